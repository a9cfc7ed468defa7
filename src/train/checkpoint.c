/* checkpoint.c: writing the whole training state (see state.h): the settings that must not change on resume, the
 * Hugging Face folder, the checkpoint's folders (the newest, pruning), and the write itself, in the loop's thread or a
 * writer thread, by one rank or every rank of a sharded state. What the folder holds is checkpoint_files.h; the
 * state's fields are checkpoint_state.c's table; checkpoint_load.c reads a checkpoint back. */
#include "train/state.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <pthread.h>
#include <stdatomic.h>
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
#include "core/version.h"
#include "train/checkpoint_files.h"
#include "train/state_io.h"

/* ---- the kept arenas: which rank writes which file ---- */

int snug_checkpoint_per_rank(const snug_engine *eng) {
    int any = 0;
    for (int i = 0; i < NKEPT; i++)
        any |= kept_per_rank(eng, i);
    return any;
}

/* Whether a file name is a rank's shard file (or its temporary file while it is written). */
static int is_rank_file(const char *name) {
    const char *q = strstr(name, ".rank");
    return !strncmp(name, "state-", 6) && q && q[5] >= '0' && q[5] <= '9';
}

/* The rank the files this rank writes are named after (world: its rank in the checkpoint's communicator), or -1
 * where another rank writes the same bytes: a data-parallel group after the first one whose state is the first's. */
static int file_rank(const snug_engine *eng, const snug_setup *s, int world) {
    if (!tp_replicated(eng))
        return world;
    return s->rank == 0 ? split_rank(&eng->model) : -1;
}

/* ---- what must not change on resume: the settings that change the results ---- */

/* The settings the key table marks (c->fixed: snug_options_defaults sets it), then what the run derives: the data
 * and tokenizer as used, the split of the ranks, the loss's blocks, and bnb_config_kwargs' blocksize. */
