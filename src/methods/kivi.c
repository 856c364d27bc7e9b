/* KIVI: asymmetric min/max quantization, keys per channel and values per
 * token (Liu et al., "KIVI: A Tuning-Free Asymmetric 2bit Quantization for KV
 * Cache", arXiv 2402.02750).
 *
 * A group of G values x gets zero = min(x), scale = (max(x) - min(x)) / (2^b - 1)
 * rounded to fp16 (scale and zero are stored as fp16, so decoding uses exactly
 * the stored numbers), code = rint((x - zero) / scale) clamped to [0, 2^b - 1]
 * (round half to even), and x_hat = code * scale + zero. A group with
 * max == min stores scale 0 and codes 0.
 *
 * Keys: G consecutive tokens of one channel share (scale, zero); a block
 * holds block_tokens / G such groups. Payload: codes [block_tokens][d*b/8],
 * then per token group fp16 scale[d] and zero[d].
 * Values: G consecutive channels of one token share (scale, zero). A last
 * group shorter than G (d not a multiple of G) uses the channels it has,
 * which is what padding by repeating the last element gives. Payload: codes
 * [block_tokens][d*b/8], then per token fp16 (scale, zero) x ceil(d / G).
 *
 * Attention never decodes: keys score as sum_d (q_d s_d) c_d + sum_d q_d z_d
 * per token group, values accumulate (w_t s_tg) c_td and add sum_t w_t z_tg
 * once per call (see DESIGN.md, "Kernel math").
 */
#include "vq_internal.h"
#include "pack.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* AVX2 kernels (kernels/cpu/kivi_avx2.c); return false when they do not
 * cover the shape, and the scalar code runs instead. */
bool vq_kivi_score_avx2(const vq_mparams *p, const float *q, int rows, const uint8_t *blk,
                        int block_tokens, int t0, int n, float *logits, int ld, float *scratch);
bool vq_kivi_accum_avx2(const vq_mparams *p, const float *w, int ld, int rows, const uint8_t *blk,
                        int block_tokens, int t0, int n, float *acc, float *scratch);
size_t vq_kivi_scratch_avx2(const vq_mparams *p);

/* Parses an integer option; `allowed` describes the valid values for the
 * message, and lo..hi bounds them. */
static vq_status parse_int(const char *key, const char *value, long lo, long hi, const char *allowed, int *out) {
    char *end = NULL;
    long x = strtol(value, &end, 10);
    if (end == value || *end != 0)
        return vq_fail(VQ_ERR_ARG, "kivi: %s='%s' is not an integer (allowed %s)", key, value, allowed);
    if (x < lo || x > hi)
        return vq_fail(VQ_ERR_ARG, "kivi: %s=%ld is out of range (allowed %s)", key, x, allowed);
    *out = (int)x;
    return VQ_OK;
}

static vq_status kivi_set_option(vq_mparams *p, const char *key, const char *value) {
    if (strcmp(key, "bits") == 0) {
        vq_status st = parse_int(key, value, 2, 8, "2, 3, 4, 8", &p->bits);
        if (!st && p->bits != 2 && p->bits != 3 && p->bits != 4 && p->bits != 8)
            st = vq_fail(VQ_ERR_ARG, "kivi: bits=%d is not supported (allowed 2, 3, 4, 8)", p->bits);
        return st;
    }
    if (strcmp(key, "group") == 0) {
        vq_status st = parse_int(key, value, 32, 128, "32, 64, 128", &p->group);
        if (!st && p->group != 32 && p->group != 64 && p->group != 128)
            st = vq_fail(VQ_ERR_ARG, "kivi: group=%d is not supported (allowed 32, 64, 128)", p->group);
        return st;
    }
    if (strcmp(key, "residual") == 0) return parse_int(key, value, 0, 4096, "0..4096", &p->residual);
    return vq_fail(VQ_ERR_ARG, "kivi: unknown option '%s' (options: bits, group, residual)", key);
}

static vq_status kivi_finish(vq_mparams *p) {
    if (p->bits == 0) p->bits = 2;
    if (p->group == 0) p->group = 32;
    if (p->residual < 0) p->residual = 128;
    if (p->head_dim % 8 != 0 || p->head_dim < 8)
        return vq_fail(VQ_ERR_ARG, "kivi: head dim %d is not supported (a multiple of 8, >= 8)", p->head_dim);
    return VQ_OK;
}

static void kivi_describe(const vq_mparams *p, char *buf, size_t size) {
    snprintf(buf, size, "kivi:bits=%d,group=%d,residual=%d", p->bits, p->group, p->residual);
}

static int kivi_token_group(const vq_mparams *p) { return p->is_value ? 1 : p->group; }

static int value_groups(const vq_mparams *p) { return (p->head_dim + p->group - 1) / p->group; }

static size_t kivi_block_bytes(const vq_mparams *p, int bt) {
    size_t codes = (size_t)bt * vq_packed_bytes(p->bits, p->head_dim);
    if (p->is_value) return codes + (size_t)bt * (size_t)value_groups(p) * 4;
    /* a block smaller than a group (eviction's size classes) holds part of one */
    return codes + (size_t)((bt + p->group - 1) / p->group) * (size_t)p->head_dim * 4;
}

