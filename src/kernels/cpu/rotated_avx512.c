/* AVX-512 attention kernels of the rotation methods (tq-mse, rvq, and the
 * codes of tq-prod): scores and value sums straight from the packed codes
 * (methods/rotated.h, vq_codes_score / vq_codes_accum) at CPU level avx512.
 * Built with the AVX-512 flags of the other *_avx512.c files and only
 * called at that level; shapes they do not cover go to the AVX2 kernels
 * (rotated_avx2.c, whose header explains the code layout).
 *
 * A code becomes its level in registers, 16 channels a vector: the code
 * bytes of 16 channels of one slot are extended to 32-bit lanes straight
 * from memory (vpmovzxbd), the slot's bits are shifted down (1 and 2
 * bits: only for the high nibble, part_tables), and one vpermps looks the
 * level up in the part's codebook replicated to 16 entries, so the index
 * bits above the code pick a copy and need no mask.
 * 4-bit codes index their 16 levels directly: none of the AVX2 path's
 * folding, blends or two-table sums is needed. 3-bit codes take their high
 * bits from the 1-bit planes, merged in by two vpternlogd per 16 channels
 * and token (load3).
 *
 * Keys: 4 tokens and R rows a step, so each q load serves four tokens and
 * each level vector every row; the 16 (token, row or chain) sums are
 * reduced by one shuffle tree to one vector, scaled by the four norms as a
 * vector and stored as four floats a row. With fewer than 4 rows the
 * slots alternate between chain sets, so there are still 8 or 16 FMA
 * chains in flight (an FMA's latency is 4 cycles, two pipes run them).
 * Values: the weights are multiplied by the norms once per token; a slice
 * of one or two 16-channel runs x slots x R rows, up to 16 accumulators,
 * stays in registers over the tokens of a call (the codes of the call sit
 * in L1 and are read once per slice). */
#include "high_bytes.h"
#include "methods/rotated.h"
#include "reduce_avx512.h"

#include <immintrin.h>
#include <string.h>

#if defined(__GNUC__)
#define ALWAYS_INLINE inline __attribute__((always_inline))
#define NOINLINE __attribute__((noinline))
#else
#define ALWAYS_INLINE inline
#define NOINLINE
#endif

/* Tokens whose norm-scaled weights are prepared at once (stack buffer). */
#define TOKENS 64

/* Whether the kernels take a part: the channels of a slot in runs of 16
 * bytes, the last of which may be shorter (2-bit codes at d = 96 have slots
 * of 24 bytes, at d = 80 of 20; its other lanes get q' zero and are masked
 * out of the value sums); 3-bit parts also need their 1-bit plane bytes
 * for a run in one piece (n a multiple of 128), or n = 64 (the 3-bit half
 * of tq-mse 2.5 and 3.5 bits at head dim 128, whose 8 bytes a 1-bit plane
 * serve both halves of the run), or 1-bit planes of at most 16 bytes that
 * one byte shuffle places (load_high). */
static bool part_covered(const vq_code_part *p) {
    switch (p->bits) {
    case 1: /* 1-bit slots of 8 bytes or fewer (d = 48, 64): the AVX2 kernels' pair tables measured faster */
        return p->n % 8 == 0 && (p->n % 128 == 0 || p->n > 64);
    case 2:
    case 4: return p->n % 8 == 0;
    case 3: return p->n % 8 == 0 && (p->n == 64 || p->n % 128 == 0 || p->n / 8 <= 16);
    default: return false;
    }
}

/* Floats of a part's q in reading order per row: whole runs of 16 a slot. */
static int prep_floats(const vq_code_part *p) {
    int slots = p->bits == 3 ? 4 : 8 / p->bits, sc = p->n / slots;
    return slots * ((sc + 15) / 16 * 16);
}

/* Slots of a part (codes a plane byte holds; 3 bits: the 2-bit planes). */
static ALWAYS_INLINE int slots_of(const int B) { return B == 3 ? 4 : 8 / B; }

