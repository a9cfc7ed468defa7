/* dtype.h: element types of stored tensors and the conversions between them. */
#ifndef SNUG_DTYPE_H
#define SNUG_DTYPE_H

#include <stddef.h>
#include <stdint.h>

typedef enum snug_dtype {
    SNUG_DT_F32 = 0,
    SNUG_DT_F16,
    SNUG_DT_BF16,
    SNUG_DT_F64,
    SNUG_DT_I64,
    SNUG_DT_I32,
    SNUG_DT_U8,
    SNUG_DT_BOOL,
    SNUG_DT_UNSUPPORTED, /* a valid safetensors dtype snug cannot compute with (F8_*, I16, ...) */
    SNUG_DT_I8,          /* read only as bitsandbytes' 8-bit codes (model/quant4.h) */
} snug_dtype;

size_t snug_dtype_size(snug_dtype t);        /* bytes per element; 0 for SNUG_DT_UNSUPPORTED */
const char *snug_dtype_name(snug_dtype t);   /* safetensors spelling: "F32", "BF16", ... */
snug_dtype snug_dtype_parse(const char *s);  /* safetensors spelling; -1 when the string is no safetensors dtype */

float snug_bf16_to_f32(uint16_t h);
uint16_t snug_f32_to_bf16(float f);  /* round to nearest even; NaN stays NaN */
float snug_f16_to_f32(uint16_t h);
uint16_t snug_f32_to_f16(float f);   /* round to nearest even, overflow to inf */

#endif
