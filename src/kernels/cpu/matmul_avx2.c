/* y += x W^T with AVX2 + FMA + F16C, for one block of output columns. Built
 * with -mavx2 -mfma -mf16c and only called after the CPU was checked.
 *
 * The micro-kernel multiplies up to 3 rows of x by 4 rows of W, 8 elements at
 * a time, into 12 vector accumulators: each W load feeds 3 FMAs and each x load
 * 4, and 12 independent chains hide the FMA latency. One row group (decode):
 * W is converted in registers as it streams from memory, so the kernel runs at
 * memory speed. More rows (prefill): a slice of W is converted to fp32 once
 * into a stack buffer and reused by every row group. */
#include "model/matmul.h"

#include <immintrin.h>
#include <string.h>

/* 8 consecutive weights as fp32. p may have any alignment. */
static inline __m256 load8(const uint8_t *p, vq_dtype wt) {
    if (wt == VQ_BF16) {
        /* bf16 is the top half of an fp32 */
        __m256i v = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)p));
        return _mm256_castsi256_ps(_mm256_slli_epi32(v, 16));
    }
    if (wt == VQ_F16) return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)p));
    return _mm256_loadu_ps((const float *)p);
}

/* Bytes per weight; inline so it folds to a constant inside the kernels. */
static inline size_t elem_size(vq_dtype wt) { return wt == VQ_F32 ? 4 : 2; }

/* [sum(a), sum(b), sum(c), sum(d)] */
static inline __m128 hsum4(__m256 a, __m256 b, __m256 c, __m256 d) {
    __m256 ab = _mm256_hadd_ps(a, b);
    __m256 cd = _mm256_hadd_ps(c, d);
    __m256 abcd = _mm256_hadd_ps(ab, cd);
    return _mm_add_ps(_mm256_castps256_ps128(abcd), _mm256_extractf128_ps(abcd, 1));
}

/* y[r*ys + c] += sum_k x[r*xs + k] * W_c[k] for r < rows (<= 3), c < cols (<= 4),
 * k < kc, where W_c starts at w + c*ws elements of type wt. Inlined into each
 * call with constant rows, cols and wt, so the accumulators stay in registers
 * and the untaken branches vanish. */
static inline __attribute__((always_inline)) void tile(int rows, int cols, const float *x,
                                                       size_t xs, const uint8_t *w, size_t ws,
                                                       vq_dtype wt, int kc, float *y, size_t ys) {
    size_t es = elem_size(wt);
    __m256 acc[3][4];
    for (int r = 0; r < 3; r++)
        for (int c = 0; c < 4; c++) acc[r][c] = _mm256_setzero_ps();
    int k = 0;
    for (; k + 8 <= kc; k += 8) {
        __m256 wv[4];
        for (int c = 0; c < 4; c++)
            wv[c] = c < cols ? load8(w + ((size_t)c * ws + (size_t)k) * es, wt) : _mm256_setzero_ps();
        for (int r = 0; r < rows; r++) {
            __m256 xv = _mm256_loadu_ps(x + (size_t)r * xs + k);
            for (int c = 0; c < cols; c++) acc[r][c] = _mm256_fmadd_ps(xv, wv[c], acc[r][c]);
        }
    }
    for (int r = 0; r < rows; r++) {
        float s[4];
        _mm_storeu_ps(s, hsum4(acc[r][0], acc[r][1], acc[r][2], acc[r][3]));
        for (int c = 0; c < cols; c++) {
            for (int t = k; t < kc; t++)
                s[c] += x[(size_t)r * xs + t] * vq_weight_at(w + ((size_t)c * ws + (size_t)t) * es, wt);
            y[(size_t)r * ys + c] += s[c];
        }
    }
}

/* Full-width tiles (4 columns) with constant rows for one constant wt. */
static inline __attribute__((always_inline)) void tile4(int rows, const float *x, size_t xs,
                                                        const uint8_t *w, size_t ws, vq_dtype wt,
                                                        int kc, float *y, size_t ys) {
    if (rows == 3)
        tile(3, 4, x, xs, w, ws, wt, kc, y, ys);
    else if (rows == 2)
        tile(2, 4, x, xs, w, ws, wt, kc, y, ys);
    else
        tile(1, 4, x, xs, w, ws, wt, kc, y, ys);
}

static void tile_any(int rows, int cols, const float *x, size_t xs, const uint8_t *w, size_t ws,
                     vq_dtype wt, int kc, float *y, size_t ys) {
    if (cols < 4) {
        /* only the last block of a layer whose width is not a multiple of 4 */
        tile(rows, cols, x, xs, w, ws, wt, kc, y, ys);
        return;
    }
    switch (wt) {
    case VQ_BF16: tile4(rows, x, xs, w, ws, VQ_BF16, kc, y, ys); break;
    case VQ_F16: tile4(rows, x, xs, w, ws, VQ_F16, kc, y, ys); break;
    default: tile4(rows, x, xs, w, ws, VQ_F32, kc, y, ys); break;
    }
}

/* dst[c*VQ_MATMUL_KC + k] = W_c[k] as fp32, for c < cols, k < kc. */
static void convert_slice(float *dst, const uint8_t *w, size_t ws, vq_dtype wt, int cols, int kc) {
    size_t es = elem_size(wt);
    for (int c = 0; c < cols; c++) {
        const uint8_t *src = w + (size_t)c * ws * es;
        float *d = dst + (size_t)c * VQ_MATMUL_KC;
        int k = 0;
        for (; k + 8 <= kc; k += 8) _mm256_storeu_ps(d + k, load8(src + (size_t)k * es, wt));
        for (; k < kc; k++) d[k] = vq_weight_at(src + (size_t)k * es, wt);
    }
}

void vq_matmul_cols_avx2(float *y, const float *x, int n, int in, const uint8_t *w, vq_dtype wt,
                         int out, int o0, int cols) {
    size_t es = elem_size(wt), xs = (size_t)in, ys = (size_t)out;
    const uint8_t *wb = w + (size_t)o0 * (size_t)in * es;
    y += o0;
    if (n <= 3) {
        /* One row group reads each weight once: stream W rows whole, four at a time. */
        for (int c = 0; c < cols; c += 4) {
            int nc = cols - c < 4 ? cols - c : 4;
            tile_any(n, nc, x, xs, wb + (size_t)c * (size_t)in * es, (size_t)in, wt, in, y + c, ys);
        }
        return;
    }
    float wf[VQ_MATMUL_COLS * VQ_MATMUL_KC];
    for (int k0 = 0; k0 < in; k0 += VQ_MATMUL_KC) {
        int kc = in - k0 < VQ_MATMUL_KC ? in - k0 : VQ_MATMUL_KC;
        convert_slice(wf, wb + (size_t)k0 * es, (size_t)in, wt, cols, kc);
        for (int i0 = 0; i0 < n; i0 += 3) {
            int rows = n - i0 < 3 ? n - i0 : 3;
            for (int c = 0; c < cols; c += 4) {
                int nc = cols - c < 4 ? cols - c : 4;
                tile_any(rows, nc, x + (size_t)i0 * xs + k0, xs,
                         (const uint8_t *)(wf + (size_t)c * VQ_MATMUL_KC), VQ_MATMUL_KC, VQ_F32, kc,
                         y + (size_t)i0 * ys + c, ys);
            }
        }
    }
}
