/* veloxquant calibrate qfilters: the Q-Filters directions of a model
 * (arXiv 2503.02812), and a report of how well they predict attention.
 *
 * Calibration: the model reads consecutive windows of the text (BOS + ctx-1
 * tokens each, as ppl does) through an fp16 cache. For every layer and query
 * head the queries after RoPE -- the coordinates of the cached keys the
 * filter is later dotted with -- are summed into the uncentered second
 * moment G = Q^T Q (fp64). Its top eigenvector is the first right singular
 * vector v1 of Q. The sign follows the paper: v1 * sgn(1^T u1), where u1 =
 * Q v1 / s1 is the LEFT singular vector, so 1^T u1 has the sign of the sum
 * of the query projections <q_i, v1>: the filter points where the queries
 * point on average, and the expected logit of a key k grows with <k, f>.
 * The signed vectors of the query heads that share a kv head are averaged
 * and renormalized.
 *
 * Report (--report FILE): on held-out windows, per (layer, kv head) the
 * Spearman rank correlation between a key's score and the mean attention it
 * actually receives -- fp64 softmax attention of every query of the window
 * over the fp16-rounded keys, averaged over the group's query heads and over
 * the queries that see the key (T - j of them for key j) -- for the filter
 * score <k, f> and for KNorm's score -|k|. */
#include "cli.h"
#include "evict/qfilters_file.h"
#include "model/model_internal.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    int L, HQ, HKV, D, T;
    vq_pool *pool;
    /* calibration: per (layer, q head) */
    double *gram;  /* [L][HQ][D][D], upper triangle */
    double *qsum;  /* [L][HQ][D] */
    double *usum;  /* [L][HQ][D]: sum of q / |q|, for the mean cosine */
    /* report: the current window's queries and fp16-rounded keys */
    float *qw;     /* [L][T][HQ * D] */
    float *kw;     /* [L][T][HKV * D] */
    /* the chunk being accumulated (calibration hook -> pool tasks) */
    int layer, n;
    const float *q;
} qk_state;

static void gram_task(void *ctx, int h, int thread) {
    qk_state *s = ctx;
    int D = s->D;
    size_t at = (size_t)s->layer * s->HQ + h;
    double *g = s->gram + at * D * D, *sum = s->qsum + at * D, *usum = s->usum + at * D;
    double row[VQ_QFILTERS_MAX_DIM];
    for (int j = 0; j < s->n; j++) {
        const float *q = s->q + ((size_t)j * s->HQ + h) * D;
        double nn = 0;
        for (int a = 0; a < D; a++) row[a] = q[a], nn += row[a] * row[a];
        nn = nn > 0 ? 1 / sqrt(nn) : 0;
        for (int a = 0; a < D; a++) usum[a] += row[a] * nn;
        for (int a = 0; a < D; a++) {
            double qa = row[a], *ga = g + (size_t)a * D;
            for (int b = a; b < D; b++) ga[b] += qa * row[b];
            sum[a] += qa;
        }
    }
}

static void calib_hook(void *user, int layer, int n, const int32_t *pos, const float *q, const float *k) {
    qk_state *s = user;
    s->layer = layer;
    s->n = n;
    s->q = q;
    vq_pool_run(s->pool, s->HQ, gram_task, s);
}

static void report_hook(void *user, int layer, int n, const int32_t *pos, const float *q, const float *k) {
    qk_state *s = user;
    size_t qd = (size_t)s->HQ * s->D, kd = (size_t)s->HKV * s->D;
    for (int j = 0; j < n; j++) {
        float *qo = s->qw + ((size_t)layer * s->T + pos[j]) * qd, *ko = s->kw + ((size_t)layer * s->T + pos[j]) * kd;
        memcpy(qo, q + (size_t)j * qd, sizeof(float) * qd);
        /* the cache stores fp16 keys: score what attention will read */
        for (size_t i = 0; i < kd; i++) ko[i] = vq_f16_to_f32(vq_f32_to_f16(k[(size_t)j * kd + i]));
    }
}

