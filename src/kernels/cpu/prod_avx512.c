/* AVX-512 attention kernels of tq-prod (methods/turboquant_prod.c) for 1-,
 * 2- and 3-bit codes (tq-prod bits=2..4) and a sign sketch of m = d signs a
 * token, d a multiple of 16 of at most 128 or a multiple of 128 (a slot's
 * short last run of codes masked; 3-bit codes whose 1-bit planes are not
 * a multiple of 16 bytes place their high bits with a byte shuffle). Built with the AVX-512 flags and only called
 * at the avx512 CPU level.
 *
 * Codes: 16 channels a lane vector. The code bytes of 16 channels of one
 * slot are extended to 32-bit lanes straight from memory; the slot's bits
 * are shifted down, for 3-bit codes the high bit (1-bit planes) is shifted
 * to bit 2 and merged in with one vpternlogd, and one vpermps looks the
 * level up in the codebook replicated to 16 entries (bits above the code
 * select a copy, so they need no mask). 1-bit codes: bit s of 16 code bytes
 * as a mask (vptestmb) picks one of the two levels (a masked blend).
 *
 * Signs: the 16 sign bits of 16 sketch channels are a mask register as they
 * lie in memory (bit i in byte i / 8 at bit i % 8), so
 *   sum_i s_i x_i = 2 sum_{s_i = +1} x_i - sum_i x_i
 * takes one masked add per 16 signs and row, with no table: the masked adds
 * run on the FP add pipes while the codes' FMAs take the FMA pipes. The AVX2
 * path scores through 64 KB of per-query byte tables (L2) instead and
 * accumulates through per-pair tables (codes_avx2.c).
 *
 * Keys: 4 tokens and R rows a step, so each load of q (codes) and of
 * 2 S R q (signs) serves four tokens: with two tokens a step the loop was
 * bound by those zmm loads (about two a cycle; 31.3 -> 26.5 ns per (token,
 * kv head) in cache for 4-bit). The 16 (token, row) sums of the codes and
 * then those of the signs are reduced by one shuffle tree each; norms and
 * gains are applied to the 16 sums as vectors.
 * Values: 32 code channels and 32 sketch channels of R rows stay in
 * registers over the tokens of a call (4 R accumulators), a pass for each
 * such slice. */
#include "high_bytes.h"
#include "reduce_avx512.h"
#include "vq_internal.h"

#include <immintrin.h>
#include <string.h>

#if defined(__GNUC__)
#define ALWAYS_INLINE inline __attribute__((always_inline))
#define NOINLINE __attribute__((noinline))
#else
#define ALWAYS_INLINE inline
#define NOINLINE
#endif

/* Tokens of one values call handled at once (stack buffers); the caller
 * passes at most this many. */
#define TOKENS 64

/* The mask of sketch channels 16 g .. 16 g + 15 (bytes 2 g, 2 g + 1). */
static ALWAYS_INLINE __mmask16 sign_mask(const uint8_t *signs, int g) {
    uint16_t w;
    memcpy(&w, signs + 2 * g, sizeof w);
    return (__mmask16)w;
}

/* The 16-entry lookup table of B-bit levels (index bits above B pick a
 * copy). */
static __m512 replicated(const float *levels, int bits) {
    float t[16];
    for (int i = 0; i < 16; i++) t[i] = levels[i & ((1 << bits) - 1)];
    return _mm512_loadu_ps(t);
}

/* Code bytes of 16 channels, one per lane. */
static ALWAYS_INLINE __m512i load_bytes(const uint8_t *p) {
    return _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)p));
}

/* The lookup index of slot s: lo holds 2-bit plane bytes, hi (B = 3) the
 * 1-bit plane bytes with the slot pair's high bits at 2 s (slot s's at bit
 * 2 s, see the callers); bit 2 of the index is taken from hi. */
static ALWAYS_INLINE __m512i slot_index(const int B, __m512i lo, __m512i hi, const int s) {
    __m512i x = s ? _mm512_srli_epi32(lo, 2 * s) : lo;
    if (B == 2) return x;
    __m512i h = s == 0 ? _mm512_slli_epi32(hi, 2) : s == 1 ? hi : _mm512_srli_epi32(hi, 2 * s - 2);
    /* bits of x, bit 2 from h: (c ? b : a) with a = x, b = h, c = 4 */
    return _mm512_ternarylogic_epi32(x, h, _mm512_set1_epi32(4), 0xD8);
}

