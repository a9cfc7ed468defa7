/* checkpoint_load.c: reading a checkpoint back (snug_checkpoint_load, state.h): its files checked against
 * trainer_state.json, the settings that change the results compared with this run's, the state and the kept arenas
 * read (from each rank's own files, or resharded from another split of the ranks), and the small readers of a
 * checkpoint's trainer_state.json. */
#include <errno.h>
#include <jansson.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/fileio.h"
#include "core/hash.h"
#include "core/json_util.h"
#include "model/model.h"
#include "model/safetensors.h"
#include "core/version.h"
#include "train/checkpoint_files.h"
#include "train/reshard.h"
#include "train/state_io.h"

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
    if (snug_ckpt_hash_file(p, &bytes, &h, want_bytes >= 0 ? (size_t)want_bytes : 0)) {
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

/* A checkpoint's fp32 weight file src written as dst with its F32 tensors in dt (BF16 or F16, rounded to nearest
 * even by the writer as the final save rounds them); tensors of other dtypes go as they are. */
static int write_as(const char *src, const char *dst, snug_dtype dt, snug_error *e) {
    snug_st_set set = {0};
    SNUG_TRY(snug_st_open_file(&set, src, e));
    snug_st_out *out = calloc(set.ntensors ? (size_t)set.ntensors : 1, sizeof *out);
    int rc = out ? 0 : snug_fail(e, SNUG_ENOMEM, "out of host memory writing %s", dst);
    for (int i = 0; !rc && i < set.ntensors; i++) {
        const snug_st_tensor *t = &set.tensors[i];
        out[i] = (snug_st_out){.name = t->name, .dtype = t->dtype, .ndim = t->ndim};
        memcpy(out[i].shape, t->shape, sizeof t->shape);
        if (t->dtype == SNUG_DT_F32)
            out[i].dtype = dt, out[i].f32 = (const float *)t->data;
        else
            out[i].raw = t->data;
    }
    if (!rc)
        rc = snug_st_write(dst, out, set.ntensors, NULL, e);
    free(out);
    snug_st_close(&set);
    return rc;
}

int snug_checkpoint_take_weights(const char *dir, const char *out_dir, snug_dtype dt, snug_error *e) {
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
        /* the model's own weights (model.safetensors or its shards; not an adapter's) in the dtype the final save
         * gives them */
        int as_model = dt != SNUG_DT_F32 && !strncmp(name, "model", 5);
        if (!(rc = check_file(dir, name, f, e)))
            rc = as_model ? write_as(src, dst, dt, e) : snug_copy_file(src, dst, e);
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
    json_t *was = j ? json_object_get(j, "fixed") : NULL, *now = snug_ckpt_fixed_json(&s->c, s);
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
        for (int i = 0; !w && i < s->c.nfixed; i++) /* written before the setting was recorded: its value then */
            if (s->c.fixed[i].absent && !strcmp(name, s->c.fixed[i].name))
                w = one = json_loads(s->c.fixed[i].absent, JSON_DECODE_ANY, NULL);
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
        if (in_weights && (wa < 0 || wa != snug_ckpt_weights_arena(eng))) {
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
