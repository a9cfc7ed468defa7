/* library_types.h (emulated CUDA): the data types shared by the CUDA libraries, with CUDA's values. */
#ifndef SNUG_EMU_LIBRARY_TYPES_H
#define SNUG_EMU_LIBRARY_TYPES_H

typedef enum cudaDataType_t {
    CUDA_R_16F = 2,
    CUDA_R_32F = 0,
    CUDA_R_64F = 1,
    CUDA_R_16BF = 14,
} cudaDataType_t;
typedef cudaDataType_t cudaDataType;

#endif