static int kivi_layout(const vq_mparams *p, size_t *row_bytes) {
    row_bytes[0] = vq_packed_bytes(p->bits, p->head_dim);
    if (!p->is_value) return 1; /* the per-group scales and zeros follow */
    row_bytes[1] = (size_t)value_groups(p) * 4;
    return 2;
}

static double kivi_bits(const vq_mparams *p) {
    if (p->is_value) return p->bits + 32.0 * value_groups(p) / p->head_dim;
    return p->bits + 32.0 / p->group;
}

/* fp16 scale and zero of a group with the given min and max. */
static void group_params(float mn, float mx, int bits, uint16_t *scale_h, uint16_t *zero_h) {
    *zero_h = vq_f32_to_f16(mn);
    *scale_h = vq_f32_to_f16((mx - mn) / (float)((1 << bits) - 1));
}

static uint8_t quant_code(float x, float scale, float zero, int bits) {
    if (!(scale > 0)) return 0;
    float c = rintf((x - zero) / scale);
    float maxq = (float)((1 << bits) - 1);
    if (c < 0) c = 0;
    if (c > maxq) c = maxq;
    return (uint8_t)c;
}

static void kivi_encode(const vq_mparams *p, const float *x, size_t x_stride, int n, uint8_t *blk,
                        int bt, int t0) {
    int d = p->head_dim, G = p->group, bits = p->bits;
    size_t cb = vq_packed_bytes(bits, d);
    uint8_t codes[1024];
    float sf[1024], zf[1024];
    if (!p->is_value) {
        /* n is a multiple of G and t0 is group-aligned: each channel of each
         * token group gets its own (scale, zero). */
        uint16_t *meta = (uint16_t *)(blk + (size_t)bt * cb);
        for (int g = 0; g < n / G; g++) {
            const float *xg = x + (size_t)g * G * x_stride;
            uint16_t *sc = meta + (size_t)((t0 + g * G) / G) * 2 * d, *zr = sc + d;
            for (int c = 0; c < d; c++) {
                float mn = xg[c], mx = xg[c];
                for (int t = 1; t < G; t++) {
                    float v = xg[(size_t)t * x_stride + c];
                    mn = v < mn ? v : mn;
                    mx = v > mx ? v : mx;
                }
                group_params(mn, mx, bits, sc + c, zr + c);
                sf[c] = vq_f16_to_f32(sc[c]);
                zf[c] = vq_f16_to_f32(zr[c]);
            }
            for (int t = 0; t < G; t++) {
                const float *xt = xg + (size_t)t * x_stride;
                for (int c = 0; c < d; c++) codes[c] = quant_code(xt[c], sf[c], zf[c], bits);
                vq_pack_codes(codes, d, bits, blk + (size_t)(t0 + g * G + t) * cb);
            }
        }
        return;
    }
    int ng = value_groups(p);
    uint16_t *meta = (uint16_t *)(blk + (size_t)bt * cb);
    for (int t = 0; t < n; t++) {
        const float *xt = x + (size_t)t * x_stride;
        uint16_t *m = meta + (size_t)(t0 + t) * ng * 2;
        for (int g = 0; g < ng; g++) {
            int c0 = g * G, c1 = c0 + G < d ? c0 + G : d;
            float mn = xt[c0], mx = xt[c0];
            for (int c = c0 + 1; c < c1; c++) {
                mn = xt[c] < mn ? xt[c] : mn;
                mx = xt[c] > mx ? xt[c] : mx;
            }
            group_params(mn, mx, bits, m + 2 * g, m + 2 * g + 1);
            float s = vq_f16_to_f32(m[2 * g]), z = vq_f16_to_f32(m[2 * g + 1]);
            for (int c = c0; c < c1; c++) codes[c] = quant_code(xt[c], s, z, bits);
        }
        vq_pack_codes(codes, d, bits, blk + (size_t)(t0 + t) * cb);
    }
}

static void kivi_decode(const vq_mparams *p, const uint8_t *blk, int bt, int t0, int n, float *out) {
    int d = p->head_dim, G = p->group, bits = p->bits;
    size_t cb = vq_packed_bytes(bits, d);
    const uint16_t *meta = (const uint16_t *)(blk + (size_t)bt * cb);
    uint8_t codes[1024];
    int ng = value_groups(p);
    for (int t = t0; t < t0 + n; t++) {
        vq_unpack_codes(blk + (size_t)t * cb, d, bits, codes);
        float *o = out + (size_t)(t - t0) * d;
        for (int c = 0; c < d; c++) {
            float s, z;
            if (p->is_value) {
                const uint16_t *m = meta + (size_t)t * ng * 2 + 2 * (c / G);
                s = vq_f16_to_f32(m[0]);
                z = vq_f16_to_f32(m[1]);
            } else {
                const uint16_t *m = meta + (size_t)(t / G) * 2 * d;
                s = vq_f16_to_f32(m[c]);
                z = vq_f16_to_f32(m[d + c]);
            }
            float prod = (float)codes[c] * s; /* two roundings, as the formula reads */
            o[c] = prod + z;
        }
    }
}

