/* quant4_io.c: bitsandbytes' files of a quantized weight (see quant4.h): the quant_state JSON of a 4-bit weight
 * (written and parsed as bitsandbytes' QuantState.as_dict and from_dict do), and the safetensors parts transformers
 * saves beside it (absmax, quant_map, nested_absmax, nested_quant_map, the quant_state; an 8-bit weight's SCB), read
 * as views with every part's dtype and count checked. quant4.c holds the code books and the arithmetic. */
#include "model/quant4.h"

#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/json_util.h"

/* ---------------------------------------------------------------------------------------------------------------- */
/* quant_state JSON */

int snug_q4_state_json(const snug_q4_tensor *t, char *buf, size_t cap, size_t *len, snug_error *e) {
    const char *dt = snug_q4_dtype_name(t->dtype);
    if (!dt)
        return snug_fail(e, SNUG_EINTERNAL, "quant_state: dtype %s has no torch name", snug_dtype_name(t->dtype));
    int k = snprintf(buf, cap, "{\"quant_type\": \"%s\", \"blocksize\": %d, \"dtype\": \"%s\", \"shape\": [%lld, %lld]",
                     snug_q4_type_name(t->type), t->blocksize, dt, (long long)t->shape[0], (long long)t->shape[1]);
    if (t->nested && k > 0 && (size_t)k < cap) {
        char off[32];
        snug_json_py_float((double)t->nested_offset, off);
        k += snprintf(buf + k, cap - (size_t)k, ", \"nested_blocksize\": %d, \"nested_dtype\": \"float32\", "
                      "\"nested_offset\": %s", t->nested_blocksize, off);
    }
    if (k > 0 && (size_t)k < cap)
        k += snprintf(buf + k, cap - (size_t)k, "}");
    if (k < 0 || (size_t)k >= cap)
        return snug_fail(e, SNUG_EINTERNAL, "quant_state JSON longer than its %zu-byte buffer", cap);
    *len = (size_t)k;
    return 0;
}

#define QS_FIX "the file is corrupt or was not written by bitsandbytes; re-download or re-quantize the model"

/* An integer member of the quant_state, or -1 (message filled) when absent or not an integer. */
static int qs_int(json_t *root, const char *key, const char *where, long long *out, snug_error *e) {
    json_t *v = json_object_get(root, key);
    if (!v)
        return snug_fail(e, SNUG_EINPUT, "%s: quant_state has no \"%s\"; %s", where, key, QS_FIX);
    if (!json_is_integer(v))
        return snug_fail(e, SNUG_EINPUT, "%s: quant_state \"%s\" must be an integer, got %s; %s", where, key,
                         snug_json_type_name(v), QS_FIX);
    *out = (long long)json_integer_value(v);
    return 0;
}

static int qs_str(json_t *root, const char *key, const char *where, const char **out, snug_error *e) {
    json_t *v = json_object_get(root, key);
    if (!v)
        return snug_fail(e, SNUG_EINPUT, "%s: quant_state has no \"%s\"; %s", where, key, QS_FIX);
    if (!json_is_string(v))
        return snug_fail(e, SNUG_EINPUT, "%s: quant_state \"%s\" must be a string, got %s; %s", where, key,
                         snug_json_type_name(v), QS_FIX);
    *out = json_string_value(v);
    return 0;
}

