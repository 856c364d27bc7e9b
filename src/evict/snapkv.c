/* SnapKV (Li et al., "SnapKV: LLM Knows What You Are Looking for Before
 * Generation", arXiv 2404.14469): the attention the last `window` queries
 * of the prompt pay to each earlier slot, summed, max-pooled over
 * neighbouring slots (kernel `pool`) so that a kept token keeps its
 * context, and the best per head kept.
 *
 * Here the prompt goes through in chunks and the budget holds at every
 * chunk (evict.h): each prefill chunk's last `window` query tokens replace
 * the scores, and the next append selects with them. During decoding the
 * observation window slides: score = score * (1 - 1/window) + the new
 * query's attention, a running sum over about the last `window` queries. */
#include "evict.h"

#include <stdio.h>
#include <string.h>

#define DEFAULT_WINDOW 32
#define DEFAULT_POOL 7

vq_status vq_snapkv_set_option(vq_evict_params *p, const char *key, const char *value) {
    const char *name = p->policy->name;
    long long x;
    vq_status st;
    if (!strcmp(key, "window")) {
        st = vq_evict_opt_int(name, key, value, 1, 4096, &x);
        if (!st) p->window = (int)x;
        return st;
    }
    if (!strcmp(key, "pool")) {
        st = vq_evict_opt_int(name, key, value, 1, 63, &x);
        if (!st && x % 2 == 0) st = vq_fail(VQ_ERR_ARG, "%s: pool=%lld must be odd (allowed 1, 3, ..., 63)", name, x);
        if (!st) p->pool = (int)x;
        return st;
    }
    if (!strcmp(key, "beta") && p->policy == &vq_policy_pyramidkv)
        return vq_evict_opt_real(name, key, value, 1, 1000, &p->beta);
    return vq_fail(VQ_ERR_ARG, "%s: unknown option '%s' (options: budget, ratio, sinks, recent, adakv, floor, %s)", name,
                   key, p->policy->options);
}

vq_status vq_snapkv_finish(vq_evict_params *p) {
    if (!p->window) p->window = DEFAULT_WINDOW;
    if (!p->pool) p->pool = DEFAULT_POOL;
    return VQ_OK;
}

static void snapkv_describe(const vq_evict_params *p, char *buf, size_t size) {
    snprintf(buf, size, ",window=%d,pool=%d", p->window, p->pool);
}

int vq_snapkv_rows(const vq_evict_params *p, int n_q) { return n_q < p->window ? n_q : p->window; }

void vq_snapkv_init(const vq_evict_params *p, const vq_evict_state *e, int layer, int head, const float *k,
                    size_t k_stride, const int32_t *pos, int n, int head_dim, float *score) {
    (void)p, (void)e, (void)layer, (void)head, (void)k, (void)k_stride, (void)pos, (void)head_dim;
    for (int i = 0; i < n; i++) score[i] = 0;
}

void vq_snapkv_observe(const vq_evict_params *p, vq_evict_state *e, int n_q, const float *w, int n, float *score) {
    (void)e;
    if (n_q > 1) {
        memcpy(score, w, sizeof(float) * (size_t)n);
        return;
    }
    float keep = 1.0f - 1.0f / (float)p->window;
    for (int i = 0; i < n; i++) score[i] = score[i] * keep + w[i];
}

void vq_snapkv_rank(const vq_evict_params *p, const float *score, int n, float *rank) {
    vq_evict_max_pool(score, n, p->pool, rank);
}

const vq_policy vq_policy_snapkv = {
    .name = "snapkv",
    .options = "window, pool",
    .set_option = vq_snapkv_set_option,
    .finish = vq_snapkv_finish,
    .describe = snapkv_describe,
    .weight_rows = vq_snapkv_rows,
    .init = vq_snapkv_init,
    .observe = vq_snapkv_observe,
    .rank = vq_snapkv_rank,
    .mass_scores = 1,
};
