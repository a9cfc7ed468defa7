/* sched_driver.c: snug's learning-rate schedules (src/optim/schedule.c) for test_sched_parity.py.
 *
 *   sched_driver KIND BASE_LR WARMUP TOTAL MIN_RATIO NUM_CYCLES POWER LR_END TIMESCALE DECAY STABLE WARMUP_TYPE
 *                DECAY_TYPE WSD_MIN_RATIO WARMUP_LR_RATE QUADRATIC CONSTANT_RATIO
 * prints snug_lr_at for steps 0 .. TOTAL + 1, one per line, as the 16 hex digits of the double's bits. KIND is the
 * snug_sched value; NUM_CYCLES < 0, STABLE < 0 and TIMESCALE 0 mean the defaults; the WSD shapes 0 linear, 1 cosine,
 * 2 1-sqrt; WARMUP_LR_RATE < 0: none. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "optim/optim.h"

int main(int argc, char **argv) {
    if (argc != 18) {
        fprintf(stderr, "sched_driver: 17 arguments, got %d\n", argc - 1);
        return 2;
    }
    snug_sched_params p;
    snug_sched_params_default(&p);
    int kind = atoi(argv[1]), warmup = atoi(argv[3]), total = atoi(argv[4]);
    double base = strtod(argv[2], NULL), min_ratio = strtod(argv[5], NULL);
    p.num_cycles = strtod(argv[6], NULL);
    p.power = strtod(argv[7], NULL);
    p.lr_end = strtod(argv[8], NULL);
    p.timescale = atoi(argv[9]);
    p.wsd_decay = atoi(argv[10]);
    p.wsd_stable = atoi(argv[11]);
    p.wsd_warmup = (snug_wsd_shape)atoi(argv[12]);
    p.wsd_decay_type = (snug_wsd_shape)atoi(argv[13]);
    p.wsd_min_ratio = strtod(argv[14], NULL);
    p.warmup_lr_rate = strtod(argv[15], NULL);
    p.quadratic_warmup = atoi(argv[16]);
    p.constant_ratio = strtod(argv[17], NULL);
    for (int s = 0; s <= total + 1; s++) {
        double lr = snug_lr_at((snug_sched)kind, base, s, warmup, total, min_ratio, &p);
        uint64_t u;
        memcpy(&u, &lr, 8);
        printf("%016llx\n", (unsigned long long)u);
    }
    return 0;
}
