/* AVX2 attention kernels of PolarQuant (methods/polarquant.c) for the
 * paper's setting: 4 levels with 4/2/2/2 angle bits, d a multiple of 16.
 * Built with -mavx2 -mfma -mf16c and only called after the CPU was checked.
 *
 * The 8 lanes of a register are 8 coordinate blocks of one token (16
 * coordinates each), so the polar tree is rebuilt for 8 blocks at once
 * with no per-block branching: the level-major code layout puts a block's
 * codes of one level in one lane (level 1: 32 bits, level 2: 8, level 3:
 * 4, level 4: 2). Going down the tree, every node multiplies its parent by
 * the cosine or sine of its angle, looked up in registers: 2-bit levels
 * with vpermilps on a 4-entry table in each 128-bit lane (it reads only the
 * index's low 2 bits, so the bits above the code need no mask, and it runs
 * at about twice the rate of vpermps on Zen 3), level 1 with vpermps on 8
 * entries. Level 1 has 16 uniform angles with a_(c+8) = a_c + pi, so
 * its 8-entry tables serve all 16 codes: bit 3 of the code flips the sign
 * (applied to the parent once for both children). No trigonometry and no
 * per-coordinate branching at attention time.
 *
 * Coordinate i of the 8 blocks of lane group g is one register; the
 * prepared query rows (keys) and the accumulator rows (values) hold their
 * coordinates in that order, [g][i][8 blocks] (polarquant.c's avx2_pos),
 * so nothing is transposed per call; the query rows are also interleaved
 * in fours, [g][i][row][8 blocks], so one pointer with constant offsets
 * reaches every row (a pointer per row ran out of registers). The node loops are unrolled by
 * pragma: GCC left them rolled, and unrolled measured 3 % faster. */
#include "reduce_avx2.h"
#include "vq_internal.h"

#include <immintrin.h>
#include <string.h>

#if defined(__GNUC__)
#define ALWAYS_INLINE inline __attribute__((always_inline))
#else
#define ALWAYS_INLINE inline
#endif

/* cos and sin tables by level (vq_mparams' angle_cos, angle_sin): level 1
 * angles 0..7; levels 2, 3, 4: their 4 angles, twice (the entries past a
 * level's count repeat it), so both 128-bit lanes hold the table. */
typedef struct {
    __m256 c1, s1, c2, s2, c3, s3, c4, s4;
} trig8;

static trig8 load_trig(const float cs[][16], const float sn[][16]) {
    trig8 r = {_mm256_loadu_ps(cs[0]), _mm256_loadu_ps(sn[0]), _mm256_loadu_ps(cs[1]), _mm256_loadu_ps(sn[1]),
               _mm256_loadu_ps(cs[2]), _mm256_loadu_ps(sn[2]), _mm256_loadu_ps(cs[3]), _mm256_loadu_ps(sn[3])};
    return r;
}

/* The codes of lane group g (blocks 8g..8g+7) of one token's codes c, nb
 * blocks in all: one lane per block, each level's codes in the low bits.
 * Level 4 starts at bit 44 nb of the token's stream: 4 bits into a byte
 * when nb is odd (d = 80). A last group of fewer than 8 blocks (d = 96:
 * 6) reads past its blocks' codes (into the token's later levels, the
 * next token, or the block's later arrays, never past the block); its
 * extra lanes get a radius of 0 (group_radius), so they rebuild to 0. */
typedef struct {
    __m256i l1, l2, l3, l4;
} codes8;

static ALWAYS_INLINE codes8 load_codes8(const uint8_t *c, int nb, int g, const bool ragged) {
    codes8 x;
    uint32_t u3;
    uint16_t u16;
    const int sh = ragged ? (44 * nb) % 8 : 0;
    const uint8_t *c4 = c + (44 * nb) / 8 + 2 * g;
    memcpy(&u3, c + 5 * nb + 4 * g, sizeof u3);
    memcpy(&u16, c4, sizeof u16);
    uint32_t u4 = u16;
    if (sh) u4 = (u4 | (uint32_t)c4[2] << 16) >> sh;
    x.l1 = _mm256_loadu_si256((const __m256i *)(c + 32 * g));
    x.l2 = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(c + 4 * nb + 8 * g)));
    x.l3 = _mm256_srlv_epi32(_mm256_set1_epi32((int)u3), _mm256_setr_epi32(0, 4, 8, 12, 16, 20, 24, 28));
    x.l4 = _mm256_srlv_epi32(_mm256_set1_epi32((int)u4), _mm256_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14));
    return x;
}

