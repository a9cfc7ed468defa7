/* test_state.c: the training state through trainer_state.json (state_io.h).
 *
 * A state with every field set to a distinct value, through the table of fields, is written to JSON text and read
 * back into a zeroed struct byte for byte; the struct is first filled with a byte pattern (padding cleared), so a field
 * added to snug_train_state without a row in the table keeps the pattern and fails the comparison. The JSON is the
 * one snug wrote before the table existed (the writer and reader of that time are kept here as the reference), and a
 * checkpoint without the optional keys (an older snug's, or a run without watchdog, early stopping, best checkpoint
 * or plateau) reads as the state before any step. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "train/state_io.h"

#if defined(__has_builtin)
#if __has_builtin(__builtin_clear_padding)
#define HAVE_CLEAR_PADDING 1
#endif
#endif

/* ---- the reference: trainer_state.json's state as write_state and snug_checkpoint_load spelled it out (format 3) */

static json_t *legacy_write(const snug_train_state *st) {
    json_t *js = json_pack("{s:i, s:i, s:I, s:I, s:i, s:{s:b, s:f, s:i, s:i}, s:f}", "step", st->step, "epochs_done",
                           st->epochs_done, "in_epoch", (json_int_t)st->in_epoch, "per_epoch",
                           (json_int_t)st->per_epoch, "optimizer_step", st->opt_step, "loss_scale", "on", st->ls.on,
                           "scale", (double)st->ls.scale, "clean", st->ls.clean, "skipped", st->ls.skipped,
                           "loss_mean", st->loss_mean);
    if (js && st->watch_over)
        json_object_set_new(js, "loss_watchdog_steps", json_integer(st->watch_over));
    if (js && st->es_step)
        json_object_set_new(js, "early_stopping", json_pack("{s:f, s:i, s:i}", "best", st->es_best, "step",
                                                            st->es_step, "count", st->es_count));
    if (js && isfinite(st->plateau.best))
        json_object_set_new(js, "plateau", json_pack("{s:f, s:f, s:i, s:i}", "lr", st->plateau.lr, "best",
                                                     st->plateau.best, "bad", st->plateau.bad, "cooldown",
                                                     st->plateau.cooldown));
    if (js && st->best_step)
        json_object_set_new(js, "best_checkpoint", json_pack("{s:f, s:i}", "val_loss", st->best_val, "step",
                                                             st->best_step));
    return js;
}

static void legacy_read(json_t *j, snug_train_state *st, double lr, const snug_sched_params *sched) {
    st->step = (int)json_integer_value(json_object_get(j, "step"));
    st->epochs_done = (int)json_integer_value(json_object_get(j, "epochs_done"));
    st->in_epoch = (size_t)json_integer_value(json_object_get(j, "in_epoch"));
    st->per_epoch = (size_t)json_integer_value(json_object_get(j, "per_epoch"));
    st->opt_step = (int)json_integer_value(json_object_get(j, "optimizer_step"));
    json_t *ls = json_object_get(j, "loss_scale");
    st->ls.on = json_is_true(json_object_get(ls, "on"));
    st->ls.scale = (float)json_real_value(json_object_get(ls, "scale"));
    st->ls.clean = (int)json_integer_value(json_object_get(ls, "clean"));
    st->ls.skipped = (int)json_integer_value(json_object_get(ls, "skipped"));
    st->loss_mean = json_real_value(json_object_get(j, "loss_mean"));
    st->watch_over = (int)json_integer_value(json_object_get(j, "loss_watchdog_steps"));
    json_t *es = json_object_get(j, "early_stopping"), *best = json_object_get(j, "best_checkpoint");
    st->es_best = json_number_value(json_object_get(es, "best"));
    st->es_step = (int)json_integer_value(json_object_get(es, "step"));
    st->es_count = (int)json_integer_value(json_object_get(es, "count"));
    st->best_val = json_number_value(json_object_get(best, "val_loss"));
    st->best_step = (int)json_integer_value(json_object_get(best, "step"));
    json_t *pl = json_object_get(j, "plateau");
    snug_plateau_init(&st->plateau, lr, sched);
    if (pl) {
        st->plateau.lr = json_number_value(json_object_get(pl, "lr"));
        st->plateau.best = json_number_value(json_object_get(pl, "best"));
        st->plateau.bad = (int)json_integer_value(json_object_get(pl, "bad"));
        st->plateau.cooldown = (int)json_integer_value(json_object_get(pl, "cooldown"));
    }
}

/* ---- helpers ---- */

/* A struct whose padding is zero and whose other bytes are `pattern` (padding as the compiler lays it out). */
static void fill_pattern(snug_train_state *st, int pattern) {
#ifdef HAVE_CLEAR_PADDING
    memset(st, pattern, sizeof *st);
    __builtin_clear_padding(st);
#else /* (padding cannot be told apart: zero throughout) */
    (void)pattern;
    memset(st, 0, sizeof *st);
#endif
}

