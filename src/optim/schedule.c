/* schedule.c: learning-rate schedules with warmup, the factors of transformers' schedulers (optimization.py,
 * get_scheduler) computed in the same double-precision order, then times the base learning rate as LambdaLR does. */
#include <math.h>
#include <string.h>

#include "optim/optim.h"

void snug_sched_params_default(snug_sched_params *p) {
    memset(p, 0, sizeof *p);
    p->num_cycles = -1.0; /* each schedule's own default: 0.5 (cosine, WSD), 1 (cosine_with_restarts) */
    p->power = 1.0;
    p->lr_end = 1e-7;
    p->wsd_decay = -1;
    p->wsd_stable = -1;
    p->wsd_warmup = SNUG_WSD_LINEAR;
    p->wsd_decay_type = SNUG_WSD_COSINE;
    p->warmup_lr_rate = -1.0;
    p->plat_factor = 0.1;
    p->plat_patience = 10;
    p->plat_threshold = 1e-4;
    p->plat_eps = 1e-8;
}

void snug_plateau_init(snug_plateau *s, double base_lr, const snug_sched_params *p) {
    memset(s, 0, sizeof *s);
    s->lr = base_lr;
    s->best = p->plat_max ? -INFINITY : INFINITY;
}

/* ReduceLROnPlateau.is_better, in its order of operations */
static int plateau_better(const snug_sched_params *p, double a, double best) {
    if (!p->plat_max)
        return p->plat_abs ? a < best - p->plat_threshold : a < best * (1.0 - p->plat_threshold);
    return p->plat_abs ? a > best + p->plat_threshold : a > best * (p->plat_threshold + 1.0);
}

void snug_plateau_step(snug_plateau *s, double metric, const snug_sched_params *p) {
    if (plateau_better(p, metric, s->best)) {
        s->best = metric;
        s->bad = 0;
    } else {
        s->bad++;
    }
    if (s->cooldown > 0) { /* bad evaluations in cooldown do not count */
        s->cooldown--;
        s->bad = 0;
    }
    if (s->bad > p->plat_patience) {
        double lr = s->lr * p->plat_factor;
        lr = lr > p->plat_min_lr ? lr : p->plat_min_lr; /* max(old * factor, min_lr) */
        if (s->lr - lr > p->plat_eps)
            s->lr = lr;
        s->cooldown = p->plat_cooldown;
        s->bad = 0;
    }
}

static double imax1(int x) { return (double)(x > 1 ? x : 1); }

/* WSD's warmup or decay shape at progress x in [0, 1): rising (warmup) or falling (decay), as transformers'
 * _get_wsd_scheduler_lambda */
static double wsd_shape(snug_wsd_shape s, double x, int rising, double num_cycles) {
    if (rising)
        return s == SNUG_WSD_COSINE ? 0.5 * (1.0 - cos(M_PI * x)) : s == SNUG_WSD_1SQRT ? 1.0 - sqrt(1.0 - x) : x;
    return s == SNUG_WSD_COSINE ? 0.5 * (1.0 + cos(M_PI * num_cycles * 2.0 * x))
           : s == SNUG_WSD_1SQRT ? 1.0 - sqrt(x) : 1.0 - x;
}

/* Axolotl's RexLR (max_lr = base_lr, min_lr = base_lr x min_ratio) at last_step = step: before the first warmup step
 * and at the end the floor, and a negative step_after taken modulo the rest as Python takes it (a warmup of 2 or more
 * gives step 0 the factor of step (total - warmup) - warmup, as Axolotl does). */
static double rex_lr(double base_lr, int step, int warmup, int total, double min_ratio) {
    double min_lr = base_lr * min_ratio;
    if (step >= 1 && step <= warmup)
        return base_lr * (double)step / (double)warmup;
    long after = (long)step - warmup, rest = (long)total - warmup;
    if (after >= rest || after == -1 || rest <= 0)
        return min_lr;
    long mod = ((after % rest) + rest) % rest; /* Python's %: the sign of the divisor */
    double z = (double)(rest - mod) / (double)rest, r = min_lr / base_lr;
    return base_lr * (r + (1.0 - r) * (z / (0.1 + 0.9 * z)));
}

