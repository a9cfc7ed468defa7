/* test_grads_ready.c: the grads-ready callback (model.h) tells the truth for every gradient layout.
 *
 * optimizer_in_backward and data-parallel all-reduce act on gradients as backward announces them, so each call must
 * name the parameters that became ready and where their gradients are at that moment. For each layout (fp32; bf16
 * and fp16 layer gradients in grads16; 16-bit with fp32 gradients; each with and without optimizer_in_backward, with
 * and without checkpointing) one step records every call and checks: the calls come in backward order (layers
 * L-1..0, then the globals); their ranges, both the callback's (offset, numel) and snug_model_ready_ranges', cover
 * the parameter table exactly once; and the gradients read at the announced place inside the callback are bitwise
 * those of the same precision's plain run (fp32 gradients, no checkpointing, no optimizer in backward), which is in
 * turn checked against an fp32 run from the same parameters to within the 16-bit dtype's precision.
 *
 * Also: the model's own host scratch allocations (RoPE tables, random init through a host buffer) failing is an
 * error returned to the caller, not an abort. */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#ifdef __GLIBC__
#include <malloc.h>
#endif

#include "check.h"
#include "core/dtype.h"
#include "model/presets.h"
#include "train/engine.h"

enum { B = 2, T = 11, VOCAB = 61, MAX_CALLS = 16 };

typedef struct batch {
    int32_t ids[B * T], labels[B * T], pos[B * T];
} batch;

static void make_batch(batch *b) {
    srand(11);
    for (int n = 0; n < B * T; n++) {
        b->ids[n] = rand() % VOCAB;
        b->pos[n] = n % T;
        b->labels[n] = n % T == 0 ? -1 : rand() % VOCAB;
    }
}

/* dst (n fp32, host) = the n gradient elements of type dt at device address src */
static void read_grad(snug_backend *be, float *dst, const void *src, snug_dtype dt, size_t n) {
    if (dt == SNUG_DT_F32) {
        be->to_host(be, dst, src, n * sizeof(float));
        return;
    }
    uint16_t *h = malloc(n * sizeof *h);
    be->to_host(be, h, src, n * sizeof *h);
    for (size_t k = 0; k < n; k++)
        dst[k] = dt == SNUG_DT_BF16 ? snug_bf16_to_f32(h[k]) : snug_f16_to_f32(h[k]);
    free(h);
}

/* What one step's callbacks announced. */
typedef struct rec {
    snug_model *m;
    int n;                            /* calls */
    int layer[MAX_CALLS];
    size_t offset[MAX_CALLS], numel[MAX_CALLS];
    int nranges[MAX_CALLS];
    int misplaced;                    /* ranges whose place is not inside their buffer */
    unsigned char *by_args, *by_ranges; /* (P) times each parameter was announced: by (offset, numel), by ranges */
    float *seen;                      /* (P) table order: the gradients read at the announced place, widened */
} rec;

static void on_ready(void *ud, int layer, size_t offset, size_t numel) {
    rec *r = ud;
    snug_model *m = r->m;
    size_t P = m->table.total;
    if (r->n == MAX_CALLS) {
        r->misplaced++;
        return;
    }
    int c = r->n++;
    r->layer[c] = layer, r->offset[c] = offset, r->numel[c] = numel;
    for (size_t k = 0; k < numel && offset < P && numel <= P; k++) /* the range may wrap past the table's end */
        r->by_args[(offset + k) % P]++;
    snug_grad_range g[SNUG_READY_MAX_RANGES];
    int n = snug_model_ready_ranges(m, layer, g, SNUG_READY_MAX_RANGES);
    r->nranges[c] = n;
    for (int k = 0; k < n && k < SNUG_READY_MAX_RANGES; k++) {
        int in16 = g[k].dt != SNUG_DT_F32;
        size_t have = in16 ? m->grads16_numel : m->grads_numel;
        void *want = in16 ? (void *)(m->grads16 + g[k].at) : (void *)(m->grads + g[k].at);
        if ((in16 && g[k].dt != m->lv.dt) || g[k].at + g[k].numel > have || g[k].data != want ||
            g[k].offset + g[k].numel > P) {
            r->misplaced++;
            continue;
        }
        for (size_t i = 0; i < g[k].numel; i++)
            r->by_ranges[g[k].offset + i]++;
        read_grad(m->be, r->seen + g[k].offset, g[k].data, g[k].dt, g[k].numel);
        if (m->lv.optimizer_in_backward) /* as the optimizer step does: the next layer accumulates into this buffer */
            m->be->zero(m->be, g[k].data, g[k].numel * snug_dtype_size(g[k].dt));
    }
}

