/* backend.h: the backend interface, a struct of function pointers for every op the engine runs.
 *
 * The model and trainer never branch on the device: they call through these slots. The CPU backend (backend/cpu) is
 * the reference; a CUDA backend fills the same slots with device pointers. All tensors are row-major fp32, except
 * where an argument carries a snug_dtype: there the tensor is stored as that dtype (F32, BF16 or F16) and the op
 * converts to fp32 as it reads. Mixed precision keeps parameters, layer gradients and saved activations in 16 bits
 * and converts them with to16/from16 around fp32 compute (model.h says where).
 *
 * Dimension names, the same everywhere: B batch rows, T sequence length, N = B*T tokens, C model width,
 * OC output width of a linear layer, NH query heads, NKV key/value heads, HD head dim, V vocabulary, I MLP width.
 *
 * Gradient convention: every *_bwd op ACCUMULATES (+=) into each gradient output it is given, and a NULL gradient
 * output is skipped (a frozen parameter, or an input that needs no gradient). The caller zeroes what must start
 * at zero. Linear weights are stored [OC, C] (the nn.Linear layout), whatever the file layout was. */
#ifndef SNUG_BACKEND_H
#define SNUG_BACKEND_H

#include <stddef.h>
#include <stdint.h>

#include "core/dtype.h"
#include "core/error.h"

typedef struct snug_backend snug_backend;

/* What a backend can do (be->caps), which callers ask instead of testing its name: the name is for people. */
enum {
    SNUG_CAP_HOST_THREADS = 1u << 0, /* its ops run on be->nthreads of the host's cores (the CPU backend) */
    SNUG_CAP_CUDA_MEMORY = 1u << 1,  /* its device memory and streams are CUDA's, on the GPU its ops run on: a CUDA
                                      * library (NCCL) may work on its buffers */
};

struct snug_backend {
    const char *name; /* "cpu", "cuda": for messages and reports only; callers ask caps */
    unsigned caps;    /* SNUG_CAP_* */
    const char *gemm; /* the GEMM library and kernels in use, for the training header */
    void *ctx;
    int nthreads;
    int host_resident;  /* 1 when device pointers are plain host memory (the CPU backend): no staging copies */
    snug_dtype math;    /* what the GEMMs may round their inputs to: SNUG_DT_F32 (0) exact fp32; BF16/F16 under mixed
                         * precision, where a GPU multiplies on its 16-bit tensor cores with fp32 accumulation (the
                         * stored operands are 16-bit values already). Set it with snug_backend_set_math. The CPU
                         * rounds to bf16 only where its bf16 units pay (AMX; AVX512-BF16 where measured faster) and
                         * computes exactly in fp32 otherwise; be->gemm says which. */

    void (*destroy)(snug_backend *be);
    /* Free and total bytes of the memory of the backend's own device right now; 0 on success, -1 when it cannot
     * tell. NULL for a backend whose device memory is the host's (host_resident). */
    int (*mem_info)(snug_backend *be, size_t *free_bytes, size_t *total_bytes);

    /* Sets be->math and lets the backend choose its GEMM kernels for it, updating be->gemm. M, N, K: the run's
     * typical GEMM (tokens per micro-batch, the MLP's width, the model's width), on which a backend may time its
     * candidates once; <= 0 for a default. 0, or an error when a choice forced by hand cannot be honoured. NULL:
     * the backend reads be->math as it is (snug_backend_set_math sets it). */
    int (*set_math)(snug_backend *be, snug_dtype math, int M, int N, int K, snug_error *e);

    /* --- memory: the blocks arenas are carved from --- */
    void *(*alloc)(snug_backend *be, size_t bytes); /* zero-filled, 64-byte aligned; NULL on failure */
    void (*free)(snug_backend *be, void *p);
    void (*to_device)(snug_backend *be, void *dst, const void *host_src, size_t bytes);
    void (*to_host)(snug_backend *be, void *host_dst, const void *src, size_t bytes);
    /* dst <- src, each the backend's memory or host memory from host_alloc (pinned), queued after the ops before it
     * (a GPU: on the compute stream, no host wait; to_device/to_host return only once their copy is done) */
    void (*copy)(snug_backend *be, void *dst, const void *src, size_t bytes);
    void (*zero)(snug_backend *be, void *dst, size_t bytes);

