/* polar_avx2.c's PolarQuant kernels (4 levels, 4/2/2/2 angle bits, d a
 * multiple of 16, a last lane group of fewer than 8 blocks masked as
 * there) with two tokens a register: lanes 0-7 hold the 8
 * coordinate blocks of a lane group for one token, lanes 8-15 the same
 * blocks of the next token, so every instruction rebuilds and uses twice
 * the coordinates. The prepared query rows and the accumulator rows keep
 * polar_avx2.c's coordinate order (polarquant.c's avx2_pos); a query's 8
 * blocks are broadcast to both halves, and the values' two halves are
 * added before they meet memory. Level 1 looks its 16 angles up whole with
 * vpermps (its table holds a_(c+8) = a_c + pi already), where the AVX2
 * kernel looks up 8 and flips the sign: the same products. Built with the
 * AVX-512 flags and only called at the avx512 CPU level. */
#include "reduce_avx512.h"
#include "vq_internal.h"

#include <immintrin.h>
#include <string.h>

#if defined(__GNUC__)
#define ALWAYS_INLINE inline __attribute__((always_inline))
#else
#define ALWAYS_INLINE inline
#endif

/* cos and sin tables by level (vq_mparams' angle_cos, angle_sin: 16
 * entries each, a level's table repeated past its count). */
typedef struct {
    __m512 c1, s1, c2, s2, c3, s3, c4, s4;
} trig16;

static trig16 load_trig(const float cs[][16], const float sn[][16]) {
    trig16 r = {_mm512_loadu_ps(cs[0]), _mm512_loadu_ps(sn[0]), _mm512_loadu_ps(cs[1]), _mm512_loadu_ps(sn[1]),
                _mm512_loadu_ps(cs[2]), _mm512_loadu_ps(sn[2]), _mm512_loadu_ps(cs[3]), _mm512_loadu_ps(sn[3])};
    return r;
}

/* Two 8-lane halves as one vector. */
static ALWAYS_INLINE __m512i join_i(__m256i lo, __m256i hi) {
    return _mm512_inserti64x4(_mm512_castsi256_si512(lo), hi, 1);
}

/* The 8 floats at p in both halves. */
static ALWAYS_INLINE __m512 both_halves(const float *p) {
    return _mm512_castpd_ps(_mm512_broadcast_f64x4(_mm256_loadu_pd((const double *)p)));
}

/* The codes of lane group g (blocks 8g..8g+7) of tokens a and b, nb blocks
 * a token: one lane per block and token, each level's codes in the low
 * bits (polar_avx2.c's load_codes8 for two tokens). */
typedef struct {
    __m512i l1, l2, l3, l4;
} codes16;

static ALWAYS_INLINE uint32_t level4_bits(const uint8_t *c, int nb, int g, const bool ragged) {
    const int sh = ragged ? (44 * nb) % 8 : 0; /* level 4 starts at bit 44 nb */
    const uint8_t *c4 = c + (44 * nb) / 8 + 2 * g;
    uint16_t u16;
    memcpy(&u16, c4, sizeof u16);
    return sh ? ((uint32_t)u16 | (uint32_t)c4[2] << 16) >> sh : u16;
}

static ALWAYS_INLINE codes16 load_codes16(const uint8_t *a, const uint8_t *b, int nb, int g, const bool ragged) {
    codes16 x;
    uint32_t u3a, u3b;
    memcpy(&u3a, a + 5 * nb + 4 * g, sizeof u3a);
    memcpy(&u3b, b + 5 * nb + 4 * g, sizeof u3b);
    uint32_t u4a = level4_bits(a, nb, g, ragged), u4b = level4_bits(b, nb, g, ragged);
    x.l1 = join_i(_mm256_loadu_si256((const __m256i *)(a + 32 * g)), _mm256_loadu_si256((const __m256i *)(b + 32 * g)));
    x.l2 = _mm512_cvtepu8_epi32(_mm_unpacklo_epi64(_mm_loadl_epi64((const __m128i *)(a + 4 * nb + 8 * g)),
                                                   _mm_loadl_epi64((const __m128i *)(b + 4 * nb + 8 * g))));
    const __m512i sh3 = _mm512_setr_epi32(0, 4, 8, 12, 16, 20, 24, 28, 0, 4, 8, 12, 16, 20, 24, 28);
    const __m512i sh4 = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 0, 2, 4, 6, 8, 10, 12, 14);
    x.l3 = _mm512_srlv_epi32(join_i(_mm256_set1_epi32((int)u3a), _mm256_set1_epi32((int)u3b)), sh3);
    x.l4 = _mm512_srlv_epi32(join_i(_mm256_set1_epi32((int)u4a), _mm256_set1_epi32((int)u4b)), sh4);
    return x;
}

