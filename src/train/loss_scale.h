/* loss_scale.h: fp16's dynamic loss scaling, the rule of torch.cuda.amp.GradScaler.
 *
 * The loss (in practice: the gradient scale backward starts from) is multiplied by `scale` so that small gradients
 * survive fp16's narrow range. A step whose gradients overflowed (a non-finite global norm) is skipped and the scale
 * halved; after `growth_interval` clean steps in a row the scale doubles. Off (scale 1, never skips) for fp32 and
 * bf16, whose range is fp32's. */
#ifndef SNUG_LOSS_SCALE_H
#define SNUG_LOSS_SCALE_H

#define SNUG_LOSS_SCALE_INIT 65536.0f  /* 2^16 */
#define SNUG_LOSS_SCALE_GROWTH 2000    /* clean steps before the scale doubles */

typedef struct snug_loss_scaler {
    int on;
    float scale;
    int clean;    /* clean steps since the last change */
    int skipped;  /* steps skipped so far */
} snug_loss_scaler;

void snug_loss_scaler_init(snug_loss_scaler *ls, int on);

/* Takes the unscaled global gradient norm of a step; returns 1 when the step is to be taken, 0 when it is skipped
 * (the scale has then been halved). */
int snug_loss_scaler_update(snug_loss_scaler *ls, double norm);

#endif
