/* safetensors.c: reading (memory-mapped, fully validated) and writing (atomic, reference layout) of safetensors files
 * (see safetensors.h). The checks follow the Rust reference implementation: a file that it rejects, snug rejects,
 * with a message that names the file, the tensor or byte offset, and what to do. */
#include "model/safetensors.h"

#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/fileio.h"
#include "core/json_util.h"

#define ST_MAX_HEADER 100000000ull /* the Rust reader's limit */
#define ST_CORRUPT "the file is corrupt or was not written by a safetensors writer; re-download or re-save it"

/* ---------------------------------------------------------------------------------------------------------------- */
/* Reading */

/* Width in bits of any safetensors dtype, including those snug cannot compute with; 0 for unknown strings. */
static int dtype_bits(const char *s) {
    static const struct {
        const char *name;
        int bits;
    } extra[] = {
        {"I16", 16},    {"U16", 16},    {"U32", 32},     {"U64", 64},
        {"F8_E5M2", 8}, {"F8_E4M3", 8}, {"F8_E8M0", 8},  {"F8_E4M3FNUZ", 8},  {"F8_E5M2FNUZ", 8},
        {"F4", 4},      {"F6_E2M3", 6}, {"F6_E3M2", 6},  {"C64", 64},
    };
    snug_dtype t = snug_dtype_parse(s);
    if (t != SNUG_DT_UNSUPPORTED)
        return t == (snug_dtype)-1 ? 0 : (int)snug_dtype_size(t) * 8;
    for (size_t i = 0; i < sizeof extra / sizeof extra[0]; i++)
        if (strcmp(extra[i].name, s) == 0)
            return extra[i].bits;
    return 0;
}


/* One tensor's byte range inside a file's data buffer, for the coverage check. */
typedef struct span {
    uint64_t begin, end;
    const char *name;
} span;

static int span_cmp(const void *a, const void *b) {
    const span *x = a, *y = b;
    if (x->begin != y->begin)
        return x->begin < y->begin ? -1 : 1;
    return x->end < y->end ? -1 : x->end > y->end;
}

static int tensor_cmp(const void *a, const void *b) {
    return strcmp(((const snug_st_tensor *)a)->name, ((const snug_st_tensor *)b)->name);
}

/* Adds one slot to the file arrays; the slot is counted at once so that snug_st_close frees it on failure. */
static int add_file_slot(snug_st_set *s, const char *path, snug_error *e) {
    int n = s->nfiles + 1;
    char **paths = realloc(s->paths, n * sizeof *paths);
    if (paths)
        s->paths = paths;
    void **maps = realloc(s->maps, n * sizeof *maps);
    if (maps)
        s->maps = maps;
    size_t *sizes = realloc(s->map_sizes, n * sizeof *sizes);
    if (sizes)
        s->map_sizes = sizes;
    char *p = strdup(path);
    if (!paths || !maps || !sizes || !p) {
        free(p);
        return snug_fail(e, SNUG_ENOMEM, "out of memory opening %s", path);
    }
    s->paths[s->nfiles] = p;
    s->maps[s->nfiles] = NULL;
    s->map_sizes[s->nfiles] = 0;
    s->nfiles = n;
    return 0;
}

/* Reads a non-negative JSON integer (a shape entry or an offset). */
static int get_u64(const json_t *j, uint64_t *out) {
    if (!json_is_integer(j) || json_integer_value(j) < 0)
        return -1;
    *out = (uint64_t)json_integer_value(j);
    return 0;
}

