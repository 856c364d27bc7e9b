/* Shared helpers of the rotation methods; see rotated.h. */
#include "rotated.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

/* AVX2 bodies (kernels/cpu/codes_avx2.c); false when the shape is not
 * covered and the scalar code must run. */
bool vq_codes_dot_avx2(const uint8_t *packed, int d, int bits, const float *table, const float *q, float *out);
bool vq_codes_axpy_avx2(const uint8_t *packed, int d, int bits, const float *table, float w, float *acc);
bool vq_codes_dot_rows_avx2(const uint8_t *packed, int d, int bits, const float *table, const float *q,
                            size_t q_stride, int rows, float *out);
bool vq_codes_axpy_rows_avx2(const uint8_t *packed, int d, int bits, const float *table, const float *w, int rows,
                             float *acc, size_t acc_stride);
void vq_signs_axpy_avx2(const uint8_t *signs, int m, float w, float *acc);
float vq_dot_avx2(const float *a, const float *b, int n);
void vq_signs_score_avx2(const float *tab, int m, int rows, const uint8_t *signs, size_t stride, const float *gain,
                         int n, float *out, int ld, bool add);
void vq_signs_score2_avx2(const float *tab_a, const float *tab_b, int m, int rows, const uint8_t *signs, size_t b_off,
                          size_t stride, const float *ga, const float *gb, int n, float *out, int ld);
void vq_signs_accum_avx2(const uint8_t *signs, size_t stride, int m, const float *gain, int n, const float *w, int ld,
                         int rows, float *z, size_t z_stride);
/* kernels/cpu/signs_avx512.c */
void vq_signs_score_avx512(const float *nib, int m, int rows, const uint8_t *signs, size_t stride, const float *gain,
                           int n, float *out, int ld, bool add);
void vq_signs_accum_avx512(const uint8_t *signs, size_t stride, int m, const float *gain, int n, const float *w,
                           int ld, int rows, float *z, size_t z_stride);
void vq_dot4_avx2(const float *a, const float *x, size_t xs, int n, float *out);
void vq_project_transpose_add_avx2(const float *s, int m, int d, const float *y, float *x);
/* kernels/cpu/rotated_avx2.c */
bool vq_codes_score_avx2(const vq_code_part *parts, int nparts, const uint8_t *codes, size_t cb,
                         const uint16_t *norms, int n, const float *q, int d, int rows, float *logits, int ld,
                         float *scratch);
bool vq_codes_accum_avx2(const vq_code_part *parts, int nparts, const uint8_t *codes, size_t cb,
                         const uint16_t *norms, int n, const float *w, int ld, int rows, float *acc, int d);
/* kernels/cpu/rotated_avx512.c: the same at level avx512, false for shapes
 * they do not cover (the AVX2 kernels then run). */
bool vq_codes_score_avx512(const vq_code_part *parts, int nparts, const uint8_t *codes, size_t cb,
                           const uint16_t *norms, int n, const float *q, int d, int rows, float *logits, int ld,
                           float *scratch);
bool vq_codes_accum_avx512(const vq_code_part *parts, int nparts, const uint8_t *codes, size_t cb,
                           const uint16_t *norms, int n, const float *w, int ld, int rows, float *acc, int d);
/* The rows it scored (a multiple of 4; 0 when the shape is not covered). */
int vq_codes_signs_score_avx2(const vq_code_part *parts, int nparts, const vq_sign_part *sp, const uint8_t *codes,
                              size_t cb, const uint16_t *norms, int n, const float *q, int d, int rows, float *logits,
                              int ld, float *scratch);

vq_status vq_opt_int(const char *method, const char *key, const char *value, long lo, long hi, long step,
                     const char *allowed, int *out) {
    char *end = NULL;
    errno = 0;
    long x = strtol(value, &end, 10);
    if (end == value || *end != 0 || errno)
        return vq_fail(VQ_ERR_ARG, "%s: %s='%s' is not an integer (allowed %s)", method, key, value, allowed);
    if (x < lo || x > hi || x % step != 0)
        return vq_fail(VQ_ERR_ARG, "%s: %s=%ld is out of range (allowed %s)", method, key, x, allowed);
    *out = (int)x;
    return VQ_OK;
}

