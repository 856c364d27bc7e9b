/* AVX2 bodies of the codebook kernels in methods/rotated.c: 8 channels at a
 * time, the codes unpacked with shifts and masks (pack.h's plane layout
 * puts 8 consecutive channels in 8 consecutive bytes) and mapped to their
 * levels with an in-register table lookup (vpermps; 16 levels take two and
 * a blend). Nothing is decoded to memory. Built with -mavx2 -mfma and only
 * called after the CPU was checked. Sign sketches: a clear bit flips the
 * sign of its float (XOR), no branches; scored through per-query byte
 * tables (vq_signs_score_avx2), accumulated two tokens per lookup from
 * per-pair tables (vq_signs_accum_avx2). Also the fp32 dots of the query
 * projections and tq-prod's S^T. */
#include "methods/rotated.h"

#include <immintrin.h>

#if defined(__GNUC__)
#define ALWAYS_INLINE inline __attribute__((always_inline))
#else
#define ALWAYS_INLINE inline
#endif

/* The shapes covered: every 8-channel run must sit in 8 consecutive bytes. */
static bool covered(int d, int bits) {
    if (bits == 3) return d % 64 == 0;
    if (bits != 1 && bits != 2 && bits != 4) return false;
    return (d * bits / 8) % 8 == 0;
}

/* Codes of channels c..c+7 as 32-bit lanes. */
static inline __m256i load_codes(const uint8_t *packed, int d, int bits, int c) {
    if (bits == 3) {
        int s2 = d / 4, s1 = d / 8, k = c / s2, i = c % s2;
        __m256i lo = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(packed + i)));
        __m256i hi = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(packed + s2 + c % s1)));
        lo = _mm256_and_si256(_mm256_srl_epi32(lo, _mm_cvtsi32_si128(2 * k)), _mm256_set1_epi32(3));
        hi = _mm256_and_si256(_mm256_srl_epi32(hi, _mm_cvtsi32_si128(c / s1)), _mm256_set1_epi32(1));
        return _mm256_or_si256(lo, _mm256_slli_epi32(hi, 2));
    }
    int stride = d * bits / 8, k = c / stride, i = c % stride;
    __m256i v = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(packed + i)));
    v = _mm256_srl_epi32(v, _mm_cvtsi32_si128(bits * k));
    return _mm256_and_si256(v, _mm256_set1_epi32((1 << bits) - 1));
}

/* table[code] per lane; the table has 16 readable floats. */
static inline __m256 lookup(__m256 lo, __m256 hi, __m256i code, int bits) {
    __m256 a = _mm256_permutevar8x32_ps(lo, code);
    if (bits < 4) return a;
    __m256 b = _mm256_permutevar8x32_ps(hi, code);
    return _mm256_blendv_ps(a, b, _mm256_castsi256_ps(_mm256_slli_epi32(code, 28)));
}

bool vq_codes_dot_avx2(const uint8_t *packed, int d, int bits, const float *table, const float *q, float *out) {
    if (!covered(d, bits)) return false;
    __m256 lo = _mm256_loadu_ps(table), hi = _mm256_loadu_ps(table + 8);
    __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();
    int c = 0;
    for (; c + 16 <= d; c += 16) {
        acc0 = _mm256_fmadd_ps(lookup(lo, hi, load_codes(packed, d, bits, c), bits), _mm256_loadu_ps(q + c), acc0);
        acc1 = _mm256_fmadd_ps(lookup(lo, hi, load_codes(packed, d, bits, c + 8), bits), _mm256_loadu_ps(q + c + 8),
                               acc1);
    }
    for (; c < d; c += 8)
        acc0 = _mm256_fmadd_ps(lookup(lo, hi, load_codes(packed, d, bits, c), bits), _mm256_loadu_ps(q + c), acc0);
    __m256 s = _mm256_add_ps(acc0, acc1);
    __m128 h = _mm_add_ps(_mm256_castps256_ps128(s), _mm256_extractf128_ps(s, 1));
    h = _mm_add_ps(h, _mm_movehl_ps(h, h));
    h = _mm_add_ss(h, _mm_movehdup_ps(h));
    *out = _mm_cvtss_f32(h);
    return true;
}

