/* AVX-512 kernels for KIVI (2, 3, 4 and 8 bits) at CPU level avx512: the
 * key scores of a row group (4, 2 or 1 q heads of one kv head) 16 channels
 * per instruction, and the inner loop of the value accumulation for such a
 * group with VNNI (vpdpwssd adds the
 * madd of a token pair into the int32 sums in one instruction, where AVX2
 * needs a madd and an add). Both follow the AVX2 kernels' math exactly
 * (kivi_avx2.c's header has the why): q' = q * scale with the slot's power
 * of two, masked codes in place, FMAs into float partial sums for keys;
 * int16 weight pairs times codes summed in int32 for values. The drivers in
 * kivi_avx2.c call these for their row groups when the level and the
 * shape allow, so the tables (the value weights, their rounding
 * correction) are built once, by the same code, for both widths.
 *
 * Built with the AVX-512 flags of the other *_avx512.c files; the VNNI
 * function also carries its own target attribute, so no other code in
 * these files can be compiled into VNNI instructions (Skylake-X has
 * AVX-512 without VNNI). */
#include "reduce_avx512.h"
#include "vq_internal.h"

#include <immintrin.h>

#if defined(__GNUC__)
#define ALWAYS_INLINE inline __attribute__((always_inline))
#else
#define ALWAYS_INLINE inline
#endif

/* Tokens per value chunk: kivi_avx2.c's CHUNK, the pair stride of its
 * weight table. */
#define CHUNK 32

/* 2^e for a small e, as 16 floats. */
static inline __m512 pow2(int e) { return _mm512_castsi512_ps(_mm512_set1_epi32((127 + e) << 23)); }

/* ------------------------------------------------------------------ keys */

/* q' for R rows and one key group (fp16 scale sc, zero zr), in the order
 * dot_tokens reads it: 16 floats per (16-byte step u, slot j, row r), channel
 * j * stride + u + lane, times 2^-(b j) except in the top slot, which is
 * shifted down instead of masked (see kivi_avx2.c's prep_keys), and none for
 * whole codes (3 bits: the 2-bit slots with their high bit joined); qz[r] =
 * sum_c q_r,c zero_c. */
static ALWAYS_INLINE void prep_keys(const float *q, const int R, int d, const int b, int stride, const bool whole,
                                    const uint16_t *sc, const uint16_t *zr, float *qs, float *qz) {
    __m512 z[4];
    for (int r = 0; r < R; r++) z[r] = _mm512_setzero_ps();
    for (int c = 0; c < d; c += 16) {
        __m512 zf = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(zr + c)));
        for (int r = 0; r < R; r++) z[r] = _mm512_fmadd_ps(_mm512_loadu_ps(q + (size_t)r * d + c), zf, z[r]);
    }
    const int slots = 8 / b;
    float *o = qs;
    for (int u = 0; u < stride; u += 16)
        for (int j = 0; j < slots; j++) {
            int c = j * stride + u;
            __m512 f = pow2(whole || j == slots - 1 ? 0 : -b * j);
            __m512 sf = _mm512_mul_ps(_mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(sc + c))), f);
            for (int r = 0; r < R; r++, o += 16)
                _mm512_storeu_ps(o, _mm512_mul_ps(_mm512_loadu_ps(q + (size_t)r * d + c), sf));
        }
    for (int r = 0; r < R; r++) qz[r] = _mm512_reduce_add_ps(z[r]);
}

/* Slot j of b-bit plane codes in 32-bit lanes x (zero-extended bytes):
 * c * 2^(b j) by a mask, the top slot c by a shift. */
static ALWAYS_INLINE __m512 slot_f(__m512i x, const int b, const int j) {
    if (b * (j + 1) < 8) return _mm512_cvtepi32_ps(_mm512_and_si512(x, _mm512_set1_epi32(((1 << b) - 1) << (b * j))));
    return _mm512_cvtepi32_ps(_mm512_srli_epi32(x, 8 - b));
}

/* The partial dot products of K tokens (c + k cb) with R rows, one
 * accumulator per (token, row) as in kivi_avx2.c's dot_pair: each q' load
 * feeds K FMAs, and K = kt(R) gives R kt(R) independent chains. K = 1: one
 * token (tails). */
