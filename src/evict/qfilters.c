/* Q-Filters (Godey et al., "Q-Filters: Leveraging Query-Key Geometry for
 * Efficient Key-Value Cache Compression", arXiv 2503.02812): each kv head
 * has a calibrated unit direction f (`veloxquant calibrate qfilters`,
 * evict/qfilters_file.h), the first right singular vector of the head's
 * uncentered queries, signed so the queries project positively on it.
 * Queries concentrate along f, so the logit a key can expect grows with
 * <k, f>: the score is <k, f>, computed once from the key as appended, and
 * the keys with the lowest projection are evicted first. No attention
 * weights needed. */
#include "evict.h"

#include <stdio.h>
#include <string.h>

static vq_status qfilters_set_option(vq_evict_params *p, const char *key, const char *value) {
    if (!strcmp(key, "filters")) {
        size_t n = strlen(value);
        if (n >= sizeof p->filters)
            return vq_fail(VQ_ERR_ARG, "qfilters: filters path is %zu bytes long (allowed up to %zu)", n,
                           sizeof p->filters - 1);
        memcpy(p->filters, value, n + 1);
        return VQ_OK;
    }
    return vq_fail(VQ_ERR_ARG, "qfilters: unknown option '%s' (options: budget, ratio, sinks, recent, adakv, floor, "
                               "filters)", key);
}

static vq_status qfilters_finish(vq_evict_params *p) {
    if (!p->filters[0])
        return vq_fail(VQ_ERR_ARG, "qfilters: filters=FILE is required (a file written by 'veloxquant calibrate qfilters')");
    return VQ_OK;
}

static void qfilters_describe(const vq_evict_params *p, char *buf, size_t size) {
    snprintf(buf, size, ",filters=%s", p->filters);
}

static int qfilters_rows(const vq_evict_params *p, int n_q) {
    (void)p;
    (void)n_q;
    return 0;
}

static void qfilters_init(const vq_evict_params *p, const vq_evict_state *e, int layer, int head, const float *k,
                          size_t k_stride, const int32_t *pos, int n, int head_dim, float *score) {
    (void)p, (void)pos;
    const float *f = e->filters + ((size_t)layer * e->n_heads_kv + head) * head_dim;
    for (int i = 0; i < n; i++) {
        const float *x = k + (size_t)i * k_stride;
        double s = 0;
        for (int j = 0; j < head_dim; j++) s += (double)x[j] * f[j];
        score[i] = (float)s;
    }
}

const vq_policy vq_policy_qfilters = {
    .name = "qfilters",
    .options = "filters",
    .set_option = qfilters_set_option,
    .finish = qfilters_finish,
    .describe = qfilters_describe,
    .weight_rows = qfilters_rows,
    .init = qfilters_init,
};
