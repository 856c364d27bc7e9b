/* TurboQuant-MSE (Zandieh et al., "TurboQuant: Online Vector Quantization
 * with Near-optimal Distortion Rate", arXiv 2504.19874).
 *
 * A vector x is stored as ||x|| (fp16) and the codes of u = R x / ||x||,
 * R a seeded random rotation (core/rotate.h). Each coordinate of a rotated
 * unit vector has the density (1 - t^2)^((d-3)/2) on [-1, 1], so every
 * coordinate uses the b-bit Lloyd-Max codebook of that exact density.
 * x_hat = ||x|| R^T c[codes].
 *
 * Fractional rates (bits=2.5, 3.5): the paper gives a subset of channels one
 * more bit. Here the first d/2 rotated coordinates get b + 1 bits and the
 * other d/2 get b bits, so the rate is exactly b + 0.5. After the rotation
 * every coordinate has the same distribution, so a fixed half is as good as
 * any other choice and needs no per-vector metadata.
 *
 * Block payload: codes [block_tokens][hi part: d/2 codes at b+1 bits, then
 * lo part: d - d/2 codes at b bits] (integer rates: one part of d codes),
 * then fp16 norms [block_tokens]. bits/elem = rate + 16/d.
 *
 * Attention: the query is rotated once (prep_query), a key scores as
 * ||k|| * sum_j q'_j c[code_j] straight from the codes; values accumulate
 * ||v|| w c[code_j] in the rotated domain and finish_rows applies R^T once. */
#include "pack.h"
#include "rotated.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

static const char NAME[] = "tq-mse";

static vq_status mse_set_option(vq_mparams *p, const char *key, const char *value) {
    if (strcmp(key, "bits") == 0) {
        const char *ok[] = {"1", "2", "3", "4", "2.5", "3.5"};
        const double rate[] = {1, 2, 3, 4, 2.5, 3.5};
        for (int i = 0; i < 6; i++)
            if (strcmp(value, ok[i]) == 0) {
                p->rate = rate[i];
                return VQ_OK;
            }
        return vq_fail(VQ_ERR_ARG, "%s: bits='%s' is not supported (allowed 1, 2, 3, 4, 2.5, 3.5)", NAME, value);
    }
    if (strcmp(key, "seed") == 0) return vq_opt_seed(NAME, value, &p->seed);
    if (strcmp(key, "residual") == 0) return vq_opt_int(NAME, key, value, 0, 4096, 1, "0..4096", &p->residual);
    return vq_fail(VQ_ERR_ARG, "%s: unknown option '%s' (options: bits, seed, residual)", NAME, key);
}

static vq_status mse_finish(vq_mparams *p) {
    if (p->rate == 0) p->rate = 4;
    if (p->residual < 0) p->residual = 0;
    p->bits = (int)p->rate;
    bool frac = p->rate != p->bits;
    int d = p->head_dim, step = frac ? 16 : 8;
    if (d < 16 || d > 1024 || d % step != 0)
        return vq_fail(VQ_ERR_ARG, "%s: head dim %d is not supported (a multiple of %d in [16, 1024]%s)", NAME, d,
                       step, frac ? " for a fractional rate" : "");
    p->hi_channels = frac ? d / 2 : 0;
    p->rot = vq_rotation_get(d, p->seed);
    if (!p->rot)
        return vq_fail(VQ_ERR_NOMEM, "%s: out of memory for the rotation or codebooks (head dim %d)", NAME,
                       p->head_dim);
    p->cb[0] = vq_codebook_get(VQ_DENSITY_SPHERE, d, p->bits);
    p->cb[1] = frac ? vq_codebook_get(VQ_DENSITY_SPHERE, d, p->bits + 1) : NULL;
    if (!p->cb[0] || (frac && !p->cb[1]))
        return vq_fail(VQ_ERR_NOMEM, "%s: out of memory for the rotation or codebooks (head dim %d)", NAME,
                       p->head_dim);
    return VQ_OK;
}

static void mse_describe(const vq_mparams *p, char *buf, size_t size) {
    snprintf(buf, size, "%s:bits=%g,seed=%llu,residual=%d", NAME, p->rate, (unsigned long long)p->seed,
             p->residual);
}

/* Bytes of one token's codes: the hi part then the lo part. */
static size_t hi_bytes(const vq_mparams *p) { return vq_packed_bytes(p->bits + 1, p->hi_channels); }
static size_t code_bytes(const vq_mparams *p) {
    return hi_bytes(p) + vq_packed_bytes(p->bits, p->head_dim - p->hi_channels);
}

static int mse_layout(const vq_mparams *p, size_t *row_bytes) {
    row_bytes[0] = code_bytes(p);
    row_bytes[1] = 2;
    return 2;
}

static size_t mse_block_bytes(const vq_mparams *p, int bt) { return (size_t)bt * (code_bytes(p) + 2); }