vq_status vq_opt_seed(const char *method, const char *value, uint64_t *out) {
    char *end = NULL;
    errno = 0;
    unsigned long long x = strtoull(value, &end, 10);
    if (end == value || *end != 0 || errno || value[0] == '-')
        return vq_fail(VQ_ERR_ARG, "%s: seed='%s' is not an unsigned integer (allowed 0..2^64-1)", method, value);
    *out = (uint64_t)x;
    return VQ_OK;
}

/* The code layout is pack.h's "planes": for b in {1, 2, 4} channel
 * s * stride + i sits in byte i at bit b * s; 3-bit codes are 2-bit planes
 * (low bits) followed by 1-bit planes (high bit). */
float vq_codes_dot(const uint8_t *packed, int d, int bits, const float *table, const float *q) {
#if defined(__x86_64__)
    float out;
    if (vq_cpu_has_avx2() && vq_codes_dot_avx2(packed, d, bits, table, q, &out)) return out;
#endif
    float s = 0;
    if (bits == 3) {
        /* channel c = j s2 + h s1 + i (s2 = 2 s1): low bits in byte h s1 + i
         * at 2 j, high bit in 1-bit plane byte i at 2 j + h; the channels in
         * order, without the divisions that made this path (head dims the
         * SIMD kernels do not take, e.g. 96) ~100x slower than they are */
        int s2 = d / 4, s1 = d / 8;
        const uint8_t *hi = packed + s2;
        for (int j = 0; j < 4; j++)
            for (int h = 0; h < 2; h++)
                for (int i = 0; i < s1; i++) {
                    int code = ((packed[h * s1 + i] >> (2 * j)) & 3) | (((hi[i] >> (2 * j + h)) & 1) << 2);
                    s += q[j * s2 + h * s1 + i] * table[code];
                }
        return s;
    }
    int per = 8 / bits, stride = d / per, mask = (1 << bits) - 1;
    for (int k = 0; k < per; k++) {
        const float *qk = q + k * stride;
        for (int i = 0; i < stride; i++) s += qk[i] * table[(packed[i] >> (bits * k)) & mask];
    }
    return s;
}

void vq_codes_dot_rows(const uint8_t *packed, int d, int bits, const float *table, const float *q, size_t q_stride,
                       int rows, float *out) {
#if defined(__x86_64__)
    if (vq_cpu_has_avx2() && vq_codes_dot_rows_avx2(packed, d, bits, table, q, q_stride, rows, out)) return;
#endif
    for (int r = 0; r < rows; r++) out[r] = vq_codes_dot(packed, d, bits, table, q + (size_t)r * q_stride);
}

void vq_codes_axpy(const uint8_t *packed, int d, int bits, const float *table, float w, float *acc) {
#if defined(__x86_64__)
    if (vq_cpu_has_avx2() && vq_codes_axpy_avx2(packed, d, bits, table, w, acc)) return;
#endif
    if (bits == 3) { /* channels as in vq_codes_dot */
        int s2 = d / 4, s1 = d / 8;
        const uint8_t *hi = packed + s2;
        for (int j = 0; j < 4; j++)
            for (int h = 0; h < 2; h++)
                for (int i = 0; i < s1; i++) {
                    int code = ((packed[h * s1 + i] >> (2 * j)) & 3) | (((hi[i] >> (2 * j + h)) & 1) << 2);
                    acc[j * s2 + h * s1 + i] += w * table[code];
                }
        return;
    }
    int per = 8 / bits, stride = d / per, mask = (1 << bits) - 1;
    for (int k = 0; k < per; k++) {
        float *ak = acc + k * stride;
        for (int i = 0; i < stride; i++) ak[i] += w * table[(packed[i] >> (bits * k)) & mask];
    }
}

void vq_codes_axpy_rows(const uint8_t *packed, int d, int bits, const float *table, const float *w, int rows,
                        float *acc, size_t acc_stride) {
#if defined(__x86_64__)
    if (vq_cpu_has_avx2() && vq_codes_axpy_rows_avx2(packed, d, bits, table, w, rows, acc, acc_stride)) return;
#endif
    for (int r = 0; r < rows; r++)
        if (w[r] != 0) vq_codes_axpy(packed, d, bits, table, w[r], acc + (size_t)r * acc_stride);
}

