/* PolarQuant (Han et al., "PolarQuant: Quantizing KV Caches with Polar
 * Transformation", arXiv 2502.02617).
 *
 * After a seeded random rotation u = R x, each block of B = 2^L consecutive
 * coordinates is turned into polar form recursively: level 1 maps the B/2
 * pairs (u_2i, u_2i+1) to radii and angles atan2(u_2i+1, u_2i) in [0, 2 pi);
 * level l > 1 pairs the radii of level l - 1 and keeps atan2(r_2i+1, r_2i)
 * in [0, pi/2]; after L levels one radius is left (fp16). The rotation makes
 * the angle distributions known in advance: uniform at level 1, density
 * ~ sin(2 psi)^(2^(l-1) - 1) at level l, which concentrates around pi/4. So
 * the angles use fixed codebooks (uniform at level 1, Lloyd-Max above) and
 * no per-block scale. Decoding multiplies the radius by the cosines/sines
 * down the tree.
 *
 * bits=a/b/c/... gives the angle bits by level (1..4 each; as many levels
 * as entries, 2^L must divide d). The default 4/2/2/2 is the paper's
 * setting: per 16 coordinates 8*4 + 4*2 + 2*2 + 1*2 = 46 bits of angles and
 * a 16-bit radius, 3.875 bits/elem.
 *
 * Block payload: fp16 radii [block_tokens][d / B], then per token the angle
 * codes as one little-endian bit stream rounded up to whole bytes, level
 * major: all level 1 angles (coordinate block 0's, then block 1's, ...),
 * then all level 2 angles, and so on. One level's codes of one block are
 * thus adjacent bits, which for 4/2/2/2 and d a multiple of 128 puts them
 * in whole bytes (level 1: 4 bytes a block) or fixed fields of one word:
 * the AVX2 kernel loads 8 blocks' codes of a level into 8 lanes at once.
 * bits/elem = (8 * code bytes + 16 d / B) / d: 3.875 for 4/2/2/2 at d = 128.
 *
 * Attention: the query is rotated once; keys are rebuilt from radius and
 * angle codes with table lookups of each level's cosines and sines (no
 * trigonometry per token) and dotted with every query row; values add the
 * rebuilt coordinates times the weight in the rotated domain and
 * finish_rows applies R^T. 4/2/2/2 with d a multiple of 128 (the default
 * at the usual head dims) runs 8 coordinate blocks per vector
 * (kernels/cpu/polar_avx2.c), with the prepared query and the accumulators
 * in that kernel's coordinate order (avx2_pos); other settings rebuild one
 * block at a time. The angles' cosines and sines are computed once, in
 * finish(). */
#include "rotated.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* kernels/cpu/polar_avx2.c: the 4/2/2/2 layout with d a multiple of 128;
 * cs, sn: vq_mparams' angle_cos, angle_sin; q and acc rows (d apart) in
 * the kernels' coordinate order (avx2_pos). */
void vq_polar_score_avx2(const float cs[][16], const float sn[][16], const uint16_t *rad, const uint8_t *codes,
                         size_t cb, int d, int n, const float *q, int rows, float *logits, int ld);
void vq_polar_accum_avx2(const float cs[][16], const float sn[][16], const uint16_t *rad, const uint8_t *codes,
                         size_t cb, int d, int n, const float *w, int ld, int rows, float *acc);
/* kernels/cpu/polar_avx512.c: the same two, two tokens a vector, at the
 * avx512 CPU level. */
void vq_polar_score_avx512(const float cs[][16], const float sn[][16], const uint16_t *rad, const uint8_t *codes,
                           size_t cb, int d, int n, const float *q, int rows, float *logits, int ld);
void vq_polar_accum_avx512(const float cs[][16], const float sn[][16], const uint16_t *rad, const uint8_t *codes,
                           size_t cb, int d, int n, const float *w, int ld, int rows, float *acc);

static const char NAME[] = "polar";
static const double TWO_PI = 6.283185307179586;

