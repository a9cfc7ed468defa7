/* adamw.c: AdamW with decoupled weight decay over the parameter table, and global-norm clipping (see optim.h). */
#include <math.h>

#include "optim/optim.h"

int snug_adamw_layout(snug_adamw *opt, snug_arenas *A, size_t nparams, snug_error *e) {
    opt->m = snug_arena_alloc(&A->a[SNUG_MEM_OPTIM], nparams * sizeof(float), e);
    if (!opt->m)
        return e ? e->code : SNUG_ENOMEM;
    opt->v = snug_arena_alloc(&A->a[SNUG_MEM_OPTIM], nparams * sizeof(float), e);
    if (!opt->v)
        return e ? e->code : SNUG_ENOMEM;
    return 0;
}

double snug_grad_norm(snug_backend *be, const float *grads, size_t n, float grad_scale) {
    return sqrt(be->sumsq(be, grads, n)) * fabs((double)grad_scale);
}

void snug_adamw_step(snug_adamw *opt, snug_backend *be, const snug_param_table *t, float *params, const float *grads,
                     double lr, float grad_scale) {
    opt->step++;
    for (int i = 0; i < t->n; i++) {
        const snug_param_entry *p = &t->e[i];
        be->adamw(be, params + p->offset, grads + p->offset, opt->m + p->offset, opt->v + p->offset, p->numel, lr,
                  opt->beta1, opt->beta2, opt->eps, p->decay ? opt->weight_decay : 0.0, opt->step, grad_scale);
    }
}