static int parse_root(json_t *root, const char *where, snug_q4_tensor *t, snug_error *e) {
    static const char *const known[] = {"quant_type", "blocksize", "dtype", "shape",
                                        "nested_blocksize", "nested_dtype", "nested_offset"};
    if (!json_is_object(root))
        return snug_fail(e, SNUG_EINPUT, "%s: quant_state must be a JSON object, got %s; %s", where,
                         snug_json_type_name(root), QS_FIX);
    const char *key;
    json_t *val;
    int nnested = 0;
    json_object_foreach(root, key, val) {
        size_t k = 0;
        while (k < sizeof known / sizeof known[0] && strcmp(key, known[k]) != 0)
            k++;
        if (k == sizeof known / sizeof known[0])
            return snug_fail(e, SNUG_EINPUT, "%s: quant_state has unknown key \"%s\" (bitsandbytes writes only "
                             "quant_type, blocksize, dtype, shape, nested_blocksize, nested_dtype, nested_offset); %s",
                             where, key, QS_FIX);
        nnested += k >= 4;
    }
    memset(t, 0, sizeof *t);
    const char *s = NULL;
    long long v = 0;
    SNUG_TRY(qs_str(root, "quant_type", where, &s, e));
    if (strcmp(s, "nf4") == 0)
        t->type = SNUG_Q4_NF4;
    else if (strcmp(s, "fp4") == 0)
        t->type = SNUG_Q4_FP4;
    else
        return snug_fail(e, SNUG_EINPUT, "%s: quant_state quant_type \"%s\" is not \"nf4\" or \"fp4\"; snug loads "
                         "only bitsandbytes' 4-bit formats", where, s);
    SNUG_TRY(qs_int(root, "blocksize", where, &v, e));
    if (v < 32 || v > 4096 || (v & (v - 1)) != 0)
        return snug_fail(e, SNUG_EINPUT, "%s: quant_state blocksize %lld is not one bitsandbytes takes (32, 64, "
                         "128, 256, 512, 1024, 2048, 4096); %s", where, v, QS_FIX);
    t->blocksize = (int)v;
    SNUG_TRY(qs_str(root, "dtype", where, &s, e));
    if (strcmp(s, "bfloat16") == 0)
        t->dtype = SNUG_DT_BF16;
    else if (strcmp(s, "float16") == 0)
        t->dtype = SNUG_DT_F16;
    else if (strcmp(s, "float32") == 0)
        t->dtype = SNUG_DT_F32;
    else
        return snug_fail(e, SNUG_EINPUT, "%s: quant_state dtype \"%s\" is not bfloat16, float16 or float32; %s",
                         where, s, QS_FIX);
    json_t *shape = json_object_get(root, "shape");
    if (!shape)
        return snug_fail(e, SNUG_EINPUT, "%s: quant_state has no \"shape\"; %s", where, QS_FIX);
    if (!json_is_array(shape))
        return snug_fail(e, SNUG_EINPUT, "%s: quant_state shape must be an array [out_features, in_features], got %s; "
                         "%s", where, snug_json_type_name(shape), QS_FIX);
    if (json_array_size(shape) != 2)
        return snug_fail(e, SNUG_EINPUT, "%s: quant_state shape has %zu dimensions; snug loads 4-bit Linear weights "
                         "([out_features, in_features]) only", where, json_array_size(shape));
    for (int d = 0; d < 2; d++) {
        json_t *x = json_array_get(shape, (size_t)d);
        if (!json_is_integer(x) || json_integer_value(x) <= 0)
            return snug_fail(e, SNUG_EINPUT, "%s: quant_state shape[%d] must be a positive integer; %s", where, d,
                             QS_FIX);
        t->shape[d] = (int64_t)json_integer_value(x);
    }
    if (t->shape[0] > INT64_MAX / t->shape[1] || (uint64_t)(t->shape[0] * t->shape[1]) > SIZE_MAX / 2)
        return snug_fail(e, SNUG_EINPUT, "%s: quant_state shape [%lld, %lld] is too large; %s", where,
                         (long long)t->shape[0], (long long)t->shape[1], QS_FIX);
    t->n = (size_t)t->shape[0] * (size_t)t->shape[1];
    if (nnested == 0)
        return 0;
    if (nnested != 3)
        return snug_fail(e, SNUG_EINPUT, "%s: quant_state has %d of nested_blocksize, nested_dtype and nested_offset; "
                         "double quantization needs all three, plain quantization none; %s", where, nnested, QS_FIX);
    t->nested = 1;
    SNUG_TRY(qs_int(root, "nested_blocksize", where, &v, e));
    if (v != SNUG_Q4_NESTED_BLOCKSIZE)
        return snug_fail(e, SNUG_EINPUT, "%s: quant_state nested_blocksize %lld: snug loads 256 only, what "
                         "bitsandbytes' quantize_4bit writes; re-quantize the model with bitsandbytes or snug",
                         where, v);
    t->nested_blocksize = (int)v;
    SNUG_TRY(qs_str(root, "nested_dtype", where, &s, e));
    if (strcmp(s, "float32") != 0)
        return snug_fail(e, SNUG_EINPUT, "%s: quant_state nested_dtype \"%s\" is not float32 (bitsandbytes' absmax "
                         "dtype); %s", where, s, QS_FIX);
    json_t *off = json_object_get(root, "nested_offset");
    if (!json_is_number(off) || !isfinite(json_number_value(off)))
        return snug_fail(e, SNUG_EINPUT, "%s: quant_state nested_offset must be a finite number, got %s; %s", where,
                         snug_json_type_name(off), QS_FIX);
    t->nested_offset = (float)json_number_value(off); /* torch.tensor(float(...)): the double rounded to fp32 */
    return 0;
}

