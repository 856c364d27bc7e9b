/* y += x W^T with AVX-512 (F, BW, VL, BF16) + FMA + F16C, for one block of
 * output columns. Built with those flags and only called when the process's
 * CPU level is VQ_CPU_AVX512 (and, for the bf16 dot product, when the CPU
 * has AVX512_BF16).
 *
 * Same structure as matmul_avx2.c, 16 lanes wide: a 3-row x 4-column
 * micro-kernel with 12 accumulators; decode (n <= 3) streams W and converts it
 * in registers, prefill converts a slice of W to fp32 once and reuses it for
 * every row group. Row tails (in not a multiple of 16) use masked loads, which
 * read nothing past the end of a row, so no scalar tail loops are needed.
 *
 * bf16 weights with the bf16 dot product (vdpbf16ps) skip the conversion of W
 * altogether: x is rounded to bf16 instead (round to nearest even), once per
 * call, and each instruction multiplies 32 bf16 pairs and adds them into 16
 * fp32 sums. Products of two bf16 values are exact in fp32, so the only extra
 * error is the rounding of x: bf16 keeps 8 significant bits, so at most 2^-8
 * (~3.9e-3) relative per element. */
#include "model/matmul.h"

#include <immintrin.h>

/* Bytes per weight; inline so it folds to a constant inside the kernels. */
static inline size_t elem_size(vq_dtype wt) { return wt == VQ_F32 ? 4 : 2; }

/* The weights selected by m (a run of low lanes) of 16 consecutive ones, as
 * fp32, 0 in the other lanes. p may have any alignment; masked-off elements
 * are not read, so the run may end at the last byte of W. */
static inline __m512 load16(const uint8_t *p, vq_dtype wt, __mmask16 m) {
    if (wt == VQ_BF16) {
        /* bf16 is the top half of an fp32 */
        __m512i v = _mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(m, p));
        return _mm512_castsi512_ps(_mm512_slli_epi32(v, 16));
    }
    if (wt == VQ_F16) return _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(m, p));
    return _mm512_maskz_loadu_ps(m, p);
}

/* Mask of the low r lanes, 0 < r <= 16 (or <= 32 for the 32-bit form). */
static inline __mmask16 low_lanes16(int r) { return (__mmask16)((1u << r) - 1u); }
static inline __mmask32 low_lanes32(int r) { return r >= 32 ? 0xffffffffu : (1u << r) - 1u; }

/* y[r*ys + c] += sum_k x[r*xs + k] * W_c[k] for r < rows (<= 3), c < cols (<= 4),
 * k < kc, where W_c starts at w + c*ws elements of type wt. Inlined into each
 * call with constant rows, cols and wt, so the accumulators stay in registers
 * and the untaken branches vanish. */
