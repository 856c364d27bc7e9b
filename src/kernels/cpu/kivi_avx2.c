/* AVX2 kernels for KIVI scoring and value accumulation, straight from the
 * packed codes (see DESIGN.md, "Kernel math"). Nothing dequantized is
 * written; the per-call tables (q', int16 weights, (scale, zero) floats of
 * one chunk) live in the scratch.
 *
 *  keys:   per token group, q'_d = q_d * scale_d in float and the constant
 *          sum_d q_d * zero_d per row; per token, 8 codes at a time become
 *          floats (shift, mask, convert) and meet q' in FMAs. Two tokens and
 *          4 rows per step: each q' load feeds two FMAs, each converted code
 *          vector four.
 *  values: per chunk of up to CHUNK tokens, w_t * scale_tg rounded to int16
 *          with one scale per row (the chunk's maximum -> 32767); the codes
 *          of two tokens are interleaved as 16-bit pairs so one
 *          _mm256_madd_epi16 adds w_t c_t + w_t+1 c_t+1 for 8 channels;
 *          sum_t w_t zero_tg is added in float once per call.
 *
 * Why float keys. The key term and the zero term nearly cancel (the zero is
 * the group minimum), so the attention output is far more sensitive to
 * rounding than the operands suggest: q' in int16 (one scale per row) gave
 * 1.2e-4 relative error on the test's attention output (limit 1e-4). Two
 * exact-enough int16 variants measured slower than the FMAs: a second int16
 * "lo" term (two madds per 16 channels), and int16 for all channels but the
 * 4 largest |q'| (keys have outlier channels), those added in float.
 * Without VNNI a madd needs a separate add, so int16 saves no instructions
 * over FMA; on the value side it saves code conversion (16 channels of two
 * tokens per unpack) and FMA port pressure. Values in int16 measure 4.9e-5
 * on the same test (the rounding's common mode, cmax/2 * sum of the weight
 * errors, is known exactly and taken back in float).
 *
 * Codes come from the "plane" layout (pack.h): one plane byte holds the
 * same slot of 8/b channels, stride bytes apart, so a shift and a mask of a
 * run of bytes gives a run of consecutive channels. 3-bit codes are a 2-bit
 * plane set plus a 1-bit plane set counting 4 times; the kernels join a
 * run's two parts into c2 + 4 c1 before converting or multiplying.
 * Rows go 4 at a time (the q heads of a GQA group share every code load),
 * then 2, then 1 (MHA models: one row per kv head). At CPU level avx512
 * the key row groups run kivi_avx512.c's bodies where the shape allows,
 * called from the driver here; values with AVX512_VNNI go to its own
 * driver (vq_kivi_accum_avx512) where the shape allows. A single value row
 * takes every slot of a 16-byte run at once (accum_run16_row); 2 and 4
 * rows take one slot of 16 channels for all rows (accum_slot16).
 */
#include "reduce_avx2.h"
#include "vq_internal.h"

#include <immintrin.h>
#include <string.h>

/* Tokens per value chunk: the int32 sums stay below 32 * 32767 * 255 < 2^31,
 * and a smaller chunk's maximum is closer to its other weights (32 tokens:
 * 4.8e-5 error on the test, 64: 6.4e-5). */
#define CHUNK 32

/* The AVX-512 bodies of the row groups (kivi_avx512.c), run at CPU level
 * avx512 (values: with AVX512_VNNI); false when the shape is not theirs. */
bool vq_kivi_score_rows_avx512(const float *q, int R, int d, int G, int bits, const uint8_t *blk, int block_tokens,
                               int t0, int n, float *logits, int ld, float *scratch);
bool vq_kivi_accum_avx512(const vq_mparams *p, const float *w, int ld, int rows, const uint8_t *blk,
                          int block_tokens, int t0, int n, float *acc, float *scratch);
size_t vq_kivi_scratch_avx512(int ng);

#if defined(__GNUC__)
#define ALWAYS_INLINE inline __attribute__((always_inline))
#else
#define ALWAYS_INLINE inline
#endif

static inline float hmax8(__m256 v) {
    __m128 m = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    m = _mm_max_ps(m, _mm_movehl_ps(m, m));
    m = _mm_max_ss(m, _mm_movehdup_ps(m));
    return _mm_cvtss_f32(m);
}

static inline float hsum8(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

/* 2^e for a small e, as 8 floats: the exponent field written directly. */
static inline __m256 pow2(int e) { return _mm256_castsi256_ps(_mm256_set1_epi32((127 + e) << 23)); }

/* Code bytes per token, and whether the plane strides (d * b / 8 bytes; for
 * 3 bits d/4 and d/8) are whole units of `unit` bytes (keys read 8 bytes at
 * a time, values 16, or 8 for 2-, 4- and 8-bit planes). */
static size_t code_bytes(int bits, int d) { return (size_t)d * (size_t)bits / 8; }

static bool planes_ok(int bits, int d, int unit) {
    if (bits == 3) return (d / 4) % unit == 0 && (d / 8) % unit == 0;
    return code_bytes(bits, d) % (size_t)unit == 0;
}

/* 3-bit codes whose 1-bit plane slots (s1 = d / 8 bytes) are not whole runs
 * of 8 bytes: d = 96 (s1 = 12), d = 80 (s1 = 10, and 2-bit slots of 20
 * bytes, which end in a run of 4). The kernels then take 8-byte runs with
 * high_bytes8 in instances of their own (`across`), so those for whole
 * runs keep their code. d a multiple of 16 (s1 even). */
static bool b3_across(int d) { return d % 16 == 0 && !planes_ok(3, d, 8); }

/* The values' 3-bit rule: their whole runs are 16 bytes, so the across
 * instances take every shape whose 1-bit planes are not whole runs of 16:
 * d = 96 (s1 = 12), d = 64 (8), d = 80 (10), d = 192 (24). */
static bool b3_across_v(int d) { return d % 16 == 0 && !planes_ok(3, d, 16); }

/* The 1-bit plane bytes c1 of the 8 channels of 2-bit plane run u (across
 * instances): byte i is (u + i) mod s1, and the channels of a 2-bit slot's
 * second half (u + i >= s1), whose high bit sits one 1-bit slot higher, get
 * their byte shifted right by one bit, so every channel of 2-bit slot j
 * finds its bit at 2 j. A run that straddles s1 takes its first k = s1 - u
 * bytes from the end of the plane and the rest from its start (both read
 * as 8 bytes: the bytes past them are the token's or the next token's
 * codes, or the block's metadata, and are masked or shifted out). A shift
 * of a whole word moves a bit across a byte edge only into bit 7, which no
 * slot reads. */
static ALWAYS_INLINE __m128i high_bytes8(const uint8_t *c1, int u, int s1) {
    if (u + 8 <= s1) return _mm_loadl_epi64((const __m128i *)(c1 + u));
    if (u >= s1) return _mm_srli_epi64(_mm_loadl_epi64((const __m128i *)(c1 + u - s1)), 1);
    uint64_t lo, hi;
    const int k = s1 - u; /* 1 .. 7 */
    memcpy(&lo, c1 + u, 8);
    memcpy(&hi, c1, 8);
    return _mm_cvtsi64_si128((long long)((lo & ((1ull << (8 * k)) - 1)) | (hi >> 1) << (8 * k)));
}

/* ------------------------------------------------------------------ keys */

/* How the key kernel walks a token's codes: b-bit slots of plane bytes
 * stride bytes apart. whole: it reads each code as c itself (3-bit codes,
 * the 2-bit slots with their high bit joined in by dot_b3), so q' carries
 * no power of two. */
typedef struct {
    int b, stride;
    bool whole;
} plane_set;

static plane_set key_planes(int bits, int d) {
    if (bits == 3) return (plane_set){2, d / 4, true};
    return (plane_set){bits, (int)code_bytes(bits, d), false};
}

/* Floats of q' for 4 rows (prep_keys here, steps of 8 bytes; kivi_avx512.c's,
 * steps of 16): a plane stride that ends in a shorter step is padded to a
 * whole one, so d = 80 at 2 bits takes 4 x 4 x 24 here, not 4 x 80. */
size_t vq_kivi_key_qs_floats(int bits, int d, int step) {
    plane_set ps = key_planes(bits, d);
    return 4 * (size_t)(8 / ps.b) * (size_t)((ps.stride + step - 1) / step * step);
}

/* For one token group's fp16 scale sc and zero zr and the R rows of q:
 * q' = q_r,ch * sc_ch * 2^(-b j), j the slot of channel ch (j taken as 0
 * for the top slot, which is shifted, and for whole codes), and
 * qz[r] = sum_ch q_r,ch * zr_ch (qz[R..3] = 0). Then q_r . k_t = the sum
 * over channels of q' * (c * 2^(b j)) + qz[r].
 *
 * Why the power of two. The kernel masks a slot's codes in place instead
 * of shifting them down, so it sees c * 2^(b j); q' carries the inverse.
 * Scaling by a power of two is exact, so every product and sum is the same
 * float as with q_r,ch * sc_ch and c: one instruction less per 8 codes.
 *
 * Layout: q' is stored in the order dot_plane and dot_b3 read it, 8
 * floats for each (8-byte step u, slot j, row r), so the kernel walks one
 * pointer; with a pointer per (slot, row) it ran out of registers. */
static ALWAYS_INLINE void prep_keys(const float *q, const int R, int d, plane_set ps, const uint16_t *sc,
                                    const uint16_t *zr, float *qs, float *qz) {
    __m256 z[4];
    for (int r = 0; r < R; r++) z[r] = _mm256_setzero_ps();
    for (int c = 0; c < d; c += 8) {
        __m256 zf = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(zr + c)));
        for (int r = 0; r < R; r++) z[r] = _mm256_fmadd_ps(_mm256_loadu_ps(q + (size_t)r * d + c), zf, z[r]);
    }
    /* in reading order: step u, slot j, row r; channel c = j * stride + u.
     * A plane stride of 4 mod 8 bytes (2-bit codes at d = 80: 20) ends in
     * a step of 4: its other 4 lanes read the next bytes (the next token's
     * codes, or the block's metadata after the last token) and get q' = 0,
     * so they add nothing; q and the scales are read under the mask. */
    int b = ps.b, slots = 8 / b;
    float *o = qs;
    for (int u = 0; u < ps.stride; u += 8) {
        const bool tail = u + 8 > ps.stride;
        const __m256i lanes = _mm256_cmpgt_epi32(_mm256_set1_epi32(ps.stride - u), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
        for (int j = 0; j < slots; j++) {
            int c = j * ps.stride + u;
            /* the top slot is shifted down, not masked: c itself */
            __m256 f = pow2(ps.whole || j == slots - 1 ? 0 : -b * j);
            __m128i sh = tail ? _mm_loadl_epi64((const __m128i *)(sc + c)) : _mm_loadu_si128((const __m128i *)(sc + c));
            __m256 sf = _mm256_mul_ps(_mm256_cvtph_ps(sh), f);
            for (int r = 0; r < R; r++, o += 8) {
                const float *qr = q + (size_t)r * d + c;
                __m256 qv = tail ? _mm256_maskload_ps(qr, lanes) : _mm256_loadu_ps(qr);
                _mm256_storeu_ps(o, _mm256_mul_ps(qv, sf));
            }
        }
    }
    for (int r = 0; r < 4; r++) qz[r] = r < R ? hsum8(z[r]) : 0.0f;
}

