/* quant4.h: bitsandbytes' 4-bit weight formats (NF4, FP4, optionally double-quantized), byte for byte: the code
 * books, quantizing a weight, dequantizing any range of it, the quant_state JSON, and the tensors a bnb-4bit
 * safetensors checkpoint holds per quantized Linear weight (reading them in place, writing them).
 *
 * One quantized weight W [out, in] of n = out * in elements, blocks of `blocksize` consecutive elements in row-major
 * order (nb = ceil(n / blocksize) blocks, the last one possibly short):
 *   packed  uint8 [(n + 1) / 2]  two 4-bit codes per byte, element 2j in the HIGH nibble of byte j; an odd n pads
 *                                the last low nibble with the code of 0.0
 *   not nested: absmax  fp32 [nb]  the block's max |w|
 *   nested (bitsandbytes' compress_statistics=True, "double quantization"):
 *     absmax_q          uint8 [nb]           8-bit codes of absmax - nested_offset
 *     nested_absmax     fp32 [ceil(nb/256)]  per 256 blocks, max |absmax - nested_offset|
 *     nested_quant_map  fp32 [256]           bitsandbytes' signed dynamic map (core/quant_map.h)
 *     nested_offset     fp32                 the mean of absmax
 * Dequantizing (fp32 math, in this order, as bitsandbytes does):
 *   absmax_f32[b] = nested ? nested_quant_map[absmax_q[b]] * nested_absmax[b / 256] + nested_offset : absmax[b]
 *   w[i] = code[nibble i] * absmax_f32[i / blocksize]
 * Quantizing follows what the installed bitsandbytes (0.50) runs on a CPU, which is not what its CUDA kernels do
 * bit for bit; quant4.c lists every rule. tests/parity/test_quant4_parity.py checks all of it against bitsandbytes.
 *
 * LLM.int8's weight format (SNUG_Q4_INT8: bitsandbytes' Int8Params, what load_in_8bit stores) lives in the same
 * struct, one block per row (blocksize = in, never nested):
 *   packed  int8 [n]    the codes, row-major (bitsandbytes' CB)
 *   absmax  fp32 [out]  each row's max |w| (bitsandbytes' SCB)
 * Dequantizing is what bitsandbytes' training path on a CPU (MatMul8bitFp) computes: w = code * (SCB * (float)(1/127))
 * in fp32, the row's factor rounded once. */
#ifndef SNUG_QUANT4_H
#define SNUG_QUANT4_H

#include <stddef.h>
#include <stdint.h>

#include "core/dtype.h"
#include "core/error.h"
#include "model/safetensors.h"

typedef enum snug_q4_type { SNUG_Q4_NF4 = 0, SNUG_Q4_FP4 = 1, SNUG_Q4_INT8 = 2 } snug_q4_type;

#define SNUG_Q4_BLOCKSIZE 64         /* bitsandbytes' default */
#define SNUG_Q4_NESTED_BLOCKSIZE 256 /* what bitsandbytes' quantize_4bit uses for the absmax codes */
#define SNUG_Q4_JSON_MAX 512         /* room for any quant_state JSON snug writes */

/* One quantized weight. The pointers are carved by snug_q4_carve from one buffer of snug_q4_bytes (or point into
 * a memory-mapped checkpoint after snug_q4_st_view, and are then read-only). */
typedef struct snug_q4_tensor {
    snug_q4_type type;
    int blocksize;             /* 32, 64, ..., 4096 */
    int nested;                /* absmax double-quantized */
    int nested_blocksize;      /* SNUG_Q4_NESTED_BLOCKSIZE when nested */
    int64_t shape[2];          /* [out, in], unpacked */
    size_t n;                  /* out * in */
    snug_dtype dtype;          /* F32, BF16 or F16: the quant_state "dtype", what dequantizing is meant to give */
    uint8_t *packed;           /* ((n + 1) / 2) */
    float *absmax;             /* (nb) when not nested, else NULL */
    uint8_t *absmax_q;         /* (nb) when nested, else NULL */
    float *nested_absmax;      /* (ceil(nb / 256)) when nested */
    float *nested_quant_map;   /* (256) when nested */
    float nested_offset;
} snug_q4_tensor;