static inline __attribute__((always_inline)) void tile(int rows, int cols, const float *x,
                                                       size_t xs, const uint8_t *w, size_t ws,
                                                       vq_dtype wt, int kc, float *y, size_t ys) {
    size_t es = elem_size(wt);
    __m512 acc[3][4];
    for (int r = 0; r < 3; r++)
        for (int c = 0; c < 4; c++) acc[r][c] = _mm512_setzero_ps();
    for (int k = 0; k < kc; k += 16) {
        /* all lanes but in the last, partial step */
        __mmask16 m = low_lanes16(kc - k < 16 ? kc - k : 16);
        __m512 wv[4];
        for (int c = 0; c < 4; c++)
            wv[c] = c < cols ? load16(w + ((size_t)c * ws + (size_t)k) * es, wt, m) : _mm512_setzero_ps();
        for (int r = 0; r < rows; r++) {
            __m512 xv = _mm512_maskz_loadu_ps(m, x + (size_t)r * xs + k);
            for (int c = 0; c < cols; c++) acc[r][c] = _mm512_fmadd_ps(xv, wv[c], acc[r][c]);
        }
    }
    for (int r = 0; r < rows; r++)
        for (int c = 0; c < cols; c++) y[(size_t)r * ys + c] += _mm512_reduce_add_ps(acc[r][c]);
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

/* dst[c*VQ_MATMUL_KC + k] = W_c[k] as fp32, for c < cols, k < kc. The last
 * store of a row may write zeros past kc: it stays inside the row, since kc
 * <= VQ_MATMUL_KC, a multiple of 16. */
static void convert_slice(float *dst, const uint8_t *w, size_t ws, vq_dtype wt, int cols, int kc) {
    size_t es = elem_size(wt);
    for (int c = 0; c < cols; c++) {
        const uint8_t *src = w + (size_t)c * ws * es;
        float *d = dst + (size_t)c * VQ_MATMUL_KC;
        for (int k = 0; k < kc; k += 16)
            _mm512_storeu_ps(d + k, load16(src + (size_t)k * es, wt, low_lanes16(kc - k < 16 ? kc - k : 16)));
    }
}

/* The same tile for bf16 weights with vdpbf16ps: xb holds rows of x already
 * rounded to bf16, VQ_MATMUL_KC elements apart and zero-padded up to a
 * multiple of 32; W_c starts at w + c*ws bf16 elements. Each step takes 32
 * elements: lane j sums the products of pairs 2j and 2j+1. */
static inline __attribute__((always_inline)) void tile_dot(int rows, int cols, const uint16_t *xb,
                                                           const uint8_t *w, size_t ws, int kc,
                                                           float *y, size_t ys) {
    __m512 acc[3][4];
    for (int r = 0; r < 3; r++)
        for (int c = 0; c < 4; c++) acc[r][c] = _mm512_setzero_ps();
    for (int k = 0; k < kc; k += 32) {
        /* masked-off weights read as 0, matching the zero padding of xb */
        __mmask32 m = low_lanes32(kc - k);
        __m512bh wv[4];
        for (int c = 0; c < 4; c++)
            wv[c] = (__m512bh)(c < cols ? _mm512_maskz_loadu_epi16(m, w + ((size_t)c * ws + (size_t)k) * 2)
                                        : _mm512_setzero_si512());
        for (int r = 0; r < rows; r++) {
            __m512bh xv = (__m512bh)_mm512_loadu_si512(xb + (size_t)r * VQ_MATMUL_KC + k);
            for (int c = 0; c < cols; c++) acc[r][c] = _mm512_dpbf16_ps(acc[r][c], xv, wv[c]);
        }
    }
    for (int r = 0; r < rows; r++)
        for (int c = 0; c < cols; c++) y[(size_t)r * ys + c] += _mm512_reduce_add_ps(acc[r][c]);
}

static void tile_dot_any(int rows, int cols, const uint16_t *xb, const uint8_t *w, size_t ws,
                         int kc, float *y, size_t ys) {
    if (cols < 4)
        tile_dot(rows, cols, xb, w, ws, kc, y, ys);
    else if (rows == 3)
        tile_dot(3, 4, xb, w, ws, kc, y, ys);
    else if (rows == 2)
        tile_dot(2, 4, xb, w, ws, kc, y, ys);
    else
        tile_dot(1, 4, xb, w, ws, kc, y, ys);
}

/* xb[r*VQ_MATMUL_KC + k] = x[r*xs + k] rounded to bf16 (nearest even), for
 * r < rows, k < kc, then zeros up to the next multiple of 32. */
static void round_rows_bf16(uint16_t *xb, const float *x, size_t xs, int rows, int kc) {
    for (int r = 0; r < rows; r++) {
        const float *xr = x + (size_t)r * xs;
        uint16_t *d = xb + (size_t)r * VQ_MATMUL_KC;
        for (int k = 0; k < kc; k += 32) {
            int left = kc - k;
            __m512 lo = _mm512_maskz_loadu_ps(low_lanes16(left < 16 ? left : 16), xr + k);
            __m512 hi = left > 16 ? _mm512_maskz_loadu_ps(low_lanes16(left - 16 < 16 ? left - 16 : 16), xr + k + 16)
                                  : _mm512_setzero_ps();
            /* the second operand fills the low half: elements k .. k+15 */
            _mm512_storeu_si512(d + k, (__m512i)_mm512_cvtne2ps_pbh(hi, lo));
        }
    }
}

/* bf16 weights with the bf16 dot product. W is used as stored, so prefill
 * needs no fp32 slice; x is rounded once per slice and row group, which is
 * once per call for each element of x. */
static void matmul_cols_bf16_dot(float *y, const float *x, int n, int in, const uint8_t *wb,
                                 int out, int cols) {
    size_t xs = (size_t)in, ys = (size_t)out;
    uint16_t xb[3 * VQ_MATMUL_KC];
    for (int k0 = 0; k0 < in; k0 += VQ_MATMUL_KC) {
        int kc = in - k0 < VQ_MATMUL_KC ? in - k0 : VQ_MATMUL_KC;
        for (int i0 = 0; i0 < n; i0 += 3) {
            int rows = n - i0 < 3 ? n - i0 : 3;
            round_rows_bf16(xb, x + (size_t)i0 * xs + k0, xs, rows, kc);
            for (int c = 0; c < cols; c += 4) {
                int nc = cols - c < 4 ? cols - c : 4;
                tile_dot_any(rows, nc, xb, wb + ((size_t)c * (size_t)in + (size_t)k0) * 2, (size_t)in,
                             kc, y + (size_t)i0 * ys + c, ys);
            }
        }
    }
}

void vq_matmul_cols_avx512(float *y, const float *x, int n, int in, const uint8_t *w, vq_dtype wt,
                           int out, int o0, int cols, bool use_bf16_dot) {
    size_t es = elem_size(wt), xs = (size_t)in, ys = (size_t)out;
    const uint8_t *wb = w + (size_t)o0 * (size_t)in * es;
    y += o0;
    if (wt == VQ_BF16 && use_bf16_dot) {
        matmul_cols_bf16_dot(y, x, n, in, wb, out, cols);
        return;
    }
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
