/* plan_cmd.c: `snug plan` (see plan_cmd.h).
 *
 * Everything printed is computed first into one `report` (plan_report.c), then written as text (plan_text.c) or
 * JSON (plan_out.c), so the two cannot disagree. This file holds the flags and the command. */
#include "cli/plan_cmd.h"

#include "cli/options.h"
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

/* ---- flags ---- */

void snug_plan_usage(FILE *f) {
    fprintf(f, "\nflags of snug plan (besides the configuration keys below; --memory_budget SIZE fits that much memory\n"
               "instead of a GPU, and with auto_fit: true re-plans the run to fit it):\n");
    snug_plan_flags_help(f);
}

int snug_plan_args_take(snug_plan_args *a, int *argc, char **argv, snug_error *e) {
    SNUG_TRY(snug_plan_flags_take(a, argc, argv, e));
    a->g = NULL;
    if (a->gpu[0] && !(a->g = snug_gpu_find(a->gpu))) {
        char names[256];
        snug_gpu_list(names, sizeof names);
        return snug_fail(e, SNUG_EINPUT, "command line: unknown GPU '%.60s'; snug plan knows %s (or give "
                         "--memory_budget 40GB for any other size)", a->gpu, names);
    }
    if (a->g && a->backend == SNUG_BACKEND_CPU)
        return snug_fail(e, SNUG_EINPUT, "command line: --gpu plans for the cuda backend; drop --backend cpu, or "
                         "give --memory_budget for a CPU run");
    return 0;
}

/* Pipeline parallelism: every stage planned; the setup's plan becomes the heaviest stage's. */
static int plan_stages(report *r, snug_error *e) {
    snug_setup *p = r->p;
    int P = p->spec.pp, heavy = 0;
    r->pp_params = calloc((size_t)P, sizeof *r->pp_params);
    r->pp_total = calloc((size_t)P, sizeof *r->pp_total);
    if (!r->pp_params || !r->pp_total)
        return snug_fail(e, SNUG_ENOMEM, "out of memory planning the stages");
    for (int q = 0; q < P; q++) {
        snug_plan_spec s = p->spec;
        snug_plan pl;
        s.pp_stage = q;
        SNUG_TRY(snug_plan_run(&pl, &s, e));
        r->pp_params[q] = pl.nparams;
        r->pp_total[q] = (double)(pl.total + pl.host_total);
        heavy = r->pp_total[q] > r->pp_total[heavy] ? q : heavy;
    }
    p->pp_stage = p->spec.pp_stage = heavy;
    return snug_plan_run(&p->plan, &p->spec, e);
}

int snug_plan_cmd(const snug_run_config *o, const snug_plan_args *a, FILE *out, snug_error *e) {
    report *r = calloc(1, sizeof *r);
    snug_setup *p = calloc(1, sizeof *p);
    if (!r || !p) {
        free(r);
        free(p);
        return snug_fail(e, SNUG_ENOMEM, "out of memory planning");
    }
    r->o = o;
    r->a = a;
    r->p = p;
    p->plan_only = 1; /* a plan never needs the tokenizer to load */
    r->kind = a->backend == SNUG_BACKEND_CUDA || (a->backend == SNUG_BACKEND_AUTO && a->g) ? SNUG_DEVICE_CUDA
                                                                                          : SNUG_DEVICE_CPU;
    int rc = a->gpus > 1 && o->tensor_parallel_size > 1
                 ? snug_fail(e, SNUG_EINPUT, "command line: --gpus %d plans data parallelism over GPUs, which does "
                             "not run beside tensor parallelism on GPUs yet; with tensor_parallel_size %d the plan is "
                             "already one rank's: drop --gpus", a->gpus, o->tensor_parallel_size)
             : (a->gpus > 1 || r->kind == SNUG_DEVICE_CUDA) && o->pipeline_parallel_size > 1
                 ? snug_fail(e, SNUG_EINPUT, "pipeline_parallel_size %d: pipeline parallelism runs on CPU ranks only "
                             "for now; plan it with --backend cpu (and without --gpus)", o->pipeline_parallel_size)
                 : snug_setup_resolve(p, o, r->kind, e);
    if (!rc && p->spec.pp > 1)
        rc = plan_stages(r, e);
    if (!rc) { /* the data when it can be read: its size prices the run and the host memory */
        r->data_host_bytes = p->data_host_est;
        snug_error de = {0};
        if (p->c.ndatasets > 0 && snug_setup_load_data(p, &de) == 0) {
            r->data_loaded = 1;
            r->data_tokens = p->train.ntokens + p->val.ntokens;
            r->data_host_bytes = snug_data_host_bytes(r->data_tokens, p->train.nexamples + p->val.nexamples,
                                                      p->c.sequence_len);
        } else if (p->c.ndatasets > 0) {
            snprintf(r->data_error, sizeof r->data_error, "%.500s", de.msg);
        }
    }
    if (!rc)
        rc = plan_report_build(r, e);
    if (!rc && a->gpus > 1)
        rc = snug_plan_ranks(&p->spec, a->gpus, a->g, r->modes, &r->mode_choice, e);
    if (!rc && a->gpus > 1 && a->g && r->mode_choice < 0)
        rc = snug_plan_ranks_fewest(&p->spec, a->gpus, MAX_GPUS, a->g, &r->fewest_gpus, &r->fewest, e);
    if (!rc && a->svg[0])
        rc = plan_write_svg(r, e);
    if (!rc) {
        if (a->json) {
            json_t *j = plan_report_json(r);
            if (a->gpus > 1)
                json_object_set_new(j, "ranks", plan_ranks_json(r));
            if (a->svg[0]) {
                char png[1100];
                plan_png_path_of(a->svg, png, sizeof png);
                json_object_set_new(j, "svg", json_string(a->svg));
                json_object_set_new(j, "png", snug_svg_to_png(a->svg, png) == 0 ? json_string(png) : json_null());
            }
            json_dumpf(j, out, JSON_INDENT(2) | JSON_PRESERVE_ORDER);
            fputc('\n', out);
            json_decref(j);
        } else {
            plan_print_text(r, out);
            if (a->gpus > 1)
                plan_print_ranks(r, out);
            if (a->svg[0]) {
                char png[1100];
                plan_png_path_of(a->svg, png, sizeof png);
                if (snug_svg_to_png(a->svg, png) == 0)
                    fprintf(out, "\nchart: %s and %s\n", a->svg, png);
                else
                    fprintf(out, "\nchart: %s (no PNG: install rsvg-convert or ImageMagick to get one)\n", a->svg);
            }
        }
    }
    plan_report_free(r);
    snug_setup_free(p);
    free(r);
    free(p);
    return rc;
}