static vq_status polar_set_option(vq_mparams *p, const char *key, const char *value) {
    if (strcmp(key, "bits") == 0) {
        int n = 0;
        const char *s = value;
        for (;;) {
            if (n == VQ_MAX_LEVELS)
                return vq_fail(VQ_ERR_ARG, "%s: bits='%s' has more than %d levels", NAME, value, VQ_MAX_LEVELS);
            if (*s < '1' || *s > '4' || (s[1] != 0 && s[1] != '/'))
                return vq_fail(VQ_ERR_ARG, "%s: bits='%s' is not a list of angle bits by level (each 1..4, "
                               "separated by '/', e.g. 4/2/2/2)", NAME, value);
            p->level_bits[n++] = *s - '0';
            if (s[1] == 0) break;
            s += 2;
        }
        p->levels = n;
        return VQ_OK;
    }
    if (strcmp(key, "seed") == 0) return vq_opt_seed(NAME, value, &p->seed);
    if (strcmp(key, "residual") == 0) return vq_opt_int(NAME, key, value, 0, 4096, 1, "0..4096", &p->residual);
    return vq_fail(VQ_ERR_ARG, "%s: unknown option '%s' (options: bits, seed, residual)", NAME, key);
}

static void trig_init(vq_mparams *p);

static vq_status polar_finish(vq_mparams *p) {
    if (p->levels == 0) {
        const int paper[4] = {4, 2, 2, 2};
        p->levels = 4;
        memcpy(p->level_bits, paper, sizeof paper);
    }
    if (p->residual < 0) p->residual = 0;
    int d = p->head_dim, B = 1 << p->levels;
    if (d < 2 || d > 1024 || d % B != 0)
        return vq_fail(VQ_ERR_ARG, "%s: head dim %d is not supported with %d levels (a multiple of %d, at most 1024)",
                       NAME, d, p->levels, B);
    p->rot = vq_rotation_get(d, p->seed);
    if (!p->rot)
        return vq_fail(VQ_ERR_NOMEM, "%s: out of memory for the rotation or codebooks (head dim %d)", NAME,
                       p->head_dim);
    for (int l = 1; l < p->levels; l++) {
        p->cb[l] = vq_codebook_get(VQ_DENSITY_POLAR_ANGLE, 1 << l, p->level_bits[l]);
        if (!p->cb[l])
            return vq_fail(VQ_ERR_NOMEM, "%s: out of memory for the rotation or codebooks (head dim %d)", NAME,
                           p->head_dim);
    }
    trig_init(p);
    return VQ_OK;
}

static void polar_describe(const vq_mparams *p, char *buf, size_t size) {
    char bits[32];
    int len = 0;
    for (int l = 0; l < p->levels; l++)
        len += snprintf(bits + len, sizeof bits - (size_t)len, l ? "/%d" : "%d", p->level_bits[l]);
    snprintf(buf, size, "%s:bits=%s,seed=%llu,residual=%d", NAME, bits, (unsigned long long)p->seed, p->residual);
}

/* Angle bits of one coordinate block. */
static int block_bits(const vq_mparams *p) {
    int bits = 0, B = 1 << p->levels;
    for (int l = 0; l < p->levels; l++) bits += p->level_bits[l] * (B >> (l + 1));
    return bits;
}
static int n_blocks(const vq_mparams *p) { return p->head_dim >> p->levels; }
static size_t code_bytes(const vq_mparams *p) { return ((size_t)block_bits(p) * n_blocks(p) + 7) / 8; }

static int polar_layout(const vq_mparams *p, size_t *row_bytes) {
    row_bytes[0] = 2 * (size_t)n_blocks(p); /* radii */
    row_bytes[1] = code_bytes(p);
    return 2;
}

static size_t polar_block_bytes(const vq_mparams *p, int bt) {
    return (size_t)bt * (code_bytes(p) + 2 * (size_t)n_blocks(p));
}

static double polar_bits(const vq_mparams *p) {
    return (8.0 * (double)code_bytes(p) + 16.0 * n_blocks(p)) / p->head_dim;
}

/* The codes of token t (after the radii). */
static uint8_t *codes_at(const vq_mparams *p, const uint8_t *blk, int bt, int t) {
    return (uint8_t *)blk + (size_t)bt * 2 * n_blocks(p) + (size_t)t * code_bytes(p);
}

