/* bench_packing.c: what each way of batching costs on real text, and how long packing takes at a million examples.
 *
 * For every JSONL file (completion format, {"text": ...}; default data/fortunes.jsonl) and sequence_len, tokenizes the
 * file with the tokenizer (default assets/tokenizer), truncating examples to sequence_len as training does, and prints
 * the padding and efficiency of fixed padding, dynamic padding, length grouping, packing and concatenation over one
 * epoch (the run header's report). Then draws 1,000,000 examples from the file's length distribution (a seeded random
 * selection, repeated) and times planning one packed epoch (shuffle, first-fit decreasing in groups of 100,000, row
 * shuffle) and one dynamically padded and one grouped epoch, best of 3.
 *
 *     build/bench_packing [--tokenizer DIR] [--sequence_len 512,2048] [--micro_batch_size 8] [--examples 1000000]
 *                         [FILE.jsonl ...] */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "data/batching.h"
#include "data/dataset.h"
#include "data/tokenizer.h"

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + 1e-9 * ts.tv_nsec;
}

static int tok_encode(const void *ctx, const char *text, size_t len, int32_t **ids, size_t *n, size_t *cap,
                      snug_error *e) {
    return snug_tok_encode((const snug_tokenizer *)ctx, text, len, ids, n, cap, e) < 0 ? (e->code ? e->code : 1) : 0;
}

static int tok_special_id(const void *ctx, const char *token) {
    return snug_tok_token_id((const snug_tokenizer *)ctx, token);
}

/* A view of ds with n examples drawn at random (seeded) from it: only the selection arrays are new. */
static snug_dataset draw(const snug_dataset *ds, size_t n, uint64_t seed) {
    snug_dataset v = {.ids = ds->ids, .sup = ds->sup, .start = ds->start, .nexamples = n};
    v.pick = malloc(n * sizeof *v.pick);
    v.cum = malloc((n + 1) * sizeof *v.cum);
    if (!v.pick || !v.cum) {
        fprintf(stderr, "out of memory\n");
        exit(1);
    }
    uint64_t s = seed, tok = 0;
    for (size_t i = 0; i < n; i++) {
        s = s * 6364136223846793005ull + 1442695040888963407ull;
        size_t k = (size_t)((s >> 33) % ds->nexamples);
        v.pick[i] = ds->pick ? ds->pick[k] : k;
        v.cum[i] = tok;
        tok += snug_dataset_example(ds, k, NULL, NULL);
    }
    v.cum[n] = tok;
    v.ntokens = (size_t)tok;
    return v;
}

/* Best of 3: seconds to plan epoch 0 (snug_loader_init) and the efficiency it reached. */
static double time_plan(const snug_dataset *ds, snug_batching how, int B, int T, double *eff) {
    double best = 1e30;
    for (int r = 0; r < 3; r++) {
        snug_batching_opts o = {.how = how, .B = B, .T = T, .shuffle = 1, .seed = 42 + (uint64_t)r};
        snug_loader l;
        snug_error e = {0};
        double t0 = now();
        if (snug_loader_init(&l, ds, &o, &e)) {
            fprintf(stderr, "%s\n", e.msg);
            exit(1);
        }
        double t = now() - t0;
        best = t < best ? t : best;
        if (how == SNUG_BATCHING_PACK)
            *eff = (double)ds->ntokens / ((double)l.nrows * T);
        snug_loader_free(&l);
    }
    return best;
}

