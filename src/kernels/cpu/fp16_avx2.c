/* AVX2 + F16C kernels for fp16 K/V rows. d is a multiple of 16. */
#include "vq_internal.h"

#include <immintrin.h>

/* Sums each of 8 vectors horizontally: returns {sum(a[0]), ..., sum(a[7])}. */
static inline __m256 hsum8(const __m256 *a) {
    __m256 t0 = _mm256_hadd_ps(a[0], a[1]), t1 = _mm256_hadd_ps(a[2], a[3]);
    __m256 t2 = _mm256_hadd_ps(a[4], a[5]), t3 = _mm256_hadd_ps(a[6], a[7]);
    __m256 u0 = _mm256_hadd_ps(t0, t1), u1 = _mm256_hadd_ps(t2, t3);
    __m256 lo = _mm256_permute2f128_ps(u0, u1, 0x20), hi = _mm256_permute2f128_ps(u0, u1, 0x31);
    return _mm256_add_ps(lo, hi);
}

void vq_fp16_score_avx2(const float *q, int rows, int d, const uint16_t *k, int n, float *logits,
                        int ld) {
    __m256 part[4][8];
    for (int r0 = 0; r0 < rows; r0 += 4) {
        int nr = rows - r0 < 4 ? rows - r0 : 4;
        const float *q0 = q + (size_t)r0 * d;
        for (int j0 = 0; j0 < n; j0 += 8) {
            int nj = n - j0 < 8 ? n - j0 : 8;
            for (int jj = 0; jj < nj; jj++) {
                const uint16_t *kj = k + (size_t)(j0 + jj) * d;
                __m256 a[4][2];
                for (int r = 0; r < 4; r++) a[r][0] = a[r][1] = _mm256_setzero_ps();
                for (int c = 0; c < d; c += 16) {
                    __m256 k0 = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(kj + c)));
                    __m256 k1 = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(kj + c + 8)));
                    for (int r = 0; r < nr; r++) {
                        const float *qr = q0 + (size_t)r * d + c;
                        a[r][0] = _mm256_fmadd_ps(_mm256_loadu_ps(qr), k0, a[r][0]);
                        a[r][1] = _mm256_fmadd_ps(_mm256_loadu_ps(qr + 8), k1, a[r][1]);
                    }
                }
                for (int r = 0; r < nr; r++) part[r][jj] = _mm256_add_ps(a[r][0], a[r][1]);
            }
            for (int r = 0; r < nr; r++) {
                for (int jj = nj; jj < 8; jj++) part[r][jj] = _mm256_setzero_ps();
                __m256 s = hsum8(part[r]);
                float *dst = logits + (size_t)(r0 + r) * ld + j0;
                if (nj == 8) {
                    _mm256_storeu_ps(dst, s);
                } else {
                    float tmp[8];
                    _mm256_storeu_ps(tmp, s);
                    for (int jj = 0; jj < nj; jj++) dst[jj] = tmp[jj];
                }
            }
        }
    }
}

void vq_fp16_accum_avx2(const float *w, int ld, int rows, int d, const uint16_t *v, int n,
                        float *acc) {
    for (int r0 = 0; r0 < rows; r0 += 4) {
        int nr = rows - r0 < 4 ? rows - r0 : 4;
        const float *w0 = w + (size_t)r0 * ld;
        for (int c = 0; c < d; c += 16) {
            __m256 a[4][2];
            for (int r = 0; r < nr; r++) {
                a[r][0] = _mm256_loadu_ps(acc + (size_t)(r0 + r) * d + c);
                a[r][1] = _mm256_loadu_ps(acc + (size_t)(r0 + r) * d + c + 8);
            }
            for (int j = 0; j < n; j++) {
                const uint16_t *vj = v + (size_t)j * d + c;
                __m256 v0 = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)vj));
                __m256 v1 = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(vj + 8)));
                for (int r = 0; r < nr; r++) {
                    __m256 wr = _mm256_broadcast_ss(w0 + (size_t)r * ld + j);
                    a[r][0] = _mm256_fmadd_ps(wr, v0, a[r][0]);
                    a[r][1] = _mm256_fmadd_ps(wr, v1, a[r][1]);
                }
            }
            for (int r = 0; r < nr; r++) {
                _mm256_storeu_ps(acc + (size_t)(r0 + r) * d + c, a[r][0]);
                _mm256_storeu_ps(acc + (size_t)(r0 + r) * d + c + 8, a[r][1]);
            }
        }
    }
}