/* Lookup tables of a part a slot can use (slot_levels), each the levels
 * replicated to 16 entries. 1- and 2-bit parts have one for each slot
 * position in a nibble (tab[v][i] = levels of the code at bits B v .. of
 * i), so that the slots of a nibble need no shift; 3- and 4-bit parts one,
 * indexed by the low bits. */
#define TABS 4
static void part_tables(const vq_code_part *p, __m512 *tab) {
    int mask = (1 << p->bits) - 1, per = p->bits <= 2 ? 4 / p->bits : 1;
    for (int v = 0; v < per; v++) {
        float t[16];
        for (int i = 0; i < 16; i++) t[i] = p->table[(i >> (p->bits * v)) & mask];
        tab[v] = _mm512_loadu_ps(t);
    }
}

/* Code bytes of 16 channels, one per lane. */
static ALWAYS_INLINE __m512i load_bytes(const uint8_t *p) {
    return _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)p));
}

/* The high bits of a 3-bit part's run of 16 channels at i0 into each
 * 2-bit slot (c: the part's codes, s2 = n / 4 plane bytes, s1 = n / 8 bytes
 * a 1-bit plane), placed so that slot j's high bit is at bit 2 j + 2 of its
 * lane. Channel j s2 + i sits in 1-bit plane 2 j + i / s1, byte i % s1: the
 * run's first half (i < s1) at bit 2 j, its second at 2 j + 1. With s1 = 8
 * (n = 64) the two halves of one run read the same 8 bytes, shifted by a
 * lane's own count. */
static ALWAYS_INLINE __m512i load_high(const uint8_t *c, int s2, int s1, int i0, const bool X) {
    if (X) {
        /* the shuffled bytes (high_bytes.h), shifted by 2 in the run's
         * first half and by 1 in its second */
        __m128i second;
        __m512i x = _mm512_cvtepu8_epi32(vq_high_bytes16(c + s2, i0, s1, &second));
        return _mm512_sllv_epi32(x, _mm512_sub_epi32(_mm512_set1_epi32(2), _mm512_cvtepu8_epi32(second)));
    }
    if (s1 == 8) {
        uint64_t b;
        memcpy(&b, c + s2, sizeof b);
        __m512i x = _mm512_cvtepu8_epi32(_mm_set1_epi64x((long long)b));
        /* lanes 0..7 shifted by 2, 8..15 by 1: a masked shift instead of a
         * vpsllvd, whose count vector took a register the keys' loop lacks */
        return _mm512_mask_slli_epi32(_mm512_slli_epi32(x, 1), 0x00FF, x, 2);
    }
    if (i0 < s1) return _mm512_slli_epi32(load_bytes(c + s2 + i0), 2);
    return _mm512_slli_epi32(load_bytes(c + s2 + i0 - s1), 1); /* i0 < s2 = 2 s1 */
}

/* A 3-bit part's run of 16 channels at i0 of each slot as two index
 * vectors: the 2-bit plane bytes lo merged with the high bits h (load_high,
 * slot j's at bit 2 j + 2) by one vpternlogd each, z = (lo & 0x33) | (h &
 * ~0x33) and w = (lo & 0xCC) | (h & ~0xCC), so that slot j's 3-bit code
 * is at bits 2 j .. 2 j + 2 of z (j even) or w (j odd): one shift a slot
 * after that, as for 2-bit codes, instead of two shifts and a merge (the
 * bits above a code pick a copy of the replicated table). */
static ALWAYS_INLINE void load3(const uint8_t *c, int s2, int s1, int i0, const bool X, __m512i *z, __m512i *w) {
    __m512i lo = load_bytes(c + i0), h = load_high(c, s2, s1, i0, X);
    /* bit by bit, with m = ~0xCC (one constant for both): z = m ? lo : h,
     * w = m ? h : lo (the bits of z above 7 are never read) */
    const __m512i m = _mm512_set1_epi32(~0xCC);
    *z = _mm512_ternarylogic_epi32(lo, h, m, 0xE4);
    *w = _mm512_ternarylogic_epi32(lo, h, m, 0xD8);
}

