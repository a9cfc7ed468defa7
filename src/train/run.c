/* run.c: one training run's setup and teardown (see run.h). */
#include "train/run.h"

#include <stdlib.h>
#include <string.h>

#include "backend/backend_select.h"
#include "model/model.h"
#include "train/parallel.h"
#include "train/report.h"

static void run_free(snug_run *r) {
    snug_engine_free(&r->eng);
    snug_setup_free(&r->s);
}

/* Several ranks (data or tensor parallel): the settings they cannot take yet, refused before anything is read or
 * written. */
static int ddp_refuse(const snug_run_config *o, const snug_comm *c, int on_gpu, snug_error *e) {
    if (o->ddp_backend == SNUG_DDP_BACKEND_NCCL && !on_gpu)
        return snug_fail(e, SNUG_EINPUT, "ddp_backend is nccl but this run trains on the CPU (device: %s): NCCL moves "
                         "GPU buffers; use ddp_backend: mpi (or leave it unset) for CPU ranks, or device: cuda on a "
                         "machine with a GPU", o->device == SNUG_BACKEND_AUTO ? "auto, and no GPU is visible" : "cpu");
    if (c->size == 1)
        return 0;
    const char *why = !o->ddp && o->tensor_parallel_size <= 1 && o->pipeline_parallel_size <= 1
                          ? "ddp is false and tensor_parallel_size and pipeline_parallel_size are 1, and snug runs as "
                            "several ranks only as data, tensor or pipeline parallelism"
                      : on_gpu && o->ddp_backend == SNUG_DDP_BACKEND_MPI
                          ? "ddp_backend is mpi on CUDA ranks, which would stage every gradient through host memory "
                            "(not built); use ddp_backend: nccl (the default on GPUs)"
                      : NULL;
    if (!why)
        return 0;
    return snug_fail(e, SNUG_EINPUT, "%d ranks: %s; run one process, or change the setting", c->size, why);
}

/* Tensor parallelism: the world is groups of tensor_parallel_size ranks (data parallel across the groups, on CPU
 * ranks for now). */
static int tp_refuse(const snug_run_config *o, const snug_comm *c, int on_gpu, snug_error *e) {
    int t = o->tensor_parallel_size;
    if (c->size % t)
        return snug_fail(e, SNUG_EINPUT, "tensor_parallel_size is %d but %d rank%s: launch a multiple of it (mpirun "
                         "-np %d snug train ... for tensor parallelism alone, -np %d for 2 data-parallel groups of %d)",
                         t, c->size, c->size == 1 ? " runs" : "s run", t, 2 * t, t);
    if (!o->ddp && c->size > t)
        return snug_fail(e, SNUG_EINPUT, "%d ranks with tensor_parallel_size %d form %d data-parallel groups, but ddp "
                         "is false; launch %d ranks, or set ddp: true", c->size, t, c->size / t, t);
    if (on_gpu && c->size > t)
        return snug_fail(e, SNUG_EINPUT, "%d GPU ranks with tensor_parallel_size %d: data parallelism beside tensor "
                         "parallelism runs on CPU ranks only for now; launch %d GPU ranks, or set "
                         "tensor_parallel_size: 1", c->size, t, t);
    return 0;
}

/* Pipeline parallelism: the world is groups of pipeline_parallel_size ranks (data parallel across the groups), on
 * CPU ranks (the NCCL communicator has no point-to-point messages yet). */
static int pp_refuse(const snug_run_config *o, const snug_comm *c, int on_gpu, snug_error *e) {
    int p = o->pipeline_parallel_size;
    if (c->size % p)
        return snug_fail(e, SNUG_EINPUT, "pipeline_parallel_size is %d but %d rank%s: launch a multiple of it (mpirun "
                         "-np %d snug train ... for one pipeline, -np %d for 2 data-parallel groups of %d)", p, c->size,
                         c->size == 1 ? " runs" : "s run", p, 2 * p, p);
    if (!o->ddp && c->size > p)
        return snug_fail(e, SNUG_EINPUT, "%d ranks with pipeline_parallel_size %d form %d data-parallel groups, but "
                         "ddp is false; launch %d ranks, or set ddp: true", c->size, p, c->size / p, p);
    if (on_gpu)
        return snug_fail(e, SNUG_EINPUT, "pipeline_parallel_size %d on GPU ranks: pipeline parallelism runs on CPU "
                         "ranks only for now (the stages' messages are not built on NCCL); set device: cpu, or "
                         "pipeline_parallel_size: 1 (zero_stage: 3 shards a model too large for one GPU)", p);
    return 0;
}

