/* schedule.c: learning-rate schedules with warmup, matching transformers' get_*_schedule_with_warmup. */
#include <math.h>
#include <string.h>

#include "optim/optim.h"

double snug_lr_at(snug_sched kind, double base_lr, int step, int warmup, int total, double min_ratio) {
    if (step < warmup)
        return base_lr * (double)step / (double)(warmup > 0 ? warmup : 1);
    if (kind == SNUG_SCHED_CONSTANT)
        return base_lr;
    int span = total - warmup;
    double progress = span > 0 ? (double)(step - warmup) / span : 1.0;
    if (progress > 1.0)
        progress = 1.0;
    if (kind == SNUG_SCHED_LINEAR)
        return base_lr * (1.0 - progress);
    /* min_ratio: Axolotl's cosine_min_lr_ratio, (1 - r) * cosine + r (r = 0: transformers' cosine) */
    return base_lr * ((1.0 - min_ratio) * 0.5 * (1.0 + cos(M_PI * progress)) + min_ratio);
}

