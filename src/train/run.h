/* run.h: one training run's setup as an object: its ranks and their communicators, the checkpoint it resumes,
 * its resolved configuration (setup.h), its data loader, its engine and the weights loaded into it.
 *
 * snug_run_open does everything a run does before its first step, in this order: the ranks (launch, communicator,
 * the tensor/pipeline and data-parallel groups), the settings several ranks cannot take, the checkpoint to resume
 * from (and the settings it fixes), the resolved configuration, the data, the engine, the weights (a checkpoint's,
 * the base model's or a random init, and the adapters), and the ranks' agreement that each got this far. The loop
 * (loop.c) runs over it; snug_run_close releases it whatever state it reached. */
#ifndef SNUG_TRAIN_RUN_H
#define SNUG_TRAIN_RUN_H

#include <stdio.h>

#include "core/error.h"
#include "data/batching.h"
#include "dist/comm.h"
#include "train/engine.h"
#include "train/setup.h"
#include "train/state.h"

typedef struct snug_run {
    snug_setup s;              /* the resolved configuration, its model, plan and data */
    snug_batching_report brep; /* padding and efficiency of each way of batching the training set */
    snug_engine eng;
    /* the ranks: every rank runs the whole run on the same data; rank 0 (lead) alone prints and writes files.
     * Tensor parallelism: groups of tpn consecutive ranks (tp, ranked by rank % tpn) split every block and run the
     * same micro-batches; the data-parallel groups (dp) are the ranks of one place in every group (ranked by
     * rank / tpn), or this rank alone (self) when there is one group. So the world's rank is dp rank x tpn + tp
     * rank. Pipeline parallelism groups its stages the same way (ppn consecutive ranks, the stage its rank in tp). */
    snug_launch launch;
    snug_comm comm;            /* the world */
    snug_comm self, tpc, dpc;  /* this rank alone; the split groups (when there are several groups) */
    snug_comm endc;            /* pipeline parallelism with a tied head: the first and last stages */
    snug_comm *dp, *tp;        /* the data-parallel ranks; the tensor-parallel ranks (or the pipeline's stages) */
    int tpn, ppn, gn;          /* tensor_parallel_size, pipeline_parallel_size (1 without), the group's size */
    int on_gpu, lead;
    int use_nccl;              /* the ranks talk through NCCL (CUDA ranks) */
    int broken;                /* a collective failed: the ranks no longer agree, so MPI is left for mpirun to end */
    FILE *out, *quiet;         /* where the run reports (/dev/null on the ranks but rank 0: quiet) */
    char resume[4096];         /* the checkpoint resumed from ("" when the run starts afresh) */
    snug_train_state saved;    /* its state */
    snug_loader loader;        /* the training set's micro-batches */
    double t_load;             /* when the weights began to load (the resume's time) */
} snug_run;

/* Sets up a run of the configuration (validated: snug_run_config_validate_train) reporting to `out` (r->out: out
 * on rank 0, /dev/null on the others). On failure everything is released (the ranks agree on it first) and r must
 * not be closed. */
int snug_run_open(snug_run *r, const snug_run_config *config, FILE *out, snug_error *e);

/* Releases a run that opened, whatever state it reached: its engine, setup and loader; the ranks then agree on rc
 * (unless a collective failed) and the communicators close. Returns the run's result: rc, or another rank's failure. */
int snug_run_close(snug_run *r, int rc, snug_error *e);

/* The batching the options ask for (src/data/batching.h); shuffle 0 keeps the dataset's order. */
snug_batching_opts snug_run_batching(const snug_run *r, int shuffle);

#endif
