/* AVX2 attention kernels of the rotation methods (tq-mse, rvq): scores and
 * value sums straight from the packed codes (methods/rotated.h,
 * vq_codes_score / vq_codes_accum). Built with -mavx2 -mfma -mf16c and only
 * called after the CPU was checked.
 *
 * A code becomes its level in registers: the lanes hold the code bytes
 * extended to 32 bits, shifted so the code sits in the low bits, and a
 * permute picks the level: vpermilps by the low 2 bits for 1- and 2-bit
 * tables (replicated to 4 entries in each 128-bit lane, so the bits above
 * the code need no mask), vpermps by the low 3 bits for 8 entries. 4 bits:
 * two lookups (low and high 8 levels) and a blend on bit 3; when the levels
 * are antisymmetric (T[15 - c] = -T[c], the usual case) one lookup in the
 * lower half and a sign flip instead (folded_levels); when they are the sums
 * of two 4-entry tables (rvq's two stages) two vpermilps and an add
 * (halves_levels). 3 bits: the low 2 bits from the 2-bit planes index two
 * replicated 4-entry tables, the high bit (1-bit planes) is shifted to the
 * sign and picks one with a blend.
 *
 * What limits these kernels on Zen 3 is the two pipes that run the FMAs:
 * vpermps, vpermilps, blends and extending a register (vpmovsxbd) take
 * turns there, while adds, logic ops and loads do not (measured next to a
 * stream of FMAs: vpermps costs about as much as two FMAs, vpermilps and
 * blendv one, a shift half of one, a vpmovsxbd from memory almost nothing).
 * The lookups are chosen by that cost.
 *
 * Keys: 2 tokens and up to 4 rows per step, so each level vector feeds every
 * row and each q load two tokens; the 8 (row, token) sums are reduced with
 * one hadd tree and stored as one pair per row; the norms scale the logits
 * afterwards, 8 tokens at a time.
 * Values: the norm is folded into the weights once per token; channels go
 * outer (accumulators for up to 4 rows x 16 channels stay in registers over
 * a run of tokens), tokens inner. A single 1-bit part takes two tokens per
 * lookup instead (accum_b1). */
#include "high_bytes.h"
#include "methods/rotated.h"

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

/* Whether every 8-channel run of the part sits in 8 consecutive bytes. */
static bool part_covered(const vq_code_part *p) {
    if (p->n % 8 != 0) return false;
    if (p->bits == 3) return p->n % 64 == 0 || p->n / 8 <= 16; /* else than % 64: ACROSS */
    if (p->bits == 1) return p->n % 16 == 0; /* n % 64 != 0: a tail of 2, 4 or 6 bytes, see tail_bytes */
    if (p->bits == 2) return true;            /* n % 32 != 0: a tail of 2, 4 or 6 bytes, ACROSS */
    if (p->bits == 4) return p->n % 8 == 0; /* n % 16 == 8: a 4-byte tail (fractional rates' parts, prepare_parts) */
    return false;
}

/* Bytes of a part's last run of 8 that belong to it: n / 8 mod 8 for a
 * 1-bit part of n % 64 != 0 channels (n = 96: 12 bytes a token, a tail of
 * 4; n = 80: 10 bytes, 2), else 8. Keys read
 * the whole run (the bytes after a token's codes are more codes or the
 * block's norms, inside the block) with q' zero in the lanes past the
 * part (prep_part); values mask those lanes of the accumulators
 * (accum_pairs_tail). Single 1-bit parts only (prepare_parts). */
static int tail_bytes(const vq_code_part *p) { return p->bits == 1 && p->n % 64 != 0 ? p->n / 8 % 8 : 8; }

/* How a part's levels are looked up. FOLDED: 4-bit levels that are
 * antisymmetric, bit for bit: table[15 - c] == -table[c] (Lloyd-Max
 * codebooks of symmetric densities; see folded_levels); FOLDED_PRE: the
 * same with the codes folded before the kernel's loops (prefold). HALVES:
 * 4-bit levels that are sums of two 4-entry tables, table[4 a + b] ==
 * hi[a] + lo[b] in float (rvq's two stages, vq_code_part.halves), for a
 * single part: two vpermilps and an add, which measured cheaper than one
 * vpermps and the fold (rvq 2-bit: 56.7 -> 47.9 ns per (token, kv head)).
 * ACROSS: 3-bit codes whose 1-bit plane slots (n / 8 bytes) are not whole
 * runs of 8 (n = 96, 48: load_high), and 2- or 3-bit codes whose 2-bit
 * plane slots end in a run of 2, 4 or 6 (n = 48: n / 4 = 12 bytes; n = 40:
 * 10); the kernels for them are instances of their own (score_b3x,
 * score_anyx, ...).
 * PLAIN: everything else. */
enum { PLAIN, FOLDED, FOLDED_PRE, HALVES, ACROSS };

static int part_kind(const vq_code_part *p, int nparts) {
    if ((p->bits == 3 && p->n % 64 != 0) || (p->bits == 2 && p->n % 32 != 0)) return ACROSS;
    if (p->bits != 4) return PLAIN;
    if (p->halves && nparts == 1) return HALVES;
    for (int c = 0; c < 8; c++) {
        float neg = -p->table[c];
        if (memcmp(&neg, &p->table[15 - c], sizeof neg) != 0) return PLAIN;
    }
    return FOLDED;
}

/* The two lookup tables of a part (see the top of the file). A folded
 * 4-bit part keeps only the lower half T[0..7]: t[8..15] for slot 1, and
 * for slot 0 the same levels with bits 28..30 of entry i xored with i, so
 * that xoring in the lane shifted left by 28 (index bits at 28..30, the
 * code's bit 3 at 31) restores them and flips the sign in one operation. */
static void part_tables(const vq_code_part *p, int kind, float t[16]) {
    if (kind == HALVES) {
        for (int i = 0; i < 8; i++) t[i] = p->halves[4 + (i & 3)], t[8 + i] = p->halves[i & 3];
        return;
    }
    if (kind == FOLDED || kind == FOLDED_PRE) {
        for (int i = 0; i < 8; i++) {
            uint32_t u;
            memcpy(&u, &p->table[i], sizeof u);
            u ^= (uint32_t)i << 28;
            memcpy(&t[i], &u, sizeof u);
            t[8 + i] = p->table[i];
        }
        return;
    }
    for (int i = 0; i < 8; i++) {
        switch (p->bits) {
        case 1: t[i] = p->table[i & 1], t[8 + i] = 0; break;
        case 2: t[i] = p->table[i & 3], t[8 + i] = 0; break;
        case 3: t[i] = p->table[i & 3], t[8 + i] = p->table[4 + (i & 3)]; break;
        default: t[i] = p->table[i], t[8 + i] = p->table[8 + i]; break;
        }
    }
}

static inline __m256i load_u8x8(const uint8_t *p) {
    return _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)p));
}

/* The plane bytes of 8 channels, one per lane. 4-bit bytes are
 * sign-extended: the lane's sign is then bit 3 of the high code, which is
 * the blend mask levels() needs, with no shift (the lookups read only the
 * low 3 bits, so the extension bits do no harm). */
static ALWAYS_INLINE __m256i load_plane(const uint8_t *p, const int B) {
    __m128i b = _mm_loadl_epi64((const __m128i *)p);
    return B == 4 ? _mm256_cvtepi8_epi32(b) : _mm256_cvtepu8_epi32(b);
}

/* Levels of slot j of the plane bytes x (B = 1, 2, 4; load_plane). Up to
 * 2 bits: vpermilps, which looks up 4 entries per 128-bit lane by the low 2
 * index bits (the replicated table makes the rest irrelevant) at about
 * twice the rate of vpermps on Zen 3. */
