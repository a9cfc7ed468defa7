/* dtype.c: element types of stored tensors and the fp32 <-> bf16/f16 conversions (see dtype.h).
 *
 * The conversions work on bit patterns so that rounding (to nearest, ties to even), NaN, infinities and subnormals
 * match PyTorch's `tensor.to(torch.bfloat16 / torch.float16)` exactly. */
#include "core/dtype.h"

#include <string.h>

static const struct {
    const char *name;
    snug_dtype t;
} dtype_names[] = {
    {"F32", SNUG_DT_F32},
    {"F16", SNUG_DT_F16},
    {"BF16", SNUG_DT_BF16},
    {"F64", SNUG_DT_F64},
    {"I64", SNUG_DT_I64},
    {"I32", SNUG_DT_I32},
    {"U8", SNUG_DT_U8},
    {"BOOL", SNUG_DT_BOOL},
    {"I8", SNUG_DT_I8},
    /* Valid safetensors dtypes that snug stores but cannot compute with. */
    {"I16", SNUG_DT_UNSUPPORTED},
    {"U16", SNUG_DT_UNSUPPORTED},
    {"U32", SNUG_DT_UNSUPPORTED},
    {"U64", SNUG_DT_UNSUPPORTED},
    {"F8_E5M2", SNUG_DT_UNSUPPORTED},
    {"F8_E4M3", SNUG_DT_UNSUPPORTED},
    {"F8_E8M0", SNUG_DT_UNSUPPORTED},
    {"F8_E4M3FNUZ", SNUG_DT_UNSUPPORTED},
    {"F8_E5M2FNUZ", SNUG_DT_UNSUPPORTED},
    {"F4", SNUG_DT_UNSUPPORTED},
    {"F6_E2M3", SNUG_DT_UNSUPPORTED},
    {"F6_E3M2", SNUG_DT_UNSUPPORTED},
    {"C64", SNUG_DT_UNSUPPORTED},
};

size_t snug_dtype_size(snug_dtype t) {
    switch (t) {
    case SNUG_DT_F64:
    case SNUG_DT_I64:
        return 8;
    case SNUG_DT_F32:
    case SNUG_DT_I32:
        return 4;
    case SNUG_DT_F16:
    case SNUG_DT_BF16:
        return 2;
    case SNUG_DT_U8:
    case SNUG_DT_I8:
    case SNUG_DT_BOOL:
        return 1;
    default:
        return 0;
    }
}

const char *snug_dtype_name(snug_dtype t) {
    if (t == SNUG_DT_UNSUPPORTED)
        return "unsupported";
    for (size_t i = 0; i < sizeof dtype_names / sizeof dtype_names[0]; i++)
        if (dtype_names[i].t == t)
            return dtype_names[i].name;
    return "invalid";
}

snug_dtype snug_dtype_parse(const char *s) {
    for (size_t i = 0; s && i < sizeof dtype_names / sizeof dtype_names[0]; i++)
        if (strcmp(dtype_names[i].name, s) == 0)
            return dtype_names[i].t;
    return (snug_dtype)-1;
}

static uint32_t f32_bits(float f) {
    uint32_t x;
    memcpy(&x, &f, 4);
    return x;
}

static float bits_f32(uint32_t x) {
    float f;
    memcpy(&f, &x, 4);
    return f;
}

float snug_bf16_to_f32(uint16_t h) { return bits_f32((uint32_t)h << 16); }

uint16_t snug_f32_to_bf16(float f) {
    uint32_t x = f32_bits(f);
    if ((x & 0x7fffffffu) > 0x7f800000u)          /* NaN: keep the sign, force a quiet NaN */
        return (uint16_t)((x >> 16) | 0x0040u);
    x += 0x7fffu + ((x >> 16) & 1u);               /* round to nearest, ties to even; overflow carries to inf */
    return (uint16_t)(x >> 16);
}

float snug_f16_to_f32(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t exp = (h >> 10) & 0x1fu, mant = h & 0x3ffu;
    if (exp == 0) {                                /* zero or subnormal: mant * 2^-24, exact in fp32 */
        float v = (float)mant * (1.0f / 16777216.0f);
        return bits_f32(f32_bits(v) | sign);
    }
    if (exp == 31)                                 /* inf or NaN (payload kept) */
        return bits_f32(sign | 0x7f800000u | (mant << 13));
    return bits_f32(sign | ((exp + 112u) << 23) | (mant << 13));
}

uint16_t snug_f32_to_f16(float f) {
    uint32_t x = f32_bits(f);
    uint16_t sign = (uint16_t)((x >> 16) & 0x8000u);
    uint32_t ax = x & 0x7fffffffu;
    if (ax > 0x7f800000u)                          /* NaN: quiet, top payload bits kept */
        return sign | 0x7e00u | (uint16_t)((ax >> 13) & 0x3ffu);
    if (ax >= 0x477ff000u)                         /* >= 65520 rounds to inf (and inf stays inf) */
        return sign | 0x7c00u;
    if (ax >= 0x38800000u) {                       /* normal half: rebias the exponent, round the mantissa */
        uint32_t r = ax - (112u << 23);
        r += 0xfffu + ((r >> 13) & 1u);
        return sign | (uint16_t)(r >> 13);
    }
    if (ax < 0x33000000u)                          /* below 2^-25 (half the smallest subnormal, a tie to 0) */
        return sign;
    /* Subnormal half: the value in units of 2^-24 is m * 2^(e-126), with a shift of 14..24 bits. */
    uint32_t e = ax >> 23, m = (ax & 0x7fffffu) | 0x800000u;
    uint32_t shift = 126u - e;
    uint32_t r = m >> shift, rem = m & ((1u << shift) - 1u), half = 1u << (shift - 1u);
    if (rem > half || (rem == half && (r & 1u)))
        r++;                                       /* may carry into the smallest normal: still correct */
    return sign | (uint16_t)r;
}
