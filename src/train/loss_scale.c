/* loss_scale.c: fp16's dynamic loss scaling (see loss_scale.h). */
#include "train/loss_scale.h"

#include <math.h>

void snug_loss_scaler_init(snug_loss_scaler *ls, int on) {
    ls->on = on;
    ls->scale = on ? SNUG_LOSS_SCALE_INIT : 1.0f;
    ls->clean = ls->skipped = 0;
}

int snug_loss_scaler_update(snug_loss_scaler *ls, double norm) {
    if (!ls->on)
        return 1;
    if (!isfinite(norm)) {
        ls->skipped++;
        ls->clean = 0;
        ls->scale = ls->scale > 1.0f ? ls->scale / 2 : 1.0f; /* GradScaler has no floor; below 1 helps nothing */
        return 0;
    }
    if (++ls->clean >= SNUG_LOSS_SCALE_GROWTH) {
        ls->scale *= 2;
        ls->clean = 0;
    }
    return 1;
}