int snug_q4_state_parse(const char *json, size_t len, const char *where, snug_q4_tensor *t, snug_error *e) {
    json_error_t jerr;
    json_t *root = snug_json_loadb(json, len, JSON_REJECT_DUPLICATES, &jerr);
    if (!root)
        return snug_fail(e, SNUG_EINPUT, "%s: quant_state is not valid JSON (%s at line %d column %d); %s", where,
                         jerr.text, jerr.line, jerr.column, QS_FIX);
    int rc = parse_root(root, where, t, e);
    json_decref(root);
    return rc;
}

/* ---------------------------------------------------------------------------------------------------------------- */
/* safetensors */

static const char *const qs_suffix[2] = {".quant_state.bitsandbytes__nf4", ".quant_state.bitsandbytes__fp4"};

/* "<name><suffix>" into buf; 0 when it does not fit. */
static int join(char *buf, size_t cap, const char *name, const char *suffix) {
    int k = snprintf(buf, cap, "%s%s", name, suffix);
    return k > 0 && (size_t)k < cap;
}

/* bitsandbytes' 8-bit weight "<module>.weight" keeps its row scales in "<module>.SCB" (and may say its layout in
 * "<module>.weight_format"): the name of that part into buf, 0 when name is no "*.weight" or it does not fit. */
static int q8_part(char *buf, size_t cap, const char *name, const char *part) {
    size_t n = strlen(name);
    if (n < 7 || strcmp(name + n - 7, ".weight") != 0)
        return 0;
    int k = snprintf(buf, cap, "%.*s.%s", (int)(n - 7), name, part);
    return k > 0 && (size_t)k < cap;
}

int snug_q4_st_detect(const snug_st_set *s, const char *name) {
    char key[1024];
    for (int q = 0; q < 2; q++)
        if (join(key, sizeof key, name, qs_suffix[q]) && snug_st_find(s, key))
            return 1;
    return q8_part(key, sizeof key, name, "SCB") && snug_st_find(s, key);
}

/* The 8-bit weight `name` with its row scales scb (transformers' save of a load_in_8bit model): I8 [out, in] codes,
 * F32 [out] scales, finite and not negative, and a weight_format, when there is one, of 0 ("row", the only layout
 * bitsandbytes reads). */
