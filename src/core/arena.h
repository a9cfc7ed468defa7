/* arena.h: every byte snug uses for training goes through an arena tagged with its category.
 *
 * An arena is one block obtained from a backend (host memory on the CPU, device memory on a GPU) and carved by a bump
 * pointer. The same layout code runs twice: first against "counting" arenas (no memory, they only add up requests:
 * this is the plan), then against real arenas of exactly the planned capacity. Prediction and allocation therefore
 * cannot drift. Workspace is carved and released in LIFO order with mark/release, and each arena records its peak. */
#ifndef SNUG_ARENA_H
#define SNUG_ARENA_H

#include <stddef.h>
#include <stdint.h>

#include "core/error.h"

typedef enum snug_category {
    SNUG_MEM_PARAMS = 0,  /* model weights in their compute/storage precision */
    SNUG_MEM_MASTER,      /* fp32 master weights (mixed precision only) */
    SNUG_MEM_GRADS,       /* parameter gradients */
    SNUG_MEM_OPTIM,       /* optimizer state (AdamW moments) */
    SNUG_MEM_ACTS,        /* activations saved in forward for backward */
    SNUG_MEM_WORKSPACE,   /* scratch: activation gradients, logits chunk, attention rows */
    SNUG_MEM_DATA,        /* token ids, labels, positions of the current micro-batch */
    SNUG_MEM_OFFLOAD,     /* in (pinned) host memory: checkpointed layer inputs (gradient_checkpointing: offload) and
                           * a frozen embedding (offload_embedding) */
    SNUG_MEM_SNAPSHOT,    /* a copy of the state a checkpoint holds, in host memory, written while training goes on */
    SNUG_MEM_ADAPTER,     /* LoRA's trainable adapter weights (fp32); the frozen base stays in SNUG_MEM_PARAMS */
    SNUG_MEM_NCAT
} snug_category;

const char *snug_category_name(snug_category c);

#define SNUG_ARENA_ALIGN 64

typedef struct snug_arena {
    snug_category cat;
    char *base;        /* NULL for a counting arena */
    size_t capacity;   /* bytes; for a counting arena, SIZE_MAX */
    size_t used;       /* bytes currently carved */
    size_t peak;       /* high-water mark of used */
    size_t budget;     /* 0 = no limit beyond capacity; else an allocation past it fails (auto-fit, --memory_budget) */
} snug_arena;

/* A counting arena: allocations return a non-NULL fake pointer and only advance used/peak. */
void snug_arena_init_counting(snug_arena *a, snug_category cat);
/* A real arena over memory the caller owns (obtained from a backend). */
void snug_arena_init(snug_arena *a, snug_category cat, void *base, size_t capacity);

/* Bytes are rounded up to SNUG_ARENA_ALIGN. Returns NULL and fills e when the arena is full. In a counting arena
 * the returned pointer must never be dereferenced. */
void *snug_arena_alloc(snug_arena *a, size_t bytes, snug_error *e);
static inline size_t snug_arena_mark(const snug_arena *a) { return a->used; }
void snug_arena_release(snug_arena *a, size_t mark);
static inline int snug_arena_counting(const snug_arena *a) { return a->base == NULL; }

/* The set of arenas one training run uses. */
typedef struct snug_arenas {
    snug_arena a[SNUG_MEM_NCAT];
} snug_arenas;

void snug_arenas_init_counting(snug_arenas *s);

#endif
