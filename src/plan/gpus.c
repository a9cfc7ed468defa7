/* gpus.c: GPU memory, runtime overhead and throughput estimates for the plan (see gpus.h).
 *
 * Sources of the numbers (all estimates except where snug measured them itself):
 *  - memory: the total nvidia-smi prints for each card (MiB), e.g. 81559 MiB for an H100 80GB HBM3, 143771 MiB for an
 *    H200; this is a little more than the program can use (the driver keeps some), which the overhead covers.
 *  - peak TFLOPs: NVIDIA data sheets, dense (without 2:4 sparsity). snug's fp32 GEMMs compute in exact fp32
 *    (CUBLAS_COMPUTE_32F, no TF32: src/backend/cuda/matmul_cuda.cu), so fp32 training is priced at the FP32 (CUDA
 *    core) peak, not the TF32 tensor-core peak, which is about 7x higher on an H100; bf16/fp16 at the 16-bit
 *    tensor-core peak.
 *  - MFU 40%: a typical model-FLOPs utilisation of well-tuned single-GPU training (llm.c and torchtune report
 *    35-50% on A100/H100); an assumption, replaced by --tokens_per_s when the user has a measurement.
 *  - prices: typical on-demand cloud prices per GPU-hour in USD (Lambda, RunPod and similar, 2024-2025); they vary
 *    by provider and over time, so `--price_per_hour` overrides them.
 *  - collective bandwidth (link_gbps, the "bus bandwidth" nccl-tests reports, in which a ring all-reduce of S bytes
 *    over n GPUs takes 2(n-1)/n x S / busbw): NVLink4 (H100, H200 SXM) 450 GB/s per direction, about 370 GB/s for
 *    ring collectives after NCCL's protocol overhead (NVIDIA/nccl-tests issue 212; 8 x H200 all_reduce_perf peaks at
 *    475 GB/s with NVLink SHARP, issue 272, which snug does not count on); 8 x A100 SXM (NVLink3) about 200 GB/s
 *    (nccl-tests issue 149); the PCIe cards (RTX 4090, RTX A6000, L40S: no NVLink switch) move collectives over PCIe
 *    Gen4 x16, 32 GB/s per direction by the specification, about 20 GB/s after protocol overhead and host
 *    bridges (an estimate, not a measurement). */
#include "plan/gpus.h"

#include <ctype.h>
#include <math.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "dist/comm.h"
#include "model/safetensors.h"

#define MIB (1024.0 * 1024.0)

static const snug_gpu gpus[] = {
    {"rtx4090", "4090 rtx-4090 geforce-rtx-4090", "RTX 4090 24GB", 24564 * MIB, 82.6, 165.2, 0.50, 20},
    {"a100-40gb", "a100-40 a100-sxm4-40gb", "A100 40GB", 40960 * MIB, 19.5, 312.0, 1.30, 200},
    {"a6000", "rtx-a6000", "RTX A6000 48GB", 49140 * MIB, 38.7, 154.8, 0.80, 20},
    {"l40s", "l40s-48gb", "L40S 48GB", 46068 * MIB, 91.6, 362.1, 1.00, 20},
    {"a100-80gb", "a100 a100-80 a100-sxm4-80gb", "A100 80GB", 81920 * MIB, 19.5, 312.0, 1.80, 200},
    {"h100", "h100-80gb h100-sxm h100-sxm5", "H100 80GB", 81559 * MIB, 66.9, 989.4, 2.50, 370},
    {"h200", "h200-141gb h200-sxm", "H200 141GB", 143771 * MIB, 66.9, 989.4, 3.50, 370},
};

#define NGPUS ((int)(sizeof gpus / sizeof gpus[0]))

const char *snug_device_kind_name(snug_device_kind k) { return k == SNUG_DEVICE_CUDA ? "cuda" : "cpu"; }

int snug_gpu_count(void) { return NGPUS; }

const snug_gpu *snug_gpu_at(int i) { return i >= 0 && i < NGPUS ? &gpus[i] : NULL; }

/* Lower case without '-', '_', ' ' or '.': "H100_SXM" and "h100-sxm" compare equal. */
static void squash(char *dst, size_t n, const char *src, size_t len) {
    size_t j = 0;
    for (size_t i = 0; i < len && src[i] && j + 1 < n; i++)
        if (!strchr("-_ .", src[i]))
            dst[j++] = (char)tolower((unsigned char)src[i]);
    dst[j] = '\0';
}

