/* cache.c: the tokenized-dataset cache file (see cache.h). */
#include "data/cache.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/fileio.h"

/* ---- file ---- */

enum { CACHE_VERSION = 1 };
static const char MAGIC[8] = {'S', 'N', 'U', 'G', 'D', 'A', 'T', 'A'};

typedef struct cache_header {
    char magic[8];
    uint32_t version;
    uint32_t header_bytes;
    uint64_t key;
    uint64_t nexamples, ntokens, nsources;
    uint64_t off_start, off_ids, off_sup, off_stats, total_bytes;
    uint64_t checksum; /* of the whole file with this field zero */
    uint64_t reserved[4];
} cache_header;

_Static_assert(sizeof(cache_header) == 128, "the cache header is 128 bytes");
_Static_assert(sizeof(snug_source_stats) == 7 * 8 + SNUG_DATA_BAD_LINES * 8 + 512, "stats have no padding");

static uint64_t align64(uint64_t x) { return (x + 63) & ~(uint64_t)63; }

/* The layout for the counts; 0 when they overflow. */
static int layout(cache_header *h, uint64_t nex, uint64_t ntok, uint64_t nsrc) {
    const uint64_t big = (uint64_t)1 << 56;
    if (nex >= big / 8 || ntok >= big / 4 || nsrc > SNUG_DATA_MAX_SOURCES)
        return 0;
    h->nexamples = nex;
    h->ntokens = ntok;
    h->nsources = nsrc;
    h->off_start = align64(sizeof(cache_header));
    h->off_ids = align64(h->off_start + (nex + 1) * 8);
    h->off_sup = align64(h->off_ids + ntok * 4);
    h->off_stats = align64(h->off_sup + ntok);
    h->total_bytes = h->off_stats + nsrc * sizeof(snug_source_stats);
    return 1;
}

static uint64_t checksum(const uint8_t *file, size_t len) {
    cache_header h;
    memcpy(&h, file, sizeof h);
    h.checksum = 0;
    snug_hasher s;
    snug_hash_init(&s, 0x736e756763616368ull);
    snug_hash_update(&s, &h, sizeof h);
    snug_hash_update(&s, file + sizeof h, len - sizeof h);
    return snug_hash_final(&s);
}

void snug_cache_close(snug_cache_view *v) {
    if (v->map)
        munmap(v->map, v->len);
    memset(v, 0, sizeof *v);
}

static int invalid(snug_cache_view *v, char *why, size_t cap, const char *what) {
    snprintf(why, cap, "%s", what);
    snug_cache_close(v);
    return 2;
}

int snug_cache_open(const char *path, uint64_t key, int nsrc, int vocab, snug_cache_view *v, snug_source_stats *stats,
                    char *why, size_t why_cap) {
    memset(v, 0, sizeof *v);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        if (errno == ENOENT)
            return 1;
        snprintf(why, why_cap, "unreadable: %s", strerror(errno));
        return 2;
    }
    struct stat st;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode) || st.st_size < (off_t)sizeof(cache_header)) {
        close(fd);
        snprintf(why, why_cap, "corrupt: shorter than its header");
        return 2;
    }
    v->len = (size_t)st.st_size;
    v->map = mmap(NULL, v->len, PROT_READ, MAP_PRIVATE, fd, 0);
    close(fd);
    if (v->map == MAP_FAILED) {
        v->map = NULL;
        snprintf(why, why_cap, "unreadable: cannot map it (%s)", strerror(errno));
        return 2;
    }
    const uint8_t *f = v->map;
    cache_header h, want;
    memcpy(&h, f, sizeof h);
    if (memcmp(h.magic, MAGIC, 8))
        return invalid(v, why, why_cap, "corrupt: not a snug data cache (bad magic)");
    if (h.version != CACHE_VERSION || h.header_bytes != sizeof h)
        return invalid(v, why, why_cap, "written by another version of snug");
    if (h.key != key)
        return invalid(v, why, why_cap, "corrupt: its key does not match its name");
    memset(&want, 0, sizeof want);
    if (!layout(&want, h.nexamples, h.ntokens, h.nsources) || h.nsources != (uint64_t)nsrc ||
        want.off_start != h.off_start || want.off_ids != h.off_ids || want.off_sup != h.off_sup ||
        want.off_stats != h.off_stats || want.total_bytes != h.total_bytes)
        return invalid(v, why, why_cap, "corrupt: inconsistent sizes in the header");
    if (h.total_bytes != v->len)
        return invalid(v, why, why_cap, "corrupt: the file size does not match its header (truncated?)");
    if (checksum(f, v->len) != h.checksum)
        return invalid(v, why, why_cap, "corrupt: checksum mismatch");
    v->start = (const uint64_t *)(f + h.off_start);
    v->ids = (const int32_t *)(f + h.off_ids);
    v->sup = (const uint8_t *)(f + h.off_sup);
    v->nexamples = h.nexamples;
    v->ntokens = h.ntokens;
    /* never trusted: the structure is checked too, so a file that matches its checksum but not snug's rules fails */
    if (v->start[0] != 0 || v->start[h.nexamples] != h.ntokens)
        return invalid(v, why, why_cap, "corrupt: example offsets out of range");
    for (uint64_t i = 0; i < h.nexamples; i++)
        if (v->start[i + 1] < v->start[i])
            return invalid(v, why, why_cap, "corrupt: example offsets out of order");
    int bad = 0;
    for (uint64_t i = 0; i < h.ntokens; i++)
        bad |= (v->ids[i] < 0) | (v->ids[i] >= vocab) | (v->sup[i] > 1);
    if (bad)
        return invalid(v, why, why_cap, "corrupt: a token id outside the vocabulary");
    memcpy(stats, f + h.off_stats, (size_t)nsrc * sizeof *stats);
    for (int i = 0; i < nsrc; i++)
        stats[i].first_bad[sizeof stats[i].first_bad - 1] = '\0';
    return 0;
}

