/* dataset.c: JSONL files to tokenized examples on all cores, the cache in front of it, the validation split, and
 * concatenate-and-chunk batches (see dataset.h). Per-line parsing and templates live in formats.c, the cache file in
 * cache.c. */
#include "data/dataset.h"

#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/fileio.h"
#include "core/rng.h"
#include "data/cache.h"
#include "data/formats.h"

/* ---- the byte-level stand-in ---- */

static int byte_encode(const void *ctx, const char *text, size_t len, int32_t **ids, size_t *n, size_t *cap,
                       snug_error *e) {
    (void)ctx;
    if (*n + len > *cap) {
        size_t nc = (*n + len) * 2 + 16;
        int32_t *p = realloc(*ids, nc * sizeof *p);
        if (!p)
            return snug_fail(e, SNUG_ENOMEM, "out of host memory tokenizing");
        *ids = p;
        *cap = nc;
    }
    for (size_t i = 0; i < len; i++)
        (*ids)[(*n)++] = (unsigned char)text[i];
    return 0;
}

snug_encoder snug_byte_encoder(void) {
    return (snug_encoder){.ctx = NULL, .encode = byte_encode, .special_id = NULL, .vocab_size = 257, .bos_id = -1,
                          .eos_id = 256, .hash = 0x6279746573323537ull /* "bytes257" */};
}

/* ---- the store: arrays owned by one or more datasets ---- */

struct snug_data_store {
    int refs;
    snug_cache_view view; /* when mapped from a cache file */
    int32_t *ids;         /* when malloc'd */
    uint8_t *sup;
    uint64_t *start;
};

static void store_release(snug_data_store *s) {
    if (!s || --s->refs > 0)
        return;
    snug_cache_close(&s->view);
    free(s->ids);
    free(s->sup);
    free(s->start);
    free(s);
}

void snug_dataset_free(snug_dataset *ds) {
    store_release(ds->store);
    free(ds->pick);
    free(ds->cum);
    memset(ds, 0, sizeof *ds);
}

size_t snug_dataset_example(const snug_dataset *ds, size_t i, const int32_t **ids, const uint8_t **sup) {
    size_t k = ds->pick ? (size_t)ds->pick[i] : i;
    uint64_t a = ds->start[k], b = ds->start[k + 1];
    if (ids)
        *ids = ds->ids + a;
    if (sup)
        *sup = ds->sup + a;
    return (size_t)(b - a);
}

/* ---- building: examples appended to growing arrays ---- */

typedef struct builder {
    int32_t *ids;
    uint8_t *sup;
    uint64_t *start;
    size_t ntok, captok, nex, capex;
} builder;

static int builder_push(builder *b, const int32_t *ids, const uint8_t *sup, size_t n) {
    if (b->ntok + n > b->captok) {
        size_t nc = (b->ntok + n) * 2 + 4096;
        int32_t *pi = realloc(b->ids, nc * sizeof *pi);
        if (pi)
            b->ids = pi;
        uint8_t *ps = realloc(b->sup, nc);
        if (ps)
            b->sup = ps;
        if (!pi || !ps)
            return -1;
        b->captok = nc;
    }
    if (b->nex + 2 > b->capex) {
        size_t nc = (b->nex + 2) * 2 + 256;
        uint64_t *p = realloc(b->start, nc * sizeof *p);
        if (!p)
            return -1;
        b->start = p;
        b->capex = nc;
    }
    if (b->nex == 0)
        b->start[0] = 0;
    memcpy(b->ids + b->ntok, ids, n * sizeof *ids);
    memcpy(b->sup + b->ntok, sup, n);
    b->ntok += n;
    b->start[++b->nex] = b->ntok;
    return 0;
}

static void builder_free(builder *b) {
    free(b->ids);
    free(b->sup);
    free(b->start);
    memset(b, 0, sizeof *b);
}