void vq_codes_score(const vq_code_part *parts, int nparts, const uint8_t *codes, size_t cb, const uint16_t *norms,
                    int n, const float *q, int d, int rows, float *logits, int ld, float *scratch) {
#if defined(__x86_64__)
    if (vq_cpu_has_avx512() && vq_codes_score_avx512(parts, nparts, codes, cb, norms, n, q, d, rows, logits, ld, scratch))
        return;
    if (vq_cpu_has_avx2() && vq_codes_score_avx2(parts, nparts, codes, cb, norms, n, q, d, rows, logits, ld, scratch))
        return;
#endif
    for (int t = 0; t < n; t++) {
        const uint8_t *ct = codes + (size_t)t * cb;
        int ch = 0;
        for (int k = 0; k < nparts; k++) {
            const vq_code_part *p = &parts[k];
            vq_codes_dot_rows(ct + p->off, p->n, p->bits, p->table, q + ch, (size_t)d, rows, scratch + k * rows);
            ch += p->n;
        }
        float len = vq_f16_to_f32(norms[t]);
        for (int r = 0; r < rows; r++) {
            float s = 0;
            for (int k = 0; k < nparts; k++) s += scratch[k * rows + r];
            logits[(size_t)r * ld + t] = len * s;
        }
    }
}

void vq_codes_signs_score(const vq_code_part *parts, int nparts, const vq_sign_part *sp, const uint8_t *codes,
                          size_t cb, const uint16_t *norms, int n, const float *q, int d, int rows, float *logits,
                          int ld, float *scratch) {
    int done = 0;
#if defined(__x86_64__)
    /* where the AVX-512 codes kernel covers the parts, it and then the sign
     * tables measured faster than the AVX2 single pass (tq-prod 3-bit 32.1
     * -> 28.4 ns per (token, kv head) in cache, 4-bit 36.4 -> 30.5; tq-prod
     * now scores its signs from nibble tables at that level, see
     * turboquant_prod.c) */
    if (vq_cpu_has_avx512() && vq_codes_score_avx512(parts, nparts, codes, cb, norms, n, q, d, rows, logits, ld, scratch)) {
        vq_signs_score(sp->tab, sp->m, rows, codes + sp->off, cb, sp->gain, n, logits, ld, true);
        return;
    }
    if (vq_cpu_has_avx2())
        done = vq_codes_signs_score_avx2(parts, nparts, sp, codes, cb, norms, n, q, d, rows, logits, ld, scratch);
#endif
    if (done == rows) return;
    /* the rows left: the two kernels one after the other (tables of leftover
     * rows are plain, one after another, so they start at row `done`) */
    float *lr = logits + (size_t)done * ld;
    vq_codes_score(parts, nparts, codes, cb, norms, n, q + (size_t)done * d, d, rows - done, lr, ld, scratch);
    vq_signs_score(sp->tab + (size_t)done * 32 * sp->m, sp->m, rows - done, codes + sp->off, cb, sp->gain, n, lr, ld,
                   true);
}

void vq_codes_accum(const vq_code_part *parts, int nparts, const uint8_t *codes, size_t cb, const uint16_t *norms,
                    int n, const float *w, int ld, int rows, float *acc, int d, float *scratch) {
#if defined(__x86_64__)
    if (vq_cpu_has_avx512() && vq_codes_accum_avx512(parts, nparts, codes, cb, norms, n, w, ld, rows, acc, d)) return;
    if (vq_cpu_has_avx2() && vq_codes_accum_avx2(parts, nparts, codes, cb, norms, n, w, ld, rows, acc, d)) return;
#endif
    for (int t = 0; t < n; t++) {
        const uint8_t *ct = codes + (size_t)t * cb;
        float len = vq_f16_to_f32(norms[t]);
        for (int r = 0; r < rows; r++) scratch[r] = w[(size_t)r * ld + t] * len;
        int ch = 0;
        for (int k = 0; k < nparts; k++) {
            const vq_code_part *p = &parts[k];
            vq_codes_axpy_rows(ct + p->off, p->n, p->bits, p->table, scratch, rows, acc + ch, (size_t)d);
            ch += p->n;
        }
    }
}