bool vq_codes_axpy_avx2(const uint8_t *packed, int d, int bits, const float *table, float w, float *acc) {
    if (!covered(d, bits)) return false;
    __m256 lo = _mm256_loadu_ps(table), hi = _mm256_loadu_ps(table + 8), wv = _mm256_set1_ps(w);
    for (int c = 0; c < d; c += 8) {
        __m256 v = lookup(lo, hi, load_codes(packed, d, bits, c), bits);
        _mm256_storeu_ps(acc + c, _mm256_fmadd_ps(v, wv, _mm256_loadu_ps(acc + c)));
    }
    return true;
}

/* The same for several query rows: each 8-channel run of levels is looked
 * up once and multiplied into up to 4 rows' accumulators (the rows of a GQA
 * group share every code load). */
bool vq_codes_dot_rows_avx2(const uint8_t *packed, int d, int bits, const float *table, const float *q,
                            size_t q_stride, int rows, float *out) {
    if (!covered(d, bits)) return false;
    __m256 lo = _mm256_loadu_ps(table), hi = _mm256_loadu_ps(table + 8);
    for (int r0 = 0; r0 < rows; r0 += 4) {
        int nr = rows - r0 < 4 ? rows - r0 : 4;
        const float *q0 = q + (size_t)r0 * q_stride;
        __m256 acc[4] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps()};
        for (int c = 0; c < d; c += 8) {
            __m256 v = lookup(lo, hi, load_codes(packed, d, bits, c), bits);
            for (int r = 0; r < nr; r++)
                acc[r] = _mm256_fmadd_ps(v, _mm256_loadu_ps(q0 + (size_t)r * q_stride + c), acc[r]);
        }
        for (int r = 0; r < nr; r++) {
            __m128 h = _mm_add_ps(_mm256_castps256_ps128(acc[r]), _mm256_extractf128_ps(acc[r], 1));
            h = _mm_add_ps(h, _mm_movehl_ps(h, h));
            h = _mm_add_ss(h, _mm_movehdup_ps(h));
            out[r0 + r] = _mm_cvtss_f32(h);
        }
    }
    return true;
}

/* acc_r[c] += w[r] * table[code_c] for every row, each run looked up once. */
bool vq_codes_axpy_rows_avx2(const uint8_t *packed, int d, int bits, const float *table, const float *w, int rows,
                             float *acc, size_t acc_stride) {
    if (!covered(d, bits)) return false;
    __m256 lo = _mm256_loadu_ps(table), hi = _mm256_loadu_ps(table + 8);
    for (int c = 0; c < d; c += 8) {
        __m256 v = lookup(lo, hi, load_codes(packed, d, bits, c), bits);
        for (int r = 0; r < rows; r++) {
            float *a = acc + (size_t)r * acc_stride + c;
            _mm256_storeu_ps(a, _mm256_fmadd_ps(v, _mm256_set1_ps(w[r]), _mm256_loadu_ps(a)));
        }
    }
    return true;
}

/* acc[i] += s_i w over m sign bits (m a multiple of 8). */
void vq_signs_axpy_avx2(const uint8_t *signs, int m, float w, float *acc) {
    const __m256i bit = _mm256_setr_epi32(1, 2, 4, 8, 16, 32, 64, 128);
    const __m256i sign = _mm256_set1_epi32((int)0x80000000u);
    const __m256 wv = _mm256_set1_ps(w);
    for (int i = 0; i < m; i += 8) {
        __m256i set = _mm256_and_si256(_mm256_set1_epi32(signs[i / 8]), bit);
        __m256i flip = _mm256_andnot_si256(_mm256_cmpeq_epi32(set, bit), sign);
        __m256 sw = _mm256_xor_ps(wv, _mm256_castsi256_ps(flip));
        _mm256_storeu_ps(acc + i, _mm256_add_ps(_mm256_loadu_ps(acc + i), sw));
    }
}