/* Hands the arrays to a new store (the builder is left empty). */
static int builder_finish(builder *b, snug_dataset *ds, snug_error *e) {
    snug_data_store *s = calloc(1, sizeof *s);
    if (!s || (b->nex == 0 && !(b->start = calloc(1, sizeof *b->start)))) {
        free(s);
        return snug_fail(e, SNUG_ENOMEM, "out of host memory holding the dataset");
    }
    s->refs = 1;
    s->ids = b->ids;
    s->sup = b->sup;
    s->start = b->start;
    memset(ds, 0, sizeof *ds);
    ds->store = s;
    ds->ids = s->ids;
    ds->sup = s->sup;
    ds->start = s->start;
    ds->nexamples = b->nex;
    ds->ntokens = b->ntok;
    memset(b, 0, sizeof *b);
    return 0;
}

/* ---- reading files ---- */

typedef struct mapped_file {
    const char *data;
    size_t len;
    int heap;              /* data was read into malloc'd memory (a pipe, snug_read_file), not mapped */
} mapped_file;

static int map_file(const char *path, mapped_file *m, snug_error *e) {
    memset(m, 0, sizeof *m);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    struct stat st;
    if (fd < 0 || fstat(fd, &st) != 0 || S_ISDIR(st.st_mode)) {
        int err = fd < 0 ? errno : EISDIR;
        if (fd >= 0)
            close(fd);
        return snug_fail(e, SNUG_EINPUT, "%s: cannot open the dataset file (%s); check datasets[].path in the config",
                         path, strerror(err));
    }
    if (!S_ISREG(st.st_mode)) { /* a pipe (`--dataset <(zcat data.jsonl.gz)`): its size unknown, read to its end */
        close(fd);
        char *buf;
        SNUG_TRY(snug_read_file(path, &buf, &m->len, e));
        m->data = buf, m->heap = 1;
        return 0;
    }
    m->len = (size_t)st.st_size;
    if (m->len) {
        void *p = mmap(NULL, m->len, PROT_READ, MAP_PRIVATE, fd, 0);
        if (p == MAP_FAILED) {
            int err = errno;
            close(fd);
            return snug_fail(e, SNUG_EIO, "%s: cannot read the dataset file (%s)", path, strerror(err));
        }
        m->data = p;
    }
    close(fd);
    return 0;
}

static void unmap_file(mapped_file *m) {
    if (m->heap)
        free((void *)m->data);
    else if (m->data)
        munmap((void *)m->data, m->len);
    memset(m, 0, sizeof *m);
}

typedef struct line_span {
    size_t off, len;
    uint64_t lineno;
} line_span;

/* The non-blank lines of a file (a UTF-8 byte order mark at the start and a \r before each \n are left out). */
static int split_lines(const mapped_file *m, line_span **out, size_t *nout, snug_error *e) {
    size_t n = 0, cap = 0, at = 0;
    uint64_t lineno = 0;
    line_span *L = NULL;
    if (m->len >= 3 && !memcmp(m->data, "\xEF\xBB\xBF", 3))
        at = 3;
    while (at < m->len) {
        const char *p = m->data + at, *nl = memchr(p, '\n', m->len - at);
        size_t len = nl ? (size_t)(nl - p) : m->len - at, full = len;
        lineno++;
        if (len && p[len - 1] == '\r')
            len--;
        size_t k = 0;
        while (k < len && (p[k] == ' ' || p[k] == '\t'))
            k++;
        if (k < len) {
            if (n == cap) {
                cap = cap ? 2 * cap : 1024;
                line_span *q = realloc(L, cap * sizeof *q);
                if (!q) {
                    free(L);
                    return snug_fail(e, SNUG_ENOMEM, "out of host memory indexing the dataset lines");
                }
                L = q;
            }
            L[n++] = (line_span){.off = at, .len = len, .lineno = lineno};
        }
        at += full + 1;
    }
    *out = L;
    *nout = n;
    return 0;
}

enum { BLOCK = 4096 }; /* lines tokenized in parallel before they are merged in order */

