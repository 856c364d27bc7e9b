/* Eviction policies: spec errors and descriptions, selection rules (ties,
 * pooling, Ada-KV floors, PyramidKV budgets), what each policy scores,
 * Keyformer at tau = 0 equal to H2O, every policy through decode steps and
 * prefill chunks without passing its budget, and a model forward pass with
 * eviction. */
#include "check.h"
#include "evict/evict.h"
#include "evict/qfilters_file.h"
#include "synth.h"
#include "vq_internal.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void expect_error(const char *spec, int bt, const char *needle1, const char *needle2) {
    vq_cache_config cfg = {.n_layers = 2, .n_heads_q = 4, .n_heads_kv = 2, .head_dim = 16, .kv_spec = spec,
                           .block_tokens = bt};
    vq_cache *c = (vq_cache *)1;
    vq_status st = vq_cache_create(&cfg, &c);
    const char *m = vq_last_error();
    CHECK(st != VQ_OK && c == NULL, "spec '%s' was accepted", spec);
    CHECK(strstr(m, needle1) != NULL, "spec '%s': message '%s' lacks '%s'", spec, m, needle1);
    if (needle2) CHECK(strstr(m, needle2) != NULL, "spec '%s': message '%s' lacks '%s'", spec, m, needle2);
}

static void test_spec_errors(void) {
    expect_error("fp16+lru:budget=8", 0, "unknown eviction policy 'lru'", "streaming, h2o, tova");
    expect_error("fp16+h2o:budget=0", 0, "budget=0", "1..2147483647");
    expect_error("fp16+h2o:budget=-5", 0, "budget=-5", "1..2147483647");
    expect_error("fp16+h2o:budget=lots", 0, "'lots'", "integer");
    expect_error("fp16+h2o:ratio=1.5", 0, "ratio=1.5", "0..1");
    expect_error("fp16+h2o:ratio=0", 0, "ratio=0", "0 < ratio <= 1");
    expect_error("fp16+h2o", 0, "budget=N", "ratio=R");
    expect_error("fp16+h2o:", 0, "empty option list", NULL);
    expect_error("fp16+h2o:budget=8,ratio=0.5", 0, "both given", NULL);
    expect_error("fp16+h2o:budget=8,sinks=6,recent=4", 0, "sinks=6 + recent=4", "budget=8");
    expect_error("fp16+h2o:budget=8,window=4", 0, "unknown option 'window'", "budget, ratio");
    expect_error("fp16+h2o:budget=8,floor=0.5", 0, "floor=0.5", "adakv=1");
    expect_error("fp16+streaming:budget=8,adakv=1", 0, "adakv=1", "scoring policy");
    expect_error("fp16+keyformer:budget=8,tau=-1", 0, "tau=-1", "0..100");
    expect_error("fp16+snapkv:budget=8,pool=4", 0, "pool=4", "odd");
    expect_error("fp16+snapkv:budget=8,window=0", 0, "window=0", "1..4096");
    expect_error("fp16+pyramidkv:budget=8,beta=0.5", 0, "beta=0.5", "1..1000");
    expect_error("fp16+qfilters:budget=8", 0, "filters=FILE is required", NULL);
    expect_error("fp16+qfilters:budget=8,filters=no/such/filters.bin", 0, "no/such/filters.bin", NULL);
    expect_error("+h2o:budget=8", 0, "no quantization", NULL);
    expect_error("fp16+", 0, "empty eviction policy", "streaming");
    expect_error("kivi+h2o:budget=64", 64, "block_tokens=64", "0 or 32");
    expect_error("zstd+h2o:budget=64", 0, "unknown method 'zstd'", NULL);
}

static vq_cache *make(const char *spec, int layers, int hq, int hkv, int d) {
    vq_cache_config cfg = {.n_layers = layers, .n_heads_q = hq, .n_heads_kv = hkv, .head_dim = d, .kv_spec = spec};
    vq_cache *c = NULL;
    if (vq_cache_create(&cfg, &c)) fprintf(stderr, "create '%s': %s\n", spec, vq_last_error());
    return c;
}

