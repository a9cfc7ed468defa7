/* checkpoint.c: saving and loading the whole training state (see state.h). */
#include "train/state.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <limits.h>
#include <pthread.h>
#include <stdatomic.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "core/fileio.h"
#include "core/json_util.h"
#include "core/hash.h"
#include "dist/comm.h"
#include "model/model.h"
#include "model/peft_io.h"
#include "snug.h"
#include "train/reshard.h"
#include "train/state_io.h"

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
static size_t kept_bytes(const snug_engine *eng, int i) {
    return snug_plan_kept_bytes(&eng->model, kept[i].c, eng->plan.bytes[kept[i].c]);
}

/* Where those bytes start: the arena, or under ZeRO-3 the parameters' shard as stored (fp32, or the 16-bit copy). */
static unsigned char *kept_at(const snug_engine *eng, int i) {
    const snug_model *m = &eng->model;
    if (kept[i].c == SNUG_MEM_PARAMS && m->param_sharded)
        return m->lv.dt == SNUG_DT_F32 ? (unsigned char *)m->params : (unsigned char *)m->params16;
    return eng->blocks[kept[i].c];
}

/* The ranks the model is split over (tensor or pipeline parallelism; 1: none) and this rank's place among them. */
static int split_n(const snug_model *m) { return m->tp > 1 ? m->tp : m->pp > 1 ? m->pp : 1; }
static int split_rank(const snug_model *m) { return m->tp > 1 ? m->tp_rank : m->pp > 1 ? m->pp_stage : 0; }

/* Whether kept arena i is this rank's shard (ZeRO: the optimizer state, under 16-bit storage the fp32 master copy,
 * and at stage 3 the parameters), which each rank writes and reads as a file of its own; the others are the same on
 * every rank, and rank 0 writes them. Under tensor or pipeline parallelism every kept arena is the rank's own. */
static int kept_per_rank(const snug_engine *eng, int i) {
    if (!snug_plan_kept(&eng->model.lv, kept[i].c)) /* a frozen base, sharded or not, is no state */
        return 0;
    if (split_n(&eng->model) > 1) /* tensor (pipeline) parallelism: each rank's slices (layers) and their state */
        return kept_bytes(eng, i) > 0;
    return (kept[i].c == SNUG_MEM_OPTIM && eng->opt.sharded) ||
           (kept[i].c == SNUG_MEM_MASTER && eng->model.master_sharded) ||
           (kept[i].c == SNUG_MEM_PARAMS && eng->model.param_sharded);
}

int snug_checkpoint_per_rank(const snug_engine *eng) {
    int any = 0;
    for (int i = 0; i < NKEPT; i++)
        any |= kept_per_rank(eng, i);
    return any;
}

/* The file of kept arena i: state-optim.bin, or rank r's shard of it, state-optim.rank<r>.bin. */
static void kept_name(int i, int per_rank, int r, char *name, size_t n) {
    const char *f = kept[i].file, *dot = strrchr(f, '.');
    if (per_rank)
        snprintf(name, n, "%.*s.rank%d.bin", (int)(dot - f), f, r);
    else
        snprintf(name, n, "%s", f);
}

static void kept_file(const snug_engine *eng, int i, int r, char *name, size_t n) {
    kept_name(i, kept_per_rank(eng, i), r, name, n);
}

/* Whether a file name is a rank's shard file (or its temporary file while it is written). */
static int is_rank_file(const char *name) {
    const char *q = strstr(name, ".rank");
    return !strncmp(name, "state-", 6) && q && q[5] >= '0' && q[5] <= '9';
}

/* Under tensor or pipeline parallelism, whether the data-parallel groups hold the same state (no ZeRO shards it over
 * them) */
static int tp_replicated(const snug_engine *eng) {
    return split_n(&eng->model) > 1 && !eng->opt.sharded && !eng->model.master_sharded && !eng->model.param_sharded;
}

/* The rank whose files of its own this process reads: its data-parallel rank, or under tensor parallelism its rank
 * in the world (data-parallel rank x tensor_parallel_size + tensor-parallel rank, as the trainer groups them), or
 * its tensor-parallel rank where every data-parallel group holds the same state (the first group's files). */
static int state_rank(const snug_engine *eng, const snug_setup *s) {
    const snug_model *m = &eng->model;
    if (split_n(m) <= 1)
        return s->rank;
    return tp_replicated(eng) ? split_rank(m) : s->rank * split_n(m) + split_rank(m);
}

/* The rank the files this rank writes are named after (world: its rank in the checkpoint's communicator), or -1
 * where another rank writes the same bytes: a data-parallel group after the first one whose state is the first's. */
static int file_rank(const snug_engine *eng, const snug_setup *s, int world) {
    if (!tp_replicated(eng))
        return world;
    return s->rank == 0 ? split_rank(&eng->model) : -1;
}

/* ---- what must not change on resume: the settings that change the results ---- */

typedef enum { F_INT, F_DBL, F_STR } field_kind;
static const struct {
    const char *name;
    field_kind kind;
    size_t off;
} fixed[] = {
#define I(f) {#f, F_INT, offsetof(snug_run_config, f)}
#define D(f) {#f, F_DBL, offsetof(snug_run_config, f)}
#define S(f) {#f, F_STR, offsetof(snug_run_config, f)}
    S(base_model), S(model_preset), I(sequence_len), D(val_set_size), I(train_on_inputs), I(skip_bad_examples),
    I(dataset_exact_deduplication),
    I(long_examples), I(micro_batch_size), I(sample_packing), I(group_by_length), I(pad_to_sequence_len),
    I(pad_to_multiple_of), I(concatenate), I(gradient_accumulation_steps), I(lr_scheduler), I(warmup_steps),
    D(warmup_ratio), D(weight_decay), D(adam_beta1), D(adam_beta2), D(adam_epsilon), D(max_grad_norm),
    I(optimizer_in_backward), I(tensor_parallel_size), I(pipeline_parallel_size), S(pipeline_layers), I(bf16),
    I(fp16), I(master_weights), I(optimizer), I(seed), I(data_seed),
    I(flash_attention), I(chunked_cross_entropy), I(cross_entropy_chunk_tokens), I(tiled_mlp),
    I(tiled_mlp_num_shards), I(adapter), I(lora_r),
    D(lora_alpha), D(lora_dropout), S(lora_target_modules), I(lora_target_linear), S(lora_modules_to_save), I(lora_rslora),
    I(lora_dora), S(lora_layers), D(loraplus_lr_ratio), S(unfrozen_parameters),
    I(bnb_4bit_quant_type), I(bnb_4bit_use_double_quant), I(bnb_4bit_blocksize),
#undef I
#undef D
#undef S
};
#define NFIXED ((int)(sizeof fixed / sizeof fixed[0]))

