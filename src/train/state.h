/* state.h: everything a training run holds between two optimizer steps, and its checkpoints.
 *
 * The run's state is this struct plus three of the engine's arenas, kept byte for byte: the parameters (fp32, or the
 * 16-bit copy forward and backward read), the fp32 master weights, and the optimizer state (fp32 moments, 8-bit
 * codes and absmax, the fp32 state of small tensors; in pinned host memory when paged). Everything else is derived
 * again from the configuration: the learning rate from the step (reduce_lr_on_plateau's from the evaluations so far:
 * its state is a field here), the stochastic-rounding seed from the optimizer's step, the data order from the seed and
 * the number of micro-batches consumed (the loader replays them). A new piece of state is a field here and a row of
 * the table in checkpoint_state.c (its key in trainer_state.json, the format that brought it, when it is written; a
 * checkpoint without the key reads it as before any step), which both the writing and the reading walk: the
 * checkpoint writes and reads the struct whole, and test_state fails for a field without its row.
 *
 * A checkpoint is a folder: the Hugging Face model files (loadable by transformers as they are), state-*.bin (the
 * arenas; the fp32 weights' arena, which model.safetensors holds bit for bit, is not written twice), trainer_state.json
 * (this struct, what must not change on resume, the size and hash of every other file) and trainer_state.hash (the
 * hash of trainer_state.json). It is written as checkpoint-N.partial and renamed to checkpoint-N once every file is
 * durable, so a folder named checkpoint-N is complete. The large files are hashed as they are written and go to the
 * disk with O_DIRECT: a write costs training's cores little more than the hashing and the weights' conversion.
 *
 * Under ZeRO (the optimizer state, and a 16-bit run's master copy, sharded over the ranks) every rank writes its
 * shard as state-optim.rank<R>.bin (state-master.rank<R>.bin) into the same checkpoint-N.partial from its own writer
 * thread, rank 0 the rest; the ranks complete the folder together in the loop's thread (snug_checkpoint_finish: each
 * rank's files' sizes and hashes gathered, trainer_state.json and the rename by rank 0), and each rank reads back its
 * own shard files. At stage 3 the parameters (as stored: fp32, or the 16-bit copy) are each rank's shard too,
 * state-params.rank<R>.bin (the gather region beside them is scratch, not state), and the checkpoint holds no model
 * files: no rank holds the model, resume needs none, and writing one would take a gather per tensor, collectives a
 * writer thread may not make. The run's final folder is the model, streamed from the shards. */
#ifndef SNUG_TRAIN_STATE_H
#define SNUG_TRAIN_STATE_H

#include <stddef.h>

#include "core/error.h"
#include "dist/comm.h"
#include "train/engine.h"
#include "train/loss_scale.h"
#include "train/setup.h"

typedef struct snug_train_state {
    int step;              /* optimizer steps done */
    int epochs_done;
    size_t in_epoch;       /* micro-batches of the current epoch consumed */
    size_t per_epoch;      /* micro-batches of the current epoch */
    int opt_step;          /* the optimizer's own count (bias correction, stochastic rounding) */
    snug_loss_scaler ls;   /* fp16's dynamic loss scale */
    double loss_mean;      /* the progress bar's moving average of the loss */
    int watch_over;        /* steps in a row whose loss was above loss_watchdog_threshold */
    /* early stopping: the lowest validation loss so far (when es_step > 0, the step of it) and the evaluations since
     * without a lower one */
    double es_best;
    int es_step, es_count;
    /* load_best_model_at_end: the lowest validation loss of a checkpointed step (when best_step > 0), that step */
    double best_val;
    int best_step;
    snug_plateau plateau;  /* reduce_lr_on_plateau: the learning rate and its count of evaluations */
} snug_train_state;

/* Writes the Hugging Face folder of the model in eng into dir: model.safetensors and the tokenizer files first,
 * config.json last, so a save that fails part way (a full disk) leaves no folder that looks loadable. The weights
 * are in the base's dtype (its config.json's torch_dtype: fp32 rounded to nearest even to bf16 or fp16, as
 * save_pretrained writes a model loaded in it), or the 16-bit parameters as they are when there is no fp32 copy;
 * a checkpoint's folder keeps fp32, which resume reads back. */
int snug_save_hf_folder(const char *dir, const snug_setup *s, const snug_engine *eng, snug_error *e);
/* The same with F32 weights from a stream (snug_model_save_weights_stream): each tensor fetched by fill just before
 * it is written, e.g. gathered from the ranks' shards of the master copy. */
int snug_save_hf_folder_stream(const char *dir, const snug_setup *s, const snug_engine *eng, snug_weights_fill fill,
                               void *ud, snug_error *e);
/* The folder of a LoRA run whose adapters were gathered from several ranks (pipeline parallelism): whole, a model
 * whose adapter table is the whole model's, and host, that table's values. */
int snug_save_hf_folder_adapter(const char *dir, const snug_setup *s, const snug_engine *eng, const snug_model *whole,
                                const float *host, snug_error *e);