static void test_describe(void) {
    vq_cache *c = make("kivi:bits=2+snapkv:budget=1024", 1, 4, 2, 16);
    const char *want = "k=kivi:bits=2,group=32,residual=128;v=kivi:bits=2,group=32,residual=128"
                       "+snapkv:budget=1024,sinks=4,recent=256,window=32,pool=7";
    CHECK(c && !strcmp(vq_cache_spec(c), want), "spec described as '%s'", c ? vq_cache_spec(c) : "");
    /* the description is itself a spec that describes the same way */
    vq_cache *c2 = c ? make(vq_cache_spec(c), 1, 4, 2, 16) : NULL;
    CHECK(c2 && !strcmp(vq_cache_spec(c2), want), "round trip gave '%s'", c2 ? vq_cache_spec(c2) : "");
    vq_cache_free(c);
    vq_cache_free(c2);
    c = make("k=tq-mse:bits=4;v=kivi:bits=2+keyformer:ratio=0.25,adakv=1", 1, 4, 2, 16);
    CHECK(c && strstr(vq_cache_spec(c), "+keyformer:ratio=0.25,sinks=4,recent=budget/4,adakv=1,floor=0.2,tau=1,seed=0"),
          "described as '%s'", c ? vq_cache_spec(c) : "");
    vq_cache_free(c);
}

static void test_selection(void) {
    float rank[6] = {3, 1, 2, 2, 5, 0};
    uint8_t keep[6];
    int64_t order[12];
    vq_evict_select(rank, 6, 3, 0, 0, keep, order);
    uint8_t want[6] = {1, 0, 1, 0, 1, 0}; /* 5, 3, then the tie 2 = 2 goes to the lower slot */
    CHECK(!memcmp(keep, want, 6), "select kept %d%d%d%d%d%d", keep[0], keep[1], keep[2], keep[3], keep[4], keep[5]);
    vq_evict_select(rank, 6, 3, 1, 1, keep, order);
    uint8_t want2[6] = {1, 0, 0, 0, 1, 1}; /* sink 0, recent 5, then the best: 4 */
    CHECK(!memcmp(keep, want2, 6), "protected select kept %d%d%d%d%d%d", keep[0], keep[1], keep[2], keep[3], keep[4],
          keep[5]);
    vq_evict_select(rank, 6, 0, 2, 2, keep, order);
    CHECK(!keep[0] && !keep[5], "a budget of 0 kept a protected slot");
    float x[7] = {0, 1, 0, 0, 0, 0, 3}, y[7];
    vq_evict_max_pool(x, 7, 3, y);
    float wy[7] = {1, 1, 1, 0, 0, 3, 3};
    CHECK(!memcmp(y, wy, sizeof y), "max pool %g %g %g %g %g %g %g", y[0], y[1], y[2], y[3], y[4], y[5], y[6]);
    /* Ada-KV: head 0 concentrated, head 1 flat; 8 slots in all, floor 2 */
    float r0[6] = {0, 0, 1, 0, 0, 0}, r1[6] = {1, 1, 1, 1, 1, 1};
    float *ranks[2] = {r0, r1};
    int64_t n[2] = {6, 6};
    uint8_t k0[6], k1[6];
    uint8_t *keeps[2] = {k0, k1};
    float norm[12];
    int64_t ord[24];
    vq_evict_select_shared(2, ranks, n, 8, 2, 0, 0, 1, keeps, norm, ord);
    int c0 = 0, c1 = 0;
    for (int i = 0; i < 6; i++) c0 += k0[i], c1 += k1[i];
    CHECK(c0 == 2 && c1 == 6 && k0[2], "ada-kv split %d + %d (want 2 + 6, with head 0's peak)", c0, c1);
    /* PyramidKV: budgets shrink with depth around the mean */
    vq_evict_params p;
    vq_evict_parse("pyramidkv:budget=100", strlen("pyramidkv:budget=100"), &p);
    vq_evict_state *e = NULL;
    vq_evict_state_create(&p, 6, 2, 16, &e);
    int64_t sum = 0, prev = INT64_MAX;
    int mono = 1;
    for (int l = 0; l < 6; l++) {
        int64_t b = vq_evict_budget(e, l, 1000);
        mono &= b < prev;
        prev = b;
        sum += b;
    }
    CHECK(mono && vq_evict_budget(e, 0, 1000) == 195 && vq_evict_budget(e, 5, 1000) == 5 && llabs(sum - 600) <= 3,
          "pyramid budgets first %lld last %lld sum %lld", (long long)vq_evict_budget(e, 0, 1000),
          (long long)vq_evict_budget(e, 5, 1000), (long long)sum);
    vq_evict_state_free(e);
}

/* One step: append n tokens to every layer, check the budget right after
 * the append (the attention of this step sees exactly this), attend n
 * query rows. Returns 0 when a budget was passed. */