static json_t *fixed_json(const snug_run_config *c, const snug_setup *s) {
    json_t *o = json_object();
    for (int i = 0; i < NFIXED; i++) {
        const char *p = (const char *)c + fixed[i].off;
        json_t *v = fixed[i].kind == F_INT   ? json_integer(*(const int *)p)
                    : fixed[i].kind == F_DBL ? json_real(*(const double *)p)
                                             : json_string(p);
        json_object_set_new(o, fixed[i].name, v);
    }
    /* the data as tokenized (the cache key hashes the files' contents, the tokenizer and the options) */
    const char *key = strrchr(s->drep.cache_path, '/');
    json_object_set_new(o, "data", json_string(key ? key + 1 : s->drep.cache_path));
    char tok[32];
    snprintf(tok, sizeof tok, "%016llx", (unsigned long long)s->enc.hash);
    json_object_set_new(o, "tokenizer", json_string(tok));
    /* data parallel: the ranks set the global batch, and the order of the ranks' sums its bits (a checkpoint written
     * before this field existed is one process's) */
    json_object_set_new(o, "ranks", json_integer(s->ranks > 1 ? s->ranks : 1));
    if (s->ranks > 1) { /* and ZeRO's stage which arenas are each rank's shard (a checkpoint without it: 0) */
        json_object_set_new(o, "ddp_deterministic", json_integer(c->ddp_deterministic));
        json_object_set_new(o, "zero_stage", json_integer(c->zero_stage));
    }
    /* the loss's blocks of head rows as resolved (a checkpoint without it: 0, the plain loss); after the stage, which
     * decides it by default */
    json_object_set_new(o, "loss_vocab_block", json_integer(s->plan.vocab_block));
    return o;
}

/* ---- files: hash, write, read ---- */

/* limit: read no further than this (a checkpoint file is as large as its listing says): -1 when longer */
static int hash_file(const char *path, size_t *bytes, uint64_t *hash, size_t limit) {
    struct stat st;
    if (stat(path, &st) != 0 || !S_ISREG(st.st_mode) || (size_t)st.st_size > limit)
        return -1;
    FILE *f = fopen(path, "rb");
    if (!f)
        return -1;
    snug_hasher h;
    snug_hash_init(&h, CKPT_SEED);
    unsigned char buf[1 << 14];
    size_t n, total = 0;
    while ((n = fread(buf, 1, sizeof buf, f)) > 0) {
        snug_hash_update(&h, buf, n);
        total += n;
    }
    int bad = ferror(f);
    fclose(f);
    if (bad)
        return -1;
    *bytes = total;
    *hash = snug_hash_final(&h);
    return 0;
}

/* The kept arena that model.safetensors holds bit for bit, so a checkpoint does not write it again: the fp32 weights
 * (the parameters of an fp32 run, the master copy of a 16-bit one) when their arena holds nothing else; -1 when none
 * (LoRA keeps the adapters; 16-bit without master weights). */
static int weights_arena(const snug_engine *eng) {
    const snug_model *m = &eng->model;
    size_t bytes = (m->table.total * sizeof(float) + SNUG_ARENA_ALIGN - 1) / SNUG_ARENA_ALIGN * SNUG_ARENA_ALIGN;
    for (int i = 0; !m->lora.on && m->params && i < NKEPT; i++)
        if (!kept_per_rank(eng, i) && kept_bytes(eng, i) == bytes && eng->blocks[kept[i].c] == (const void *)m->params)
            return i;
    return -1;
}

/* n bytes from src into path, hashed into h on the way, through a host staging buffer when src is device memory.
 * Direct I/O: the bytes are not copied into the page cache (resume is another process). */
static int write_arena(const char *path, const unsigned char *src, size_t n, int host, snug_backend *be,
                       snug_hasher *h, snug_error *e) {
    snug_atomic_file af;
    snug_write_opts o = {.direct = 1, .hash = h};
    SNUG_TRY(snug_atomic_open(&af, path, &o, e));
    const size_t piece = (size_t)16 << 20;
    unsigned char *buf = host ? NULL : aligned_alloc(4096, piece);
    int rc = !host && n && !buf ? snug_fail(e, SNUG_ENOMEM, "out of host memory writing %s", path) : 0;
    for (size_t o = 0; !rc && o < n; o += piece) {
        size_t k = n - o < piece ? n - o : piece;
        if (host) {
            rc = snug_atomic_write(&af, src + o, k, e);
        } else {
            be->to_host(be, buf, src + o, k);
            rc = snug_atomic_write(&af, buf, k, e);
        }
    }
    free(buf);
    if (rc) {
        snug_atomic_abort(&af);
        return rc;
    }
    return snug_atomic_commit(&af, e);
}

/* Kept arena i's bytes (kept_bytes from kept_at) from path. */
static int read_arena(const char *path, snug_engine *eng, int i, snug_error *e) {
    snug_category c = kept[i].c;
    size_t n = kept_bytes(eng, i);
    unsigned char *dst = kept_at(eng, i);
    FILE *f = fopen(path, "rb");
    if (!f)
        return snug_fail(e, SNUG_EINPUT, "%s: cannot open (%s); the checkpoint is incomplete", path, strerror(errno));
    int host = eng->plan.host[c] || eng->be->host_resident;
    const size_t piece = (size_t)16 << 20;
    unsigned char *buf = host ? NULL : malloc(n < piece ? n : piece);
    int rc = !host && n && !buf ? snug_fail(e, SNUG_ENOMEM, "out of host memory reading %s", path) : 0;
    for (size_t o = 0; !rc && o < n; o += piece) {
        size_t k = n - o < piece ? n - o : piece;
        unsigned char *into = host ? dst + o : buf;
        if (fread(into, 1, k, f) != k)
            rc = snug_fail(e, SNUG_EINPUT, "%s: shorter than the %zu bytes this run's %s needs; the checkpoint is "
                           "damaged or from another configuration", path, n, snug_category_name(c));
        else if (!host)
            eng->be->to_device(eng->be, dst + o, buf, k);
    }
    free(buf);
    fclose(f);
    return rc;
}

/* ---- the Hugging Face folder ---- */

/* The folder with the weights from p32 (F32) or p16 (16-bit, p32 NULL) in host memory, from a stream (fill, F32),
 * or (all NULL) from the engine's model itself; model.safetensors is written with wo (NULL: none). */
static int save_hf_as(const char *dir, const snug_setup *s, const snug_engine *eng, const snug_model *am,
                      const float *p32, const uint16_t *p16, snug_weights_fill fill, void *ud,
                      const snug_write_opts *wo, snug_error *e) {
    char p[4096];
    SNUG_TRY(snug_mkdirs(dir, e));
    const snug_model *m = am ? am : &eng->model;
    if (s->tok_path[0]) {
        char srcdir[4096];
        snprintf(srcdir, sizeof srcdir, "%s", s->tok_path);
        char *slash = strrchr(srcdir, '/');
        if (slash)
            *slash = '\0';
        else
            snprintf(srcdir, sizeof srcdir, ".");
        SNUG_TRY(snug_copy_tokenizer_files(srcdir, dir, e));
        SNUG_TRY(snug_tokenizer_files_set_special(dir, &s->c, e));
    }
    /* LoRA: the adapter as PEFT saves it (p32: the adapter table's values), naming its base; adapter_config.json,
     * written last, makes the folder an adapter */
    if (m->lora.on)
        return snug_peft_save(m, dir, s->c.base_model[0] ? s->c.base_model : s->c.model_preset, p32, e);
    if (fill)
        SNUG_TRY(snug_model_save_weights_stream(m, dir, fill, ud, wo, e));
    else if (p32 || p16)
        SNUG_TRY(snug_model_save_weights_host(m, dir, p32, p16, wo, e));
    else
        SNUG_TRY(snug_model_save_weights(m, dir, wo, e));
    snug_model_config cfg = s->cfg;
    /* the dtype the weights were saved in: fp32, or bf16/fp16 when there is no fp32 copy to save (a rank's shard
     * of the master copy is not one) */
    int half_only = fill ? m->lv.dt != SNUG_DT_F32 && !m->params
                    : (p32 || p16) ? !p32
                                   : m->lv.dt != SNUG_DT_F32 && (!m->params || m->master_sharded) && m->be->host_resident;
    snprintf(cfg.torch_dtype, sizeof cfg.torch_dtype, "%s",
             !half_only ? "float32" : m->lv.dt == SNUG_DT_BF16 ? "bfloat16" : "float16");
    snug_path_join(p, sizeof p, dir, "generation_config.json");
    SNUG_TRY(snug_generation_config_save(&cfg, p, e));
    snug_path_join(p, sizeof p, dir, "config.json"); /* last: the folder is loadable only once it is whole */
    return snug_model_config_save(&cfg, p, e);
}