int main(int argc, char **argv) {
    char tokpath[4096];
    snprintf(tokpath, sizeof tokpath, "%s/assets/tokenizer/tokenizer.json", SNUG_SOURCE_DIR);
    const char *lens = "512,2048";
    int B = 8;
    size_t nbig = 1000000;
    const char *files[64];
    int nfiles = 0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--tokenizer") && i + 1 < argc) {
            const char *p = argv[++i];
            size_t n = strlen(p);
            snprintf(tokpath, sizeof tokpath, "%s%s", p, n > 5 && !strcmp(p + n - 5, ".json") ? "" : "/tokenizer.json");
        } else if (!strcmp(argv[i], "--sequence_len") && i + 1 < argc) {
            lens = argv[++i];
        } else if (!strcmp(argv[i], "--micro_batch_size") && i + 1 < argc) {
            B = atoi(argv[++i]);
        } else if (!strcmp(argv[i], "--examples") && i + 1 < argc) {
            nbig = (size_t)atoll(argv[++i]);
        } else if (argv[i][0] == '-') {
            fprintf(stderr, "usage: %s [--tokenizer DIR] [--sequence_len 512,2048] [--micro_batch_size 8] "
                    "[--examples 1000000] [FILE.jsonl ...]\n", argv[0]);
            return 2;
        } else if (nfiles < 64) {
            files[nfiles++] = argv[i];
        }
    }
    static char deffile[4096];
    if (nfiles == 0) {
        snprintf(deffile, sizeof deffile, "%s/data/fortunes.jsonl", SNUG_SOURCE_DIR);
        files[nfiles++] = deffile;
    }
    snug_tokenizer *tok;
    snug_error e = {0};
    if (snug_tok_load(&tok, tokpath, &e)) {
        fprintf(stderr, "%s\n", e.msg);
        return 1;
    }
    snug_encoder enc = {.ctx = tok, .encode = tok_encode, .special_id = tok_special_id,
                        .vocab_size = snug_tok_vocab_size(tok), .bos_id = snug_tok_bos_id(tok),
                        .eos_id = snug_tok_eos_id(tok), .hash = snug_tok_hash(tok)};
    for (int f = 0; f < nfiles; f++) {
        const char *p = lens;
        while (*p) {
            int T = atoi(p);
            p += strcspn(p, ",");
            p += *p == ',';
            if (T < 2)
                continue;
            snug_data_source src = {.path = files[f], .format = SNUG_DATA_COMPLETION, .field = "text"};
            snug_data_opts opts = {.sequence_len = T};
            snug_data_report rep;
            snug_dataset ds;
            if (snug_dataset_build(&ds, &src, 1, &opts, &enc, &rep, &e)) {
                fprintf(stderr, "%s\n", e.msg);
                return 1;
            }
            size_t mn = (size_t)-1, mx = 0;
            for (size_t i = 0; i < ds.nexamples; i++) {
                size_t L = snug_dataset_example(&ds, i, NULL, NULL);
                mn = L < mn ? L : mn;
                mx = L > mx ? L : mx;
            }
            printf("\n%s, sequence_len %d, micro_batch_size %d: %zu examples, %zu tokens (%zu to %zu per example, "
                   "mean %.0f; %llu truncated)\n", files[f], T, B, ds.nexamples, ds.ntokens, mn, mx,
                   (double)ds.ntokens / ds.nexamples, (unsigned long long)rep.src[0].long_examples);
            snug_batching_report r;
            snug_batching_opts o = {.how = SNUG_BATCHING_PACK, .B = B, .T = T, .shuffle = 1, .seed = 42};
            if (snug_batching_report_compute(&r, &ds, &o, &e)) {
                fprintf(stderr, "%s\n", e.msg);
                return 1;
            }
            snug_batching_report_print(stdout, &r);

            snug_dataset big = draw(&ds, nbig, 7);
            double ep = 0, ed = 0, eg = 0;
            double tp = time_plan(&big, SNUG_BATCHING_PACK, B, T, &ep);
            double td = time_plan(&big, SNUG_BATCHING_PAD, B, T, &ed);
            double tg = time_plan(&big, SNUG_BATCHING_GROUP, B, T, &eg);
            printf("  %zu examples drawn from it (%zu tokens): planning one epoch packed %.3f s (efficiency %.2f%%), "
                   "dynamic padding %.3f s, grouped %.3f s\n", nbig, big.ntokens, tp, 100 * ep, td, tg);
            free(big.pick);
            free(big.cum);
            snug_dataset_free(&ds);
        }
    }
    snug_tok_free(tok);
    return 0;
}
