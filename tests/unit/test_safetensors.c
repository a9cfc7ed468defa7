/* test_safetensors.c: dtype conversions, safetensors write -> read round trips, folder and index handling, and one
 * hand-crafted file per kind of corruption the reader must reject (with the file and tensor named). */
#include <dirent.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "check.h"
#include "core/dtype.h"
#include "core/fileio.h"
#include "core/hash.h"
#include "model/safetensors.h"

static char tmpdir[256];

static const char *tpath(const char *name) {
    static char buf[8][512];
    static int k;
    char *p = buf[k++ % 8];
    snprintf(p, 512, "%s/%s", tmpdir, name);
    return p;
}

static void write_bytes(const char *path, const void *data, size_t n) {
    FILE *f = fopen(path, "wb");
    if (!f || (n && fwrite(data, 1, n, f) != n)) {
        fprintf(stderr, "cannot write %s\n", path);
        exit(1);
    }
    fclose(f);
}

/* A safetensors file from a header text, a declared header length (0: the real one) and data bytes. */
static void craft(const char *path, const char *header, uint64_t declared, const void *data, size_t ndata) {
    size_t hn = strlen(header);
    uint64_t n = declared ? declared : hn;
    unsigned char *buf = malloc(8 + hn + ndata + 1);
    for (int i = 0; i < 8; i++)
        buf[i] = (unsigned char)(n >> (8 * i));
    memcpy(buf + 8, header, hn);
    if (ndata)
        memcpy(buf + 8 + hn, data, ndata);
    write_bytes(path, buf, 8 + hn + ndata);
    free(buf);
}

/* Checks that rc is the expected failure and that the message names every given piece (NULL-terminated). */
static void expect_fail_(int line, int rc, const snug_error *e, int code, const char *const *needles) {
    CHECKF(rc == code, "line %d: rc %d, expected %d (%s)", line, rc, code, e->msg);
    CHECKF(e->code == code, "line %d: e->code %d", line, e->code);
    for (int i = 0; needles[i]; i++)
        CHECKF(strstr(e->msg, needles[i]) != NULL, "line %d: message lacks \"%s\": %s", line, needles[i], e->msg);
    CHECKF(strchr(e->msg, '\n') == NULL, "line %d: message has a newline", line);
}
#define EXPECT_FAIL(rc, e, code, ...) expect_fail_(__LINE__, rc, e, code, (const char *const[]){__VA_ARGS__, NULL})

/* Opens a crafted file and expects it to be rejected with the file (and maybe tensor) named. */
static void bad_file(int line, const char *name, const char *header, uint64_t declared, const void *data,
                     size_t ndata, const char *needle) {
    const char *p = tpath(name);
    craft(p, header, declared, data, ndata);
    snug_st_set s;
    snug_error e = {0};
    int rc = snug_st_open_file(&s, p, &e);
    expect_fail_(line, rc, &e, SNUG_EINPUT, (const char *const[]){name, needle, NULL});
    CHECK(s.ntensors == 0 && s.nfiles == 0 && s.tensors == NULL); /* left empty on failure */
    snug_st_close(&s);
    unlink(p);
}

/* ---------------------------------------------------------------------------------------------------------------- */

static uint32_t fbits(float f) {
    uint32_t x;
    memcpy(&x, &f, 4);
    return x;
}

static float bitsf(uint32_t x) {
    float f;
    memcpy(&f, &x, 4);
    return f;
}