/* The 1-bit plane bytes for the 16 channels starting i0 into each 2-bit
 * slot (s2 = d / 4 of them, s1 = d / 8 bytes a 1-bit slot): channel
 * s s2 + i0 + i has its high bit in byte (i0 + i) % s1 at bit 2 s + i0 /
 * s1; shifted so it is at 2 s. */
static ALWAYS_INLINE __m512i load_high(const uint8_t *c, int s2, int s1, int i0, const bool X) {
    if (X) {
        /* 1-bit planes of other than a multiple of 16 bytes (d = 96: 12):
         * the shuffled bytes (high_bytes.h), shifted by 1 in the slot's
         * second half */
        __m128i second;
        __m512i x = _mm512_cvtepu8_epi32(vq_high_bytes16(c + s2, i0, s1, &second));
        return _mm512_srlv_epi32(x, _mm512_cvtepu8_epi32(second));
    }
    if (i0 < s1) return load_bytes(c + s2 + i0);
    return _mm512_srli_epi32(load_bytes(c + s2 + i0 - s1), 1); /* i0 < s2 = 2 s1: no division */
}

/* One 16-channel step of a token's codes, i0 bytes into each slot: B = 2,
 * 3: the 2-bit plane bytes (lo) and the 1-bit plane bytes (hi, B = 3) as
 * lanes; B = 1: the 16 bytes as they are (x). */
static ALWAYS_INLINE void load_step(const int B, const bool X, const uint8_t *c, int d, int i0, __m512i *lo,
                                    __m512i *hi, __m128i *x) {
    *lo = *hi = _mm512_setzero_si512();
    *x = _mm_setzero_si128();
    if (B == 1) *x = _mm_loadu_si128((const __m128i *)(c + i0));
    else *lo = load_bytes(c + i0);
    if (B == 3) *hi = load_high(c, d / 4, d / 8, i0, X);
}

/* Levels of slot s of a step (load_step). 1-bit codes: bit s of each byte
 * as a mask (vptestmb) picks t1 over t0 (the two levels broadcast), no
 * shift and no lookup. */
static ALWAYS_INLINE __m512 slot_levels(const int B, __m512i lo, __m512i hi, __m128i x, const int s, __m512 tab,
                                        __m512 t0, __m512 t1) {
    if (B == 1) return _mm512_mask_blend_ps(_mm_test_epi8_mask(x, _mm_set1_epi8((char)(1 << s))), t0, t1);
    return _mm512_permutexvar_ps(slot_index(B, lo, hi, s), tab);
}

/* Scores of tokens [0, n) for R rows (1..4), four tokens a step, so each
 * load of q or of 2 S R q serves four tokens: the (token t, row r) sums
 * sit in a[4 t + r] and come out of vq_sum16x16 at lane 4 r + t, the codes' and
 * the signs' one after the other. qs: the rows' rotated q in reading order
 * (16 floats per (i0, slot, row)); v2: 2 S R q per row (d floats, rows d
 * apart); vsum: sum_i (S R q)_i per row. */
