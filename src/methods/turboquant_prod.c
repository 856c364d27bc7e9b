/* TurboQuant-Prod (Zandieh et al., arXiv 2504.19874): an unbiased
 * inner-product quantizer. A (b-1)-bit TurboQuant-MSE stage (see
 * turboquant_mse.c) codes u = R x / ||x||; the residual r = u - c[codes] is
 * sketched with 1-bit QJL: the d signs of S r, S a seeded d x d Gaussian
 * matrix, and gamma = ||r||. The estimate
 *   <q, x> ~ ||x|| (<R q, c[codes]> + sqrt(pi/2) / d * gamma * <S R q, sign(S r)>)
 * is unbiased, because E[sign(<s, r>) s] = sqrt(2/pi) r / ||r|| for a
 * Gaussian row s. (The residual is sketched in the rotated domain; S R^T is
 * as Gaussian as S, so this is the paper's estimator.)
 *
 * Block payload: per token the (b-1)-bit codes of d coordinates and the d
 * sign bits; then fp16 ||x|| [block_tokens] and fp16 gamma [block_tokens].
 * bits/elem = b + 32/d.
 *
 * Attention: prep_query gives [R q, S R q] per row; scores read the codes
 * and signs directly. Values: accum adds the codebook part in the rotated
 * domain and gathers the sign part per call in scratch, then adds S^T of it
 * (d^2 per call, not per token); finish_rows applies R^T. */
#include "pack.h"
#include "rotated.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

static const char NAME[] = "tq-prod";
static const float SQRT_HALF_PI = 1.2533141373155003f;

static vq_status prod_set_option(vq_mparams *p, const char *key, const char *value) {
    if (strcmp(key, "bits") == 0) return vq_opt_int(NAME, key, value, 2, 4, 1, "2, 3, 4", &p->bits);
    if (strcmp(key, "seed") == 0) return vq_opt_seed(NAME, value, &p->seed);
    if (strcmp(key, "residual") == 0) return vq_opt_int(NAME, key, value, 0, 4096, 1, "0..4096", &p->residual);
    return vq_fail(VQ_ERR_ARG, "%s: unknown option '%s' (options: bits, seed, residual)", NAME, key);
}

static vq_status prod_finish(vq_mparams *p) {
    if (p->bits == 0) p->bits = 4;
    if (p->residual < 0) p->residual = 0;
    int d = p->head_dim;
    if (d < 16 || d > 1024 || d % 8 != 0)
        return vq_fail(VQ_ERR_ARG, "%s: head dim %d is not supported (a multiple of 8 in [16, 1024])", NAME, d);
    p->rot = vq_rotation_get(d, p->seed);
    p->proj = vq_gaussian_matrix_get(d, d, p->seed);
    p->cb[0] = vq_codebook_get(VQ_DENSITY_SPHERE, d, p->bits - 1);
    if (!p->rot || !p->proj || !p->cb[0])
        return vq_fail(VQ_ERR_NOMEM, "%s: out of memory for the rotation or codebooks (head dim %d)", NAME,
                       p->head_dim);
    return VQ_OK;
}

static void prod_describe(const vq_mparams *p, char *buf, size_t size) {
    snprintf(buf, size, "%s:bits=%d,seed=%llu,residual=%d", NAME, p->bits, (unsigned long long)p->seed,
             p->residual);
}

static int prod_token_group(const vq_mparams *p) {
    (void)p;
    return 1;
}

static size_t mse_bytes(const vq_mparams *p) { return vq_packed_bytes(p->bits - 1, p->head_dim); }
static size_t token_bytes(const vq_mparams *p) { return mse_bytes(p) + (size_t)p->head_dim / 8; }

static int prod_layout(const vq_mparams *p, size_t *row_bytes) {
    row_bytes[0] = token_bytes(p);
    row_bytes[1] = 2; /* norm */
    row_bytes[2] = 2; /* gamma */
    return 3;
}

static size_t prod_block_bytes(const vq_mparams *p, int bt) { return (size_t)bt * (token_bytes(p) + 4); }

static double prod_bits(const vq_mparams *p) { return p->bits + 32.0 / p->head_dim; }

/* fp16 ||x|| [bt] then fp16 gamma [bt] after the codes */
static const uint16_t *meta(const vq_mparams *p, const uint8_t *blk, int bt) {
    return (const uint16_t *)(blk + (size_t)bt * token_bytes(p));
}

static void prod_encode(const vq_mparams *p, const float *x, size_t x_stride, int n, uint8_t *blk, int bt,
                        int t0) {
    int d = p->head_dim;
    const vq_codebook *cb = p->cb[0];
    size_t tb = token_bytes(p);
    uint16_t *nrm = (uint16_t *)(blk + (size_t)bt * tb), *gam = nrm + bt;
    float u[1024], y[1024];
    uint8_t codes[1024];
    for (int t = 0; t < n; t++) {
        const float *xt = x + (size_t)t * x_stride;
        double len = vq_norm(xt, d);
        float inv = len > 0 ? (float)(1.0 / len) : 0.0f;
        for (int c = 0; c < d; c++) u[c] = xt[c] * inv;
        vq_rotate(p->rot, u, u);
        for (int c = 0; c < d; c++) {
            codes[c] = (uint8_t)vq_codebook_quantize(cb, u[c]);
            u[c] -= cb->centroid[codes[c]]; /* the residual r */
        }
        uint8_t *dst = blk + (size_t)(t0 + t) * tb;
        vq_pack_codes(codes, d, p->bits - 1, dst);
        vq_project(p->proj, d, d, u, y);
        vq_signs_pack(y, d, dst + mse_bytes(p));
        nrm[t0 + t] = vq_f32_to_f16((float)len);
        gam[t0 + t] = vq_f32_to_f16((float)vq_norm(u, d));
    }
}