/* Adds one plane set of one token's codes c for R rows (4, 2 or 1, a
 * constant) into accumulators: acc[r + 4 (j & 1)] for 4 rows (8 FMA chains;
 * dot_pair has why two tokens do better), acc[r + 2 (j & 3)] for 2, acc[j & 3]
 * for one. Per 8
 * bytes, slot j holds channels j * stride + u .. +7, taken as c * 2^(bits j)
 * by a mask alone (q' carries 2^-(bits j), see prep_keys), the top slot as
 * c by a shift alone.
 *
 * One token at a time (single rows, and tokens outside whole runs of 8;
 * dot_pair takes two tokens for 4 rows).
 * q' comes straight from L1 as the FMAs' memory operand. */
static ALWAYS_INLINE void dot_plane(const float *qs, const uint8_t *c, int stride, const int bits, const int R,
                                    __m256 *acc) {
    const float *qp = qs;
    for (int u = 0; u < stride; u += 8) {
        __m256i x = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(c + u)));
        for (int j = 0; j < 8 / bits; j++) {
            __m256i ix;
            if (bits * (j + 1) < 8)
                ix = _mm256_and_si256(x, _mm256_set1_epi32(((1 << bits) - 1) << (bits * j)));
            else /* the top slot: the lanes are zero-extended bytes, a shift alone gives c */
                ix = _mm256_srli_epi32(x, 8 - bits);
            __m256 f = _mm256_cvtepi32_ps(ix);
            for (int r = 0; r < R; r++) {
                int i = R == 1 ? (j & 3) : R == 2 ? r + 2 * (j & 3) : r + 4 * (j & 1);
                acc[i] = _mm256_fmadd_ps(_mm256_loadu_ps(qp + 8 * r), f, acc[i]);
            }
            qp += 8 * R;
        }
    }
}

/* dot_plane for 3-bit codes: per 8 channels, the 2-bit part (slot j of
 * the 2-bit plane bytes) and the high bit (slot 2 j + u / s1 of the 1-bit
 * plane bytes u mod s1, the same channels) joined into c2 + 4 c1 before
 * one conversion and one FMA per row. One pass per plane set did every
 * conversion and FMA twice. */
static ALWAYS_INLINE __m128i high_bytes8(const uint8_t *c1, int u, int s1);

static ALWAYS_INLINE void dot_b3(const float *qs, const uint8_t *c, int d, const int R, const bool across,
                                 __m256 *acc) {
    const int s2 = d / 4, s1 = d / 8;
    const __m256i three = _mm256_set1_epi32(3), four = _mm256_set1_epi32(4);
    const float *qp = qs;
    for (int u = 0; u < s2; u += 8) {
        __m256i x = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(c + u)));
        __m128i hb = across ? high_bytes8(c + s2, u, s1) : _mm_loadl_epi64((const __m128i *)(c + s2 + u % s1));
        __m256i y = _mm256_slli_epi32(_mm256_cvtepu8_epi32(hb), 2);
        int k0 = across ? 0 : u / s1; /* the 1-bit slot of j = 0 */
        for (int j = 0; j < 4; j++) {
            __m256i c2 = _mm256_and_si256(_mm256_srli_epi32(x, 2 * j), three);
            __m256i c1 = _mm256_and_si256(_mm256_srli_epi32(y, 2 * j + k0), four);
            __m256 f = _mm256_cvtepi32_ps(_mm256_add_epi32(c2, c1));
            for (int r = 0; r < R; r++) {
                int i = R == 1 ? (j & 3) : R == 2 ? r + 2 * (j & 3) : r + 4 * (j & 1);
                acc[i] = _mm256_fmadd_ps(_mm256_loadu_ps(qp + 8 * r), f, acc[i]);
            }
            qp += 8 * R;
        }
    }
}

/* dot_plane for two tokens (codes c and c + cb) and 4 rows, one
 * accumulator per (token, row): each q' load feeds two FMAs. One token at
 * a time, its 64 FMAs (2-bit, d = 128) run in 8 chains of 8, which at 4
 * cycles of FMA latency is the whole peak rate only if the next token's
 * chains start before these end; the loop ran at about one FMA a cycle.
 * Two tokens give 8 chains of 16 with fewer instructions between them
 * (no per-token merge of even and odd slots): 14 % less key time in cache
 * (2-bit). Three tokens (12 chains) ran out of registers and spilled. */
