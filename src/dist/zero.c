/* zero.c: ZeRO's shard ranges (see zero.h). */
#include "dist/zero.h"

/* The edge at or below x that is a tensor's start plus whole blocks. */
static size_t snap(const size_t *starts, int n, size_t x, size_t block) {
    int i = 0;
    while (i + 1 < n && starts[i + 1] <= x)
        i++;
    return starts[i] + (x - starts[i]) / block * block;
}

/* floor(total x k / size) without overflow */
static size_t floor_part(size_t total, int k, int size) {
    return total / (size_t)size * (size_t)k + total % (size_t)size * (size_t)k / (size_t)size;
}

void snug_zero_shards(const size_t *starts, int n, size_t total, int size, size_t block, size_t *counts) {
    size_t prev = 0;
    for (int r = 0; r < size; r++) {
        size_t next = r + 1 == size ? total : snap(starts, n, floor_part(total, r + 1, size), block);
        if (next < prev)
            next = prev;
        counts[r] = next - prev;
        prev = next;
    }
}

void snug_add_range_counts(const size_t *shard, int size, size_t lo, size_t hi, size_t *counts) {
    size_t s0 = 0;
    for (int r = 0; r < size; s0 += shard[r], r++) {
        size_t a = s0 > lo ? s0 : lo, b = s0 + shard[r] < hi ? s0 + shard[r] : hi;
        counts[r] += b > a ? b - a : 0;
    }
}
