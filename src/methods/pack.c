/* Plain scalar packing; see pack.h for the layout. */
#include "pack.h"

#include <string.h>

static void pack_planes(const uint8_t *codes, int d, int bits, uint8_t *out) {
    int per = 8 / bits, stride = d / per;
    uint8_t mask = (uint8_t)((1u << bits) - 1);
    if (stride <= 0) return; /* d is a positive multiple of 8; this also tells the compiler */
    memset(out, 0, (size_t)stride);
    for (int c = 0; c < d; c++)
        out[c % stride] |= (uint8_t)((codes[c] & mask) << (bits * (c / stride)));
}

static void unpack_planes(const uint8_t *in, int d, int bits, uint8_t *codes) {
    int per = 8 / bits, stride = d / per;
    uint8_t mask = (uint8_t)((1u << bits) - 1);
    for (int c = 0; c < d; c++) codes[c] = (uint8_t)((in[c % stride] >> (bits * (c / stride))) & mask);
}

void vq_pack_codes(const uint8_t *codes, int d, int bits, uint8_t *out) {
    if (bits != 3) {
        pack_planes(codes, d, bits, out);
        return;
    }
    uint8_t lo[1024], hi[1024];
    for (int c = 0; c < d; c++) {
        lo[c] = codes[c] & 3;
        hi[c] = (uint8_t)(codes[c] >> 2);
    }
    pack_planes(lo, d, 2, out);
    pack_planes(hi, d, 1, out + d / 4);
}

void vq_unpack_codes(const uint8_t *in, int d, int bits, uint8_t *codes) {
    if (bits != 3) {
        unpack_planes(in, d, bits, codes);
        return;
    }
    uint8_t hi[1024];
    unpack_planes(in, d, 2, codes);
    unpack_planes(in + d / 4, d, 1, hi);
    for (int c = 0; c < d; c++) codes[c] |= (uint8_t)(hi[c] << 2);
}
