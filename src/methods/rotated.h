/* Helpers shared by the rotation-and-codebook methods (turboquant_mse.c,
 * turboquant_prod.c, rvq.c, qjl.c, polarquant.c): option parsing with the
 * messages every method gives, the kernels that read codes directly, and
 * the query and output rotations of tq-mse and rvq.
 *
 * A "table" is the per-coordinate scalar codebook of a method (<= 16
 * levels); codes are packed with vq_pack_codes (pack.h). Sign sketches are
 * m bits, bit i in byte i / 8 at bit i % 8, 1 meaning +1. */
#ifndef VQ_ROTATED_H
#define VQ_ROTATED_H

#include "core/rotate.h"
#include "vq_internal.h"

/* Parses an integer option of `method`: lo..hi, and a multiple of `step`
 * (1: any); `allowed` describes the valid values for the message. */
vq_status vq_opt_int(const char *method, const char *key, const char *value, long lo, long hi, long step,
                     const char *allowed, int *out);
/* Parses seed=N (an unsigned 64-bit integer). */
vq_status vq_opt_seed(const char *method, const char *value, uint64_t *out);

/* sum_c q[c] * table[code_c] over the d packed codes (bits 1..4). */
float vq_codes_dot(const uint8_t *packed, int d, int bits, const float *table, const float *q);
/* out[r] = vq_codes_dot(packed, ..., q + r * q_stride) for r < rows, with
 * each code read once for all rows. */
void vq_codes_dot_rows(const uint8_t *packed, int d, int bits, const float *table, const float *q, size_t q_stride,
                       int rows, float *out);
/* acc[c] += w * table[code_c] over the d packed codes. */
void vq_codes_axpy(const uint8_t *packed, int d, int bits, const float *table, float w, float *acc);
/* acc[r * acc_stride + c] += w[r] * table[code_c] for r < rows, each code
 * read once for all rows. */
void vq_codes_axpy_rows(const uint8_t *packed, int d, int bits, const float *table, const float *w, int rows,
                        float *acc, size_t acc_stride);

/* One run of a token's codes: n channels at `bits` (1..4) with levels
 * table, packed with vq_pack_codes starting `off` bytes into the token's
 * codes. A token's parts cover its channels in order (tq-mse at a
 * fractional rate: the b+1-bit part, then the b-bit part). */
typedef struct {
    int off, n, bits;
    const float *table;
    /* 4-bit parts may give their levels as two 4-entry tables too:
     * halves[0..3] = hi, halves[4..7] = lo with table[4 a + b] == hi[a] +
     * lo[b] exactly (rvq); NULL otherwise. */
    const float *halves;
} vq_code_part;

/* Attention straight from codes for the rotation methods. Token t's codes
 * start at codes + t * cb, its fp16 norm is norms[t]; q and acc rows are d
 * floats apart (the rotated domain; d is only the row stride, the parts give
 * the channels: tq-prod's accumulator rows are 2 head_dim apart).
 * Score: logits[r * ld + t] = norms[t] * sum_c q[r][c] * level_t[c].
 * Accum: acc[r][c] += sum_t w[r * ld + t] * norms[t] * level_t[c].
 * scratch: vq_codes_scratch(d, rows) floats (both). */
/* Scratch floats of vq_codes_score and vq_codes_accum: q of 4 rows in the
 * kernels' reading order (whole runs of each plane's slots: a 1-bit part
 * of 96 channels reads 2 runs of 8 channels for each of its 8 slots in the
 * AVX2 kernels, one of 16 in the AVX-512 ones; a 1-bit part of 48 channels
 * takes 8 runs of 16 there, and tq-mse 3.5-bit at d = 64 a 3-bit part of
 * 32 channels 4 runs of 16: 128 more than the head dim rounded up to 64
 * covers every part), or the scalar path's per-part row sums. */
static inline size_t vq_codes_scratch(int d, int rows) {
    return 4 * (((size_t)d + 63) / 64 * 64 + 128) + 2 * (size_t)rows;
}
void vq_codes_score(const vq_code_part *parts, int nparts, const uint8_t *codes, size_t cb, const uint16_t *norms,
                    int n, const float *q, int d, int rows, float *logits, int ld, float *scratch);
void vq_codes_accum(const vq_code_part *parts, int nparts, const uint8_t *codes, size_t cb, const uint16_t *norms,
                    int n, const float *w, int ld, int rows, float *acc, int d, float *scratch);

/* A sign sketch scored along with a token's codes (tq-prod keys): m signs
 * `off` bytes into each token's codes, scored from vq_signs_table's tables
 * tab (the same rows as q) and scaled by gain[t]. */
typedef struct {
    const float *tab;
    int m;
    size_t off;
    const float *gain;
} vq_sign_part;
/* vq_codes_score followed by vq_signs_score adding sp's scores, bit for
 * bit, with the two in one pass over the tokens where the AVX2 kernels
 * cover the shape (at level avx512, where the AVX-512 codes kernel covers
 * the parts, one after the other). */
void vq_codes_signs_score(const vq_code_part *parts, int nparts, const vq_sign_part *sp, const uint8_t *codes,
                          size_t cb, const uint16_t *norms, int n, const float *q, int d, int rows, float *logits,
                          int ld, float *scratch);