/* The levels of slot j: from plane bytes x (B = 1, 2, 4), or from load3's
 * z (x) and w (y). 1 and 2 bits: the slots of the low nibble index x as it
 * is, those of the high nibble x >> 4, each through its slot position's
 * table (part_tables), so one shift serves them all. */
static ALWAYS_INLINE __m512 slot_levels(const int B, __m512i x, __m512i y, int j, const __m512 *tab) {
    if (B == 3) {
        __m512i v = j & 1 ? y : x;
        return _mm512_permutexvar_ps(j > 0 ? _mm512_srli_epi32(v, (unsigned)(2 * j)) : v, tab[0]);
    }
    if (B == 4) return _mm512_permutexvar_ps(j ? _mm512_srli_epi32(x, 4) : x, tab[0]);
    const int per = 4 / B;
    return _mm512_permutexvar_ps(j >= per ? _mm512_srli_epi32(x, 4) : x, tab[j % per]);
}

/* Bytes (or, 3 bits, 2-bit plane bytes) of one slot: its channels. */
static ALWAYS_INLINE int slot_channels(const int B, int n) { return B == 3 ? n / 4 : n * B / 8; }

/* ------------------------------------------------------------------ keys */

/* Copies R rows of one part's q (q: the part's first channel of row 0,
 * rows d apart) into qs in score_part's reading order: 16 floats per (run
 * i0, slot j, row r), channels j * (slot channels) + i0 .. + 15; a short
 * last run's other lanes 0 (its codes' lanes read the next bytes). */
static void prep_part(const vq_code_part *p, int R, const float *q, int d, float *qs) {
    int slots = p->bits == 3 ? 4 : 8 / p->bits, sc = p->n / slots;
    for (int i0 = 0; i0 < sc; i0 += 16) {
        const __mmask16 k = sc - i0 >= 16 ? 0xFFFF : (__mmask16)((1u << (sc - i0)) - 1);
        for (int j = 0; j < slots; j++)
            for (int r = 0; r < R; r++, qs += 16) {
                if (k == 0xFFFF) memcpy(qs, q + (size_t)r * d + j * sc + i0, 16 * sizeof(float));
                else _mm512_storeu_ps(qs, _mm512_maskz_loadu_ps(k, q + (size_t)r * d + j * sc + i0));
            }
    }
}

/* Adds q_r . levels of one B-bit part of n channels (its codes `off` bytes
 * into each of the 4 tokens c[t]) into a[4 t + k], k the chain set of (row
 * r, slot j): r + R (j mod 4 / R). qs: the part's q in reading order. */
static ALWAYS_INLINE void score_part(const int B, const bool X, const int R, int off, int n, const __m512 *tab, const float *qs,
                                     const uint8_t *const *c, __m512 *a) {
    const int slots = slots_of(B), sets = 4 / R;
    int sc = slot_channels(B, n), s1 = n / 8;
    for (int i0 = 0; i0 < sc; i0 += 16) {
        __m512i lo[4], hi[4];
        for (int t = 0; t < 4; t++) {
            if (B == 3) load3(c[t] + off, sc, s1, i0, X, &lo[t], &hi[t]);
            else lo[t] = hi[t] = load_bytes(c[t] + off + i0);
        }
        for (int j = 0; j < slots; j++) {
            __m512 lev[4];
            for (int t = 0; t < 4; t++) lev[t] = slot_levels(B, lo[t], hi[t], j, tab);
            for (int r = 0; r < R; r++, qs += 16) {
                __m512 q = _mm512_loadu_ps(qs);
                int k = r + R * (j % sets);
                for (int t = 0; t < 4; t++) a[4 * t + k] = _mm512_fmadd_ps(q, lev[t], a[4 * t + k]);
            }
        }
    }
}

