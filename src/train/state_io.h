/* state_io.h: snug_train_state to and from trainer_state.json, through one table of its fields (internal to train/:
 * the checkpoint and its unit test).
 *
 * Every field of snug_train_state, nested ones included (the loss scaler's, the plateau's), is one row of
 * snug_state_fields: its key in trainer_state.json (and the object it lies in), its type, its place in the struct, the
 * format that introduced it and when it is written. Writing and reading walk the same rows, so a new piece of state is
 * one field in state.h and one row in checkpoint_state.c. A key a checkpoint does not hold (written by a snug from
 * before the field, or left out as the row allows) is read as the state before any step has (snug_state_init). */
#ifndef SNUG_TRAIN_STATE_IO_H
#define SNUG_TRAIN_STATE_IO_H

#include <jansson.h>
#include <stddef.h>

#include "optim/optim.h"
#include "train/state.h"

typedef enum {
    SNUG_SF_INT,    /* int, a JSON integer */
    SNUG_SF_SIZE,   /* size_t, a JSON integer */
    SNUG_SF_BOOL,   /* int 0 or 1, JSON true or false */
    SNUG_SF_FLOAT,  /* float, a JSON real */
    SNUG_SF_DOUBLE, /* double, a JSON real */
} snug_state_type;

/* When a row is written. A row with a condition decides for its whole object (the object's other rows say
 * SNUG_SW_ALWAYS): the object, or the key at the top level, is left out when the condition fails, which keeps the
 * files of runs that never used a feature as they were before the feature existed. */
typedef enum {
    SNUG_SW_ALWAYS,
    SNUG_SW_NONZERO, /* when the value is not 0 */
    SNUG_SW_FINITE,  /* when the value is finite */
} snug_state_when;

typedef struct snug_state_field {
    const char *group; /* the object of trainer_state.json it lies in ("loss_scale"); NULL: the top level */
    const char *key;
    snug_state_type type;
    size_t off;          /* offsetof(snug_train_state, ...) */
    int since;           /* the format of trainer_state.json that introduced it: older ones do not hold it */
    snug_state_when when;
} snug_state_field;

extern const snug_state_field snug_state_fields[];
extern const int snug_state_nfields;

/* The size in bytes of a row's field in the struct. */
size_t snug_state_field_size(const snug_state_field *f);

/* The state before any step: zero but for reduce_lr_on_plateau's, at the learning rate lr (snug_plateau_init). What a
 * key that a checkpoint does not hold reads as. */
void snug_state_init(snug_train_state *st, double lr, const snug_sched_params *sched);

/* Adds st's rows to the object js (which holds the rest of trainer_state.json). -1 when a value cannot be made (out
 * of memory, a non-finite real, which JSON cannot hold), 0 otherwise. */
int snug_state_to_json(const snug_train_state *st, json_t *js);

/* st from trainer_state.json js of the given format: every row from its key, or from def (snug_state_init) where the
 * checkpoint does not hold it. */
void snug_state_from_json(const json_t *js, int format, const snug_train_state *def, snug_train_state *st);

#endif