static ALWAYS_INLINE void dot_pair(const float *qs, const uint8_t *c, size_t cb, int stride, const int bits,
                                   __m256 acc[2][4]) {
    const float *qp = qs;
    for (int k = 0; k < 2; k++)
        for (int r = 0; r < 4; r++) acc[k][r] = _mm256_setzero_ps();
    for (int u = 0; u < stride; u += 8) {
        __m256i x[2];
        for (int k = 0; k < 2; k++) x[k] = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(c + k * cb + u)));
        for (int j = 0; j < 8 / bits; j++, qp += 32)
            for (int k = 0; k < 2; k++) {
                __m256i ix;
                if (bits * (j + 1) < 8)
                    ix = _mm256_and_si256(x[k], _mm256_set1_epi32(((1 << bits) - 1) << (bits * j)));
                else /* the top slot: the lanes are zero-extended bytes, a shift alone gives c */
                    ix = _mm256_srli_epi32(x[k], 8 - bits);
                __m256 f = _mm256_cvtepi32_ps(ix);
                for (int r = 0; r < 4; r++) acc[k][r] = _mm256_fmadd_ps(_mm256_loadu_ps(qp + 8 * r), f, acc[k][r]);
            }
    }
}

/* dot_b3 for two tokens and 4 rows (as dot_pair: one accumulator per
 * (token, row), each q' load feeding two FMAs). */
static ALWAYS_INLINE void dot_b3_pair(const float *qs, const uint8_t *c, size_t cb, int d, const bool across,
                                      __m256 acc[2][4]) {
    const int s2 = d / 4, s1 = d / 8;
    const float *qp = qs;
    for (int k = 0; k < 2; k++)
        for (int r = 0; r < 4; r++) acc[k][r] = _mm256_setzero_ps();
    for (int u = 0; u < s2; u += 8) {
        __m256i x[2], y[2];
        for (int k = 0; k < 2; k++) {
            const uint8_t *ck = c + k * cb;
            x[k] = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(ck + u)));
            __m128i hb = across ? high_bytes8(ck + s2, u, s1) : _mm_loadl_epi64((const __m128i *)(ck + s2 + u % s1));
            y[k] = _mm256_slli_epi32(_mm256_cvtepu8_epi32(hb), 2);
        }
        int k0 = across ? 0 : u / s1; /* the 1-bit slot of j = 0 */
        for (int j = 0; j < 4; j++, qp += 32)
            for (int k = 0; k < 2; k++) {
                __m256i c2 = _mm256_and_si256(_mm256_srli_epi32(x[k], 2 * j), _mm256_set1_epi32(3));
                __m256i c1 = _mm256_and_si256(_mm256_srli_epi32(y[k], 2 * j + k0), _mm256_set1_epi32(4));
                __m256 f = _mm256_cvtepi32_ps(_mm256_add_epi32(c2, c1));
                for (int r = 0; r < 4; r++) acc[k][r] = _mm256_fmadd_ps(_mm256_loadu_ps(qp + 8 * r), f, acc[k][r]);
            }
    }
}

/* One token's per-lane partial dot products: v[r] for 4 or 2 rows (8 lanes
 * each, summed later), or for one row spread over v[0..3]. */
static ALWAYS_INLINE void dot_token(const float *qs, const uint8_t *ct, int d, const int bits, const int R,
                                    const bool across, __m256 v[4]) {
    __m256 acc[8];
    for (int i = 0; i < 8; i++) acc[i] = _mm256_setzero_ps();
    if (bits == 3) {
        dot_b3(qs, ct, d, R, across, acc);
    } else {
        dot_plane(qs, ct, (int)code_bytes(bits, d), bits, R, acc);
    }
    for (int i = 0; i < 4; i++) v[i] = _mm256_add_ps(acc[i], acc[4 + i]);
    if (R == 2) /* rows 0, 1 in v[0], v[1]; their other slots in v[2], v[3] */
        for (int r = 0; r < 2; r++) v[r] = _mm256_add_ps(v[r], v[r + 2]);
}

/* Scores tokens [t0, t0 + n) for R rows (4, 2 or 1); bits and R are constants
 * in each caller, so the unpacking uses immediate masks and the
 * accumulators stay in registers. */
static ALWAYS_INLINE void score_rows(const float *q, const int R, int d, int G, const int bits, const bool across,
                                     const uint8_t *blk, int block_tokens, int t0, int n, float *logits, int ld,
                                     float *scratch) {
    size_t cb = code_bytes(bits, d);
    const uint16_t *meta = (const uint16_t *)(blk + (size_t)block_tokens * cb);
    plane_set ps = key_planes(bits, d);
    float *qs = scratch, *qz = scratch + vq_kivi_key_qs_floats(bits, d, 8); /* q' (4 rows), [4] */
    for (int t = t0; t < t0 + n;) {
        int g = t / G, end = (g + 1) * G < t0 + n ? (g + 1) * G : t0 + n;
        const uint16_t *sc = meta + (size_t)g * 2 * d;
        prep_keys(q, R, d, ps, sc, sc + d, qs, qz);
        __m128 vz = _mm_loadu_ps(qz);
        /* 8 tokens' per-lane partials are kept and summed by one
         * transposing hadd tree per row, 8 logits per store (instead of a
         * tree, an extract and four scalar stores per token: about 1 ns
         * per token and kv head less in cache; a single row saves its
         * per-token horizontal sum) */
        for (; t + 8 <= end; t += 8) {
            __m256 part[4][8]; /* [row][token] */
            for (int k = 0; R <= 2 && k < 8; k++) {
                __m256 v[4];
                dot_token(qs, blk + (size_t)(t + k) * cb, d, bits, R, across, v);
                if (R == 1) {
                    part[0][k] = _mm256_add_ps(_mm256_add_ps(v[0], v[1]), _mm256_add_ps(v[2], v[3]));
                } else {
                    part[0][k] = v[0];
                    part[1][k] = v[1];
                }
            }
            for (int k = 0; R == 4 && k < 8; k += 2) {
                __m256 acc[2][4];
                const uint8_t *ct = blk + (size_t)(t + k) * cb;
                if (bits == 3)
                    dot_b3_pair(qs, ct, cb, d, across, acc);
                else
                    dot_pair(qs, ct, cb, (int)cb, bits, acc);
                for (int r = 0; r < 4; r++) {
                    part[r][k] = acc[0][r];
                    part[r][k + 1] = acc[1][r];
                }
            }
            for (int r = 0; r < R; r++) {
                __m256 sum = vq_sum8x8(part[r]);
                _mm256_storeu_ps(logits + (size_t)r * ld + (t - t0), _mm256_add_ps(sum, _mm256_set1_ps(qz[r])));
            }
        }
        for (; t < end; t++) {
            __m256 v[4];
            dot_token(qs, blk + (size_t)t * cb, d, bits, R, across, v);
            float *l = logits + (t - t0);
            if (R == 1) {
                l[0] = hsum8(_mm256_add_ps(_mm256_add_ps(v[0], v[1]), _mm256_add_ps(v[2], v[3]))) + qz[0];
            } else if (R == 2) {
                l[0] = hsum8(v[0]) + qz[0];
                l[ld] = hsum8(v[1]) + qz[1];
            } else {
                /* {r0, r1, r2, r3 | r0, r1, r2, r3} partial sums, then the halves */
                __m256 h = _mm256_hadd_ps(_mm256_hadd_ps(v[0], v[1]), _mm256_hadd_ps(v[2], v[3]));
                __m128 s = _mm_add_ps(_mm_add_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps(h, 1)), vz);
                _mm_store_ss(l, s);
                _mm_store_ss(l + ld, _mm_movehdup_ps(s));
                _mm_store_ss(l + 2 * (size_t)ld, _mm_movehl_ps(s, s));
                _mm_store_ss(l + 3 * (size_t)ld, _mm_shuffle_ps(s, s, 3));
            }
        }
        t = end;
    }
}

/* score_rows with the bits a constant in each instance (immediate shifts
 * and masks); R is a constant at every call site. */