static void put_bits(uint8_t *s, size_t pos, int bits, int v) {
    for (int i = 0; i < bits; i++, pos++)
        if ((v >> i) & 1) s[pos / 8] |= (uint8_t)(1u << (pos % 8));
}

static int get_bits(const uint8_t *s, size_t pos, int bits) {
    unsigned v = s[pos / 8] >> (pos % 8);
    if (pos % 8 + (size_t)bits > 8) v |= (unsigned)s[pos / 8 + 1] << (8 - pos % 8);
    return (int)(v & ((1u << bits) - 1));
}

/* The cosine and sine of every level's angle levels, into p (see
 * vq_mparams). Level 1's angles are uniform, a_(c + n/2) = a_c + pi, and
 * stored as exact negatives so that the AVX2 kernel's half table with a
 * sign flip gives the same numbers. */
static void trig_init(vq_mparams *p) {
    int n1 = 1 << p->level_bits[0];
    for (int c = 0; c < n1 / 2; c++) {
        double a = (c + 0.5) * TWO_PI / n1;
        p->angle_cos[0][c] = (float)cos(a);
        p->angle_sin[0][c] = (float)sin(a);
        p->angle_cos[0][c + n1 / 2] = -p->angle_cos[0][c];
        p->angle_sin[0][c + n1 / 2] = -p->angle_sin[0][c];
    }
    for (int l = 1; l < p->levels; l++)
        for (int c = 0; c < p->cb[l]->n; c++) {
            p->angle_cos[l][c] = cosf(p->cb[l]->centroid[c]);
            p->angle_sin[l][c] = sinf(p->cb[l]->centroid[c]);
        }
    for (int l = 0; l < p->levels; l++) {
        int nc = 1 << p->level_bits[l];
        for (int c = nc; c < 16; c++) {
            p->angle_cos[l][c] = p->angle_cos[l][c % nc];
            p->angle_sin[l][c] = p->angle_sin[l][c % nc];
        }
    }
}

/* Bit offset of coordinate block k's first level-l angle in a token's
 * codes (the level-major layout). */
static size_t level_pos(const vq_mparams *p, int l, int k) {
    int B = 1 << p->levels, nb = n_blocks(p);
    size_t pos = 0;
    for (int i = 0; i < l; i++) pos += (size_t)nb * (size_t)(B >> (i + 1)) * (size_t)p->level_bits[i];
    return pos + (size_t)k * (size_t)(B >> (l + 1)) * (size_t)p->level_bits[l];
}

/* Rebuilds coordinate block k of a token into val[0..B) from the codes
 * (bit stream s) and the radius. */
static void rebuild(const vq_mparams *p, const uint8_t *s, int k, float radius, float *val) {
    int L = p->levels, B = 1 << L;
    size_t off[VQ_MAX_LEVELS];
    for (int l = 0; l < L; l++) off[l] = level_pos(p, l, k);
    val[0] = radius;
    for (int l = L - 1; l >= 0; l--) {
        int nodes = B >> (l + 1), bits = p->level_bits[l];
        for (int i = nodes - 1; i >= 0; i--) {
            int c = get_bits(s, off[l] + (size_t)i * bits, bits);
            float r = val[i];
            val[2 * i] = r * p->angle_cos[l][c];
            val[2 * i + 1] = r * p->angle_sin[l][c];
        }
    }
}

static void polar_encode(const vq_mparams *p, const float *x, size_t x_stride, int n, uint8_t *blk, int bt,
                         int t0) {
    int L = p->levels, B = 1 << L, nb = n_blocks(p);
    size_t cb = code_bytes(p);
    uint16_t *rad = (uint16_t *)blk;
    float u[1024];
    for (int t = 0; t < n; t++) {
        vq_rotate(p->rot, x + (size_t)t * x_stride, u);
        uint8_t *s = codes_at(p, blk, bt, t0 + t);
        memset(s, 0, cb);
        for (int k = 0; k < nb; k++) {
            float *v = u + k * B; /* radii overwrite the block in place, level by level */
            for (int l = 0; l < L; l++) {
                int nodes = B >> (l + 1), bits = p->level_bits[l], nc = 1 << bits;
                size_t pos = level_pos(p, l, k);
                for (int i = 0; i < nodes; i++) {
                    double a = v[2 * i], b = v[2 * i + 1], psi = atan2(b, a);
                    int c;
                    if (l == 0) {
                        if (psi < 0) psi += TWO_PI;
                        c = (int)(psi * nc / TWO_PI);
                        if (c >= nc) c = nc - 1;
                    } else {
                        c = vq_codebook_quantize(p->cb[l], (float)psi);
                    }
                    put_bits(s, pos, bits, c);
                    pos += (size_t)bits;
                    v[i] = (float)sqrt(a * a + b * b);
                }
            }
            rad[(size_t)(t0 + t) * nb + k] = vq_f32_to_f16(v[0]);
        }
    }
}