/* Eigenvalues and eigenvectors of a symmetric D x D matrix by cyclic Jacobi
 * rotations: robust when the top two eigenvalues are close (layer 0 of the
 * reference model has a flat query spectrum), where power iteration crawls.
 * a (full, symmetric) is destroyed; on return its diagonal holds the
 * eigenvalues and the columns of v the eigenvectors. */
static void jacobi_eigen(double *a, double *v, int D) {
    for (int i = 0; i < D * D; i++) v[i] = 0;
    for (int i = 0; i < D; i++) v[(size_t)i * D + i] = 1;
    for (int sweep = 0; sweep < 100; sweep++) {
        double off = 0, diag = 0;
        for (int p = 0; p < D; p++) {
            diag += a[(size_t)p * D + p] * a[(size_t)p * D + p];
            for (int q = p + 1; q < D; q++) off += a[(size_t)p * D + q] * a[(size_t)p * D + q];
        }
        if (off <= 1e-30 * diag) break;
        for (int p = 0; p < D; p++)
            for (int q = p + 1; q < D; q++) {
                double apq = a[(size_t)p * D + q];
                if (apq == 0) continue;
                double theta = (a[(size_t)q * D + q] - a[(size_t)p * D + p]) / (2 * apq);
                double t = (theta >= 0 ? 1.0 : -1.0) / (fabs(theta) + sqrt(theta * theta + 1));
                double c = 1 / sqrt(t * t + 1), s = t * c;
                for (int k = 0; k < D; k++) { /* columns p, q */
                    double akp = a[(size_t)k * D + p], akq = a[(size_t)k * D + q];
                    a[(size_t)k * D + p] = c * akp - s * akq;
                    a[(size_t)k * D + q] = s * akp + c * akq;
                }
                for (int k = 0; k < D; k++) { /* rows p, q */
                    double apk = a[(size_t)p * D + k], aqk = a[(size_t)q * D + k];
                    a[(size_t)p * D + k] = c * apk - s * aqk;
                    a[(size_t)q * D + k] = s * apk + c * aqk;
                }
                for (int k = 0; k < D; k++) {
                    double vkp = v[(size_t)k * D + p], vkq = v[(size_t)k * D + q];
                    v[(size_t)k * D + p] = c * vkp - s * vkq;
                    v[(size_t)k * D + q] = s * vkp + c * vkq;
                }
            }
    }
}

/* The filters from the accumulated moments; prints each head's share of the
 * query energy on the top direction and how far the group's heads agree. */