/* The batching the options ask for (src/data/batching.h); shuffle 0 keeps the dataset's order. */
snug_batching_opts snug_run_batching(const snug_run *r, int shuffle) {
    const snug_run_config *o = &r->s.c;
    snug_batching how = o->concatenate ? SNUG_BATCHING_CONCAT : o->sample_packing ? SNUG_BATCHING_PACK
                        : o->group_by_length ? SNUG_BATCHING_GROUP : SNUG_BATCHING_PAD;
    return (snug_batching_opts){.how = how, .B = o->micro_batch_size, .T = o->sequence_len,
                                .pad_to_sequence_len = o->pad_to_sequence_len,
                                .pad_to_multiple_of = o->pad_to_multiple_of, .shuffle = shuffle,
                                .seed = snug_data_seed(o), .pad_id = r->s.pad_id};
}

/* The end of a run on this rank: a failure names the rank, and the communicators close (MPI_Finalize) only when
 * every rank reaches it. */
static void run_end(snug_run *r, int rc, snug_error *e) {
    if (rc && r->comm.size > 1 && e)
        snug_error_wrap(e, "rank %d of %d: ", r->comm.rank, r->comm.size);
    if (!r->broken) { /* MPI_Finalize only when every rank reaches it */
        snug_comm_close(&r->endc);
        snug_comm_close(&r->tpc);
        snug_comm_close(&r->dpc);
        snug_comm_close(&r->comm);
    }
    if (r->quiet)
        fclose(r->quiet);
}

/* The ranks' groups: tensor parallelism's (or the pipeline's) and the data-parallel ones, after the settings several
 * ranks cannot take are refused; the setup learns this rank's place. */
static int open_groups(snug_run *r, const snug_run_config *config, snug_error *e) {
    /* tensor parallelism: groups of tpn consecutive ranks (tp, ranked by rank % tpn) split every block and run the
     * same micro-batches; the data-parallel groups (dp) are the ranks of one place in every group (ranked by
     * rank / tpn), or this rank alone when there is one group. So the world's rank is dp rank x tpn + tp rank. */
    /* Pipeline parallelism groups its stages the same way (ppn consecutive ranks, the stage its rank in tp, the
     * pipeline's communicator; the configuration refuses both splits at once). */
    r->tpn = config->tensor_parallel_size > 1 ? config->tensor_parallel_size : 1;
    r->ppn = config->pipeline_parallel_size > 1 ? config->pipeline_parallel_size : 1;
    r->gn = r->tpn > 1 ? r->tpn : r->ppn;
    r->dp = &r->comm;
    r->tp = &r->comm;
    snug_comm_self_init(&r->self);
    int rc = r->tpn > 1   ? tp_refuse(config, &r->comm, r->on_gpu, e)
             : r->ppn > 1 ? pp_refuse(config, &r->comm, r->on_gpu, e)
                          : 0;
    if (!rc) /* the backend's choice holds for tensor parallelism's sums too */
        rc = ddp_refuse(config, &r->comm, r->on_gpu, e);
    if (!rc && r->gn > 1 && r->comm.size == r->gn) {
        r->dp = &r->self;
    } else if (!rc && r->gn > 1) {
        rc = r->comm.split(&r->comm, r->comm.rank / r->gn, r->comm.rank % r->gn, &r->tpc, e);
        if (!rc)
            rc = r->comm.split(&r->comm, r->comm.rank % r->gn, r->comm.rank / r->gn, &r->dpc, e);
        r->tp = &r->tpc;
        r->dp = &r->dpc;
    }
    /* CUDA ranks talk through NCCL (ddp_backend: nccl, or unset with several ranks), each on its local rank's GPU */
    r->use_nccl = r->on_gpu && (config->ddp_backend == SNUG_DDP_BACKEND_NCCL ||
                                (config->ddp_backend == SNUG_DDP_BACKEND_AUTO && r->comm.size > 1));
    if (r->on_gpu)
        snug_backend_use_gpu(r->comm.local_rank);
    r->s.ranks = r->dp->size; /* ranks that sum gradients keep them fp32, as accumulation does */
    r->s.rank = r->dp->rank;  /* and under ZeRO each plans its own shard */
    r->s.tp_rank = r->tpn > 1 ? r->tp->rank : 0;
    r->s.pp_stage = r->ppn > 1 ? r->tp->rank : 0;
    r->s.agree = r->comm.size > 1 ? &r->comm : NULL; /* (auto_find_batch_size: the size every rank fits) */
    return rc;
}

