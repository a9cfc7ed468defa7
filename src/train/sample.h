/* sample.h: the end-of-run sample: a few tokens generated from the trained weights (sample_tokens). */
#ifndef SNUG_TRAIN_SAMPLE_H
#define SNUG_TRAIN_SAMPLE_H

#include <stdio.h>

#include "train/run.h"

/* Prints a sample of sample_tokens tokens after sample_prompt, or why there is none. Training must be over: the
 * gradients and the optimizer state are released first. */
void snug_run_sample(snug_run *r, FILE *out);

#endif
