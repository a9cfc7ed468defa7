/* cuda_runtime.h (emulated CUDA): what a .cu file sees when tests/cuda_emu compiles it as host C++ (see
 * tests/cuda_emu/README.md): the runtime API (cuda_runtime_api.h) and, in C++, the device side: the built-in
 * variables, the intrinsics, shared memory and kernel launches (snug_emu_device.h). */
#ifndef SNUG_EMU_CUDA_RUNTIME_H
#define SNUG_EMU_CUDA_RUNTIME_H

#include "cuda_runtime_api.h"

#ifdef __cplusplus
#include "snug_emu_device.h"
#endif

#endif
