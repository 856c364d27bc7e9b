/* Times vq_attend for one decode step on one thread over a cache small
 * enough to stay in the CPU cache, so what is measured is the kernels'
 * compute (score, softmax, accum), not the memory. Reports ns per
 * (token, kv head), the minimum and the median over many repetitions: the
 * minimum is the best estimate of the code's cost on a shared, noisy
 * machine, the median says how noisy it was.
 *
 * Usage: bench_kernels [--seq N] [--dim D] [--reps R] [--heads HQ/HKV]
 * [--cpu scalar|avx2|avx512] [SPEC ...] (default: 4096 tokens, d = 128, 400
 * repetitions, heads 8/2 and 32/8, the machine's best kernel level, specs
 * fp16, kivi:bits=2, kivi:bits=4). */
#include "veloxquant.h"
#include "synth.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* Fills a cache of seq tokens with synthetic K/V; NULL on error. */
static vq_cache *make_cache(const char *spec, int hq, int hkv, int d, int seq) {
    vq_cache_config cfg = {.n_layers = 1, .n_heads_q = hq, .n_heads_kv = hkv, .head_dim = d, .kv_spec = spec};
    vq_cache *c;
    if (vq_cache_create(&cfg, &c)) return NULL;
    vq_synth syn = {.n_heads_kv = hkv, .n_heads_q = hq, .head_dim = d, .seed = 42};
    int chunk = 512;
    float *k = malloc(sizeof(float) * (size_t)chunk * hkv * d), *v = malloc(sizeof(float) * (size_t)chunk * hkv * d);
    if (!k || !v) {
        vq_cache_free(c);
        c = NULL;
    }
    for (int t = 0; c && t < seq; t += chunk) {
        int n = seq - t < chunk ? seq - t : chunk;
        vq_synth_kv(&syn, t, n, k, v);
        if (vq_cache_append(c, 0, n, k, v, VQ_F32, NULL)) {
            vq_cache_free(c);
            c = NULL;
        }
    }
    free(k);
    free(v);
    return c;
}

/* Runs one decode step reps times (after a warm-up); prints min and median
 * ns per (token, kv head). */
static int bench_one(const char *spec, int hq, int hkv, int d, int seq, int reps) {
    vq_cache *c = make_cache(spec, hq, hkv, d, seq);
    float *q = malloc(sizeof(float) * (size_t)hq * d), *out = malloc(sizeof(float) * (size_t)hq * d);
    double *ts = malloc(sizeof(double) * (size_t)reps);
    if (!c || !q || !out || !ts) {
        fprintf(stderr, "bench_kernels: %s: %s\n", spec, c ? "out of memory" : vq_last_error());
        return 1;
    }
    vq_synth syn = {.n_heads_kv = hkv, .n_heads_q = hq, .head_dim = d, .seed = 7};
    vq_synth_q(&syn, seq, q);
    vq_attend_args a = {.n_q = 1, .q = q, .out = out, .out_dtype = VQ_F32, .pool = NULL};
    for (int i = 0; i < 5; i++) vq_attend(c, 0, &a);
    for (int i = 0; i < reps; i++) {
        double t0 = vq_time_now();
        vq_attend(c, 0, &a);
        ts[i] = vq_time_now() - t0;
    }
    qsort(ts, (size_t)reps, sizeof *ts, cmp_double);
    double per = 1e9 / ((double)seq * hkv);
    printf("  %-14s heads %2d/%-2d d %3d  min %6.2f  median %6.2f ns/(token, kv head)\n", spec, hq, hkv, d,
           ts[0] * per, ts[reps / 2] * per);
    fflush(stdout);
    vq_cache_free(c);
    free(q);
    free(out);
    free(ts);
    return 0;
}

int main(int argc, char **argv) {
    int seq = 4096, d = 128, reps = 400, nspec = 0;
    int heads[2][2] = {{8, 2}, {32, 8}}, nheads = 2;
    const char *specs[16], *cpu = "auto";
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--seq") && i + 1 < argc) seq = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--dim") && i + 1 < argc) d = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--reps") && i + 1 < argc) reps = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--cpu") && i + 1 < argc) cpu = argv[++i];
        else if (!strcmp(argv[i], "--heads") && i + 1 < argc) {
            nheads = 1;
            if (sscanf(argv[++i], "%d/%d", &heads[0][0], &heads[0][1]) != 2) heads[0][0] = 0;
        }
        else if (nspec < 16) specs[nspec++] = argv[i];
    }
    static const char *const level_names[] = {"auto", "scalar", "avx2", "avx512"};
    static const vq_cpu_level levels[] = {VQ_CPU_AUTO, VQ_CPU_SCALAR, VQ_CPU_AVX2, VQ_CPU_AVX512};
    int li = 0;
    while (li < 4 && strcmp(cpu, level_names[li])) li++;
    if (seq < 1 || d < 8 || reps < 1 || heads[0][0] < 1 || heads[0][1] < 1 || heads[0][0] % heads[0][1] || li == 4) {
        fprintf(stderr, "usage: bench_kernels [--seq N] [--dim D] [--reps R] [--heads HQ/HKV] "
                        "[--cpu auto|scalar|avx2|avx512] [SPEC ...]\n"
                        "  (N, R >= 1, D >= 8, HQ a multiple of HKV >= 1)\n");
        return 2;
    }
    if (vq_cpu_set_level(levels[li]) != VQ_OK) {
        fprintf(stderr, "bench_kernels: %s\n", vq_last_error());
        return 2;
    }
    if (nspec == 0) {
        specs[nspec++] = "fp16";
        specs[nspec++] = "kivi:bits=2";
        specs[nspec++] = "kivi:bits=4";
    }
    printf("bench_kernels: one decode step, 1 thread, %d tokens in cache, %d repetitions, kernels %s\n", seq, reps,
           vq_cpu_level_name(vq_cpu_level_in_use()));
    for (int h = 0; h < nheads; h++)
        for (int s = 0; s < nspec; s++)
            if (bench_one(specs[s], heads[h][0], heads[h][1], d, seq, reps)) return 1;
    return 0;
}