/* One step of a fresh model with levers lv: parameters from init (random with seed 7 when NULL). Fills, when not
 * NULL: the final gradients (table order, widened), the parameters as the model holds them, and the record of the
 * callbacks. */
static void run(const snug_model_config *cfg, snug_levers lv, const batch *b, const float *init, float *final,
                float *params, rec *r) {
    snug_engine g;
    snug_error e = {0};
    snug_plan_spec spec = {.cfg = *cfg, .B = B, .T = T, .lv = lv, .with_grads = 1};
    if (snug_engine_create(&g, &spec, SNUG_BACKEND_CPU, 2, &e)) {
        fprintf(stderr, "engine: %s\n", e.msg);
        exit(1);
    }
    snug_model *m = &g.model;
    if (init)
        snug_model_put_params(m, init);
    else
        CHECK(snug_model_init_random(m, 7) == 0);
    if (m->grads)
        g.be->zero(g.be, m->grads, m->grads_numel * sizeof(float));
    if (m->grads16)
        g.be->zero(g.be, m->grads16, m->grads16_numel * sizeof(uint16_t));
    if (r) {
        size_t P = m->table.total;
        memset(r, 0, sizeof *r);
        r->m = m;
        r->by_args = calloc(P, 1), r->by_ranges = calloc(P, 1), r->seen = calloc(P, sizeof *r->seen);
        static const snug_model_hook_ops ops = {.grads_ready = on_ready};
        m->hooks = (snug_model_hooks){.ops = &ops, .ud = r};
    }
    snug_model_set_batch(m, b->ids, b->labels, b->pos, NULL, B, T);
    snug_model_step(m, 1.0f); /* the summed loss: gradients well inside fp16's range */
    for (int i = 0; final && i < m->table.n; i++) {
        snug_dtype dt;
        const void *gi = snug_model_grad(m, i, &dt);
        read_grad(g.be, final + m->table.e[i].offset, gi, dt, m->table.e[i].numel);
    }
    if (params)
        snug_model_get_params(m, params);
    if (r)
        r->m = NULL;
    snug_engine_free(&g);
}

static void rec_free(rec *r) {
    free(r->by_args);
    free(r->by_ranges);
    free(r->seen);
}

/* The checks on one layout's record; ref: the same precision's plain run's gradients (table order). */
static void check_record(const char *what, const rec *r, const snug_param_table *t, int L, const float *ref) {
    size_t P = t->total, layers = 0;
    for (int l = 0; l < L; l++)
        layers += t->layer_numel[l];
    CHECKF(r->n == L + 1, "%s: %d calls, want %d (one per layer and one for the globals)", what, r->n, L + 1);
    for (int c = 0; c < r->n && c <= L; c++) {
        int want = c < L ? L - 1 - c : -1;
        CHECKF(r->layer[c] == want, "%s: call %d announced layer %d, want %d (backward order)", what, c, r->layer[c],
               want);
        if (want >= 0)
            CHECKF(r->offset[c] == t->layer_offset[want] && r->numel[c] == t->layer_numel[want] && r->nranges[c] == 1,
                   "%s: layer %d announced [%zu, +%zu) in %d ranges, want [%zu, +%zu) in 1", what, want, r->offset[c],
                   r->numel[c], r->nranges[c], t->layer_offset[want], t->layer_numel[want]);
        else
            CHECKF(r->numel[c] == P - layers && r->nranges[c] >= 1 && r->nranges[c] <= SNUG_READY_MAX_RANGES,
                   "%s: the globals announced %zu parameters in %d ranges, want %zu", what, r->numel[c],
                   r->nranges[c], P - layers);
    }
    CHECKF(r->misplaced == 0, "%s: %d ranges point outside their gradient buffer", what, r->misplaced);
    size_t twice_args = 0, twice_ranges = 0, diff = 0, first = P;
    for (size_t k = 0; k < P; k++) {
        twice_args += r->by_args[k] != 1;
        twice_ranges += r->by_ranges[k] != 1;
        if (memcmp(&r->seen[k], &ref[k], sizeof(float)) != 0) {
            diff++;
            first = first < P ? first : k;
        }
    }
    CHECKF(twice_args == 0, "%s: %zu of %zu parameters not announced exactly once by (offset, numel)", what,
           twice_args, P);
    CHECKF(twice_ranges == 0, "%s: %zu of %zu parameters not announced exactly once by snug_model_ready_ranges",
           what, twice_ranges, P);
    CHECKF(diff == 0, "%s: %zu of %zu gradients read in the callback differ from the plain run's (first at %zu: %g "
           "vs %g)", what, diff, P, first, first < P ? r->seen[first] : 0.0, first < P ? ref[first] : 0.0);
}

