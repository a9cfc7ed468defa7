/* init.c: values the model starts from: the RoPE tables, the random initialisation (each tensor its own stream,
 * the same across tensor and pipeline parallelism), and the micro-batch's ids, labels and positions. */
#include "model/model_impl.h"

#include "core/rng.h"

/* Inverse frequencies with the rope_scaling of the config (default, linear, llama3), in double. */
static void rope_inv_freq(const snug_model_config *c, double *inv, int half) {
    for (int i = 0; i < half; i++) {
        double f = 1.0 / pow(c->rope_theta, (2.0 * i) / (2.0 * half));
        if (c->rope_type == SNUG_ROPE_LINEAR) {
            f /= c->rope_factor;
        } else if (c->rope_type == SNUG_ROPE_LLAMA3) {
            double lo_wl = c->rope_original_max_position / c->rope_low_freq_factor;
            double hi_wl = c->rope_original_max_position / c->rope_high_freq_factor;
            double wl = 2.0 * M_PI / f;
            if (wl > lo_wl) {
                f /= c->rope_factor;
            } else if (wl >= hi_wl) {
                double smooth = (c->rope_original_max_position / wl - c->rope_low_freq_factor) /
                                (c->rope_high_freq_factor - c->rope_low_freq_factor);
                f = (1.0 - smooth) * f / c->rope_factor + smooth * f;
            }
        }
        inv[i] = f;
    }
}

int snug_model_init_rope(snug_model *m) {
    if (!m->rope_cos)
        return 0;
    int half = m->cfg.head_dim / 2, T = m->T;
    double *inv = malloc((size_t)half * sizeof *inv);
    float *cs = malloc((size_t)T * half * sizeof *cs), *sn = malloc((size_t)T * half * sizeof *sn);
    if (!inv || !cs || !sn) {
        free(inv);
        free(cs);
        free(sn);
        return SNUG_ENOMEM;
    }
    rope_inv_freq(&m->cfg, inv, half);
    for (int t = 0; t < T; t++)
        for (int i = 0; i < half; i++) {
            /* transformers computes the angle in fp32: position (fp32) times inv_freq (fp32) */
            float ang = (float)t * (float)inv[i];
            cs[(size_t)t * half + i] = (float)cos((double)ang);
            sn[(size_t)t * half + i] = (float)sin((double)ang);
        }
    m->be->to_device(m->be, m->rope_cos, cs, (size_t)T * half * sizeof *cs);
    m->be->to_device(m->be, m->rope_sin, sn, (size_t)T * half * sizeof *sn);
    free(inv);
    free(cs);
    free(sn);
    return 0;
}

static double uniform01(uint64_t *s) { return ((snug_splitmix64(s) >> 11) + 0.5) * (1.0 / 9007199254740992.0); }

/* The random init's next len values of table entry p (a model of n_layer layers) into x, from the entry's stream *s
 * where the previous piece left it (len even but for the last piece, so the Box-Muller pairs stay whole). */
static void init_values(const snug_param_entry *p, double std, int n_layer, uint64_t *s, float *x, size_t len) {
    int is_norm_w = p->ndim == 1 && (strstr(p->name, "norm") || strstr(p->name, "ln_")) && ends_with(p->name, "weight");
    int site = p->ndim == 2 ? model_weight_site(p->name) : -1; /* the outputs into the residual stream */
    int residual_out = site == SNUG_SITE_O || site == SNUG_SITE_PROJ;
    double sd = residual_out ? std / sqrt(2.0 * n_layer) : std;
    if (p->ndim == 1) {
        for (size_t k = 0; k < len; k++)
            x[k] = is_norm_w ? 1.0f : 0.0f;
        return;
    }
    for (size_t k = 0; k < len; k += 2) {
        double u1 = uniform01(s), u2 = uniform01(s), r = sqrt(-2.0 * log(u1));
        x[k] = (float)(sd * r * cos(2 * M_PI * u2));
        if (k + 1 < len)
            x[k + 1] = (float)(sd * r * sin(2 * M_PI * u2));
    }
}

/* each tensor gets its own stream, so adding a tensor does not change the others */
static uint64_t init_stream(uint64_t seed, int i) {
    return seed * 0x100000001B3ull + (uint64_t)i * 0x9E3779B97F4A7C15ull;
}

/* Tensor parallelism: the whole model's tensors drawn as one process draws them, each rank keeping its slice, so the
 * ranks start from the weights one process would */
static int init_random_tp(snug_model *m, uint64_t seed, double std) {
    snug_param_table g;
    if (snug_param_table_build(&g, &m->tp_cfg, NULL))
        return SNUG_ENOMEM;
    size_t largest = 0;
    for (int i = 0; i < g.n; i++)
        largest = g.e[i].numel > largest ? g.e[i].numel : largest;
    float *whole = malloc(largest * sizeof *whole), *part = malloc(largest * sizeof *part);
    int rc = whole && part && g.n == m->table.n ? 0 : SNUG_ENOMEM;
    for (int i = 0; i < g.n && !rc; i++) {
        uint64_t s = init_stream(seed, i);
        init_values(&g.e[i], std, m->tp_cfg.n_layer, &s, whole, g.e[i].numel);
        snug_tp_slice(&g.e[i], &m->table.e[i], m->tp_rank, whole, part, 0);
        rc = snug_model_put_entry(m, i, part, NULL) ? SNUG_ENOMEM : 0;
    }
    free(whole);
    free(part);
    snug_param_table_free(&g);
    return rc;
}

