/* rng.c: see rng.h. */
#include "core/rng.h"

void snug_shuffle(size_t *a, size_t n, uint64_t seed) {
    uint64_t s = seed;
    for (size_t i = n; i > 1; i--) {
        size_t j = (size_t)(snug_splitmix64(&s) % i);
        size_t t = a[i - 1];
        a[i - 1] = a[j];
        a[j] = t;
    }
}