/* Tokenizes one file into b on all cores, applying the long-example and bad-line policies; st gets the counts. */
static int load_source(builder *b, const snug_data_source *src, const mapped_file *m, const snug_data_opts *o,
                       const snug_encoder *enc, snug_source_stats *st, snug_error *e) {
    memset(st, 0, sizeof *st);
    snug_format fmt;
    SNUG_TRY(snug_format_init(&fmt, src, o, enc, e));
    line_span *lines = NULL;
    size_t nlines = 0;
    if (split_lines(m, &lines, &nlines, e)) {
        snug_format_free(&fmt);
        return e->code ? e->code : SNUG_EINTERNAL;
    }
    snug_example *ex = calloc(BLOCK, sizeof *ex);
    int *lrc = calloc(BLOCK, sizeof *lrc);
    char **lmsg = calloc(BLOCK, sizeof *lmsg);
    int rc = 0;
    if (!ex || !lrc || !lmsg)
        rc = snug_fail(e, SNUG_ENOMEM, "out of host memory reading %s", src->path);
    json_object_seed(0); /* seed jansson's hash tables once, before the threads start */
    for (size_t b0 = 0; !rc && b0 < nlines; b0 += BLOCK) {
        size_t nb = nlines - b0 < BLOCK ? nlines - b0 : BLOCK;
#pragma omp parallel
        {
            snug_error le;
#pragma omp for schedule(dynamic, 16)
            for (size_t i = 0; i < nb; i++) {
                const line_span *L = &lines[b0 + i];
                lrc[i] = snug_format_line(&fmt, m->data + L->off, L->len, &ex[i], &le);
                lmsg[i] = lrc[i] ? strdup(le.msg) : NULL;
            }
        }
        for (size_t i = 0; i < nb; i++) { /* merge in file order */
            const line_span *L = &lines[b0 + i];
            if (rc) {
                /* after a failure: only free the messages */
            } else if (lrc[i] && (lrc[i] != SNUG_EINPUT || !o->skip_bad)) {
                rc = snug_fail(e, lrc[i], "%s line %llu: %s", src->path, (unsigned long long)L->lineno,
                               lmsg[i] ? lmsg[i] : "out of host memory");
            } else if (lrc[i]) {
                st->lines++;
                if (st->bad < SNUG_DATA_BAD_LINES)
                    st->bad_lines[st->bad] = L->lineno;
                if (st->bad == 0)
                    snprintf(st->first_bad, sizeof st->first_bad, "%s", lmsg[i] ? lmsg[i] : "?");
                st->bad++;
            } else {
                st->lines++;
                size_t n = ex[i].n;
                if (o->sequence_len > 0 && n > (size_t)o->sequence_len) {
                    st->long_examples++;
                    if (o->drop_long)
                        n = 0;
                    else
                        n = (size_t)o->sequence_len;
                }
                if (n) {
                    if (builder_push(b, ex[i].ids, ex[i].sup, n))
                        rc = snug_fail(e, SNUG_ENOMEM, "out of host memory holding the tokens of %s", src->path);
                    uint64_t nsup = 0;
                    for (size_t t = 0; t < n; t++)
                        nsup += ex[i].sup[t];
                    st->examples++;
                    st->tokens += n;
                    st->supervised += nsup;
                    st->long_unsupervised += n < ex[i].n && nsup == 0;
                }
            }
            free(lmsg[i]);
            lmsg[i] = NULL;
        }
    }
    for (size_t i = 0; ex && i < BLOCK; i++)
        snug_example_free(&ex[i]);
    free(ex);
    free(lrc);
    free(lmsg);
    free(lines);
    snug_format_free(&fmt);
    if (!rc && st->examples == 0) {
        if (st->lines == 0)
            rc = snug_fail(e, SNUG_EINPUT, "%s: the file has no examples (every line is blank); add one JSON object "
                           "per line", src->path);
        else
            rc = snug_fail(e, SNUG_EINPUT, "%s: no example left out of %llu lines (%llu bad lines skipped, %llu "
                           "longer than sequence_len %d dropped); fix the data or the options",
                           src->path, (unsigned long long)st->lines, (unsigned long long)st->bad,
                           (unsigned long long)st->long_examples, o->sequence_len);
    }
    return rc;
}

static int build_from_maps(snug_dataset *ds, const snug_data_source *src, const mapped_file *maps, int nsrc,
                           const snug_data_opts *o, const snug_encoder *enc, snug_data_report *rep, snug_error *e) {
    builder b = {0};
    for (int i = 0; i < nsrc; i++) {
        int rc = load_source(&b, &src[i], &maps[i], o, enc, &rep->src[i], e);
        if (rc) {
            builder_free(&b);
            return rc;
        }
    }
    return builder_finish(&b, ds, e);
}

