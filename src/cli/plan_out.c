/* plan_out.c: the report of `snug plan` as JSON (--json) and as a picture (--svg, and the PNG beside it where a
 * converter is installed); see plan_report.h. */
#include "cli/plan_report.h"

#include <jansson.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/fileio.h"
#include "model/peft_io.h"
#include "plan/autofit.h"
#include "plan/plan_json.h"
#include "plan/ranks.h"
#include "plan/svg.h"
#include "train/setup.h"

/* ---- JSON ---- */

static json_t *point_json(const snug_fit_space *s, const snug_fit_point *pt) {
    if (!pt)
        return json_null();
    return json_pack("{s:s, s:I, s:f, s:i, s:i}", "setting", pt->what, "needs", (json_int_t)plan_cap_of(s, pt),
                     "step_time_cost", pt->cost, "micro_batch_size", pt->spec.B, "gradient_accumulation_steps", pt->GA);
}

json_t *plan_report_json(const report *r) {
    const snug_setup *p = r->p;
    const snug_run_config *o = &p->c;
    const snug_model_config *c = &p->cfg;
    const snug_plan *pl = &p->plan;
    json_t *j = json_object();
    json_object_set_new(j, "model", json_pack("{s:s, s:s, s:I, s:i, s:i, s:i, s:i, s:i, s:i}", "name", r->model_name,
                                              "model_type", c->model_type, "parameters", (json_int_t)plan_whole_params(p),
                                              "layers", c->n_layer, "hidden_size", c->hidden_size, "heads", c->n_head,
                                              "kv_heads", c->n_kv_head, "intermediate_size", c->intermediate_size,
                                              "vocab_size", c->vocab_size));
    json_object_set_new(j, "batch", json_pack("{s:i, s:i, s:i, s:f}", "micro_batch_size", o->micro_batch_size,
                                              "sequence_len", o->sequence_len, "gradient_accumulation_steps",
                                              o->gradient_accumulation_steps, "tokens_per_step", plan_step_tokens(o)));
    if (p->spec.tp > 1) { /* the memory is one rank's */
        int nar = 0;
        double bytes = snug_tp_comm_bytes(&p->spec, &nar);
        json_object_set_new(j, "tensor_parallel", json_pack("{s:i, s:I, s:i, s:f}", "ranks", p->spec.tp,
                                                            "parameters_per_rank", (json_int_t)pl->nparams,
                                                            "allreduces_per_step", nar, "bytes_sent_per_rank", bytes));
    }
    if (p->spec.pp > 1) { /* the memory is the heaviest stage's */
        json_t *st = json_array();
        for (int q = 0; q < p->spec.pp; q++) {
            int l0, n;
            snug_pp_layers(c->n_layer, p->spec.pp, p->spec.pp_split, q, &l0, &n);
            json_array_append_new(st, json_pack("{s:i, s:i, s:I, s:f}", "first_layer", l0, "layers", n, "parameters",
                                                (json_int_t)r->pp_params[q], "bytes", r->pp_total[q]));
        }
        json_object_set_new(j, "pipeline_parallel", json_pack("{s:i, s:i, s:o}", "stages", p->spec.pp, "planned_stage",
                                                              p->spec.pp_stage, "per_stage", st));
    }
    const snug_levers *lv = &p->spec.lv;
    json_object_set_new(j, "levers", snug_levers_json(&p->spec, pl));
    json_t *meth = json_array();
    for (int k = 0; k < r->nmethods; k++) {
        json_t *fits = json_array();
        for (int i = 0; i < r->nrows; i++)
            if (r->method_need[k] <= r->rows[i].g->mem_bytes)
                json_array_append_new(fits, json_string(r->rows[i].g->id));
        json_array_append_new(meth, json_pack("{s:s, s:f, s:o}", "method", r->method_name[k], "needs",
                                              r->method_need[k], "fits", fits));
    }
    json_object_set_new(j, "methods", meth);
    json_object_set_new(j, "precision", json_string(snug_precision_name(lv->dt)));
    json_object_set_new(j, "master_weights", json_boolean(lv->dt != SNUG_DT_F32 && lv->master_weights));
    if (p->fit_note[0])
        json_object_set_new(j, "auto_fit", json_string(p->fit_note));
    json_object_set_new(j, "backend", json_string(snug_device_kind_name(r->kind)));
    json_t *cats = json_object();
    for (int k = 0; k < SNUG_MEM_NCAT; k++) {
        char what[192];
        plan_category_what(r, k, what, sizeof what);
        json_object_set_new(cats, snug_category_name((snug_category)k),
                            json_pack("{s:I, s:f, s:b, s:s}", "bytes", (json_int_t)pl->bytes[k], "bytes_per_parameter",
                                      pl->nparams ? (double)pl->bytes[k] / (double)pl->nparams : 0.0, "host_memory",
                                      pl->host[k], "what", what));
    }
    json_object_set_new(j, "memory", json_pack("{s:o, s:I, s:I, s:o, s:f}", "categories", cats, "arenas",
                                               (json_int_t)pl->total, "host_arenas", (json_int_t)pl->host_total,
                                               "runtime_overhead", snug_overhead_json(&r->ov), "total", r->need));
    json_t *when = json_array();
    for (int i = 0; i < plan_nwhen; i++)
        json_array_append_new(when, json_string(plan_when_text[i]));
    json_object_set_new(j, "when_in_use", when);
    if (r->target_name)
        json_object_set_new(j, "target", json_pack("{s:s, s:f, s:b, s:o}", "name", r->target_name, "bytes",
                                                   r->target_bytes, "fits", r->need <= r->target_bytes, "cheapest_fit",
                                                   point_json(&r->space, r->target_best)));
    json_t *levs = json_array();
    for (int i = 0; i < r->nlev; i++)
        json_array_append_new(levs, json_pack("{s:s, s:f, s:f, s:f, s:s}", "lever", r->lev[i].name, "saves",
                                              r->lev[i].saves, "total", plan_cap_of(&r->space, r->lev[i].p),
                                              "step_time_cost", r->lev[i].p->cost, "why", r->lev[i].cost_note));
    json_object_set_new(j, "levers_toggled", levs);
    json_t *listed = json_array();
    for (int i = 0; i < r->nlisted; i++)
        json_array_append_new(listed, json_pack("{s:s, s:f, s:f, s:f, s:s}", "lever", r->listed[i].name, "saves",
                                                r->listed[i].saves, "total", r->listed[i].total, "step_time_cost",
                                                r->listed[i].cost_pct / 100.0, "why", r->listed[i].why));
    json_object_set_new(j, "levers_listed", listed);
    json_t *gpus = json_array();
    for (int i = 0; i < r->nrows; i++) {
        const gpu_row *w = &r->rows[i];
        json_t *alone = json_array();
        for (int k = 0; k < w->nalone; k++)
            json_array_append_new(alone, json_string(w->alone[k]->name));
        json_t *g = json_pack("{s:s, s:s, s:f, s:f, s:b, s:o, s:o}", "id", w->g->id, "label", w->g->label, "memory",
                              w->g->mem_bytes, "needs", w->need, "fits", w->need <= w->g->mem_bytes, "cheapest_fit",
                              point_json(&r->cuda, w->best), "single_levers_that_fit", alone);
        if (w->best) {
            json_object_set_new(g, "tokens_per_s", json_real(w->tps));
            json_object_set_new(g, "hours", json_real(w->hours));
            json_object_set_new(g, "price_per_hour", json_real(w->price));
            json_object_set_new(g, "cost_usd", json_real(w->usd));
        }
        json_array_append_new(gpus, g);
    }
    json_object_set_new(j, "gpus", gpus);
    json_object_set_new(j, "run_tokens", json_pack("{s:f, s:s}", "tokens", r->run_tokens, "source", r->tokens_source));
    json_object_set_new(j, "cheapest_gpu", r->cheapest >= 0 ? json_string(r->rows[r->cheapest].g->id) : json_null());
    return j;
}