/* Sign-sketch scores from vq_signs_table's tables (methods/rotated.h): per
 * sketch, one 16-byte load and add per byte serves four rows; four add
 * chains hide the latency. The tables (32 m floats a row) sit in L2. */
void vq_signs_score_avx2(const float *tab, int m, int rows, const uint8_t *signs, size_t stride, const float *gain,
                         int n, float *out, int ld, bool add) {
    int nb = m / 8, r = 0;
    for (; r + 4 <= rows; r += 4) {
        const float *tg = tab + (size_t)r * 32 * m;
        for (int t = 0; t < n; t++) {
            const uint8_t *s = signs + (size_t)t * stride;
            __m128 a0 = _mm_setzero_ps(), a1 = _mm_setzero_ps(), a2 = _mm_setzero_ps(), a3 = _mm_setzero_ps();
            int k = 0;
            for (; k + 4 <= nb; k += 4) {
                const float *e = tg + (size_t)1024 * k;
                a0 = _mm_add_ps(a0, _mm_loadu_ps(e + 4 * s[k]));
                a1 = _mm_add_ps(a1, _mm_loadu_ps(e + 1024 + 4 * s[k + 1]));
                a2 = _mm_add_ps(a2, _mm_loadu_ps(e + 2048 + 4 * s[k + 2]));
                a3 = _mm_add_ps(a3, _mm_loadu_ps(e + 3072 + 4 * s[k + 3]));
            }
            for (; k < nb; k++) a0 = _mm_add_ps(a0, _mm_loadu_ps(tg + (size_t)1024 * k + 4 * s[k]));
            float v[4];
            _mm_storeu_ps(v, _mm_mul_ps(_mm_add_ps(_mm_add_ps(a0, a1), _mm_add_ps(a2, a3)), _mm_set1_ps(gain[t])));
            for (int i = 0; i < 4; i++) {
                float *o = out + (size_t)(r + i) * ld + t;
                *o = add ? *o + v[i] : v[i];
            }
        }
    }
    for (; r < rows; r++) {
        const float *tg = tab + (size_t)r * 32 * m;
        for (int t = 0; t < n; t++) {
            const uint8_t *s = signs + (size_t)t * stride;
            float a0 = 0, a1 = 0;
            int k = 0;
            for (; k + 2 <= nb; k += 2) {
                a0 += tg[256 * k + s[k]];
                a1 += tg[256 * (k + 1) + s[k + 1]];
            }
            if (k < nb) a0 += tg[256 * k + s[k]];
            float *o = out + (size_t)r * ld + t, v = gain[t] * (a0 + a1);
            *o = add ? *o + v : v;
        }
    }
}

/* Two sketches a token scored in one pass: the one at signs + t * stride
 * from tab_a times ga[t] plus the one b_off bytes further from tab_b times
 * gb[t], each summed exactly as vq_signs_score_avx2 sums it, so the result
 * has the bits of a storing call for a followed by an adding one for b;
 * one pass over the tokens and one store per score instead of two. */