/* The checkpoint to resume from, the settings it fixes, and the configuration resolved (setup.h). */
static int open_resolve(snug_run *r, const snug_run_config *config, snug_error *e) {
    int rc = 0;
    /* the checkpoint to resume from; one that leaves loss_vocab_block to its auto value (which follows the ZeRO
     * stage) takes the checkpoint's, so that it continues the same loss on another stage */
    if (!rc && config->resume_latest) {
        if (snug_checkpoint_latest(config->output_dir, r->resume, sizeof r->resume))
            rc = snug_fail(e, SNUG_EINPUT, "%s: resume_from_checkpoint is latest but the folder holds no complete "
                           "checkpoint; start the run without it", config->output_dir);
    } else if (!rc && config->resume_from_checkpoint[0]) {
        snprintf(r->resume, sizeof r->resume, "%s", config->resume_from_checkpoint);
    } else if (!rc && config->auto_resume && snug_checkpoint_latest(config->output_dir, r->resume, sizeof r->resume)) {
        r->resume[0] = '\0'; /* auto_resume_from_checkpoints: the newest complete checkpoint when there is one */
    }
    /* and auto_find_batch_size takes the micro_batch_size the run found when it started, as transformers' does */
    snug_run_config *adopted = NULL;
    int vb, fb = 0;
    int take_vb = !rc && r->resume[0] && config->loss_vocab_block == 0 && snug_checkpoint_vocab_block(r->resume, &vb);
    int take_mb = !rc && r->resume[0] && config->auto_find_batch_size &&
                  snug_checkpoint_fixed_int(r->resume, "micro_batch_size", &fb) && fb >= 1;
    if (take_mb && fb > config->micro_batch_size)
        rc = snug_fail(e, SNUG_EINPUT, "%s trained with micro_batch_size %d (auto_find_batch_size's), above "
                       "micro_batch_size %d now, the most it may take; resume with micro_batch_size %d or more",
                       r->resume, fb, config->micro_batch_size, fb);
    if (!rc && (take_vb || take_mb) && (adopted = malloc(sizeof *adopted))) {
        *adopted = *config;
        if (take_vb)
            adopted->loss_vocab_block = vb;
        if (take_mb) /* found already: no search */
            adopted->micro_batch_size = fb, adopted->auto_find_batch_size = 0;
    }
    if (!rc)
        rc = snug_setup_resolve(&r->s, adopted ? adopted : config, r->on_gpu ? SNUG_DEVICE_CUDA : SNUG_DEVICE_CPU, e);
    if (!rc && adopted && take_mb)
        snprintf(r->s.fit_note, sizeof r->s.fit_note, "auto_find_batch_size: micro_batch_size %d, the checkpoint's "
                 "(found when the run started)", fb);
    free(adopted);
    return rc;
}