/* Sign sketches scored through per-query tables (QJL keys, tq-prod's
 * residual stage). For each byte k of a sketch (signs 8k..8k+7) and each of
 * its 256 values b, a row's table holds sum_i (bit i of b ? v : -v)[8k + i]
 * with v = S x the projected query, so a sketch of m signs scores as the sum
 * of m/8 table entries: lookups and adds, no per-sign work. A table is 32 m
 * floats (64 KB for four rows at m = 128, 128 KB at m = 256: L2, not L1;
 * nibble tables at 4 m floats fit L1 but take twice the lookups and the
 * nibble extraction, and measured 5-14 % slower for tq-prod and qjl in
 * cache with the AVX2 kernels, which look entries up one at a time). Rows
 * are interleaved in fours (entry (k, b) of rows 4a..4a+3 side by side: one
 * 16-byte load serves four rows); the leftover rows each have a plain
 * table after them. m is a multiple of 8. */
static inline size_t vq_signs_table_floats(int m, int rows) { return (size_t)32 * (size_t)m * (size_t)rows; }
/* The tables of v = S x for `rows` vectors x (d floats each, x_stride
 * apart) and the m x d row-major S; S x is never stored whole. */
void vq_signs_table(const float *s, int m, int d, const float *x, size_t x_stride, int rows, float *tab);
/* Whether sketches of m signs are scored from nibble tables instead
 * (vq_signs_nibbles, vq_signs_score_nibbles): at level avx512, m a multiple
 * of 4. The AVX-512 kernel (kernels/cpu/signs_avx512.c) looks up 16
 * tokens' nibbles at once with vpermps. */
bool vq_signs_nibbled(int m);
/* The nibble tables of v = S x: table j of a row (16 floats) holds
 * sum_{b < 4} (bit b of x ? v : -v)[4 j + b] for each nibble x; 4 m floats
 * a row, rows 4 m apart. */
static inline size_t vq_signs_nibbles_floats(int m, int rows) { return (size_t)4 * (size_t)m * (size_t)rows; }
void vq_signs_nibbles(const float *s, int m, int d, const float *x, size_t x_stride, int rows, float *nib);
/* vq_signs_score from vq_signs_nibbles' tables; only where
 * vq_signs_nibbled(m). Reads whole 16-byte pieces of each sketch: up to 15
 * bytes past the last one's end must be readable (in a block, its next
 * part). */
void vq_signs_score_nibbles(const float *nib, int m, int rows, const uint8_t *signs, size_t stride, const float *gain,
                            int n, float *out, int ld, bool add);
/* 1-bit packed codes (pack.h) scored the same way: tables in
 * vq_signs_table's layout whose entry (k, b) holds sum_j x[channel] *
 * levels[code] over the 8 codes a byte value b at byte k holds, so
 * vq_signs_score with m = d gives sum_c x[c] levels[code_c] from d/8
 * lookups and adds (tq-prod 2-bit keys: 16 for d = 128, against 32
 * multiply-adds for four rows in the codes kernel). */
void vq_codes_table(int d, const float *levels, const float *x, size_t x_stride, int rows, float *tab);
/* out[r * ld + t] (+)= gain[t] * sum_i s_t,i v_r[i] for the n sketches
 * signs + t * stride, from vq_signs_table's tab; `add` adds instead of
 * storing. */
void vq_signs_score(const float *tab, int m, int rows, const uint8_t *signs, size_t stride, const float *gain, int n,
                    float *out, int ld, bool add);
/* Two sketches of m signs a token in one pass (tq-prod 2-bit keys: the
 * 1-bit codes through vq_codes_table's tables, then the residual's signs):
 * out[r * ld + t] = ga[t] * (score of signs + t * stride from tab_a) +
 * gb[t] * (score of the sketch b_off bytes further from tab_b), with the
 * bits of vq_signs_score for a (storing) followed by one for b (adding). */
void vq_signs_score2(const float *tab_a, const float *tab_b, int m, int rows, const uint8_t *signs, size_t b_off,
                     size_t stride, const float *ga, const float *gb, int n, float *out, int ld);
/* z[r * z_stride + i] += sum_t w[r * ld + t] * gain[t] * s_t,i for the n
 * sketches signs + t * stride (values weighted by the softmax: tq-prod's
 * residual). */
void vq_signs_accum(const uint8_t *signs, size_t stride, int m, const float *gain, int n, const float *w, int ld,
                    int rows, float *z, size_t z_stride);

/* Writes the m signs of y (y >= 0 -> bit set). */
void vq_signs_pack(const float *y, int m, uint8_t *out);
/* acc[i] += w * s_i. */
void vq_signs_axpy(const uint8_t *signs, int m, float w, float *acc);

/* y[0..m) = S x for the m x d row-major S. */
void vq_project(const float *s, int m, int d, const float *x, float *y);
/* y_r = S x_r for `rows` vectors (x_r at x + r * xs, y_r at y + r * ys),
 * each row of S read once for four vectors where AVX2 is present. */
void vq_project_rows(const float *s, int m, int d, const float *x, size_t xs, int rows, float *y, size_t ys);
/* x[0..d) += S^T y for the m x d row-major S. */
void vq_project_transpose_add(const float *s, int m, int d, const float *y, float *x);

/* The Euclidean norm of x[0..d) in double. */
double vq_norm(const float *x, int d);

/* Method-table entries of the methods whose attention works in the rotated
 * domain of p->rot with d floats a prepared row (tq-mse, rvq): the query
 * rows are rotated once per call, the value sums rotated back once. */
size_t vq_rotated_prep_floats(const vq_mparams *p);
void vq_rotated_prep_query(const vq_mparams *p, const float *q, int rows, float *prep);
void vq_rotated_finish_rows(const vq_mparams *p, float *acc, int rows);

#endif
