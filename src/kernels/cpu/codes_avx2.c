/* AVX2 bodies of the codebook kernels in methods/rotated.c: 8 channels at a
 * time, the codes unpacked with shifts and masks (pack.h's plane layout
 * puts 8 consecutive channels in 8 consecutive bytes) and mapped to their
 * levels with an in-register table lookup (vpermps; 16 levels take two and
 * a blend). Nothing is decoded to memory. Built with -mavx2 -mfma and only
 * called after the CPU was checked. Sign sketches: a clear bit flips the
 * sign of its float (XOR), no branches; scored through per-query byte
 * tables (vq_signs_score_avx2), accumulated with the bits turned into +-1.0
 * lanes (vq_signs_accum_avx2). Also the fp32 dot and axpy the query
 * projections and tq-prod's S^T use. */
#include "methods/rotated.h"

#include <immintrin.h>

#if defined(__GNUC__)
#define ALWAYS_INLINE inline __attribute__((always_inline))
#else
#define ALWAYS_INLINE inline
#endif

/* The shapes covered: every 8-channel run must sit in 8 consecutive bytes. */
static bool covered(int d, int bits) {
    if (bits == 3) return d % 64 == 0;
    if (bits != 1 && bits != 2 && bits != 4) return false;
    return (d * bits / 8) % 8 == 0;
}

/* Codes of channels c..c+7 as 32-bit lanes. */
static inline __m256i load_codes(const uint8_t *packed, int d, int bits, int c) {
    if (bits == 3) {
        int s2 = d / 4, s1 = d / 8, k = c / s2, i = c % s2;
        __m256i lo = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(packed + i)));
        __m256i hi = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(packed + s2 + c % s1)));
        lo = _mm256_and_si256(_mm256_srl_epi32(lo, _mm_cvtsi32_si128(2 * k)), _mm256_set1_epi32(3));
        hi = _mm256_and_si256(_mm256_srl_epi32(hi, _mm_cvtsi32_si128(c / s1)), _mm256_set1_epi32(1));
        return _mm256_or_si256(lo, _mm256_slli_epi32(hi, 2));
    }
    int stride = d * bits / 8, k = c / stride, i = c % stride;
    __m256i v = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(packed + i)));
    v = _mm256_srl_epi32(v, _mm_cvtsi32_si128(bits * k));
    return _mm256_and_si256(v, _mm256_set1_epi32((1 << bits) - 1));
}

/* table[code] per lane; the table has 16 readable floats. */
static inline __m256 lookup(__m256 lo, __m256 hi, __m256i code, int bits) {
    __m256 a = _mm256_permutevar8x32_ps(lo, code);
    if (bits < 4) return a;
    __m256 b = _mm256_permutevar8x32_ps(hi, code);
    return _mm256_blendv_ps(a, b, _mm256_castsi256_ps(_mm256_slli_epi32(code, 28)));
}

bool vq_codes_dot_avx2(const uint8_t *packed, int d, int bits, const float *table, const float *q, float *out) {
    if (!covered(d, bits)) return false;
    __m256 lo = _mm256_loadu_ps(table), hi = _mm256_loadu_ps(table + 8);
    __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();
    int c = 0;
    for (; c + 16 <= d; c += 16) {
        acc0 = _mm256_fmadd_ps(lookup(lo, hi, load_codes(packed, d, bits, c), bits), _mm256_loadu_ps(q + c), acc0);
        acc1 = _mm256_fmadd_ps(lookup(lo, hi, load_codes(packed, d, bits, c + 8), bits), _mm256_loadu_ps(q + c + 8),
                               acc1);
    }
    for (; c < d; c += 8)
        acc0 = _mm256_fmadd_ps(lookup(lo, hi, load_codes(packed, d, bits, c), bits), _mm256_loadu_ps(q + c), acc0);
    __m256 s = _mm256_add_ps(acc0, acc1);
    __m128 h = _mm_add_ps(_mm256_castps256_ps128(s), _mm256_extractf128_ps(s, 1));
    h = _mm_add_ps(h, _mm_movehl_ps(h, h));
    h = _mm_add_ss(h, _mm_movehdup_ps(h));
    *out = _mm_cvtss_f32(h);
    return true;
}