static ALWAYS_INLINE void score_rows_bits(const float *q, const int R, int d, int G, int bits, const uint8_t *blk,
                                          int block_tokens, int t0, int n, float *logits, int ld, float *scratch) {
    switch (bits) {
    case 2: score_rows(q, R, d, G, 2, false, blk, block_tokens, t0, n, logits, ld, scratch); break;
    case 3:
        if (b3_across(d)) score_rows(q, R, d, G, 3, true, blk, block_tokens, t0, n, logits, ld, scratch);
        else score_rows(q, R, d, G, 3, false, blk, block_tokens, t0, n, logits, ld, scratch);
        break;
    case 4: score_rows(q, R, d, G, 4, false, blk, block_tokens, t0, n, logits, ld, scratch); break;
    default: score_rows(q, R, d, G, 8, false, blk, block_tokens, t0, n, logits, ld, scratch); break;
    }
}

bool vq_kivi_score_avx2(const vq_mparams *p, const float *q, int rows, const uint8_t *blk,
                        int block_tokens, int t0, int n, float *logits, int ld, float *scratch) {
    int d = p->head_dim, bits = p->bits, G = p->group;
    /* 2-, 4- and 8-bit planes of whole 8-byte steps or ending in a step of
     * 4 (see prep_keys); 3-bit codes in steps of 8 */
    if (bits == 3 ? !planes_ok(3, d, 8) && !b3_across(d) : !planes_ok(bits, d, 4)) return false;
    const bool wide = vq_cpu_has_avx512(); /* row groups by kivi_avx512.c */
    /* 4 rows at a time, then 2, then 1: the rows of one call share every
     * code load and conversion */
    for (int r0 = 0; r0 < rows;) {
        int R = rows - r0 >= 4 ? 4 : rows - r0 >= 2 ? 2 : 1;
        const float *qr = q + (size_t)r0 * d;
        float *lr = logits + (size_t)r0 * ld;
        if (wide && vq_kivi_score_rows_avx512(qr, R, d, G, bits, blk, block_tokens, t0, n, lr, ld, scratch)) {
            /* the AVX-512 body took the group */
        } else if (R == 4) {
            score_rows_bits(qr, 4, d, G, bits, blk, block_tokens, t0, n, lr, ld, scratch);
        } else if (R == 2) {
            score_rows_bits(qr, 2, d, G, bits, blk, block_tokens, t0, n, lr, ld, scratch);
        } else {
            score_rows_bits(qr, 1, d, G, bits, blk, block_tokens, t0, n, lr, ld, scratch);
        }
        r0 += R;
    }
    return true;
}

/* ---------------------------------------------------------------- values */

/* For R rows (wr[r]) and one chunk (CHUNK tokens, zero weights past its
 * end), with sT/zT[g][t] the chunk's scales and zeros and W_tg = w_t *
 * sT[g][t]: row r's wp[r * CHUNK / 2 + g * gstride + pair] = (w16_t,
 * w16_t+1), w16 = rint(W * 32767 / max W), the max over the chunk's tokens
 * and groups, and zv[r * ng + g] (8 lanes, summed at the end of the call)
 * += w_t zT[g][t] - cmax/2 * deq * (w16_t - W_t * 32767 / max W) where
 * deq[r] = max W / 32767.
 * smax[t] = max over groups of sT[g][t], shared by the rows: weights and
 * scales are >= 0, so max W = max over t of w_t * smax[t] (the same float:
 * rounding is monotonic), one product per token instead of one per group.
 * W * 32767 / max W is formed as (w_t * 32767 / max W) * sT, the first
 * factor once per token for all groups.
 *
 * The codes are used as they are (no centering), and the rounding error
 * sum_t e_t c_t = sum_t e_t (c_t - cmax/2) + cmax/2 sum_t e_t has its
 * second, largest part known exactly here: it is taken back in float. */
static void prep_weights(const float *const *wr, const int R, const float *sT, const float *smax, const float *zT,
                         int ng, int cmax, int32_t *wp, size_t gstride, __m256 *zv, float *deq) {
    /* The rows' maxima by one transposing tree (lane r of each 128-bit half
     * ends up holding row r's), then one division for all rows' steps and
     * one for their inverses: a horizontal maximum and two scalar
     * divisions a row, one row after the other, made a chain of dependent
     * steps in front of the chunk's sums (kivi_avx512.c's chunk_weights has
     * the measurements). */
    __m256 mx[4];
    for (int r = 0; r < 4; r++) mx[r] = _mm256_setzero_ps();
    for (int r = 0; r < R; r++)
        for (int t = 0; t < CHUNK; t += 8)
            mx[r] = _mm256_max_ps(mx[r], _mm256_mul_ps(_mm256_loadu_ps(wr[r] + t), _mm256_loadu_ps(smax + t)));
    __m256 x01 = _mm256_max_ps(_mm256_unpacklo_ps(mx[0], mx[1]), _mm256_unpackhi_ps(mx[0], mx[1])); /* r0 r1 r0 r1 */
    __m256 x23 = _mm256_max_ps(_mm256_unpacklo_ps(mx[2], mx[3]), _mm256_unpackhi_ps(mx[2], mx[3])); /* r2 r3 r2 r3 */
    __m256 y = _mm256_max_ps(_mm256_shuffle_ps(x01, x23, 0x44), _mm256_shuffle_ps(x01, x23, 0xEE)); /* r0 r1 r2 r3 */
    const __m128 m = _mm_max_ps(_mm256_castps256_ps128(y), _mm256_extractf128_ps(y, 1)), c = _mm_set1_ps(32767.0f);
    const __m128 dq = _mm_div_ps(m, c);
    /* A chunk whose largest weight is below 1e-30 (a sharp softmax: its
     * tokens sit 69+ nats under the running maximum, whose own weight is
     * 1) adds nothing an fp32 output can hold. 32767 / m overflows to inf
     * below 32767 / FLT_MAX ~ 1e-34 and turns zero weights into NaN
     * (0 * inf), so such a chunk gets zero int16 weights. */
    float inv4[4], corr4[4];
    _mm_storeu_ps(inv4, _mm_and_ps(_mm_div_ps(c, m), _mm_cmpgt_ps(m, _mm_set1_ps(1e-30f))));
    _mm_storeu_ps(corr4, _mm_mul_ps(dq, _mm_set1_ps(-0.5f * (float)cmax)));
    _mm_storeu_ps(deq, dq);
    for (int r = 0; r < R; r++) {
        const __m256 inv = _mm256_set1_ps(inv4[r]), corr = _mm256_set1_ps(corr4[r]);
        __m256 wi[CHUNK / 8];
        for (int i = 0; i < CHUNK / 8; i++) wi[i] = _mm256_mul_ps(_mm256_loadu_ps(wr[r] + 8 * i), inv);
        for (int g = 0; g < ng; g++) {
            __m256 err = _mm256_setzero_ps(), zw = zv[r * ng + g]; /* sum_t (w16_t - W_t * inv), sum_t w_t zT */
            for (int t = 0; t < CHUNK; t += 16) {
                __m256 w0 = _mm256_loadu_ps(wr[r] + t), w1 = _mm256_loadu_ps(wr[r] + t + 8);
                __m256 x0 = _mm256_mul_ps(wi[t / 8], _mm256_loadu_ps(sT + g * CHUNK + t));
                __m256 x1 = _mm256_mul_ps(wi[t / 8 + 1], _mm256_loadu_ps(sT + g * CHUNK + t + 8));
                __m256i i0 = _mm256_cvtps_epi32(x0), i1 = _mm256_cvtps_epi32(x1);
                err = _mm256_add_ps(err, _mm256_add_ps(_mm256_sub_ps(_mm256_cvtepi32_ps(i0), x0),
                                                       _mm256_sub_ps(_mm256_cvtepi32_ps(i1), x1)));
                zw = _mm256_fmadd_ps(w0, _mm256_loadu_ps(zT + g * CHUNK + t), zw);
                zw = _mm256_fmadd_ps(w1, _mm256_loadu_ps(zT + g * CHUNK + t + 8), zw);
                /* 16 int16 in token order (packs works per 128-bit lane) = 8 pairs */
                __m256i p = _mm256_permute4x64_epi64(_mm256_packs_epi32(i0, i1), 0xD8);
                _mm256_storeu_si256((__m256i *)(wp + r * (CHUNK / 2) + g * gstride + t / 2), p);
            }
            zv[r * ng + g] = _mm256_fmadd_ps(err, corr, zw);
        }
    }
}

