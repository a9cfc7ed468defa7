/* runtime.cpp: the emulated CUDA runtime: snug's .cu files, compiled as host C++ (cu2cpp), run here on the CPU so CI
 * can execute every kernel without a GPU, under AddressSanitizer and UndefinedBehaviorSanitizer.
 *
 * Kernels: the threads of a block are fibers on the host thread that runs the grid; blocks run in turn.
 * A block barrier resumes its threads once all of them wait at the same __syncthreads; a warp operation (shuffle,
 * __syncwarp, WMMA) once every lane of its mask waits at the same call, its results computed at that moment for
 * all. A barrier some threads never reach is an error naming the kernel, the block and the lines.
 * Launches are checked as the GPU checks them (block and grid dimensions, dynamic shared memory against the
 * kernel's attribute and 227 KiB, registers x threads against the 64K register file from the real build's
 * table), and every pointer argument must be device memory or pinned host memory.
 * Memory: device memory is a region of its own, its pages closed until first written (a kernel reading memory
 * nothing wrote stops the run), then filled with 0xff bytes (a NaN in every float), and, under AddressSanitizer,
 * poisoned while the host runs, so a host read of device memory is reported where it happens.
 * Streams: queues. Nothing runs when queued; a synchronize (of a stream, an event, the device, a copy to pageable
 * memory, a free) runs everything queued, always taking next the queued item submitted LAST among the streams whose
 * next item may run (its stream's earlier items are done, the events it waits for are reached). Work on one stream
 * stays in order and an event wait really orders, but two streams' work without a wait between them runs in the
 * reverse of the order the host queued it: a missing wait gives wrong results, in every run the same.
 *
 * Settings (environment): SNUG_CUDA_EMU_DEVICES (visible devices, default 0: without it CUDA sees no GPU),
 * SNUG_CUDA_EMU_MEMORY (bytes per device, default 16 GiB), SNUG_CUDA_EMU_RESOURCES (the kernel table; default the
 * source tree's tests/cuda_emu/kernel_resources.tsv), SNUG_CUDA_EMU_COVERAGE (a file each process appends the
 * kernels it ran to), SNUG_CUDA_EMU_STACK (fiber stack bytes, default 256 KiB). */
#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <signal.h>
#include <sys/mman.h>
#include <ucontext.h>
#include <unistd.h>

#include <deque>
#include <map>
#include <mutex>
#include <set>
#include <string>
#include <vector>

#include "cuda_runtime_api.h"
#include "mma.h"
#include "snug_emu.h"
#include "snug_emu_device.h"

#if defined(__SANITIZE_ADDRESS__)
#include <sanitizer/asan_interface.h>
#include <sanitizer/common_interface_defs.h>
#define EMU_ASAN 1
#else
#define EMU_ASAN 0
#endif

namespace snug_emu {
thread_ctx *cur; /* device work runs under the runtime's lock, on one host thread at a time: no thread_local needed */
}
using namespace snug_emu;

/* ------------------------------------------------------------------------------------------------ basics */

static std::recursive_mutex mu; /* every API call and all device work */
#define LOCK std::lock_guard<std::recursive_mutex> lock_(mu)

static thread_local cudaError_t last_error = cudaSuccess;
static thread_local int cur_device = 0;

static cudaError_t fail(cudaError_t e) {
    if (e != cudaSuccess)
        last_error = e;
    return e;
}

/* What device work runs now, for diagnostics. */
static const launch_desc *running_launch;
static const char *running_item;
static uint3 running_block;

extern "C" const char *snug_emu_setting(const char *name) {
    char key[128];
    snprintf(key, sizeof key, "SNUG_CUDA_EMU_%s", name);
    const char *v = getenv(key);
    return v && *v ? v : NULL;
}

extern "C" void snug_emu_fatal(const char *fmt, ...) {
    char msg[2048];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    fprintf(stderr, "snug cuda-emu: error: %s\n", msg);
    if (running_launch) {
        fprintf(stderr, "snug cuda-emu:   in kernel %s launched at %s:%d, grid (%u,%u,%u) block (%u,%u,%u)",
                running_launch->kernel, running_launch->file, running_launch->line, running_launch->grid.x,
                running_launch->grid.y, running_launch->grid.z, running_launch->block.x, running_launch->block.y,
                running_launch->block.z);
        fprintf(stderr, ", running block (%u,%u,%u)", running_block.x, running_block.y, running_block.z);
        if (cur)
            fprintf(stderr, " thread (%u,%u,%u)", cur->tid.x, cur->tid.y, cur->tid.z);
        fprintf(stderr, "\n");
    } else if (running_item) {
        fprintf(stderr, "snug cuda-emu:   in %s\n", running_item);
    }
#if EMU_ASAN
    __sanitizer_print_stack_trace();
#endif
    fflush(stderr);
    abort();
}

static void warn(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void warn(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "snug cuda-emu: ");
    vfprintf(stderr, fmt, ap);
    fprintf(stderr, "\n");
    va_end(ap);
}

static size_t setting_size(const char *name, size_t dflt) {
    const char *v = snug_emu_setting(name);
    if (!v)
        return dflt;
    char *end;
    unsigned long long x = strtoull(v, &end, 10);
    if (*end || end == v)
        snug_emu_fatal("SNUG_CUDA_EMU_%s=%s is not a number", name, v);
    return (size_t)x;
}

/* ------------------------------------------------------------------------------------------------ memory */

enum { MEM_DEVICE = 1, MEM_PINNED = 2 };
struct alloc {
    size_t size;
    int kind, device;
};
/* The runtime's tables live until the process ends, never destroyed: work still queued at exit and the leak checker
 * both see them whole. */
static std::map<uintptr_t, alloc> &live = *new std::map<uintptr_t, alloc>; /* by base address */
struct freed_rec {
    uintptr_t base;
    size_t size;
    int kind;
};
static std::deque<freed_rec> &freed = *new std::deque<freed_rec>; /* the latest frees, to name a use after free */
static size_t device_bytes;
static int device_open; /* device memory unpoisoned: device work is running */

static const uint8_t POISON = 0xff;

static void poison_all(int on) {
#if EMU_ASAN
    for (auto &kv : live)
        if (kv.second.kind == MEM_DEVICE) {
            if (on)
                ASAN_POISON_MEMORY_REGION((void *)kv.first, kv.second.size);
            else
                ASAN_UNPOISON_MEMORY_REGION((void *)kv.first, kv.second.size);
        }
#else
    (void)on;
#endif
}

/* Device memory readable from here on (nested: device work inside device work). */
struct device_open_scope {
    device_open_scope() {
        if (device_open++ == 0)
            poison_all(0);
    }
    ~device_open_scope() {
        if (--device_open == 0)
            poison_all(1);
    }
};

/* The live allocation holding p (one past its end included), or NULL. */
static const alloc *find(const void *p, uintptr_t *base) {
    uintptr_t a = (uintptr_t)p;
    auto it = live.upper_bound(a);
    if (it == live.begin())
        return NULL;
    --it;
    if (a > it->first + it->second.size)
        return NULL;
    if (base)
        *base = it->first;
    return &it->second;
}

/* Device memory lives in a region of its own, as on a GPU, so no host pointer can ever look like a device one:
 * allocations are carved in address order and never reused, each followed by a poisoned gap (AddressSanitizer
 * reports a kernel that runs past its buffer), and a freed one stays poisoned, its pages given back. */
static char *dev_base;
static size_t dev_reserved, dev_top;
static const size_t DEV_GAP = 256;

static int in_device_region(const void *p) {
    return dev_base && (const char *)p >= dev_base && (const char *)p < dev_base + dev_reserved;
}

