/* test_comm_nccl.c: the NCCL communicator (src/dist/comm_nccl.c) at one rank on a GPU, against the single-process
 * communicator on the same data.
 *
 * Every collective with every type it accepts (float32, float64 and int64 sums; 16-bit values moved), over counts that
 * cross the deterministic mode's 1 Mi-element pieces and one that is not a multiple of anything, deterministic off and
 * on, with the debug signature check off and on, and with a timeout (the watch thread): each result, copied back from
 * the device, is exactly comm_self's (at one rank every collective is the identity, which comm_self computes by
 * doing nothing; NCCL's path runs whole: its stream, the events, the grouped per-owner collectives, the gather and the
 * rank-order kernel). Then the ordering: a buffer scaled on the backend's compute stream, all-reduced, and scaled
 * again comes back scaled twice (the collective waits for the first op, the second for the collective), which a
 * missing event breaks on a buffer this large. The host route (SNUG_COMM_HOST) leaves a host buffer as comm_self
 * does, a host pointer passed without the flag is refused naming the collective, 16-bit sums are refused, and the
 * sequence number counts every collective of both routes.
 *
 * Without a CUDA build or a visible GPU the test prints why and exits 77, which ctest reports as skipped;
 * scripts/gpu-check.sh runs it on a GPU machine. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backend.h"
#include "check.h"
#include "core/rng.h"
#include "dist/comm.h"

#ifdef SNUG_HAVE_CUDA
#include "backend/cuda/backend_cuda.h"

static uint64_t rng_state = 0x243F6A8885A308D3ull;

/* bytes of random bits, with float32 and float64 values kept finite (every pattern compared bit for bit) */
static void *random_data(size_t n, snug_comm_dtype dt) {
    size_t es = snug_comm_dtype_size(dt);
    unsigned char *p = malloc(n * es + 8);
    for (size_t i = 0; i < n * es; i += 8) {
        uint64_t r = snug_splitmix64(&rng_state);
        memcpy(p + i, &r, 8);
    }
    for (size_t i = 0; i < n; i++) {
        if (dt == SNUG_COMM_F32) {
            float v = (float)((double)(snug_splitmix64(&rng_state) >> 11) * 0x1.0p-53 * 200.0 - 100.0);
            memcpy(p + i * 4, &v, 4);
        } else if (dt == SNUG_COMM_F64) {
            double v = (double)(snug_splitmix64(&rng_state) >> 11) * 0x1.0p-53 * 2e6 - 1e6;
            memcpy(p + i * 8, &v, 8);
        }
    }
    return p;
}

static const char *names[] = {"float32", "float64", "int64", "16-bit"};

/* One collective (kind 0 all-reduce, 1 broadcast, 3 reduce-scatter, 4 all-gather) on n random elements of dt through
 * comm_self on the host and through the NCCL communicator on the device: the same bytes. */
static void same_as_self(snug_comm *nc, snug_backend *be, int kind, size_t n, snug_comm_dtype dt) {
    snug_comm self;
    snug_comm_self_init(&self);
    self.deterministic = nc->deterministic;
    size_t bytes = n * snug_comm_dtype_size(dt), counts[1] = {n};
    void *ref = random_data(n, dt), *got = malloc(bytes + 1), *dev = be->alloc(be, bytes);
    snug_error e = {0}, se = {0};
    be->to_device(be, dev, ref, bytes);
    int rc, src;
    if (kind == 0) {
        src = self.allreduce_sum(&self, ref, n, dt, &se);
        rc = nc->allreduce_sum(nc, dev, n, dt, &e);
    } else if (kind == 1) {
        src = self.broadcast(&self, ref, n, dt, 0, &se);
        rc = nc->broadcast(nc, dev, n, dt, 0, &e);
    } else if (kind == 3) {
        src = self.reduce_scatter_sum(&self, ref, counts, dt, &se);
        rc = nc->reduce_scatter_sum(nc, dev, counts, dt, &e);
    } else {
        src = self.allgather(&self, ref, counts, dt, &se);
        rc = nc->allgather(nc, dev, counts, dt, &e);
    }
    be->to_host(be, got, dev, bytes);
    snug_error ce = {0};
    CHECKF(src == 0 && rc == 0 && be->check(be, &ce) == 0 && !memcmp(got, ref, bytes),
           "kind %d of %zu %s (deterministic %d, check %d): rc %d (%s), backend %s", kind, n, names[dt],
           nc->deterministic, nc->check, rc, e.msg, ce.msg);
    be->free(be, dev);
    free(ref);
    free(got);
}

