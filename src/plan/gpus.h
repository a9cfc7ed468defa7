/* gpus.h: what a plan is compared against: the memory of common GPUs (and of this machine), the runtime overhead a
 * backend adds beyond snug's arenas, and a throughput estimate for costing a run.
 *
 * Every number here that does not come from snug's own layout code is an estimate with its source in gpus.c: GPU
 * memory as nvidia-smi reports it, CUDA context and cuBLAS workspace sizes as commonly published, peak TFLOPs from
 * the vendors' data sheets, an assumed model-FLOPs utilisation, and typical cloud prices. */
#ifndef SNUG_GPUS_H
#define SNUG_GPUS_H

#include <stddef.h>

#include "core/error.h"
#include "plan/plan.h"

/* Where the arenas live: host memory (the CPU backend) or GPU memory (the CUDA backend). */
typedef enum snug_device_kind { SNUG_DEVICE_CPU = 0, SNUG_DEVICE_CUDA = 1 } snug_device_kind;

const char *snug_device_kind_name(snug_device_kind k); /* "cpu", "cuda" */

typedef struct snug_gpu {
    const char *id;         /* "h100": what --gpu accepts (also the aliases) */
    const char *aliases;    /* other spellings, space-separated; compared without case, '-', '_' or spaces */
    const char *label;      /* "H100 80GB" */
    double mem_bytes;       /* total memory as nvidia-smi reports it */
    double tflops_fp32;     /* FP32 peak without tensor cores: snug's fp32 GEMMs are exact fp32, not TF32 */
    double tflops_bf16;     /* dense tensor-core peak for bf16 */
    double price_per_hour;  /* USD per GPU-hour, typical on-demand cloud price (estimate) */
    double link_gbps;       /* GB/s per GPU that collectives move between GPUs of one machine (NCCL bus bandwidth) */
} snug_gpu;

int snug_gpu_count(void);
const snug_gpu *snug_gpu_at(int i);
/* NULL when unknown; "H100", "h100-80gb" and "H100_SXM" all find the H100. */
const snug_gpu *snug_gpu_find(const char *name);
/* "rtx4090, a100-40gb, ..." for error messages. */
void snug_gpu_list(char *buf, size_t n);

/* One part of the runtime overhead: memory the backend uses beyond the arenas. */
typedef struct snug_overhead_item {
    const char *name;       /* "CUDA context and kernels" */
    size_t bytes;
    const char *note;       /* where the number comes from */
} snug_overhead_item;

typedef struct snug_overhead {
    int n;
    snug_overhead_item item[5];
    size_t total;
} snug_overhead;

/* The CPU process beyond the arenas, measured on snug's own runs (2 threads, the 2048-token default tokenizer; see
 * docs/MEMORY.md): the baseline (binary, libraries, OpenBLAS and OpenMP buffers, tokenizer) was 7.0-8.8 MiB; tokenizing
 * a dataset in the run, instead of reading its tokens from the cache, left 12-21 MiB more in the heap. */
#define SNUG_CPU_BASELINE_BYTES ((size_t)8 << 20)
#define SNUG_CPU_TOKENIZE_BYTES ((size_t)21 << 20) /* the level the tokenizing leftover reaches on large data */

/* The overhead of running plan p on a device of kind k. host_data_bytes: the dataset's token arrays in host memory
 * (counted on the CPU backend only, with SNUG_CPU_TOKENIZE_BYTES when there is a dataset; on a GPU they stay in host
 * memory). */
void snug_overhead_compute(snug_overhead *ov, snug_device_kind k, const snug_plan *p, size_t host_data_bytes);

/* The host memory of a dataset of ntokens tokens in nexamples examples, batched into rows of T tokens: 4 bytes of id
 * and 1 of supervision flag per token, 8 bytes of offset per example, 8 bytes of row order per row. */
size_t snug_data_host_bytes(size_t ntokens, size_t nexamples, int T);

/* Physical memory of this machine in bytes (0 when unknown). */
double snug_host_memory_bytes(void);

/* Model FLOPs per trained token: 6 per parameter (forward + backward) plus causal attention, 6 * L * T * NH * HD,
 * with T in a sliding-window layer of W < T keys W (2T - W + 1) / T (twice the mean number of keys a token sees). */
double snug_flops_per_token(const snug_plan_spec *s, long long nparams);

/* The model-FLOPs utilisation assumed for the throughput estimate. */
#define SNUG_ASSUMED_MFU 0.40

/* Estimated training tokens/s of the configured run on gpu g (the FP32 peak for fp32 training, the bf16 tensor-core
 * peak for bf16/fp16, x SNUG_ASSUMED_MFU / FLOPs per token), before any lever's extra cost. */
double snug_gpu_tokens_per_s(const snug_gpu *g, const snug_plan_spec *s, long long nparams);

#endif
