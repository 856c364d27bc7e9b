/* AVX-512 kernels for fp16 K/V rows (the AVX2 ones in fp16_avx2.c, 16 lanes
 * wide). d is a multiple of 32. Built with -mavx512f -mavx512bw -mf16c and only
 * called at the avx512 CPU level.
 *
 * As in the AVX2 file, the 4-row bodies (one GQA group of 4 q heads, the
 * decode case) are written out so the accumulators stay in registers; other
 * row counts run 4 at a time and then one at a time. */
#include "reduce_avx512.h"
#include "vq_internal.h"

#include <immintrin.h>

static inline __m512 load_h16(const uint16_t *p) {
    return _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)p));
}

/* Scores of 4 rows against tokens j and j+1, returned as
 * {r0t0, r0t1, r1t0, r1t1 | r2t0, r2t1, r3t0, r3t1}. */
static inline __m256 score4x2(const float *q, int d, const uint16_t *k0, const uint16_t *k1) {
    __m512 a00 = _mm512_setzero_ps(), a01 = _mm512_setzero_ps();
    __m512 a10 = _mm512_setzero_ps(), a11 = _mm512_setzero_ps();
    __m512 a20 = _mm512_setzero_ps(), a21 = _mm512_setzero_ps();
    __m512 a30 = _mm512_setzero_ps(), a31 = _mm512_setzero_ps();
    for (int c = 0; c < d; c += 16) {
        __m512 x0 = load_h16(k0 + c), x1 = load_h16(k1 + c);
        __m512 q0 = _mm512_loadu_ps(q + c), q1 = _mm512_loadu_ps(q + d + c);
        __m512 q2 = _mm512_loadu_ps(q + 2 * d + c), q3 = _mm512_loadu_ps(q + 3 * d + c);
        a00 = _mm512_fmadd_ps(q0, x0, a00);
        a01 = _mm512_fmadd_ps(q0, x1, a01);
        a10 = _mm512_fmadd_ps(q1, x0, a10);
        a11 = _mm512_fmadd_ps(q1, x1, a11);
        a20 = _mm512_fmadd_ps(q2, x0, a20);
        a21 = _mm512_fmadd_ps(q2, x1, a21);
        a30 = _mm512_fmadd_ps(q3, x0, a30);
        a31 = _mm512_fmadd_ps(q3, x1, a31);
    }
    __m256 h01 = _mm256_hadd_ps(_mm256_hadd_ps(vq_fold512(a00), vq_fold512(a01)),
                                _mm256_hadd_ps(vq_fold512(a10), vq_fold512(a11)));
    __m256 h23 = _mm256_hadd_ps(_mm256_hadd_ps(vq_fold512(a20), vq_fold512(a21)),
                                _mm256_hadd_ps(vq_fold512(a30), vq_fold512(a31)));
    return _mm256_add_ps(_mm256_permute2f128_ps(h01, h23, 0x20), _mm256_permute2f128_ps(h01, h23, 0x31));
}

static void score4(const float *q, int d, const uint16_t *k, int n, float *logits, int ld) {
    float *l0 = logits, *l1 = logits + ld, *l2 = logits + 2 * (size_t)ld, *l3 = logits + 3 * (size_t)ld;
    int j = 0;
    for (; j + 2 <= n; j += 2) {
        __m256 s = score4x2(q, d, k + (size_t)j * d, k + (size_t)(j + 1) * d);
        __m128 lo = _mm256_castps256_ps128(s), hi = _mm256_extractf128_ps(s, 1);
        _mm_storel_pi((__m64 *)(l0 + j), lo);
        _mm_storeh_pi((__m64 *)(l1 + j), lo);
        _mm_storel_pi((__m64 *)(l2 + j), hi);
        _mm_storeh_pi((__m64 *)(l3 + j), hi);
    }
    if (j < n) { /* odd count: score the last token twice, keep one */
        const uint16_t *kj = k + (size_t)j * d;
        float t[8];
        _mm256_storeu_ps(t, score4x2(q, d, kj, kj));
        l0[j] = t[0];
        l1[j] = t[2];
        l2[j] = t[4];
        l3[j] = t[6];
    }
}

static void score1(const float *q, int d, const uint16_t *k, int n, float *logits) {
    for (int j = 0; j < n; j++) {
        const uint16_t *kj = k + (size_t)j * d;
        __m512 a0 = _mm512_setzero_ps(), a1 = _mm512_setzero_ps();
        for (int c = 0; c < d; c += 32) {
            a0 = _mm512_fmadd_ps(_mm512_loadu_ps(q + c), load_h16(kj + c), a0);
            a1 = _mm512_fmadd_ps(_mm512_loadu_ps(q + c + 16), load_h16(kj + c + 16), a1);
        }
        logits[j] = _mm512_reduce_add_ps(_mm512_add_ps(a0, a1));
    }
}