/* Parses one header entry into t and its byte span; the name is owned by the caller. */
static int parse_entry(const char *path, const char *name, json_t *v, uint64_t bufsize, snug_st_tensor *t,
                       span *sp, snug_error *e) {
    if (!json_is_object(v))
        return snug_fail(e, SNUG_EINPUT, "%s: tensor \"%s\": the header entry is %s, expected an object with dtype, "
                         "shape and data_offsets; " ST_CORRUPT, path, name, snug_json_type_name(v));
    json_t *jd = json_object_get(v, "dtype"), *js = json_object_get(v, "shape"),
           *jo = json_object_get(v, "data_offsets");
    if (!json_is_string(jd))
        return snug_fail(e, SNUG_EINPUT, "%s: tensor \"%s\": \"dtype\" is %s, expected a string such as \"BF16\"; "
                         ST_CORRUPT, path, name, jd ? snug_json_type_name(jd) : "missing");
    const char *ds = json_string_value(jd);
    int bits = dtype_bits(ds);
    if (bits == 0)
        return snug_fail(e, SNUG_EINPUT, "%s: tensor \"%s\": unknown dtype \"%.40s\" (safetensors dtypes are F32, "
                         "F16, BF16, F64, I64, I32, I16, I8, U8, BOOL, F8_*, ...); " ST_CORRUPT, path, name, ds);
    t->dtype = snug_dtype_parse(ds);
    if (!json_is_array(js))
        return snug_fail(e, SNUG_EINPUT, "%s: tensor \"%s\": \"shape\" is %s, expected an array of sizes; "
                         ST_CORRUPT, path, name, js ? snug_json_type_name(js) : "missing");
    size_t nd = json_array_size(js);
    if (nd > SNUG_ST_MAXDIM)
        return snug_fail(e, SNUG_EINPUT, "%s: tensor \"%s\": %zu dimensions, snug reads at most %d; this is not a "
                         "checkpoint snug can read", path, name, nd, SNUG_ST_MAXDIM);
    t->ndim = (int)nd;
    uint64_t numel = 1;
    for (size_t d = 0; d < nd; d++) {
        uint64_t dim;
        if (get_u64(json_array_get(js, d), &dim) != 0 || dim > INT64_MAX)
            return snug_fail(e, SNUG_EINPUT, "%s: tensor \"%s\": shape[%zu] is not a non-negative integer; "
                             ST_CORRUPT, path, name, d);
        t->shape[d] = (int64_t)dim;
        if (__builtin_mul_overflow(numel, dim, &numel))
            return snug_fail(e, SNUG_EINPUT, "%s: tensor \"%s\": the shape's element count overflows 64 bits; "
                             ST_CORRUPT, path, name);
    }
    uint64_t nbits;
    if (__builtin_mul_overflow(numel, (uint64_t)bits, &nbits))
        return snug_fail(e, SNUG_EINPUT, "%s: tensor \"%s\": the shape's byte size overflows 64 bits; " ST_CORRUPT,
                         path, name);
    if (nbits % 8)
        return snug_fail(e, SNUG_EINPUT, "%s: tensor \"%s\": %s with %llu elements does not end on a byte boundary; "
                         ST_CORRUPT, path, name, ds, (unsigned long long)numel);
    if (!json_is_array(jo) || json_array_size(jo) != 2 || get_u64(json_array_get(jo, 0), &sp->begin) != 0 ||
        get_u64(json_array_get(jo, 1), &sp->end) != 0)
        return snug_fail(e, SNUG_EINPUT, "%s: tensor \"%s\": \"data_offsets\" must be [begin, end] with non-negative "
                         "integers; " ST_CORRUPT, path, name);
    if (sp->begin > sp->end)
        return snug_fail(e, SNUG_EINPUT, "%s: tensor \"%s\": data_offsets [%llu, %llu] end before they begin; "
                         ST_CORRUPT, path, name, (unsigned long long)sp->begin, (unsigned long long)sp->end);
    if (sp->end > bufsize)
        return snug_fail(e, SNUG_EINPUT, "%s: tensor \"%s\": data_offsets [%llu, %llu] are out of range (the data "
                         "buffer holds %llu bytes); the file is truncated or corrupt: re-download or re-save it",
                         path, name, (unsigned long long)sp->begin, (unsigned long long)sp->end,
                         (unsigned long long)bufsize);
    if (sp->end - sp->begin != nbits / 8)
        return snug_fail(e, SNUG_EINPUT, "%s: tensor \"%s\": data_offsets [%llu, %llu] span %llu bytes but %s with "
                         "%llu elements needs %llu; " ST_CORRUPT, path, name, (unsigned long long)sp->begin,
                         (unsigned long long)sp->end, (unsigned long long)(sp->end - sp->begin), ds,
                         (unsigned long long)numel, (unsigned long long)(nbits / 8));
    t->nbytes = (size_t)(sp->end - sp->begin);
    return 0;
}

static int check_metadata(const char *path, json_t *v, snug_error *e) {
    if (!json_is_object(v))
        return snug_fail(e, SNUG_EINPUT, "%s: \"__metadata__\" is %s, expected an object of strings; " ST_CORRUPT,
                         path, snug_json_type_name(v));
    const char *k;
    json_t *x;
    json_object_foreach(v, k, x) {
        if (!json_is_string(x))
            return snug_fail(e, SNUG_EINPUT, "%s: \"__metadata__\".\"%s\" is %s, expected a string; " ST_CORRUPT,
                             path, k, snug_json_type_name(x));
    }
    return 0;
}

/* Checks that the tensors' byte ranges tile the data buffer exactly (no overlaps, no holes), as the reference reader
 * does: sorted by (begin, end), each range must start where the previous one ended. */
static int check_coverage(const char *path, span *sp, size_t n, uint64_t bufsize, uint64_t base, snug_error *e) {
    qsort(sp, n, sizeof *sp, span_cmp);
    uint64_t pos = 0;
    const char *prev = NULL;
    for (size_t i = 0; i < n; i++) {
        if (sp[i].begin < pos)
            return snug_fail(e, SNUG_EINPUT, "%s: tensor \"%s\" (data_offsets [%llu, %llu]) overlaps tensor \"%s\" "
                             "(which ends at %llu); " ST_CORRUPT, path, sp[i].name,
                             (unsigned long long)sp[i].begin, (unsigned long long)sp[i].end, prev,
                             (unsigned long long)pos);
        if (sp[i].begin > pos)
            return snug_fail(e, SNUG_EINPUT, "%s: bytes %llu..%llu of the data buffer (file offset %llu) belong to no "
                             "tensor (a hole before tensor \"%s\"); " ST_CORRUPT, path, (unsigned long long)pos,
                             (unsigned long long)sp[i].begin, (unsigned long long)(base + pos), sp[i].name);
        pos = sp[i].end;
        prev = sp[i].name;
    }
    if (pos != bufsize)
        return snug_fail(e, SNUG_EINPUT, "%s: bytes %llu..%llu at the end of the data buffer (file offset %llu) belong "
                         "to no tensor; " ST_CORRUPT, path, (unsigned long long)pos, (unsigned long long)bufsize,
                         (unsigned long long)(base + pos));
    return 0;
}