static void polar_decode(const vq_mparams *p, const uint8_t *blk, int bt, int t0, int n, float *out) {
    int d = p->head_dim, B = 1 << p->levels, nb = n_blocks(p);
    const uint16_t *rad = (const uint16_t *)blk;
    for (int t = t0; t < t0 + n; t++) {
        float *o = out + (size_t)(t - t0) * d;
        for (int k = 0; k < nb; k++)
            rebuild(p, codes_at(p, blk, bt, t), k, vq_f16_to_f32(rad[(size_t)t * nb + k]), o + k * B);
        vq_rotate_inverse(p->rot, o, o);
    }
}

/* Whether the AVX2 kernels cover p: the paper's 4/2/2/2 (8 coordinate
 * blocks of 16 per vector; a last lane group of fewer blocks, as at d = 96,
 * has its extra lanes zeroed; the AVX-512 kernels likewise). */
static bool avx2_covered(const vq_mparams *p) {
#if defined(__x86_64__)
    return vq_cpu_has_avx2() && p->levels == 4 && p->level_bits[0] == 4 && p->level_bits[1] == 2 &&
           p->level_bits[2] == 2 && p->level_bits[3] == 2;
#else
    (void)p;
    return false;
#endif
}



/* Floats of a prepared q row and of an accumulator row: the kernels'
 * order fills whole lane groups of 128 coordinates (the padding holds 0). */
static size_t row_floats(const vq_mparams *p) {
    return avx2_covered(p) ? ((size_t)p->head_dim + 127) / 128 * 128 : (size_t)p->head_dim;
}

/* Where the AVX2 kernels keep rotated coordinate c in a prepared q row or
 * an accumulator row: coordinate i of the 8 blocks 8g..8g+7 side by side,
 * [g][i][8 blocks], the order their registers hold (kernels/cpu/
 * polar_avx2.c). Keeping q and the sums in that order saves transposing
 * them in every score and accum call. */
static int avx2_pos(int c) {
    int blk = c / 16, i = c % 16;
    return (blk / 8) * 128 + i * 8 + blk % 8;
}

static size_t polar_prep_floats(const vq_mparams *p) { return row_floats(p); }

/* Prepared rows: R q. For the AVX2 kernels in their coordinate order
 * (avx2_pos) and interleaved in fours, [g][i][row][8 blocks]: row r of a
 * group keeps coordinate c at 32 (avx2_pos(c) / 8) + 8 r + avx2_pos(c) % 8;
 * the leftover rows follow one by one. */
static void polar_prep_query(const vq_mparams *p, const float *q, int rows, float *prep) {
    int d = p->head_dim;
    size_t W = row_floats(p);
    bool perm = avx2_covered(p);
    float u[1024];
    for (int r = 0; r < rows; r++) {
        float *o = prep + (size_t)r * W;
        vq_rotate(p->rot, q + (size_t)r * d, perm ? u : o);
        if (!perm) continue;
        int r0 = r < rows / 4 * 4 ? r / 4 * 4 : r, w = r < rows / 4 * 4 ? 4 : 1; /* r's group of w rows */
        if (r == r0 && W > (size_t)d) memset(prep + (size_t)r0 * W, 0, sizeof(float) * W * (size_t)w);
        float *og = prep + (size_t)r0 * W + (size_t)(r - r0) * 8;
        for (int c = 0; c < d; c++) {
            int pos = avx2_pos(c);
            og[(size_t)(pos / 8) * 8 * w + pos % 8] = u[c];
        }
    }
}