    /* --- embeddings --- */
    /* out (N,C) = table[ids[n]] (+= when accumulate) ; ids (N) in [0, rows), or -1 for a zero row (tensor
     * parallelism: an id in another rank's rows) ; table (rows,C) stored as tdt */
    void (*embed_fwd)(snug_backend *be, float *out, const int32_t *ids, const void *table, snug_dtype tdt, int N,
                      int C, int accumulate);
    /* dtable (rows,C) += scatter of dout (N,C) by ids (an id of -1 adds nothing); deterministic (same result for any
     * thread count) */
    void (*embed_bwd)(snug_backend *be, float *dtable, const float *dout, const int32_t *ids, int N, int C);

    /* --- normalisation --- */
    /* out (N,C) = inp * rstd * w ; rstd (N) saved for backward */
    void (*rmsnorm_fwd)(snug_backend *be, float *out, float *rstd, const float *inp, const float *w, int N, int C,
                        float eps);
    void (*rmsnorm_bwd)(snug_backend *be, float *dinp, float *dw, const float *dout, const float *inp,
                        const float *w, const float *rstd, int N, int C);
    /* out (N,C) = (inp - mean) * rstd * w + b ; mean, rstd (N) saved */
    void (*layernorm_fwd)(snug_backend *be, float *out, float *mean, float *rstd, const float *inp, const float *w,
                          const float *b, int N, int C, float eps);
    void (*layernorm_bwd)(snug_backend *be, float *dinp, float *dw, float *db, const float *dout, const float *inp,
                          const float *w, const float *mean, const float *rstd, int N, int C);

    /* --- linear layers --- */
    /* out (N,OC) = inp (N,C) @ w (OC,C)^T + bias (OC, may be NULL) */
    void (*matmul_fwd)(snug_backend *be, float *out, const float *inp, const float *w, const float *bias, int N,
                       int C, int OC);
    /* dinp (N,C) += dout @ w ; dw (OC,C) += dout^T @ inp ; dbias (OC) += column sums of dout. Any may be NULL. */
    void (*matmul_bwd)(snug_backend *be, float *dinp, float *dw, float *dbias, const float *dout, const float *inp,
                       const float *w, int N, int C, int OC);
    /* The same two with the weight w (OC,C) read as stored in 16 bits (wdt BF16 or F16), without an fp32 copy of it:
     * the products matmul_fwd/bwd multiply on the widened weight under the same math. A backend fills them only
     * where its GEMMs take 16-bit weights as they are at no loss: the CPU when set_math put its GEMMs on oneDNN,
     * which rounds its operands to bf16 anyway (bitwise matmul_fwd/bwd's results); CUDA under 16-bit math, whose
     * fast-16-bit GEMMs round their operands too (the fp32 sums in cuBLASLt's order). NULL otherwise, and the caller
     * widens the weight and calls matmul_fwd/bwd. Where they are filled, the loss (xent_fwd_bwd) also reads a 16-bit
     * head as stored. */
    void (*matmul_w16_fwd)(snug_backend *be, float *out, const float *inp, const void *w, snug_dtype wdt,
                           const float *bias, int N, int C, int OC);
    void (*matmul_w16_bwd)(snug_backend *be, float *dinp, float *dw, float *dbias, const float *dout,
                           const float *inp, const void *w, snug_dtype wdt, int N, int C, int OC);
    /* Row-major C (M,N) = alpha * op(A) (M,K) @ op(B) (K,N) + beta * C, op transposing when ta / tb, each matrix
     * with its leading dimension (row stride): a block of columns of a wider matrix is a valid operand (LoRA's
     * adapters on q alone of the fused q/k/v output). */
    void (*gemm_strided)(snug_backend *be, int ta, int tb, int M, int N, int K, float alpha, const float *A, int lda,
                         const float *B, int ldb, float beta, float *C, int ldc);

