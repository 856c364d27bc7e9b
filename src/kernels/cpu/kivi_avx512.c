/* AVX-512 kernels for KIVI (2, 3, 4 and 8 bits) at CPU level avx512: the
 * key scores of a row group (4, 2 or 1 q heads of one kv head) 16 channels
 * per instruction, and the value accumulation with VNNI (vpdpwssd adds the
 * madd of a token pair into the int32 sums in one instruction, where AVX2
 * needs a madd and an add). Both follow the AVX2 kernels' math (kivi_avx2.c's
 * header has the why): q' = q * scale with the slot's power of two, masked
 * codes in place, FMAs into float partial sums for keys; int16 weight pairs
 * times codes summed in int32 for values. Keys of 2, 4 and 8 bits whose
 * code rows are 16 to 256 bytes, and of 3 bits at d = 64, 128 and 256, take a
 * VNNI form instead when the CPU has it (vpdpbusd of 16 tokens' codes with
 * q' rounded to integers in three byte digits; "keys by VNNI" below).
 * Keys: kivi_avx2.c's driver calls vq_kivi_score_rows_avx512 for its row
 * groups when the shape allows.
 * Values: vq_kivi_accum_avx512 is a whole driver of its own, which also
 * builds each chunk's tables (the (scale, zero) floats by group, the int16
 * weights) with AVX-512.
 *
 * Built with the AVX-512 flags of the other *_avx512.c files; the VNNI
 * functions also carry their own target attribute, so no other code in
 * these files can be compiled into VNNI instructions (Skylake-X has
 * AVX-512 without VNNI). */
#include "high_bytes.h"
#include "reduce_avx2.h"
#include "reduce_avx512.h"
#include "vq_internal.h"

#include <float.h>
#include <immintrin.h>
#include <string.h>

#if defined(__GNUC__)
#define ALWAYS_INLINE inline __attribute__((always_inline))
#else
#define ALWAYS_INLINE inline
#endif

#define VNNI __attribute__((target("avx512f,avx512bw,avx512vl,avx512vnni")))

/* Floats of q' for 4 rows in steps of `step` bytes (kivi_avx2.c). */
size_t vq_kivi_key_qs_floats(int bits, int d, int step);

/* Tokens per value chunk: kivi_avx2.c's CHUNK (its comment has the why),
 * the pair stride of the weight table. */
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
    for (int u = 0; u < stride; u += 16) {
        /* a plane stride of 4, 8 or 12 mod 16 bytes (2-bit codes at d = 96:
         * 24) ends in a shorter step: its other lanes read the next bytes
         * (more codes, or the block's metadata after the last token) and
         * get q' = 0; q and the scales are read under the mask */
        const __mmask16 k = stride - u >= 16 ? 0xFFFF : (__mmask16)((1u << (stride - u)) - 1);
        for (int j = 0; j < slots; j++) {
            int c = j * stride + u;
            __m512 f = pow2(whole || j == slots - 1 ? 0 : -b * j);
            __m512 sf = _mm512_mul_ps(_mm512_cvtph_ps(_mm256_maskz_loadu_epi16(k, sc + c)), f);
            for (int r = 0; r < R; r++, o += 16)
                _mm512_storeu_ps(o, _mm512_mul_ps(_mm512_maskz_loadu_ps(k, q + (size_t)r * d + c), sf));
        }
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
 * token (tails). A token's codes are loaded again for every slot instead
 * of held across the slots: holding 4 tokens' codes next to 16
 * accumulators, 4 q' vectors and the masks, GCC 12 ran out of the 32
 * registers and kept accumulators on the stack (2-bit, 4 rows, one block
 * in L1: 33 -> 24 cycles a token). The empty asm stops it from merging the
 * loads back into one. */
static ALWAYS_INLINE void dot_tokens(const float *qs, const uint8_t *c, size_t cb, int stride, const int b, const int K,
                                     const int R, __m512 acc[8][4]) {
    const float *qp = qs;
    for (int k = 0; k < K; k++)
        for (int r = 0; r < R; r++) acc[k][r] = _mm512_setzero_ps();
    for (int u = 0; u < stride; u += 16) {
        for (int j = 0; j < 8 / b; j++, qp += 16 * R)
            for (int k = 0; k < K; k++) {
                __m512i x = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(c + k * cb + u)));
                __asm__("" : "+v"(x));
                __m512 f = slot_f(x, b, j);
                for (int r = 0; r < R; r++) acc[k][r] = _mm512_fmadd_ps(_mm512_loadu_ps(qp + 16 * r), f, acc[k][r]);
            }
    }
}

/* dot_tokens for 3-bit codes: per 16 channels of slot j, the 2-bit part
 * (x >> 2 j) & 3 and the high bit from slot 2 j + k0 of the 1-bit plane
 * bytes (the same channels, s1 = d / 8 apart) joined into c2 + 4 c1 by one
 * vpternlogd before one conversion and the rows' FMAs. d a multiple of
 * 128: every step's 16 channels take their high bits from one 1-bit slot
 * (k0 = u / s1). `across` (d < 128, a multiple of 16: s1 = d / 8 < 16
 * bytes): a step may cross from 1-bit slot 2 j to 2 j + 1 (d = 96: s1 = 12,
 * the step at u = 0 covers bytes 0-11 of the plane and then 0-3 again), so
 * its high bytes are placed by a byte shuffle (vq_high_bytes16) and each
 * lane's bit is brought to the same place by a per-lane shift; the last
 * step of a plane stride of 4, 8 or 12 mod 16 reads past the plane with q'
 * zero there (prep_keys). */