const snug_gpu *snug_gpu_find(const char *name) {
    char want[64], have[64];
    if (strlen(name) >= sizeof want)
        return NULL;
    squash(want, sizeof want, name, strlen(name));
    if (!want[0])
        return NULL;
    for (int i = 0; i < NGPUS; i++) {
        squash(have, sizeof have, gpus[i].id, strlen(gpus[i].id));
        if (!strcmp(want, have))
            return &gpus[i];
        for (const char *p = gpus[i].aliases; *p;) {
            size_t k = strcspn(p, " ");
            squash(have, sizeof have, p, k);
            if (!strcmp(want, have))
                return &gpus[i];
            p += k;
            while (*p == ' ')
                p++;
        }
    }
    return NULL;
}

void snug_gpu_list(char *buf, size_t n) {
    size_t len = 0;
    buf[0] = '\0';
    for (int i = 0; i < NGPUS && len < n; i++)
        len += (size_t)snprintf(buf + len, n - len, "%s%s", i ? ", " : "", gpus[i].id);
}

/* CUDA (estimates, see docs/MEMORY.md):
 *  - the context with snug's kernels and cuBLAS's loaded lazily: 300-500 MiB on CUDA 12 with lazy module loading
 *    (the default since CUDA 11.7); Hugging Face measured about 1.3 GB for PyTorch's far larger kernel set on a V100
 *    ("Model training anatomy"). 512 MiB keeps a margin.
 *  - what the CUDA backend allocates besides the arenas (backend_cuda.cu): a 32 MiB cuBLASLt workspace (llm.c's
 *    cublaslt_workspace_size; snug does not use cuBLAS's own) and the scratch for reductions, the attention
 *    backward's row sums and the embedding backward's sort, of the plan's size (p->device_scratch: the backend is
 *    created with exactly that many bytes).
 *  - allocator slack: each arena is one cudaMalloc, rounded up to the 2 MiB allocation granularity; static arenas do
 *    not fragment, so instead of the 5-10% headroom a caching allocator needs, 1% covers what the estimate misses.
 *  - over several ranks, NCCL's buffers: each channel's connection to a peer holds one buffer per protocol, Simple
 *    4 MiB (NCCL_BUFFSIZE), LL 512 KiB (8 lines x 512 threads x 8 steps x 16 bytes) and LL128 4,915,200 bytes (120
 *    elements x 640 threads x 8 steps x 8 bytes; NCCL's init.cc defaults), 9.2 MiB that NCCL allocates as 10 MiB
 *    (the 10,485,760-byte allocations NCCL_DEBUG_SUBSYS=ALLOC lists on 8 x H100, NVIDIA/nccl issue 1685). The
 *    memory grows linearly with the channels (NVIDIA/nccl issue 986); on NVLink machines NCCL opens up to 32. A
 *    ring receives from one peer per channel and a tree within a machine from two; snug counts two receiving peers
 *    per channel, 640 MiB, which with the 512 MiB context is 1.13 GiB: about the 1 GB nccl-tests leaves to CUDA and
 *    NCCL on HGX/DGX machines (NVIDIA/nccl-tests issue 198) and the 1.06 GB reported for both on 8 x H100 (issue
 *    1685). The PCIe cards open fewer channels and use less; the plan counts the NVLink figure everywhere, as a
 *    bound. Not counted: NVLink SHARP's buffers (H100/H200 with NVSwitch; NCCL_NVLS_ENABLE=0 turns them off), and
 *    the send/receive buffers that deterministic mode's per-owner exchange opens between every pair of ranks (an
 *    all-to-all added 3.3 GB on 8 x H100 in issue 1685; deterministic mode is for tests). Its scratch is counted,
 *    exactly (SNUG_NCCL_SCRATCH_BYTES, dist/comm.h). */
#define CUDA_CONTEXT_BYTES ((size_t)512 << 20)
#define NCCL_CHANNELS 32
#define NCCL_PEERS_PER_CHANNEL 2
#define NCCL_CONNECTION_BYTES ((size_t)10 << 20)
#define CUBLAS_WORKSPACE_BYTES ((size_t)32 << 20)
#define CUDA_ALLOC_GRANULE ((size_t)2 << 20)

