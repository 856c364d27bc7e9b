/* fp16 and bf16 <-> fp32. The scalar code is exact (round to nearest even,
 * subnormals, infinities, quiet NaN) and is what the SIMD paths must match. */
#include "vq_internal.h"

#include <string.h>

static uint32_t f32_bits(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}

static float bits_f32(uint32_t u) {
    float f;
    memcpy(&f, &u, 4);
    return f;
}

/* Rounds m >> shift to nearest, ties to even. shift in [1, 31]. */
static uint32_t shift_rne(uint32_t m, int shift) {
    uint32_t q = m >> shift;
    uint32_t rem = m & ((1u << shift) - 1);
    uint32_t half = 1u << (shift - 1);
    if (rem > half || (rem == half && (q & 1))) q++;
    return q;
}

uint16_t vq_f32_to_f16(float f) {
    uint32_t x = f32_bits(f);
    uint16_t sign = (uint16_t)((x >> 16) & 0x8000);
    uint32_t a = x & 0x7fffffff;
    if (a > 0x7f800000) /* NaN: keep the top payload bits, make it quiet (as F16C does) */
        return (uint16_t)(sign | 0x7e00 | ((a >> 13) & 0x3ff));
    if (a == 0x7f800000) return (uint16_t)(sign | 0x7c00);
    int e = (int)(a >> 23);           /* biased fp32 exponent */
    uint32_t m = a & 0x7fffff;
    if (e >= 113) {                   /* normal fp16 range or overflow */
        int e16 = e - 112;
        if (e16 >= 31) return (uint16_t)(sign | 0x7c00);
        /* Rounding may carry into the exponent, and up to infinity: both are right. */
        uint32_t v = ((uint32_t)e16 << 10) + shift_rne(m, 13);
        if (v >= 0x7c00) v = 0x7c00;
        return (uint16_t)(sign | v);
    }
    if (e == 0) return sign;          /* fp32 zero or subnormal: far below fp16's range */
    /* fp16 subnormal: value = (m | 2^23) * 2^(e-150); in units of 2^-24 that is
     * (m | 2^23) >> (126 - e). */
    int shift = 126 - e;
    if (shift > 24) return sign;      /* below half the smallest subnormal */
    return (uint16_t)(sign | shift_rne(m | 0x800000, shift));
}

float vq_f16_to_f32(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000) << 16;
    uint32_t e = (h >> 10) & 0x1f;
    uint32_t m = h & 0x3ff;
    if (e == 31) /* inf, or NaN made quiet */
        return bits_f32(sign | 0x7f800000 | (m ? (0x400000 | (m << 13)) : 0));
    if (e == 0) {
        if (m == 0) return bits_f32(sign);
        /* subnormal: normalize */
        int shift = 0;
        while (!(m & 0x400)) {
            m <<= 1;
            shift++;
        }
        m &= 0x3ff;
        return bits_f32(sign | ((uint32_t)(113 - shift) << 23) | (m << 13));
    }
    return bits_f32(sign | ((e + 112) << 23) | (m << 13));
}

uint16_t vq_f32_to_bf16(float f) {
    uint32_t x = f32_bits(f);
    if ((x & 0x7fffffff) > 0x7f800000) return (uint16_t)((x >> 16) | 0x40);
    x += 0x7fff + ((x >> 16) & 1);
    return (uint16_t)(x >> 16);
}

float vq_bf16_to_f32(uint16_t h) { return bits_f32((uint32_t)h << 16); }

size_t vq_dtype_size(vq_dtype t) { return t == VQ_F32 ? 4 : 2; }

/* SIMD bodies live in kernels/cpu/half_avx2.c and half_avx512.c. */
void vq_f32_to_f16_avx2(const float *x, uint16_t *out, size_t n);
void vq_f16_to_f32_avx2(const uint16_t *h, float *out, size_t n);
void vq_f32_to_bf16_avx2(const float *x, uint16_t *out, size_t n);
void vq_bf16_to_f32_avx2(const uint16_t *h, float *out, size_t n);
void vq_f32_to_f16_avx512(const float *x, uint16_t *out, size_t n);
void vq_f16_to_f32_avx512(const uint16_t *h, float *out, size_t n);
void vq_f32_to_bf16_avx512(const float *x, uint16_t *out, size_t n);
void vq_bf16_to_f32_avx512(const uint16_t *h, float *out, size_t n);

void vq_f32_to_f16_array(const float *x, uint16_t *out, size_t n) {
#if defined(__x86_64__)
    if (vq_cpu_has_avx512()) {
        vq_f32_to_f16_avx512(x, out, n);
        return;
    }
    if (vq_cpu_has_avx2()) {
        vq_f32_to_f16_avx2(x, out, n);
        return;
    }
#endif
    for (size_t i = 0; i < n; i++) out[i] = vq_f32_to_f16(x[i]);
}

void vq_f16_to_f32_array(const uint16_t *h, float *out, size_t n) {
#if defined(__x86_64__)
    if (vq_cpu_has_avx512()) {
        vq_f16_to_f32_avx512(h, out, n);
        return;
    }
    if (vq_cpu_has_avx2()) {
        vq_f16_to_f32_avx2(h, out, n);
        return;
    }
#endif
    for (size_t i = 0; i < n; i++) out[i] = vq_f16_to_f32(h[i]);
}

void vq_f32_to_bf16_array(const float *x, uint16_t *out, size_t n) {
#if defined(__x86_64__)
    if (vq_cpu_has_avx512()) {
        vq_f32_to_bf16_avx512(x, out, n);
        return;
    }
    if (vq_cpu_has_avx2()) {
        vq_f32_to_bf16_avx2(x, out, n);
        return;
    }
#endif
    for (size_t i = 0; i < n; i++) out[i] = vq_f32_to_bf16(x[i]);
}

void vq_bf16_to_f32_array(const uint16_t *h, float *out, size_t n) {
#if defined(__x86_64__)
    if (vq_cpu_has_avx512()) {
        vq_bf16_to_f32_avx512(h, out, n);
        return;
    }
    if (vq_cpu_has_avx2()) {
        vq_bf16_to_f32_avx2(h, out, n);
        return;
    }
#endif
    for (size_t i = 0; i < n; i++) out[i] = vq_bf16_to_f32(h[i]);
}