/* Byte sizes of the parts of one quantized weight, for planning memory before anything is allocated. */
typedef struct snug_q4_sizes {
    size_t packed;            /* (n + 1) / 2; n for SNUG_Q4_INT8 */
    size_t absmax;            /* 4 * nb, or nb when nested */
    size_t nested_absmax;     /* 4 * ceil(nb / 256) when nested, else 0 */
    size_t nested_quant_map;  /* 1024 when nested, else 0 */
    size_t total;             /* the sum: what snug_q4_carve takes */
} snug_q4_sizes;

/* The 16 values of a code book, indexed by the 4-bit code: NF4 sorted from -1 to 1; FP4 sign in bit 3 and the
 * magnitudes {0, 1/192, 2/3, 1, 1/3, 1/2, 1/6, 1/4} in bits 0-2 (not monotonic; code 8 is +0, as in bitsandbytes).
 * Exactly bitsandbytes' get_4bit_type(), as float32: the quant_map a checkpoint stores. NULL for SNUG_Q4_INT8. */
const float *snug_q4_code(snug_q4_type type);
const char *snug_q4_type_name(snug_q4_type type); /* "nf4", "fp4", "int8" */
/* "8-bit" for SNUG_Q4_INT8, else "4-bit": how messages name a quantized base */
static inline const char *snug_q4_width(snug_q4_type type) { return type == SNUG_Q4_INT8 ? "8-bit" : "4-bit"; }
/* "bfloat16", "float16", "float32" (torch's names, as the quant_state JSON spells them); NULL for other dtypes */
const char *snug_q4_dtype_name(snug_dtype dtype);

size_t snug_q4_nblocks(size_t n, int blocksize);
snug_q4_sizes snug_q4_sizes_of(snug_q4_type type, size_t n, int blocksize, int nested);
size_t snug_q4_bytes(snug_q4_type type, size_t n, int blocksize, int nested); /* snug_q4_sizes_of(...).total */

/* Fills t's description (no buffers): type, blocksize (32..4096, a power of two; for SNUG_Q4_INT8 ignored: one block
 * per row), nested (never for SNUG_Q4_INT8), shape [rows, cols] and the dtype dequantizing gives. Fails
 * (SNUG_EINPUT) on a bad blocksize, shape or dtype. */
int snug_q4_init(snug_q4_tensor *t, snug_q4_type type, int blocksize, int nested, int64_t rows, int64_t cols,
                 snug_dtype dtype, snug_error *e);
/* Points t's buffers into buf (snug_q4_bytes(t->type, t->n, ...) bytes, 4-byte aligned): the fp32 parts
 * first, then the byte parts. */
void snug_q4_carve(snug_q4_tensor *t, void *buf);

/* Quantizes src [out, in] row-major (F32, BF16 or F16; 16-bit values are widened to fp32 first, as bitsandbytes
 * does) into t's buffers, as bitsandbytes' quantize_4bit(A, blocksize, compress_statistics=t->nested, quant_type)
 * does on a CPU, or for SNUG_Q4_INT8 as bitsandbytes' Int8Params does (int8_vectorwise_quant of the fp16 weight).
 * Fails (SNUG_EINPUT) naming the flat index of the first NaN or infinite value (for 8 bits: or past fp16's range). */
int snug_q4_quantize(snug_q4_tensor *t, const void *src, snug_dtype src_dtype, snug_error *e);

/* The fp32 scale of block b (dequantizing the nested absmax when nested). */
float snug_q4_block_absmax(const snug_q4_tensor *t, size_t b);

/* Dequantizes elements [i0, i1) of the flat weight into dst (i1 - i0 values of dst_dtype: F32, or BF16 / F16
 * rounded to nearest even from the fp32 value, as bitsandbytes' .to(dtype) does). A row range [r0, r1) of W is
 * [r0 * in, r1 * in). */
void snug_q4_dequantize(const snug_q4_tensor *t, size_t i0, size_t i1, void *dst, snug_dtype dst_dtype);