double snug_lr_at(snug_sched kind, double base_lr, int step, int warmup, int total, double min_ratio,
                  const snug_sched_params *p) {
    snug_sched_params d;
    if (!p) {
        snug_sched_params_default(&d);
        p = &d;
    }
    double nc = p->num_cycles >= 0 ? p->num_cycles : kind == SNUG_SCHED_COSINE_RESTARTS ? 1.0 : 0.5;
    if (kind == SNUG_SCHED_CONSTANT || kind == SNUG_SCHED_PLATEAU) /* no warmup; a plateau's lr is snug_plateau's */
        return base_lr;
    if (kind == SNUG_SCHED_WSD) {
        int stable = p->wsd_stable >= 0 ? p->wsd_stable : total - warmup - p->wsd_decay;
        double f, mr = p->wsd_min_ratio;
        if (step < warmup)
            f = wsd_shape(p->wsd_warmup, (double)step / imax1(warmup), 1, nc) * (1.0 - mr) + mr;
        else if (step < warmup + stable)
            return base_lr;
        else if (step < warmup + stable + p->wsd_decay)
            f = wsd_shape(p->wsd_decay_type, (double)(step - warmup - stable) / imax1(p->wsd_decay), 0, nc) *
                    (1.0 - mr) + mr;
        else
            return base_lr * mr;
        return base_lr * (f > 0.0 ? f : 0.0);
    }
    if (kind == SNUG_SCHED_COSINE_WARMUP_MIN) { /* _get_cosine_with_min_lr_schedule_with_warmup_lr_rate_lambda */
        double r = p->warmup_lr_rate, f;
        if (step < warmup)
            f = r < 0 ? ((double)step + 1.0) / imax1(warmup) : r + (1.0 - r) * (double)step / imax1(warmup - 1);
        else
            f = 0.5 * (1.0 + cos(M_PI * nc * 2.0 * (((double)step - (double)warmup + 1.0) / imax1(total - warmup)))) *
                    (1.0 - min_ratio) + min_ratio;
        return base_lr * (f > 0.0 ? f : 0.0);
    }
    if (kind == SNUG_SCHED_REX) /* Axolotl's RexLR.get_lr at last_step = step */
        return rex_lr(base_lr, step, warmup, total, min_ratio);
    if (kind == SNUG_SCHED_COSINE && p->quadratic_warmup) { /* Axolotl's quadratic warmup (it takes no floor) */
        if (step < warmup) /* (x ** 2 in Python: the same pow) */
            return base_lr * pow((double)step / imax1(warmup), 2.0);
        double f = 0.5 * (1.0 + cos(M_PI * nc * 2.0 * ((double)(step - warmup) / imax1(total - warmup))));
        return base_lr * (f > 0.0 ? f : 0.0);
    }
    if (kind == SNUG_SCHED_COSINE && p->constant_ratio > 0 && min_ratio > 0 && step >= warmup) {
        int ncs = (int)((double)total * p->constant_ratio); /* Python's int(): toward zero */
        int s = step < ncs ? step : ncs;
        double progress = (double)(s - warmup) / imax1(ncs - warmup);
        double f = (1.0 - min_ratio) * 0.5 * (1.0 + cos(M_PI * nc * 2.0 * progress));
        return base_lr * ((f > 0.0 ? f : 0.0) + min_ratio);
    }
    if (step < warmup)
        return base_lr * ((double)step / imax1(warmup));
    double f = 1.0, progress = (double)(step - warmup) / imax1(total - warmup);
    switch (kind) {
    case SNUG_SCHED_LINEAR: f = (double)(total - step) / imax1(total - warmup); break;
    case SNUG_SCHED_COSINE: /* min_ratio: Axolotl's cosine_min_lr_ratio, Hugging Face's min_lr_rate (0: to 0) */
        f = 0.5 * (1.0 + cos(M_PI * nc * 2.0 * progress)) * (1.0 - min_ratio) + min_ratio;
        break;
    case SNUG_SCHED_COSINE_RESTARTS:
        f = progress >= 1.0 ? 0.0 : 0.5 * (1.0 + cos(M_PI * fmod(nc * progress, 1.0)));
        break;
    case SNUG_SCHED_POLYNOMIAL:
        if (step > total)
            f = p->lr_end / base_lr;
        else
            f = ((base_lr - p->lr_end) * pow(1.0 - (double)(step - warmup) / imax1(total - warmup), p->power) +
                 p->lr_end) / base_lr;
        break;
    case SNUG_SCHED_INVERSE_SQRT: {
        int ts = p->timescale > 0 ? p->timescale : warmup > 0 ? warmup : 10000;
        f = 1.0 / sqrt((double)(step + (ts - warmup)) / (double)ts);
        break;
    }
    default: break; /* constant_with_warmup */
    }
    return base_lr * (f > 0.0 ? f : 0.0);
}
