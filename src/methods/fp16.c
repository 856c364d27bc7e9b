/* fp16: the uncompressed baseline. A block payload is [block_tokens][d]
 * binary16 rows; scoring and accumulation convert on the fly. */
#include "vq_internal.h"

#include <stdio.h>
#include <string.h>

/* SIMD bodies: kernels/cpu/fp16_avx2.c and fp16_avx512.c. */
void vq_fp16_score_avx2(const float *q, int rows, int d, const uint16_t *k, int n, float *logits,
                        int ld);
void vq_fp16_accum_avx2(const float *w, int ld, int rows, int d, const uint16_t *v, int n,
                        float *acc);
void vq_fp16_score_avx512(const float *q, int rows, int d, const uint16_t *k, int n, float *logits,
                          int ld);
void vq_fp16_accum_avx512(const float *w, int ld, int rows, int d, const uint16_t *v, int n,
                          float *acc);

static vq_status fp16_set_option(vq_mparams *p, const char *key, const char *value) {
    (void)p;
    return vq_fail(VQ_ERR_ARG, "method 'fp16' takes no options (got '%s=%s')", key, value);
}

static vq_status fp16_finish(vq_mparams *p) {
    p->residual = 0;
    return VQ_OK;
}

static void fp16_describe(const vq_mparams *p, char *buf, size_t size) {
    (void)p;
    snprintf(buf, size, "fp16");
}

static size_t fp16_block_bytes(const vq_mparams *p, int block_tokens) {
    return (size_t)block_tokens * (size_t)p->head_dim * 2;
}

static int fp16_layout(const vq_mparams *p, size_t *row_bytes) {
    row_bytes[0] = (size_t)p->head_dim * 2;
    return 1;
}

static double fp16_bits(const vq_mparams *p) {
    (void)p;
    return 16.0;
}

static void fp16_encode(const vq_mparams *p, const float *x, size_t x_stride, int n, uint8_t *blk,
                        int block_tokens, int t0) {
    (void)block_tokens;
    int d = p->head_dim;
    uint16_t *dst = (uint16_t *)blk + (size_t)t0 * d;
    for (int i = 0; i < n; i++) vq_f32_to_f16_array(x + i * x_stride, dst + (size_t)i * d, (size_t)d);
}

static void fp16_decode(const vq_mparams *p, const uint8_t *blk, int block_tokens, int t0, int n,
                        float *out) {
    (void)block_tokens;
    int d = p->head_dim;
    vq_f16_to_f32_array((const uint16_t *)blk + (size_t)t0 * d, out, (size_t)n * d);
}

static size_t fp16_scratch(const vq_mparams *p, int rows) {
    (void)p;
    (void)rows;
    return 0;
}

static void fp16_score(const vq_mparams *p, const float *q, int rows, const uint8_t *blk,
                       int block_tokens, int t0, int n, float *logits, int ld, float *scratch) {
    (void)block_tokens;
    (void)scratch;
    int d = p->head_dim;
    const uint16_t *k = (const uint16_t *)blk + (size_t)t0 * d;
#if defined(__x86_64__)
    if (vq_cpu_has_avx512() && d % 32 == 0) {
        vq_fp16_score_avx512(q, rows, d, k, n, logits, ld);
        return;
    }
    if (vq_cpu_has_avx2() && d % 16 == 0) {
        vq_fp16_score_avx2(q, rows, d, k, n, logits, ld);
        return;
    }
#endif
    for (int j = 0; j < n; j++) {
        const uint16_t *kj = k + (size_t)j * d;
        for (int r = 0; r < rows; r++) {
            const float *qr = q + (size_t)r * d;
            float s = 0;
            for (int c = 0; c < d; c++) s += qr[c] * vq_f16_to_f32(kj[c]);
            logits[(size_t)r * ld + j] = s;
        }
    }
}

static void fp16_accum(const vq_mparams *p, const float *w, int ld, int rows, const uint8_t *blk,
                       int block_tokens, int t0, int n, float *acc, float *scratch) {
    (void)block_tokens;
    (void)scratch;
    int d = p->head_dim;
    const uint16_t *v = (const uint16_t *)blk + (size_t)t0 * d;
#if defined(__x86_64__)
    if (vq_cpu_has_avx512() && d % 32 == 0) {
        vq_fp16_accum_avx512(w, ld, rows, d, v, n, acc);
        return;
    }
    if (vq_cpu_has_avx2() && d % 16 == 0) {
        vq_fp16_accum_avx2(w, ld, rows, d, v, n, acc);
        return;
    }
#endif
    for (int j = 0; j < n; j++) {
        const uint16_t *vj = v + (size_t)j * d;
        for (int r = 0; r < rows; r++) {
            float wr = w[(size_t)r * ld + j];
            if (wr == 0) continue;
            float *ar = acc + (size_t)r * d;
            for (int c = 0; c < d; c++) ar[c] += wr * vq_f16_to_f32(vj[c]);
        }
    }
}

const vq_method vq_method_fp16 = {
    .name = "fp16",
    .set_option = fp16_set_option,
    .finish = fp16_finish,
    .describe = fp16_describe,
    .token_group = vq_token_group_one,
    .block_bytes = fp16_block_bytes,
    .token_layout = fp16_layout,
    .bits_per_elem = fp16_bits,
    .encode = fp16_encode,
    .decode = fp16_decode,
    .scratch_floats = fp16_scratch,
    .score = fp16_score,
    .accum = fp16_accum,
};