static ALWAYS_INLINE void score_rows(const int B, const bool X, const int R, const uint8_t *codes, size_t cb, size_t soff, int d,
                                     __m512 tab, const float *len, const float *gain, int n, const float *qs,
                                     const float *v2, const float *vsum, float *logits, int ld) {
    /* bytes of a slot's plane and slots a byte (3-bit codes: of the 2-bit planes) */
    const int st = B == 1 ? d / 8 : d / 4, ns = B == 1 ? 8 : 4;
    const __m512 t0 = _mm512_permutexvar_ps(_mm512_set1_epi32(0), tab);
    const __m512 t1 = _mm512_permutexvar_ps(_mm512_set1_epi32(1), tab);
    float vv[16] = {0};
    for (int r = 0; r < R; r++)
        for (int t = 0; t < 4; t++) vv[4 * r + t] = vsum[r];
    const __m512 vs = _mm512_loadu_ps(vv);
    for (int j = 0; j < n; j += 4) {
        /* a short last step repeats its last token and stores fewer */
        int cnt = n - j < 4 ? n - j : 4;
        __mmask8 keep = (__mmask8)((1u << cnt) - 1);
        const uint8_t *c[4];
        for (int t = 0; t < 4; t++) c[t] = codes + (size_t)(j + (t < cnt ? t : cnt - 1)) * cb;
        __m512 a[16];
        for (int i = 0; i < 16; i++) a[i] = _mm512_setzero_ps();
        const float *qp = qs;
        for (int i0 = 0; i0 < st; i0 += 16) {
            __m512i lo[4], hi[4];
            __m128i x[4];
            for (int t = 0; t < 4; t++) load_step(B, X, c[t], d, i0, &lo[t], &hi[t], &x[t]);
            for (int s = 0; s < ns; s++) {
                __m512 lev[4];
                for (int t = 0; t < 4; t++) lev[t] = slot_levels(B, lo[t], hi[t], x[t], s, tab, t0, t1);
                for (int r = 0; r < R; r++, qp += 16) {
                    __m512 q = _mm512_loadu_ps(qp);
                    for (int t = 0; t < 4; t++) a[4 * t + r] = _mm512_fmadd_ps(q, lev[t], a[4 * t + r]);
                }
            }
        }
        __m512 codes_sum = vq_sum16x16(a);
        for (int i = 0; i < 16; i++) a[i] = _mm512_setzero_ps();
        for (int g = 0; g < d / 16; g++) {
            __mmask16 k[4];
            for (int t = 0; t < 4; t++) k[t] = sign_mask(c[t] + soff, g);
            for (int r = 0; r < R; r++) {
                __m512 v = _mm512_loadu_ps(v2 + (size_t)r * d + 16 * g);
                for (int t = 0; t < 4; t++) a[4 * t + r] = _mm512_mask_add_ps(a[4 * t + r], k[t], a[4 * t + r], v);
            }
        }
        /* len * codes + gain * (2 sum_{+1} v - sum v), lane 4 r + t */
        __m512 ln = _mm512_broadcast_f32x4(_mm_maskz_loadu_ps(keep, len + j));
        __m512 gn = _mm512_broadcast_f32x4(_mm_maskz_loadu_ps(keep, gain + j));
        __m512 sc = _mm512_fmadd_ps(gn, _mm512_sub_ps(vq_sum16x16(a), vs), _mm512_mul_ps(ln, codes_sum));
        _mm_mask_storeu_ps(logits + j, keep, _mm512_castps512_ps128(sc));
        if (R > 1) _mm_mask_storeu_ps(logits + (size_t)ld + j, keep, _mm512_extractf32x4_ps(sc, 1));
        if (R > 2) _mm_mask_storeu_ps(logits + 2 * (size_t)ld + j, keep, _mm512_extractf32x4_ps(sc, 2));
        if (R > 3) _mm_mask_storeu_ps(logits + 3 * (size_t)ld + j, keep, _mm512_extractf32x4_ps(sc, 3));
    }
}

/* Copies R rows of rotated q (d apart) into qs in score_rows' reading order;
 * a slot's short last run (d = 96: 8 of 16 channels) has 0 in its other
 * lanes (its codes' lanes read the next bytes). */
static void prep_q(const float *q, int d, int bits, const int R, float *qs) {
    int st = bits == 1 ? d / 8 : d / 4, ns = bits == 1 ? 8 : 4;
    for (int i0 = 0; i0 < st; i0 += 16) {
        const __mmask16 k = st - i0 >= 16 ? 0xFFFF : (__mmask16)((1u << (st - i0)) - 1);
        for (int s = 0; s < ns; s++)
            for (int r = 0; r < R; r++, qs += 16)
                _mm512_storeu_ps(qs, _mm512_maskz_loadu_ps(k, q + (size_t)r * d + s * st + i0));
    }
}

/* score_rows with the row count a constant in each instance (R = rows,
 * 1..4); B is a constant at each call site. */
