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
 * Attention: prep_query gives R q, the sign tables of S R q and, for 1-bit
 * codes, byte tables of R q against the codebook (rotated.h) per row;
 * scores read the codes and the signs directly: byte table lookups (the
 * shared codes kernel for 2- and 3-bit codes, with the sign lookups in the
 * same pass over the tokens). Values: accum adds the codebook part in the
 * rotated domain and the sign part in the sketch domain, side by side in a
 * 2 d accumulator row; finish_rows adds S^T of the sign part and applies
 * R^T, d^2 work per output row and attention call. At the avx512 level
 * (nibble_signs) the signs are scored from nibble tables instead, 16
 * tokens a vector, after the codes kernel. */
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

/* Whether the signs are scored from nibble tables (vq_signs_nibbled; else
 * from byte tables, vq_signs_table); the prepared rows differ. */
static bool nibble_signs(const vq_mparams *p) { return vq_signs_nibbled(p->head_dim); }

/* Whether the keys' codes part is scored from byte tables (vq_codes_table)
 * rather than by the codes kernel; then the prepared rows hold their tables
 * too. Only for 1-bit codes (bits=2): 64 KB for four rows at d = 128. The
 * 2-bit codes' tables (128 KB, besides the signs' 64 KB) measured slower
 * than the codes kernel in cache (tq-prod 3-bit 68.5 -> 71.4 ns), the
 * 1-bit ones faster (68.1 -> 60.7 ns). Not with nibble_signs, where the
 * codes kernel scores them. */
static bool codes_tabled(const vq_mparams *p) { return p->bits == 2 && !nibble_signs(p); }

/* Prepared rows: the sign tables of S R q (rotated.h), then the rows of
 * R q (d floats each), then (codes_tabled) the byte tables of the codes.
 * With nibble_signs: the nibble tables (4 d floats a row, fewer than the
 * byte tables' 32 d), then the rows of R q. */
static size_t prod_prep_floats(const vq_mparams *p) {
    size_t codes = codes_tabled(p) ? vq_signs_table_floats(8 * (int)mse_bytes(p), 1) : 0;
    return vq_signs_table_floats(p->head_dim, 1) + (size_t)p->head_dim + codes;
}

static void prod_prep_query(const vq_mparams *p, const float *q, int rows, float *prep) {
    int d = p->head_dim;
    bool nib = nibble_signs(p);
    float *rq = prep + (nib ? vq_signs_nibbles_floats(d, rows) : vq_signs_table_floats(d, rows));
    for (int r = 0; r < rows; r++) vq_rotate(p->rot, q + (size_t)r * d, rq + (size_t)r * d);
    if (nib) {
        vq_signs_nibbles(p->proj, d, d, rq, (size_t)d, rows, prep);
        return;
    }
    vq_signs_table(p->proj, d, d, rq, (size_t)d, rows, prep);
    if (codes_tabled(p)) vq_codes_table(d, p->cb[0]->centroid, rq, (size_t)d, rows, rq + (size_t)rows * d);
}

/* Accumulator rows: the rotated-domain codebook part (d floats), then the
 * sign part in the sketch domain (d floats), mapped back with S^T once per
 * output row here rather than once per block. */
static size_t prod_acc_floats(const vq_mparams *p) { return 2 * (size_t)p->head_dim; }

static void prod_finish_rows(const vq_mparams *p, float *acc, int rows) {
    int d = p->head_dim;
    for (int r = 0; r < rows; r++) {
        float *a = acc + (size_t)r * 2 * d;
        vq_project_transpose_add(p->proj, d, d, a + d, a);
        vq_rotate_inverse(p->rot, a, a);
    }
}

/* The (b-1)-bit part as one code part of the shared kernels (rotated.h). */
static vq_code_part mse_part(const vq_mparams *p) {
    return (vq_code_part){0, p->head_dim, p->bits - 1, p->cb[0]->centroid, NULL};
}

/* score() and accum(): the codes kernels' scratch */
static size_t prod_scratch(const vq_mparams *p, int rows) { return vq_codes_scratch(p->head_dim, rows); }

