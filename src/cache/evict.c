/* The cache drives its eviction policy (src/evict/).
 *
 * Budget semantics. Let B(l, t) be layer l's per-head budget once t tokens
 * have been appended to it (budget=N, or ceil(ratio * t); PyramidKV scales
 * it per layer). An append of n tokens to layer l, with t tokens seen
 * before it, first evicts every head down to B(l, t + n) - n slots using the
 * scores known at that moment, then appends. So a head never holds more
 * than B(l, t + n), not even during the attention of the step that
 * appends, and the new tokens always enter the cache (their own query must
 * see them). An append of more than B(l, t + n) tokens is refused:
 * vq_cache_append_limit says how many fit. With adakv=1 the bound is on
 * the layer, n_heads_kv * (B - n) slots shared by its heads.
 *
 * Scores are known from appends (position, key norm, filter projection) and
 * from attention calls on the cache (the weights each slot received), so a
 * decode step evicts by everything up to the previous step. */
#include "vq_internal.h"
#include "evict/evict.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* Selection scratch for `slots` slots in all. */
static vq_status ensure_scratch(vq_evict_state *e, size_t slots) {
    if (slots <= e->scratch_cap) return VQ_OK;
    size_t cap = e->scratch_cap ? e->scratch_cap : 256;
    while (cap < slots) cap *= 2;
    float *r = realloc(e->rank, sizeof *r * 2 * cap);
    if (r) e->rank = r;
    int64_t *o = r ? realloc(e->order, sizeof *o * 2 * cap) : NULL;
    if (o) e->order = o;
    uint8_t *k = o ? realloc(e->keep, cap) : NULL;
    if (k) e->keep = k;
    if (!k) return vq_fail(VQ_ERR_NOMEM, "out of memory for eviction scratch (%zu slots)", cap);
    e->scratch_cap = cap;
    return VQ_OK;
}

static const float *ranks_of(vq_evict_state *e, const vq_stream *s, int64_t n, float *rank) {
    if (!e->p.policy->rank) return s->score;
    e->p.policy->rank(&e->p, s->score, (int)n, rank);
    return rank;
}

vq_status vq_cache_evict_for(vq_cache *c, int layer, int n_new) {
    /* The capacity is checked against the counts eviction is about to
     * leave, before anything is evicted: a refused append changes nothing. */
    vq_evict_state *e = c->evict;
    int H = c->cfg.n_heads_kv;
    int64_t budget = vq_evict_budget(e, layer, c->seen[layer] + n_new);
    if (n_new > budget)
        return vq_fail(VQ_ERR_ARG, "appending %d tokens at once to layer %d passes its eviction budget of %lld tokens per "
                                   "head (%s); append at most vq_cache_append_limit() tokens at a time",
                       n_new, layer, (long long)budget, c->spec_text);
    int64_t keep_n = budget - n_new, total = 0, most = 0;
    for (int h = 0; h < H; h++) {
        int64_t n = vq_cache_head_tokens(c, layer, h);
        total += n;
        most = n > most ? n : most;
    }
    if (e->p.adakv ? total <= keep_n * H : most <= keep_n) return vq_cache_check_room(c, layer, most, n_new);
    if (!e->p.adakv) {
        vq_status st = vq_cache_check_room(c, layer, keep_n, n_new);
        if (st) return st;
    }
    vq_status st = ensure_scratch(e, (size_t)total);
    if (st) return st;
    int sinks, recent;
    vq_evict_protection(&e->p, budget, &sinks, &recent);
    if (!e->p.adakv) {
        for (int h = 0; h < H; h++) {
            vq_stream *s = vq_stream_at(c, layer, h);
            int64_t n = s->n_quant + s->win_n;
            if (n <= keep_n) continue;
            const float *rank = ranks_of(e, s, n, e->rank);
            vq_evict_select(rank, n, keep_n, sinks, recent, e->keep, e->order);
            vq_stream_keep(c, s, e->keep);
        }
        return VQ_OK;
    }
    int64_t base = 0;
    for (int h = 0; h < H; h++) {
        vq_stream *s = vq_stream_at(c, layer, h);
        int64_t n = s->n_quant + s->win_n;
        /* selection reads the ranks and the norm scratch as separate arrays */
        float *r = e->rank + base;
        const float *src = ranks_of(e, s, n, r);
        if (src != r) memcpy(r, src, sizeof(float) * (size_t)n);
        e->head_rank[h] = r;
        e->head_keep[h] = e->keep + base;
        e->head_n[h] = n;
        base += n;
    }
    int64_t floor_n = (int64_t)(e->p.floor * (double)keep_n + 0.5);
    vq_evict_select_shared(H, e->head_rank, e->head_n, keep_n * H, floor_n, sinks, recent, e->p.policy->mass_scores,
                           e->head_keep, e->rank + total, e->order);
    int64_t most_kept = 0;
    for (int h = 0; h < H; h++) {
        int64_t k = 0;
        for (int64_t i = 0; i < e->head_n[h]; i++) k += e->head_keep[h][i];
        most_kept = k > most_kept ? k : most_kept;
    }
    st = vq_cache_check_room(c, layer, most_kept, n_new);
    if (st) return st;
    for (int h = 0; h < H; h++) vq_stream_keep(c, vq_stream_at(c, layer, h), e->head_keep[h]);
    return VQ_OK;
}

int vq_cache_weight_rows(const vq_cache *c, int n_q) {
    if (!c->evict) return 0;
    int r = c->evict->p.policy->weight_rows(&c->evict->p, n_q);
    return r < n_q ? r : n_q;
}

float *vq_cache_weight_scratch(vq_cache *c, size_t floats) {
    vq_evict_state *e = c->evict;
    if (floats > e->weights_cap) {
        float *w = realloc(e->weights, sizeof *w * floats);
        if (!w) return NULL;
        e->weights = w;
        e->weights_cap = floats;
    }
    return e->weights;
}

void vq_cache_observe(vq_cache *c, int layer, int n_q, const float *w, size_t ld) {
    vq_evict_state *e = c->evict;
    if (!e->p.policy->observe) return;
    /* keyformer perturbs the weights in the rank scratch */
    if (ensure_scratch(e, ld)) return;
    for (int h = 0; h < c->cfg.n_heads_kv; h++) {
        vq_stream *s = vq_stream_at(c, layer, h);
        e->p.policy->observe(&e->p, e, n_q, w + (size_t)h * ld, (int)(s->n_quant + s->win_n), s->score);
    }
}

int64_t vq_cache_append_limit(const vq_cache *c) {
    if (!c || !c->evict) return INT64_MAX;
    int64_t best = INT64_MAX;
    for (int l = 0; l < c->cfg.n_layers; l++) {
        int64_t seen = c->seen[l], n;
        if (c->evict->p.budget) {
            n = vq_evict_budget(c->evict, l, seen + 1);
        } else {
            /* ratio: the most n with n <= B(l, seen + n); B grows by about
             * ratio per token, so start from the fixed point and step down */
            double r = c->evict->p.ratio;
            n = r >= 1 ? INT32_MAX : (int64_t)(r * (double)seen / (1 - r)) + 2;
            if (n > INT32_MAX) n = INT32_MAX;
            while (n > 1 && n > vq_evict_budget(c->evict, l, seen + n)) n--;
        }
        best = n < best ? n : best;
    }
    return best;
}