static int save_hf(const char *dir, const snug_setup *s, const snug_engine *eng, const float *p32,
                   const uint16_t *p16, snug_weights_fill fill, void *ud, const snug_write_opts *wo, snug_error *e) {
    return save_hf_as(dir, s, eng, NULL, p32, p16, fill, ud, wo, e);
}

int snug_save_hf_folder(const char *dir, const snug_setup *s, const snug_engine *eng, snug_error *e) {
    return save_hf(dir, s, eng, NULL, NULL, NULL, NULL, NULL, e);
}

int snug_save_hf_folder_adapter(const char *dir, const snug_setup *s, const snug_engine *eng, const snug_model *whole,
                                const float *host, snug_error *e) {
    return save_hf_as(dir, s, eng, whole, host, NULL, NULL, NULL, NULL, e);
}

int snug_save_hf_folder_stream(const char *dir, const snug_setup *s, const snug_engine *eng, snug_weights_fill fill,
                               void *ud, snug_error *e) {
    return save_hf(dir, s, eng, NULL, NULL, fill, ud, NULL, e);
}

/* ---- folders ---- */

static int remove_tree(const char *path) {
    DIR *d = opendir(path);
    if (!d)
        return unlink(path) == 0 || errno == ENOENT ? 0 : -1;
    struct dirent *de;
    int rc = 0;
    while ((de = readdir(d))) {
        if (!strcmp(de->d_name, ".") || !strcmp(de->d_name, ".."))
            continue;
        char p[4096];
        if (snug_path_join(p, sizeof p, path, de->d_name) == 0)
            rc |= remove_tree(p);
    }
    closedir(d);
    return rmdir(path) == 0 ? rc : -1;
}

static void fsync_dir(const char *dir) {
    int fd = open(dir, O_RDONLY | O_DIRECTORY);
    if (fd >= 0) {
        fsync(fd);
        close(fd);
    }
}

/* The step of a complete checkpoint folder name, or -1. */
static int checkpoint_step(const char *name) {
    int step, len = 0;
    if (sscanf(name, "checkpoint-%d%n", &step, &len) != 1 || name[len] || step < 0)
        return -1;
    return step;
}

int snug_checkpoint_latest(const char *output_dir, char *path, size_t n) {
    DIR *d = opendir(output_dir);
    if (!d)
        return 1;
    int best = -1;
    struct dirent *de;
    while ((de = readdir(d))) {
        int st = checkpoint_step(de->d_name);
        if (st > best) {
            char p[4096], j[4200];
            snug_path_join(p, sizeof p, output_dir, de->d_name);
            snug_path_join(j, sizeof j, p, STATE_HASH);
            if (snug_file_exists(j))
                best = st;
        }
    }
    closedir(d);
    if (best < 0)
        return 1;
    snprintf(path, n, "%s/checkpoint-%d", output_dir, best);
    return 0;
}

static int int_desc(const void *a, const void *b) { return *(const int *)b - *(const int *)a; }

int snug_checkpoint_prune(const char *output_dir, int keep, int protect, snug_error *e) {
    if (keep == 0)
        return 0;
    if (keep < 0)
        keep = 0;
    DIR *d = opendir(output_dir);
    if (!d)
        return 0;
    int steps[4096], n = 0;
    struct dirent *de;
    while ((de = readdir(d)) && n < 4096) {
        int st = checkpoint_step(de->d_name);
        if (st >= 0)
            steps[n++] = st;
    }
    closedir(d);
    qsort(steps, (size_t)n, sizeof *steps, int_desc);
    for (int i = keep; i < n; i++) {
        if (protect > 0 && steps[i] == protect)
            continue;
        char p[4096];
        snprintf(p, sizeof p, "%s/checkpoint-%d", output_dir, steps[i]);
        if (remove_tree(p))
            return snug_fail(e, SNUG_EIO, "%s: cannot delete the old checkpoint (save_total_limit %d): %s", p, keep,
                             strerror(errno));
    }
    return 0;
}

int snug_output_dir_has_run(const char *output_dir) {
    char p[4096];
    snug_path_join(p, sizeof p, output_dir, "metrics.jsonl");
    if (snug_file_exists(p))
        return 1;
    DIR *d = opendir(output_dir);
    if (!d)
        return 0;
    struct dirent *de;
    int found = 0;
    while (!found && (de = readdir(d)))
        found = !strncmp(de->d_name, "checkpoint-", 11);
    closedir(d);
    return found;
}

/* ---- save ---- */

/* One checkpoint being written: what it is written from, and how it ended. */
struct snug_ckpt_job {
    char dir[4096];
    int keep;
    snug_train_state st;
    const snug_setup *s;
    const snug_engine *eng;
    const unsigned char *src[NKEPT]; /* the bytes of each kept arena: the snapshot, or the arena itself */
    int host;                        /* src is host memory (a snapshot, or a host-resident backend) */
    const float *p32;                /* the model's weights in the snapshot (NULL: from the model) */
    const uint16_t *p16;
    int rank;        /* the rank writing (0: the model files and the state every rank holds) */
    int per_rank;    /* ZeRO: each rank writes its shard files, and the loop's thread completes the folder */
    int frank;       /* the rank its shard files are named after (file_rank); -1: it writes none */
    json_t *files;   /* what this rank wrote, each file's size and hash (a shard file with its rank) */
    int64_t rbytes[NKEPT], rhash[NKEPT]; /* this rank's shard files: size and hash */
    pthread_t thread;
    int threaded;
    atomic_int done;
    double t0, t1;
    double cpu_s; /* the CPU time the write took (its thread's) */
    int rc;
    snug_error err;
};

/* Where a pointer into one of the kept arenas lies in the snapshot. */
static const void *in_snapshot(const snug_engine *eng, const void *ptr) {
    for (int c = 0; ptr && c < SNUG_MEM_NCAT; c++) {
        const unsigned char *b = eng->blocks[c], *q = ptr;
        if (eng->snapshot[c] && b && q >= b && q < b + eng->plan.bytes[c])
            return (unsigned char *)eng->snapshot[c] + (q - b);
    }
    return NULL;
}

