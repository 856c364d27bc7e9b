/* The forward pass against Hugging Face transformers: tiny random Llama 3
 * (llama3 rope scaling, head dim 64), Llama 2 (tied, head dim 128), Mistral
 * (GQA 4), Qwen2 (biases) and Qwen3 (q/k norms, head dim 128 != hidden/heads)
 * checkpoints with the logits transformers computed for three prompts and its
 * greedy continuation of the first (fixtures/models, made by
 * make_model_fixtures.py). Checked in prefill (one chunk and many), decode
 * (token by token) and on a quantized cache, for 1 and 2 threads. */
#include "check.h"
#include "vq_internal.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_TOKENS 256 /* per prompt */

/* Reads up to max_prompts lines of token ids; returns the prompt count. */
static int read_prompts(const char *path, int32_t tok[][MAX_TOKENS], int *len, int max_prompts) {
    FILE *f = fopen(path, "r");
    if (!f) return 0;
    char line[8192];
    int n = 0;
    while (n < max_prompts && fgets(line, sizeof line, f)) {
        int k = 0, off = 0, used;
        while (k < MAX_TOKENS && sscanf(line + off, "%d%n", &tok[n][k], &used) == 1) {
            off += used;
            k++;
        }
        if (k) len[n++] = k;
    }
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

/* With AVX512_BF16 the matmuls round activations to bf16 (2^-8 relative per
 * element), which moves logits by a few 1e-3: that level is checked against
 * this looser floor, and its greedy continuation is not compared. */
static double tol_floor = 0;
static int check_greedy = 1;

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
        /* a near-tie in the reference may flip; count only clear winners:
         * a margin over 1e-2, and at the bf16 level over 5 times the allowed
         * relative error of the row's logits (their RMS times tol_floor) */
        float second = -INFINITY;
        double ss = 0;
        for (int i = 0; i < V; i++) {
            double x = ref[(size_t)r * V + i];
            ss += x * x;
            if (i != ib && ref[(size_t)r * V + i] > second) second = ref[(size_t)r * V + i];
        }
        double margin = 5 * tol_floor * sqrt(ss / V);
        if (margin < 1e-2) margin = 1e-2;
        if (ia != ib && ref[(size_t)r * V + ib] - second > margin) *argmax_ok = 0;
    }
    return sqrt(num / den);
}

#define MAX_PROMPTS 4


