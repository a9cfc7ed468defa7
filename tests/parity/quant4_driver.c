/* quant4_driver.c: runs snug's 4-bit quantization (src/model/quant4.c) for test_quant4_parity.py.
 *
 *   quant4_driver quant IN OUT SPEC...   SPEC = NAME:nf4|fp4:BLOCKSIZE:0|1 (nested). Quantizes tensor NAME of IN
 *                                        (F32/BF16/F16 [out, in]) and writes to OUT the tensors bitsandbytes'
 *                                        Linear4bit saves for it (snug_q4_st_outs_fill), plus "snug/NAME.f32" (the
 *                                        dequantized weight, F32 [out, in]) and "snug/NAME.out" (the same rounded to
 *                                        the weight's dtype)
 *                                        SPEC = NAME:int8:0:0 quantizes it as bitsandbytes' Int8Params and writes
 *                                        "NAME.CB" (its int8 codes as U8 [out, in]) and "NAME.SCB" (F32 [out]) with
 *                                        the same snug/ tensors
 *   quant4_driver export IN OUT SPEC...  the same without the snug/ tensors, and SPEC = NAME:copy copies tensor NAME
 *                                        as it is: a bnb-4bit checkpoint as snug writes one
 *   quant4_driver view IN OUT NAME...    reads the bnb-4bit weights NAME of IN in place (snug_q4_st_view) and writes
 *                                        "snug/NAME.f32" and "snug/NAME.out" as above; a failing view prints the
 *                                        error and exits 3
 *   quant4_driver mean FILE LANES THREADS  prints the bits of snug_q4_torch_mean of FILE's little-endian floats
 *   quant4_driver repr                   for each line of stdin (a double in C syntax) prints snug_json_py_float */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/json_util.h"
#include "model/quant4.h"

#define MAXW 128

static snug_st_out outs[MAXW * 8];
static int nouts;
static char names[MAXW * 2][600];
static int nnames;

static void die(const snug_error *e) {
    fprintf(stderr, "quant4_driver: %s\n", e->msg);
    exit(3);
}

/* Adds "snug/NAME.f32" and "snug/NAME.out" with t dequantized. */
static void add_dequant(const char *name, const snug_q4_tensor *t) {
    float *f = malloc(t->n * sizeof *f);
    void *o = malloc(t->n * snug_dtype_size(t->dtype));
    if (!f || !o)
        exit(1);
    snug_q4_dequantize(t, 0, t->n, f, SNUG_DT_F32);
    /* in two ranges, to exercise the range form */
    size_t mid = t->n / 3, esz = snug_dtype_size(t->dtype);
    snug_q4_dequantize(t, 0, mid, o, t->dtype);
    snug_q4_dequantize(t, mid, t->n, (char *)o + mid * esz, t->dtype);
    snprintf(names[nnames], sizeof names[0], "snug/%s.f32", name);
    outs[nouts++] = (snug_st_out){.name = names[nnames++], .dtype = SNUG_DT_F32, .ndim = 2,
                                  .shape = {t->shape[0], t->shape[1]}, .raw = f};
    snprintf(names[nnames], sizeof names[0], "snug/%s.out", name);
    outs[nouts++] = (snug_st_out){.name = names[nnames++], .dtype = t->dtype, .ndim = 2,
                                  .shape = {t->shape[0], t->shape[1]}, .raw = o};
}

