/* The "+POLICY[:key=value,...]" part of a KV spec: the policy registry,
 * the options every policy shares, defaults, the canonical description, the
 * budget rule, and the state a cache keeps for its policy. */
#include "evict.h"
#include "evict/qfilters_file.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const vq_policy *const policies[] = {&vq_policy_streaming, &vq_policy_h2o,       &vq_policy_tova,
                                            &vq_policy_keyformer, &vq_policy_snapkv,    &vq_policy_pyramidkv,
                                            &vq_policy_knorm,     &vq_policy_qfilters};
#define N_POLICIES (sizeof policies / sizeof policies[0])

const char *vq_evict_policy_names(void) {
    return "streaming, h2o, tova, keyformer, snapkv, pyramidkv, knorm, qfilters";
}

#define COMMON_OPTIONS "budget, ratio, sinks, recent, adakv, floor"
#define DEFAULT_SINKS 4
#define DEFAULT_FLOOR 0.2
#define MAX_TOKENS 2147483647LL

vq_status vq_evict_opt_int(const char *policy, const char *key, const char *value, long long lo, long long hi,
                           long long *out) {
    char *end = NULL;
    long long x = strtoll(value, &end, 10);
    if (end == value || *end != 0)
        return vq_fail(VQ_ERR_ARG, "%s: %s='%s' is not an integer (allowed %lld..%lld)", policy, key, value, lo, hi);
    if (x < lo || x > hi)
        return vq_fail(VQ_ERR_ARG, "%s: %s=%lld is out of range (allowed %lld..%lld)", policy, key, x, lo, hi);
    *out = x;
    return VQ_OK;
}

vq_status vq_evict_opt_real(const char *policy, const char *key, const char *value, double lo, double hi,
                            double *out) {
    char *end = NULL;
    double x = strtod(value, &end);
    if (end == value || *end != 0 || !isfinite(x))
        return vq_fail(VQ_ERR_ARG, "%s: %s='%s' is not a finite number (allowed %g..%g)", policy, key, value, lo, hi);
    if (x < lo || x > hi)
        return vq_fail(VQ_ERR_ARG, "%s: %s=%g is out of range (allowed %g..%g)", policy, key, x, lo, hi);
    *out = x;
    return VQ_OK;
}

static vq_status set_common(vq_evict_params *p, const char *name, const char *key, const char *value, int *known) {
    long long x;
    vq_status st = VQ_OK;
    *known = 1;
    if (!strcmp(key, "budget")) {
        st = vq_evict_opt_int(name, key, value, 1, MAX_TOKENS, &x);
        if (!st) p->budget = x;
    } else if (!strcmp(key, "ratio")) {
        st = vq_evict_opt_real(name, key, value, 0, 1, &p->ratio);
        if (!st && !(p->ratio > 0)) st = vq_fail(VQ_ERR_ARG, "%s: ratio=%s is out of range (allowed 0 < ratio <= 1)", name, value);
    } else if (!strcmp(key, "sinks")) {
        st = vq_evict_opt_int(name, key, value, 0, 1 << 20, &x);
        if (!st) p->sinks = (int)x;
    } else if (!strcmp(key, "recent")) {
        st = vq_evict_opt_int(name, key, value, 0, 1 << 20, &x);
        if (!st) p->recent = (int)x;
    } else if (!strcmp(key, "adakv")) {
        st = vq_evict_opt_int(name, key, value, 0, 1, &x);
        if (!st) p->adakv = (int)x;
    } else if (!strcmp(key, "floor")) {
        st = vq_evict_opt_real(name, key, value, 0, 1, &p->floor);
    } else {
        *known = 0;
    }
    return st;
}

vq_status vq_evict_parse(const char *s, size_t len, vq_evict_params *p) {
    char buf[512];
    memset(p, 0, sizeof *p);
    if (len == 0) return vq_fail(VQ_ERR_ARG, "empty eviction policy after '+' (policies: %s)", vq_evict_policy_names());
    if (len >= sizeof buf)
        return vq_fail(VQ_ERR_ARG, "eviction spec is too long (%zu bytes, max %zu)", len, sizeof buf - 1);
    memcpy(buf, s, len);
    buf[len] = 0;
    char *opts = strchr(buf, ':');
    if (opts) *opts++ = 0;
    for (size_t i = 0; i < N_POLICIES; i++)
        if (!strcmp(policies[i]->name, buf)) p->policy = policies[i];
    if (!p->policy) return vq_fail(VQ_ERR_ARG, "unknown eviction policy '%s' (policies: %s)", buf, vq_evict_policy_names());
    const vq_policy *pol = p->policy;
    p->sinks = -1;
    p->recent = -1;
    p->floor = -1;
    p->tau = -1;
    if (opts) {
        if (*opts == 0) return vq_fail(VQ_ERR_ARG, "%s: empty option list after ':'", pol->name);
        char *save = NULL;
        for (char *kv = strtok_r(opts, ",", &save); kv; kv = strtok_r(NULL, ",", &save)) {
            char *eq = strchr(kv, '=');
            if (!eq || eq == kv || eq[1] == 0)
                return vq_fail(VQ_ERR_ARG, "%s: option '%s' is not of the form key=value", pol->name, kv);
            *eq = 0;
            int known;
            vq_status st = set_common(p, pol->name, kv, eq + 1, &known);
            if (!st && !known) {
                if (pol->set_option) st = pol->set_option(p, kv, eq + 1);
                else st = vq_fail(VQ_ERR_ARG, "%s: unknown option '%s' (options: %s)", pol->name, kv, COMMON_OPTIONS);
            }
            if (st) return st;
        }
    }
    if (!p->budget && !(p->ratio > 0))
        return vq_fail(VQ_ERR_ARG, "%s: give budget=N (tokens per head, 1..%lld) or ratio=R (0 < R <= 1)", pol->name,
                       MAX_TOKENS);
    if (p->budget && p->ratio > 0)
        return vq_fail(VQ_ERR_ARG, "%s: budget=%lld and ratio=%g both given (allowed: one of them)", pol->name,
                       (long long)p->budget, p->ratio);
    if (p->sinks < 0) p->sinks = DEFAULT_SINKS;
    if (p->budget && p->recent >= 0 && (int64_t)p->sinks + p->recent > p->budget)
        return vq_fail(VQ_ERR_ARG, "%s: sinks=%d + recent=%d pass budget=%lld (allowed sinks + recent <= budget)",
                       pol->name, p->sinks, p->recent, (long long)p->budget);
    if (p->adakv && pol == &vq_policy_streaming)
        return vq_fail(VQ_ERR_ARG, "streaming: adakv=1 needs a scoring policy (allowed with h2o, tova, keyformer, "
                                   "snapkv, pyramidkv, knorm, qfilters)");
    if (p->floor >= 0 && !p->adakv) return vq_fail(VQ_ERR_ARG, "%s: floor=%g needs adakv=1", pol->name, p->floor);
    if (p->floor < 0) p->floor = p->adakv ? DEFAULT_FLOOR : 0;
    return pol->finish ? pol->finish(p) : VQ_OK;
}

