/* KNorm (Devoto et al., "A Simple and Effective L2 Norm-Based Strategy for
 * KV Cache Compression", arXiv 2406.11430): keys with a small L2 norm draw
 * more attention, so the score is -||k||, computed once from the key as
 * appended (before quantization). No attention weights needed. */
#include "evict.h"

#include <math.h>

static int knorm_rows(const vq_evict_params *p, int n_q) {
    (void)p;
    (void)n_q;
    return 0;
}

static void knorm_init(const vq_evict_params *p, const vq_evict_state *e, int layer, int head, const float *k,
                       size_t k_stride, const int32_t *pos, int n, int head_dim, float *score) {
    (void)p, (void)e, (void)layer, (void)head, (void)pos;
    for (int i = 0; i < n; i++) {
        const float *x = k + (size_t)i * k_stride;
        double s = 0;
        for (int j = 0; j < head_dim; j++) s += (double)x[j] * x[j];
        score[i] = (float)-sqrt(s);
    }
}

const vq_policy vq_policy_knorm = {
    .name = "knorm",
    .options = "",
    .weight_rows = knorm_rows,
    .init = knorm_init,
};