static ALWAYS_INLINE __m256 levels(__m256i x, const int B, int j, __m256 ta, __m256 tb) {
    __m256i idx = _mm256_srli_epi32(x, B * j);
    if (B < 4) return _mm256_permutevar_ps(ta, idx);
    __m256 a = _mm256_permutevar8x32_ps(ta, idx);
    __m256 b = _mm256_permutevar8x32_ps(tb, idx);
    __m256i pick = j == 0 ? _mm256_slli_epi32(x, 28) : x;
    return _mm256_blendv_ps(a, b, _mm256_castsi256_ps(pick));
}

/* Folded 4-bit codes (FOLDED parts): each code c with bit 3 set becomes
 * c ^ 7, so its low 3 bits index the lower half T[0..7] at 15 - c and bit
 * 3 says to negate (T[c] = -T[15 - c]). Per byte, m = h - (h >> 3) with h
 * = b & 0x88 is 7 in each nibble whose bit 3 is set (the 16-bit shift moves
 * no set bit across a byte). */
static ALWAYS_INLINE __m256i fold_bytes32(__m256i b) {
    __m256i h = _mm256_and_si256(b, _mm256_set1_epi8((char)0x88));
    return _mm256_xor_si256(b, _mm256_sub_epi8(h, _mm256_srli_epi16(h, 3)));
}

static ALWAYS_INLINE __m128i fold_bytes16(__m128i b) {
    __m128i h = _mm_and_si128(b, _mm_set1_epi8((char)0x88));
    return _mm_xor_si128(b, _mm_sub_epi8(h, _mm_srli_epi16(h, 3)));
}

/* Bytes of folded codes kept per pass on the stack (prefold): FOLD_BYTES /
 * cb tokens a pass, 16 or more (4-bit codes of at most 1024 channels are at
 * most 512 bytes a token). */
#define FOLD_BYTES 8192

/* The len bytes of src, folded, into dst. The kernels fold a pass of
 * tokens this way before their token loops when they can (prefold) rather
 * than 8 bytes at a time inside them (load_folded): there the fold sits
 * between each code load and its lookups, and the loops measured 4-5
 * cycles per token slower each (tq-mse 4-bit, in cache) than on folded
 * bytes with this pass included. The loads run a few vectors ahead of the
 * stores: one store after each load measured about twice the time. */
static void fold_codes(const uint8_t *src, size_t len, uint8_t *dst) {
    size_t i = 0;
    for (; i + 128 <= len; i += 128) {
        __m256i v[4];
        for (int k = 0; k < 4; k++) v[k] = _mm256_loadu_si256((const __m256i *)(src + i + 32 * k));
        for (int k = 0; k < 4; k++) _mm256_storeu_si256((__m256i *)(dst + i + 32 * k), fold_bytes32(v[k]));
    }
    for (; i + 32 <= len; i += 32)
        _mm256_storeu_si256((__m256i *)(dst + i), fold_bytes32(_mm256_loadu_si256((const __m256i *)(src + i))));
    for (; i < len; i += 8)
        _mm_storel_epi64((__m128i *)(dst + i), fold_bytes16(_mm_loadl_epi64((const __m128i *)(src + i))));
}

/* Whether the codes are folded a pass of tokens at a time (fold_codes): a
 * single FOLDED part that fills whole rows (tq-mse 4-bit); its kind becomes
 * FOLDED_PRE. Parts next to others (tq-mse 3.5-bit) fold in the loop. */
static bool prefold(const vq_code_part *parts, int nparts, size_t cb, int *kind) {
    if (nparts != 1 || kind[0] != FOLDED || parts[0].off != 0 || (size_t)parts[0].n / 2 != cb || cb > FOLD_BYTES)
        return false;
    kind[0] = FOLDED_PRE;
    return true;
}

/* The 4-bit plane bytes of 8 channels of a FOLDED part, folded, one per
 * lane and sign-extended (load_plane): the fold runs on the 32-bit lanes
 * after the extension, so that the extension takes its bytes straight
 * from memory (extending a register costs the FMA pipes about 1.6 FMAs,
 * from memory almost nothing). */
static ALWAYS_INLINE __m256i load_folded(const uint8_t *p) {
    __m256i x = load_plane(p, 4);
    __m256i h = _mm256_and_si256(x, _mm256_set1_epi32(0x88));
    return _mm256_xor_si256(x, _mm256_sub_epi32(h, _mm256_srli_epi32(h, 3)));
}

/* Levels of slot j of folded plane bytes x (load_folded, or load_plane of
 * fold_codes' bytes): one lookup and a sign flip instead of two lookups and
 * a blend. Slot 0 xors in x << 28, which tw0 expects (part_tables); slot 1
 * has the sign in bit 31 already (sign extension) and takes it with a
 * mask. */
static ALWAYS_INLINE __m256 folded_levels(__m256i x, int j, __m256 tw0, __m256 tw1) {
    if (j == 0) {
        __m256 a = _mm256_permutevar8x32_ps(tw0, x);
        return _mm256_xor_ps(a, _mm256_castsi256_ps(_mm256_slli_epi32(x, 28)));
    }
    __m256 a = _mm256_permutevar8x32_ps(tw1, _mm256_srli_epi32(x, 4));
    return _mm256_xor_ps(a, _mm256_and_ps(_mm256_castsi256_ps(x), _mm256_set1_ps(-0.0f)));
}

/* Levels of slot j of a 4-bit HALVES part: lo[bits 0..1] + hi[bits 2..3]
 * of the slot's code (ta: lo, tb: hi, each replicated; vpermilps reads the
 * low 2 bits of each lane). */
static ALWAYS_INLINE __m256 halves_levels(__m256i x, int j, __m256 ta, __m256 tb) {
    __m256 lo = _mm256_permutevar_ps(ta, j ? _mm256_srli_epi32(x, 4) : x);
    return _mm256_add_ps(lo, _mm256_permutevar_ps(tb, _mm256_srli_epi32(x, 4 * j + 2)));
}

/* Levels of slot j of plane bytes x for a part of B bits and kind F. */
static ALWAYS_INLINE __m256 part_levels(__m256i x, const int B, const int F, int j, __m256 ta, __m256 tb) {
    if (F == FOLDED || F == FOLDED_PRE) return folded_levels(x, j, ta, tb);
    if (F == HALVES) return halves_levels(x, j, ta, tb);
    return levels(x, B, j, ta, tb);
}

/* The 1-bit plane bytes c1 (s1 = n / 8 bytes a 1-bit slot, at most 16)
 * of the 8 channels of 2-bit plane run u, one per lane, with the high bit
 * of a channel of 2-bit slot j at bit 2 j (ACROSS parts). Lane i's byte is
 * (u + i) mod s1; the channels of a 2-bit slot's second half (u + i >=
 * s1) sit one 1-bit slot higher, so their bytes are shifted down once. One
 * 16-byte load holds every byte (past s1 it reads the next bytes of the
 * block, which no lane picks); a byte shuffle places them. PLAIN 3-bit
 * parts (s1 a multiple of 8) do the same with one load and a shift by 0
 * or 1 per run; ACROSS has kernels of its own (score_b3x, accum_b3x,
 * score_anyx, accum_anyx) because a branch in the shared ones made GCC
 * allocate their registers worse (tq-prod 4-bit keys at d = 128: 33 -> 37
 * ns per token and kv head in cache). */
static ALWAYS_INLINE __m256i load_high(const uint8_t *c1, int u, int s1) {
    __m128i second;
    __m256i h = _mm256_cvtepu8_epi32(vq_high_bytes16(c1, u, s1, &second));
    return _mm256_srlv_epi32(h, _mm256_cvtepu8_epi32(second));
}