int snug_model_init_random(snug_model *m, uint64_t seed) {
    const snug_model_config *c = &m->cfg;
    float std = c->initializer_range > 0 ? c->initializer_range : 0.02f;
    if (m->tp > 1)
        return init_random_tp(m, seed, std);
    /* write straight into the parameters when they are fp32 host memory; else through a host buffer of PIECE
     * values (even, so the Box-Muller pairs never straddle two pieces) */
    size_t PIECE = (size_t)1 << 20, largest = 0;
    for (int i = 0; m->q4 && i < m->table.n; i++) /* QLoRA quantizes whole tensors: pieces as large as the largest */
        largest = m->table.e[i].numel > largest ? m->table.e[i].numel : largest;
    PIECE = largest > PIECE ? (largest + 1) / 2 * 2 : PIECE;
    float *direct = snug_model_host_params(m);
    float *buf = direct ? NULL : malloc(PIECE * sizeof *buf);
    /* a pipeline stage: each tensor's stream is its index in the whole model's table, as one process draws it */
    int *whole_i = malloc((size_t)(m->table.n ? m->table.n : 1) * sizeof *whole_i);
    snug_model_config wc = *c;
    wc.n_layer = m->pp > 1 ? m->pp_L : c->n_layer;
    snug_param_table g = {0};
    if ((!direct && !buf) || !whole_i || (m->pp > 1 && snug_param_table_build(&g, &wc, NULL))) {
        free(buf);
        free(whole_i);
        return SNUG_ENOMEM;
    }
    for (int i = 0; i < m->table.n; i++)
        whole_i[i] = m->pp > 1 ? snug_param_table_find(&g, m->table.e[i].name) : i;
    snug_param_table_free(&g);
    for (int i = 0; i < m->table.n; i++) {
        const snug_param_entry *p = &m->table.e[i];
        uint64_t s = init_stream(seed, whole_i[i]);
        for (size_t k0 = 0; k0 < p->numel; k0 += PIECE) {
            size_t len = p->numel - k0 < PIECE ? p->numel - k0 : PIECE;
            float *x = direct ? direct + p->offset + k0 : buf;
            init_values(p, std, wc.n_layer, &s, x, len);
            if (!direct && m->q4 && snug_model_put_entry(m, i, buf, NULL)) {
                free(buf);
                free(whole_i);
                return SNUG_ENOMEM;
            } else if (!direct && !m->q4) {
                snug_model_put_range(m, p->offset + k0, buf, len);
            }
        }
    }
    free(buf);
    free(whole_i);
    return 0;
}

void snug_model_set_batch(snug_model *m, const int32_t *ids, const int32_t *labels, const int32_t *pos,
                          const int32_t *seg, int b_used, int t_used) {
    size_t n = (size_t)b_used * t_used * sizeof(int32_t);
    m->cur_B = b_used;
    m->cur_T = t_used;
    m->be->to_device(m->be, m->ids, ids, n);
    if (m->tp_vocab && m->ids_tp) { /* host memory (layout checks): the rank's rows, -1 (a zero row) elsewhere */
        int32_t V = m->cfg.vocab_size, lo = m->tp_rank * V;
        for (size_t k = 0; k < (size_t)b_used * t_used; k++)
            m->ids_tp[k] = ids[k] >= lo && ids[k] - lo < V ? ids[k] - lo : -1;
    }
    m->be->to_device(m->be, m->labels, labels, n);
    m->be->to_device(m->be, m->pos, pos, n);
    if (seg)
        m->be->to_device(m->be, m->seg, seg, n);
    m->seg_used = seg != NULL;
    /* a window as long as the rows changes nothing: those layers then take seg, as the others do */
    int W = m->cfg.sliding_window;
    m->win_used = m->win && W > 0 && W < t_used;
    size_t N = (size_t)b_used * t_used;
    for (size_t k0 = 0; m->win_used && k0 < N; k0 += 1024) {
        int32_t first[1024];
        size_t k = N - k0 < 1024 ? N - k0 : 1024;
        snug_attention_window_starts(first, seg, k0, k, t_used, W);
        m->be->to_device(m->be, m->win + k0, first, k * sizeof *first);
    }
}

void snug_attention_window_starts(int32_t *first, const int32_t *seg, size_t k0, size_t n, int T, int W) {
    for (size_t i = 0; i < n; i++) {
        size_t k = k0 + i;
        int t = (int)(k % (size_t)T), lo = seg ? seg[k] : 0;
        first[i] = t - W + 1 > lo ? t - W + 1 : lo;
    }
}