int main(void) {
    snug_error e = {0};
    if (snug_cuda_device_count() < 1) {
        printf("test_comm_nccl: skipped: no CUDA GPU visible\n");
        return 77;
    }
    snug_backend *be = snug_backend_cuda_create(0, &e);
    if (!be) {
        printf("test_comm_nccl: skipped: %s\n", e.msg);
        return 77;
    }
    snug_comm c;
    snug_comm_self_init(&c);
    int rc = snug_comm_nccl_wrap(&c, be, &e);
    CHECKF(rc == 0 && !strcmp(c.name, "nccl") && c.size == 1 && c.rank == 0, "%d %s", rc, e.msg);
    if (rc) {
        be->destroy(be);
        return check_finish("test_comm_nccl");
    }
    uint64_t seq = c.seq;
    int issued = 0;
    const size_t sizes[] = {1, 1000003, ((size_t)1 << 20) + 12345}; /* one element, odd, across two pieces */
    for (int det = 0; det <= 1; det++)
        for (int chk = 0; chk <= 1; chk++) {
            c.deterministic = det;
            c.check = chk;
            c.timeout_s = chk ? 60 : 0; /* the watch thread runs beside the checked passes */
            for (size_t s = 0; s < sizeof sizes / sizeof *sizes; s++)
                for (int dt = SNUG_COMM_F32; dt <= SNUG_COMM_U16; dt++) {
                    if (dt != SNUG_COMM_U16) { /* 16-bit values are moved, never summed */
                        same_as_self(&c, be, 0, sizes[s], (snug_comm_dtype)dt);
                        same_as_self(&c, be, 3, sizes[s], (snug_comm_dtype)dt);
                        issued += 2;
                    }
                    same_as_self(&c, be, 1, sizes[s], (snug_comm_dtype)dt);
                    same_as_self(&c, be, 4, sizes[s], (snug_comm_dtype)dt);
                    issued += 2;
                }
            CHECKF(c.barrier(&c, &e) == 0, "barrier: %s", e.msg);
            issued++;
        }
    c.check = 1;
    c.deterministic = 1;

    /* the ordering against the compute stream, on 16 Mi floats: x * 2 (compute), the all-reduce (its stream: the
     * gather reads x, the rank-order kernel writes it), x * 4 (compute) */
    size_t n = (size_t)1 << 24;
    float *x = random_data(n, SNUG_COMM_F32), *y = malloc(n * sizeof *y);
    float *dx = be->alloc(be, n * sizeof *dx);
    be->to_device(be, dx, x, n * sizeof *x);
    for (int det = 0; det <= 1; det++) {
        c.deterministic = det;
        be->scale(be, dx, 2.0f, n);
        rc = c.allreduce_sum(&c, dx, n, SNUG_COMM_F32, &e);
        be->scale(be, dx, 4.0f, n);
        issued++;
        be->to_host(be, y, dx, n * sizeof *y);
        size_t bad = 0;
        for (size_t i = 0; i < n; i++) {
            x[i] *= 8.0f; /* exact: powers of two */
            bad += memcmp(&x[i], &y[i], sizeof *y) != 0;
        }
        CHECKF(rc == 0 && bad == 0, "ordering (deterministic %d): rc %d (%s), %zu of %zu elements differ", det, rc,
               e.msg, bad, n);
    }
    /* SNUG_COMM_ASYNC: the compute stream goes on beside the collective (x * 2 on a second buffer) and waits for it
     * only at `wait`, so the x * 4 after the wait reads the sum */
    float *dz = be->alloc(be, n * sizeof *dz);
    be->to_device(be, dz, x, n * sizeof *x);
    for (int det = 0; det <= 1; det++) {
        c.deterministic = det;
        be->scale(be, dx, 2.0f, n);
        rc = c.allreduce_sum(&c, dx, n, SNUG_COMM_F32 | SNUG_COMM_ASYNC, &e);
        be->scale(be, dz, 2.0f, n);
        int wrc = rc ? rc : c.wait(&c, &e);
        be->scale(be, dx, 4.0f, n);
        issued++;
        be->to_host(be, y, dx, n * sizeof *y);
        size_t bad = 0;
        for (size_t i = 0; i < n; i++) {
            x[i] *= 8.0f;
            bad += memcmp(&x[i], &y[i], sizeof *y) != 0;
        }
        CHECKF(rc == 0 && wrc == 0 && bad == 0, "asynchronous (deterministic %d): rc %d/%d (%s), %zu of %zu elements "
               "differ", det, rc, wrc, e.msg, bad, n);
    }
    CHECKF(c.wait(&c, &e) == 0, "a wait with nothing outstanding: %s", e.msg);
    be->free(be, dz);
    be->free(be, dx);
    free(x);
    free(y);

    /* the host route: host buffers go to the host communicator (comm_self: left as they are) */
    double loss[3] = {1.25, -2.5, 1e300};
    int64_t flag = 7;
    rc = c.allreduce_sum(&c, loss, 3, SNUG_COMM_F64 | SNUG_COMM_HOST, &e);
    CHECKF(rc == 0 && loss[0] == 1.25 && loss[1] == -2.5 && loss[2] == 1e300, "host all-reduce: %s", e.msg);
    rc = c.broadcast(&c, &flag, 1, SNUG_COMM_I64 | SNUG_COMM_HOST, 0, &e);
    size_t three[1] = {3};
    int rc2 = c.allgather(&c, loss, three, SNUG_COMM_F64 | SNUG_COMM_HOST, &e);
    int rc3 = c.reduce_scatter_sum(&c, loss, three, SNUG_COMM_F64 | SNUG_COMM_HOST, &e);
    CHECKF(rc == 0 && rc2 == 0 && rc3 == 0 && flag == 7 && loss[0] == 1.25, "host route: %s", e.msg);
    issued += 4;
    /* misrouted: a host pointer without the flag, refused naming the collective; a 16-bit sum; a root out of range */
    rc = c.allreduce_sum(&c, loss, 3, SNUG_COMM_F64, &e);
    CHECKF(rc == SNUG_EINTERNAL && strstr(e.msg, "not device memory") && strstr(e.msg, "SNUG_COMM_HOST"), "%d %s", rc,
           e.msg);
    uint16_t *d16 = be->alloc(be, 64);
    CHECK(c.allreduce_sum(&c, d16, 8, SNUG_COMM_U16, &e) == SNUG_EINTERNAL && strstr(e.msg, "16-bit"));
    CHECK(c.broadcast(&c, d16, 8, SNUG_COMM_U16, 1, &e) == SNUG_EINTERNAL);
    issued += 2; /* the refused 16-bit sum is refused before it counts */
    be->free(be, d16);
    CHECKF(c.seq == seq + (uint64_t)issued, "sequence %llu, expected %llu", (unsigned long long)c.seq,
           (unsigned long long)(seq + (uint64_t)issued));
    /* everything still works after refused calls (they never reach NCCL) */
    same_as_self(&c, be, 0, 4097, SNUG_COMM_F32);
    snug_comm_close(&c);
    CHECK(c.ctx == NULL && c.free == NULL);
    be->destroy(be);
    return check_finish("test_comm_nccl");
}

#else
int main(void) {
    printf("test_comm_nccl: skipped: snug built without CUDA\n");
    return 77;
}
#endif