static int step(vq_cache *c, const vq_synth *syn, int64_t t0, int n, float *out) {
    int L = c->cfg.n_layers, H = c->cfg.n_heads_kv, d = c->cfg.head_dim, hq = c->cfg.n_heads_q, ok = 1;
    float *k = malloc(sizeof(float) * n * H * d), *v = malloc(sizeof(float) * n * H * d);
    float *q = malloc(sizeof(float) * n * hq * d);
    int32_t *qpos = malloc(sizeof(int32_t) * n);
    vq_synth_kv(syn, t0, n, k, v);
    for (int i = 0; i < n; i++) {
        vq_synth_q(syn, t0 + i, q + (size_t)i * hq * d);
        qpos[i] = (int32_t)(t0 + i);
    }
    for (int l = 0; l < L; l++) {
        if (vq_cache_append(c, l, n, k, v, VQ_F32, NULL)) {
            fprintf(stderr, "append: %s\n", vq_last_error());
            ok = 0;
        }
        int64_t b = vq_evict_budget(c->evict, l, vq_cache_tokens_seen(c, l)), sum = 0;
        for (int h = 0; h < H; h++) {
            int64_t nh = vq_cache_head_tokens(c, l, h);
            sum += nh;
            if (!c->evict->p.adakv) ok &= nh <= b;
        }
        ok &= sum <= b * H;
        vq_attend_args a = {.n_q = n, .q = q, .q_pos = qpos, .out = out, .out_dtype = VQ_F32};
        if (vq_attend(c, l, &a)) ok = 0;
    }
    free(k), free(v), free(q), free(qpos);
    return ok;
}

static void test_all_policies(const char *qf_path) {
    char qf_spec[400];
    snprintf(qf_spec, sizeof qf_spec, "kivi:bits=2,residual=8+qfilters:budget=24,filters=%s", qf_path);
    const char *specs[] = {"fp16+streaming:budget=24", "kivi:bits=2,residual=8+h2o:budget=24",
                           "tq-mse:bits=4+tova:budget=24", "fp16+keyformer:budget=24,tau=0.5,seed=3",
                           "kivi:bits=4,residual=0+snapkv:budget=24,window=4", "fp16+pyramidkv:ratio=0.5,window=4",
                           "tq-mse:bits=3+knorm:budget=24", qf_spec, "kivi:bits=2,residual=8+h2o:budget=24,adakv=1",
                           "fp16+snapkv:ratio=0.4,adakv=1,floor=0.5", "rvq:bits=2+tova:budget=24,sinks=0,recent=0"};
    vq_synth syn = {.n_heads_kv = 2, .n_heads_q = 4, .head_dim = 32, .seed = 17};
    float *out = malloc(sizeof(float) * 16 * 4 * 32);
    for (size_t s = 0; s < sizeof specs / sizeof specs[0]; s++) {
        vq_cache *c = make(specs[s], 3, 4, 2, 32);
        if (!c) {
            CHECK(0, "'%s' was refused", specs[s]);
            continue;
        }
        int ok = 1;
        int64_t t = 0;
        /* prefill chunks of up to 16, then 60 decode steps */
        while (t < 48) {
            int64_t lim = vq_cache_append_limit(c);
            int n = (int)(lim < 16 ? lim : 16);
            ok &= step(c, &syn, t, n, out);
            t += n;
        }
        for (int i = 0; i < 60; i++, t++) ok &= step(c, &syn, t, 1, out);
        int finite = 1;
        for (int i = 0; i < 4 * 32; i++) finite &= isfinite(out[i]);
        CHECK(ok && finite, "%s: budget passed or attention failed over %lld tokens", specs[s], (long long)t);
        CHECK(vq_cache_last_pos(c, 0) == t - 1, "%s: last position %d, %lld tokens appended", specs[s],
              vq_cache_last_pos(c, 0), (long long)t);
        vq_cache_free(c);
    }
    free(out);
}