/* The radii of lane group g of tokens a and b (fp16, nb a token), 0 in
 * the lanes past the last block. */
static ALWAYS_INLINE __m512 load_rad16(const uint16_t *ra, const uint16_t *rb, int nb, int g, const bool ragged) {
    __m256i h = _mm256_set_m128i(_mm_loadu_si128((const __m128i *)(rb + 8 * g)),
                                 _mm_loadu_si128((const __m128i *)(ra + 8 * g)));
    __m512 r = _mm512_cvtph_ps(h);
    if (!ragged || nb - 8 * g >= 8) return r;
    const __mmask16 half = (__mmask16)((1u << (nb - 8 * g)) - 1);
    return _mm512_maskz_mov_ps((__mmask16)(half | half << 8), r);
}

/* The radius times the cosines and sines of levels 4 and 3: the parents of
 * the 4 level-2 nodes. */
static ALWAYS_INLINE void top_levels(const trig16 *tr, const codes16 *x, __m512 rad, __m512 a3[4]) {
    __m512 a4[2] = {_mm512_mul_ps(rad, _mm512_permutevar_ps(tr->c4, x->l4)),
                    _mm512_mul_ps(rad, _mm512_permutevar_ps(tr->s4, x->l4))};
    for (int j = 0; j < 2; j++) {
        __m512i idx = _mm512_srli_epi32(x->l3, 2 * j);
        a3[2 * j] = _mm512_mul_ps(a4[j], _mm512_permutevar_ps(tr->c3, idx));
        a3[2 * j + 1] = _mm512_mul_ps(a4[j], _mm512_permutevar_ps(tr->s3, idx));
    }
}

/* The parents of level-1 nodes 2j and 2j + 1 from level-2 node j. */
static ALWAYS_INLINE void level2(const trig16 *tr, const codes16 *x, __m512 parent, int j, __m512 *p0, __m512 *p1) {
    __m512i idx = _mm512_srli_epi32(x->l2, 2 * j);
    *p0 = _mm512_mul_ps(parent, _mm512_permutevar_ps(tr->c2, idx));
    *p1 = _mm512_mul_ps(parent, _mm512_permutevar_ps(tr->s2, idx));
}

/* Coordinates 2j and 2j + 1 of the 16 blocks from level-1 node j (its
 * code: bits 4j.. of l1). */
static ALWAYS_INLINE void leaf_pair(const trig16 *tr, __m512i l1, __m512 parent, int j, __m512 *v0, __m512 *v1) {
    __m512i idx = _mm512_srli_epi32(l1, 4 * j);
    *v0 = _mm512_mul_ps(parent, _mm512_permutexvar_ps(idx, tr->c1));
    *v1 = _mm512_mul_ps(parent, _mm512_permutexvar_ps(idx, tr->s1));
}

/* q's 8 or 16 floats at p as a register of T tokens: the 8 blocks in both
 * halves (T = 2), the first 4 in the four quarters (T = 4), or already
 * spread to three tokens' lanes (T = 3, 16 floats, see spread_q). */
static ALWAYS_INLINE __m512 q_lanes(const float *p, const int T) {
    if (T == 4) return _mm512_broadcast_f32x4(_mm_loadu_ps(p));
    if (T == 3) return _mm512_loadu_ps(p);
    return both_halves(p);
}

/* acc[r + 4 (i & 1)] += q_r . v for coordinates i = 2j, 2j + 1 of level-1
 * node j (polar_avx2.c's score_node). qg: the lane group's q, [i][r][8]
 * ([i][r][16] for T = 3), see q_lanes. */
static ALWAYS_INLINE void score_node(const trig16 *tr, const codes16 *x, __m512 parent, int j, const float *qg,
                                     const int R, const int T, __m512 *acc) {
    __m512 v0, v1;
    leaf_pair(tr, x->l1, parent, j, &v0, &v1);
    const int w = T == 3 ? 16 : 8;
    for (int r = 0; r < R; r++) {
        acc[r] = _mm512_fmadd_ps(q_lanes(qg + ((2 * j) * R + r) * w, T), v0, acc[r]);
        acc[r + 4] = _mm512_fmadd_ps(q_lanes(qg + ((2 * j + 1) * R + r) * w, T), v1, acc[r + 4]);
    }
}

static inline float hsum8(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

static ALWAYS_INLINE __m256 lo_half(__m512 v) { return _mm512_castps512_ps256(v); }
static ALWAYS_INLINE __m256 hi_half(__m512 v) {
    return _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1));
}

/* logits[r][t0 + k] = the lane sum of part[r][k] for 4 rows and cnt <= 8
 * tokens (polar_avx2.c). part: [row][token][8 lanes]. */