    /* --- rotary position embedding, rotate-half convention (HF Llama), in place --- */
    /* x: N rows of `stride` floats; heads [0, H) of HD floats start at the row's beginning. pos (N) position ids.
     * cos/sin (max_pos, HD/2) tables. Rotates pairs (i, i + HD/2). */
    void (*rope_fwd)(snug_backend *be, float *x, const int32_t *pos, const float *cos, const float *sin, int N,
                     int H, int HD, int stride);
    /* the inverse rotation applied in place to a gradient laid out like x (rope is orthogonal) */
    void (*rope_bwd)(snug_backend *be, float *dx, const int32_t *pos, const float *cos, const float *sin, int N,
                     int H, int HD, int stride);

    /* --- attention: causal, grouped-query, variable length; no (T,T) buffer anywhere --- */
    /* qkv (N, (NH + 2*NKV)*HD): per row, NH query heads, then NKV key heads, then NKV value heads (q already roped).
     * Query head h uses key/value head h / (NH/NKV). Token t of batch row b attends to tokens s of the same row with
     * seg_start[b*T+t] <= s <= t; seg_start NULL means 0 (plain causal). seg_start is the first key each token
     * sees: the start of its packed example, or, in a sliding-window layer of W keys, max(that, t - W + 1)
     * (transformers' t - s < W; the model computes it, snug_attention_window_starts). Every implementation skips
     * the keys before the earliest first key of a query tile and the query tiles that see none of a key tile, so
     * a window costs O(T W), not O(T^2). out (N, NH*HD); lse (N, NH) the log-sum-exp of the scaled scores of each
     * query row, saved for backward. scale is usually 1/sqrt(HD). */
    void (*attention_fwd)(snug_backend *be, float *out, float *lse, const float *qkv, const int32_t *seg_start,
                          int B, int T, int NH, int NKV, int HD, float scale);
    /* dqkv (N, (NH+2*NKV)*HD) += gradients for q, k, v; recomputes probabilities from qkv and lse. */
    void (*attention_bwd)(snug_backend *be, float *dqkv, const float *dout, const float *qkv, const float *out,
                          const float *lse, const int32_t *seg_start, int B, int T, int NH, int NKV, int HD,
                          float scale);

    /* The reference path (flash_attention: false): the same attention with the probabilities stored whole.
     * probs (B, NH, T, T), row t of head h of batch row b at ((b*NH + h)*T + t)*T; entries outside the row's
     * visible range [seg_start, t] are 0. Backward reads probs instead of recomputing them. */
    void (*attention_naive_fwd)(snug_backend *be, float *out, float *probs, const float *qkv,
                                const int32_t *seg_start, int B, int T, int NH, int NKV, int HD, float scale);
    void (*attention_naive_bwd)(snug_backend *be, float *dqkv, const float *dout, const float *qkv,
                                const float *probs, int B, int T, int NH, int NKV, int HD, float scale);

    /* Decoding with a KV cache: the attention of token p alone against the roped keys and values of tokens 0..p,
     * which earlier steps left in rows 0..p of a layer's qkv buffer (T, (NH + 2*NKV)*HD). out (NH*HD). A sliding
     * window of W keys passes the rows it sees: qkv from row k0 = max(0, p - W + 1), and p - k0. */
    void (*attention_decode)(snug_backend *be, float *out, const float *qkv, int p, int NH, int NKV, int HD,
                             float scale);

    /* --- activations --- */
    /* gu (N, 2I): gate in columns [0,I), up in [I,2I). out (N,I) = silu(gate) * up */
    void (*swiglu_fwd)(snug_backend *be, float *out, const float *gu, int N, int I);
    void (*swiglu_bwd)(snug_backend *be, float *dgu, const float *dout, const float *gu, int N, int I);
    /* tanh-approximate GELU (GPT-2 "gelu_new"), elementwise over n */
    void (*gelu_fwd)(snug_backend *be, float *out, const float *inp, size_t n);
    void (*gelu_bwd)(snug_backend *be, float *dinp, const float *dout, const float *inp, size_t n);