/* Parses a mapped file's header and appends its tensors to s. */
static int parse_header(snug_st_set *s, int fi, snug_error *e) {
    const char *path = s->paths[fi];
    const unsigned char *map = s->maps[fi];
    uint64_t size = s->map_sizes[fi], hlen = 0;
    for (int i = 7; i >= 0; i--)
        hlen = hlen << 8 | map[i];
    if (hlen > ST_MAX_HEADER)
        return snug_fail(e, SNUG_EINPUT, "%s: the header length at byte 0 is %llu, above the %llu-byte limit; "
                         ST_CORRUPT, path, (unsigned long long)hlen, ST_MAX_HEADER);
    if (hlen > size - 8)
        return snug_fail(e, SNUG_EINPUT, "%s: the header length at byte 0 is %llu but only %llu bytes follow; the file "
                         "is truncated or not safetensors: re-download or re-save it", path,
                         (unsigned long long)hlen, (unsigned long long)(size - 8));
    const char *hdr = (const char *)map + 8;
    size_t lead = 0;
    while (lead < hlen && (hdr[lead] == ' ' || hdr[lead] == '\t' || hdr[lead] == '\n' || hdr[lead] == '\r'))
        lead++;
    if (lead == hlen || hdr[lead] != '{')
        return snug_fail(e, SNUG_EINPUT, "%s: the JSON header at byte 8 does not start with '{'; the file is not "
                         "safetensors (or is corrupt): re-download or re-save it", path);
    json_error_t je;
    json_t *root = snug_json_loadb(hdr, (size_t)hlen, JSON_REJECT_DUPLICATES, &je);
    if (!root) {
        const char *dup = strstr(je.text, "duplicate object key") ? " (a tensor name appears twice)" : "";
        return snug_fail(e, SNUG_EINPUT, "%s: the JSON header is invalid at file offset %llu: %s%s; " ST_CORRUPT,
                         path, (unsigned long long)(8 + je.position), je.text, dup);
    }
    int rc = 0;
    span *sp = NULL;
    if (!json_is_object(root)) {
        rc = snug_fail(e, SNUG_EINPUT, "%s: the JSON header is %s, expected an object; " ST_CORRUPT, path,
                       snug_json_type_name(root));
        goto out;
    }
    uint64_t bufsize = size - 8 - hlen;
    size_t cap = json_object_size(root);
    snug_st_tensor *grown = realloc(s->tensors, (s->ntensors + cap + 1) * sizeof *grown);
    sp = malloc((cap + 1) * sizeof *sp);
    if (grown)
        s->tensors = grown;
    if (!grown || !sp) {
        rc = snug_fail(e, SNUG_ENOMEM, "out of memory reading the header of %s", path);
        goto out;
    }
    size_t nsp = 0;
    const char *name;
    json_t *v;
    json_object_foreach(root, name, v) {
        if (strcmp(name, "__metadata__") == 0) {
            if ((rc = check_metadata(path, v, e)) != 0)
                goto out;
            continue;
        }
        snug_st_tensor t = {.file = fi};
        if ((rc = parse_entry(path, name, v, bufsize, &t, &sp[nsp], e)) != 0)
            goto out;
        t.data = map + 8 + hlen + sp[nsp].begin;
        if (!(t.name = strdup(name))) {
            rc = snug_fail(e, SNUG_ENOMEM, "out of memory reading the header of %s", path);
            goto out;
        }
        sp[nsp].name = t.name;
        nsp++;
        s->tensors[s->ntensors++] = t;
    }
    rc = check_coverage(path, sp, nsp, bufsize, 8 + hlen, e);
out:
    free(sp);
    json_decref(root);
    return rc;
}

/* Maps one file and appends its tensors (unsorted). */
static int open_one(snug_st_set *s, const char *path, snug_error *e) {
    SNUG_TRY(add_file_slot(s, path, e));
    int fi = s->nfiles - 1;
    struct stat st;
    if (stat(path, &st) == 0 && !S_ISREG(st.st_mode)) /* before open: a FIFO's open would wait for a writer */
        return snug_fail(e, SNUG_EINPUT, "%s: not a regular file (a %s); the weights must be a safetensors file", path,
                         S_ISDIR(st.st_mode) ? "folder" : "device, pipe or socket");
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return snug_fail(e, SNUG_EIO, "cannot open %s: %s; check the path", path, strerror(errno));
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        close(fd);
        return snug_fail(e, SNUG_EINPUT, "%s: not a regular file; the weights must be a safetensors file", path);
    }
    if (st.st_size < 8) {
        close(fd);
        return snug_fail(e, SNUG_EINPUT, "%s: the file is %lld bytes, shorter than the 8-byte header length; it is "
                         "truncated or not safetensors: re-download or re-save it", path, (long long)st.st_size);
    }
    void *m = mmap(NULL, (size_t)st.st_size, PROT_READ, MAP_PRIVATE, fd, 0);
    int err = errno;
    close(fd);
    if (m == MAP_FAILED)
        return snug_fail(e, SNUG_EIO, "cannot memory-map %s (%lld bytes): %s", path, (long long)st.st_size,
                         strerror(err));
    s->maps[fi] = m;
    s->map_sizes[fi] = (size_t)st.st_size;
    return parse_header(s, fi, e);
}