static void test_dtype(void) {
    CHECK(snug_dtype_parse("F32") == SNUG_DT_F32 && snug_dtype_parse("BF16") == SNUG_DT_BF16);
    CHECK(snug_dtype_parse("F16") == SNUG_DT_F16 && snug_dtype_parse("BOOL") == SNUG_DT_BOOL);
    CHECK(snug_dtype_parse("F8_E4M3") == SNUG_DT_UNSUPPORTED && snug_dtype_parse("U64") == SNUG_DT_UNSUPPORTED);
    CHECK(snug_dtype_parse("F6_E2M3") == SNUG_DT_UNSUPPORTED && snug_dtype_parse("C64") == SNUG_DT_UNSUPPORTED);
    CHECK(snug_dtype_parse("bf16") == (snug_dtype)-1 && snug_dtype_parse("F17") == (snug_dtype)-1);
    CHECK(snug_dtype_size(SNUG_DT_BF16) == 2 && snug_dtype_size(SNUG_DT_I64) == 8 &&
          snug_dtype_size(SNUG_DT_UNSUPPORTED) == 0);
    CHECK(strcmp(snug_dtype_name(SNUG_DT_BF16), "BF16") == 0 && strcmp(snug_dtype_name(SNUG_DT_F32), "F32") == 0);

    /* bf16: round to nearest even */
    CHECK(snug_f32_to_bf16(1.0f) == 0x3f80);
    CHECK(snug_f32_to_bf16(bitsf(0x3f808000)) == 0x3f80); /* tie, even stays */
    CHECK(snug_f32_to_bf16(bitsf(0x3f818000)) == 0x3f82); /* tie, odd rounds up */
    CHECK(snug_f32_to_bf16(bitsf(0x3f808001)) == 0x3f81);
    CHECK(snug_f32_to_bf16(bitsf(0x7f7fffff)) == 0x7f80); /* FLT_MAX rounds to inf */
    CHECK(snug_f32_to_bf16(-INFINITY) == 0xff80);
    CHECK(isnan(snug_bf16_to_f32(snug_f32_to_bf16(NAN))));
    CHECK(isnan(snug_bf16_to_f32(snug_f32_to_bf16(bitsf(0x7f800001))))); /* payload in the low bits only */
    CHECK(snug_f32_to_bf16(bitsf(0x00000001)) == 0x0000);                /* tiny subnormal */
    int bf_ok = 1, f16_ok = 1;
    for (uint32_t h = 0; h < 65536; h++) {
        float b = snug_bf16_to_f32((uint16_t)h), f = snug_f16_to_f32((uint16_t)h);
        if (isnan(b) ? !isnan(snug_bf16_to_f32(snug_f32_to_bf16(b))) : snug_f32_to_bf16(b) != h)
            bf_ok = 0;
        if (isnan(f) ? !isnan(snug_f16_to_f32(snug_f32_to_f16(f))) : snug_f32_to_f16(f) != h)
            f16_ok = 0;
    }
    CHECK(bf_ok);
    CHECK(f16_ok);

    /* f16: boundaries, subnormals, ties */
    CHECK(snug_f32_to_f16(65504.0f) == 0x7bff);
    CHECK(snug_f32_to_f16(65519.99f) == 0x7bff);
    CHECK(snug_f32_to_f16(65520.0f) == 0x7c00);
    CHECK(snug_f32_to_f16(-1e9f) == 0xfc00);
    CHECK(snug_f32_to_f16(ldexpf(1, -24)) == 0x0001);
    CHECK(snug_f32_to_f16(ldexpf(1, -25)) == 0x0000);          /* tie to even (0) */
    CHECK(snug_f32_to_f16(ldexpf(1.5f, -25)) == 0x0001);
    CHECK(snug_f32_to_f16(ldexpf(3, -25)) == 0x0002);          /* 1.5 units: tie to even (2) */
    CHECK(snug_f32_to_f16(ldexpf(1, -14)) == 0x0400);          /* smallest normal */
    CHECK(snug_f32_to_f16(ldexpf(1023.5f, -24)) == 0x0400);    /* rounds up across the subnormal boundary */
    CHECK(snug_f32_to_f16(-0.0f) == 0x8000);
    CHECK(snug_f16_to_f32(0x3c00) == 1.0f && snug_f16_to_f32(0x0001) == ldexpf(1, -24));
    CHECK(snug_f16_to_f32(0xfc00) == -INFINITY && isnan(snug_f16_to_f32(0x7e00)));
    CHECK(snug_f32_to_f16(bitsf(0x3f801000)) == 0x3c00);       /* tie below: even */
    CHECK(snug_f32_to_f16(bitsf(0x3f803000)) == 0x3c02);       /* tie above odd: up */
#ifdef __FLT16_MAX__
    /* Against the compiler's own (round-to-nearest-even) conversion on a spread of bit patterns. */
    int hw_ok = 1;
    for (uint64_t x = 0; x < (1ull << 32); x += 4093) {
        float f = bitsf((uint32_t)x);
        _Float16 h = (_Float16)f;
        uint16_t hb;
        memcpy(&hb, &h, 2);
        uint16_t mine = snug_f32_to_f16(f);
        if (isnan(f) ? (mine & 0x7fff) <= 0x7c00 : mine != hb) {
            if (hw_ok)
                fprintf(stderr, "f16 mismatch at 0x%08x: 0x%04x vs 0x%04x\n", (unsigned)x, mine, hb);
            hw_ok = 0;
        }
    }
    CHECK(hw_ok);
#endif
    (void)fbits;
}

/* ---------------------------------------------------------------------------------------------------------------- */

static float *ramp(size_t n, float scale) {
    float *p = malloc((n ? n : 1) * sizeof *p);
    for (size_t i = 0; i < n; i++)
        p[i] = scale * ((float)i - (float)n / 3) + 0.001f * (float)(i % 7);
    return p;
}

static int dir_has_tmp(void) {
    DIR *d = opendir(tmpdir);
    struct dirent *de;
    int found = 0;
    while ((de = readdir(d)))
        if (strstr(de->d_name, ".tmp."))
            found = 1;
    closedir(d);
    return found;
}