static double mse_bits(const vq_mparams *p) { return p->rate + 16.0 / p->head_dim; }

static const uint16_t *norms(const vq_mparams *p, const uint8_t *blk, int bt) {
    return (const uint16_t *)(blk + (size_t)bt * code_bytes(p));
}

static void mse_encode(const vq_mparams *p, const float *x, size_t x_stride, int n, uint8_t *blk, int bt,
                       int t0) {
    int d = p->head_dim, h = p->hi_channels;
    const vq_codebook *lo = p->cb[0], *hi = p->cb[1];
    size_t cb = code_bytes(p);
    uint16_t *nrm = (uint16_t *)(blk + (size_t)bt * cb);
    float u[1024];
    uint8_t codes[1024];
    for (int t = 0; t < n; t++) {
        const float *xt = x + (size_t)t * x_stride;
        double len = vq_norm(xt, d);
        float inv = len > 0 ? (float)(1.0 / len) : 0.0f;
        for (int c = 0; c < d; c++) u[c] = xt[c] * inv;
        vq_rotate(p->rot, u, u);
        for (int c = 0; c < h; c++) codes[c] = (uint8_t)vq_codebook_quantize(hi, u[c]);
        for (int c = h; c < d; c++) codes[c] = (uint8_t)vq_codebook_quantize(lo, u[c]);
        uint8_t *dst = blk + (size_t)(t0 + t) * cb;
        if (h) vq_pack_codes(codes, h, p->bits + 1, dst);
        vq_pack_codes(codes + h, d - h, p->bits, dst + hi_bytes(p));
        nrm[t0 + t] = vq_f32_to_f16((float)len);
    }
}

/* acc[0..d) += w * c[codes] of one token (rotated domain). */
static void add_token(const vq_mparams *p, const uint8_t *codes, float w, float *acc) {
    int d = p->head_dim, h = p->hi_channels;
    if (h) vq_codes_axpy(codes, h, p->bits + 1, p->cb[1]->centroid, w, acc);
    vq_codes_axpy(codes + hi_bytes(p), d - h, p->bits, p->cb[0]->centroid, w, acc + h);
}

static void mse_decode(const vq_mparams *p, const uint8_t *blk, int bt, int t0, int n, float *out) {
    int d = p->head_dim;
    size_t cb = code_bytes(p);
    const uint16_t *nrm = norms(p, blk, bt);
    for (int t = t0; t < t0 + n; t++) {
        float *o = out + (size_t)(t - t0) * d;
        memset(o, 0, sizeof(float) * (size_t)d);
        add_token(p, blk + (size_t)t * cb, vq_f16_to_f32(nrm[t]), o);
        vq_rotate_inverse(p->rot, o, o);
    }
}

/* The runs of one token's codes: the hi part (fractional rates), then the
 * lo part; returns their count. */
static int code_parts(const vq_mparams *p, vq_code_part parts[2]) {
    int d = p->head_dim, h = p->hi_channels, k = 0;
    if (h) parts[k++] = (vq_code_part){0, h, p->bits + 1, p->cb[1]->centroid, NULL};
    parts[k++] = (vq_code_part){(int)hi_bytes(p), d - h, p->bits, p->cb[0]->centroid, NULL};
    return k;
}

static size_t mse_scratch(const vq_mparams *p, int rows) { return vq_codes_scratch(p->head_dim, rows); }

static void mse_score(const vq_mparams *p, const float *q, int rows, const uint8_t *blk, int bt, int t0, int n,
                      float *logits, int ld, float *scratch) {
    vq_code_part parts[2];
    int np = code_parts(p, parts);
    size_t cb = code_bytes(p);
    vq_codes_score(parts, np, blk + (size_t)t0 * cb, cb, norms(p, blk, bt) + t0, n, q, p->head_dim, rows, logits,
                   ld, scratch);
}

static void mse_accum(const vq_mparams *p, const float *w, int ld, int rows, const uint8_t *blk, int bt, int t0,
                      int n, float *acc, float *scratch) {
    vq_code_part parts[2];
    int np = code_parts(p, parts);
    size_t cb = code_bytes(p);
    vq_codes_accum(parts, np, blk + (size_t)t0 * cb, cb, norms(p, blk, bt) + t0, n, w, ld, rows, acc, p->head_dim,
                   scratch);
}

const vq_method vq_method_tq_mse = {
    .name = "tq-mse",
    .set_option = mse_set_option,
    .finish = mse_finish,
    .describe = mse_describe,
    .token_group = vq_token_group_one,
    .block_bytes = mse_block_bytes,
    .token_layout = mse_layout,
    .bits_per_elem = mse_bits,
    .encode = mse_encode,
    .decode = mse_decode,
    .prep_floats = vq_rotated_prep_floats,
    .prep_query = vq_rotated_prep_query,
    .finish_rows = vq_rotated_finish_rows,
    .scratch_floats = mse_scratch,
    .score = mse_score,
    .accum = mse_accum,
};
