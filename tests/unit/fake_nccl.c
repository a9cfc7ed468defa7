/* fake_nccl.c: a stand-in for libnccl.so.2 with the entry points comm_nccl.c looks up, for test_nccl_join (loaded
 * through SNUG_NCCL). Its ncclCommInitRank does what SNUG_FAKE_NCCL_INIT says: "hang" waits forever, as a join
 * whose other ranks never arrive does; "fail" returns ncclSystemError. Every other call succeeds doing nothing. */
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

typedef int res;
typedef void *comm_t;
typedef struct { char internal[128]; } id_t_;

res ncclGetVersion(int *v) { *v = 23007; return 0; }
res ncclGetUniqueId(id_t_ *id) { memset(id, 7, sizeof *id); return 0; }
res ncclCommInitRank(comm_t *c, int n, id_t_ id, int r) {
    (void)n, (void)id, (void)r;
    const char *m = getenv("SNUG_FAKE_NCCL_INIT");
    if (m && !strcmp(m, "fail"))
        return 2;
    if (m && !strcmp(m, "hang"))
        for (;;)
            sleep(1);
    static int one;
    *c = &one;
    return 0;
}
res ncclCommDestroy(comm_t c) { (void)c; return 0; }
res ncclCommAbort(comm_t c) { (void)c; return 0; }
res ncclCommGetAsyncError(comm_t c, res *e) { (void)c; *e = 0; return 0; }
const char *ncclGetErrorString(res r) { return r == 2 ? "unhandled system error (fake)" : "fake"; }
const char *ncclGetLastError(comm_t c) { (void)c; return ""; }
res ncclAllReduce(const void *s, void *r, size_t n, int dt, int op, comm_t c, void *st) {
    (void)s, (void)r, (void)n, (void)dt, (void)op, (void)c, (void)st;
    return 0;
}
res ncclBroadcast(const void *s, void *r, size_t n, int dt, int root, comm_t c, void *st) {
    (void)s, (void)r, (void)n, (void)dt, (void)root, (void)c, (void)st;
    return 0;
}
res ncclReduce(const void *s, void *r, size_t n, int dt, int op, int root, comm_t c, void *st) {
    (void)s, (void)r, (void)n, (void)dt, (void)op, (void)root, (void)c, (void)st;
    return 0;
}
res ncclAllGather(const void *s, void *r, size_t n, int dt, comm_t c, void *st) {
    (void)s, (void)r, (void)n, (void)dt, (void)c, (void)st;
    return 0;
}
res ncclSend(const void *s, size_t n, int dt, int peer, comm_t c, void *st) {
    (void)s, (void)n, (void)dt, (void)peer, (void)c, (void)st;
    return 0;
}
res ncclRecv(void *r, size_t n, int dt, int peer, comm_t c, void *st) {
    (void)r, (void)n, (void)dt, (void)peer, (void)c, (void)st;
    return 0;
}
res ncclGroupStart(void) { return 0; }
res ncclGroupEnd(void) { return 0; }