/* Per tensor, the largest |a - ref| over the largest |ref|. */
static double worst_tensor_err(const snug_param_table *t, const float *a, const float *ref, int *worst) {
    double w = 0;
    for (int i = 0; i < t->n; i++) {
        double err = check_max_rel_f(a + t->e[i].offset, ref + t->e[i].offset, t->e[i].numel);
        if (err > w)
            w = err, *worst = i;
    }
    return w;
}

static void test_arch(snug_arch arch) {
    const char *arch_name = arch == SNUG_ARCH_GPT2 ? "gpt2" : "llama";
    snug_model_config cfg = check_small_model(arch, VOCAB, 3, 64, 32);
    snug_param_table t;
    snug_error e = {0};
    CHECK(snug_param_table_build(&t, &cfg, &e) == 0);
    size_t P = t.total;
    int L = cfg.n_layer;
    batch b;
    make_batch(&b);
    float *ref = malloc(P * sizeof *ref), *params = malloc(P * sizeof *params), *ref32 = malloc(P * sizeof *ref32);

    struct {
        const char *name;
        snug_dtype dt;
        int grads_fp32;
    } precisions[] = {
        {"fp32", SNUG_DT_F32, 0},
        {"bf16 (grads16)", SNUG_DT_BF16, 0},
        {"fp16 (grads16)", SNUG_DT_F16, 0},
        {"bf16, fp32 gradients", SNUG_DT_BF16, 1},
        {"fp16, fp32 gradients", SNUG_DT_F16, 1},
    };
    struct {
        const char *name;
        snug_ckpt ckpt;
        int every;
    } ckpts[] = {
        {"no checkpointing", SNUG_CKPT_NONE, 1},
        {"full checkpointing", SNUG_CKPT_FULL, 1},
        {"full checkpointing every 2nd layer", SNUG_CKPT_FULL, 2},
        {"selective checkpointing", SNUG_CKPT_SELECTIVE, 1},
    };
    for (size_t p = 0; p < sizeof precisions / sizeof *precisions; p++) {
        snug_levers plain = {.ckpt_every = 1, .dt = precisions[p].dt, .grads_fp32 = precisions[p].grads_fp32};
        run(&cfg, plain, &b, NULL, ref, params, NULL);
        if (precisions[p].dt != SNUG_DT_F32) {
            /* the plain 16-bit run against fp32 from the same (16-bit) parameters: the parameters, saved activations
             * and (grads16) gradients are rounded to the dtype, each op computes in fp32 */
            run(&cfg, (snug_levers){.ckpt_every = 1}, &b, params, ref32, NULL, NULL);
            double eps = precisions[p].dt == SNUG_DT_BF16 ? 1.0 / 128 : 1.0 / 1024; /* 2^-7, 2^-10 */
            int worst = 0;
            double err = worst_tensor_err(&t, ref, ref32, &worst);
            CHECKF(err < 4 * eps, "%s %s: plain run's gradients %.3g from fp32's (%s), over 4 eps", arch_name,
                   precisions[p].name, err, t.e[worst].name);
            printf("  %s %s: plain run's gradients within %.2f eps of fp32's\n", arch_name, precisions[p].name,
                   err / eps);
        }
        for (int oib = 0; oib <= 1; oib++)
            for (size_t c = 0; c < sizeof ckpts / sizeof *ckpts; c++) {
                snug_levers lv = plain;
                lv.ckpt = ckpts[c].ckpt, lv.ckpt_every = ckpts[c].every, lv.optimizer_in_backward = oib;
                char what[160];
                snprintf(what, sizeof what, "%s %s, %s%s", arch_name, precisions[p].name, ckpts[c].name,
                         oib ? ", optimizer in backward" : "");
                rec r;
                float *final = oib ? NULL : malloc(P * sizeof *final);
                run(&cfg, lv, &b, NULL, final, NULL, &r);
                int before = check_failed;
                check_record(what, &r, &t, L, ref);
                if (final) /* read in the callback == what the step leaves behind */
                    CHECKF(memcmp(final, r.seen, P * sizeof *final) == 0, "%s: gradients read in the callback "
                           "changed before the step ended", what);
                printf("  %-80s %s\n", what, check_failed == before ? "ok" : "FAILED");
                free(final);
                rec_free(&r);
            }
    }
    free(ref);
    free(params);
    free(ref32);
    snug_param_table_free(&t);
}