void vq_polar_sum_parts(const float *part, int t0, int cnt, float *logits, int ld);

/* Scores n tokens for R rows (4 or 1) of q ([g][i][r][8]), two tokens a
 * step (an odd last token paired with itself, its second copy unused). */
static ALWAYS_INLINE void score_rows(const trig16 *tr, const uint16_t *rad, const uint8_t *codes, size_t cb, int d,
                                     int n, const float *q, const int R, const bool ragged, float *logits, int ld) {
    int nb = d / 16;
    float part[4 * 8 * 8]; /* a short last group sums old or zero lanes, never stored */
    if (R == 4 && n % 8) memset(part, 0, sizeof part);
    for (int t = 0; t < n; t += 2) {
        const int tb = t + 1 < n ? t + 1 : t;
        const uint8_t *ca = codes + (size_t)t * cb, *cbt = codes + (size_t)tb * cb;
        __m512 acc[8];
        for (int r = 0; r < 8; r++) acc[r] = _mm512_setzero_ps();
        for (int g = 0; g < (nb + 7) / 8; g++) {
            codes16 x = load_codes16(ca, cbt, nb, g, ragged);
            __m512 a3[4];
            top_levels(tr, &x, load_rad16(rad + (size_t)t * nb, rad + (size_t)tb * nb, nb, g, ragged), a3);
            const float *qg = q + (size_t)g * 128 * R;
#pragma GCC unroll 4
            for (int j = 0; j < 4; j++) {
                __m512 p0, p1;
                level2(tr, &x, a3[j], j, &p0, &p1);
                score_node(tr, &x, p0, 2 * j, qg, R, 2, acc);
                score_node(tr, &x, p1, 2 * j + 1, qg, R, 2, acc);
            }
        }
        if (R == 1) {
            __m512 s = _mm512_add_ps(acc[0], acc[4]);
            logits[t] = hsum8(lo_half(s));
            if (tb != t) logits[tb] = hsum8(hi_half(s));
        } else {
            for (int r = 0; r < 4; r++) {
                __m512 s = _mm512_add_ps(acc[r], acc[r + 4]);
                _mm256_storeu_ps(part + (r * 8 + t % 8) * 8, lo_half(s));
                _mm256_storeu_ps(part + (r * 8 + t % 8 + 1) * 8, hi_half(s));
            }
            if (t % 8 == 6 || t + 2 >= n)
                vq_polar_sum_parts(part, t - t % 8, (t + 2 < n ? t + 2 : n) - (t - t % 8), logits, ld);
        }
    }
}

/* ---------------------------------------- four tokens a register, d <= 64 */

/* At d = 48 or 64 a lane group holds 3 or 4 coordinate blocks, so two
 * tokens a register leave half the lanes or more holding zeros: d = 64 cost
 * what d = 128 costs (21.6 against 22.3 ns per token and kv head in cache).
 * There lanes 4 k .. 4 k + 3 hold the blocks of token k of four; q's 4
 * blocks are broadcast to the four quarters. Tokens past the count repeat
 * the last one: their logits are not stored, their weights are 0. */

/* The index vector that gives lane 4 k + i element k. */
static ALWAYS_INLINE __m512i spread4(void) { return _mm512_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3); }

/* The 32-bit words at tk[k] + off of T = 3 or 4 tokens as one vector (lane
 * 3: 0 for T = 3), built in registers (four scalar stores read back as one
 * vector cannot be forwarded: that stall was most of this kernel's time). */
static ALWAYS_INLINE __m128i words(const uint8_t *const *tk, const int T, int off) {
    int32_t w[4] = {0, 0, 0, 0};
    for (int k = 0; k < T; k++) memcpy(&w[k], tk[k] + off, sizeof w[k]);
    __m128i v = _mm_cvtsi32_si128(w[0]);
    v = _mm_insert_epi32(v, w[1], 1);
    v = _mm_insert_epi32(v, w[2], 2);
    return T == 4 ? _mm_insert_epi32(v, w[3], 3) : v;
}

/* The codes of four tokens (nb <= 4 blocks each). The 32-bit words of
 * levels 3 and 4 read up to 3 bytes past a token's codes (18 bytes at
 * nb = 3, 23 at nb = 4): into the next token's, or for a block's last
 * token into what follows in the block (the value part after the keys,
 * the token positions after the values). */
