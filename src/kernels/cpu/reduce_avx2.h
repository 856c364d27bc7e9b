/* The horizontal sum shared by the AVX2 attention kernels and the 8-lane
 * steps of the AVX-512 ones (built with at least -mavx2). */
#ifndef VQ_REDUCE_AVX2_H
#define VQ_REDUCE_AVX2_H

#include <immintrin.h>

/* The sums of v[0..7] (8 lanes each) as the lanes of one vector: lane k
 * holds the sum of v[k]. Two levels of hadds, then the 128-bit halves. */
static inline __m256 vq_sum8x8(const __m256 *v) {
    __m256 h0 = _mm256_hadd_ps(_mm256_hadd_ps(v[0], v[1]), _mm256_hadd_ps(v[2], v[3]));
    __m256 h1 = _mm256_hadd_ps(_mm256_hadd_ps(v[4], v[5]), _mm256_hadd_ps(v[6], v[7]));
    /* h0 = {sums of v0 v1 v2 v3 | the same}, one half each; h1 for v4..v7 */
    return _mm256_add_ps(_mm256_permute2f128_ps(h0, h1, 0x20), _mm256_permute2f128_ps(h0, h1, 0x31));
}

#endif