/* A file's size and hash into the list trainer_state.json keeps; rank >= 0: a rank's shard file, which only that
 * rank reads back. */
static void list_entry(json_t *files, const char *name, uint64_t bytes, uint64_t hash, int rank) {
    char hex[32];
    snprintf(hex, sizeof hex, "%016llx", (unsigned long long)hash);
    json_t *o = json_pack("{s:I, s:s}", "bytes", (json_int_t)bytes, "hash", hex);
    if (rank >= 0)
        json_object_set_new(o, "rank", json_integer(rank));
    json_object_set_new(files, name, o);
}

static void list_file(json_t *files, const char *name, const snug_hasher *h) {
    list_entry(files, name, h->total, snug_hash_final(h), -1);
}

/* The files of the checkpoint this rank writes into dir.partial, listed in j->files: rank 0 the Hugging Face folder
 * and the state every rank holds, every rank under ZeRO its shard files. */
static int write_files(struct snug_ckpt_job *j, snug_error *e) {
    char part[4200], p[4400], name[256];
    const snug_engine *eng = j->eng;
    snprintf(part, sizeof part, "%s.partial", j->dir);
    if (!j->per_rank) { /* under ZeRO rank 0 made the folder before any rank wrote into it */
        remove_tree(part); /* what a stop during an earlier save left */
        SNUG_TRY(snug_mkdirs(part, e));
    }
    if (!(j->files = json_object()))
        return snug_fail(e, SNUG_ENOMEM, "out of memory writing %s", j->dir);
    /* the big files are hashed as they are written and go to the disk directly; model.safetensors (not under LoRA,
     * whose adapter files are small) is the fp32 weights' arena too when it holds it */
    snug_hasher h;
    snug_hash_init(&h, CKPT_SEED);
    snug_write_opts wo = {.direct = 1, .hash = &h};
    /* ZeRO-3 and tensor parallelism: no rank holds the model to write (state.h); under LoRA the model files are the
     * adapters' */
    if (j->rank == 0 && (!eng->model.param_sharded || eng->model.lora.on) && split_n(&eng->model) <= 1) {
        SNUG_TRY(save_hf(part, j->s, eng, j->p32, j->p16, NULL, NULL, &wo, e));
        if (!eng->model.lora.on)
            list_file(j->files, "model.safetensors", &h);
    }
    int wa = weights_arena(eng);
    for (int i = 0; i < NKEPT; i++) {
        int mine = kept_per_rank(eng, i); /* a shard file, written even when the shard is empty */
        if (i == wa || (!mine && (j->rank != 0 || !kept_bytes(eng, i))) || (mine && j->frank < 0))
            continue;
        if (eng->model.lv.ckpt_model_only) /* save_only_model: the model files alone (their arenas kept for them) */
            continue;
        kept_file(eng, i, mine ? j->frank : j->rank, name, sizeof name);
        snug_path_join(p, sizeof p, part, name);
        snug_hash_init(&h, CKPT_SEED);
        SNUG_TRY(write_arena(p, j->src[i], kept_bytes(eng, i), j->host, eng->be, &h, e));
        list_entry(j->files, name, h.total, snug_hash_final(&h), mine ? j->frank : -1);
        j->rbytes[i] = (int64_t)h.total;
        j->rhash[i] = (int64_t)snug_hash_final(&h);
    }
    if (j->rank != 0)
        return 0;
    /* every other file but the state's own and the ranks' shard files, with its size and hash */
    DIR *d = opendir(part);
    struct dirent *de;
    while (d && (de = readdir(d))) {
        if (de->d_name[0] == '.' || json_object_get(j->files, de->d_name) || is_rank_file(de->d_name))
            continue;
        size_t bytes;
        uint64_t hv;
        snug_path_join(p, sizeof p, part, de->d_name);
        if (hash_file(p, &bytes, &hv, SIZE_MAX)) {
            closedir(d);
            return snug_fail(e, SNUG_EIO, "%s: cannot read back what was just written", p);
        }
        list_entry(j->files, de->d_name, bytes, hv, -1);
    }
    if (d)
        closedir(d);
    return 0;
}

/* Rank 0, once every file of dir.partial is complete: trainer_state.json (the state, the fixed settings, j->files)
 * and trainer_state.hash, then the folder takes its name, the rename is made durable, and old checkpoints are
 * pruned. */
static int write_state(struct snug_ckpt_job *j, snug_error *e) {
    char part[4200], p[4400];
    const char *dir = j->dir;
    const snug_train_state *st = &j->st;
    const snug_setup *s = j->s;
    snprintf(part, sizeof part, "%s.partial", dir);
    int wa = weights_arena(j->eng);
    json_t *js = json_pack("{s:i, s:s, s:o, s:O}", "format", STATE_FORMAT, "snug_version", SNUG_VERSION, "fixed",
                           fixed_json(&s->c, s), "files", j->files);
    if (js && snug_state_to_json(st, js)) { /* the state's fields (checkpoint_state.c) */
        json_decref(js);
        return snug_fail(e, SNUG_ENOMEM, "%s: cannot write the training state into %s: out of memory, or a value "
                         "JSON cannot hold (not finite)", dir, STATE_JSON);
    }
    if (js && wa >= 0) /* resume reads this arena from model.safetensors */
        json_object_set_new(js, "weights_arena", json_string(kept[wa].file));
    if (js && j->eng->model.lv.ckpt_model_only) /* save_only_model: nothing to resume from */
        json_object_set_new(js, "model_only", json_true());
    char *text = js ? json_dumps(js, JSON_INDENT(2) | JSON_SORT_KEYS) : NULL;
    json_decref(js);
    if (!text)
        return snug_fail(e, SNUG_ENOMEM, "out of memory writing %s", STATE_JSON);
    size_t len = strlen(text);
    snug_path_join(p, sizeof p, part, STATE_JSON);
    int rc = snug_write_file_atomic(p, text, len, e);
    char hex[32];
    snprintf(hex, sizeof hex, "%016llx\n", (unsigned long long)snug_hash64(text, len, CKPT_SEED));
    free(text);
    snug_path_join(p, sizeof p, part, STATE_HASH);
    if (!rc)
        rc = snug_write_file_atomic(p, hex, strlen(hex), e);
    if (rc)
        return rc;
    /* complete: the folder takes its name only now, and the rename itself is made durable */
    remove_tree(dir);
    if (rename(part, dir))
        return snug_fail(e, SNUG_EIO, "%s: cannot rename the finished checkpoint into place: %s", dir, strerror(errno));
    char parent[4096];
    snprintf(parent, sizeof parent, "%s", dir);
    char *slash = strrchr(parent, '/');
    if (slash)
        *slash = '\0';
    fsync_dir(slash ? parent : ".");
    return snug_checkpoint_prune(slash ? parent : ".", j->keep, j->st.best_step, e);
}

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* The CPU time of the calling thread (Linux). */
static double thread_cpu_s(void) {
    struct rusage ru;
    if (getrusage(RUSAGE_THREAD, &ru))
        return 0;
    return (double)(ru.ru_utime.tv_sec + ru.ru_stime.tv_sec) +
           1e-6 * (double)(ru.ru_utime.tv_usec + ru.ru_stime.tv_usec);
}