/* Never-written device memory (x86-64 Linux, where a fault tells a read from a write): its pages stay without access
 * until something writes them. The first write to a page fills it with the 0xff poison and opens it; a read of a
 * page nothing has written stops the run, naming the kernel that reads (or the library call), the address and the
 * allocation. The runtime's own copies may read such pages (a copy of a partly written buffer is no error on a GPU):
 * they copy the poison. Elsewhere the pages are simply filled with the poison when allocated. Granularity: a page,
 * so a read of the unwritten part of a page written elsewhere reads the poison rather than stopping. */
#if defined(__x86_64__) && defined(__linux__)
#define EMU_UNWRITTEN 1
#else
#define EMU_UNWRITTEN 0
#endif
static int copying; /* the runtime's own copy runs: it may read never-written pages */
static const alloc *find(const void *p, uintptr_t *base);
static const char *freed_what(const void *p);

#if EMU_UNWRITTEN
static struct sigaction old_segv;

/* The poison into a page just opened, past AddressSanitizer's checks (the page holds the gap after an allocation,
 * which stays poisoned for it); volatile so that no memset call replaces the loop. */
__attribute__((no_sanitize("address"))) static void fill_page(char *page) {
    volatile uint64_t *w = (volatile uint64_t *)page;
    for (int i = 0; i < 4096 / 8; i++)
        w[i] = ~(uint64_t)0;
}

static void on_segv(int sig, siginfo_t *si, void *uc) {
    char *a = (char *)si->si_addr;
    if (dev_base && a >= dev_base && a < dev_base + dev_reserved) {
        char *page = (char *)((uintptr_t)a & ~(uintptr_t)4095);
        int write = (((ucontext_t *)uc)->uc_mcontext.gregs[REG_ERR] & 2) != 0;
        uintptr_t base = 0;
        const alloc *al = find(a, &base);
        if (al && (uintptr_t)a < base + al->size) {
            if (write || copying) {
                mprotect(page, 4096, PROT_READ | PROT_WRITE);
                fill_page(page);
                return;
            }
            snug_emu_fatal("a read of device memory nothing has written: %p, %zu bytes into the %zu-byte allocation "
                           "at %p (on a GPU: whatever the memory held)", (void *)a, (size_t)((uintptr_t)a - base),
                           al->size, (void *)base);
        }
        const char *fw = freed_what(a);
        snug_emu_fatal("an access to device address %p: %s", (void *)a, fw ? fw : "no allocation holds it");
    }
    /* not device memory: the handler before ours (AddressSanitizer's, or the default) */
    if (old_segv.sa_flags & SA_SIGINFO) {
        old_segv.sa_sigaction(sig, si, uc);
    } else if (old_segv.sa_handler == SIG_DFL || old_segv.sa_handler == SIG_IGN) {
        signal(SIGSEGV, SIG_DFL); /* the access happens again and ends the process as it would have */
    } else {
        old_segv.sa_handler(sig);
    }
}
#endif