static int check_sources(int nsrc, snug_data_report *rep, snug_error *e) {
    if (nsrc < 1 || nsrc > SNUG_DATA_MAX_SOURCES)
        return snug_fail(e, SNUG_EINPUT, "%d dataset files; give between 1 and %d", nsrc, SNUG_DATA_MAX_SOURCES);
    memset(rep, 0, sizeof *rep);
    rep->nsources = nsrc;
    return 0;
}

int snug_dataset_build(snug_dataset *ds, const snug_data_source *src, int nsrc, const snug_data_opts *opts,
                       const snug_encoder *enc, snug_data_report *rep_out, snug_error *e) {
    memset(ds, 0, sizeof *ds);
    snug_data_report *rep = rep_out ? rep_out : malloc(sizeof *rep);
    if (!rep)
        return snug_fail(e, SNUG_ENOMEM, "out of host memory");
    int rc = check_sources(nsrc, rep, e);
    mapped_file maps[SNUG_DATA_MAX_SOURCES] = {{0}};
    for (int i = 0; !rc && i < nsrc; i++)
        rc = map_file(src[i].path, &maps[i], e);
    if (!rc)
        rc = build_from_maps(ds, src, maps, nsrc, opts, enc, rep, e);
    for (int i = 0; i < nsrc && i < SNUG_DATA_MAX_SOURCES; i++)
        unmap_file(&maps[i]);
    if (!rep_out)
        free(rep);
    return rc;
}

/* ---- the cache in front of it ---- */

static void hash_u64(snug_hasher *h, uint64_t v) { snug_hash_update(h, &v, sizeof v); }

static void hash_str(snug_hasher *h, const char *s) {
    hash_u64(h, strlen(s));
    snug_hash_update(h, s, strlen(s));
}

/* Everything that changes the tokens: the files' bytes, the tokenizer, the formats and the options. */
static uint64_t cache_key(const snug_data_source *src, const mapped_file *maps, int nsrc, const snug_data_opts *o,
                          const snug_encoder *enc) {
    snug_hasher h;
    snug_hash_init(&h, 0x736e75672d6b6579ull);
    hash_str(&h, "snug tokenized data v1");
    hash_u64(&h, enc->hash);
    hash_u64(&h, (uint64_t)enc->vocab_size);
    hash_u64(&h, (uint64_t)(int64_t)enc->bos_id);
    hash_u64(&h, (uint64_t)(int64_t)enc->eos_id);
    hash_u64(&h, enc->special_id != NULL);
    hash_u64(&h, enc->decode != NULL);
    hash_u64(&h, (uint64_t)o->train_on_inputs);
    hash_u64(&h, (uint64_t)(int64_t)o->sequence_len);
    hash_u64(&h, (uint64_t)o->drop_long);
    hash_u64(&h, (uint64_t)o->skip_bad);
    hash_u64(&h, (uint64_t)nsrc);
    for (int i = 0; i < nsrc; i++) {
        hash_u64(&h, (uint64_t)src[i].format);
        hash_u64(&h, (uint64_t)src[i].chat);
        hash_str(&h, src[i].field && *src[i].field ? src[i].field : "text");
        if (src[i].format == SNUG_DATA_CHAT) { /* the fields and the roles read */
            hash_str(&h, src[i].messages && *src[i].messages ? src[i].messages : "messages");
            hash_str(&h, src[i].role && *src[i].role ? src[i].role : "role");
            hash_str(&h, src[i].content && *src[i].content ? src[i].content : "content");
            for (int r = 0; r < 3; r++)
                hash_str(&h, src[i].roles[r] ? src[i].roles[r] : "");
            if (src[i].chat == SNUG_CHAT_JINJA) { /* the template and the strings it is rendered with */
                const char *v[9] = {src[i].jinja, src[i].jinja_tool_use};
                memcpy(v + 2, src[i].chat_tokens, sizeof src[i].chat_tokens);
                for (int k = 0; k < 9; k++) {
                    hash_u64(&h, v[k] != NULL);
                    hash_str(&h, v[k] ? v[k] : "");
                }
                if (src[i].jinja && strstr(src[i].jinja, "strftime_now")) { /* it renders today's date */
                    char day[32];
                    time_t now = time(NULL);
                    struct tm tm;
                    strftime(day, sizeof day, "%Y-%m-%d", localtime_r(&now, &tm));
                    hash_str(&h, day);
                }
            }
        }
        hash_u64(&h, maps[i].len);
        hash_u64(&h, snug_hash64(maps[i].data, maps[i].len, 0x66696c65ull));
    }
    return snug_hash_final(&h);
}