static void *writer_main(void *arg) {
    struct snug_ckpt_job *j = arg;
    double c0 = thread_cpu_s();
    /* the lowest priority: the write takes the cores the training threads leave idle, not theirs (Linux: a thread's
     * nice value is its own) */
    if (j->threaded)
        setpriority(PRIO_PROCESS, (id_t)syscall(SYS_gettid), 19);
    j->rc = write_files(j, &j->err);
    if (!j->rc && !j->per_rank) /* one writer: the folder is complete here (under ZeRO: snug_checkpoint_finish) */
        j->rc = write_state(j, &j->err);
    j->t1 = now_s();
    j->cpu_s = thread_cpu_s() - c0;
    atomic_store(&j->done, 1);
    return NULL;
}

/* ZeRO, in the loop's thread of every rank: whether every rank got its part of the job done (ok, from each rank),
 * as every rank's failure on all of them; what names the step. A failed collective is returned as it is. */
static int ranks_agree(snug_comm *c, const char *dir, const char *what, int ok, int rc_here, snug_error *e) {
    int64_t failed = !ok;
    snug_error ce = {0};
    if (c->allreduce_sum(c, &failed, 1, SNUG_COMM_I64 | SNUG_COMM_HOST, &ce)) {
        if (e)
            *e = ce;
        return ce.code ? ce.code : SNUG_EIO;
    }
    if (!ok)
        return rc_here;
    if (failed)
        return snug_fail(e, SNUG_EIO, "%s: another rank could not %s (its message says why)", dir, what);
    return 0;
}

int snug_checkpoint_start(snug_checkpointer *w, const char *dir, int keep, const snug_train_state *st,
                          const snug_setup *s, const snug_engine *eng, snug_error *e) {
    SNUG_TRY(snug_checkpoint_finish(w, 1, e));
    int per_rank = snug_checkpoint_per_rank(eng), rank = w->comm ? w->comm->rank : 0;
    if (per_rank && (!w->comm || w->comm->size < 2))
        return snug_fail(e, SNUG_EINTERNAL, "%s: a sharded state without its ranks' communicator", dir);
    if (per_rank) { /* rank 0 makes the folder (anew) before any rank writes into it */
        char part[4200];
        snprintf(part, sizeof part, "%s.partial", dir);
        int rc = 0;
        if (rank == 0) {
            remove_tree(part); /* what a stop during an earlier save left */
            rc = snug_mkdirs(part, e);
        }
        SNUG_TRY(ranks_agree(w->comm, dir, "create the checkpoint's folder", !rc, rc, e));
    }
    struct snug_ckpt_job *j = calloc(1, sizeof *j);
    if (!j)
        return snug_fail(e, SNUG_ENOMEM, "out of host memory writing %s", dir);
    snprintf(j->dir, sizeof j->dir, "%s", dir);
    j->keep = keep;
    j->st = *st;
    j->s = s;
    j->eng = eng;
    j->rank = rank;
    j->per_rank = per_rank;
    j->frank = file_rank(eng, s, rank);
    j->t0 = now_s();
    int snap = 1;
    for (int i = 0; i < NKEPT; i++)
        snap &= !kept_bytes(eng, i) || eng->snapshot[kept[i].c];
    j->host = snap || eng->be->host_resident;
    for (int i = 0; i < NKEPT; i++) {
        snug_category c = kept[i].c;
        size_t n = kept_bytes(eng, i);
        j->src[i] = kept_at(eng, i);
        if (!snap || !n || (rank != 0 && !kept_per_rank(eng, i))) /* what this rank does not write is not copied */
            continue;
        /* the snapshot: what the next steps change is copied now, and written from the copy */
        if (eng->plan.host[c] || eng->be->host_resident)
            memcpy(eng->snapshot[c], j->src[i], n);
        else
            eng->be->to_host(eng->be, eng->snapshot[c], j->src[i], n);
        j->src[i] = eng->snapshot[c];
    }
    const snug_model *m = &eng->model;
    if (m->param_sharded && !m->lora.on) {
        /* ZeRO-3 writes no model files: nothing of the weights but the shard files */
    } else if (snap && m->lora.on) {
        j->p32 = in_snapshot(eng, m->lora.params);
    } else if (m->master_sharded) { /* the rank's shard of the master copy: the model files hold the 16-bit copy */
        j->p16 = snap ? in_snapshot(eng, m->params16) : eng->be->host_resident ? m->params16 : NULL;
    } else if (snap) {
        j->p32 = in_snapshot(eng, m->params);
        j->p16 = j->p32 ? NULL : in_snapshot(eng, m->params16);
    }
    w->job = j;
    w->copy_s = now_s() - j->t0;
    j->threaded = snap;
    if (snap && pthread_create(&j->thread, NULL, writer_main, j) == 0)
        return 0;
    j->threaded = 0;
    writer_main(j); /* no snapshot (or no thread): written here and now */
    return 0;
}

/* ZeRO, in the loop's thread of every rank, once every rank's writer is done: each rank's result and the size and
 * hash of each of its shard files to every rank (one all-gather of NKEPT pairs per rank), then rank 0 lists them all
 * in trainer_state.json and renames the folder, and the ranks agree that it did. */
static int commit(struct snug_ckpt_job *j, snug_comm *c, snug_error *e) {
    const size_t per = 2 + 2 * NKEPT;
    int W = c->size;
    int64_t *all = calloc((size_t)W * per, sizeof *all);
    size_t *counts = calloc((size_t)W, sizeof *counts);
    if (!all || !counts || W < 1) {
        free(all);
        free(counts);
        return snug_fail(e, SNUG_ENOMEM, "out of host memory completing %s", j->dir);
    }
    int64_t *mine = all + (size_t)j->rank * per;
    mine[0] = j->rc;
    mine[1] = j->frank;
    for (int i = 0; i < NKEPT; i++) {
        mine[2 + 2 * i] = j->rbytes[i];
        mine[3 + 2 * i] = j->rhash[i];
    }
    for (int r = 0; r < W; r++)
        counts[r] = per;
    int rc = c->allgather(c, all, counts, SNUG_COMM_I64 | SNUG_COMM_HOST, e);
    int failed = -1;
    for (int r = 0; !rc && r < W && failed < 0; r++)
        failed = all[(size_t)r * per] ? r : -1;
    if (!rc && failed == j->rank) {
        rc = j->rc;
        if (e)
            *e = j->err;
    } else if (!rc && failed >= 0) {
        rc = snug_fail(e, SNUG_EIO, "%s: rank %d of %d could not write its part of the checkpoint (its message says "
                       "why)", j->dir, failed, W);
    }
    if (rc) {
        free(all);
        free(counts);
        return rc;
    }
    int wrc = 0;
    if (j->rank == 0) {
        char name[256];
        for (int r = 1; r < W; r++)
            for (int i = 0; i < NKEPT; i++) {
                const int64_t *q = all + (size_t)r * per;
                int fr = (int)q[1]; /* -1: rank r wrote none (the same bytes as another rank's) */
                if (kept_per_rank(j->eng, i) && fr >= 0 && !j->eng->model.lv.ckpt_model_only) {
                    kept_file(j->eng, i, fr, name, sizeof name);
                    list_entry(j->files, name, (uint64_t)q[2 + 2 * i], (uint64_t)q[3 + 2 * i], fr);
                }
            }
        wrc = write_state(j, e);
    }
    free(all);
    free(counts);
    return ranks_agree(c, j->dir, "complete the checkpoint", !wrc, wrc, e);
}

