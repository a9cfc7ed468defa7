/* snug_emu.h: the emulated CUDA runtime's own interface, for its stand-in libraries (cuBLASLt, NCCL) and its tests.
 *
 * The emulator (tests/cuda_emu) runs snug's .cu files on the CPU: device memory comes from the host heap but is
 * tracked, streams are queues run in order when something waits on them, and work is checked as a GPU would check it
 * and more (see tests/cuda_emu/README.md). A stand-in library queues its work on a stream with snug_emu_enqueue and
 * checks the pointers it is given with snug_emu_check_device before it reads or writes them. Plain C. */
#ifndef SNUG_EMU_H
#define SNUG_EMU_H

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Aborts the process after printing "snug cuda-emu: error: <message>" and, when work is running, what runs (the
 * kernel or queued item and where it was queued). For what a GPU would turn into an illegal address or a hang. */
void snug_emu_fatal(const char *fmt, ...) __attribute__((format(printf, 1, 2), noreturn));

/* [p, p + bytes) must lie inside one live allocation the device can reach (cudaMalloc'd memory, or pinned host memory
 * from cudaHostAlloc); else snug_emu_fatal naming `who`. bytes 0 checks p alone. */
void snug_emu_check_device(const void *p, size_t bytes, const char *who);

/* Queues fn(arg) on stream (a cudaStream_t; NULL: the legacy default stream) after what is queued there already;
 * it runs when something waits for the stream (a synchronize, an event, a copy to pageable memory), in order with
 * the stream's kernels and copies, and after the events the stream waits on. `what` names it in diagnostics (a
 * string that outlives the call). Returns 0, or a cudaError_t when the stream is not a live stream. */
int snug_emu_enqueue(void *stream, const char *what, void (*fn)(void *arg), void *arg);

/* Runs everything queued on every stream now (what cudaDeviceSynchronize does). */
void snug_emu_drain(void);

/* The value of the environment variable SNUG_CUDA_EMU_<name>, or NULL: the emulator's settings (e.g.
 * SNUG_CUDA_EMU_DEVICES=1 makes one device visible; without it the emulated runtime sees none). */
const char *snug_emu_setting(const char *name);

#ifdef __cplusplus
}
#endif

#endif