void vq_evict_describe(const vq_evict_params *p, char *buf, size_t size) {
    if (!p->policy || size == 0) {
        if (size) buf[0] = 0;
        return;
    }
    char recent[32], own[320] = "";
    if (p->recent >= 0) snprintf(recent, sizeof recent, "%d", p->recent);
    else if (p->budget && !p->policy->layer_budget) snprintf(recent, sizeof recent, "%lld", (long long)(p->budget / 4));
    else snprintf(recent, sizeof recent, "budget/4"); /* follows the budget as it changes */
    if (p->policy->describe) p->policy->describe(p, own, sizeof own);
    char amount[48];
    if (p->budget) snprintf(amount, sizeof amount, "budget=%lld", (long long)p->budget);
    else snprintf(amount, sizeof amount, "ratio=%g", p->ratio);
    char ada[48] = "";
    if (p->adakv) snprintf(ada, sizeof ada, ",adakv=1,floor=%g", p->floor);
    snprintf(buf, size, "+%s:%s,sinks=%d,recent=%s%s%s", p->policy->name, amount, p->sinks, recent, ada, own);
}

int64_t vq_evict_budget(const vq_evict_state *e, int layer, int64_t seen) {
    const vq_evict_params *p = &e->p;
    /* ceil with a little slack, so that 0.25 * 2048 stays 512 */
    int64_t b = p->budget ? p->budget : (int64_t)ceil(p->ratio * (double)seen - 1e-9);
    if (p->policy->layer_budget) b = p->policy->layer_budget(p, b, layer, e->n_layers);
    return b < 1 ? 1 : b;
}

void vq_evict_protection(const vq_evict_params *p, int64_t budget, int *sinks, int *recent) {
    *sinks = p->sinks;
    *recent = p->recent >= 0 ? p->recent : (int)(budget / 4);
}

vq_status vq_evict_state_create(const vq_evict_params *p, int n_layers, int n_heads_kv, int head_dim,
                                vq_evict_state **out) {
    *out = NULL;
    vq_evict_state *e = calloc(1, sizeof *e);
    if (!e) return vq_fail(VQ_ERR_NOMEM, "out of memory for the eviction state");
    e->p = *p;
    e->n_layers = n_layers;
    e->n_heads_kv = n_heads_kv;
    e->head_dim = head_dim;
    vq_rng_seed(&e->rng, p->seed);
    e->head_rank = malloc(sizeof *e->head_rank * (size_t)n_heads_kv);
    e->head_keep = malloc(sizeof *e->head_keep * (size_t)n_heads_kv);
    e->head_n = malloc(sizeof *e->head_n * (size_t)n_heads_kv);
    if (!e->head_rank || !e->head_keep || !e->head_n) {
        vq_evict_state_free(e);
        return vq_fail(VQ_ERR_NOMEM, "out of memory for the eviction state");
    }
    if (p->policy == &vq_policy_qfilters) {
        vq_qfilters f;
        vq_status st = vq_qfilters_load(p->filters, &f);
        if (st) {
            vq_evict_state_free(e);
            return st;
        }
        if (f.n_layers != n_layers || f.n_heads_kv != n_heads_kv || f.head_dim != head_dim) {
            st = vq_fail(VQ_ERR_ARG, "qfilters: '%s' holds %d layers x %d kv heads x dim %d; the cache has %d x %d x %d",
                         p->filters, f.n_layers, f.n_heads_kv, f.head_dim, n_layers, n_heads_kv, head_dim);
            vq_qfilters_free(&f);
            vq_evict_state_free(e);
            return st;
        }
        size_t n = (size_t)n_layers * n_heads_kv * head_dim;
        e->filters = malloc(sizeof(float) * n);
        if (e->filters) memcpy(e->filters, f.dirs, sizeof(float) * n);
        vq_qfilters_free(&f);
        if (!e->filters) {
            vq_evict_state_free(e);
            return vq_fail(VQ_ERR_NOMEM, "out of memory for the Q-Filters directions");
        }
    }
    *out = e;
    return VQ_OK;
}

void vq_evict_state_free(vq_evict_state *e) {
    if (!e) return;
    free(e->filters);
    free(e->rank);
    free(e->order);
    free(e->keep);
    free(e->weights);
    free(e->head_rank);
    free(e->head_keep);
    free(e->head_n);
    free(e);
}