/* The data and its loader, the checks before anything is written, the engine and the weights. */
static int open_load(snug_run *r, snug_error *e) {
    const snug_run_config *o = &r->s.c; /* as it runs: after auto_fit */
    int rc = snug_setup_load_data(&r->s, e);
    if (!rc && o->debug && r->lead) /* Axolotl's debug: the first examples as the model will see them */
        snug_setup_print_examples(r->out, &r->s, 3);
    snug_batching_opts bopts = snug_run_batching(r, 1);
    if (!rc)
        rc = snug_loader_init(&r->loader, &r->s.train, &bopts, e);
    if (!rc)
        rc = snug_batching_report_compute(&r->brep, &r->s.train, &bopts, e);
    if (!rc && o->base_model[0]) { /* the weights must match config.json before memory is sized by it */
        snug_param_table t;
        rc = snug_param_table_build(&t, &r->s.cfg, e);
        if (!rc) {
            rc = snug_model_check_weights(&t, o->base_model, e);
            snug_param_table_free(&t);
        }
    }
    /* a folder that holds a run is continued (resume, above) or overwritten, never mixed into */
    if (!rc && !r->resume[0] && r->lead && snug_output_dir_has_run(o->output_dir)) {
        if (o->overwrite_output_dir)
            rc = snug_checkpoint_prune(o->output_dir, -1, 0, e);
        else
            rc = snug_fail(e, SNUG_EINPUT, "%s already holds a run (metrics.jsonl or checkpoints); continue it with "
                           "resume_from_checkpoint: latest, replace it with overwrite_output_dir: true, or choose "
                           "another output_dir", o->output_dir);
    }
    if (!rc)
        rc = snug_engine_create_planned(&r->eng, &r->s.spec, &r->s.plan, o->device, o->threads, e);
    r->t_load = snug_now_s();
    /* the weights: a checkpoint's, or the base model's (or a random init); under LoRA the frozen base always comes
     * from base_model (or the same seed), and the adapters from the checkpoint or PEFT's initialisation */
    int lora = r->eng.model.lora.on;
    if (!rc && (!r->resume[0] || lora)) {
        if (o->base_model[0])
            rc = snug_model_load_weights(&r->eng.model, o->base_model, e);
        else if (snug_model_init_random(&r->eng.model, (uint64_t)o->seed))
            rc = snug_fail(e, SNUG_ENOMEM, "out of host memory initialising the weights");
    }
    if (!rc && lora && !r->resume[0])
        rc = snug_setup_load_adapter(&r->s, &r->eng.model, e);
    else if (!rc && lora) /* (PiSSA, OLoRA: the base the adapters were trained on) */
        rc = snug_setup_adapter_base(&r->s, &r->eng.model, e);
    if (!rc && r->resume[0])
        rc = snug_checkpoint_load(r->resume, &r->saved, &r->s, &r->eng, e);
    return rc;
}

int snug_run_open(snug_run *r, const snug_run_config *config, FILE *out, snug_error *e) {
    memset(r, 0, sizeof *r);
    r->out = out;
    r->on_gpu = snug_backend_resolve(config->device) == SNUG_BACKEND_CUDA;
    /* the ranks: every rank runs this whole function on the same data; rank 0 alone prints and writes files */
    SNUG_TRY(snug_launch_detect(&r->launch, e));
    SNUG_TRY(snug_comm_open(&r->comm, &r->launch, e));
    r->comm.deterministic = config->ddp_deterministic;
    r->comm.check = config->dist_debug;
    r->comm.timeout_s = config->dist_timeout;
    r->lead = r->comm.rank == 0;
    r->quiet = r->lead ? NULL : fopen("/dev/null", "w");
    if (!r->lead)
        r->out = r->quiet ? r->quiet : r->out;
    int rc = open_groups(r, config, e);
    if (!rc)
        rc = open_resolve(r, config, e);
    if (!rc)
        rc = open_load(r, e);
    rc = snug_ddp_agree(&r->comm, rc, &r->broken, e);
    if (!rc && r->use_nccl) /* every rank or none: it agrees through the host communicator itself */
        rc = snug_comm_nccl_wrap(&r->comm, r->eng.be, e);
    if (rc) { /* the others learnt it in the agreement */
        snug_loader_free(&r->loader);
        run_free(r);
        run_end(r, rc, e);
    }
    return rc;
}

int snug_run_close(snug_run *r, int rc, snug_error *e) {
    snug_loader_free(&r->loader);
    run_free(r);
    if (!r->broken)
        rc = snug_ddp_agree(&r->comm, rc, &r->broken, e);
    run_end(r, rc, e);
    return rc;
}