static void test_round_trip(void) {
    float *a = ramp(6, 0.5f), *b = ramp(12, 0.25f), *c = ramp(35, 1.0f), *d = ramp(24, 0.1f);
    float scalar = 3.25f;
    snug_st_out outs[] = {
        {.name = "w.bf16", .dtype = SNUG_DT_BF16, .ndim = 2, .shape = {3, 4}, .f32 = b},
        {.name = "a.f32", .dtype = SNUG_DT_F32, .ndim = 2, .shape = {2, 3}, .f32 = a},
        {.name = "t.f16", .dtype = SNUG_DT_F16, .ndim = 3, .shape = {5, 7, 1}, .f32 = c},
        /* source is [6, 4]; the file holds its transpose [4, 6] */
        {.name = "conv.weight", .dtype = SNUG_DT_F32, .ndim = 2, .shape = {4, 6}, .f32 = d, .transpose2d = 1},
        {.name = "conv16.weight", .dtype = SNUG_DT_BF16, .ndim = 2, .shape = {4, 6}, .f32 = d, .transpose2d = 1},
        {.name = "scalar", .dtype = SNUG_DT_F32, .ndim = 0, .f32 = &scalar},
        {.name = "empty", .dtype = SNUG_DT_F16, .ndim = 2, .shape = {0, 5}, .f32 = NULL},
        {.name = "odd.f16", .dtype = SNUG_DT_F16, .ndim = 1, .shape = {3}, .f32 = a}, /* 6 bytes: misaligns what follows */
    };
    int n = sizeof outs / sizeof outs[0];
    snug_error e = {0};
    char p[512];
    snprintf(p, sizeof p, "%s", tpath("rt.safetensors"));
    CHECKF(snug_st_write(p, outs, n, NULL, &e) == 0, "%s", e.msg);
    CHECK(!dir_has_tmp());

    /* The header follows the reference writer's layout. */
    char *raw;
    size_t rawlen;
    CHECK(snug_read_file(p, &raw, &rawlen, &e) == 0);
    uint64_t hlen = 0;
    for (int i = 7; i >= 0; i--)
        hlen = hlen << 8 | (unsigned char)raw[i];
    CHECK((8 + hlen) % 8 == 0);
    CHECK(strncmp(raw + 8, "{\"__metadata__\":{\"format\":\"pt\"}", 31) == 0);
    CHECK(raw[8 + hlen - 1] == ' ' || raw[8 + hlen - 1] == '}');
    CHECK(strstr(raw + 8, "\"a.f32\":{\"dtype\":\"F32\",\"shape\":[2,3],\"data_offsets\":[0,24]}") != NULL);
    char *pa = strstr(raw + 8, "\"a.f32\""), *pw = strstr(raw + 8, "\"w.bf16\""), *ps = strstr(raw + 8, "\"scalar\"");
    CHECK(pa && pw && ps && pa < ps && ps < pw); /* 4-byte dtypes first, then by name */
    free(raw);

    snug_st_set s;
    CHECKF(snug_st_open_file(&s, p, &e) == 0, "%s", e.msg);
    CHECK(s.ntensors == n && s.nfiles == 1);
    for (int i = 1; i < s.ntensors; i++)
        CHECK(strcmp(s.tensors[i - 1].name, s.tensors[i].name) < 0);
    CHECK(snug_st_find(&s, "nope") == NULL && snug_st_find(&s, "") == NULL);

    float got[64];
    const snug_st_tensor *t = snug_st_find(&s, "a.f32");
    CHECK(t && t->dtype == SNUG_DT_F32 && t->ndim == 2 && t->shape[0] == 2 && t->shape[1] == 3 && t->nbytes == 24);
    CHECK(t && ((const char *)t->data - (const char *)s.maps[0]) % 8 == 0);
    CHECK(t && snug_st_to_f32(&s, t, got, 0, &e) == 0 && memcmp(got, a, 6 * sizeof(float)) == 0);

    t = snug_st_find(&s, "w.bf16");
    CHECK(t && t->dtype == SNUG_DT_BF16 && t->nbytes == 24);
    int ok = t && snug_st_to_f32(&s, t, got, 0, &e) == 0;
    for (int i = 0; ok && i < 12; i++)
        ok = got[i] == snug_bf16_to_f32(snug_f32_to_bf16(b[i]));
    CHECK(ok);

    t = snug_st_find(&s, "t.f16");
    CHECK(t && t->dtype == SNUG_DT_F16 && t->ndim == 3 && t->shape[2] == 1 && t->nbytes == 70);
    ok = t && snug_st_to_f32(&s, t, got, 0, &e) == 0;
    for (int i = 0; ok && i < 35; i++)
        ok = got[i] == snug_f16_to_f32(snug_f32_to_f16(c[i]));
    CHECK(ok);

    /* Written transposed, read back transposed: the original [6, 4] source. */
    t = snug_st_find(&s, "conv.weight");
    CHECK(t && t->shape[0] == 4 && t->shape[1] == 6);
    CHECK(t && snug_st_to_f32(&s, t, got, 1, &e) == 0 && memcmp(got, d, 24 * sizeof(float)) == 0);
    /* Read without transposing: element (r, k) of the file [4, 6] is d[k*4 + r]. */
    ok = t && snug_st_to_f32(&s, t, got, 0, &e) == 0;
    for (int r = 0; ok && r < 4; r++)
        for (int k = 0; k < 6; k++)
            ok &= got[r * 6 + k] == d[k * 4 + r];
    CHECK(ok);
    t = snug_st_find(&s, "conv16.weight");
    ok = t && snug_st_to_f32(&s, t, got, 1, &e) == 0;
    for (int i = 0; ok && i < 24; i++)
        ok = got[i] == snug_bf16_to_f32(snug_f32_to_bf16(d[i]));
    CHECK(ok);

    t = snug_st_find(&s, "scalar");
    CHECK(t && t->ndim == 0 && t->nbytes == 4 && snug_st_to_f32(&s, t, got, 0, &e) == 0 && got[0] == 3.25f);
    t = snug_st_find(&s, "empty");
    CHECK(t && t->ndim == 2 && t->shape[0] == 0 && t->shape[1] == 5 && t->nbytes == 0);
    CHECK(t && snug_st_to_f32(&s, t, got, 0, &e) == 0);
    t = snug_st_find(&s, "scalar");
    snug_error e2 = {0};
    EXPECT_FAIL(snug_st_to_f32(&s, t, got, 1, &e2), &e2, SNUG_EINPUT, "rt.safetensors", "scalar");
    snug_st_close(&s);
    CHECK(s.ntensors == 0 && s.tensors == NULL && s.maps == NULL);

    /* Writing rejects a name given twice and leaves nothing behind. */
    snug_st_out dup[] = {outs[1], outs[1]};
    e2 = (snug_error){0};
    CHECK(snug_st_write(tpath("dup.safetensors"), dup, 2, NULL, &e2) != 0 && strstr(e2.msg, "a.f32"));
    CHECK(!snug_file_exists(tpath("dup.safetensors")) && !dir_has_tmp());

    /* An empty file (no tensors) is valid both ways. */
    CHECK(snug_st_write(tpath("none.safetensors"), NULL, 0, NULL, &e) == 0);
    CHECK(snug_st_open_file(&s, tpath("none.safetensors"), &e) == 0 && s.ntensors == 0);
    snug_st_close(&s);
    unlink(tpath("none.safetensors"));
    unlink(p);
    free(a);
    free(b);
    free(c);
    free(d);
}

