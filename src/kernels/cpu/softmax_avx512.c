/* The online softmax's exp and max (softmax_avx2.c) 16 lanes wide, with the
 * same polynomial and clamp; the tail runs in the same vector under a mask.
 * Only called at the avx512 CPU level. */
#include "vq_internal.h"

#include <immintrin.h>
#include <math.h>

static inline __m512 exp_avx512(__m512 x) {
    const __m512 lo = _mm512_set1_ps(-87.0f);
    x = _mm512_max_ps(x, lo); /* also maps -inf to -87: exp(-87) ~ 1.6e-38, flushed below */
    __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                    _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    /* r = x - n ln2, with ln2 split in two for accuracy */
    __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), x);
    r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.12194440e-4f), r);
    __m512 p = _mm512_set1_ps(1.9875691500e-4f);
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.3981999507e-3f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(8.3334519073e-3f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(4.1665795894e-2f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.6666665459e-1f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(5.0000001201e-1f));
    __m512 r2 = _mm512_mul_ps(r, r);
    p = _mm512_fmadd_ps(p, r2, _mm512_add_ps(r, _mm512_set1_ps(1.0f)));
    __m512i e = _mm512_slli_epi32(_mm512_add_epi32(_mm512_cvtps_epi32(n), _mm512_set1_epi32(127)), 23);
    __m512 y = _mm512_mul_ps(p, _mm512_castsi512_ps(e));
    /* anything at the clamp is below float's normal range: make it exactly 0 */
    return _mm512_maskz_mov_ps(_mm512_cmp_ps_mask(x, lo, _CMP_GT_OQ), y);
}

float vq_exp_shift_sum_avx512(float *x, int n, float m) {
    __m512 vm = _mm512_set1_ps(m), s = _mm512_setzero_ps();
    int i = 0;
    for (; i + 16 <= n; i += 16) {
        __m512 y = exp_avx512(_mm512_sub_ps(_mm512_loadu_ps(x + i), vm));
        _mm512_storeu_ps(x + i, y);
        s = _mm512_add_ps(s, y);
    }
    if (i < n) {
        __mmask16 k = (__mmask16)((1u << (n - i)) - 1);
        __m512 y = exp_avx512(_mm512_sub_ps(_mm512_mask_loadu_ps(_mm512_set1_ps(-INFINITY), k, x + i), vm));
        _mm512_mask_storeu_ps(x + i, k, y);
        s = _mm512_add_ps(s, y);
    }
    return _mm512_reduce_add_ps(s);
}

float vq_max_avx512(const float *x, int n) {
    __m512 mx = _mm512_set1_ps(-INFINITY);
    int i = 0;
    for (; i + 16 <= n; i += 16) mx = _mm512_max_ps(mx, _mm512_loadu_ps(x + i));
    if (i < n) mx = _mm512_max_ps(mx, _mm512_mask_loadu_ps(mx, (__mmask16)((1u << (n - i)) - 1), x + i));
    return _mm512_reduce_max_ps(mx);
}
