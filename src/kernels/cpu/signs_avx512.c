/* AVX-512 kernels of sign sketches (tq-prod's residual stage, see
 * methods/turboquant_prod.c and methods/rotated.h): scores from per-query
 * nibble tables with 16 tokens a vector, and value sums from per-step
 * tables of four tokens' weights. Built with the AVX-512 flags and only
 * called at the avx512 CPU level. A sketch of m signs lies in m / 8 bytes,
 * sign i at bit i % 8 of byte i / 8, +1 where set.
 *
 * Both replace a form with one masked add per (token, row, 16 signs),
 * which for tq-prod 4-bit at d = 128 cost about 5 ns per (token, kv head)
 * in the key scores and 6 ns in the value sums, in cache (Zen 5: about 20
 * cycles for a token's 32 masked adds of 4 rows). Here 16 signs of a
 * (token, row) cost a quarter of a vpermps and of an add, plus the index
 * work that the rows share. */
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

/* Tokens of one values step at most (stack tables). */
#define TOKENS 64

/* The 16 bytes b .. b + 15 of 16 tokens' sketches (s[t]: token t's) as
 * four vectors: x[k] lane t = the dword of signs 8 b + 32 k .. + 31 of
 * token t. z[g] holds the bytes of tokens g, g + 4, g + 8, g + 12 in its
 * 128-bit lanes; a 4 x 4 dword transpose inside the lanes then puts token
 * 4 L + g at lane 4 L + g. */
static ALWAYS_INLINE void sign_dwords(const uint8_t *const *s, int b, __m512i x[4]) {
    __m512i z[4];
    for (int g = 0; g < 4; g++) {
        __m512i v = _mm512_castsi128_si512(_mm_loadu_si128((const __m128i *)(s[g] + b)));
        v = _mm512_inserti32x4(v, _mm_loadu_si128((const __m128i *)(s[g + 4] + b)), 1);
        v = _mm512_inserti32x4(v, _mm_loadu_si128((const __m128i *)(s[g + 8] + b)), 2);
        z[g] = _mm512_inserti32x4(v, _mm_loadu_si128((const __m128i *)(s[g + 12] + b)), 3);
    }
    __m512i t0 = _mm512_unpacklo_epi32(z[0], z[1]), t1 = _mm512_unpackhi_epi32(z[0], z[1]);
    __m512i t2 = _mm512_unpacklo_epi32(z[2], z[3]), t3 = _mm512_unpackhi_epi32(z[2], z[3]);
    x[0] = _mm512_unpacklo_epi64(t0, t2);
    x[1] = _mm512_unpackhi_epi64(t0, t2);
    x[2] = _mm512_unpacklo_epi64(t1, t3);
    x[3] = _mm512_unpackhi_epi64(t1, t3);
}

/* The scores of R rows (1..4), 32 tokens a step as two vectors of 16:
 * nibble j of a token's sketch (signs 4 j .. 4 j + 3) indexes table j of a
 * row with one vpermps, which ignores the index bits above the nibble, and
 * each table load serves both vectors (16 tokens a step: 2.77 against 2.26
 * ns a token for 4 rows at m = 128). The last 16 bytes read may pass the
 * sketch's end (m < 128, or m not a multiple of 128): no table looks at
 * those bits. */
static ALWAYS_INLINE void score_rows(const int R, const float *nib, int m, const uint8_t *signs, size_t stride,
                                     const float *gain, int n, float *out, int ld, bool add) {
    const int nb = m / 4;
    for (int j = 0; j < n; j += 32) {
        int cnt = n - j < 32 ? n - j : 32;
        const uint8_t *s[32];
        for (int t = 0; t < 32; t++) s[t] = signs + (size_t)(j + (t < cnt ? t : cnt - 1)) * stride;
        __m512 a[8]; /* (row r, token half h) at 2 r + h */
        for (int i = 0; i < 2 * R; i++) a[i] = _mm512_setzero_ps();
        for (int b = 0; b < m / 8; b += 16) {
            __m512i x[4], y[4];
            sign_dwords(s, b, x);
            sign_dwords(s + 16, b, y);
            for (int k = 0; k < 4; k++)
                for (int h = 0; h < 8 && 2 * b + 8 * k + h < nb; h++) {
                    __m512i ix = h ? _mm512_srli_epi32(x[k], 4 * h) : x[k];
                    __m512i iy = h ? _mm512_srli_epi32(y[k], 4 * h) : y[k];
                    const float *tp = nib + (size_t)(2 * b + 8 * k + h) * 16;
                    for (int r = 0; r < R; r++) {
                        __m512 tb = _mm512_loadu_ps(tp + (size_t)r * 4 * m);
                        a[2 * r] = _mm512_add_ps(a[2 * r], _mm512_permutexvar_ps(ix, tb));
                        a[2 * r + 1] = _mm512_add_ps(a[2 * r + 1], _mm512_permutexvar_ps(iy, tb));
                    }
                }
        }
        for (int hh = 0; hh < 2; hh++) {
            int c = cnt - 16 * hh; if (c <= 0) break; if (c > 16) c = 16;
            __mmask16 keep = (__mmask16)((1u << c) - 1);
            __m512 g = _mm512_maskz_loadu_ps(keep, gain + j + 16 * hh);
            for (int r = 0; r < R; r++) {
                float *o = out + (size_t)r * ld + j + 16 * hh;
                __m512 sc = _mm512_mul_ps(g, a[2 * r + hh]);
                if (add) sc = _mm512_add_ps(sc, _mm512_maskz_loadu_ps(keep, o));
                _mm512_mask_storeu_ps(o, keep, sc);
            }
        }
    }
}

