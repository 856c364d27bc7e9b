/* CUDA caches against the CPU implementation on the same data: encode
 * (block bytes compared with a CPU cache fed the same tokens) and attention
 * (GPU output vs the CPU attention run on a host copy of the GPU cache, the
 * same compressed data, within 1e-3 relative). Exits 77 (skipped) without a
 * usable GPU. */
#include "check.h"
#include "vq_internal.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#define SKIP 77

#if VQ_TEST_CUDA
#include <cuda_runtime_api.h>

static void *to_device(const void *src, size_t bytes) {
    void *p = NULL;
    if (cudaMalloc(&p, bytes) != cudaSuccess) return NULL;
    cudaMemcpy(p, src, bytes, cudaMemcpyHostToDevice);
    return p;
}

static void fill(float *x, size_t n, vq_rng *r) {
    for (size_t i = 0; i < n; i++) x[i] = (float)vq_rng_normal(r) * (i % 7 == 0 ? 3.0f : 1.0f);
}

/* Few distinct values, zeros of both signs among them: many equal minima
 * and maxima, so the encoders must pick the same one (the first in order).
 * `zero_min`: no negative values, so every group's minimum is a zero. */
static void fill_ties(float *x, size_t n, vq_rng *r, int zero_min) {
    static const float vals[] = {0.0f, -0.0f, 1.0f, -1.0f, 0.5f, -0.0f, 0.0f, 2.0f};
    for (size_t i = 0; i < n; i++) {
        float v = vals[vq_rng_next(r) % 8];
        x[i] = zero_min && v < 0 ? 0.25f : v;
    }
}

/* Converts fp32 rows to the dtype as a host buffer (bf16/f16 bits). */
static void *as_dtype(const float *x, size_t n, vq_dtype dt) {
    if (dt == VQ_F32) {
        float *o = malloc(n * 4);
        memcpy(o, x, n * 4);
        return o;
    }
    uint16_t *o = malloc(n * 2);
    for (size_t i = 0; i < n; i++) o[i] = dt == VQ_F16 ? vq_f32_to_f16(x[i]) : vq_f32_to_bf16(x[i]);
    return o;
}

typedef struct {
    vq_cache *gpu, *cpu;
} pair;

static pair make_pair(const char *spec, int hq, int hkv, int d, int64_t cap, int layers) {
    vq_cache_config cfg = {.n_layers = layers, .n_heads_q = hq, .n_heads_kv = hkv, .head_dim = d, .kv_spec = spec,
                           .capacity = cap};
    pair p = {NULL, NULL};
    vq_status st = vq_cache_create(&cfg, &p.cpu);
    CHECK(st == VQ_OK, "cpu create %s: %s", spec, vq_last_error());
    cfg.device = VQ_DEVICE_CUDA;
    st = vq_cache_create(&cfg, &p.gpu);
    CHECK(st == VQ_OK, "gpu create %s: %s", spec, vq_last_error());
    return p;
}

/* Places bytes on the device `skew` bytes past a 256-byte boundary (its
 * allocation returned through *base). */
static void *to_device_at(const void *src, size_t bytes, size_t skew, void **base) {
    *base = NULL;
    if (cudaMalloc(base, bytes + skew) != cudaSuccess) return NULL;
    cudaMemcpy((char *)*base + skew, src, bytes, cudaMemcpyHostToDevice);
    return (char *)*base + skew;
}

/* Token t's factors in a drifting append (append_scaled): keys from 1 to
 * 4 and back every ~940 tokens, values 2^-8 .. 2^8, a new power of two
 * every 64 tokens. */
static float drift_key(int t) { return 1.0f + 3.0f * fabsf(sinf((float)t / 300.0f)); }
static float drift_value(int t) { return ldexpf(1.0f, (t / 64 * 7) % 17 - 8); }

/* Appends the same n tokens to both caches of a pair, in `pieces` calls;
 * keys and values are standard normal (or tie-heavy: ties 1, with zero
 * minima: 2) times kscale and vscale (drift: times drift_key and
 * drift_value of the token's index too), and the GPU's K and V sit `skew`
 * bytes off 16-byte alignment. */
