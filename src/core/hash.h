/* hash.h: a 64-bit streaming hash (word at a time, multiply-xorshift; not cryptographic). It keys and checks the
 * tokenized-data cache and checks every file of a checkpoint; a file's hash can be taken while it is written. */
#ifndef SNUG_HASH_H
#define SNUG_HASH_H

#include <stddef.h>
#include <stdint.h>

/* Chunks may be of any length; the result depends only on the bytes (and the seed). */
typedef struct snug_hasher {
    uint64_t h, total;
    uint8_t buf[8];
    size_t nbuf;
} snug_hasher;

void snug_hash_init(snug_hasher *s, uint64_t seed);
void snug_hash_update(snug_hasher *s, const void *data, size_t n);
uint64_t snug_hash_final(const snug_hasher *s);
uint64_t snug_hash64(const void *data, size_t n, uint64_t seed);

#endif