static ALWAYS_INLINE void dot_tokens_b3(const float *qs, const uint8_t *c, size_t cb, int d, const bool across,
                                        const int K, const int R, __m512 acc[8][4]) {
    const int s2 = d / 4, s1 = d / 8;
    const __m512i four = _mm512_set1_epi32(4);
    const float *qp = qs;
    for (int k = 0; k < K; k++)
        for (int r = 0; r < R; r++) acc[k][r] = _mm512_setzero_ps();
    for (int u = 0; u < s2; u += 16) {
        const int k0 = across ? 0 : u / s1; /* the 1-bit slot of j = 0 */
        __m512i x[8], y[8];
        for (int k = 0; k < K; k++) {
            const uint8_t *ck = c + k * cb;
            x[k] = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(ck + u)));
            if (across) {
                /* lane i: plane byte (u + i) mod s1 shifted left by 2 - second_i,
                 * so its slot 2 j + second_i bit lands at 2 j + 2 */
                __m128i second;
                __m128i hb = vq_high_bytes16(ck + s2, u, s1, &second);
                y[k] = _mm512_sllv_epi32(_mm512_cvtepu8_epi32(hb),
                                         _mm512_sub_epi32(_mm512_set1_epi32(2), _mm512_cvtepu8_epi32(second)));
            } else {
                y[k] = _mm512_slli_epi32(_mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(ck + s2 + u % s1))), 2);
            }
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
static ALWAYS_INLINE void score_rows(const float *q, const int R, int d, int G, const int bits, const bool across,
                                     const uint8_t *blk, int block_tokens, int t0, int n, float *logits, int ld,
                                     float *scratch) {
    /* 3-bit codes: the 2-bit plane set's slots, whole (see prep_keys) */
    const int b = bits == 3 ? 2 : bits, stride = bits == 3 ? d / 4 : d * b / 8;
    const size_t cb = (size_t)d * (size_t)bits / 8;
    const uint16_t *meta = (const uint16_t *)(blk + (size_t)block_tokens * cb);
    float *qs = scratch, *qz = scratch + vq_kivi_key_qs_floats(bits, d, 16);
    for (int t = t0; t < t0 + n;) {
        int g = t / G, end = (g + 1) * G < t0 + n ? (g + 1) * G : t0 + n;
        const uint16_t *sc = meta + (size_t)g * 2 * d;
        prep_keys(q, R, d, b, stride, bits == 3, sc, sc + d, qs, qz);
        if (R == 4) {
            /* The 16 sums of each 4 tokens x 4 rows by one 16-vector tree
             * (vq_sum16x16, lane 4 e + r: token e, row r), then rows 2 i
             * and 2 i + 1 of 8 tokens gathered from two such vectors by one
             * vpermt2ps. Against folding every accumulator to 8 lanes and
             * summing 8 tokens a row by hadds: 2-bit 27 -> 24, 4-bit 27 ->
             * 25 cycles a token (one block in L1). */
            static const int32_t rows01[16] = {0, 4, 8, 12, 16, 20, 24, 28, 1, 5, 9, 13, 17, 21, 25, 29};
            static const int32_t rows23[16] = {2, 6, 10, 14, 18, 22, 26, 30, 3, 7, 11, 15, 19, 23, 27, 31};
            const __m512i sel[2] = {_mm512_loadu_si512(rows01), _mm512_loadu_si512(rows23)};
            const __m512 qzv[2] = {_mm512_mask_blend_ps(0xFF00, _mm512_set1_ps(qz[0]), _mm512_set1_ps(qz[1])),
                                   _mm512_mask_blend_ps(0xFF00, _mm512_set1_ps(qz[2]), _mm512_set1_ps(qz[3]))};
            for (; t + 8 <= end; t += 8) {
                __m512 v[2];
                for (int h = 0; h < 2; h++) {
                    __m512 acc[8][4], a[16];
                    if (bits == 3)
                        dot_tokens_b3(qs, blk + (size_t)(t + 4 * h) * cb, cb, d, across, 4, 4, acc);
                    else
                        dot_tokens(qs, blk + (size_t)(t + 4 * h) * cb, cb, stride, b, 4, 4, acc);
                    for (int r = 0; r < 4; r++)
                        for (int e = 0; e < 4; e++) a[4 * r + e] = acc[e][r];
                    v[h] = vq_sum16x16(a);
                }
                for (int i = 0; i < 2; i++) {
                    __m512 x = _mm512_add_ps(_mm512_permutex2var_ps(v[0], sel[i], v[1]), qzv[i]);
                    _mm256_storeu_ps(logits + (size_t)(2 * i) * ld + (t - t0), _mm512_castps512_ps256(x));
                    _mm256_storeu_ps(logits + (size_t)(2 * i + 1) * ld + (t - t0),
                                     _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(x), 1)));
                }
            }
        }
        /* fewer rows: 8 tokens' partials per row summed by one transposing
         * tree, 8 logits per store (as the AVX2 kernel) */
        for (; t + 8 <= end; t += 8) {
            __m256 part[4][8]; /* [row][token] */
            for (int k = 0; k < 8; k += kt(R)) {
                __m512 acc[8][4];
                if (bits == 3)
                    dot_tokens_b3(qs, blk + (size_t)(t + k) * cb, cb, d, across, kt(R), R, acc);
                else
                    dot_tokens(qs, blk + (size_t)(t + k) * cb, cb, stride, b, kt(R), R, acc);
                for (int r = 0; r < R; r++)
                    for (int e = 0; e < kt(R); e++) part[r][k + e] = vq_fold512(acc[e][r]);
            }
            for (int r = 0; r < R; r++) {
                __m256 sum = vq_sum8x8(part[r]);
                _mm256_storeu_ps(logits + (size_t)r * ld + (t - t0), _mm256_add_ps(sum, _mm256_set1_ps(qz[r])));
            }
        }
        for (; t < end; t++) {
            __m512 acc[8][4];
            if (bits == 3)
                dot_tokens_b3(qs, blk + (size_t)t * cb, cb, d, across, 1, R, acc);
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
    case 2: score_rows(q, R, d, G, 2, false, blk, block_tokens, t0, n, logits, ld, scratch); break;
    case 3:
        if (d % 128 == 0) score_rows(q, R, d, G, 3, false, blk, block_tokens, t0, n, logits, ld, scratch);
        else score_rows(q, R, d, G, 3, true, blk, block_tokens, t0, n, logits, ld, scratch);
        break;
    case 4: score_rows(q, R, d, G, 4, false, blk, block_tokens, t0, n, logits, ld, scratch); break;
    default: score_rows(q, R, d, G, 8, false, blk, block_tokens, t0, n, logits, ld, scratch); break;
    }
}

/* ------------------------------------------------- keys by VNNI, tokens in lanes */

/* Row r's sum (or max) of x[r]'s 16 lanes, in every lane of 128-bit lane r
 * (r < 4; missing rows read as x[0]): two 128-bit lane shuffles fold
 * rows in pairs, two more bring each row to its own lane, and two in-lane
 * steps finish, 13 instructions for 4 rows where one horizontal reduction
 * a row takes 8. */
static ALWAYS_INLINE __m512 rows_fold(const __m512 *x, const int R, const bool max) {
    const __m512 x1 = x[R > 1 ? 1 : 0], x2 = x[R > 2 ? 2 : 0], x3 = x[R > 3 ? 3 : 0];
    __m512 u0a = _mm512_shuffle_f32x4(x[0], x1, 0x44), u0b = _mm512_shuffle_f32x4(x[0], x1, 0xEE);
    __m512 u1a = _mm512_shuffle_f32x4(x2, x3, 0x44), u1b = _mm512_shuffle_f32x4(x2, x3, 0xEE);
    __m512 u0 = max ? _mm512_max_ps(u0a, u0b) : _mm512_add_ps(u0a, u0b); /* lanes: r0 L0|2, r0 L1|3, r1 .., r1 .. */
    __m512 u1 = max ? _mm512_max_ps(u1a, u1b) : _mm512_add_ps(u1a, u1b);
    __m512 va = _mm512_shuffle_f32x4(u0, u1, 0x88), vb = _mm512_shuffle_f32x4(u0, u1, 0xDD);
    __m512 v = max ? _mm512_max_ps(va, vb) : _mm512_add_ps(va, vb); /* 128-bit lane r: row r's 4 partials */
    __m512 w = _mm512_permute_ps(v, 0x4E);
    v = max ? _mm512_max_ps(v, w) : _mm512_add_ps(v, w);
    w = _mm512_permute_ps(v, 0xB1);
    return max ? _mm512_max_ps(v, w) : _mm512_add_ps(v, w);
}

/* q' of R rows for one key group as integers in three signed byte digits:
 * x = round(q' 2^E_r) = 65536 A + 256 B + C, A, B, C in [-128, 127], E_r
 * the largest with max |x| < 2^23 / (1 + 2^-7) (the margin keeps A inside
 * its byte after the carries below). Per 4 channels (c .. c + 3)
 * qd holds 16 bytes, the dwords of their C, B and A digits and a spare one,
 * at qd + r 4 d + 4 c: each is one broadcast operand of dot16_vnni.
 * unit[4 r] = 2^-E_r and qz[4 r] = sum_c q_r,c zero_c (16 floats each).
 * Returns false (and the float kernels take the group) when a row's
 * max |q'| is below 2^-100 (2^E or 2^-E would leave the float exponents;
 * such a row's scores are qz to within 1e-30 anyway) or not finite.
 *
 * Why three digits: the logit's error from rounding q' is at most
 * sum_c c_c |e_c| <= (2^b - 1) d 2^-23 max |q'|, 2^8 times below that of
 * 15-bit q' (int16 with a power of two a channel, tried before: 1.5e-3
 * relative error on test_attend's keys x 60 case, whose bound is 1e-4).
 *
 * The digits by one add: y = x + 128 + 128 * 256 has bytes C + 128,
 * B + 128 and A (the carries of the balanced digits done by the add), so
 * one in-lane byte shuffle gathers each digit of 4 channels into a dword
 * and one xor takes the 128s off. */
