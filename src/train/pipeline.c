/* pipeline.c: pipeline parallelism's 1F1B step, evaluation forward, tied head and norm (see pipeline.h). */
#include "train/pipeline.h"

#include <math.h>

#include "backend/backend.h"

/* The micro-batch of the layout's size N x C floats: what crosses between stages. */
static size_t stage_floats(const snug_model *m) { return (size_t)m->B * m->T * m->cfg.hidden_size; }

/* Slot of micro-batch i among the stage's inputs in flight. */
static float *in_slot(const snug_model *m, int i) {
    return snug_pp_first(m) ? NULL : m->pp_in + (size_t)(i % snug_pp_in_slots(m)) * stage_floats(m);
}

/* Micro-batch i's data (and LoRA dropout's seed), and its set of saved activations where the stage keeps one per
 * micro-batch in flight */
static void set_batch(snug_model *m, const snug_micro_batch *b, const uint64_t *seeds, int i) {
    snug_model_set_batch(m, b->ids, b->labels, b->pos, b->seg, b->rows, b->T);
    if (seeds)
        m->lora.seed = seeds[i];
    if (m->act_sets_n > 1)
        snug_model_use_set(m, i % m->act_sets_n);
}

/* The current micro-batch's output-sized exchange: N x C floats of the current batch's rows. */
static size_t cur_floats(const snug_model *m) { return (size_t)m->cur_B * m->cur_T * m->cfg.hidden_size; }

/* Forward of the current batch (micro-batch i) on a stage before the last: its input received, the output sent.
 * grad_scale: the step's (training: LoRA's dropout on), or 0 (evaluation). */
static int fwd(snug_pipe *p, snug_model *m, int i, float grad_scale, snug_error *e) {
    snug_comm *c = p->c;
    size_t n = cur_floats(m);
    float *in = in_slot(m, i);
    if (in)
        SNUG_TRY(c->recv(c, in, n, SNUG_COMM_F32, c->rank - 1, e));
    SNUG_TRY(c->wait(c, e)); /* the last output sent has been received: pp_out may be overwritten */
    snug_model_stage(m, grad_scale, in, NULL);
    return c->send(c, m->pp_out, n, SNUG_COMM_F32 | SNUG_COMM_ASYNC, c->rank + 1, e);
}

/* Backward of the current batch (micro-batch i): on the last stage its input received and its forward, loss and
 * backward run; before it, the output's gradient received and backward run from the micro-batch's set of saved
 * activations (with pipeline_recompute, from its forward run again on the kept input). The input's gradient goes
 * back to the previous stage. */
static int bwd(snug_pipe *p, snug_model *m, int i, float grad_scale, double *loss, snug_error *e) {
    snug_comm *c = p->c;
    size_t n = cur_floats(m);
    float *in = in_slot(m, i);
    if (snug_pp_last(m) && in)
        SNUG_TRY(c->recv(c, in, n, SNUG_COMM_F32, c->rank - 1, e));
    if (!snug_pp_last(m))
        SNUG_TRY(c->recv(c, m->pp_dout, n, SNUG_COMM_F32, c->rank + 1, e));
    SNUG_TRY(c->wait(c, e)); /* pp_din (and pp_out) free again */
    *loss += snug_model_stage(m, grad_scale, in, snug_pp_last(m) ? NULL : m->pp_dout);
    if (snug_pp_first(m))
        return 0;
    return c->send(c, m->pp_din, n, SNUG_COMM_F32 | SNUG_COMM_ASYNC, c->rank - 1, e);
}

int snug_pipe_step(snug_pipe *p, snug_model *m, const snug_micro_batch *mb, const uint64_t *seeds, int n,
                   float grad_scale, int *last, double *loss, snug_error *e) {
    int s = p->c->rank, w = p->c->size - s - 1;
    w = w < n ? w : n;
    *loss = 0;
    for (int i = 0; i < w; i++) { /* warm-up: the forwards ahead of the first backward */
        set_batch(m, &mb[i], seeds, i);
        SNUG_TRY(fwd(p, m, i, grad_scale, e));
    }
    for (int i = 0; i < n; i++) { /* one forward, one backward; then the backwards left */
        if (i + w < n && !snug_pp_last(m) && w > 0) {
            set_batch(m, &mb[i + w], seeds, i + w);
            SNUG_TRY(fwd(p, m, i + w, grad_scale, e));
        }
        set_batch(m, &mb[i], seeds, i);
        if (last)
            *last = i == n - 1;
        int rc = bwd(p, m, i, grad_scale, loss, e);
        if (last)
            *last = 0;
        SNUG_TRY(rc);
    }
    return p->c->wait(p->c, e); /* every send received: the next step starts with nothing in flight */
}

int snug_pipe_forward(snug_pipe *p, snug_model *m, double *loss, snug_error *e) {
    snug_comm *c = p->c;
    *loss = 0;
    if (!snug_pp_last(m)) {
        SNUG_TRY(fwd(p, m, 0, 0.0f, e));
        return c->wait(c, e);
    }
    float *in = in_slot(m, 0);
    SNUG_TRY(c->recv(c, in, cur_floats(m), SNUG_COMM_F32, c->rank - 1, e));
    *loss = snug_model_stage(m, 0.0f, in, NULL);
    return 0;
}

/* The table entry of the embedding a tied head reads, or -1. */
static int tied_entry(const snug_model *m) {
    if (m->pp <= 1 || !m->cfg.tie_embeddings || m->gwte == (size_t)-1 || !m->grads) /* (LoRA: a frozen base) */
        return -1;
    for (int i = 0; i < m->table.n; i++)
        if (m->table.e[i].layer < 0 && m->table.e[i].offset == m->gwte)
            return i;
    return -1;
}

int snug_pipe_tied_sum(snug_pipe *p, snug_model *m, snug_error *e) {
    int i = tied_entry(m);
    if (i < 0 || !p->ends)
        return 0;
    snug_dtype dt;
    void *g = snug_model_grad(m, i, &dt); /* a global tensor's gradient: fp32 (none when frozen) */
    if (!g)
        return 0;
    return p->ends->allreduce_sum(p->ends, g, m->table.e[i].numel, SNUG_COMM_F32, e);
}

int snug_pipe_grad_norm(snug_pipe *p, const snug_model *m, float grad_scale, double *norm, snug_error *e) {
    int skip = snug_pp_last(m) && !snug_pp_first(m) ? tied_entry(m) : -1; /* the first stage counts it */
    double ss = m->lora.grads ? m->be->sumsq(m->be, m->lora.grads, SNUG_DT_F32, m->lora.table.total) : 0;
    for (int i = 0; i < m->table.n && !m->lora.grads; i++) {
        if (i == skip)
            continue;
        snug_dtype dt;
        const void *g = snug_model_grad(m, i, &dt);
        if (g) /* (a frozen tensor has none: unfrozen_parameters) */
            ss += m->be->sumsq(m->be, g, dt, m->table.e[i].numel);
    }
    SNUG_TRY(p->c->allreduce_sum(p->c, &ss, 1, SNUG_COMM_F64 | SNUG_COMM_HOST, e));
    *norm = sqrt(ss) * fabs((double)grad_scale);
    return 0;
}
