/* comm_nccl_lib.c: NCCL as a library (see comm_nccl_lib.h): opened at run time (dlopen of libnccl.so.2, or the file
 * SNUG_NCCL names; its entry points looked up once), so a CUDA build of snug starts, and trains on the CPU or on one
 * GPU, where NCCL is not installed, and only a run that needs it fails, naming the library and the fix; and a rank's
 * join of the communicator, which must not wait forever for a rank that died. */
#include "dist/comm_nccl_lib.h"

#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

nccl_api snug_nccl;        /* filled once by snug_nccl_load; never unloaded */
static int nccl_loaded;    /* 1: loaded (a failure is not kept: the next communicator tries again) */
static char nccl_why[1024];
static char nccl_path[512];
static int nccl_version;


int snug_nccl_load(snug_error *e) {
    if (nccl_loaded)
        return 0;
    const char *env = getenv("SNUG_NCCL");
    const char *names[3] = {env && *env ? env : "libnccl.so.2", NULL, NULL};
#ifdef SNUG_NCCL_PATH
    if (!(env && *env))
        names[1] = SNUG_NCCL_PATH;
#endif
    void *h = NULL;
    char tried[768] = "";
    for (int i = 0; i < 3 && names[i] && !h; i++) {
        h = dlopen(names[i], RTLD_NOW | RTLD_LOCAL);
        if (h)
            snprintf(nccl_path, sizeof nccl_path, "%s", names[i]);
        else if (!tried[0])
            snprintf(tried, sizeof tried, "%s", dlerror());
    }
    if (!h) {
        snprintf(nccl_why, sizeof nccl_why, "CUDA ranks talk through NCCL, but %s cannot be opened (%s); install "
                 "NCCL 2.7 or newer (Debian/Ubuntu: libnccl2; pip: nvidia-nccl-cu12) where the loader finds it "
                 "(LD_LIBRARY_PATH), or name the file with SNUG_NCCL=/path/libnccl.so.2", names[0], tried);
        return snug_fail(e, SNUG_EINPUT, "%s", nccl_why);
    }
    struct { void **slot; const char *name; } syms[] = {
        {(void **)&snug_nccl.GetVersion, "ncclGetVersion"},
        {(void **)&snug_nccl.GetUniqueId, "ncclGetUniqueId"},
        {(void **)&snug_nccl.CommInitRank, "ncclCommInitRank"},
        {(void **)&snug_nccl.CommDestroy, "ncclCommDestroy"},
        {(void **)&snug_nccl.CommAbort, "ncclCommAbort"},
        {(void **)&snug_nccl.CommGetAsyncError, "ncclCommGetAsyncError"},
        {(void **)&snug_nccl.GetErrorString, "ncclGetErrorString"},
        {(void **)&snug_nccl.GetLastError, "ncclGetLastError"},
        {(void **)&snug_nccl.AllReduce, "ncclAllReduce"},
        {(void **)&snug_nccl.Broadcast, "ncclBroadcast"},
        {(void **)&snug_nccl.Reduce, "ncclReduce"},
        {(void **)&snug_nccl.AllGather, "ncclAllGather"},
        {(void **)&snug_nccl.Send, "ncclSend"},
        {(void **)&snug_nccl.Recv, "ncclRecv"},
        {(void **)&snug_nccl.GroupStart, "ncclGroupStart"},
        {(void **)&snug_nccl.GroupEnd, "ncclGroupEnd"},
    };
    for (size_t i = 0; i < sizeof syms / sizeof *syms; i++)
        if (!(*syms[i].slot = dlsym(h, syms[i].name))) {
            snprintf(nccl_why, sizeof nccl_why, "%s has no %s: snug needs NCCL 2.7 or newer (ncclGetLastError: "
                     "2.13); install a newer one, or name it with SNUG_NCCL=/path/libnccl.so.2", nccl_path,
                     syms[i].name);
            return snug_fail(e, SNUG_EINPUT, "%s", nccl_why);
        }
    snug_nccl.GetVersion(&nccl_version);
    nccl_loaded = 1;
    return 0;
}

/* ------------------------------------------------------------------------------------------------ joining */

