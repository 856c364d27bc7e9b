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
float vq_signs_dot_avx2(const uint8_t *signs, int m, const float *v);
bool vq_codes_axpy_rows_avx2(const uint8_t *packed, int d, int bits, const float *table, const float *w, int rows,
                             float *acc, size_t acc_stride);
void vq_signs_axpy_avx2(const uint8_t *signs, int m, float w, float *acc);
/* kernels/cpu/rotated_avx2.c */
bool vq_codes_score_avx2(const vq_code_part *parts, int nparts, const uint8_t *codes, size_t cb,
                         const uint16_t *norms, int n, const float *q, int d, int rows, float *logits, int ld,
                         float *scratch);
bool vq_codes_accum_avx2(const vq_code_part *parts, int nparts, const uint8_t *codes, size_t cb,
                         const uint16_t *norms, int n, const float *w, int ld, int rows, float *acc, int d);

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
        int s2 = d / 4, s1 = d / 8;
        const uint8_t *hi = packed + s2;
        for (int c = 0; c < d; c++) {
            int code = ((packed[c % s2] >> (2 * (c / s2))) & 3) | (((hi[c % s1] >> (c / s1)) & 1) << 2);
            s += q[c] * table[code];
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
    if (bits == 3) {
        int s2 = d / 4, s1 = d / 8;
        const uint8_t *hi = packed + s2;
        for (int c = 0; c < d; c++) {
            int code = ((packed[c % s2] >> (2 * (c / s2))) & 3) | (((hi[c % s1] >> (c / s1)) & 1) << 2);
            acc[c] += w * table[code];
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

void vq_codes_accum(const vq_code_part *parts, int nparts, const uint8_t *codes, size_t cb, const uint16_t *norms,
                    int n, const float *w, int ld, int rows, float *acc, int d, float *scratch) {
#if defined(__x86_64__)
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

void vq_signs_pack(const float *y, int m, uint8_t *out) {
    memset(out, 0, (size_t)(m + 7) / 8);
    for (int i = 0; i < m; i++)
        if (y[i] >= 0) out[i / 8] |= (uint8_t)(1u << (i % 8));
}

float vq_signs_dot(const uint8_t *signs, int m, const float *v) {
#if defined(__x86_64__)
    if (vq_cpu_has_avx2() && m % 8 == 0) return vq_signs_dot_avx2(signs, m, v);
#endif
    float s = 0;
    for (int i = 0; i < m; i++) s += ((signs[i / 8] >> (i % 8)) & 1) ? v[i] : -v[i];
    return s;
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

void vq_project_transpose_add(const float *s, int m, int d, const float *y, float *x) {
    for (int i = 0; i < m; i++) vq_vec_axpy(y[i], s + (size_t)i * d, x, d);
}

double vq_norm(const float *x, int d) {
    double s = 0;
    for (int i = 0; i < d; i++) s += (double)x[i] * x[i];
    return sqrt(s);
}