bool vq_codes_axpy_avx2(const uint8_t *packed, int d, int bits, const float *table, float w, float *acc) {
    if (!covered(d, bits)) return false;
    __m256 lo = _mm256_loadu_ps(table), hi = _mm256_loadu_ps(table + 8), wv = _mm256_set1_ps(w);
    for (int c = 0; c < d; c += 8) {
        __m256 v = lookup(lo, hi, load_codes(packed, d, bits, c), bits);
        _mm256_storeu_ps(acc + c, _mm256_fmadd_ps(v, wv, _mm256_loadu_ps(acc + c)));
    }
    return true;
}

/* The same for several query rows: each 8-channel run of levels is looked
 * up once and multiplied into up to 4 rows' accumulators (the rows of a GQA
 * group share every code load). */
bool vq_codes_dot_rows_avx2(const uint8_t *packed, int d, int bits, const float *table, const float *q,
                            size_t q_stride, int rows, float *out) {
    if (!covered(d, bits)) return false;
    __m256 lo = _mm256_loadu_ps(table), hi = _mm256_loadu_ps(table + 8);
    for (int r0 = 0; r0 < rows; r0 += 4) {
        int nr = rows - r0 < 4 ? rows - r0 : 4;
        const float *q0 = q + (size_t)r0 * q_stride;
        __m256 acc[4] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps()};
        for (int c = 0; c < d; c += 8) {
            __m256 v = lookup(lo, hi, load_codes(packed, d, bits, c), bits);
            for (int r = 0; r < nr; r++)
                acc[r] = _mm256_fmadd_ps(v, _mm256_loadu_ps(q0 + (size_t)r * q_stride + c), acc[r]);
        }
        for (int r = 0; r < nr; r++) {
            __m128 h = _mm_add_ps(_mm256_castps256_ps128(acc[r]), _mm256_extractf128_ps(acc[r], 1));
            h = _mm_add_ps(h, _mm_movehl_ps(h, h));
            h = _mm_add_ss(h, _mm_movehdup_ps(h));
            out[r0 + r] = _mm_cvtss_f32(h);
        }
    }
    return true;
}

/* acc_r[c] += w[r] * table[code_c] for every row, each run looked up once. */
bool vq_codes_axpy_rows_avx2(const uint8_t *packed, int d, int bits, const float *table, const float *w, int rows,
                             float *acc, size_t acc_stride) {
    if (!covered(d, bits)) return false;
    __m256 lo = _mm256_loadu_ps(table), hi = _mm256_loadu_ps(table + 8);
    for (int c = 0; c < d; c += 8) {
        __m256 v = lookup(lo, hi, load_codes(packed, d, bits, c), bits);
        for (int r = 0; r < rows; r++) {
            float *a = acc + (size_t)r * acc_stride + c;
            _mm256_storeu_ps(a, _mm256_fmadd_ps(v, _mm256_set1_ps(w[r]), _mm256_loadu_ps(a)));
        }
    }
    return true;
}

/* acc[i] += s_i w over m sign bits (m a multiple of 8). */
void vq_signs_axpy_avx2(const uint8_t *signs, int m, float w, float *acc) {
    const __m256i bit = _mm256_setr_epi32(1, 2, 4, 8, 16, 32, 64, 128);
    const __m256i sign = _mm256_set1_epi32((int)0x80000000u);
    const __m256 wv = _mm256_set1_ps(w);
    for (int i = 0; i < m; i += 8) {
        __m256i set = _mm256_and_si256(_mm256_set1_epi32(signs[i / 8]), bit);
        __m256i flip = _mm256_andnot_si256(_mm256_cmpeq_epi32(set, bit), sign);
        __m256 sw = _mm256_xor_ps(wv, _mm256_castsi256_ps(flip));
        _mm256_storeu_ps(acc + i, _mm256_add_ps(_mm256_loadu_ps(acc + i), sw));
    }
}

