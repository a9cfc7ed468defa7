/* rng.h: the seeded generator behind everything that must be reproducible (random init, shuffling, sampling):
 * splitmix64, the same sequence on every machine for a given seed. */
#ifndef SNUG_RNG_H
#define SNUG_RNG_H

#include <stddef.h>
#include <stdint.h>

static inline uint64_t snug_splitmix64(uint64_t *s) {
    uint64_t z = (*s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

/* Fisher-Yates over a[0..n) driven by snug_splitmix64 from seed. */
void snug_shuffle(size_t *a, size_t n, uint64_t seed);

#endif
