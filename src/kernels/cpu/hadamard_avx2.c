/* Walsh-Hadamard transform with AVX2 (see core/hadamard.c). The three
 * butterfly passes inside one 8-float register use lane permutes; the wider
 * passes are plain vector adds and subtracts. Same operations and order per
 * element as the scalar code, so the results are identical. */
#include "core/rotate.h"

#include <immintrin.h>

void vq_fwht_avx2(float *x, int n) {
    /* n >= 8, a power of two */
    for (int i = 0; i < n; i += 8) {
        __m256 a = _mm256_loadu_ps(x + i);
        /* each pass: lower lanes of a butterfly take self + partner, upper
         * lanes partner - self (= lower - upper) */
        __m256 p = _mm256_permute_ps(a, 0xB1); /* h = 1: swap neighbours */
        a = _mm256_blend_ps(_mm256_add_ps(a, p), _mm256_sub_ps(p, a), 0xAA);
        p = _mm256_permute_ps(a, 0x4E); /* h = 2: swap pairs */
        a = _mm256_blend_ps(_mm256_add_ps(a, p), _mm256_sub_ps(p, a), 0xCC);
        p = _mm256_permute2f128_ps(a, a, 0x01); /* h = 4: swap halves */
        a = _mm256_blend_ps(_mm256_add_ps(a, p), _mm256_sub_ps(p, a), 0xF0);
        _mm256_storeu_ps(x + i, a);
    }
    for (int h = 8; h < n; h *= 2)
        for (int i = 0; i < n; i += 2 * h)
            for (int j = i; j < i + h; j += 8) {
                __m256 a = _mm256_loadu_ps(x + j), b = _mm256_loadu_ps(x + j + h);
                _mm256_storeu_ps(x + j, _mm256_add_ps(a, b));
                _mm256_storeu_ps(x + j + h, _mm256_sub_ps(a, b));
            }
}