/* Sorts the set by name and rejects a name found in two files. */
static int finish_set(snug_st_set *s, snug_error *e) {
    if (s->ntensors > 1)
        qsort(s->tensors, s->ntensors, sizeof *s->tensors, tensor_cmp);
    for (int i = 1; i < s->ntensors; i++)
        if (strcmp(s->tensors[i - 1].name, s->tensors[i].name) == 0)
            return snug_fail(e, SNUG_EINPUT, "tensor \"%s\" is stored twice, in %s and in %s; remove one of the "
                             "files or re-save the model", s->tensors[i].name, s->paths[s->tensors[i - 1].file],
                             s->paths[s->tensors[i].file]);
    return 0;
}

int snug_st_open_file(snug_st_set *s, const char *path, snug_error *e) {
    memset(s, 0, sizeof *s);
    int rc = open_one(s, path, e);
    if (rc == 0)
        rc = finish_set(s, e);
    if (rc)
        snug_st_close(s);
    return rc;
}

/* Opens the shards that model.safetensors.index.json lists and checks every listed tensor is where it says. */
static int open_index(snug_st_set *s, const char *dir, const char *index_path, snug_error *e) {
    char *text = NULL;
    size_t len = 0;
    SNUG_TRY(snug_read_file(index_path, &text, &len, e));
    json_error_t je;
    json_t *root = snug_json_loadb(text, len, 0, &je);
    free(text);
    if (!root)
        return snug_fail(e, SNUG_EINPUT, "%s:%d:%d: invalid JSON: %s; re-download or re-save the model", index_path,
                         je.line, je.column, je.text);
    int rc = 0;
    const char **shards = NULL;
    int nshards = 0;
    char full[4096];
    json_t *wm = json_object_get(root, "weight_map");
    if (!json_is_object(wm) || json_object_size(wm) == 0) {
        rc = snug_fail(e, SNUG_EINPUT, "%s: \"weight_map\" is %s, expected an object mapping tensor names to shard "
                       "files; re-download or re-save the model", index_path,
                       !wm ? "missing" : json_is_object(wm) ? "empty" : snug_json_type_name(wm));
        goto out;
    }
    shards = calloc(json_object_size(wm), sizeof *shards);
    if (!shards) {
        rc = snug_fail(e, SNUG_ENOMEM, "out of memory reading %s", index_path);
        goto out;
    }
    const char *name;
    json_t *v;
    json_object_foreach(wm, name, v) {
        if (!json_is_string(v)) {
            rc = snug_fail(e, SNUG_EINPUT, "%s: weight_map.\"%s\" is %s, expected a shard file name", index_path,
                           name, snug_json_type_name(v));
            goto out;
        }
        const char *f = json_string_value(v);
        if (!snug_is_plain_name(f)) {
            rc = snug_fail(e, SNUG_EINPUT, "%s: weight_map puts tensor \"%s\" in \"%s\", which is not a file name of "
                           "the model folder; name its shard file (model-00001-of-00002.safetensors)", index_path,
                           name, f);
            goto out;
        }
        int k = 0;
        while (k < nshards && strcmp(shards[k], f) != 0)
            k++;
        if (k < nshards)
            continue;
        shards[nshards++] = f;
        snprintf(full, sizeof full, "%s/%s", dir, f);
        if (!snug_file_exists(full)) {
            rc = snug_fail(e, SNUG_EINPUT, "%s: weight_map puts tensor \"%s\" in shard \"%s\", but %s does not "
                           "exist; download the missing shard", index_path, name, f, full);
            goto out;
        }
        if ((rc = open_one(s, full, e)) != 0)
            goto out;
    }
    if ((rc = finish_set(s, e)) != 0)
        goto out;
    json_object_foreach(wm, name, v) {
        const char *f = json_string_value(v);
        const snug_st_tensor *t = snug_st_find(s, name);
        snprintf(full, sizeof full, "%s/%s", dir, f);
        if (!t) {
            rc = snug_fail(e, SNUG_EINPUT, "%s: weight_map puts tensor \"%s\" in %s, but that file has no such "
                           "tensor; re-download the shard or re-save the model", index_path, name, full);
            goto out;
        }
        if (strcmp(s->paths[t->file], full) != 0) {
            rc = snug_fail(e, SNUG_EINPUT, "%s: weight_map puts tensor \"%s\" in %s, but it is in %s; re-save the "
                           "model to rebuild the index", index_path, name, full, s->paths[t->file]);
            goto out;
        }
    }
out:
    free(shards);
    json_decref(root);
    return rc;
}