static int finish_filters(const qk_state *s, long long n_q, vq_qfilters *f) {
    int D = s->D, rep = s->HQ / s->HKV;
    double *a = malloc(sizeof(double) * D * D), *v = malloc(sizeof(double) * D * D), *dir = malloc(sizeof(double) * D);
    f->n_layers = s->L;
    f->n_heads_kv = s->HKV;
    f->head_dim = D;
    f->dirs = malloc(sizeof(float) * (size_t)s->L * s->HKV * D);
    if (!a || !v || !dir || !f->dirs) {
        free(a); free(v); free(dir);
        vq_qfilters_free(f);
        fprintf(stderr, "veloxquant calibrate: out of memory\n");
        return -1;
    }
    /* energy: s1^2 / sum s_i^2; l2/l1: the second eigenvalue over the first;
     * mean <q,f> and mean cos(q, f) over the calibration queries (f signed) */
    fprintf(stderr, "layer head  energy  l2/l1  mean <q,f>  mean cos(q,f)\n");
    for (int l = 0; l < s->L; l++)
        for (int g = 0; g < s->HKV; g++) {
            for (int i = 0; i < D; i++) dir[i] = 0;
            for (int r = 0; r < rep; r++) {
                int h = g * rep + r;
                size_t at = (size_t)l * s->HQ + h;
                const double *gu = s->gram + at * D * D, *sum = s->qsum + at * D, *usum = s->usum + at * D;
                for (int i = 0; i < D; i++)
                    for (int j = i; j < D; j++) a[(size_t)i * D + j] = a[(size_t)j * D + i] = gu[(size_t)i * D + j];
                jacobi_eigen(a, v, D);
                int top = 0, second = -1;
                double trace = 0;
                for (int i = 0; i < D; i++) {
                    trace += a[(size_t)i * D + i];
                    if (a[(size_t)i * D + i] > a[(size_t)top * D + top]) top = i;
                }
                for (int i = 0; i < D; i++)
                    if (i != top && (second < 0 || a[(size_t)i * D + i] > a[(size_t)second * D + second])) second = i;
                /* sgn(1^T u1) = sgn(sum_i <q_i, v1>) = sgn(<sum_i q_i, v1>) */
                double proj = 0, cosv = 0;
                for (int i = 0; i < D; i++) proj += sum[i] * v[(size_t)i * D + top], cosv += usum[i] * v[(size_t)i * D + top];
                double sign = proj < 0 ? -1 : 1;
                for (int i = 0; i < D; i++) dir[i] += sign * v[(size_t)i * D + top];
                double l1 = a[(size_t)top * D + top], l2 = second >= 0 ? a[(size_t)second * D + second] : 0;
                fprintf(stderr, "%5d %4d  %6.3f  %5.3f  %10.3f  %13.3f\n", l, h, l1 / trace, l2 / l1, fabs(proj) / (double)n_q,
                        sign * cosv / (double)n_q);
            }
            double nn = 0;
            for (int i = 0; i < D; i++) nn += dir[i] * dir[i];
            nn = sqrt(nn);
            /* |mean of rep unit vectors|: 1 when the heads agree, near 0 when
             * they point apart and the average says little */
            fprintf(stderr, "%5d  kv %d: |mean of the group's signed directions| = %.3f%s\n", l, g, nn / rep,
                    nn / rep < 0.3 ? "  (the heads disagree: the group filter is weak)" : "");
            float *o = f->dirs + ((size_t)l * s->HKV + g) * D;
            for (int i = 0; i < D; i++) o[i] = (float)(dir[i] / nn);
        }
    free(a); free(v); free(dir);
    return 0;
}

/* Average ranks (ties share the mean of their positions), 1-based. */
typedef struct { double key; int idx; } ranked;
static int cmp_ranked(const void *x, const void *y) {
    double a = ((const ranked *)x)->key, b = ((const ranked *)y)->key;
    int ia = ((const ranked *)x)->idx, ib = ((const ranked *)y)->idx;
    return a < b ? -1 : a > b ? 1 : ia - ib;
}

static void ranks(const double *x, int n, ranked *tmp, double *r) {
    for (int i = 0; i < n; i++) tmp[i] = (ranked){x[i], i};
    qsort(tmp, (size_t)n, sizeof *tmp, cmp_ranked);
    for (int i = 0; i < n;) {
        int j = i;
        while (j + 1 < n && tmp[j + 1].key == tmp[i].key) j++;
        for (int k = i; k <= j; k++) r[tmp[k].idx] = 0.5 * (i + j) + 1;
        i = j + 1;
    }
}

static double spearman(const double *x, const double *y, int n, ranked *tmp, double *rx, double *ry) {
    ranks(x, n, tmp, rx);
    ranks(y, n, tmp, ry);
    double mx = 0, my = 0;
    for (int i = 0; i < n; i++) mx += rx[i], my += ry[i];
    mx /= n;
    my /= n;
    double sxy = 0, sxx = 0, syy = 0;
    for (int i = 0; i < n; i++) {
        sxy += (rx[i] - mx) * (ry[i] - my);
        sxx += (rx[i] - mx) * (rx[i] - mx);
        syy += (ry[i] - my) * (ry[i] - my);
    }
    return sxx > 0 && syy > 0 ? sxy / sqrt(sxx * syy) : 0;
}

typedef struct {
    const qk_state *s;
    const vq_qfilters *f;
    double *rho_f, *rho_n; /* [L][HKV] for this window */
    double *work;          /* per task: see corr_task */
    ranked *rtmp;          /* per task: T */
} corr_ctx;