static NOINLINE void score_4(const float *nib, int m, const uint8_t *signs, size_t stride, const float *gain, int n,
                             float *out, int ld, bool add) {
    score_rows(4, nib, m, signs, stride, gain, n, out, ld, add);
}
static NOINLINE void score_1(const float *nib, int m, const uint8_t *signs, size_t stride, const float *gain, int n,
                             float *out, int ld, bool add) {
    score_rows(1, nib, m, signs, stride, gain, n, out, ld, add);
}

/* out[r * ld + t] (+)= gain[t] * sum_i s_t,i v_r[i] for r < rows, t < n,
 * from the rows' nibble tables (vq_signs_nibbles: 4 m floats a row); `add`
 * adds instead of storing. m is a multiple of 4. */
void vq_signs_score_avx512(const float *nib, int m, int rows, const uint8_t *signs, size_t stride, const float *gain,
                           int n, float *out, int ld, bool add) {
    int r = 0;
    for (; r + 4 <= rows; r += 4)
        score_4(nib + (size_t)r * 4 * m, m, signs, stride, gain, n, out + (size_t)r * ld, ld, add);
    for (; r < rows; r++) score_1(nib + (size_t)r * 4 * m, m, signs, stride, gain, n, out + (size_t)r * ld, ld, add);
}

/* The value tables of a step of four tokens 4 u .. 4 u + 3 and row r:
 * wt[(u R + r) 16 + x] = sum_{b < 4} (bit b of x ? wg : -wg)[r, 4 u + b],
 * wg[r * TOKENS + t] the row's weight times the token's gain; tokens at or
 * past n weigh 0. */
static void value_tables(int R, const float *wg, int n, float *wt) {
    __m512 pm[4]; /* lane x: +1 where bit b of x is set, else -1 */
    for (int b = 0; b < 4; b++) {
        float v[16];
        for (int x = 0; x < 16; x++) v[x] = (x >> b & 1) ? 1.0f : -1.0f;
        pm[b] = _mm512_loadu_ps(v);
    }
    for (int u = 0; 4 * u < n; u++)
        for (int r = 0; r < R; r++) {
            __m512 t = _mm512_setzero_ps();
            for (int b = 0; b < 4 && 4 * u + b < n; b++)
                t = _mm512_fmadd_ps(_mm512_set1_ps(wg[r * TOKENS + 4 * u + b]), pm[b], t);
            _mm512_storeu_ps(wt + (size_t)(u * R + r) * 16, t);
        }
}

/* Signs 16 g0 .. 16 (g0 + G) - 1 (G = 4 or 1) of R rows into z, four
 * tokens a step: byte i of the step's index holds sign 16 g0 + i of the
 * four tokens as a nibble (token 4 u + b at bit b), built from each
 * token's sign bits as a mask; one vpermps of the step's table
 * (value_tables) then gives each lane the signed sum of the four weights. */