/* Sign-sketch scores from vq_signs_table's tables (methods/rotated.h): per
 * sketch, one 16-byte load and add per byte serves four rows; four add
 * chains hide the latency. The tables (32 m floats a row) sit in L2. */
void vq_signs_score_avx2(const float *tab, int m, int rows, const uint8_t *signs, size_t stride, const float *gain,
                         int n, float *out, int ld, bool add) {
    int nb = m / 8, r = 0;
    for (; r + 4 <= rows; r += 4) {
        const float *tg = tab + (size_t)r * 32 * m;
        for (int t = 0; t < n; t++) {
            const uint8_t *s = signs + (size_t)t * stride;
            __m128 a0 = _mm_setzero_ps(), a1 = _mm_setzero_ps(), a2 = _mm_setzero_ps(), a3 = _mm_setzero_ps();
            int k = 0;
            for (; k + 4 <= nb; k += 4) {
                const float *e = tg + (size_t)1024 * k;
                a0 = _mm_add_ps(a0, _mm_loadu_ps(e + 4 * s[k]));
                a1 = _mm_add_ps(a1, _mm_loadu_ps(e + 1024 + 4 * s[k + 1]));
                a2 = _mm_add_ps(a2, _mm_loadu_ps(e + 2048 + 4 * s[k + 2]));
                a3 = _mm_add_ps(a3, _mm_loadu_ps(e + 3072 + 4 * s[k + 3]));
            }
            for (; k < nb; k++) a0 = _mm_add_ps(a0, _mm_loadu_ps(tg + (size_t)1024 * k + 4 * s[k]));
            float v[4];
            _mm_storeu_ps(v, _mm_mul_ps(_mm_add_ps(_mm_add_ps(a0, a1), _mm_add_ps(a2, a3)), _mm_set1_ps(gain[t])));
            for (int i = 0; i < 4; i++) {
                float *o = out + (size_t)(r + i) * ld + t;
                *o = add ? *o + v[i] : v[i];
            }
        }
    }
    for (; r < rows; r++) {
        const float *tg = tab + (size_t)r * 32 * m;
        for (int t = 0; t < n; t++) {
            const uint8_t *s = signs + (size_t)t * stride;
            float a0 = 0, a1 = 0;
            int k = 0;
            for (; k + 2 <= nb; k += 2) {
                a0 += tg[256 * k + s[k]];
                a1 += tg[256 * (k + 1) + s[k + 1]];
            }
            if (k < nb) a0 += tg[256 * k + s[k]];
            float *o = out + (size_t)r * ld + t, v = gain[t] * (a0 + a1);
            *o = add ? *o + v : v;
        }
    }
}

/* z[R rows][G runs of 8 signs from byte k] += sum_t wg[r][t] s_t: the R x G
 * accumulators stay in registers over the tokens. A sign byte becomes +-1.0
 * per lane: the G bytes are broadcast together, vpsllvd moves bit i of byte
 * g to the sign position of lane i, and a clear bit sets the sign of 1.0.
 * wg rows are 64 floats apart, z rows zs. */