static ALWAYS_INLINE VNNI bool prep_digits(const float *q, const int R, const int d, const uint16_t *sc,
                                           const uint16_t *zr, int8_t *qd, float *unit, float *qz) {
    __m512 mx[4], z[4];
    for (int r = 0; r < R; r++) mx[r] = z[r] = _mm512_setzero_ps();
    for (int c = 0; c < d; c += 16) {
        const __m512 sf = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(sc + c)));
        const __m512 zf = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(zr + c)));
        for (int r = 0; r < R; r++) {
            __m512 qv = _mm512_loadu_ps(q + (size_t)r * d + c);
            mx[r] = _mm512_max_ps(mx[r], _mm512_abs_ps(_mm512_mul_ps(qv, sf)));
            z[r] = _mm512_fmadd_ps(qv, zf, z[r]);
        }
    }
    /* m (1 + 2^-7) < 2^e for the rows' maxima m, e from the exponent bits
     * (normal here); E = 23 - e */
    const __m512 m = rows_fold(mx, R, true), mm = _mm512_mul_ps(m, _mm512_set1_ps(1.0f + 0x1p-7f));
    if (_mm512_cmp_ps_mask(m, _mm512_set1_ps(0x1p-100f), _CMP_GE_OQ) != 0xFFFF ||
        _mm512_cmp_ps_mask(mm, _mm512_set1_ps(FLT_MAX), _CMP_LE_OQ) != 0xFFFF)
        return false;
    const __m512i eb = _mm512_srli_epi32(_mm512_castps_si512(mm), 23); /* e + 126 */
    const __m512 fv = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_sub_epi32(_mm512_set1_epi32(276), eb), 23));
    _mm512_storeu_ps(unit, _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_sub_epi32(eb, _mm512_set1_epi32(22)), 23)));
    _mm512_storeu_ps(qz, rows_fold(z, R, false));
    __m512 f[4];
    for (int r = 0; r < R; r++) f[r] = _mm512_permutexvar_ps(_mm512_set1_epi32(4 * r), fv);
    const __m512i bias = _mm512_set1_epi32(128 + 128 * 256);
    const __m512i gather =
        _mm512_broadcast_i32x4(_mm_setr_epi8(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, -1, -1, -1, -1));
    const __m512i flip = _mm512_broadcast_i32x4(_mm_setr_epi32((int)0x80808080, (int)0x80808080, 0, 0));
    for (int c = 0; c < d; c += 16) {
        const __m512 sf = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(sc + c)));
        for (int r = 0; r < R; r++) {
            __m512 x = _mm512_mul_ps(_mm512_mul_ps(_mm512_loadu_ps(q + (size_t)r * d + c), sf), f[r]);
            __m512i y = _mm512_add_epi32(_mm512_cvtps_epi32(x), bias);
            _mm512_storeu_si512(qd + (size_t)r * 4 * d + 4 * c,
                                _mm512_xor_si512(_mm512_shuffle_epi8(y, gather), flip));
        }
    }
    return true;
}

/* a + the 4-byte dot products of unsigned x with the signed bytes of the
 * dword at w broadcast (vpdpbusd with its memory operand broadcast): asm
 * for the reason dpwssd gives below. */
static ALWAYS_INLINE VNNI __m512i dpbusd_b(__m512i a, __m512i x, const int8_t *w) {
    __asm__("vpdpbusd %2%{1to16%}, %1, %0" : "+v"(a) : "v"(x), "m"(*(const int32_t *)w));
    return a;
}

/* 16 tokens' 16-byte pieces (the first at c, the others cb bytes apart)
 * transposed in registers: lane 4 L + p of w[k] holds dword k of token
 * 4 L + p (4 loads, 12 inserts, 8 unpacks). */
static ALWAYS_INLINE void transpose16(const uint8_t *c, const size_t cb, __m512i w[4]) {
    __m512i z[4], t[4];
    for (int p = 0; p < 4; p++) {
        /* 128-bit lane L: token p + 4 L */
        const uint8_t *cp = c + (size_t)p * cb;
        __m512i x = _mm512_castsi128_si512(_mm_loadu_si128((const __m128i *)cp));
        x = _mm512_inserti32x4(x, _mm_loadu_si128((const __m128i *)(cp + 4 * cb)), 1);
        x = _mm512_inserti32x4(x, _mm_loadu_si128((const __m128i *)(cp + 8 * cb)), 2);
        z[p] = _mm512_inserti32x4(x, _mm_loadu_si128((const __m128i *)(cp + 12 * cb)), 3);
    }
    t[0] = _mm512_unpacklo_epi32(z[0], z[1]);
    t[1] = _mm512_unpackhi_epi32(z[0], z[1]);
    t[2] = _mm512_unpacklo_epi32(z[2], z[3]);
    t[3] = _mm512_unpackhi_epi32(z[2], z[3]);
    w[0] = _mm512_unpacklo_epi64(t[0], t[2]);
    w[1] = _mm512_unpackhi_epi64(t[0], t[2]);
    w[2] = _mm512_unpacklo_epi64(t[1], t[3]);
    w[3] = _mm512_unpackhi_epi64(t[1], t[3]);
}

/* 4 channels' codes of 16 tokens (bytes of v) into the rows' digit sums;
 * qc: those channels' digits of row 0. */
static ALWAYS_INLINE VNNI void dot_slot(__m512i acc[4][3], __m512i v, const int8_t *qc, const int R, const int d) {
#pragma GCC unroll 4
    for (int r = 0; r < R; r++)
#pragma GCC unroll 3
        for (int g = 0; g < 3; g++) acc[r][g] = dpbusd_b(acc[r][g], v, qc + (size_t)r * 4 * d + 4 * g);
}

/* Slot j of plane dwords w as bytes: (w >> b j) & mask; 3 bits: the 2-bit
 * slot j joined with its high bit, bit 2 j of the 1-bit dwords h (already
 * shifted by the piece's first slot), as c2 + 4 c1 (imm 0xEC: (a & c) | b). */
static ALWAYS_INLINE __m512i slot_bytes(__m512i w, __m512i h, const __m512i mask, const int b, const int j) {
    if (b == 8) return w;
    __m512i x = j ? _mm512_srli_epi32(w, (b == 3 ? 2 : b) * j) : w;
    if (b != 3) return _mm512_and_si512(x, mask);
    /* bit 2 j of each byte to bit 2 (rotations: the bits that wrap around
     * land outside the mask) */
    __m512i hb = j == 0   ? _mm512_rol_epi32(h, 2)
                 : j == 1 ? h
                 : j == 2 ? _mm512_ror_epi32(h, 2)
                          : _mm512_ror_epi32(h, 4);
    return _mm512_ternarylogic_epi32(x, _mm512_and_si512(hb, _mm512_set1_epi8(4)), mask, 0xEC);
}