/* Levels of 3-bit codes: slot j of the 2-bit plane bytes x, high bit hb of
 * the 1-bit plane bytes h. */
static ALWAYS_INLINE __m256 levels3(__m256i x, __m256i h, int j, int hb, __m256 ta, __m256 tb) {
    __m256i idx = _mm256_srli_epi32(x, 2 * j);
    __m256 a = _mm256_permutevar_ps(ta, idx); /* 4-entry lookups, see levels() */
    __m256 b = _mm256_permutevar_ps(tb, idx);
    return _mm256_blendv_ps(a, b, _mm256_castsi256_ps(_mm256_slli_epi32(h, 31 - hb)));
}

/* The accumulator of (row r, token t) for 8-channel run number g: with one
 * row the runs alternate between two sets, so four FMA chains hide the
 * latency instead of two. */
static ALWAYS_INLINE int acc_index(const int R, int r, int t, int g) { return R == 1 ? t + 2 * (g & 1) : 2 * r + t; }

/* Adds q_r . levels of one part for tokens c0 and c1 (their codes) into
 * acc; qs is the part's q in reading order (prep_part). F: the part's
 * kind (part_kind). */
static ALWAYS_INLINE void score_part(const vq_code_part *p, const float *tab, const int B, const int F, const int R,
                                     const float *qs, const uint8_t *c0, const uint8_t *c1, __m256 *acc) {
    __m256 ta = _mm256_loadu_ps(tab), tb = _mm256_loadu_ps(tab + 8);
    c0 += p->off;
    c1 += p->off;
    if (B == 3) {
        /* 2-bit plane bytes u of the first half of a slot's channels
         * (u < s1) share the 1-bit plane byte u with the second half (u +
         * s1): their high bits sit at 2j and 2j + 1. The second half shifts
         * its 1-bit bytes down once so both halves use the same shifts. */
        int s2 = p->n / 4, s1 = p->n / 8;
        for (int u = 0; u < s2; u += 8) {
            int half = u < s1 ? 0 : 1, v = u - half * s1;
            __m256i x0 = load_u8x8(c0 + u), x1 = load_u8x8(c1 + u), h0, h1;
            if (F == ACROSS) {
                h0 = load_high(c0 + s2, u, s1);
                h1 = load_high(c1 + s2, u, s1);
            } else {
                h0 = _mm256_srli_epi32(load_u8x8(c0 + s2 + v), half);
                h1 = _mm256_srli_epi32(load_u8x8(c1 + s2 + v), half);
            }
            for (int j = 0; j < 4; j++) {
                __m256 v0 = levels3(x0, h0, j, 2 * j, ta, tb), v1 = levels3(x1, h1, j, 2 * j, ta, tb);
                for (int r = 0; r < R; r++, qs += 8) {
                    __m256 qv = _mm256_loadu_ps(qs);
                    acc[acc_index(R, r, 0, j)] = _mm256_fmadd_ps(qv, v0, acc[acc_index(R, r, 0, j)]);
                    acc[acc_index(R, r, 1, j)] = _mm256_fmadd_ps(qv, v1, acc[acc_index(R, r, 1, j)]);
                }
            }
        }
        return;
    }
    int stride = p->n * B / 8;
    for (int u = 0; u < stride; u += 8) {
        __m256i x0, x1;
        x0 = F == FOLDED ? load_folded(c0 + u) : load_plane(c0 + u, B);
        x1 = F == FOLDED ? load_folded(c1 + u) : load_plane(c1 + u, B);
        for (int j = 0; j < 8 / B; j++) {
            __m256 v0 = part_levels(x0, B, F, j, ta, tb), v1 = part_levels(x1, B, F, j, ta, tb);
            for (int r = 0; r < R; r++, qs += 8) {
                __m256 qv = _mm256_loadu_ps(qs);
                acc[acc_index(R, r, 0, j)] = _mm256_fmadd_ps(qv, v0, acc[acc_index(R, r, 0, j)]);
                acc[acc_index(R, r, 1, j)] = _mm256_fmadd_ps(qv, v1, acc[acc_index(R, r, 1, j)]);
            }
        }
    }
}

/* Copies R rows of one part's q (q: its first channel of row 0, rows d
 * apart) into qs in the order score_part reads them: 8 floats for each
 * (8-byte step u, slot j, row r), channels j * stride + u .. + 7. One
 * pointer then walks q with immediate offsets; with a pointer per (slot,
 * row) the kernel ran out of registers. */
/* Floats per row that prep_part writes for a part: whole runs of 8
 * channels per slot (n, or more for a part whose slots end in a run of 4). */
static int prep_floats(const vq_code_part *p) {
    int slots = p->bits == 3 ? 4 : 8 / p->bits, stride = p->n / slots;
    return slots * ((stride + 7) / 8 * 8);
}

static void prep_part(const vq_code_part *p, const int R, const float *q, int d, float *qs) {
    int slots = p->bits == 3 ? 4 : 8 / p->bits, stride = p->n / slots;
    for (int u = 0; u < stride; u += 8) {
        /* lanes past the part's bytes (tail_bytes): zero, not read */
        const int live = stride - u < 8 ? stride - u : 8;
        const __m256i keep = _mm256_cmpgt_epi32(_mm256_set1_epi32(live), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
        for (int j = 0; j < slots; j++)
            for (int r = 0; r < R; r++, qs += 8)
                _mm256_storeu_ps(qs, _mm256_maskload_ps(q + (size_t)r * d + j * stride + u, keep));
    }
}

/* logits[r][t] *= norms[t] for R rows: once per call, 8 tokens a step, so
 * the per-pair epilogue of score_rows has no conversions or broadcasts. */
static void scale_by_norms(const uint16_t *norms, int n, int R, float *logits, int ld) {
    int t = 0;
    for (; t + 8 <= n; t += 8) {
        __m256 nv = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(norms + t)));
        for (int r = 0; r < R; r++) {
            float *l = logits + (size_t)r * ld + t;
            _mm256_storeu_ps(l, _mm256_mul_ps(_mm256_loadu_ps(l), nv));
        }
    }
    for (; t < n; t++)
        for (int r = 0; r < R; r++) logits[(size_t)r * ld + t] *= _cvtsh_ss(norms[t]);
}

/* The sign-sketch score of one token for four rows, summed exactly as
 * vq_signs_score_avx2 sums it (four chains, the same order), times gain. */
static ALWAYS_INLINE __m128 sign_score4(const float *tg, const uint8_t *s, int nb, float gain) {
    __m128 a0 = _mm_setzero_ps(), a1 = _mm_setzero_ps(), a2 = _mm_setzero_ps(), a3 = _mm_setzero_ps();
    int k = 0;
    for (; k + 4 <= nb; k += 4) {
        const float *e = tg + (size_t)1024 * k;
        a0 = _mm_add_ps(a0, _mm_loadu_ps(e + 4 * (size_t)s[k]));
        a1 = _mm_add_ps(a1, _mm_loadu_ps(e + 1024 + 4 * (size_t)s[k + 1]));
        a2 = _mm_add_ps(a2, _mm_loadu_ps(e + 2048 + 4 * (size_t)s[k + 2]));
        a3 = _mm_add_ps(a3, _mm_loadu_ps(e + 3072 + 4 * (size_t)s[k + 3]));
    }
    for (; k < nb; k++) a0 = _mm_add_ps(a0, _mm_loadu_ps(tg + (size_t)1024 * k + 4 * (size_t)s[k]));
    return _mm_mul_ps(_mm_add_ps(_mm_add_ps(a0, a1), _mm_add_ps(a2, a3)), _mm_set1_ps(gain));
}

