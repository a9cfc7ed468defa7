/* model.h: the transformer (Llama family and GPT-2 in one layer implementation), its parameters in one flat buffer,
 * and its forward and backward passes over the backend ops.
 *
 * Parameters live in one flat fp32 buffer laid out layer by layer (globals first, then layer 0..L-1, then the final
 * norm and an untied head), so a layer's parameters, gradients and optimizer state are one contiguous range: the unit
 * that later gets sharded across ranks or updated as soon as backward finishes it. Inside a layer, q/k/v weights are
 * adjacent (one GEMM), as are gate/up. A table maps every range to its Hugging Face tensor name and file layout.
 *
 * The implementation is carved by job (each file opens with what it holds; model_impl.h is what they share):
 * layout.c, acts.c, storage.c, views.c (memory and views), grads.c (gradients, freezing, announcements), gather.c
 * (ZeRO-3 and 4-bit gathers), init.c and weights.c (values in and out), linear.c (a weight made readable for a
 * GEMM), forward.c, backward.c, loss.c and step.c (the passes). */
#ifndef SNUG_MODEL_H
#define SNUG_MODEL_H

#include <stddef.h>
#include <stdint.h>

#include "backend/backend.h"
#include "core/arena.h"
#include "core/error.h"
#include "core/fileio.h"
#include "dist/gather.h"
#include "model/config.h"
#include "model/lora.h"
#include "model/params.h"
#include "model/quant4.h"

/* Pointers to one layer's tensors inside a flat buffer (parameters or gradients). NULL where the arch has none. */
typedef struct snug_layer_tensors {
    float *ln1_w, *ln1_b;   /* (C) */
    float *qkv_w, *qkv_b;   /* (QKV, C), (QKV) with QKV = (NH + 2*NKV) * HD */
    float *o_w, *o_b;       /* (C, NH*HD), (C) */
    float *ln2_w, *ln2_b;   /* (C) */
    float *fc_w, *fc_b;     /* (FC, C), (FC) with FC = 2*I (gate rows, then up rows) for SwiGLU, I for GELU */
    float *proj_w, *proj_b; /* (C, I), (C) */
} snug_layer_tensors;

typedef struct snug_tensors {
    float *wte;             /* (V, C) */
    float *wpe;             /* (maxT, C), GPT-2 only */
    float *lnf_w, *lnf_b;   /* (C) */
    float *lm_head;         /* (V, C); == wte when tied */
    snug_layer_tensors *layers; /* (L) */
} snug_tensors;


/* The memory levers that change what a training step keeps and recomputes. Each is one switch, read in one place
 * (the model's layout and passes); none changes the result: checkpointing gives bitwise the same gradients, the
 * attention paths and the loss chunking agree to fp32 rounding. */
typedef enum snug_ckpt {
    SNUG_CKPT_NONE = 0,   /* keep every activation backward needs */
    SNUG_CKPT_SELECTIVE,  /* drop the norm outputs and the MLP activation (cheap to recompute, C+C+I per token) */
    SNUG_CKPT_FULL,       /* keep only the layer input; recompute the whole layer in backward */
} snug_ckpt;


typedef struct snug_levers {
    snug_ckpt ckpt;
    int ckpt_every;       /* with SNUG_CKPT_FULL: layers l with l % ckpt_every == 0 are checkpointed (1 = all) */
    int ckpt_model_only;  /* save_only_model: checkpoints hold the model files alone, no optimizer state (not
                           * resumable); the snapshot holds no optimizer state either */
    int ckpt_offload;     /* with SNUG_CKPT_FULL: the residual stream (every layer's input) lives in host memory
                           * (SNUG_MEM_OFFLOAD), copied out after each layer's forward and back before its backward */
    int naive_attention;  /* flash_attention: false: the reference path that stores (B, NH, T, T) probabilities */
    int xent_chunk;       /* tokens per logits chunk (chunked_cross_entropy); 0 = every token of the micro-batch */
    int offload_embedding; /* the frozen input embedding (adapters, 16-bit, untied head) in host memory
                            * (SNUG_MEM_OFFLOAD): the embedding op reads the micro-batch's rows there */
    int offload_params;   /* an adapter's frozen base in host memory (SNUG_MEM_OFFLOAD; at ZeRO-3 the rank's share),
                           * each layer's copied to a device buffer before it runs: QLoRA's 4-bit matrices
                           * (q4_sharded), or LoRA's base laid out as ZeRO-3's (param_sharded, the whole table the
                           * rank's shard without stage 3) */
    int mlp_shards;       /* tiled_mlp: 0 off; k >= 1: every block's MLP runs over k shards of the micro-batch's
                           * tokens, its activations never saved but recomputed shard by shard in backward;
                           * -1: k = ceil(tokens / hidden size) */
    int pack_grads;       /* frozen tensors (unfrozen_parameters) get no gradient storage: the gradient buffers hold
                           * only the tensors that train (and the frozen ones fused with them, q/k/v and gate/up,
                           * which one GEMM writes together); snug_model_grad gives NULL for the others. Set where the
                           * gradients are summed and stepped tensor by tensor at their grad_off (not under ZeRO, whose
                           * shards are ranges of the table, nor with the step inside backward) */
    int optimizer_in_backward; /* gradients exist one layer at a time (plus the global tensors): each layer is
                                * stepped from grads_ready and its buffer reused by the next */
    /* precision (bf16: true / fp16: true): parameters, saved activations and layer gradients stored as dt, every op
     * computing in fp32 on widened copies (one layer's weights and activations at a time, in the workspace) */
    snug_dtype dt;        /* SNUG_DT_F32 (0, the default), SNUG_DT_BF16 or SNUG_DT_F16 */
    int master_weights;   /* 16-bit: an fp32 master copy of the parameters takes the update (SNUG_MEM_MASTER) */
    int grads_fp32;       /* 16-bit: layer gradients in fp32 anyway: accumulation over micro-batches sums in fp32 */
    int zero_grads;       /* ZeRO-2: the layers' gradients pass through one shared buffer (as optimizer_in_backward's),
                           * each reduce-scattered from grads_ready into `gshard`, the rank's shard of the sum, which
                           * the optimizer reads (ZeRO-3 with optimizer_in_backward: no gshard; the rank's part of
                           * each layer's sum is stepped where the reduce-scatter leaves it, in the buffer) */
    int zero_overlap;     /* with zero_grads: two such buffers, the layers alternating between them (layer l in buffer
                           * l % 2), so that a layer's reduce-scatter may still run while backward writes the next one's
                           * (zero_overlap_comm) */
    int vocab_block;      /* loss_vocab_block: the loss over the vocabulary `vocab_block` rows of the head at a time
                           * (xent_block), so the logits are (chunk, rows) and, under ZeRO-2/3 with a tied head, no rank
                           * holds the whole embedding's weight or gradient; -1: rows of one layer's size; 0: off */
    snug_lora_cfg lora;   /* adapter: lora (kind SNUG_ADAPTER_NONE: full fine-tuning) */
} snug_levers;