static ALWAYS_INLINE codes16 load_codes_q(const uint8_t *const *tk, int nb) {
    codes16 x;
    __m512i l1 = _mm512_castsi128_si512(_mm_loadu_si128((const __m128i *)tk[0]));
    l1 = _mm512_inserti32x4(l1, _mm_loadu_si128((const __m128i *)tk[1]), 1);
    l1 = _mm512_inserti32x4(l1, _mm_loadu_si128((const __m128i *)tk[2]), 2);
    x.l1 = _mm512_inserti32x4(l1, _mm_loadu_si128((const __m128i *)tk[3]), 3);
    x.l2 = _mm512_cvtepu8_epi32(words(tk, 4, 4 * nb));
    /* level 4 starts at bit 44 nb: a 32-bit word from its byte, shifted */
    __m128i u4 = _mm_srli_epi32(words(tk, 4, 44 * nb / 8), (44 * nb) % 8);
    const __m512i sh3 = _mm512_setr_epi32(0, 4, 8, 12, 0, 4, 8, 12, 0, 4, 8, 12, 0, 4, 8, 12);
    const __m512i sh4 = _mm512_setr_epi32(0, 2, 4, 6, 0, 2, 4, 6, 0, 2, 4, 6, 0, 2, 4, 6);
    x.l3 = _mm512_srlv_epi32(_mm512_permutexvar_epi32(spread4(), _mm512_castsi128_si512(words(tk, 4, 5 * nb))), sh3);
    x.l4 = _mm512_srlv_epi32(_mm512_permutexvar_epi32(spread4(), _mm512_castsi128_si512(u4)), sh4);
    return x;
}

/* The radii of four tokens (token indices tk, nb halves each), 0 in the
 * lanes past a token's blocks. */
static ALWAYS_INLINE __m512 load_rad_q(const uint16_t *rad, const int *tk, int nb) {
    const __mmask8 m = (__mmask8)((1u << nb) - 1);
    __m128i r01 = _mm_unpacklo_epi64(_mm_maskz_loadu_epi16(m, rad + (size_t)tk[0] * nb),
                                     _mm_maskz_loadu_epi16(m, rad + (size_t)tk[1] * nb));
    __m128i r23 = _mm_unpacklo_epi64(_mm_maskz_loadu_epi16(m, rad + (size_t)tk[2] * nb),
                                     _mm_maskz_loadu_epi16(m, rad + (size_t)tk[3] * nb));
    return _mm512_cvtph_ps(_mm256_set_m128i(r23, r01));
}

/* The T tokens from t (the last one repeated past n). */
static ALWAYS_INLINE void group_tokens(const uint8_t *codes, size_t cb, int t, int n, const int T, int *tk,
                                      const uint8_t **ck) {
    for (int k = 0; k < T; k++) {
        tk[k] = t + k < n ? t + k : n - 1;
        ck[k] = codes + (size_t)tk[k] * cb;
    }
}

/* Sums each quarter of v: lane 4 k (and every lane of quarter k) holds
 * quarter k's sum. */
static ALWAYS_INLINE __m512 quarter_sums(__m512 v) {
    v = _mm512_add_ps(v, _mm512_permute_ps(v, 0x4E));
    return _mm512_add_ps(v, _mm512_permute_ps(v, 0xB1));
}

/* ---------------------------------------- three tokens a register, d = 80 */

/* At d = 80 a lane group holds 5 coordinate blocks, so two tokens a
 * register fill 10 of its 16 lanes (28.0 ns per token and kv head in
 * cache, against 22.8 for this form). There lanes 5 k .. 5 k + 4 hold the
 * blocks of token k of three; lane 15 (radius 0) is never summed.
 * q's rows are spread to the same lanes once a call (spread_q). Tokens
 * past the count repeat the last one: their logits are not stored, their
 * weights are 0. */

/* Lane j gets lane j + k mod 16 (valignd: the shift is an immediate). */
static ALWAYS_INLINE __m512 rotate_lanes(__m512 v, const int k) {
    __m512i x = _mm512_castps_si512(v);
    return _mm512_castsi512_ps(_mm512_alignr_epi32(x, x, k));
}

/* Lane 5 k + i gets element k (lane 15: element 3). */
static ALWAYS_INLINE __m512i spread3(void) { return _mm512_setr_epi32(0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 2, 2, 2, 2, 2, 3); }

/* Lane 5 k + i gets element i (lane 15: element 5). */
static ALWAYS_INLINE __m512i blocks3(void) { return _mm512_setr_epi32(0, 1, 2, 3, 4, 0, 1, 2, 3, 4, 0, 1, 2, 3, 4, 5); }

/* The codes of three tokens of 5 blocks (28 bytes each). Like the two-token
 * loads, the 32-byte read of level 1 and the words of levels 3 and 4 pass a
 * token's end by up to 4 bytes: into the next token, or for a block's last
 * token into what follows in the block. */