void vq_signs_score2_avx2(const float *tab_a, const float *tab_b, int m, int rows, const uint8_t *signs, size_t b_off,
                          size_t stride, const float *ga, const float *gb, int n, float *out, int ld) {
    int nb = m / 8, r = 0;
    for (; r + 4 <= rows; r += 4) {
        const float *ta = tab_a + (size_t)r * 32 * m, *tb = tab_b + (size_t)r * 32 * m;
        for (int t = 0; t < n; t++) {
            const uint8_t *s = signs + (size_t)t * stride, *u = s + b_off;
            __m128 a0 = _mm_setzero_ps(), a1 = _mm_setzero_ps(), a2 = _mm_setzero_ps(), a3 = _mm_setzero_ps();
            __m128 b0 = _mm_setzero_ps(), b1 = _mm_setzero_ps(), b2 = _mm_setzero_ps(), b3 = _mm_setzero_ps();
            int k = 0;
            for (; k + 4 <= nb; k += 4) {
                const float *e = ta + (size_t)1024 * k, *f = tb + (size_t)1024 * k;
                a0 = _mm_add_ps(a0, _mm_loadu_ps(e + 4 * s[k]));
                b0 = _mm_add_ps(b0, _mm_loadu_ps(f + 4 * u[k]));
                a1 = _mm_add_ps(a1, _mm_loadu_ps(e + 1024 + 4 * s[k + 1]));
                b1 = _mm_add_ps(b1, _mm_loadu_ps(f + 1024 + 4 * u[k + 1]));
                a2 = _mm_add_ps(a2, _mm_loadu_ps(e + 2048 + 4 * s[k + 2]));
                b2 = _mm_add_ps(b2, _mm_loadu_ps(f + 2048 + 4 * u[k + 2]));
                a3 = _mm_add_ps(a3, _mm_loadu_ps(e + 3072 + 4 * s[k + 3]));
                b3 = _mm_add_ps(b3, _mm_loadu_ps(f + 3072 + 4 * u[k + 3]));
            }
            for (; k < nb; k++) {
                a0 = _mm_add_ps(a0, _mm_loadu_ps(ta + (size_t)1024 * k + 4 * s[k]));
                b0 = _mm_add_ps(b0, _mm_loadu_ps(tb + (size_t)1024 * k + 4 * u[k]));
            }
            __m128 va = _mm_mul_ps(_mm_add_ps(_mm_add_ps(a0, a1), _mm_add_ps(a2, a3)), _mm_set1_ps(ga[t]));
            __m128 vb = _mm_mul_ps(_mm_add_ps(_mm_add_ps(b0, b1), _mm_add_ps(b2, b3)), _mm_set1_ps(gb[t]));
            float v[4];
            _mm_storeu_ps(v, _mm_add_ps(va, vb));
            for (int i = 0; i < 4; i++) out[(size_t)(r + i) * ld + t] = v[i];
        }
    }
    for (; r < rows; r++) {
        const float *ta = tab_a + (size_t)r * 32 * m, *tb = tab_b + (size_t)r * 32 * m;
        for (int t = 0; t < n; t++) {
            const uint8_t *s = signs + (size_t)t * stride, *u = s + b_off;
            float a0 = 0, a1 = 0, b0 = 0, b1 = 0;
            int k = 0;
            for (; k + 2 <= nb; k += 2) {
                a0 += ta[256 * k + s[k]];
                a1 += ta[256 * (k + 1) + s[k + 1]];
                b0 += tb[256 * k + u[k]];
                b1 += tb[256 * (k + 1) + u[k + 1]];
            }
            if (k < nb) {
                a0 += ta[256 * k + s[k]];
                b0 += tb[256 * k + u[k]];
            }
            float va = ga[t] * (a0 + a1), vb = gb[t] * (b0 + b1);
            out[(size_t)r * ld + t] = va + vb;
        }
    }
}

/* Sign-sketch values, two tokens per lookup. For a token pair (t, u) and a
 * row, the four sums +-wt +-wu form a 4-entry table, and the pair's two
 * sign bits of a channel index it: one vpermilps and one add per 8
 * channels, row and token pair, where +-1.0 lanes took one FMA per token,
 * two per pair (the FMA pipes run both vpermilps and FMAs, the adds go to
 * the other two): tq-prod 2-bit 63.7 -> 58.4 ns per (token, kv head) in
 * cache, 4-bit 88.1 -> 84.7 (32/8 heads, one thread). vpermilps reads the
 * low 2 bits of each lane, so a lane needs the two tokens' bits of its
 * channel side by side: from the pair's two bytes of two 8-channel runs
 * (16-bit words wt, wu), e = (wt & 0x5555) | (wu & 0x5555) << 1 holds those
 * pairs for the even channels and o = (wt >> 1 & 0x5555) | (wu & 0xAAAA)
 * for the odd ones; with e | o << 16 broadcast, one vpsrlvd per run moves
 * each lane's pair down. The lanes then hold channels 0, 2, 4, 6, 1, 3, 5,
 * 7 of their run, which the accumulators keep between the loads and stores
 * (one vpermps each way per call). */