/* The weight of a site among a layer's tensors: (width, in). */
static inline float *snug_site_weight(const snug_layer_tensors *w, snug_site site) {
    return site == SNUG_SITE_QKV ? w->qkv_w : site == SNUG_SITE_O ? w->o_w : site == SNUG_SITE_FC ? w->fc_w : w->proj_w;
}


/* Where the gradients of one contiguous range of the parameter table are (snug_model_ready_ranges). */
typedef struct snug_grad_range {
    size_t offset, numel;   /* the parameters [offset, offset+numel), floats into the table */
    snug_dtype dt;          /* SNUG_DT_F32: their gradients are in grads; m->lv.dt (16-bit): in grads16 */
    size_t at;              /* elements into that buffer: the gradient of parameter offset+k is element at+k */
    void *data;             /* grads + at or grads16 + at; NULL (and at meaningless) without gradients */
} snug_grad_range;

/* The ranges one snug_grads_ready_fn call announces: a layer is one range; the global tensors (layer -1) are the
 * ones before the layers (embeddings) and after them (final norm, untied head). Under lv.zero_grads the ones after
 * the layers are announced apart, as layer SNUG_READY_POST, and layer -1 is the ones before them. */
enum { SNUG_READY_MAX_RANGES = 2, SNUG_READY_POST = -2, SNUG_READY_ROWS = -3 };

/* The hook grads_ready (snug_model_hook_ops), called by snug_model_step's backward as gradients become final for
 * the micro-batch, in backward order: layer L-1, ..., 0, each after its backward, then layer -1 (every global
 * tensor) after the embedding backward. Over one step each parameter of the table is announced exactly once.
 *   layer >= 0: [offset, offset+numel) = [table.layer_offset[layer], + table.layer_numel[layer]), the layer's range
 *               of the parameter table.
 *   layer -1:   the global tensors, which are not one range of the table (they sit before and after the layers):
 *               [offset, offset+numel) wraps past the end of the table, i.e. [offset, table.total) then
 *               [0, offset + numel - table.total). numel is the number of global parameters.
 *   SNUG_READY_POST (lv.zero_grads only): the global tensors after the layers (the final norm, an untied head),
 *               announced after the final norm's backward, before layer L-1's; layer -1 then announces only the
 *               ones before the layers (the embeddings). Their gradient buffer is the layers' next: consume them
 *               there and zero them.
 * offset and numel index the parameter table, not a gradient buffer: where the gradients are (fp32 grads or 16-bit
 * grads16, and the element offset in it) depends on the layout; snug_model_ready_ranges(m, layer, ...) gives it as
 * one snug_grad_range per contiguous piece. The gradients there hold the sum over the micro-batches run since they
 * were last zeroed. With optimizer_in_backward every layer's gradients go to the same buffer, which holds the
 * announced layer's only until the callback returns: consume them there and zero them (the next layer accumulates
 * into it). */
typedef void (*snug_grads_ready_fn)(void *ud, int layer, size_t offset, size_t numel);

/* ZeRO-3's gather (hook gather_params): dst holds numel elements of the stored dtype (fp32, or m->lv.dt under 16-bit
 * storage) for the table elements [offset, offset+numel); the model has already copied this rank's piece (its
 * shard's part of the range) to its place in dst, and the callback fills the other ranks' pieces (an all-gather).
 * Every rank calls it in the same order with the same ranges (snug_model_step, snug_model_skip_step). With prefetch
 * set (the next layer's gather, issued while this one computes) the gather may still be running when the callback
 * returns (SNUG_COMM_ASYNC): the model calls it again with dst NULL (a wait) before anything reads or writes dst. */
typedef void (*snug_gather_fn)(void *ud, void *dst, size_t offset, size_t numel, int prefetch);

/* QLoRA at ZeRO-3's gather (hook gather_q4): dst holds nranks pieces of `piece` bytes (a layer's 4-bit span), this
 * rank's already in place at rank x piece; the callback fills the others' (an all-gather of opaque bytes). The same
 * order on every rank, prefetch and the wait (dst NULL) as for snug_gather_fn. */
typedef void (*snug_gather_q4_fn)(void *ud, void *dst, size_t piece, int prefetch);

/* A tied embedding split by rows (m->vtied: ZeRO-2/3 with loss_vocab_block). The rows are the table elements
 * [base + row*C, +C) of rows `rows[0..n)` (increasing), or of rows first, first+1, ... when rows is NULL; buf holds
 * them one after another. SNUG_ROWS_GATHER (ZeRO-3): buf (stored dtype) holds this rank's pieces (its shard's part of
 * each row) in place; fill the others' (an all-gather). SNUG_ROWS_REDUCE: buf (fp32) is this rank's gradient of
 * those rows; sum it over the ranks, add this rank's part of the sum into gshard and zero buf. SNUG_ROWS_IDS: buf is
 * (ranks, n) int32 with this rank's n ids at its slot; fill the others' (rows, base unused). Every rank calls it in
 * the same order with the same rows. */
