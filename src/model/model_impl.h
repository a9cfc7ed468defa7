/* model_impl.h: what the files of the model share and nothing outside src/model reads: small helpers, the
 * arena-carving macro, and the functions one file of the model calls in another (see each file's opening for
 * what it holds). The public interface is model.h. */
#ifndef SNUG_MODEL_IMPL_H
#define SNUG_MODEL_IMPL_H

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model/model.h"

static inline int ends_with(const char *s, const char *suffix) {
    size_t n = strlen(s), k = strlen(suffix);
    return n >= k && strcmp(s + n - k, suffix) == 0;
}

#define NO_GRAD ((size_t)-1) /* grad_off of a frozen tensor without gradient storage (lv.pack_grads) */

/* The first keys the attention of layer l (of this model or pipeline stage) takes (backend.h's seg_start): its
 * window's, the batch's segment starts, or NULL (plain causal). cfg's flags are the whole model's layers. */
static inline const int32_t *model_att_first(const snug_model *m, int l) {
    if (m->win_used && snug_layer_window(&m->cfg, l + (m->pp > 1 ? m->pp_l0 : 0)))
        return m->win;
    return m->seg_used ? m->seg : NULL;
}

static inline int is16(const snug_model *m) { return m->lv.dt == SNUG_DT_BF16 || m->lv.dt == SNUG_DT_F16; }

/* The model's hook operations (m->hooks): its table, or one of NULL operations when it has none. Call an operation
 * as model_hooks(m)->op(m->hooks.ud, ...) after checking that it is set. */
static inline const snug_model_hook_ops *model_hooks(const snug_model *m) {
    static const snug_model_hook_ops none;
    return m->hooks.ops ? m->hooks.ops : &none;
}

/* ptr = (count) elements of its type from arena `cat` of A; returns the error from the enclosing function (which
 * has snug_arenas *A and snug_error *e) when the arena is full. */
#define CARVE(ptr, cat, count)                                                               \
    do {                                                                                      \
        (ptr) = snug_arena_alloc(&A->a[cat], (size_t)(count) * sizeof *(ptr), e);             \
        if (!(ptr))                                                                           \
            return e ? e->code : SNUG_ENOMEM;                                                 \
    } while (0)

/* ZeRO-3: which global tensors model_gather_globals brings into gglob */
enum { GLOB_PRE = 1, GLOB_POST = 2 };

/* ZeRO-3 with vtied: where the loss's block of head rows (and, before the layers, the looked-up rows) go in the
 * region, after the globals (32-aligned). */
static inline size_t model_head_block_at(const snug_model *m) { return (m->gglob_n + 31) / 32 * 32; }

/* adapter.c: the base weight's rows for DoRA (snug_model_site_rows), as a snug_lora_rows_fn */
void model_lora_rows(void *ud, int l, snug_site site, int row, int nr, int in, float *dst);

/* What the adapters read of model m (see snug_lora_ctx). */
static inline snug_lora_ctx model_lora_ctx(snug_model *m) {
    return (snug_lora_ctx){.lora = &m->lora, .be = m->be, .base_rows = model_lora_rows, .ud = m};
}

/* views.c */
float **model_slot_of(const char *n, snug_tensors *v, snug_layer_tensors *L);
void model_make_views(const snug_model *m, float *base, const size_t *off, int globals_only, snug_tensors *v);
void model_layer_views(const snug_model *m, float *base, snug_layer_tensors *L);
void model_global_offsets(snug_model *m);
int model_wte_entry(const snug_model *m);
void model_dense_layer_views(const snug_model *m, float *base, snug_layer_tensors *L);
int model_weight_site(const char *name);

/* grads.c */
void model_drop_frozen(const snug_model *m, int l, snug_layer_tensors *g, snug_tensors *v);
void model_mask_frozen(snug_model *m, int group);
void model_announce_globals(snug_model *m, int group);
int model_grad_offsets(snug_model *m, snug_error *e);

/* gather.c */
size_t model_gglob_at(const snug_model *m, size_t offset);
void model_gather_settle(snug_model *m);
void model_gather_range(snug_model *m, void *dst, size_t offset, size_t numel, int prefetch);
void model_gather_globals(snug_model *m, int want);
const void *model_gathered_layer(snug_model *m, int l);
void model_q4_layer(snug_model *m, int l);
void model_q4_local(const snug_model *m, int l);

/* loss.c */
void model_lookup_rows(snug_model *m, int n);
void model_gather_lookup_rows(snug_model *m);
double model_loss_blocks(snug_model *m, const void *head, snug_dtype hdt, float *dhead, int N, float grad_scale,
                         int train, int skip);
void model_reduce_lookup_rows(snug_model *m, int N, int skip);
void model_vocab_blocks(snug_model *m, int B, int T, int with_grads);

/* acts.c */
int model_layout_acts(snug_model *m, snug_arenas *A, size_t N, int with_grads, snug_error *e);
void model_free_act_sets(snug_model *m);

/* storage.c */
size_t model_largest_layer(const snug_model *m);
size_t model_dense_layer(const snug_model *m, int l, size_t *start);
size_t model_largest_dense_layer(const snug_model *m);
int model_layer_has_bias(const snug_model *m);
size_t model_gcd_size(size_t a, size_t b);
void model_q4_spans_free(snug_model *m);
int model_storage_layout(snug_model *m, snug_error *e);
uint16_t *model_stored16(const snug_model *m, int i);

/* linear.c */
void model_dequant_rows(const snug_model *m, int i, size_t r0, size_t nr, float *dst);
const snug_layer_tensors *model_layer_weights(snug_model *m, int l);
void model_linear_fwd(snug_model *m, int l, snug_site site, float *out, const float *inp, const float *w,
                      const float *b, int N, int n0, int Cin, int OC);
void model_linear_bwd(snug_model *m, int l, snug_site site, float *dinp, float *dw, float *db, float *dout,
                      const float *inp, const float *w, int N, int n0, int Cin, int OC, const float *y,
                      const float *yb);
void model_tp_sum(snug_model *m, float *x, size_t n);

/* forward.c */
void model_norm_fwd(const snug_model *m, float *out, float *mean, float *rstd, const float *inp, const float *w,
                    const float *b, int N);
void model_mlp_act(const snug_model *m, float *act, const float *fc, int N);
void model_keep(const snug_model *m, uint16_t *dst, float *src, size_t n);
void model_fetch(const snug_model *m, float *dst, const uint16_t *src, size_t n);
float *model_res_at(const snug_model *m, int l);
void model_save_res(snug_model *m, int l, float *x, size_t n);
void model_load_res(snug_model *m, int l, float *x, size_t n);
void model_mlp_in(snug_model *m, int l, const snug_layer_tensors *w, const snug_layer_acts *a,
                  const snug_layer_acts16 *s, int n0, int ns);
void model_layer_fwd(snug_model *m, int l, int recompute);

/* backward.c */
void model_norm_bwd(const snug_model *m, float *dinp, float *dw, float *db, const float *dout, const float *inp,
                    const float *w, const float *mean, const float *rstd, int N);
void model_layer_bwd(snug_model *m, int l);

#endif
