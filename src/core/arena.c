/* arena.c: bump allocation with peak tracking (see arena.h). */
#include "core/arena.h"

#include <stdint.h>

static const char *const category_names[SNUG_MEM_NCAT] = {
    "parameters", "master weights", "gradients", "optimizer state", "saved activations", "workspace", "data",
    "offloaded to host", "checkpoint snapshot", "adapter weights",
};

const char *snug_category_name(snug_category c) {
    return (c >= 0 && c < SNUG_MEM_NCAT) ? category_names[c] : "unknown";
}

void snug_arena_init_counting(snug_arena *a, snug_category cat) {
    *a = (snug_arena){.cat = cat, .base = NULL, .capacity = SIZE_MAX};
}

void snug_arena_init(snug_arena *a, snug_category cat, void *base, size_t capacity) {
    *a = (snug_arena){.cat = cat, .base = base, .capacity = capacity};
}

static size_t round_up(size_t n) { return (n + SNUG_ARENA_ALIGN - 1) / SNUG_ARENA_ALIGN * SNUG_ARENA_ALIGN; }

void *snug_arena_alloc(snug_arena *a, size_t bytes, snug_error *e) {
    size_t n = round_up(bytes);
    size_t limit = a->capacity;
    if (a->budget && a->budget < limit)
        limit = a->budget;
    if (n > limit - a->used || a->used > limit) {
        snug_fail(e, SNUG_ENOMEM,
                  "out of memory in the %s arena: %zu bytes requested, %zu of %zu in use; "
                  "reduce micro_batch_size or sequence_len, or see `snug plan` for the levers that shrink %s",
                  snug_category_name(a->cat), bytes, a->used, limit, snug_category_name(a->cat));
        return NULL;
    }
    /* A counting arena hands out distinct, aligned, never-dereferenced addresses so layout code can compare them. */
    char *p = a->base ? a->base + a->used : (char *)(uintptr_t)(SNUG_ARENA_ALIGN + a->used);
    a->used += n;
    if (a->used > a->peak)
        a->peak = a->used;
    return p;
}

void snug_arena_release(snug_arena *a, size_t mark) {
    if (mark <= a->used)
        a->used = mark;
}

void snug_arenas_init_counting(snug_arenas *s) {
    for (int c = 0; c < SNUG_MEM_NCAT; c++)
        snug_arena_init_counting(&s->a[c], (snug_category)c);
}