enum { SNUG_ROWS_GATHER, SNUG_ROWS_REDUCE, SNUG_ROWS_IDS };
typedef void (*snug_rows_fn)(void *ud, int op, void *buf, size_t base, const int32_t *rows, int first, int n, int C);

/* Tensor parallelism's sum (hook tp_reduce): buf (backend memory, n floats) summed over the tensor-parallel ranks in
 * place, the same bits on every rank. Every rank calls it in the same order with the same n. */
typedef void (*snug_tp_reduce_fn)(void *ud, float *buf, size_t n);
/* Tensor parallelism's gather (hook tp_gather): buf (host memory) holds tp pieces of n doubles, this rank's at
 * tp_rank x n; the callback fills the others' (an all-gather). The same order on every rank. */
typedef void (*snug_tp_gather_fn)(void *ud, double *buf, size_t n);

/* The model's hooks: every way a step talks to the world outside the model (the other ranks), as one table of
 * operations and the one context they all get (m->hooks). The table is filled in one place, the parallel object
 * (train/parallel.c), whose state each operation finds in ud; a test fills one with fakes of its own. A NULL table
 * or a NULL operation: not used (the step then does the one-process thing). */
typedef struct snug_model_hook_ops {
    snug_gather_fn gather_params;    /* ZeRO-3: the parameters of a range of the table, gathered */
    snug_gather_q4_fn gather_q4;     /* QLoRA at ZeRO-3: a layer's 4-bit span, gathered */
    snug_grads_ready_fn grads_ready; /* gradients final (DDP's buckets, ZeRO-2's reduce-scatter, the step inside
                                      * backward) */
    snug_rows_fn rows;               /* a tied embedding split by rows (vtied) */
    snug_tp_reduce_fn tp_reduce;     /* tensor parallelism's sum */
    snug_tp_gather_fn tp_gather;     /* tensor parallelism's gather */
} snug_model_hook_ops;

typedef struct snug_model_hooks {
    const snug_model_hook_ops *ops; /* NULL: none */
    void *ud;                       /* every operation's first argument */
} snug_model_hooks;

/* Activations saved by forward for backward, per layer. With a 16-bit dt the large ones are saved as dt in
 * snug_layer_acts16 and these pointers are the fp32 compute buffers of the layer being run (shared by all layers);
 * the small per-row statistics (lse, mean, rstd) and naive attention's probs stay fp32 per layer. */
typedef struct snug_layer_acts {
    float *ln1;          /* (N, C) */
    float *ln1_mean;     /* (N) LayerNorm only */
    float *ln1_rstd;     /* (N) */
    float *qkv;          /* (N, QKV) q and k roped */
    float *att;          /* (N, NH*HD) */
    float *lse;          /* (N, NH) */
    float *probs;        /* (B, NH, T, T) naive attention only */
    float *res_mid;      /* (N, C) residual after attention */
    float *ln2;          /* (N, C) */
    float *ln2_mean;     /* (N) */
    float *ln2_rstd;     /* (N) */
    float *fc;           /* (N, FC) */
    float *act;          /* (N, I) */
} snug_layer_acts;

typedef struct snug_layer_acts16 {
    uint16_t *ln1, *qkv, *att, *res_mid, *ln2, *fc, *act; /* shapes as in snug_layer_acts; NULL: not kept */
} snug_layer_acts16;

/* One micro-batch's saved activations (see snug_model.act_sets) */
typedef struct snug_act_set {
    float *res;                /* fp32 without offloading: the residual stream (L+1, N, C); NULL otherwise */
    uint16_t *res16;           /* 16-bit: its saved copy */
    void *res_off;             /* ckpt_offload: in host memory */
    snug_layer_acts *acts;     /* (L) */
    snug_layer_acts16 *acts16; /* (L) */
} snug_act_set;

/* pipeline_layers: each stage's count of layers as listed (n counts), or n 0 for an even split. */
typedef struct snug_pp_split {
    const int *layers;
    int n;
} snug_pp_split;