static ALWAYS_INLINE codes16 load_codes_t(const uint8_t *const *tk) {
    codes16 x;
    const __m512i i01 = _mm512_setr_epi32(0, 1, 2, 3, 4, 16, 17, 18, 19, 20, 0, 0, 0, 0, 0, 0);
    const __m512i i2 = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 16, 17, 18, 19, 20, 0);
    __m512i a = _mm512_castsi256_si512(_mm256_loadu_si256((const __m256i *)tk[0]));
    __m512i b = _mm512_castsi256_si512(_mm256_loadu_si256((const __m256i *)tk[1]));
    __m512i c = _mm512_castsi256_si512(_mm256_loadu_si256((const __m256i *)tk[2]));
    x.l1 = _mm512_permutex2var_epi32(_mm512_permutex2var_epi32(a, i01, b), i2, c);
    /* level 2: a byte a block from byte 20 */
    const __m128i c01 = _mm_setr_epi8(0, 1, 2, 3, 4, 8, 9, 10, 11, 12, -1, -1, -1, -1, -1, -1);
    const __m128i c2 = _mm_setr_epi8(-1, -1, -1, -1, -1, -1, -1, -1, -1, -1, 0, 1, 2, 3, 4, -1);
    __m128i b01 = _mm_unpacklo_epi64(_mm_loadl_epi64((const __m128i *)(tk[0] + 20)),
                                     _mm_loadl_epi64((const __m128i *)(tk[1] + 20)));
    __m128i b2 = _mm_loadl_epi64((const __m128i *)(tk[2] + 20));
    x.l2 = _mm512_cvtepu8_epi32(_mm_or_si128(_mm_shuffle_epi8(b01, c01), _mm_shuffle_epi8(b2, c2)));
    /* level 3 from byte 25, level 4 from bit 220 (byte 27, bit 4) */
    const __m512i sh3 = _mm512_setr_epi32(0, 4, 8, 12, 16, 0, 4, 8, 12, 16, 0, 4, 8, 12, 16, 0);
    const __m512i sh4 = _mm512_setr_epi32(0, 2, 4, 6, 8, 0, 2, 4, 6, 8, 0, 2, 4, 6, 8, 0);
    x.l3 = _mm512_srlv_epi32(_mm512_permutexvar_epi32(spread3(), _mm512_castsi128_si512(words(tk, 3, 25))), sh3);
    __m128i u4 = _mm_srli_epi32(words(tk, 3, 27), 4);
    x.l4 = _mm512_srlv_epi32(_mm512_permutexvar_epi32(spread3(), _mm512_castsi128_si512(u4)), sh4);
    return x;
}

/* The radii of three tokens (token indices tk, 5 halves each); lane 15 0. */
static ALWAYS_INLINE __m512 load_rad_t(const uint16_t *rad, const int *tk) {
    const __mmask8 m = 0x1F;
    __m256i r01 = _mm256_set_m128i(_mm_maskz_loadu_epi16(m, rad + (size_t)tk[1] * 5),
                                   _mm_maskz_loadu_epi16(m, rad + (size_t)tk[0] * 5));
    __m256i r2 = _mm256_castsi128_si256(_mm_maskz_loadu_epi16(m, rad + (size_t)tk[2] * 5));
    const __m256i idx = _mm256_setr_epi16(0, 1, 2, 3, 4, 8, 9, 10, 11, 12, 16, 17, 18, 19, 20, 5);
    return _mm512_cvtph_ps(_mm256_permutex2var_epi16(r01, idx, r2));
}

/* R rows of prepared q (lane group 0, [i][r][8]) spread to the three
 * tokens' lanes: qs[(i R + r) 16 + 5 k + b] = block b of coordinate i;
 * lane 15 gets block 5, which the prepared rows pad with 0. */
static void spread_q(const float *q, const int R, float *qs) {
    for (int i = 0; i < 16 * R; i++)
        _mm512_storeu_ps(qs + 16 * i,
                         _mm512_permutexvar_ps(blocks3(), _mm512_castps256_ps512(_mm256_loadu_ps(q + 8 * i))));
}

/* The codes and the radii of T tokens (four at d <= 64, three at d = 80). */
static ALWAYS_INLINE codes16 load_codes_g(const uint8_t *const *ck, int nb, const int T) {
    return T == 4 ? load_codes_q(ck, nb) : load_codes_t(ck);
}
static ALWAYS_INLINE __m512 load_rad_g(const uint16_t *rad, const int *tk, int nb, const int T) {
    return T == 4 ? load_rad_q(rad, tk, nb) : load_rad_t(rad, tk);
}

/* The T tokens' sums of s in lanes 0 .. T - 1: per quarter (T = 4), or per
 * five lanes by rotations by an immediate (T = 3: no index vectors held in
 * registers). */