/* Logits of 16 tokens (codes at c, cb bytes apart) for R rows. Each
 * 16-byte piece of the 16 tokens' plane codes is transposed in registers
 * so that lane t holds token t's dword k; slot j of it, masked to bytes,
 * holds 4 channels' codes, which one vpdpbusd per (row, digit) multiplies
 * by the rows' digits of those channels and sums. No reduction tree: the
 * lanes are the tokens. 3 bits (d = 128, 256): the 2-bit plane set
 * (s2 = d / 4 bytes) by pieces, each with the 1-bit plane's piece that
 * holds the same channels' high bits: channel j s2 + u + 4 k + i is bit
 * 2 j + u / s1 of 1-bit byte (u mod s1) + 4 k + i (s1 = d / 8); at d = 64
 * (s1 = 8) bit 2 j + k / 2 of byte 4 (k mod 2) + i. */
static ALWAYS_INLINE VNNI void dot16_vnni(const int8_t *qd, const float *unit, const float *qz, const uint8_t *c,
                                          const size_t cb, const int d, const int b, const int R, float *logits,
                                          int ld) {
    __m512i acc[4][3];
    for (int r = 0; r < R; r++) acc[r][0] = acc[r][1] = acc[r][2] = _mm512_setzero_si512();
    const int bl = b == 3 ? 2 : b; /* bits of the plane set read by slots */
    const size_t s2 = b == 3 ? (size_t)d / 4 : cb, s1 = (size_t)d / 8;
    const __m512i mask = _mm512_set1_epi8((char)((1 << bl) - 1));
    for (size_t u = 0; u < s2; u += 16) {
        __m512i w[4], h[4];
        transpose16(c + u, cb, w);
        if (b == 3 && s1 == 8) {
            /* d = 64: one piece u = 0; dwords 0 and 1 of the 1-bit plane
             * (bytes 8-15 of the piece are the next token's or the
             * metadata's) serve k = 0, 1 at slot 2 j and k = 2, 3 at 2 j + 1 */
            transpose16(c + s2, cb, h);
            h[2] = _mm512_srli_epi32(h[0], 1);
            h[3] = _mm512_srli_epi32(h[1], 1);
        } else if (b == 3) {
            transpose16(c + s2 + u % s1, cb, h);
            const __m128i first = _mm_cvtsi32_si128((int)(u / s1));
            for (int k = 0; k < 4; k++) h[k] = _mm512_srl_epi32(h[k], first);
        } else {
            for (int k = 0; k < 4; k++) h[k] = w[k]; /* unused */
        }
        /* the digits of this piece's channels from one pointer and constant
         * offsets: without the empty asm GCC made a pointer per offset and
         * kept most of them on the stack */
        const int8_t *qu = qd + 4 * u;
        __asm__("" : "+r"(qu));
        /* the slots written out: a loop over them (1, 2 or 4 per b) with
         * an unroll pragma draws a warning at -O2 */
#pragma GCC unroll 4
        for (int k = 0; k < 4; k++) {
            /* slot j of byte u + 4 k + i holds channel j s2 + u + 4 k + i */
            dot_slot(acc, slot_bytes(w[k], h[k], mask, b, 0), qu + 16 * k, R, d);
            if (bl <= 4) dot_slot(acc, slot_bytes(w[k], h[k], mask, b, 1), qu + 4 * (s2 + 4 * k), R, d);
            if (bl == 2) {
                dot_slot(acc, slot_bytes(w[k], h[k], mask, b, 2), qu + 4 * (2 * s2 + 4 * k), R, d);
                dot_slot(acc, slot_bytes(w[k], h[k], mask, b, 3), qu + 4 * (3 * s2 + 4 * k), R, d);
            }
        }
    }
    for (int r = 0; r < R; r++) {
        __m512 s =
            _mm512_fmadd_ps(_mm512_cvtepi32_ps(acc[r][2]), _mm512_set1_ps(256.0f), _mm512_cvtepi32_ps(acc[r][1]));
        s = _mm512_fmadd_ps(s, _mm512_set1_ps(256.0f), _mm512_cvtepi32_ps(acc[r][0]));
        _mm512_storeu_ps(logits + (size_t)r * ld,
                         _mm512_fmadd_ps(s, _mm512_set1_ps(unit[4 * r]), _mm512_set1_ps(qz[4 * r])));
    }
}

/* Scores of tokens [t0, t0 + n) for R rows of b-bit codes (2, 4, 8 with
 * code rows of whole 16-byte pieces; 3 at d = 64, 128, 256) with VNNI: 16
 * tokens a step by dot16_vnni, the float kernels for a group's last tokens
 * short of 16 and for groups whose q' prep_digits declines. */
static ALWAYS_INLINE VNNI void score_rows_vnni(const float *q, const int R, const int d, int G, const int b,
                                               const uint8_t *blk, int block_tokens, int t0, int n, float *logits,
                                               int ld, float *scratch) {
    const size_t cb = (size_t)d * (size_t)b / 8;
    const uint16_t *meta = (const uint16_t *)(blk + (size_t)block_tokens * cb);
    /* qz and unit: 16 floats each, row r's at 4 r (prep_digits) */
    float *qs = scratch, *qz = scratch + vq_kivi_key_qs_floats(b, d, 16), *unit = qz + 16;
    int8_t *qd = (int8_t *)(unit + 16);
    for (int t = t0; t < t0 + n;) {
        int g = t / G, end = (g + 1) * G < t0 + n ? (g + 1) * G : t0 + n;
        const uint16_t *sc = meta + (size_t)g * 2 * d;
        if (end - t >= 16 && prep_digits(q, R, d, sc, sc + d, qd, unit, qz))
            for (; t + 16 <= end; t += 16)
                dot16_vnni(qd, unit, qz, blk + (size_t)t * cb, cb, d, b, R, logits + (t - t0), ld);
        if (t < end) {
            if (b == 3) prep_keys(q, R, d, 2, d / 4, true, sc, sc + d, qs, qz);
            else prep_keys(q, R, d, b, (int)cb, false, sc, sc + d, qs, qz);
            for (; t < end; t++) {
                __m512 acc[8][4];
                if (b == 3) dot_tokens_b3(qs, blk + (size_t)t * cb, cb, d, d % 128 != 0, 1, R, acc);
                else dot_tokens(qs, blk + (size_t)t * cb, cb, (int)cb, b, 1, R, acc);
                for (int r = 0; r < R; r++)
                    logits[(size_t)r * ld + (t - t0)] = _mm512_reduce_add_ps(acc[0][r]) + qz[r];
            }
        }
    }
}

/* score_rows_vnni with R, the bits and the code row bytes (hence d)
 * constants in each instance: the 16 tokens' loads then take one base
 * register and constant offsets (with cb a variable GCC kept 16 token
 * pointers, most of them on the stack). */
static ALWAYS_INLINE VNNI void score_vnni_rows(const float *q, int R, const int d, int G, const int b,
                                               const uint8_t *blk, int block_tokens, int t0, int n, float *logits,
                                               int ld, float *scratch) {
    if (R == 4) score_rows_vnni(q, 4, d, G, b, blk, block_tokens, t0, n, logits, ld, scratch);
    else if (R == 2) score_rows_vnni(q, 2, d, G, b, blk, block_tokens, t0, n, logits, ld, scratch);
    else score_rows_vnni(q, 1, d, G, b, blk, block_tokens, t0, n, logits, ld, scratch);
}

/* score_vnni_rows for head dim d and b bits, both constants; false when a
 * token's codes are less than one 16-byte piece (the instance is then
 * never built). */