/* a + the madd of x and w, in int32 lanes. The value kernels' int32
 * accumulators are __v8si (GCC's and clang's vector type of the AVX
 * headers), not __m256i: _mm256_add_epi32 adds in __v8si and returns
 * __m256i, whose lanes are 64-bit to GCC, and GCC 12 did not keep a
 * loop-carried __m256i in one register across that change of type. Each
 * accumulator then cost a register move every pair and one lived on the
 * stack: 46 instructions per token pair of the 4-row step where the work
 * is 29 (2-bit). */
static ALWAYS_INLINE __v8si madd_acc(__v8si a, __m256i x, __m256i w) { return a + (__v8si)_mm256_madd_epi16(x, w); }

/* The madds of one token pair for R rows (4, 2 or 1) into the 16-channel
 * accumulators of accum_slot16 (lo, hi: the pair's codes as 16-bit lanes;
 * wg: the rows' paired int16 weights, CHUNK / 2 apart). */
static ALWAYS_INLINE void madd_rows16(__m256i lo, __m256i hi, const int32_t *wg, const int R, __v8si a[8]) {
    for (int r = 0; r < R; r++) {
        __m256i w = _mm256_set1_epi32(wg[r * (CHUNK / 2)]);
        a[2 * r] = madd_acc(a[2 * r], lo, w);
        a[2 * r + 1] = madd_acc(a[2 * r + 1], hi, w);
    }
}

/* acc rows (d apart) += the 16-channel int sums a times deq[r] * fs. */
static ALWAYS_INLINE void add_rows16(const __v8si a[8], const float *deq, float fs, const int R, float *acc,
                                      int d) {
    for (int r = 0; r < R; r++) {
        float *o = acc + (size_t)r * d;
        __m256 f = _mm256_set1_ps(deq[r] * fs);
        _mm256_storeu_ps(o, _mm256_fmadd_ps(_mm256_cvtepi32_ps((__m256i)a[2 * r]), f, _mm256_loadu_ps(o)));
        _mm256_storeu_ps(o + 8, _mm256_fmadd_ps(_mm256_cvtepi32_ps((__m256i)a[2 * r + 1]), f, _mm256_loadu_ps(o + 8)));
    }
}

/* Slot j of b-bit codes in 16-bit lanes x, taken with one instruction:
 * the top slot shifted down (c itself), a lower one masked in place
 * (c * 2^(bits j), at most 255: fits the madd operand; slot_scale gives
 * the float factor that takes the power back). 8-bit codes need neither. */
static ALWAYS_INLINE __m256i take_slot(__m256i x, const int bits, const int j) {
    if (bits == 8) return x;
    if (j == 8 / bits - 1) return _mm256_srli_epi16(x, bits * j);
    return _mm256_and_si256(x, _mm256_set1_epi16((short)(((1 << bits) - 1) << (bits * j))));
}

static ALWAYS_INLINE float slot_scale(const int bits, const int j) {
    return bits == 8 || j == 8 / bits - 1 ? 1.0f : 1.0f / (float)(1 << (bits * j));
}

/* One token pair's 16 bytes of plane codes (xa, xb) as two vectors of 8
 * int16 pairs (c_t, c_t+1) each. */
static ALWAYS_INLINE void widen_pairs16(__m128i xa, __m128i xb, __m256i *lo, __m256i *hi) {
    *lo = _mm256_cvtepu8_epi16(_mm_unpacklo_epi8(xa, xb));
    *hi = _mm256_cvtepu8_epi16(_mm_unpackhi_epi8(xa, xb));
}

/* R rows (4, 2 or 1) of one slot j of 16 channels (one group: runs of 16 start at
 * multiples of 16 and groups are at least 32 wide): one 16-byte load per
 * token serves two vectors of 8 channel pairs, and each weight broadcast
 * two madds. The loop takes whole pairs only (an odd last token comes
 * after it, not as a choice of partner in every pair), and slot j costs
 * one shift or mask instead of two shifts (see take_slot): 29 to 31
 * instructions per pair, 8 madds and 8 adds of them. Sums of masked codes
 * may pass 2^24 and round once in the int to float conversion (2^-24
 * relative, far below the int16 weights' rounding). */
static ALWAYS_INLINE void accum_slot16(const uint8_t *codes, size_t cb, int cn, const int32_t *wg, const int bits,
                                       const int j, const float *deq, const int R, float *acc, int d) {
    __v8si a[8];
    __m256i lo, hi;
    for (int i = 0; i < 8; i++) a[i] = (__v8si)_mm256_setzero_si256();
    const uint8_t *ca = codes;
    const int32_t *wt = wg;
    const uint8_t *end = codes + (size_t)(cn & ~1) * cb;
    for (; ca != end; ca += 2 * cb, wt++) {
        widen_pairs16(_mm_loadu_si128((const __m128i *)ca), _mm_loadu_si128((const __m128i *)(ca + cb)), &lo, &hi);
        madd_rows16(take_slot(lo, bits, j), take_slot(hi, bits, j), wt, R, a);
    }
    if (cn & 1) {
        /* paired with itself: its partner's weight is 0 */
        __m128i x = _mm_loadu_si128((const __m128i *)ca);
        widen_pairs16(x, x, &lo, &hi);
        madd_rows16(take_slot(lo, bits, j), take_slot(hi, bits, j), wt, R, a);
    }
    add_rows16(a, deq, slot_scale(bits, j), R, acc, d);
}

/* accum_slot16 for a run of 8 channels (8 bytes a token), or of 4 (run =
 * 4), for plane strides that are not whole 16-byte runs (2-bit codes at
 * d = 96: 24 bytes; at d = 80: 20). Runs of 16 would cross value groups
 * there (slot 1 holds channels 24-47 and groups are 32 wide); runs of 8
 * start at multiples of 8 and so stay inside a group, unless the stride
 * is 4 mod 8 (d = 80: slot 1's run 28-35), where accum_plane takes runs of
 * 4 instead. One madd per 8 channels of a pair and row, as in
 * accum_slot16; the bytes of a pair fill one vector instead of two (a run
 * of 4 fills half of it, the other half codes 0). */
static ALWAYS_INLINE __m128i load_run(const uint8_t *p, const int run) {
    if (run == 8) return _mm_loadl_epi64((const __m128i *)p);
    int32_t x;
    memcpy(&x, p, 4);
    return _mm_cvtsi32_si128(x);
}

/* o[0 .. run - 1] += the int sums a (lanes in channel order) times f, for a
 * run of 8 or 4 channels (accum_slot8, accum_slot8_b3). */
static ALWAYS_INLINE void add_run(float *o, __v8si a, float f, const int run) {
    __m256 y = _mm256_cvtepi32_ps((__m256i)a), fv = _mm256_set1_ps(f);
    if (run == 8) {
        _mm256_storeu_ps(o, _mm256_fmadd_ps(y, fv, _mm256_loadu_ps(o)));
        return;
    }
    _mm_storeu_ps(o, _mm_fmadd_ps(_mm256_castps256_ps128(y), _mm256_castps256_ps128(fv), _mm_loadu_ps(o)));
}