/* len * <R q, c[codes]> from the codes' byte tables (codes_tabled) or the
 * codes kernel, then len * gamma * sqrt(pi/2) / d * <S R q, signs> from
 * the sign tables added on. */
static void prod_score(const vq_mparams *p, const float *prep, int rows, const uint8_t *blk, int bt, int t0, int n,
                       float *logits, int ld, float *scratch) {
    int d = p->head_dim;
    size_t tb = token_bytes(p), mb = mse_bytes(p);
    const uint16_t *nrm = meta(p, blk, bt), *gam = nrm + bt;
    vq_code_part part = mse_part(p);
    bool nib = nibble_signs(p);
    const float *rq = prep + (nib ? vq_signs_nibbles_floats(d, rows) : vq_signs_table_floats(d, rows));
    float gain[64], len[64];
    for (int j0 = 0; j0 < n; j0 += 64) {
        int cnt = n - j0 < 64 ? n - j0 : 64;
        const uint8_t *src = blk + (size_t)(t0 + j0) * tb;
        vq_f16_to_f32_array(nrm + t0 + j0, len, (size_t)cnt);
        vq_f16_to_f32_array(gam + t0 + j0, gain, (size_t)cnt);
        for (int j = 0; j < cnt; j++) gain[j] = len[j] * (SQRT_HALF_PI / (float)d * gain[j]);
        if (nib) { /* the codes, then the signs added */
            vq_codes_score(&part, 1, src, tb, nrm + t0 + j0, cnt, rq, d, rows, logits + j0, ld, scratch);
            vq_signs_score_nibbles(prep, d, rows, src + mb, tb, gain, cnt, logits + j0, ld, true);
        } else if (codes_tabled(p)) { /* both sketches (8 mb = d signs each) in one pass */
            vq_signs_score2(rq + (size_t)rows * d, prep, d, rows, src, mb, tb, len, gain, cnt, logits + j0, ld);
        } else { /* the codes and the signs in one pass */
            vq_sign_part sp = {prep, d, mb, gain};
            vq_codes_signs_score(&part, 1, &sp, src, tb, nrm + t0 + j0, cnt, rq, d, rows, logits + j0, ld, scratch);
        }
    }
}

/* Both parts go straight into the accumulator rows (prod_acc_floats): the
 * codebook part in the rotated domain, the sign part in the sketch domain. */
static void prod_accum(const vq_mparams *p, const float *w, int ld, int rows, const uint8_t *blk, int bt, int t0,
                       int n, float *acc, float *scratch) {
    int d = p->head_dim;
    size_t tb = token_bytes(p), mb = mse_bytes(p);
    const uint16_t *nrm = meta(p, blk, bt), *gam = nrm + bt;
    vq_code_part part = mse_part(p);
    vq_codes_accum(&part, 1, blk + (size_t)t0 * tb, tb, nrm + t0, n, w, ld, rows, acc, 2 * d, scratch);
    float gain[64], len[64];
    for (int j0 = 0; j0 < n; j0 += 64) {
        int cnt = n - j0 < 64 ? n - j0 : 64;
        vq_f16_to_f32_array(nrm + t0 + j0, len, (size_t)cnt);
        vq_f16_to_f32_array(gam + t0 + j0, gain, (size_t)cnt);
        for (int j = 0; j < cnt; j++) gain[j] = len[j] * (SQRT_HALF_PI / (float)d * gain[j]);
        vq_signs_accum(blk + (size_t)(t0 + j0) * tb + mb, tb, d, gain, cnt, w + j0, ld, rows, acc + d, 2 * (size_t)d);
    }
}

const vq_method vq_method_tq_prod = {
    .name = "tq-prod",
    .set_option = prod_set_option,
    .finish = prod_finish,
    .describe = prod_describe,
    .token_group = vq_token_group_one,
    .block_bytes = prod_block_bytes,
    .token_layout = prod_layout,
    .bits_per_elem = prod_bits,
    .encode = prod_encode,
    .decode = prod_decode,
    .prep_floats = prod_prep_floats,
    .prep_query = prod_prep_query,
    .finish_rows = prod_finish_rows,
    .acc_floats = prod_acc_floats,
    .scratch_floats = prod_scratch,
    .score = prod_score,
    .accum = prod_accum,
};