/* Scores tokens [0, n) for R rows (1, 2 or 4, a constant in each caller so
 * the accumulators stay in registers). S (R = 4 only): a sign sketch is
 * scored along (sp, tables of these four rows at stab), each token pair
 * right after its codes, and the logits are norm * codes + gain * signs
 * with the bits of the two separate kernels. */
static ALWAYS_INLINE void score_rows(const vq_code_part *parts, int nparts, const float *tabs, const int *kind,
                                     const uint8_t *codes, size_t cb, const uint16_t *norms, int n, const float *q,
                                     int d, const int R, float *logits, int ld, float *qs, const int B1, const int F1,
                                     const int S, const vq_sign_part *sp, const float *stab) {
    int po[2]; /* each part's prepared q in qs */
    for (int k = 0, ch = 0, pc = 0; k < nparts; ch += parts[k].n, pc += prep_floats(&parts[k]), k++) {
        po[k] = R * pc;
        prep_part(&parts[k], R, q + ch, d, qs + po[k]);
    }
    for (int j = 0; j < n; j += 2) {
        /* an odd count scores the last token twice and keeps one */
        int j1 = j + 1 < n ? j + 1 : j;
        const uint8_t *c0 = codes + (size_t)j * cb, *c1 = codes + (size_t)j1 * cb;
        __m256 acc[8];
        for (int i = 0; i < 8; i++) acc[i] = _mm256_setzero_ps();
        for (int k = 0; k < nparts; k++) {
            const vq_code_part *p = &parts[k];
            const float *qk = qs + po[k], *tab = tabs + 16 * k;
            if (B1) {
                score_part(p, tab, B1, F1, R, qk, c0, c1, acc);
                break;
            }
            switch (p->bits) {
            case 1: score_part(p, tab, 1, PLAIN, R, qk, c0, c1, acc); break;
            case 2: score_part(p, tab, 2, PLAIN, R, qk, c0, c1, acc); break; /* a tail: zero q' (prep_part) */
            case 3:
                if (F1 == ACROSS) score_part(p, tab, 3, ACROSS, R, qk, c0, c1, acc);
                else score_part(p, tab, 3, PLAIN, R, qk, c0, c1, acc);
                break;
            default:
                if (kind[k] == FOLDED) score_part(p, tab, 4, FOLDED, R, qk, c0, c1, acc);
                else score_part(p, tab, 4, PLAIN, R, qk, c0, c1, acc);
                break;
            }
        }
        if (R == 1) {
            acc[0] = _mm256_add_ps(acc[0], acc[2]);
            acc[1] = _mm256_add_ps(acc[1], acc[3]);
            acc[2] = acc[3] = _mm256_setzero_ps();
        }
        /* {r0t0, r0t1, r1t0, r1t1 | r2t0, r2t1, r3t0, r3t1} */
        __m256 h01 = _mm256_hadd_ps(_mm256_hadd_ps(acc[0], acc[1]), _mm256_hadd_ps(acc[2], acc[3]));
        __m256 h23 = _mm256_hadd_ps(_mm256_hadd_ps(acc[4], acc[5]), _mm256_hadd_ps(acc[6], acc[7]));
        __m256 s = _mm256_add_ps(_mm256_permute2f128_ps(h01, h23, 0x20), _mm256_permute2f128_ps(h01, h23, 0x31));
        /* a row's two sums are adjacent in s and in logits: one 8-byte
         * store each instead of a scalar per (row, token) */
        __m128 lo = _mm256_castps256_ps128(s), hi = _mm256_extractf128_ps(s, 1);
        if (S) {
            /* the sign part's loads (L2: 64 KB of tables) overlap the next
             * pair's FMAs here instead of running in a pass of their own */
            __m128 va = sign_score4(stab, codes + (size_t)j * cb + sp->off, sp->m / 8, sp->gain[j]);
            __m128 vb = sign_score4(stab, codes + (size_t)j1 * cb + sp->off, sp->m / 8, sp->gain[j1]);
            __m128 nv = _mm_setr_ps(_cvtsh_ss(norms[j]), _cvtsh_ss(norms[j1]), _cvtsh_ss(norms[j]), _cvtsh_ss(norms[j1]));
            lo = _mm_add_ps(_mm_mul_ps(lo, nv), _mm_unpacklo_ps(va, vb));
            hi = _mm_add_ps(_mm_mul_ps(hi, nv), _mm_unpackhi_ps(va, vb));
        }
        if (j1 != j) {
            _mm_storel_pi((__m64 *)(logits + j), lo);
            if (R > 1) _mm_storeh_pi((__m64 *)(logits + (size_t)ld + j), lo);
            if (R > 2) {
                _mm_storel_pi((__m64 *)(logits + 2 * (size_t)ld + j), hi);
                _mm_storeh_pi((__m64 *)(logits + 3 * (size_t)ld + j), hi);
            }
        } else {
            float out[8];
            _mm_storeu_ps(out, lo);
            _mm_storeu_ps(out + 4, hi);
            for (int r = 0; r < R; r++) logits[(size_t)r * ld + j] = out[2 * r];
        }
    }
    if (!S) scale_by_norms(norms, n, R, logits, ld);
}

/* The score kernel over n tokens for every row. B1, F1: the bits and kind
 * of a single part, as constants, or B1 = 0 for any parts (chosen per part
 * and token pair). The common single parts get a function each
 * (score_pick), so that their loops get the registers to themselves: in
 * one function with every variant, GCC spilled in some loops and the
 * prefolded 4-bit loop measured 2-3 ns per (token, kv head) slower. */
static ALWAYS_INLINE void score_all(const vq_code_part *parts, int nparts, const float *tabs, const int *kind,
                                    const uint8_t *codes, size_t cb, const uint16_t *norms, int n, const float *q,
                                    int d, int rows, float *logits, int ld, float *qs, const int B1, const int F1) {
    int r = 0;
    for (; r + 4 <= rows; r += 4)
        score_rows(parts, nparts, tabs, kind, codes, cb, norms, n, q + (size_t)r * d, d, 4, logits + (size_t)r * ld,
                   ld, qs, B1, F1, 0, NULL, NULL);
    for (; r + 2 <= rows; r += 2)
        score_rows(parts, nparts, tabs, kind, codes, cb, norms, n, q + (size_t)r * d, d, 2, logits + (size_t)r * ld,
                   ld, qs, B1, F1, 0, NULL, NULL);
    for (; r < rows; r++)
        score_rows(parts, nparts, tabs, kind, codes, cb, norms, n, q + (size_t)r * d, d, 1, logits + (size_t)r * ld,
                   ld, qs, B1, F1, 0, NULL, NULL);
}

typedef void score_fn(const vq_code_part *parts, int nparts, const float *tabs, const int *kind, const uint8_t *codes,
                      size_t cb, const uint16_t *norms, int n, const float *q, int d, int rows, float *logits, int ld,
                      float *qs);

