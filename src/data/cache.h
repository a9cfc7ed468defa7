/* cache.h (internal to src/data): the binary file that holds a tokenized dataset, keyed and checked by core/hash.h.
 *
 * Layout (host byte order; every section starts at a multiple of 64 bytes, gaps are zero):
 *   header   magic "SNUGDATA", version, header size, key, counts, section offsets, total size, checksum
 *   start    (nexamples + 1) uint64   example i is tokens [start[i], start[i+1])
 *   ids      (ntokens) int32
 *   sup      (ntokens) uint8          1: supervised
 *   stats    (nsources) snug_source_stats
 * The checksum covers the whole file with the checksum field read as zero. A file is used only when the magic,
 * version, key, sizes, checksum, offsets and every id check out; anything else is "invalid" and gets rebuilt. */
#ifndef SNUG_DATA_CACHE_H
#define SNUG_DATA_CACHE_H

#include <stddef.h>
#include <stdint.h>

#include "core/error.h"
#include "core/hash.h"
#include "data/dataset.h"

/* A cache file mapped read-only, its arrays pointing into the map. */
typedef struct snug_cache_view {
    void *map;
    size_t len;
    const uint64_t *start; /* (nexamples + 1) */
    const int32_t *ids;    /* (ntokens) */
    const uint8_t *sup;    /* (ntokens) */
    uint64_t nexamples, ntokens;
} snug_cache_view;

/* Maps and checks path. Returns 0 (valid: v filled, stats[0..nsrc) copied), 1 (no such file) or 2 (unreadable or
 * invalid: why says what, e.g. "checksum mismatch"). */
int snug_cache_open(const char *path, uint64_t key, int nsrc, int vocab, snug_cache_view *v, snug_source_stats *stats,
                    char *why, size_t why_cap);
void snug_cache_close(snug_cache_view *v);

/* Writes the file atomically (temporary file, fsync, rename). */
int snug_cache_write(const char *path, uint64_t key, const uint64_t *start, uint64_t nexamples, const int32_t *ids,
                     const uint8_t *sup, uint64_t ntokens, const snug_source_stats *stats, int nsrc, snug_error *e);

#endif
