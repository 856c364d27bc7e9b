/* Token eviction: the policies (one file each, named after their paper),
 * the selection they share, and the state the cache keeps for them.
 * Internal to the library; not installed.
 *
 * A policy gives every slot of a (layer, kv head) a score, higher meaning
 * "keep longer". Scores come from three places:
 *   - when a token is appended (its position, its key's norm, its key's
 *     projection on a calibrated filter): init();
 *   - when attention runs over the cache (the probability each slot
 *     received, from the fused attention pass): observe();
 *   - at selection, a view of the scores (SnapKV's max pooling): rank().
 * Selection (select.c) keeps the protected sinks and recent window, then the
 * best-ranked slots up to the budget, ties to the lowest position. */
#ifndef VQ_EVICT_H
#define VQ_EVICT_H

#include "vq_internal.h"

typedef struct vq_policy {
    const char *name;
    /* Options of this policy beyond the common ones (budget, ratio, sinks,
     * recent, adakv, floor), for error messages; "" when none. */
    const char *options;
    /* Applies a policy-specific option; VQ_ERR_ARG naming the allowed
     * options when unknown. NULL: no own options. */
    vq_status (*set_option)(vq_evict_params *p, const char *key, const char *value);
    /* Fills the policy's defaults and checks them. NULL: nothing to do. */
    vq_status (*finish)(vq_evict_params *p);
    /* Appends ",key=value" for the policy's own options. NULL: none. */
    void (*describe)(const vq_evict_params *p, char *buf, size_t size);
    /* Query tokens of an attention call whose attention to each slot the
     * policy observes (the last ones of the call); 0: it needs no weights. */
    int (*weight_rows)(const vq_evict_params *p, int n_q);
    /* Scores of n new slots: key rows k (n x head_dim fp32, stride
     * k_stride floats), their positions; writes score[0..n). */
    void (*init)(const vq_evict_params *p, const struct vq_evict_state *e, int layer, int head, const float *k,
                 size_t k_stride, const int32_t *pos, int n, int head_dim, float *score);
    /* Updates score[0..n) with w[0..n), the probability each slot received
     * summed over the observed query rows (weight_rows query tokens times
     * the q heads of the GQA group). n_q: query tokens of the call. */
    void (*observe)(const vq_evict_params *p, struct vq_evict_state *e, int n_q, const float *w, int n,
                    float *score);
    /* The scores selection ranks by, rank[0..n) from score[0..n) (slots
     * in position order). NULL: the scores themselves. */
    void (*rank)(const vq_evict_params *p, const float *score, int n, float *rank);
    /* Per-layer budget from the per-head one (PyramidKV). NULL: the same. */
    int64_t (*layer_budget)(const vq_evict_params *p, int64_t budget, int layer, int n_layers);
    /* Scores are attention mass (>= 0, summing like probabilities): Ada-KV
     * normalizes them by their sum; other scores by a softmax. */
    int mass_scores;
} vq_policy;

extern const vq_policy vq_policy_streaming;
extern const vq_policy vq_policy_h2o;
extern const vq_policy vq_policy_tova;
extern const vq_policy vq_policy_keyformer;
extern const vq_policy vq_policy_snapkv;
extern const vq_policy vq_policy_pyramidkv;
extern const vq_policy vq_policy_knorm;
extern const vq_policy vq_policy_qfilters;

/* What the cache keeps for its policy beyond the per-slot scores. */
typedef struct vq_evict_state {
    vq_evict_params p;
    int n_layers, n_heads_kv, head_dim;
    vq_rng rng;             /* keyformer's noise */
    float *filters;         /* qfilters: [n_layers][n_heads_kv][head_dim] */
    /* Scratch for selection, grown on demand. */
    float *rank;
    int64_t *order;
    uint8_t *keep;
    size_t scratch_cap;
    float *weights;         /* key weights attention computes for observe */
    size_t weights_cap;
    /* Per-head views for Ada-KV's shared selection, [n_heads_kv]. */
    float **head_rank;
    uint8_t **head_keep;
    int64_t *head_n;
} vq_evict_state;

/* Parses "POLICY[:key=value,...]" (len bytes of s) into p. */
vq_status vq_evict_parse(const char *s, size_t len, vq_evict_params *p);
/* Writes "+POLICY:budget=...,..." with every default filled in. */
void vq_evict_describe(const vq_evict_params *p, char *buf, size_t size);
/* Comma-separated policy names, for messages. */
const char *vq_evict_policy_names(void);

/* Creates the state for a cache shaped (layers, heads, dim): loads and
 * checks the qfilters file. */
vq_status vq_evict_state_create(const vq_evict_params *p, int n_layers, int n_heads_kv, int head_dim,
                                vq_evict_state **out);
void vq_evict_state_free(vq_evict_state *e);

/* The per-head budget of a layer once `seen` tokens have been appended to
 * it (budget or ceil(ratio * seen), then the policy's per-layer rule),
 * at least 1. With adakv the layer keeps n_heads_kv times this in all. */
int64_t vq_evict_budget(const vq_evict_state *e, int layer, int64_t seen);
/* The protected sinks and recent slots for a budget. */
void vq_evict_protection(const vq_evict_params *p, int64_t budget, int *sinks, int *recent);

/* Selection for one head: keep[i] = 1 for the slots kept, at most `keep_n`
 * of the n slots (all when n <= keep_n): the oldest `sinks` and the newest
 * `recent` slots first (the recent window shrinks first, then the sinks,
 * when they alone pass keep_n), then the best-ranked, ties to the lower
 * slot (lower position). order: n scratch entries. */
void vq_evict_select(const float *rank, int64_t n, int64_t keep_n, int sinks, int recent, uint8_t *keep,
                     int64_t *order);
/* Ada-KV selection for the H heads of a layer: keeps at most total slots in
 * all, every head first its protected slots and floor_n best-ranked ones,
 * then the best normalized ranks over all heads (ties: lower head, then
 * lower slot). ranks[h] / n[h] / keep[h] per head; mass: see
 * vq_policy.mass_scores. norm, order: scratch of sum(n) entries. */
void vq_evict_select_shared(int H, float *const *ranks, const int64_t *n, int64_t total, int64_t floor_n, int sinks,
                            int recent, int mass, uint8_t *const *keep, float *norm, int64_t *order);

/* Max-pools x[0..n) over windows of `kernel` slots centred on each slot
 * (SnapKV's pooling) into out. */
void vq_evict_max_pool(const float *x, int64_t n, int kernel, float *out);

/* SnapKV's options and scoring, shared with PyramidKV (snapkv.c). */
vq_status vq_snapkv_set_option(vq_evict_params *p, const char *key, const char *value);
vq_status vq_snapkv_finish(vq_evict_params *p);
int vq_snapkv_rows(const vq_evict_params *p, int n_q);
void vq_snapkv_init(const vq_evict_params *p, const vq_evict_state *e, int layer, int head, const float *k,
                    size_t k_stride, const int32_t *pos, int n, int head_dim, float *score);
void vq_snapkv_observe(const vq_evict_params *p, vq_evict_state *e, int n_q, const float *w, int n, float *score);
void vq_snapkv_rank(const vq_evict_params *p, const float *score, int n, float *rank);

/* Shared option parsing (src/evict/spec.c): an integer in [lo, hi] or a
 * real in [lo, hi]; errors name the policy, the key and the range. */
vq_status vq_evict_opt_int(const char *policy, const char *key, const char *value, long long lo, long long hi,
                           long long *out);
vq_status vq_evict_opt_real(const char *policy, const char *key, const char *value, double lo, double hi,
                            double *out);

#endif
