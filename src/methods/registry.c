/* The method registry and the KV spec parser:
 *   METHOD[:key=value,...]            same method for keys and values
 *   k=METHOD[:...];v=METHOD[:...]     keys and values apart
 *   ...+POLICY[:key=value,...]        eviction (src/evict/spec.c) */
#include "vq_internal.h"
#include "evict/evict.h"

#include <stdio.h>
#include <string.h>

static const vq_method *const methods[] = {&vq_method_fp16, &vq_method_kivi, &vq_method_tq_mse, &vq_method_tq_prod,
                                           &vq_method_rvq, &vq_method_qjl, &vq_method_polar};
#define N_METHODS (sizeof methods / sizeof methods[0])

int vq_token_group_one(const vq_mparams *p) {
    (void)p;
    return 1;
}

const vq_method *vq_method_find(const char *name) {
    for (size_t i = 0; i < N_METHODS; i++)
        if (strcmp(methods[i]->name, name) == 0) return methods[i];
    return NULL;
}

const char *vq_method_names(void) { return "fp16, kivi, tq-mse, tq-prod, rvq, qjl, polar"; }

/* Parses "name[:k=v,...]" (len bytes of s) into p. */
static vq_status parse_one(const char *s, size_t len, int head_dim, bool is_value, vq_mparams *p) {
    char buf[256];
    const char *what = is_value ? "values" : "keys";
    if (len == 0) return vq_fail(VQ_ERR_ARG, "empty method for %s in KV spec (methods: %s)", what, vq_method_names());
    if (len >= sizeof buf) return vq_fail(VQ_ERR_ARG, "method spec for %s is too long (%zu bytes, max %zu)", what, len, sizeof buf - 1);
    memcpy(buf, s, len);
    buf[len] = 0;
    char *opts = strchr(buf, ':');
    if (opts) *opts++ = 0;
    const vq_method *m = vq_method_find(buf);
    if (!m) return vq_fail(VQ_ERR_ARG, "unknown method '%s' for %s (methods: %s)", buf, what, vq_method_names());
    memset(p, 0, sizeof *p);
    p->method = m;
    p->is_value = is_value;
    p->head_dim = head_dim;
    p->residual = -1; /* "not set": finish() picks the method's default */
    if (opts) {
        if (*opts == 0) return vq_fail(VQ_ERR_ARG, "method '%s': empty option list after ':'", m->name);
        char *save = NULL;
        for (char *kv = strtok_r(opts, ",", &save); kv; kv = strtok_r(NULL, ",", &save)) {
            char *eq = strchr(kv, '=');
            if (!eq || eq == kv || eq[1] == 0)
                return vq_fail(VQ_ERR_ARG, "method '%s': option '%s' is not of the form key=value", m->name, kv);
            *eq = 0;
            vq_status st = m->set_option(p, kv, eq + 1);
            if (st) return st;
        }
    }
    return m->finish(p);
}

/* The quantization part of a spec (len bytes; no policy). */
static vq_status parse_quant(const char *spec, size_t len, int head_dim, vq_spec *out) {
    char whole[1024];
    if (len >= sizeof whole) return vq_fail(VQ_ERR_ARG, "KV spec is too long (%zu bytes, max %zu)", len, sizeof whole - 1);
    memcpy(whole, spec, len);
    whole[len] = 0;
    spec = whole;
    if (strncmp(spec, "k=", 2) == 0 || strncmp(spec, "v=", 2) == 0 || strchr(spec, ';')) {
        const char *semi = strchr(spec, ';');
        if (!semi) return vq_fail(VQ_ERR_ARG, "KV spec '%s' names one of keys/values only: use 'k=METHOD;v=METHOD'", spec);
        const char *a = spec, *b = semi + 1;
        size_t alen = (size_t)(semi - spec), blen = len - alen - 1;
        if (strchr(b, ';')) return vq_fail(VQ_ERR_ARG, "KV spec '%s' has more than one ';'", spec);
        if (strncmp(a, "v=", 2) == 0) { /* accept v=...;k=... */
            const char *t = a; a = b; b = t;
            size_t tl = alen; alen = blen; blen = tl;
        }
        if (strncmp(a, "k=", 2) != 0 || strncmp(b, "v=", 2) != 0)
            return vq_fail(VQ_ERR_ARG, "KV spec '%s': expected 'k=METHOD[:...];v=METHOD[:...]'", spec);
        vq_status st = parse_one(a + 2, alen - 2, head_dim, false, &out->k);
        if (st) return st;
        return parse_one(b + 2, blen - 2, head_dim, true, &out->v);
    }
    vq_status st = parse_one(spec, len, head_dim, false, &out->k);
    if (st) return st;
    return parse_one(spec, len, head_dim, true, &out->v);
}

vq_status vq_spec_parse(const char *spec, int head_dim, vq_spec *out) {
    memset(out, 0, sizeof *out);
    if (!spec || !*spec) spec = "fp16";
    /* the policy follows the first '+' (quantization specs have none) */
    const char *plus = strchr(spec, '+');
    size_t qlen = plus ? (size_t)(plus - spec) : strlen(spec);
    if (qlen == 0) return vq_fail(VQ_ERR_ARG, "KV spec '%s' has no quantization before '+' (e.g. 'fp16+%s')", spec, plus + 1);
    vq_status st = parse_quant(spec, qlen, head_dim, out);
    if (!st && plus) st = vq_evict_parse(plus + 1, strlen(plus + 1), &out->evict);
    return st;
}

void vq_spec_describe(const vq_spec *s, char *buf, size_t size) {
    char a[200], b[200];
    s->k.method->describe(&s->k, a, sizeof a);
    s->v.method->describe(&s->v, b, sizeof b);
    char e[400];
    vq_evict_describe(&s->evict, e, sizeof e);
    snprintf(buf, size, "k=%s;v=%s%s", a, b, e);
}
