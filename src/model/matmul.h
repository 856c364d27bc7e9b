/* Matrix multiply for the model's linear layers: fp32 activations times
 * weights stored as fp32, fp16 or bf16 straight from the safetensors file. */
#ifndef VQ_MATMUL_H
#define VQ_MATMUL_H

#include "vq_internal.h"

#include <string.h>

/* One weight to fp32. Checkpoint data may be unaligned, so it is read with
 * memcpy rather than through a typed pointer. */
static inline float vq_weight_at(const void *p, vq_dtype wt) {
    if (wt == VQ_F32) {
        float f;
        memcpy(&f, p, sizeof f);
        return f;
    }
    uint16_t h;
    memcpy(&h, p, sizeof h);
    return wt == VQ_BF16 ? vq_bf16_to_f32(h) : vq_f16_to_f32(h);
}

/* y[i*out + o] = sum_k x[i*in + k] * W[o*in + k] (+ bias[o] when bias != NULL),
 * for i < n rows, o < out. x, y fp32 row-major, y must not overlap x. W is
 * row-major [out][in] in wt = VQ_F32, VQ_F16 or VQ_BF16 and may sit at any byte
 * address. Work is split over the pool by fixed blocks of output columns, so
 * the result is bit-identical for any thread count; pool may be NULL. */
void vq_matmul(vq_pool *pool, float *y, const float *x, int n, int in, const void *w, vq_dtype wt,
               int out, const float *bias);

/* The split, shared by the scalar and SIMD bodies: each task owns
 * VQ_MATMUL_COLS output columns; when W is converted to fp32 first, it is
 * converted VQ_MATMUL_KC input elements at a time into a stack buffer of
 * VQ_MATMUL_COLS * VQ_MATMUL_KC floats (16 KB: half of L1). */
enum { VQ_MATMUL_COLS = 16, VQ_MATMUL_KC = 256 };

/* AVX2 + FMA + F16C body for output columns [o0, o0 + cols): adds x W^T into
 * y, which the caller has set to the bias (or 0). Only called after the CPU
 * was checked. */
void vq_matmul_cols_avx2(float *y, const float *x, int n, int in, const uint8_t *w, vq_dtype wt,
                         int out, int o0, int cols);

/* The same with AVX-512 (F, BW, VL) + FMA + F16C, for CPU level VQ_CPU_AVX512.
 * With use_bf16_dot (the CPU has AVX512_BF16), bf16 weights are multiplied
 * with vdpbf16ps, which rounds x to bf16 first: each product then has a
 * relative error of up to 2^-8 (~3.9e-3), unlike the other paths, which are
 * exact up to fp32 accumulation. */
void vq_matmul_cols_avx512(float *y, const float *x, int n, int in, const uint8_t *w, vq_dtype wt,
                           int out, int o0, int cols, bool use_bf16_dot);

#endif