int snug_st_open_dir(snug_st_set *s, const char *dir, snug_error *e) {
    memset(s, 0, sizeof *s);
    char single[4096], index[4096], bin[4096];
    snprintf(single, sizeof single, "%s/model.safetensors", dir);
    snprintf(index, sizeof index, "%s/model.safetensors.index.json", dir);
    if (snug_file_exists(single))
        return snug_st_open_file(s, single, e);
    if (snug_file_exists(index)) {
        int rc = open_index(s, dir, index, e);
        if (rc)
            snug_st_close(s);
        return rc;
    }
    struct stat st;
    if (stat(dir, &st) != 0 || !S_ISDIR(st.st_mode))
        return snug_fail(e, SNUG_EINPUT, "model folder %s does not exist; give the path of a Hugging Face model "
                         "folder (with config.json and model.safetensors)", dir);
    snprintf(bin, sizeof bin, "%s/pytorch_model.bin", dir);
    const char *hint = snug_file_exists(bin) ? " (it has pytorch_model.bin: snug reads only safetensors; convert with "
                                               "transformers' save_pretrained(..., safe_serialization=True))"
                                             : "";
    return snug_fail(e, SNUG_EINPUT, "model folder %s has neither model.safetensors nor "
                     "model.safetensors.index.json%s; point to a Hugging Face model folder saved with safetensors",
                     dir, hint);
}

static int find_cmp(const void *key, const void *elem) {
    return strcmp((const char *)key, ((const snug_st_tensor *)elem)->name);
}

const snug_st_tensor *snug_st_find(const snug_st_set *s, const char *name) {
    if (!s->ntensors)
        return NULL;
    return bsearch(name, s->tensors, s->ntensors, sizeof *s->tensors, find_cmp);
}

void snug_st_close(snug_st_set *s) {
    for (int i = 0; i < s->ntensors; i++)
        free(s->tensors[i].name);
    for (int i = 0; i < s->nfiles; i++) {
        if (s->maps[i])
            munmap(s->maps[i], s->map_sizes[i]);
        free(s->paths[i]);
    }
    free(s->tensors);
    free(s->paths);
    free(s->maps);
    free(s->map_sizes);
    memset(s, 0, sizeof *s);
}

static int64_t numel_of(int ndim, const int64_t *shape) {
    int64_t n = 1;
    for (int d = 0; d < ndim; d++)
        n *= shape[d];
    return n;
}

/* Converts n consecutive elements of a float dtype to fp32 (the source may be unaligned). */
static void convert_run(snug_dtype dt, const unsigned char *p, float *out, size_t n) {
    switch (dt) {
    case SNUG_DT_F32:
        memcpy(out, p, n * 4);
        break;
    case SNUG_DT_BF16:
        for (size_t i = 0; i < n; i++) {
            uint16_t h;
            memcpy(&h, p + 2 * i, 2);
            uint32_t x = (uint32_t)h << 16; /* bf16 is the top half of fp32 */
            memcpy(&out[i], &x, 4);
        }
        break;
    case SNUG_DT_F16:
        for (size_t i = 0; i < n; i++) {
            uint16_t h;
            memcpy(&h, p + 2 * i, 2);
            out[i] = snug_f16_to_f32(h);
        }
        break;
    default: /* F64 */
        for (size_t i = 0; i < n; i++) {
            double d;
            memcpy(&d, p + 8 * i, 8);
            out[i] = (float)d;
        }
        break;
    }
}

/* The mapped pages of t's first `upto` bytes, once read, are dropped a block at a time (from *done on, whole pages
 * only), so converting a tensor never holds more than a block of its file pages: they come back from the file if
 * touched again. */
static void drop_read(const snug_st_tensor *t, size_t upto, uintptr_t *done) {
    uintptr_t page = (uintptr_t)sysconf(_SC_PAGESIZE), lo = (uintptr_t)t->data;
    uintptr_t a = *done ? *done : (lo + page - 1) / page * page, b = (lo + upto) / page * page;
    if (b < a + SNUG_ST_READ_BLOCK && upto < t->nbytes)
        return;
    if (b > a)
        madvise((void *)a, b - a, MADV_DONTNEED);
    *done = b > a ? b : a;
}

static int check_finite(const snug_st_set *s, const snug_st_tensor *t, const float *dst, size_t first, size_t n,
                        snug_error *e);

static int check_float(const snug_st_set *s, const snug_st_tensor *t, snug_error *e) {
    if (t->dtype != SNUG_DT_F32 && t->dtype != SNUG_DT_F16 && t->dtype != SNUG_DT_BF16 && t->dtype != SNUG_DT_F64)
        return snug_fail(e, SNUG_EINPUT, "%s: tensor \"%s\" is stored as %s; snug reads weights as F32, F16 or BF16 "
                         "(dequantize or convert the checkpoint first)", s->paths[t->file], t->name,
                         t->dtype == SNUG_DT_UNSUPPORTED ? "a dtype snug does not support" : snug_dtype_name(t->dtype));
    return 0;
}

int snug_st_to_f32_range(const snug_st_set *s, const snug_st_tensor *t, float *dst, size_t first, size_t n,
                         snug_error *e) {
    SNUG_TRY(check_float(s, t, e));
    size_t esz = snug_dtype_size(t->dtype), run = SNUG_ST_READ_BLOCK / esz;
    uintptr_t dropped = 0;
    for (size_t i = 0; i < n; i += run) {
        size_t k = n - i < run ? n - i : run;
        convert_run(t->dtype, (const unsigned char *)t->data + (first + i) * esz, dst + i, k);
        drop_read(t, (first + i + k) * esz, &dropped);
    }
    return check_finite(s, t, dst, first, n, e);
}

