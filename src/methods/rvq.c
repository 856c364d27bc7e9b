/* RVQ: two-stage residual scalar quantization after a random rotation (the
 * VeloxQuant articles' "TurboQuant-RVQ").
 *
 * u = R x / ||x|| has coordinates of variance exactly 1/d, so stage 1 is the
 * b-bit Lloyd-Max codebook of N(0, 1) scaled by sigma1 = 1/sqrt(d) (at 1 bit
 * this is the sign quantizer +-0.798 sigma1). The stage-1 residual is
 * Laplacian-like; stage 2 is the b-bit Lloyd-Max codebook of a Laplace
 * density with the residual's variance. That variance is known in advance,
 * D_b * sigma1^2 with D_b the stage-1 codebook's mean squared error for unit
 * variance, so sigma is fixed per stage and costs no metadata (a Laplace of
 * scale s has variance 2 s^2: s2 = sigma1 * sqrt(D_b / 2)).
 *
 * A coordinate's two codes form one 2b-bit code c1 * 2^b + c2 whose level is
 * sigma1 g[c1] + s2 l[c2], so scoring and accumulation are a single 2^(2b)
 * entry table lookup per coordinate, like TurboQuant-MSE.
 *
 * Block payload: codes [block_tokens][d codes of 2b bits], then fp16 ||x||
 * [block_tokens]. bits/elem = 2b + 16/d (rvq:bits=b is b bits per stage). */
#include "pack.h"
#include "rotated.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

static const char NAME[] = "rvq";

static vq_status rvq_set_option(vq_mparams *p, const char *key, const char *value) {
    if (strcmp(key, "bits") == 0) return vq_opt_int(NAME, key, value, 1, 2, 1, "1, 2 (bits per stage)", &p->bits);
    if (strcmp(key, "seed") == 0) return vq_opt_seed(NAME, value, &p->seed);
    if (strcmp(key, "residual") == 0) return vq_opt_int(NAME, key, value, 0, 4096, 1, "0..4096", &p->residual);
    return vq_fail(VQ_ERR_ARG, "%s: unknown option '%s' (options: bits, seed, residual)", NAME, key);
}

static vq_status rvq_finish(vq_mparams *p) {
    if (p->bits == 0) p->bits = 2;
    if (p->residual < 0) p->residual = 0;
    int d = p->head_dim;
    if (d < 16 || d > 1024 || d % 8 != 0)
        return vq_fail(VQ_ERR_ARG, "%s: head dim %d is not supported (a multiple of 8 in [16, 1024])", NAME, d);
    p->rot = vq_rotation_get(d, p->seed);
    p->cb[0] = vq_codebook_get(VQ_DENSITY_GAUSS, 0, p->bits);
    p->cb[1] = vq_codebook_get(VQ_DENSITY_LAPLACE, 0, p->bits);
    if (!p->rot || !p->cb[0] || !p->cb[1])
        return vq_fail(VQ_ERR_NOMEM, "%s: out of memory for the rotation or codebooks (head dim %d)", NAME,
                       p->head_dim);
    return VQ_OK;
}

static void rvq_describe(const vq_mparams *p, char *buf, size_t size) {
    snprintf(buf, size, "%s:bits=%d,seed=%llu,residual=%d", NAME, p->bits, (unsigned long long)p->seed,
             p->residual);
}

static size_t code_bytes(const vq_mparams *p) { return vq_packed_bytes(2 * p->bits, p->head_dim); }
static int rvq_layout(const vq_mparams *p, size_t *row_bytes) {
    row_bytes[0] = code_bytes(p);
    row_bytes[1] = 2;
    return 2;
}

static size_t rvq_block_bytes(const vq_mparams *p, int bt) { return (size_t)bt * (code_bytes(p) + 2); }
static double rvq_bits(const vq_mparams *p) { return 2.0 * p->bits + 16.0 / p->head_dim; }

/* Stage scales, each stage's scaled levels (halves: stage 1, then stage 2,
 * 2^b each) and the combined table level[c1 << b | c2] = halves[c1] +
 * halves[2^b + c2], the sum the codes kernels may form themselves
 * (vq_code_part.halves). */
static void stages(const vq_mparams *p, float *s1, float *s2, float *level, float *halves) {
    const vq_codebook *g = p->cb[0], *l = p->cb[1];
    *s1 = 1.0f / sqrtf((float)p->head_dim);
    *s2 = *s1 * (float)sqrt(g->mse / 2);
    for (int a = 0; a < g->n; a++) halves[a] = *s1 * g->centroid[a];
    for (int b = 0; b < l->n; b++) halves[g->n + b] = *s2 * l->centroid[b];
    for (int a = 0; a < g->n; a++)
        for (int b = 0; b < l->n; b++) level[a * l->n + b] = halves[a] + halves[g->n + b];
}