/* The radii of lane group g of a token (rad: its nb radii), 0 in the
 * lanes past the last block. */
static ALWAYS_INLINE __m256 group_radius(const uint16_t *rad, int nb, int g, const bool ragged) {
    __m256 r = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(rad + 8 * g)));
    if (!ragged || nb - 8 * g >= 8) return r;
    __m256i lanes = _mm256_cmpgt_epi32(_mm256_set1_epi32(nb - 8 * g), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
    return _mm256_and_ps(r, _mm256_castsi256_ps(lanes));
}

/* The radius times the cosines and sines of levels 4 and 3: the parents of
 * the 4 level-2 nodes. */
static ALWAYS_INLINE void top_levels(const trig8 *tr, const codes8 *x, __m256 rad, __m256 a3[4]) {
    __m256 a4[2] = {_mm256_mul_ps(rad, _mm256_permutevar_ps(tr->c4, x->l4)),
                    _mm256_mul_ps(rad, _mm256_permutevar_ps(tr->s4, x->l4))};
    for (int j = 0; j < 2; j++) {
        __m256i idx = _mm256_srli_epi32(x->l3, 2 * j);
        a3[2 * j] = _mm256_mul_ps(a4[j], _mm256_permutevar_ps(tr->c3, idx));
        a3[2 * j + 1] = _mm256_mul_ps(a4[j], _mm256_permutevar_ps(tr->s3, idx));
    }
}

/* The parents of level-1 nodes 2j and 2j + 1 from level-2 node j. */
static ALWAYS_INLINE void level2(const trig8 *tr, const codes8 *x, __m256 parent, int j, __m256 *p0, __m256 *p1) {
    __m256i idx = _mm256_srli_epi32(x->l2, 2 * j);
    *p0 = _mm256_mul_ps(parent, _mm256_permutevar_ps(tr->c2, idx));
    *p1 = _mm256_mul_ps(parent, _mm256_permutevar_ps(tr->s2, idx));
}

/* Coordinates 2j and 2j + 1 of the 8 blocks from level-1 node j. */
static ALWAYS_INLINE void leaf_pair(const trig8 *tr, const codes8 *x, __m256 parent, int j, __m256 *v0, __m256 *v1) {
    __m256i idx = _mm256_srli_epi32(x->l1, 4 * j);
    __m256 sign = _mm256_and_ps(_mm256_castsi256_ps(_mm256_slli_epi32(x->l1, 28 - 4 * j)), _mm256_set1_ps(-0.0f));
    __m256 f = _mm256_xor_ps(parent, sign);
    *v0 = _mm256_mul_ps(f, _mm256_permutevar8x32_ps(tr->c1, idx));
    *v1 = _mm256_mul_ps(f, _mm256_permutevar8x32_ps(tr->s1, idx));
}

