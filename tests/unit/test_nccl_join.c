/* test_nccl_join.c: joining the NCCL communicator ends within dist_timeout whatever NCCL does.
 *
 * ncclCommInitRank waits for every rank; one that never arrives would hold the others forever. Against a stand-in
 * NCCL (fake_nccl.c, opened through SNUG_NCCL) whose join never returns, snug_comm_nccl_wrap fails within the
 * timeout (1 s here, checked under 30 s) naming dist_timeout, and leaves the host communicator as it was; against
 * one whose join fails, the error names ncclCommInitRank and NCCL's reason; against one whose join succeeds, the
 * communicator is made. Each case runs in a child process: NCCL is opened once per process, and the abandoned
 * join's thread stays blocked in it. Skipped (77) without a CUDA build or a visible GPU. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "backend/backend.h"
#include "check.h"
#include "dist/comm.h"

#ifdef SNUG_HAVE_CUDA
#include "backend/cuda/backend_cuda.h"

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* In a child: the join under SNUG_FAKE_NCCL_INIT=mode; its verdict (0 as expected) is the exit status. */
static int join_case(const char *mode, int want_ok, const char *want, double *took) {
    fflush(stdout);
    double t0 = now_s();
    pid_t pid = fork();
    if (pid == 0) {
        setenv("SNUG_NCCL", SNUG_FAKE_NCCL, 1);
        setenv("SNUG_FAKE_NCCL_INIT", mode, 1);
        snug_error e = {0};
        snug_backend *be = snug_backend_cuda_create(0, &e);
        if (!be)
            _exit(3);
        snug_comm c;
        snug_comm_self_init(&c);
        c.timeout_s = 1;
        int rc = snug_comm_nccl_wrap(&c, be, &e);
        int ok = want_ok ? rc == 0 && !strcmp(c.name, "nccl")
                         : rc != 0 && !strcmp(c.name, "self") && strstr(e.msg, want) != NULL;
        if (!ok)
            fprintf(stderr, "join %s: rc %d, communicator %s: %s\n", mode, rc, c.name, e.msg);
        _exit(ok ? 0 : 1); /* an abandoned join's thread would keep a normal exit waiting in NCCL's teardown */
    }
    int status = 0;
    while (waitpid(pid, &status, 0) < 0)
        ;
    *took = now_s() - t0;
    return WIFEXITED(status) ? WEXITSTATUS(status) : 2;
}

int main(void) {
    if (snug_cuda_device_count() < 1) {
        printf("test_nccl_join: skipped: no CUDA GPU visible\n");
        return 77;
    }
    double t;
    int r = join_case("hang", 0, "did not complete in 1 s (dist_timeout)", &t);
    CHECKF(r == 0 && t < 30, "a join that never returns: verdict %d after %.1f s", r, t);
    printf("  a join that never returns failed after %.2f s (dist_timeout 1 s)\n", t);
    r = join_case("fail", 0, "ncclCommInitRank (rank 0 of 1, GPU 0) failed: unhandled system error (fake)", &t);
    CHECKF(r == 0, "a join that fails: verdict %d", r);
    r = join_case("ok", 1, "", &t);
    CHECKF(r == 0, "a join that succeeds: verdict %d", r);
    return check_finish("test_nccl_join");
}
#else
int main(void) {
    printf("test_nccl_join: skipped: snug built without CUDA\n");
    return 77;
}
#endif