static ALWAYS_INLINE void dot_tokens(const float *qs, const uint8_t *c, size_t cb, int stride, const int b, const int K,
                                     const int R, __m512 acc[8][4]) {
    const float *qp = qs;
    for (int k = 0; k < K; k++)
        for (int r = 0; r < R; r++) acc[k][r] = _mm512_setzero_ps();
    for (int u = 0; u < stride; u += 16) {
        __m512i x[8];
        for (int k = 0; k < K; k++) x[k] = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(c + k * cb + u)));
        for (int j = 0; j < 8 / b; j++, qp += 16 * R)
            for (int k = 0; k < K; k++) {
                __m512 f = slot_f(x[k], b, j);
                for (int r = 0; r < R; r++) acc[k][r] = _mm512_fmadd_ps(_mm512_loadu_ps(qp + 16 * r), f, acc[k][r]);
            }
    }
}

/* dot_tokens for 3-bit codes (d a multiple of 128): per 16 channels of
 * slot j, the 2-bit part (x >> 2 j) & 3 and the high bit from slot 2 j + k0
 * of the 1-bit plane bytes (the same channels, s1 = d / 8 apart) joined
 * into c2 + 4 c1 by one vpternlogd before one conversion and the rows'
 * FMAs. */
static ALWAYS_INLINE void dot_tokens_b3(const float *qs, const uint8_t *c, size_t cb, int d, const int K,
                                        const int R, __m512 acc[8][4]) {
    const int s2 = d / 4, s1 = d / 8;
    const __m512i four = _mm512_set1_epi32(4);
    const float *qp = qs;
    for (int k = 0; k < K; k++)
        for (int r = 0; r < R; r++) acc[k][r] = _mm512_setzero_ps();
    for (int u = 0; u < s2; u += 16) {
        const int k0 = u / s1; /* the 1-bit slot of j = 0 */
        __m512i x[8], y[8];
        for (int k = 0; k < K; k++) {
            const uint8_t *ck = c + k * cb;
            x[k] = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(ck + u)));
            y[k] = _mm512_slli_epi32(_mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(ck + s2 + u % s1))), 2);
        }
        for (int j = 0; j < 4; j++, qp += 16 * R)
            for (int k = 0; k < K; k++) {
                __m512i hi = _mm512_and_si512(_mm512_srli_epi32(y[k], 2 * j + k0), four);
                /* (x >> 2 j) & 3 | hi: imm 0xEC is (a & c) | b */
                __m512i cj = _mm512_ternarylogic_epi32(_mm512_srli_epi32(x[k], 2 * j), hi, _mm512_set1_epi32(3), 0xEC);
                __m512 f = _mm512_cvtepi32_ps(cj);
                for (int r = 0; r < R; r++) acc[k][r] = _mm512_fmadd_ps(_mm512_loadu_ps(qp + 16 * r), f, acc[k][r]);
            }
    }
}

/* Tokens per step of the key loop for R rows: 4 tokens x 4 rows = 16 FMA
 * chains; 2 tokens (8 chains, the AVX2 kernel's choice) left the FMA units
 * waiting on their latency: 18.7 ns per (token, kv head) in cache against
 * 15.8 (2-bit, heads 8/2, Zen 5). Fewer rows take 8 tokens (the 8 a
 * reduction tree sums). */
static ALWAYS_INLINE int kt(const int R) { return R == 4 ? 4 : 8; }

/* Scores of tokens [t0, t0 + n) for R rows (4, 2 or 1; bits 2, 3, 4 or 8;
 * both constants per instance). */