/* Scores of tokens [0, n) for R rows (4, 2 or 1) of one or two parts (B0
 * bits, then B1 bits or B1 = 0), four tokens a step. The 16 chains come
 * out of vq_sum16x16 as 128-bit lanes k of 4 tokens each; a row's lanes are
 * added, scaled by the tokens' norms and stored. qs: both parts' q in
 * reading order, part 0 first. */
static ALWAYS_INLINE void score_rows(const int B0, const int B1, const bool X, const int R, const vq_code_part *parts,
                                     const __m512 *tabs, const uint8_t *codes, size_t cb, const uint16_t *norms, int n,
                                     const float *qs, float *logits, int ld) {
    int off0 = parts[0].off, n0 = parts[0].n, off1 = B1 ? parts[1].off : 0, n1 = B1 ? parts[1].n : 0;
    const float *qs1 = qs + (size_t)R * prep_floats(&parts[0]);
    for (int j = 0; j < n; j += 4) {
        /* a short last step repeats its last token and stores fewer */
        int cnt = n - j < 4 ? n - j : 4;
        __mmask8 keep = (__mmask8)((1u << cnt) - 1);
        const uint8_t *c[4];
        for (int t = 0; t < 4; t++) c[t] = codes + (size_t)(j + (t < cnt ? t : cnt - 1)) * cb;
        __m512 a[16];
        for (int i = 0; i < 16; i++) a[i] = _mm512_setzero_ps();
        score_part(B0, X, R, off0, n0, tabs, qs, c, a);
        if (B1) score_part(B1, X, R, off1, n1, tabs + TABS, qs1, c, a);
        __m512 s = vq_sum16x16(a);
        if (R < 4) s = _mm512_add_ps(s, _mm512_shuffle_f32x4(s, s, 0x4E)); /* lanes k + 2 onto k */
        if (R < 2) s = _mm512_add_ps(s, _mm512_shuffle_f32x4(s, s, 0xB1)); /* lane 1 onto 0 */
        __m128 nv = _mm_cvtph_ps(_mm_maskz_loadu_epi16(keep, norms + j));
        s = _mm512_mul_ps(s, _mm512_broadcast_f32x4(nv));
        _mm_mask_storeu_ps(logits + j, keep, _mm512_castps512_ps128(s));
        if (R > 1) _mm_mask_storeu_ps(logits + (size_t)ld + j, keep, _mm512_extractf32x4_ps(s, 1));
        if (R > 2) {
            _mm_mask_storeu_ps(logits + 2 * (size_t)ld + j, keep, _mm512_extractf32x4_ps(s, 2));
            _mm_mask_storeu_ps(logits + 3 * (size_t)ld + j, keep, _mm512_extractf32x4_ps(s, 3));
        }
    }
}

/* Every row, 4 at a time, then 2, then 1; the bits as constants, so each
 * combination of parts gets a function of its own (score_pick). */
static ALWAYS_INLINE void score_all(const int B0, const int B1, const bool X, const vq_code_part *parts, int nparts,
                                    const __m512 *tabs, const uint8_t *codes, size_t cb, const uint16_t *norms, int n,
                                    const float *q, int d, int rows, float *logits, int ld, float *qs) {
    for (int r = 0; r < rows;) {
        int R = rows - r >= 4 ? 4 : rows - r >= 2 ? 2 : 1;
        const float *qr = q + (size_t)r * d;
        for (int k = 0, ch = 0, pc = 0; k < nparts; ch += parts[k].n, pc += prep_floats(&parts[k]), k++)
            prep_part(&parts[k], R, qr + ch, d, qs + R * pc);
        float *lr = logits + (size_t)r * ld;
        if (R == 4) score_rows(B0, B1, X, 4, parts, tabs, codes, cb, norms, n, qs, lr, ld);
        else if (R == 2) score_rows(B0, B1, X, 2, parts, tabs, codes, cb, norms, n, qs, lr, ld);
        else score_rows(B0, B1, X, 1, parts, tabs, codes, cb, norms, n, qs, lr, ld);
        r += R;
    }
}

