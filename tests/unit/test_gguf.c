/* test_gguf.c: the GGUF writer: the file's layout byte for byte (header, metadata of each value type, tensor infos
 * with reversed dims and 32-aligned offsets, padding, data), the conversions (f16, bf16) and Q8_0's blocks (the scale
 * amax / 127 in fp16, values rounded half away from zero, an all-zero block). */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "check.h"
#include "core/dtype.h"
#include "core/fileio.h"
#include "model/gguf.h"

static int fill_ramp(void *ud, int tag, float *dst, snug_error *e) {
    (void)ud, (void)e;
    for (int i = 0; i < 64; i++)
        dst[i] = (float)(i - 20) * 0.25f * (float)(tag + 1);
    return 0;
}

static int fill_fail(void *ud, int tag, float *dst, snug_error *e) {
    (void)ud, (void)tag, (void)dst;
    return snug_fail(e, SNUG_EINPUT, "no values");
}

/* Little-endian readers over the file's bytes. */
static const unsigned char *P;
static uint32_t u32(size_t *o) { uint32_t v; memcpy(&v, P + *o, 4); *o += 4; return v; }
static uint64_t u64(size_t *o) { uint64_t v; memcpy(&v, P + *o, 8); *o += 8; return v; }
static int str_is(size_t *o, const char *s) {
    uint64_t n = u64(o);
    int ok = n == strlen(s) && !memcmp(P + *o, s, n);
    *o += n;
    return ok;
}

static void test_q8_0(void) {
    float x[64] = {0}; /* a ramp in the first block (amax 18.3), zeros in the second */
    for (int j = 0; j < 32; j++)
        x[j] = (float)j - 12.7f;
    uint8_t out[68];
    snug_gguf_quantize_q8_0(x, 64, out);
    const float d = 18.3f / 127.0f, id = 1.0f / d;
    uint16_t dh;
    memcpy(&dh, out, 2);
    CHECK(dh == snug_f32_to_f16(d));
    int same = 1;
    for (int j = 0; j < 32; j++)
        same &= (int8_t)out[2 + j] == (int8_t)roundf(x[j] * id);
    CHECK(same && (int8_t)out[2 + 31] == 127);
    /* ties go away from zero: 2.5 -> 3, -2.5 -> -3 with d = 1 (amax 127) */
    float t[32] = {127.0f, 2.5f, -2.5f, 0.49f, -0.5f};
    snug_gguf_quantize_q8_0(t, 32, out);
    CHECK((int8_t)out[3] == 3 && (int8_t)out[4] == -3 && (int8_t)out[5] == 0 && (int8_t)out[6] == -1);
    /* the all-zero second block: scale 0, values 0 */
    snug_gguf_quantize_q8_0(x, 64, out);
    int zero = out[34] == 0 && out[35] == 0;
    for (int j = 0; j < 32; j++)
        zero &= out[36 + j] == 0;
    CHECK(zero);
    CHECK(snug_gguf_nbytes(SNUG_GGUF_Q8_0, 64) == 68 && snug_gguf_nbytes(SNUG_GGUF_BF16, 3) == 6);
}

static void test_layout(const char *dir) {
    char path[512];
    snprintf(path, sizeof path, "%s/t.gguf", dir);
    snug_gguf g;
    snug_gguf_init(&g);
    snug_error e = {0};
    snug_gguf_kv_str(&g, "general.architecture", "llama");
    snug_gguf_kv_u32(&g, "llama.block_count", 2);
    snug_gguf_kv_f32(&g, "llama.rope.freq_base", 10000.0f);
    snug_gguf_kv_bool(&g, "tokenizer.ggml.add_bos_token", 1);
    const char *toks[] = {"a", "bc"};
    snug_gguf_kv_strs(&g, "tokenizer.ggml.tokens", toks, NULL, 2);
    int32_t types[] = {1, 3};
    snug_gguf_kv_i32s(&g, "tokenizer.ggml.token_type", types, 2);
    int64_t s1[] = {2, 32}, s2[] = {3};
    CHECK(!snug_gguf_add_tensor(&g, "w", SNUG_GGUF_F16, 2, s1, fill_ramp, NULL, 0, &e));
    CHECK(!snug_gguf_add_tensor(&g, "b", SNUG_GGUF_F32, 1, s2, fill_ramp, NULL, 1, &e));
    int64_t bad[] = {2, 20};
    CHECK(snug_gguf_add_tensor(&g, "q", SNUG_GGUF_Q8_0, 2, bad, fill_ramp, NULL, 0, &e) != 0);
    CHECK(!snug_gguf_write(&g, path, &e));
    snug_gguf_free(&g);
    char *buf = NULL;
    size_t len = 0, o = 0;
    CHECK(!snug_read_file(path, &buf, &len, &e));
    if (!buf)
        return;
    P = (const unsigned char *)buf;
    CHECK(!memcmp(P, "GGUF", 4));
    o = 4;
    CHECK(u32(&o) == 3 && u64(&o) == 2 && u64(&o) == 6);
    CHECK(str_is(&o, "general.architecture") && u32(&o) == 8 && str_is(&o, "llama"));
    CHECK(str_is(&o, "llama.block_count") && u32(&o) == 4 && u32(&o) == 2);
    float f;
    CHECK(str_is(&o, "llama.rope.freq_base") && u32(&o) == 6);
    memcpy(&f, P + o, 4), o += 4;
    CHECK(f == 10000.0f);
    CHECK(str_is(&o, "tokenizer.ggml.add_bos_token") && u32(&o) == 7 && P[o] == 1);
    o++;
    CHECK(str_is(&o, "tokenizer.ggml.tokens") && u32(&o) == 9 && u32(&o) == 8 && u64(&o) == 2 && str_is(&o, "a") &&
          str_is(&o, "bc"));
    CHECK(str_is(&o, "tokenizer.ggml.token_type") && u32(&o) == 9 && u32(&o) == 5 && u64(&o) == 2 && u32(&o) == 1 &&
          u32(&o) == 3);
    /* tensor infos: dims ne0 first, offsets from the data's start padded to 32 */
    CHECK(str_is(&o, "w") && u32(&o) == 2 && u64(&o) == 32 && u64(&o) == 2 && u32(&o) == 1 && u64(&o) == 0);
    CHECK(str_is(&o, "b") && u32(&o) == 1 && u64(&o) == 3 && u32(&o) == 0 && u64(&o) == 128);
    size_t data = (o + 31) / 32 * 32;
    CHECK(len == data + 128 + 32);
    for (size_t i = o; i < data; i++)
        CHECK(P[i] == 0);
    uint16_t h;
    memcpy(&h, P + data + 2 * 5, 2);
    CHECK(h == snug_f32_to_f16((5 - 20) * 0.25f));
    memcpy(&f, P + data + 128 + 4 * 2, 4);
    CHECK(f == (2 - 20) * 0.25f * 2);
    free(buf);

    /* a fill that fails leaves no file */
    snprintf(path, sizeof path, "%s/fail.gguf", dir);
    snug_gguf_init(&g);
    CHECK(!snug_gguf_add_tensor(&g, "b", SNUG_GGUF_F32, 1, s2, fill_fail, NULL, 0, &e));
    CHECK(snug_gguf_write(&g, path, &e) == SNUG_EINPUT && !snug_file_exists(path));
    snug_gguf_free(&g);
}

int main(void) {
    char dir[] = "/tmp/snug_gguf_XXXXXX";
    if (!mkdtemp(dir))
        return 1;
    test_q8_0();
    test_layout(dir);
    char cmd[600];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    if (system(cmd)) {
    }
    return check_finish("test_gguf");
}
