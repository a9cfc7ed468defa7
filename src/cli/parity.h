/* parity.h: `snug parity`, the harness the PyTorch parity tests drive. */
#ifndef SNUG_PARITY_H
#define SNUG_PARITY_H

#include "core/error.h"

/* snug parity MODEL_DIR IN.safetensors OUT.safetensors [--steps K --lr X --weight_decay X --max_grad_norm X
 *                                                      --adam_epsilon X  *                                                      --save DIR --threads N]
 * IN holds input_ids and labels (B, T; I32 or I64; labels aligned with the inputs: labels[t] is the token position t
 * predicts, negative = unsupervised). OUT receives logits (B, T, V), loss (mean over supervised tokens) and
 * grad.<name> for every parameter in the file layout. With --steps K, K AdamW steps (clipping, weight decay,
 * constant lr) on the same batch follow, and OUT also holds param.<name> after them and loss_history (K). --save
 * writes the model (after the steps) as a Hugging Face folder. */
int snug_parity_cmd(int argc, char **argv, snug_error *e);

#endif