static ALWAYS_INLINE VNNI bool score_vnni_d(const float *q, int R, const int d, int G, const int b, const uint8_t *blk,
                                            int block_tokens, int t0, int n, float *logits, int ld, float *scratch) {
    if (d * b / 8 < 16) return false;
    score_vnni_rows(q, R, d, G, b, blk, block_tokens, t0, n, logits, ld, scratch);
    return true;
}

/* The head dims 16-256 (powers of two) for b bits: code rows of 16-256
 * bytes; 3 bits at d = 64, 128 and 256 (dot16_vnni's 1-bit pieces). */
static ALWAYS_INLINE VNNI bool score_vnni_bits(const float *q, int R, int d, int G, const int b, const uint8_t *blk,
                                               int block_tokens, int t0, int n, float *logits, int ld, float *scratch) {
    switch (d) {
    case 16: return score_vnni_d(q, R, 16, G, b, blk, block_tokens, t0, n, logits, ld, scratch);
    case 32: return score_vnni_d(q, R, 32, G, b, blk, block_tokens, t0, n, logits, ld, scratch);
    case 64: return score_vnni_d(q, R, 64, G, b, blk, block_tokens, t0, n, logits, ld, scratch);
    case 128: return score_vnni_d(q, R, 128, G, b, blk, block_tokens, t0, n, logits, ld, scratch);
    case 256: return score_vnni_d(q, R, 256, G, b, blk, block_tokens, t0, n, logits, ld, scratch);
    default: return false;
    }
}

static VNNI bool score_vnni(const float *q, int R, int d, int G, int bits, const uint8_t *blk, int block_tokens,
                            int t0, int n, float *logits, int ld, float *scratch) {
    switch (bits) {
    case 2: return score_vnni_bits(q, R, d, G, 2, blk, block_tokens, t0, n, logits, ld, scratch);
    case 3: return score_vnni_bits(q, R, d, G, 3, blk, block_tokens, t0, n, logits, ld, scratch);
    case 4: return score_vnni_bits(q, R, d, G, 4, blk, block_tokens, t0, n, logits, ld, scratch);
    case 8: return score_vnni_bits(q, R, d, G, 8, blk, block_tokens, t0, n, logits, ld, scratch);
    default: return false;
    }
}

bool vq_kivi_score_rows_avx512(const float *q, int R, int d, int G, int bits, const uint8_t *blk, int block_tokens,
                               int t0, int n, float *logits, int ld, float *scratch) {
    if (vq_cpu_has_avx512_vnni() && score_vnni(q, R, d, G, bits, blk, block_tokens, t0, n, logits, ld, scratch))
        return true;
    /* 3 bits: d a multiple of 128, or of 16 below 128 (across) */
    if (bits == 3 ? d % 128 != 0 && (d % 16 != 0 || d > 128)
                  : (bits != 2 && bits != 4 && bits != 8) || (d * bits / 8) % 4 != 0)
        return false;
    if (R == 4) score_rows_bits(q, 4, d, G, bits, blk, block_tokens, t0, n, logits, ld, scratch);
    else if (R == 2) score_rows_bits(q, 2, d, G, bits, blk, block_tokens, t0, n, logits, ld, scratch);
    else score_rows_bits(q, 1, d, G, bits, blk, block_tokens, t0, n, logits, ld, scratch);
    return true;
}

/* ---------------------------------------------------------------- values */

/* a + the pairwise int16 products of x and w (vpdpwssd). In asm because
 * GCC 12 compiles the intrinsic into a copy of the accumulator before each
 * instruction and back after it, and with 16 accumulators live spills
 * some of them to the stack every iteration: 29 register moves and 3
 * stores per 16 vpdpwssd in the 2-bit loop for 4 rows. */
static ALWAYS_INLINE VNNI __m512i dpwssd(__m512i a, __m512i x, __m512i w) {
    __asm__("vpdpwssd %2, %1, %0" : "+v"(a) : "v"(x), "v"(w));
    return a;
}

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
            a[s][r][0] = dpwssd(a[s][r][0], xl, w);
            a[s][r][1] = dpwssd(a[s][r][1], xh, w);
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

/* Slot j of one run of 16, 8 or 4 bytes of plane codes (channels of one
 * value group) for R rows over a chunk of cn tokens, for plane strides
 * that are not whole runs of 32 (2-bit codes at d = 96: 24 bytes; at
 * d = 80: 20): a pair's bytes, interleaved, fill one vector of 16 channel
 * pairs in channel order (a shorter run leaves the rest 0), one vpdpwssd
 * per row; the sums meet acc under a mask of the run's channels. */
static ALWAYS_INLINE VNNI __m128i load_bytes(const uint8_t *p, const int run) {
    if (run == 16) return _mm_loadu_si128((const __m128i *)p);
    if (run == 8) return _mm_loadl_epi64((const __m128i *)p);
    int32_t x;
    memcpy(&x, p, 4);
    return _mm_cvtsi32_si128(x);
}

static ALWAYS_INLINE VNNI __m512i widen_pair16(__m128i xa, __m128i xb) {
    return _mm512_cvtepu8_epi16(_mm256_set_m128i(_mm_unpackhi_epi8(xa, xb), _mm_unpacklo_epi8(xa, xb)));
}

static ALWAYS_INLINE VNNI void accum_short(const uint8_t *codes, size_t cb, int cn, const int32_t *wg, const int b,
                                           const int j, const int run, const int R, const float *deq, float *acc,
                                           int d) {
    __m512i a[4];
    for (int r = 0; r < R; r++) a[r] = _mm512_setzero_si512();
    const uint8_t *ca = codes, *end = codes + (size_t)(cn & ~1) * cb;
    int i = 0;
    for (; ca != end; ca += 2 * cb, i++) {
        __m512i x = take_slot(widen_pair16(load_bytes(ca, run), load_bytes(ca + cb, run)), b, j);
        for (int r = 0; r < R; r++) a[r] = dpwssd(a[r], x, _mm512_set1_epi32(wg[r * (CHUNK / 2) + i]));
    }
    if (cn & 1) { /* the odd last token, paired with itself: its partner's weight is 0 */
        __m128i y = load_bytes(ca, run);
        __m512i x = take_slot(widen_pair16(y, y), b, j);
        for (int r = 0; r < R; r++) a[r] = dpwssd(a[r], x, _mm512_set1_epi32(wg[r * (CHUNK / 2) + i]));
    }
    const __mmask16 k = (__mmask16)((1u << run) - 1);
    const float fs = b == 8 || j == 8 / b - 1 ? 1.0f : 1.0f / (float)(1 << (b * j));
    for (int r = 0; r < R; r++) {
        float *o = acc + (size_t)r * d;
        __m512 y = _mm512_fmadd_ps(_mm512_cvtepi32_ps(a[r]), _mm512_set1_ps(deq[r] * fs), _mm512_maskz_loadu_ps(k, o));
        _mm512_mask_storeu_ps(o, k, y);
    }
}

/* All slots of b-bit plane codes for one chunk (cn tokens) and R rows: runs
 * of 32 bytes, two slots at a time (16 int32 accumulators for 4 rows; all
 * four 2-bit slots at once would take all 32 registers). wp is
 * [group][row][pair]. */