int snug_st_to_f32(const snug_st_set *s, const snug_st_tensor *t, float *dst, int transpose2d, snug_error *e) {
    if (!transpose2d)
        return snug_st_to_f32_range(s, t, dst, 0, (size_t)numel_of(t->ndim, t->shape), e);
    const char *path = s->paths[t->file];
    size_t esz = snug_dtype_size(t->dtype);
    SNUG_TRY(check_float(s, t, e));
    if (t->ndim != 2)
        return snug_fail(e, SNUG_EINPUT, "%s: tensor \"%s\" has %d dimensions where a 2-D weight was expected; the "
                         "checkpoint does not match the architecture in config.json", path, t->name, t->ndim);
    size_t n = (size_t)numel_of(t->ndim, t->shape);
    const unsigned char *src = t->data;
    uintptr_t dropped = 0;
    if (n > 0) {
        /* [R, K] in the file -> [K, R] in dst: convert a row, then scatter it into column r. */
        size_t R = (size_t)t->shape[0], K = (size_t)t->shape[1];
        float *row = malloc(K * sizeof *row);
        if (!row)
            return snug_fail(e, SNUG_ENOMEM, "out of memory converting tensor \"%s\" of %s", t->name, path);
        for (size_t r = 0; r < R; r++) {
            convert_run(t->dtype, src + r * K * esz, row, K);
            for (size_t k = 0; k < K; k++)
                dst[k * R + r] = row[k];
            drop_read(t, (r + 1) * K * esz, &dropped);
        }
        free(row);
    }
    return check_finite(s, t, dst, 0, n, e);
}

/* One branch-free pass over dst (elements [first, first+n) of t) for NaN/Inf (exponent all ones); the search for
 * where runs only on failure. */
static int check_finite(const snug_st_set *s, const snug_st_tensor *t, const float *dst, size_t first, size_t n,
                        snug_error *e) {
    const char *path = s->paths[t->file];
    size_t esz = snug_dtype_size(t->dtype);
    const unsigned char *src = (const unsigned char *)t->data + first * esz;
    uint32_t bad = 0;
    for (size_t i = 0; i < n; i++) {
        uint32_t x;
        memcpy(&x, &dst[i], 4);
        bad |= (x & 0x7f800000u) == 0x7f800000u;
    }
    for (size_t i = 0; bad && i < n; i++) {
        float v;
        convert_run(t->dtype, src + i * esz, &v, 1);
        if (!isfinite(v))
            return snug_fail(e, SNUG_EINPUT, "%s: tensor \"%s\" holds %s at flat index %zu; the checkpoint is "
                             "corrupt or was saved after training diverged: use another checkpoint", path, t->name,
                             isnan(v) ? "NaN" : "an infinite value", first + i);
    }
    if (bad) /* the search always finds what the pass saw */
        return snug_fail(e, SNUG_EINTERNAL, "%s: tensor \"%s\": non-finite value not located", path, t->name);
    return 0;
}

/* ---------------------------------------------------------------------------------------------------------------- */
/* Writing */

static int out_name_cmp(const void *a, const void *b) {
    return strcmp((*(const snug_st_out *const *)a)->name, (*(const snug_st_out *const *)b)->name);
}

/* The reference writer's order: larger dtypes first (so every tensor starts aligned), then by name. */
static int out_layout_cmp(const void *a, const void *b) {
    const snug_st_out *x = *(const snug_st_out *const *)a, *y = *(const snug_st_out *const *)b;
    size_t sx = snug_dtype_size(x->dtype), sy = snug_dtype_size(y->dtype);
    if (sx != sy)
        return sx > sy ? -1 : 1;
    return strcmp(x->name, y->name);
}

static int check_out(const char *path, const snug_st_out *t, snug_error *e) {
    if (!t->name || strcmp(t->name, "__metadata__") == 0)
        return snug_fail(e, SNUG_EINTERNAL, "writing %s: a tensor has no name or is named __metadata__", path);
    if (t->raw && (snug_dtype_size(t->dtype) == 0 || t->transpose2d))
        return snug_fail(e, SNUG_EINTERNAL, "writing %s: tensor \"%s\": raw bytes need a dtype snug knows and no "
                         "transpose", path, t->name);
    if (!t->raw && t->dtype != SNUG_DT_F32 && t->dtype != SNUG_DT_BF16 && t->dtype != SNUG_DT_F16)
        return snug_fail(e, SNUG_EINTERNAL, "writing %s: tensor \"%s\": dtype must be F32, BF16 or F16", path,
                         t->name);
    if (t->ndim < 0 || t->ndim > SNUG_ST_MAXDIM || (t->transpose2d && t->ndim != 2))
        return snug_fail(e, SNUG_EINTERNAL, "writing %s: tensor \"%s\": bad rank %d%s", path, t->name, t->ndim,
                         t->transpose2d ? " for a transposed (2-D) tensor" : "");
    for (int d = 0; d < t->ndim; d++)
        if (t->shape[d] < 0)
            return snug_fail(e, SNUG_EINTERNAL, "writing %s: tensor \"%s\": shape[%d] is negative", path, t->name, d);
    if (t->fill && (t->raw || t->h16))
        return snug_fail(e, SNUG_EINTERNAL, "writing %s: tensor \"%s\": a stream and another source", path, t->name);
    if (!t->f32 && !t->h16 && !t->raw && !t->fill && numel_of(t->ndim, t->shape) > 0)
        return snug_fail(e, SNUG_EINTERNAL, "writing %s: tensor \"%s\": no source data", path, t->name);
    return 0;
}

