/* Eviction mechanics: exact budgets under ties and full protection,
 * positions and attention after eviction (fp16, kivi-2, tq-mse), in-place
 * compaction (kept tokens bit for bit unchanged), memory freed by the
 * evicted share (per-token methods and KIVI's grouped keys), per-head
 * budgets, the key weights of the fused attention, and appends refused
 * for capacity leaving the cache untouched. */
#include "check.h"
#include "evict/evict.h"
#include "synth.h"
#include "vq_internal.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

static vq_cache *make_capped(const char *spec, int layers, int hq, int hkv, int d, int bt, int64_t capacity) {
    vq_cache_config cfg = {.n_layers = layers, .n_heads_q = hq, .n_heads_kv = hkv, .head_dim = d, .kv_spec = spec,
                           .block_tokens = bt, .capacity = capacity};
    vq_cache *c = NULL;
    if (vq_cache_create(&cfg, &c)) fprintf(stderr, "create '%s': %s\n", spec, vq_last_error());
    return c;
}

static vq_cache *make(const char *spec, int layers, int hq, int hkv, int d, int bt) {
    return make_capped(spec, layers, hq, hkv, d, bt, 0);
}

/* Appends tokens [t0, t0 + n) of a synthetic stream to one layer. */
static void append_synth(vq_cache *c, const vq_synth *syn, int layer, int64_t t0, int n) {
    int hkv = syn->n_heads_kv, d = syn->head_dim;
    float *k = malloc(sizeof(float) * (size_t)n * hkv * d), *v = malloc(sizeof(float) * (size_t)n * hkv * d);
    vq_synth_kv(syn, t0, n, k, v);
    vq_status st = vq_cache_append(c, layer, n, k, v, VQ_F32, NULL);
    if (st) fprintf(stderr, "append: %s\n", vq_last_error());
    free(k);
    free(v);
}

static int64_t positions_of(vq_cache *c, int layer, int head, int32_t *pos) {
    vq_cache_decode(c, layer, head, NULL, NULL, pos);
    return vq_cache_head_tokens(c, layer, head);
}

/* All scores equal (h2o with no attention calls): every append keeps the
 * sinks, the recent window and then the lowest positions; the budget holds
 * after every append. */
static void test_budget_ties(void) {
    int B = 16;
    vq_cache *c = make("fp16+h2o:budget=16,sinks=2,recent=4", 1, 2, 1, 16, 0);
    vq_synth syn = {.n_heads_kv = 1, .n_heads_q = 2, .head_dim = 16, .seed = 1};
    int ok = 1;
    for (int t = 0; t < 60; t++) {
        append_synth(c, &syn, 0, t, 1);
        ok &= vq_cache_head_tokens(c, 0, 0) <= B;
    }
    CHECK(ok, "a head held more than the budget of %d", B);
    int32_t pos[64];
    int64_t n = positions_of(c, 0, 0, pos);
    /* before the last append: 15 kept = sinks 0, 1, the 9 lowest candidates
     * 2..10, the recent 55..58; then 59 */
    int32_t want[16] = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 55, 56, 57, 58, 59};
    CHECK(n == 16 && !memcmp(pos, want, sizeof want), "tied scores kept %lld slots, positions %d %d .. %d %d", (long long)n,
          pos[0], pos[1], pos[n - 2], pos[n - 1]);
    vq_cache_free(c);

    /* everything protected (sinks + recent = budget): the recent window
     * yields one slot for the new token, the sinks stay */
    c = make("fp16+h2o:budget=16,sinks=8,recent=8", 1, 2, 1, 16, 0);
    ok = 1;
    for (int t = 0; t < 40; t++) {
        append_synth(c, &syn, 0, t, 1);
        ok &= vq_cache_head_tokens(c, 0, 0) <= B;
    }
    n = positions_of(c, 0, 0, pos);
    int32_t want2[16] = {0, 1, 2, 3, 4, 5, 6, 7, 32, 33, 34, 35, 36, 37, 38, 39};
    CHECK(ok && n == 16 && !memcmp(pos, want2, sizeof want2), "all-protected budget: %lld slots, %d .. %d", (long long)n,
          pos[0], pos[n - 1]);
    /* an append larger than the budget is refused and changes nothing */
    float k[17 * 16] = {0}, v[17 * 16] = {0};
    vq_status st = vq_cache_append(c, 0, 17, k, v, VQ_F32, NULL);
    CHECK(st == VQ_ERR_ARG && strstr(vq_last_error(), "budget of 16"), "oversized append: %s", vq_last_error());
    CHECK(vq_cache_head_tokens(c, 0, 0) == 16 && vq_cache_append_limit(c) == 16, "limit %lld",
          (long long)vq_cache_append_limit(c));
    vq_cache_free(c);

    /* ratio: at most ceil(R * seen) after every append, in chunks too */
    c = make("fp16+h2o:ratio=0.3", 1, 2, 1, 16, 0);
    ok = 1;
    int64_t seen = 0;
    while (seen < 300) {
        int64_t lim = vq_cache_append_limit(c);
        int n_new = (int)(lim < 7 ? lim : 7);
        append_synth(c, &syn, 0, seen, n_new);
        seen += n_new;
        ok &= vq_cache_head_tokens(c, 0, 0) <= (int64_t)ceil(0.3 * (double)seen - 1e-9);
    }
    CHECK(ok && vq_cache_tokens_seen(c, 0) == seen, "ratio budget passed (seen %lld)", (long long)seen);
    vq_cache_free(c);
}