/* Lane l of a run's accumulator holds channel PERM[l]; INV undoes it. */
static const int PERM[8] = {0, 2, 4, 6, 1, 3, 5, 7}, INV[8] = {0, 4, 1, 5, 2, 6, 3, 7};

/* z[R rows][G runs of 8 signs from byte k] += sum over the token pairs p
 * of pt[r][p] looked up by the pair's bits: pt has 4 floats per row and
 * pair, rows 128 floats apart; pw[p * np] is the pair's index word of
 * bytes k, k + 1 (pair_words). z rows are zs apart. */
static ALWAYS_INLINE void signs_accum_runs(const uint32_t *pw, int np, size_t zs, int k, int pairs, const float *pt,
                                           const int R, const int G, float *z) {
    const __m256i shifts[2] = {_mm256_setr_epi32(0, 2, 4, 6, 16, 18, 20, 22),
                               _mm256_setr_epi32(8, 10, 12, 14, 24, 26, 28, 30)};
    const __m256i perm = _mm256_loadu_si256((const __m256i *)PERM);
    __m256 a[8];
    for (int r = 0; r < R; r++)
        for (int g = 0; g < G; g++)
            a[r * G + g] = _mm256_permutevar8x32_ps(_mm256_loadu_ps(z + (size_t)r * zs + 8 * (k + g)), perm);
    for (int p = 0; p < pairs; p++, pw += np) {
        __m256i word = _mm256_set1_epi32((int)*pw);
        __m256i idx[2];
        for (int g = 0; g < G; g++) idx[g] = _mm256_srlv_epi32(word, shifts[g]);
        for (int r = 0; r < R; r++) {
            __m256 tab = _mm256_broadcast_ps((const __m128 *)(pt + r * 128 + 4 * p));
            for (int g = 0; g < G; g++) a[r * G + g] = _mm256_add_ps(a[r * G + g], _mm256_permutevar_ps(tab, idx[g]));
        }
    }
    const __m256i inv = _mm256_loadu_si256((const __m256i *)INV);
    for (int r = 0; r < R; r++)
        for (int g = 0; g < G; g++)
            _mm256_storeu_ps(z + (size_t)r * zs + 8 * (k + g), _mm256_permutevar8x32_ps(a[r * G + g], inv));
}

static ALWAYS_INLINE void signs_accum_rows(const uint32_t *pw, int np, int m, size_t zs, int pairs, const float *pt,
                                           const int R, float *z) {
    int k = 0;
    for (; k + 2 <= m / 8; k += 2) signs_accum_runs(pw + k / 2, np, zs, k, pairs, pt, R, 2, z);
    if (k < m / 8) signs_accum_runs(pw + k / 2, np, zs, k, pairs, pt, R, 1, z);
}

/* The index words of the sketches t (a) and u (b, or NULL for none) of a
 * pair: word j from bytes 2j, 2j + 1 of each, np = (m / 8 + 1) / 2 words;
 * eight at a time from 16 bytes, the rest one by one. */
static void pair_words(const uint8_t *a, const uint8_t *b, int m, uint32_t *out) {
    const __m128i m55 = _mm_set1_epi16(0x5555), maa = _mm_set1_epi16((short)0xAAAA);
    int nb = m / 8, i = 0;
    for (; i + 16 <= nb; i += 16) {
        __m128i t = _mm_loadu_si128((const __m128i *)(a + i));
        __m128i u = b ? _mm_loadu_si128((const __m128i *)(b + i)) : _mm_setzero_si128();
        __m128i e = _mm_or_si128(_mm_and_si128(t, m55), _mm_slli_epi16(_mm_and_si128(u, m55), 1));
        __m128i o = _mm_or_si128(_mm_and_si128(_mm_srli_epi16(t, 1), m55), _mm_and_si128(u, maa));
        _mm_storeu_si128((__m128i *)(out + i / 2), _mm_unpacklo_epi16(e, o));
        _mm_storeu_si128((__m128i *)(out + i / 2 + 4), _mm_unpackhi_epi16(e, o));
    }
    for (; i < nb; i += 2) {
        uint32_t wt = a[i] | (i + 1 < nb ? (uint32_t)a[i + 1] << 8 : 0), wu = 0;
        if (b) wu = b[i] | (i + 1 < nb ? (uint32_t)b[i + 1] << 8 : 0);
        uint32_t e = (wt & 0x5555) | (wu & 0x5555) << 1, o = (wt >> 1 & 0x5555) | (wu & 0xAAAA);
        out[i / 2] = e | o << 16;
    }
}