void snug_overhead_compute(snug_overhead *ov, snug_device_kind k, const snug_plan *p, size_t host_data_bytes) {
    memset(ov, 0, sizeof *ov);
    if (k == SNUG_DEVICE_CUDA) {
        size_t slack = p->total / 100;
        for (int c = 0; c < SNUG_MEM_NCAT; c++)
            if (p->bytes[c])
                slack += CUDA_ALLOC_GRANULE;
        ov->item[ov->n++] = (snug_overhead_item){"CUDA context and kernels", CUDA_CONTEXT_BYTES,
                                                 "estimate: 300-500 MiB with lazy loading (CUDA 12)"};
        ov->item[ov->n++] = (snug_overhead_item){"cuBLASLt workspace, scratch", CUBLAS_WORKSPACE_BYTES +
                                                 p->device_scratch, "32 MiB cuBLASLt + the scratch the plan sizes "
                                                 "from the shape (reductions, attention, embedding sort, 16-bit GEMM operands)"};
        ov->item[ov->n++] = (snug_overhead_item){"allocator slack", slack,
                                                 "2 MiB rounding per arena + 1% margin; arenas do not fragment"};
        if (p->ranks > 1)
            ov->item[ov->n++] = (snug_overhead_item){
                "NCCL buffers", (size_t)NCCL_CHANNELS * NCCL_PEERS_PER_CHANNEL * NCCL_CONNECTION_BYTES + p->comm_scratch,
                p->comm_scratch ? "estimate: 32 channels x 2 peers x 10 MiB, + the deterministic sums' scratch"
                                : "estimate: 32 channels x 2 peers x 10 MiB (NCCL's protocol buffers)"};
    } else {
        ov->item[ov->n++] = (snug_overhead_item){"process baseline", SNUG_CPU_BASELINE_BYTES,
                                                 "libraries, OpenBLAS/OpenMP buffers, tokenizer (measured)"};
        size_t pages = p->largest_tensor * sizeof(float);
        ov->item[ov->n++] = (snug_overhead_item){"weights file pages", pages < SNUG_ST_READ_BLOCK ? pages : SNUG_ST_READ_BLOCK,
                                                 "the mapped pages of one block of a tensor while it is read"};
        /* tokenizing leaves heap behind that grows with the data and levels off: fitted to 51 KB, 0.7, 2.7 and
         * 8.2 MB of text (+1.8, +13.6, +18.9, +20.8 MiB) */
        double tok = host_data_bytes ? (double)SNUG_CPU_TOKENIZE_BYTES * (1.0 - exp(-(double)host_data_bytes / 1.25e6))
                                     : 0.0;
        ov->item[ov->n++] = (snug_overhead_item){"dataset", host_data_bytes + (size_t)tok,
                                                 "token arrays + what tokenizing leaves in the heap (measured)"};
    }
    for (int i = 0; i < ov->n; i++)
        ov->total += ov->item[i].bytes;
}

size_t snug_data_host_bytes(size_t ntokens, size_t nexamples, int T) {
    if (!ntokens && !nexamples)
        return 0;
    return ntokens * 5 + (nexamples + 1) * 8 + (T > 0 ? ntokens / (size_t)T * 8 : 0);
}

double snug_host_memory_bytes(void) {
    long pages = sysconf(_SC_PHYS_PAGES), size = sysconf(_SC_PAGE_SIZE);
    return pages > 0 && size > 0 ? (double)pages * (double)size : 0.0;
}

double snug_flops_per_token(const snug_plan_spec *s, long long nparams) {
    const snug_model_config *c = &s->cfg;
    int heads = s->tp > 1 ? c->n_head / s->tp : c->n_head; /* tensor parallelism: the rank's (nparams its share) */
    /* per layer and head 6 HD FLOPs (QK^T and PV, forward and backward) per key a token sees, twice the mean of
     * which is T for a causal layer and W (2T - W + 1) / T for a sliding window of W < T keys */
    double span = 0, T = s->T;
    for (int l = 0; l < c->n_layer; l++) {
        int W = snug_layer_window(c, l);
        span += W > 0 && W < s->T ? fmin(W * (2.0 * T - W + 1) / T, T) : T;
    }
    return 6.0 * (double)nparams + 6.0 * span * heads * c->head_dim;
}

double snug_gpu_tokens_per_s(const snug_gpu *g, const snug_plan_spec *s, long long nparams) {
    double f = snug_flops_per_token(s, nparams);
    double peak = s->lv.dt == SNUG_DT_F32 ? g->tflops_fp32 : g->tflops_bf16; /* 16-bit: the tensor cores' bf16 rate */
    return f > 0 ? peak * 1e12 * SNUG_ASSUMED_MFU / f : 0.0;
}
