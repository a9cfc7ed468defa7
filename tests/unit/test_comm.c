/* test_comm.c: rank discovery from each launcher's environment (src/dist/launch.c), the single-process
 * communicator, the NCCL communicator's error where NCCL is missing, and the rank-order sum of the deterministic
 * all-reduce. The NCCL communicator's collectives run on a GPU in tests/unit/test_comm_nccl.c. The MPI communicator itself runs under
 * mpirun in tests/cli/test_ddp.sh. */
#include <stdlib.h>
#include <string.h>

#include "backend/backend.h"
#include "check.h"
#include "dist/comm.h"
#include "dist/zero.h"

static const char *vars[] = {"OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK", "PMI_RANK",
                             "PMI_SIZE", "MPI_LOCALRANKID", "SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID", "RANK",
                             "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"};

static void clear_env(void) {
    for (size_t i = 0; i < sizeof vars / sizeof *vars; i++)
        unsetenv(vars[i]);
}

int main(void) {
    snug_launch l;
    snug_error e = {0};
    clear_env();
    CHECK(snug_launch_detect(&l, &e) == 0 && l.size == 1 && l.rank == 0 && !strcmp(l.launcher, "none"));

    setenv("SLURM_PROCID", "2", 1), setenv("SLURM_NTASKS", "4", 1), setenv("SLURM_LOCALID", "0", 1);
    CHECK(snug_launch_detect(&l, &e) == 0 && l.rank == 2 && l.size == 4 && l.local_rank == 0 &&
          !strcmp(l.launcher, "srun"));
    /* mpirun inside a Slurm allocation: MPI's variables name this process */
    setenv("OMPI_COMM_WORLD_RANK", "1", 1), setenv("OMPI_COMM_WORLD_SIZE", "3", 1);
    CHECK(snug_launch_detect(&l, &e) == 0 && l.rank == 1 && l.size == 3 && l.local_rank == 1 &&
          !strcmp(l.launcher, "mpirun"));
    clear_env();

    setenv("RANK", "3", 1), setenv("WORLD_SIZE", "8", 1), setenv("LOCAL_RANK", "1", 1);
    setenv("MASTER_ADDR", "10.0.0.7", 1), setenv("MASTER_PORT", "29500", 1);
    CHECK(snug_launch_detect(&l, &e) == 0 && l.rank == 3 && l.size == 8 && l.local_rank == 1 &&
          !strcmp(l.launcher, "torchrun") && !strcmp(l.master_addr, "10.0.0.7") && l.master_port == 29500);
    snug_comm c;
    CHECKF(snug_comm_open(&c, &l, &e) == SNUG_EINPUT && strstr(e.msg, "mpirun -np 8"), "%s", e.msg);
    clear_env();

    /* malformed or inconsistent: refused naming the variable */
    setenv("PMI_RANK", "x1", 1), setenv("PMI_SIZE", "2", 1);
    CHECKF(snug_launch_detect(&l, &e) == SNUG_EINPUT && strstr(e.msg, "PMI_RANK=x1"), "%s", e.msg);
    setenv("PMI_RANK", "2", 1);
    CHECKF(snug_launch_detect(&l, &e) == SNUG_EINPUT && strstr(e.msg, "0..1"), "%s", e.msg);
    clear_env();
    setenv("WORLD_SIZE", "2", 1);
    CHECKF(snug_launch_detect(&l, &e) == SNUG_EINPUT && strstr(e.msg, "RANK is not"), "%s", e.msg);
    clear_env();

    /* one process: every collective leaves the data as it is */
    CHECK(snug_launch_detect(&l, &e) == 0 && snug_comm_open(&c, &l, &e) == 0 && c.size == 1 && c.rank == 0);
    float x[3] = {1.5f, -2, 3};
    int64_t k = 7;
    CHECK(c.allreduce_sum(&c, x, 3, SNUG_COMM_F32, &e) == 0 && x[0] == 1.5f && x[1] == -2 && x[2] == 3);
    CHECK(c.broadcast(&c, &k, 1, SNUG_COMM_I64, 0, &e) == 0 && k == 7 && c.barrier(&c, &e) == 0 && c.seq == 3);
    CHECK(c.broadcast(&c, &k, 1, SNUG_COMM_I64, 1, &e) != 0);
    size_t counts[1] = {3};
    CHECK(c.reduce_scatter_sum(&c, x, counts, SNUG_COMM_F32, &e) == 0 && c.allgather(&c, x, counts, SNUG_COMM_F32, &e)
          == 0 && x[0] == 1.5f && x[1] == -2 && x[2] == 3 && c.seq == 6);
    /* the host communicators complete every collective before returning: an overlapped one is the same call */
    CHECK(c.allreduce_sum(&c, x, 3, SNUG_COMM_F32 | SNUG_COMM_ASYNC, &e) == 0 && c.wait(&c, &e) == 0 && x[0] == 1.5f &&
          c.seq == 7);
    size_t three[3] = {4, 0, 5};
    CHECK(snug_comm_displ(three, 0) == 0 && snug_comm_displ(three, 2) == 4 && snug_comm_displ(three, 3) == 9);
    snug_comm_close(&c);

    /* NCCL is opened when a communicator needs it: where the library is missing (SNUG_NCCL names a file that does not
     * exist) the wrap fails with one error naming the library and the fix, before it touches the backend, and leaves
     * the host communicator as it was; a build without CUDA says so */
    snug_comm_self_init(&c);
    snug_backend fake = {.name = "cuda", .caps = SNUG_CAP_CUDA_MEMORY};
    setenv("SNUG_NCCL", "/nonexistent/libnccl.so.2", 1);
    int wrc = snug_comm_nccl_wrap(&c, &fake, &e);
    if (snug_comm_nccl_available())
        CHECKF(wrc == SNUG_EINPUT && strstr(e.msg, "/nonexistent/libnccl.so.2") && strstr(e.msg, "SNUG_NCCL=") &&
               strstr(e.msg, "install NCCL"), "%d %s", wrc, e.msg);
    else
        CHECKF(wrc == SNUG_EINPUT && strstr(e.msg, "without CUDA"), "%d %s", wrc, e.msg);
    CHECK(!strcmp(c.name, "self") && c.size == 1 && c.allreduce_sum(&c, x, 3, SNUG_COMM_F32, &e) == 0);
    unsetenv("SNUG_NCCL");
    snug_backend cpu_be = {.name = "cpu", .caps = SNUG_CAP_HOST_THREADS};
    CHECK(!snug_comm_nccl_available() || snug_comm_nccl_wrap(&c, &cpu_be, &e) == SNUG_EINTERNAL);
    snug_comm_close(&c);
    /* the host flag is not a type: sizes and the rank-order sum ignore it */
    CHECK(snug_comm_dtype_size(SNUG_COMM_F64 | SNUG_COMM_HOST) == 8 && snug_comm_dtype_size(SNUG_COMM_U16 |
          SNUG_COMM_HOST) == 2 && snug_comm_type(SNUG_COMM_F32 | SNUG_COMM_HOST) == SNUG_COMM_F32 &&
          snug_comm_type(SNUG_COMM_U16 | SNUG_COMM_HOST | SNUG_COMM_ASYNC) == SNUG_COMM_U16 &&
          snug_comm_dtype_size(SNUG_COMM_F32 | SNUG_COMM_ASYNC) == 4);

    /* the rank-order sum: ((a0 + a1) + a2), not a0 + (a1 + a2) */
    float all[6] = {1e8f, 1, -1e8f, 1, 1, 1}, out[2];
    snug_comm_sum_in_order(out, all, 3, 2, SNUG_COMM_F32);
    CHECKF(out[0] == 1.0f && out[1] == 3.0f, "%g %g", out[0], out[1]);
    double dall[4] = {0.1, 0.2, 0.3, 0.4}, dout[2];
    snug_comm_sum_in_order(dout, dall, 2, 2, SNUG_COMM_F64);
    CHECK(dout[0] == 0.1 + 0.3 && dout[1] == 0.2 + 0.4);

    /* ZeRO's shards (dist/zero.c): they tile the range, every edge is a tensor's start plus whole blocks, and each
     * shard is within a block of total / size */
    size_t starts[5] = {0, 100, 1124, 5000, 5003}, total = 9001;
    for (int size = 1; size <= 7; size++) {
        size_t counts[7], sum = 0;
        snug_zero_shards(starts, 5, total, size, 256, counts);
        for (int r = 0; r < size; r++) {
            size_t lo = sum;
            sum += counts[r];
            int on_block = 0;
            for (int i = 0; i < 5; i++)
                on_block |= lo >= starts[i] && (i == 4 || lo < starts[i + 1]) && (lo - starts[i]) % 256 == 0;
            CHECKF(on_block, "size %d: rank %d starts at %zu, inside a block", size, r, lo);
            double dev = (double)counts[r] - (double)total / size;
            CHECKF(dev > -257.0 && dev < 257.0, "size %d: rank %d holds %zu of %zu", size, r, counts[r], total);
        }
        CHECKF(sum == total, "size %d: the shards hold %zu of %zu", size, sum, total);
    }
    return check_finish("test_comm");
}
