/* gguf.c: the GGUF writer (see gguf.h). Little-endian hosts only, as snug's other file formats. */
#include "model/gguf.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/dtype.h"
#include "core/fileio.h"

void snug_gguf_init(snug_gguf *g) { memset(g, 0, sizeof *g); }

void snug_gguf_free(snug_gguf *g) {
    for (int i = 0; i < g->nt; i++)
        free(g->t[i].name);
    free(g->t);
    free(g->kv);
    memset(g, 0, sizeof *g);
}

static void put(snug_gguf *g, const void *p, size_t n) {
    if (g->oom || !n) /* (an empty array's values may be NULL) */
        return;
    if (g->kv_cap - g->kv_len < n) {
        size_t cap = g->kv_cap ? g->kv_cap : 4096;
        while (cap - g->kv_len < n)
            cap *= 2;
        unsigned char *k = realloc(g->kv, cap);
        if (!k) {
            g->oom = 1;
            return;
        }
        g->kv = k, g->kv_cap = cap;
    }
    memcpy(g->kv + g->kv_len, p, n);
    g->kv_len += n;
}
static void put_u32(snug_gguf *g, uint32_t v) { put(g, &v, 4); }
static void put_u64(snug_gguf *g, uint64_t v) { put(g, &v, 8); }
static void put_str(snug_gguf *g, const char *s, size_t n) { put_u64(g, n), put(g, s, n); }
static void key(snug_gguf *g, const char *k, uint32_t vtype) {
    put_str(g, k, strlen(k));
    put_u32(g, vtype);
    g->n_kv++;
}

void snug_gguf_kv_str(snug_gguf *g, const char *k, const char *val) {
    key(g, k, SNUG_GGUF_V_STRING);
    put_str(g, val, strlen(val));
}
void snug_gguf_kv_u32(snug_gguf *g, const char *k, uint32_t val) { key(g, k, SNUG_GGUF_V_U32), put_u32(g, val); }
void snug_gguf_kv_i32(snug_gguf *g, const char *k, int32_t val) { key(g, k, SNUG_GGUF_V_I32), put(g, &val, 4); }
void snug_gguf_kv_f32(snug_gguf *g, const char *k, float val) { key(g, k, SNUG_GGUF_V_F32), put(g, &val, 4); }
void snug_gguf_kv_bool(snug_gguf *g, const char *k, int val) {
    uint8_t b = val != 0;
    key(g, k, SNUG_GGUF_V_BOOL), put(g, &b, 1);
}
void snug_gguf_kv_strs(snug_gguf *g, const char *k, const char *const *s, const size_t *lens, size_t n) {
    key(g, k, SNUG_GGUF_V_ARRAY);
    put_u32(g, SNUG_GGUF_V_STRING), put_u64(g, n);
    for (size_t i = 0; i < n; i++)
        put_str(g, s[i], lens ? lens[i] : strlen(s[i]));
}
void snug_gguf_kv_i32s(snug_gguf *g, const char *k, const int32_t *v, size_t n) {
    key(g, k, SNUG_GGUF_V_ARRAY);
    put_u32(g, SNUG_GGUF_V_I32), put_u64(g, n), put(g, v, n * 4);
}
void snug_gguf_kv_f32s(snug_gguf *g, const char *k, const float *v, size_t n) {
    key(g, k, SNUG_GGUF_V_ARRAY);
    put_u32(g, SNUG_GGUF_V_F32), put_u64(g, n), put(g, v, n * 4);
}

const char *snug_gguf_type_name(snug_gguf_type type) {
    switch (type) {
    case SNUG_GGUF_F32: return "f32";
    case SNUG_GGUF_F16: return "f16";
    case SNUG_GGUF_BF16: return "bf16";
    case SNUG_GGUF_Q8_0: return "q8_0";
    }
    return "?";
}

size_t snug_gguf_nbytes(snug_gguf_type type, size_t n) {
    switch (type) {
    case SNUG_GGUF_F32: return n * 4;
    case SNUG_GGUF_F16:
    case SNUG_GGUF_BF16: return n * 2;
    case SNUG_GGUF_Q8_0: return n / SNUG_GGUF_QK8_0 * (2 + SNUG_GGUF_QK8_0);
    }
    return 0;
}

void snug_gguf_quantize_q8_0(const float *x, size_t n, uint8_t *out) {
    for (size_t b = 0; b < n / SNUG_GGUF_QK8_0; b++, x += SNUG_GGUF_QK8_0, out += 2 + SNUG_GGUF_QK8_0) {
        float amax = 0.0f;
        for (int j = 0; j < SNUG_GGUF_QK8_0; j++)
            amax = fmaxf(amax, fabsf(x[j]));
        const float d = amax / 127.0f, id = d != 0.0f ? 1.0f / d : 0.0f;
        uint16_t dh = snug_f32_to_f16(d);
        memcpy(out, &dh, 2);
        for (int j = 0; j < SNUG_GGUF_QK8_0; j++)
            out[2 + j] = (uint8_t)(int8_t)roundf(x[j] * id);
    }
}

static size_t numel(const snug_gguf_tensor *t) {
    size_t n = 1;
    for (int i = 0; i < t->ndim; i++)
        n *= (size_t)t->shape[i];
    return n;
}

