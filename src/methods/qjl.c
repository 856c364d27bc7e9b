/* QJL: 1-bit quantized Johnson-Lindenstrauss sketch of keys (Zandieh et al.,
 * "QJL: 1-Bit Quantized JL Transform for KV Cache Quantization with Zero
 * Overhead", arXiv 2406.03482). Keys only: the estimator is for inner
 * products with a query, which values never take part in.
 *
 * S is an m x d matrix of iid N(0, 1) entries from the seed. A key k stores
 * sign(S k) (m bits) and ||k|| (fp16); the query is projected, not
 * quantized, and
 *   <q, k> ~ sqrt(pi/2) / m * ||k|| * <S q, sign(S k)>
 * is unbiased. Decoding returns that estimator's vector,
 * sqrt(pi/2) / m * ||k|| * S^T sign(S k), so q . decode(k) is the score.
 *
 * Outliers (outliers=K): the K channels of largest |k_c| of each key are
 * kept exact (fp16 value and channel index) and the rest of the key is
 * sketched. Chosen per vector rather than per block, so encoding stays one
 * token at a time; K = 0 is the plain estimator.
 *
 * Block payload: signs [block_tokens][m / 8], fp16 ||k_rest|| [block_tokens],
 * then per token K (uint16 channel, fp16 value) pairs.
 * bits/elem = (m + 16 + 32 K) / d. */
#include "rotated.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

static const char NAME[] = "qjl";
static const float SQRT_HALF_PI = 1.2533141373155003f;

static vq_status qjl_set_option(vq_mparams *p, const char *key, const char *value) {
    if (strcmp(key, "m") == 0)
        return vq_opt_int(NAME, key, value, 8, 4096, 8, "8..4096, a multiple of 8", &p->sketch);
    if (strcmp(key, "outliers") == 0) return vq_opt_int(NAME, key, value, 0, 64, 1, "0..64", &p->outliers);
    if (strcmp(key, "seed") == 0) return vq_opt_seed(NAME, value, &p->seed);
    if (strcmp(key, "residual") == 0) return vq_opt_int(NAME, key, value, 0, 4096, 1, "0..4096", &p->residual);
    return vq_fail(VQ_ERR_ARG, "%s: unknown option '%s' (options: m, outliers, seed, residual)", NAME, key);
}

static vq_status qjl_finish(vq_mparams *p) {
    if (p->is_value)
        return vq_fail(VQ_ERR_ARG, "%s is for keys only (it estimates inner products with the query, which values "
                       "never take part in): use e.g. 'k=qjl;v=kivi:bits=2'", NAME);
    int d = p->head_dim;
    if (p->sketch == 0) p->sketch = 2 * d; /* the reference uses m = 256 for d = 128 */
    if (p->residual < 0) p->residual = 128; /* the reference keeps the last 128 tokens in fp16 */
    if (d < 8 || d > 1024)
        return vq_fail(VQ_ERR_ARG, "%s: head dim %d is not supported (allowed 8..1024)", NAME, d);
    if (p->sketch % 8 != 0 || p->sketch > 4096)
        return vq_fail(VQ_ERR_ARG, "%s: m=%d is out of range (allowed 8..4096, a multiple of 8)", NAME, p->sketch);
    if (p->outliers > d / 2)
        return vq_fail(VQ_ERR_ARG, "%s: outliers=%d is out of range for head dim %d (allowed 0..%d)", NAME,
                       p->outliers, d, d / 2);
    p->proj = vq_gaussian_matrix_get(p->sketch, d, p->seed);
    if (!p->proj)
        return vq_fail(VQ_ERR_NOMEM, "%s: out of memory for the rotation or codebooks (head dim %d)", NAME,
                       p->head_dim);
    return VQ_OK;
}

static void qjl_describe(const vq_mparams *p, char *buf, size_t size) {
    snprintf(buf, size, "%s:m=%d,outliers=%d,seed=%llu,residual=%d", NAME, p->sketch, p->outliers,
             (unsigned long long)p->seed, p->residual);
}

static size_t sign_bytes(const vq_mparams *p) { return (size_t)p->sketch / 8; }

static int qjl_layout(const vq_mparams *p, size_t *row_bytes) {
    row_bytes[0] = sign_bytes(p);
    row_bytes[1] = 2;                        /* norm */
    row_bytes[2] = 4 * (size_t)p->outliers; /* (channel, value) pairs */
    return 3;
}

static size_t qjl_block_bytes(const vq_mparams *p, int bt) {
    return (size_t)bt * (sign_bytes(p) + 2 + 4 * (size_t)p->outliers);
}

static double qjl_bits(const vq_mparams *p) { return (p->sketch + 16.0 + 32.0 * p->outliers) / p->head_dim; }

/* After the signs: fp16 norms [bt], then [bt][K] (channel, fp16 value). */
static uint16_t *norms(const vq_mparams *p, const uint8_t *blk, int bt) {
    return (uint16_t *)(blk + (size_t)bt * sign_bytes(p));
}
static uint16_t *outlier_pairs(const vq_mparams *p, const uint8_t *blk, int bt, int t) {
    return norms(p, blk, bt) + bt + (size_t)t * 2 * p->outliers;
}

