/* safetensors.h: reading and writing the safetensors format (Hugging Face model weights).
 *
 * Reading memory-maps each file and validates the header completely before anything is used: header length inside
 * the file, JSON that parses, known dtypes, shape * dtype size == byte length, offsets inside the buffer, and the
 * buffer covered with no overlap and no holes. A folder is read through model.safetensors or through the shards
 * listed by model.safetensors.index.json. Every error names the file and the tensor or byte offset. */
#ifndef SNUG_SAFETENSORS_H
#define SNUG_SAFETENSORS_H

#include <stddef.h>
#include <stdint.h>

#include "core/dtype.h"
#include "core/error.h"
#include "core/fileio.h"

#define SNUG_ST_MAXDIM 8

typedef struct snug_st_tensor {
    char *name;
    snug_dtype dtype;
    int ndim;
    int64_t shape[SNUG_ST_MAXDIM];
    const void *data; /* inside the memory map */
    size_t nbytes;
    int file;         /* index into snug_st_set.paths */
} snug_st_tensor;

typedef struct snug_st_set {
    int nfiles;
    char **paths;     /* the files, for error messages */
    void **maps;
    size_t *map_sizes;
    int ntensors;
    snug_st_tensor *tensors; /* sorted by name for lookup */
} snug_st_set;

/* Opens one .safetensors file. */
int snug_st_open_file(snug_st_set *s, const char *path, snug_error *e);
/* Opens a model folder: model.safetensors, or model.safetensors.index.json and its shards. */
int snug_st_open_dir(snug_st_set *s, const char *dir, snug_error *e);
const snug_st_tensor *snug_st_find(const snug_st_set *s, const char *name);
void snug_st_close(snug_st_set *s);
/* Drops the mapped pages of a tensor that has been read (they come back from the file if touched again), so
 * loading a model never holds more than one tensor's pages beyond the model itself. */
void snug_st_release(const snug_st_set *s, const snug_st_tensor *t);

/* How much of a tensor's file pages reading it holds at once: snug_st_to_f32 drops each block it has read. */
#define SNUG_ST_READ_BLOCK ((size_t)4 << 20)

/* Converts a F32/F16/BF16 tensor to fp32 into dst (numel floats). transpose2d: the tensor is 2-D [R, K] and dst
 * receives its transpose [K, R] (GPT-2's Conv1D weights). Fails with the file and tensor named when a value is NaN
 * or infinite, or when the dtype is not a float type. */
int snug_st_to_f32(const snug_st_set *s, const snug_st_tensor *t, float *dst, int transpose2d, snug_error *e);
/* Elements [first, first+n) of tensor t in its file's order (no transpose) to fp32 into dst (n floats), failing as
 * snug_st_to_f32 does (the flat index named is the tensor's). */
int snug_st_to_f32_range(const snug_st_set *s, const snug_st_tensor *t, float *dst, size_t first, size_t n,
                         snug_error *e);

/* A tensor to write. */
typedef struct snug_st_out {
    const char *name;
    snug_dtype dtype;   /* dtype in the file */
    int ndim;
    int64_t shape[SNUG_ST_MAXDIM];
    const float *f32;   /* source values in fp32, converted to dtype while writing */
    const uint16_t *h16;/* or (when set) source values stored as h16_dtype (BF16 or F16) */
    snug_dtype h16_dtype;
    int transpose2d;    /* write the transpose of a 2-D source (source is [shape[1], shape[0]]) */
    const void *raw;    /* or (when set) the bytes as they go in the file: numel * dtype size bytes of any dtype snug
                         * knows (U8, F32, BF16, ...), written as they are, never transposed */
    /* or (when set) a stream: just before the tensor is written, fill(fill_ud, fill_tag, dst) puts its numel fp32
     * values, laid out as f32's would be, into dst, one buffer the writer holds for the largest such tensor, so the
     * caller never holds every tensor at once */
    int (*fill)(void *fill_ud, int fill_tag, float *dst, snug_error *e);
    void *fill_ud;
    int fill_tag;
} snug_st_out;

/* Writes one file atomically, the way the reference writer does: tensors sorted by dtype alignment (descending)
 * then name, header padded with spaces so 8 + header length is a multiple of 8, metadata {"format":"pt"}. opts (NULL:
 * none) as snug_atomic_open takes them: direct I/O, the hash of the file's bytes. */
int snug_st_write(const char *path, const snug_st_out *t, int n, const snug_write_opts *opts, snug_error *e);

/* The order in which snug_st_write writes t's tensors' data (so their fill calls come in it): idx[k] is the index
 * into t of the k-th. */
int snug_st_write_order(const snug_st_out *t, int n, int *idx, snug_error *e);

#endif