static ALWAYS_INLINE void signs_accum_runs(const uint8_t *signs, size_t stride, size_t zs, int k, int cnt,
                                           const float *wg, const int R, const int G, float *z) {
    const __m256i shifts[2] = {_mm256_setr_epi32(31, 30, 29, 28, 27, 26, 25, 24),
                               _mm256_setr_epi32(23, 22, 21, 20, 19, 18, 17, 16)};
    const __m256 one = _mm256_set1_ps(1.0f), sign = _mm256_set1_ps(-0.0f);
    __m256 a[8];
    for (int r = 0; r < R; r++)
        for (int g = 0; g < G; g++) a[r * G + g] = _mm256_loadu_ps(z + (size_t)r * zs + 8 * (k + g));
    const uint8_t *s = signs + k;
    for (int t = 0; t < cnt; t++, s += stride) {
        __m256i bytes = _mm256_set1_epi32(G == 2 ? s[0] | s[1] << 8 : s[0]);
        for (int g = 0; g < G; g++) {
            __m256i x = _mm256_sllv_epi32(bytes, shifts[g]);
            __m256 sg = _mm256_or_ps(one, _mm256_andnot_ps(_mm256_castsi256_ps(x), sign));
            for (int r = 0; r < R; r++)
                a[r * G + g] = _mm256_fmadd_ps(_mm256_broadcast_ss(wg + r * 64 + t), sg, a[r * G + g]);
        }
    }
    for (int r = 0; r < R; r++)
        for (int g = 0; g < G; g++) _mm256_storeu_ps(z + (size_t)r * zs + 8 * (k + g), a[r * G + g]);
}

static ALWAYS_INLINE void signs_accum_rows(const uint8_t *signs, size_t stride, int m, size_t zs, int cnt,
                                           const float *wg, const int R, float *z) {
    int k = 0;
    for (; k + 2 <= m / 8; k += 2) signs_accum_runs(signs, stride, zs, k, cnt, wg, R, 2, z);
    if (k < m / 8) signs_accum_runs(signs, stride, zs, k, cnt, wg, R, 1, z);
}

void vq_signs_accum_avx2(const uint8_t *signs, size_t stride, int m, const float *gain, int n, const float *w, int ld,
                         int rows, float *z, size_t z_stride) {
    float wg[4 * 64];
    for (int t0 = 0; t0 < n; t0 += 64) {
        int cnt = n - t0 < 64 ? n - t0 : 64;
        const uint8_t *st = signs + (size_t)t0 * stride;
        for (int r = 0; r < rows;) {
            int R = rows - r >= 4 ? 4 : 1;
            for (int i = 0; i < R; i++)
                for (int t = 0; t < cnt; t++) wg[i * 64 + t] = w[(size_t)(r + i) * ld + t0 + t] * gain[t0 + t];
            if (R == 4) signs_accum_rows(st, stride, m, z_stride, cnt, wg, 4, z + (size_t)r * z_stride);
            else signs_accum_rows(st, stride, m, z_stride, cnt, wg, 1, z + (size_t)r * z_stride);
            r += R;
        }
    }
}

/* a . b over n floats, 16 at a time in two chains. */
float vq_dot_avx2(const float *a, const float *b, int n) {
    __m256 s0 = _mm256_setzero_ps(), s1 = _mm256_setzero_ps();
    int i = 0;
    for (; i + 16 <= n; i += 16) {
        s0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), s0);
        s1 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 8), _mm256_loadu_ps(b + i + 8), s1);
    }
    for (; i + 8 <= n; i += 8) s0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), s0);
    __m256 s = _mm256_add_ps(s0, s1);
    __m128 h = _mm_add_ps(_mm256_castps256_ps128(s), _mm256_extractf128_ps(s, 1));
    h = _mm_add_ps(h, _mm_movehl_ps(h, h));
    h = _mm_add_ss(h, _mm_movehdup_ps(h));
    float r = _mm_cvtss_f32(h);
    for (; i < n; i++) r += a[i] * b[i];
    return r;
}

/* y[0..n) += a x[0..n). */
void vq_axpy_avx2(float a, const float *x, float *y, int n) {
    __m256 av = _mm256_set1_ps(a);
    int i = 0;
    for (; i + 8 <= n; i += 8) _mm256_storeu_ps(y + i, _mm256_fmadd_ps(av, _mm256_loadu_ps(x + i), _mm256_loadu_ps(y + i)));
    for (; i < n; i++) y[i] += a * x[i];
}
