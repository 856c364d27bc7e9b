/* Linear layers: y = x W^T (+ bias). Threads split the output columns into
 * fixed blocks; every output is computed by the same code whatever thread runs
 * its block, so results do not depend on the thread count. The scalar body
 * below is the portable path; kernels/cpu/matmul_avx2.c and matmul_avx512.c
 * are the fast ones. */
#include "model/matmul.h"

#include <string.h>

typedef struct {
    float *y;
    const float *x;
    int n, in, out;
    const uint8_t *w;
    vq_dtype wt;
    const float *bias;
    vq_cpu_level level; /* read once per call, so all tasks run the same body */
    bool bf16_dot;
} matmul_job;

/* Sum of a[k] * b[k] in 8 interleaved partial sums, combined pairwise at the
 * end. The fixed order lets the compiler vectorize it without changing results. */
static float dot8(const float *a, const float *b, int n) {
    float acc[8] = {0};
    int k = 0;
    for (; k + 8 <= n; k += 8)
        for (int l = 0; l < 8; l++) acc[l] += a[k + l] * b[k + l];
    for (; k < n; k++) acc[k & 7] += a[k] * b[k];
    for (int l = 0; l < 4; l++) acc[l] += acc[l + 4];
    return (acc[0] + acc[2]) + (acc[1] + acc[3]);
}

/* Portable body: converts a [cols][VQ_MATMUL_KC] slice of W to fp32 once and
 * reuses it for every row of x. */
static void matmul_cols_scalar(float *y, const float *x, int n, int in, const uint8_t *w,
                               vq_dtype wt, int out, int o0, int cols) {
    float wf[VQ_MATMUL_COLS * VQ_MATMUL_KC];
    size_t es = vq_dtype_size(wt);
    for (int k0 = 0; k0 < in; k0 += VQ_MATMUL_KC) {
        int kc = in - k0 < VQ_MATMUL_KC ? in - k0 : VQ_MATMUL_KC;
        for (int c = 0; c < cols; c++) {
            const uint8_t *row = w + ((size_t)(o0 + c) * (size_t)in + (size_t)k0) * es;
            for (int k = 0; k < kc; k++) wf[c * VQ_MATMUL_KC + k] = vq_weight_at(row + (size_t)k * es, wt);
        }
        for (int i = 0; i < n; i++) {
            const float *xi = x + (size_t)i * (size_t)in + k0;
            float *yi = y + (size_t)i * (size_t)out + o0;
            for (int c = 0; c < cols; c++) yi[c] += dot8(xi, wf + c * VQ_MATMUL_KC, kc);
        }
    }
}

static void matmul_task(void *ctx, int task, int thread) {
    const matmul_job *j = ctx;
    int o0 = task * VQ_MATMUL_COLS;
    int cols = j->out - o0 < VQ_MATMUL_COLS ? j->out - o0 : VQ_MATMUL_COLS;
    for (int i = 0; i < j->n; i++) {
        float *yi = j->y + (size_t)i * (size_t)j->out + o0;
        for (int c = 0; c < cols; c++) yi[c] = j->bias ? j->bias[o0 + c] : 0.0f;
    }
#if defined(__x86_64__)
    if (j->level == VQ_CPU_AVX512) {
        vq_matmul_cols_avx512(j->y, j->x, j->n, j->in, j->w, j->wt, j->out, o0, cols, j->bf16_dot);
        return;
    }
    if (j->level == VQ_CPU_AVX2) {
        vq_matmul_cols_avx2(j->y, j->x, j->n, j->in, j->w, j->wt, j->out, o0, cols);
        return;
    }
#endif
    matmul_cols_scalar(j->y, j->x, j->n, j->in, j->w, j->wt, j->out, o0, cols);
}

void vq_matmul(vq_pool *pool, float *y, const float *x, int n, int in, const void *w, vq_dtype wt,
               int out, const float *bias) {
    if (n <= 0 || out <= 0 || in <= 0) return;
    matmul_job j = {y, x, n, in, out, w, wt, bias, vq_cpu_level_in_use(), vq_cpu_has_avx512_bf16()};
    int tasks = (out + VQ_MATMUL_COLS - 1) / VQ_MATMUL_COLS;
    vq_pool_run(pool, tasks, matmul_task, &j);
}