static ALWAYS_INLINE void accum_slot8(const uint8_t *codes, size_t cb, int cn, const int32_t *wg, const int bits,
                                      const int j, const int run, const float *deq, const int R, float *acc, int d) {
    __v8si a[4];
    for (int r = 0; r < R; r++) a[r] = (__v8si)_mm256_setzero_si256();
    const uint8_t *ca = codes;
    const int32_t *wt = wg;
    const uint8_t *end = codes + (size_t)(cn & ~1) * cb;
    for (; ca != end; ca += 2 * cb, wt++) {
        __m128i xa = load_run(ca, run), xb = load_run(ca + cb, run);
        __m256i x = take_slot(_mm256_cvtepu8_epi16(_mm_unpacklo_epi8(xa, xb)), bits, j);
        for (int r = 0; r < R; r++) a[r] = madd_acc(a[r], x, _mm256_set1_epi32(wt[r * (CHUNK / 2)]));
    }
    if (cn & 1) { /* paired with itself: its partner's weight is 0 */
        __m128i xa = load_run(ca, run);
        __m256i x = take_slot(_mm256_cvtepu8_epi16(_mm_unpacklo_epi8(xa, xa)), bits, j);
        for (int r = 0; r < R; r++) a[r] = madd_acc(a[r], x, _mm256_set1_epi32(wt[r * (CHUNK / 2)]));
    }
    for (int r = 0; r < R; r++) add_run(acc + (size_t)r * d, a[r], deq[r] * slot_scale(bits, j), run);
}

/* The madds of one token pair (codes lo, hi; pair i of each slot's
 * weights wj[j]) into two accumulators per slot, for accum_run16_row. */
static ALWAYS_INLINE void madd_slots(__m256i lo, __m256i hi, const int32_t *wj[4], int i, const int bits,
                                     __v8si a[8]) {
    for (int j = 0; j < 8 / bits; j++) {
        __m256i w = _mm256_set1_epi32(wj[j][i]);
        a[2 * j] = madd_acc(a[2 * j], take_slot(lo, bits, j), w);
        a[2 * j + 1] = madd_acc(a[2 * j + 1], take_slot(hi, bits, j), w);
    }
}

/* A single row (one q head per kv head): every slot of one 16-byte run u
 * of b-bit plane codes (channels j * stride + u .. +15, stride = cb) at once, two
 * accumulators per slot, so each pair's bytes are widened once for all
 * slots; with the rows of accum_slot16 a single row widened them once per
 * slot for two madds. wp is [group][pair] (one row). */
static ALWAYS_INLINE void accum_run16_row(const uint8_t *codes, size_t cb, int cn, int u, const int bits, int G,
                                          const int32_t *wp, float deq, float *acc) {
    const int stride = (int)cb;
    const int slots = 8 / bits;
    const int32_t *wj[4];
    __v8si a[8];
    __m256i lo, hi;
    for (int j = 0; j < slots; j++) {
        wj[j] = wp + (size_t)((j * stride + u) / G) * (CHUNK / 2);
        a[2 * j] = a[2 * j + 1] = (__v8si)_mm256_setzero_si256();
    }
    const uint8_t *ca = codes + u, *end = ca + (size_t)(cn & ~1) * cb;
    int i = 0;
    for (; ca != end; ca += 2 * cb, i++) {
        widen_pairs16(_mm_loadu_si128((const __m128i *)ca), _mm_loadu_si128((const __m128i *)(ca + cb)), &lo, &hi);
        madd_slots(lo, hi, wj, i, bits, a);
    }
    if (cn & 1) {
        /* paired with itself: its partner's weight is 0 */
        __m128i x = _mm_loadu_si128((const __m128i *)ca);
        widen_pairs16(x, x, &lo, &hi);
        madd_slots(lo, hi, wj, i, bits, a);
    }
    for (int j = 0; j < slots; j++) {
        float *o = acc + j * stride + u;
        __m256 f = _mm256_set1_ps(deq * slot_scale(bits, j));
        _mm256_storeu_ps(o, _mm256_fmadd_ps(_mm256_cvtepi32_ps((__m256i)a[2 * j]), f, _mm256_loadu_ps(o)));
        _mm256_storeu_ps(o + 8, _mm256_fmadd_ps(_mm256_cvtepi32_ps((__m256i)a[2 * j + 1]), f, _mm256_loadu_ps(o + 8)));
    }
}

/* One token's 16 bytes of 3-bit codes for accum_slot16_b3: the 2-bit part
 * from slot j of the 2-bit plane bytes c2 and the high bit from slot
 * j1 = 2 j + h (h 0 or 1) of the 1-bit plane bytes c1, joined in place as
 * (c2 + 4 c1) * 2^e, e = 2 j (4 for j = 3, so the top value 7 * 2^e fits a
 * byte). Each byte's bits are masked before they are shifted (the shifts
 * are 16-bit), so none crosses into its neighbour. */
static ALWAYS_INLINE __m128i join_b3(__m128i c2, __m128i c1, const int j, int h) {
    const int e = j < 3 ? 2 * j : 4;
    __m128i lo = _mm_and_si128(j < 3 ? c2 : _mm_srli_epi16(c2, 2), _mm_set1_epi8((char)(3 << e)));
    __m128i hb = _mm_and_si128(c1, _mm_set1_epi8((char)(1 << (2 * j + h))));
    /* bit 2 j + h to bit e + 2: up by 2 - h for j < 3, down by h for j = 3 */
    hb = j < 3 ? _mm_sll_epi16(hb, _mm_cvtsi32_si128(2 - h)) : _mm_srl_epi16(hb, _mm_cvtsi32_si128(h));
    return _mm_or_si128(lo, hb);
}

/* accum_slot16 for 3-bit codes (join_b3 has the channel's parts). Two
 * passes, one per plane set, did every madd twice: 3-bit values cost about
 * twice the 2-bit ones; joining the parts after widening them to 16 bits
 * cost 22 instructions per pair where the bytes joined first need 14. */
static ALWAYS_INLINE void accum_slot16_b3(const uint8_t *c2, const uint8_t *c1, size_t cb, int cn, const int32_t *wg,
                                          const int j, int h, const float *deq, const int R, float *acc, int d) {
    __v8si a[8];
    __m256i lo, hi;
    for (int i = 0; i < 8; i++) a[i] = (__v8si)_mm256_setzero_si256();
    const uint8_t *end = c2 + (size_t)(cn & ~1) * cb;
    for (; c2 != end; c2 += 2 * cb, c1 += 2 * cb, wg++) {
        __m128i xa = join_b3(_mm_loadu_si128((const __m128i *)c2), _mm_loadu_si128((const __m128i *)c1), j, h);
        __m128i xb = join_b3(_mm_loadu_si128((const __m128i *)(c2 + cb)), _mm_loadu_si128((const __m128i *)(c1 + cb)),
                             j, h);
        widen_pairs16(xa, xb, &lo, &hi);
        madd_rows16(lo, hi, wg, R, a);
    }
    if (cn & 1) {
        /* paired with itself: its partner's weight is 0 */
        __m128i x = join_b3(_mm_loadu_si128((const __m128i *)c2), _mm_loadu_si128((const __m128i *)c1), j, h);
        widen_pairs16(x, x, &lo, &hi);
        madd_rows16(lo, hi, wg, R, a);
    }
    add_rows16(a, deq, 1.0f / (float)(1 << (j < 3 ? 2 * j : 4)), R, acc, d);
}

/* accum_slot16_b3 for a run of 8 channels u .. u + 7 of 2-bit slot j, or
 * of 4 (run = 4; the sums of the other 4 lanes are dropped) (across
 * shapes, b3_across_v): the high bits come from high_bytes8, which puts
 * every channel's at bit 2 j, so join_b3 takes h = 0; the pair fills one
 * vector of 8 channel pairs (as accum_slot8). */
