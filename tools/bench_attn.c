/* veloxquant bench attn: decode attention over a compressed cache versus the
 * fp16 cache on the same K/V, interleaved in one process (A B A B ...), each
 * run on the next of several caches so neither arm is served from the CPU
 * cache. Reports medians and spread, bytes, bandwidth and the floor. */
#include "veloxquant.h"
#include "cli.h"
#include "synth.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

typedef struct {
    const char *spec;
    int seq, hq, hkv, dim, batch, threads, runs;
    int json;
    const char *cpu;
} opts;

static int parse_int_opt(const char *name, const char *v, int lo, int hi, int *out) {
    char *end;
    long x = strtol(v, &end, 10);
    if (end == v || *end || x < lo || x > hi) {
        fprintf(stderr, "bench attn: %s '%s' is out of range [%d, %d]\n", name, v, lo, hi);
        return -1;
    }
    *out = (int)x;
    return 0;
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static double median(double *x, int n) {
    qsort(x, (size_t)n, sizeof *x, cmp_double);
    return n % 2 ? x[n / 2] : 0.5 * (x[n / 2 - 1] + x[n / 2]);
}

/* Read bandwidth of this machine with the given threads: sums a 256 MiB
 * buffer, best of three. */
typedef struct {
    const float *buf;
    size_t n;
    int parts;
    double sums[256];
} bw_ctx;

static void bw_task(void *ctx, int task, int thread) {
    (void)thread;
    bw_ctx *b = ctx;
    size_t lo = b->n / b->parts * task, hi = b->n / b->parts * (task + 1);
    double s = 0;
    float acc[16] = {0};
    for (size_t i = lo; i + 16 <= hi; i += 16)
        for (int j = 0; j < 16; j++) acc[j] += b->buf[i + j];
    for (int j = 0; j < 16; j++) s += acc[j];
    b->sums[task] = s;
}

static double measure_bandwidth(vq_pool *pool) {
    size_t n = (size_t)64 << 20; /* floats: 256 MiB */
    float *buf = vq_aligned_alloc(n * sizeof(float));
    if (!buf) return 0;
    for (size_t i = 0; i < n; i++) buf[i] = (float)(i & 1023);
    bw_ctx b = {.buf = buf, .n = n, .parts = vq_pool_threads(pool) * 4};
    double best = 0;
    for (int r = 0; r < 3; r++) {
        double t0 = vq_time_now();
        vq_pool_run(pool, b.parts, bw_task, &b);
        double dt = vq_time_now() - t0;
        double gbps = (double)n * sizeof(float) / dt / 1e9;
        if (gbps > best) best = gbps;
    }
    vq_aligned_free(buf);
    return best;
}

int vq_cmd_bench_attn(int argc, char **argv) {
    opts o = {.spec = "kivi:bits=2", .seq = 32768, .hq = 32, .hkv = 8, .dim = 128, .batch = 1,
              .threads = 0, .runs = 15, .json = 0, .cpu = "auto"};
    for (int i = 0; i < argc; i++) {
        const char *a = argv[i];
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
        int rc = 0;
        if (!strcmp(a, "--json")) { o.json = 1; continue; }
        if (!v) { fprintf(stderr, "bench attn: option '%s' needs a value (or is unknown)\n", a); return 2; }
        if (!strcmp(a, "--kv")) o.spec = v;
        else if (!strcmp(a, "--seq")) rc = parse_int_opt("--seq", v, 1, 1 << 24, &o.seq);
        else if (!strcmp(a, "--dim")) rc = parse_int_opt("--dim", v, 8, 1024, &o.dim);
        else if (!strcmp(a, "--batch")) rc = parse_int_opt("--batch", v, 1, 4096, &o.batch);
        else if (!strcmp(a, "--threads")) rc = parse_int_opt("--threads", v, 1, 256, &o.threads);
        else if (!strcmp(a, "--runs")) rc = parse_int_opt("--runs", v, 1, 100000, &o.runs);
        else if (!strcmp(a, "--cpu")) o.cpu = v;
        else if (!strcmp(a, "--heads")) {
            if (sscanf(v, "%d/%d", &o.hq, &o.hkv) != 2 || o.hq < 1 || o.hkv < 1 || o.hq % o.hkv || o.hq > 8192) {
                fprintf(stderr, "bench attn: --heads '%s' must be HQ/HKV with HQ a multiple of HKV (e.g. 32/8)\n", v);
                return 2;
            }
        } else {
            fprintf(stderr, "bench attn: unknown option '%s' (try 'veloxquant help')\n", a);
            return 2;
        }
        if (rc) return 2;
        i++;
    }
    vq_cpu_level lvl;
    if (!strcmp(o.cpu, "auto")) lvl = VQ_CPU_AUTO;
    else if (!strcmp(o.cpu, "scalar")) lvl = VQ_CPU_SCALAR;
    else if (!strcmp(o.cpu, "avx2")) lvl = VQ_CPU_AVX2;
    else if (!strcmp(o.cpu, "avx512")) lvl = VQ_CPU_AVX512;
    else { fprintf(stderr, "bench attn: --cpu '%s' is not one of auto, scalar, avx2, avx512\n", o.cpu); return 2; }
    if (vq_cpu_set_level(lvl)) { fprintf(stderr, "bench attn: %s\n", vq_last_error()); return 2; }
    if (o.threads == 0) {
        long n = sysconf(_SC_NPROCESSORS_ONLN);
        o.threads = n > 0 ? (int)(n < 256 ? n : 256) : 1;
    }

    vq_cache_config cfg = {.n_layers = 1, .n_heads_q = o.hq, .n_heads_kv = o.hkv, .head_dim = o.dim};
    /* Check the spec before the long fill. */
    vq_cache *probe;
    cfg.kv_spec = o.spec;
    if (vq_cache_create(&cfg, &probe)) { fprintf(stderr, "bench attn: %s\n", vq_last_error()); return 2; }
    char spec_full[512];
    snprintf(spec_full, sizeof spec_full, "%s", vq_cache_spec(probe));
    double bits = vq_cache_bits_per_elem(probe);
    vq_cache_free(probe);

    /* Enough rotating caches that one pass over them is several times the
     * last-level cache (32 MiB assumed), at least two. */
    double fp16_bytes = (double)o.seq * o.hkv * o.dim * 4.0 * o.batch;
    double spec_bytes = fp16_bytes * bits / 16.0;
    int rot = (int)ceil(128.0 * 1048576.0 / spec_bytes);
    if (rot < 2) rot = 2;
    if (rot > 8) rot = 8;
    size_t n_caches = (size_t)rot * o.batch;
    vq_cache **cs = calloc(n_caches, sizeof *cs), **cf = calloc(n_caches, sizeof *cf);
    int chunk = 1024;
    float *k = malloc(sizeof(float) * (size_t)chunk * o.hkv * o.dim);
    float *v = malloc(sizeof(float) * (size_t)chunk * o.hkv * o.dim);
    size_t qn = (size_t)o.batch * o.hq * o.dim;
    float *q = malloc(sizeof(float) * qn * rot);
    float *out_s = malloc(sizeof(float) * qn), *out_f = malloc(sizeof(float) * qn);
    if (!cs || !cf || !k || !v || !q || !out_s || !out_f) { fprintf(stderr, "bench attn: out of memory\n"); return 1; }
    fprintf(stderr, "filling %zu caches of %d tokens (%s and fp16)...\n", n_caches, o.seq, spec_full);
    for (size_t i = 0; i < n_caches; i++) {
        cfg.kv_spec = o.spec;
        if (vq_cache_create(&cfg, &cs[i])) { fprintf(stderr, "bench attn: %s\n", vq_last_error()); return 1; }
        cfg.kv_spec = "fp16";
        if (vq_cache_create(&cfg, &cf[i])) { fprintf(stderr, "bench attn: %s\n", vq_last_error()); return 1; }
        vq_synth syn = {.n_heads_kv = o.hkv, .n_heads_q = o.hq, .head_dim = o.dim, .seed = 1000 + i};
        for (int t = 0, n; t < o.seq; t += n) {
            n = o.seq - t < chunk ? o.seq - t : chunk;
            /* an evicting spec takes at most its budget per append */
            if (vq_cache_append_limit(cs[i]) < n) n = (int)vq_cache_append_limit(cs[i]);
            vq_synth_kv(&syn, t, n, k, v);
            if (vq_cache_append(cs[i], 0, n, k, v, VQ_F32, NULL) || vq_cache_append(cf[i], 0, n, k, v, VQ_F32, NULL)) {
                fprintf(stderr, "bench attn: %s\n", vq_last_error());
                return 1;
            }
        }
    }
    for (int r = 0; r < rot; r++)
        for (int b = 0; b < o.batch; b++) {
            vq_synth syn = {.n_heads_kv = o.hkv, .n_heads_q = o.hq, .head_dim = o.dim, .seed = 7 + (uint64_t)r * 131 + b};
            vq_synth_q(&syn, o.seq, q + ((size_t)r * o.batch + b) * o.hq * o.dim);
        }
    vq_pool *pool;
    if (vq_pool_create(o.threads, &pool)) { fprintf(stderr, "bench attn: %s\n", vq_last_error()); return 1; }
    double bw = measure_bandwidth(pool);

    /* Accuracy: every rotation's step, spec vs fp16 outputs. */
    double num = 0, den = 0;
    for (int r = 0; r < rot; r++)
        for (int b = 0; b < o.batch; b++) {
            size_t ci = (size_t)r * o.batch + b;
            const float *qb = q + ci * o.hq * o.dim;
            vq_attend_args as = {.n_q = 1, .q = qb, .out = out_s, .out_dtype = VQ_F32, .pool = pool};
            vq_attend_args af = as;
            af.out = out_f;
            if (vq_attend(cs[ci], 0, &as) || vq_attend(cf[ci], 0, &af)) { fprintf(stderr, "bench attn: %s\n", vq_last_error()); return 1; }
            for (size_t i = 0; i < (size_t)o.hq * o.dim; i++) {
                double dlt = (double)out_s[i] - out_f[i];
                num += dlt * dlt;
                den += (double)out_f[i] * out_f[i];
            }
        }
    double rel_err = den > 0 ? sqrt(num / den) : 0;

    /* Interleaved timing: A B A B, a new rotation every pair. */
    double *ts = malloc(sizeof(double) * o.runs), *tf = malloc(sizeof(double) * o.runs);
    for (int run = -1; run < o.runs; run++) { /* run -1 warms both arms */
        int r = (run + 1) % rot;
        for (int arm = 0; arm < 2; arm++) {
            int which = (run & 1) ? 1 - arm : arm; /* alternate which arm goes first */
            vq_cache **set = which == 0 ? cs : cf;
            double t0 = vq_time_now();
            for (int b = 0; b < o.batch; b++) {
                size_t ci = (size_t)r * o.batch + b;
                vq_attend_args a = {.n_q = 1, .q = q + ci * o.hq * o.dim, .out = which == 0 ? out_s : out_f,
                                    .out_dtype = VQ_F32, .pool = pool};
                vq_attend(set[ci], 0, &a);
            }
            double dt = (vq_time_now() - t0) * 1e6;
            if (run >= 0) (which == 0 ? ts : tf)[run] = dt;
        }
    }
    double s_min = ts[0], s_max = ts[0], f_min = tf[0], f_max = tf[0];
    for (int i = 0; i < o.runs; i++) {
        s_min = fmin(s_min, ts[i]); s_max = fmax(s_max, ts[i]);
        f_min = fmin(f_min, tf[i]); f_max = fmax(f_max, tf[i]);
    }
    double s_med = median(ts, o.runs), f_med = median(tf, o.runs);
    size_t kv_bytes = 0, kv_bytes_fp16 = 0;
    for (int b = 0; b < o.batch; b++) {
        kv_bytes += vq_cache_bytes(cs[b]);
        kv_bytes_fp16 += vq_cache_bytes(cf[b]);
    }
    double gbps = (double)kv_bytes / (s_med * 1e-6) / 1e9;
    double gbps_fp16 = (double)kv_bytes_fp16 / (f_med * 1e-6) / 1e9;
    double floor_us = bw > 0 ? (double)kv_bytes / (bw * 1e9) * 1e6 : 0;
    double floor_fp16_us = bw > 0 ? (double)kv_bytes_fp16 / (bw * 1e9) * 1e6 : 0;

    printf("bench attn: decode attention, one query token per sequence, %s kernels\n",
           vq_cpu_level_name(vq_cpu_level_in_use()));
    printf("  seq %d, heads %d/%d, dim %d, batch %d, threads %d, runs %d, %d rotating caches per arm\n",
           o.seq, o.hq, o.hkv, o.dim, o.batch, o.threads, o.runs, rot);
    printf("  measured read bandwidth %.1f GB/s\n\n", bw);
    printf("  %-52s %10s %10s %10s %11s %8s %10s\n", "spec", "median us", "min us", "max us", "KV bytes", "GB/s", "floor us");
    printf("  %-52s %10.1f %10.1f %10.1f %11zu %8.1f %10.1f\n", spec_full, s_med, s_min, s_max, kv_bytes, gbps, floor_us);
    printf("  %-52s %10.1f %10.1f %10.1f %11zu %8.1f %10.1f\n", "fp16", f_med, f_min, f_max, kv_bytes_fp16, gbps_fp16, floor_fp16_us);
    char rb[48];
    printf("\n  speedup vs fp16 %.2fx, memory %s, %.2f bits/elem, rel. L2 error vs fp16 output %.3g\n",
           f_med / s_med, cli_size_ratio((double)kv_bytes_fp16, (double)kv_bytes, rb, sizeof rb), bits, rel_err);
    printf("  fp16 spread (noise floor): %.1f%% of its median\n", (f_max - f_min) / f_med * 100.0);
    if (o.json)
        printf("{\"spec\":\"%s\",\"seq\":%d,\"heads_q\":%d,\"heads_kv\":%d,\"dim\":%d,\"batch\":%d,\"threads\":%d,"
               "\"runs\":%d,\"cpu\":\"%s\",\"us_median\":%.2f,\"us_min\":%.2f,\"us_max\":%.2f,\"fp16_us_median\":%.2f,"
               "\"fp16_us_min\":%.2f,\"fp16_us_max\":%.2f,\"speedup_vs_fp16\":%.4f,\"kv_bytes\":%zu,\"kv_bytes_fp16\":%zu,"
               "\"bits_per_elem\":%.4f,\"rel_err_vs_fp16\":%.6g,\"gbps\":%.3f,\"fp16_gbps\":%.3f,\"bw_gbps\":%.3f,"
               "\"floor_us\":%.2f,\"fp16_floor_us\":%.2f}\n",
               spec_full, o.seq, o.hq, o.hkv, o.dim, o.batch, o.threads, o.runs, vq_cpu_level_name(vq_cpu_level_in_use()),
               s_med, s_min, s_max, f_med, f_min, f_max, f_med / s_med, kv_bytes, kv_bytes_fp16, bits, rel_err, gbps,
               gbps_fp16, bw, floor_us, floor_fp16_us);
    for (size_t i = 0; i < n_caches; i++) {
        vq_cache_free(cs[i]);
        vq_cache_free(cf[i]);
    }
    vq_pool_free(pool);
    free(cs); free(cf); free(k); free(v); free(q); free(out_s); free(out_f); free(ts); free(tf);
    return 0;
}