/* ---------------------------------------------------------------------------------------------------------------- */

/* The stream source: each tensor's values fetched just before it is written, in snug_st_write_order's order. */
typedef struct stream_src {
    const snug_st_out *outs;
    int calls[16], ncalls;
    int fail_at; /* fail the call with this tag (-1: none) */
} stream_src;

static int stream_fill(void *ud, int tag, float *dst, snug_error *e) {
    stream_src *s = ud;
    const snug_st_out *t = &s->outs[tag];
    s->calls[s->ncalls++] = tag;
    if (tag == s->fail_at)
        return snug_fail(e, SNUG_EIO, "tensor %s: the stream failed", t->name);
    size_t n = 1;
    for (int d = 0; d < t->ndim; d++)
        n *= (size_t)t->shape[d];
    if (n) /* the empty tensor has no source */
        memcpy(dst, t->f32, n * sizeof *dst);
    return 0;
}

static void test_stream(void) {
    float *a = ramp(6, 0.5f), *b = ramp(12, 0.25f), *d = ramp(24, 0.1f);
    float scalar = -1.5f;
    snug_st_out outs[] = {
        {.name = "w.bf16", .dtype = SNUG_DT_BF16, .ndim = 2, .shape = {3, 4}, .f32 = b},
        {.name = "z.f32", .dtype = SNUG_DT_F32, .ndim = 2, .shape = {2, 3}, .f32 = a},
        {.name = "conv.weight", .dtype = SNUG_DT_F32, .ndim = 2, .shape = {4, 6}, .f32 = d, .transpose2d = 1},
        {.name = "scalar", .dtype = SNUG_DT_F32, .ndim = 0, .f32 = &scalar},
        {.name = "empty", .dtype = SNUG_DT_F32, .ndim = 2, .shape = {0, 5}, .f32 = NULL},
    };
    int n = sizeof outs / sizeof outs[0];
    snug_st_out streamed[sizeof outs / sizeof outs[0]];
    stream_src src = {.outs = outs, .fail_at = -1};
    for (int i = 0; i < n; i++) {
        streamed[i] = outs[i];
        streamed[i].f32 = NULL;
        streamed[i].fill = stream_fill;
        streamed[i].fill_ud = &src;
        streamed[i].fill_tag = i;
    }
    snug_error e = {0};
    char p[512], q[512];
    snprintf(p, sizeof p, "%s", tpath("direct.safetensors"));
    snprintf(q, sizeof q, "%s", tpath("stream.safetensors"));
    CHECKF(snug_st_write(p, outs, n, NULL, &e) == 0, "%s", e.msg);
    CHECKF(snug_st_write(q, streamed, n, NULL, &e) == 0, "%s", e.msg);
    /* the same bytes, each tensor fetched once, in the order snug_st_write_order gives */
    char *x = NULL, *y = NULL;
    size_t xn = 0, yn = 0;
    CHECK(snug_read_file(p, &x, &xn, &e) == 0 && snug_read_file(q, &y, &yn, &e) == 0);
    CHECK(x && y && xn == yn && memcmp(x, y, xn) == 0);
    free(x);
    free(y);
    int order[8];
    CHECKF(snug_st_write_order(outs, n, order, &e) == 0, "%s", e.msg);
    CHECK(src.ncalls == n && memcmp(order, src.calls, (size_t)n * sizeof *order) == 0);
    CHECK(!strcmp(outs[order[0]].name, "conv.weight") && !strcmp(outs[order[n - 1]].name, "w.bf16"));
    /* a stream that fails: its error, and no file left behind */
    src = (stream_src){.outs = outs, .fail_at = 1};
    snug_error e2 = {0};
    unlink(q);
    CHECK(snug_st_write(q, streamed, n, NULL, &e2) != 0 && strstr(e2.msg, "z.f32: the stream failed"));
    CHECK(!snug_file_exists(q) && !dir_has_tmp());
    /* a stream beside another source is refused */
    streamed[0].h16 = (const uint16_t *)b;
    CHECK(snug_st_write(q, streamed, n, NULL, &e2) != 0 && strstr(e2.msg, "a stream and another source"));
    unlink(p);
    free(a);
    free(b);
    free(d);
}