static int q8_view(const snug_st_set *s, const char *name, const snug_st_tensor *scb, snug_q4_tensor *t,
                   snug_error *e) {
    char key[1024];
    const snug_st_tensor *w = snug_st_find(s, name);
    const char *path = s->paths[scb->file];
    if (!w)
        return snug_fail(e, SNUG_EINPUT, "%s: 8-bit weight \"%s\" is missing beside its scales; %s", path, name,
                         QS_FIX);
    if (w->dtype != SNUG_DT_I8 || w->ndim != 2)
        return snug_fail(e, SNUG_EINPUT, "%s: tensor \"%s\" is %s of rank %d, bitsandbytes stores an 8-bit weight "
                         "as I8 [out, in]; %s", s->paths[w->file], name, snug_dtype_name(w->dtype), w->ndim, QS_FIX);
    q8_part(key, sizeof key, name, "SCB");
    if (scb->dtype != SNUG_DT_F32 || scb->ndim != 1 || scb->shape[0] != w->shape[0])
        return snug_fail(e, SNUG_EINPUT, "%s: tensor \"%s\" should hold F32 [%lld], a scale per row of \"%s\"; %s",
                         path, key, (long long)w->shape[0], name, QS_FIX);
    if (((uintptr_t)scb->data & 3) != 0)
        return snug_fail(e, SNUG_EINPUT, "%s: tensor \"%s\" is not 4-byte aligned in the file; re-save the checkpoint "
                         "with safetensors", path, key);
    for (int64_t r = 0; r < scb->shape[0]; r++) {
        float v;
        memcpy(&v, (const char *)scb->data + 4 * r, 4);
        if (!(v >= 0.0f && isfinite(v)))
            return snug_fail(e, SNUG_EINPUT, "%s: tensor \"%s\"[%lld] is %g, a row's largest |w| cannot be; %s", path,
                             key, (long long)r, (double)v, QS_FIX);
    }
    q8_part(key, sizeof key, name, "weight_format");
    const snug_st_tensor *f = snug_st_find(s, key);
    if (f && (f->dtype != SNUG_DT_U8 || f->nbytes != 1 || *(const uint8_t *)f->data != 0))
        return snug_fail(e, SNUG_EINPUT, "%s: tensor \"%s\" is not the row format (U8 0), the only one bitsandbytes "
                         "reads; %s", s->paths[f->file], key, QS_FIX);
    SNUG_TRY(snug_q4_init(t, SNUG_Q4_INT8, 0, 0, w->shape[0], w->shape[1], SNUG_DT_BF16, e));
    t->packed = (uint8_t *)w->data;
    t->absmax = (float *)scb->data;
    return 0;
}

static int64_t numel(const snug_st_tensor *x) {
    int64_t k = 1;
    for (int d = 0; d < x->ndim; d++)
        k *= x->shape[d];
    return k;
}

/* The part "<name><suffix>": present (or absent when !required), of dtype dt (any when dt < 0), of count values,
 * 4-byte aligned when F32. */
static int st_part(const snug_st_set *s, const char *name, const char *suffix, int required, int dt, int64_t count,
                   const snug_st_tensor **out, snug_error *e) {
    char key[1024];
    if (!join(key, sizeof key, name, suffix))
        return snug_fail(e, SNUG_EINPUT, "tensor name \"%s%s\" is too long for snug", name, suffix);
    const snug_st_tensor *x = snug_st_find(s, key);
    *out = x;
    if (!x) {
        if (!required)
            return 0;
        return snug_fail(e, SNUG_EINPUT, "%s: 4-bit weight \"%s\" has no tensor \"%s\"; %s",
                         s->nfiles ? s->paths[0] : "safetensors", name, key, QS_FIX);
    }
    const char *path = s->paths[x->file];
    if (dt >= 0 && x->dtype != (snug_dtype)dt)
        return snug_fail(e, SNUG_EINPUT, "%s: tensor \"%s\" is %s, bitsandbytes stores it as %s; %s", path, key,
                         snug_dtype_name(x->dtype), snug_dtype_name((snug_dtype)dt), QS_FIX);
    int64_t have = dt >= 0 ? numel(x) : (int64_t)x->nbytes;
    if (have != count)
        return snug_fail(e, SNUG_EINPUT, "%s: tensor \"%s\" holds %lld %s, the quant_state needs %lld; %s", path, key,
                         (long long)have, dt >= 0 ? "values" : "bytes", (long long)count, QS_FIX);
    if (dt == SNUG_DT_F32 && ((uintptr_t)x->data & 3) != 0)
        return snug_fail(e, SNUG_EINPUT, "%s: tensor \"%s\" is not 4-byte aligned in the file; re-save the "
                         "checkpoint with safetensors", path, key);
    return 0;
}

