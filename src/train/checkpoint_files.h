/* checkpoint_files.h: what a checkpoint folder holds, shared by its writing (checkpoint.c) and its reading
 * (checkpoint_load.c): the names of its files, the arenas it keeps byte for byte and which of them are each rank's own
 * file, and the helpers both sides use (the fixed settings, a file's hash, the arena model.safetensors holds). Internal
 * to train/. */
#ifndef SNUG_TRAIN_CHECKPOINT_FILES_H
#define SNUG_TRAIN_CHECKPOINT_FILES_H

#include <jansson.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "train/state.h"

#define STATE_JSON "trainer_state.json"
#define STATE_HASH "trainer_state.hash"
#define STATE_FORMAT 3 /* 2: the fp32 weights' arena may be kept as model.safetensors alone; 3: the adapters of one
                        * site lie A's first (lora.c), so a LoRA state of format 2 does not fit */
#define CKPT_SEED 0x636b7074ull /* "ckpt": the seed of every checkpoint hash */

/* the arenas a checkpoint keeps, byte for byte */
static const struct {
    snug_category c;
    const char *file;
} kept[] = {
    {SNUG_MEM_PARAMS, "state-params.bin"},
    {SNUG_MEM_MASTER, "state-master.bin"},
    {SNUG_MEM_OPTIM, "state-optim.bin"},
    {SNUG_MEM_ADAPTER, "state-adapter.bin"},
};
#define NKEPT ((int)(sizeof kept / sizeof kept[0]))

/* The bytes of kept arena i this run checkpoints (0: none, or not part of the state, such as a frozen base; under
 * ZeRO-3 the parameters' shard, not the gather region). */
static inline size_t kept_bytes(const snug_engine *eng, int i) {
    return snug_plan_kept_bytes(&eng->model, kept[i].c, eng->plan.bytes[kept[i].c]);
}

/* Where those bytes start: the arena, or under ZeRO-3 the parameters' shard as stored (fp32, or the 16-bit copy). */
static inline unsigned char *kept_at(const snug_engine *eng, int i) {
    const snug_model *m = &eng->model;
    if (kept[i].c == SNUG_MEM_PARAMS && m->param_sharded)
        return m->lv.dt == SNUG_DT_F32 ? (unsigned char *)m->params : (unsigned char *)m->params16;
    return eng->blocks[kept[i].c];
}

/* The ranks the model is split over (tensor or pipeline parallelism; 1: none) and this rank's place among them. */
static inline int split_n(const snug_model *m) { return m->tp > 1 ? m->tp : m->pp > 1 ? m->pp : 1; }
static inline int split_rank(const snug_model *m) { return m->tp > 1 ? m->tp_rank : m->pp > 1 ? m->pp_stage : 0; }

/* Whether kept arena i is this rank's shard (ZeRO: the optimizer state, under 16-bit storage the fp32 master copy,
 * and at stage 3 the parameters), which each rank writes and reads as a file of its own; the others are the same on
 * every rank, and rank 0 writes them. Under tensor or pipeline parallelism every kept arena is the rank's own. */
static inline int kept_per_rank(const snug_engine *eng, int i) {
    if (!snug_plan_kept(&eng->model.lv, kept[i].c)) /* a frozen base, sharded or not, is no state */
        return 0;
    if (split_n(&eng->model) > 1) /* tensor (pipeline) parallelism: each rank's slices (layers) and their state */
        return kept_bytes(eng, i) > 0;
    return (kept[i].c == SNUG_MEM_OPTIM && eng->opt.sharded) ||
           (kept[i].c == SNUG_MEM_MASTER && eng->model.master_sharded) ||
           (kept[i].c == SNUG_MEM_PARAMS && eng->model.param_sharded);
}

/* The file of kept arena i: state-optim.bin, or rank r's shard of it, state-optim.rank<r>.bin. */
static inline void kept_name(int i, int per_rank, int r, char *name, size_t n) {
    const char *f = kept[i].file, *dot = strrchr(f, '.');
    if (per_rank)
        snprintf(name, n, "%.*s.rank%d.bin", (int)(dot - f), f, r);
    else
        snprintf(name, n, "%s", f);
}

static inline void kept_file(const snug_engine *eng, int i, int r, char *name, size_t n) {
    kept_name(i, kept_per_rank(eng, i), r, name, n);
}

/* Under tensor or pipeline parallelism, whether the data-parallel groups hold the same state (no ZeRO shards it over
 * them) */
static inline int tp_replicated(const snug_engine *eng) {
    return split_n(&eng->model) > 1 && !eng->opt.sharded && !eng->model.master_sharded && !eng->model.param_sharded;
}

/* The rank whose files of its own this process reads: its data-parallel rank, or under tensor parallelism its rank
 * in the world (data-parallel rank x tensor_parallel_size + tensor-parallel rank, as the trainer groups them), or
 * its tensor-parallel rank where every data-parallel group holds the same state (the first group's files). */
static inline int state_rank(const snug_engine *eng, const snug_setup *s) {
    const snug_model *m = &eng->model;
    if (split_n(m) <= 1)
        return s->rank;
    return tp_replicated(eng) ? split_rank(m) : s->rank * split_n(m) + split_rank(m);
}

/* The settings that change the results, as trainer_state.json's "fixed" holds them (checkpoint.c). */
json_t *snug_ckpt_fixed_json(const snug_run_config *c, const snug_setup *s);
/* The size and hash (CKPT_SEED) of the file at path, reading no further than limit: -1 when it is longer, missing,
 * unreadable or not a plain file. */
int snug_ckpt_hash_file(const char *path, size_t *bytes, uint64_t *hash, size_t limit);
/* The kept arena model.safetensors holds bit for bit (not written again), or -1. */
int snug_ckpt_weights_arena(const snug_engine *eng);

#endif