typedef struct snug_model {
    snug_model_config cfg;
    snug_block blk;        /* snug_block_of(&cfg), resolved once (snug_plan_model_init) for the layer code */
    snug_backend *be;
    snug_param_table table;
    snug_levers lv;        /* set before layout */
    int B, T;              /* largest micro-batch the activations are laid out for */
    int cur_B, cur_T;      /* shape of the current micro-batch (<= B, T) */
    int QKV, FC;           /* derived widths */
    int xent_chunk;        /* tokens per logits chunk */
    int mlp_rows;          /* tiled_mlp: tokens per MLP shard (the fc/act buffers' rows); 0 when not tiled */

    /* Parameters. fp32: `params` (SNUG_MEM_PARAMS). 16-bit: `params16` (SNUG_MEM_PARAMS) is what forward and
     * backward read, and `params` is the fp32 master copy (SNUG_MEM_MASTER) or NULL without master weights. */
    float *params;         /* flat (table.total) */
    uint16_t *params16;    /* flat (table.total), 16-bit dt only */
    /* Gradients (SNUG_MEM_GRADS, none for inference). Tensor i's gradient starts at grad_off[i] of grads16 when
     * snug_model_grad16(m, i), else of grads. grads: every tensor (flat like the parameters), or only the global
     * tensors when the layers' gradients are 16-bit. With optimizer_in_backward one layer's buffer (in grads or
     * grads16) is shared by all layers in turn. */
    float *grads;
    uint16_t *grads16;
    size_t *grad_off;      /* (table.n) */
    size_t grads_numel;    /* floats in grads */
    size_t grads16_numel;  /* elements in grads16 */
    float *gshard;         /* lv.zero_grads: (gshard_n) the summed gradients of table floats [gshard_lo, +gshard_n) */
    snug_dtype file_dt;    /* the dtype model.safetensors gets fp32 weights in: F32 (0), or BF16/F16 rounded to nearest
                            * even as torch rounds (a final save of a 16-bit base, as save_pretrained writes it) */
    int master_sharded;    /* ZeRO, 16-bit with master weights: `params` (the master copy) holds only table floats
                            * [master_lo, +master_n), the rank's shard; set before layout */
    size_t master_lo, master_n;
    size_t gshard_lo, gshard_n;
    /* ZeRO-3 (param_sharded, set before layout): params (fp32) or params16 (16-bit) holds only table elements
     * [pshard_lo, +pshard_n), the rank's shard. Forward and backward read a layer from one of two layer-sized
     * gather buffers (layer l in gpair.buf[l % 2], all-gathered before its forward and again before its backward unless
     * it is still there), and the global tensors from `gglob` (pre-layer globals, then the post-layer ones),
     * gathered before the embedding and again before the loss. Both live in one region of SNUG_MEM_PARAMS of
     * max(globals, two layers) elements, since the globals and the layers are never read at the same time; with an
     * untied head the embedding reads only the pre-layer globals and the loss only the post-layer ones, so those
     * are gathered one set at a time (gsplit) and the region is max(pre, post, two layers). */
    int param_sharded;
    size_t pshard_lo, pshard_n;
    snug_gather_pair gpair; /* the two layer buffers (buf[k]: (largest layer) each, stored dtype), the layer each
                             * holds and the prefetches under way (settled before the region is touched) */
    int gdir;              /* the pass under way: +1 forward, -1 backward (which layer to prefetch), 0 none */
    void *gglob;           /* (globals) stored dtype; aliases the layer buffers */
    int gsplit;            /* untied head: the pre- and post-layer globals take turns at gglob's start (the region is
                            * max(pre, post, two layers)); else both, one after the other */
    int gglob_ok;          /* which globals gglob holds (bits 1 pre, 2 post; no layer gathered since) */
    size_t gbuf_n, gregion_n; /* elements of a layer buffer (the largest layer, rounded up to 32) and of the region */
    size_t gglob_n;        /* elements the globals take in the region at most (both sets, or the larger with gsplit) */
    size_t gpre_n, gpost_n; /* globals before the layers ([0, gpre_n)) and after them ([total - gpost_n, total)) */
    snug_layer_tensors gbuf_t[2]; /* fp32: views into gpair.buf[k] */
    snug_tensors w, g;     /* views into params / grads (fp32 tensors only: g has no layer views when grads16); a
                            * global view whose tensors are all frozen is NULL (unfrozen_parameters) */
    int frozen_any;        /* a table entry is frozen or trained in ranges: backward skips and zeroes their gradients */
    size_t gwte, gwpe, glnf_w, glnf_b, ghead; /* where the global tensors start in the table ((size_t)-1: none) */

    /* 16-bit dt: fp32 copies of the layer being run, carved in the workspace */
    float *wl, *gl;        /* (largest layer) weights widened from params16; gradients before rounding to grads16 */
    snug_layer_tensors wl_t, gl_t; /* views into wl / gl (every layer has the same layout) */
    int wl_layer;          /* the layer wl holds, -1 none */
    /* Where the backend's GEMMs take 16-bit weights as stored (its matmul_w16 slots), wl holds only the layer's
     * norms and biases (views wd_t: wl_t without the four matrices) and each site's weight is read from params16 */
    int wl_direct;         /* 1 when wl holds its layer that way */
    const uint16_t *wl16[SNUG_NSITES]; /* (rows, in) each site's weight as stored: q/k/v, o, gate/up or fc, down */
    snug_layer_tensors wd_t;
    float *lnf_ws;         /* (2, C) the final norm's weight and bias widened */
    float *w_ws;           /* (wblock, C) rows of the 16-bit output head widened for the loss */
    int wblock;

    float *res;            /* (L+1, N, C) residual stream: layer inputs and the final output. 16-bit dt: (2, N, C)
                            * fp32 in the workspace, layer l's input in slot l % 2, and res16 keeps them all */
    uint16_t *res16;       /* (L+1, N, C) 16-bit dt: the layer inputs, saved */
    void *res_off;         /* (L+1, N, C) as dt, in host memory (SNUG_MEM_OFFLOAD): ckpt_offload's layer inputs */
    uint16_t *res_stage;   /* (N, C) 16-bit dt with ckpt_offload: a layer input rounded, on its way to or from host */
    snug_layer_acts *acts; /* (L) */
    snug_layer_acts16 *acts16; /* (L), 16-bit dt only */
    float *lnf;            /* (N, C) */
    float *lnf_mean, *lnf_rstd; /* (N) */

    /* workspace shared by all layers in backward */
    float *d_res;          /* (N, C) */
    float *d_ln;           /* (N, C) */
    float *d_qkv;          /* (N, QKV) */
    float *d_att;          /* (N, NH*HD) */
    float *d_fc;           /* (N, FC) */
    float *d_act;          /* (N, I) */
    float *logits;         /* (xent_chunk, V) */

    /* data of the current micro-batch (SNUG_MEM_DATA) */
    int32_t *ids, *labels, *pos, *seg; /* (N) each */
    int seg_used;          /* seg holds segment starts for this batch (packing); else plain causal */
    int32_t *win;          /* (N) the first key each token sees in a sliding layer, max(seg, t - W + 1); NULL
                            * without a sliding window (cfg.sliding_window, laid out only then) */
    int win_used;          /* win holds this batch's first keys (the window is shorter than its rows) */
    float *rope_cos, *rope_sin;        /* (T, HD/2) */

    snug_lora lora;        /* adapter: lora (lora.on) */
    float neftune_alpha;   /* NEFTune: a training step's embeddings get uniform noise of alpha / sqrt(T x hidden) (its
                            * stream from lora.seed, the micro-batch's); 0 = none */
    /* Where each tensor is stored. Normally at its table offset in params / params16. Under QLoRA the block
     * matrices are 4-bit (q4[i].packed set, each carved from SNUG_MEM_PARAMS) and the other tensors are packed
     * densely: soff[i] is tensor i's place in params16 (dense_total elements). */
    size_t *soff;          /* (table.n) */
    size_t dense_total;
    int packed;            /* soff packs the tensors kept in params16 (QLoRA, or offload_embedding): not table offsets */
    int emb_entry;         /* offload_embedding: the embedding's table entry, stored in emb16 (host), else -1 */
    uint16_t *emb16;
    snug_q4_tensor *q4;    /* (table.n), NULL without QLoRA */
    void **q4_block;       /* (table.n) the block each q4[i] was carved from (its bytes are contiguous) */
    /* QLoRA never widens a whole layer: each linear runs over row chunks of its 4-bit matrices, dequantized one
     * chunk at a time into wq (workspace, wq_n floats), and wl holds only the layer's dense tensors (norms,
     * biases). q4_site[i]: the site and the first output row of matrix i, and its rows per chunk. */
    struct snug_q4_site {
        int site;          /* snug_site */
        int row0;          /* its rows of the site's (fused) output */
        int chunk_rows;    /* rows per chunk: the whole matrix, or a multiple of what keeps chunks block-aligned */
    } *q4_site;            /* (table.n) */
    float *wq;             /* (wq_n) one chunk of a 4-bit matrix, dequantized */
    size_t wq_n;
    size_t wl_n;           /* floats in wl */
    float *ones;           /* (N) ones: a QLoRA linear's bias added by a GEMM */
    /* QLoRA at ZeRO-3, or with lv.offload_params (q4_sharded, set before layout with q4_parts and q4_part): layer
     * l's 4-bit matrices are one span of bytes (matrix i at q4_rel[i] in it, 64-byte aligned) cut into q4_parts
     * equal pieces of q4_piece[l] bytes. The rank keeps piece q4_part of every layer in q4_shard (layer l's at
     * q4_soff[l]; in host memory with offload_params); before a layer's forward and backward its span is
     * assembled in q4pair.buf[l % 2] (the rank's piece copied in, the others' all-gathered) unless it is still there,
     * and the next layer of the pass is prefetched into the other buffer, as gathered_layer does for the dense
     * layers. The base is frozen, so a gathered layer stays valid across steps. q4[i] is carved where its layer was
     * last gathered (q4_block unused). The dense tensors (embedding, head, norms) stay whole on every rank;
     * snug_model_entry_f32 and snug_model_get_params read the 4-bit matrices only with q4_parts 1 (at stage 3 no
     * rank holds them whole). */
    int q4_sharded;
    int q4_parts, q4_part; /* the pieces of a span and this rank's: nranks and rank at ZeRO-3, else 1 and 0
                            * (offload_params alone: the whole span kept in host memory, copied in, no gather) */
    size_t *q4_rel;        /* (table.n) */
    size_t *q4_piece, *q4_soff; /* (n_layer) bytes */
    size_t q4_shard_n, q4_gbuf_n; /* bytes of q4_shard and of each buffer */
    char *q4_shard;
    snug_gather_pair q4pair; /* the two buffers (buf[k]: q4_gbuf_n bytes each), the layer each holds and the
                              * prefetches under way */

    snug_model_hooks hooks; /* the gathers, the grads-ready announcements, the rows and tensor parallelism's sums and
                             * gathers (see snug_model_hook_ops) */

    /* loss_vocab_block: the loss vb rows of the head at a time (0: the whole vocabulary in one pass), with each
     * token's running statistics st_max, st_sum, st_zy (N each, workspace). vtied (ZeRO-2/3, tied head): the
     * embedding's gradient never exists whole. Each block's head gradient is reduced as soon as it is complete
     * (through the layer buffer, hook rows, SNUG_ROWS_REDUCE), except the rows some rank's micro-batch looks up: those
     * (the union of every rank's ids, urow[0..nU), from SNUG_ROWS_IDS) wait in ubuf for the embedding's backward and
     * are reduced after it. Under ZeRO-3 the embedding is not among the gathered globals either: the loss gathers
     * each block into the region and the lookup gathers the urow rows into urows. nranks, rank: set before layout. */
    int vb, vtied, nranks, rank;
    float *st_max, *st_zy;
    double *st_sum;
    int32_t *uids;         /* (nranks, N) every rank's ids of the micro-batch, -1 past its tokens */
    int32_t *urow;         /* (umax) the rows they look up, increasing */
    int32_t *ids_u;        /* (N) this rank's ids as indices into urow */
    int nU, umax;
    float *ubuf;           /* (umax, C) fp32: the urow rows' gradient */
    void *urows;           /* ZeRO-3: (umax, C) stored dtype: the urow rows' weights, in the region after the
                            * globals, where the loss's block goes later */
    size_t gpre_lo;        /* ZeRO-3 with vtied: the pre-layer globals gathered are [gpre_lo, gpre_n) */

    /* Tensor parallelism (Megatron's layout; tp > 1, set before layout with tp_rank and tp_cfg): cfg is this rank's
     * share of tp_cfg's blocks (snug_tp_config: n_head, n_kv_head and intermediate_size divided by tp), so the table
     * holds the rank's query and key/value heads and its rows of gate/up (column-parallel, sliced by rows) and the
     * matching columns of o_proj and down_proj (row-parallel, sliced by columns); the embeddings, the norms, the
     * head and the row-parallel biases are whole on every rank. Each block's two row-parallel outputs are summed
     * over the ranks (tp_reduce) before the residual adds them, the bias added by rank 0 alone; in backward the
     * gradients of the two norms' outputs are summed before the norms' backward. So every rank holds the same
     * residual stream, the same loss and the same gradients of the whole tensors.
     * tp_vocab (set before layout; a backend with xent_block, in host memory): the vocabulary is split too, cfg's
     * vocab_size the rank's rows [tp_rank x V/tp, +V/tp) of the embedding and the head. The lookup takes the ids in
     * the rank's rows (ids_tp: the others -1, a zero row) and sums over the ranks; the loss runs over the rank's rows
     * as blocks (loss_blocks), each token's statistics (running maximum, sum of exponentials, the label's logit)
     * gathered from every rank (tp_gather, into tp_st) and combined in rank order between its passes, and the final
     * norm's output gradient is summed over the ranks. */
    int tp, tp_rank;
    snug_model_config tp_cfg;
    int tp_vocab;
    int32_t *ids_tp;       /* (N) SNUG_MEM_DATA: the micro-batch's ids as rows of the rank's vocabulary, -1 elsewhere */
    double *tp_st;         /* (tp, 3, N) SNUG_MEM_WORKSPACE: every rank's statistics of each token */

    /* Pipeline parallelism (pp > 1, set before layout with pp_stage, pp_l0 and pp_L): this rank is stage pp_stage
     * of pp; cfg is the whole model's with n_layer its layers (layers pp_l0.. of pp_L, snug_pp_layers), the table
     * holds them (named as the whole model's) with the embedding on the first stage and the final norm and head on
     * the last (a tied head: the embedding again, its gradient summed with the first stage's by the caller).
     * snug_model_stage runs a micro-batch through the stage; the stage's input and output cross to the next stage
     * through these buffers (N x C fp32 each, backend memory): pp_in, the inputs received (snug_pp_in_slots of them,
     * SNUG_MEM_ACTS; stages after the first), pp_out the output forward leaves to send and pp_dout the gradient of
     * the output received (stages before the last), pp_din the input's gradient backward leaves to send (stages
     * after the first) (SNUG_MEM_WORKSPACE). */
    int pp, pp_stage, pp_l0, pp_L, pp_slots;
    snug_pp_split pp_split; /* pipeline_layers as configured (snug_pp_layers) */
    float *pp_in, *pp_out, *pp_dout, *pp_din;
    /* The saved activations as sets (set before layout: pp_keep, 0 or 1 for one): a stage before the last that does
     * not recompute keeps one set per micro-batch in flight (pp_keep = pp_slots), each a residual stream and every
     * layer's saved activations; snug_model_use_set points res/res16/res_off and acts/acts16 at set k, which forward
     * fills and backward reads. act_set: the set in use. */
    int pp_keep, act_set, act_sets_n;
    snug_act_set *act_sets;
} snug_model;