static void prod_decode(const vq_mparams *p, const uint8_t *blk, int bt, int t0, int n, float *out) {
    int d = p->head_dim;
    size_t tb = token_bytes(p);
    const uint16_t *nrm = meta(p, blk, bt), *gam = nrm + bt;
    float z[1024];
    for (int t = t0; t < t0 + n; t++) {
        float *o = out + (size_t)(t - t0) * d;
        const uint8_t *src = blk + (size_t)t * tb;
        float len = vq_f16_to_f32(nrm[t]);
        memset(o, 0, sizeof(float) * (size_t)d);
        memset(z, 0, sizeof(float) * (size_t)d);
        vq_codes_axpy(src, d, p->bits - 1, p->cb[0]->centroid, len, o);
        vq_signs_axpy(src + mse_bytes(p), d, len * SQRT_HALF_PI / (float)d * vq_f16_to_f32(gam[t]), z);
        vq_project_transpose_add(p->proj, d, d, z, o);
        vq_rotate_inverse(p->rot, o, o);
    }
}

static size_t prod_prep_floats(const vq_mparams *p) { return 2 * (size_t)p->head_dim; }

static void prod_prep_query(const vq_mparams *p, const float *q, int rows, float *prep) {
    int d = p->head_dim;
    for (int r = 0; r < rows; r++) {
        float *pr = prep + (size_t)r * 2 * d;
        vq_rotate(p->rot, q + (size_t)r * d, pr);
        vq_project(p->proj, d, d, pr, pr + d);
    }
}

static void prod_finish_rows(const vq_mparams *p, float *acc, int rows) {
    int d = p->head_dim;
    for (int r = 0; r < rows; r++) vq_rotate_inverse(p->rot, acc + (size_t)r * d, acc + (size_t)r * d);
}

/* score(): per-row sums of one token; accum(): the sign part [rows][d] */
static size_t prod_scratch(const vq_mparams *p, int rows) { return (size_t)rows * (size_t)p->head_dim; }

static void prod_score(const vq_mparams *p, const float *q, int rows, const uint8_t *blk, int bt, int t0, int n,
                       float *logits, int ld, float *scratch) {
    int d = p->head_dim;
    size_t tb = token_bytes(p), mb = mse_bytes(p);
    const uint16_t *nrm = meta(p, blk, bt), *gam = nrm + bt;
    const float *table = p->cb[0]->centroid;
    for (int j = 0; j < n; j++) {
        const uint8_t *src = blk + (size_t)(t0 + j) * tb;
        float len = vq_f16_to_f32(nrm[t0 + j]);
        float g = SQRT_HALF_PI / (float)d * vq_f16_to_f32(gam[t0 + j]);
        vq_codes_dot_rows(src, d, p->bits - 1, table, q, 2 * (size_t)d, rows, scratch);
        for (int r = 0; r < rows; r++) {
            float s = scratch[r] + g * vq_signs_dot(src + mb, d, q + (size_t)r * 2 * d + d);
            logits[(size_t)r * ld + j] = len * s;
        }
    }
}

static void prod_accum(const vq_mparams *p, const float *w, int ld, int rows, const uint8_t *blk, int bt, int t0,
                       int n, float *acc, float *scratch) {
    int d = p->head_dim;
    size_t tb = token_bytes(p), mb = mse_bytes(p);
    const uint16_t *nrm = meta(p, blk, bt), *gam = nrm + bt;
    const float *table = p->cb[0]->centroid;
    float *z = scratch; /* [rows][d] the sign part, in the sketch domain */
    memset(z, 0, sizeof(float) * (size_t)rows * d);
    for (int j = 0; j < n; j++) {
        const uint8_t *src = blk + (size_t)(t0 + j) * tb;
        float len = vq_f16_to_f32(nrm[t0 + j]);
        float g = SQRT_HALF_PI / (float)d * vq_f16_to_f32(gam[t0 + j]);
        for (int r = 0; r < rows; r++) {
            float wt = w[(size_t)r * ld + j] * len;
            if (wt == 0) continue;
            vq_codes_axpy(src, d, p->bits - 1, table, wt, acc + (size_t)r * d);
            vq_signs_axpy(src + mb, d, wt * g, z + (size_t)r * d);
        }
    }
    for (int r = 0; r < rows; r++) vq_project_transpose_add(p->proj, d, d, z + (size_t)r * d, acc + (size_t)r * d);
}

const vq_method vq_method_tq_prod = {
    .name = "tq-prod",
    .set_option = prod_set_option,
    .finish = prod_finish,
    .describe = prod_describe,
    .token_group = prod_token_group,
    .block_bytes = prod_block_bytes,
    .token_layout = prod_layout,
    .bits_per_elem = prod_bits,
    .encode = prod_encode,
    .decode = prod_decode,
    .prep_floats = prod_prep_floats,
    .prep_query = prod_prep_query,
    .finish_rows = prod_finish_rows,
    .scratch_floats = prod_scratch,
    .score = prod_score,
    .accum = prod_accum,
};