static int dataset_from_view(snug_dataset *ds, snug_cache_view *v, snug_error *e) {
    snug_data_store *s = calloc(1, sizeof *s);
    if (!s) {
        snug_cache_close(v);
        return snug_fail(e, SNUG_ENOMEM, "out of host memory");
    }
    s->refs = 1;
    s->view = *v;
    memset(ds, 0, sizeof *ds);
    ds->store = s;
    ds->ids = v->ids;
    ds->sup = v->sup;
    ds->start = v->start;
    ds->nexamples = (size_t)v->nexamples;
    ds->ntokens = (size_t)v->ntokens;
    memset(v, 0, sizeof *v);
    return 0;
}

static int write_cache(const char *dir, const snug_data_report *rep, uint64_t key, const snug_dataset *ds, int nsrc,
                       snug_error *e) {
    int rc = snug_mkdirs(dir, e);
    if (!rc)
        rc = snug_cache_write(rep->cache_path, key, ds->start, ds->nexamples, ds->ids, ds->sup, ds->ntokens, rep->src,
                              nsrc, e);
    if (rc)
        snug_error_wrap(e, "tokenized-data cache (dataset_prepared_path %s): ", dir);
    return rc;
}

int snug_dataset_prepare(snug_dataset *ds, const snug_data_source *src, int nsrc, const snug_data_opts *opts,
                         const snug_encoder *enc, const char *cache_dir, snug_data_report *rep, snug_error *e) {
    memset(ds, 0, sizeof *ds);
    SNUG_TRY(check_sources(nsrc, rep, e));
    mapped_file maps[SNUG_DATA_MAX_SOURCES] = {{0}};
    int rc = 0;
    for (int i = 0; !rc && i < nsrc; i++)
        rc = map_file(src[i].path, &maps[i], e);
    uint64_t key = rc ? 0 : cache_key(src, maps, nsrc, opts, enc);
    if (!rc && snprintf(rep->cache_path, sizeof rep->cache_path, "%s/data-%016llx.snugdata", cache_dir,
                        (unsigned long long)key) >= (int)sizeof rep->cache_path)
        rc = snug_fail(e, SNUG_EINPUT, "dataset_prepared_path '%.100s...' is too long; use a shorter path", cache_dir);
    if (!rc) {
        snug_cache_view v;
        char why[200] = "";
        int got = snug_cache_open(rep->cache_path, key, nsrc, enc->vocab_size, &v, rep->src, why, sizeof why);
        if (got == 0) {
            rep->cache_hit = 1;
            rc = dataset_from_view(ds, &v, e);
        } else {
            memset(rep->src, 0, sizeof rep->src);
            if (got == 2)
                snprintf(rep->cache_note, sizeof rep->cache_note, "%s", why);
            rc = build_from_maps(ds, src, maps, nsrc, opts, enc, rep, e);
            if (!rc)
                rc = write_cache(cache_dir, rep, key, ds, nsrc, e);
            /* train from the mapped file, as a later run will: the heap copy goes */
            if (!rc &&
                snug_cache_open(rep->cache_path, key, nsrc, enc->vocab_size, &v, rep->src, why, sizeof why) == 0) {
                snug_dataset mapped;
                if (dataset_from_view(&mapped, &v, e) == 0) {
                    snug_dataset_free(ds);
                    *ds = mapped;
                }
            }
        }
    }
    for (int i = 0; i < nsrc && i < SNUG_DATA_MAX_SOURCES; i++)
        unmap_file(&maps[i]);
    if (rc)
        snug_dataset_free(ds);
    return rc;
}

/* ---- validation split ---- */



