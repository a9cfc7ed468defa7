/* checkpoint_state.c: the table of snug_train_state's fields (state_io.h), and the writing and reading of the state in
 * trainer_state.json that it drives. */
#include "train/state_io.h"

#include <math.h>
#include <string.h>

/* Every field of snug_train_state, in trainer_state.json's names and objects as snug has written them since format 1.
 * The rows of one object are next to each other. */
#define ROW(group, key, type, field, since, when) \
    {group, key, SNUG_SF_##type, offsetof(snug_train_state, field), since, SNUG_SW_##when}
const snug_state_field snug_state_fields[] = {
    ROW(NULL, "step", INT, step, 1, ALWAYS),
    ROW(NULL, "epochs_done", INT, epochs_done, 1, ALWAYS),
    ROW(NULL, "in_epoch", SIZE, in_epoch, 1, ALWAYS),
    ROW(NULL, "per_epoch", SIZE, per_epoch, 1, ALWAYS),
    ROW(NULL, "optimizer_step", INT, opt_step, 1, ALWAYS),
    ROW("loss_scale", "on", BOOL, ls.on, 1, ALWAYS),
    ROW("loss_scale", "scale", FLOAT, ls.scale, 1, ALWAYS),
    ROW("loss_scale", "clean", INT, ls.clean, 1, ALWAYS),
    ROW("loss_scale", "skipped", INT, ls.skipped, 1, ALWAYS),
    ROW(NULL, "loss_mean", DOUBLE, loss_mean, 1, ALWAYS),
    /* loss_watchdog_threshold's count (absent: 0, as in checkpoints from before the watchdog) */
    ROW(NULL, "loss_watchdog_steps", INT, watch_over, 1, NONZERO),
    /* early stopping (absent: no evaluation yet) */
    ROW("early_stopping", "best", DOUBLE, es_best, 1, ALWAYS),
    ROW("early_stopping", "step", INT, es_step, 1, NONZERO),
    ROW("early_stopping", "count", INT, es_count, 1, ALWAYS),
    /* load_best_model_at_end (absent: no checkpointed evaluation yet) */
    ROW("best_checkpoint", "val_loss", DOUBLE, best_val, 1, ALWAYS),
    ROW("best_checkpoint", "step", INT, best_step, 1, NONZERO),
    /* reduce_lr_on_plateau, after its first evaluation (absent: snug_plateau_init's) */
    ROW("plateau", "lr", DOUBLE, plateau.lr, 1, ALWAYS),
    ROW("plateau", "best", DOUBLE, plateau.best, 1, FINITE),
    ROW("plateau", "bad", INT, plateau.bad, 1, ALWAYS),
    ROW("plateau", "cooldown", INT, plateau.cooldown, 1, ALWAYS),
};
#undef ROW
const int snug_state_nfields = (int)(sizeof snug_state_fields / sizeof snug_state_fields[0]);

size_t snug_state_field_size(const snug_state_field *f) {
    switch (f->type) {
    case SNUG_SF_SIZE:
        return sizeof(size_t);
    case SNUG_SF_FLOAT:
        return sizeof(float);
    case SNUG_SF_DOUBLE:
        return sizeof(double);
    default:
        return sizeof(int);
    }
}

void snug_state_init(snug_train_state *st, double lr, const snug_sched_params *sched) {
    memset(st, 0, sizeof *st);
    snug_plateau_init(&st->plateau, lr, sched);
}

static int same_object(const snug_state_field *a, const snug_state_field *b) {
    return a == b || (a->group && b->group && !strcmp(a->group, b->group));
}

/* A row's value as a number, for its condition. */
static double number(const snug_train_state *st, const snug_state_field *f) {
    const char *p = (const char *)st + f->off;
    switch (f->type) {
    case SNUG_SF_SIZE:
        return (double)*(const size_t *)p;
    case SNUG_SF_FLOAT:
        return (double)*(const float *)p;
    case SNUG_SF_DOUBLE:
        return *(const double *)p;
    default:
        return (double)*(const int *)p;
    }
}

/* Whether row f's object (or f itself at the top level) is written, as its conditions say: and whether it has any. */
static int written(const snug_train_state *st, const snug_state_field *f, int *conditional) {
    int yes = 1;
    *conditional = 0;
    for (int i = 0; i < snug_state_nfields; i++) {
        const snug_state_field *g = &snug_state_fields[i];
        if (!same_object(f, g) || g->when == SNUG_SW_ALWAYS)
            continue;
        *conditional = 1;
        double v = number(st, g);
        yes &= g->when == SNUG_SW_NONZERO ? v != 0 : isfinite(v);
    }
    return yes;
}

static json_t *value(const snug_train_state *st, const snug_state_field *f) {
    const char *p = (const char *)st + f->off;
    switch (f->type) {
    case SNUG_SF_INT:
        return json_integer(*(const int *)p);
    case SNUG_SF_SIZE:
        return json_integer((json_int_t) * (const size_t *)p);
    case SNUG_SF_BOOL:
        return json_boolean(*(const int *)p);
    case SNUG_SF_FLOAT:
        return json_real((double)*(const float *)p);
    case SNUG_SF_DOUBLE:
        return json_real(*(const double *)p);
    }
    return NULL;
}

int snug_state_to_json(const snug_train_state *st, json_t *js) {
    const char *dropped = NULL; /* an object left out whole */
    for (int i = 0; i < snug_state_nfields; i++) {
        const snug_state_field *f = &snug_state_fields[i];
        int conditional;
        if (!written(st, f, &conditional) || (dropped && f->group && !strcmp(dropped, f->group)))
            continue;
        json_t *into = js, *v = value(st, f);
        if (v && f->group && !(into = json_object_get(js, f->group)) &&
            json_object_set_new(js, f->group, into = json_object()))
            into = NULL;
        if (v && into && !json_object_set_new(into, f->key, v))
            continue;
        if (!v || !into)
            json_decref(v);
        /* a value JSON cannot hold (a non-finite real): a conditional object is left out whole, as snug always did
         * (a reader takes the state before any such evaluation); elsewhere the state cannot be written */
        if (!conditional || !f->group)
            return -1;
        json_object_del(js, f->group);
        dropped = f->group;
    }
    return 0;
}

void snug_state_from_json(const json_t *js, int format, const snug_train_state *def, snug_train_state *st) {
    for (int i = 0; i < snug_state_nfields; i++) {
        const snug_state_field *f = &snug_state_fields[i];
        const json_t *in = f->group ? json_object_get(js, f->group) : js;
        const json_t *v = in && format >= f->since ? json_object_get(in, f->key) : NULL;
        char *p = (char *)st + f->off;
        if (!v) {
            memcpy(p, (const char *)def + f->off, snug_state_field_size(f));
            continue;
        }
        switch (f->type) {
        case SNUG_SF_INT:
            *(int *)p = (int)json_integer_value(v);
            break;
        case SNUG_SF_SIZE:
            *(size_t *)p = (size_t)json_integer_value(v);
            break;
        case SNUG_SF_BOOL:
            *(int *)p = json_is_true(v);
            break;
        case SNUG_SF_FLOAT:
            *(float *)p = (float)json_number_value(v);
            break;
        case SNUG_SF_DOUBLE:
            *(double *)p = json_number_value(v);
            break;
        }
    }
}
