/* The forward pass against Hugging Face transformers: tiny random Llama 3
 * (llama3 rope scaling), Llama 2 (tied, GQA 4), Mistral, Qwen2 (biases) and
 * Qwen3 (q/k norms, head_dim != hidden/heads) checkpoints with the logits
 * transformers computed for a fixed sequence (fixtures/models, made by
 * make_model_fixtures.py). Checked in prefill (one chunk and many), decode
 * (token by token) and on a quantized cache, for 1 and 2 threads. */
#include "check.h"
#include "veloxquant.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_TOKENS 256

static int read_tokens(const char *path, int32_t *tok) {
    FILE *f = fopen(path, "r");
    if (!f) return 0;
    int n = 0;
    while (n < MAX_TOKENS && fscanf(f, "%d", &tok[n]) == 1) n++;
    fclose(f);
    return n;
}

static float *read_f32(const char *path, size_t n) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    float *x = malloc(sizeof(float) * n);
    size_t got = x ? fread(x, sizeof(float), n, f) : 0;
    fclose(f);
    if (got != n) {
        free(x);
        return NULL;
    }
    return x;
}

/* Relative L2 distance and whether every row's argmax matches. */
static double compare(const float *a, const float *ref, int rows, int V, int *argmax_ok) {
    double num = 0, den = 0;
    *argmax_ok = 1;
    for (int r = 0; r < rows; r++) {
        int ia = 0, ib = 0;
        for (int i = 0; i < V; i++) {
            double d = (double)a[(size_t)r * V + i] - ref[(size_t)r * V + i];
            num += d * d;
            den += (double)ref[(size_t)r * V + i] * ref[(size_t)r * V + i];
            if (a[(size_t)r * V + i] > a[(size_t)r * V + ia]) ia = i;
            if (ref[(size_t)r * V + i] > ref[(size_t)r * V + ib]) ib = i;
        }
        /* a near-tie in the reference may flip; count only clear winners */
        float second = -INFINITY;
        for (int i = 0; i < V; i++)
            if (i != ib && ref[(size_t)r * V + i] > second) second = ref[(size_t)r * V + i];
        if (ia != ib && ref[(size_t)r * V + ib] - second > 1e-2f) *argmax_ok = 0;
    }
    return sqrt(num / den);
}