static NOINLINE void score_any(const vq_code_part *parts, int nparts, const float *tabs, const int *kind,
                               const uint8_t *codes, size_t cb, const uint16_t *norms, int n, const float *q, int d,
                               int rows, float *logits, int ld, float *qs) {
    score_all(parts, nparts, tabs, kind, codes, cb, norms, n, q, d, rows, logits, ld, qs, 0, PLAIN);
}
static NOINLINE void score_b1(const vq_code_part *parts, int nparts, const float *tabs, const int *kind,
                              const uint8_t *codes, size_t cb, const uint16_t *norms, int n, const float *q, int d,
                              int rows, float *logits, int ld, float *qs) {
    score_all(parts, nparts, tabs, kind, codes, cb, norms, n, q, d, rows, logits, ld, qs, 1, PLAIN);
}
static NOINLINE void score_b2(const vq_code_part *parts, int nparts, const float *tabs, const int *kind,
                              const uint8_t *codes, size_t cb, const uint16_t *norms, int n, const float *q, int d,
                              int rows, float *logits, int ld, float *qs) {
    score_all(parts, nparts, tabs, kind, codes, cb, norms, n, q, d, rows, logits, ld, qs, 2, PLAIN);
}
static NOINLINE void score_b4_pre(const vq_code_part *parts, int nparts, const float *tabs, const int *kind,
                                  const uint8_t *codes, size_t cb, const uint16_t *norms, int n, const float *q, int d,
                                  int rows, float *logits, int ld, float *qs) {
    score_all(parts, nparts, tabs, kind, codes, cb, norms, n, q, d, rows, logits, ld, qs, 4, FOLDED_PRE);
}
static NOINLINE void score_b4_halves(const vq_code_part *parts, int nparts, const float *tabs, const int *kind,
                                     const uint8_t *codes, size_t cb, const uint16_t *norms, int n, const float *q,
                                     int d, int rows, float *logits, int ld, float *qs) {
    score_all(parts, nparts, tabs, kind, codes, cb, norms, n, q, d, rows, logits, ld, qs, 4, HALVES);
}

static NOINLINE void score_b3x(const vq_code_part *parts, int nparts, const float *tabs, const int *kind,
                               const uint8_t *codes, size_t cb, const uint16_t *norms, int n, const float *q, int d,
                               int rows, float *logits, int ld, float *qs) {
    score_all(parts, nparts, tabs, kind, codes, cb, norms, n, q, d, rows, logits, ld, qs, 3, ACROSS);
}

static NOINLINE void score_anyx(const vq_code_part *parts, int nparts, const float *tabs, const int *kind,
                                const uint8_t *codes, size_t cb, const uint16_t *norms, int n, const float *q, int d,
                                int rows, float *logits, int ld, float *qs) {
    score_all(parts, nparts, tabs, kind, codes, cb, norms, n, q, d, rows, logits, ld, qs, 0, ACROSS);
}

/* Whether any part is ACROSS. */
static bool any_across(int nparts, const int *kind) {
    for (int k = 0; k < nparts; k++)
        if (kind[k] == ACROSS) return true;
    return false;
}

static score_fn *score_pick(const vq_code_part *parts, int nparts, const int *kind) {
    if (nparts != 1) return any_across(nparts, kind) ? score_anyx : score_any;
    switch (parts[0].bits) {
    case 1: return score_b1;
    case 2: return score_b2; /* an ACROSS part's tail reads zero q' (prep_part) */
    case 3: return kind[0] == ACROSS ? score_b3x : score_any; /* PLAIN: measured 3-5 % faster there than alone */
    default: return kind[0] == FOLDED_PRE ? score_b4_pre : kind[0] == HALVES ? score_b4_halves : score_any;
    }
}

/* fn over n tokens whose codes are folded first (prefold), a pass of
 * FOLD_BYTES at a time; in a function of its own so that the other calls
 * keep a small stack frame. */
static NOINLINE void score_prefolded(score_fn *fn, const vq_code_part *parts, const float *tabs, const int *kind,
                                     const uint8_t *codes, size_t cb, const uint16_t *norms, int n, const float *q,
                                     int d, int rows, float *logits, int ld, float *qs) {
    uint8_t folded[FOLD_BYTES];
    int step = (int)(FOLD_BYTES / cb);
    for (int t0 = 0; t0 < n; t0 += step) {
        int m = n - t0 < step ? n - t0 : step;
        fold_codes(codes + (size_t)t0 * cb, (size_t)m * cb, folded);
        fn(parts, 1, tabs, kind, folded, cb, norms + t0, m, q, d, rows, logits + t0, ld, qs);
    }
}

/* What both kernels do first: checks that the AVX2 path covers the parts
 * (false: the caller takes the scalar path), picks each part's kind and
 * whether the codes are folded before the loops (*pre), and fills the
 * lookup tables, 16 floats per part. */
static bool prepare_parts(const vq_code_part *parts, int nparts, size_t cb, int kind[2], float tabs[2 * 16],
                          bool *pre) {
    if (nparts > 2) return false;
    for (int k = 0; k < nparts; k++) {
        if (!part_covered(&parts[k])) return false;
        kind[k] = part_kind(&parts[k], nparts);
        if (tail_bytes(&parts[k]) < 8 && nparts > 1) return false; /* 1-bit tails: single parts only */
        /* 4-bit tails: next to another part only (tq-mse 3.5-bit at d = 80:
         * 40 channels), never the folded single part (fold_codes) */
        if (parts[k].bits == 4 && parts[k].n % 16 != 0 && nparts == 1) return false;
    }
    *pre = prefold(parts, nparts, cb, kind);
    for (int k = 0; k < nparts; k++) part_tables(&parts[k], kind[k], tabs + 16 * k);
    return true;
}

bool vq_codes_score_avx2(const vq_code_part *parts, int nparts, const uint8_t *codes, size_t cb,
                         const uint16_t *norms, int n, const float *q, int d, int rows, float *logits, int ld,
                         float *scratch) {
    float tabs[2 * 16];
    int kind[2];
    bool pre;
    if (!prepare_parts(parts, nparts, cb, kind, tabs, &pre)) return false;
    score_fn *fn = score_pick(parts, nparts, kind);
    if (pre) score_prefolded(fn, parts, tabs, kind, codes, cb, norms, n, q, d, rows, logits, ld, scratch);
    else fn(parts, nparts, tabs, kind, codes, cb, norms, n, q, d, rows, logits, ld, scratch);
    return true;
}

/* Codes and a sign sketch scored in one pass, four rows at a time (the
 * rows of a kv head in decode): the codes kernels are bound by the FMA
 * pipes, the sign lookups by bringing their table lines from L2, so one
 * pass lets the two overlap. Single 2-bit parts (tq-prod 3-bit) and 3-bit
 * parts (tq-prod 4-bit, through the generic function as in score_pick). */
static NOINLINE void score_signs_b2(const vq_code_part *parts, const float *tabs, const int *kind,
                                    const uint8_t *codes, size_t cb, const uint16_t *norms, int n, const float *q,
                                    int d, float *logits, int ld, float *qs, const vq_sign_part *sp,
                                    const float *stab) {
    score_rows(parts, 1, tabs, kind, codes, cb, norms, n, q, d, 4, logits, ld, qs, 2, PLAIN, 1, sp, stab);
}
static NOINLINE void score_signs_b3x(const vq_code_part *parts, const float *tabs, const int *kind,
                                     const uint8_t *codes, size_t cb, const uint16_t *norms, int n, const float *q,
                                     int d, float *logits, int ld, float *qs, const vq_sign_part *sp,
                                     const float *stab) {
    score_rows(parts, 1, tabs, kind, codes, cb, norms, n, q, d, 4, logits, ld, qs, 3, ACROSS, 1, sp, stab);
}
static NOINLINE void score_signs_any(const vq_code_part *parts, const float *tabs, const int *kind,
                                     const uint8_t *codes, size_t cb, const uint16_t *norms, int n, const float *q,
                                     int d, float *logits, int ld, float *qs, const vq_sign_part *sp,
                                     const float *stab) {
    score_rows(parts, 1, tabs, kind, codes, cb, norms, n, q, d, 4, logits, ld, qs, 0, PLAIN, 1, sp, stab);
}