    /* --- 16-bit storage (dt is SNUG_DT_BF16 or SNUG_DT_F16) --- */
    /* dst (n, stored as dt) = src (n) rounded to dt's precision (round to nearest even; fp16 overflows to inf).
     * With round_src, src is also replaced by the rounded values (dst may then be NULL): the next op reads exactly
     * what was stored, so a recomputation from the stored copy gives the same bits. */
    void (*to16)(snug_backend *be, void *dst, float *src, size_t n, snug_dtype dt, int round_src);
    /* dst (n) = src (n, stored as dt) widened to fp32 (exact) */
    void (*from16)(snug_backend *be, float *dst, const void *src, size_t n, snug_dtype dt);
    /* dst (n) = the 4-bit tensor widened (bitsandbytes' dequantize_4bit, fp32): element i is
     * code[nibble i] * absmax_b with b = i / blocksize, nibble i the high half of packed[i/2] for even i; absmax_b is
     * absmax[b], or (absmax NULL, double-quantized) nested_map[absmax_q[b]] * nested_absmax[b / 256] + offset. The
     * 16 codes are host memory (the code book); every other pointer is the backend's. */
    void (*dequantize_4bit)(snug_backend *be, float *dst, const uint8_t *packed, const float *absmax,
                            const uint8_t *absmax_q, const float *nested_absmax, const float *nested_map,
                            float nested_offset, const float *code, size_t n, int blocksize);
    /* dst (rows x cols) = bitsandbytes' 8-bit weight widened: element (r, j) is
     * (float)codes[r * cols + j] * snug_q8_row_scale(scb[r]) in fp32. */
    void (*dequantize_int8)(snug_backend *be, float *dst, const int8_t *codes, const float *scb, size_t rows,
                            size_t cols);
    /* dst (n, bf16) = src rounded stochastically: element i adds r_i = the low 16 bits of
     * snug_sr_bits(seed, i) to the fp32 bit pattern and truncates to the top 16 bits, so it rounds up with
     * probability equal to its distance from the lower neighbour. Non-finite values round to nearest. The same
     * (seed, i) gives the same bits on every backend and thread count. */
    void (*bf16_sr)(snug_backend *be, uint16_t *dst, const float *src, size_t n, uint64_t seed);

    /* --- elementwise --- */
    void (*add)(snug_backend *be, float *out, const float *a, const float *b, size_t n); /* out = a + b */
    void (*accumulate)(snug_backend *be, float *dst, const float *src, size_t n);      /* dst += src */
    void (*scale)(snug_backend *be, float *x, float s, size_t n);                      /* x *= s */
    /* Inverted dropout: out (n) = in * keep_i / (1 - p), element i kept when snug_dropout_keep(seed, i, p). The mask
     * depends only on (seed, i), so backward applies the same op to the gradient, and every backend drops the same
     * elements. out may be in. */
    void (*dropout)(snug_backend *be, float *out, const float *in, size_t n, float p, uint64_t seed);
    /* NEFTune's noise: x[i] += mag * snug_uniform_pm1(seed, i), uniform in (-mag, mag), the same bits on every
     * backend (one rounded product, one rounded sum) */
    void (*add_noise)(snug_backend *be, float *x, size_t n, float mag, uint64_t seed);