static ALWAYS_INLINE void accum_slot8_b3(const uint8_t *c2, const uint8_t *c1, int u, int s1, size_t cb, int cn,
                                         const int32_t *wg, const int j, const int run, const float *deq, const int R,
                                         float *acc, int d) {
    __v8si a[4];
    for (int r = 0; r < R; r++) a[r] = (__v8si)_mm256_setzero_si256();
    const uint8_t *end = c2 + (size_t)(cn & ~1) * cb;
    for (; c2 != end; c2 += 2 * cb, c1 += 2 * cb, wg++) {
        __m128i xa = join_b3(_mm_loadl_epi64((const __m128i *)c2), high_bytes8(c1, u, s1), j, 0);
        __m128i xb = join_b3(_mm_loadl_epi64((const __m128i *)(c2 + cb)), high_bytes8(c1 + cb, u, s1), j, 0);
        __m256i x = _mm256_cvtepu8_epi16(_mm_unpacklo_epi8(xa, xb));
        for (int r = 0; r < R; r++) a[r] = madd_acc(a[r], x, _mm256_set1_epi32(wg[r * (CHUNK / 2)]));
    }
    if (cn & 1) { /* paired with itself: its partner's weight is 0 */
        __m128i xa = join_b3(_mm_loadl_epi64((const __m128i *)c2), high_bytes8(c1, u, s1), j, 0);
        __m256i x = _mm256_cvtepu8_epi16(_mm_unpacklo_epi8(xa, xa));
        for (int r = 0; r < R; r++) a[r] = madd_acc(a[r], x, _mm256_set1_epi32(wg[r * (CHUNK / 2)]));
    }
    for (int r = 0; r < R; r++) add_run(acc + (size_t)r * d, a[r], deq[r] / (float)(1 << (j < 3 ? 2 * j : 4)), run);
}

/* Every channel of 3-bit codes of an across shape (b3_across_v) for one
 * chunk: runs of 8 channels, or of 4 where a run of 8 would pass the slot
 * or a value group's edge (d = 80: slots of 20 channels, 2-bit slot 1's
 * run 28-35). */
static ALWAYS_INLINE void accum_planes_b3x(const uint8_t *codes, size_t cb, int cn, int G, const int32_t *wp,
                                           const float *deq, const int R, float *acc, int d) {
    const int s2 = d / 4, s1 = d / 8;
    for (int u = 0; u < s2; u += 8)
        for (int j = 0; j < 4; j++) {
            int ch = j * s2 + u, g = ch / G;
            if (u + 8 <= s2 && (ch + 7) / G == g) {
                accum_slot8_b3(codes + u, codes + s2, u, s1, cb, cn, wp + (size_t)g * R * (CHUNK / 2), j, 8, deq, R,
                               acc + ch, d);
                continue;
            }
            for (int v = u; v < u + 8 && v < s2; v += 4) {
                int cv = j * s2 + v;
                accum_slot8_b3(codes + v, codes + s2, v, s1, cb, cn, wp + (size_t)(cv / G) * R * (CHUNK / 2), j, 4, deq,
                               R, acc + cv, d);
            }
        }
}

/* Every channel of 3-bit codes for one chunk and R rows (4, 2 or 1). Channel
 * ch = j s2 + u + i (s2 = d / 4, the 2-bit plane stride; u a multiple of
 * 16) has its high bit in byte (u mod s1) + i, slot 2 j + u / s1, of the
 * 1-bit planes (s1 = d / 8; s1 is a multiple of 16 here). */
static ALWAYS_INLINE void accum_planes_b3(const uint8_t *codes, size_t cb, int cn, int G, const int32_t *wp,
                                          const float *deq, const int R, float *acc, int d) {
    const int s2 = d / 4, s1 = d / 8;
    for (int u = 0; u < s2; u += 16)
#pragma GCC unroll 4
        for (int j = 0; j < 4; j++) {
            int ch = j * s2 + u, g = ch / G;
            accum_slot16_b3(codes + u, codes + s2 + u % s1, cb, cn, wp + (size_t)g * R * (CHUNK / 2), j, u / s1,
                            deq, R, acc + ch, d);
        }
}

/* All slots of b-bit plane codes (2, 4 or 8 bits) for one chunk; wp is
 * [group][row][pair]. */
static ALWAYS_INLINE void accum_plane(const uint8_t *codes, size_t cb, int cn, const int bits, int G,
                                      const int32_t *wp, const float *deq, const int R, float *acc, int d) {
    const int stride = (int)cb;
    if (stride % 16 != 0) { /* runs of 8, or of 4 where 8 would cross a group or the stride (accum_slot8) */
        for (int u = 0; u < stride; u += 8)
            for (int j = 0; j < 8 / bits; j++) {
                int ch = j * stride + u, g = ch / G;
                if (u + 8 <= stride && (ch + 7) / G == g) {
                    accum_slot8(codes + u, cb, cn, wp + (size_t)g * R * (CHUNK / 2), bits, j, 8, deq, R, acc + ch, d);
                    continue;
                }
                for (int v = u; v < u + 8 && v < stride; v += 4) {
                    int cv = j * stride + v;
                    accum_slot8(codes + v, cb, cn, wp + (size_t)(cv / G) * R * (CHUNK / 2), bits, j, 4, deq, R,
                                acc + cv, d);
                }
            }
        return;
    }
    if (R == 1) {
        for (int u = 0; u < stride; u += 16) accum_run16_row(codes, cb, cn, u, bits, G, wp, deq[0], acc);
        return;
    }
    /* the slot count outside the loop test: with UBSan's division check
     * in the test, GCC drops the unroll pragma (and warns) */
    const int slots = 8 / bits;
    for (int u = 0; u < stride; u += 16)
#pragma GCC unroll 8
        for (int j = 0; j < slots; j++) {
            int ch = j * stride + u, g = ch / G;
            accum_slot16(codes + u, cb, cn, wp + (size_t)g * R * (CHUNK / 2), bits, j, deq, R, acc + ch, d);
        }
}

/* 8 x 8 float transpose: row i of the result holds element i of each input. */
static ALWAYS_INLINE void transpose8(__m256 x[8]) {
    __m256 a[8], b[8];
    for (int i = 0; i < 8; i += 2) {
        a[i] = _mm256_unpacklo_ps(x[i], x[i + 1]);
        a[i + 1] = _mm256_unpackhi_ps(x[i], x[i + 1]);
    }
    for (int i = 0; i < 8; i += 4) {
        b[i] = _mm256_shuffle_ps(a[i], a[i + 2], 0x44);
        b[i + 1] = _mm256_shuffle_ps(a[i], a[i + 2], 0xEE);
        b[i + 2] = _mm256_shuffle_ps(a[i + 1], a[i + 3], 0x44);
        b[i + 3] = _mm256_shuffle_ps(a[i + 1], a[i + 3], 0xEE);
    }
    for (int i = 0; i < 4; i++) {
        x[i] = _mm256_permute2f128_ps(b[i], b[i + 4], 0x20);
        x[i + 4] = _mm256_permute2f128_ps(b[i], b[i + 4], 0x31);
    }
}

/* A whole chunk's value metadata, [CHUNK][ng][scale, zero] halves, as
 * sT, zT [ng][CHUNK] floats when ng is a multiple of 4: 8 halves of a token
 * (4 groups' scale and zero) are one vector, and 8 tokens' vectors
 * transposed give 8 tokens of each of the 4 groups' scales and zeros. */
static void regroup_meta4(const uint16_t *m, int ng, float *sT, float *zT) {
    for (int t = 0; t < CHUNK; t += 8)
        for (int g = 0; g < ng; g += 4) {
            __m256 x[8];
            for (int i = 0; i < 8; i++)
                x[i] = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(m + ((size_t)(t + i) * ng + g) * 2)));
            transpose8(x);
            for (int k = 0; k < 4; k++) {
                _mm256_storeu_ps(sT + (g + k) * CHUNK + t, x[2 * k]);
                _mm256_storeu_ps(zT + (g + k) * CHUNK + t, x[2 * k + 1]);
            }
        }
}