int vq_codes_signs_score_avx2(const vq_code_part *parts, int nparts, const vq_sign_part *sp, const uint8_t *codes,
                              size_t cb, const uint16_t *norms, int n, const float *q, int d, int rows, float *logits,
                              int ld, float *scratch) {
    float tabs[2 * 16];
    int kind[2];
    bool pre;
    if (nparts != 1 || (parts[0].bits != 2 && parts[0].bits != 3)) return 0;
    if (!prepare_parts(parts, nparts, cb, kind, tabs, &pre) || pre) return 0;
    int r = 0;
    for (; r + 4 <= rows; r += 4) {
        const float *qr = q + (size_t)r * d, *stab = sp->tab + (size_t)r * 32 * sp->m;
        float *lr = logits + (size_t)r * ld;
        if (parts[0].bits == 2) score_signs_b2(parts, tabs, kind, codes, cb, norms, n, qr, d, lr, ld, scratch, sp, stab);
        else if (kind[0] == ACROSS)
            score_signs_b3x(parts, tabs, kind, codes, cb, norms, n, qr, d, lr, ld, scratch, sp, stab);
        else score_signs_any(parts, tabs, kind, codes, cb, norms, n, qr, d, lr, ld, scratch, sp, stab);
    }
    return r;
}

/* a[r][g] += wn[r] * v[g] for R rows and G runs of one token (wn rows
 * TOKENS apart). */
static ALWAYS_INLINE void weigh(const int R, const int G, const float *wn, const __m256 *v, __m256 *a) {
    for (int r = 0; r < R; r++) {
        __m256 w = _mm256_broadcast_ss(wn + r * TOKENS);
        for (int g = 0; g < G; g++) a[r * G + g] = _mm256_fmadd_ps(w, v[g], a[r * G + g]);
    }
}

/* acc_r[channels of G runs] += sum_t wn[r][t] * levels over n tokens for one
 * part, R rows (1, 2, 4) and G = 8 / R runs per pass (at most the slots of
 * a byte): the R x G accumulators stay in registers over the tokens. acc
 * points at the part's first channel of row 0, rows d apart; wn rows are
 * TOKENS apart. F: the part's kind (part_kind). */