static void append_scaled(pair *p, int layer, int n, int pieces, vq_dtype dt, vq_rng *r, int with_pos, int ties,
                          size_t skew, float kscale, float vscale, int drift) {
    int H = p->cpu->cfg.n_heads_kv, d = p->cpu->cfg.head_dim;
    size_t rows = (size_t)n * H * d;
    float *k = malloc(rows * 4), *v = malloc(rows * 4);
    if (ties) fill_ties(k, rows, r, ties == 2), fill_ties(v, rows, r, ties == 2);
    else fill(k, rows, r), fill(v, rows, r);
    for (size_t i = 0; i < rows; i++) {
        const int t = (int)(i / ((size_t)H * d));
        k[i] *= kscale * (drift ? drift_key(t) : 1.0f);
        v[i] *= vscale * (drift ? drift_value(t) : 1.0f);
    }
    void *kh = as_dtype(k, rows, dt), *vh = as_dtype(v, rows, dt);
    size_t es = vq_dtype_size(dt);
    void *kbase, *vbase;
    void *kd = to_device_at(kh, rows * es, skew, &kbase), *vd = to_device_at(vh, rows * es, skew, &vbase);
    int32_t *pos = malloc(sizeof(int32_t) * (size_t)n);
    int32_t last = vq_cache_last_pos(p->cpu, layer);
    for (int i = 0; i < n; i++) pos[i] = last + 1 + 2 * i; /* gaps: positions are not indices */
    int done = 0;
    for (int piece = 0; piece < pieces; piece++) {
        int m = piece == pieces - 1 ? n - done : n / pieces;
        size_t off = (size_t)done * H * d * es;
        vq_status a = vq_cache_append(p->cpu, layer, m, (char *)kh + off, (char *)vh + off, dt,
                                      with_pos ? pos + done : NULL);
        vq_status b = vq_cache_append(p->gpu, layer, m, (char *)kd + off, (char *)vd + off, dt,
                                      with_pos ? pos + done : NULL);
        CHECK(a == VQ_OK && b == VQ_OK, "append: %s", vq_last_error());
        done += m;
    }
    CHECK(vq_cache_tokens(p->gpu, layer) == vq_cache_tokens(p->cpu, layer), "token counts differ");
    CHECK(vq_cache_last_pos(p->gpu, layer) == vq_cache_last_pos(p->cpu, layer), "last positions differ");
    cudaFree(kbase);
    cudaFree(vbase);
    free(k), free(v), free(kh), free(vh), free(pos);
}

static void append_both(pair *p, int layer, int n, int pieces, vq_dtype dt, vq_rng *r, int with_pos, int ties,
                        size_t skew) {
    append_scaled(p, layer, n, pieces, dt, r, with_pos, ties, skew, 1.0f, 1.0f, 0);
}

/* Compares the GPU cache's bytes with the CPU cache's. Returns the number
 * of differing payload bytes (positions and the window must match). */
static size_t compare_bytes(pair *p, const char *what) {
    vq_cache *h = NULL;
    CHECK(vq_cache_to_host(p->gpu, &h) == VQ_OK, "to_host: %s", vq_last_error());
    if (!h) return (size_t)-1;
    const vq_cache *c = p->cpu;
    size_t diff = 0, n_streams = (size_t)c->cfg.n_layers * c->cfg.n_heads_kv;
    int d = c->cfg.head_dim, bt = c->block_tokens;
    for (size_t i = 0; i < n_streams; i++) {
        const vq_stream *a = &c->streams[i], *b = &h->streams[i];
        CHECK(a->n_quant == b->n_quant && a->win_n == b->win_n, "%s: counts differ in stream %zu", what, i);
        for (int blk = 0; blk < a->n_blocks && blk < b->n_blocks; blk++) {
            int n = (int)(a->n_quant - (int64_t)blk * bt < bt ? a->n_quant - (int64_t)blk * bt : bt);
            /* compare the filled part of the payloads token by token via decode-free byte ranges */
            const uint8_t *x = a->blocks[blk], *y = b->blocks[blk];
            CHECK(memcmp(vq_blk_pos(c, a, blk), vq_blk_pos(h, b, blk), sizeof(int32_t) * n) == 0,
                  "%s: block positions differ", what);
            if (n == bt)
                for (size_t j = 0; j < c->k_bytes + c->v_bytes; j++) diff += x[j] != y[j];
        }
        CHECK(memcmp(a->win_k, b->win_k, (size_t)a->win_n * d * 2) == 0, "%s: window keys differ", what);
        CHECK(memcmp(a->win_v, b->win_v, (size_t)a->win_n * d * 2) == 0, "%s: window values differ", what);
        CHECK(memcmp(a->win_pos, b->win_pos, sizeof(int32_t) * a->win_n) == 0, "%s: window positions differ", what);
    }
    vq_cache_free(h);
    return diff;
}

/* GPU attention over caches[0..n) vs the CPU attention on host copies.
 * Causal rows sit `back` positions before the last token and step back 3
 * positions per row. */