static void check_model(const char *fixtures, const char *name) {
    char dir[1024], path[1100];
    snprintf(dir, sizeof dir, "%s/models/%s", fixtures, name);
    vq_model *m;
    if (vq_model_load(dir, &m)) {
        CHECK(0, "%s: %s", name, vq_last_error());
        return;
    }
    const vq_model_info *info = vq_model_get_info(m);
    static int32_t tok[MAX_PROMPTS][MAX_TOKENS];
    int len[MAX_PROMPTS], total = 0;
    snprintf(path, sizeof path, "%s/tokens.txt", dir);
    int n_prompts = read_prompts(path, tok, len, MAX_PROMPTS);
    for (int p = 0; p < n_prompts; p++) total += len[p];
    int V = info->vocab_size;
    /* ref: transformers in float32; ref16: the same with K and V rounded to
     * fp16 after RoPE, which is exactly what an fp16 cache stores */
    snprintf(path, sizeof path, "%s/logits.f32", dir);
    float *ref32 = read_f32(path, (size_t)total * V);
    snprintf(path, sizeof path, "%s/logits_kv16.f32", dir);
    float *ref16 = read_f32(path, (size_t)total * V);
    float *ref = ref32;
    CHECK(n_prompts >= 2 && ref32 && ref16, "%s: fixture prompts/logits missing", name);
    float *out = malloc(sizeof(float) * (size_t)MAX_TOKENS * V);
    /* fp16 caches against ref16 at float32 rounding level; a quantized cache
     * against the float32 reference, close but not equal */
    struct {
        const char *spec;
        int chunk;
        int threads;
        int vs_kv16;
        double tol;
    } runs[] = {
        {"fp16", 0, 1, 1, 1e-4},  /* one prefill chunk (seen: <= 5e-5) */
        {"fp16", 7, 2, 1, 1e-4},  /* several chunks: each sees the cache of the last */
        {"fp16", 1, 2, 1, 1e-4},  /* decode: token by token */
        {"fp16", 0, 2, 0, 2e-3},  /* the fp16 cache is near the float32 model (seen: <= 5e-4) */
        {"kivi:bits=8,group=32,residual=0", 5, 2, 0, 2e-2}, /* seen: <= 6e-3 */
    };
    for (size_t r = 0; ref32 && ref16 && r < sizeof runs / sizeof runs[0]; r++) {
        ref = runs[r].vs_kv16 ? ref16 : ref32;
        vq_cache *c;
        vq_pool *pool;
        vq_pool_create(runs[r].threads, &pool);
        if (vq_model_cache_create(m, runs[r].spec, 0, &c)) {
            CHECK(0, "%s: %s", name, vq_last_error());
            vq_pool_free(pool);
            continue;
        }
        const float *ref_p = ref;
        for (int p = 0; p < n_prompts; p++) {
            int n = len[p];
            vq_cache_reset(c);
            for (size_t i = 0; i < (size_t)n * V; i++) out[i] = NAN;
            vq_status st = vq_model_forward(m, c, tok[p], n, runs[r].chunk, out, 1, pool);
            CHECK(st == VQ_OK, "%s: forward: %s", name, vq_last_error());
            int argmax_ok;
            double e = compare(out, ref_p, n, V, &argmax_ok);
            if (getenv("VQ_TEST_VERBOSE"))
                fprintf(stderr, "%s prompt %d [%s, chunk %d]: rel err %.3g\n", name, p, runs[r].spec, runs[r].chunk, e);
            double tol = runs[r].tol > tol_floor ? runs[r].tol : tol_floor;
            CHECK(e < tol, "%s prompt %d [%s, chunk %d, %d threads]: logits rel. L2 error %.3g (allowed %.1e)", name,
                  p, runs[r].spec, runs[r].chunk, runs[r].threads, e, tol);
            if (runs[r].vs_kv16)
                CHECK(argmax_ok, "%s prompt %d [%s, chunk %d]: a clear top-1 token differs from transformers", name, p,
                      runs[r].spec, runs[r].chunk);
            ref_p += (size_t)n * V;
        }
        vq_cache_free(c);
        vq_pool_free(pool);
    }
    /* Greedy continuation of the first prompt, token by token through the
     * cache, equals transformers' generate (which masks eos while it must
     * produce tokens; so do we). */
    if (check_greedy) {
        int32_t want[64];
        int n_want = 0;
        snprintf(path, sizeof path, "%s/greedy.txt", dir);
        FILE *f = fopen(path, "r");
        while (f && n_want < 64 && fscanf(f, "%d", &want[n_want]) == 1) n_want++;
        if (f) fclose(f);
        CHECK(n_want > 0, "%s: greedy.txt missing", name);
        vq_cache *c;
        vq_model_cache_create(m, "fp16", 0, &c);
        float *lg = malloc(sizeof(float) * V), scratch[2];
        vq_model_forward(m, c, tok[0], len[0], 0, lg, 0, NULL);
        int same = 1;
        for (int i = 0; i < n_want && same; i++) {
            for (int e = 0; e < info->n_eos; e++) lg[info->eos_token_ids[e]] = -INFINITY;
            int32_t next = vq_sample(lg, V, 0.0f, 1.0f, NULL, scratch);
            same = next == want[i];
            CHECK(same, "%s: greedy token %d is %d, transformers gave %d", name, i, next, want[i]);
            vq_model_forward(m, c, &next, 1, 0, lg, 0, NULL);
        }
        free(lg);
        vq_cache_free(c);
    }
    /* last-row-only logits equal the last row of the full run, and a prompt
     * fed in two calls (positions continue from the cache) equals one call */
    {
        vq_cache *c;
        vq_model_cache_create(m, "fp16", 0, &c);
        int n = len[0];
        float *last = malloc(sizeof(float) * V);
        vq_model_forward(m, c, tok[0], n, 0, out, 1, NULL);
        vq_cache_reset(c);
        vq_model_forward(m, c, tok[0], n, 0, last, 0, NULL);
        CHECK(memcmp(last, out + (size_t)(n - 1) * V, sizeof(float) * V) == 0, "%s: last-row logits differ", name);
        vq_cache_reset(c);
        vq_model_forward(m, c, tok[0], n / 2, 0, NULL, 0, NULL);
        vq_model_forward(m, c, tok[0] + n / 2, n - n / 2, 0, last, 0, NULL);
        double d = 0;
        for (int i = 0; i < V; i++) d = fmax(d, fabs(last[i] - out[(size_t)(n - 1) * V + i]));
        CHECK(d < 1e-3, "%s: prefix + rest differs from one pass by %g", name, d);
        free(last);
        /* bad input */
        int32_t bad = V + 3;
        CHECK(vq_model_forward(m, c, &bad, 1, 0, out, 0, NULL) == VQ_ERR_ARG && strstr(vq_last_error(), "out of range"),
              "%s: token %d accepted: %s", name, bad, vq_last_error());
        vq_cache_free(c);
        vq_cache_config other = {.n_layers = 1, .n_heads_q = 4, .n_heads_kv = 2, .head_dim = 16};
        vq_cache_create(&other, &c);
        CHECK(vq_model_forward(m, c, tok[0], 1, 0, out, 0, NULL) == VQ_ERR_ARG && strstr(vq_last_error(), "does not fit"),
              "%s: a cache of another shape was accepted: %s", name, vq_last_error());
        vq_cache_free(c);
    }
    free(out);
    free(ref32);
    free(ref16);
    vq_model_free(m);
}

int main(int argc, char **argv) {
    const char *fixtures = argc > 1 ? argv[1] : "tests/fixtures";
    const char *names[] = {"llama3", "llama2", "mistral", "qwen2", "qwen3"};
    /* Exact parity at the AVX2 (or scalar) level; then, where the CPU has
     * the bf16 dot product, the same models at that level, looser. */
    vq_cpu_level best = vq_cpu_detect();
    vq_cpu_set_level(best >= VQ_CPU_AVX2 ? VQ_CPU_AVX2 : VQ_CPU_SCALAR);
    for (int i = 0; i < 5; i++) check_model(fixtures, names[i]);
    if (best >= VQ_CPU_AVX512) {
        vq_cpu_set_level(VQ_CPU_AVX512);
        if (vq_cpu_has_avx512_bf16()) {
            tol_floor = 2e-2;
            check_greedy = 0;
        }
        for (int i = 0; i < 5; i++) check_model(fixtures, names[i]);
        printf("also checked at the avx512 level%s\n", vq_cpu_has_avx512_bf16() ? " (bf16 dot product)" : "");
    }
    vq_cpu_set_level(VQ_CPU_AUTO);
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
