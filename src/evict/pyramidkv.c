/* PyramidKV (Cai et al., "PyramidKV: Dynamic KV Cache Compression based on
 * Pyramidal Information Funneling", arXiv 2406.02069): SnapKV's scores with
 * per-layer budgets that shrink with depth, since lower layers spread their
 * attention widely and upper ones concentrate it.
 *
 * With the per-head budget B as the mean over layers, the last layer keeps
 * B / beta and the first 2B - B / beta, linear in between (the paper's
 * arithmetic schedule); beta defaults to 20 as in the paper. So `budget=N`
 * is the average: early layers keep up to 2N. */
#include "evict.h"

#include <math.h>
#include <stdio.h>

#define DEFAULT_BETA 20.0

static vq_status pyramidkv_finish(vq_evict_params *p) {
    if (!(p->beta > 0)) p->beta = DEFAULT_BETA;
    return vq_snapkv_finish(p);
}

static void pyramidkv_describe(const vq_evict_params *p, char *buf, size_t size) {
    snprintf(buf, size, ",window=%d,pool=%d,beta=%g", p->window, p->pool, p->beta);
}

static int64_t pyramidkv_budget(const vq_evict_params *p, int64_t budget, int layer, int n_layers) {
    if (n_layers < 2) return budget;
    double last = (double)budget / p->beta, first = 2.0 * (double)budget - last;
    double b = first + (last - first) * layer / (n_layers - 1);
    return (int64_t)floor(b + 0.5);
}

const vq_policy vq_policy_pyramidkv = {
    .name = "pyramidkv",
    .options = "window, pool, beta",
    .set_option = vq_snapkv_set_option,
    .finish = pyramidkv_finish,
    .describe = pyramidkv_describe,
    .weight_rows = vq_snapkv_rows,
    .init = vq_snapkv_init,
    .observe = vq_snapkv_observe,
    .rank = vq_snapkv_rank,
    .layer_budget = pyramidkv_budget,
    .mass_scores = 1,
};
