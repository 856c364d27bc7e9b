/* Times vq_matmul: decode-sized products (one row of x, memory bound: reports
 * GB/s of weights read) and prefill-sized ones (many rows, compute bound:
 * reports GFLOP/s). Prints the median of several runs.
 * Usage: bench_matmul [threads] (default 2). */
#include "model/matmul.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { REPS = 15 };

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static const char *dtype_name(vq_dtype t) {
    return t == VQ_F32 ? "f32" : t == VQ_F16 ? "f16" : "bf16";
}

/* Runs n x in times (out x in)^T REPS times. The weights rotate over enough
 * copies (at least 128 MB) that each run reads them from memory, not cache. */
static void bench(vq_pool *pool, int n, int in, int out, vq_dtype wt) {
    size_t wbytes = (size_t)out * (size_t)in * vq_dtype_size(wt);
    int copies = (int)((((size_t)128 << 20) + wbytes - 1) / wbytes);
    unsigned char *w = vq_aligned_alloc(wbytes * (size_t)copies);
    float *x = vq_aligned_alloc(sizeof(float) * (size_t)n * (size_t)in);
    float *y = vq_aligned_alloc(sizeof(float) * (size_t)n * (size_t)out);
    if (!w || !x || !y) {
        fprintf(stderr, "out of memory\n");
        exit(1);
    }
    vq_rng r;
    vq_rng_seed(&r, 1);
    for (size_t i = 0; i < (size_t)n * (size_t)in; i++) x[i] = (float)vq_rng_normal(&r);
    /* values in [-0.5, 0.5) in the weight dtype; the other copies repeat the first */
    for (size_t i = 0; i < (size_t)out * (size_t)in; i++) {
        float f = (float)(vq_rng_uniform(&r) - 0.5);
        if (wt == VQ_F32) {
            memcpy(w + i * 4, &f, 4);
        } else {
            uint16_t h = wt == VQ_F16 ? vq_f32_to_f16(f) : vq_f32_to_bf16(f);
            memcpy(w + i * 2, &h, 2);
        }
    }
    for (int c = 1; c < copies; c++) memcpy(w + (size_t)c * wbytes, w, wbytes);
    double t[REPS];
    vq_matmul(pool, y, x, n, in, w, wt, out, NULL); /* warm-up */
    for (int k = 0; k < REPS; k++) {
        const unsigned char *wk = w + (size_t)(k % copies) * wbytes;
        double t0 = vq_time_now();
        vq_matmul(pool, y, x, n, in, wk, wt, out, NULL);
        t[k] = vq_time_now() - t0;
    }
    qsort(t, REPS, sizeof t[0], cmp_double);
    double med = t[REPS / 2];
    printf("n=%-4d in=%-5d out=%-5d %-4s  median %8.3f ms  %6.1f GB/s (weights)  %6.1f GFLOP/s\n",
           n, in, out, dtype_name(wt), med * 1e3, (double)wbytes / med * 1e-9,
           2.0 * n * (double)in * out / med * 1e-9);
    vq_aligned_free(w);
    vq_aligned_free(x);
    vq_aligned_free(y);
}

int main(int argc, char **argv) {
    int threads = argc > 1 ? atoi(argv[1]) : 2;
    vq_pool *pool;
    if (vq_pool_create(threads, &pool) != VQ_OK) {
        fprintf(stderr, "%s\n", vq_last_error());
        return 1;
    }
    printf("kernel level %s, %d threads\n", vq_cpu_level_name(vq_cpu_level_in_use()), threads);
    /* decode: one token */
    bench(pool, 1, 8192, 2048, VQ_BF16);
    bench(pool, 1, 2048, 8192, VQ_BF16);
    bench(pool, 1, 8192, 2048, VQ_F16);
    bench(pool, 1, 8192, 2048, VQ_F32);
    /* prefill: a 512-token prompt */
    bench(pool, 512, 1536, 1536, VQ_BF16);
    bench(pool, 512, 1536, 1536, VQ_F32);
    bench(pool, 64, 2048, 2048, VQ_BF16);
    vq_pool_free(pool);
    return 0;
}