    /* --- rows and columns (DoRA's weight norms, magnitude gradient and output scale) --- */
    /* out[j] = sqrt(sum_i a[j lda + i]^2) for j < rows, i < cols: each row summed in double, rounded once */
    void (*row_norms)(snug_backend *be, float *out, const float *a, size_t lda, int rows, int cols);
    /* out[j] += (sum_i a[j lda + i] b[j ldb + i]) / div[j]: the sum in double in index order, divided, then rounded
     * and added */
    void (*row_dots)(snug_backend *be, float *out, const float *a, size_t lda, const float *b, size_t ldb, int rows,
                     int cols, const float *div);
    /* out[t ldo + j] = bias[j] + (mag[j] / nrm[j]) * (in[t ldi + j] - bias[j]) for t < N, j < cols; bias NULL: none
     * (no subtraction). The gain rounded once, then each product and sum; out may be in. */
    void (*scale_cols)(snug_backend *be, float *out, size_t ldo, const float *in, size_t ldi, int N, int cols,
                       const float *mag, const float *nrm, const float *bias);
    /* out[j] += (sum_t a[t lda + j] (y[t ldy + j] - bias[j])) / div[j] for j < cols, t < N (bias NULL: y alone): the
     * difference rounded, the sum in double, divided, then rounded and added (DoRA's magnitude gradient from the
     * module's output) */
    void (*col_dots)(snug_backend *be, float *out, const float *a, size_t lda, const float *y, size_t ldy, int N,
                     int cols, const float *bias, const float *div);
    /* out[t ldo + j] += (mag[j] / nrm[j] - minus) * in[t ldi + j]: the gain and the factor rounded once each, then the
     * product and the sum (DoRA with dropout: minus 1 for the base's share, 0 for the adapter's) */
    void (*add_scaled_cols)(snug_backend *be, float *out, size_t ldo, const float *in, size_t ldi, int N, int cols,
                            const float *mag, const float *nrm, float minus);

    /* --- loss: output projection + softmax + cross-entropy, chunked over tokens --- */
    /* For tokens n with labels[n] >= 0: loss_n = logsumexp(h_n . w^T) - (h_n . w^T)[labels[n]]. Returns the sum of
     * loss_n over supervised tokens (the caller divides). When dh or dw is non-NULL, also accumulates
     * grad_scale * d(sum loss)/dh into dh (N,C) and into dw (V,C) (both fp32). Logits exist only `chunk` rows at a
     * time in logits_ws (chunk, V). Tokens with labels[n] < 0 contribute nothing. w (V,C) is stored as wdt; when
     * wdt is not F32 the CPU converts it `wblock` rows at a time into w_ws (wblock, C), or with its matmul_w16 slots
     * filled hands each block of rows to its GEMMs as stored (a GPU backend may read the 16-bit weight directly and
     * ignore w_ws); w_ws is unused for F32. logits_ws holds chunk rows of
     * snug_logits_ld(V) floats, a backend choosing the row stride up to that (the CPU's is V). */
    double (*xent_fwd_bwd)(snug_backend *be, float *dh, float *dw, const float *h, const void *w, snug_dtype wdt,
                           const int32_t *labels, int N, int C, int V, float grad_scale, float *logits_ws,
                           int chunk, float *w_ws, int wblock);
    /* The same loss one block of the head's rows at a time (loss_vocab_block), so that neither the logits nor the
     * head's weight or gradient need to exist beyond one block [v0, v0+vb) of rows (w is that block, (vb,C) as wdt;
     * dw its (vb,C) gradient). pass 0: folds the block's logits into each supervised token's running maximum st_max
     * (-inf before the first block) and sum of exp(logit - st_max) st_sum (0 before; double), and sets st_zy to the
     * label's logit when the label is in the block. pass 1, after every block's pass 0: with those statistics final,
     * G = grad_scale * (softmax - onehot) over the block; dh (N,C) += G @ w, dw (vb,C) += G^T @ h (either NULL to
     * skip). pass 2: returns the summed loss st_max + log(st_sum) - st_zy over the supervised tokens, in a fixed
     * order. logits_ws holds chunk rows of vb floats. NULL on a backend without it (the lever is then off). */
    double (*xent_block)(snug_backend *be, int pass, float *dh, float *dw, const float *h, const void *w,
                         snug_dtype wdt, const int32_t *labels, int N, int C, int V, int v0, int vb, float grad_scale,
                         float *st_max, double *st_sum, float *st_zy, float *logits_ws, int chunk, float *w_ws,
                         int wblock);