typedef void score_fn(const vq_code_part *parts, int nparts, const __m512 *tabs, const uint8_t *codes, size_t cb,
                      const uint16_t *norms, int n, const float *q, int d, int rows, float *logits, int ld,
                      float *qs);

static NOINLINE void score_1(const vq_code_part *parts, int nparts, const __m512 *tabs, const uint8_t *codes,
                             size_t cb, const uint16_t *norms, int n, const float *q, int d, int rows, float *logits,
                             int ld, float *qs) {
    score_all(1, 0, false, parts, nparts, tabs, codes, cb, norms, n, q, d, rows, logits, ld, qs);
}
static NOINLINE void score_2(const vq_code_part *parts, int nparts, const __m512 *tabs, const uint8_t *codes,
                             size_t cb, const uint16_t *norms, int n, const float *q, int d, int rows, float *logits,
                             int ld, float *qs) {
    score_all(2, 0, false, parts, nparts, tabs, codes, cb, norms, n, q, d, rows, logits, ld, qs);
}
static NOINLINE void score_3(const vq_code_part *parts, int nparts, const __m512 *tabs, const uint8_t *codes,
                             size_t cb, const uint16_t *norms, int n, const float *q, int d, int rows, float *logits,
                             int ld, float *qs) {
    score_all(3, 0, false, parts, nparts, tabs, codes, cb, norms, n, q, d, rows, logits, ld, qs);
}
static NOINLINE void score_4(const vq_code_part *parts, int nparts, const __m512 *tabs, const uint8_t *codes,
                             size_t cb, const uint16_t *norms, int n, const float *q, int d, int rows, float *logits,
                             int ld, float *qs) {
    score_all(4, 0, false, parts, nparts, tabs, codes, cb, norms, n, q, d, rows, logits, ld, qs);
}
static NOINLINE void score_3_2(const vq_code_part *parts, int nparts, const __m512 *tabs, const uint8_t *codes,
                               size_t cb, const uint16_t *norms, int n, const float *q, int d, int rows,
                               float *logits, int ld, float *qs) {
    score_all(3, 2, false, parts, nparts, tabs, codes, cb, norms, n, q, d, rows, logits, ld, qs);
}
static NOINLINE void score_4_3(const vq_code_part *parts, int nparts, const __m512 *tabs, const uint8_t *codes,
                               size_t cb, const uint16_t *norms, int n, const float *q, int d, int rows,
                               float *logits, int ld, float *qs) {
    score_all(4, 3, false, parts, nparts, tabs, codes, cb, norms, n, q, d, rows, logits, ld, qs);
}

/* The instances whose 3-bit part places its high bits by a byte shuffle
 * (load_high's X: 1-bit planes of other than 8 or a multiple of 16 bytes,
 * d = 96: 12): their own functions, so that the others keep their code (a
 * run-time test per load measured 3 % on tq-mse 3-bit at d = 128). */
static NOINLINE void score_3x(const vq_code_part *parts, int nparts, const __m512 *tabs, const uint8_t *codes,
                              size_t cb, const uint16_t *norms, int n, const float *q, int d, int rows, float *logits,
                              int ld, float *qs) {
    score_all(3, 0, true, parts, nparts, tabs, codes, cb, norms, n, q, d, rows, logits, ld, qs);
}
static NOINLINE void score_3x_2(const vq_code_part *parts, int nparts, const __m512 *tabs, const uint8_t *codes,
                                size_t cb, const uint16_t *norms, int n, const float *q, int d, int rows,
                                float *logits, int ld, float *qs) {
    score_all(3, 2, true, parts, nparts, tabs, codes, cb, norms, n, q, d, rows, logits, ld, qs);
}
static NOINLINE void score_4_3x(const vq_code_part *parts, int nparts, const __m512 *tabs, const uint8_t *codes,
                                size_t cb, const uint16_t *norms, int n, const float *q, int d, int rows,
                                float *logits, int ld, float *qs) {
    score_all(4, 3, true, parts, nparts, tabs, codes, cb, norms, n, q, d, rows, logits, ld, qs);
}