/* Keeps a random subset of every stream of layer 0 through the compaction
 * itself and checks that each kept token decodes bit for bit as before
 * (its codes moved, nothing was re-encoded), with its position. */
static void test_in_place(const char *spec, int bt) {
    int d = 64, hkv = 2, n_tok = 300;
    vq_cache *c = make(spec, 1, 4, hkv, d, bt);
    if (!c) return;
    vq_synth syn = {.n_heads_kv = hkv, .n_heads_q = 4, .head_dim = d, .seed = 7};
    for (int t = 0; t < n_tok; t += 50) append_synth(c, &syn, 0, t, 50);
    vq_rng rng;
    vq_rng_seed(&rng, 3);
    float *k0 = malloc(sizeof(float) * n_tok * d), *v0 = malloc(sizeof(float) * n_tok * d);
    float *k1 = malloc(sizeof(float) * n_tok * d), *v1 = malloc(sizeof(float) * n_tok * d);
    int32_t p0[300], p1[300];
    uint8_t keep[300];
    int ok = 1;
    for (int round = 0; round < 3; round++)
        for (int h = 0; h < hkv; h++) {
            int64_t n = vq_cache_head_tokens(c, 0, h);
            vq_cache_decode(c, 0, h, k0, v0, p0);
            int64_t kept = 0;
            for (int64_t i = 0; i < n; i++) kept += keep[i] = vq_rng_uniform(&rng) < 0.7;
            /* tag each slot's score with its position: scores travel with slots */
            vq_stream *s = vq_stream_at(c, 0, h);
            for (int64_t i = 0; i < n; i++) s->score[i] = (float)p0[i];
            vq_stream_keep(c, s, keep);
            ok &= vq_cache_head_tokens(c, 0, h) == kept;
            vq_cache_decode(c, 0, h, k1, v1, p1);
            for (int64_t i = 0, j = 0; i < n; i++) {
                if (!keep[i]) continue;
                ok &= p1[j] == p0[i] && !memcmp(k1 + j * d, k0 + i * d, sizeof(float) * d) &&
                      !memcmp(v1 + j * d, v0 + i * d, sizeof(float) * d) && s->score[j] == (float)p1[j];
                j++;
            }
        }
    CHECK(ok, "%s: kept tokens changed when others were evicted", spec);
    /* the positions continue after the newest token whatever was evicted */
    append_synth(c, &syn, 0, n_tok, 1);
    positions_of(c, 0, 0, p1);
    CHECK(p1[vq_cache_head_tokens(c, 0, 0) - 1] == n_tok, "%s: new token at position %d, not %d", spec,
          p1[vq_cache_head_tokens(c, 0, 0) - 1], n_tok);
    free(k0), free(v0), free(k1), free(v1);
    vq_cache_free(c);
}

/* A policy evicts while tokens stream in; then fused attention over the
 * cache equals fp64 attention over the decoded kept tokens at their
 * original positions, for decode (split-KV) and a causal prefill chunk. */
