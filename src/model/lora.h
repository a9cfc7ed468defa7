/* lora.h: LoRA and DoRA adapters on a block's linear layers (lora.c): their configuration, the modules of each
 * architecture they can adapt, their table and memory (snug_lora), and their forward and backward beside a site's
 * base linear. A leaf below the model: it knows of the model only what a snug_lora_ctx hands it (the backend and
 * the base weight's rows); fitting adapters to a model (their table from its config, their initial values) is the
 * model's side (adapter.c, declared in model.h). */
#ifndef SNUG_LORA_H
#define SNUG_LORA_H

#include <stddef.h>
#include <stdint.h>

#include "backend/backend.h"
#include "model/config.h"
#include "model/family.h" /* snug_site */
#include "model/params.h"

/* LoRA (adapter: lora): the base weights frozen, a trainable low-rank pair per adapted linear module,
 * out += scale * (dropout(x) A^T) B^T with A (r, in), B (out, r), scale = alpha / r (alpha / sqrt(r) with rsLoRA). The
 * modules are the architecture's linear layers as Hugging Face names them (snug_lora_module_name). */
typedef enum snug_adapter {
    SNUG_ADAPTER_NONE = 0, /* full fine-tuning: every parameter trains */
    SNUG_ADAPTER_LORA,
    SNUG_ADAPTER_QLORA,    /* LoRA on a base whose block matrices are stored 4-bit (quant4.h), dequantized one layer
                            * at a time for forward and backward; embeddings, norms and the head stay 16-bit */
} snug_adapter;

enum { SNUG_LORA_MAX_MODULES = 8 };
/* The global modules LoRA can train in full beside the adapters: an fp32 copy of the base's tensor in the adapter
 * table, which forward reads instead of the frozen original (PEFT's ModulesToSaveWrapper). */
enum { SNUG_SAVE_EMBED = 1u, SNUG_SAVE_HEAD = 2u };

/* PEFT's init_lora_weights, where it changes the base: an adapter saved unconverted is relative to the base less
 * scale * B0 A0, the initial pair the method derives from the original base (the top r of its SVD for PiSSA, of its
 * QR for OLoRA), which loading derives again (snug_peft_residual). Every other value leaves the base as it is. */
typedef enum snug_lora_init_kind {
    SNUG_LORA_INIT_PLAIN = 0,
    SNUG_LORA_INIT_PISSA,
    SNUG_LORA_INIT_OLORA,
} snug_lora_init_kind;

typedef struct snug_lora_cfg {
    snug_adapter kind;
    int init;             /* snug_lora_init_kind: what the adapters' base is (set by loading an adapter, kept when
                           * saving) */
    int r;
    float alpha;
    float dropout;        /* on the adapter's input only */
    int rslora;
    int dora;             /* DoRA (PEFT's use_dora): each module's output columns scaled by magnitude / weight norm */
    unsigned targets;     /* bit k: module k of the architecture (snug_lora_module_name(arch, k)) is adapted */
    uint64_t layers[4];   /* PEFT's layers_to_transform: bit l of the whole model's layer l is adapted; all zero:
                           * every layer */
    double loraplus;      /* LoRA+ (loraplus_lr_ratio): lora_B and the 1-D tensors (DoRA's magnitudes) step at this
                           * times the learning rate, as PEFT's create_loraplus_optimizer groups them; 0: off */
    unsigned save_modules; /* lora_modules_to_save (PEFT's modules_to_save): SNUG_SAVE_EMBED, SNUG_SAVE_HEAD */
    /* QLoRA: how the base's block matrices are stored (bitsandbytes' quantize_4bit) */
    int q4_type;          /* snug_q4_type: NF4 (0) or FP4 */
    int q4_nested;        /* double quantization of the absmax */
    int q4_blocksize;     /* 64 unless a pre-quantized checkpoint says otherwise */
    size_t q4_chunk;      /* elements of a 4-bit matrix dequantized at a time at most; 0 = 2^24 (64 MiB in fp32).
                           * DoRA: of a module's weight at a time in its norms and gradient; 0 = 2^20 */
} snug_lora_cfg;