static ALWAYS_INLINE void accum_runs(const int R, const int G, const uint8_t *signs, size_t stride, const float *wt,
                                     int n, float *z, size_t zs, int g0) {
    __m512 acc[16]; /* (row r, run g0 + k) at G r + k */
    for (int i = 0; i < G * R; i++) acc[i] = _mm512_setzero_ps();
    for (int j = 0; j < n; j += 4) {
        /* a short last step repeats its last token; its table weighs it 0 */
        const uint8_t *c[4];
        for (int b = 0; b < 4; b++) c[b] = signs + (size_t)(j + b < n ? j + b : n - 1) * stride + 2 * g0;
        __m512i idx[4];
        if (G == 4) {
            __m512i x = _mm512_setzero_si512();
            for (int b = 0; b < 4; b++) {
                uint64_t bits;
                memcpy(&bits, c[b], sizeof bits);
                x = _mm512_or_si512(x, _mm512_maskz_mov_epi8(_cvtu64_mask64(bits), _mm512_set1_epi8((char)(1 << b))));
            }
            idx[0] = _mm512_cvtepu8_epi32(_mm512_castsi512_si128(x));
            idx[1] = _mm512_cvtepu8_epi32(_mm512_extracti32x4_epi32(x, 1));
            idx[2] = _mm512_cvtepu8_epi32(_mm512_extracti32x4_epi32(x, 2));
            idx[3] = _mm512_cvtepu8_epi32(_mm512_extracti32x4_epi32(x, 3));
        } else {
            __m128i x = _mm_setzero_si128();
            for (int b = 0; b < 4; b++) {
                uint16_t bits;
                memcpy(&bits, c[b], sizeof bits);
                x = _mm_or_si128(x, _mm_maskz_mov_epi8(_cvtu32_mask16(bits), _mm_set1_epi8((char)(1 << b))));
            }
            idx[0] = _mm512_cvtepu8_epi32(x);
        }
        for (int r = 0; r < R; r++) {
            __m512 t = _mm512_loadu_ps(wt + (size_t)(j / 4 * R + r) * 16);
            for (int k = 0; k < G; k++)
                acc[G * r + k] = _mm512_add_ps(acc[G * r + k], _mm512_permutexvar_ps(idx[k], t));
        }
    }
    for (int r = 0; r < R; r++)
        for (int k = 0; k < G; k++) {
            float *zp = z + (size_t)r * zs + 16 * (g0 + k);
            _mm512_storeu_ps(zp, _mm512_add_ps(_mm512_loadu_ps(zp), acc[G * r + k]));
        }
}

static ALWAYS_INLINE void accum_rows(const int R, const uint8_t *signs, size_t stride, int m, const float *wt, int n,
                                     float *z, size_t zs) {
    int g = 0;
    for (; g + 4 <= m / 16; g += 4) accum_runs(R, 4, signs, stride, wt, n, z, zs, g);
    for (; g < m / 16; g++) accum_runs(R, 1, signs, stride, wt, n, z, zs, g);
}

static NOINLINE void accum_4(const uint8_t *signs, size_t stride, int m, const float *wt, int n, float *z, size_t zs) {
    accum_rows(4, signs, stride, m, wt, n, z, zs);
}
static NOINLINE void accum_1(const uint8_t *signs, size_t stride, int m, const float *wt, int n, float *z, size_t zs) {
    accum_rows(1, signs, stride, m, wt, n, z, zs);
}

/* z[r * z_stride + i] += sum_t w[r * ld + t] * gain[t] * s_t,i for r < rows,
 * i < m, t < n (vq_signs_accum at level avx512; m a multiple of 16). */
void vq_signs_accum_avx512(const uint8_t *signs, size_t stride, int m, const float *gain, int n, const float *w,
                           int ld, int rows, float *z, size_t z_stride) {
    float wg[4 * TOKENS], wt[4 * TOKENS * 4];
    for (int j0 = 0; j0 < n; j0 += TOKENS) {
        int cnt = n - j0 < TOKENS ? n - j0 : TOKENS;
        for (int r0 = 0; r0 < rows;) {
            int R = rows - r0 >= 4 ? 4 : 1;
            for (int r = 0; r < R; r++) {
                const float *wr = w + (size_t)(r0 + r) * ld + j0;
                for (int t = 0; t < cnt; t += 16) {
                    __mmask16 k = cnt - t >= 16 ? 0xFFFF : (__mmask16)((1u << (cnt - t)) - 1);
                    _mm512_storeu_ps(wg + r * TOKENS + t, _mm512_mul_ps(_mm512_maskz_loadu_ps(k, wr + t),
                                                                        _mm512_maskz_loadu_ps(k, gain + j0 + t)));
                }
            }
            value_tables(R, wg, cnt, wt);
            const uint8_t *s = signs + (size_t)j0 * stride;
            float *zr = z + (size_t)r0 * z_stride;
            if (R == 4) accum_4(s, stride, m, wt, cnt, zr, z_stride);
            else accum_1(s, stride, m, wt, cnt, zr, z_stride);
            r0 += R;
        }
    }
}
