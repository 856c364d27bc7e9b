/* vq_matmul against a double-precision reference for fp32, fp16 and bf16
 * weights, at every kernel level, with unaligned weights, odd shapes and
 * several thread counts (which must give bit-identical results). */
#include "check.h"
#include "model/matmul.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

static const vq_dtype dtypes[] = {VQ_F32, VQ_F16, VQ_BF16};
static const char *const dtype_names[] = {"f32", "f16", "bf16"};
static const int ns[] = {1, 3, 4, 5, 17, 64};
/* 3 and 259 leave tails that are not a multiple of the SIMD width; 259 and
 * 4096 span several conversion slices. */
static const int ins[] = {3, 8, 64, 72, 136, 259, 4096};
static const int outs[] = {1, 7, 64, 130};
#define COUNT(a) ((int)(sizeof(a) / sizeof((a)[0])))

enum { MAX_N = 64, MAX_IN = 4096, MAX_OUT = 130 };

/* Buffers for the largest shape, shared by all cases. */
static float x[MAX_N * MAX_IN], wf[MAX_OUT * MAX_IN], bias[MAX_OUT];
static float y[MAX_N * MAX_OUT], y_threads[MAX_N * MAX_OUT];
static double ref[MAX_N * MAX_OUT], mag[MAX_N * MAX_OUT];
/* W as stored, one byte past an aligned start so that no element is aligned. */
static unsigned char wbuf[MAX_OUT * MAX_IN * 4 + 1];

static float uniform(vq_rng *r) { return (float)(2.0 * vq_rng_uniform(r) - 1.0); }

/* Writes W in dtype t at wbuf + 1 and keeps its exact fp32 values in wf. */
static const void *store_weights(vq_rng *r, vq_dtype t, int count) {
    unsigned char *p = wbuf + 1;
    for (int i = 0; i < count; i++) {
        float f = uniform(r);
        if (t == VQ_F32) {
            memcpy(p + (size_t)i * 4, &f, 4);
        } else {
            uint16_t h = t == VQ_F16 ? vq_f32_to_f16(f) : vq_f32_to_bf16(f);
            f = t == VQ_F16 ? vq_f16_to_f32(h) : vq_bf16_to_f32(h);
            memcpy(p + (size_t)i * 2, &h, 2);
        }
        wf[i] = f;
    }
    return p;
}

/* ref = x W^T in double; mag = sum |x w|, which scales the fp32 rounding error. */
static void reference(int n, int in, int out) {
    for (int i = 0; i < n; i++)
        for (int o = 0; o < out; o++) {
            double s = 0, m = 0;
            for (int k = 0; k < in; k++) {
                double p = (double)x[i * in + k] * (double)wf[o * in + k];
                s += p;
                m += fabs(p);
            }
            ref[i * out + o] = s;
            mag[i * out + o] = m;
        }
}

/* Bound on |y - ref| / (sum |x w| + |bias|). fp32 accumulation stays well
 * within 1e-5 at these sizes. vdpbf16ps (AVX-512 level, CPU with AVX512_BF16,
 * bf16 weights) rounds each x to bf16 (8 significant bits) first, a relative
 * error of up to 2^-8 (~3.9e-3) per product, while the product of two bf16
 * values is exact in fp32; so the error can reach 2^-8 * sum |x w| when all
 * roundings line up, plus the fp32 accumulation (under 2e-5 for in <= 4096):
 * 4e-3 covers both. With random data it is smaller (3.1e-3 worst seen here,
 * on the short rows). */
static double tolerance(vq_cpu_level level, vq_dtype t) {
    if (level == VQ_CPU_AVX512 && t == VQ_BF16 && vq_cpu_has_avx512_bf16()) return 4e-3;
    return 1e-5;
}

static void check_case(vq_pool *pools[3], vq_cpu_level level, int t, int n, int in, int out, const void *w,
                       const float *b) {
    vq_matmul(NULL, y, x, n, in, w, dtypes[t], out, b);
    double worst = 0;
    for (int i = 0; i < n * out; i++) {
        double want = ref[i] + (b ? b[i % out] : 0.0);
        double err = fabs((double)y[i] - want) / (mag[i] + (b ? fabs(b[i % out]) : 0.0) + 1e-30);
        if (!(err <= worst)) worst = err; /* also catches NaN */
    }
    CHECK(worst <= tolerance(level, dtypes[t]), "%s level %s n=%d in=%d out=%d bias=%d: relative error %.3g",
          dtype_names[t], vq_cpu_level_name(level), n, in, out, b != NULL, worst);
    for (int p = 0; p < 3; p++) {
        memset(y_threads, 0xff, sizeof(float) * (size_t)(n * out));
        vq_matmul(pools[p], y_threads, x, n, in, w, dtypes[t], out, b);
        CHECK(memcmp(y, y_threads, sizeof(float) * (size_t)(n * out)) == 0,
              "%s level %s n=%d in=%d out=%d: %d threads differ from inline", dtype_names[t],
              vq_cpu_level_name(level), n, in, out, p + 1);
    }
}

int main(int argc, char **argv) {
    vq_rng r;
    vq_rng_seed(&r, 42);
    vq_pool *pools[3];
    for (int p = 0; p < 3; p++) CHECK(vq_pool_create(p + 1, &pools[p]) == VQ_OK, "pool");
    for (int i = 0; i < MAX_N * MAX_IN; i++) x[i] = uniform(&r);
    for (int i = 0; i < MAX_OUT; i++) bias[i] = uniform(&r);

    /* Every level up to the best this CPU has; they are in increasing order. */
    vq_cpu_level levels[3] = {VQ_CPU_SCALAR, VQ_CPU_AVX2, VQ_CPU_AVX512};
    int n_levels = 0;
    while (n_levels < 3 && levels[n_levels] <= vq_cpu_detect()) n_levels++;
    for (int t = 0; t < COUNT(dtypes); t++)
        for (int a = 0; a < COUNT(ins); a++)
            for (int c = 0; c < COUNT(outs); c++) {
                int in = ins[a], out = outs[c];
                const void *w = store_weights(&r, dtypes[t], in * out);
                for (int b = 0; b < COUNT(ns); b++) {
                    int n = ns[b];
                    reference(n, in, out);
                    for (int l = 0; l < n_levels; l++) {
                        CHECK(vq_cpu_set_level(levels[l]) == VQ_OK, "set level");
                        check_case(pools, levels[l], t, n, in, out, w, NULL);
                        check_case(pools, levels[l], t, n, in, out, w, bias);
                    }
                }
            }
    /* Say which bodies ran, so a run on an AVX-512 machine shows it was tested. */
    printf("levels tested:");
    for (int l = 0; l < n_levels; l++) {
        vq_cpu_set_level(levels[l]);
        printf(" %s%s", vq_cpu_level_name(levels[l]), vq_cpu_has_avx512_bf16() ? "(bf16 dot)" : "");
    }
    printf("\n");
    vq_cpu_set_level(VQ_CPU_AUTO);

    /* Empty shapes leave y untouched. */
    y[0] = 7.0f;
    vq_matmul(NULL, y, x, 0, 8, wbuf + 1, VQ_BF16, 4, NULL);
    vq_matmul(NULL, y, x, 1, 8, wbuf + 1, VQ_BF16, 0, NULL);
    CHECK(y[0] == 7.0f, "empty matmul wrote to y");

    for (int p = 0; p < 3; p++) vq_pool_free(pools[p]);
    (void)argc;
    (void)argv;
    return check_done();
}