/* The file is produced twice: once into the hash (for the checksum), once into the file. */
typedef struct emitter {
    snug_hasher *hs;
    snug_atomic_file *af;
    snug_error *e;
    uint64_t at;
} emitter;

static int emit(emitter *m, const void *p, size_t n) {
    m->at += n;
    if (m->hs) {
        snug_hash_update(m->hs, p, n);
        return 0;
    }
    return snug_atomic_write(m->af, p, n, m->e);
}

static int emit_pad(emitter *m, uint64_t to) {
    static const uint8_t zeros[64];
    return to > m->at ? emit(m, zeros, (size_t)(to - m->at)) : 0;
}

static int emit_all(emitter *m, const cache_header *h, const uint64_t *start, const int32_t *ids, const uint8_t *sup,
                    const snug_source_stats *stats) {
    SNUG_TRY(emit(m, h, sizeof *h));
    SNUG_TRY(emit_pad(m, h->off_start));
    SNUG_TRY(emit(m, start, (size_t)(h->nexamples + 1) * 8));
    SNUG_TRY(emit_pad(m, h->off_ids));
    SNUG_TRY(emit(m, ids, (size_t)h->ntokens * 4));
    SNUG_TRY(emit_pad(m, h->off_sup));
    SNUG_TRY(emit(m, sup, (size_t)h->ntokens));
    SNUG_TRY(emit_pad(m, h->off_stats));
    return emit(m, stats, (size_t)h->nsources * sizeof *stats);
}

int snug_cache_write(const char *path, uint64_t key, const uint64_t *start, uint64_t nexamples, const int32_t *ids,
                     const uint8_t *sup, uint64_t ntokens, const snug_source_stats *stats, int nsrc, snug_error *e) {
    cache_header h;
    memset(&h, 0, sizeof h);
    memcpy(h.magic, MAGIC, 8);
    h.version = CACHE_VERSION;
    h.header_bytes = sizeof h;
    h.key = key;
    if (!layout(&h, nexamples, ntokens, (uint64_t)nsrc))
        return snug_fail(e, SNUG_EINTERNAL, "%s: the dataset is too large for the cache format", path);
    snug_hasher hs;
    snug_hash_init(&hs, 0x736e756763616368ull);
    emitter m = {.hs = &hs, .e = e};
    emit_all(&m, &h, start, ids, sup, stats);
    h.checksum = snug_hash_final(&hs);
    snug_atomic_file af;
    SNUG_TRY(snug_atomic_open(&af, path, NULL, e));
    m = (emitter){.af = &af, .e = e};
    int rc = emit_all(&m, &h, start, ids, sup, stats);
    if (rc)
        return rc; /* snug_atomic_write aborted the file */
    return snug_atomic_commit(&af, e);
}