static ALWAYS_INLINE void accum_part(const vq_code_part *p, const float *tab, const int B, const int F, const int R,
                                     const float *wn, const uint8_t *codes, size_t cb, int n, float *acc, int d) {
    __m256 ta = _mm256_loadu_ps(tab), tb = _mm256_loadu_ps(tab + 8);
    const int slots = B == 3 ? 4 : 8 / B, G = 8 / R < slots ? 8 / R : slots;
    const uint8_t *c = codes + p->off;
    int stride = B == 3 ? p->n / 4 : p->n * B / 8, s1 = p->n / 8;
    for (int u = 0; u < stride; u += 8)
        for (int j0 = 0; j0 < slots; j0 += G) {
            __m256 a[8];
            /* a run of 2, 4 or 6 at the end of the slots (ACROSS parts, and
             * 4-bit parts of n % 16 == 8 channels); its other lanes (the
             * next slot's channels) are neither loaded nor stored. The test
             * is outside the token loop: 4-bit parts of whole runs (d = 128,
             * AVX2 level) measured within 1 % of the code without it. */
            const bool tail = (F == ACROSS || B == 4) && u + 8 > stride;
            const __m256i keep =
                _mm256_cmpgt_epi32(_mm256_set1_epi32(stride - u), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
            for (int r = 0; r < R; r++)
                for (int g = 0; g < G; g++) {
                    const float *o = acc + (size_t)r * d + (j0 + g) * stride + u;
                    a[r * G + g] = tail ? _mm256_maskload_ps(o, keep) : _mm256_loadu_ps(o);
                }
            for (int t = 0; t < n; t++) {
                const uint8_t *ct = c + (size_t)t * cb;
                __m256i x = F == FOLDED ? load_folded(ct + u) : load_plane(ct + u, B);
                __m256 v[8];
                if (B == 3 && F == ACROSS) {
                    __m256i h = load_high(ct + stride, u, s1);
                    for (int g = 0; g < G; g++) v[g] = levels3(x, h, j0 + g, 2 * (j0 + g), ta, tb);
                } else if (B == 3) {
                    __m256i h = load_u8x8(ct + stride + u % s1);
                    for (int g = 0; g < G; g++) v[g] = levels3(x, h, j0 + g, 2 * (j0 + g) + u / s1, ta, tb);
                } else {
                    for (int g = 0; g < G; g++) v[g] = part_levels(x, B, F, j0 + g, ta, tb);
                }
                weigh(R, G, wn + t, v, a);
            }
            for (int r = 0; r < R; r++)
                for (int g = 0; g < G; g++) {
                    float *o = acc + (size_t)r * d + (j0 + g) * stride + u;
                    if (tail) _mm256_maskstore_ps(o, keep, a[r * G + g]);
                    else _mm256_storeu_ps(o, a[r * G + g]);
                }
        }
}

static ALWAYS_INLINE void accum_rows(const vq_code_part *parts, int nparts, const float *tabs, const int *kind,
                                     const uint8_t *codes, size_t cb, const uint16_t *norms, int n, const float *w,
                                     int ld, const int R, float *acc, int d, const int B1, const int F1) {
    float wn[4 * TOKENS];
    for (int t0 = 0; t0 < n; t0 += TOKENS) {
        int m = n - t0 < TOKENS ? n - t0 : TOKENS;
        for (int t = 0; t < m; t++) {
            float len = _cvtsh_ss(norms[t0 + t]);
            for (int r = 0; r < R; r++) wn[r * TOKENS + t] = w[(size_t)r * ld + t0 + t] * len;
        }
        const uint8_t *ct = codes + (size_t)t0 * cb;
        int ch = 0;
        for (int k = 0; k < nparts; k++) {
            const vq_code_part *p = &parts[k];
            const float *tab = tabs + 16 * k;
            if (B1) {
                accum_part(p, tab, B1, F1, R, wn, ct, cb, m, acc + ch, d);
                break;
            }
            switch (p->bits) {
            case 1: accum_part(p, tab, 1, PLAIN, R, wn, ct, cb, m, acc + ch, d); break;
            case 2:
                if (F1 == ACROSS) accum_part(p, tab, 2, ACROSS, R, wn, ct, cb, m, acc + ch, d);
                else accum_part(p, tab, 2, PLAIN, R, wn, ct, cb, m, acc + ch, d);
                break;
            case 3:
                if (F1 == ACROSS) accum_part(p, tab, 3, ACROSS, R, wn, ct, cb, m, acc + ch, d);
                else accum_part(p, tab, 3, PLAIN, R, wn, ct, cb, m, acc + ch, d);
                break;
            default:
                if (kind[k] == FOLDED) accum_part(p, tab, 4, FOLDED, R, wn, ct, cb, m, acc + ch, d);
                else accum_part(p, tab, 4, PLAIN, R, wn, ct, cb, m, acc + ch, d);
                break;
            }
            ch += p->n;
        }
    }
}

/* The value kernel over n tokens for every row; B1, F1 as in score_all
 * (accum_pick). */
static ALWAYS_INLINE void accum_all(const vq_code_part *parts, int nparts, const float *tabs, const int *kind,
                                    const uint8_t *codes, size_t cb, const uint16_t *norms, int n, const float *w,
                                    int ld, int rows, float *acc, int d, const int B1, const int F1) {
    int r = 0;
    for (; r + 4 <= rows; r += 4)
        accum_rows(parts, nparts, tabs, kind, codes, cb, norms, n, w + (size_t)r * ld, ld, 4, acc + (size_t)r * d, d,
                   B1, F1);
    for (; r + 2 <= rows; r += 2)
        accum_rows(parts, nparts, tabs, kind, codes, cb, norms, n, w + (size_t)r * ld, ld, 2, acc + (size_t)r * d, d,
                   B1, F1);
    for (; r < rows; r++)
        accum_rows(parts, nparts, tabs, kind, codes, cb, norms, n, w + (size_t)r * ld, ld, 1, acc + (size_t)r * d, d,
                   B1, F1);
}

typedef void accum_fn(const vq_code_part *parts, int nparts, const float *tabs, const int *kind, const uint8_t *codes,
                      size_t cb, const uint16_t *norms, int n, const float *w, int ld, int rows, float *acc, int d);

static NOINLINE void accum_any(const vq_code_part *parts, int nparts, const float *tabs, const int *kind,
                               const uint8_t *codes, size_t cb, const uint16_t *norms, int n, const float *w, int ld,
                               int rows, float *acc, int d) {
    accum_all(parts, nparts, tabs, kind, codes, cb, norms, n, w, ld, rows, acc, d, 0, PLAIN);
}
/* A single 1-bit part's values, two tokens per lookup: for a token pair
 * (t, u) and a row the four sums T[a] wt + T[b] wu (a, b the two codes, wt
 * and wu the norm-scaled weights) form a 4-entry table that the pair's two
 * code bits index, one vpermilps and one add per 8 channels, row and pair
 * instead of one FMA per token (the FMA pipes run both; the adds go to the
 * other two): tq-prod 2-bit 58.5 -> 56.5 ns per (token, kv head) in
 * cache, tq-mse 1-bit 37.3 -> 35.0 (32/8 heads, one thread). The pair's
 * code bytes are interleaved bit by bit first (pair_bits), so that bit j
 * of both sits at bits 2j, 2j + 1 of a 16-bit word: a lane's slot j is
 * then one shift away, as for 2-bit codes. */

/* Words w[i] = bits of a[i] at the even positions, of b[i] (0 without b)
 * at the odd ones, for len bytes: each nibble spread by a vpshufb table.
 * len is a multiple of 8, or of 2 for a part with a tail (tail_bytes):
 * then the last step reads up to 6 bytes past the part (still inside the
 * block) and writes as many words past w + len, lanes that
 * accum_pairs_rows masks (the next pair's words overwrite them). */
static void pair_bits(const uint8_t *a, const uint8_t *b, int len, uint16_t *w) {
    const __m128i spread = _mm_setr_epi8(0, 1, 4, 5, 16, 17, 20, 21, 64, 65, 68, 69, 80, 81, 84, 85);
    const __m128i low = _mm_set1_epi8(15);
    for (int i = 0; i < len; i += 8) {
        __m128i x = _mm_loadl_epi64((const __m128i *)(a + i));
        __m128i y = b ? _mm_loadl_epi64((const __m128i *)(b + i)) : _mm_setzero_si128();
        __m128i sx = _mm_unpacklo_epi8(_mm_shuffle_epi8(spread, _mm_and_si128(x, low)),
                                       _mm_shuffle_epi8(spread, _mm_and_si128(_mm_srli_epi16(x, 4), low)));
        __m128i sy = _mm_unpacklo_epi8(_mm_shuffle_epi8(spread, _mm_and_si128(y, low)),
                                       _mm_shuffle_epi8(spread, _mm_and_si128(_mm_srli_epi16(y, 4), low)));
        _mm_storeu_si128((__m128i *)(w + i), _mm_or_si128(sx, _mm_slli_epi16(sy, 1)));
    }
}

/* acc_r[channels] += the pairs' table entries for R rows (1, 2, 4), G = 8
 * / R slots per pass; pt: 4 floats per (row, pair), rows TOKENS * 2 floats
 * apart; pw: the pairs' words, `len` a pair. */
static ALWAYS_INLINE void accum_pairs_rows(const uint16_t *pw, int len, int pairs, const float *pt, const int R,
                                           float *acc, int d) {
    const int G = 8 / R;
    for (int u = 0; u < len; u += 8)
        for (int j0 = 0; j0 < 8; j0 += G) {
            __m256 a[8];
            /* a run past the part's bytes (tail_bytes; its words past len
             * are the next pair's or unset): those lanes are neither loaded
             * nor stored */
            const bool tail = u + 8 > len;
            const __m256i keep =
                _mm256_cmpgt_epi32(_mm256_set1_epi32(len - u), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
            for (int r = 0; r < R; r++)
                for (int g = 0; g < G; g++) {
                    const float *o = acc + (size_t)r * d + (j0 + g) * len + u;
                    a[r * G + g] = tail ? _mm256_maskload_ps(o, keep) : _mm256_loadu_ps(o);
                }
            for (int p = 0; p < pairs; p++) {
                __m256i x = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)(pw + (size_t)p * len + u)));
                __m256i idx[8];
                for (int g = 0; g < G; g++) idx[g] = _mm256_srli_epi32(x, 2 * (j0 + g));
                for (int r = 0; r < R; r++) {
                    __m256 tab = _mm256_broadcast_ps((const __m128 *)(pt + r * 2 * TOKENS + 4 * p));
                    for (int g = 0; g < G; g++)
                        a[r * G + g] = _mm256_add_ps(a[r * G + g], _mm256_permutevar_ps(tab, idx[g]));
                }
            }
            for (int r = 0; r < R; r++)
                for (int g = 0; g < G; g++) {
                    float *o = acc + (size_t)r * d + (j0 + g) * len + u;
                    if (tail) _mm256_maskstore_ps(o, keep, a[r * G + g]);
                    else _mm256_storeu_ps(o, a[r * G + g]);
                }
        }
}

/* The pair tables of accum_b1 (entry a + 2 b: T[a] wt + T[b] wu, by one
 * FMA after a multiply, as its scalar loop computes them, so the same bits)
 * for 8 pairs at a time, for the first cnt / 16 * 16 tokens; returns that
 * count. pt: 4 floats a pair. The sign sketch's tables (codes_avx2.c) are
 * the same with the levels -1 and +1. */
int vq_pair_tables8_avx2(const float *w, const float *nrm, int cnt, const float *levels, float *pt) {
    const __m256 l0 = _mm256_set1_ps(levels[0]), l1 = _mm256_set1_ps(levels[1]);
    int t = 0;
    for (; t + 16 <= cnt; t += 16) {
        __m256 x0 = _mm256_mul_ps(_mm256_loadu_ps(w + t), _mm256_loadu_ps(nrm + t));
        __m256 x1 = _mm256_mul_ps(_mm256_loadu_ps(w + t + 8), _mm256_loadu_ps(nrm + t + 8));
        /* pairs 0, 1, 4, 5 | 2, 3, 6, 7 of the 8 */
        __m256 a = _mm256_shuffle_ps(x0, x1, 0x88), b = _mm256_shuffle_ps(x0, x1, 0xDD);
        __m256 b0 = _mm256_mul_ps(b, l0), b1 = _mm256_mul_ps(b, l1);
        __m256 e0 = _mm256_fmadd_ps(a, l0, b0), e1 = _mm256_fmadd_ps(a, l1, b0);
        __m256 e2 = _mm256_fmadd_ps(a, l0, b1), e3 = _mm256_fmadd_ps(a, l1, b1);
        __m256 u0 = _mm256_unpacklo_ps(e0, e1), u1 = _mm256_unpackhi_ps(e0, e1);
        __m256 u2 = _mm256_unpacklo_ps(e2, e3), u3 = _mm256_unpackhi_ps(e2, e3);
        __m256 r0 = _mm256_shuffle_ps(u0, u2, 0x44), r1 = _mm256_shuffle_ps(u0, u2, 0xEE); /* pairs 0, 2 | 1, 3 */
        __m256 r2 = _mm256_shuffle_ps(u1, u3, 0x44), r3 = _mm256_shuffle_ps(u1, u3, 0xEE); /* pairs 4, 6 | 5, 7 */
        float *o = pt + 2 * t;
        _mm256_storeu_ps(o, _mm256_permute2f128_ps(r0, r1, 0x20));
        _mm256_storeu_ps(o + 8, _mm256_permute2f128_ps(r0, r1, 0x31));
        _mm256_storeu_ps(o + 16, _mm256_permute2f128_ps(r2, r3, 0x20));
        _mm256_storeu_ps(o + 24, _mm256_permute2f128_ps(r2, r3, 0x31));
    }
    return t;
}