static ALWAYS_INLINE void score_rows_r(const int B, const bool X, int R, const uint8_t *codes, size_t cb, size_t soff, int d,
                                       __m512 tab, const float *len, const float *gain, int n, const float *qs,
                                       const float *v2, const float *vsum, float *logits, int ld) {
    switch (R) {
    case 4: score_rows(B, X, 4, codes, cb, soff, d, tab, len, gain, n, qs, v2, vsum, logits, ld); break;
    case 3: score_rows(B, X, 3, codes, cb, soff, d, tab, len, gain, n, qs, v2, vsum, logits, ld); break;
    case 2: score_rows(B, X, 2, codes, cb, soff, d, tab, len, gain, n, qs, v2, vsum, logits, ld); break;
    default: score_rows(B, X, 1, codes, cb, soff, d, tab, len, gain, n, qs, v2, vsum, logits, ld); break;
    }
}

/* One function per code width, so that each loop gets the registers to
 * itself. */
static NOINLINE void score_b1(int R, const uint8_t *codes, size_t cb, size_t soff, int d, __m512 tab, const float *len,
                              const float *gain, int n, const float *qs, const float *v2, const float *vsum,
                              float *logits, int ld) {
    score_rows_r(1, false, R, codes, cb, soff, d, tab, len, gain, n, qs, v2, vsum, logits, ld);
}
static NOINLINE void score_b2(int R, const uint8_t *codes, size_t cb, size_t soff, int d, __m512 tab, const float *len,
                              const float *gain, int n, const float *qs, const float *v2, const float *vsum,
                              float *logits, int ld) {
    score_rows_r(2, false, R, codes, cb, soff, d, tab, len, gain, n, qs, v2, vsum, logits, ld);
}
static NOINLINE void score_b3(int R, const uint8_t *codes, size_t cb, size_t soff, int d, __m512 tab, const float *len,
                              const float *gain, int n, const float *qs, const float *v2, const float *vsum,
                              float *logits, int ld) {
    score_rows_r(3, false, R, codes, cb, soff, d, tab, len, gain, n, qs, v2, vsum, logits, ld);
}

/* 3-bit codes whose 1-bit planes are not a multiple of 16 bytes (load_high's
 * X): an instance of their own, so the others keep their code. */
static NOINLINE void score_b3x(int R, const uint8_t *codes, size_t cb, size_t soff, int d, __m512 tab,
                               const float *len, const float *gain, int n, const float *qs, const float *v2,
                               const float *vsum, float *logits, int ld) {
    score_rows_r(3, true, R, codes, cb, soff, d, tab, len, gain, n, qs, v2, vsum, logits, ld);
}

/* logits[r * ld + t] = len[t] * <rq_r, levels of token t's codes> +
 * gain[t] * <v_r, signs of token t> for r < rows, t < n, where v2 rows
 * hold 2 v_r and vsum[r] = sum_i v_r[i]. Token t's bits-bit codes (1..3)
 * start at codes + t * cb, its d signs soff bytes further. scratch: 4 d
 * floats. */
void vq_prod_score_avx512(const uint8_t *codes, size_t cb, size_t soff, int bits, const float *levels, int d,
                          const float *len, const float *gain, int n, const float *rq, const float *v2,
                          const float *vsum, int rows, float *logits, int ld, float *scratch) {
    __m512 tab = replicated(levels, bits);
    for (int r = 0; r < rows; r += 4) {
        int R = rows - r < 4 ? rows - r : 4;
        prep_q(rq + (size_t)r * d, d, bits, R, scratch);
        const float *vr = v2 + (size_t)r * d;
        float *lr = logits + (size_t)r * ld;
        if (bits == 1) score_b1(R, codes, cb, soff, d, tab, len, gain, n, scratch, vr, vsum + r, lr, ld);
        else if (bits == 2) score_b2(R, codes, cb, soff, d, tab, len, gain, n, scratch, vr, vsum + r, lr, ld);
        else if ((d / 8) % 16 != 0) score_b3x(R, codes, cb, soff, d, tab, len, gain, n, scratch, vr, vsum + r, lr, ld);
        else score_b3(R, codes, cb, soff, d, tab, len, gain, n, scratch, vr, vsum + r, lr, ld);
    }
}

