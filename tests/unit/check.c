/* check.c: counters and helpers for check.h. */
#include "check.h"

#include <math.h>

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
    return check_failed ? 1 : 0;
}