/* Whether a 3-bit part needs load_high's byte shuffle. */
static bool shuffled_high(const vq_code_part *p) { return p->bits == 3 && p->n / 8 != 8 && (p->n / 8) % 16 != 0; }

/* The function for these parts: single parts of 1..4 bits and the two
 * pairs of tq-mse's fractional rates (3 + 2 bits: 2.5; 4 + 3 bits: 3.5);
 * NULL for anything else. */
static score_fn *score_pick(const vq_code_part *parts, int nparts) {
    bool x = shuffled_high(&parts[0]) || (nparts > 1 && shuffled_high(&parts[1]));
    if (nparts == 1) {
        switch (parts[0].bits) {
        case 1: return score_1;
        case 2: return score_2;
        case 3: return x ? score_3x : score_3;
        default: return score_4;
        }
    }
    if (parts[0].bits == 3 && parts[1].bits == 2) return x ? score_3x_2 : score_3_2;
    if (parts[0].bits == 4 && parts[1].bits == 3) return x ? score_4_3x : score_4_3;
    return NULL;
}

/* Whether these kernels cover the parts (1 or 2, each part_covered). */
static bool parts_covered(const vq_code_part *parts, int nparts) {
    if (nparts < 1 || nparts > 2) return false;
    for (int k = 0; k < nparts; k++)
        if (!part_covered(&parts[k])) return false;
    return true;
}

bool vq_codes_score_avx512(const vq_code_part *parts, int nparts, const uint8_t *codes, size_t cb,
                           const uint16_t *norms, int n, const float *q, int d, int rows, float *logits, int ld,
                           float *scratch) {
    if (!parts_covered(parts, nparts)) return false;
    score_fn *fn = score_pick(parts, nparts);
    if (!fn) return false;
    __m512 tabs[2 * TABS];
    for (int k = 0; k < nparts; k++) part_tables(&parts[k], tabs + TABS * k);
    fn(parts, nparts, tabs, codes, cb, norms, n, q, d, rows, logits, ld, scratch);
    return true;
}

/* ---------------------------------------------------------------- values */

/* acc_r[channels] += sum_t wn[r][t] * levels of one slice of a B-bit part
 * for R rows: slots j0 .. j0 + G - 1 of the H 16-channel runs from i0, whose
 * R x G x H accumulators stay in registers over the n tokens. acc: the
 * part's first channel of row 0, rows d apart; wn rows TOKENS apart; sc:
 * channels a slot. */
/* accum_slice's short last run of the slots (H = 1): its other lanes (the
 * next slot's channels) are neither loaded nor stored. Separate from
 * accum_slice and after its loops (accum_part), so the whole runs' loop
 * keeps its code: a test for the short run inside accum_slice made the
 * d = 128 value loops 2-4 % slower. */
static ALWAYS_INLINE void accum_tail(const int B, const bool X, const int R, const int G, const uint8_t *c, size_t cb,
                                int sc, int s1, int i0, int j0, const __m512 *tab, const float *wn, int n, float *acc,
                                int d) {
    const __mmask16 k = (__mmask16)((1u << (sc - i0)) - 1);
    __m512 a[16];
    for (int r = 0; r < R; r++)
        for (int g = 0; g < G; g++) a[r * G + g] = _mm512_maskz_loadu_ps(k, acc + (size_t)r * d + (j0 + g) * sc + i0);
    for (int t = 0; t < n; t++) {
        const uint8_t *ct = c + (size_t)t * cb;
        __m512i lo, hi;
        if (B == 3) load3(ct, sc, s1, i0, X, &lo, &hi);
        else lo = hi = load_bytes(ct + i0);
        for (int r = 0; r < R; r++) {
            __m512 w = _mm512_set1_ps(wn[r * TOKENS + t]);
            for (int g = 0; g < G; g++)
                a[r * G + g] = _mm512_fmadd_ps(w, slot_levels(B, lo, hi, j0 + g, tab), a[r * G + g]);
        }
    }
    for (int r = 0; r < R; r++)
        for (int g = 0; g < G; g++) _mm512_mask_storeu_ps(acc + (size_t)r * d + (j0 + g) * sc + i0, k, a[r * G + g]);
}

