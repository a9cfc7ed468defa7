/* check.c: counters and helpers for check.h. */
#include "check.h"

#include <math.h>

#include "model/presets.h"

int check_passed, check_failed;

double check_relerr(double a, double b, double floor) {
    double d = fabs(a - b), m = fmax(fmax(fabs(a), fabs(b)), floor);
    return d / m;
}

double check_max_relerr(const float *a, const double *ref, size_t n) {
    double scale = 1e-30, worst = 0;
    for (size_t i = 0; i < n; i++)
        scale = fmax(scale, fabs(ref[i]));
    for (size_t i = 0; i < n; i++) {
        double d = fabs((double)a[i] - ref[i]) / scale;
        if (!(d <= worst)) /* catches NaN too */
            worst = isnan(d) ? INFINITY : d;
    }
    return worst;
}

double check_max_rel_f(const float *a, const float *ref, size_t n) {
    double scale = 1e-30, worst = 0;
    for (size_t i = 0; i < n; i++)
        scale = fmax(scale, fabs(ref[i]));
    for (size_t i = 0; i < n; i++) {
        double d = fabs((double)a[i] - ref[i]) / scale;
        if (!(d <= worst))
            worst = isnan(d) ? INFINITY : d;
    }
    return worst;
}

int check_finish(const char *name) {
    printf("%s: %d passed, %d failed\n", name, check_passed, check_failed);
    if (check_passed + check_failed == 0) {
        /* a test that checked nothing has shown nothing: a path that cannot run here exits 77 (skipped) instead */
        fprintf(stderr, "%s: no checks were made\n", name);
        return 1;
    }
    return check_failed ? 1 : 0;
}

snug_model_config check_small_model(snug_arch arch, int vocab, int n_layer, int gpt2_fc, int max_position) {
    snug_model_config c;
    snug_error e = {0};
    if (arch == SNUG_ARCH_GPT2) {
        snug_preset(&c, "gpt2-124m", vocab, &e);
        c.hidden_size = 32, c.intermediate_size = gpt2_fc, c.n_head = 4, c.n_kv_head = 4;
    } else {
        snug_preset(&c, "tiny-llama", vocab, &e);
        c.hidden_size = 48, c.intermediate_size = 72, c.n_head = 6, c.n_kv_head = 2, c.tie_embeddings = 0;
    }
    c.n_layer = n_layer, c.max_position = max_position;
    c.head_dim = c.hidden_size / c.n_head;
    return c;
}