/* The 16 sums sum_i x_i (bit i of b ? lo + step : lo), i = 0..3, of w rows
 * (x_i at x[r * xs + i * cs]) into e[b * w + r]: entry b starts from the
 * one without b's lowest set bit, so each costs one multiply-add. Signs
 * take lo = -1, step = 2 (sums of +-x_i); 1-bit codes their two levels. */
static void nibble_sums(const float *x, size_t xs, size_t cs, float lo, float step, int w, float *e) {
    for (int r = 0; r < w; r++) {
        const float *xr = x + (size_t)r * xs;
        e[r] = (xr[0] + xr[cs]) * lo + (xr[2 * cs] + xr[3 * cs]) * lo;
    }
    for (int b = 1; b < 16; b++) {
        int i = 0;
        while (!((b >> i) & 1)) i++;
        const float *from = e + (b & (b - 1)) * w;
        for (int r = 0; r < w; r++) e[b * w + r] = from[r] + x[(size_t)r * xs + (size_t)i * cs] * step;
    }
}

/* Entry b = lo[b & 15] + hi[b >> 4] of one byte position's table for w
 * rows (lo, hi: [16][w]; e: [256][w]). With four rows a run of 16 entries
 * is lo plus one vector of hi, which the compiler vectorizes: the tables
 * are rebuilt every attention call, 32 m floats a row, and the scalar loop
 * cost about 20 ns per (token, kv head) at 512 cached tokens. */
static void expand_bytes(const float *lo, const float *hi, int w, float *e) {
    if (w == 4) {
        for (int bh = 0; bh < 16; bh++)
            for (int i = 0; i < 64; i += 4)
                for (int r = 0; r < 4; r++) e[bh * 64 + i + r] = lo[i + r] + hi[bh * 4 + r];
        return;
    }
    for (int b = 0; b < 256; b++) e[b] = lo[b & 15] + hi[b >> 4];
}

/* Byte positions k0 .. k0 + nk of the tables of w rows (4: interleaved, or
 * 1), from v (the projected rows for signs 8 k0 on, vs apart): each entry is
 * the sum of its two nibbles' entries. */
static void table_group(const float *v, size_t vs, int k0, int nk, int w, float *tab) {
    float lo[16 * 4], hi[16 * 4];
    for (int k = 0; k < nk; k++) {
        nibble_sums(v + 8 * k, vs, 1, -1.0f, 2.0f, w, lo);
        nibble_sums(v + 8 * k + 4, vs, 1, -1.0f, 2.0f, w, hi);
        expand_bytes(lo, hi, w, tab + (size_t)(k0 + k) * 256 * w);
    }
}

/* a . b in fp32 (AVX2 when present: the projections of the query are m d
 * multiply-adds a row and attention call). */
static float dot(const float *a, const float *b, int n) {
#if defined(__x86_64__)
    if (vq_cpu_has_avx2()) return vq_dot_avx2(a, b, n);
#endif
    return vq_vec_dot(a, b, n);
}

/* out[k] = a . x_k for four vectors x_k (xs floats apart): a is read once
 * for the four, with each product and sum as in dot(), so the same bits. */
static void dot4(const float *a, const float *x, size_t xs, int n, float out[4]) {
#if defined(__x86_64__)
    if (vq_cpu_has_avx2()) {
        vq_dot4_avx2(a, x, xs, n, out);
        return;
    }
#endif
    for (int k = 0; k < 4; k++) out[k] = vq_vec_dot(a, x + (size_t)k * xs, n);
}

/* Signs projected per piece, so the stack holds 4 rows x PIECE floats. */
#define PIECE 256

void vq_signs_table(const float *s, int m, int d, const float *x, size_t x_stride, int rows, float *tab) {
    float v[4 * PIECE];
    for (int r = 0; r < rows;) {
        int w = rows - r >= 4 ? 4 : 1;
        for (int i0 = 0; i0 < m; i0 += PIECE) {
            int cnt = m - i0 < PIECE ? m - i0 : PIECE;
            for (int i = 0; i < cnt; i++) {
                const float *si = s + (size_t)(i0 + i) * d;
                if (w == 1) {
                    v[i] = dot(si, x + (size_t)r * x_stride, d);
                    continue;
                }
                float o[4];
                dot4(si, x + (size_t)r * x_stride, x_stride, d, o);
                for (int k = 0; k < 4; k++) v[k * PIECE + i] = o[k];
            }
            table_group(v, PIECE, i0 / 8, cnt / 8, w, tab + (size_t)r * 32 * m);
        }
        r += w;
    }
}