/* Pipeline parallelism: whether this rank holds the embedding (the first stage) and the head (the last). */
static inline int snug_pp_first(const snug_model *m) { return m->pp <= 1 || m->pp_stage == 0; }
static inline int snug_pp_last(const snug_model *m) { return m->pp <= 1 || m->pp_stage == m->pp - 1; }
/* Pipeline parallelism: the slots of pp_in, the stage's inputs kept: one per micro-batch in flight where its backward
 * runs the forward again (pipeline_recompute), else one (the forward keeps the input in the micro-batch's set). */
static inline int snug_pp_in_slots(const snug_model *m) {
    return m->act_sets_n > 1 || m->pp_slots < 1 ? 1 : m->pp_slots;
}

/* 1 when tensor i's gradient is stored 16-bit in grads16 (a layer tensor under a 16-bit dt without grads_fp32). */
int snug_model_grad16(const snug_model *m, int i);
/* Where tensor i's gradient starts (in grads16 or grads) and, in dt, how it is stored; NULL for a frozen tensor without
 * gradient storage (lv.pack_grads). */
void *snug_model_grad(const snug_model *m, int i, snug_dtype *dt);
/* Where layer's gradients are (layer -1: the global tensors'), one range per contiguous piece of the table, in table
 * order, each contiguous in its gradient buffer too. Writes at most max ranges to out and returns how many there are
 * (1 for a layer, at most SNUG_READY_MAX_RANGES). Depends only on the layout, so it can be called at any time after
 * snug_model_layout, e.g. to plan buckets before the first step. */