int snug_checkpoint_finish(snug_checkpointer *w, int wait, snug_error *e) {
    struct snug_ckpt_job *j = w->job;
    w->finished = 0;
    if (!j)
        return 0;
    /* ZeRO: every rank has a write in flight; it is collected when every rank's is done, on all of them at once */
    int together = j->per_rank && w->comm;
    if (!wait && together) {
        int64_t busy = !atomic_load(&j->done);
        SNUG_TRY(w->comm->allreduce_sum(w->comm, &busy, 1, SNUG_COMM_I64 | SNUG_COMM_HOST, e));
        if (busy)
            return 0;
    } else if (!wait && !atomic_load(&j->done)) {
        return 0;
    }
    if (j->threaded)
        pthread_join(j->thread, NULL);
    int rc = j->rc;
    if (rc && e)
        *e = j->err;
    if (together) { /* the folder is complete only once every rank's files are */
        rc = commit(j, w->comm, e);
        j->t1 = now_s();
    } else if (!rc && j->per_rank) { /* the ranks no longer agree (a failed collective): left as .partial */
        rc = snug_fail(e, SNUG_EIO, "%s: left incomplete, as the ranks stopped before all of them had written it",
                       j->dir);
    }
    w->job = NULL;
    w->finished = 1;
    w->write_s = j->t1 - j->t0;
    w->write_cpu_s = j->cpu_s;
    snprintf(w->dir, sizeof w->dir, "%s", j->dir);
    json_decref(j->files);
    free(j);
    return rc;
}

/* ---- load ---- */

static int refuse(snug_error *e, const char *dir, const char *what) {
    return snug_fail(e, SNUG_EINPUT, "%s: %s; resume from another checkpoint (snug keeps only complete ones under their "
                     "own name), or start the run again", dir, what);
}

/* Whether file `name` of checkpoint dir is as trainer_state.json lists it (f: its size and hash). */
static int check_file(const char *dir, const char *name, json_t *f, snug_error *e) {
    char p[4400], why[600], hex[32];
    size_t bytes;
    uint64_t h;
    json_int_t want_bytes = json_integer_value(json_object_get(f, "bytes"));
    /* a listed name is a file of this folder, never a path out of it */
    if (!snug_is_plain_name(name)) {
        snprintf(why, sizeof why, "it lists \"%.200s\", which is not a file name of the checkpoint", name);
        return refuse(e, dir, why);
    }
    snug_path_join(p, sizeof p, dir, name);
    if (hash_file(p, &bytes, &h, want_bytes >= 0 ? (size_t)want_bytes : 0)) {
        snprintf(why, sizeof why, "%s is missing, unreadable, not a plain file or longer than the %lld bytes it was "
                 "written as", name, (long long)want_bytes);
        return refuse(e, dir, why);
    }
    snprintf(hex, sizeof hex, "%016llx", (unsigned long long)h);
    const char *want_hash = json_string_value(json_object_get(f, "hash"));
    if ((json_int_t)bytes != want_bytes || !want_hash || strcmp(hex, want_hash)) {
        snprintf(why, sizeof why, "%s is %zu bytes with hash %s, but was written as %lld bytes with hash %s (the file "
                 "was truncated or changed)", name, bytes, hex, (long long)want_bytes, want_hash ? want_hash : "?");
        return refuse(e, p, why);
    }
    return 0;
}

/* How the checkpoint's ranks split the state: their number, their ZeRO stage (0 for one process) and their
 * accumulation; the data of a step is ranks x accumulation micro-batches, whatever the split. */
typedef struct split {
    int ranks, stage, ga;
} split;

static split split_of(json_t *fixed_settings) {
    json_t *r = json_object_get(fixed_settings, "ranks"), *z = json_object_get(fixed_settings, "zero_stage");
    split sp = {.ranks = r ? (int)json_integer_value(r) : 1,
                .ga = (int)json_integer_value(json_object_get(fixed_settings, "gradient_accumulation_steps"))};
    sp.ranks = sp.ranks > 1 ? sp.ranks : 1;
    sp.stage = sp.ranks > 1 && z ? (int)json_integer_value(z) : 0;
    return sp;
}

/* Whether this run may continue a checkpoint split as `was` (the settings compared elsewhere being equal): the same
 * micro-batches per step, whatever the ranks (each takes its share of the same global batch); ZeRO stage 3 only as
 * stage 3 over several ranks, as its parameters are shards; stages 0 to 2 across each other, as they differ only in
 * how the optimizer state and the master copy are split. Under LoRA (frozen_base) the state is the adapters' at
 * every stage: any split. */
static int split_check(const char *dir, split was, split now, int frozen_base, snug_error *e) {
    int mb = was.ranks * was.ga;
    if (mb != now.ranks * now.ga) {
        char fix[160];
        if (mb % now.ranks == 0)
            snprintf(fix, sizeof fix, "set gradient_accumulation_steps to %d on %d rank%s", mb / now.ranks, now.ranks,
                     now.ranks > 1 ? "s" : "");
        else
            snprintf(fix, sizeof fix, "resume on a number of ranks that divides %d, with ranks x "
                     "gradient_accumulation_steps = %d", mb, mb);
        return snug_fail(e, SNUG_EINPUT, "%s: the checkpoint's steps take %d micro-batch%s (%d rank%s x "
                         "gradient_accumulation_steps %d), this run's %d (%d x %d), so the data would not continue "
                         "where it stopped: %s", dir, mb, mb > 1 ? "es" : "", was.ranks, was.ranks > 1 ? "s" : "",
                         was.ga, now.ranks * now.ga, now.ranks, now.ga, fix);
    }
    if (was.stage != now.stage && (was.stage == 3 || now.stage == 3) && !frozen_base)
        return snug_fail(e, SNUG_EINPUT, "%s: the checkpoint was trained with zero_stage %d over %d rank%s, this run "
                         "has zero_stage %d over %d; stage 3 keeps the parameters as shards and no model files, so it "
                         "resumes only as stage 3 over two ranks or more (stages 0 to 2 resume across each other): "
                         "set zero_stage: %d", dir, was.stage, was.ranks, was.ranks > 1 ? "s" : "", now.stage,
                         now.ranks, was.stage);
    return 0;
}

/* Whether kept arena i of a checkpoint split as sp is each rank's file (kept_per_rank of the run that wrote it). */
static int was_per_rank(const snug_engine *eng, int i, split sp) {
    snug_category c = kept[i].c;
    if (split_n(&eng->model) > 1) /* a fixed setting (tensor_parallel_size, pipeline_parallel_size): the
                                   * checkpoint's split is this run's */
        return kept_per_rank(eng, i);
    return sp.ranks > 1 && sp.stage >= 1 && !eng->model.lora.on && /* under LoRA the state (adapters) is whole */
           (c == SNUG_MEM_OPTIM || c == SNUG_MEM_MASTER || (c == SNUG_MEM_PARAMS && sp.stage >= 3)) &&
           kept_bytes(eng, i) > 0;
}