/* A zeroed struct with its padding zero too. */
static void zeroed(snug_train_state *st) { memset(st, 0, sizeof *st); }

/* Every row of the table set to a value of its own (nonzero and finite, so every object is written). */
static void set_distinct(snug_train_state *st) {
    for (int i = 0; i < snug_state_nfields; i++) {
        const snug_state_field *f = &snug_state_fields[i];
        char *p = (char *)st + f->off;
        switch (f->type) {
        case SNUG_SF_INT:
            *(int *)p = 1000 + 37 * i;
            break;
        case SNUG_SF_SIZE:
            *(size_t *)p = ((size_t)1 << 40) + (size_t)i;
            break;
        case SNUG_SF_BOOL:
            *(int *)p = 1;
            break;
        case SNUG_SF_FLOAT:
            *(float *)p = 0.1f * (float)(i + 1); /* not a round number: the float's bits through a JSON real */
            break;
        case SNUG_SF_DOUBLE:
            *(double *)p = 1.0 / 3.0 + (double)i; /* all 17 digits */
            break;
        }
    }
}

static char *dump(const json_t *js) { return json_dumps(js, JSON_INDENT(2) | JSON_SORT_KEYS); }

/* st written through the table, to the text of a file and parsed back */
static json_t *through_text(const snug_train_state *st) {
    json_t *js = json_object();
    CHECK(snug_state_to_json(st, js) == 0);
    char *text = dump(js);
    json_decref(js);
    json_error_t je;
    json_t *back = text ? json_loads(text, 0, &je) : NULL;
    free(text);
    CHECK(back != NULL);
    return back;
}

/* Whether the table writes st as the writer before it did, byte for byte. */
static int same_text_as_legacy(const snug_train_state *st) {
    json_t *a = json_object(), *b = legacy_write(st);
    int wrote = snug_state_to_json(st, a) == 0;
    char *ta = dump(a), *tb = b ? dump(b) : NULL;
    int same = wrote && ta && tb && !strcmp(ta, tb);
    if (!same)
        fprintf(stderr, "table:\n%s\nbefore:\n%s\n", ta ? ta : "(null)", tb ? tb : "(null)");
    free(ta);
    free(tb);
    json_decref(a);
    json_decref(b);
    return same;
}

/* ---- tests ---- */

/* The rows: inside the struct, not overlapping, one object's rows together, no key twice in an object. */
static void test_table(void) {
    size_t covered = 0;
    for (int i = 0; i < snug_state_nfields; i++) {
        const snug_state_field *f = &snug_state_fields[i];
        size_t n = snug_state_field_size(f);
        covered += n;
        CHECKF(f->off + n <= sizeof(snug_train_state), "row %s", f->key);
        CHECKF(f->since >= 1, "row %s", f->key);
        for (int k = 0; k < i; k++) {
            const snug_state_field *g = &snug_state_fields[k];
            size_t m = snug_state_field_size(g);
            CHECKF(f->off >= g->off + m || g->off >= f->off + n, "rows %s and %s overlap", g->key, f->key);
            int same_obj = (!f->group && !g->group) || (f->group && g->group && !strcmp(f->group, g->group));
            CHECKF(!same_obj || strcmp(f->key, g->key), "key %s twice", f->key);
            /* an object's rows are next to each other: one seen before is the row just before */
            const snug_state_field *prev = &snug_state_fields[i - 1];
            if (f->group && g->group && !strcmp(f->group, g->group))
                CHECKF(prev->group && !strcmp(prev->group, f->group), "the rows of %s apart", f->group);
        }
    }
    /* what the rows leave uncovered is at most the padding alignment can need (each gap below 8 bytes) */
    CHECKF(covered <= sizeof(snug_train_state) && sizeof(snug_train_state) - covered < 8 * (size_t)snug_state_nfields,
           "rows cover %zu of %zu bytes", covered, sizeof(snug_train_state));
}

/* Every field distinct, written and read back: the same bytes, and the same text the writer before the table wrote. */
static void test_round_trip(void) {
    snug_train_state a, b, def;
    fill_pattern(&a, 0x5a);
    set_distinct(&a);
    snug_sched_params sp;
    snug_sched_params_default(&sp);
    snug_state_init(&def, 3e-4, &sp);
    json_t *js = through_text(&a);
    zeroed(&b);
    snug_state_from_json(js, 3, &def, &b);
    int same = memcmp(&a, &b, sizeof a) == 0;
    CHECKF(same, "the state read back differs from the one written");
    for (size_t k = 0; !same && k < sizeof a; k++)
        if (((unsigned char *)&a)[k] != ((unsigned char *)&b)[k])
            fprintf(stderr, "  byte %zu of snug_train_state: written 0x%02x, read 0x%02x (a field without a row in "
                    "checkpoint_state.c?)\n", k, ((unsigned char *)&a)[k], ((unsigned char *)&b)[k]);
    /* every object and key written (all conditions hold) */
    for (int i = 0; i < snug_state_nfields; i++) {
        const snug_state_field *f = &snug_state_fields[i];
        json_t *in = f->group ? json_object_get(js, f->group) : js;
        CHECKF(json_object_get(in, f->key) != NULL, "%s.%s not written", f->group ? f->group : "", f->key);
    }
    /* the reader before the table reads the same */
    snug_train_state c;
    zeroed(&c);
    legacy_read(js, &c, 3e-4, &sp);
    CHECK(memcmp(&a, &c, sizeof a) == 0);
    json_decref(js);
    CHECK(same_text_as_legacy(&a));
}