static void test_crafted_valid(void) {
    /* Unaligned data (a 1-byte tensor first), leading whitespace, 0-rank and empty tensors, an unsupported dtype. */
    unsigned char data[1 + 4 + 2 + 4 + 2];
    data[0] = 7;
    float f = -2.5f;
    memcpy(data + 1, &f, 4);
    uint16_t h = snug_f32_to_bf16(0.75f);
    memcpy(data + 5, &h, 2);
    memset(data + 7, 0x11, 4);
    memset(data + 11, 0x22, 2);
    const char *hdr = "  {\"u\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1]},"
                      "\"x\":{\"dtype\":\"F32\",\"shape\":[],\"data_offsets\":[1,5]},"
                      "\"e\":{\"dtype\":\"F32\",\"shape\":[3,0],\"data_offsets\":[5,5]},"
                      "\"y\":{\"dtype\":\"BF16\",\"shape\":[1,1],\"data_offsets\":[5,7]},"
                      "\"q\":{\"dtype\":\"F8_E4M3\",\"shape\":[2,2],\"data_offsets\":[7,11]},"
                      "\"f4\":{\"dtype\":\"F4\",\"shape\":[4],\"data_offsets\":[11,13]},"
                      "\"__metadata__\":{\"format\":\"pt\",\"note\":\"x\"}}   ";
    const char *p = tpath("valid.safetensors");
    craft(p, hdr, 0, data, sizeof data);
    snug_st_set s;
    snug_error e = {0};
    CHECKF(snug_st_open_file(&s, p, &e) == 0, "%s", e.msg);
    float got[4];
    const snug_st_tensor *t = snug_st_find(&s, "x");
    CHECK(t && t->ndim == 0 && snug_st_to_f32(&s, t, got, 0, &e) == 0 && got[0] == -2.5f);
    t = snug_st_find(&s, "y");
    CHECK(t && snug_st_to_f32(&s, t, got, 1, &e) == 0 && got[0] == 0.75f);
    t = snug_st_find(&s, "e");
    CHECK(t && t->nbytes == 0 && t->shape[0] == 3 && t->shape[1] == 0);
    t = snug_st_find(&s, "q");
    CHECK(t && t->dtype == SNUG_DT_UNSUPPORTED && t->nbytes == 4);
    snug_error e2 = {0};
    EXPECT_FAIL(snug_st_to_f32(&s, t, got, 0, &e2), &e2, SNUG_EINPUT, "valid.safetensors", "\"q\"");
    t = snug_st_find(&s, "u");
    e2 = (snug_error){0};
    EXPECT_FAIL(snug_st_to_f32(&s, t, got, 0, &e2), &e2, SNUG_EINPUT, "valid.safetensors", "\"u\"", "U8");
    snug_st_close(&s);
    unlink(p);
}

static void test_bad_files(void) {
    char zeros[64] = {0};
    snug_st_set s;
    snug_error e = {0};

    /* missing file: an I/O error naming it */
    EXPECT_FAIL(snug_st_open_file(&s, tpath("absent.safetensors"), &e), &e, SNUG_EIO, "absent.safetensors");
    snug_st_close(&s);

    /* truncated: fewer than 8 bytes */
    const char *p = tpath("short.safetensors");
    write_bytes(p, "\x10\0\0\0\0", 5);
    e = (snug_error){0};
    EXPECT_FAIL(snug_st_open_file(&s, p, &e), &e, SNUG_EINPUT, "short.safetensors", "truncated");
    unlink(p);

    const char *one = "{\"w\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}";
    bad_file(__LINE__, "pastend.safetensors", one, 1000, zeros, 8, "header length");
    bad_file(__LINE__, "huge.safetensors", one, 200000000, zeros, 8, "limit");
    bad_file(__LINE__, "notjson.safetensors", "{\"w\": not json}", 0, zeros, 8, "invalid");
    bad_file(__LINE__, "notobj.safetensors", "[1, 2]", 0, NULL, 0, "'{'");
    bad_file(__LINE__, "range.safetensors", "{\"w.weight\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[0,16]}}",
             0, zeros, 8, "w.weight");
    bad_file(__LINE__, "backwards.safetensors",
             "{\"w.weight\":{\"dtype\":\"F32\",\"shape\":[0],\"data_offsets\":[8,0]}}", 0, zeros, 8, "end before");
    bad_file(__LINE__, "overlap.safetensors",
             "{\"a.weight\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
             "\"b.weight\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[4,12]}}", 0, zeros, 12, "overlaps");
    bad_file(__LINE__, "overlap2.safetensors",
             "{\"a.weight\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
             "\"b.weight\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[4,12]}}", 0, zeros, 12, "b.weight");
    bad_file(__LINE__, "hole.safetensors",
             "{\"a.weight\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]},"
             "\"b.weight\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[8,12]}}", 0, zeros, 12, "b.weight");
    bad_file(__LINE__, "tail.safetensors", "{\"a.weight\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}",
             0, zeros, 8, "no tensor");
    bad_file(__LINE__, "emptyinside.safetensors",
             "{\"a.weight\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
             "\"e\":{\"dtype\":\"F32\",\"shape\":[0],\"data_offsets\":[4,4]}}", 0, zeros, 8, "overlaps");
    bad_file(__LINE__, "length.safetensors", "{\"w.weight\":{\"dtype\":\"F32\",\"shape\":[3],\"data_offsets\":[0,8]}}",
             0, zeros, 8, "w.weight");
    bad_file(__LINE__, "dtype.safetensors", "{\"w.weight\":{\"dtype\":\"F17\",\"shape\":[2],\"data_offsets\":[0,8]}}",
             0, zeros, 8, "F17");
    bad_file(__LINE__, "dtype2.safetensors", "{\"w.weight\":{\"dtype\":\"F17\",\"shape\":[2],\"data_offsets\":[0,8]}}",
             0, zeros, 8, "w.weight");
    bad_file(__LINE__, "subbyte.safetensors", "{\"w.weight\":{\"dtype\":\"F4\",\"shape\":[3],\"data_offsets\":[0,2]}}",
             0, zeros, 2, "w.weight");
    bad_file(__LINE__, "dup.safetensors",
             "{\"dup.weight\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]},"
             "\"dup.weight\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,8]}}", 0, zeros, 8, "dup.weight");
    bad_file(__LINE__, "negshape.safetensors",
             "{\"w.weight\":{\"dtype\":\"F32\",\"shape\":[-2],\"data_offsets\":[0,8]}}", 0, zeros, 8, "shape[0]");
    bad_file(__LINE__, "realshape.safetensors",
             "{\"w.weight\":{\"dtype\":\"F32\",\"shape\":[2.0],\"data_offsets\":[0,8]}}", 0, zeros, 8, "w.weight");
    bad_file(__LINE__, "noshape.safetensors", "{\"w.weight\":{\"dtype\":\"F32\",\"data_offsets\":[0,8]}}", 0, zeros,
             8, "shape");
    bad_file(__LINE__, "nooffsets.safetensors", "{\"w.weight\":{\"dtype\":\"F32\",\"shape\":[2]}}", 0, zeros, 8,
             "data_offsets");
    bad_file(__LINE__, "entry.safetensors", "{\"w.weight\":[1,2]}", 0, zeros, 0, "w.weight");
    bad_file(__LINE__, "meta.safetensors", "{\"__metadata__\":{\"format\":1}}", 0, NULL, 0, "format");
    bad_file(__LINE__, "meta2.safetensors", "{\"__metadata__\":[\"pt\"]}", 0, NULL, 0, "__metadata__");
    bad_file(__LINE__, "overflow.safetensors",
             "{\"w.weight\":{\"dtype\":\"F32\",\"shape\":[4294967296,4294967296],\"data_offsets\":[0,8]}}", 0, zeros,
             8, "overflows");
    bad_file(__LINE__, "rank.safetensors",
             "{\"w.weight\":{\"dtype\":\"F32\",\"shape\":[1,1,1,1,1,1,1,1,1],\"data_offsets\":[0,4]}}", 0, zeros, 4,
             "dimensions");
}