    /* --- optimizer --- */
    /* sum of squares of x (n, stored as dt), in double; inf or NaN when x holds one (the loss scaler's check) */
    double (*sumsq)(snug_backend *be, const void *x, snug_dtype dt, size_t n);
    /* The same sums without waiting for each: sumsq_acc adds sumsq(x) to an accumulator the backend keeps (0 when it
     * is created) and returns at once; sumsq_take waits for the work queued so far, returns the accumulator and resets
     * it to 0. The additions are in double in call order, so the total has the bits of adding the sumsq results on the
     * host in that order (the gradient norm of the optimizer step inside backward, summed tensor by tensor). */
    void (*sumsq_acc)(snug_backend *be, const void *x, snug_dtype dt, size_t n);
    double (*sumsq_take)(snug_backend *be);
    /* AdamW with decoupled weight decay, bias correction by step (1-based), torch.optim.AdamW's exact order:
     * p -= lr*wd*p; m = b1*m + (1-b1)*g; v = b2*v + (1-b2)*g*g;
     * p -= lr * (m/(1-b1^step)) / (sqrt(v/(1-b2^step)) + eps). g is read after multiplying by grad_scale.
     * Hyperparameters are doubles because torch derives 1-beta, lr/bc1 and 1-lr*wd from Python doubles. */
    void (*adamw)(snug_backend *be, float *p, const float *g, float *m, float *v, size_t n, double lr, double beta1,
                  double beta2, double eps, double weight_decay, int step, float grad_scale);

    /* --- 8-bit optimizer state (bitsandbytes' blockwise quantization; see optim/optim.h) --- */
    /* Blocks of 256 elements (the last may be short), each scaled by its own fp32 absmax; a code q stands for
     * code[q] * absmax. code (256) is a sorted dynamic map on the device. */
    /* absmax (ceil(n/256)) = max |x| of each block of x (n); q (n) = the nearest code of x/absmax by bitsandbytes'
     * tree search; with is_signed, a code of the wrong sign is moved one step towards x's sign (as for momentum). */
    void (*quantize_blockwise)(snug_backend *be, uint8_t *q, float *absmax, const float *x, const float *code,
                               int is_signed, size_t n);
    /* x (n) = code[q] * absmax[block] */
    void (*dequantize_blockwise)(snug_backend *be, float *x, const uint8_t *q, const float *absmax,
                                 const float *code, size_t n);
    /* 8-bit AdamW, bitsandbytes' kOptimizerStatic8bit2StateBlockwise order, per block of 256, in fp32:
     * g *= grad_scale; v = b2*v + (1-b2)*g*g; m = b1*m + (1-b1)*g (m, v dequantized with the old absmax);
     * new absmax = max |m|, max |v| over the block; p += -lr*sqrt(bc2)/bc1 * m / (sqrt(v) + sqrt(bc2)*eps);
     * p *= 1 - lr*wd (decoupled decay AFTER the update, unlike torch); then m, v are requantized with the new absmax
     * (qm by map_signed with the sign kept, qv by map_unsigned). A non-finite g zeroes m and v and leaves p.
     * qm, qv (n); absmax_m, absmax_v (ceil(n/256)); maps (256) on the device. Blocks are independent. */
    void (*adamw8bit)(snug_backend *be, float *p, const float *g, uint8_t *qm, uint8_t *qv, float *absmax_m,
                      float *absmax_v, const float *map_signed, const float *map_unsigned, size_t n, double lr,
                      double beta1, double beta2, double eps, double weight_decay, int step, float grad_scale);

    /* --- paged optimizer state: host-resident buffers streamed through the device in chunks --- */
    /* No managed (unified) memory: state lives in page-locked host memory and explicit copies move one chunk at a
     * time into a device staging slot and back, on a side stream, so a GPU can overlap the next chunk's copy with
     * this chunk's update. On the CPU these are plain memory, memcpy and a no-op. */
    void *(*host_alloc)(snug_backend *be, size_t bytes); /* pinned host memory, zero-filled, page-aligned */
    void (*host_free)(snug_backend *be, void *p);
    /* Queued on the side stream in order; the data may be used (or the source reused) only after sync. */
    void (*copy_in_async)(snug_backend *be, void *dst, const void *host_src, size_t bytes);
    void (*copy_out_async)(snug_backend *be, void *host_dst, const void *src, size_t bytes);
    /* Makes the ops queued after it wait until the copies queued so far have finished, without blocking the caller:
     * after it, the ops may read a copy's destination and overwrite its source (a GPU: the compute stream waits on an
     * event of the side stream). The host side of a copy is the caller's again only after sync. The CPU's copies are
     * done when they return: nothing to wait for. */
    void (*copy_wait)(snug_backend *be);
    /* Waits until everything queued so far, on the compute stream and the side stream, has finished. */
    void (*sync)(snug_backend *be);