/* One adapted module: its rows of a site's output and its input width. */
typedef struct snug_lora_module {
    int index;            /* the architecture's module number (snug_lora_module_name) */
    snug_site site;
    int row0, rows;       /* output columns [row0, row0 + rows) of the site's (N, width) output */
    int in;               /* input features */
    size_t a_off, b_off;  /* layer 0's A (r, in) and B (rows, r), floats into the adapter table; layer l adds
                           * l * per_layer */
    int group;            /* on the first module of a site: the site's adapted modules (adjacent in mod[]), whose
                           * A's lie side by side, one (group r, in) matrix; 0 on the others */
    size_t m_off;         /* DoRA: layer 0's magnitude (rows) in the adapter table, after the site's B's */
    size_t n_off;         /* DoRA: the module's weight norms (rows) in a layer's part of `dn` */
} snug_lora_module;

/* The adapters of a model: their own parameter table (names as PEFT saves them), fp32 weights and gradients. */
typedef struct snug_lora {
    int on;
    int r;
    float scale;
    float dropout;
    int nmod;
    snug_lora_module mod[SNUG_LORA_MAX_MODULES];
    size_t per_layer;     /* adapter floats per layer */
    int l0;               /* the whole model's index of layer 0 (pipeline parallelism: the stage's first layer), in
                           * the names, the initial values' streams and dropout's masks */
    size_t emb_off, head_off; /* the trained copies of embed_tokens and lm_head in the adapter table (after every
                               * layer's adapters), (size_t)-1 when not trained */
    int max_in;
    int max_group;        /* the most modules of one site */
    snug_param_table table;
    float *params;        /* (table.total) SNUG_MEM_ADAPTER */
    float *grads;         /* (table.total) SNUG_MEM_GRADS, training only */
    float *u, *du;        /* (N, max_group r) workspace: x A^T of the site being run (its modules side by side)
                           * and its gradient */
    float *xd;            /* (N, max_in) workspace: the dropped-out input (dropout > 0 only) */
    /* DoRA: y = bias + (mag / |W + s B A|_row) (x W^T + s x A^T B^T) on each module's columns, the norm a constant to
     * backward (PEFT's detach) */
    int dora;
    size_t dn_per_layer;  /* the summed rows of the modules */
    float *dn;            /* (layers, dn_per_layer) SNUG_MEM_ADAPTER: each module's row norms |W + s B A|, as the
                           * layer's last forward computed them */
    int dchunk;           /* rows of a module's weight in dw and dp at a time */
    float *dw, *dp;       /* (dchunk, max(max_in, r)) workspace: rows of W + s B A; rows of dy^T x or dy^T u */
    float *dmt;           /* (dchunk) workspace, training only: a chunk's magnitude gradient of this micro-batch */
    float *dt, *vx;       /* with dropout, training only: (N, dchunk) a chunk's columns, (N, max_in) the input's
                           * gradient before its mask */
    float *dy;            /* (N, hidden) workspace, training only: the scaled output gradient of an o_proj or
                           * down_proj module (its unscaled one is the residual stream's, read again after) */
    int dora_fixed;       /* the norms in dn stay as they are (generation: the adapters do not change) */
    int dora_pending;     /* the magnitudes await snug_lora_dora_start (a base sharded over ranks) */
    uint64_t seed;        /* dropout's stream of this micro-batch (set by the caller before each training step) */
    int training;         /* the step running trains (dropout applies); evaluation and generation see none */
} snug_lora;

/* What the adapters read of the model they are fitted to, handed to each call: the adapters, the backend that runs
 * them, and (DoRA) rows [row, row + nr) of layer l's base weight at site as fp32 into dst (nr, in). */