static void qjl_encode(const vq_mparams *p, const float *x, size_t x_stride, int n, uint8_t *blk, int bt, int t0) {
    int d = p->head_dim, m = p->sketch, K = p->outliers;
    uint16_t *nrm = norms(p, blk, bt);
    float rest[1024], y[4096];
    for (int t = 0; t < n; t++) {
        const float *xt = x + (size_t)t * x_stride;
        memcpy(rest, xt, sizeof(float) * (size_t)d);
        uint16_t *pairs = outlier_pairs(p, blk, bt, t0 + t);
        for (int k = 0; k < K; k++) {
            /* the largest remaining |x_c| (ties: the lowest channel) moves
             * to the exact list and leaves the sketched rest */
            int best = 0;
            for (int c = 1; c < d; c++)
                if (fabsf(rest[c]) > fabsf(rest[best])) best = c;
            pairs[2 * k] = (uint16_t)best;
            pairs[2 * k + 1] = vq_f32_to_f16(rest[best]);
            rest[best] = 0;
        }
        vq_project(p->proj, m, d, rest, y);
        vq_signs_pack(y, m, blk + (size_t)(t0 + t) * sign_bytes(p));
        nrm[t0 + t] = vq_f32_to_f16((float)vq_norm(rest, d));
    }
}

static void qjl_decode(const vq_mparams *p, const uint8_t *blk, int bt, int t0, int n, float *out) {
    int d = p->head_dim, m = p->sketch, K = p->outliers;
    const uint16_t *nrm = norms(p, blk, bt);
    float z[4096];
    for (int t = t0; t < t0 + n; t++) {
        float *o = out + (size_t)(t - t0) * d;
        memset(o, 0, sizeof(float) * (size_t)d);
        memset(z, 0, sizeof(float) * (size_t)m);
        vq_signs_axpy(blk + (size_t)t * sign_bytes(p), m, SQRT_HALF_PI / (float)m * vq_f16_to_f32(nrm[t]), z);
        vq_project_transpose_add(p->proj, m, d, z, o);
        const uint16_t *pairs = outlier_pairs(p, blk, bt, t);
        for (int k = 0; k < K; k++) o[pairs[2 * k]] += vq_f16_to_f32(pairs[2 * k + 1]);
    }
}

/* Prepared rows: the sign tables of S q (rotated.h; nibble tables where
 * vq_signs_nibbled, 4 m floats a row instead of 32 m), then the rows of q
 * themselves (d floats each, for the outliers). Built once per attention
 * call, so a key costs m/8 table lookups and adds (m/4 nibble lookups, 16
 * keys at a time). */
static size_t qjl_prep_floats(const vq_mparams *p) { return 32 * (size_t)p->sketch + (size_t)p->head_dim; }

static size_t table_floats(int m, int rows) {
    return vq_signs_nibbled(m) ? vq_signs_nibbles_floats(m, rows) : vq_signs_table_floats(m, rows);
}

static void qjl_prep_query(const vq_mparams *p, const float *q, int rows, float *prep) {
    int d = p->head_dim, m = p->sketch;
    if (vq_signs_nibbled(m)) vq_signs_nibbles(p->proj, m, d, q, (size_t)d, rows, prep);
    else vq_signs_table(p->proj, m, d, q, (size_t)d, rows, prep);
    memcpy(prep + table_floats(m, rows), q, sizeof(float) * (size_t)rows * d);
}

static size_t qjl_scratch(const vq_mparams *p, int rows) {
    (void)p;
    (void)rows;
    return 0;
}

static void qjl_score(const vq_mparams *p, const float *prep, int rows, const uint8_t *blk, int bt, int t0, int n,
                      float *logits, int ld, float *scratch) {
    (void)scratch;
    int d = p->head_dim, m = p->sketch, K = p->outliers;
    const uint16_t *nrm = norms(p, blk, bt);
    size_t sb = sign_bytes(p);
    float gain[64];
    for (int j0 = 0; j0 < n; j0 += 64) {
        int cnt = n - j0 < 64 ? n - j0 : 64;
        vq_f16_to_f32_array(nrm + t0 + j0, gain, (size_t)cnt);
        for (int j = 0; j < cnt; j++) gain[j] *= SQRT_HALF_PI / (float)m;
        if (vq_signs_nibbled(m))
            vq_signs_score_nibbles(prep, m, rows, blk + (size_t)(t0 + j0) * sb, sb, gain, cnt, logits + j0, ld, false);
        else vq_signs_score(prep, m, rows, blk + (size_t)(t0 + j0) * sb, sb, gain, cnt, logits + j0, ld, false);
    }
    const float *q = prep + table_floats(m, rows);
    for (int j = 0; K && j < n; j++) {
        const uint16_t *pairs = outlier_pairs(p, blk, bt, t0 + j);
        for (int r = 0; r < rows; r++) {
            const float *qr = q + (size_t)r * d;
            float s = 0;
            for (int k = 0; k < K; k++) s += qr[pairs[2 * k]] * vq_f16_to_f32(pairs[2 * k + 1]);
            logits[(size_t)r * ld + j] += s;
        }
    }
}

const vq_method vq_method_qjl = {
    .name = "qjl",
    .set_option = qjl_set_option,
    .finish = qjl_finish,
    .describe = qjl_describe,
    .token_group = vq_token_group_one,
    .block_bytes = qjl_block_bytes,
    .token_layout = qjl_layout,
    .bits_per_elem = qjl_bits,
    .encode = qjl_encode,
    .decode = qjl_decode,
    .prep_floats = qjl_prep_floats,
    .prep_query = qjl_prep_query,
    .scratch_floats = qjl_scratch,
    .score = qjl_score,
    .accum = NULL, /* keys only: finish() refuses qjl for values */
};