static ALWAYS_INLINE void score_rows(const float *q, const int R, int d, int G, const int bits, const uint8_t *blk,
                                     int block_tokens, int t0, int n, float *logits, int ld, float *scratch) {
    /* 3-bit codes: the 2-bit plane set's slots, whole (see prep_keys) */
    const int b = bits == 3 ? 2 : bits, stride = bits == 3 ? d / 4 : d * b / 8;
    const size_t cb = (size_t)d * (size_t)bits / 8;
    const uint16_t *meta = (const uint16_t *)(blk + (size_t)block_tokens * cb);
    float *qs = scratch, *qz = scratch + 4 * (size_t)d;
    for (int t = t0; t < t0 + n;) {
        int g = t / G, end = (g + 1) * G < t0 + n ? (g + 1) * G : t0 + n;
        const uint16_t *sc = meta + (size_t)g * 2 * d;
        prep_keys(q, R, d, b, stride, bits == 3, sc, sc + d, qs, qz);
        /* 8 tokens' partials per row summed by one transposing tree, 8
         * logits per store (as the AVX2 kernel) */
        for (; t + 8 <= end; t += 8) {
            __m256 part[4][8]; /* [row][token] */
            for (int k = 0; k < 8; k += kt(R)) {
                __m512 acc[8][4];
                if (bits == 3)
                    dot_tokens_b3(qs, blk + (size_t)(t + k) * cb, cb, d, kt(R), R, acc);
                else
                    dot_tokens(qs, blk + (size_t)(t + k) * cb, cb, stride, b, kt(R), R, acc);
                for (int r = 0; r < R; r++)
                    for (int e = 0; e < kt(R); e++) part[r][k + e] = vq_fold512(acc[e][r]);
            }
            for (int r = 0; r < R; r++) {
                __m256 *p = part[r];
                __m256 h0 = _mm256_hadd_ps(_mm256_hadd_ps(p[0], p[1]), _mm256_hadd_ps(p[2], p[3]));
                __m256 h1 = _mm256_hadd_ps(_mm256_hadd_ps(p[4], p[5]), _mm256_hadd_ps(p[6], p[7]));
                __m256 sum = _mm256_add_ps(_mm256_permute2f128_ps(h0, h1, 0x20), _mm256_permute2f128_ps(h0, h1, 0x31));
                _mm256_storeu_ps(logits + (size_t)r * ld + (t - t0), _mm256_add_ps(sum, _mm256_set1_ps(qz[r])));
            }
        }
        for (; t < end; t++) {
            __m512 acc[8][4];
            if (bits == 3)
                dot_tokens_b3(qs, blk + (size_t)t * cb, cb, d, 1, R, acc);
            else
                dot_tokens(qs, blk + (size_t)t * cb, cb, stride, b, 1, R, acc);
            for (int r = 0; r < R; r++) logits[(size_t)r * ld + (t - t0)] = _mm512_reduce_add_ps(acc[0][r]) + qz[r];
        }
    }
}

/* score_rows with the bits a constant in each instance. */
static ALWAYS_INLINE void score_rows_bits(const float *q, const int R, int d, int G, int bits, const uint8_t *blk,
                                          int block_tokens, int t0, int n, float *logits, int ld, float *scratch) {
    switch (bits) {
    case 2: score_rows(q, R, d, G, 2, blk, block_tokens, t0, n, logits, ld, scratch); break;
    case 3: score_rows(q, R, d, G, 3, blk, block_tokens, t0, n, logits, ld, scratch); break;
    case 4: score_rows(q, R, d, G, 4, blk, block_tokens, t0, n, logits, ld, scratch); break;
    default: score_rows(q, R, d, G, 8, blk, block_tokens, t0, n, logits, ld, scratch); break;
    }
}

bool vq_kivi_score_rows_avx512(const float *q, int R, int d, int G, int bits, const uint8_t *blk, int block_tokens,
                               int t0, int n, float *logits, int ld, float *scratch) {
    if (bits == 3 ? d % 128 != 0 : (bits != 2 && bits != 4 && bits != 8) || (d * bits / 8) % 16 != 0) return false;
    if (R == 4) score_rows_bits(q, 4, d, G, bits, blk, block_tokens, t0, n, logits, ld, scratch);
    else if (R == 2) score_rows_bits(q, 2, d, G, bits, blk, block_tokens, t0, n, logits, ld, scratch);
    else score_rows_bits(q, 1, d, G, bits, blk, block_tokens, t0, n, logits, ld, scratch);
    return true;
}

/* ---------------------------------------------------------------- values */