static ALWAYS_INLINE VNNI void accum_plane(const uint8_t *codes, size_t cb, int cn, const int b, int G,
                                           const int32_t *wp, const float *deq, const int R, float *acc, int d) {
    const int stride = (int)cb, slots = 8 / b;
    if (stride % 32 != 0) { /* runs of 16, 8 or 4: the longest that stays inside the slot and a value group */
        for (int j = 0; j < slots; j++)
            for (int v = 0; v < stride;) {
                const int ch = j * stride + v, g = ch / G;
                int run = 16;
                while (run > 4 && (v + run > stride || (ch + run - 1) / G != g)) run /= 2;
                const int32_t *wg = wp + (size_t)g * R * (CHUNK / 2);
                if (run == 16) accum_short(codes + v, cb, cn, wg, b, j, 16, R, deq, acc + ch, d);
                else if (run == 8) accum_short(codes + v, cb, cn, wg, b, j, 8, R, deq, acc + ch, d);
                else accum_short(codes + v, cb, cn, wg, b, j, 4, R, deq, acc + ch, d);
                v += run;
            }
        return;
    }
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
                a[s][r][0] = dpwssd(a[s][r][0], lo, w);
                a[s][r][1] = dpwssd(a[s][r][1], hi, w);
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
                a[s][r][0] = dpwssd(a[s][r][0], lo, w);
                a[s][r][1] = dpwssd(a[s][r][1], hi, w);
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

/* join_b3 for the 16 bytes of a run of 3-bit codes whose high bits are
 * not in one 1-bit slot (d < 128): c1 from vq_high_bytes16, m1 the bit
 * of each byte lane (slot 2 j or 2 j + 1, see high_mask). */
static ALWAYS_INLINE __m128i join_b3_16(__m128i c2, __m128i c1, __m128i m1, const int j) {
    const int e = j < 3 ? 2 * j : 4;
    __m128i lo = _mm_and_si128(j < 3 ? c2 : _mm_srli_epi16(c2, 2), _mm_set1_epi8((char)(3 << e)));
    __m128i off = _mm_cmpeq_epi8(_mm_and_si128(c1, m1), _mm_setzero_si128());
    return _mm_or_si128(lo, _mm_andnot_si128(off, _mm_set1_epi8((char)(4 << e))));
}

/* The high bit of slot j in each byte lane of vq_high_bytes16's bytes for
 * the run at v: bit 2 j, or 2 j + 1 in the lanes of the slot's second half
 * (v + i >= s1). */
static ALWAYS_INLINE __m128i high_mask(int v, int s1, const int j) {
    const __m128i lane = _mm_setr_epi8(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
    __m128i second = _mm_cmpgt_epi8(_mm_add_epi8(lane, _mm_set1_epi8((char)v)), _mm_set1_epi8((char)(s1 - 1)));
    return _mm_blendv_epi8(_mm_set1_epi8((char)(1 << (2 * j))), _mm_set1_epi8((char)(2 << (2 * j))), second);
}

/* accum_short for 3-bit codes of d < 128 (a multiple of 16): slot j of the
 * 2-bit plane run v .. v + run - 1 (run 16, 8 or 4 channels of one value
 * group) joined with its high bits, which vq_high_bytes16 places from the
 * 1-bit plane (s1 = d / 8 bytes: d = 96, the run at v = 8 takes plane
 * bytes 8-11 and then 0-3 one slot higher). */
static ALWAYS_INLINE VNNI void accum_short_b3(const uint8_t *codes, size_t cb, int cn, int v, int d, const int32_t *wg,
                                              const int j, const int run, const int R, const float *deq, float *acc) {
    const int s2 = d / 4, s1 = d / 8;
    __m512i a[4];
    for (int r = 0; r < R; r++) a[r] = _mm512_setzero_si512();
    __m128i second; /* vq_high_bytes16's, unused: high_mask has the bits */
    const __m128i m1 = high_mask(v, s1, j);
    const uint8_t *ca = codes, *end = codes + (size_t)(cn & ~1) * cb;
    int i = 0;
    for (; ca != end; ca += 2 * cb, i++) {
        __m128i xa = join_b3_16(load_bytes(ca + v, run), vq_high_bytes16(ca + s2, v, s1, &second), m1, j);
        __m128i xb = join_b3_16(load_bytes(ca + cb + v, run), vq_high_bytes16(ca + cb + s2, v, s1, &second), m1, j);
        __m512i x = widen_pair16(xa, xb);
        for (int r = 0; r < R; r++) a[r] = dpwssd(a[r], x, _mm512_set1_epi32(wg[r * (CHUNK / 2) + i]));
    }
    if (cn & 1) { /* the odd last token, paired with itself: its partner's weight is 0 */
        __m128i y = join_b3_16(load_bytes(ca + v, run), vq_high_bytes16(ca + s2, v, s1, &second), m1, j);
        __m512i x = widen_pair16(y, y);
        for (int r = 0; r < R; r++) a[r] = dpwssd(a[r], x, _mm512_set1_epi32(wg[r * (CHUNK / 2) + i]));
    }
    const __mmask16 k = (__mmask16)((1u << run) - 1);
    const float fs = 1.0f / (float)(1 << (j < 3 ? 2 * j : 4));
    for (int r = 0; r < R; r++) {
        float *o = acc + (size_t)r * d;
        __m512 y = _mm512_fmadd_ps(_mm512_cvtepi32_ps(a[r]), _mm512_set1_ps(deq[r] * fs), _mm512_maskz_loadu_ps(k, o));
        _mm512_mask_storeu_ps(o, k, y);
    }
}

/* Every channel of 3-bit codes for one chunk and R rows, d < 128 (a
 * multiple of 16): per 2-bit slot, runs of 16, 8 or 4 channels, the
 * longest that stays inside the slot and a value group (as accum_plane's
 * short runs). */
static ALWAYS_INLINE VNNI void accum_planes_b3x(const uint8_t *codes, size_t cb, int cn, int G, const int32_t *wp,
                                                const float *deq, const int R, float *acc, int d) {
    const int s2 = d / 4;
    for (int j = 0; j < 4; j++)
        for (int v = 0; v < s2;) {
            const int ch = j * s2 + v, g = ch / G;
            int run = 16;
            while (run > 4 && (v + run > s2 || (ch + run - 1) / G != g)) run /= 2;
            const int32_t *wg = wp + (size_t)g * R * (CHUNK / 2);
            if (run == 16) accum_short_b3(codes, cb, cn, v, d, wg, j, 16, R, deq, acc + ch);
            else if (run == 8) accum_short_b3(codes, cb, cn, v, d, wg, j, 8, R, deq, acc + ch);
            else accum_short_b3(codes, cb, cn, v, d, wg, j, 4, R, deq, acc + ch);
            v += run;
        }
}

/* accum_plane or accum_planes_b3 with the bits a constant in each instance. */
static ALWAYS_INLINE VNNI void accum_bits(const uint8_t *codes, size_t cb, int cn, int bits, int G, const int32_t *wp,
                                         const float *deq, const int R, float *acc, int d) {
    switch (bits) {
    case 2: accum_plane(codes, cb, cn, 2, G, wp, deq, R, acc, d); break;
    case 3:
        if (d % 128 == 0) accum_planes_b3(codes, cb, cn, G, wp, deq, R, acc, d);
        else accum_planes_b3x(codes, cb, cn, G, wp, deq, R, acc, d);
        break;
    case 4: accum_plane(codes, cb, cn, 4, G, wp, deq, R, acc, d); break;
    default: accum_plane(codes, cb, cn, 8, G, wp, deq, R, acc, d); break;
    }
}

/* A chunk's value metadata m ([CHUNK][ng][scale, zero] halves) as floats
 * by group (chunk_meta's tables). Tokens from cn on read as 0: their
 * weights are 0, and a slot not yet written may hold any bits, a NaN among
 * them. With W = 2 ng
 * halves a token a power of two, the 32 x W matrix of halves (W vectors)
 * is transposed in registers: one unshuffle round (each output pair takes
 * the even elements of an input pair, then the odd ones) rotates every
 * element's index right by a bit, so after log2 W rounds half v of token t
 * sits at v * 32 + t (8 vpermt2w a round for ng = 4, against a 24-shuffle
 * 8 x 8 float transpose per 8 tokens and group pair in kivi_avx2.c). */
static ALWAYS_INLINE void transpose_meta(const uint16_t *m, const int W, int cn, __m512 hc, float *sz, float *zs,
                                         float *smax) {
    static const int16_t ev[32] = {0,  2,  4,  6,  8,  10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30,
                                   32, 34, 36, 38, 40, 42, 44, 46, 48, 50, 52, 54, 56, 58, 60, 62};
    const __m512i even = _mm512_loadu_si512(ev), odd = _mm512_add_epi16(even, _mm512_set1_epi16(1));
    __m512i v[16], o[16];
    for (int i = 0; i < W; i++) {
        int left = cn * W - 32 * i; /* halves of this vector inside the chunk */
        __mmask32 k = left >= 32 ? 0xFFFFFFFFu : left > 0 ? (1u << left) - 1 : 0;
        v[i] = _mm512_maskz_loadu_epi16(k, m + 32 * i);
    }
    for (int w = W; w > 1; w /= 2) {
        for (int i = 0; i < W / 2; i++) {
            o[i] = _mm512_permutex2var_epi16(v[2 * i], even, v[2 * i + 1]);
            o[W / 2 + i] = _mm512_permutex2var_epi16(v[2 * i], odd, v[2 * i + 1]);
        }
        for (int i = 0; i < W; i++) v[i] = o[i];
    }
    /* half 2 g of a token is group g's scale, 2 g + 1 its zero */
    for (int h = 0; h < 2; h++) {
        __m512 mx = _mm512_setzero_ps();
        for (int g = 0; g < W / 2; g++) {
            __m512 sc = _mm512_cvtph_ps(h ? _mm512_extracti64x4_epi64(v[2 * g], 1) : _mm512_castsi512_si256(v[2 * g]));
            __m512 zr = _mm512_cvtph_ps(h ? _mm512_extracti64x4_epi64(v[2 * g + 1], 1)
                                          : _mm512_castsi512_si256(v[2 * g + 1]));
            _mm512_storeu_ps(sz + g * CHUNK + 16 * h, sc);
            _mm512_storeu_ps(zs + g * CHUNK + 16 * h, _mm512_fmadd_ps(hc, sc, zr));
            mx = _mm512_max_ps(mx, sc);
        }
        _mm512_storeu_ps(smax + 16 * h, mx);
    }
}

/* A chunk's value metadata as the tables chunk_weights reads: sz [ng][CHUNK]
 * the scales by group, zs [ng][CHUNK] = zero + cmax/2 scale, smax [CHUNK]
 * each token's largest scale (made here from the converted registers, not
 * read back from memory). */
static void chunk_meta(const uint16_t *m, int ng, int cn, float half_cmax, float *sz, float *zs, float *smax) {
    const __m512 hc = _mm512_set1_ps(half_cmax);
    switch (ng) {
    case 1: transpose_meta(m, 2, cn, hc, sz, zs, smax); return;
    case 2: transpose_meta(m, 4, cn, hc, sz, zs, smax); return;
    case 4: transpose_meta(m, 8, cn, hc, sz, zs, smax); return;
    case 8: transpose_meta(m, 16, cn, hc, sz, zs, smax); return;
    }
    /* other group counts (d = 96 or 80 with groups of 32: 3): each token's
     * (scale, zero) pair of group g is one 32-bit word, gathered for 16
     * tokens at a time and split into the halves (tokens past cn read 0) */
    const __m512i iota = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
    for (int h = 0; h < CHUNK; h += 16) {
        int left = cn - h;
        __mmask16 k = left >= 16 ? 0xFFFF : left > 0 ? (__mmask16)((1u << left) - 1) : 0;
        __m512 mx = _mm512_setzero_ps();
        for (int g = 0; g < ng; g++) {
            __m512i idx = _mm512_add_epi32(_mm512_mullo_epi32(_mm512_add_epi32(iota, _mm512_set1_epi32(h)),
                                                              _mm512_set1_epi32(ng)),
                                           _mm512_set1_epi32(g));
            __m512i w = _mm512_mask_i32gather_epi32(_mm512_setzero_si512(), k, idx, m, 4);
            __m512 sc = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(w));
            __m512 zr = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(_mm512_srli_epi32(w, 16)));
            _mm512_storeu_ps(sz + g * CHUNK + h, sc);
            _mm512_storeu_ps(zs + g * CHUNK + h, _mm512_fmadd_ps(hc, sc, zr));
            mx = _mm512_max_ps(mx, sc);
        }
        _mm512_storeu_ps(smax + h, mx);
    }
}

