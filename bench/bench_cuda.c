/* Timing of the CUDA kernels alone: decode attention over CUDA caches and
 * append (encode) throughput (fp16 and bf16 rows, in one call or in
 * chunks), against a device-to-device copy measured in the same run. GPU
 * time from CUDA events; median over repetitions; several sets of caches
 * rotated when one set would fit in L2.
 *
 *   bench_cuda [--quick] [--shape=BATCH,SEQ ...] [--extra-shape=BATCH,SEQ ...] [SPEC_SUBSTRING]
 *
 * (--shape picks shapes of the table, and may be repeated; --shape=1,1, no
 * shape of the table, times the appends alone. --extra-shape adds a decode
 * shape that is not in the table.)
 *
 * Prints a table: spec, batch, seq, median us (min..max), packed MB read,
 * GB/s on the packed bytes, % of the copy bandwidth. */
#include "veloxquant.h"

#include <cuda_runtime_api.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define L2_BYTES (60.0 * (1 << 20))
#define REPS 15
#define BUSY_BYTES ((size_t)512 << 20) /* a copy of ~0.25 ms that hides the host's issue time */

static void die(const char *what) {
    fprintf(stderr, "bench_cuda: %s: %s\n", what, vq_last_error());
    exit(1);
}

static int cmp_f(const void *a, const void *b) {
    float x = *(const float *)a, y = *(const float *)b;
    return x < y ? -1 : x > y;
}

/* Milliseconds of one event pair. */
static float elapsed(cudaEvent_t a, cudaEvent_t b) {
    float ms = 0;
    cudaEventSynchronize(b);
    cudaEventElapsedTime(&ms, a, b);
    return ms;
}

static double copy_bandwidth(void) {
    size_t bytes = (size_t)2 << 30;
    void *a = NULL, *b = NULL;
    if (cudaMalloc(&a, bytes) != cudaSuccess || cudaMalloc(&b, bytes) != cudaSuccess) return 0;
    cudaMemset(a, 1, bytes);
    cudaEvent_t e0, e1;
    cudaEventCreate(&e0);
    cudaEventCreate(&e1);
    float t[REPS];
    cudaMemcpy(b, a, bytes, cudaMemcpyDeviceToDevice);
    for (int i = 0; i < REPS; i++) {
        cudaEventRecord(e0, 0);
        cudaMemcpy(b, a, bytes, cudaMemcpyDeviceToDevice);
        cudaEventRecord(e1, 0);
        t[i] = elapsed(e0, e1);
    }
    qsort(t, REPS, sizeof *t, cmp_f);
    cudaFree(a);
    cudaFree(b);
    return 2.0 * bytes / (t[REPS / 2] * 1e-3) / 1e9; /* read + write */
}

/* Random fp16 or bf16 rows [n][8][128] on the device: 2^22 values drawn
 * on the host and repeated, so that a run does not spend its time drawing
 * ~5 x 10^8 normals (the kernels' time does not depend on the values). */
static void *random_rows(size_t n_vals, unsigned seed, vq_dtype dt) {
    const size_t period = (size_t)1 << 22;
    uint16_t *h = malloc(n_vals * 2);
    vq_rng r;
    vq_rng_seed(&r, seed);
    for (size_t i = 0; i < n_vals && i < period; i++) {
        float x = (float)vq_rng_normal(&r);
        h[i] = dt == VQ_BF16 ? vq_f32_to_bf16(x) : vq_f32_to_f16(x);
    }
    for (size_t i = period; i < n_vals; i++) h[i] = h[i - period];
    void *d = NULL;
    if (cudaMalloc(&d, n_vals * 2) != cudaSuccess) return NULL;
    cudaMemcpy(d, h, n_vals * 2, cudaMemcpyHostToDevice);
    free(h);
    return d;
}