bool vq_signs_nibbled(int m) {
#if defined(__x86_64__)
    return vq_cpu_has_avx512() && m % 4 == 0;
#else
    (void)m;
    return false;
#endif
}

void vq_signs_score_nibbles(const float *nib, int m, int rows, const uint8_t *signs, size_t stride, const float *gain,
                            int n, float *out, int ld, bool add) {
#if defined(__x86_64__)
    vq_signs_score_avx512(nib, m, rows, signs, stride, gain, n, out, ld, add);
#else
    (void)nib, (void)m, (void)rows, (void)signs, (void)stride, (void)gain, (void)n, (void)out, (void)ld, (void)add;
#endif
}

/* S x of each row goes into the first m floats of its 4 m, then the
 * tables are written back to front: table j (floats 16 j ..) is made
 * from floats 4 j .. 4 j + 3 and overwrites only those of tables after
 * it, except table 0, which is made from a copy. */
void vq_signs_nibbles(const float *s, int m, int d, const float *x, size_t x_stride, int rows, float *nib) {
    vq_project_rows(s, m, d, x, x_stride, rows, nib, (size_t)4 * m);
    for (int r = 0; r < rows; r++) {
        float *t = nib + (size_t)r * 4 * m;
        for (int j = m / 4 - 1; j >= 0; j--) {
            float v[4] = {t[4 * j], t[4 * j + 1], t[4 * j + 2], t[4 * j + 3]};
            for (int x4 = 0; x4 < 16; x4++) {
                float sum = 0;
                for (int b = 0; b < 4; b++) sum += (x4 >> b & 1) ? v[b] : -v[b];
                t[16 * j + x4] = sum;
            }
        }
    }
}

/* Code byte k holds channels k + j d/8, j = 0..7 (pack.h). Its nibbles'
 * sums sum_j x_j levels[bit j] of w rows go to lo and hi ([16][w]), then
 * entry b = lo[b & 15] + hi[b >> 4]. */
void vq_codes_table(int d, const float *levels, const float *x, size_t x_stride, int rows, float *tab) {
    size_t stride = (size_t)d / 8;
    float lo[16 * 4], hi[16 * 4];
    for (int r0 = 0; r0 < rows;) {
        int w = rows - r0 >= 4 ? 4 : 1;
        for (size_t k = 0; k < stride; k++) {
            const float *xk = x + (size_t)r0 * x_stride + k;
            nibble_sums(xk, x_stride, stride, levels[0], levels[1] - levels[0], w, lo);
            nibble_sums(xk + 4 * stride, x_stride, stride, levels[0], levels[1] - levels[0], w, hi);
            expand_bytes(lo, hi, w, tab + (size_t)r0 * 256 * stride + k * 256 * (size_t)w);
        }
        r0 += w;
    }
}

void vq_signs_score(const float *tab, int m, int rows, const uint8_t *signs, size_t stride, const float *gain, int n,
                    float *out, int ld, bool add) {
#if defined(__x86_64__)
    if (vq_cpu_has_avx2()) {
        vq_signs_score_avx2(tab, m, rows, signs, stride, gain, n, out, ld, add);
        return;
    }
#endif
    for (int r = 0; r < rows;) {
        int w = rows - r >= 4 ? 4 : 1;
        const float *tg = tab + (size_t)r * 32 * m;
        for (int t = 0; t < n; t++) {
            const uint8_t *s = signs + (size_t)t * stride;
            float acc[4] = {0, 0, 0, 0};
            for (int k = 0; k < m / 8; k++) {
                const float *e = tg + ((size_t)256 * k + s[k]) * w;
                for (int i = 0; i < w; i++) acc[i] += e[i];
            }
            for (int i = 0; i < w; i++) {
                float *o = out + (size_t)(r + i) * ld + t;
                *o = add ? *o + gain[t] * acc[i] : gain[t] * acc[i];
            }
        }
        r += w;
    }
}