static double attend_err(vq_cache **gpu, int n, int layer, int n_q, int causal, int back, vq_dtype out_dt,
                         vq_rng *r) {
    const vq_cache_config *cfg = &gpu[0]->cfg;
    size_t rows = (size_t)n * n_q * cfg->n_heads_q * cfg->head_dim;
    float *q = malloc(rows * 4);
    fill(q, rows, r);
    int32_t *qpos = malloc(sizeof(int32_t) * (size_t)n * n_q);
    for (int i = 0; i < n; i++) {
        int32_t last = vq_cache_last_pos(gpu[i], layer);
        /* causal rows see a prefix: the last n_q positions step back */
        for (int j = 0; j < n_q; j++) qpos[i * n_q + j] = last - back - 3 * (n_q - 1 - j);
    }
    size_t es = vq_dtype_size(out_dt);
    void *qd = to_device(q, rows * 4), *od = NULL;
    cudaMalloc(&od, rows * es);
    cudaMemset(od, 0xff, rows * es); /* NaN poison: every element must be written */
    vq_attend_args a = {.n_q = n_q, .q = qd, .q_pos = causal ? qpos : NULL, .out = od, .out_dtype = out_dt};
    vq_status st = n == 1 ? vq_attend(gpu[0], layer, &a) : vq_attend_batch(gpu, n, layer, &a);
    CHECK(st == VQ_OK, "gpu attend: %s", vq_last_error());
    CHECK(vq_cuda_synchronize() == VQ_OK, "sync: %s", vq_last_error());
    void *og = malloc(rows * es);
    cudaMemcpy(og, od, rows * es, cudaMemcpyDeviceToHost);
    float *oc = malloc(rows * 4);
    double num = 0, den = 0;
    for (int i = 0; i < n; i++) {
        vq_cache *h = NULL;
        CHECK(vq_cache_to_host(gpu[i], &h) == VQ_OK, "to_host: %s", vq_last_error());
        size_t per = (size_t)n_q * cfg->n_heads_q * cfg->head_dim;
        vq_attend_args b = {.n_q = n_q, .q = q + per * i, .q_pos = causal ? qpos + i * n_q : NULL,
                            .out = oc + per * i, .out_dtype = VQ_F32};
        CHECK(vq_attend(h, layer, &b) == VQ_OK, "cpu attend: %s", vq_last_error());
        vq_cache_free(h);
    }
    for (size_t i = 0; i < rows; i++) {
        double g = out_dt == VQ_F32 ? ((float *)og)[i] : vq_f16_to_f32(((uint16_t *)og)[i]);
        if (isnan(g)) {
            num = INFINITY;
            break;
        }
        num += (g - oc[i]) * (g - oc[i]);
        den += (double)oc[i] * oc[i];
    }
    cudaFree(qd);
    cudaFree(od);
    free(q), free(qpos), free(og), free(oc);
    return sqrt(num / (den > 0 ? den : 1));
}

static void free_pair(pair *p) {
    vq_cache_free(p->gpu);
    vq_cache_free(p->cpu);
}

typedef struct {
    const char *spec;
    int hq, hkv, d, n, pieces;
    vq_dtype dt;
    int ties;  /* inputs from fill_ties (2: every minimum a zero) */
    int skew;  /* bytes the GPU's K and V sit off 16-byte alignment */
} case_t;

static void run_case(const case_t *t, vq_rng *r) {
    pair p = make_pair(t->spec, t->hq, t->hkv, t->d, 4096, 2);
    if (!p.gpu || !p.cpu) {
        free_pair(&p);
        return;
    }
    append_both(&p, 1, t->n, t->pieces, t->dt, r, 1, t->ties, (size_t)t->skew);
    size_t diff = compare_bytes(&p, t->spec);
    size_t total = (size_t)(t->n / p.cpu->block_tokens) * t->hkv * (p.cpu->k_bytes + p.cpu->v_bytes);
    /* every encoder is bit-identical to the CPU's, tq-mse's norms included */
    CHECK(diff == 0, "%s: %zu of %zu block bytes differ from the CPU encoder", t->spec, diff, total);
    double e1 = attend_err(&p.gpu, 1, 1, 1, 0, 0, VQ_F32, r);
    /* 70 causal rows: more q positions than the launch arguments hold */
    double e2 = attend_err(&p.gpu, 1, 1, 70, 1, 0, VQ_F32, r);
    double e3 = attend_err(&p.gpu, 1, 1, 1, 1, 0, VQ_F16, r);
    /* one decode row that sees neither the window nor the last block
     * (positions step by 2): masking in the decode kernels */
    double e4 = attend_err(&p.gpu, 1, 1, 1, 1, 2 * (p.cpu->win_cap + p.cpu->block_tokens), VQ_F32, r);
    CHECK(e1 < 1e-3 && e2 < 1e-3 && e3 < 2e-3 && e4 < 1e-3,
          "%s: relative error decode %.2e, prefill %.2e, fp16 out %.2e, masked decode %.2e", t->spec, e1, e2, e3, e4);
    printf("%-40s hq %2d hkv %d d %3d n %4d: decode %.1e prefill %.1e f16 %.1e masked %.1e\n", t->spec, t->hq,
           t->hkv, t->d, t->n, e1, e2, e3, e4);
    /* layer 0 stays empty: every row sees nothing and gets zeros */
    double e0 = attend_err(&p.gpu, 1, 0, 1, 0, 0, VQ_F32, r);
    CHECK(e0 == 0, "%s: empty layer: error %.2e", t->spec, e0);
    free_pair(&p);
}