/* A selection of ds's examples: those with is_val[i] == want, in order. */
static int select_examples(const snug_dataset *ds, const char *is_val, char want, size_t count, snug_dataset *out) {
    memset(out, 0, sizeof *out);
    out->pick = malloc((count ? count : 1) * sizeof *out->pick);
    out->cum = malloc((count + 1) * sizeof *out->cum);
    if (!out->pick || !out->cum) {
        free(out->pick);
        free(out->cum);
        out->pick = out->cum = NULL;
        return -1;
    }
    size_t k = 0;
    uint64_t tok = 0;
    for (size_t i = 0; i < ds->nexamples; i++) {
        if (is_val[i] != want)
            continue;
        out->pick[k] = ds->pick ? ds->pick[i] : i;
        out->cum[k++] = tok;
        tok += snug_dataset_example(ds, i, NULL, NULL);
    }
    out->cum[k] = tok;
    out->nexamples = k;
    out->ntokens = (size_t)tok;
    out->store = ds->store;
    out->ids = ds->ids;
    out->sup = ds->sup;
    out->start = ds->start;
    return 0;
}

typedef struct keyed {
    uint64_t h;
    size_t i; /* prior's examples first (0 .. nprior - 1), then ds's */
} keyed;

static int by_hash(const void *a, const void *b) {
    const keyed *x = a, *y = b;
    return x->h != y->h ? (x->h < y->h ? -1 : 1) : (x->i > y->i) - (x->i < y->i);
}

/* Example i of prior (i < np) or of ds (i - np). */
static size_t nth(const snug_dataset *ds, const snug_dataset *prior, size_t np, size_t i, const int32_t **ids,
                  const uint8_t **sup) {
    return i < np ? snug_dataset_example(prior, i, ids, sup) : snug_dataset_example(ds, i - np, ids, sup);
}

int snug_dataset_dedup(snug_dataset *ds, const snug_dataset *prior, uint64_t *removed, snug_error *e) {
    size_t np = prior ? prior->nexamples : 0, n = ds->nexamples, all = np + n;
    keyed *k = malloc((all ? all : 1) * sizeof *k);
    char *keep = malloc(n ? n : 1);
    *removed = 0;
    if (!k || !keep) {
        free(k);
        free(keep);
        return snug_fail(e, SNUG_ENOMEM, "out of host memory removing duplicate examples");
    }
    for (size_t i = 0; i < all; i++) {
        const int32_t *ids;
        const uint8_t *sup;
        size_t len = nth(ds, prior, np, i, &ids, &sup);
        snug_hasher h;
        snug_hash_init(&h, 0x64656475ull);
        snug_hash_update(&h, ids, len * sizeof *ids);
        snug_hash_update(&h, sup, len);
        k[i] = (keyed){.h = snug_hash_final(&h), .i = i};
    }
    qsort(k, all, sizeof *k, by_hash);
    memset(keep, 1, n);
    for (size_t a = 0, b; a < all; a = b) { /* a run of equal hashes, in example order: each compared with those
                                             * before it that were kept */
        for (b = a + 1; b < all && k[b].h == k[a].h; b++)
            ;
        for (size_t x = a + 1; x < b; x++) {
            if (k[x].i < np)
                continue;
            const int32_t *ix;
            const uint8_t *sx;
            size_t lx = nth(ds, prior, np, k[x].i, &ix, &sx);
            for (size_t y = a; y < x; y++) {
                if (k[y].i >= np && !keep[k[y].i - np])
                    continue;
                const int32_t *iy;
                const uint8_t *sy;
                if (nth(ds, prior, np, k[y].i, &iy, &sy) == lx && !memcmp(ix, iy, lx * sizeof *ix) &&
                    !memcmp(sx, sy, lx)) {
                    keep[k[x].i - np] = 0;
                    break;
                }
            }
        }
    }
    free(k);
    size_t kept = 0;
    for (size_t i = 0; i < n; i++)
        kept += keep[i];
    *removed = n - kept;
    int rc = 0;
    if (kept < n) { /* the kept ones, as a view of the same store */
        snug_dataset out;
        for (size_t i = 0; i < n; i++)
            keep[i] = !keep[i]; /* select_examples takes those marked `want` */
        if (select_examples(ds, keep, 0, kept, &out)) {
            rc = snug_fail(e, SNUG_ENOMEM, "out of host memory removing duplicate examples");
        } else {
            free(ds->pick);
            free(ds->cum);
            *ds = out;
        }
    }
    free(keep);
    return rc;
}

