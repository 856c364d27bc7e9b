/* Bit packing of b-bit codes (b = 1, 2, 3, 4, 8) for one token's d channels.
 *
 * Layout ("planes"): with per = 8 / b codes a byte and stride = d / per
 * bytes, channel c lives in byte c % stride at bit offset b * (c / stride).
 * Unpacking slot j of all bytes at once therefore yields channels
 * j*stride .. j*stride + stride - 1 contiguously: one shift and one mask per
 * SIMD register, no shuffles. 3-bit codes are a 2-bit plane set (low bits,
 * d/4 bytes) followed by a 1-bit plane set (high bit, d/8 bytes).
 * d must be a multiple of 8. */
#ifndef VQ_PACK_H
#define VQ_PACK_H

#include <stddef.h>
#include <stdint.h>

static inline size_t vq_packed_bytes(int bits, int d) { return (size_t)d * (size_t)bits / 8; }

void vq_pack_codes(const uint8_t *codes, int d, int bits, uint8_t *out);
void vq_unpack_codes(const uint8_t *in, int d, int bits, uint8_t *codes);

#endif