static void test_nonfinite(void) {
    float v[3] = {1.0f, NAN, 2.0f};
    uint16_t bf[4] = {0x3f80, 0x3f80, 0x7f80, 0};
    uint16_t hf[2] = {0x3c00, 0xfc00};
    unsigned char data[12 + 8 + 4];
    memcpy(data, v, 12);
    memcpy(data + 12, bf, 8);
    memcpy(data + 20, hf, 4);
    const char *p = tpath("nan.safetensors");
    craft(p, "{\"layers.0.w\":{\"dtype\":\"F32\",\"shape\":[3],\"data_offsets\":[0,12]},"
             "\"layers.1.w\":{\"dtype\":\"BF16\",\"shape\":[2,2],\"data_offsets\":[12,20]},"
             "\"layers.2.w\":{\"dtype\":\"F16\",\"shape\":[2],\"data_offsets\":[20,24]}}", 0, data, sizeof data);
    snug_st_set s;
    snug_error e = {0};
    CHECKF(snug_st_open_file(&s, p, &e) == 0, "%s", e.msg); /* values are checked on conversion, not on open */
    float got[4];
    EXPECT_FAIL(snug_st_to_f32(&s, snug_st_find(&s, "layers.0.w"), got, 0, &e), &e, SNUG_EINPUT, "nan.safetensors",
                "layers.0.w", "NaN", "index 1");
    e = (snug_error){0};
    EXPECT_FAIL(snug_st_to_f32(&s, snug_st_find(&s, "layers.1.w"), got, 1, &e), &e, SNUG_EINPUT, "nan.safetensors",
                "layers.1.w", "infinite", "index 2");
    e = (snug_error){0};
    EXPECT_FAIL(snug_st_to_f32(&s, snug_st_find(&s, "layers.2.w"), got, 0, &e), &e, SNUG_EINPUT, "nan.safetensors",
                "layers.2.w", "index 1");
    snug_st_close(&s);
    unlink(p);
}

/* ---------------------------------------------------------------------------------------------------------------- */

static void write_text(const char *path, const char *text) { write_bytes(path, text, strlen(text)); }

/* Integers beyond 64 bits, as transformers writes them: in the index's metadata they are accepted; where the reader
 * needs an integer (shape, data_offsets) or a string (__metadata__), the error names the tensor or the key. */
static void test_huge_numbers(void) {
    char zeros[8] = {0};
    snug_st_set s;
    snug_error e = {0};
    bad_file(__LINE__, "hugemeta.safetensors",
             "{\"__metadata__\":{\"format\":\"pt\",\"max_len\":1000000000000000019884624838656},"
             "\"w.weight\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}", 0, zeros, 8,
             "\"__metadata__\".\"max_len\" is a real number, expected a string");
    bad_file(__LINE__, "hugeoff.safetensors",
             "{\"w.weight\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,18446744073709551616]}}", 0, zeros,
             8, "tensor \"w.weight\": \"data_offsets\"");
    bad_file(__LINE__, "hugeshape.safetensors",
             "{\"w.weight\":{\"dtype\":\"F32\",\"shape\":[99999999999999999999999],\"data_offsets\":[0,8]}}", 0,
             zeros, 8, "tensor \"w.weight\": shape[0]");

    char dir[512], shard[600], idx[600];
    snprintf(dir, sizeof dir, "%s/hugeidx", tmpdir);
    CHECK(snug_mkdirs(dir, &e) == 0);
    snprintf(shard, sizeof shard, "%s/model-00001-of-00001.safetensors", dir);
    snprintf(idx, sizeof idx, "%s/model.safetensors.index.json", dir);
    float x[2] = {1, 2};
    snug_st_out o = {.name = "w.weight", .dtype = SNUG_DT_F32, .ndim = 1, .shape = {2}, .f32 = x};
    CHECK(snug_st_write(shard, &o, 1, NULL, &e) == 0);
    write_text(idx, "{\"metadata\":{\"total_size\":1000000000000000019884624838656,\"n\":-1e400},\"weight_map\":"
                    "{\"w.weight\":\"model-00001-of-00001.safetensors\"}}");
    CHECKF(snug_st_open_dir(&s, dir, &e) == 0, "%s", e.msg);
    CHECK(s.ntensors == 1 && snug_st_find(&s, "w.weight"));
    snug_st_close(&s);
    unlink(shard);
    unlink(idx);
    rmdir(dir);
}

