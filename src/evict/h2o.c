/* H2O (Zhang et al., "H2O: Heavy-Hitter Oracle for Efficient Generative
 * Inference of Large Language Models", arXiv 2306.14048): a slot's score is
 * the attention it has received, summed over every query so far; the heavy
 * hitters and a window of recent tokens are kept. */
#include "evict.h"

static int h2o_rows(const vq_evict_params *p, int n_q) {
    (void)p;
    return n_q;
}

static void h2o_init(const vq_evict_params *p, const vq_evict_state *e, int layer, int head, const float *k,
                     size_t k_stride, const int32_t *pos, int n, int head_dim, float *score) {
    (void)p, (void)e, (void)layer, (void)head, (void)k, (void)k_stride, (void)pos, (void)head_dim;
    for (int i = 0; i < n; i++) score[i] = 0;
}

static void h2o_observe(const vq_evict_params *p, vq_evict_state *e, int n_q, const float *w, int n, float *score) {
    (void)p, (void)e, (void)n_q;
    for (int i = 0; i < n; i++) score[i] += w[i];
}

const vq_policy vq_policy_h2o = {
    .name = "h2o",
    .options = "",
    .weight_rows = h2o_rows,
    .init = h2o_init,
    .observe = h2o_observe,
    .mass_scores = 1,
};