static ALWAYS_INLINE __m128 token_sums(__m512 s, const int T) {
    if (T == 4) {
        const __m512i firsts = _mm512_setr_epi32(0, 4, 8, 12, 0, 4, 8, 12, 0, 4, 8, 12, 0, 4, 8, 12);
        return _mm512_castps512_ps128(_mm512_permutexvar_ps(firsts, quarter_sums(s)));
    }
    __m512 u = _mm512_add_ps(s, rotate_lanes(s, 1));
    u = _mm512_add_ps(u, rotate_lanes(u, 2));
    u = _mm512_add_ps(u, rotate_lanes(s, 4)); /* lane 5 k: lanes 5 k .. 5 k + 4 */
    return _mm512_castps512_ps128(_mm512_maskz_compress_ps(0x0421, u));
}

/* Scores n tokens for R rows, T tokens a register (q: the rows in q_lanes'
 * layout for T). */
static ALWAYS_INLINE void score_group(const trig16 *tr, const uint16_t *rad, const uint8_t *codes, size_t cb, int nb,
                                      int n, const float *q, const int R, const int T, float *logits, int ld) {
    for (int t = 0; t < n; t += T) {
        int tk[4];
        const uint8_t *ck[4];
        group_tokens(codes, cb, t, n, T, tk, ck);
        codes16 x = load_codes_g(ck, nb, T);
        __m512 acc[8], a3[4];
        for (int r = 0; r < 8; r++) acc[r] = _mm512_setzero_ps();
        top_levels(tr, &x, load_rad_g(rad, tk, nb, T), a3);
#pragma GCC unroll 4
        for (int j = 0; j < 4; j++) {
            __m512 p0, p1;
            level2(tr, &x, a3[j], j, &p0, &p1);
            score_node(tr, &x, p0, 2 * j, q, R, T, acc);
            score_node(tr, &x, p1, 2 * j + 1, q, R, T, acc);
        }
        const __mmask8 keep = (__mmask8)((1u << (n - t < T ? n - t : T)) - 1);
        for (int r = 0; r < R; r++)
            _mm_mask_storeu_ps(logits + (size_t)r * ld + t, keep, token_sums(_mm512_add_ps(acc[r], acc[r + 4]), T));
    }
}

void vq_polar_score_avx512(const float cs[][16], const float sn[][16], const uint16_t *rad, const uint8_t *codes,
                           size_t cb, int d, int n, const float *q, int rows, float *logits, int ld) {
    trig16 tr = load_trig(cs, sn);
    const size_t w = (size_t)(d + 127) / 128 * 128; /* q's row stride: whole lane groups */
    const bool ragged = d % 128 != 0;                /* an instance of its own, as in polar_avx2.c */
    int r = 0;
    const int nb = d / 16;
    if (d <= 64) { /* four tokens a register */
        for (; r + 4 <= rows; r += 4) score_group(&tr, rad, codes, cb, nb, n, q + r * w, 4, 4, logits + (size_t)r * ld, ld);
        for (; r < rows; r++) score_group(&tr, rad, codes, cb, nb, n, q + r * w, 1, 4, logits + (size_t)r * ld, ld);
        return;
    }
    if (d == 80) { /* three tokens a register */
        float qs[16 * 4 * 16];
        for (; r + 4 <= rows; r += 4) {
            spread_q(q + r * w, 4, qs);
            score_group(&tr, rad, codes, cb, nb, n, qs, 4, 3, logits + (size_t)r * ld, ld);
        }
        for (; r < rows; r++) {
            spread_q(q + r * w, 1, qs);
            score_group(&tr, rad, codes, cb, nb, n, qs, 1, 3, logits + (size_t)r * ld, ld);
        }
        return;
    }
    for (; r + 4 <= rows; r += 4) {
        if (ragged) score_rows(&tr, rad, codes, cb, d, n, q + r * w, 4, true, logits + (size_t)r * ld, ld);
        else score_rows(&tr, rad, codes, cb, d, n, q + r * w, 4, false, logits + (size_t)r * ld, ld);
    }
    for (; r < rows; r++) {
        if (ragged) score_rows(&tr, rad, codes, cb, d, n, q + r * w, 1, true, logits + (size_t)r * ld, ld);
        else score_rows(&tr, rad, codes, cb, d, n, q + r * w, 1, false, logits + (size_t)r * ld, ld);
    }
}

/* Token pairs per pass of the value kernel (their level-1 parents on the
 * stack: 8 KB). */
#define VPAIRS 16

/* The level-1 parents of lane group g for token pairs [0, np) (tokens
 * [0, cnt)): par[8 p + j] = level-1 node j's parent, l1[p] the pair's
 * level-1 codes; an odd last token is paired with itself. */