static void check_model(const char *fixtures, const char *name) {
    char dir[1024], path[1100];
    snprintf(dir, sizeof dir, "%s/models/%s", fixtures, name);
    vq_model *m;
    if (vq_model_load(dir, &m)) {
        CHECK(0, "%s: %s", name, vq_last_error());
        return;
    }
    const vq_model_info *info = vq_model_get_info(m);
    int32_t tok[MAX_TOKENS];
    snprintf(path, sizeof path, "%s/tokens.txt", dir);
    int n = read_tokens(path, tok);
    int V = info->vocab_size;
    snprintf(path, sizeof path, "%s/logits.f32", dir);
    float *ref = read_f32(path, (size_t)n * V);
    CHECK(n > 8 && ref, "%s: fixture tokens/logits missing", name);
    float *out = malloc(sizeof(float) * (size_t)n * V);
    struct {
        const char *spec;
        int chunk;
        int threads;
        double tol;
    } runs[] = {
        {"fp16", 0, 1, 1.5e-3},   /* one prefill chunk */
        {"fp16", 7, 2, 1.5e-3},   /* several chunks: each sees the cache of the last */
        {"fp16", 1, 2, 1.5e-3},   /* decode: token by token */
        {"kivi:bits=8,group=32,residual=0", 5, 2, 6e-3}, /* quantized cache: close, not equal */
    };
    for (size_t r = 0; ref && r < sizeof runs / sizeof runs[0]; r++) {
        vq_cache *c;
        vq_pool *pool;
        vq_pool_create(runs[r].threads, &pool);
        if (vq_model_cache_create(m, runs[r].spec, 0, &c)) {
            CHECK(0, "%s: %s", name, vq_last_error());
            vq_pool_free(pool);
            continue;
        }
        for (size_t i = 0; i < (size_t)n * V; i++) out[i] = NAN;
        vq_status st = vq_model_forward(m, c, tok, n, runs[r].chunk, out, 1, pool);
        CHECK(st == VQ_OK, "%s: forward: %s", name, vq_last_error());
        int argmax_ok;
        double e = compare(out, ref, n, V, &argmax_ok);
        if (getenv("VQ_TEST_VERBOSE")) fprintf(stderr, "%s [%s, chunk %d]: rel err %.3g\n", name, runs[r].spec, runs[r].chunk, e);
        CHECK(e < runs[r].tol, "%s [%s, chunk %d, %d threads]: logits rel. L2 error %.3g (allowed %.1e)", name, runs[r].spec,
              runs[r].chunk, runs[r].threads, e, runs[r].tol);
        CHECK(argmax_ok, "%s [%s, chunk %d]: a clear top-1 token differs from transformers", name, runs[r].spec, runs[r].chunk);
        /* last-row-only logits equal the last row of the full run */
        if (r == 0) {
            float *last = malloc(sizeof(float) * V);
            vq_cache_reset(c);
            vq_model_forward(m, c, tok, n, 0, last, 0, pool);
            CHECK(memcmp(last, out + (size_t)(n - 1) * V, sizeof(float) * V) == 0, "%s: last-row logits differ", name);
            /* positions continue from the cache: feeding the rest after a prefix gives the same logits */
            vq_cache_reset(c);
            vq_model_forward(m, c, tok, n / 2, 0, NULL, 0, pool);
            vq_model_forward(m, c, tok + n / 2, n - n / 2, 0, last, 0, pool);
            double d = 0;
            for (int i = 0; i < V; i++) d = fmax(d, fabs(last[i] - out[(size_t)(n - 1) * V + i]));
            CHECK(d < 1e-3, "%s: prefix + rest differs from one pass by %g", name, d);
            free(last);
        }
        vq_cache_free(c);
        vq_pool_free(pool);
    }
    /* bad input */
    vq_cache *c;
    vq_model_cache_create(m, "fp16", 0, &c);
    int32_t bad = V + 3;
    CHECK(vq_model_forward(m, c, &bad, 1, 0, out, 0, NULL) == VQ_ERR_ARG && strstr(vq_last_error(), "out of range"),
          "%s: token %d accepted: %s", name, bad, vq_last_error());
    vq_cache_free(c);
    vq_cache_config other = {.n_layers = 1, .n_heads_q = 4, .n_heads_kv = 2, .head_dim = 16};
    vq_cache_create(&other, &c);
    CHECK(vq_model_forward(m, c, tok, 1, 0, out, 0, NULL) == VQ_ERR_ARG && strstr(vq_last_error(), "does not fit"),
          "%s: a cache of another shape was accepted: %s", name, vq_last_error());
    vq_cache_free(c);
    free(out);
    free(ref);
    vq_model_free(m);
}

int main(int argc, char **argv) {
    const char *fixtures = argc > 1 ? argv[1] : "tests/fixtures";
    const char *names[] = {"llama3", "llama2", "mistral", "qwen2", "qwen3"};
    for (int i = 0; i < 5; i++) check_model(fixtures, names[i]);
    /* sampling: greedy takes the first maximum; a seeded draw is repeatable */
    float lg[5] = {0.1f, 2.0f, 2.0f, -1.0f, 0.5f}, scratch[10];
    CHECK(vq_sample(lg, 5, 0.0f, 1.0f, NULL, scratch) == 1, "greedy is not the lowest-id maximum");
    vq_rng a, b;
    vq_rng_seed(&a, 7);
    vq_rng_seed(&b, 7);
    int same = 1, seen[5] = {0};
    for (int i = 0; i < 200; i++) {
        int32_t x = vq_sample(lg, 5, 1.0f, 1.0f, &a, scratch), y = vq_sample(lg, 5, 1.0f, 1.0f, &b, scratch);
        same &= x == y;
        seen[x]++;
    }
    CHECK(same, "the same seed gave different samples");
    CHECK(seen[1] > 40 && seen[2] > 40 && seen[3] < 20, "sample counts off: %d %d %d %d %d", seen[0], seen[1], seen[2], seen[3], seen[4]);
    /* top-p 0.5 keeps only the two most likely tokens here */
    int outside = 0;
    for (int i = 0; i < 200; i++) {
        int32_t x = vq_sample(lg, 5, 1.0f, 0.5f, &a, scratch);
        outside += x != 1 && x != 2;
    }
    CHECK(outside == 0, "top-p 0.5 sampled %d tokens outside the nucleus", outside);
    return check_done();
}