    /* --- failure --- */
    /* The ops above return nothing, so a backend whose ops can fail (a GPU: a CUDA or cuBLASLt error, a kernel
     * fault; the CPU's GEMMs on oneDNN) never aborts: it records its FIRST failure, where and why, and keeps it
     * (sticky) until it is destroyed; ops queued after a failure may do nothing or compute garbage. The caller asks
     * at its sync points (after sync or to_host, at the end of a step or of a decoded token) with snug_backend_check
     * and stops on non-zero. check: 0 while nothing failed, else the error's code with e filled. NULL for a backend
     * whose ops cannot fail. */
    int (*check)(snug_backend *be, snug_error *e);
};

/* The row stride the logits workspace is sized for: V rounded up to 8 floats (32 bytes), so that a GPU's rows and
 * their 16-bit copies start 16-byte aligned, which its 16-bit tensor-core GEMMs need (GPT-2's V = 50257 is odd). */
static inline int snug_logits_ld(int V) { return (V + 7) / 8 * 8; }

/* be->math = math, through the backend's set_math where it has one (see above). */
static inline int snug_backend_set_math(snug_backend *be, snug_dtype math, int M, int N, int K, snug_error *e) {
    if (be->set_math)
        return be->set_math(be, math, M, N, K, e);
    be->math = math;
    return 0;
}

/* 0 when every op so far succeeded, else the backend's first failure (its code, with e filled). */
static inline int snug_backend_check(snug_backend *be, snug_error *e) {
    return be->check ? be->check(be, e) : 0;
}

/* Compiled for the host and, inside CUDA sources, for the device too. */
#ifdef __CUDACC__
#define SNUG_HOST_DEVICE __host__ __device__
#else
#define SNUG_HOST_DEVICE
#endif

/* The random bits of stochastic rounding for element i of a tensor rounded under `seed` (splitmix64 of
 * seed + (i + 1) * golden gamma). Inline so every backend, host or device, computes the same stream. */
static inline SNUG_HOST_DEVICE uint32_t snug_sr_bits(uint64_t seed, uint64_t i) {
    uint64_t z = seed + (i + 1) * 0x9E3779B97F4A7C15ull;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return (uint32_t)((z ^ (z >> 31)) >> 32);
}

/* Dropout's mask: element i survives when its 32 random bits are at or above p * 2^32. */
static inline SNUG_HOST_DEVICE int snug_dropout_keep(uint64_t seed, uint64_t i, float p) {
    return (double)snug_sr_bits(seed, i) >= (double)p * 4294967296.0;
}

/* Element i of a uniform stream on (-1, 1): the 32 bits of snug_sr_bits at the centres of 2^32 equal cells, exact in
 * double and rounded once to float. */
static inline SNUG_HOST_DEVICE float snug_uniform_pm1(uint64_t seed, uint64_t i) {
    return (float)(((double)snug_sr_bits(seed, i) + 0.5) * (1.0 / 2147483648.0) - 1.0);
}

/* The factor of a row of bitsandbytes' 8-bit weight (LLM.int8's SCB, the row's max |w|): SCB * (float)(1/127), as
 * its SCB.mul(1.0 / 127.0), one fp32 rounding. An element is then code * factor. */
static inline SNUG_HOST_DEVICE float snug_q8_row_scale(float scb) { return scb * (float)(1.0 / 127.0); }

/* The CPU backend: OpenMP threads (nthreads <= 0: all cores), OpenBLAS for GEMM and, under bf16 math on a CPU whose
 * bf16 units pay, oneDNN (backend/cpu/gemm_cpu.h). */
snug_backend *snug_backend_cpu_create(int nthreads);

#endif
