/* Packed-code functions shared by the encode and attention kernels: the
 * "planes" layout of methods/pack.h (channel c of a b-bit row lives in byte
 * c % stride at bit b * (c / stride); 3 bits = 2-bit planes of the low bits,
 * then 1-bit planes of the high bit). */
#ifndef VQ_CUDA_CODES_CUH
#define VQ_CUDA_CODES_CUH

#include "cuda_internal.h"

/* The code of channel c in one token's packed row. */
__device__ __forceinline__ int vq_cu_code_at(const uint8_t *row, int c, int bits, int d) {
    if (bits == 3) {
        int s2 = d / 4, s1 = d / 8;
        int lo = (row[c % s2] >> (2 * (c / s2))) & 3;
        int hi = (row[s2 + c % s1] >> (c / s1)) & 1;
        return lo | (hi << 2);
    }
    int stride = d * bits / 8;
    return (row[c % stride] >> (bits * (c / stride))) & ((1 << bits) - 1);
}

/* Byte j of one token's packed row, code(c) giving channel c's code. */
template <class Code>
__device__ __forceinline__ uint8_t vq_cu_pack_byte(int j, int bits, int d, Code code) {
    unsigned v = 0;
    if (bits == 3) {
        if (j < d / 4) {
            int stride = d / 4;
            for (int s = 0; s < 4; s++) v |= (unsigned)(code(j + stride * s) & 3) << (2 * s);
        } else {
            int jj = j - d / 4, stride = d / 8;
            for (int s = 0; s < 8; s++) v |= (unsigned)(code(jj + stride * s) >> 2) << s;
        }
        return (uint8_t)v;
    }
    int per = 8 / bits, stride = d / per;
    for (int s = 0; s < per; s++) v |= (unsigned)code(j + stride * s) << (bits * s);
    return (uint8_t)v;
}

__device__ __forceinline__ float vq_cu_h2f(uint16_t h) { return __half2float(__ushort_as_half(h)); }
__device__ __forceinline__ uint16_t vq_cu_f2h(float f) { return __half_as_ushort(__float2half_rn(f)); }

#endif
