/* The 1-bit plane bytes of a run of 3-bit codes, for the kernels whose
 * 1-bit plane slots are not whole runs (rotated_avx2.c, rotated_avx512.c,
 * kivi_avx512.c). Included by files built with AVX2 or AVX-512 flags. */
#ifndef VQ_HIGH_BYTES_H
#define VQ_HIGH_BYTES_H

#include <immintrin.h>
#include <stdint.h>

/* The 1-bit plane bytes of the channels i0 .. i0 + 15 of a 2-bit plane
 * slot, one per byte lane: lane i holds byte (i0 + i) mod s1 of the plane
 * (s1 <= 16 bytes a 1-bit slot; i0 + i < 2 s1 for the slot's lanes, lanes
 * past the slot pick any byte), placed by one shuffle of the plane's first
 * 16 bytes (the load reads past the plane, inside the block). *second: 1 in
 * the lanes of the slot's second half (i0 + i >= s1), whose high bit sits
 * one 1-bit slot higher, 0 elsewhere. */
static inline __m128i vq_high_bytes16(const uint8_t *plane, int i0, int s1, __m128i *second) {
    const __m128i lane = _mm_setr_epi8(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
    __m128i v = _mm_add_epi8(lane, _mm_set1_epi8((char)i0));
    __m128i hi = _mm_cmpgt_epi8(v, _mm_set1_epi8((char)(s1 - 1)));
    __m128i idx = _mm_sub_epi8(v, _mm_and_si128(hi, _mm_set1_epi8((char)s1)));
    *second = _mm_and_si128(hi, _mm_set1_epi8(1));
    return _mm_shuffle_epi8(_mm_loadu_si128((const __m128i *)plane), idx);
}

#endif