/* A run that used none of the optional parts: they are not written, and read as the state before any step. */
static void test_optional(void) {
    snug_sched_params sp;
    snug_sched_params_default(&sp);
    snug_train_state a, def, b, c;
    snug_state_init(&def, 2e-3, &sp);
    fill_pattern(&a, 0);
    set_distinct(&a);
    a.watch_over = 0;
    a.es_step = 0;
    a.best_step = 0;
    a.plateau.best = INFINITY; /* no evaluation yet */
    CHECK(same_text_as_legacy(&a));
    json_t *js = through_text(&a);
    CHECK(json_object_get(js, "loss_watchdog_steps") == NULL);
    CHECK(json_object_get(js, "early_stopping") == NULL);
    CHECK(json_object_get(js, "best_checkpoint") == NULL);
    CHECK(json_object_get(js, "plateau") == NULL);
    CHECK(json_object_get(js, "loss_scale") != NULL && json_object_get(js, "step") != NULL);
    fill_pattern(&b, 0x77);
    snug_state_from_json(js, 3, &def, &b);
    CHECK(b.step == a.step && b.in_epoch == a.in_epoch && b.ls.scale == a.ls.scale && b.loss_mean == a.loss_mean);
    CHECK(b.watch_over == 0 && b.es_best == 0 && b.es_step == 0 && b.es_count == 0);
    CHECK(b.best_val == 0 && b.best_step == 0);
    CHECK(b.plateau.lr == 2e-3 && b.plateau.best == INFINITY && b.plateau.bad == 0 && b.plateau.cooldown == 0);
    fill_pattern(&c, 0);
    legacy_read(js, &c, 2e-3, &sp);
    CHECK(memcmp(&b, &c, sizeof b) == 0);
    json_decref(js);
    /* the file of a snug from before the watchdog, early stopping and plateau (format 1), in mode max */
    sp.plat_max = 1;
    snug_state_init(&def, 5e-5, &sp);
    const char *old = "{\"files\": {}, \"fixed\": {}, \"format\": 1, \"snug_version\": \"0.1.0\", \"step\": 40, "
                      "\"epochs_done\": 1, \"in_epoch\": 3, \"per_epoch\": 12, \"optimizer_step\": 39, \"loss_mean\": "
                      "2.5, \"loss_scale\": {\"on\": true, \"scale\": 32768.0, \"clean\": 17, \"skipped\": 2}}";
    json_error_t je;
    js = json_loads(old, 0, &je);
    CHECK(js != NULL);
    fill_pattern(&b, 0x33);
    snug_state_from_json(js, 1, &def, &b);
    CHECK(b.step == 40 && b.epochs_done == 1 && b.in_epoch == 3 && b.per_epoch == 12 && b.opt_step == 39);
    CHECK(b.ls.on == 1 && b.ls.scale == 32768.0f && b.ls.clean == 17 && b.ls.skipped == 2 && b.loss_mean == 2.5);
    CHECK(b.plateau.lr == 5e-5 && b.plateau.best == -INFINITY && b.es_step == 0 && b.best_step == 0);
    fill_pattern(&c, 0);
    legacy_read(js, &c, 5e-5, &sp);
    CHECK(memcmp(&b, &c, sizeof b) == 0);
    /* a format older than every row: all of it the state before any step */
    fill_pattern(&b, 0x33);
    snug_state_from_json(js, 0, &def, &b);
    CHECK(memcmp(&b, &def, sizeof b) == 0);
    json_decref(js);
}

/* Values JSON cannot hold: an optional object is left out whole, as before the table; elsewhere the write fails. */
static void test_not_finite(void) {
    snug_train_state a;
    fill_pattern(&a, 0);
    set_distinct(&a);
    a.es_best = INFINITY;
    json_t *js = json_object();
    CHECK(snug_state_to_json(&a, js) == 0);
    CHECK(json_object_get(js, "early_stopping") == NULL && json_object_get(js, "plateau") != NULL);
    json_decref(js);
    CHECK(same_text_as_legacy(&a));
    a.loss_mean = NAN;
    js = json_object();
    CHECK(snug_state_to_json(&a, js) != 0);
    json_decref(js);
}

int main(void) {
#ifndef HAVE_CLEAR_PADDING
    fprintf(stderr, "note: no __builtin_clear_padding: a field without a row is caught by the coverage check only\n");
#endif
    test_table();
    test_round_trip();
    test_optional();
    test_not_finite();
    return check_finish("test_state");
}