static void test_attend_after_evict(const char *spec) {
    int d = 64, hq = 8, hkv = 2, seq = 700, layer = 1;
    vq_cache *c = make(spec, 2, hq, hkv, d, 0);
    if (!c) return;
    vq_synth syn = {.n_heads_kv = hkv, .n_heads_q = hq, .head_dim = d, .seed = 11};
    int64_t t = 0;
    for (int step = 1; t < seq; step = step % 40 + 7) {
        int n = (int)(seq - t < step ? seq - t : step);
        append_synth(c, &syn, layer, t, n);
        t += n;
    }
    int64_t n_k = vq_cache_head_tokens(c, layer, 0);
    CHECK(n_k == 256 && vq_cache_head_tokens(c, layer, 1) == 256, "%s: %lld tokens held, budget 256", spec,
          (long long)n_k);
    if (n_k != 256 || vq_cache_head_tokens(c, layer, 1) != 256) { /* the rest assumes equal heads */
        vq_cache_free(c);
        return;
    }
    float *dk = malloc(sizeof(float) * hkv * n_k * d), *dv = malloc(sizeof(float) * hkv * n_k * d);
    int32_t *pos = malloc(sizeof(int32_t) * n_k);
    int ok_pos = 1;
    for (int h = 0; h < hkv; h++) {
        vq_cache_decode(c, layer, h, dk + h * n_k * d, dv + h * n_k * d, pos);
        for (int64_t i = 1; i < n_k; i++) ok_pos &= pos[i] > pos[i - 1];
        ok_pos &= pos[0] == 0 && pos[n_k - 1] == seq - 1; /* the sink and the newest */
    }
    CHECK(ok_pos, "%s: positions not increasing, or sink/newest lost", spec);
    for (int n_q = 1; n_q <= 40; n_q += 39) {
        float *q = malloc(sizeof(float) * n_q * hq * d), *out = malloc(sizeof(float) * n_q * hq * d);
        int32_t *qpos = malloc(sizeof(int32_t) * n_q);
        for (int i = 0; i < n_q; i++) {
            vq_synth_q(&syn, i, q + (size_t)i * hq * d);
            qpos[i] = (int32_t)(seq - 30 + i); /* some keys are in these rows' future */
        }
        vq_attend_args a = {.n_q = n_q, .q = q, .q_pos = qpos, .out = out, .out_dtype = VQ_F32};
        vq_status st = vq_attend(c, layer, &a);
        double *ref = malloc(sizeof(double) * n_q * hq * d);
        /* per kv head over its own kept positions (heads keep different ones) */
        for (int h = 0; h < hkv; h++) {
            int32_t *ph = malloc(sizeof(int32_t) * n_k);
            vq_cache_decode(c, layer, h, NULL, NULL, ph);
            int g = hq / hkv;
            float *qh = malloc(sizeof(float) * n_q * g * d);
            for (int i = 0; i < n_q; i++) memcpy(qh + (size_t)i * g * d, q + ((size_t)i * hq + h * g) * d, sizeof(float) * g * d);
            double *rh = malloc(sizeof(double) * n_q * g * d);
            vq_attend_reference(g, 1, d, n_q, qh, qpos, (int)n_k, dk + h * n_k * d, dv + h * n_k * d, ph,
                                1.0 / sqrt((double)d), rh);
            for (int i = 0; i < n_q; i++) memcpy(ref + ((size_t)i * hq + h * g) * d, rh + (size_t)i * g * d, sizeof(double) * g * d);
            free(qh);
            free(rh);
            free(ph);
        }
        double err = rel_l2(out, ref, (size_t)n_q * hq * d);
        CHECK(st == VQ_OK && err < 1e-4, "%s n_q %d: attention after eviction, rel err %.3g", spec, n_q, err);
        free(q), free(out), free(qpos), free(ref);
    }
    free(dk), free(dv), free(pos);
    vq_cache_free(c);
}

static size_t r64(size_t x) { return (x + 63) & ~(size_t)63; }

/* Memory follows the kept share. Per-token layouts: exactly the blocks the
 * kept tokens fill. KIVI's grouped keys: a group keeping k of its G tokens
 * takes a block of ceil(k / 8) * 8 slots (codes and per-token value
 * metadata for that many slots) plus its key scales and zeros (4d bytes),
 * which are freed only when the group empties. */
