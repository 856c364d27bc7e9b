/* Vectorized exp for the online softmax. exp(x) = 2^n * p(r) with
 * x = n ln2 + r, |r| <= ln2/2, p the Cephes expf polynomial (relative error about
 * 2e-7, comparable to expf). Inputs here are <= 0 (x - max); -inf gives 0. */
#include "vq_internal.h"

#include <immintrin.h>
#include <math.h>

static inline __m256 exp_avx2(__m256 x) {
    const __m256 lo = _mm256_set1_ps(-87.0f);
    x = _mm256_max_ps(x, lo); /* also maps -inf to -87: exp(-87) ~ 1.6e-38, flushed below */
    __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                               _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    /* r = x - n ln2, with ln2 split in two for accuracy */
    __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), x);
    r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), r);
    __m256 p = _mm256_set1_ps(1.9875691500e-4f);
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.3981999507e-3f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(8.3334519073e-3f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(4.1665795894e-2f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.6666665459e-1f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(5.0000001201e-1f));
    __m256 r2 = _mm256_mul_ps(r, r);
    p = _mm256_fmadd_ps(p, r2, _mm256_add_ps(r, _mm256_set1_ps(1.0f)));
    __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
    __m256 y = _mm256_mul_ps(p, _mm256_castsi256_ps(e));
    /* anything at the clamp is below float's normal range: make it exactly 0 */
    return _mm256_andnot_ps(_mm256_cmp_ps(x, lo, _CMP_LE_OQ), y);
}

float vq_exp_shift_sum_avx2(float *x, int n, float m) {
    __m256 vm = _mm256_set1_ps(m), s = _mm256_setzero_ps();
    int i = 0;
    for (; i + 8 <= n; i += 8) {
        __m256 y = exp_avx2(_mm256_sub_ps(_mm256_loadu_ps(x + i), vm));
        _mm256_storeu_ps(x + i, y);
        s = _mm256_add_ps(s, y);
    }
    if (i < n) {
        float tmp[8];
        int rest = n - i;
        for (int j = 0; j < 8; j++) tmp[j] = j < rest ? x[i + j] : -INFINITY;
        __m256 y = exp_avx2(_mm256_sub_ps(_mm256_loadu_ps(tmp), vm));
        _mm256_storeu_ps(tmp, y);
        for (int j = 0; j < rest; j++) x[i + j] = tmp[j];
        s = _mm256_add_ps(s, y);
    }
    float t[8];
    _mm256_storeu_ps(t, s);
    return ((t[0] + t[1]) + (t[2] + t[3])) + ((t[4] + t[5]) + (t[6] + t[7]));
}

float vq_max_avx2(const float *x, int n) {
    __m256 mx = _mm256_set1_ps(-INFINITY);
    int i = 0;
    for (; i + 8 <= n; i += 8) mx = _mm256_max_ps(mx, _mm256_loadu_ps(x + i));
    float t[8];
    _mm256_storeu_ps(t, mx);
    float m = t[0];
    for (int j = 1; j < 8; j++) m = t[j] > m ? t[j] : m;
    for (; i < n; i++) m = x[i] > m ? x[i] : m;
    return m;
}