/* Sequences of different lengths in one launch: partitions past the end
 * of the shorter ones. */
static void test_batch(const char *spec, vq_rng *r) {
    vq_cache *g[3];
    pair p[3];
    int lens[3] = {1000, 37, 2500};
    for (int i = 0; i < 3; i++) {
        p[i] = make_pair(spec, 32, 8, 128, 4096, 1);
        if (!p[i].gpu) return;
        append_both(&p[i], 0, lens[i], 2, VQ_BF16, r, 0, 0, 0);
        g[i] = p[i].gpu;
    }
    double e = attend_err(g, 3, 0, 1, 0, 0, VQ_F32, r);
    CHECK(e < 1e-3, "%s: batch of 3: relative error %.2e", spec, e);
    double e2 = attend_err(g, 3, 0, 3, 1, 0, VQ_F32, r);
    CHECK(e2 < 1e-3, "%s: batch of 3, 3 causal rows: relative error %.2e", spec, e2);
    printf("%s: batch of 3 (lengths 1000, 37, 2500): decode %.1e, 3 causal rows %.1e\n", spec, e, e2);
    for (int i = 0; i < 3; i++) free_pair(&p[i]);
}

/* The KIVI decode kernel's 64-token instance runs a mask-free body for
 * blocks whose tokens are all valid and all at or before the query position,
 * and the masked body otherwise. For every pair of key and value bits and
 * both q-head layouts (4 and 8 q heads per kv head): a last block half full
 * (n_quant = 8.5 blocks), a query position at the last token (every block
 * passes the position test), and one inside the second block (that full
 * block is masked from its 22nd token on, the later ones entirely). */
static void test_kivi_full_blocks(vq_rng *r) {
    static const char *specs[] = {"kivi:bits=2", "k=kivi:bits=2;v=kivi:bits=4", "k=kivi:bits=4;v=kivi:bits=2",
                                  "kivi:bits=4"};
    for (int s = 0; s < 4; s++)
        for (int hq = 8; hq <= 16; hq += 8) {
            pair p = make_pair(specs[s], hq, 2, 128, 1024, 1);
            if (!p.gpu || !p.cpu) {
                free_pair(&p);
                return;
            }
            /* window of 128 .. 159 tokens (residual 128, flushes of 32):
             * 700 tokens leave 544 quantized, the last block 32 of 64 */
            append_both(&p, 0, 700, 2, VQ_F32, r, 1, 0, 0);
            const vq_stream *st = &p.cpu->streams[0];
            CHECK(p.cpu->block_tokens == 64 && st->n_quant % 64 == 32 && st->n_quant >= 128,
                  "%s: expected a half-full last block of 64 tokens, got %lld tokens in blocks of %d", specs[s],
                  (long long)st->n_quant, p.cpu->block_tokens);
            /* positions 0, 2, 4, ...: position 2 * 85 + 1 sees tokens 0 .. 85 */
            const int back = (int)vq_cache_last_pos(p.cpu, 0) - (2 * 85 + 1);
            double e1 = attend_err(&p.gpu, 1, 0, 1, 0, 0, VQ_F32, r);
            double e2 = attend_err(&p.gpu, 1, 0, 1, 1, 0, VQ_F32, r);
            double e3 = attend_err(&p.gpu, 1, 0, 1, 1, back, VQ_F32, r);
            CHECK(e1 < 1e-3 && e2 < 1e-3 && e3 < 1e-3,
                  "%s, %d q heads per kv head: relative error decode %.2e, at the last position %.2e, inside block 1 "
                  "%.2e",
                  specs[s], hq / 2, e1, e2, e3);
            printf("%-30s %d q heads per kv head, last block 32 of 64: decode %.1e, q_pos last %.1e, inside "
                   "block 1 %.1e\n",
                   specs[s], hq / 2, e1, e2, e3);
            free_pair(&p);
        }
}

/* The KIVI decode kernel folds the value scales into the fp16
 * probabilities and the key scales into an fp16 hi + lo q: tiny values
 * (p * scale below fp16's normal range without the kernel's per-block
 * power of two), large values and larger keys must keep the parity too. */
static void test_scaled(const char *spec, float kscale, float vscale, vq_rng *r) {
    pair p = make_pair(spec, 32, 8, 128, 4096, 1);
    if (!p.gpu || !p.cpu) {
        free_pair(&p);
        return;
    }
    append_scaled(&p, 0, 1500, 2, VQ_F32, r, 0, 0, 0, kscale, vscale, 0);
    double e = attend_err(&p.gpu, 1, 0, 1, 0, 0, VQ_F32, r);
    CHECK(e < 1e-3, "%s: keys x %g, values x %g: relative error %.2e", spec, kscale, vscale, e);
    printf("%s: keys x %g, values x %g: decode %.1e\n", spec, kscale, vscale, e);
    free_pair(&p);
}