/* kivi_avx2.c's prep_weights (its comment has the contract) for the 32
 * tokens of a chunk as two 16-lane vectors: the int16 weight pairs wp, the
 * zero terms and the rounding correction added into zv (8 lanes a group,
 * summed at the end of the call), the returned deq. The same operations
 * per token; only the order of the float sums in zv differs. */
float vq_kivi_prep_weights_avx512(const float *wr, const float *sT, const float *smax, const float *zT, int ng,
                                  int cmax, int32_t *wp, size_t gstride, __m256 *zv) {
    const __m512 w0 = _mm512_loadu_ps(wr), w1 = _mm512_loadu_ps(wr + 16);
    __m512 mx = _mm512_max_ps(_mm512_mul_ps(w0, _mm512_loadu_ps(smax)), _mm512_mul_ps(w1, _mm512_loadu_ps(smax + 16)));
    float m = _mm512_reduce_max_ps(_mm512_max_ps(mx, _mm512_setzero_ps()));
    float deq = m / 32767.0f;
    /* a chunk whose largest weight is below 1e-30 gets zero int16 weights
     * (see prep_weights) */
    const __m512 inv = _mm512_set1_ps(m > 1e-30f ? 32767.0f / m : 0.0f);
    const __m256 corr = _mm256_set1_ps(-0.5f * (float)cmax * deq);
    const __m512 wi0 = _mm512_mul_ps(w0, inv), wi1 = _mm512_mul_ps(w1, inv);
    for (int g = 0; g < ng; g++) {
        const float *sg = sT + g * CHUNK, *zg = zT + g * CHUNK;
        __m512 x0 = _mm512_mul_ps(wi0, _mm512_loadu_ps(sg)), x1 = _mm512_mul_ps(wi1, _mm512_loadu_ps(sg + 16));
        __m512i i0 = _mm512_cvtps_epi32(x0), i1 = _mm512_cvtps_epi32(x1);
        __m512 err = _mm512_add_ps(_mm512_sub_ps(_mm512_cvtepi32_ps(i0), x0), _mm512_sub_ps(_mm512_cvtepi32_ps(i1), x1));
        __m512 zw = _mm512_fmadd_ps(w1, _mm512_loadu_ps(zg + 16), _mm512_mul_ps(w0, _mm512_loadu_ps(zg)));
        /* 0 <= x <= 32767 after rounding: the truncating narrow keeps it */
        _mm256_storeu_si256((__m256i *)(wp + g * gstride), _mm512_cvtepi32_epi16(i0));
        _mm256_storeu_si256((__m256i *)(wp + g * gstride + 8), _mm512_cvtepi32_epi16(i1));
        zv[g] = _mm256_fmadd_ps(vq_fold512(err), corr, _mm256_add_ps(zv[g], vq_fold512(zw)));
    }
    return deq;
}

#define VNNI __attribute__((target("avx512f,avx512bw,avx512vl,avx512vnni")))

/* Slot j of b-bit codes in 16-bit lanes x: the top slot shifted down (c),
 * a lower one masked in place (c * 2^(b j); add_rows takes the power back). */
static ALWAYS_INLINE __m512i take_slot(__m512i x, const int b, const int j) {
    if (b == 8) return x;
    if (j == 8 / b - 1) return _mm512_srli_epi16(x, b * j);
    return _mm512_and_si512(x, _mm512_set1_epi16((short)(((1 << b) - 1) << (b * j))));
}

/* One token pair's 32 bytes of plane codes each (ya, yb) as int16 pairs
 * (c_t, c_t+1): lo holds channels 0-7 and 16-23 of the run, hi 8-15 and
 * 24-31 (the in-lane byte interleave; add_rows puts them back in order). */
static ALWAYS_INLINE void widen_pairs32(__m256i ya, __m256i yb, __m512i *lo, __m512i *hi) {
    *lo = _mm512_cvtepu8_epi16(_mm256_unpacklo_epi8(ya, yb));
    *hi = _mm512_cvtepu8_epi16(_mm256_unpackhi_epi8(ya, yb));
}

/* acc[r][0..31] (R rows d apart) += the int sums a[r][0..1] (lane order of
 * widen_pairs32) times deq[r] * fs. */