/* Accumulates tokens [t0, t0 + n) into R rows (4, 2 or 1). */
static ALWAYS_INLINE void accum_rows(const float *w, int ld, const int R, int d, int G, const int bits, const bool across,
                                     const uint8_t *blk, int block_tokens, int t0, int n, float *acc,
                                     float *scratch) {
    int ng = (d + G - 1) / G, cmax = bits == 3 ? 7 : (1 << bits) - 1; /* the last group may be shorter */
    size_t cb = code_bytes(bits, d);
    const uint16_t *meta = (const uint16_t *)(blk + (size_t)block_tokens * cb);
    /* scratch: mf [CHUNK][ng][2] the chunk's (scale, zero) floats as
     * stored, sT, zT [ng][CHUNK] the same by group, wbuf [R][CHUNK]
     * weights (0 past the chunk's end), smax [CHUNK] the largest scale of
     * each token, wp [ng][R][CHUNK/2] int32 weight
     * pairs, zv [R][ng] zero terms (8 lanes each, 32-byte aligned) */
    float *mf = scratch, *sT = mf + (size_t)ng * 2 * CHUNK, *zT = sT + (size_t)ng * CHUNK;
    float *wbuf = zT + (size_t)ng * CHUNK, *smax = wbuf + 4 * CHUNK;
    int32_t *wp = (int32_t *)(smax + CHUNK);
    __m256 *zv = (__m256 *)(void *)(((uintptr_t)(wp + (size_t)ng * 4 * (CHUNK / 2)) + 31) & ~(uintptr_t)31);
    for (int i = 0; i < R * ng; i++) zv[i] = _mm256_setzero_ps();
    for (int c0 = t0; c0 < t0 + n; c0 += CHUNK) {
        int cn = t0 + n - c0 < CHUNK ? t0 + n - c0 : CHUNK;
        const uint16_t *m = meta + (size_t)c0 * ng * 2;
        if (cn == CHUNK && ng % 4 == 0) {
            regroup_meta4(m, ng, sT, zT);
        } else {
            /* the chunk's metadata is contiguous: convert it 8 halves at a
             * time, then regroup by group (plain float copies) */
            int nh = cn * ng * 2, i = 0;
            for (; i + 8 <= nh; i += 8)
                _mm256_storeu_ps(mf + i, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(m + i))));
            for (; i < nh; i++) mf[i] = _cvtsh_ss(m[i]);
            for (int g = 0; g < ng; g++) {
                for (int t = 0; t < cn; t++) {
                    sT[g * CHUNK + t] = mf[(t * ng + g) * 2];
                    zT[g * CHUNK + t] = mf[(t * ng + g) * 2 + 1];
                }
                for (int t = cn; t < CHUNK; t++) sT[g * CHUNK + t] = zT[g * CHUNK + t] = 0.0f;
            }
        }
        for (int t = 0; t < CHUNK; t += 8) {
            __m256 x = _mm256_loadu_ps(sT + t);
            for (int g = 1; g < ng; g++) x = _mm256_max_ps(x, _mm256_loadu_ps(sT + g * CHUNK + t));
            _mm256_storeu_ps(smax + t, x);
        }
        float deq[4];
        const float *wr[4];
        for (int r = 0; r < R; r++) {
            /* a whole chunk's weights are read in place; a shorter one is
             * copied and padded with zero weights */
            wr[r] = w + (size_t)r * ld + (c0 - t0);
            if (cn < CHUNK) {
                float *wc = wbuf + r * CHUNK;
                memcpy(wc, wr[r], sizeof(float) * (size_t)cn);
                memset(wc + cn, 0, sizeof(float) * (size_t)(CHUNK - cn));
                wr[r] = wc;
            }
        }
        prep_weights(wr, R, sT, smax, zT, ng, cmax, wp, (size_t)R * (CHUNK / 2), zv, deq);
        const uint8_t *codes = blk + (size_t)c0 * cb;
        if (bits == 3) {
            if (across) accum_planes_b3x(codes, cb, cn, G, wp, deq, R, acc, d);
            else accum_planes_b3(codes, cb, cn, G, wp, deq, R, acc, d);
        } else {
            accum_plane(codes, cb, cn, bits, G, wp, deq, R, acc, d);
        }
    }
    /* zero terms and the rounding correction, per group */
    for (int r = 0; r < R; r++)
        for (int g = 0; g < ng; g++) {
            __m256 z = _mm256_set1_ps(hsum8(zv[r * ng + g]));
            float *o = acc + (size_t)r * d + g * G;
            int gw = d - g * G < G ? d - g * G : G; /* a multiple of 8 */
            for (int c = 0; c < gw; c += 8) _mm256_storeu_ps(o + c, _mm256_add_ps(_mm256_loadu_ps(o + c), z));
        }
}

/* accum_rows with the bits a constant in each instance (immediate shifts in
 * accum_slot16); R is a constant at every call site. */
static ALWAYS_INLINE void accum_rows_bits(const float *w, int ld, const int R, int d, int G, int bits,
                                          const uint8_t *blk, int block_tokens, int t0, int n, float *acc,
                                          float *scratch) {
    switch (bits) {
    case 2: accum_rows(w, ld, R, d, G, 2, false, blk, block_tokens, t0, n, acc, scratch); break;
    case 3:
        if (b3_across_v(d)) accum_rows(w, ld, R, d, G, 3, true, blk, block_tokens, t0, n, acc, scratch);
        else accum_rows(w, ld, R, d, G, 3, false, blk, block_tokens, t0, n, acc, scratch);
        break;
    case 4: accum_rows(w, ld, R, d, G, 4, false, blk, block_tokens, t0, n, acc, scratch); break;
    default: accum_rows(w, ld, R, d, G, 8, false, blk, block_tokens, t0, n, acc, scratch); break;
    }
}

bool vq_kivi_accum_avx2(const vq_mparams *p, const float *w, int ld, int rows, const uint8_t *blk,
                        int block_tokens, int t0, int n, float *acc, float *scratch) {
    int d = p->head_dim, G = p->group, ng = (d + G - 1) / G, bits = p->bits;
    /* runs of 16 bytes, or of 8 and 4 for 2-, 4- and 8-bit planes
     * (accum_slot8); a last value group shorter than G is taken like the
     * others (runs never cross a group edge) */
    if (!(bits == 3 ? planes_ok(3, d, 16) || b3_across_v(d) : planes_ok(bits, d, 4)) || ng > 16) return false;
    if (vq_cpu_has_avx512_vnni() && vq_kivi_accum_avx512(p, w, ld, rows, blk, block_tokens, t0, n, acc, scratch))
        return true;
    /* 4 rows at a time, then 2, then 1 */
    for (int r0 = 0; r0 < rows;) {
        int R = rows - r0 >= 4 ? 4 : rows - r0 >= 2 ? 2 : 1;
        const float *wr = w + (size_t)r0 * ld;
        float *ar = acc + (size_t)r0 * d;
        if (R == 4) accum_rows_bits(wr, ld, 4, d, G, bits, blk, block_tokens, t0, n, ar, scratch);
        else if (R == 2) accum_rows_bits(wr, ld, 2, d, G, bits, blk, block_tokens, t0, n, ar, scratch);
        else accum_rows_bits(wr, ld, 1, d, G, bits, blk, block_tokens, t0, n, ar, scratch);
        r0 += R;
    }
    return true;
}

/* Scratch floats the two kernels above need (for 4 rows at a time), or
 * kivi_avx512.c's value driver, whichever is more. */
size_t vq_kivi_scratch_avx2(const vq_mparams *p) {
    size_t d = (size_t)p->head_dim, ng = (d + (size_t)p->group - 1) / (size_t)p->group;
    /* keys: q' (4 rows, padded to steps of 16 for kivi_avx512.c, which
     * covers 8), zero terms and kivi_avx512.c's units [16] each, and its
     * byte digits (4 rows of d / 4 times 16 bytes) */
    if (!p->is_value) return vq_kivi_key_qs_floats(p->bits, p->head_dim, 16) + 32 + 4 * d;
    /* mf [CHUNK][ng][2], sT, zT [ng][CHUNK], wbuf [4][CHUNK], smax [CHUNK],
     * wp [ng][4][CHUNK/2], zv [4][ng][8] and 8 floats to align it */
    size_t n = 2 * ng * CHUNK + 2 * ng * CHUNK + 4 * CHUNK + CHUNK + ng * 4 * (CHUNK / 2) + 4 * ng * 8 + 8;
    size_t wide = vq_kivi_scratch_avx512((int)ng);
    if (wide > n) n = wide;
    return n;
}
