/* plan_report.h: the report of `snug plan`, private to src/cli: computed once (plan_report.c), then written as
 * text (plan_text.c) or as JSON and a picture (plan_out.c), so the forms cannot disagree. */
#ifndef SNUG_CLI_PLAN_REPORT_H
#define SNUG_CLI_PLAN_REPORT_H

#include <stdio.h>

#include <jansson.h>

#include "cli/plan_cmd.h"
#include "plan/autofit.h"
#include "plan/gpus.h"
#include "plan/ranks.h"
#include "train/setup.h"

#define MAXLEV 32
#define MAX_GPUS 256 /* the most GPUs the plan looks at when none of --gpus fits */

typedef struct gpu_row {
    const snug_gpu *g;
    double need;                 /* as configured, cuda overhead included */
    const snug_fit_point *best;  /* the cheapest setting that fits; NULL: none */
    int nalone;                  /* single levers that fit on their own */
    const snug_lever_effect *alone[MAXLEV];
    double tps, hours, price, usd; /* for `best`, when it exists */
} gpu_row;

/* A lever the search does not try, re-planned on its own */
typedef struct listed_row {
    char name[96];
    double saves, total, cost_pct;
    const char *why;
} listed_row;

typedef struct report {
    const snug_run_config *o;
    const snug_plan_args *a;
    snug_setup *p;
    snug_device_kind kind;
    snug_overhead ov;               /* of the configured plan on kind */
    double need;                    /* the configured plan's total on kind */
    snug_fit_space space;           /* lever settings on kind */
    snug_fit_space cuda;            /* the same on the cuda backend (the GPU table); == space when kind is cuda */
    int own_cuda;
    int data_loaded;                /* the datasets were read: data_tokens counts them */
    size_t data_tokens;
    size_t data_host_bytes;         /* measured when loaded, else estimated from the files' sizes */
    char data_error[512];           /* why they were not read ("" when loaded, or none is configured) */
    snug_lever_effect lev[MAXLEV];  /* on kind */
    int nlev;
    snug_lever_effect clev[MAXLEV]; /* on cuda */
    listed_row listed[8];           /* levers beside the search's, never chosen by auto_fit (text and JSON) */
    int nlisted;
    int nclev;
    gpu_row rows[16];
    int nrows;
    const char *target_name;        /* --gpu label, "memory_budget", or NULL */
    double target_bytes;
    const snug_fit_point *target_best;
    double run_tokens;
    char tokens_source[640];
    int cheapest;                   /* row index, -1 for none */
    char model_name[1100];
    /* the training methods side by side with the configured levers, on the cuda backend: full fine-tuning, LoRA
     * (the configured adapters, or r=16 on every linear module) */
    int nmethods;
    char method_name[3][320];
    double method_need[3];
    /* --gpus N: each rank's plan under DDP and each ZeRO stage (plan/ranks.h) */
    snug_rank_mode modes[4];
    int mode_choice;                /* the stage that fits at the least predicted step time; -1 none */
    int fewest_gpus;                /* none fits: the fewest GPUs over which one does (0: none up to MAX_GPUS) */
    snug_rank_mode fewest;          /* the mode chosen there */
    /* pipeline_parallel_size: each stage's parameters and planned bytes; the plan printed is the heaviest's */
    long long *pp_params;
    double *pp_total;
} report;

/* When each category is in use, and where the step's peak falls: plan_nwhen lines. */
extern const char *const plan_when_text[];
extern const int plan_nwhen;
/* "ddp", "zero-1", "zero-2", "zero-3" */
extern const char *const plan_mode_names[4];

/* plan_report.c: the report computed (the options, flags and setup set by the caller), and freed */
int plan_report_build(report *r, snug_error *e);
void plan_report_free(report *r);
/* text wrapped at width columns after lead, continued at indent */
void plan_wrap(FILE *f, const char *lead, int indent, const char *text, int width);
const char *plan_q4_code(const snug_levers *lv);
/* what category c holds in this run, for the table */
void plan_category_what(const report *r, int c, char *buf, size_t n);
void plan_fmtb(char *s, size_t n, double b);
void plan_fmt_hours(char *s, size_t n, double h);
double plan_cap_of(const snug_fit_space *s, const snug_fit_point *pt);
double plan_step_tokens(const snug_run_config *o);
/* the model's parameters (under tensor or pipeline parallelism the plan's are one rank's share) */
double plan_whole_params(const snug_setup *p);

/* plan_text.c */
void plan_print_text(const report *r, FILE *f);
void plan_print_ranks(const report *r, FILE *f);

/* plan_out.c */
json_t *plan_report_json(const report *r);
json_t *plan_ranks_json(const report *r);
int plan_write_svg(const report *r, snug_error *e);
void plan_png_path_of(const char *svg, char *png, size_t n);

#endif