static ALWAYS_INLINE void accum_slice(const int B, const bool X, const int R, const int G, const int H, const uint8_t *c,
                                      size_t cb, int sc, int s1, int i0, int j0, const __m512 *tab, const float *wn,
                                      int n, float *acc, int d) {
    __m512 a[16];
    for (int h = 0; h < H; h++)
        for (int r = 0; r < R; r++)
            for (int g = 0; g < G; g++)
                a[(h * R + r) * G + g] = _mm512_loadu_ps(acc + (size_t)r * d + (j0 + g) * sc + i0 + 16 * h);
    for (int t = 0; t < n; t++) {
        const uint8_t *ct = c + (size_t)t * cb;
        __m512 lev[8];
        for (int h = 0; h < H; h++) {
            __m512i lo, hi;
            if (B == 3) load3(ct, sc, s1, i0 + 16 * h, X, &lo, &hi);
            else lo = hi = load_bytes(ct + i0 + 16 * h);
            for (int g = 0; g < G; g++) lev[h * G + g] = slot_levels(B, lo, hi, j0 + g, tab);
        }
        for (int r = 0; r < R; r++) {
            __m512 w = _mm512_set1_ps(wn[r * TOKENS + t]);
            for (int h = 0; h < H; h++)
                for (int g = 0; g < G; g++)
                    a[(h * R + r) * G + g] = _mm512_fmadd_ps(w, lev[h * G + g], a[(h * R + r) * G + g]);
        }
    }
    for (int h = 0; h < H; h++)
        for (int r = 0; r < R; r++)
            for (int g = 0; g < G; g++)
                _mm512_storeu_ps(acc + (size_t)r * d + (j0 + g) * sc + i0 + 16 * h, a[(h * R + r) * G + g]);
}

/* One part's values for R rows (4, 2, 1): G slots a pass, and where R x G
 * leaves room (and the G level vectors of two runs fit lev), two
 * 16-channel runs a pass (4-bit codes at 4 rows: 16 accumulators instead
 * of 8, so each broadcast weight feeds 4 FMAs). */
static ALWAYS_INLINE void accum_part(const int B, const bool X, const int R, const vq_code_part *p, const __m512 *tab,
                                     const float *wn, const uint8_t *codes, size_t cb, int n, float *acc, int d) {
    const int slots = slots_of(B), G = 16 / R < slots ? 16 / R : slots, H2 = 2 * R * G <= 16 && G <= 4;
    const uint8_t *c = codes + p->off;
    int sc = slot_channels(B, p->n), s1 = p->n / 8, i0 = 0;
    if (H2)
        for (; i0 + 32 <= sc; i0 += 32)
            for (int j0 = 0; j0 < slots; j0 += G) accum_slice(B, X, R, G, 2, c, cb, sc, s1, i0, j0, tab, wn, n, acc, d);
    for (; i0 + 16 <= sc; i0 += 16)
        for (int j0 = 0; j0 < slots; j0 += G) accum_slice(B, X, R, G, 1, c, cb, sc, s1, i0, j0, tab, wn, n, acc, d);
    if (i0 < sc) /* a short last run */
        for (int j0 = 0; j0 < slots; j0 += G) accum_tail(B, X, R, G, c, cb, sc, s1, i0, j0, tab, wn, n, acc, d);
}

/* One part's values for every row, rows 4 at a time, then 2, then 1, a
 * chunk of TOKENS tokens at a time: wn = w * norm for the chunk's tokens,
 * 16 at a time (masked at the end). */
