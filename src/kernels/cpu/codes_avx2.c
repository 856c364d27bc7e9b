/* AVX2 bodies of the codebook kernels in methods/rotated.c: 8 channels at a
 * time, the codes unpacked with shifts and masks (pack.h's plane layout
 * puts 8 consecutive channels in 8 consecutive bytes) and mapped to their
 * levels with an in-register table lookup (vpermps; 16 levels take two and
 * a blend). Nothing is decoded to memory. Built with -mavx2 -mfma and only
 * called after the CPU was checked. Sign sketches: a clear bit flips the
 * sign of its float (XOR), no branches. */
#include "vq_internal.h"

#include <immintrin.h>

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

/* sum_i s_i v[i] over m sign bits (m a multiple of 8): a clear bit flips
 * the sign bit of v[i]. */
float vq_signs_dot_avx2(const uint8_t *signs, int m, const float *v) {
    const __m256i bit = _mm256_setr_epi32(1, 2, 4, 8, 16, 32, 64, 128);
    const __m256i sign = _mm256_set1_epi32((int)0x80000000u);
    __m256 acc = _mm256_setzero_ps();
    for (int i = 0; i < m; i += 8) {
        __m256i set = _mm256_and_si256(_mm256_set1_epi32(signs[i / 8]), bit);
        __m256i flip = _mm256_andnot_si256(_mm256_cmpeq_epi32(set, bit), sign);
        acc = _mm256_add_ps(acc, _mm256_xor_ps(_mm256_loadu_ps(v + i), _mm256_castsi256_ps(flip)));
    }
    __m128 h = _mm_add_ps(_mm256_castps256_ps128(acc), _mm256_extractf128_ps(acc, 1));
    h = _mm_add_ps(h, _mm_movehl_ps(h, h));
    h = _mm_add_ss(h, _mm_movehdup_ps(h));
    return _mm_cvtss_f32(h);
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