/* The int16 weights of R rows (w, ld floats apart) for a chunk
 * (kivi_avx2.c's prep_weights has the contract): w_t s_tg scaled so the
 * row's largest in the chunk is 32767, rounded, stored as the token pairs
 * the VNNI loop reads (row r's at wp[r * CHUNK / 2 + g * gstride + pair]);
 * deq[r] the row's step. zacc[r * ng + g] (16 lanes) gathers the float terms of
 * group g: sum_t w_t z_tg, and the rounding's common mode, which
 * kivi_avx2.c takes back as cmax/2 * deq * sum_t (round(x_t) - x_t) with
 * x_t = w_t s_tg / deq. Here it is rewritten as
 * cmax/2 * (deq * sum_t round(x_t) - sum_t w_t s_tg): the second sum
 * joins the zero term through zs_tg = z_tg + cmax/2 s_tg (built once per
 * chunk for all rows), the first is one integer add and one conversion
 * per group instead of two conversions back and two subtractions. */
static ALWAYS_INLINE void chunk_weights(const float *w, int ld, const int R, int cn, const float *sz, const float *zs,
                                        const float *smax, int ng, float half_cmax, int32_t *wp, size_t gstride,
                                        __m512 *zacc, float *deq) {
    const __mmask16 k0 = cn >= 16 ? 0xFFFF : (__mmask16)((1u << cn) - 1);
    const __mmask16 k1 = cn >= 32 ? 0xFFFF : cn > 16 ? (__mmask16)((1u << (cn - 16)) - 1) : 0;
    __m512 w0[4], w1[4], v[4];
    for (int r = 0; r < 4; r++) v[r] = _mm512_setzero_ps();
    for (int r = 0; r < R; r++) {
        w0[r] = _mm512_maskz_loadu_ps(k0, w + (size_t)r * ld);
        w1[r] = _mm512_maskz_loadu_ps(k1, w + (size_t)r * ld + 16);
        v[r] = _mm512_max_ps(_mm512_max_ps(_mm512_mul_ps(w0[r], _mm512_loadu_ps(smax)),
                                           _mm512_mul_ps(w1[r], _mm512_loadu_ps(smax + 16))),
                             _mm512_setzero_ps());
    }
    /* The rows' maxima by one transposing tree (lane r of every 128-bit
     * block ends up holding row r's), then one division for all rows'
     * steps and one for their inverses. A horizontal maximum, a compare
     * and two scalar divisions a row, one row after the other, made a
     * chain of dependent steps between the chunk's weights and its sums
     * (2-bit, 4 rows, in cache: 14.0-14.3 -> 13.4-13.6 ns per token and kv
     * head with the tree; the same results, bit for bit). */
    __m512 x01 = _mm512_max_ps(_mm512_unpacklo_ps(v[0], v[1]), _mm512_unpackhi_ps(v[0], v[1])); /* r0 r1 r0 r1 */
    __m512 x23 = _mm512_max_ps(_mm512_unpacklo_ps(v[2], v[3]), _mm512_unpackhi_ps(v[2], v[3])); /* r2 r3 r2 r3 */
    __m512 y = _mm512_max_ps(_mm512_shuffle_ps(x01, x23, 0x44), _mm512_shuffle_ps(x01, x23, 0xEE)); /* r0 r1 r2 r3 */
    y = _mm512_max_ps(y, _mm512_shuffle_f32x4(y, y, 0x4E));
    y = _mm512_max_ps(y, _mm512_shuffle_f32x4(y, y, 0xB1));
    const __m128 mv = _mm512_castps512_ps128(y), c = _mm_set1_ps(32767.0f);
    const __m128 dq = _mm_div_ps(mv, c);
    /* a chunk whose largest weight is below 1e-30 gets zero int16 weights
     * (see kivi_avx2.c's prep_weights) */
    const __m128 inv = _mm_and_ps(_mm_div_ps(c, mv), _mm_cmpgt_ps(mv, _mm_set1_ps(1e-30f)));
    const __m128 rcv = _mm_mul_ps(dq, _mm_set1_ps(-half_cmax));
    _mm_storeu_ps(deq, dq);
    /* packs_epi32 interleaves its inputs by 64 bits per 128-bit lane;
     * this puts the 64-bit pieces back in token order */
    const __m512i order = _mm512_set_epi64(7, 5, 3, 1, 6, 4, 2, 0);
    for (int r = 0; r < R; r++) {
        const __m512i lane = _mm512_set1_epi32(r);
        const __m512 iv = _mm512_permutexvar_ps(lane, _mm512_castps128_ps512(inv));
        const __m512 rc = _mm512_permutexvar_ps(lane, _mm512_castps128_ps512(rcv));
        const __m512 wi0 = _mm512_mul_ps(w0[r], iv), wi1 = _mm512_mul_ps(w1[r], iv);
        for (int g = 0; g < ng; g++) {
            const float *sg = sz + g * CHUNK, *zg = zs + g * CHUNK;
            /* 0 <= x <= 32767 after rounding: packs_epi32 keeps it */
            __m512i i0 = _mm512_cvtps_epi32(_mm512_mul_ps(wi0, _mm512_loadu_ps(sg)));
            __m512i i1 = _mm512_cvtps_epi32(_mm512_mul_ps(wi1, _mm512_loadu_ps(sg + 16)));
            _mm512_storeu_si512(wp + r * (CHUNK / 2) + g * gstride,
                                _mm512_permutexvar_epi64(order, _mm512_packs_epi32(i0, i1)));
            __m512 z = _mm512_fmadd_ps(w0[r], _mm512_loadu_ps(zg), zacc[r * ng + g]);
            z = _mm512_fmadd_ps(w1[r], _mm512_loadu_ps(zg + 16), z);
            zacc[r * ng + g] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_add_epi32(i0, i1)), rc, z);
        }
    }
}

