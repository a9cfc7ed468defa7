/* launch.c: which rank of how many this process is, as its launcher's environment says (see comm.h). Read before any
 * communication library starts, so `snug train` knows whether it runs alone and which rank alone prints. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dist/comm.h"

/* *v <- the integer in variable name; 0 if unset, 1 if set, -1 (with e) if not an integer >= 0 */
static int env_int(const char *name, int *v, snug_error *e) {
    const char *s = getenv(name);
    if (!s || !*s)
        return 0;
    char *end;
    errno = 0;
    long x = strtol(s, &end, 10);
    if (errno || *end || x < 0 || x > 1 << 24) {
        snug_fail(e, SNUG_EINPUT, "environment variable %s=%s: not a rank or a count; unset it or fix the launch",
                  name, s);
        return -1;
    }
    *v = (int)x;
    return 1;
}

/* one launcher's variables: rank, size and (optional) local rank; all present, or none */
static int try_launcher(snug_launch *l, const char *launcher, const char *rank, const char *size, const char *local,
                        snug_error *e) {
    int r = 0, n = 0, lr = 0;
    int hr = env_int(rank, &r, e), hn = hr < 0 ? -1 : env_int(size, &n, e);
    int hl = hn < 0 || !local ? 0 : env_int(local, &lr, e);
    if (hr < 0 || hn < 0 || hl < 0)
        return -1;
    if (!hr && !hn)
        return 0;
    if (!hr || !hn) {
        snug_fail(e, SNUG_EINPUT, "%s is set but %s is not (a %s launch needs both); unset it or fix the launch",
                  hr ? rank : size, hr ? size : rank, launcher);
        return -1;
    }
    if (n < 1 || r >= n) {
        snug_fail(e, SNUG_EINPUT, "%s=%d with %s=%d: the rank must lie in 0..%d", rank, r, size, n, n - 1);
        return -1;
    }
    l->rank = r, l->size = n, l->local_rank = hl ? lr : r, l->launcher = launcher;
    return 1;
}

int snug_launch_detect(snug_launch *l, snug_error *e) {
    memset(l, 0, sizeof *l);
    l->size = 1, l->launcher = "none";
    /* the MPI launchers first: under mpirun inside a Slurm allocation both sets exist and MPI's is the one that
     * names this process */
    int found = try_launcher(l, "mpirun", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE",
                             "OMPI_COMM_WORLD_LOCAL_RANK", e);
    if (!found)
        found = try_launcher(l, "pmi", "PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID", e);
    if (!found)
        found = try_launcher(l, "srun", "SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID", e);
    if (!found)
        found = try_launcher(l, "torchrun", "RANK", "WORLD_SIZE", "LOCAL_RANK", e);
    if (found < 0)
        return SNUG_EINPUT;
    if (found && !strcmp(l->launcher, "torchrun") && env_int("LOCAL_WORLD_SIZE", &l->local_size, e) < 0)
        return SNUG_EINPUT;
    const char *addr = getenv("MASTER_ADDR");
    if (addr)
        snprintf(l->master_addr, sizeof l->master_addr, "%s", addr);
    int port = 0;
    if (env_int("MASTER_PORT", &port, e) < 0)
        return SNUG_EINPUT;
    l->master_port = port;
    return 0;
}