int snug_q4_st_view(const snug_st_set *s, const char *name, snug_q4_tensor *t, snug_error *e) {
    char key[1024], where[1536];
    const snug_st_tensor *qs = NULL;
    int which = -1;
    if (q8_part(key, sizeof key, name, "SCB") && (qs = snug_st_find(s, key)))
        return q8_view(s, name, qs, t, e);
    for (int q = 0; q < 2; q++) {
        if (!join(key, sizeof key, name, qs_suffix[q]))
            return snug_fail(e, SNUG_EINPUT, "tensor name \"%s\" is too long for snug", name);
        const snug_st_tensor *x = snug_st_find(s, key);
        if (x && qs)
            return snug_fail(e, SNUG_EINPUT, "%s: weight \"%s\" has both an nf4 and an fp4 quant_state; %s",
                             s->paths[x->file], name, QS_FIX);
        if (x) {
            qs = x;
            which = q;
        }
    }
    if (!qs)
        return snug_fail(e, SNUG_EINPUT, "%s: weight \"%s\" is not bitsandbytes 4-bit (no \"%s%s\" or \"%s%s\")",
                         s->nfiles ? s->paths[0] : "safetensors", name, name, qs_suffix[0], name, qs_suffix[1]);
    const char *path = s->paths[qs->file];
    snprintf(where, sizeof where, "%s: tensor \"%s%s\"", path, name, qs_suffix[which]);
    if (qs->dtype != SNUG_DT_U8 || qs->ndim != 1)
        return snug_fail(e, SNUG_EINPUT, "%s is %s of rank %d, bitsandbytes stores it as U8 of rank 1 (JSON bytes); %s",
                         where, snug_dtype_name(qs->dtype), qs->ndim, QS_FIX);
    SNUG_TRY(snug_q4_state_parse(qs->data, qs->nbytes, where, t, e));
    if ((int)t->type != which)
        return snug_fail(e, SNUG_EINPUT, "%s says quant_type \"%s\", which its name contradicts; %s", where,
                         snug_q4_type_name(t->type), QS_FIX);
    const int64_t nb = (int64_t)snug_q4_nblocks(t->n, t->blocksize);
    const snug_st_tensor *w, *am, *qm, *na, *nq;
    SNUG_TRY(st_part(s, name, "", 1, -1, (int64_t)(t->n + 1) / 2, &w, e));
    SNUG_TRY(st_part(s, name, ".absmax", 1, t->nested ? SNUG_DT_U8 : SNUG_DT_F32, nb, &am, e));
    SNUG_TRY(st_part(s, name, ".quant_map", 1, SNUG_DT_F32, 16, &qm, e));
    SNUG_TRY(st_part(s, name, ".nested_absmax", t->nested, SNUG_DT_F32,
                     (nb + SNUG_Q4_NESTED_BLOCKSIZE - 1) / SNUG_Q4_NESTED_BLOCKSIZE, &na, e));
    SNUG_TRY(st_part(s, name, ".nested_quant_map", t->nested, SNUG_DT_F32, 256, &nq, e));
    if (!t->nested && (na || nq))
        return snug_fail(e, SNUG_EINPUT, "%s: weight \"%s\" has %s but its quant_state has no nested_* keys; %s",
                         s->paths[(na ? na : nq)->file], name, na ? "nested_absmax" : "nested_quant_map", QS_FIX);
    const float *code = snug_q4_code(t->type);
    for (int k = 0; k < 16; k++) {
        float v;
        memcpy(&v, (const unsigned char *)qm->data + 4 * k, 4);
        if (!(fabsf(v - code[k]) <= 1e-6f))
            return snug_fail(e, SNUG_EINPUT, "%s: tensor \"%s.quant_map\"[%d] is %.9g, bitsandbytes' %s table has "
                             "%.9g; bitsandbytes dequantizes with its own table, so would snug: re-quantize the model",
                             s->paths[qm->file], name, k, (double)v, snug_q4_type_name(t->type), (double)code[k]);
    }
    /* every "<name>.*" tensor must be one of bitsandbytes' parts (its QuantState.from_dict asserts the same) */
    static const char *const parts[] = {"absmax", "quant_map", "nested_absmax", "nested_quant_map",
                                        "quant_state.bitsandbytes__nf4", "quant_state.bitsandbytes__fp4"};
    size_t nl = strlen(name);
    for (int i = 0; i < s->ntensors; i++) {
        const char *k = s->tensors[i].name;
        if (strncmp(k, name, nl) != 0 || k[nl] != '.')
            continue;
        size_t p = 0;
        while (p < sizeof parts / sizeof parts[0] && strcmp(k + nl + 1, parts[p]) != 0)
            p++;
        if (p == sizeof parts / sizeof parts[0])
            return snug_fail(e, SNUG_EINPUT, "%s: tensor \"%s\" is not a part of bitsandbytes' 4-bit weight \"%s\" "
                             "(absmax, quant_map, nested_absmax, nested_quant_map, quant_state); %s",
                             s->paths[s->tensors[i].file], k, name, QS_FIX);
    }
    /* the view: mapped memory, read only */
    t->packed = (uint8_t *)w->data;
    if (t->nested) {
        t->absmax_q = (uint8_t *)am->data;
        t->nested_absmax = (float *)na->data;
        t->nested_quant_map = (float *)nq->data;
    } else {
        t->absmax = (float *)am->data;
    }
    return 0;
}