/* One (layer, kv head): mean attention per key, then the two correlations. */
static void corr_task(void *ctx, int task, int thread) {
    corr_ctx *c = ctx;
    const qk_state *s = c->s;
    int l = task / s->HKV, g = task % s->HKV, T = s->T, D = s->D, rep = s->HQ / s->HKV;
    double *w = c->work + (size_t)task * 6 * T, *att = w, *logit = w + T, *fsc = w + 2 * T, *nsc = w + 3 * T;
    double *r1 = w + 4 * T, *r2 = w + 5 * T;
    double scale = 1 / sqrt((double)D);
    for (int j = 0; j < T; j++) att[j] = 0;
    for (int r = 0; r < rep; r++) {
        int h = g * rep + r;
        for (int i = 0; i < T; i++) {
            const float *q = s->qw + ((size_t)l * T + i) * s->HQ * D + (size_t)h * D;
            double mx = -INFINITY;
            for (int j = 0; j <= i; j++) {
                const float *k = s->kw + ((size_t)l * T + j) * s->HKV * D + (size_t)g * D;
                double d = 0;
                for (int e = 0; e < D; e++) d += (double)q[e] * k[e];
                logit[j] = d * scale;
                if (logit[j] > mx) mx = logit[j];
            }
            double z = 0;
            for (int j = 0; j <= i; j++) z += logit[j] = exp(logit[j] - mx);
            for (int j = 0; j <= i; j++) att[j] += logit[j] / z;
        }
    }
    const float *fd = c->f->dirs + ((size_t)l * s->HKV + g) * D;
    for (int j = 0; j < T; j++) {
        att[j] /= (double)rep * (T - j);
        const float *k = s->kw + ((size_t)l * T + j) * s->HKV * D + (size_t)g * D;
        double dot = 0, nn = 0;
        for (int e = 0; e < D; e++) dot += (double)k[e] * fd[e], nn += (double)k[e] * k[e];
        fsc[j] = dot;
        nsc[j] = -sqrt(nn);
    }
    c->rho_f[task] = spearman(fsc, att, T, c->rtmp + (size_t)task * T, r1, r2);
    c->rho_n[task] = spearman(nsc, att, T, c->rtmp + (size_t)task * T, r1, r2);
}

/* Tokens of the first `need` tokens' worth of text: encoding a 68 MB corpus
 * to use 40 k tokens of it wastes a minute, so a prefix cut at a line end is
 * tried first (16 bytes per token is far above any real text's rate). */
static int32_t *encode_prefix(const char *cmd, const vq_tokenizer *tok, const char *text, size_t len, size_t need,
                              size_t *n_ids) {
    size_t cut = len;
    if (need * 16 < len) {
        cut = need * 16;
        while (cut > 0 && text[cut - 1] != '\n') cut--;
        if (cut == 0) cut = len;
    }
    for (;;) {
        int32_t *ids = malloc(sizeof(int32_t) * (2 * cut + 2));
        if (!ids) {
            fprintf(stderr, "veloxquant %s: out of memory\n", cmd);
            return NULL;
        }
        if (vq_tokenizer_encode(tok, text, cut, -1, ids, 2 * cut + 2, n_ids)) {
            fprintf(stderr, "veloxquant %s: %s\n", cmd, vq_last_error());
            free(ids);
            return NULL;
        }
        /* the last tokens of a cut text may differ from the whole text's */
        if (cut == len || *n_ids >= need + 64) return ids;
        free(ids);
        cut = len;
    }
}

/* Feeds `windows` windows of ctx tokens (BOS + ctx-1 when the tokenizer has
 * a BOS) through an fp16 cache; the hook set on m sees every layer. */