int snug_model_ready_ranges(const snug_model *m, int layer, snug_grad_range *out, int max);
/* The announcement (the `layer` argument of grads_ready) that carries table entry i's gradients: its layer, -1,
 * or SNUG_READY_POST. */
int snug_model_ready_group(const snug_model *m, int i);
/* The fp32 parameters when they are host memory the caller may read and write in place (the CPU backend, fp32);
 * NULL otherwise: go through snug_model_put_params / snug_model_get_params. */
float *snug_model_host_params(const snug_model *m);
/* The parameters at `offset` (floats into the table) as forward reads them: in params16 under a 16-bit dt (stored
 * as m->lv.dt), else in params (F32). */
const void *snug_model_stored(const snug_model *m, size_t offset);

/* ZeRO-3 on a backend whose memory is host memory: the gather region as n floats of host scratch, when it is that
 * large (what it held is gathered again before it is read); NULL otherwise. Loading stages each tensor there, so
 * the load needs no tensor-sized buffer beside the arenas. */
float *snug_model_host_scratch(snug_model *m, size_t n);

/* ZeRO-3: the collectives of one snug_model_step without its compute, in the same order (the gathers of forward
 * and, with train, those of backward with each layer's grads-ready callback): a rank with no micro-batch left at the
 * end of an epoch, or no validation micro-batch of its own, still joins every other rank's gathers. Nothing without
 * param_sharded or q4_sharded (train: only the grads-ready callbacks, as ZeRO-2's idle rank makes them). */
void snug_model_skip_step(snug_model *m, int train);

/* Entry i of the base as fp32 values into dst (backend memory, numel floats): the parameters, or widened. */
void snug_model_entry_f32(const snug_model *m, int i, float *dst);
/* 4-bit matrix i from buf (snug_q4_bytes of it, its parts as snug_q4_carve lays them out, host memory) and its
 * nested_offset: copied to where the model keeps it (under q4_sharded, only this rank's piece of it). */
void snug_model_put_q4(snug_model *m, int i, const void *buf, float nested_offset);

/* The tensors that train: the adapters' table under LoRA, else the model's. */
static inline const snug_param_table *snug_model_trainable(const snug_model *m) {
    return m->lora.on ? &m->lora.table : &m->table;
}

/* The adapters fitted to the model (adapter.c; the adapters themselves are lora.h's). */

/* Builds the adapter table (A and B of each adapted module, layer by layer, named
 * "base_model.model.<module>.lora_A.weight"; in memory the A's of one site's modules side by side, then their B's)
 * and the module list of m->lora from m->lv.lora; nothing when kind is NONE. Called by snug_model_layout. */