/* One slice of the values for R rows: code channels s st + i0 .. + 15 for
 * slots s0, s0 + 1 into acc (rows as apart) and sketch channels 16 g0 ..
 * 16 g0 + 31 into acc + d. wn, wg: the weights times norm and gain per row
 * (TOKENS apart), wsum[r] = sum_t wg[r][t]. */
static ALWAYS_INLINE void accum_slice(const int B, const bool X, const int R, const uint8_t *codes, size_t cb, size_t soff, int d,
                                      __m512 tab, const float *wn, const float *wg, const float *wsum, int n,
                                      float *acc, size_t as, int i0, const int s0, int g0) {
    const int st = B == 1 ? d / 8 : d / 4; /* bytes of a slot's plane */
    const __m512 t0 = _mm512_permutexvar_ps(_mm512_set1_epi32(0), tab);
    const __m512 t1 = _mm512_permutexvar_ps(_mm512_set1_epi32(1), tab);
    __m512 a[8], z[8]; /* (row r, slot or sketch run k) at 2 r + k */
    for (int r = 0; r < R; r++)
        for (int k = 0; k < 2; k++) {
            a[2 * r + k] = _mm512_loadu_ps(acc + (size_t)r * as + (s0 + k) * st + i0);
            z[2 * r + k] = _mm512_setzero_ps();
        }
    for (int t = 0; t < n; t++) {
        const uint8_t *c = codes + (size_t)t * cb;
        __m512i lo, hi;
        __m128i x;
        load_step(B, X, c, d, i0, &lo, &hi, &x);
        __m512 lev[2] = {slot_levels(B, lo, hi, x, s0, tab, t0, t1), slot_levels(B, lo, hi, x, s0 + 1, tab, t0, t1)};
        __mmask16 k[2] = {sign_mask(c + soff, g0), sign_mask(c + soff, g0 + 1)};
        for (int r = 0; r < R; r++) {
            __m512 w = _mm512_set1_ps(wn[r * TOKENS + t]), u = _mm512_set1_ps(wg[r * TOKENS + t]);
            for (int i = 0; i < 2; i++) {
                a[2 * r + i] = _mm512_fmadd_ps(w, lev[i], a[2 * r + i]);
                z[2 * r + i] = _mm512_mask_add_ps(z[2 * r + i], k[i], z[2 * r + i], u);
            }
        }
    }
    /* sum_t wg_t s_t = 2 sum_{s = +1} wg_t - sum_t wg_t */
    for (int r = 0; r < R; r++)
        for (int k = 0; k < 2; k++) {
            _mm512_storeu_ps(acc + (size_t)r * as + (s0 + k) * st + i0, a[2 * r + k]);
            float *zp = acc + (size_t)r * as + d + 16 * (g0 + k);
            __m512 base = _mm512_sub_ps(_mm512_loadu_ps(zp), _mm512_set1_ps(wsum[r]));
            _mm512_storeu_ps(zp, _mm512_fmadd_ps(z[2 * r + k], _mm512_set1_ps(2.0f), base));
        }
}

/* The code channels s st + i0 .. st - 1 of slots s0, s0 + 1 (a slot's short
 * last run: fewer than 16) for R rows, under a mask; no signs. */