static int cmd_quant(int argc, char **argv, int extras) {
    snug_error e = {0};
    snug_st_set in = {0};
    static snug_q4_st_outs w[MAXW];
    if (snug_st_open_file(&in, argv[2], &e))
        die(&e);
    for (int a = 4; a < argc && a - 4 < MAXW; a++) {
        char spec[512], *name = spec, *type, *bs, *nested;
        snprintf(spec, sizeof spec, "%s", argv[a]);
        const snug_st_tensor *x = NULL;
        if ((type = strchr(name, ':')) && strcmp(type, ":copy") == 0) {
            *type = '\0';
            if (!(x = snug_st_find(&in, name)))
                return fprintf(stderr, "quant4_driver: no tensor %s\n", name), 2;
            snprintf(names[nnames], sizeof names[0], "%s", name);
            snug_st_out *o = &outs[nouts++];
            *o = (snug_st_out){.name = names[nnames++], .dtype = x->dtype, .ndim = x->ndim, .raw = x->data};
            memcpy(o->shape, x->shape, sizeof o->shape);
            continue;
        }
        if (!(type = strchr(name, ':')) || !(bs = strchr(type + 1, ':')) || !(nested = strchr(bs + 1, ':')))
            return fprintf(stderr, "quant4_driver: bad spec %s\n", argv[a]), 2;
        *type++ = *bs++ = *nested++ = '\0';
        x = snug_st_find(&in, name);
        if (!x || x->ndim != 2)
            return fprintf(stderr, "quant4_driver: no 2-D tensor %s\n", name), 2;
        snug_q4_tensor t;
        int q8 = strcmp(type, "int8") == 0;
        if (snug_q4_init(&t, q8 ? SNUG_Q4_INT8 : strcmp(type, "fp4") == 0 ? SNUG_Q4_FP4 : SNUG_Q4_NF4, atoi(bs),
                         atoi(nested), x->shape[0], x->shape[1], x->dtype, &e))
            die(&e);
        void *buf = malloc(snug_q4_bytes(t.type, t.n, t.blocksize, t.nested));
        if (!buf)
            return 1;
        snug_q4_carve(&t, buf);
        if (q8) {
            if (snug_q4_quantize(&t, x->data, x->dtype, &e))
                die(&e);
            snprintf(names[nnames], sizeof names[0], "%s.CB", name);
            outs[nouts++] = (snug_st_out){.name = names[nnames++], .dtype = SNUG_DT_U8, .ndim = 2,
                                          .shape = {t.shape[0], t.shape[1]}, .raw = t.packed};
            snprintf(names[nnames], sizeof names[0], "%s.SCB", name);
            outs[nouts++] = (snug_st_out){.name = names[nnames++], .dtype = SNUG_DT_F32, .ndim = 1,
                                          .shape = {t.shape[0]}, .raw = t.absmax};
            add_dequant(name, &t);
            continue;
        }
        if (snug_q4_quantize(&t, x->data, x->dtype, &e) || snug_q4_st_outs_fill(&w[a - 4], name, &t, &e))
            die(&e);
        for (int k = 0; k < w[a - 4].n; k++)
            outs[nouts++] = w[a - 4].out[k];
        if (extras)
            add_dequant(name, &t);
    }
    if (snug_st_write(argv[3], outs, nouts, NULL, &e))
        die(&e);
    return 0;
}

static int cmd_view(int argc, char **argv) {
    snug_error e = {0};
    snug_st_set in = {0};
    if (snug_st_open_file(&in, argv[2], &e))
        die(&e);
    for (int a = 4; a < argc && a - 4 < MAXW; a++) {
        snug_q4_tensor t;
        if (!snug_q4_st_detect(&in, argv[a]))
            return fprintf(stderr, "quant4_driver: %s is not detected as 4-bit\n", argv[a]), 3;
        if (snug_q4_st_view(&in, argv[a], &t, &e))
            die(&e);
        add_dequant(argv[a], &t);
    }
    if (snug_st_write(argv[3], outs, nouts, NULL, &e))
        die(&e);
    return 0;
}

static int cmd_mean(char **argv) {
    FILE *f = fopen(argv[2], "rb");
    if (!f)
        return 1;
    fseek(f, 0, SEEK_END);
    size_t n = (size_t)ftell(f) / 4;
    fseek(f, 0, SEEK_SET);
    float *x = malloc((n ? n : 1) * sizeof *x);
    if (!x || fread(x, 4, n, f) != n)
        return 1;
    fclose(f);
    float m = snug_q4_torch_mean(x, n, atoi(argv[3]), atoi(argv[4]));
    unsigned u;
    memcpy(&u, &m, 4);
    printf("%08x\n", u);
    return 0;
}

static int cmd_repr(void) {
    char line[128], out[32];
    while (fgets(line, sizeof line, stdin)) {
        snug_json_py_float(strtod(line, NULL), out);
        puts(out);
    }
    return 0;
}

int main(int argc, char **argv) {
    if (argc >= 4 && strcmp(argv[1], "quant") == 0)
        return cmd_quant(argc, argv, 1);
    if (argc >= 4 && strcmp(argv[1], "export") == 0)
        return cmd_quant(argc, argv, 0);
    if (argc >= 4 && strcmp(argv[1], "view") == 0)
        return cmd_view(argc, argv);
    if (argc == 5 && strcmp(argv[1], "mean") == 0)
        return cmd_mean(argv);
    if (argc == 2 && strcmp(argv[1], "repr") == 0)
        return cmd_repr();
    fprintf(stderr, "usage: quant4_driver quant|export IN OUT SPEC... | view IN OUT NAME... | "
                    "mean FILE LANES THREADS | repr\n");
    return 2;
}
