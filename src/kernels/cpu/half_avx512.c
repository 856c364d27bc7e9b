/* fp16/bf16 array conversion with AVX-512 (F + BW): 16 values per step. Built
 * with -mavx512f -mavx512bw and only called at the avx512 CPU level. The
 * results are identical to the scalar conversions (tests/test_half.c runs all
 * three levels). */
#include "vq_internal.h"

#include <immintrin.h>

void vq_f32_to_f16_avx512(const float *x, uint16_t *out, size_t n) {
    size_t i = 0;
    for (; i + 16 <= n; i += 16) {
        __m256i h = _mm512_cvtps_ph(_mm512_loadu_ps(x + i), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
        _mm256_storeu_si256((__m256i *)(out + i), h);
    }
    for (; i < n; i++) out[i] = vq_f32_to_f16(x[i]);
}

void vq_f16_to_f32_avx512(const uint16_t *h, float *out, size_t n) {
    size_t i = 0;
    for (; i + 16 <= n; i += 16)
        _mm512_storeu_ps(out + i, _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(h + i))));
    for (; i < n; i++) out[i] = vq_f16_to_f32(h[i]);
}

/* Round to nearest even by adding 0x7fff + the lowest kept bit; NaN keeps its
 * top bits and gets the quiet bit instead, so it never rounds to infinity. */
void vq_f32_to_bf16_avx512(const float *x, uint16_t *out, size_t n) {
    size_t i = 0;
    const __m512i bias = _mm512_set1_epi32(0x7fff), one = _mm512_set1_epi32(1);
    const __m512i absmask = _mm512_set1_epi32(0x7fffffff), inf = _mm512_set1_epi32(0x7f800000);
    const __m512i quiet = _mm512_set1_epi32(0x400000);
    for (; i + 16 <= n; i += 16) {
        __m512i v = _mm512_loadu_si512((const void *)(x + i));
        __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(v, 16), one);
        __m512i r = _mm512_add_epi32(v, _mm512_add_epi32(bias, lsb));
        __mmask16 isnan = _mm512_cmpgt_epi32_mask(_mm512_and_si512(v, absmask), inf);
        r = _mm512_mask_or_epi32(r, isnan, v, quiet);
        _mm256_storeu_si256((__m256i *)(out + i), _mm512_cvtepi32_epi16(_mm512_srli_epi32(r, 16)));
    }
    for (; i < n; i++) out[i] = vq_f32_to_bf16(x[i]);
}

void vq_bf16_to_f32_avx512(const uint16_t *h, float *out, size_t n) {
    size_t i = 0;
    for (; i + 16 <= n; i += 16) {
        __m512i v = _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)(h + i)));
        _mm512_storeu_si512((void *)(out + i), _mm512_slli_epi32(v, 16));
    }
    for (; i < n; i++) out[i] = vq_bf16_to_f32(h[i]);
}
