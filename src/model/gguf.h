/* gguf.h: writing the GGUF file format (version 3) of llama.cpp and Ollama: a header, metadata key/value pairs,
 * tensor infos and the tensor data, each tensor's data aligned to 32 bytes (general.alignment's default).
 *
 * A writer collects the metadata (in the order it is added, as gguf-py's GGUFWriter keeps it) and the tensors, then
 * writes the file atomically in one pass. A tensor's values come from a fill callback called just before its data is
 * written, into one buffer the writer holds for the largest tensor, so a model is never held whole. Tensor types:
 * F32, F16 and BF16 (round to nearest even) and Q8_0 (blocks of 32 values: an fp16 scale d = amax / 127 and 32 int8
 * q = round(x / d), ties away from zero, as ggml's quantize_row_q8_0_ref and gguf-py compute it). */
#ifndef SNUG_MODEL_GGUF_H
#define SNUG_MODEL_GGUF_H

#include <stddef.h>
#include <stdint.h>

#include "core/error.h"

/* ggml's type ids, as the file stores them */
typedef enum snug_gguf_type {
    SNUG_GGUF_F32 = 0,
    SNUG_GGUF_F16 = 1,
    SNUG_GGUF_Q8_0 = 8,
    SNUG_GGUF_BF16 = 30,
} snug_gguf_type;

#define SNUG_GGUF_ALIGN 32
#define SNUG_GGUF_QK8_0 32 /* values per Q8_0 block (34 bytes: fp16 d, 32 int8) */

/* The value types of the metadata (GGUFValueType) */
enum { SNUG_GGUF_V_U32 = 4, SNUG_GGUF_V_I32 = 5, SNUG_GGUF_V_F32 = 6, SNUG_GGUF_V_BOOL = 7, SNUG_GGUF_V_STRING = 8,
       SNUG_GGUF_V_ARRAY = 9 };

/* Puts the tensor's numel fp32 values, in row-major order of its shape, into dst. */
typedef int (*snug_gguf_fill_fn)(void *ud, int tag, float *dst, snug_error *e);

typedef struct snug_gguf_tensor {
    char *name;
    snug_gguf_type type;
    int ndim;
    int64_t shape[4];   /* row-major, as torch names it: (rows, cols); the file stores it reversed (ne0 = cols) */
    snug_gguf_fill_fn fill;
    void *ud;
    int tag;
} snug_gguf_tensor;

typedef struct snug_gguf {
    unsigned char *kv;  /* the metadata as it goes in the file */
    size_t kv_len, kv_cap;
    uint64_t n_kv;
    snug_gguf_tensor *t;
    int nt, t_cap;
    int oom;            /* an append ran out of memory: snug_gguf_write fails */
} snug_gguf;

void snug_gguf_init(snug_gguf *g);
void snug_gguf_free(snug_gguf *g);

/* Metadata, appended in order (a failed allocation is reported by snug_gguf_write). */
void snug_gguf_kv_str(snug_gguf *g, const char *key, const char *val);
void snug_gguf_kv_u32(snug_gguf *g, const char *key, uint32_t val);
void snug_gguf_kv_i32(snug_gguf *g, const char *key, int32_t val);
void snug_gguf_kv_f32(snug_gguf *g, const char *key, float val);
void snug_gguf_kv_bool(snug_gguf *g, const char *key, int val);
/* An array of n strings (lens[i] bytes each; lens NULL: NUL-terminated), of n int32 or of n float32. */
void snug_gguf_kv_strs(snug_gguf *g, const char *key, const char *const *s, const size_t *lens, size_t n);
void snug_gguf_kv_i32s(snug_gguf *g, const char *key, const int32_t *v, size_t n);
void snug_gguf_kv_f32s(snug_gguf *g, const char *key, const float *v, size_t n);

/* A tensor of shape (row-major, 1 to 4 dims) stored as type; Q8_0 needs the last dim a multiple of 32. */
int snug_gguf_add_tensor(snug_gguf *g, const char *name, snug_gguf_type type, int ndim, const int64_t *shape,
                         snug_gguf_fill_fn fill, void *ud, int tag, snug_error *e);

/* Writes the file atomically: header, metadata, tensor infos, padding to 32, each tensor's data padded to 32. */
int snug_gguf_write(snug_gguf *g, const char *path, snug_error *e);

/* Bytes of n values (n a multiple of 32 for Q8_0) stored as type. */
size_t snug_gguf_nbytes(snug_gguf_type type, size_t n);
/* n values (a multiple of 32) as Q8_0 blocks into out (n / 32 * 34 bytes). */
void snug_gguf_quantize_q8_0(const float *x, size_t n, uint8_t *out);
/* The name of a type ("f32", "f16", "bf16", "q8_0"). */
const char *snug_gguf_type_name(snug_gguf_type type);

#endif