/* The KIVI decode kernel moves its running maxima and its power-of-two
 * unit lazily, only when a block needs it (see softmax in
 * attend_kivi.cu): keys whose scale rises and falls along the sequence and
 * values whose scale jumps by powers of two from block to block must keep
 * the parity. A batch of 9 sequences x 8 kv heads of 3072 tokens, so that
 * each warp of the kernel takes several blocks (one wave: 3 partitions
 * per kv head on an H200, 4 blocks per warp). */
static void test_drift(const char *spec, int hq, vq_rng *r) {
    enum { SEQS = 9, HKV = 8, N = 3072 };
    vq_cache *g[SEQS];
    pair p[SEQS];
    int made = 0;
    for (; made < SEQS; made++) {
        p[made] = make_pair(spec, hq, HKV, 128, N + 64, 1);
        if (!p[made].gpu || !p[made].cpu) break;
        append_scaled(&p[made], 0, N, 1, VQ_F16, r, 0, 0, 0, 1.0f, 1.0f, 1);
        g[made] = p[made].gpu;
    }
    if (made == SEQS) {
        double e = attend_err(g, SEQS, 0, 1, 0, 0, VQ_F32, r);
        CHECK(e < 1e-3, "%s, %d q heads per kv head: drifting scales: relative error %.2e", spec, hq / HKV, e);
        printf("%s, %d q heads per kv head: keys x 1..4, values x 2^-8..2^8 along the sequence: decode %.1e\n", spec,
               hq / HKV, e);
    } else {
        free_pair(&p[made]);
    }
    for (int i = 0; i < made; i++) free_pair(&p[i]);
}

/* A KIVI append long enough for three waves of the append kernel's thread
 * blocks, where they take items of one kind (key items or value items:
 * encode.cu, launch_one): the blocks must equal the CPU encoder's byte for
 * byte. bf16 rows on 16-byte boundaries (the bulk-copy instance), 8 kv
 * heads: 16 items per 32 tokens, 4 items per thread block, 4 thread blocks
 * per SM. */
static void test_long_append(const char *spec, vq_rng *r) {
    int sms = 0;
    CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0) == cudaSuccess, "SM count");
    const int n = 32 * (3 * sms * 4 * 4 / 16) + 100;
    pair p = make_pair(spec, 32, 8, 128, n + 64, 1);
    if (!p.gpu || !p.cpu) {
        free_pair(&p);
        return;
    }
    append_both(&p, 0, n, 1, VQ_BF16, r, 1, 0, 0);
    size_t diff = compare_bytes(&p, spec);
    CHECK(diff == 0, "%s: %d tokens in one append: %zu block bytes differ from the CPU encoder", spec, n, diff);
    double e = attend_err(&p.gpu, 1, 0, 1, 0, 0, VQ_F32, r);
    CHECK(e < 1e-3, "%s: %d tokens in one append: relative error %.2e", spec, n, e);
    printf("%s: %d tokens in one append: %zu bytes differ, decode %.1e\n", spec, n, diff, e);
    free_pair(&p);
}

/* Decode calls issued back to back, each with its own q and output, must
 * give the same bits as the same call run alone: a call's kernels reuse
 * the partials of the call before, and may start before that call has
 * ended (programmatic dependents). One kv head of 9000 tokens: more KIVI
 * partials than one round of the merge's loads; parity with the CPU too. */
static void test_repeat(const char *spec, vq_rng *r) {
    enum { HQ = 4, D = 128, CALLS = 4 };
    pair p = make_pair(spec, HQ, 1, D, 9100, 1);
    if (!p.gpu || !p.cpu) {
        free_pair(&p);
        return;
    }
    append_both(&p, 0, 9000, 3, VQ_F32, r, 0, 0, 0);
    double e = attend_err(&p.gpu, 1, 0, 1, 0, 0, VQ_F32, r);
    const size_t n = HQ * D;
    float *q = malloc(n * CALLS * 4), *alone = malloc(n * CALLS * 4), *both = malloc(n * CALLS * 4);
    fill(q, n * CALLS, r);
    float *qd = to_device(q, n * CALLS * 4), *od = NULL;
    cudaMalloc((void **)&od, n * CALLS * 4);
    cudaMemset(od, 0xff, n * CALLS * 4);
    for (int k = 0; k < CALLS; k++) {
        vq_attend_args a = {.n_q = 1, .q = qd + n * k, .out = od + n * k, .out_dtype = VQ_F32};
        CHECK(vq_attend(p.gpu, 0, &a) == VQ_OK, "attend: %s", vq_last_error());
        CHECK(vq_cuda_synchronize() == VQ_OK, "sync: %s", vq_last_error());
    }
    cudaMemcpy(alone, od, n * CALLS * 4, cudaMemcpyDeviceToHost);
    int same = 1;
    for (int round = 0; round < 3; round++) {
        cudaMemset(od, 0xff, n * CALLS * 4);
        for (int k = 0; k < CALLS; k++) {
            vq_attend_args a = {.n_q = 1, .q = qd + n * k, .out = od + n * k, .out_dtype = VQ_F32};
            CHECK(vq_attend(p.gpu, 0, &a) == VQ_OK, "attend: %s", vq_last_error());
        }
        CHECK(vq_cuda_synchronize() == VQ_OK, "sync: %s", vq_last_error());
        cudaMemcpy(both, od, n * CALLS * 4, cudaMemcpyDeviceToHost);
        same &= memcmp(both, alone, n * CALLS * 4) == 0;
    }
    CHECK(e < 1e-3, "%s: 9000 tokens, one kv head: relative error %.2e", spec, e);
    CHECK(same && !isnan(alone[0]), "%s: back-to-back decodes differ from the same decodes run alone", spec);
    printf("%s: 9000 tokens, one kv head: decode %.1e; %d decodes back to back x 3, bit-identical to each alone: %s\n",
           spec, e, CALLS, same ? "yes" : "no");
    cudaFree(qd);
    cudaFree(od);
    free(q), free(alone), free(both);
    free_pair(&p);
}