int main(int argc, char **argv) {
    int quick = 0;
    const char *only = NULL; /* run the specs containing this string */
    int pick[8][2], n_pick = 0; /* run these shapes alone */
    int extra[8][2], n_extra = 0;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--quick") == 0) quick = 1;
        else if (strncmp(argv[i], "--shape=", 8) == 0 && n_pick < 8 &&
                 sscanf(argv[i] + 8, "%d,%d", &pick[n_pick][0], &pick[n_pick][1]) == 2)
            n_pick++;
        else if (strncmp(argv[i], "--extra-shape=", 14) == 0 && n_extra < 8 &&
                 sscanf(argv[i] + 14, "%d,%d", &extra[n_extra][0], &extra[n_extra][1]) == 2 && extra[n_extra][0] > 0 &&
                 extra[n_extra][1] > 0)
            n_extra++;
        else only = argv[i];
    }
    if (vq_cuda_device_count() < 1) {
        fprintf(stderr, "bench_cuda: no CUDA device\n");
        return 1;
    }
    const int HQ = 32, HKV = 8, D = 128;
    double bw = copy_bandwidth();
    printf("device-to-device copy: %.0f GB/s (read + write)\n", bw);
    const char *specs[] = {"fp16", "kivi:bits=2", "kivi:bits=4", "tq-mse:bits=4"};
    int shapes[7 + 8][2] = {{1, 4096}, {1, 32768}, {1, 131072}, {8, 16384}, {8, 32768}, {8, 131072}, {32, 16384}};
    int n_shapes = quick ? 2 : 7;
    for (int k = 0; k < n_extra; k++) {
        shapes[n_shapes][0] = extra[k][0];
        shapes[n_shapes++][1] = extra[k][1];
    }
    /* the appends: tokens, tokens per call, input dtype. One call of 8192
     * and of 65536 fp16 tokens into an empty cache, so that the fixed cost
     * of a launch shows; then the same with bf16 input, and in chunks (each
     * chunk after the first arrives at a cache whose fp16 window is not
     * empty and flushes it), up to a 131072-token bf16 prefill in chunks of
     * 32768 as cuda_bench.py's encode_gbps times it. */
    const struct {
        int n, chunk;
        vq_dtype dt;
    } appends[] = {{8192, 8192, VQ_F16},      {65536, 65536, VQ_F16},   {65536, 65536, VQ_BF16},
                   {65536, 32768, VQ_F16},    {65536, 32768, VQ_BF16},  {131072, 131072, VQ_BF16},
                   {131072, 32768, VQ_BF16}};
    const int n_appends = sizeof appends / sizeof appends[0];
    int max_seq = 131072; /* the largest append; more for the decode shapes that run */
    int run[sizeof shapes / sizeof shapes[0]];
    for (int shp = 0; shp < n_shapes; shp++) {
        run[shp] = !n_pick || shp >= n_shapes - n_extra;
        for (int k = 0; k < n_pick; k++) run[shp] |= shapes[shp][0] == pick[k][0] && shapes[shp][1] == pick[k][1];
        if (run[shp] && shapes[shp][1] > max_seq) max_seq = shapes[shp][1];
    }
    const size_t n_in = (size_t)max_seq * HKV * D;
    void *kin = random_rows(n_in, 1, VQ_F16), *vin = random_rows(n_in, 2, VQ_F16);
    void *kbf = random_rows(n_in, 3, VQ_BF16), *vbf = random_rows(n_in, 4, VQ_BF16);
    if (!kin || !vin || !kbf || !vbf) die("input rows");
    void *busy[2] = {NULL, NULL};
    if (cudaMalloc(&busy[0], BUSY_BYTES) != cudaSuccess || cudaMalloc(&busy[1], BUSY_BYTES) != cudaSuccess)
        die("busy buffers");
    cudaEvent_t e0, e1;
    cudaEventCreate(&e0);
    cudaEventCreate(&e1);
    printf("%-16s %5s %7s %10s %10s %10s %9s %7s\n", "spec", "batch", "seq", "us", "min", "max", "packedMB", "GB/s");
    for (size_t si = 0; si < sizeof specs / sizeof specs[0]; si++) {
        if (only && !strstr(specs[si], only)) continue;
        for (int shp = 0; shp < n_shapes; shp++) {
            int B = shapes[shp][0], S = shapes[shp][1];
            if (!run[shp]) continue;
            vq_cache_config cfg = {.n_layers = 1, .n_heads_q = HQ, .n_heads_kv = HKV, .head_dim = D,
                                   .kv_spec = specs[si], .capacity = S, .device = VQ_DEVICE_CUDA};
            /* sets of B caches; more sets when one set fits in L2 */
            vq_cache *probe = NULL;
            if (vq_cache_create(&cfg, &probe)) die("create");
            if (vq_cache_append(probe, 0, S, kin, vin, VQ_F16, NULL)) die("append");
            double set_bytes = (double)vq_cache_bytes(probe) * B;
            vq_cache_free(probe);
            int n_sets = set_bytes < 4 * L2_BYTES ? (int)(4 * L2_BYTES / set_bytes) + 1 : 1;
            if (n_sets > 16) n_sets = 16;
            vq_cache **cs = calloc((size_t)n_sets * B, sizeof *cs);
            size_t packed = 0;
            for (int i = 0; i < n_sets * B; i++) {
                if (vq_cache_create(&cfg, &cs[i])) die("create");
                if (vq_cache_append(cs[i], 0, S, kin, vin, VQ_F16, NULL)) die("append");
                if (i < B) packed += vq_cache_bytes(cs[i]);
            }
            float *q = NULL;
            void *out = NULL;
            size_t qn = (size_t)B * HQ * D;
            cudaMalloc((void **)&q, qn * 4);
            cudaMalloc(&out, qn * 2);
            cudaMemset(q, 0x3c, qn * 4); /* ~0.01: any finite values */
            vq_attend_args a = {.n_q = 1, .q = q, .out = out, .out_dtype = VQ_F16};
            int iters = 20;
            float t[REPS];
            for (int w = 0; w < 3; w++)
                if (vq_attend_batch(cs + (size_t)(w % n_sets) * B, B, 0, &a)) die("attend");
            for (int rep = 0; rep < REPS; rep++) {
                cudaEventRecord(e0, 0);
                for (int it = 0; it < iters; it++)
                    if (vq_attend_batch(cs + (size_t)(it % n_sets) * B, B, 0, &a)) die("attend");
                cudaEventRecord(e1, 0);
                t[rep] = elapsed(e0, e1) * 1000 / iters;
            }
            if (vq_cuda_synchronize()) die("attend (asynchronous)");
            qsort(t, REPS, sizeof *t, cmp_f);
            double gbps = packed / (t[REPS / 2] * 1e-6) / 1e9;
            printf("%-16s %5d %7d %10.1f %10.1f %10.1f %9.1f %7.0f  %3.0f%% of copy\n", specs[si], B, S, t[REPS / 2],
                   t[0], t[REPS - 1], packed / 1e6, gbps, 100 * gbps / bw);
            fflush(stdout);
            for (int i = 0; i < n_sets * B; i++) vq_cache_free(cs[i]);
            free(cs);
            cudaFree(q);
            cudaFree(out);
        }
        /* append throughput: n new tokens into an empty cache, in calls of
         * `chunk` tokens (its blocks stay assigned across vq_cache_reset, so
         * no allocation is timed). "GPU": the events start behind a copy
         * that keeps the GPU busy while the host issues the calls, so they
         * time the kernels alone; "from idle": the events start on an idle
         * GPU, so the host's work before the first launch counts too. */
        vq_cache *c = NULL;
        for (int ai = 0; ai < n_appends; ai++) {
            const int n = appends[ai].n, chunk = appends[ai].chunk;
            const vq_dtype dt = appends[ai].dt;
            const char *kx = dt == VQ_BF16 ? kbf : kin, *vx = dt == VQ_BF16 ? vbf : vin;
            vq_cache_config cfg = {.n_layers = 1, .n_heads_q = HQ, .n_heads_kv = HKV, .head_dim = D,
                                   .kv_spec = specs[si], .capacity = n, .device = VQ_DEVICE_CUDA};
            vq_cache_free(c);
            c = NULL;
            if (vq_cache_create(&cfg, &c)) die("create");
            float t[REPS], ti[REPS], th[REPS];
            for (int rep = 0; rep < 2 * REPS; rep++) {
                const int idle = rep % 2;
                vq_cache_reset(c);
                if (!idle) cudaMemcpyAsync(busy[1], busy[0], BUSY_BYTES, cudaMemcpyDeviceToDevice, 0);
                cudaEventRecord(e0, 0);
                double h0 = vq_time_now() * 1e6;
                for (int t0 = 0; t0 < n; t0 += chunk) {
                    size_t off = (size_t)t0 * HKV * D * 2;
                    if (vq_cache_append(c, 0, n - t0 < chunk ? n - t0 : chunk, kx + off, vx + off, dt, NULL))
                        die("append");
                }
                if (idle) th[rep / 2] = (float)(vq_time_now() * 1e6 - h0);
                cudaEventRecord(e1, 0);
                (idle ? ti : t)[rep / 2] = elapsed(e0, e1) * 1000;
            }
            if (vq_cuda_synchronize()) die("append (asynchronous)");
            qsort(t, REPS, sizeof *t, cmp_f);
            qsort(ti, REPS, sizeof *ti, cmp_f);
            qsort(th, REPS, sizeof *th, cmp_f);
            double bytes = (double)n * HKV * D * 2 * 2 + (double)vq_cache_bytes(c);
            double gbps = bytes / (t[REPS / 2] * 1e-6) / 1e9;
            printf("%-16s append %6d tokens %s x%d: GPU %.1f us (%.1f..%.1f), %.0f GB/s in+out, %.0f%% of copy; from "
                   "idle %.1f us (%.1f..%.1f); host %.1f us\n",
                   specs[si], n, dt == VQ_BF16 ? "bf16" : "fp16", (n + chunk - 1) / chunk, t[REPS / 2], t[0],
                   t[REPS - 1], gbps, 100 * gbps / bw, ti[REPS / 2], ti[0], ti[REPS - 1], th[REPS / 2]);
            fflush(stdout);
        }
        /* decode steps: one token per call, back to back; the GPU time per
         * call is the larger of the kernel's and the host's issue time */
        int steps = 2048;
        vq_cache_reset(c);
        cudaDeviceSynchronize();
        double h0 = vq_time_now() * 1e6;
        cudaEventRecord(e0, 0);
        for (int i = 0; i < steps; i++)
            if (vq_cache_append(c, 0, 1, (const char *)kin + (size_t)i * HKV * D * 2,
                                (const char *)vin + (size_t)i * HKV * D * 2, VQ_F16, NULL))
                die("append");
        cudaEventRecord(e1, 0);
        double host = vq_time_now() * 1e6 - h0;
        printf("%-16s append 1 token x %d: %.2f us per call (GPU, back to back), %.2f us per call (host)\n", specs[si],
               steps, elapsed(e0, e1) * 1000 / steps, host / steps);
        fflush(stdout);
        vq_cache_free(c);
    }
    cudaFree(kin);
    cudaFree(vin);
    cudaFree(kbf);
    cudaFree(vbf);
    cudaFree(busy[0]);
    cudaFree(busy[1]);
    return 0;
}