static ALWAYS_INLINE void parents(const trig16 *tr, const uint16_t *rad, const uint8_t *codes, size_t cb, int nb, int g,
                                  const bool ragged, int cnt, __m512 *par, __m512i *l1) {
    for (int t = 0; t < cnt; t += 2) {
        const int tb = t + 1 < cnt ? t + 1 : t;
        codes16 x = load_codes16(codes + (size_t)t * cb, codes + (size_t)tb * cb, nb, g, ragged);
        __m512 a3[4], *pt = par + 4 * t;
        top_levels(tr, &x, load_rad16(rad + (size_t)t * nb, rad + (size_t)tb * nb, nb, g, ragged), a3);
        for (int j = 0; j < 4; j++) level2(tr, &x, a3[j], j, &pt[2 * j], &pt[2 * j + 1]);
        l1[t / 2] = x.l1;
    }
}

/* acc_r[coordinates 2j, 2j + 1 of the lane group] += sum_t w_r,t v_t over
 * np registers of T tokens each (2, or 4 at d <= 64) and R rows (4 or 1):
 * the 2 R sums stay in registers, their halves or quarters (the tokens)
 * are added once at the end. wp: the rows' weights of each register, [r][p]
 * vectors (each token's in its half or quarter). */
static ALWAYS_INLINE void accum_node(const trig16 *tr, const __m512 *par, const __m512i *l1, int j, int np,
                                     const __m512 *wp, const int R, const int T, float *acc, int d) {
    __m512 a[8];
    for (int i = 0; i < 2 * R; i++) a[i] = _mm512_setzero_ps();
    for (int p = 0; p < np; p++) {
        __m512 v0, v1;
        leaf_pair(tr, l1[p], par[8 * p + j], j, &v0, &v1);
        for (int r = 0; r < R; r++) {
            a[2 * r] = _mm512_fmadd_ps(wp[r * VPAIRS + p], v0, a[2 * r]);
            a[2 * r + 1] = _mm512_fmadd_ps(wp[r * VPAIRS + p], v1, a[2 * r + 1]);
        }
    }
    for (int r = 0; r < R; r++) {
        float *o = acc + (size_t)r * d + 16 * j;
        for (int h = 0; h < 2; h++) {
            if (T == 2) {
                _mm256_storeu_ps(o + 8 * h, _mm256_add_ps(_mm256_loadu_ps(o + 8 * h), vq_fold512(a[2 * r + h])));
            } else if (T == 3) {
                /* lanes 0-4: the three tokens' block sums; blocks 5-7 are
                 * padding, kept at 0 as the other forms keep them */
                __m512 v = a[2 * r + h];
                v = _mm512_add_ps(_mm512_add_ps(v, rotate_lanes(v, 5)), rotate_lanes(v, 10));
                __m256 f = _mm256_maskz_mov_ps(0x1F, _mm512_castps512_ps256(v));
                _mm256_storeu_ps(o + 8 * h, _mm256_add_ps(_mm256_loadu_ps(o + 8 * h), f));
            } else {
                __m512 v = _mm512_add_ps(a[2 * r + h], _mm512_shuffle_f32x4(a[2 * r + h], a[2 * r + h], 0x4E));
                v = _mm512_add_ps(v, _mm512_shuffle_f32x4(v, v, 0xB1));
                _mm_storeu_ps(o + 8 * h, _mm_add_ps(_mm_loadu_ps(o + 8 * h), _mm512_castps512_ps128(v)));
            }
        }
    }
}

/* R rows (4 or 1) of acc (d apart, in the kernels' coordinate order): per
 * lane group and pass of 2 VPAIRS tokens, the tree down to level 2 once per
 * pair (parents), then the leaves node by node with the node's sums in
 * registers (accum_node). */
static ALWAYS_INLINE void accum_rows(const trig16 *tr, const uint16_t *rad, const uint8_t *codes, size_t cb, int d,
                                     int n, const float *w, int ld, const int R, float *acc, int aw) {
    int nb = d / 16;
    __m512 par[8 * VPAIRS], wp[4 * VPAIRS];
    __m512i l1[VPAIRS];
    for (int t0 = 0; t0 < n; t0 += 2 * VPAIRS) {
        int cnt = n - t0 < 2 * VPAIRS ? n - t0 : 2 * VPAIRS, np = (cnt + 1) / 2;
        for (int r = 0; r < R; r++)
            for (int p = 0; p < np; p++) {
                const float *wr = w + (size_t)r * ld + t0 + 2 * p;
                /* a token paired with itself adds nothing twice: weight 0 */
                float w1 = 2 * p + 1 < cnt ? wr[1] : 0.0f;
                wp[r * VPAIRS + p] =
                    _mm512_castpd_ps(_mm512_insertf64x4(_mm512_castpd256_pd512(_mm256_castps_pd(_mm256_set1_ps(wr[0]))),
                                                        _mm256_castps_pd(_mm256_set1_ps(w1)), 1));
            }
        for (int g = 0; g < (nb + 7) / 8; g++) {
            parents(tr, rad + (size_t)t0 * nb, codes + (size_t)t0 * cb, cb, nb, g, nb % 8 != 0, cnt, par, l1);
            for (int j = 0; j < 8; j++) accum_node(tr, par, l1, j, np, wp, R, 2, acc + (size_t)g * 128, aw);
        }
    }
}