/* What the policies score. */
static void test_scores(const char *qf_path) {
    vq_synth syn = {.n_heads_kv = 1, .n_heads_q = 2, .head_dim = 16, .seed = 23};
    float out[2 * 16], q[2 * 16], w1[64];
    int32_t qp = 40;
    vq_synth_q(&syn, 5, q);
    /* h2o accumulates, tova keeps the last query's weights */
    const char *specs[] = {"fp16+h2o:budget=64", "fp16+tova:budget=64"};
    for (int s = 0; s < 2; s++) {
        vq_cache *c = make(specs[s], 1, 2, 1, 16);
        float k[40 * 16], v[40 * 16];
        vq_synth_kv(&syn, 0, 40, k, v);
        vq_cache_append(c, 0, 40, k, v, VQ_F32, NULL);
        vq_attend_args a = {.n_q = 1, .q = q, .q_pos = &qp, .out = out, .out_dtype = VQ_F32};
        vq_attend(c, 0, &a); /* observed by the policy */
        vq_attend(c, 0, &a);
        a.key_weights = w1; /* the caller's weights: not observed */
        vq_attend(c, 0, &a);
        float *sc = vq_stream_at(c, 0, 0)->score;
        int ok = 1;
        for (int i = 0; i < 40; i++) ok &= s == 0 ? sc[i] == w1[i] + w1[i] : sc[i] == w1[i];
        CHECK(ok, "%s: scores are not the observed weights (slot 0: %g vs %g)", specs[s], sc[0], w1[0]);
        vq_cache_free(c);
    }
    /* knorm: -||k||, qfilters: <k, f> with f = e_0 here */
    vq_cache *c1 = make("fp16+knorm:budget=64", 1, 2, 1, 16);
    char spec[400];
    snprintf(spec, sizeof spec, "fp16+qfilters:budget=64,filters=%s", qf_path);
    vq_cache *c2 = make(spec, 1, 2, 1, 16);
    float k[8 * 16], v[8 * 16];
    vq_synth_kv(&syn, 0, 8, k, v);
    if (c1 && c2) {
        vq_cache_append(c1, 0, 8, k, v, VQ_F32, NULL);
        vq_cache_append(c2, 0, 8, k, v, VQ_F32, NULL);
        int ok = 1;
        for (int i = 0; i < 8; i++) {
            double n2 = 0;
            for (int j = 0; j < 16; j++) {
                float x = vq_f16_to_f32(vq_f32_to_f16(k[i * 16 + j]));
                n2 += (double)x * x;
            }
            ok &= fabs(vq_stream_at(c1, 0, 0)->score[i] + sqrt(n2)) < 1e-4 * (1 + sqrt(n2));
            ok &= vq_stream_at(c2, 0, 0)->score[i] == vq_f16_to_f32(vq_f32_to_f16(k[i * 16]));
        }
        CHECK(ok, "knorm / qfilters scores are not -||k|| / <k, f>");
    }
    vq_cache_free(c1);
    vq_cache_free(c2);
}

/* Keyformer with tau = 0 adds the plain attention: H2O exactly. */
static void test_keyformer_tau0(void) {
    vq_cache *a = make("kivi:bits=2,residual=8+h2o:budget=20", 2, 4, 2, 32);
    vq_cache *b = make("kivi:bits=2,residual=8+keyformer:budget=20,tau=0,seed=99", 2, 4, 2, 32);
    vq_cache *n = make("kivi:bits=2,residual=8+keyformer:budget=20,tau=1", 2, 4, 2, 32);
    vq_synth syn = {.n_heads_kv = 2, .n_heads_q = 4, .head_dim = 32, .seed = 29};
    float oa[4 * 32], ob[4 * 32], on[4 * 32];
    int same = 1, differ = 0;
    for (int64_t t = 0; t < 80; t++) {
        step(a, &syn, t, 1, oa);
        step(b, &syn, t, 1, ob);
        step(n, &syn, t, 1, on);
        same &= !memcmp(oa, ob, sizeof oa);
        differ |= memcmp(oa, on, sizeof oa) != 0;
    }
    for (int l = 0; l < 2; l++)
        for (int h = 0; h < 2; h++) {
            int32_t pa[32], pb[32];
            int64_t na = vq_cache_head_tokens(a, l, h), nb = vq_cache_head_tokens(b, l, h);
            vq_cache_decode(a, l, h, NULL, NULL, pa);
            vq_cache_decode(b, l, h, NULL, NULL, pb);
            same &= na == nb && !memcmp(pa, pb, sizeof(int32_t) * (size_t)na) &&
                    !memcmp(vq_stream_at(a, l, h)->score, vq_stream_at(b, l, h)->score, sizeof(float) * (size_t)na);
        }
    CHECK(same, "keyformer tau=0 differs from h2o");
    CHECK(differ, "keyformer tau=1 gave exactly h2o's outputs: the noise does nothing");
    vq_cache_free(a);
    vq_cache_free(b);
    vq_cache_free(n);
}