/* Kept arena i of this rank from a checkpoint split otherwise (sp): the files that hold the arena over each of the
 * old ranges (each rank's, or the one file of an unsplit arena), checked and read where they overlap this rank's. */
static int read_resharded(const char *dir, json_t *files, const snug_setup *s, snug_engine *eng, int i, split sp,
                          snug_error *e) {
    const snug_param_table *t = &eng->model.table;
    int per = was_per_rank(eng, i, sp), n = per ? sp.ranks : 1;
    size_t *counts = calloc((size_t)n, sizeof *counts);
    snug_shard_src *src = calloc((size_t)n, sizeof *src);
    char (*paths)[4400] = calloc((size_t)n, sizeof *paths);
    int rc = counts && src && paths ? 0 : snug_fail(e, SNUG_ENOMEM, "out of host memory resharding a checkpoint");
    if (!rc && per) {
        snug_plan_spec old = s->spec;
        old.ranks = sp.ranks, old.zero_stage = sp.stage;
        snug_plan_zero_counts(&old, t, counts);
    } else if (!rc) {
        counts[0] = t->total;
    }
    for (int r = 0; !rc && r < n; r++) {
        char name[256];
        kept_name(i, per, r, name, sizeof name);
        src[r].lo = snug_comm_displ(counts, r);
        src[r].hi = src[r].lo + counts[r];
        src[r].path = paths[r];
        snug_path_join(paths[r], sizeof paths[r], dir, name);
        json_t *fi = json_object_get(files, name);
        if (!fi) {
            char why[400];
            snprintf(why, sizeof why, "it lists no %s, the %s of %s %d of %d (zero_stage %d)", name,
                     per ? "shard" : "file", snug_category_name(kept[i].c), r, n, sp.stage);
            rc = refuse(e, dir, why);
        } else if (counts[r] && per && json_integer_value(json_object_get(fi, "rank")) != state_rank(eng, s)) {
            rc = check_file(dir, name, fi, e); /* this rank's own were checked with the rest */
        }
    }
    if (!rc)
        rc = snug_reshard_read(eng, kept[i].c, src, n, e);
    free(counts);
    free(src);
    free(paths);
    return rc;
}

/* trainer_state.json of the complete checkpoint dir, checked against trainer_state.hash, into *out (NULL on an
 * error); p receives its path. */
static int read_state(const char *dir, char p[4400], json_t **out, snug_error *e) {
    size_t len;
    char *text = NULL, *hash = NULL;
    *out = NULL;
    snug_path_join(p, 4400, dir, STATE_HASH);
    if (snug_read_file(p, &hash, &len, e)) {
        char part[4200];
        snprintf(part, sizeof part, "%s.partial", dir);
        return refuse(e, dir, snug_file_exists(part) || !snug_file_exists(dir)
                                  ? "not a complete checkpoint (no trainer_state.hash)"
                                  : "not a complete checkpoint: trainer_state.hash is missing");
    }
    snug_path_join(p, 4400, dir, STATE_JSON);
    int rc = snug_read_file(p, &text, &len, e);
    if (rc) /* the hash without its state: as incomplete as a checkpoint without the hash */
        rc = refuse(e, dir, "not a complete checkpoint: trainer_state.json is missing or unreadable");
    char want[32];
    if (!rc) {
        snprintf(want, sizeof want, "%016llx\n", (unsigned long long)snug_hash64(text, len, CKPT_SEED));
        if (strcmp(want, hash))
            rc = refuse(e, p, "its contents do not match trainer_state.hash (the file was truncated or changed)");
    }
    free(hash);
    json_error_t je;
    json_t *j = rc ? NULL : snug_json_loadb(text, len, 0, &je);
    free(text);
    if (!rc && !j)
        rc = refuse(e, p, "not valid JSON");
    *out = j;
    return rc;
}

int snug_checkpoint_take_weights(const char *dir, const char *out_dir, snug_error *e) {
    char p[4400];
    json_t *j;
    int rc = read_state(dir, p, &j, e);
    json_t *files = json_object_get(j, "files");
    if (!rc && !json_is_object(files))
        rc = refuse(e, dir, "no \"files\" list");
    const char *name;
    json_t *f;
    int taken = 0;
    json_object_foreach(files, name, f) { /* the model's weights: the files transformers and PEFT load them from */
        size_t n = strlen(name);
        if (rc || n < 12 || strcmp(name + n - 12, ".safetensors") || json_object_get(f, "rank"))
            continue;
        char src[4400], dst[4400];
        snug_path_join(src, sizeof src, dir, name);
        snug_path_join(dst, sizeof dst, out_dir, name);
        if (!(rc = check_file(dir, name, f, e)))
            rc = snug_copy_file(src, dst, e);
        taken++;
    }
    json_decref(j);
    if (!rc && !taken)
        rc = refuse(e, dir, "it holds no model weights (.safetensors)");
    return rc;
}

int snug_checkpoint_fixed_int(const char *dir, const char *key, int *v) {
    char p[4400];
    snug_path_join(p, sizeof p, dir, STATE_JSON);
    json_error_t je;
    json_t *j = json_load_file(p, 0, &je);
    json_t *w = json_object_get(json_object_get(j, "fixed"), key);
    int found = json_is_integer(w) && json_integer_value(w) >= 0 && json_integer_value(w) <= INT_MAX;
    if (found)
        *v = (int)json_integer_value(w);
    json_decref(j);
    return found;
}

int snug_checkpoint_vocab_block(const char *dir, int *v) {
    int found = snug_checkpoint_fixed_int(dir, "loss_vocab_block", v);
    if (found && *v == 0)
        *v = -1;
    return found;
}

