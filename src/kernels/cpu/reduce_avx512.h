/* Horizontal sums shared by the AVX-512 attention kernels (*_avx512.c,
 * built with the AVX-512 flags; include only from those files). */
#ifndef VQ_REDUCE_AVX512_H
#define VQ_REDUCE_AVX512_H

#include <immintrin.h>

/* 16 lanes -> 8 by adding the two 256-bit halves (an AVX2 hadd tree or
 * store then finishes). */
static inline __m256 vq_fold512(__m512 a) {
    return _mm256_add_ps(_mm512_castps512_ps256(a), _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(a), 1)));
}

/* The sums of a[0..15] (16 lanes each) as the lanes of one vector: lane
 * 4 k + t holds the sum of a[4 t + k]. Four levels of shuffles and adds. */
static inline __m512 vq_sum16x16(const __m512 *a) {
    __m512 b[8], c[4], e[2];
    for (int i = 0; i < 8; i++) /* 256-bit halves: a(2i) | a(2i+1), 8 partials each */
        b[i] = _mm512_add_ps(_mm512_shuffle_f32x4(a[2 * i], a[2 * i + 1], 0x44),
                             _mm512_shuffle_f32x4(a[2 * i], a[2 * i + 1], 0xEE));
    for (int i = 0; i < 4; i++) /* 128-bit lane j: 4 partials of a(4i + j) */
        c[i] = _mm512_add_ps(_mm512_shuffle_f32x4(b[2 * i], b[2 * i + 1], 0x88),
                             _mm512_shuffle_f32x4(b[2 * i], b[2 * i + 1], 0xDD));
    for (int i = 0; i < 2; i++) /* lane j: 2 partials each of a(8i + j), a(8i + 4 + j) */
        e[i] = _mm512_add_ps(_mm512_shuffle_ps(c[2 * i], c[2 * i + 1], 0x88),
                             _mm512_shuffle_ps(c[2 * i], c[2 * i + 1], 0xDD));
    return _mm512_add_ps(_mm512_shuffle_ps(e[0], e[1], 0x88), _mm512_shuffle_ps(e[0], e[1], 0xDD));
}

#endif