static ALWAYS_INLINE void add_rows(const __m512i a[4][2], const int R, const float *deq, float fs, float *acc, int d) {
    for (int r = 0; r < R; r++) {
        float *o = acc + (size_t)r * d;
        __m512 f = _mm512_set1_ps(deq[r] * fs);
        /* 128-bit pieces: lo = {0-3, 4-7, 16-19, 20-23}, hi = {8-11, 12-15, 24-27, 28-31} */
        __m512i c0 = _mm512_shuffle_i64x2(a[r][0], a[r][1], 0x44); /* lo.0, lo.1, hi.0, hi.1: channels 0-15 */
        __m512i c1 = _mm512_shuffle_i64x2(a[r][0], a[r][1], 0xEE); /* lo.2, lo.3, hi.2, hi.3: channels 16-31 */
        _mm512_storeu_ps(o, _mm512_fmadd_ps(_mm512_cvtepi32_ps(c0), f, _mm512_loadu_ps(o)));
        _mm512_storeu_ps(o + 16, _mm512_fmadd_ps(_mm512_cvtepi32_ps(c1), f, _mm512_loadu_ps(o + 16)));
    }
}

/* The vpdpwssd of token pair i (codes lo, hi) for slots j0 .. j0 + NJ - 1
 * and R rows into accum_run's sums. */
static ALWAYS_INLINE VNNI void madd_slots(__m512i lo, __m512i hi, const int32_t *const *wj, int i, const int b,
                                          const int j0, const int NJ, const int R, __m512i a[2][4][2]) {
    for (int s = 0; s < NJ; s++) {
        __m512i xl = take_slot(lo, b, j0 + s), xh = take_slot(hi, b, j0 + s);
        for (int r = 0; r < R; r++) {
            __m512i w = _mm512_set1_epi32(wj[s][r * (CHUNK / 2) + i]);
            a[s][r][0] = _mm512_dpwssd_epi32(a[s][r][0], xl, w);
            a[s][r][1] = _mm512_dpwssd_epi32(a[s][r][1], xh, w);
        }
    }
}

/* Slots j0 .. j0 + NJ - 1 of one 32-byte run of plane codes (channels
 * j stride + u .. +31, each slot inside one value group) for R rows over a
 * chunk of cn tokens: each pair's bytes are widened once for the NJ slots,
 * and each weight broadcast feeds two vpdpwssd. wj[s]: the rows' weight
 * pairs of slot j0 + s's group ([row][pair], CHUNK / 2 pairs a row). */
static ALWAYS_INLINE VNNI void accum_run(const uint8_t *codes, size_t cb, int cn, const int32_t *const *wj,
                                         const int b, const int j0, const int NJ, const int R, const float *deq,
                                         float *const *accj, int d) {
    __m512i a[2][4][2]; /* [slot][row][half] */
    for (int s = 0; s < NJ; s++)
        for (int r = 0; r < R; r++) a[s][r][0] = a[s][r][1] = _mm512_setzero_si512();
    __m512i lo, hi;
    const uint8_t *ca = codes, *end = codes + (size_t)(cn & ~1) * cb;
    int i = 0;
    for (; ca != end; ca += 2 * cb, i++) {
        widen_pairs32(_mm256_loadu_si256((const __m256i *)ca), _mm256_loadu_si256((const __m256i *)(ca + cb)), &lo,
                      &hi);
        madd_slots(lo, hi, wj, i, b, j0, NJ, R, a);
    }
    if (cn & 1) { /* the odd last token, paired with itself: its partner's weight is 0 */
        __m256i y = _mm256_loadu_si256((const __m256i *)ca);
        widen_pairs32(y, y, &lo, &hi);
        madd_slots(lo, hi, wj, i, b, j0, NJ, R, a);
    }
    for (int s = 0; s < NJ; s++) {
        const int j = j0 + s;
        add_rows(a[s], R, deq, b == 8 || j == 8 / b - 1 ? 1.0f : 1.0f / (float)(1 << (b * j)), accj[s], d);
    }
}

/* All slots of b-bit plane codes for one chunk (cn tokens) and R rows: runs
 * of 32 bytes, two slots at a time (16 int32 accumulators for 4 rows; all
 * four 2-bit slots at once would take all 32 registers). wp is
 * [group][row][pair]. */
