/* plateau_driver.c: reduce_lr_on_plateau's state machine (src/optim/schedule.c) for test_plateau_parity.py.
 *
 *   plateau_driver BASE_LR MAX ABS FACTOR PATIENCE THRESHOLD COOLDOWN MIN_LR EPS < metrics
 * reads one metric per line (the 16 hex digits of a double's bits), steps the plateau with each and prints the
 * learning rate after it, as the 16 hex digits of the double's bits. MAX: mode max; ABS: threshold_mode abs. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "optim/optim.h"

int main(int argc, char **argv) {
    if (argc != 10) {
        fprintf(stderr, "plateau_driver: 9 arguments, got %d\n", argc - 1);
        return 2;
    }
    snug_sched_params p;
    snug_sched_params_default(&p);
    double base = strtod(argv[1], NULL);
    p.plat_max = atoi(argv[2]);
    p.plat_abs = atoi(argv[3]);
    p.plat_factor = strtod(argv[4], NULL);
    p.plat_patience = atoi(argv[5]);
    p.plat_threshold = strtod(argv[6], NULL);
    p.plat_cooldown = atoi(argv[7]);
    p.plat_min_lr = strtod(argv[8], NULL);
    p.plat_eps = strtod(argv[9], NULL);
    snug_plateau s;
    snug_plateau_init(&s, base, &p);
    unsigned long long u;
    while (scanf("%llx", &u) == 1) {
        double metric;
        uint64_t bits = (uint64_t)u;
        memcpy(&metric, &bits, 8);
        snug_plateau_step(&s, metric, &p);
        memcpy(&bits, &s.lr, 8);
        printf("%016llx\n", (unsigned long long)bits);
    }
    return 0;
}