static void *dev_carve(size_t bytes) {
    if (!dev_base) {
        dev_reserved = (size_t)1 << 40; /* address space only (1 TiB); pages are taken as they are written */
        void *m = mmap(NULL, dev_reserved, EMU_UNWRITTEN ? PROT_NONE : PROT_READ | PROT_WRITE,
                       MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
        if (m == MAP_FAILED)
            snug_emu_fatal("cannot reserve the device memory region: %s", strerror(errno));
        dev_base = (char *)m;
#if EMU_UNWRITTEN
        struct sigaction sa;
        memset(&sa, 0, sizeof sa);
        sa.sa_sigaction = on_segv;
        sa.sa_flags = SA_SIGINFO | SA_NODEFER;
        sigemptyset(&sa.sa_mask);
        sigaction(SIGSEGV, &sa, &old_segv);
#endif
        dev_top = DEV_GAP;
#if EMU_ASAN
        ASAN_POISON_MEMORY_REGION(dev_base, DEV_GAP);
#endif
    }
    size_t span = (bytes + DEV_GAP + 4095) / 4096 * 4096; /* each allocation starts on a page */
    if (span < bytes || dev_top + span > dev_reserved)
        return NULL;
    char *p = dev_base + (dev_top + 4095) / 4096 * 4096;
    dev_top = (size_t)(p - dev_base) + span;
#if EMU_ASAN
    ASAN_POISON_MEMORY_REGION(p + bytes, span - bytes);
#endif
    return p;
}

static void dev_release(void *p, size_t bytes) {
#if EMU_ASAN
    ASAN_POISON_MEMORY_REGION(p, bytes);
#endif
    uintptr_t a = ((uintptr_t)p + 4095) / 4096 * 4096, e = ((uintptr_t)p + bytes) / 4096 * 4096;
    if (e > a) {
        madvise((void *)a, e - a, MADV_DONTNEED);
        if (EMU_UNWRITTEN)
            mprotect((void *)a, e - a, PROT_NONE);
    }
}

static const char *freed_what(const void *p) {
    uintptr_t a = (uintptr_t)p;
    for (auto it = freed.rbegin(); it != freed.rend(); ++it)
        if (a >= it->base && a <= it->base + it->size) {
            if (it->kind == MEM_DEVICE)
                return "device memory already freed (cudaFree)";
#if EMU_ASAN
            if (__asan_address_is_poisoned(p)) /* else the host heap has given the address out again */
                return "pinned memory already freed (cudaFreeHost)";
#endif
            return NULL;
        }
    if (in_device_region(p))
        return "a device address no allocation holds";
    return NULL;
}

/* How the device sees p: 0 host memory it cannot reach, else the allocation's kind. */
static int kind_of(const void *p, size_t bytes, uintptr_t *base, const alloc **out) {
    uintptr_t b;
    const alloc *a = find(p, &b);
    if (!a)
        return 0;
    if ((uintptr_t)p + bytes > b + a->size)
        return -1; /* runs past the allocation */
    if (base)
        *base = b;
    if (out)
        *out = a;
    return a->kind;
}

extern "C" void snug_emu_check_device(const void *p, size_t bytes, const char *who) {
    LOCK;
    uintptr_t b = 0;
    const alloc *a = NULL;
    int k = kind_of(p, bytes, &b, &a);
    if (k > 0)
        return;
    const char *fw = freed_what(p);
    if (k < 0) {
        const alloc *al = find(p, &b);
        snug_emu_fatal("%s: %zu bytes at %p run %zu bytes past the end of the %zu-byte allocation at %p", who, bytes,
                       p, (size_t)((uintptr_t)p + bytes - (b + al->size)), al->size, (void *)b);
    }
    snug_emu_fatal("%s: %p is %s", who, p, fw ? fw : "host memory the device cannot reach (not from cudaMalloc or "
                                                     "cudaHostAlloc)");
}

/* ------------------------------------------------------------------------------------------------ streams */

struct item {
    uint64_t seq; /* submission order over all streams */
    const char *what;
    void (*fn)(void *);
    void *arg;
    struct snug_emu_stream *wait_stream; /* a wait: runs once that stream has done wait_pos items */
    uint64_t wait_pos;
};
struct snug_emu_stream {
    std::deque<item> q;
    uint64_t queued, done;
    int live, id;
};
struct snug_emu_event {
    snug_emu_stream *s;
    uint64_t pos;
    int live, recorded;
};
static snug_emu_stream legacy_stream = {{}, 0, 0, 1, 0};
static std::vector<snug_emu_stream *> &streams = *new std::vector<snug_emu_stream *>{&legacy_stream};
static std::vector<snug_emu_event *> &events = *new std::vector<snug_emu_event *>; /* destroyed ones too */
static uint64_t next_seq;

static snug_emu_stream *stream_of(cudaStream_t s) {
    snug_emu_stream *st = s ? (snug_emu_stream *)s : &legacy_stream;
    for (auto *x : streams)
        if (x == st)
            return x->live ? x : NULL;
    return NULL;
}

static void push(snug_emu_stream *st, const item &it0) {
    item it = it0;
    it.seq = ++next_seq;
    st->q.push_back(it);
    st->queued++;
}

static void drain(void) {
    for (;;) {
        snug_emu_stream *pick = NULL;
        int pending = 0;
        for (auto *st : streams) {
            if (st->q.empty())
                continue;
            pending = 1;
            const item &h = st->q.front();
            if (h.wait_stream && h.wait_stream->done < h.wait_pos)
                continue;
            if (!pick || h.seq > pick->q.front().seq)
                pick = st;
        }
        if (!pending)
            return;
        if (!pick)
            snug_emu_fatal("the streams wait on each other: nothing queued can run");
        item it = pick->q.front();
        pick->q.pop_front();
        if (it.fn) {
            device_open_scope open;
            running_item = it.what;
            it.fn(it.arg);
            running_item = NULL;
        }
        pick->done++;
    }
}

extern "C" void snug_emu_drain(void) {
    LOCK;
    drain();
}

extern "C" int snug_emu_enqueue(void *stream, const char *what, void (*fn)(void *), void *arg) {
    LOCK;
    snug_emu_stream *st = stream_of((cudaStream_t)stream);
    if (!st)
        return fail(cudaErrorInvalidResourceHandle);
    push(st, item{0, what, fn, arg, NULL, 0});
    return 0;
}

/* ------------------------------------------------------------------------------------------------ fibers */

/* The switch between fibers: saves the callee-saved registers and the floating-point control words on the old
 * stack, stores its stack pointer in *from and continues on `to` (what an earlier switch stored, or a new fiber's
 * prepared stack). Without a system call, unlike swapcontext, whose signal-mask call dominated a barrier's cost. */
extern "C" void snug_emu_switch(void **from, void *to);
#if defined(__x86_64__)
__asm__(".text\n"
        ".globl snug_emu_switch\n"
        ".type snug_emu_switch,@function\n"
        "snug_emu_switch:\n"
        "  pushq %rbp\n  pushq %rbx\n  pushq %r12\n  pushq %r13\n  pushq %r14\n  pushq %r15\n"
        "  subq $8, %rsp\n  stmxcsr (%rsp)\n  fnstcw 4(%rsp)\n"
        "  movq %rsp, (%rdi)\n  movq %rsi, %rsp\n"
        "  ldmxcsr (%rsp)\n  fldcw 4(%rsp)\n  addq $8, %rsp\n"
        "  popq %r15\n  popq %r14\n  popq %r13\n  popq %r12\n  popq %rbx\n  popq %rbp\n"
        "  ret\n"
        ".size snug_emu_switch,.-snug_emu_switch\n");
#elif defined(__aarch64__)
__asm__(".text\n"
        ".globl snug_emu_switch\n"
        ".type snug_emu_switch,%function\n"
        "snug_emu_switch:\n"
        "  sub sp, sp, #176\n"
        "  stp x19, x20, [sp, #0]\n  stp x21, x22, [sp, #16]\n  stp x23, x24, [sp, #32]\n"
        "  stp x25, x26, [sp, #48]\n  stp x27, x28, [sp, #64]\n  stp x29, x30, [sp, #80]\n"
        "  stp d8, d9, [sp, #96]\n  stp d10, d11, [sp, #112]\n  stp d12, d13, [sp, #128]\n"
        "  stp d14, d15, [sp, #144]\n  mrs x9, fpcr\n  str x9, [sp, #160]\n"
        "  mov x9, sp\n  str x9, [x0]\n  mov sp, x1\n"
        "  ldp x19, x20, [sp, #0]\n  ldp x21, x22, [sp, #16]\n  ldp x23, x24, [sp, #32]\n"
        "  ldp x25, x26, [sp, #48]\n  ldp x27, x28, [sp, #64]\n  ldp x29, x30, [sp, #80]\n"
        "  ldp d8, d9, [sp, #96]\n  ldp d10, d11, [sp, #112]\n  ldp d12, d13, [sp, #128]\n"
        "  ldp d14, d15, [sp, #144]\n  ldr x9, [sp, #160]\n  msr fpcr, x9\n"
        "  add sp, sp, #176\n  ret\n"
        ".size snug_emu_switch,.-snug_emu_switch\n");
#else
#error "the emulated CUDA runtime switches fibers on x86-64 and AArch64 only"
#endif

enum { F_RUN, F_BLOCK, F_WARP, F_DONE };
struct fiber {
    void *sp; /* its saved stack pointer while switched out */
    char *stack;
    thread_ctx tc;
    int state;
    /* where it waits */
    const char *what, *file;
    int line;
    unsigned mask;
    void *req;
    warp_complete_fn fn;
    int pred, result;
    void *fake; /* AddressSanitizer's fake stack while switched out */
};

struct block_run {
    const launch_desc *d;
    kernel_body_fn body;
    void *args;
    std::vector<fiber> f;
    int n;
    struct sh {
        const char *name;
        int line;
        void *p;
        size_t bytes;
    };
    std::vector<sh> shared;
    size_t shared_bytes;
    void *dyn;
};

static block_run *blk;
static fiber *me;
static void *sched_sp;
static const void *sched_bottom;
static size_t sched_size;
static char *stacks;
static size_t stack_bytes, stacks_n;

static void fiber_finish_switch(fiber *f) {
#if EMU_ASAN
    __sanitizer_finish_switch_fiber(f->fake, &sched_bottom, &sched_size);
#else
    (void)f;
#endif
}

static void *dead_sp;

static void fiber_entry(void) {
    fiber *f = me;
    fiber_finish_switch(f);
    blk->body(blk->args);
    f->state = F_DONE;
#if EMU_ASAN
    __sanitizer_start_switch_fiber(NULL, sched_bottom, sched_size);
#endif
    snug_emu_switch(&dead_sp, sched_sp); /* a global, not a local: this frame keeps no poisoned redzone */
    __builtin_unreachable();
}

/* A new fiber's stack, laid out so the first switch to it "returns" into fiber_entry as if called. */
static void *fiber_stack_init(char *stack, size_t bytes) {
    uintptr_t top = ((uintptr_t)(stack + bytes)) & ~(uintptr_t)15;
#if EMU_ASAN
    ASAN_UNPOISON_MEMORY_REGION((void *)(top - 1024), 1024); /* whatever a finished fiber left at the top */
#endif
    void **sp = (void **)top;
#if defined(__x86_64__)
    *--sp = NULL;                   /* fiber_entry's return address: it never returns */
    *--sp = (void *)fiber_entry;    /* where the switch's ret goes */
    for (int i = 0; i < 6; i++)
        *--sp = NULL;               /* rbp rbx r12 r13 r14 r15 */
    uint32_t ctl[2];
    __asm__ volatile("stmxcsr %0" : "=m"(ctl[0]));
    __asm__ volatile("fnstcw %0" : "=m"(ctl[1]));
    *--sp = NULL;
    memcpy(sp, ctl, sizeof ctl);
#else
    sp -= 22;                       /* 176 bytes of saved registers */
    memset(sp, 0, 176);
    sp[11] = (void *)fiber_entry;   /* x30, the link register */
    uint64_t fpcr;
    __asm__ volatile("mrs %0, fpcr" : "=r"(fpcr));
    sp[20] = (void *)fpcr;
#endif
    return sp;
}

/* From a fiber: park until the scheduler resumes it. */
static void park(void) {
    fiber *f = me;
#if EMU_ASAN
    __sanitizer_start_switch_fiber(&f->fake, sched_bottom, sched_size);
#endif
    snug_emu_switch(&f->sp, sched_sp);
    fiber_finish_switch(f);
}

static void resume(fiber *f) {
    me = f;
    cur = &f->tc;
#if EMU_ASAN
    void *fake = NULL;
    __sanitizer_start_switch_fiber(&fake, f->stack, stack_bytes);
#endif
    snug_emu_switch(&sched_sp, f->sp);
#if EMU_ASAN
    __sanitizer_finish_switch_fiber(fake, NULL, NULL);
#endif
    me = NULL;
    cur = NULL;
}

static void in_kernel(const char *what) {
    if (!blk || !me)
        snug_emu_fatal("%s called outside a kernel", what);
}

/* Parks the running thread at a block barrier; the block's OR of pred once every thread has arrived. */
static int block_barrier(const char *what, int pred, const char *file, int line) {
    in_kernel(what);
    fiber *f = me;
    f->state = F_BLOCK;
    f->what = what;
    f->file = file;
    f->line = line;
    f->pred = pred != 0;
    park();
    return f->result;
}

void snug_emu::syncthreads(const char *file, int line) { block_barrier("__syncthreads", 0, file, line); }

int snug_emu::syncthreads_or(int pred, const char *file, int line) {
    return block_barrier("__syncthreads_or", pred, file, line);
}

void snug_emu::warp_collective(unsigned mask, const char *what, const char *file, int line, void *req,
                               warp_complete_fn fn) {
    in_kernel(what);
    fiber *f = me;
    if (!(mask >> f->tc.lane & 1))
        snug_emu_fatal("%s:%d: %s with mask %#x by lane %d, which the mask leaves out", file, line, what, mask,
                       f->tc.lane);
    f->state = F_WARP;
    f->what = what;
    f->file = file;
    f->line = line;
    f->mask = mask;
    f->req = req;
    f->fn = fn;
    park();
}

static void syncwarp_complete(void *reqs[32], unsigned mask) { (void)reqs, (void)mask; }
void snug_emu::syncwarp(unsigned mask, const char *file, int line) {
    warp_collective(mask, "__syncwarp", file, line, NULL, syncwarp_complete);
}

void snug_emu::shfl_complete(void *reqs[32], unsigned mask) {
    for (int l = 0; l < 32; l++) {
        if (!(mask >> l & 1))
            continue;
        shfl_req *r = (shfl_req *)reqs[l];
        if (!(mask >> r->src & 1))
            snug_emu_fatal("a shuffle of lane %d reads lane %d, which its mask %#x leaves out", l, r->src, mask);
        r->result = ((shfl_req *)reqs[r->src])->val;
    }
}

void *snug_emu::shared_alloc(size_t bytes, size_t align, const char *name, int line) {
    in_kernel("__shared__");
    for (auto &s : blk->shared) /* the same literal: usually the same pointer */
        if (s.line == line && (s.name == name || !strcmp(s.name, name)))
            return s.p;
    blk->shared_bytes += bytes;
    if (blk->shared_bytes > 48 * 1024)
        snug_emu_fatal("%s:%d: static shared memory of the block reaches %zu bytes with %s; a block may have 48 KiB",
                       blk->d->file, line, blk->shared_bytes, name);
    if (blk->shared_bytes + blk->d->smem > 227 * 1024)
        snug_emu_fatal("static (%zu) and dynamic (%zu) shared memory exceed the 227 KiB of a block",
                       blk->shared_bytes, blk->d->smem);
    void *p = NULL;
    if (posix_memalign(&p, align < 16 ? 16 : align, bytes ? bytes : 1))
        snug_emu_fatal("out of host memory for shared memory");
    memset(p, POISON, bytes);
    blk->shared.push_back(block_run::sh{name, line, p, bytes});
    return p;
}

void *snug_emu::dynamic_shared(size_t align) {
    in_kernel("extern __shared__");
    if ((uintptr_t)blk->dyn % (align ? align : 1))
        snug_emu_fatal("dynamic shared memory not aligned to %zu", align);
    return blk->dyn;
}

static std::string lanes_str(unsigned m) {
    std::string s;
    char b[16];
    for (int l = 0; l < 32; l++)
        if (m >> l & 1) {
            snprintf(b, sizeof b, "%s%d", s.empty() ? "" : ",", l);
            s += b;
        }
    return s;
}

/* Two names of call sites: usually the same literal, so the same pointer. */
static inline int same_str(const char *a, const char *b) { return a == b || !strcmp(a, b); }

/* After every fiber has parked or finished: completes one warp operation or the block barrier. 0 when none can. */
static int resolve(block_run *b) {
    int nwarps = (b->n + 31) / 32, progress = 0;
    for (int w = 0; w < nwarps; w++) {
        int lanes = b->n - w * 32 < 32 ? b->n - w * 32 : 32;
        unsigned handled = 0;
        for (int l = 0; l < lanes; l++) {
            fiber *f0 = &b->f[w * 32 + l];
            if (f0->state != F_WARP || (handled >> l & 1))
                continue;
            unsigned mask = f0->mask;
            int ready = 1;
            for (int k = 0; k < 32; k++) {
                if (!(mask >> k & 1))
                    continue;
                if (k >= lanes)
                    snug_emu_fatal("%s:%d: %s with mask %#x in warp %d, which has %d lanes (the block has %d "
                                   "threads)", f0->file, f0->line, f0->what, mask, w, lanes, b->n);
                fiber *g = &b->f[w * 32 + k];
                if (g->state == F_DONE)
                    snug_emu_fatal("%s:%d: %s waits for lane %d of warp %d, which has returned (mask %#x)", f0->file,
                                   f0->line, f0->what, k, w, mask);
                if (g->state == F_WARP && (g->line != f0->line || !same_str(g->file, f0->file) || g->mask != mask))
                    snug_emu_fatal("lanes of warp %d wait at different warp operations: %s at %s:%d (mask %#x) and %s "
                                   "at %s:%d (mask %#x)", w, f0->what, f0->file, f0->line, mask, g->what, g->file,
                                   g->line, g->mask);
                if (g->state != F_WARP)
                    ready = 0;
            }
            handled |= mask;
            if (!ready)
                continue;
            void *reqs[32] = {0};
            for (int k = 0; k < 32; k++)
                if (mask >> k & 1)
                    reqs[k] = b->f[w * 32 + k].req;
            f0->fn(reqs, mask);
            for (int k = 0; k < 32; k++)
                if (mask >> k & 1)
                    b->f[w * 32 + k].state = F_RUN;
            progress = 1;
        }
    }
    if (progress)
        return 1;
    /* the block barrier: every thread that has not returned waits at the same one */
    fiber *first = NULL;
    int done = 0, waiting = 0, any = 0;
    for (auto &f : b->f) {
        if (f.state == F_DONE) {
            done++;
            continue;
        }
        if (f.state != F_BLOCK)
            continue;
        waiting++;
        if (!first)
            first = &f;
        else if (f.line != first->line || !same_str(f.file, first->file) || !same_str(f.what, first->what))
            snug_emu_fatal("threads of one block wait at different barriers: %s at %s:%d and %s at %s:%d", first->what,
                           first->file, first->line, f.what, f.file, f.line);
        any |= f.pred;
    }
    if (!first)
        return 0;
    if (waiting + done < b->n) {
        /* some wait at a warp operation that cannot complete */
        for (auto &f : b->f)
            if (f.state == F_WARP)
                snug_emu_fatal("%s at %s:%d waits for warp %d (mask %#x) while other threads wait at %s at %s:%d",
                               f.what, f.file, f.line, f.tc.warp, f.mask, first->what, first->file, first->line);
    }
    if (done)
        snug_emu_fatal("%s at %s:%d is reached by %d of the block's %d threads; the other %d have returned",
                       first->what, first->file, first->line, waiting, b->n, done);
    for (auto &f : b->f) {
        f.result = any;
        f.pred = 0;
        f.state = F_RUN;
    }
    return 1;
}

static void describe_stuck(block_run *b) {
    for (auto &f : b->f)
        if (f.state == F_WARP) {
            unsigned waiting = 0;
            int w = f.tc.warp;
            for (int k = 0; k < 32 && w * 32 + k < b->n; k++)
                if (b->f[w * 32 + k].state == F_WARP)
                    waiting |= 1u << k;
            snug_emu_fatal("%s at %s:%d (mask %#x) is reached by lanes %s of warp %d only", f.what, f.file, f.line,
                           f.mask, lanes_str(waiting & f.mask).c_str(), w);
        }
    snug_emu_fatal("the block cannot go on (a barrier reached by part of it)");
}

static void ensure_stacks(int n) {
    if ((size_t)n <= stacks_n)
        return;
    if (stacks)
        munmap(stacks, stacks_n * (stack_bytes + 4096));
    stack_bytes = setting_size("STACK", (size_t)256 << 10);
    stack_bytes = (stack_bytes + 4095) / 4096 * 4096;
    size_t per = stack_bytes + 4096; /* a guard page below each stack */
    stacks = (char *)mmap(NULL, per * (size_t)n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE,
                          -1, 0);
    if (stacks == MAP_FAILED)
        snug_emu_fatal("cannot map %d fiber stacks", n);
    for (int i = 0; i < n; i++)
        mprotect(stacks + per * (size_t)i, 4096, PROT_NONE);
    stacks_n = (size_t)n;
}

static std::set<std::string> &ran = *new std::set<std::string>; /* kernels run, for the coverage count */

static void run_grid(const launch_desc *d, kernel_body_fn body, void *args) {
    int n = (int)(d->block.x * d->block.y * d->block.z);
    ensure_stacks(n);
    ran.insert(d->kernel);
    block_run b;
    b.d = d;
    b.body = body;
    b.args = args;
    b.n = n;
    b.f.resize((size_t)n);
    running_launch = d;
    blk = &b;
    for (unsigned bz = 0; bz < d->grid.z; bz++)
        for (unsigned by = 0; by < d->grid.y; by++)
            for (unsigned bx = 0; bx < d->grid.x; bx++) {
                running_block = uint3{bx, by, bz};
                b.shared.clear();
                b.shared_bytes = 0;
                b.dyn = NULL;
                if (posix_memalign(&b.dyn, 128, d->smem ? d->smem : 1))
                    snug_emu_fatal("out of host memory for dynamic shared memory");
                memset(b.dyn, POISON, d->smem);
                for (int i = 0; i < n; i++) {
                    fiber &f = b.f[(size_t)i];
                    f.tc.tid = uint3{(unsigned)i % d->block.x, (unsigned)i / d->block.x % d->block.y,
                                     (unsigned)i / (d->block.x * d->block.y)};
                    f.tc.bid = running_block;
                    f.tc.bdim = d->block;
                    f.tc.gdim = d->grid;
                    f.tc.lane = i % 32;
                    f.tc.warp = i / 32;
                    f.state = F_RUN;
                    f.stack = stacks + (size_t)i * (stack_bytes + 4096) + 4096;
                    f.fake = NULL;
                    f.pred = f.result = 0;
                    f.sp = fiber_stack_init(f.stack, stack_bytes);
                }
                for (;;) {
                    int alive = 0;
                    for (auto &f : b.f)
                        if (f.state == F_RUN)
                            resume(&f);
                    for (auto &f : b.f)
                        alive += f.state != F_DONE;
                    if (!alive)
                        break;
                    if (!resolve(&b))
                        describe_stuck(&b);
                }
                for (auto &s : b.shared)
                    free(s.p);
                free(b.dyn);
            }
    blk = NULL;
    running_launch = NULL;
}

/* ------------------------------------------------------------------------------------------------ launches */

struct kernel_res {
    int regs;
    size_t smem;
};
static std::map<std::string, kernel_res> &resources = *new std::map<std::string, kernel_res>; /* sm_90 rows */
static int resources_loaded;

static std::string squash(const char *s) {
    std::string o;
    for (; *s; s++)
        if (*s != ' ')
            o += *s;
    /* the host compiler's spelling of some types against c++filt's */
    struct {
        const char *from, *to;
    } sub[] = {{"longint", "long"}, {"unsignedint", "unsigned"}, {"longunsigned", "unsignedlong"}};
    for (auto &r : sub)
        for (size_t at; (at = o.find(r.from)) != std::string::npos;)
            o.replace(at, strlen(r.from), r.to);
    return o;
}

static void load_resources(void) {
    if (resources_loaded)
        return;
    resources_loaded = 1;
    const char *path = snug_emu_setting("RESOURCES");
#ifdef SNUG_EMU_RESOURCES
    if (!path)
        path = SNUG_EMU_RESOURCES;
#endif
    if (!path)
        return;
    FILE *f = fopen(path, "r");
    if (!f) {
        warn("no kernel table at %s: launches are not checked against the registers", path);
        return;
    }
    char line[4096];
    while (fgets(line, sizeof line, f)) {
        char arch[32], kernel[2048];
        int regs, stack, local;
        size_t smem;
        if (sscanf(line, "%31s %2047s %d %d %d %zu", arch, kernel, &regs, &stack, &local, &smem) != 6)
            continue;
        if (!strcmp(arch, "sm_90"))
            resources[squash(kernel)] = kernel_res{regs, smem};
    }
    fclose(f);
}

static std::map<const void *, int> &max_dyn_smem = *new std::map<const void *, int>; /* the attribute by kernel */
static const size_t SMEM_OPTIN = 227 * 1024;

const char *snug_emu::kernel_name(const char *pretty) {
    const char *k = strstr(pretty, "K = ");
    std::string s = k ? k + 4 : pretty;
    size_t end = s.find_first_of(";]");
    if (end != std::string::npos)
        s.resize(end);
    if (!s.empty() && s[0] == '&')
        s.erase(0, 1);
    return strdup(s.c_str());
}

struct queued_launch {
    launch_desc d;
    kernel_body_fn body;
    void *args;
    void (*free_args)(void *);
};
static void run_launch(void *p) {
    queued_launch *q = (queued_launch *)p;
    run_grid(&q->d, q->body, q->args);
    q->free_args(q->args);
    delete q;
}

cudaError_t snug_emu::launch_kernel(const launch_desc *d, kernel_body_fn body, void *args, void (*free_args)(void *),
                                    const void *const *ptrs, const char *const *ptr_names, int nptrs) {
    LOCK;
    (void)ptr_names;
    load_resources();
    const dim3 &g = d->grid, &b = d->block;
    unsigned long long threads = (unsigned long long)b.x * b.y * b.z;
    const char *bad = NULL;
    cudaError_t err = cudaErrorInvalidConfiguration;
    char why[512];
    if (!b.x || !b.y || !b.z || b.x > 1024 || b.y > 1024 || b.z > 64 || threads > 1024)
        bad = "the block's dimensions (at most 1024 threads, 1024 x 1024 x 64)";
    else if (!g.x || !g.y || !g.z || g.x > 2147483647u || g.y > 65535 || g.z > 65535)
        bad = "the grid's dimensions (x up to 2^31 - 1, y and z up to 65535)";
    size_t cap = max_dyn_smem.count(d->func) ? (size_t)max_dyn_smem[d->func] : 48 * 1024;
    if (!bad && d->smem > cap) {
        snprintf(why, sizeof why, "%zu bytes of dynamic shared memory, above the kernel's %zu (set it with "
                 "cudaFuncSetAttribute)", d->smem, cap);
        bad = why;
        err = cudaErrorInvalidValue;
    }
    auto r = resources.find(squash(d->kernel));
    if (!bad && r != resources.end()) {
        unsigned long long per_warp = ((unsigned long long)r->second.regs * 32 + 255) / 256 * 256;
        unsigned long long need = (threads + 31) / 32 * per_warp;
        if (need > 65536) {
            snprintf(why, sizeof why, "%d registers per thread x %llu threads need %llu of the 65536 registers a "
                     "block may have", r->second.regs, threads, need);
            bad = why;
            err = cudaErrorLaunchOutOfResources;
        } else if (r->second.smem + d->smem > SMEM_OPTIN) {
            snprintf(why, sizeof why, "%zu bytes of static and %zu of dynamic shared memory exceed 227 KiB",
                     r->second.smem, d->smem);
            bad = why;
            err = cudaErrorInvalidValue;
        }
    }
    snug_emu_stream *st = stream_of(d->stream);
    if (!bad && !st) {
        bad = "a stream that does not exist (destroyed, or never created)";
        err = cudaErrorInvalidResourceHandle;
    }
    if (bad) {
        warn("launch of %s at %s:%d (grid %u,%u,%u block %u,%u,%u): %s", d->kernel, d->file, d->line, g.x, g.y, g.z,
             b.x, b.y, b.z, bad);
        free_args(args);
        return fail(err);
    }
    for (int i = 0; i < nptrs; i++) {
        if (!ptrs[i])
            continue;
        int k = kind_of(ptrs[i], 0, NULL, NULL);
        if (k > 0)
            continue;
        const char *fw = freed_what(ptrs[i]);
        snug_emu_fatal("launch of %s at %s:%d: pointer argument %d (%p) is %s", d->kernel, d->file, d->line, i + 1,
                       ptrs[i], fw ? fw : "host memory the device cannot reach (not from cudaMalloc or "
                                          "cudaHostAlloc)");
    }
    queued_launch *q = new queued_launch{*d, body, args, free_args};
    push(st, item{0, q->d.kernel, run_launch, q, NULL, 0});
    return cudaSuccess;
}

extern "C" cudaError_t snug_emu_func_set_attribute(const void *func, enum cudaFuncAttribute attr, int value) {
    LOCK;
    if (attr == cudaFuncAttributeMaxDynamicSharedMemorySize) {
        if (value < 0 || (size_t)value > SMEM_OPTIN) {
            warn("cudaFuncSetAttribute: %d bytes of dynamic shared memory; a block may have %zu", value, SMEM_OPTIN);
            return fail(cudaErrorInvalidValue);
        }
        max_dyn_smem[func] = value;
    }
    return cudaSuccess;
}

/* ------------------------------------------------------------------------------------------------ WMMA */

void snug_emu::wmma_impl::check_ptr(const char *what, const void *p, unsigned ldm, size_t esize, const char *file,
                                    int line) {
    if ((uintptr_t)p % 32)
        snug_emu_fatal("%s:%d: %s with a pointer %p that is not 32-byte aligned", file, line, what, p);
    if ((ldm * esize) % 16)
        snug_emu_fatal("%s:%d: %s with a stride of %u elements (%zu bytes), not a multiple of 16 bytes", file, line,
                       what, ldm, ldm * esize);
}

void snug_emu::wmma_impl::complete(void *reqs[32], unsigned mask) {
    if (mask != 0xffffffffu)
        snug_emu_fatal("a WMMA operation needs the whole warp");
    req *r0 = (req *)reqs[0];
    for (int l = 1; l < 32; l++) {
        req *r = (req *)reqs[l];
        if (r->op != r0->op ||
            (r->op != 2 && (r->ptr != r0->ptr || r->ldm != r0->ldm || r->col_major != r0->col_major)))
            snug_emu_fatal("the lanes of a warp call WMMA with different pointers or strides (lane 0: %p ld %u, lane "
                           "%d: %p ld %u)", r0->ptr, r0->ldm, l, r->ptr, r->ldm);
    }
    if (r0->op == 0 || r0->op == 1) {
        for (int l = 0; l < 32; l++) {
            req *r = (req *)reqs[l];
            for (int i = 0; i < 8; i++) {
                int row, col;
                pos(r->is_b, l, i, &row, &col);
                size_t at = r->col_major ? (size_t)col * r->ldm + row : (size_t)row * r->ldm + col;
                if (r->op == 0) {
                    if (r->kind == KIND_F32)
                        ((float *)r->frag)[i] = ((const float *)r->ptr)[at];
                    else
                        ((uint16_t *)r->frag)[i] = ((const uint16_t *)r->ptr)[at];
                } else {
                    ((float *)r->ptr)[at] = ((const float *)r->frag)[i];
                }
            }
        }
        return;
    }
    float A[16][16], B[16][16], C[16][16];
    for (int l = 0; l < 32; l++) {
        req *r = (req *)reqs[l];
        for (int i = 0; i < 8; i++) {
            int row, col;
            pos(0, l, i, &row, &col);
            A[row][col] = elem_f(r->a, KIND_BF16, i);
            C[row][col] = elem_f(r->c, KIND_F32, i);
            pos(1, l, i, &row, &col);
            B[row][col] = elem_f(r->b, KIND_BF16, i);
        }
    }
    for (int l = 0; l < 32; l++) {
        req *r = (req *)reqs[l];
        for (int i = 0; i < 8; i++) {
            int row, col;
            pos(0, l, i, &row, &col);
            float s = 0.0f;
            for (int k = 0; k < 16; k++)
                s += A[row][k] * B[k][col];
            ((float *)r->frag)[i] = s + C[row][col];
        }
    }
}

/* ------------------------------------------------------------------------------------------------ the API */

static int ndevices(void) {
    static int n = -1;
    if (n < 0) {
        const char *v = snug_emu_setting("DEVICES");
        n = v ? atoi(v) : 0;
        if (n < 0)
            n = 0;
    }
    return n;
}

extern "C" {

const char *cudaGetErrorName(cudaError_t e) {
    switch (e) {
    case cudaSuccess: return "cudaSuccess";
    case cudaErrorInvalidValue: return "cudaErrorInvalidValue";
    case cudaErrorMemoryAllocation: return "cudaErrorMemoryAllocation";
    case cudaErrorInitializationError: return "cudaErrorInitializationError";
    case cudaErrorInvalidConfiguration: return "cudaErrorInvalidConfiguration";
    case cudaErrorInvalidDevicePointer: return "cudaErrorInvalidDevicePointer";
    case cudaErrorInvalidMemcpyDirection: return "cudaErrorInvalidMemcpyDirection";
    case cudaErrorInvalidResourceHandle: return "cudaErrorInvalidResourceHandle";
    case cudaErrorNotReady: return "cudaErrorNotReady";
    case cudaErrorNoDevice: return "cudaErrorNoDevice";
    case cudaErrorInvalidDevice: return "cudaErrorInvalidDevice";
    case cudaErrorIllegalAddress: return "cudaErrorIllegalAddress";
    case cudaErrorLaunchOutOfResources: return "cudaErrorLaunchOutOfResources";
    case cudaErrorInvalidDeviceFunction: return "cudaErrorInvalidDeviceFunction";
    default: return "cudaErrorUnknown";
    }
}

const char *cudaGetErrorString(cudaError_t e) {
    switch (e) {
    case cudaSuccess: return "no error";
    case cudaErrorInvalidValue: return "invalid argument";
    case cudaErrorMemoryAllocation: return "out of memory";
    case cudaErrorInvalidConfiguration: return "invalid configuration argument";
    case cudaErrorInvalidMemcpyDirection: return "invalid copy direction for memcpy";
    case cudaErrorInvalidResourceHandle: return "invalid resource handle";
    case cudaErrorNotReady: return "device not ready";
    case cudaErrorNoDevice: return "no CUDA-capable device is detected";
    case cudaErrorInvalidDevice: return "invalid device ordinal";
    case cudaErrorLaunchOutOfResources: return "too many resources requested for launch";
    default: return cudaGetErrorName(e);
    }
}

cudaError_t cudaGetLastError(void) {
    cudaError_t e = last_error;
    last_error = cudaSuccess;
    return e;
}
cudaError_t cudaPeekAtLastError(void) { return last_error; }

cudaError_t cudaGetDeviceCount(int *count) {
    *count = ndevices();
    return *count ? cudaSuccess : fail(cudaErrorNoDevice);
}

cudaError_t cudaSetDevice(int device) {
    if (device < 0 || device >= ndevices())
        return fail(ndevices() ? cudaErrorInvalidDevice : cudaErrorNoDevice);
    cur_device = device;
    return cudaSuccess;
}

cudaError_t cudaGetDevice(int *device) {
    *device = cur_device;
    return ndevices() ? cudaSuccess : fail(cudaErrorNoDevice);
}

cudaError_t cudaGetDeviceProperties(cudaDeviceProp *p, int device) {
    if (device < 0 || device >= ndevices())
        return fail(cudaErrorInvalidDevice);
    memset(p, 0, sizeof *p);
    snprintf(p->name, sizeof p->name, "snug CUDA emulator (sm_90 on the CPU)");
    p->totalGlobalMem = setting_size("MEMORY", (size_t)16 << 30);
    p->sharedMemPerBlock = 48 * 1024;
    p->sharedMemPerBlockOptin = SMEM_OPTIN;
    p->regsPerBlock = 65536;
    p->warpSize = 32;
    p->maxThreadsPerBlock = 1024;
    p->maxThreadsDim[0] = p->maxThreadsDim[1] = 1024;
    p->maxThreadsDim[2] = 64;
    p->maxGridSize[0] = 2147483647;
    p->maxGridSize[1] = p->maxGridSize[2] = 65535;
    p->major = 9;
    p->minor = 0;
    p->multiProcessorCount = 1;
    return cudaSuccess;
}

cudaError_t cudaDeviceSynchronize(void) {
    LOCK;
    drain();
    return cudaSuccess;
}

cudaError_t cudaMemGetInfo(size_t *free_bytes, size_t *total_bytes) {
    LOCK;
    if (!ndevices())
        return fail(cudaErrorNoDevice);
    size_t total = setting_size("MEMORY", (size_t)16 << 30);
    *free_bytes = total > device_bytes ? total - device_bytes : 0;
    *total_bytes = total;
    return cudaSuccess;
}

cudaError_t cudaMalloc(void **p, size_t bytes) {
    LOCK;
    *p = NULL;
    if (!ndevices())
        return fail(cudaErrorNoDevice);
    size_t total = setting_size("MEMORY", (size_t)16 << 30);
    if (bytes > total || device_bytes + bytes > total)
        return fail(cudaErrorMemoryAllocation);
    void *q = dev_carve(bytes);
    if (!q)
        return fail(cudaErrorMemoryAllocation);
    if (!EMU_UNWRITTEN) /* else each page is filled on its first write */
        memset(q, POISON, bytes);
    live[(uintptr_t)q] = alloc{bytes, MEM_DEVICE, cur_device};
    device_bytes += bytes;
#if EMU_ASAN
    if (!device_open)
        ASAN_POISON_MEMORY_REGION(q, bytes);
#endif
    *p = q;
    return cudaSuccess;
}

static cudaError_t free_kind(void *p, int kind, const char *fn) {
    LOCK;
    if (!p)
        return cudaSuccess;
    drain(); /* a free waits for the device */
    auto it = live.find((uintptr_t)p);
    if (it == live.end() || it->second.kind != kind) {
        const char *fw = freed_what(p);
        if (fw)
            snug_emu_fatal("%s(%p): %s (a double free)", fn, p, fw);
        warn("%s(%p): not the start of memory from %s", fn, p, kind == MEM_DEVICE ? "cudaMalloc" : "cudaHostAlloc");
        return fail(cudaErrorInvalidValue);
    }
    size_t size = it->second.size;
    if (kind == MEM_DEVICE)
        device_bytes -= size;
    live.erase(it);
    freed.push_back(freed_rec{(uintptr_t)p, size, kind});
    if (freed.size() > 4096)
        freed.pop_front();
    if (kind == MEM_DEVICE)
        dev_release(p, size);
    else
        free(p);
    return cudaSuccess;
}

cudaError_t cudaFree(void *p) { return free_kind(p, MEM_DEVICE, "cudaFree"); }
cudaError_t cudaFreeHost(void *p) { return free_kind(p, MEM_PINNED, "cudaFreeHost"); }

cudaError_t cudaHostAlloc(void **p, size_t bytes, unsigned int flags) {
    LOCK;
    (void)flags;
    *p = NULL;
    void *q = NULL;
    if (posix_memalign(&q, 4096, bytes ? bytes : 1))
        return fail(cudaErrorMemoryAllocation);
    live[(uintptr_t)q] = alloc{bytes, MEM_PINNED, cur_device};
    *p = q;
    return cudaSuccess;
}
cudaError_t cudaMallocHost(void **p, size_t bytes) { return cudaHostAlloc(p, bytes, 0); }

cudaError_t cudaPointerGetAttributes(struct cudaPointerAttributes *attr, const void *p) {
    LOCK;
    memset(attr, 0, sizeof *attr);
    const alloc *a = find(p, NULL);
    if (!a) {
        attr->type = cudaMemoryTypeUnregistered;
        attr->device = -2;
        attr->hostPointer = (void *)p;
        return cudaSuccess;
    }
    attr->type = a->kind == MEM_DEVICE ? cudaMemoryTypeDevice : cudaMemoryTypeHost;
    attr->device = a->device;
    attr->devicePointer = (void *)p;
    attr->hostPointer = a->kind == MEM_PINNED ? (void *)p : NULL;
    return cudaSuccess;
}

/* a copy, a memset: run in stream order */
struct copy_item {
    void *dst;
    const void *src;
    size_t bytes;
    void *staged; /* the pageable source, copied when the call was made */
    int value, is_set;
};
static void run_copy(void *p) {
    copy_item *c = (copy_item *)p;
    copying = 1;
    if (c->is_set)
        memset(c->dst, c->value, c->bytes);
    else
        memmove(c->dst, c->staged ? c->staged : c->src, c->bytes);
    copying = 0;
    free(c->staged);
    delete c;
}

static const char *where(int k) {
    return k == MEM_DEVICE ? "device memory" : k == MEM_PINNED ? "pinned host memory" : "pageable host memory";
}

cudaError_t cudaMemcpyAsync(void *dst, const void *src, size_t bytes, enum cudaMemcpyKind kind, cudaStream_t s) {
    LOCK;
    snug_emu_stream *st = stream_of(s);
    if (!st)
        return fail(cudaErrorInvalidResourceHandle);
    if (!bytes)
        return cudaSuccess;
    int kd = kind_of(dst, bytes, NULL, NULL), ks = kind_of(src, bytes, NULL, NULL);
    if (kd < 0 || ks < 0)
        snug_emu_fatal("cudaMemcpyAsync of %zu bytes from %p to %p runs past the end of an allocation", bytes, src,
                       dst);
    const char *fw = freed_what(kd ? NULL : dst);
    if (!fw && !ks)
        fw = freed_what(src);
    if (fw)
        snug_emu_fatal("cudaMemcpyAsync of %zu bytes from %p to %p: %s", bytes, src, dst, fw);
    int want_dd = kind == cudaMemcpyHostToDevice || kind == cudaMemcpyDeviceToDevice;
    int want_sd = kind == cudaMemcpyDeviceToHost || kind == cudaMemcpyDeviceToDevice;
    if (kind != cudaMemcpyDefault &&
        ((want_dd != (kd == MEM_DEVICE)) || (want_sd != (ks == MEM_DEVICE)))) {
        static const char *kinds[] = {"HostToHost", "HostToDevice", "DeviceToHost", "DeviceToDevice"};
        warn("cudaMemcpyAsync(cudaMemcpy%s) from %s to %s: the wrong kind of copy", kinds[kind & 3], where(ks),
             where(kd));
        return fail(cudaErrorInvalidMemcpyDirection);
    }
    copy_item *c = new copy_item{dst, src, bytes, NULL, 0, 0};
    if (!ks) { /* pageable source: staged now, so the caller may reuse it at once */
        c->staged = malloc(bytes);
        memcpy(c->staged, src, bytes);
    }
    push(st, item{0, "cudaMemcpyAsync", run_copy, c, NULL, 0});
    if (!kd) /* to pageable memory: the call returns when the copy is done */
        drain();
    return cudaSuccess;
}

cudaError_t cudaMemcpy(void *dst, const void *src, size_t bytes, enum cudaMemcpyKind kind) {
    LOCK;
    cudaError_t e = cudaMemcpyAsync(dst, src, bytes, kind, 0);
    if (e == cudaSuccess)
        drain();
    return e;
}

cudaError_t cudaMemsetAsync(void *dst, int value, size_t bytes, cudaStream_t s) {
    LOCK;
    snug_emu_stream *st = stream_of(s);
    if (!st)
        return fail(cudaErrorInvalidResourceHandle);
    if (!bytes)
        return cudaSuccess;
    int k = kind_of(dst, bytes, NULL, NULL);
    if (k != MEM_DEVICE) {
        const char *fw = freed_what(dst);
        snug_emu_fatal("cudaMemsetAsync of %zu bytes at %p: %s", bytes, dst,
                       fw ? fw : k < 0 ? "runs past the end of its allocation" : "not device memory");
    }
    push(st, item{0, "cudaMemsetAsync", run_copy, new copy_item{dst, NULL, bytes, NULL, value, 1}, NULL, 0});
    return cudaSuccess;
}

struct memset2d_item {
    char *dst;
    size_t pitch, width, height;
    int value;
};
static void run_memset2d(void *p) {
    memset2d_item *m = (memset2d_item *)p;
    for (size_t r = 0; r < m->height; r++)
        memset(m->dst + r * m->pitch, m->value, m->width);
    delete m;
}

cudaError_t cudaMemset2DAsync(void *dst, size_t pitch, int value, size_t width, size_t height, cudaStream_t s) {
    LOCK;
    snug_emu_stream *st = stream_of(s);
    if (!st)
        return fail(cudaErrorInvalidResourceHandle);
    if (!width || !height)
        return cudaSuccess;
    if (width > pitch) {
        warn("cudaMemset2DAsync: width %zu above the pitch %zu", width, pitch);
        return fail(cudaErrorInvalidValue);
    }
    size_t extent = (height - 1) * pitch + width;
    if (kind_of(dst, extent, NULL, NULL) != MEM_DEVICE) {
        const char *fw = freed_what(dst);
        snug_emu_fatal("cudaMemset2DAsync of %zu rows of %zu bytes (pitch %zu) at %p: %s", height, width, pitch, dst,
                       fw ? fw : "not inside one device allocation");
    }
    push(st, item{0, "cudaMemset2DAsync", run_memset2d, new memset2d_item{(char *)dst, pitch, width, height, value},
                  NULL, 0});
    return cudaSuccess;
}

cudaError_t cudaMemset(void *dst, int value, size_t bytes) {
    LOCK;
    cudaError_t e = cudaMemsetAsync(dst, value, bytes, 0);
    if (e == cudaSuccess)
        drain();
    return e;
}

cudaError_t cudaStreamCreateWithFlags(cudaStream_t *s, unsigned int flags) {
    LOCK;
    (void)flags;
    if (!ndevices())
        return fail(cudaErrorNoDevice);
    snug_emu_stream *st = new snug_emu_stream{{}, 0, 0, 1, (int)streams.size()};
    streams.push_back(st);
    *s = st;
    return cudaSuccess;
}
cudaError_t cudaStreamCreate(cudaStream_t *s) { return cudaStreamCreateWithFlags(s, 0); }

cudaError_t cudaStreamDestroy(cudaStream_t s) {
    LOCK;
    snug_emu_stream *st = stream_of(s);
    if (!st || st == &legacy_stream)
        return fail(cudaErrorInvalidResourceHandle);
    drain();
    st->live = 0; /* kept, so a later use is recognised */
    return cudaSuccess;
}

cudaError_t cudaStreamSynchronize(cudaStream_t s) {
    LOCK;
    if (!stream_of(s))
        return fail(cudaErrorInvalidResourceHandle);
    drain();
    return cudaSuccess;
}
cudaError_t cudaStreamQuery(cudaStream_t s) { return cudaStreamSynchronize(s); }

cudaError_t cudaEventCreateWithFlags(cudaEvent_t *e, unsigned int flags) {
    LOCK;
    (void)flags;
    *e = new snug_emu_event{NULL, 0, 1, 0};
    events.push_back(*e);
    return cudaSuccess;
}
cudaError_t cudaEventCreate(cudaEvent_t *e) { return cudaEventCreateWithFlags(e, 0); }

cudaError_t cudaEventDestroy(cudaEvent_t e) {
    LOCK;
    if (!e || !e->live)
        return fail(cudaErrorInvalidResourceHandle);
    e->live = 0; /* kept, so a later use is recognised */
    return cudaSuccess;
}

cudaError_t cudaEventRecord(cudaEvent_t e, cudaStream_t s) {
    LOCK;
    snug_emu_stream *st = stream_of(s);
    if (!e || !e->live || !st)
        return fail(cudaErrorInvalidResourceHandle);
    e->s = st;
    e->pos = st->queued;
    e->recorded = 1;
    return cudaSuccess;
}

cudaError_t cudaStreamWaitEvent(cudaStream_t s, cudaEvent_t e, unsigned int flags) {
    LOCK;
    (void)flags;
    snug_emu_stream *st = stream_of(s);
    if (!e || !e->live || !st)
        return fail(cudaErrorInvalidResourceHandle);
    if (e->recorded && e->s != st)
        push(st, item{0, "cudaStreamWaitEvent", NULL, NULL, e->s, e->pos});
    return cudaSuccess;
}

cudaError_t cudaEventQuery(cudaEvent_t e) {
    LOCK;
    if (!e || !e->live)
        return fail(cudaErrorInvalidResourceHandle);
    drain();
    return cudaSuccess;
}
cudaError_t cudaEventSynchronize(cudaEvent_t e) { return cudaEventQuery(e); }

cudaError_t cudaEventElapsedTime(float *ms, cudaEvent_t a, cudaEvent_t b) {
    (void)a, (void)b;
    *ms = 0.0f; /* the emulator has no GPU time */
    return cudaSuccess;
}

} /* extern "C" */

/* ------------------------------------------------------------------------------------------------ coverage */

static void write_coverage(void) {
    const char *path = snug_emu_setting("COVERAGE");
    if (!path || ran.empty())
        return;
    std::string all;
    for (auto &k : ran)
        all += squash(k.c_str()) + "\n";
    int fd = open(path, O_WRONLY | O_CREAT | O_APPEND, 0644);
    if (fd < 0) {
        warn("cannot append to %s: %s", path, strerror(errno));
        return;
    }
    if (write(fd, all.data(), all.size()) != (ssize_t)all.size())
        warn("cannot append to %s", path);
    close(fd);
}

__attribute__((constructor)) static void emu_init(void) { atexit(write_coverage); }
