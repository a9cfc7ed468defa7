/* hash.c: the 64-bit streaming hash (see hash.h). */
#include "core/hash.h"

#include <string.h>

static const uint64_t K1 = 0x9E3779B97F4A7C15ull, K2 = 0xBF58476D1CE4E5B9ull;

static inline uint64_t mix_word(uint64_t h, uint64_t w) {
    h ^= w;
    h *= K1;
    return h ^ (h >> 29); /* both steps are bijections: any one changed word changes the result */
}

void snug_hash_init(snug_hasher *s, uint64_t seed) {
    memset(s, 0, sizeof *s);
    s->h = seed ^ K2;
}

void snug_hash_update(snug_hasher *s, const void *data, size_t n) {
    const uint8_t *p = data;
    s->total += n;
    while (s->nbuf > 0 && s->nbuf < 8 && n) { /* finish a partial word */
        s->buf[s->nbuf++] = *p++;
        n--;
        if (s->nbuf == 8) {
            uint64_t w;
            memcpy(&w, s->buf, 8);
            s->h = mix_word(s->h, w);
            s->nbuf = 0;
        }
    }
    if (s->nbuf) /* the partial word is still not full: n is spent */
        return;
    uint64_t h = s->h;
    for (; n >= 8; p += 8, n -= 8) {
        uint64_t w;
        memcpy(&w, p, 8);
        h = mix_word(h, w);
    }
    s->h = h;
    if (n) /* (data may be NULL with n 0) */
        memcpy(s->buf, p, n);
    s->nbuf = n;
}

uint64_t snug_hash_final(const snug_hasher *s) {
    uint64_t h = s->h;
    if (s->nbuf) {
        uint64_t w = 0;
        memcpy(&w, s->buf, s->nbuf);
        h = mix_word(h, w ^ 0x80);
    }
    h ^= s->total;
    h ^= h >> 33; /* murmur3's finalizer */
    h *= 0xff51afd7ed558ccdull;
    h ^= h >> 33;
    h *= 0xc4ceb9fe1a85ec53ull;
    return h ^ (h >> 33);
}

uint64_t snug_hash64(const void *data, size_t n, uint64_t seed) {
    snug_hasher s;
    snug_hash_init(&s, seed);
    snug_hash_update(&s, data, n);
    return snug_hash_final(&s);
}