static ALWAYS_INLINE VNNI void accum_plane(const uint8_t *codes, size_t cb, int cn, const int b, int G,
                                           const int32_t *wp, const float *deq, const int R, float *acc, int d) {
    const int stride = (int)cb, slots = 8 / b;
    for (int u = 0; u < stride; u += 32)
        for (int j = 0; j < slots; j += 2) {
            const int NJ = slots - j >= 2 ? 2 : 1;
            const int32_t *wj[2];
            float *accj[2];
            for (int s = 0; s < NJ; s++) {
                int ch = (j + s) * stride + u;
                wj[s] = wp + (size_t)(ch / G) * R * (CHUNK / 2);
                accj[s] = acc + ch;
            }
            if (NJ == 2)
                accum_run(codes + u, cb, cn, wj, b, j, 2, R, deq, accj, d);
            else
                accum_run(codes + u, cb, cn, wj, b, j, 1, R, deq, accj, d);
        }
}

/* One token's 32 bytes of 3-bit codes for slot j of a run: the 2-bit part
 * from slot j of the 2-bit plane bytes c2 and the high bit from the 1-bit
 * plane bytes c1 (m1: its bit in each byte), joined in place as
 * (c2 + 4 c1) * 2^e, e = 2 j (4 for j = 3, so 7 * 2^e fits a byte), as
 * kivi_avx2.c's join_b3 does for 16 bytes. */
static ALWAYS_INLINE __m256i join_b3(__m256i c2, __m256i c1, __m256i m1, const int j) {
    const int e = j < 3 ? 2 * j : 4;
    __m256i lo = _mm256_and_si256(j < 3 ? c2 : _mm256_srli_epi16(c2, 2), _mm256_set1_epi8((char)(3 << e)));
    __m256i off = _mm256_cmpeq_epi8(_mm256_and_si256(c1, m1), _mm256_setzero_si256());
    return _mm256_or_si256(lo, _mm256_andnot_si256(off, _mm256_set1_epi8((char)(4 << e))));
}

/* The 1-bit plane bytes of a token for the 32 channels j s2 + u .. +31 of
 * a run (s1 = d / 8 bytes of them): s1 = 16, the same 16 bytes for both
 * halves (their bits differ: see m1_for); s1 a multiple of 32, 32 bytes. */
static ALWAYS_INLINE __m256i high_bytes(const uint8_t *c1, int s1, int u) {
    if (s1 == 16) return _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)c1));
    return _mm256_loadu_si256((const __m256i *)(c1 + u % s1));
}

/* The high bit's place in high_bytes for slot j: slot 2 j + (u + i) / s1
 * of byte i. */
static ALWAYS_INLINE __m256i m1_for(int s1, int u, const int j) {
    if (s1 == 16) return _mm256_set_m128i(_mm_set1_epi8((char)(1 << (2 * j + 1))), _mm_set1_epi8((char)(1 << (2 * j))));
    return _mm256_set1_epi8((char)(1 << (2 * j + u / s1)));
}

/* accum_run for 3-bit codes: slots j0, j0 + 1 of the 2-bit plane run u (32
 * channels each), their high bits joined in (join_b3) before the widening. */
