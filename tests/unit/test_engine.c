/* test_engine.c: the engine gives each category's memory back with the free function that matches where it was
 * allocated: device memory with the backend's free, a paged optimizer's state (pinned host memory on a GPU) with
 * its host_free. Sampling after training releases the gradients and the optimizer state early this way. */
#include <string.h>

#include "check.h"
#include "model/presets.h"
#include "train/engine.h"

static int device_frees, host_frees;
static void (*real_free)(snug_backend *, void *);
static void (*real_host_free)(snug_backend *, void *);

static void count_free(snug_backend *be, void *p) {
    device_frees++;
    real_free(be, p);
}

static void count_host_free(snug_backend *be, void *p) {
    host_frees++;
    real_host_free(be, p);
}

static void test_release(int paged) {
    snug_model_config c;
    snug_error e = {0};
    CHECK(snug_preset(&c, "tiny-llama", 61, &e) == 0);
    c.hidden_size = 32, c.intermediate_size = 64, c.n_layer = 2, c.n_head = 4, c.n_kv_head = 2, c.head_dim = 8;
    c.max_position = 32;
    snug_plan_spec spec = {.cfg = c, .B = 2, .T = 16, .lv = {.ckpt_every = 1}, .with_grads = 1,
                           .optim = SNUG_OPTIM_ADAMW, .optim_paged = paged};
    snug_engine g;
    if (snug_engine_create(&g, &spec, SNUG_BACKEND_CPU, 1, &e)) {
        CHECKF(0, "engine: %s", e.msg);
        return;
    }
    CHECK(g.plan.host[SNUG_MEM_OPTIM] == paged && g.blocks[SNUG_MEM_OPTIM] && g.blocks[SNUG_MEM_GRADS]);
    real_free = g.be->free;
    real_host_free = g.be->host_free;
    g.be->free = count_free;
    g.be->host_free = count_host_free;
    device_frees = host_frees = 0;
    snug_engine_release(&g, SNUG_MEM_GRADS);
    CHECK(device_frees == 1 && host_frees == 0 && !g.blocks[SNUG_MEM_GRADS]);
    snug_engine_release(&g, SNUG_MEM_OPTIM);
    CHECKF(host_frees == paged && device_frees == 1 + !paged, "paged %d: %d device frees, %d host frees", paged,
           device_frees, host_frees);
    snug_engine_release(&g, SNUG_MEM_OPTIM); /* released already: nothing more */
    CHECK(host_frees == paged && device_frees == 1 + !paged && !g.blocks[SNUG_MEM_OPTIM]);
    int before_dev = device_frees, before_host = host_frees, live_dev = 0, live_host = 0;
    for (int k = 0; k < SNUG_MEM_NCAT; k++)
        if (g.blocks[k])
            *(g.plan.host[k] ? &live_host : &live_dev) += 1;
    snug_engine_free(&g); /* the rest, each once */
    CHECK(device_frees == before_dev + live_dev && host_frees == before_host + live_host);
}

int main(void) {
    test_release(0);
    test_release(1);
    return check_finish("test_engine");
}