/* Builds the compact JSON header, padded with spaces so that 8 + length is a multiple of 8. */
static int build_header(const char *path, const snug_st_out *const *order, int n, char **out, size_t *len,
                        snug_error *e) {
    json_t *root = json_object(), *meta = json_object();
    int bad = !root || !meta || json_object_set_new(meta, "format", json_string("pt")) ||
              json_object_set_new(root, "__metadata__", meta);
    uint64_t off = 0;
    for (int i = 0; i < n && !bad; i++) {
        const snug_st_out *t = order[i];
        json_t *shape = json_array(), *offs = json_array(), *ent = json_object();
        for (int d = 0; d < t->ndim; d++)
            bad |= json_array_append_new(shape, json_integer(t->shape[d]));
        uint64_t nbytes = (uint64_t)numel_of(t->ndim, t->shape) * snug_dtype_size(t->dtype);
        bad |= json_array_append_new(offs, json_integer((json_int_t)off));
        bad |= json_array_append_new(offs, json_integer((json_int_t)(off + nbytes)));
        bad |= json_object_set_new(ent, "dtype", json_string(snug_dtype_name(t->dtype)));
        bad |= json_object_set_new(ent, "shape", shape);
        bad |= json_object_set_new(ent, "data_offsets", offs);
        if (json_object_set_new(root, t->name, ent) != 0) {
            json_decref(root);
            return snug_fail(e, SNUG_EINTERNAL, "writing %s: tensor name \"%s\" is not valid UTF-8", path, t->name);
        }
        off += nbytes;
    }
    char *js = bad ? NULL : json_dumps(root, JSON_COMPACT);
    json_decref(root);
    if (!js)
        return snug_fail(e, SNUG_ENOMEM, "out of memory building the header of %s", path);
    size_t jn = strlen(js), padded = jn + (8 - (8 + jn) % 8) % 8;
    char *h = realloc(js, padded + 1);
    if (!h) {
        free(js);
        return snug_fail(e, SNUG_ENOMEM, "out of memory building the header of %s", path);
    }
    memset(h + jn, ' ', padded - jn);
    h[padded] = '\0';
    *out = h;
    *len = padded;
    return 0;
}

static inline float out_value(const snug_st_out *t, size_t i) {
    if (!t->h16)
        return t->f32[i];
    return t->h16_dtype == SNUG_DT_BF16 ? snug_bf16_to_f32(t->h16[i]) : snug_f16_to_f32(t->h16[i]);
}

static inline void store(unsigned char *dst, snug_dtype dt, float v) {
    if (dt == SNUG_DT_F32) {
        memcpy(dst, &v, 4);
    } else {
        uint16_t h = dt == SNUG_DT_BF16 ? snug_f32_to_bf16(v) : snug_f32_to_f16(v);
        memcpy(dst, &h, 2);
    }
}

/* out[r * nk + k] = src[k * R + r] for r < nr, k < nk, in 8 x 8 tiles: a tile's 8 source lines and 8 output lines
 * stay in L1 (whole rows or columns at a time fight over a few cache sets when a row is a multiple of 4 KiB). */
static void transpose_tiles(float *out, const float *src, size_t R, size_t nr, size_t nk) {
    for (size_t kt = 0; kt < nk; kt += 8)
        for (size_t rt = 0; rt < nr; rt += 8)
            for (size_t r = rt; r < rt + 8 && r < nr; r++)
                for (size_t k = kt; k < kt + 8 && k < nk; k++)
                    out[r * nk + k] = src[k * R + r];
}

/* Converts and writes one tensor's data: raw bytes, and F32 from fp32 in place, as they are; the rest through buf.
 * A transposed tensor goes out a band of whole output rows at a time (part of one row when a row is longer than
 * buf), transposed in small tiles. */