/* The pair tables of signs_accum_span are accum_b1's with the levels -1
 * and +1 (entries -a-b, a-b, -a+b, a+b for a = w_t gain_t, b = w_u gain_u;
 * multiplying by 1 is exact, so these are the bits of its scalar loop). */
int vq_pair_tables8_avx2(const float *w, const float *scale, int cnt, const float *levels, float *pt);
static const float sign_levels[2] = {-1.0f, 1.0f};

/* Signs per span of signs_accum_span, and the index words of its 32 pairs
 * (64 words a pair). */
#define SPAN_SIGNS 1024
#define PAIR_WORDS (32 * SPAN_SIGNS / 16)

/* vq_signs_accum_avx2 for m <= SPAN_SIGNS. */
static void signs_accum_span(const uint8_t *signs, size_t stride, int m, const float *gain, int n, const float *w,
                             int ld, int rows, float *z, size_t z_stride) {
    /* pair tables: bit 0 of the index is token t's sign, bit 1 token u's */
    const __m128 st = _mm_setr_ps(-1.0f, 1.0f, -1.0f, 1.0f), su = _mm_setr_ps(-1.0f, -1.0f, 1.0f, 1.0f);
    float pt[4 * 128];
    uint32_t pw[PAIR_WORDS];
    int np = (m / 8 + 1) / 2;
    for (int t0 = 0; t0 < n; t0 += 64) {
        int cnt = n - t0 < 64 ? n - t0 : 64, pairs = (cnt + 1) / 2;
        const uint8_t *sg = signs + (size_t)t0 * stride;
        for (int p = 0; p < pairs; p++)
            pair_words(sg + (size_t)2 * p * stride, 2 * p + 1 < cnt ? sg + (size_t)(2 * p + 1) * stride : NULL, m,
                       pw + (size_t)p * np);
        for (int r = 0; r < rows;) {
            int R = rows - r >= 4 ? 4 : 1;
            for (int i = 0; i < R; i++) {
                const float *wr = w + (size_t)(r + i) * ld + t0;
                int t = vq_pair_tables8_avx2(wr, gain + t0, cnt, sign_levels, pt + i * 128);
                for (; t < cnt; t += 2) {
                    float a = wr[t] * gain[t0 + t], b = t + 1 < cnt ? wr[t + 1] * gain[t0 + t + 1] : 0.0f;
                    _mm_storeu_ps(pt + i * 128 + 2 * t,
                                  _mm_add_ps(_mm_mul_ps(_mm_set1_ps(a), st), _mm_mul_ps(_mm_set1_ps(b), su)));
                }
            }
            if (R == 4) signs_accum_rows(pw, np, m, z_stride, pairs, pt, 4, z + (size_t)r * z_stride);
            else signs_accum_rows(pw, np, m, z_stride, pairs, pt, 1, z + (size_t)r * z_stride);
            r += R;
        }
    }
}

void vq_signs_accum_avx2(const uint8_t *signs, size_t stride, int m, const float *gain, int n, const float *w, int ld,
                         int rows, float *z, size_t z_stride) {
    for (int c0 = 0; c0 < m; c0 += SPAN_SIGNS)
        signs_accum_span(signs + c0 / 8, stride, m - c0 < SPAN_SIGNS ? m - c0 : SPAN_SIGNS, gain, n, w, ld, rows,
                         z + c0, z_stride);
}

