/* run.h: everything one training run holds, from its resolved configuration to its engine. */
#ifndef SNUG_TRAIN_RUN_H
#define SNUG_TRAIN_RUN_H

#include "data/batching.h"
#include "train/engine.h"
#include "train/setup.h"

/* Everything a run holds; released by run_free whatever state it reached. */
typedef struct snug_run {
    snug_setup s;              /* the resolved configuration, its model, plan and data */
    snug_batching_report brep; /* padding and efficiency of each way of batching the training set */
    snug_engine eng;
} snug_run;

#endif