static ALWAYS_INLINE void accum_all(const int B, const bool X, const vq_code_part *p, const __m512 *tab, const uint8_t *codes, size_t cb,
                                    const uint16_t *norms, int n, const float *w, int ld, int rows, float *acc,
                                    int d) {
    float wn[4 * TOKENS];
    for (int r = 0; r < rows;) {
        int R = rows - r >= 4 ? 4 : rows - r >= 2 ? 2 : 1;
        for (int t0 = 0; t0 < n; t0 += TOKENS) {
            int m = n - t0 < TOKENS ? n - t0 : TOKENS;
            for (int t = 0; t < m; t += 16) {
                __mmask16 k = m - t >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << (m - t)) - 1);
                __m512 nv = _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(k, norms + t0 + t));
                for (int i = 0; i < R; i++) {
                    __m512 wv = _mm512_maskz_loadu_ps(k, w + (size_t)(r + i) * ld + t0 + t);
                    _mm512_storeu_ps(wn + i * TOKENS + t, _mm512_mul_ps(wv, nv));
                }
            }
            const uint8_t *ct = codes + (size_t)t0 * cb;
            float *ar = acc + (size_t)r * d;
            if (R == 4) accum_part(B, X, 4, p, tab, wn, ct, cb, m, ar, d);
            else if (R == 2) accum_part(B, X, 2, p, tab, wn, ct, cb, m, ar, d);
            else accum_part(B, X, 1, p, tab, wn, ct, cb, m, ar, d);
        }
        r += R;
    }
}

static NOINLINE void accum_1(const vq_code_part *p, const __m512 *tab, const uint8_t *codes, size_t cb,
                             const uint16_t *norms, int n, const float *w, int ld, int rows, float *acc, int d) {
    accum_all(1, false, p, tab, codes, cb, norms, n, w, ld, rows, acc, d);
}
static NOINLINE void accum_2(const vq_code_part *p, const __m512 *tab, const uint8_t *codes, size_t cb,
                             const uint16_t *norms, int n, const float *w, int ld, int rows, float *acc, int d) {
    accum_all(2, false, p, tab, codes, cb, norms, n, w, ld, rows, acc, d);
}
static NOINLINE void accum_3(const vq_code_part *p, const __m512 *tab, const uint8_t *codes, size_t cb,
                             const uint16_t *norms, int n, const float *w, int ld, int rows, float *acc, int d) {
    accum_all(3, false, p, tab, codes, cb, norms, n, w, ld, rows, acc, d);
}
static NOINLINE void accum_3x(const vq_code_part *p, const __m512 *tab, const uint8_t *codes, size_t cb,
                              const uint16_t *norms, int n, const float *w, int ld, int rows, float *acc, int d) {
    accum_all(3, true, p, tab, codes, cb, norms, n, w, ld, rows, acc, d);
}
static NOINLINE void accum_4(const vq_code_part *p, const __m512 *tab, const uint8_t *codes, size_t cb,
                             const uint16_t *norms, int n, const float *w, int ld, int rows, float *acc, int d) {
    accum_all(4, false, p, tab, codes, cb, norms, n, w, ld, rows, acc, d);
}

bool vq_codes_accum_avx512(const vq_code_part *parts, int nparts, const uint8_t *codes, size_t cb,
                           const uint16_t *norms, int n, const float *w, int ld, int rows, float *acc, int d) {
    if (!parts_covered(parts, nparts)) return false;
    for (int k = 0, ch = 0; k < nparts; ch += parts[k].n, k++) {
        const vq_code_part *p = &parts[k];
        __m512 tab[TABS];
        part_tables(p, tab);
        switch (p->bits) {
        case 1: accum_1(p, tab, codes, cb, norms, n, w, ld, rows, acc + ch, d); break;
        case 2: accum_2(p, tab, codes, cb, norms, n, w, ld, rows, acc + ch, d); break;
        case 3:
            if (shuffled_high(p)) accum_3x(p, tab, codes, cb, norms, n, w, ld, rows, acc + ch, d);
            else accum_3(p, tab, codes, cb, norms, n, w, ld, rows, acc + ch, d);
            break;
        default: accum_4(p, tab, codes, cb, norms, n, w, ld, rows, acc + ch, d); break;
        }
    }
    return true;
}