/* parents for T tokens a register (four at d <= 64, three at d = 80):
 * registers [0, (cnt + T - 1) / T) of tokens [0, cnt). */
static ALWAYS_INLINE void parents_g(const trig16 *tr, const uint16_t *rad, const uint8_t *codes, size_t cb, int nb,
                                    int cnt, const int T, __m512 *par, __m512i *l1) {
    for (int t = 0; t < cnt; t += T) {
        int tk[4];
        const uint8_t *ck[4];
        group_tokens(codes, cb, t, cnt, T, tk, ck);
        codes16 x = load_codes_g(ck, nb, T);
        __m512 a3[4], *pt = par + 8 * (t / T);
        top_levels(tr, &x, load_rad_g(rad, tk, nb, T), a3);
        for (int j = 0; j < 4; j++) level2(tr, &x, a3[j], j, &pt[2 * j], &pt[2 * j + 1]);
        l1[t / T] = x.l1;
    }
}

/* accum_rows for T tokens a register, VPAIRS registers (T VPAIRS tokens) a
 * pass. A register's weights: token k's in its lanes (spread4, spread3;
 * lane 15 at T = 3 gets element 3, which is 0). */
static ALWAYS_INLINE void accum_group(const trig16 *tr, const uint16_t *rad, const uint8_t *codes, size_t cb, int nb,
                                      int n, const float *w, int ld, const int R, const int T, float *acc, int aw) {
    __m512 par[8 * VPAIRS], wg[4 * VPAIRS];
    __m512i l1[VPAIRS];
    for (int t0 = 0; t0 < n; t0 += T * VPAIRS) {
        const int cnt = n - t0 < T * VPAIRS ? n - t0 : T * VPAIRS, ng = (cnt + T - 1) / T;
        for (int r = 0; r < R; r++)
            for (int p = 0; p < ng; p++) {
                /* tokens past cnt (repeats of the last) weigh 0 */
                const int left = cnt - T * p;
                const __mmask8 m = (__mmask8)((1u << (left >= T ? T : left)) - 1);
                __m128 wv = _mm_maskz_loadu_ps(m, w + (size_t)r * ld + t0 + T * p);
                wg[r * VPAIRS + p] = _mm512_permutexvar_ps(T == 4 ? spread4() : spread3(), _mm512_castps128_ps512(wv));
            }
        parents_g(tr, rad + (size_t)t0 * nb, codes + (size_t)t0 * cb, cb, nb, cnt, T, par, l1);
        for (int j = 0; j < 8; j++) accum_node(tr, par, l1, j, ng, wg, R, T, acc, aw);
    }
}

void vq_polar_accum_avx512(const float cs[][16], const float sn[][16], const uint16_t *rad, const uint8_t *codes,
                           size_t cb, int d, int n, const float *w, int ld, int rows, float *acc) {
    trig16 tr = load_trig(cs, sn);
    const size_t aw = (size_t)(d + 127) / 128 * 128; /* acc's row stride: whole lane groups */
    int r = 0;
    const int nb = d / 16;
    if (d <= 64) { /* four tokens a register */
        for (; r + 4 <= rows; r += 4)
            accum_group(&tr, rad, codes, cb, nb, n, w + (size_t)r * ld, ld, 4, 4, acc + r * aw, (int)aw);
        for (; r < rows; r++) accum_group(&tr, rad, codes, cb, nb, n, w + (size_t)r * ld, ld, 1, 4, acc + r * aw, (int)aw);
        return;
    }
    if (d == 80) { /* three tokens a register */
        for (; r + 4 <= rows; r += 4)
            accum_group(&tr, rad, codes, cb, nb, n, w + (size_t)r * ld, ld, 4, 3, acc + r * aw, (int)aw);
        for (; r < rows; r++) accum_group(&tr, rad, codes, cb, nb, n, w + (size_t)r * ld, ld, 1, 3, acc + r * aw, (int)aw);
        return;
    }
    for (; r + 4 <= rows; r += 4)
        accum_rows(&tr, rad, codes, cb, d, n, w + (size_t)r * ld, ld, 4, acc + r * aw, (int)aw);
    for (; r < rows; r++) accum_rows(&tr, rad, codes, cb, d, n, w + (size_t)r * ld, ld, 1, acc + r * aw, (int)aw);
}