/* Scratch floats of vq_kivi_accum_avx512: sz [ng][CHUNK], zs [ng][CHUNK],
 * smax [CHUNK], wp [ng][4][CHUNK / 2] int32, zacc [4][ng][16] and 16 floats
 * to align it to 64 bytes. */
size_t vq_kivi_scratch_avx512(int ng) { return (size_t)ng * (2 * CHUNK + 4 * (CHUNK / 2) + 4 * 16) + CHUNK + 16; }

/* Tokens [t0, t0 + n) of a block's values into R rows (4, 2 or 1). */
static ALWAYS_INLINE VNNI void accum_group(const float *w, int ld, const int R, int d, int G, int bits,
                                          const uint8_t *blk, int block_tokens, int t0, int n, float *acc,
                                          float *scratch) {
    const int ng = (d + G - 1) / G; /* the last group may be shorter */
    const size_t cb = (size_t)d * (size_t)bits / 8;
    const float half_cmax = 0.5f * (float)(bits == 3 ? 7 : (1 << bits) - 1);
    const uint16_t *meta = (const uint16_t *)(blk + (size_t)block_tokens * cb);
    float *sz = scratch, *zs = sz + ng * CHUNK, *smax = zs + ng * CHUNK;
    int32_t *wp = (int32_t *)(smax + CHUNK);
    __m512 *zacc = (__m512 *)(void *)(((uintptr_t)(wp + (size_t)ng * 4 * (CHUNK / 2)) + 63) & ~(uintptr_t)63);
    for (int i = 0; i < R * ng; i++) zacc[i] = _mm512_setzero_ps();
    for (int c0 = t0; c0 < t0 + n; c0 += CHUNK) {
        const int cn = t0 + n - c0 < CHUNK ? t0 + n - c0 : CHUNK;
        chunk_meta(meta + (size_t)c0 * ng * 2, ng, cn, half_cmax, sz, zs, smax);
        float deq[4];
        chunk_weights(w + (c0 - t0), ld, R, cn, sz, zs, smax, ng, half_cmax, wp, (size_t)R * (CHUNK / 2), zacc, deq);
        accum_bits(blk + (size_t)c0 * cb, cb, cn, bits, G, wp, deq, R, acc, d);
    }
    /* the float terms, per group */
    for (int r = 0; r < R; r++)
        for (int g = 0; g < ng; g++) {
            const __m512 z = _mm512_set1_ps(_mm512_reduce_add_ps(zacc[r * ng + g]));
            float *o = acc + (size_t)r * d + g * G;
            const int gw = d - g * G < G ? d - g * G : G; /* a multiple of 8 */
            for (int c = 0; c < gw; c += 16) {
                const __mmask16 k = gw - c >= 16 ? 0xFFFF : (__mmask16)((1u << (gw - c)) - 1);
                _mm512_mask_storeu_ps(o + c, k, _mm512_add_ps(_mm512_maskz_loadu_ps(k, o + c), z));
            }
        }
}

/* kivi_avx2.c's vq_kivi_accum_avx2 at CPU level avx512 with AVX512_VNNI:
 * every row, 4, then 2, then 1 at a time; false (nothing done) for a
 * shape it does not take. */
VNNI bool vq_kivi_accum_avx512(const vq_mparams *p, const float *w, int ld, int rows, const uint8_t *blk,
                               int block_tokens, int t0, int n, float *acc, float *scratch) {
    const int d = p->head_dim, G = p->group, bits = p->bits;
    const size_t cb = (size_t)d * (size_t)bits / 8;
    if (G % 32 != 0 || (d + G - 1) / G > 16) return false;
    /* 3 bits: d a multiple of 128, or of 16 below 128 (accum_planes_b3x) */
    if (bits == 3 ? d % 128 != 0 && (d % 16 != 0 || d > 128) : (bits != 2 && bits != 4 && bits != 8) || cb % 4 != 0)
        return false;
    for (int r0 = 0; r0 < rows;) {
        const int R = rows - r0 >= 4 ? 4 : rows - r0 >= 2 ? 2 : 1;
        const float *wr = w + (size_t)r0 * ld;
        float *ar = acc + (size_t)r0 * d;
        if (R == 4) accum_group(wr, ld, 4, d, G, bits, blk, block_tokens, t0, n, ar, scratch);
        else if (R == 2) accum_group(wr, ld, 2, d, G, bits, blk, block_tokens, t0, n, ar, scratch);
        else accum_group(wr, ld, 1, d, G, bits, blk, block_tokens, t0, n, ar, scratch);
        r0 += R;
    }
    return true;
}