/* a . b over n floats, 16 at a time in two chains. */
float vq_dot_avx2(const float *a, const float *b, int n) {
    __m256 s0 = _mm256_setzero_ps(), s1 = _mm256_setzero_ps();
    int i = 0;
    for (; i + 16 <= n; i += 16) {
        s0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), s0);
        s1 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 8), _mm256_loadu_ps(b + i + 8), s1);
    }
    for (; i + 8 <= n; i += 8) s0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), s0);
    __m256 s = _mm256_add_ps(s0, s1);
    __m128 h = _mm_add_ps(_mm256_castps256_ps128(s), _mm256_extractf128_ps(s, 1));
    h = _mm_add_ps(h, _mm_movehl_ps(h, h));
    h = _mm_add_ss(h, _mm_movehdup_ps(h));
    float r = _mm_cvtss_f32(h);
    for (; i < n; i++) r += a[i] * b[i];
    return r;
}

/* out[k] = a . x_k for k < 4 (x_k at x + k xs): vq_dot_avx2's chains and
 * reduction for each, with each 8 floats of a loaded once for the four. */
void vq_dot4_avx2(const float *a, const float *x, size_t xs, int n, float *out) {
    __m256 s0[4], s1[4];
    for (int k = 0; k < 4; k++) s0[k] = s1[k] = _mm256_setzero_ps();
    int i = 0;
    for (; i + 16 <= n; i += 16) {
        __m256 a0 = _mm256_loadu_ps(a + i), a1 = _mm256_loadu_ps(a + i + 8);
        for (int k = 0; k < 4; k++) {
            s0[k] = _mm256_fmadd_ps(a0, _mm256_loadu_ps(x + k * xs + i), s0[k]);
            s1[k] = _mm256_fmadd_ps(a1, _mm256_loadu_ps(x + k * xs + i + 8), s1[k]);
        }
    }
    for (; i + 8 <= n; i += 8) {
        __m256 a0 = _mm256_loadu_ps(a + i);
        for (int k = 0; k < 4; k++) s0[k] = _mm256_fmadd_ps(a0, _mm256_loadu_ps(x + k * xs + i), s0[k]);
    }
    for (int k = 0; k < 4; k++) {
        __m256 s = _mm256_add_ps(s0[k], s1[k]);
        __m128 h = _mm_add_ps(_mm256_castps256_ps128(s), _mm256_extractf128_ps(s, 1));
        h = _mm_add_ps(h, _mm_movehl_ps(h, h));
        h = _mm_add_ss(h, _mm_movehdup_ps(h));
        float r = _mm_cvtss_f32(h);
        for (int j = i; j < n; j++) r += a[j] * x[k * xs + j];
        out[k] = r;
    }
}

/* x[0..d) += S^T y for the m x d row-major S: 64 channels of x stay in
 * registers over all m rows of S (an axpy per row loaded and stored all of
 * x each time); each x[j] still takes its FMAs in row order, so the same
 * bits. tq-prod maps every output row's sign part back with it. */
void vq_project_transpose_add_avx2(const float *s, int m, int d, const float *y, float *x) {
    int j = 0;
    for (; j + 64 <= d; j += 64) {
        __m256 a[8];
        for (int g = 0; g < 8; g++) a[g] = _mm256_loadu_ps(x + j + 8 * g);
        for (int i = 0; i < m; i++) {
            __m256 w = _mm256_broadcast_ss(y + i);
            const float *si = s + (size_t)i * d + j;
            for (int g = 0; g < 8; g++) a[g] = _mm256_fmadd_ps(w, _mm256_loadu_ps(si + 8 * g), a[g]);
        }
        for (int g = 0; g < 8; g++) _mm256_storeu_ps(x + j + 8 * g, a[g]);
    }
    for (; j + 8 <= d; j += 8) {
        __m256 a = _mm256_loadu_ps(x + j);
        for (int i = 0; i < m; i++)
            a = _mm256_fmadd_ps(_mm256_broadcast_ss(y + i), _mm256_loadu_ps(s + (size_t)i * d + j), a);
        _mm256_storeu_ps(x + j, a);
    }
    for (; j < d; j++)
        for (int i = 0; i < m; i++) x[j] += y[i] * s[(size_t)i * d + j];
}