static void test_memory(void) {
    int d = 64, n_tok = 512;
    vq_synth syn = {.n_heads_kv = 1, .n_heads_q = 1, .head_dim = d, .seed = 5};
    const char *specs[] = {"fp16+h2o:budget=100000", "tq-mse:bits=4+h2o:budget=100000"};
    size_t tok_bytes[] = {(size_t)d * 2, (size_t)d * 4 / 8 + 2}; /* per token, K or V */
    for (int s = 0; s < 2; s++) {
        vq_cache *c = make(specs[s], 1, 1, 1, d, 32);
        append_synth(c, &syn, 0, 0, n_tok);
        size_t blk = r64(r64(32 * tok_bytes[s]) * 2 + 32 * 4), fixed = c->window_bytes + c->score_bytes;
        size_t before = vq_cache_bytes(c);
        CHECK(before == fixed + 16 * blk, "%s: %zu bytes for 16 blocks, expected %zu", specs[s], before, fixed + 16 * blk);
        uint8_t keep[512];
        for (int i = 0; i < n_tok; i++) keep[i] = i % 4 == 0; /* a quarter kept */
        vq_stream_keep(c, vq_stream_at(c, 0, 0), keep);
        size_t after = vq_cache_bytes(c);
        CHECK(after == fixed + 4 * blk, "%s: %zu bytes after keeping 1/4, expected %zu (3/4 of the blocks freed)",
              specs[s], after, fixed + 4 * blk);
        vq_cache_free(c);
    }
    /* every per-token method: keeping a quarter frees exactly 3/4 of the
     * block bytes (whole blocks of 32 slots) */
    const char *per_token[] = {"tq-prod:bits=3+h2o:budget=100000", "rvq:bits=2+h2o:budget=100000",
                               "k=qjl:outliers=2;v=polar+h2o:budget=100000", "k=fp16;v=kivi:bits=2+h2o:budget=100000"};
    for (int s = 0; s < 4; s++) {
        vq_cache *c = make(per_token[s], 1, 1, 1, d, 32);
        append_synth(c, &syn, 0, 0, n_tok);
        size_t fixed = c->window_bytes + c->score_bytes, before = vq_cache_bytes(c) - fixed;
        vq_stream *st = vq_stream_at(c, 0, 0);
        int64_t n = st->n_quant + st->win_n; /* residual windows keep the newest apart */
        uint8_t keep[512];
        for (int64_t i = 0; i < n; i++) keep[i] = i < st->n_quant ? i % 4 == 0 : 1;
        int64_t q0 = st->n_quant;
        vq_stream_keep(c, st, keep);
        size_t after = vq_cache_bytes(c) - fixed;
        CHECK(q0 % 128 == 0 && after * 4 == before, "%s: %zu block bytes after keeping 1/4 of %lld, %zu before", per_token[s],
              after, (long long)q0, before);
        vq_cache_free(c);
    }
    /* KIVI-2 keys and values, residual 0: groups of 32 */
    vq_cache *c = make("kivi:bits=2,residual=0+h2o:budget=100000", 1, 1, 1, d, 0);
    append_synth(c, &syn, 0, 0, n_tok);
    size_t fixed = c->window_bytes + c->score_bytes, cb = (size_t)d * 2 / 8, vmeta = (size_t)((d + 31) / 32) * 4;
    uint8_t keep[512];
    int kept_in[16] = {32, 0, 1, 8, 9, 16, 17, 24, 25, 31, 0, 3, 12, 20, 28, 5};
    size_t want = fixed;
    int64_t total = 0;
    for (int g = 0; g < 16; g++) {
        total += kept_in[g];
        for (int i = 0; i < 32; i++) keep[g * 32 + i] = i < kept_in[g];
        if (!kept_in[g]) continue;
        size_t slots = (size_t)(kept_in[g] + 7) / 8 * 8;
        want += r64(r64(slots * cb + (size_t)d * 4) + r64(slots * (cb + vmeta)) + slots * 4);
    }
    vq_stream_keep(c, vq_stream_at(c, 0, 0), keep);
    CHECK(vq_cache_bytes(c) == want, "kivi: %zu bytes after eviction, expected %zu", vq_cache_bytes(c), want);
    CHECK(vq_cache_head_tokens(c, 0, 0) == total, "kivi: %lld tokens kept, not %lld", (long long)vq_cache_head_tokens(c, 0, 0),
          (long long)total);
    /* the peak stays what it was */
    CHECK(vq_cache_peak_bytes(c) > vq_cache_bytes(c), "peak %zu", vq_cache_peak_bytes(c));
    vq_cache_free(c);
}

/* Ada-KV: heads with concentrated scores give slots to heads with spread
 * ones; each head's memory follows its own count. */
