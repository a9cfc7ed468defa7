/* trainer.c: one training run end to end (see trainer.h): the run opened (run.c), its loop over one state (loop.c),
 * the final save (save.c) and report (report.c), the run closed. */
#include "train/trainer.h"

#include "train/loop.h"
#include "train/report.h"
#include "train/run.h"
#include "train/save.h"

int snug_train(const snug_run_config *config, FILE *out, snug_error *e) {
    snug_run r;
    SNUG_TRY(snug_run_open(&r, config, out, e));
    snug_loop l;
    snug_step_status s = snug_loop_open(&l, &r, e);
    while (s == SNUG_STEP_NEXT)
        s = snug_loop_step(&l, e);
    int rc = snug_loop_end(&l, e);
    rc = snug_save_final(&l, rc, e);
    rc = snug_report_end(&l, rc, e);
    snug_loop_free(&l);
    return snug_run_close(&r, rc, e);
}