int snug_dataset_split(snug_dataset *ds, double val, uint64_t seed, snug_dataset *val_out, snug_error *e) {
    memset(val_out, 0, sizeof *val_out);
    size_t n = ds->nexamples, nval = val < 1.0 ? (size_t)(val * (double)n + 0.5) : val < (double)n ? (size_t)val : n;
    if (nval == 0)
        return 0;
    if (nval >= n)
        return snug_fail(e, SNUG_EINPUT, "val_set_size %g leaves no training examples out of %zu; lower it", val, n);
    size_t *idx = malloc(n * sizeof *idx);
    char *is_val = calloc(n, 1);
    snug_dataset tr, va;
    int rc = 0;
    if (!idx || !is_val)
        rc = -1;
    if (!rc) {
        for (size_t i = 0; i < n; i++)
            idx[i] = i;
        snug_shuffle(idx, n, seed ^ 0x76616cull);
        for (size_t i = 0; i < nval; i++)
            is_val[idx[i]] = 1;
        rc = select_examples(ds, is_val, 0, n - nval, &tr);
        if (!rc && select_examples(ds, is_val, 1, nval, &va)) {
            free(tr.pick);
            free(tr.cum);
            rc = -1;
        }
    }
    free(idx);
    free(is_val);
    if (rc)
        return snug_fail(e, SNUG_ENOMEM, "out of host memory splitting the validation set");
    ds->store->refs++; /* now held by both sets */
    free(ds->pick);
    free(ds->cum);
    *ds = tr;
    *val_out = va;
    return 0;
}

/* ---- report ---- */

void snug_data_report_print(FILE *out, const char *label, const snug_data_report *rep, const snug_data_source *src,
                            const snug_data_opts *opts) {
    for (int i = 0; i < rep->nsources; i++) {
        const snug_source_stats *s = &rep->src[i];
        char kind[320];
        if (src[i].format == SNUG_DATA_CHAT && src[i].chat == SNUG_CHAT_JINJA) /* the template's file */
            snprintf(kind, sizeof kind, "chat, template of %.300s", src[i].jinja_where ? src[i].jinja_where : "?");
        else if (src[i].format == SNUG_DATA_CHAT)
            snprintf(kind, sizeof kind, "chat, %s", snug_chat_template_name(src[i].chat));
        else
            snprintf(kind, sizeof kind, "%s", snug_data_format_name(src[i].format));
        fprintf(out, "  %-20s %s (%s): %llu examples, %llu tokens, %llu supervised\n", i ? "" : label,
                src[i].path, kind, (unsigned long long)s->examples, (unsigned long long)s->tokens,
                (unsigned long long)s->supervised);
        if (s->long_examples) {
            fprintf(out, "  %-20s %llu examples longer than sequence_len %d: %s", "",
                    (unsigned long long)s->long_examples, opts->sequence_len,
                    opts->drop_long ? "dropped" : "truncated");
            if (s->long_unsupervised)
                fprintf(out, " (%llu of them keep no supervised token; raise sequence_len or set long_examples: drop)",
                        (unsigned long long)s->long_unsupervised);
            fputc('\n', out);
        }
        if (s->bad) {
            fprintf(out, "  %-20s skipped %llu bad line%s (line", "", (unsigned long long)s->bad,
                    s->bad > 1 ? "s" : "");
            for (uint64_t k = 0; k < s->bad && k < SNUG_DATA_BAD_LINES; k++)
                fprintf(out, "%s %llu", k ? "," : (s->bad > 1 ? "s" : ""), (unsigned long long)s->bad_lines[k]);
            fprintf(out, "%s); line %llu: %s\n", s->bad > SNUG_DATA_BAD_LINES ? ", ..." : "",
                    (unsigned long long)s->bad_lines[0], s->first_bad);
        }
    }
    if (rep->duplicates)
        fprintf(out, "  %-20s %llu duplicate example%s removed (dataset_exact_deduplication)\n", "",
                (unsigned long long)rep->duplicates, rep->duplicates > 1 ? "s" : "");
    if (rep->cache_path[0])
        fprintf(out, "  %-20s %s (%s%s%s)\n", "tokenized cache", rep->cache_path,
                rep->cache_hit ? "reused" : rep->cache_note[0] ? "rebuilt: " : "written", rep->cache_note,
                rep->cache_hit ? ", input and options unchanged" : "");
}