void vq_signs_score2(const float *tab_a, const float *tab_b, int m, int rows, const uint8_t *signs, size_t b_off,
                     size_t stride, const float *ga, const float *gb, int n, float *out, int ld) {
#if defined(__x86_64__)
    if (vq_cpu_has_avx2()) {
        vq_signs_score2_avx2(tab_a, tab_b, m, rows, signs, b_off, stride, ga, gb, n, out, ld);
        return;
    }
#endif
    vq_signs_score(tab_a, m, rows, signs, stride, ga, n, out, ld, false);
    vq_signs_score(tab_b, m, rows, signs + b_off, stride, gb, n, out, ld, true);
}

void vq_signs_accum(const uint8_t *signs, size_t stride, int m, const float *gain, int n, const float *w, int ld,
                    int rows, float *z, size_t z_stride) {
#if defined(__x86_64__)
    if (vq_cpu_has_avx512() && m % 16 == 0) {
        vq_signs_accum_avx512(signs, stride, m, gain, n, w, ld, rows, z, z_stride);
        return;
    }
    if (vq_cpu_has_avx2()) {
        vq_signs_accum_avx2(signs, stride, m, gain, n, w, ld, rows, z, z_stride);
        return;
    }
#endif
    for (int t = 0; t < n; t++)
        for (int r = 0; r < rows; r++) {
            float wt = w[(size_t)r * ld + t] * gain[t];
            if (wt != 0) vq_signs_axpy(signs + (size_t)t * stride, m, wt, z + (size_t)r * z_stride);
        }
}

void vq_signs_pack(const float *y, int m, uint8_t *out) {
    memset(out, 0, (size_t)(m + 7) / 8);
    for (int i = 0; i < m; i++)
        if (y[i] >= 0) out[i / 8] |= (uint8_t)(1u << (i % 8));
}

void vq_signs_axpy(const uint8_t *signs, int m, float w, float *acc) {
#if defined(__x86_64__)
    if (vq_cpu_has_avx2() && m % 8 == 0) {
        vq_signs_axpy_avx2(signs, m, w, acc);
        return;
    }
#endif
    for (int i = 0; i < m; i++) acc[i] += ((signs[i / 8] >> (i % 8)) & 1) ? w : -w;
}

void vq_project(const float *s, int m, int d, const float *x, float *y) {
    for (int i = 0; i < m; i++) y[i] = vq_vec_dot(s + (size_t)i * d, x, d);
}

void vq_project_rows(const float *s, int m, int d, const float *x, size_t xs, int rows, float *y, size_t ys) {
    int r = 0;
    for (; r + 4 <= rows; r += 4)
        for (int i = 0; i < m; i++) {
            float o[4];
            dot4(s + (size_t)i * d, x + (size_t)r * xs, xs, d, o);
            for (int k = 0; k < 4; k++) y[(size_t)(r + k) * ys + i] = o[k];
        }
    for (; r < rows; r++)
        for (int i = 0; i < m; i++) y[(size_t)r * ys + i] = dot(s + (size_t)i * d, x + (size_t)r * xs, d);
}

void vq_project_transpose_add(const float *s, int m, int d, const float *y, float *x) {
#if defined(__x86_64__)
    if (vq_cpu_has_avx2()) {
        vq_project_transpose_add_avx2(s, m, d, y, x);
        return;
    }
#endif
    for (int i = 0; i < m; i++) vq_vec_axpy(y[i], s + (size_t)i * d, x, d);
}

double vq_norm(const float *x, int d) {
    double s = 0;
    for (int i = 0; i < d; i++) s += (double)x[i] * x[i];
    return sqrt(s);
}

size_t vq_rotated_prep_floats(const vq_mparams *p) { return (size_t)p->head_dim; }

void vq_rotated_prep_query(const vq_mparams *p, const float *q, int rows, float *prep) {
    int d = p->head_dim;
    for (int r = 0; r < rows; r++) vq_rotate(p->rot, q + (size_t)r * d, prep + (size_t)r * d);
}

void vq_rotated_finish_rows(const vq_mparams *p, float *acc, int rows) {
    int d = p->head_dim;
    for (int r = 0; r < rows; r++) vq_rotate_inverse(p->rot, acc + (size_t)r * d, acc + (size_t)r * d);
}