static int run_windows(const char *cmd, vq_model *m, const vq_tokenizer *tok, const char *path, int ctx, int windows,
                       int max_tokens, vq_pool *pool, void (*after_window)(void *, int), void *ctx_after) {
    size_t len, n_ids;
    char *text = cli_read_text(cmd, path, &len);
    if (!text) return -1;
    size_t want = (size_t)ctx * windows;
    if (max_tokens > 0 && (size_t)max_tokens < want) want = (size_t)max_tokens;
    int32_t *ids = encode_prefix(cmd, tok, text, len, want, &n_ids);
    free(text);
    if (!ids) return -1;
    size_t usable = n_ids < want ? n_ids : want;
    int nw = (int)(usable / (size_t)ctx);
    if (nw == 0) {
        fprintf(stderr, "veloxquant %s: '%s' has %zu tokens, fewer than one window of --ctx %d\n", cmd, path, usable, ctx);
        free(ids);
        return -1;
    }
    if (nw < windows)
        fprintf(stderr, "veloxquant %s: '%s' gives %d windows of %d tokens (asked for %d)\n", cmd, path, nw, ctx, windows);
    int32_t bos = vq_tokenizer_bos(tok);
    int32_t *input = malloc(sizeof(int32_t) * (size_t)ctx);
    vq_cache *cache = NULL;
    int rc = -1;
    if (!input || vq_model_cache_create(m, "fp16", 0, &cache)) {
        fprintf(stderr, "veloxquant %s: %s\n", cmd, input ? vq_last_error() : "out of memory");
        goto done;
    }
    for (int w = 0; w < nw; w++) {
        const int32_t *win = ids + (size_t)w * ctx;
        if (bos >= 0) {
            input[0] = bos;
            memcpy(input + 1, win, sizeof(int32_t) * (size_t)(ctx - 1));
        } else {
            memcpy(input, win, sizeof(int32_t) * (size_t)ctx);
        }
        vq_cache_reset(cache);
        if (vq_model_forward(m, cache, input, ctx, 0, NULL, 0, pool)) {
            fprintf(stderr, "\nveloxquant %s: %s\n", cmd, vq_last_error());
            goto done;
        }
        if (after_window) after_window(ctx_after, w);
        fprintf(stderr, "\r%s: window %d/%d", path, w + 1, nw);
    }
    fprintf(stderr, "\n");
    rc = nw;
done:
    free(ids);
    free(input);
    vq_cache_free(cache);
    return rc;
}

typedef struct {
    qk_state *s;
    const vq_qfilters *f;
    double *sum_f, *sum_n, *min_f, *max_f; /* [L][HKV] over windows */
    double *rho_f, *rho_n, *work;
    ranked *rtmp;
} report_acc;

static void report_window(void *user, int w) {
    report_acc *r = user;
    qk_state *s = r->s;
    int n = s->L * s->HKV;
    corr_ctx c = {.s = s, .f = r->f, .rho_f = r->rho_f, .rho_n = r->rho_n, .work = r->work, .rtmp = r->rtmp};
    vq_pool_run(s->pool, n, corr_task, &c);
    for (int i = 0; i < n; i++) {
        r->sum_f[i] += r->rho_f[i];
        r->sum_n[i] += r->rho_n[i];
        if (w == 0 || r->rho_f[i] < r->min_f[i]) r->min_f[i] = r->rho_f[i];
        if (w == 0 || r->rho_f[i] > r->max_f[i]) r->max_f[i] = r->rho_f[i];
    }
}

