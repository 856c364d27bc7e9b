/* fp16/bf16 array conversion with F16C and AVX2. Built with -mavx2 -mfma -mf16c
 * and only called after the CPU was checked. */
#include "vq_internal.h"

#include <immintrin.h>

void vq_f32_to_f16_avx2(const float *x, uint16_t *out, size_t n) {
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        __m128i h = _mm256_cvtps_ph(_mm256_loadu_ps(x + i), _MM_FROUND_TO_NEAREST_INT);
        _mm_storeu_si128((__m128i *)(out + i), h);
    }
    for (; i < n; i++) out[i] = vq_f32_to_f16(x[i]);
}

void vq_f16_to_f32_avx2(const uint16_t *h, float *out, size_t n) {
    size_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(out + i, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(h + i))));
    for (; i < n; i++) out[i] = vq_f16_to_f32(h[i]);
}

void vq_f32_to_bf16_avx2(const float *x, uint16_t *out, size_t n) {
    size_t i = 0;
    const __m256i bias = _mm256_set1_epi32(0x7fff), one = _mm256_set1_epi32(1);
    const __m256i absmask = _mm256_set1_epi32(0x7fffffff), inf = _mm256_set1_epi32(0x7f800000);
    const __m256i quiet = _mm256_set1_epi32(0x400000);
    for (; i + 8 <= n; i += 8) {
        __m256i v = _mm256_loadu_si256((const __m256i *)(x + i));
        __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(v, 16), one);
        __m256i r = _mm256_add_epi32(v, _mm256_add_epi32(bias, lsb));
        /* NaN: truncate and set the quiet bit instead of rounding */
        __m256i isnan = _mm256_cmpgt_epi32(_mm256_and_si256(v, absmask), inf);
        r = _mm256_blendv_epi8(r, _mm256_or_si256(v, quiet), isnan);
        r = _mm256_srli_epi32(r, 16);
        __m128i lo = _mm256_castsi256_si128(r), hi = _mm256_extracti128_si256(r, 1);
        _mm_storeu_si128((__m128i *)(out + i), _mm_packus_epi32(lo, hi));
    }
    for (; i < n; i++) out[i] = vq_f32_to_bf16(x[i]);
}

void vq_bf16_to_f32_avx2(const uint16_t *h, float *out, size_t n) {
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        __m256i v = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)(h + i)));
        _mm256_storeu_si256((__m256i *)(out + i), _mm256_slli_epi32(v, 16));
    }
    for (; i < n; i++) out[i] = vq_bf16_to_f32(h[i]);
}