/* ---- batches ---- */

/* Tokens of the selected examples before example i (the concatenated stream's offsets). */
static inline uint64_t stream_at(const snug_dataset *ds, size_t i) { return ds->pick ? ds->cum[i] : ds->start[i]; }

/* n tokens of the concatenated stream from offset off, ids and flags. */
static void fetch(const snug_dataset *ds, uint64_t off, size_t n, int32_t *ids, uint8_t *sup) {
    size_t lo = 0, hi = ds->nexamples; /* the last example that starts at or before off */
    while (hi - lo > 1) {
        size_t mid = lo + (hi - lo) / 2;
        if (stream_at(ds, mid) <= off)
            lo = mid;
        else
            hi = mid;
    }
    size_t k = lo, got = 0;
    uint64_t within = off - stream_at(ds, k);
    while (got < n && k < ds->nexamples) {
        const int32_t *ei;
        const uint8_t *es;
        size_t len = snug_dataset_example(ds, k++, &ei, &es);
        size_t take = len > within ? len - (size_t)within : 0;
        if (take > n - got)
            take = n - got;
        memcpy(ids + got, ei + within, take * sizeof *ids);
        memcpy(sup + got, es + within, take);
        got += take;
        within = 0;
    }
}

int snug_batcher_init(snug_batcher *b, const snug_dataset *ds, int B, int T, uint64_t seed, int shuffle_rows,
                      snug_error *e) {
    memset(b, 0, sizeof *b);
    b->ds = ds;
    b->B = B;
    b->T = T;
    b->seed = seed;
    b->shuffle = shuffle_rows;
    b->nrows = ds->ntokens > 1 ? (ds->ntokens - 1) / (size_t)T : 0;
    if (b->nrows == 0)
        return snug_fail(e, SNUG_EINPUT,
                         "the dataset holds %zu tokens, fewer than one sequence of sequence_len %d + 1; add data or "
                         "lower sequence_len",
                         ds->ntokens, T);
    b->order = malloc(b->nrows * sizeof *b->order);
    b->row_ids = malloc(((size_t)T + 1) * sizeof *b->row_ids);
    b->row_sup = malloc((size_t)T + 1);
    if (!b->order || !b->row_ids || !b->row_sup) {
        snug_batcher_free(b);
        return snug_fail(e, SNUG_ENOMEM, "out of host memory for the batch order");
    }
    for (size_t i = 0; i < b->nrows; i++)
        b->order[i] = i;
    if (shuffle_rows)
        snug_shuffle(b->order, b->nrows, seed);
    return 0;
}

size_t snug_batcher_batches_per_epoch(const snug_batcher *b) { return (b->nrows + b->B - 1) / b->B; }

int snug_batcher_next(snug_batcher *b, int32_t *ids, int32_t *labels, int32_t *pos) {
    if (b->next >= b->nrows) {
        b->next = 0;
        b->epoch++;
        for (size_t i = 0; i < b->nrows; i++)
            b->order[i] = i;
        if (b->shuffle)
            snug_shuffle(b->order, b->nrows, b->seed + (uint64_t)b->epoch * 0x51ed27ull);
        return 0;
    }
    int rows = 0, T = b->T;
    while (rows < b->B && b->next < b->nrows) {
        fetch(b->ds, (uint64_t)b->order[b->next++] * (uint64_t)T, (size_t)T + 1, b->row_ids, b->row_sup);
        for (int t = 0; t < T; t++) {
            ids[(size_t)rows * T + t] = b->row_ids[t];
            labels[(size_t)rows * T + t] = b->row_sup[t + 1] ? b->row_ids[t + 1] : -1;
            pos[(size_t)rows * T + t] = t;
        }
        rows++;
    }
    return rows;
}

void snug_batcher_free(snug_batcher *b) {
    free(b->order);
    free(b->row_ids);
    free(b->row_sup);
    memset(b, 0, sizeof *b);
}

size_t snug_count_supervised(const int32_t *labels, size_t n) {
    size_t k = 0;
    for (size_t i = 0; i < n; i++)
        k += labels[i] >= 0;
    return k;
}