static void polar_finish_rows(const vq_mparams *p, float *acc, int rows) {
    int d = p->head_dim;
    bool perm = avx2_covered(p);
    float u[1024];
    for (int r = 0; r < rows; r++) {
        float *a = acc + (size_t)r * row_floats(p);
        if (perm)
            for (int c = 0; c < d; c++) u[c] = a[avx2_pos(c)];
        vq_rotate_inverse(p->rot, perm ? u : a, a);
    }
}

static size_t polar_scratch(const vq_mparams *p, int rows) {
    (void)p;
    (void)rows;
    return 0;
}

static void polar_score(const vq_mparams *p, const float *q, int rows, const uint8_t *blk, int bt, int t0, int n,
                        float *logits, int ld, float *scratch) {
    int d = p->head_dim, B = 1 << p->levels, nb = n_blocks(p);
    const uint16_t *rad = (const uint16_t *)blk;
    (void)scratch;
    if (avx2_covered(p)) {
        if (vq_cpu_has_avx512())
            vq_polar_score_avx512(p->angle_cos, p->angle_sin, rad + (size_t)t0 * nb, codes_at(p, blk, bt, t0),
                                  code_bytes(p), d, n, q, rows, logits, ld);
        else
            vq_polar_score_avx2(p->angle_cos, p->angle_sin, rad + (size_t)t0 * nb, codes_at(p, blk, bt, t0),
                                code_bytes(p), d, n, q, rows, logits, ld);
        return;
    }
    float val[1024];
    for (int j = 0; j < n; j++) {
        int t = t0 + j;
        for (int r = 0; r < rows; r++) logits[(size_t)r * ld + j] = 0;
        for (int k = 0; k < nb; k++) {
            rebuild(p, codes_at(p, blk, bt, t), k, vq_f16_to_f32(rad[(size_t)t * nb + k]), val);
            for (int r = 0; r < rows; r++)
                logits[(size_t)r * ld + j] += vq_vec_dot(q + (size_t)r * d + k * B, val, B);
        }
    }
}

static void polar_accum(const vq_mparams *p, const float *w, int ld, int rows, const uint8_t *blk, int bt, int t0,
                        int n, float *acc, float *scratch) {
    int d = p->head_dim, B = 1 << p->levels, nb = n_blocks(p);
    const uint16_t *rad = (const uint16_t *)blk;
    (void)scratch;
    if (avx2_covered(p)) {
        if (vq_cpu_has_avx512())
            vq_polar_accum_avx512(p->angle_cos, p->angle_sin, rad + (size_t)t0 * nb, codes_at(p, blk, bt, t0),
                                  code_bytes(p), d, n, w, ld, rows, acc);
        else
            vq_polar_accum_avx2(p->angle_cos, p->angle_sin, rad + (size_t)t0 * nb, codes_at(p, blk, bt, t0),
                                code_bytes(p), d, n, w, ld, rows, acc);
        return;
    }
    float val[1024];
    for (int j = 0; j < n; j++) {
        int t = t0 + j;
        for (int k = 0; k < nb; k++) {
            rebuild(p, codes_at(p, blk, bt, t), k, vq_f16_to_f32(rad[(size_t)t * nb + k]), val);
            for (int r = 0; r < rows; r++) {
                float wt = w[(size_t)r * ld + j];
                if (wt != 0) vq_vec_axpy(wt, val, acc + (size_t)r * d + k * B, B);
            }
        }
    }
}

const vq_method vq_method_polar = {
    .name = "polar",
    .set_option = polar_set_option,
    .finish = polar_finish,
    .describe = polar_describe,
    .token_group = vq_token_group_one,
    .block_bytes = polar_block_bytes,
    .token_layout = polar_layout,
    .bits_per_elem = polar_bits,
    .encode = polar_encode,
    .decode = polar_decode,
    .prep_floats = polar_prep_floats,
    .prep_query = polar_prep_query,
    .finish_rows = polar_finish_rows,
    .acc_floats = row_floats,
    .scratch_floats = polar_scratch,
    .score = polar_score,
    .accum = polar_accum,
};