static void test_errors(vq_rng *r) {
    vq_cache_config cfg = {.n_layers = 1, .n_heads_q = 4, .n_heads_kv = 1, .head_dim = 128, .kv_spec = "kivi",
                           .device = VQ_DEVICE_CUDA};
    vq_cache *c = NULL;
    CHECK(vq_cache_create(&cfg, &c) == VQ_ERR_ARG && strstr(vq_last_error(), "capacity"), "capacity 0: %s",
          vq_last_error());
    cfg.capacity = 100;
    cfg.head_dim = 72;
    CHECK(vq_cache_create(&cfg, &c) == VQ_ERR_UNSUPPORTED, "head dim 72: %s", vq_last_error());
    cfg.head_dim = 128;
    cfg.kv_spec = "k=qjl;v=kivi";
    CHECK(vq_cache_create(&cfg, &c) == VQ_ERR_UNSUPPORTED, "qjl: %s", vq_last_error());
    cfg.kv_spec = "kivi";
    cfg.device_index = 99;
    CHECK(vq_cache_create(&cfg, &c) == VQ_ERR_ARG, "device 99: %s", vq_last_error());
    cfg.device_index = 0;
    CHECK(vq_cache_create(&cfg, &c) == VQ_OK, "create: %s", vq_last_error());
    float *x = NULL;
    cudaMalloc((void **)&x, 128 * 101 * 4);
    cudaMemset(x, 0, 128 * 101 * 4);
    CHECK(vq_cache_append(c, 0, 101, x, x, VQ_F32, NULL) == VQ_ERR_ARG && strstr(vq_last_error(), "capacity"),
          "capacity overflow: %s", vq_last_error());
    CHECK(vq_cache_append(c, 0, 100, x, x, VQ_F32, NULL) == VQ_OK, "fill: %s", vq_last_error());
    CHECK(vq_cache_append(c, 0, 1, x, x, VQ_F32, NULL) == VQ_ERR_ARG, "full: %s", vq_last_error());
    /* truncate to a group boundary, then append again */
    CHECK(vq_cache_truncate(c, 64) == VQ_OK, "truncate: %s", vq_last_error());
    CHECK(vq_cache_tokens(c, 0) == 64 && vq_cache_last_pos(c, 0) == 63, "after truncate: %lld tokens, last %d",
          (long long)vq_cache_tokens(c, 0), vq_cache_last_pos(c, 0));
    CHECK(vq_cache_append(c, 0, 36, x, x, VQ_F32, NULL) == VQ_OK, "refill: %s", vq_last_error());
    CHECK(vq_cache_bytes(c) > 0 && vq_cache_bytes_fp16_equiv(c) == 100 * 128 * 4, "bytes");
    cudaFree(x);
    vq_cache_free(c);
    (void)r;
}