void vq_fp16_score_avx512(const float *q, int rows, int d, const uint16_t *k, int n, float *logits,
                          int ld) {
    int r = 0;
    for (; r + 4 <= rows; r += 4) score4(q + (size_t)r * d, d, k, n, logits + (size_t)r * ld, ld);
    for (; r < rows; r++) score1(q + (size_t)r * d, d, k, n, logits + (size_t)r * ld);
}

/* acc[0..3][c..c+31] += sum_j w[r][j] * v_j[c..c+31]: 8 accumulators in
 * registers over all n tokens; v is re-read per 32 channels from L1. */
static void accum4(const float *w, int ld, int d, const uint16_t *v, int n, float *acc) {
    const float *w0 = w, *w1 = w + ld, *w2 = w + 2 * (size_t)ld, *w3 = w + 3 * (size_t)ld;
    float *c0 = acc, *c1 = acc + d, *c2 = acc + 2 * (size_t)d, *c3 = acc + 3 * (size_t)d;
    for (int c = 0; c < d; c += 32) {
        __m512 a00 = _mm512_loadu_ps(c0 + c), a01 = _mm512_loadu_ps(c0 + c + 16);
        __m512 a10 = _mm512_loadu_ps(c1 + c), a11 = _mm512_loadu_ps(c1 + c + 16);
        __m512 a20 = _mm512_loadu_ps(c2 + c), a21 = _mm512_loadu_ps(c2 + c + 16);
        __m512 a30 = _mm512_loadu_ps(c3 + c), a31 = _mm512_loadu_ps(c3 + c + 16);
        for (int j = 0; j < n; j++) {
            const uint16_t *vj = v + (size_t)j * d + c;
            __m512 x0 = load_h16(vj), x1 = load_h16(vj + 16);
            __m512 b0 = _mm512_set1_ps(w0[j]), b1 = _mm512_set1_ps(w1[j]);
            __m512 b2 = _mm512_set1_ps(w2[j]), b3 = _mm512_set1_ps(w3[j]);
            a00 = _mm512_fmadd_ps(b0, x0, a00);
            a01 = _mm512_fmadd_ps(b0, x1, a01);
            a10 = _mm512_fmadd_ps(b1, x0, a10);
            a11 = _mm512_fmadd_ps(b1, x1, a11);
            a20 = _mm512_fmadd_ps(b2, x0, a20);
            a21 = _mm512_fmadd_ps(b2, x1, a21);
            a30 = _mm512_fmadd_ps(b3, x0, a30);
            a31 = _mm512_fmadd_ps(b3, x1, a31);
        }
        _mm512_storeu_ps(c0 + c, a00);
        _mm512_storeu_ps(c0 + c + 16, a01);
        _mm512_storeu_ps(c1 + c, a10);
        _mm512_storeu_ps(c1 + c + 16, a11);
        _mm512_storeu_ps(c2 + c, a20);
        _mm512_storeu_ps(c2 + c + 16, a21);
        _mm512_storeu_ps(c3 + c, a30);
        _mm512_storeu_ps(c3 + c + 16, a31);
    }
}

static void accum1(const float *w, int d, const uint16_t *v, int n, float *acc) {
    for (int c = 0; c < d; c += 32) {
        __m512 a0 = _mm512_loadu_ps(acc + c), a1 = _mm512_loadu_ps(acc + c + 16);
        for (int j = 0; j < n; j++) {
            const uint16_t *vj = v + (size_t)j * d + c;
            __m512 b = _mm512_set1_ps(w[j]);
            a0 = _mm512_fmadd_ps(b, load_h16(vj), a0);
            a1 = _mm512_fmadd_ps(b, load_h16(vj + 16), a1);
        }
        _mm512_storeu_ps(acc + c, a0);
        _mm512_storeu_ps(acc + c + 16, a1);
    }
}

void vq_fp16_accum_avx512(const float *w, int ld, int rows, int d, const uint16_t *v, int n,
                          float *acc) {
    int r = 0;
    for (; r + 4 <= rows; r += 4) accum4(w + (size_t)r * ld, ld, d, v, n, acc + (size_t)r * d);
    for (; r < rows; r++) accum1(w + (size_t)r * ld, d, v, n, acc + (size_t)r * d);
}