static void test_per_head(void) {
    int d = 32, hkv = 4, B = 64;
    vq_cache *c = make("fp16+h2o:budget=64,adakv=1,floor=0.25", 1, 4, hkv, d, 16);
    vq_synth syn = {.n_heads_kv = hkv, .n_heads_q = 4, .head_dim = d, .seed = 9};
    append_synth(c, &syn, 0, 0, B);
    /* head h's scores: head 0 all mass on one slot, head 3 flat */
    for (int h = 0; h < hkv; h++) {
        vq_stream *s = vq_stream_at(c, 0, h);
        for (int i = 0; i < B; i++) s->score[i] = h == 0 ? (i == 30 ? 1.0f : 0.0f) : 1.0f + (float)h * (float)(i % 3);
    }
    append_synth(c, &syn, 0, B, 8);
    int64_t n[4], total = 0;
    size_t want = c->window_bytes + c->score_bytes;
    for (int h = 0; h < hkv; h++) {
        n[h] = vq_cache_head_tokens(c, 0, h);
        total += n[h];
        vq_stream *s = vq_stream_at(c, 0, h);
        want += (size_t)s->n_blocks * c->block_bytes;
        CHECK(s->n_blocks == (s->n_quant + 15) / 16, "head %d: %d blocks for %lld tokens", h, s->n_blocks,
              (long long)s->n_quant);
    }
    CHECK(total == hkv * B, "ada-kv kept %lld in all, budget %d", (long long)total, hkv * B);
    CHECK(n[0] < n[3] && n[0] >= 16, "ada-kv counts %lld %lld %lld %lld: the concentrated head should give slots away "
          "but keep its floor of 16", (long long)n[0], (long long)n[1], (long long)n[2], (long long)n[3]);
    CHECK(vq_cache_bytes(c) == want, "per-head bytes %zu, expected %zu", vq_cache_bytes(c), want);
    CHECK(vq_cache_tokens(c, 0) == n[3], "layer count %lld is not the largest head's %lld", (long long)vq_cache_tokens(c, 0),
          (long long)n[3]);
    vq_cache_free(c);
}

/* A budget above the capacity: an append whose tokens would not fit after
 * eviction is refused before anything is evicted (counts, bytes and tokens
 * seen unchanged), with and without Ada-KV (Ada-KV's counts are known only
 * after its shared selection). */
static void test_capacity(bool adakv) {
    int d = 32, hkv = 4;
    const char *spec = adakv ? "fp16+h2o:budget=64,adakv=1,floor=0.25" : "fp16+h2o:budget=64";
    vq_cache *c = make_capped(spec, 1, 4, hkv, d, 16, 60);
    vq_synth syn = {.n_heads_kv = hkv, .n_heads_q = 4, .head_dim = d, .seed = 3};
    append_synth(c, &syn, 0, 0, 60);
    /* head 0 puts all its mass on one slot, so Ada-KV moves its slots to
     * the others: some head keeps more than the capacity leaves room for */
    for (int h = 0; h < hkv; h++) {
        vq_stream *s = vq_stream_at(c, 0, h);
        for (int i = 0; i < 60; i++) s->score[i] = h == 0 ? (i == 7 ? 1.0f : 0.0f) : 1.0f + (float)(i % 5);
    }
    size_t bytes = vq_cache_bytes(c);
    float *k = calloc((size_t)8 * hkv * d, sizeof(float)), *v = calloc((size_t)8 * hkv * d, sizeof(float));
    vq_status st = vq_cache_append(c, 0, 8, k, v, VQ_F32, NULL);
    CHECK(st == VQ_ERR_ARG && strstr(vq_last_error(), "capacity 60"), "%s: append over capacity gave %d (%s)", spec,
          (int)st, vq_last_error());
    for (int h = 0; h < hkv; h++)
        CHECK(vq_cache_head_tokens(c, 0, h) == 60, "%s: head %d holds %lld after a refused append, not 60", spec, h,
              (long long)vq_cache_head_tokens(c, 0, h));
    CHECK(vq_cache_bytes(c) == bytes && vq_cache_tokens_seen(c, 0) == 60,
          "%s: a refused append changed the cache (%zu -> %zu bytes, %lld seen)", spec, bytes, vq_cache_bytes(c),
          (long long)vq_cache_tokens_seen(c, 0));
    free(k);
    free(v);
    vq_cache_free(c);
}

/* Key weights from the fused pass equal the reference softmax
 * probabilities, summed over the observed rows and the GQA group. */