typedef void (*snug_lora_rows_fn)(void *ud, int l, snug_site site, int row, int nr, int in, float *dst);
typedef struct snug_lora_ctx {
    snug_lora *lora;
    snug_backend *be;
    snug_lora_rows_fn base_rows;
    void *ud;
} snug_lora_ctx;

/* The Hugging Face name of module k of an architecture's block ("self_attn.q_proj", "mlp.c_fc"), NULL past the
 * last; and the number of modules. */
const char *snug_lora_module_name(snug_arch arch, int k);
int snug_lora_module_count(snug_arch arch);
/* Module k's site, its first row of the site's output, its rows and its input width. */
snug_site snug_lora_module_site(snug_arch arch, int k);
void snug_lora_module_shape(const snug_model_config *c, int k, int *row0, int *rows, int *in);
/* The modules Axolotl's lora_target_linear and Unsloth adapt: every linear layer of the block. */
unsigned snug_lora_all_linear(snug_arch arch);
/* PEFT's default when no target is named: q_proj and v_proj (Llama), c_attn (GPT-2). */
unsigned snug_lora_default_targets(snug_arch arch);
/* The floats of the adapter table snug_lora_build lays out for config c (0 without an adapter): what trains, and so
 * what data parallel sums, under LoRA. */
long long snug_lora_nparams(const snug_model_config *c, const snug_lora_cfg *lc);
/* Whether lc names its layers (lora_layers_to_transform), and whether the whole model's layer l then carries adapters
 * (every layer when it names none); the named layers as "1,3" into buf ("" when none are named). */
int snug_lora_layers_named(const snug_lora_cfg *lc);
int snug_lora_layer_on(const snug_lora_cfg *lc, int l);
void snug_lora_layers_list(const snug_lora_cfg *lc, char *buf, size_t n);
/* After the base linear of a site has written out (N, width): adds the site's adapters. x (N, in) its input: rows
 * n0 .. n0 + N - 1 of the micro-batch (n0 > 0 for a shard of a tiled MLP; dropout's mask is the same whatever the
 * shards). */
void snug_lora_fwd(const snug_lora_ctx *cx, int l, snug_site site, float *out, int width, const float *x, int N,
                   int n0, const float *bias);
/* DoRA: the row norms of layer l's modules at site into lora.dn (nothing without DoRA, or with dora_fixed set).
 * snug_lora_fwd calls it; generation calls it once per layer and site, then sets dora_fixed. */
void snug_lora_dora_norms(const snug_lora_ctx *cx, int l, snug_site site);
/* DoRA, before the site's base backward: the magnitudes' gradients accumulate from the unscaled dout (N, width) and
 * x (N, in), or with y non-NULL from the site's output as forward left it (N, width; the same row stride) and its
 * bias, without the GEMM over x; returns the gradient the base and snug_lora_bwd then read, each DoRA module's
 * columns scaled by mag / nrm: dout itself (in_place) or lora.dy. Without DoRA (or with dropout, which
 * snug_lora_bwd takes whole): dout. */
const float *snug_lora_dora_bwd(const snug_lora_ctx *cx, int l, snug_site site, float *dout, int width,
                                const float *x, int N, const float *y, const float *bias, int in_place);
/* DoRA: the magnitudes of every adapted layer of n_layer set to the base's row norms, when they are pending
 * (dora_pending); nothing otherwise. */
void snug_lora_dora_magnitudes(const snug_lora_ctx *cx, int n_layer);
/* After the base linear's backward: dx (N, in) += the adapters' input gradient (dx NULL: not wanted); dA, dB
 * accumulate. dout (N, width) the site's output gradient, x its input, rows from n0 as in snug_lora_fwd. */
void snug_lora_bwd(const snug_lora_ctx *cx, int l, snug_site site, float *dx, const float *dout, int width,
                   const float *x, int N, int n0);
void snug_lora_free(snug_lora *lora);

#endif