int snug_q4_st_outs_fill(snug_q4_st_outs *w, const char *name, const snug_q4_tensor *t, snug_error *e) {
    memset(w, 0, sizeof *w);
    size_t len = 0;
    SNUG_TRY(snug_q4_state_json(t, w->json, sizeof w->json, &len, e));
    memcpy(w->quant_map, snug_q4_code(t->type), sizeof w->quant_map);
    const int64_t nb = (int64_t)snug_q4_nblocks(t->n, t->blocksize);
    const struct {
        const char *suffix;
        snug_dtype dtype;
        int64_t count;
        const void *raw;
    } part[6] = {
        {"", SNUG_DT_U8, (int64_t)(t->n + 1) / 2, t->packed},
        {".absmax", t->nested ? SNUG_DT_U8 : SNUG_DT_F32, nb,
         t->nested ? (const void *)t->absmax_q : (const void *)t->absmax},
        {".quant_map", SNUG_DT_F32, 16, w->quant_map},
        {".nested_absmax", SNUG_DT_F32, (nb + t->nested_blocksize - 1) / (t->nested ? t->nested_blocksize : 1),
         t->nested_absmax},
        {".nested_quant_map", SNUG_DT_F32, 256, t->nested_quant_map},
        {qs_suffix[t->type == SNUG_Q4_FP4], SNUG_DT_U8, (int64_t)len, w->json},
    };
    for (int k = 0; k < 6; k++) {
        if (!t->nested && (k == 3 || k == 4))
            continue;
        if (!join(w->names[w->n], sizeof w->names[0], name, part[k].suffix))
            return snug_fail(e, SNUG_EINPUT, "tensor name \"%s%s\" is too long for snug", name, part[k].suffix);
        /* the packed weight is [(n + 1) / 2, 1], as bitsandbytes' Params4bit holds it */
        w->out[w->n] = (snug_st_out){.name = w->names[w->n], .dtype = part[k].dtype, .ndim = k == 0 ? 2 : 1,
                                     .shape = {part[k].count, 1}, .raw = part[k].raw};
        w->n++;
    }
    return 0;
}