static int write_data(snug_atomic_file *af, const snug_st_out *t, unsigned char *buf, size_t bufsize,
                      snug_error *e) {
    size_t n = (size_t)numel_of(t->ndim, t->shape), esz = snug_dtype_size(t->dtype);
    if (!n)
        return 0;
    if (t->raw)
        return snug_atomic_write(af, t->raw, n * esz, e);
    if (!t->transpose2d && !t->h16 && t->dtype == SNUG_DT_F32)
        return snug_atomic_write(af, t->f32, n * 4, e);
    /* the output is [R, K]; its (r, k) is the source's (k, r) of [K, R] when transposed */
    size_t R = t->transpose2d ? (size_t)t->shape[0] : 1, K = t->transpose2d ? (size_t)t->shape[1] : n;
    size_t rows = bufsize / esz / K, cols = rows ? K : bufsize / esz;
    if (!rows)
        rows = 1;
    for (size_t r0 = 0; r0 < R; r0 += rows) {
        size_t nr = R - r0 < rows ? R - r0 : rows;
        for (size_t k0 = 0; k0 < K; k0 += cols) {
            size_t nk = K - k0 < cols ? K - k0 : cols;
            if (!t->transpose2d) {
                for (size_t k = 0; k < nk; k++)
                    store(buf + k * esz, t->dtype, out_value(t, k0 + k));
            } else if (!t->h16 && t->dtype == SNUG_DT_F32) {
                transpose_tiles((float *)buf, t->f32 + k0 * R + r0, R, nr, nk);
            } else { /* converted, in the same tiles */
                for (size_t kt = 0; kt < nk; kt += 8)
                    for (size_t rt = 0; rt < nr; rt += 8)
                        for (size_t r = rt; r < rt + 8 && r < nr; r++)
                            for (size_t k = kt; k < kt + 8 && k < nk; k++)
                                store(buf + (r * nk + k) * esz, t->dtype, out_value(t, (k0 + k) * R + r0 + r));
            }
            SNUG_TRY(snug_atomic_write(af, buf, nr * nk * esz, e));
        }
    }
    return 0;
}

/* The tensors checked, in the order their data goes in the file. */
static int layout_order(const char *path, const snug_st_out *t, int n, const snug_st_out **order, snug_error *e) {
    for (int i = 0; i < n; i++) {
        SNUG_TRY(check_out(path, &t[i], e));
        order[i] = &t[i];
    }
    qsort(order, n, sizeof *order, out_name_cmp);
    for (int i = 1; i < n; i++)
        if (strcmp(order[i - 1]->name, order[i]->name) == 0)
            return snug_fail(e, SNUG_EINTERNAL, "writing %s: tensor \"%s\" given twice", path, order[i]->name);
    qsort(order, n, sizeof *order, out_layout_cmp);
    return 0;
}

int snug_st_write_order(const snug_st_out *t, int n, int *idx, snug_error *e) {
    const snug_st_out **order = malloc((n > 0 ? n : 1) * sizeof *order);
    if (!order)
        return snug_fail(e, SNUG_ENOMEM, "out of memory ordering the tensors of a safetensors file");
    int rc = layout_order("(safetensors)", t, n, order, e);
    for (int i = 0; !rc && i < n; i++)
        idx[i] = (int)(order[i] - t);
    free(order);
    return rc;
}

int snug_st_write(const char *path, const snug_st_out *t, int n, const snug_write_opts *opts, snug_error *e) {
    const snug_st_out **order = malloc((n > 0 ? n : 1) * sizeof *order);
    const size_t bufsize = (size_t)1 << 20;
    unsigned char *buf = malloc(bufsize);
    float *tensor = NULL; /* the streamed tensors' values, one at a time */
    size_t largest = 0;
    for (int i = 0; i < n; i++)
        if (t[i].fill && (size_t)numel_of(t[i].ndim, t[i].shape) > largest)
            largest = (size_t)numel_of(t[i].ndim, t[i].shape);
    char *hdr = NULL;
    snug_atomic_file af = {0};
    int rc = 0;
    if (!order || !buf || (largest && !(tensor = malloc(largest * sizeof *tensor)))) {
        rc = snug_fail(e, SNUG_ENOMEM, "out of memory writing %s", path);
        goto out;
    }
    if ((rc = layout_order(path, t, n, order, e)) != 0)
        goto out;
    size_t hlen = 0;
    if ((rc = build_header(path, order, n, &hdr, &hlen, e)) != 0)
        goto out;
    unsigned char len8[8];
    for (int i = 0; i < 8; i++)
        len8[i] = (unsigned char)((uint64_t)hlen >> (8 * i));
    if ((rc = snug_atomic_open(&af, path, opts, e)) != 0 || (rc = snug_atomic_write(&af, len8, 8, e)) != 0 ||
        (rc = snug_atomic_write(&af, hdr, hlen, e)) != 0)
        goto out;
    for (int i = 0; i < n; i++) {
        snug_st_out one = *order[i];
        if (one.fill) { /* the stream's next tensor, then written as fp32 values in memory are */
            if ((rc = one.fill(one.fill_ud, one.fill_tag, tensor, e)) != 0)
                goto out;
            one.f32 = tensor;
        }
        if ((rc = write_data(&af, &one, buf, bufsize, e)) != 0)
            goto out;
    }
    rc = snug_atomic_commit(&af, e);
out:
    if (rc)
        snug_atomic_abort(&af);
    free(hdr);
    free(buf);
    free(tensor);
    free(order);
    return rc;
}

void snug_st_release(const snug_st_set *s, const snug_st_tensor *t) {
    long page = sysconf(_SC_PAGESIZE);
    uintptr_t lo = (uintptr_t)t->data, hi = lo + t->nbytes;
    uintptr_t a = (lo + (uintptr_t)page - 1) / (uintptr_t)page * (uintptr_t)page;
    uintptr_t b = hi / (uintptr_t)page * (uintptr_t)page;
    (void)s;
    if (b > a)
        madvise((void *)a, b - a, MADV_DONTNEED);
}