static void test_dirs(void) {
    snug_st_set s;
    snug_error e = {0};
    char dir[512];
    snprintf(dir, sizeof dir, "%s/model", tmpdir);
    CHECK(snug_mkdirs(dir, &e) == 0);

    /* neither file: the folder is named with what was expected */
    EXPECT_FAIL(snug_st_open_dir(&s, dir, &e), &e, SNUG_EINPUT, dir, "model.safetensors");
    e = (snug_error){0};
    EXPECT_FAIL(snug_st_open_dir(&s, tpath("no-such-model"), &e), &e, SNUG_EINPUT, "no-such-model");

    /* single file */
    float x[4] = {1, 2, 3, 4};
    snug_st_out o[3] = {
        {.name = "model.norm.weight", .dtype = SNUG_DT_F32, .ndim = 1, .shape = {4}, .f32 = x},
        {.name = "model.embed_tokens.weight", .dtype = SNUG_DT_BF16, .ndim = 2, .shape = {2, 2}, .f32 = x},
        {.name = "lm_head.weight", .dtype = SNUG_DT_F32, .ndim = 2, .shape = {2, 2}, .f32 = x},
    };
    char single[600], s1[600], s2[600], idx[600];
    snprintf(single, sizeof single, "%s/model.safetensors", dir);
    snprintf(s1, sizeof s1, "%s/model-00001-of-00002.safetensors", dir);
    snprintf(s2, sizeof s2, "%s/model-00002-of-00002.safetensors", dir);
    snprintf(idx, sizeof idx, "%s/model.safetensors.index.json", dir);
    CHECK(snug_st_write(single, o, 3, NULL, &e) == 0);
    CHECKF(snug_st_open_dir(&s, dir, &e) == 0, "%s", e.msg);
    CHECK(s.ntensors == 3 && s.nfiles == 1 && snug_st_find(&s, "lm_head.weight"));
    snug_st_close(&s);
    unlink(single);

    /* sharded through the index */
    CHECK(snug_st_write(s1, o, 2, NULL, &e) == 0);
    CHECK(snug_st_write(s2, o + 2, 1, NULL, &e) == 0);
    write_text(idx, "{\"metadata\":{\"total_size\":32},\"weight_map\":{"
                    "\"model.norm.weight\":\"model-00001-of-00002.safetensors\","
                    "\"model.embed_tokens.weight\":\"model-00001-of-00002.safetensors\","
                    "\"lm_head.weight\":\"model-00002-of-00002.safetensors\"}}");
    CHECKF(snug_st_open_dir(&s, dir, &e) == 0, "%s", e.msg);
    CHECK(s.ntensors == 3 && s.nfiles == 2);
    const snug_st_tensor *t = snug_st_find(&s, "lm_head.weight");
    CHECK(t && strstr(s.paths[t->file], "model-00002-of-00002") != NULL);
    float got[4];
    CHECK(t && snug_st_to_f32(&s, t, got, 0, &e) == 0 && got[3] == 4.0f);
    snug_st_close(&s);

    /* the index names a shard that is not there */
    write_text(idx, "{\"weight_map\":{\"model.norm.weight\":\"model-00001-of-00002.safetensors\","
                    "\"lm_head.weight\":\"model-00003-of-00003.safetensors\"}}");
    e = (snug_error){0};
    EXPECT_FAIL(snug_st_open_dir(&s, dir, &e), &e, SNUG_EINPUT, "model.safetensors.index.json",
                "model-00003-of-00003.safetensors", "lm_head.weight");
    CHECK(s.nfiles == 0 && s.ntensors == 0);

    /* the index puts a tensor in the wrong shard */
    write_text(idx, "{\"weight_map\":{\"model.norm.weight\":\"model-00002-of-00002.safetensors\","
                    "\"model.embed_tokens.weight\":\"model-00001-of-00002.safetensors\","
                    "\"lm_head.weight\":\"model-00002-of-00002.safetensors\"}}");
    e = (snug_error){0};
    EXPECT_FAIL(snug_st_open_dir(&s, dir, &e), &e, SNUG_EINPUT, "model.safetensors.index.json", "model.norm.weight",
                "but it is in", "model-00001-of-00002.safetensors");

    /* the index lists a tensor no shard has */
    write_text(idx, "{\"weight_map\":{\"model.ghost.weight\":\"model-00002-of-00002.safetensors\"}}");
    e = (snug_error){0};
    EXPECT_FAIL(snug_st_open_dir(&s, dir, &e), &e, SNUG_EINPUT, "model.safetensors.index.json", "model.ghost.weight");

    /* the same tensor in two shards */
    write_text(idx, "{\"weight_map\":{\"lm_head.weight\":\"model-00002-of-00002.safetensors\","
                    "\"model.norm.weight\":\"model-00001-of-00002.safetensors\","
                    "\"x\":\"dup.safetensors\"}}");
    char dup[600];
    snprintf(dup, sizeof dup, "%s/dup.safetensors", dir);
    CHECK(snug_st_write(dup, o + 2, 1, NULL, &e) == 0);
    e = (snug_error){0};
    EXPECT_FAIL(snug_st_open_dir(&s, dir, &e), &e, SNUG_EINPUT, "lm_head.weight", "dup.safetensors");

    /* a broken index */
    write_text(idx, "{\"weight_map\": [}");
    e = (snug_error){0};
    EXPECT_FAIL(snug_st_open_dir(&s, dir, &e), &e, SNUG_EINPUT, "model.safetensors.index.json");
    write_text(idx, "{\"metadata\":{}}");
    e = (snug_error){0};
    EXPECT_FAIL(snug_st_open_dir(&s, dir, &e), &e, SNUG_EINPUT, "model.safetensors.index.json", "weight_map");

    /* a corrupt shard is named as the file at fault */
    write_text(idx, "{\"weight_map\":{\"lm_head.weight\":\"model-00002-of-00002.safetensors\"}}");
    write_bytes(s2, "abc", 3);
    e = (snug_error){0};
    EXPECT_FAIL(snug_st_open_dir(&s, dir, &e), &e, SNUG_EINPUT, "model-00002-of-00002.safetensors");

    unlink(dup);
    unlink(s1);
    unlink(s2);
    unlink(idx);
    rmdir(dir);
}