static size_t kivi_scratch(const vq_mparams *p, int rows) {
    /* scalar code: keys need per row q' (d) and the zero term (1); values
     * per row the zero accumulators (groups) */
    size_t d = (size_t)p->head_dim, ng = (size_t)value_groups(p);
    size_t scalar = p->is_value ? (size_t)rows * ng + d + 16 : (size_t)rows * (d + 1) + d + 16;
#if defined(__x86_64__)
    size_t avx2 = vq_kivi_scratch_avx2(p); /* the AVX2 kernels' tables */
    if (avx2 > scalar) scalar = avx2;
#endif
    return scalar;
}

static void kivi_score(const vq_mparams *p, const float *q, int rows, const uint8_t *blk, int bt,
                       int t0, int n, float *logits, int ld, float *scratch) {
#if defined(__x86_64__)
    if (vq_cpu_has_avx2() && vq_kivi_score_avx2(p, q, rows, blk, bt, t0, n, logits, ld, scratch)) return;
#endif
    int d = p->head_dim, G = p->group, bits = p->bits;
    size_t cb = vq_packed_bytes(bits, d);
    const uint16_t *meta = (const uint16_t *)(blk + (size_t)bt * cb);
    float *qs = scratch;                       /* [rows][d] q_d * scale_d */
    float *qz = scratch + (size_t)rows * d;    /* [rows] sum_d q_d zero_d */
    uint8_t codes[1024];
    for (int t = t0; t < t0 + n;) {
        int g = t / G, end = (g + 1) * G;
        if (end > t0 + n) end = t0 + n;
        const uint16_t *sc = meta + (size_t)g * 2 * d, *zr = sc + d;
        for (int r = 0; r < rows; r++) {
            const float *qr = q + (size_t)r * d;
            float z = 0;
            for (int c = 0; c < d; c++) {
                qs[(size_t)r * d + c] = qr[c] * vq_f16_to_f32(sc[c]);
                z += qr[c] * vq_f16_to_f32(zr[c]);
            }
            qz[r] = z;
        }
        for (; t < end; t++) {
            vq_unpack_codes(blk + (size_t)t * cb, d, bits, codes);
            for (int r = 0; r < rows; r++) {
                const float *qr = qs + (size_t)r * d;
                float s = 0;
                for (int c = 0; c < d; c++) s += qr[c] * (float)codes[c];
                logits[(size_t)r * ld + (t - t0)] = s + qz[r];
            }
        }
    }
}

static void kivi_accum(const vq_mparams *p, const float *w, int ld, int rows, const uint8_t *blk,
                       int bt, int t0, int n, float *acc, float *scratch) {
#if defined(__x86_64__)
    if (vq_cpu_has_avx2() && vq_kivi_accum_avx2(p, w, ld, rows, blk, bt, t0, n, acc, scratch)) return;
#endif
    int d = p->head_dim, G = p->group, bits = p->bits, ng = value_groups(p);
    size_t cb = vq_packed_bytes(bits, d);
    const uint16_t *meta = (const uint16_t *)(blk + (size_t)bt * cb);
    float *zacc = scratch; /* [rows][ng] sum_t w_t zero_tg */
    memset(zacc, 0, sizeof(float) * (size_t)rows * ng);
    uint8_t codes[1024];
    for (int t = t0; t < t0 + n; t++) {
        vq_unpack_codes(blk + (size_t)t * cb, d, bits, codes);
        const uint16_t *m = meta + (size_t)t * ng * 2;
        for (int r = 0; r < rows; r++) {
            float wt = w[(size_t)r * ld + (t - t0)];
            if (wt == 0) continue;
            float *ar = acc + (size_t)r * d;
            for (int g = 0; g < ng; g++) {
                float ws = wt * vq_f16_to_f32(m[2 * g]);
                zacc[(size_t)r * ng + g] += wt * vq_f16_to_f32(m[2 * g + 1]);
                int c1 = (g + 1) * G < d ? (g + 1) * G : d;
                for (int c = g * G; c < c1; c++) ar[c] += ws * (float)codes[c];
            }
        }
    }
    for (int r = 0; r < rows; r++)
        for (int g = 0; g < ng; g++) {
            int c1 = (g + 1) * G < d ? (g + 1) * G : d;
            float z = zacc[(size_t)r * ng + g];
            for (int c = g * G; c < c1; c++) acc[(size_t)r * d + c] += z;
        }
}

const vq_method vq_method_kivi = {
    .name = "kivi",
    .set_option = kivi_set_option,
    .finish = kivi_finish,
    .describe = kivi_describe,
    .token_group = kivi_token_group,
    .block_bytes = kivi_block_bytes,
    .token_layout = kivi_layout,
    .bits_per_elem = kivi_bits,
    .encode = kivi_encode,
    .decode = kivi_decode,
    .scratch_floats = kivi_scratch,
    .score = kivi_score,
    .accum = kivi_accum,
};
