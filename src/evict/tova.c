/* TOVA (Oren et al., "Transformers are Multi-State RNNs", arXiv
 * 2401.06104): keep the slots the current query attends to most. The score
 * is the attention of the newest query token alone (summed over the q heads
 * of the GQA group, which orders like their mean); the previous scores are
 * forgotten at every step. */
#include "evict.h"

static int tova_rows(const vq_evict_params *p, int n_q) {
    (void)p;
    return n_q > 0 ? 1 : 0;
}

static void tova_init(const vq_evict_params *p, const vq_evict_state *e, int layer, int head, const float *k,
                      size_t k_stride, const int32_t *pos, int n, int head_dim, float *score) {
    (void)p, (void)e, (void)layer, (void)head, (void)k, (void)k_stride, (void)pos, (void)head_dim;
    for (int i = 0; i < n; i++) score[i] = 0;
}

static void tova_observe(const vq_evict_params *p, vq_evict_state *e, int n_q, const float *w, int n, float *score) {
    (void)p, (void)e, (void)n_q;
    for (int i = 0; i < n; i++) score[i] = w[i];
}

const vq_policy vq_policy_tova = {
    .name = "tova",
    .options = "",
    .weight_rows = tova_rows,
    .init = tova_init,
    .observe = tova_observe,
    .mass_scores = 1,
};