static int report(const char *cmd, vq_model *m, const vq_tokenizer *tok, qk_state *s, const vq_qfilters *f,
                  const char *path, int ctx, int windows, vq_pool *pool) {
    int n = s->L * s->HKV, rc = -1;
    s->T = ctx;
    s->qw = malloc(sizeof(float) * (size_t)s->L * ctx * s->HQ * s->D);
    s->kw = malloc(sizeof(float) * (size_t)s->L * ctx * s->HKV * s->D);
    report_acc r = {.s = s, .f = f};
    r.sum_f = calloc((size_t)n * 6, sizeof(double));
    r.work = malloc(sizeof(double) * (size_t)n * 6 * ctx);
    r.rtmp = malloc(sizeof(ranked) * (size_t)n * ctx);
    if (!s->qw || !s->kw || !r.sum_f || !r.work || !r.rtmp) {
        fprintf(stderr, "veloxquant %s: out of memory\n", cmd);
        goto done;
    }
    r.sum_n = r.sum_f + n;
    r.min_f = r.sum_f + 2 * n;
    r.max_f = r.sum_f + 3 * n;
    r.rho_f = r.sum_f + 4 * n;
    r.rho_n = r.sum_f + 5 * n;
    vq_model_set_qk_hook(m, report_hook, s);
    int nw = run_windows(cmd, m, tok, path, ctx, windows, 0, pool, report_window, &r);
    vq_model_set_qk_hook(m, NULL, NULL);
    if (nw < 0) goto done;
    double mf = 0, mn = 0;
    printf("Spearman correlation between a key's score and the mean attention it receives\n");
    printf("(%d windows of %d tokens of %s; fp64 attention over fp16 keys; mean over windows, min..max for Q-Filters)\n\n",
           nw, ctx, path);
    printf("| layer | kv head | Q-Filters <k,f> | min .. max | KNorm -|k| |\n| ---: | ---: | ---: | ---: | ---: |\n");
    for (int i = 0; i < n; i++) {
        double a = r.sum_f[i] / nw, b = r.sum_n[i] / nw;
        mf += a;
        mn += b;
        printf("| %d | %d | %.3f | %.3f .. %.3f | %.3f |\n", i / s->HKV, i % s->HKV, a, r.min_f[i], r.max_f[i], b);
    }
    printf("| mean | | %.3f | | %.3f |\n", mf / n, mn / n);
    printf("{\"windows\":%d,\"ctx\":%d,\"qfilters_spearman\":[", nw, ctx);
    for (int i = 0; i < n; i++) printf("%s%.4f", i ? "," : "", r.sum_f[i] / nw);
    printf("],\"knorm_spearman\":[");
    for (int i = 0; i < n; i++) printf("%s%.4f", i ? "," : "", r.sum_n[i] / nw);
    printf("],\"layout\":\"[layer][kv_head]\",\"n_heads_kv\":%d,\"mean_qfilters\":%.4f,\"mean_knorm\":%.4f}\n", s->HKV,
           mf / n, mn / n);
    rc = 0;
done:
    free(s->qw);
    free(s->kw);
    s->qw = s->kw = NULL;
    free(r.sum_f);
    free(r.work);
    free(r.rtmp);
    return rc;
}