int snug_lora_build(snug_model *m, snug_error *e);
/* DoRA: the magnitudes set to the base's row norms, when snug_lora_init left them pending (the base sharded over
 * ranks, read through its gathers: every rank calls it, once they are set); nothing otherwise. */
void snug_lora_dora_start(snug_model *m);
/* PEFT's initialisation: A Kaiming-uniform (bound 1/sqrt(in)), B zero; deterministic in seed. */
int snug_lora_init(snug_model *m, uint64_t seed);
/* The base table's entry that lora_modules_to_save's module `bit` (SNUG_SAVE_EMBED, SNUG_SAVE_HEAD) copies; -1: none. */
int snug_lora_saved_entry(const snug_model *m, unsigned bit);
/* Under ZeRO-3 (a sharded base): the trained copies of lora_modules_to_save from the base folder's file, rounded to
 * the base's storage as loading rounds them, so they start as the base's tensors do without the shards. */
int snug_lora_saved_from_file(snug_model *m, const char *dir, snug_error *e);
/* Rows [row, row + nr) of layer l's weight at site (out features, in features as (rows, in)) in fp32 into dst
 * (nr, in): copied, widened from 16 bits or dequantized from 4. Within a layer's pass, or outside the passes where
 * nothing needs a collective (not under ZeRO-3). */
void snug_model_site_rows(snug_model *m, int l, snug_site site, int row, int nr, int in, float *dst);
/* Copies the adapter weights of src into dst (both laid out with the same adapters). */
void snug_lora_copy(snug_model *dst, const snug_model *src);

/* Frees the host-side pieces snug_model_layout allocated (tables, views, the storage layout); not the arenas. */
void snug_model_free_host(snug_model *m);

/* Builds the parameter table for a config (no allocation of model memory). */
int snug_param_table_build(snug_param_table *t, const snug_model_config *cfg, snug_error *e);
/* The index of the entry named name in t, or -1. */
int snug_param_table_find(const snug_param_table *t, const char *name);
/* unfrozen_parameters (Axolotl's freeze_layers_except): every tensor of t frozen but those a pattern matches. patterns:
 * NULL or none = every tensor trains. A pattern is a regular expression matched at the start of a tensor's name
 * (Python's re.match), each '.' a literal dot; an optional "[a:b]" at its end ("[a]", "[a:]", "[:b]") trains only
 * those rows of the tensor's first dimension, their gradient kept and the other rows' zeroed (the tensor stays in
 * the optimizer, so weight decay still reaches every row, as in Axolotl). *unmatched (when not NULL): the number
 * (1-based) of the first pattern that matches no tensor of t, 0 when each matches one. A broken pattern or a range
 * outside the tensor is SNUG_EINPUT naming it. */
int snug_param_table_freeze(snug_param_table *t, const snug_patterns *patterns, int *unmatched, snug_error *e);
/* The floats of t that train (not frozen). */
size_t snug_param_table_trained(const snug_param_table *t);
/* The global tensors a table holds (pipeline parallelism: a stage's share of the model) */
enum {
    SNUG_PARTS_EMBED = 1, /* the token embedding and GPT-2's positions (the first stage) */
    SNUG_PARTS_HEAD = 2,  /* the final norm and the head, a tied head as the token embedding (the last stage) */
};
/* The table of cfg's layers, named as layers l0, l0 + 1, ... of a whole model, with the global tensors of parts. */
int snug_param_table_build_part(snug_param_table *t, const snug_model_config *cfg, int l0, int parts,
                                snug_error *e);
/* Pipeline parallelism: the layers [*l0, *l0 + *n) of stage `stage` of pp over a model of L layers: as split lists
 * them (pipeline_layers: pp counts, each at least 1, that sum to L), or with split.n 0
 * L / pp each, the remainder one more each on the stages after the first (which holds the embedding). -1 when it
 * cannot be (L < pp, a list that does not fit). */
int snug_pp_layers(int L, int pp, snug_pp_split split, int stage, int *l0, int *n);
/* The stage that holds layer `layer` of the whole model (-1: a global tensor, on the first stage when it comes before
 * the layers (pre: the embeddings), else on the last). */
int snug_pp_stage_of(int L, int pp, snug_pp_split split, int layer, int pre);

/* Tensor parallelism: one rank's share of a model config's blocks over tp ranks (n_head, n_kv_head and
 * intermediate_size divided by tp; the rest as it is). NULL, with why (naming the setting) in *why, where it does
 * not divide. */
const snug_model_config *snug_tp_config(const snug_model_config *g, int tp, snug_model_config *local, char *why,
                                        size_t n);
/* Tensor parallelism: whether the vocabulary splits over tp ranks too (the embedding and head by rows): when it
 * divides by tp and the loss runs over blocks of the head's rows (not on a GPU yet). */
int snug_tp_vocab_split(const snug_model_config *g, int tp, int device_cuda);
/* Entry l of a rank's table as a slice of entry g of the whole model's (the same name), in the table's layout (a
 * transposed entry's rows are its file's columns): 0 whole, 1 rows (the rank takes rows [part * l.rows, +l.rows), or
 * of each of its segs parts the rank's share), 2 columns (of every row, columns [part * l.cols, +l.cols)). */
int snug_tp_slice_kind(const snug_param_entry *g, const snug_param_entry *l);
/* Rank `part`'s slice of a whole tensor (g's numel floats, as the table lays it out) into local (l's numel), or with
 * put set the other way: the slice written into its place in the whole tensor. */
void snug_tp_slice(const snug_param_entry *g, const snug_param_entry *l, int part, float *whole, float *local,
                   int put);

/* Carves every buffer of a model for micro-batches of (B, T) from the arenas: parameters, gradients (when
 * with_grads), saved activations, workspace, data. Run it on counting arenas to plan, then on real arenas to
 * allocate; the layout is the same code both times. m->cfg, m->lv, m->be and m->table must be set. */