static NOINLINE void accum_b1(const vq_code_part *parts, int nparts, const float *tabs, const int *kind,
                              const uint8_t *codes, size_t cb, const uint16_t *norms, int n, const float *w, int ld,
                              int rows, float *acc, int d) {
    (void)nparts, (void)tabs, (void)kind;
    const vq_code_part *p = &parts[0];
    const __m128 lt = _mm_setr_ps(p->table[0], p->table[1], p->table[0], p->table[1]);
    const __m128 lu = _mm_setr_ps(p->table[0], p->table[0], p->table[1], p->table[1]);
    int len = p->n / 8;
    float pt[4 * 2 * TOKENS], nrm[TOKENS];
    uint16_t pw[TOKENS / 2 * 128]; /* a part has at most 1024 channels: 128 bytes a token */
    for (int t0 = 0; t0 < n; t0 += TOKENS) {
        int cnt = n - t0 < TOKENS ? n - t0 : TOKENS, pairs = (cnt + 1) / 2;
        const uint8_t *ct = codes + (size_t)t0 * cb + p->off;
        int t = 0;
        for (; t + 8 <= cnt; t += 8)
            _mm256_storeu_ps(nrm + t, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(norms + t0 + t))));
        for (; t < cnt; t++) nrm[t] = _cvtsh_ss(norms[t0 + t]);
        for (int q = 0; q < pairs; q++)
            pair_bits(ct + (size_t)2 * q * cb, 2 * q + 1 < cnt ? ct + (size_t)(2 * q + 1) * cb : NULL, len,
                      pw + (size_t)q * len);
        for (int r = 0; r < rows;) {
            int R = rows - r >= 4 ? 4 : rows - r >= 2 ? 2 : 1;
            for (int i = 0; i < R; i++) {
                const float *wr = w + (size_t)(r + i) * ld + t0;
                for (int j = vq_pair_tables8_avx2(wr, nrm, cnt, p->table, pt + i * 2 * TOKENS); j < cnt; j += 2) {
                    float a = wr[j] * nrm[j], b = j + 1 < cnt ? wr[j + 1] * nrm[j + 1] : 0.0f;
                    _mm_storeu_ps(pt + i * 2 * TOKENS + 2 * j,
                                  _mm_fmadd_ps(_mm_set1_ps(a), lt, _mm_mul_ps(_mm_set1_ps(b), lu)));
                }
            }
            float *ar = acc + (size_t)r * d;
            if (R == 4) accum_pairs_rows(pw, len, pairs, pt, 4, ar, d);
            else if (R == 2) accum_pairs_rows(pw, len, pairs, pt, 2, ar, d);
            else accum_pairs_rows(pw, len, pairs, pt, 1, ar, d);
            r += R;
        }
    }
}
static NOINLINE void accum_b2(const vq_code_part *parts, int nparts, const float *tabs, const int *kind,
                              const uint8_t *codes, size_t cb, const uint16_t *norms, int n, const float *w, int ld,
                              int rows, float *acc, int d) {
    accum_all(parts, nparts, tabs, kind, codes, cb, norms, n, w, ld, rows, acc, d, 2, PLAIN);
}
static NOINLINE void accum_b4_pre(const vq_code_part *parts, int nparts, const float *tabs, const int *kind,
                                  const uint8_t *codes, size_t cb, const uint16_t *norms, int n, const float *w, int ld,
                                  int rows, float *acc, int d) {
    accum_all(parts, nparts, tabs, kind, codes, cb, norms, n, w, ld, rows, acc, d, 4, FOLDED_PRE);
}
static NOINLINE void accum_b4_halves(const vq_code_part *parts, int nparts, const float *tabs, const int *kind,
                                     const uint8_t *codes, size_t cb, const uint16_t *norms, int n, const float *w,
                                     int ld, int rows, float *acc, int d) {
    accum_all(parts, nparts, tabs, kind, codes, cb, norms, n, w, ld, rows, acc, d, 4, HALVES);
}

static NOINLINE void accum_b3x(const vq_code_part *parts, int nparts, const float *tabs, const int *kind,
                               const uint8_t *codes, size_t cb, const uint16_t *norms, int n, const float *w, int ld,
                               int rows, float *acc, int d) {
    accum_all(parts, nparts, tabs, kind, codes, cb, norms, n, w, ld, rows, acc, d, 3, ACROSS);
}

static NOINLINE void accum_anyx(const vq_code_part *parts, int nparts, const float *tabs, const int *kind,
                                const uint8_t *codes, size_t cb, const uint16_t *norms, int n, const float *w, int ld,
                                int rows, float *acc, int d) {
    accum_all(parts, nparts, tabs, kind, codes, cb, norms, n, w, ld, rows, acc, d, 0, ACROSS);
}

static accum_fn *accum_pick(const vq_code_part *parts, int nparts, const int *kind) {
    if (nparts != 1) return any_across(nparts, kind) ? accum_anyx : accum_any;
    switch (parts[0].bits) {
    case 1: return accum_b1;
    case 2: return kind[0] == ACROSS ? accum_anyx : accum_b2;
    case 3: return kind[0] == ACROSS ? accum_b3x : accum_any; /* PLAIN: as in score_pick */
    default: return kind[0] == FOLDED_PRE ? accum_b4_pre : kind[0] == HALVES ? accum_b4_halves : accum_any;
    }
}

/* As score_prefolded. */
static NOINLINE void accum_prefolded(accum_fn *fn, const vq_code_part *parts, const float *tabs, const int *kind,
                                     const uint8_t *codes, size_t cb, const uint16_t *norms, int n, const float *w,
                                     int ld, int rows, float *acc, int d) {
    uint8_t folded[FOLD_BYTES];
    int step = (int)(FOLD_BYTES / cb);
    for (int t0 = 0; t0 < n; t0 += step) {
        int m = n - t0 < step ? n - t0 : step;
        fold_codes(codes + (size_t)t0 * cb, (size_t)m * cb, folded);
        fn(parts, 1, tabs, kind, folded, cb, norms + t0, m, w + t0, ld, rows, acc, d);
    }
}

bool vq_codes_accum_avx2(const vq_code_part *parts, int nparts, const uint8_t *codes, size_t cb,
                         const uint16_t *norms, int n, const float *w, int ld, int rows, float *acc, int d) {
    float tabs[2 * 16];
    int kind[2];
    bool pre;
    if (!prepare_parts(parts, nparts, cb, kind, tabs, &pre)) return false;
    accum_fn *fn = accum_pick(parts, nparts, kind);
    if (pre) accum_prefolded(fn, parts, tabs, kind, codes, cb, norms, n, w, ld, rows, acc, d);
    else fn(parts, nparts, tabs, kind, codes, cb, norms, n, w, ld, rows, acc, d);
    return true;
}