/* Streaming keeps the sinks and the newest tokens. */
static void test_streaming(void) {
    vq_cache *c = make("kivi:bits=2,residual=0+streaming:budget=40,sinks=4", 1, 2, 1, 32);
    vq_synth syn = {.n_heads_kv = 1, .n_heads_q = 2, .head_dim = 32, .seed = 31};
    float out[2 * 32];
    for (int64_t t = 0; t < 200; t++) step(c, &syn, t, 1, out);
    int32_t pos[40];
    int64_t n = vq_cache_head_tokens(c, 0, 0);
    vq_cache_decode(c, 0, 0, NULL, NULL, pos);
    int ok = n == 40;
    for (int i = 0; i < 40 && ok; i++) ok &= pos[i] == (i < 4 ? i : 200 - 40 + i);
    CHECK(ok, "streaming kept %lld: %d %d %d %d %d .. %d", (long long)n, pos[0], pos[1], pos[2], pos[3], pos[4],
          pos[n - 1]);
    vq_cache_free(c);
}

/* The reference-model fixture runs prefill and decode with eviction. */
static void test_model(const char *fixtures) {
    char dir[512];
    snprintf(dir, sizeof dir, "%s/models/llama3", fixtures);
    vq_model *m;
    if (vq_model_load(dir, &m)) {
        CHECK(0, "load %s: %s", dir, vq_last_error());
        return;
    }
    const vq_model_info *in = vq_model_get_info(m);
    const char *specs[] = {"kivi:bits=2,residual=0+snapkv:budget=40,window=8", "fp16+h2o:ratio=0.5",
                           "tq-mse:bits=4+tova:budget=32,adakv=1"};
    for (int s = 0; s < 3; s++) {
        vq_cache *c;
        if (vq_model_cache_create(m, specs[s], 0, &c)) {
            CHECK(0, "%s: %s", specs[s], vq_last_error());
            continue;
        }
        int32_t tok[150];
        for (int i = 0; i < 150; i++) tok[i] = (i * 37 + 11) % in->vocab_size;
        float *lg = malloc(sizeof(float) * in->vocab_size);
        vq_status st = vq_model_forward(m, c, tok, 120, 0, lg, 0, NULL);
        for (int i = 120; i < 150 && !st; i++) st = vq_model_forward(m, c, tok + i, 1, 1, lg, 0, NULL);
        int ok = st == VQ_OK;
        for (int i = 0; i < in->vocab_size; i++) ok &= isfinite(lg[i]);
        CHECK(ok && vq_cache_last_pos(c, 0) == 149 && vq_cache_tokens_seen(c, 1) == 150,
              "%s: forward with eviction (%s), last position %d", specs[s], st ? vq_last_error() : "ok",
              vq_cache_last_pos(c, 0));
        free(lg);
        vq_cache_free(c);
    }
    vq_model_free(m);
}

int main(int argc, char **argv) {
    const char *fixtures = argc > 1 ? argv[1] : "tests/fixtures";
    /* a filters file for a 3-layer, 2-head, dim-32 cache and a 1 x 1 x 16
     * one, every direction e_0 */
    const char *qf32 = "test_policy_filters32.bin", *qf16 = "test_policy_filters16.bin";
    float dirs[3 * 2 * 32] = {0}, d16[16] = {0};
    for (int i = 0; i < 6; i++) dirs[i * 32] = 1;
    d16[0] = 1;
    vq_qfilters f32 = {.n_layers = 3, .n_heads_kv = 2, .head_dim = 32, .dirs = dirs};
    vq_qfilters f16 = {.n_layers = 1, .n_heads_kv = 1, .head_dim = 16, .dirs = d16};
    CHECK(!vq_qfilters_save(qf32, &f32) && !vq_qfilters_save(qf16, &f16), "writing filters: %s", vq_last_error());
    char spec[400];
    snprintf(spec, sizeof spec, "fp16+qfilters:budget=8,filters=%s", qf32);
    expect_error(spec, 0, "3 layers x 2 kv heads x dim 32", "2 x 2 x 16");
    test_spec_errors();
    test_describe();
    test_selection();
    test_all_policies(qf32);
    test_scores(qf16);
    test_keyformer_tau0();
    test_streaming();
    test_model(fixtures);
    remove(qf32);
    remove(qf16);
    return check_done();
}