/* Checkpoints are written one at a time. With a snapshot (the engine's spec.ckpt_snapshot, async_checkpoint), the
 * arenas a checkpoint keeps are copied into it and a thread writes the folder from the copy while training goes on;
 * without one, the folder is written from the arenas before snug_checkpoint_start returns. */
typedef struct snug_checkpointer {
    snug_comm *comm;           /* the ranks, set by the caller (NULL: one process, or ranks that no longer agree) */
    struct snug_ckpt_job *job; /* the write in flight, NULL when none */
    double copy_s;             /* the last start: how long training waited for the snapshot (or the whole write) */
    int finished;              /* the last snug_checkpoint_finish ended a write: */
    char dir[4096];            /*   its folder */
    double write_s;            /*   the seconds from its start to its folder being complete */
    double write_cpu_s;        /*   and the CPU seconds the writing took (what it took from training's cores) */
} snug_checkpointer;

/* Starts writing checkpoint dir (".../checkpoint-N") of st and eng whole: see above. A write still in flight is
 * finished first (and its error returned). Once the folder is complete, all but the `keep` newest complete
 * checkpoints beside it are deleted (snug_checkpoint_prune). Under ZeRO every rank calls it at the same step (with
 * w->comm set): it is a collective, as snug_checkpoint_finish then is while the write is in flight. */
int snug_checkpoint_start(snug_checkpointer *w, const char *dir, int keep, const snug_train_state *st,
                          const snug_setup *s, const snug_engine *eng, snug_error *e);

/* Ends the write in flight: waits for it (wait 1), or only collects it if it is done (wait 0). w->finished says
 * whether one ended; its error, if it failed, is returned. The engine and setup must outlive the write. Under ZeRO
 * it is collected only when every rank's part is done (wait 0: one all-reduce of a flag), and the ranks then
 * complete the folder together; with w->comm NULL (ranks that no longer agree) the rank only joins its writer, and
 * the folder stays .partial. */
int snug_checkpoint_finish(snug_checkpointer *w, int wait, snug_error *e);

/* Reads checkpoint dir into st and eng's arenas (eng created from the same configuration; under ZeRO, rank s->rank
 * reads its own shard files, or on another split of the ranks assembles its range from the files that hold it:
 * reshard.h). Refused with a clear error naming the file: an incomplete folder, a file whose size or hash differs
 * from trainer_state.json (truncated, changed), a configuration that differs from the checkpoint's in a setting that
 * changes the results (the setting and both values named), or a split of the ranks that would take other
 * micro-batches per step (ranks x gradient_accumulation_steps) or move ZeRO stage 3 to another stage. */
int snug_checkpoint_load(const char *dir, snug_train_state *st, const snug_setup *s, snug_engine *eng, snug_error *e);

/* Whether every rank writes part of eng's checkpoints: some of the state is each rank's shard (ZeRO's optimizer
 * state, master copy or stage-3 parameters; not a LoRA run's sharded base, which is no state). */
int snug_checkpoint_per_rank(const snug_engine *eng);

/* The loss_vocab_block checkpoint dir was trained with, as a setting (its blocks' rows, or -1 for none), into *v;
 * 1 when its trainer_state.json says, 0 when it cannot be read or does not say (the load checks it fully). A run
 * that leaves loss_vocab_block to its auto value resumes with it, since the auto value follows the ZeRO stage. */
int snug_checkpoint_vocab_block(const char *dir, int *v);
/* The integer setting `key` of the configuration checkpoint dir was trained with (its trainer_state.json's "fixed"),
 * into *v: 1 when it says, 0 when it cannot be read or does not say. auto_find_batch_size resumes with the
 * micro_batch_size found when the run started, as transformers' Trainer does. */
int snug_checkpoint_fixed_int(const char *dir, const char *key, int *v);

/* The newest complete checkpoint-N in output_dir into path; 1 when there is none. */
int snug_checkpoint_latest(const char *output_dir, char *path, size_t n);

/* Copies the model's weight files (the .safetensors that transformers or PEFT load) of the complete checkpoint dir into
 * out_dir, each checked against the size and hash the checkpoint lists (load_best_model_at_end). dt: the dtype the
 * final save writes the model's fp32 weights in (snug_checkpoint_final_dtype); an adapter's files are copied as they
 * are. */
int snug_checkpoint_take_weights(const char *dir, const char *out_dir, snug_dtype dt, snug_error *e);
/* The dtype a final save writes fp32 weights in: the one the base's config.json names (torch_dtype, or dtype in the
 * v5 spelling), F32 when it names none. */
snug_dtype snug_checkpoint_final_dtype(const snug_model_config *c);

/* Deletes all but the `keep` newest complete checkpoints of output_dir (keep 0: none is deleted; -1: all are), and
 * checkpoint-<protect> besides (protect 0: none; load_best_model_at_end's best). */
int snug_checkpoint_prune(const char *output_dir, int keep, int protect, snug_error *e);

/* Whether output_dir holds a run (metrics.jsonl or a checkpoint). */
int snug_output_dir_has_run(const char *output_dir);

#endif