static ALWAYS_INLINE void accum_code_tail(const int B, const bool X, const int R, const uint8_t *codes, size_t cb,
                                          int d, __m512 tab, const float *wn, int n, float *acc, size_t as, int i0,
                                          const int s0) {
    const int st = B == 1 ? d / 8 : d / 4;
    const __mmask16 m = (__mmask16)((1u << (st - i0)) - 1);
    const __m512 t0 = _mm512_permutexvar_ps(_mm512_set1_epi32(0), tab);
    const __m512 t1 = _mm512_permutexvar_ps(_mm512_set1_epi32(1), tab);
    __m512 a[8];
    for (int r = 0; r < R; r++)
        for (int k = 0; k < 2; k++) a[2 * r + k] = _mm512_maskz_loadu_ps(m, acc + (size_t)r * as + (s0 + k) * st + i0);
    for (int t = 0; t < n; t++) {
        __m512i lo, hi;
        __m128i x;
        load_step(B, X, codes + (size_t)t * cb, d, i0, &lo, &hi, &x);
        __m512 lev[2] = {slot_levels(B, lo, hi, x, s0, tab, t0, t1), slot_levels(B, lo, hi, x, s0 + 1, tab, t0, t1)};
        for (int r = 0; r < R; r++) {
            __m512 w = _mm512_set1_ps(wn[r * TOKENS + t]);
            for (int k = 0; k < 2; k++) a[2 * r + k] = _mm512_fmadd_ps(w, lev[k], a[2 * r + k]);
        }
    }
    for (int r = 0; r < R; r++)
        for (int k = 0; k < 2; k++) _mm512_mask_storeu_ps(acc + (size_t)r * as + (s0 + k) * st + i0, m, a[2 * r + k]);
}

/* Sketch channels 16 g .. 16 g + 15 for R rows; no codes. */
static ALWAYS_INLINE void accum_sign_run(const int R, const uint8_t *codes, size_t cb, size_t soff, int d,
                                         const float *wg, const float *wsum, int n, float *acc, size_t as, int g) {
    __m512 z[4];
    for (int r = 0; r < R; r++) z[r] = _mm512_setzero_ps();
    for (int t = 0; t < n; t++) {
        __mmask16 k = sign_mask(codes + (size_t)t * cb + soff, g);
        for (int r = 0; r < R; r++) z[r] = _mm512_mask_add_ps(z[r], k, z[r], _mm512_set1_ps(wg[r * TOKENS + t]));
    }
    for (int r = 0; r < R; r++) {
        float *zp = acc + (size_t)r * as + d + 16 * g;
        __m512 base = _mm512_sub_ps(_mm512_loadu_ps(zp), _mm512_set1_ps(wsum[r]));
        _mm512_storeu_ps(zp, _mm512_fmadd_ps(z[r], _mm512_set1_ps(2.0f), base));
    }
}

static ALWAYS_INLINE void accum_rows(const int B, const bool X, const int R, const uint8_t *codes, size_t cb,
                                     size_t soff, int d, __m512 tab, const float *wn, const float *wg,
                                     const float *wsum, int n, float *acc, size_t as) {
    /* two slots and two runs of 16 signs a slice: d / 32 slices. A slot
     * shorter than a whole number of runs (d = 96: 3-bit slots of 24
     * channels, 1-bit of 12) ends in code-only slices under a mask, and the
     * sketch runs not yet taken follow alone. */
    const int st = B == 1 ? d / 8 : d / 4, ns = B == 1 ? 8 : 4;
    int g = 0, i0 = 0;
    for (; i0 + 16 <= st; i0 += 16) {
        accum_slice(B, X, R, codes, cb, soff, d, tab, wn, wg, wsum, n, acc, as, i0, 0, g);
        accum_slice(B, X, R, codes, cb, soff, d, tab, wn, wg, wsum, n, acc, as, i0, 2, g + 2);
        g += 4;
        if (B == 1) {
            accum_slice(B, X, R, codes, cb, soff, d, tab, wn, wg, wsum, n, acc, as, i0, 4, g);
            accum_slice(B, X, R, codes, cb, soff, d, tab, wn, wg, wsum, n, acc, as, i0, 6, g + 2);
            g += 4;
        }
    }
    if (i0 < st)
        for (int s0 = 0; s0 < ns; s0 += 2) accum_code_tail(B, X, R, codes, cb, d, tab, wn, n, acc, as, i0, s0);
    for (; g < d / 16; g++) accum_sign_run(R, codes, cb, soff, d, wg, wsum, n, acc, as, g);
}

/* accum_rows with the row count a constant in each instance (as
 * score_rows_r). */