static void test_key_weights(const char *spec, int n_q, int rows) {
    int d = 64, hq = 8, hkv = 2, g = hq / hkv, seq = 600;
    vq_cache *c = make(spec, 1, hq, hkv, d, 0);
    if (!c) return;
    vq_synth syn = {.n_heads_kv = hkv, .n_heads_q = hq, .head_dim = d, .seed = 21};
    append_synth(c, &syn, 0, 0, 300);
    append_synth(c, &syn, 0, 300, seq - 300);
    float *q = malloc(sizeof(float) * n_q * hq * d), *out = malloc(sizeof(float) * n_q * hq * d);
    int32_t *qpos = malloc(sizeof(int32_t) * n_q);
    for (int i = 0; i < n_q; i++) {
        vq_synth_q(&syn, i, q + (size_t)i * hq * d);
        qpos[i] = seq - n_q + i;
    }
    int64_t T = vq_cache_tokens(c, 0);
    float *w = malloc(sizeof(float) * hkv * T);
    vq_pool *pool;
    vq_pool_create(2, &pool);
    vq_attend_args a = {.n_q = n_q, .q = q, .q_pos = qpos, .out = out, .out_dtype = VQ_F32, .pool = pool,
                        .key_weights = w, .key_weight_rows = rows};
    vq_status st = vq_attend(c, 0, &a);
    float *dk = malloc(sizeof(float) * T * d);
    int32_t *pos = malloc(sizeof(int32_t) * T);
    double *p = malloc(sizeof(double) * T), maxerr = 0, mass = 0;
    int first = n_q - (rows ? rows : n_q);
    for (int h = 0; h < hkv; h++) {
        vq_cache_decode(c, 0, h, dk, NULL, pos);
        double *acc = calloc((size_t)T, sizeof(double));
        for (int i = first; i < n_q; i++)
            for (int j = 0; j < g; j++) {
                const float *qr = q + ((size_t)i * hq + h * g + j) * d;
                double mx = -INFINITY, z = 0;
                for (int64_t t = 0; t < T; t++) {
                    double s = -INFINITY;
                    if (pos[t] <= qpos[i]) {
                        s = 0;
                        for (int e = 0; e < d; e++) s += (double)qr[e] * dk[t * d + e];
                        s /= sqrt((double)d);
                    }
                    p[t] = s;
                    mx = s > mx ? s : mx;
                }
                for (int64_t t = 0; t < T; t++) z += p[t] = p[t] == -INFINITY ? 0 : exp(p[t] - mx);
                for (int64_t t = 0; t < T; t++) acc[t] += p[t] / z;
            }
        for (int64_t t = 0; t < T; t++) {
            double e = fabs(acc[t] - w[h * T + t]);
            maxerr = e > maxerr ? e : maxerr;
            mass += w[h * T + t];
        }
        free(acc);
    }
    int observed = (rows ? rows : n_q) * g * hkv;
    CHECK(st == VQ_OK && maxerr < 1e-4 && fabs(mass - observed) < 1e-3, "%s n_q %d rows %d: key weights max err %.3g, "
          "mass %.5f (want %d)", spec, n_q, rows, maxerr, mass, observed);
    free(q), free(out), free(qpos), free(w), free(dk), free(pos), free(p);
    vq_pool_free(pool);
    vq_cache_free(c);
}

int main(void) {
    test_budget_ties();
    const char *specs[] = {"fp16+h2o:budget=100000", "kivi:bits=2,residual=16+h2o:budget=100000",
                           "tq-mse:bits=4,residual=8+h2o:budget=100000", "k=kivi:bits=4;v=tq-mse:bits=3+h2o:budget=100000",
                           "rvq:bits=1+h2o:budget=100000", "k=qjl:outliers=2;v=polar+h2o:budget=100000",
                           "tq-prod:bits=3+h2o:budget=100000"};
    for (size_t i = 0; i < sizeof specs / sizeof specs[0]; i++) test_in_place(specs[i], 0);
    test_in_place("fp16+h2o:budget=100000", 16);
    test_attend_after_evict("fp16+knorm:budget=256");
    test_attend_after_evict("kivi:bits=2,residual=32+knorm:budget=256");
    test_attend_after_evict("tq-mse:bits=4+knorm:budget=256");
    test_attend_after_evict("kivi:bits=2,residual=32+h2o:budget=256");
    test_memory();
    test_per_head();
    test_capacity(false);
    test_capacity(true);
    test_key_weights("fp16", 1, 0);
    test_key_weights("kivi:bits=2,residual=64", 1, 0);
    test_key_weights("kivi:bits=2,residual=64", 40, 0);
    test_key_weights("tq-mse:bits=4", 40, 5);
    return check_done();
}