int main(int argc, char **argv) {
    /* --small: seven short cases and a long decode, for compute-sanitizer runs */
    int small = argc > 1 && strcmp(argv[1], "--small") == 0;
    if (vq_cuda_device_count() < 1) {
        printf("no usable CUDA device: skipped\n");
        return SKIP;
    }
    vq_rng r;
    vq_rng_seed(&r, 6);
    const case_t cases[] = {
        {"fp16", 32, 8, 128, 700, 3, VQ_F32, 0, 0},
        {"fp16", 8, 8, 64, 300, 1, VQ_F16, 0, 0},
        /* the fp16-row decode kernel's shapes: 8 q heads per kv head at
         * head dims 128 and 64, 3 (padded to 4) at 256 */
        {"fp16", 64, 8, 128, 1000, 2, VQ_BF16, 0, 0},
        {"fp16", 16, 2, 64, 333, 2, VQ_F32, 0, 0},
        {"fp16", 24, 8, 256, 500, 1, VQ_F32, 0, 0},
        {"kivi:bits=2", 24, 8, 128, 700, 2, VQ_F32, 0, 0},
        {"kivi:bits=2,group=32", 32, 8, 128, 1500, 4, VQ_F32, 0, 0},
        {"kivi:bits=2,group=128", 16, 4, 128, 1100, 2, VQ_BF16, 0, 0},
        {"kivi:bits=4,group=32", 8, 8, 128, 900, 3, VQ_F16, 0, 0},
        {"kivi:bits=4,group=64", 32, 8, 256, 800, 1, VQ_F32, 0, 0},
        {"kivi:bits=4,group=64", 32, 8, 128, 900, 2, VQ_F32, 0, 0},
        {"kivi:bits=3,group=32", 8, 2, 128, 600, 2, VQ_F32, 0, 0},
        {"kivi:bits=8,group=32,residual=0", 8, 2, 64, 500, 5, VQ_F32, 0, 0},
        {"kivi:bits=2", 32, 8, 128, 90, 1, VQ_F32, 0, 0}, /* the window alone */
        /* the KIVI tensor-core decode kernel with 8 and 6 q heads per kv
         * head (q's hi and lo terms in mma of their own) and with 2 (hi and
         * lo in the columns of one mma, 2 of its 4 heads empty) */
        {"kivi:bits=2", 64, 8, 128, 1000, 2, VQ_F32, 0, 0},
        {"kivi:bits=4,group=64", 48, 8, 128, 700, 2, VQ_BF16, 0, 0},
        {"kivi:bits=2,group=64", 16, 8, 128, 800, 3, VQ_F32, 0, 0},
        {"k=kivi:bits=4;v=kivi:bits=2", 32, 8, 128, 1000, 2, VQ_F32, 0, 0},
        {"tq-mse:bits=4", 32, 8, 128, 800, 2, VQ_F32, 0, 0},
        /* the 4-bit tq-mse decode kernel at its other head dims and group sizes */
        {"tq-mse:bits=4", 8, 8, 64, 500, 2, VQ_F32, 0, 0},
        {"tq-mse:bits=4", 64, 8, 256, 400, 1, VQ_BF16, 0, 0},
        {"tq-mse:bits=2", 8, 8, 128, 600, 1, VQ_BF16, 0, 0},
        {"tq-mse:bits=3,residual=64", 16, 4, 128, 700, 3, VQ_F32, 0, 0},
        {"tq-mse:bits=1", 8, 2, 128, 300, 2, VQ_F16, 0, 0},
        {"k=tq-mse:bits=4;v=kivi:bits=2", 32, 8, 128, 700, 2, VQ_F32, 0, 0},
        /* tq-mse encode at 1-3 bits and head dims 64 and 256 (rows of 8
         * and 32 lanes; the cell tables of those codebooks) */
        {"tq-mse:bits=1", 8, 2, 64, 300, 2, VQ_F16, 0, 0},
        {"tq-mse:bits=2", 8, 2, 64, 300, 1, VQ_BF16, 0, 0},
        {"tq-mse:bits=3", 8, 2, 64, 300, 2, VQ_F32, 0, 0},
        {"tq-mse:bits=1", 8, 2, 256, 200, 1, VQ_BF16, 0, 0},
        {"tq-mse:bits=2", 8, 2, 256, 200, 2, VQ_F32, 0, 0},
        {"tq-mse:bits=3", 8, 2, 256, 200, 2, VQ_F16, 0, 0},
        /* encode at head dim 192 (rows of 24 lanes, a last value group of
         * 64 channels) and a key group wider than d = 64 */
        {"kivi:bits=2,group=128", 8, 2, 192, 700, 2, VQ_F32, 0, 0},
        {"kivi:bits=3,group=64", 8, 2, 192, 400, 1, VQ_BF16, 0, 0},
        {"fp16", 8, 2, 192, 200, 1, VQ_F32, 0, 0},
        {"kivi:bits=4,group=128", 8, 2, 64, 600, 2, VQ_BF16, 0, 0},
        /* KIVI keys at d = 64 (one channel pair a lane in the fold) and
         * d = 256 (four; key groups coded from 16-row tiles by 16 lanes);
         * d = 256 with 8 value groups of parameters per warp (over 48 KB of
         * shared memory a block) */
        {"kivi:bits=2,group=64", 8, 2, 64, 400, 2, VQ_F16, 0, 0},
        {"kivi:bits=3,group=32", 8, 2, 64, 400, 2, VQ_F16, 0, 0},
        {"kivi:bits=2,group=32", 8, 2, 256, 600, 2, VQ_F16, 0, 0},
        {"kivi:bits=3,group=128", 8, 2, 256, 400, 1, VQ_F32, 0, 0},
        {"kivi:bits=8,group=32", 8, 2, 256, 300, 1, VQ_BF16, 0, 0},
        /* ties: equal minima (+0 and -0) in key and value groups */
        {"kivi:bits=2", 8, 2, 128, 500, 2, VQ_F32, 1, 0},
        {"kivi:bits=4,group=64", 8, 2, 64, 400, 1, VQ_F16, 1, 0},
        {"tq-mse:bits=4", 8, 2, 128, 200, 1, VQ_F32, 1, 0},
        /* every minimum a zero: every KIVI group folded again in order */
        {"kivi:bits=2", 8, 2, 128, 500, 2, VQ_F16, 2, 0},
        {"kivi:bits=4,group=64", 8, 2, 128, 500, 3, VQ_BF16, 2, 0},
        {"kivi:bits=3,group=64", 8, 2, 64, 400, 1, VQ_F32, 2, 0},
        /* K and V off 16-byte alignment: element-wise loads */
        {"kivi:bits=2", 8, 2, 128, 300, 2, VQ_F16, 0, 2},
        {"fp16", 8, 2, 64, 200, 1, VQ_F32, 0, 4},
        {"tq-mse:bits=4", 8, 2, 128, 200, 1, VQ_BF16, 0, 6},
    };
    if (small) {
        /* f32 rows are staged through registers, fp16 and bf16 rows by
         * the bulk-copy engine (bf16 then converted in the tile, next to
         * the window's fp16 rows in the second piece): all paths under the
         * sanitizers; the last case folds every KIVI group again in order,
         * with 8 value groups */
        const case_t few[] = {
            {"fp16", 8, 2, 64, 150, 2, VQ_F32, 0, 0},
            {"kivi:bits=2,group=32", 8, 2, 128, 300, 2, VQ_F32, 0, 0},
            {"kivi:bits=2", 16, 2, 128, 300, 1, VQ_F32, 0, 0},
            {"tq-mse:bits=4", 8, 2, 128, 200, 2, VQ_F32, 0, 0},
            {"kivi:bits=2,group=32", 8, 2, 128, 300, 2, VQ_F16, 0, 0},
            {"tq-mse:bits=4", 8, 2, 128, 200, 2, VQ_F16, 0, 0},
            {"kivi:bits=2,group=32", 8, 2, 128, 300, 2, VQ_BF16, 0, 0},
            {"tq-mse:bits=4", 8, 2, 128, 200, 2, VQ_BF16, 0, 0},
            {"kivi:bits=2,group=32", 8, 2, 256, 200, 1, VQ_F16, 2, 0},
        };
        for (size_t i = 0; i < sizeof few / sizeof few[0]; i++) run_case(&few[i], &r);
        test_repeat("kivi:bits=2", &r); /* the decode merge over two rounds of partials */
        return check_done();
    }
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) run_case(&cases[i], &r);
    test_batch("kivi:bits=2", &r);
    test_batch("fp16", &r);
    test_batch("tq-mse:bits=4", &r);
    test_kivi_full_blocks(&r);
    test_scaled("kivi:bits=2", 1.0f, 1e-3f, &r);
    test_scaled("kivi:bits=4", 1.0f, 1e-3f, &r);
    test_scaled("kivi:bits=4,group=64", 1.0f, 1e-5f, &r);
    test_scaled("kivi:bits=2", 5.0f, 1.0f, &r);
    test_scaled("kivi:bits=2", 60.0f, 1.0f, &r); /* most weights underflow */
    test_scaled("kivi:bits=4", 20.0f, 1.0f, &r);
    test_scaled("kivi:bits=4,group=64", 0.01f, 100.0f, &r);
    test_drift("kivi:bits=2", 32, &r);
    test_drift("kivi:bits=4", 64, &r);
    test_long_append("kivi:bits=2", &r);
    test_long_append("k=kivi:bits=4;v=kivi:bits=2,group=64", &r);
    test_repeat("kivi:bits=2", &r);
    test_repeat("kivi:bits=4", &r);
    test_errors(&r);
    return check_done();
}

#else

int main(int argc, char **argv) {
    (void)argc, (void)argv;
    /* without CUDA a CUDA cache is refused with a clear error */
    vq_cache_config cfg = {.n_layers = 1, .n_heads_q = 4, .n_heads_kv = 1, .head_dim = 128, .kv_spec = "kivi",
                           .capacity = 64, .device = VQ_DEVICE_CUDA};
    vq_cache *c = NULL;
    CHECK(vq_cache_create(&cfg, &c) == VQ_ERR_UNSUPPORTED && c == NULL, "create: %s", vq_last_error());
    CHECK(vq_cuda_device_count() == 0, "device count");
    if (check_failed) return check_done();
    printf("built without CUDA: skipped\n");
    return SKIP;
}

#endif