static inline float hsum8(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

/* acc[r + 4 (i & 1)] += q_r . v for coordinates i = 2j, 2j + 1 of level-1
 * node j: two accumulators a row, so a row's FMA chain is 8 long per lane
 * group and the tree's work overlaps it (one chain of 16 held the loop at
 * the FMA latency). qg: the lane group's q, [i][r][8]. */
static ALWAYS_INLINE void score_node(const trig8 *tr, const codes8 *x, __m256 parent, int j, const float *qg, const int R,
                                     __m256 *acc) {
    __m256 v0, v1;
    leaf_pair(tr, x, parent, j, &v0, &v1);
    for (int r = 0; r < R; r++) {
        acc[r] = _mm256_fmadd_ps(_mm256_loadu_ps(qg + ((2 * j) * R + r) * 8), v0, acc[r]);
        acc[r + 4] = _mm256_fmadd_ps(_mm256_loadu_ps(qg + ((2 * j + 1) * R + r) * 8), v1, acc[r + 4]);
    }
}

/* logits[r][t0 + k] = the lane sum of part[r][k] for 4 rows and cnt <= 8
 * tokens: one transposing hadd tree per row and 8 tokens instead of one
 * per token. part: [row][token][8 lanes]. polar_avx512.c uses it too. */
void vq_polar_sum_parts(const float *part, int t0, int cnt, float *logits, int ld) {
    for (int r = 0; r < 4; r++) {
        const float *p = part + r * 64;
        __m256 v[8];
        for (int k = 0; k < 8; k++) v[k] = _mm256_loadu_ps(p + 8 * k);
        __m256 s = vq_sum8x8(v);
        float *l = logits + (size_t)r * ld + t0;
        if (cnt == 8) {
            _mm256_storeu_ps(l, s);
        } else {
            float o[8];
            _mm256_storeu_ps(o, s);
            memcpy(l, o, sizeof(float) * (size_t)cnt);
        }
    }
}

/* Scores n tokens for R rows (4 or 1, a constant) of q ([g][i][r][8]). */
static ALWAYS_INLINE void score_rows(const trig8 *tr, const uint16_t *rad, const uint8_t *codes, size_t cb, int d, int n,
                                     const float *q, const int R, const bool ragged, float *logits, int ld) {
    const int ng = (d / 16 + 7) / 8;
    int nb = d / 16;
    float part[4 * 8 * 8]; /* a short last group sums old or zero lanes, never stored */
    if (R == 4 && n % 8) memset(part, 0, sizeof part);
    for (int t = 0; t < n; t++) {
        const uint8_t *c = codes + (size_t)t * cb;
        __m256 acc[8];
        for (int r = 0; r < 8; r++) acc[r] = _mm256_setzero_ps();
        for (int g = 0; g < ng; g++) {
            codes8 x = load_codes8(c, nb, g, ragged);
            __m256 a3[4];
            top_levels(tr, &x, group_radius(rad + (size_t)t * nb, nb, g, ragged), a3);
            const float *qg = q + (size_t)g * 128 * R;
#pragma GCC unroll 4
            for (int j = 0; j < 4; j++) {
                __m256 p0, p1;
                level2(tr, &x, a3[j], j, &p0, &p1);
                score_node(tr, &x, p0, 2 * j, qg, R, acc);
                score_node(tr, &x, p1, 2 * j + 1, qg, R, acc);
            }
        }
        if (R == 1) {
            logits[t] = hsum8(_mm256_add_ps(acc[0], acc[4]));
        } else {
            for (int r = 0; r < 4; r++) _mm256_storeu_ps(part + (r * 8 + t % 8) * 8, _mm256_add_ps(acc[r], acc[r + 4]));
            if (t % 8 == 7 || t == n - 1) vq_polar_sum_parts(part, t - t % 8, t % 8 + 1, logits, ld);
        }
    }
}

void vq_polar_score_avx2(const float cs[][16], const float sn[][16], const uint16_t *rad, const uint8_t *codes,
                         size_t cb, int d, int n, const float *q, int rows, float *logits, int ld) {
    trig8 tr = load_trig(cs, sn);
    const size_t w = (size_t)(d + 127) / 128 * 128; /* q's row stride: whole lane groups */
    int r = 0;
    /* d a multiple of 128 (whole lane groups) has an instance of its own
     * without the last group's masks (with them, d = 128 took about 5 %
     * more time at the AVX2 level) */
    const bool ragged = d % 128 != 0;
    for (; r + 4 <= rows; r += 4) {
        if (ragged) score_rows(&tr, rad, codes, cb, d, n, q + r * w, 4, true, logits + (size_t)r * ld, ld);
        else score_rows(&tr, rad, codes, cb, d, n, q + r * w, 4, false, logits + (size_t)r * ld, ld);
    }
    for (; r < rows; r++) {
        if (ragged) score_rows(&tr, rad, codes, cb, d, n, q + r * w, 1, true, logits + (size_t)r * ld, ld);
        else score_rows(&tr, rad, codes, cb, d, n, q + r * w, 1, false, logits + (size_t)r * ld, ld);
    }
}

/* Tokens per pass of the value kernel (their level-1 parents on the stack:
 * 9 KB). */
#define VTOKENS 32

/* The level-1 parents of lane group g for tokens [0, cnt): par[8 t + j] =
 * level-1 node j's parent with the sign of its code's bit 3 applied, l1[t]
 * the token's level-1 codes. */
static ALWAYS_INLINE void parents(const trig8 *tr, const uint16_t *rad, const uint8_t *codes, size_t cb, int nb, int g,
                                  const bool ragged,
                                  int cnt, __m256 *par, __m256i *l1) {
    for (int t = 0; t < cnt; t++) {
        codes8 x = load_codes8(codes + (size_t)t * cb, nb, g, ragged);
        __m256 a3[4], *pt = par + 8 * t;
        top_levels(tr, &x, group_radius(rad + (size_t)t * nb, nb, g, ragged), a3);
        for (int j = 0; j < 4; j++) level2(tr, &x, a3[j], j, &pt[2 * j], &pt[2 * j + 1]);
        for (int j = 0; j < 8; j++) {
            __m256 bit3 = _mm256_castsi256_ps(_mm256_slli_epi32(x.l1, 28 - 4 * j));
            pt[j] = _mm256_xor_ps(pt[j], _mm256_and_ps(bit3, _mm256_set1_ps(-0.0f)));
        }
        l1[t] = x.l1;
    }
}

/* acc_r[coordinates 2j, 2j + 1 of the lane group] += sum_t w_r,t v_t for
 * tokens [0, cnt) and R rows (4 or 1): the 2 R sums stay in registers over
 * the tokens and meet memory once. acc: the lane group's accumulators of
 * row 0, [i][8 blocks], rows d apart; w rows ld apart. */
static ALWAYS_INLINE void accum_node(const trig8 *tr, const __m256 *par, const __m256i *l1, int j, int cnt,
                                     const float *w, int ld, const int R, float *acc, int d) {
    __m256 a[8];
    for (int i = 0; i < 2 * R; i++) a[i] = _mm256_setzero_ps();
    for (int t = 0; t < cnt; t++) {
        __m256i idx = _mm256_srli_epi32(l1[t], 4 * j);
        __m256 f = par[8 * t + j];
        __m256 v0 = _mm256_mul_ps(f, _mm256_permutevar8x32_ps(tr->c1, idx));
        __m256 v1 = _mm256_mul_ps(f, _mm256_permutevar8x32_ps(tr->s1, idx));
        for (int r = 0; r < R; r++) {
            __m256 wv = _mm256_broadcast_ss(w + (size_t)r * ld + t);
            a[2 * r] = _mm256_fmadd_ps(wv, v0, a[2 * r]);
            a[2 * r + 1] = _mm256_fmadd_ps(wv, v1, a[2 * r + 1]);
        }
    }
    for (int r = 0; r < R; r++) {
        float *p = acc + (size_t)r * d + 16 * j;
        _mm256_storeu_ps(p, _mm256_add_ps(_mm256_loadu_ps(p), a[2 * r]));
        _mm256_storeu_ps(p + 8, _mm256_add_ps(_mm256_loadu_ps(p + 8), a[2 * r + 1]));
    }
}

/* R rows (4 or 1) of acc (d apart, in the kernels' coordinate order): per
 * lane group and pass of VTOKENS tokens, the tree down to level 2 once per
 * token (parents), then the leaves level-1 node by node with the node's
 * sums in registers (accum_node), so the accumulators are not loaded and
 * stored for every token. */
static ALWAYS_INLINE void accum_rows(const trig8 *tr, const uint16_t *rad, const uint8_t *codes, size_t cb, int d, int n,
                                     const float *w, int ld, const int R, float *acc, int aw) {
    int nb = d / 16;
    __m256 par[8 * VTOKENS];
    __m256i l1[VTOKENS];
    for (int g = 0; g < (nb + 7) / 8; g++)
        for (int t0 = 0; t0 < n; t0 += VTOKENS) {
            int cnt = n - t0 < VTOKENS ? n - t0 : VTOKENS;
            parents(tr, rad + (size_t)t0 * nb, codes + (size_t)t0 * cb, cb, nb, g, nb % 8 != 0, cnt, par, l1);
            for (int j = 0; j < 8; j++) accum_node(tr, par, l1, j, cnt, w + t0, ld, R, acc + (size_t)g * 128, aw);
        }
}

void vq_polar_accum_avx2(const float cs[][16], const float sn[][16], const uint16_t *rad, const uint8_t *codes,
                         size_t cb, int d, int n, const float *w, int ld, int rows, float *acc) {
    trig8 tr = load_trig(cs, sn);
    const size_t aw = (size_t)(d + 127) / 128 * 128; /* acc's row stride: whole lane groups */
    int r = 0;
    for (; r + 4 <= rows; r += 4) accum_rows(&tr, rad, codes, cb, d, n, w + (size_t)r * ld, ld, 4, acc + r * aw, (int)aw);
    for (; r < rows; r++) accum_rows(&tr, rad, codes, cb, d, n, w + (size_t)r * ld, ld, 1, acc + r * aw, (int)aw);
}