/* ncclCommInitRank waits for every rank to join, so a rank that died after the unique id's broadcast, or one that
 * cannot reach the others, would hold the rest there forever. The join runs on a thread of its own (on the rank's
 * GPU: the current device is per thread) while the caller waits at most dist_timeout for it. A join that does not
 * return in time is left behind, its state owned by the thread (it frees it if NCCL ever returns), and the rank fails
 * naming the timeout: nothing can abort a communicator NCCL has not handed back yet. */
typedef struct nccl_join {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int done, abandoned; /* under mu */
    int device, nranks, rank;
    nccl_id id;
    nccl_comm_t comm;
    nccl_result r;
    cudaError_t cerr;
} nccl_join;

static void join_free(nccl_join *j) {
    pthread_cond_destroy(&j->cv);
    pthread_mutex_destroy(&j->mu);
    free(j);
}

static void *join_thread(void *arg) {
    nccl_join *j = arg;
    nccl_comm_t comm = NULL;
    nccl_result r = NCCL_OK;
    cudaError_t cerr = cudaSetDevice(j->device);
    if (cerr == cudaSuccess)
        r = snug_nccl.CommInitRank(&comm, j->nranks, j->id, j->rank);
    pthread_mutex_lock(&j->mu);
    int abandoned = j->abandoned;
    j->comm = comm, j->r = r, j->cerr = cerr, j->done = 1;
    pthread_cond_signal(&j->cv);
    pthread_mutex_unlock(&j->mu);
    if (abandoned) { /* the caller gave up: the communicator is nobody's */
        if (comm && r == NCCL_OK)
            snug_nccl.CommAbort(comm);
        join_free(j);
    }
    return NULL;
}

int snug_nccl_join_timed(int device, int nranks, nccl_id id, int rank, double timeout_s, nccl_comm_t *comm, char *why,
                       size_t whylen) {
    *comm = NULL;
    nccl_join *j = calloc(1, sizeof *j);
    if (!j) {
        snprintf(why, whylen, "out of host memory to join the NCCL communicator");
        return 1;
    }
    pthread_mutex_init(&j->mu, NULL);
    pthread_cond_init(&j->cv, NULL);
    j->device = device, j->nranks = nranks, j->rank = rank, j->id = id;
    pthread_t t;
    if (pthread_create(&t, NULL, join_thread, j)) {
        snprintf(why, whylen, "cannot start a thread to join the NCCL communicator");
        join_free(j);
        return 1;
    }
    struct timespec until;
    clock_gettime(CLOCK_REALTIME, &until);
    double end = (double)until.tv_sec + 1e-9 * (double)until.tv_nsec + timeout_s;
    until.tv_sec = (time_t)end;
    until.tv_nsec = (long)((end - (double)until.tv_sec) * 1e9);
    pthread_mutex_lock(&j->mu);
    int late = 0;
    while (!j->done && !late)
        late = timeout_s > 0 ? pthread_cond_timedwait(&j->cv, &j->mu, &until) != 0 && !j->done
                             : (pthread_cond_wait(&j->cv, &j->mu), 0);
    if (late) {
        j->abandoned = 1;
        pthread_mutex_unlock(&j->mu);
        pthread_detach(t);
        snprintf(why, whylen, "ncclCommInitRank (rank %d of %d, GPU %d) did not complete in %.0f s (dist_timeout): "
                 "a rank died before joining, or the ranks cannot reach each other (NCCL_DEBUG=WARN says more; "
                 "NCCL_SOCKET_IFNAME picks the network interface)", rank, nranks, device, timeout_s);
        return 2;
    }
    pthread_mutex_unlock(&j->mu);
    pthread_join(t, NULL);
    if (j->cerr != cudaSuccess)
        snprintf(why, whylen, "GPU %d: cannot make it current to join the NCCL communicator: %s", device,
                 cudaGetErrorString(j->cerr));
    else if (j->r != NCCL_OK)
        snprintf(why, whylen, "ncclCommInitRank (rank %d of %d, GPU %d) failed: %s; NCCL_DEBUG=WARN says more", rank,
                 nranks, device, snug_nccl.GetErrorString(j->r));
    else
        *comm = j->comm;
    join_free(j);
    return *comm ? 0 : 1;
}