static size_t pad_to(size_t n) { return (n + SNUG_GGUF_ALIGN - 1) / SNUG_GGUF_ALIGN * SNUG_GGUF_ALIGN; }

int snug_gguf_add_tensor(snug_gguf *g, const char *name, snug_gguf_type type, int ndim, const int64_t *shape,
                         snug_gguf_fill_fn fill, void *ud, int tag, snug_error *e) {
    if (ndim < 1 || ndim > 4)
        return snug_fail(e, SNUG_EINTERNAL, "GGUF tensor %s: %d dimensions (1 to 4)", name, ndim);
    if (type == SNUG_GGUF_Q8_0 && shape[ndim - 1] % SNUG_GGUF_QK8_0)
        return snug_fail(e, SNUG_EINTERNAL, "GGUF tensor %s: q8_0 needs rows of a multiple of 32 values, not %lld",
                         name, (long long)shape[ndim - 1]);
    if (g->nt == g->t_cap) {
        int cap = g->t_cap ? 2 * g->t_cap : 64;
        snug_gguf_tensor *t = realloc(g->t, (size_t)cap * sizeof *t);
        if (!t)
            return snug_fail(e, SNUG_ENOMEM, "out of host memory listing the GGUF tensors");
        g->t = t, g->t_cap = cap;
    }
    snug_gguf_tensor *t = &g->t[g->nt];
    memset(t, 0, sizeof *t);
    if (!(t->name = strdup(name)))
        return snug_fail(e, SNUG_ENOMEM, "out of host memory listing the GGUF tensors");
    t->type = type, t->ndim = ndim, t->fill = fill, t->ud = ud, t->tag = tag;
    memcpy(t->shape, shape, (size_t)ndim * sizeof *shape);
    g->nt++;
    return 0;
}

/* The tensor infos: name, dims (ne0 first: the row-major shape reversed), type, offset from the data's start. */
static void put_infos(snug_gguf *g, snug_gguf *out) {
    uint64_t off = 0;
    for (int i = 0; i < g->nt; i++) {
        const snug_gguf_tensor *t = &g->t[i];
        put_str(out, t->name, strlen(t->name));
        put_u32(out, (uint32_t)t->ndim);
        for (int d = t->ndim - 1; d >= 0; d--)
            put_u64(out, (uint64_t)t->shape[d]);
        put_u32(out, (uint32_t)t->type);
        put_u64(out, off);
        off += pad_to(snug_gguf_nbytes(t->type, numel(t)));
    }
}

/* Converts n fp32 values to type into dst. */
static void convert(snug_gguf_type type, const float *x, size_t n, void *dst) {
    uint16_t *h = dst;
    switch (type) {
    case SNUG_GGUF_F32: memcpy(dst, x, n * 4); break;
    case SNUG_GGUF_F16:
        for (size_t i = 0; i < n; i++)
            h[i] = snug_f32_to_f16(x[i]);
        break;
    case SNUG_GGUF_BF16:
        for (size_t i = 0; i < n; i++)
            h[i] = snug_f32_to_bf16(x[i]);
        break;
    case SNUG_GGUF_Q8_0: snug_gguf_quantize_q8_0(x, n, dst); break;
    }
}

int snug_gguf_write(snug_gguf *g, const char *path, snug_error *e) {
    snug_gguf head;
    snug_gguf_init(&head);
    put(&head, "GGUF", 4);
    put_u32(&head, 3);
    put_u64(&head, (uint64_t)g->nt);
    put_u64(&head, g->n_kv);
    put(&head, g->kv, g->kv_len);
    put_infos(g, &head);
    static const unsigned char zeros[SNUG_GGUF_ALIGN] = {0};
    put(&head, zeros, pad_to(head.kv_len) - head.kv_len);
    size_t most = 0;
    for (int i = 0; i < g->nt; i++)
        most = numel(&g->t[i]) > most ? numel(&g->t[i]) : most;
    float *x = malloc(most * sizeof *x + 1);
    void *buf = malloc(most * 4 + 1);
    int rc = 0;
    if (g->oom || head.oom || !x || !buf)
        rc = snug_fail(e, SNUG_ENOMEM, "out of host memory writing %s", path);
    snug_atomic_file af;
    if (!rc)
        rc = snug_atomic_open(&af, path, NULL, e);
    if (!rc) {
        rc = snug_atomic_write(&af, head.kv, head.kv_len, e);
        for (int i = 0; !rc && i < g->nt; i++) {
            const snug_gguf_tensor *t = &g->t[i];
            size_t n = numel(t), nb = snug_gguf_nbytes(t->type, n);
            rc = t->fill(t->ud, t->tag, x, e);
            if (!rc) {
                convert(t->type, x, n, buf);
                rc = snug_atomic_write(&af, buf, nb, e);
            }
            if (!rc)
                rc = snug_atomic_write(&af, zeros, pad_to(nb) - nb, e);
        }
        if (!rc)
            rc = snug_atomic_commit(&af, e);
        else
            snug_atomic_abort(&af);
    }
    free(x);
    free(buf);
    snug_gguf_free(&head);
    return rc;
}