/* torch.mean of a contiguous fp32 vector on a CPU, reproduced to the bit: torch's cascade sum with `lanes`-wide
 * vectors (8 with AVX2, 16 with AVX512), split over `threads` threads when n >= 32768 (torch's grain size), then
 * divided by (float)n. bitsandbytes' nested_offset is absmax.mean(); snug_q4_quantize uses lanes 8, threads 1 (the
 * value torch gives with AVX2 and torch.set_num_threads(1); with more threads torch's own result changes once
 * nb >= 32768). */
float snug_q4_torch_mean(const float *x, size_t n, int lanes, int threads);

/* The quant_state JSON: exactly the bytes of Python's json.dumps(d) for bitsandbytes' QuantState.as_dict(packed=True)
 * non-tensor items, in its key order: quant_type, blocksize, dtype, shape, then when nested nested_blocksize,
 * nested_dtype, nested_offset (the double of the fp32 offset, as repr() writes it). Writes a NUL-terminated string
 * of *len bytes into buf (cap bytes; SNUG_Q4_JSON_MAX is enough). */
int snug_q4_state_json(const snug_q4_tensor *t, char *buf, size_t cap, size_t *len, snug_error *e);
/* Parses and validates a quant_state JSON into t's description (type, blocksize, dtype, shape, n, nested,
 * nested_blocksize, nested_offset; the buffers are left alone). `where` names the file and tensor for the messages.
 * Fails (SNUG_EINPUT) on anything bitsandbytes would refuse or snug cannot load: bad JSON, a missing or unknown key,
 * a wrong type, an unknown quant_type or dtype, a blocksize bitsandbytes does not accept, a shape that is not 2-D,
 * nested keys given only in part, a nested_blocksize other than 256, a nested_dtype other than float32. */
int snug_q4_state_parse(const char *json, size_t len, const char *where, snug_q4_tensor *t, snug_error *e);

/* Whether weight `name` (e.g. "model.layers.0.self_attn.q_proj.weight") is stored bnb-4bit in s: 1 when
 * "<name>.quant_state.bitsandbytes__nf4" or "__fp4" exists, or bnb-8bit: "<module>.SCB" exists (transformers' save of a
 * load_in_8bit model: "<module>.weight" I8 [out, in], "<module>.SCB" F32 [out], "<module>.weight_format" U8 0);
 * else 0. */
int snug_q4_st_detect(const snug_st_set *s, const char *name);
/* Fills t with a read-only view of the bnb-4bit weight `name` inside s's memory maps, after checking every part:
 * the quant_state JSON (snug_q4_state_parse), the packed weight (any dtype: bnb_4bit_quant_storage only relabels the
 * bytes) of (n + 1) / 2 bytes, absmax (U8 when nested, else F32) of nb values, quant_map (F32 [16], bitsandbytes'
 * table for the quant_type: bitsandbytes dequantizes with its own table, so snug does too and refuses a file whose
 * table differs), nested_absmax and nested_quant_map (F32, used as given) exactly when the JSON says nested, fp32
 * parts 4-byte aligned, and no other "<name>.*" tensor. An 8-bit weight: I8 [out, in], SCB F32 [out] (finite, not
 * negative, 4-byte aligned), weight_format 0 when present. Errors name the file and the tensor. */
int snug_q4_st_view(const snug_st_set *s, const char *name, snug_q4_tensor *t, snug_error *e);

/* The tensors bitsandbytes' Linear4bit saves for one weight, ready for snug_st_write: "<name>" (U8 [(n+1)/2, 1]),
 * "<name>.absmax", "<name>.quant_map", when nested "<name>.nested_absmax" and "<name>.nested_quant_map", and
 * "<name>.quant_state.bitsandbytes__<type>" (U8 JSON). out[0..n) point into this struct and into t's buffers, which
 * must outlive the write. */
typedef struct snug_q4_st_outs {
    snug_st_out out[6];
    int n;
    char names[6][512];
    char json[SNUG_Q4_JSON_MAX];
    float quant_map[16];
} snug_q4_st_outs;
int snug_q4_st_outs_fill(snug_q4_st_outs *w, const char *name, const snug_q4_tensor *t, snug_error *e);

#endif