static void rvq_encode(const vq_mparams *p, const float *x, size_t x_stride, int n, uint8_t *blk, int bt,
                       int t0) {
    int d = p->head_dim;
    float s1, s2, level[16], halves[8], u[1024];
    stages(p, &s1, &s2, level, halves);
    size_t cb = code_bytes(p);
    uint16_t *nrm = (uint16_t *)(blk + (size_t)bt * cb);
    uint8_t codes[1024];
    for (int t = 0; t < n; t++) {
        const float *xt = x + (size_t)t * x_stride;
        double len = vq_norm(xt, d);
        float inv = len > 0 ? (float)(1.0 / len) : 0.0f;
        for (int c = 0; c < d; c++) u[c] = xt[c] * inv;
        vq_rotate(p->rot, u, u);
        for (int c = 0; c < d; c++) {
            int c1 = vq_codebook_quantize(p->cb[0], u[c] / s1);
            float r = u[c] - s1 * p->cb[0]->centroid[c1];
            int c2 = vq_codebook_quantize(p->cb[1], r / s2);
            codes[c] = (uint8_t)((c1 << p->bits) | c2);
        }
        vq_pack_codes(codes, d, 2 * p->bits, blk + (size_t)(t0 + t) * cb);
        nrm[t0 + t] = vq_f32_to_f16((float)len);
    }
}

static void rvq_decode(const vq_mparams *p, const uint8_t *blk, int bt, int t0, int n, float *out) {
    int d = p->head_dim;
    float s1, s2, level[16], halves[8];
    stages(p, &s1, &s2, level, halves);
    size_t cb = code_bytes(p);
    const uint16_t *nrm = (const uint16_t *)(blk + (size_t)bt * cb);
    for (int t = t0; t < t0 + n; t++) {
        float *o = out + (size_t)(t - t0) * d;
        memset(o, 0, sizeof(float) * (size_t)d);
        vq_codes_axpy(blk + (size_t)t * cb, d, 2 * p->bits, level, vq_f16_to_f32(nrm[t]), o);
        vq_rotate_inverse(p->rot, o, o);
    }
}

static size_t rvq_scratch(const vq_mparams *p, int rows) { return vq_codes_scratch(p->head_dim, rows); }

static void rvq_score(const vq_mparams *p, const float *q, int rows, const uint8_t *blk, int bt, int t0, int n,
                      float *logits, int ld, float *scratch) {
    float s1, s2, level[16], halves[8];
    stages(p, &s1, &s2, level, halves);
    size_t cb = code_bytes(p);
    const uint16_t *nrm = (const uint16_t *)(blk + (size_t)bt * cb);
    vq_code_part part = {0, p->head_dim, 2 * p->bits, level, p->bits == 2 ? halves : NULL};
    vq_codes_score(&part, 1, blk + (size_t)t0 * cb, cb, nrm + t0, n, q, p->head_dim, rows, logits, ld, scratch);
}

static void rvq_accum(const vq_mparams *p, const float *w, int ld, int rows, const uint8_t *blk, int bt, int t0,
                      int n, float *acc, float *scratch) {
    float s1, s2, level[16], halves[8];
    stages(p, &s1, &s2, level, halves);
    size_t cb = code_bytes(p);
    const uint16_t *nrm = (const uint16_t *)(blk + (size_t)bt * cb);
    vq_code_part part = {0, p->head_dim, 2 * p->bits, level, p->bits == 2 ? halves : NULL};
    vq_codes_accum(&part, 1, blk + (size_t)t0 * cb, cb, nrm + t0, n, w, ld, rows, acc, p->head_dim, scratch);
}

const vq_method vq_method_rvq = {
    .name = "rvq",
    .set_option = rvq_set_option,
    .finish = rvq_finish,
    .describe = rvq_describe,
    .token_group = vq_token_group_one,
    .block_bytes = rvq_block_bytes,
    .token_layout = rvq_layout,
    .bits_per_elem = rvq_bits,
    .encode = rvq_encode,
    .decode = rvq_decode,
    .prep_floats = vq_rotated_prep_floats,
    .prep_query = vq_rotated_prep_query,
    .finish_rows = vq_rotated_finish_rows,
    .scratch_floats = rvq_scratch,
    .score = rvq_score,
    .accum = rvq_accum,
};