static ALWAYS_INLINE void accum_rows_r(const int B, const bool X, int R, const uint8_t *codes, size_t cb, size_t soff, int d,
                                       __m512 tab, const float *wn, const float *wg, const float *wsum, int n, float *acc,
                                       size_t as) {
    switch (R) {
    case 4: accum_rows(B, X, 4, codes, cb, soff, d, tab, wn, wg, wsum, n, acc, as); break;
    case 3: accum_rows(B, X, 3, codes, cb, soff, d, tab, wn, wg, wsum, n, acc, as); break;
    case 2: accum_rows(B, X, 2, codes, cb, soff, d, tab, wn, wg, wsum, n, acc, as); break;
    default: accum_rows(B, X, 1, codes, cb, soff, d, tab, wn, wg, wsum, n, acc, as); break;
    }
}

static NOINLINE void accum_b1(int R, const uint8_t *codes, size_t cb, size_t soff, int d, __m512 tab, const float *wn,
                              const float *wg, const float *wsum, int n, float *acc, size_t as) {
    accum_rows_r(1, false, R, codes, cb, soff, d, tab, wn, wg, wsum, n, acc, as);
}
static NOINLINE void accum_b2(int R, const uint8_t *codes, size_t cb, size_t soff, int d, __m512 tab, const float *wn,
                              const float *wg, const float *wsum, int n, float *acc, size_t as) {
    accum_rows_r(2, false, R, codes, cb, soff, d, tab, wn, wg, wsum, n, acc, as);
}
static NOINLINE void accum_b3(int R, const uint8_t *codes, size_t cb, size_t soff, int d, __m512 tab, const float *wn,
                              const float *wg, const float *wsum, int n, float *acc, size_t as) {
    accum_rows_r(3, false, R, codes, cb, soff, d, tab, wn, wg, wsum, n, acc, as);
}

static NOINLINE void accum_b3x(int R, const uint8_t *codes, size_t cb, size_t soff, int d, __m512 tab,
                               const float *wn, const float *wg, const float *wsum, int n, float *acc, size_t as) {
    accum_rows_r(3, true, R, codes, cb, soff, d, tab, wn, wg, wsum, n, acc, as);
}

/* acc[r * 2 d + c] += sum_t w[r * ld + t] len[t] level_t[c] and
 * acc[r * 2 d + d + i] += sum_t w[r * ld + t] gain[t] s_t,i for r < rows,
 * n <= TOKENS tokens laid out as for vq_prod_score_avx512. */
void vq_prod_accum_avx512(const uint8_t *codes, size_t cb, size_t soff, int bits, const float *levels, int d,
                          const float *len, const float *gain, int n, const float *w, int ld, int rows, float *acc) {
    __m512 tab = replicated(levels, bits);
    float wn[4 * TOKENS], wg[4 * TOKENS], wsum[4];
    for (int r0 = 0; r0 < rows; r0 += 4) {
        int R = rows - r0 < 4 ? rows - r0 : 4;
        for (int r = 0; r < R; r++) {
            const float *wr = w + (size_t)(r0 + r) * ld;
            __m512 s = _mm512_setzero_ps();
            for (int t = 0; t < n; t += 16) {
                __mmask16 m = n - t >= 16 ? 0xFFFF : (__mmask16)((1u << (n - t)) - 1);
                __m512 x = _mm512_maskz_loadu_ps(m, wr + t);
                __m512 g = _mm512_mul_ps(x, _mm512_maskz_loadu_ps(m, gain + t));
                _mm512_storeu_ps(wn + r * TOKENS + t, _mm512_mul_ps(x, _mm512_maskz_loadu_ps(m, len + t)));
                _mm512_storeu_ps(wg + r * TOKENS + t, g);
                s = _mm512_add_ps(s, g);
            }
            wsum[r] = _mm512_reduce_add_ps(s);
        }
        float *ar = acc + (size_t)r0 * 2 * d;
        if (bits == 1) accum_b1(R, codes, cb, soff, d, tab, wn, wg, wsum, n, ar, 2 * (size_t)d);
        else if (bits == 2) accum_b2(R, codes, cb, soff, d, tab, wn, wg, wsum, n, ar, 2 * (size_t)d);
        else if ((d / 8) % 16 != 0) accum_b3x(R, codes, cb, soff, d, tab, wn, wg, wsum, n, ar, 2 * (size_t)d);
        else accum_b3(R, codes, cb, soff, d, tab, wn, wg, wsum, n, ar, 2 * (size_t)d);
    }
}