/* ---- picture ---- */

static void bar_of(snug_svg_bar *b, const snug_fit_space *s, const snug_fit_point *pt, const char *label) {
    memset(b, 0, sizeof *b);
    snprintf(b->label, sizeof b->label, "%s%s", label,
             pt->plan.host_total && s->kind == SNUG_DEVICE_CUDA ? " (state in host memory)" : "");
    for (int c = 0; c < SNUG_MEM_NCAT; c++)
        b->bytes[c] = pt->plan.host[c] && s->kind == SNUG_DEVICE_CUDA ? 0 : (double)pt->plan.bytes[c];
    snug_overhead ov;
    snug_overhead_compute(&ov, s->kind, &pt->plan, s->host_data_bytes);
    b->overhead = (double)ov.total;
}

int plan_write_svg(const report *r, snug_error *e) {
    snug_svg_bar bars[MAXLEV + 20];
    int n = 0;
    const snug_fit_space *s = &r->cuda; /* the picture is about GPUs: cuda overhead */
    bar_of(&bars[n++], s, &s->pt[0], "as configured");
    for (int i = 0; i < r->nclev && n < MAXLEV; i++)
        bar_of(&bars[n++], s, r->clev[i].p, r->clev[i].name);
    for (int i = 0; i < r->nrows && n < MAXLEV + 19; i++) {
        const snug_fit_point *b = r->rows[i].best;
        if (!b || b == &s->pt[0] || b->changes < 2)
            continue;
        int dup = 0;
        for (int k = 0; k < i; k++)
            dup |= r->rows[k].best == b;
        if (dup)
            continue;
        char label[200];
        snprintf(label, sizeof label, "%.150s (fits %s)", b->what, r->rows[i].g->label);
        bar_of(&bars[n++], s, b, label);
    }
    snug_svg_line lines[16];
    int nl = 0;
    for (int i = 0; i < r->nrows && nl < 16; i++) {
        snprintf(lines[nl].label, sizeof lines[nl].label, "%s", r->rows[i].g->label);
        lines[nl++].bytes = r->rows[i].g->mem_bytes;
    }
    char title[1400];
    char name[256]; /* the model folder's own name */
    snprintf(name, sizeof name, "%.255s", r->model_name);
    for (size_t n = strlen(name); n > 1 && name[n - 1] == '/'; n--)
        name[n - 1] = '\0';
    const char *slash = strrchr(name, '/');
    if (slash && slash[1])
        memmove(name, slash + 1, strlen(slash + 1) + 1);
    snprintf(title, sizeof title, "snug plan: %.200s, %d x %d tokens, %s (cuda backend)", name,
             r->p->c.micro_batch_size, r->p->c.sequence_len, snug_optim_name(r->p->spec.optim, r->p->spec.optim_paged));
    SNUG_TRY(snug_svg_write(r->a->svg, title, bars, n, lines, nl, e));
    return 0;
}

