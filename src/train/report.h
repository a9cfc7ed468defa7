/* report.h: what a run tells: its header, the progress line, the metrics log of a resumed run, and the memory it
 * measured beside its plan (memory.json). */
#ifndef SNUG_TRAIN_REPORT_H
#define SNUG_TRAIN_REPORT_H

#include <stddef.h>
#include <stdio.h>

#include "core/error.h"
#include "plan/gpus.h"
#include "train/loop.h"
#include "train/run.h"

/* Seconds on the monotonic clock. */
double snug_now_s(void);

/* The process's peak resident memory in bytes. */
double snug_peak_rss_bytes(void);

/* The CPU runtime overhead with the data as read (plan/gpus.c). */
void snug_rank_overhead(const snug_run *r, snug_overhead *ov);

/* memory.json (or a rank's memory.rankR.json) in output_dir: this process's plan beside its measured peaks. */
int snug_rank_memory_json(const snug_run *r, const char *file, const size_t *measured, snug_error *e);

/* One terminal line, redrawn in place: progress, the step's metrics (its loss as metrics.jsonl logs it, beside the
 * running mean the bar smooths it into), and the time left. */
void snug_progress_bar(FILE *out, int step, int total, double loss, double smoothed, double lr, double norm, double tps,
                       double rss, double elapsed);

/* The run's header: the model, the data, the batch, the schedule, the precision and the memory plan. */
void snug_report_header(snug_run *r, FILE *out, int total_steps, size_t batches_per_epoch);

/* metrics.jsonl of a resumed run: the lines of the steps up to `upto` kept, the file then opened to append. */
FILE *snug_reopen_metrics(const char *path, int upto, snug_error *e);

/* The end of a run that was not stopped (rc 0): on rank 0 the time taken, the memory measured beside the plan
 * (and memory.json) and the sample; on the other ranks that hold a part of the model, memory.rankR.json. */
int snug_report_end(snug_loop *l, int rc, snug_error *e);

#endif