int snug_model_layout(snug_model *m, snug_arenas *A, int B, int T, int with_grads, snug_error *e);

/* 1 when layer l keeps only its input and is recomputed in backward (full checkpointing, every ckpt_every). */
int snug_model_layer_full_ckpt(const snug_model *m, int l);

/* Fills the RoPE tables (host computation, copied to the device). Call after layout on real arenas. Returns 0, or
 * SNUG_ENOMEM when the host scratch cannot be allocated (the tables are then not filled). */
int snug_model_init_rope(snug_model *m);

/* Random init for training from scratch: N(0, initializer_range), residual output projections scaled by
 * 1/sqrt(2L), norms to 1, biases to 0. Deterministic in seed. Returns 0, or SNUG_ENOMEM when the host scratch it
 * needs (parameters that are not fp32 host memory) cannot be allocated: then no parameter has been changed. */
int snug_model_init_random(snug_model *m, uint64_t seed);

/* Checks, without reading any weight, that a folder's safetensors hold every tensor of the table with the shape
 * config.json implies and a float dtype: run before allocating, so a mismatch is one clear error, not a failed
 * allocation sized by a wrong config. */
int snug_model_check_weights(const snug_param_table *table, const char *dir, snug_error *e);
/* Sets every parameter from host (table.total fp32 values): the fp32 parameters, or the master copy and the 16-bit
 * parameters rounded from it. */
void snug_model_put_params(snug_model *m, const float *host);
/* The same for the n parameters from `offset` (floats into the table). */
void snug_model_put_range(snug_model *m, size_t offset, const float *host, size_t n);
/* Copies every parameter to host in fp32: the parameters, the master copy, or the 16-bit parameters widened. */
void snug_model_get_params(const snug_model *m, float *host);

/* Loads weights from a Hugging Face folder's safetensors (checks every name, shape and dtype). */
int snug_model_load_weights(snug_model *m, const char *dir, snug_error *e);
/* Writes model.safetensors into dir, atomically: F32 (fp32 parameters or the master copy; file_dt when it is set),
 * or the 16-bit parameters as they are when there is no fp32 copy; opts (NULL: none) as snug_st_write takes them. */
int snug_model_save_weights(const snug_model *m, const char *dir, const snug_write_opts *opts, snug_error *e);
/* The same from host copies laid out like the model's parameters: F32 (file_dt) from p32, or (p32 NULL) lv.dt from p16; opts
 * (NULL: none) as snug_st_write takes them. */
int snug_model_save_weights_host(const snug_model *m, const char *dir, const float *p32, const uint16_t *p16,
                                 const snug_write_opts *opts, snug_error *e);
/* The weights as a stream (snug_st_out.fill): F32 (file_dt), each table tensor i fetched by fill(ud, i, dst) into a buffer of
 * its numel floats just before it is written, in the order snug_model_weights_order gives (a sharded master copy
 * gathered tensor by tensor: no whole copy anywhere). A 16-bit model without an fp32 copy (params NULL) is written
 * as lv.dt: fill gives its 16-bit values widened, which go back to 16 bits exactly. */
typedef int (*snug_weights_fill)(void *ud, int i, float *dst, snug_error *e);
int snug_model_save_weights_stream(const snug_model *m, const char *dir, snug_weights_fill fill, void *ud,
                                   const snug_write_opts *opts, snug_error *e);
/* The table indices in the order snug_model_save_weights_stream fetches them (n = the table's tensors). */
int snug_model_weights_order(const snug_model *m, int *order, snug_error *e);

/* Sets tensor i of the table from host (its numel fp32 values): stored as the model stores it (fp32, 16-bit, or
 * quantized to 4 bits under QLoRA). Returns 0, or an error (out of memory, a value 4-bit cannot take). */
int snug_model_put_entry(snug_model *m, int i, const float *host, snug_error *e);
/* 1 when tensor i is stored 4-bit. */
static inline int snug_model_entry_q4(const snug_model *m, int i) { return m->q4 && m->q4[i].packed; }

/* Copies one micro-batch (B*T ids, labels with -1 for unsupervised, positions, segment starts or NULL) to the device
 * buffers. b_used <= B rows, t_used <= T columns: the batch may be smaller than the layout. */
void snug_model_set_batch(snug_model *m, const int32_t *ids, const int32_t *labels, const int32_t *pos,
                          const int32_t *seg, int b_used, int t_used);

/* first (n) = the first key that tokens k0 .. k0+n-1 of a (B, T) batch see under a sliding window of W keys:
 * max(seg[k] (0 when seg is NULL), t - W + 1) for token k at column t = k % T. The attention ops take it in place of
 * the segment starts, so a sliding layer is the same op with a later first key. */
void snug_attention_window_starts(int32_t *first, const int32_t *seg, size_t k0, size_t n, int T, int W);

/* Forward over the current batch. Returns the summed loss over supervised tokens (divide by their count). When
 * grad_scale != 0, also runs backward, accumulating grad_scale * d(loss sum) into m->grads. */
double snug_model_step(snug_model *m, float grad_scale);
/* Pipeline parallelism: the current batch through this stage. The first stage embeds the ids; the others read their
 * input from in (N x C, backend memory: a slot of pp_in). The last stage is snug_model_step from there: the loss,
 * and backward when grad_scale != 0. Any other stage with dout NULL runs forward only and leaves its output in
 * pp_out; with dout (the output's gradient, N x C) it runs forward again (the same bits) and then backward from
 * dout, accumulating grad_scale-scaled gradients, and leaves its input's gradient in pp_din (after the first
 * stage). Returns the loss sum on the last stage, 0 elsewhere. */
double snug_model_stage(snug_model *m, float grad_scale, const float *in, const float *dout);
/* Pipeline parallelism without recomputation: the saved activations from here on are set k's (k < pp_keep): a
 * stage's forward of a micro-batch fills its set, its backward (snug_model_stage with dout, which then runs no
 * forward) reads it. */
void snug_model_use_set(snug_model *m, int k);

#endif