int snug_checkpoint_load(const char *dir, snug_train_state *st, const snug_setup *s, snug_engine *eng,
                         snug_error *e) {
    char p[4400], why[600];
    json_t *j;
    int rc = read_state(dir, p, &j, e);
    json_int_t format = j ? json_integer_value(json_object_get(j, "format")) : 0;
    if (!rc && (format < 1 || format > STATE_FORMAT)) {
        snprintf(why, sizeof why, "format %lld, which this snug (%s, format %d) does not read; resume with the snug "
                 "that wrote it", (long long)format, SNUG_VERSION, STATE_FORMAT);
        rc = refuse(e, p, why);
    }
    if (!rc && json_is_true(json_object_get(j, "model_only")))
        rc = snug_fail(e, SNUG_EINPUT, "%s was saved with save_only_model: true: it holds the model's weights alone, "
                       "without the optimizer state a resumed run needs; resume from a checkpoint of a run without "
                       "save_only_model, or start a new run from these weights (base_model: %s)", dir, dir);
    if (!rc && format < 3 && eng->model.lora.on) {
        snprintf(why, sizeof why, "format %lld keeps the adapters in the order of an earlier snug's memory, which this "
                 "snug (%s) lays out otherwise; resume with the snug that wrote it", (long long)format, SNUG_VERSION);
        rc = refuse(e, p, why);
    }
    /* every other file as it was written */
    json_t *files = j ? json_object_get(j, "files") : NULL;
    if (!rc && !json_is_object(files))
        rc = refuse(e, p, "no \"files\" list");
    const char *name;
    json_t *f;
    json_object_foreach(files, name, f) {
        json_t *owner = json_object_get(f, "rank"); /* another rank's shard file is that rank's to check (or the
                                                     * reader's, when the ranks are split otherwise: resharded) */
        if (!rc && !(owner && json_integer_value(owner) != state_rank(eng, s)))
            rc = check_file(dir, name, f, e);
    }
    /* the settings that change the results must be the checkpoint's */
    json_t *was = j ? json_object_get(j, "fixed") : NULL, *now = fixed_json(&s->c, s);
    split sp_was = split_of(was), sp_now = split_of(now);
    int multi = sp_was.ranks > 1 && sp_now.ranks > 1;
    json_object_foreach(now, name, f) {
        if (rc)
            break;
        /* the split of the ranks is weighed whole (split_check); a rank-order sum only between several ranks */
        if (!strcmp(name, "ranks") || !strcmp(name, "gradient_accumulation_steps") || !strcmp(name, "zero_stage") ||
            (!multi && !strcmp(name, "ddp_deterministic")))
            continue;
        json_t *w = json_object_get(was, name), *one = NULL;
        if (!w && !strcmp(name, "loss_vocab_block"))
            w = one = json_integer(0);
        if (!w && (!strcmp(name, "tensor_parallel_size") || !strcmp(name, "pipeline_parallel_size")))
            w = one = json_integer(1); /* written before tensor (pipeline) parallelism: none */
        if (!w && (!strcmp(name, "pipeline_layers") || !strcmp(name, "unfrozen_parameters")))
            w = one = json_string(""); /* written before them: none (every tensor trained) */
        if (!w || !json_equal(w, f)) {
            char *a = w ? json_dumps(w, JSON_ENCODE_ANY) : NULL, *b = json_dumps(f, JSON_ENCODE_ANY), fix[160] = "";
            /* the loss's blocks are resolved by the stage (auto): another stage needs the checkpoint's value set */
            if (!strcmp(name, "loss_vocab_block") && w)
                snprintf(fix, sizeof fix, " (here: loss_vocab_block: %lld)",
                         json_integer_value(w) ? (long long)json_integer_value(w) : -1LL);
            if (!strcmp(name, "tensor_parallel_size") && w) /* each rank's files hold its slices of the blocks */
                snprintf(fix, sizeof fix, " (here: tensor_parallel_size: %lld on as many ranks, each reading its "
                         "slices of the blocks)", (long long)json_integer_value(w));
            if (!strcmp(name, "pipeline_parallel_size") && w) /* each rank's files hold its stage's layers */
                snprintf(fix, sizeof fix, " (here: pipeline_parallel_size: %lld on as many ranks, each reading its "
                         "stage's layers)", (long long)json_integer_value(w));
            rc = snug_fail(e, SNUG_EINPUT, "%s: the checkpoint was trained with %s %s, this run has %s; resuming would "
                           "not continue the same run: resume with the checkpoint's settings%s (max_steps, "
                           "learning_rate, the logging and saving keys may change)", dir, name, a ? a : "(none)",
                           b ? b : "?", fix);
            free(a);
            free(b);
        }
        json_decref(one);
    }
    json_decref(now);
    if (!rc)
        rc = split_check(dir, sp_was, sp_now, eng->model.lora.on, e);
    if (!rc && split_n(&eng->model) > 1 && sp_was.ranks != sp_now.ranks) { /* each rank's files: its world rank's */
        int n = split_n(&eng->model);
        snprintf(why, sizeof why, "it was trained as %d data-parallel group%s of %s %d ranks, this run has %d; such "
                 "a checkpoint resumes on as many ranks (mpirun -np %d)", sp_was.ranks, sp_was.ranks > 1 ? "s" : "",
                 eng->model.tp > 1 ? "tensor_parallel_size" : "pipeline_parallel_size", n, sp_now.ranks,
                 sp_was.ranks * n);
        rc = refuse(e, dir, why);
    }
    if (!rc) {
        snug_train_state def; /* what a key the checkpoint does not hold reads as */
        snug_state_init(&def, s->c.learning_rate, &s->c.sched);
        snug_state_from_json(j, (int)format, &def, st);
        /* the fp32 weights' arena kept as model.safetensors alone: read first, as loading the weights also sets a
         * 16-bit copy, which its own file then restores bit for bit */
        const char *in_weights = json_string_value(json_object_get(j, "weights_arena"));
        int wa = -1;
        for (int i = 0; in_weights && i < NKEPT; i++)
            wa = !strcmp(in_weights, kept[i].file) ? i : wa;
        if (in_weights && (wa < 0 || wa != weights_arena(eng))) {
            if (sp_was.stage != sp_now.stage && (!strcmp(in_weights, "state-master.bin") || eng->model.master_sharded))
                snprintf(why, sizeof why, "it keeps %s (the fp32 master copy of a 16-bit run without ZeRO) as "
                         "model.safetensors, which ZeRO's shards of that copy are not read from; resume with zero_stage "
                         "%d", in_weights, sp_was.stage);
            else
                snprintf(why, sizeof why, "it keeps %s as model.safetensors, which this run cannot take it from (it "
                         "lays out the weights differently); the checkpoint is from another configuration", in_weights);
            rc = refuse(e, dir, why);
        } else if (in_weights) {
            rc = snug_model_load_weights(&eng->model, dir, e);
        }
        for (int i = 0; !rc && i < NKEPT; i++) {
            size_t want_bytes = kept_bytes(eng, i);
            if (i == wa)
                continue;
            /* split otherwise than this run splits it: assembled from the files that hold this rank's range */
            int per = kept_per_rank(eng, i);
            if (want_bytes && (per || was_per_rank(eng, i, sp_was)) &&
                (per != was_per_rank(eng, i, sp_was) || sp_was.ranks != sp_now.ranks)) {
                rc = read_resharded(dir, files, s, eng, i, sp_was, e);
                continue;
            }
            char file[256]; /* under ZeRO, this rank's own file of its shard (tensor parallelism: of its slices) */
            int me = state_rank(eng, s);
            kept_file(eng, i, me, file, sizeof file);
            json_t *fi = json_object_get(files, file);
            if (!fi && kept_per_rank(eng, i)) {
                snprintf(why, sizeof why, "it lists no %s, the shard of %s this rank (%d of %d) reads; the checkpoint "
                         "is from another number of ranks or zero_stage", file, snug_category_name(kept[i].c),
                         me, split_n(&eng->model) > 1 ? split_n(&eng->model) : s->ranks);
                rc = refuse(e, dir, why);
            } else if ((size_t)json_integer_value(json_object_get(fi, "bytes")) != want_bytes) {
                snprintf(why, sizeof why, "%s holds %lld bytes of %s, this run lays out %zu; the checkpoint is from "
                         "another configuration", file, (long long)json_integer_value(json_object_get(fi, "bytes")),
                         snug_category_name(kept[i].c), want_bytes);
                rc = refuse(e, dir, why);
            } else if (want_bytes) {
                snug_path_join(p, sizeof p, dir, file);
                rc = read_arena(p, eng, i, e);
            }
        }
    }
    json_decref(j);
    return rc;
}