/* Tensors larger than the writer's buffer: transposed in bands of rows (the last band short), a row longer than the
 * buffer, 16-bit sources, F32 written in place; written direct and hashed, the hash is the file's. */
static void test_large(void) {
    const size_t R = 700, K = 1500, R2 = 3, K2 = 300000;
    float *a = ramp(R * K, 1e-3f), *b = ramp(R2 * K2, 1e-4f);
    uint16_t *h = malloc(R * K * sizeof *h);
    for (size_t i = 0; i < R * K; i++)
        h[i] = snug_f32_to_bf16(a[i]);
    snug_st_out outs[] = {
        {.name = "band", .dtype = SNUG_DT_F32, .ndim = 2, .shape = {(int64_t)R, (int64_t)K}, .f32 = a,
         .transpose2d = 1},
        {.name = "long", .dtype = SNUG_DT_F32, .ndim = 2, .shape = {(int64_t)R2, (int64_t)K2}, .f32 = b,
         .transpose2d = 1},
        {.name = "plain", .dtype = SNUG_DT_F32, .ndim = 1, .shape = {(int64_t)(R * K)}, .f32 = a},
        {.name = "h16", .dtype = SNUG_DT_BF16, .ndim = 2, .shape = {(int64_t)R, (int64_t)K}, .h16 = h,
         .h16_dtype = SNUG_DT_BF16, .transpose2d = 1},
        {.name = "h16to16", .dtype = SNUG_DT_F16, .ndim = 1, .shape = {(int64_t)(R * K)}, .h16 = h,
         .h16_dtype = SNUG_DT_BF16},
    };
    snug_error e = {0};
    snug_hasher hs;
    snug_hash_init(&hs, 99);
    snug_write_opts o = {.direct = 1, .hash = &hs};
    CHECKF(snug_st_write(tpath("large.safetensors"), outs, 5, &o, &e) == 0, "%s", e.msg);
    char *raw;
    size_t rawlen;
    CHECK(snug_read_file(tpath("large.safetensors"), &raw, &rawlen, &e) == 0);
    CHECK(hs.total == rawlen && snug_hash_final(&hs) == snug_hash64(raw, rawlen, 99));
    free(raw);
    snug_st_set s;
    CHECKF(snug_st_open_file(&s, tpath("large.safetensors"), &e) == 0, "%s", e.msg);
    float *got = malloc((R * K > R2 * K2 ? R * K : R2 * K2) * sizeof *got);
    const snug_st_tensor *t = snug_st_find(&s, "band");
    CHECK(t && snug_st_to_f32(&s, t, got, 1, &e) == 0 && memcmp(got, a, R * K * sizeof *a) == 0);
    int ok = t && snug_st_to_f32(&s, t, got, 0, &e) == 0;
    for (size_t r = 0; ok && r < R; r++)
        for (size_t k = 0; k < K; k++)
            ok &= got[r * K + k] == a[k * R + r];
    CHECK(ok);
    t = snug_st_find(&s, "long");
    CHECK(t && snug_st_to_f32(&s, t, got, 1, &e) == 0 && memcmp(got, b, R2 * K2 * sizeof *b) == 0);
    t = snug_st_find(&s, "plain");
    CHECK(t && snug_st_to_f32(&s, t, got, 0, &e) == 0 && memcmp(got, a, R * K * sizeof *a) == 0);
    t = snug_st_find(&s, "h16");
    ok = t && snug_st_to_f32(&s, t, got, 1, &e) == 0;
    for (size_t i = 0; ok && i < R * K; i++)
        ok = got[i] == snug_bf16_to_f32(h[i]);
    CHECK(ok);
    t = snug_st_find(&s, "h16to16");
    ok = t && snug_st_to_f32(&s, t, got, 0, &e) == 0;
    for (size_t i = 0; ok && i < R * K; i++)
        ok = got[i] == snug_f16_to_f32(snug_f32_to_f16(snug_bf16_to_f32(h[i])));
    CHECK(ok);
    snug_st_close(&s);
    unlink(tpath("large.safetensors"));
    free(got);
    free(h);
    free(b);
    free(a);
}

int main(void) {
    snprintf(tmpdir, sizeof tmpdir, "/tmp/snug_test_st_XXXXXX");
    if (!mkdtemp(tmpdir)) {
        perror("mkdtemp");
        return 1;
    }
    test_dtype();
    test_round_trip();
    test_stream();
    test_large();
    test_crafted_valid();
    test_bad_files();
    test_nonfinite();
    test_dirs();
    test_huge_numbers();
    CHECKF(rmdir(tmpdir) == 0, "temporary folder %s not empty", tmpdir);
    return check_finish("test_safetensors");
}