static ALWAYS_INLINE VNNI void accum_run_b3(const uint8_t *codes, size_t cb, int cn, int u, int d,
                                            const int32_t *const *wj, const int j0, const int R, const float *deq,
                                            float *const *accj) {
    const int s2 = d / 4, s1 = d / 8;
    __m512i a[2][4][2]; /* [slot][row][half] */
    for (int s = 0; s < 2; s++)
        for (int r = 0; r < R; r++) a[s][r][0] = a[s][r][1] = _mm512_setzero_si512();
    const __m256i m1[2] = {m1_for(s1, u, j0), m1_for(s1, u, j0 + 1)};
    __m512i lo, hi;
    const uint8_t *ca = codes, *end = codes + (size_t)(cn & ~1) * cb;
    int i = 0;
    for (; ca != end; ca += 2 * cb, i++) {
        __m256i c2a = _mm256_loadu_si256((const __m256i *)(ca + u)), c2b = _mm256_loadu_si256((const __m256i *)(ca + cb + u));
        __m256i c1a = high_bytes(ca + s2, s1, u), c1b = high_bytes(ca + cb + s2, s1, u);
        for (int s = 0; s < 2; s++) {
            widen_pairs32(join_b3(c2a, c1a, m1[s], j0 + s), join_b3(c2b, c1b, m1[s], j0 + s), &lo, &hi);
            for (int r = 0; r < R; r++) {
                __m512i w = _mm512_set1_epi32(wj[s][r * (CHUNK / 2) + i]);
                a[s][r][0] = _mm512_dpwssd_epi32(a[s][r][0], lo, w);
                a[s][r][1] = _mm512_dpwssd_epi32(a[s][r][1], hi, w);
            }
        }
    }
    if (cn & 1) { /* the odd last token, paired with itself: its partner's weight is 0 */
        __m256i c2a = _mm256_loadu_si256((const __m256i *)(ca + u)), c1a = high_bytes(ca + s2, s1, u);
        for (int s = 0; s < 2; s++) {
            __m256i x = join_b3(c2a, c1a, m1[s], j0 + s);
            widen_pairs32(x, x, &lo, &hi);
            for (int r = 0; r < R; r++) {
                __m512i w = _mm512_set1_epi32(wj[s][r * (CHUNK / 2) + i]);
                a[s][r][0] = _mm512_dpwssd_epi32(a[s][r][0], lo, w);
                a[s][r][1] = _mm512_dpwssd_epi32(a[s][r][1], hi, w);
            }
        }
    }
    for (int s = 0; s < 2; s++) {
        const int j = j0 + s;
        add_rows(a[s], R, deq, 1.0f / (float)(1 << (j < 3 ? 2 * j : 4)), accj[s], d);
    }
}

/* Every channel of 3-bit codes for one chunk and R rows (d a multiple of
 * 128): channel j s2 + u + i, slots two at a time. */
static ALWAYS_INLINE VNNI void accum_planes_b3(const uint8_t *codes, size_t cb, int cn, int G, const int32_t *wp,
                                               const float *deq, const int R, float *acc, int d) {
    const int s2 = d / 4;
    for (int u = 0; u < s2; u += 32)
        for (int j = 0; j < 4; j += 2) {
            const int32_t *wj[2];
            float *accj[2];
            for (int s = 0; s < 2; s++) {
                int ch = (j + s) * s2 + u;
                wj[s] = wp + (size_t)(ch / G) * R * (CHUNK / 2);
                accj[s] = acc + ch;
            }
            accum_run_b3(codes, cb, cn, u, d, wj, j, R, deq, accj);
        }
}

/* accum_plane or accum_planes_b3 with the bits a constant in each instance. */
static ALWAYS_INLINE VNNI void accum_bits(const uint8_t *codes, size_t cb, int cn, int bits, int G, const int32_t *wp,
                                         const float *deq, const int R, float *acc, int d) {
    switch (bits) {
    case 2: accum_plane(codes, cb, cn, 2, G, wp, deq, R, acc, d); break;
    case 3: accum_planes_b3(codes, cb, cn, G, wp, deq, R, acc, d); break;
    case 4: accum_plane(codes, cb, cn, 4, G, wp, deq, R, acc, d); break;
    default: accum_plane(codes, cb, cn, 8, G, wp, deq, R, acc, d); break;
    }
}

VNNI bool vq_kivi_accum_rows_avx512(const uint8_t *codes, size_t cb, int cn, int bits, int G, const int32_t *wp,
                                    const float *deq, int R, float *acc, int d) {
    if (G % 32 != 0) return false;
    if (bits == 3 ? d % 128 != 0 : (bits != 2 && bits != 4 && bits != 8) || cb % 32 != 0) return false;
    if (R == 4) accum_bits(codes, cb, cn, bits, G, wp, deq, 4, acc, d);
    else if (R == 2) accum_bits(codes, cb, cn, bits, G, wp, deq, 2, acc, d);
    else accum_bits(codes, cb, cn, bits, G, wp, deq, 1, acc, d);
    return true;
}
