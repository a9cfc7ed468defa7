/* tok_driver.c: runs snug's tokenizer over a file of documents for test_tokenizer_parity.py and bench_tokenizer.py.
 *
 *   tok_driver TOKENIZER_JSON DOCS IDS_OUT [DECODED_OUT] [--threads N] [--repeat R]
 *
 * DOCS holds records (u32 little-endian length, then that many bytes, any bytes). IDS_OUT gets, per document, a u32
 * count and that many i32 ids; DECODED_OUT gets, per document, a u32 length and the bytes snug_tok_decode gives back
 * for those ids. --threads N encodes everything again from N threads at once on the same tokenizer and fails if any
 * document's ids differ from the single-threaded run. --repeat R times R single-threaded passes and reports the best.
 * Prints one line: "info vocab_size=.. bos=.. adds_bos=.. eos=.. adds_eos=.. hash=.." and one "encode bytes=.. ids=.. seconds=..".
 */
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "data/tokenizer.h"

typedef struct doc {
    const char *text;
    uint32_t len;
    int32_t *ids;
    size_t n;
} doc;

static snug_tokenizer *tok;
static doc *docs;
static size_t ndocs;
static int nthreads = 0, failed = 0;

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static void *worker(void *arg) {
    size_t me = (size_t)arg;
    int32_t *ids = NULL;
    size_t cap = 0;
    for (size_t i = me; i < ndocs; i += (size_t)nthreads) {
        size_t n = 0;
        snug_error e = {0};
        if (snug_tok_encode(tok, docs[i].text, docs[i].len, &ids, &n, &cap, &e) < 0 || n != docs[i].n ||
            (n && memcmp(ids, docs[i].ids, n * sizeof *ids) != 0)) {
            fprintf(stderr, "thread %zu: document %zu differs from the single-threaded run %s\n", me, i, e.msg);
            __atomic_store_n(&failed, 1, __ATOMIC_SEQ_CST);
        }
    }
    free(ids);
    return NULL;
}

static int put_u32(FILE *f, uint32_t v) {
    return fwrite(&v, 4, 1, f) == 1 ? 0 : -1;
}

int main(int argc, char **argv) {
    if (argc < 4) {
        fprintf(stderr, "usage: %s TOKENIZER_JSON DOCS IDS_OUT [DECODED_OUT] [--threads N] [--repeat R]\n", argv[0]);
        return 2;
    }
    const char *decoded_path = NULL;
    int repeat = 1;
    for (int i = 4; i < argc; i++) {
        if (!strcmp(argv[i], "--threads") && i + 1 < argc)
            nthreads = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--repeat") && i + 1 < argc)
            repeat = atoi(argv[++i]);
        else
            decoded_path = argv[i];
    }
    snug_error e = {0};
    if (snug_tok_load(&tok, argv[1], &e)) {
        fprintf(stderr, "%s\n", e.msg);
        return 1;
    }
    printf("info vocab_size=%d bos=%d adds_bos=%d eos=%d adds_eos=%d hash=%016llx\n", snug_tok_vocab_size(tok),
           snug_tok_bos_id(tok), snug_tok_adds_bos(tok), snug_tok_eos_id(tok), snug_tok_adds_eos(tok),
           (unsigned long long)snug_tok_hash(tok));

    FILE *f = fopen(argv[2], "rb");
    if (!f) {
        perror(argv[2]);
        return 1;
    }
    fseek(f, 0, SEEK_END);
    long size = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *all = malloc((size_t)size + 1);
    if (!all || fread(all, 1, (size_t)size, f) != (size_t)size) {
        fprintf(stderr, "cannot read %s\n", argv[2]);
        return 1;
    }
    fclose(f);
    size_t cap_docs = 1024, total = 0;
    docs = malloc(cap_docs * sizeof *docs);
    for (size_t at = 0; at + 4 <= (size_t)size;) {
        uint32_t len;
        memcpy(&len, all + at, 4);
        at += 4;
        if (ndocs == cap_docs)
            docs = realloc(docs, (cap_docs *= 2) * sizeof *docs);
        docs[ndocs++] = (doc){all + at, len, NULL, 0};
        at += len;
        total += len;
    }

    double best = 1e30;
    size_t nids = 0;
    for (int r = 0; r < repeat; r++) {
        double t0 = now();
        nids = 0;
        for (size_t i = 0; i < ndocs; i++) {
            size_t cap = docs[i].n = 0;
            free(docs[i].ids);
            docs[i].ids = NULL;
            if (snug_tok_encode(tok, docs[i].text, docs[i].len, &docs[i].ids, &docs[i].n, &cap, &e) < 0) {
                fprintf(stderr, "document %zu: %s\n", i, e.msg);
                return 1;
            }
            nids += docs[i].n;
        }
        double dt = now() - t0;
        if (dt < best)
            best = dt;
    }
    printf("encode bytes=%zu ids=%zu seconds=%.6f\n", total, nids, best);

    FILE *out = fopen(argv[3], "wb"), *dec = decoded_path ? fopen(decoded_path, "wb") : NULL;
    if (!out || (decoded_path && !dec)) {
        perror("output");
        return 1;
    }
    for (size_t i = 0; i < ndocs; i++) {
        size_t n = docs[i].n;
        if (put_u32(out, (uint32_t)n) || (n && fwrite(docs[i].ids, 4, n, out) != n)) {
            perror(argv[3]);
            return 1;
        }
        if (dec) {
            char *text;
            size_t len;
            if (snug_tok_decode(tok, docs[i].ids, docs[i].n, &text, &len, &e)) {
                fprintf(stderr, "document %zu: %s\n", i, e.msg);
                return 1;
            }
            if (put_u32(dec, (uint32_t)len) || (len && fwrite(text, 1, len, dec) != len)) {
                perror(decoded_path);
                return 1;
            }
            free(text);
        }
    }
    fclose(out);
    if (dec)
        fclose(dec);

    if (nthreads > 0) {
        pthread_t th[64];
        if (nthreads > 64)
            nthreads = 64;
        for (int k = 0; k < nthreads; k++)
            pthread_create(&th[k], NULL, worker, (void *)(size_t)k);
        for (int k = 0; k < nthreads; k++)
            pthread_join(th[k], NULL);
        printf("threads %d %s\n", nthreads, failed ? "MISMATCH" : "same");
    }
    for (size_t i = 0; i < ndocs; i++)
        free(docs[i].ids);
    free(docs);
    free(all);
    snug_tok_free(tok);
    return failed;
}