static int cmd_qfilters(int argc, char **argv) {
    const char *cmd = "calibrate qfilters", *dir = NULL, *file = NULL, *out = NULL, *val = NULL, *in = NULL;
    int ctx = 2048, windows = 20, report_windows = 4, max_tokens = 0, threads = cli_default_threads();
    for (int i = 0; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        int rc = 0;
        if (!v) { fprintf(stderr, "veloxquant %s: option '%s' needs a value (or is unknown)\n", cmd, a); return 2; }
        if (!strcmp(a, "-m") || !strcmp(a, "--model")) dir = v;
        else if (!strcmp(a, "-f") || !strcmp(a, "--file")) file = v;
        else if (!strcmp(a, "-o") || !strcmp(a, "--out")) out = v;
        else if (!strcmp(a, "--filters")) in = v;
        else if (!strcmp(a, "--report")) val = v;
        else if (!strcmp(a, "--ctx")) rc = cli_int(cmd, "--ctx", v, 2, 1 << 20, &ctx);
        else if (!strcmp(a, "--windows")) rc = cli_int(cmd, "--windows", v, 1, 100000, &windows);
        else if (!strcmp(a, "--report-windows")) rc = cli_int(cmd, "--report-windows", v, 1, 1000, &report_windows);
        else if (!strcmp(a, "--max-tokens")) rc = cli_int(cmd, "--max-tokens", v, 0, 2147483647, &max_tokens);
        else if (!strcmp(a, "--threads")) rc = cli_int(cmd, "--threads", v, 1, 256, &threads);
        else { fprintf(stderr, "veloxquant %s: unknown option '%s' (try 'veloxquant help')\n", cmd, a); return 2; }
        if (rc) return 2;
        i++;
    }
    if (file && !out) { fprintf(stderr, "veloxquant %s: -f FILE calibrates: give -o FILTERS to write them\n", cmd); return 2; }
    if (!file && out) { fprintf(stderr, "veloxquant %s: -o FILTERS needs calibration text: give -f FILE\n", cmd); return 2; }
    if (file && in) { fprintf(stderr, "veloxquant %s: give -f FILE (calibrate) or --filters FILE (load), not both\n", cmd); return 2; }
    if (!file && !(in && val)) {
        fprintf(stderr, "veloxquant %s: nothing to do: give -f FILE -o FILTERS, or --filters FILE --report VALFILE\n", cmd);
        return 2;
    }
    vq_model *m;
    vq_tokenizer *tok;
    if (cli_load_model(cmd, dir, &m, &tok)) return 1;
    const vq_model_info *info = vq_model_get_info(m);
    if (ctx > info->max_position_embeddings) {
        fprintf(stderr, "veloxquant %s: --ctx %d passes the model's context length %d\n", cmd, ctx,
                info->max_position_embeddings);
        vq_tokenizer_free(tok);
        vq_model_free(m);
        return 2;
    }
    qk_state s = {.L = info->n_layers, .HQ = info->n_heads, .HKV = info->n_kv_heads, .D = info->head_dim};
    vq_qfilters f = {0};
    int rc = 1;
    if (vq_pool_create(threads, &s.pool)) { fprintf(stderr, "veloxquant %s: %s\n", cmd, vq_last_error()); goto done; }
    if (s.D > VQ_QFILTERS_MAX_DIM) {
        fprintf(stderr, "veloxquant %s: head_dim %d is above %d\n", cmd, s.D, VQ_QFILTERS_MAX_DIM);
        goto done;
    }
    if (file) {
        s.gram = calloc((size_t)s.L * s.HQ * s.D * s.D, sizeof(double));
        s.qsum = calloc((size_t)s.L * s.HQ * s.D, sizeof(double));
        s.usum = calloc((size_t)s.L * s.HQ * s.D, sizeof(double));
        if (!s.gram || !s.qsum || !s.usum) { fprintf(stderr, "veloxquant %s: out of memory\n", cmd); goto done; }
        double t0 = vq_time_now();
        vq_model_set_qk_hook(m, calib_hook, &s);
        int nw = run_windows(cmd, m, tok, file, ctx, windows, max_tokens, s.pool, NULL, NULL);
        vq_model_set_qk_hook(m, NULL, NULL);
        if (nw < 0) goto done;
        long long n_q = (long long)nw * ctx;
        fprintf(stderr, "%lld queries per head in %.1f s\n", n_q, vq_time_now() - t0);
        if (finish_filters(&s, n_q, &f)) goto done;
        if (vq_qfilters_save(out, &f)) { fprintf(stderr, "veloxquant %s: %s\n", cmd, vq_last_error()); goto done; }
        fprintf(stderr, "wrote %s (%d layers x %d kv heads x %d)\n", out, f.n_layers, f.n_heads_kv, f.head_dim);
    } else {
        if (vq_qfilters_load(in, &f)) { fprintf(stderr, "veloxquant %s: %s\n", cmd, vq_last_error()); goto done; }
        if (f.n_layers != s.L || f.n_heads_kv != s.HKV || f.head_dim != s.D) {
            fprintf(stderr, "veloxquant %s: '%s' holds %d layers x %d kv heads x %d, the model has %d x %d x %d\n", cmd,
                    in, f.n_layers, f.n_heads_kv, f.head_dim, s.L, s.HKV, s.D);
            goto done;
        }
    }
    if (val && report(cmd, m, tok, &s, &f, val, ctx, report_windows, s.pool)) goto done;
    rc = 0;
done:
    free(s.gram);
    free(s.qsum);
    free(s.usum);
    vq_qfilters_free(&f);
    vq_pool_free(s.pool);
    vq_tokenizer_free(tok);
    vq_model_free(m);
    return rc;
}

int vq_cmd_calibrate(int argc, char **argv) {
    if (argc < 1) {
        fprintf(stderr, "veloxquant calibrate: give what to calibrate (available: qfilters)\n");
        return 2;
    }
    if (!strcmp(argv[0], "qfilters")) return cmd_qfilters(argc - 1, argv + 1);
    fprintf(stderr, "veloxquant calibrate: unknown target '%s' (available: qfilters)\n", argv[0]);
    return 2;
}