void plan_png_path_of(const char *svg, char *png, size_t n) {
    size_t len = strlen(svg);
    if (len > 4 && !strcmp(svg + len - 4, ".svg"))
        snprintf(png, n, "%.*s.png", (int)(len - 4), svg);
    else
        snprintf(png, n, "%s.png", svg);
}

const char *const plan_mode_names[4] = {"ddp", "zero-1", "zero-2", "zero-3"};

json_t *plan_ranks_json(const report *r) {
    json_t *modes = json_array();
    for (int z = 0; z < 4; z++) {
        const snug_rank_mode *m = &r->modes[z];
        if (m->unbuilt) {
            json_array_append_new(modes, json_pack("{s:s, s:i, s:s}", "mode", plan_mode_names[z], "zero_stage", z,
                                                   "not_built", m->unbuilt));
            continue;
        }
        json_t *o = json_pack("{s:s, s:i, s:o, s:I, s:I, s:f, s:f}", "mode", plan_mode_names[z], "zero_stage", z,
                              "bytes", json_object(), "total", (json_int_t)m->total,
                              "host_total", (json_int_t)m->host_total, "need", m->need, "comm_bytes", m->comm_bytes);
        for (int c = 0; c < SNUG_MEM_NCAT; c++)
            json_object_set_new(json_object_get(o, "bytes"), snug_category_name((snug_category)c),
                                json_integer((json_int_t)m->bytes[c]));
        if (r->a->g) {
            json_object_set_new(o, "fits", json_boolean(m->fits));
            json_object_set_new(o, "comm_s", json_real(m->comm_s));
            json_object_set_new(o, "compute_s", json_real(m->compute_s));
            json_object_set_new(o, "step_s", json_real(m->step_s));
        }
        json_array_append_new(modes, o);
    }
    json_t *fewest = r->fewest_gpus ? json_pack("{s:i, s:s, s:f, s:f}", "gpus", r->fewest_gpus, "mode",
                                                plan_mode_names[r->fewest.stage], "need", r->fewest.need, "step_s",
                                                r->fewest.step_s)
                                    : json_null();
    return json_pack("{s:i, s:o, s:o, s:o}", "gpus", r->a->gpus, "modes", modes, "chosen",
                     r->mode_choice >= 0 ? json_string(plan_mode_names[r->mode_choice]) : json_null(), "fits_from",
                     fewest);
}
