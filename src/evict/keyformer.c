/* Keyformer (Adnan et al., "Keyformer: KV Cache Reduction through Key
 * Tokens Selection for Efficient Generative Inference", arXiv 2403.09054):
 * H2O's accumulated attention, but each step's attention is regularized by
 * Gumbel noise before it is added, so that slots that lost a close race
 * earlier still get a chance.
 *
 * Per step and kv head, with w_j the attention slot j received (summed over
 * the observed rows) and g_j ~ Gumbel(0, 1) from the cache's seeded
 * generator: score_j += W * w_j e^(tau g_j) / sum_i w_i e^(tau g_i), W =
 * sum_i w_i. For one query row this adds softmax(logit_j + tau g_j), the
 * paper's Gumbel-softmax; with a GQA group it perturbs the group's summed
 * attention. tau scales the noise (the paper divides logits and noise by a
 * temperature instead); tau = 0 adds exactly w_j, which is H2O. */
#include "evict.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

static vq_status keyformer_set_option(vq_evict_params *p, const char *key, const char *value) {
    if (!strcmp(key, "tau")) return vq_evict_opt_real("keyformer", key, value, 0, 100, &p->tau);
    if (!strcmp(key, "seed")) {
        long long x;
        vq_status st = vq_evict_opt_int("keyformer", key, value, 0, 9223372036854775807LL, &x);
        if (!st) p->seed = (uint64_t)x;
        return st;
    }
    return vq_fail(VQ_ERR_ARG, "keyformer: unknown option '%s' (options: budget, ratio, sinks, recent, adakv, floor, "
                               "tau, seed)", key);
}

static vq_status keyformer_finish(vq_evict_params *p) {
    if (p->tau < 0) p->tau = 1.0;
    return VQ_OK;
}

static void keyformer_describe(const vq_evict_params *p, char *buf, size_t size) {
    snprintf(buf, size, ",tau=%g,seed=%llu", p->tau, (unsigned long long)p->seed);
}

static int keyformer_rows(const vq_evict_params *p, int n_q) {
    (void)p;
    return n_q;
}

static void keyformer_init(const vq_evict_params *p, const vq_evict_state *e, int layer, int head, const float *k,
                           size_t k_stride, const int32_t *pos, int n, int head_dim, float *score) {
    (void)p, (void)e, (void)layer, (void)head, (void)k, (void)k_stride, (void)pos, (void)head_dim;
    for (int i = 0; i < n; i++) score[i] = 0;
}

static void keyformer_observe(const vq_evict_params *p, vq_evict_state *e, int n_q, const float *w, int n,
                              float *score) {
    (void)n_q;
    /* e->rank is free scratch outside selection: the perturbed weights */
    float *z = e->rank;
    double sw = 0, sz = 0;
    for (int i = 0; i < n; i++) {
        double u = vq_rng_uniform(&e->rng);
        if (u <= 0) u = 0x1p-60; /* keeps log(log) finite */
        double g = -log(-log(u));
        z[i] = (float)((double)w[i] * exp(p->tau * g));
        sw += w[i];
        sz += z[i];
    }
    if (!(sz > 0)) return;
    float scale = (float)(sw / sz);
    for (int i = 0; i < n; i++) score[i] += z[i] * scale;
}

const vq_policy vq_policy_keyformer = {
    .name = "keyformer",
    .options = "tau, seed",
    .set_option = keyformer_set_option,
    .finish = keyformer_finish,
    .describe = keyformer_describe,
    .weight_rows = keyformer_rows,
    .init = keyformer_init,
    .observe = keyformer_observe,
    .mass_scores = 1,
};