/* Bytes of address space this process has mapped (Linux), 0 when unknown. */
static size_t mapped_bytes(void) {
    FILE *f = fopen("/proc/self/statm", "r");
    unsigned long pages = 0;
    if (f) {
        if (fscanf(f, "%lu", &pages) != 1)
            pages = 0;
        fclose(f);
    }
    return (size_t)pages * 4096;
}

static void test_out_of_memory(void) {
    /* RoPE tables for T x head_dim/2 = 2^59 angles: the host scratch cannot exist on any machine */
    snug_model m;
    memset(&m, 0, sizeof m);
    float unused[2];
    m.rope_cos = &unused[0], m.rope_sin = &unused[1];
    m.T = 1 << 30, m.cfg.head_dim = 1 << 30;
    CHECKF(snug_model_init_rope(&m) == SNUG_ENOMEM, "RoPE tables without host memory must return SNUG_ENOMEM");

    /* random init of 16-bit parameters goes through a host buffer; with the address space capped near what is
     * mapped already, that buffer cannot be had: an error, and the parameters are left as they were */
    snug_model_config cfg = check_small_model(SNUG_ARCH_LLAMA, VOCAB, 3, 64, 32);
    snug_plan_spec spec = {.cfg = cfg, .B = B, .T = T, .lv = {.ckpt_every = 1, .dt = SNUG_DT_BF16}, .with_grads = 1};
    snug_engine g;
    snug_error e = {0};
    if (snug_engine_create(&g, &spec, SNUG_BACKEND_CPU, 2, &e)) {
        fprintf(stderr, "engine: %s\n", e.msg);
        exit(1);
    }
    size_t P = g.model.table.total;
    float *before = malloc(P * sizeof *before), *after = malloc(P * sizeof *after);
    snug_model_get_params(&g.model, before);
    struct rlimit old, capped;
    size_t mapped = mapped_bytes();
#ifdef __GLIBC__
    mallopt(M_MMAP_THRESHOLD, 128 * 1024); /* a fixed threshold: the 4 MiB buffer needs a new mapping */
    malloc_trim(0);
    mapped = mapped_bytes();
#endif
    if (mapped && getrlimit(RLIMIT_AS, &old) == 0) {
        capped = old;
        capped.rlim_cur = (rlim_t)(mapped + (1u << 20)); /* 1 MiB to spare; the buffer is 4 MiB */
        int rc = -1;
        if (setrlimit(RLIMIT_AS, &capped) == 0) {
            rc = snug_model_init_random(&g.model, 7);
            setrlimit(RLIMIT_AS, &old);
        }
        CHECKF(rc == SNUG_ENOMEM, "random init without host memory returned %d, want SNUG_ENOMEM", rc);
        snug_model_get_params(&g.model, after);
        CHECKF(memcmp(before, after, P * sizeof *before) == 0, "a failed random init changed the parameters");
        CHECKF(snug_model_init_random(&g.model, 7) == 0, "random init with the memory back must succeed");
    } else {
        printf("  (address space unknown: the random-init out-of-memory case is skipped)\n");
    }
    free(before);
    free(after);
    snug_engine_free(&g);
}

int main(void) {
#if defined(__SANITIZE_ADDRESS__)
    /* AddressSanitizer refuses impossible sizes by aborting and maps its shadow memory outside any address-space cap:
     * the out-of-memory cases run in the normal build only */
    printf("  (AddressSanitizer build: the out-of-memory cases are skipped)\n");
    (void)test_out_of_memory;
#else
    test_out_of_memory();
#endif /* first: no large freed block in the heap yet that could serve the capped malloc */
    test_arch(SNUG_ARCH_LLAMA);
    test_arch(SNUG_ARCH_GPT2);
    return check_finish("test_grads_ready");
}