json_t *snug_ckpt_fixed_json(const snug_run_config *c, const snug_setup *s) {
    json_t *o = json_object();
    for (int i = 0; i < c->nfixed; i++) {
        const snug_fixed_setting *f = &c->fixed[i];
        const char *p = (const char *)c + f->offset;
        json_t *v = f->kind == SNUG_SETTING_INT    ? json_integer(*(const int *)p)
                    : f->kind == SNUG_SETTING_REAL ? json_real(*(const double *)p)
                                                   : json_string(p);
        json_object_set_new(o, f->name, v);
    }
    json_object_set_new(o, "bnb_4bit_blocksize", json_integer(c->bnb_4bit_blocksize));
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
int snug_ckpt_hash_file(const char *path, size_t *bytes, uint64_t *hash, size_t limit) {
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
int snug_ckpt_weights_arena(const snug_engine *eng) {
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

/* ---- the Hugging Face folder ---- */

snug_dtype snug_checkpoint_final_dtype(const snug_model_config *c) {
    return !strcmp(c->torch_dtype, "bfloat16") ? SNUG_DT_BF16 : !strcmp(c->torch_dtype, "float16") ? SNUG_DT_F16
                                                                                                    : SNUG_DT_F32;
}

/* The folder with the weights from p32 (F32) or p16 (16-bit, p32 NULL) in host memory, from a stream (fill, F32),
 * or (all NULL) from the engine's model itself; model.safetensors is written with wo (NULL: none). The final save
 * (`final`) writes fp32 weights in the base's dtype, rounded to nearest even as torch rounds, as transformers'
 * save_pretrained of the fine-tuned base would; a checkpoint keeps them fp32, which resume reads back exactly. */
static int save_hf_as(const char *dir, const snug_setup *s, const snug_engine *eng, const snug_model *am,
                      const float *p32, const uint16_t *p16, snug_weights_fill fill, void *ud,
                      const snug_write_opts *wo, int final, snug_error *e) {
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
        SNUG_TRY(snug_setup_save_chat_template(s, dir, e));
    }
    /* LoRA: the adapter as PEFT saves it (p32: the adapter table's values), naming its base; adapter_config.json,
     * written last, makes the folder an adapter */
    if (m->lora.on)
        return snug_peft_save(m, dir, s->c.base_model[0] ? s->c.base_model : s->c.model_preset, p32, e);
    /* the dtype the weights are saved in: the 16-bit parameters as they are when there is no fp32 copy to save (a
     * rank's shard of the master copy is not one); else fp32, rounded to the base's dtype by a final save */
    int half_only = fill ? m->lv.dt != SNUG_DT_F32 && !m->params
                    : (p32 || p16) ? !p32
                                   : m->lv.dt != SNUG_DT_F32 && (!m->params || m->master_sharded) && m->be->host_resident;
    snug_dtype dt = half_only ? m->lv.dt : final ? snug_checkpoint_final_dtype(&s->cfg) : SNUG_DT_F32;
    snug_model *view = NULL; /* the same model, saved as dt */
    if (!half_only && dt != SNUG_DT_F32) {
        if (!(view = malloc(sizeof *view)))
            return snug_fail(e, SNUG_ENOMEM, "out of host memory saving the weights to %s", dir);
        *view = *m;
        view->file_dt = dt;
        m = view;
    }
    int rc = fill ? snug_model_save_weights_stream(m, dir, fill, ud, wo, e)
             : p32 || p16 ? snug_model_save_weights_host(m, dir, p32, p16, wo, e)
                          : snug_model_save_weights(m, dir, wo, e);
    free(view);
    if (rc)
        return rc;
    snug_model_config cfg = s->cfg;
    /* special_tokens' pad and eos tokens, which the tokenizer files now name, are the model's too */
    if (s->c.pad_token[0] && s->pad_id >= 0)
        cfg.pad_token_id = s->pad_id;
    if (s->c.eos_token[0] && s->enc.eos_id >= 0)
        cfg.eos_token_id = s->enc.eos_id;
    snprintf(cfg.torch_dtype, sizeof cfg.torch_dtype, "%s",
             dt == SNUG_DT_BF16 ? "bfloat16" : dt == SNUG_DT_F16 ? "float16" : "float32");
    snug_path_join(p, sizeof p, dir, "generation_config.json");
    SNUG_TRY(snug_generation_config_save(&cfg, p, e));
    snug_path_join(p, sizeof p, dir, "config.json"); /* last: the folder is loadable only once it is whole */
    return snug_model_config_save(&cfg, p, e);
}

static int save_hf(const char *dir, const snug_setup *s, const snug_engine *eng, const float *p32,
                   const uint16_t *p16, snug_weights_fill fill, void *ud, const snug_write_opts *wo, int final,
                   snug_error *e) {
    return save_hf_as(dir, s, eng, NULL, p32, p16, fill, ud, wo, final, e);
}

int snug_save_hf_folder(const char *dir, const snug_setup *s, const snug_engine *eng, snug_error *e) {
    return save_hf(dir, s, eng, NULL, NULL, NULL, NULL, NULL, 1, e);
}

int snug_save_hf_folder_adapter(const char *dir, const snug_setup *s, const snug_engine *eng, const snug_model *whole,
                                const float *host, snug_error *e) {
    return save_hf_as(dir, s, eng, whole, host, NULL, NULL, NULL, NULL, 1, e);
}

int snug_save_hf_folder_stream(const char *dir, const snug_setup *s, const snug_engine *eng, snug_weights_fill fill,
                               void *ud, snug_error *e) {
    return save_hf(dir, s, eng, NULL, NULL, fill, ud, NULL, 1, e);
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
        SNUG_TRY(save_hf(part, j->s, eng, j->p32, j->p16, NULL, NULL, &wo, 0, e));
        if (!eng->model.lora.on)
            list_file(j->files, "model.safetensors", &h);
    }
    int wa = snug_ckpt_weights_arena(eng);
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
        if (snug_ckpt_hash_file(p, &bytes, &hv, SIZE_MAX)) {
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
    int wa = snug_ckpt_weights_arena(j->eng);
    json_t *js = json_pack("{s:i, s:s, s:o, s:O}", "format", STATE_FORMAT, "snug_version", SNUG_VERSION, "fixed",
                           snug_ckpt_fixed_json(&s->c, s), "files", j->files);
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
