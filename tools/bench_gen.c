/* veloxquant bench gen: model throughput on a compressed cache versus fp16,
 * interleaved in one process. Each run prefills ctx - decode tokens (chunks
 * of 512) from an empty cache, then decodes `decode` more tokens one at a
 * time, so decode speed is measured at a context of about ctx tokens. */
#include "cli.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int cmp_d(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static void stats(double *x, int n, double *med, double *mn, double *mx) {
    qsort(x, (size_t)n, sizeof *x, cmp_d);
    *med = n % 2 ? x[n / 2] : 0.5 * (x[n / 2 - 1] + x[n / 2]);
    *mn = x[0];
    *mx = x[n - 1];
}

int vq_cmd_bench_gen(int argc, char **argv) {
    const char *cmd = "bench gen", *dir = NULL, *spec = "kivi:bits=2", *file = NULL;
    int ctx = 4096, n_dec = 64, runs = 3, threads = cli_default_threads(), json = 0;
    for (int i = 0; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        int rc = 0;
        if (!strcmp(a, "--json")) { json = 1; continue; }
        if (!v) { fprintf(stderr, "veloxquant bench gen: option '%s' needs a value (or is unknown)\n", a); return 2; }
        if (!strcmp(a, "-m") || !strcmp(a, "--model")) dir = v;
        else if (!strcmp(a, "-f") || !strcmp(a, "--file")) file = v;
        else if (!strcmp(a, "--kv")) spec = v;
        else if (!strcmp(a, "--ctx")) rc = cli_int(cmd, "--ctx", v, 2, 1 << 20, &ctx);
        else if (!strcmp(a, "--decode")) rc = cli_int(cmd, "--decode", v, 1, 1 << 16, &n_dec);
        else if (!strcmp(a, "--runs")) rc = cli_int(cmd, "--runs", v, 1, 1000, &runs);
        else if (!strcmp(a, "--threads")) rc = cli_int(cmd, "--threads", v, 1, 256, &threads);
        else { fprintf(stderr, "veloxquant bench gen: unknown option '%s' (try 'veloxquant help')\n", a); return 2; }
        if (rc) return 2;
        i++;
    }
    if (n_dec >= ctx) { fprintf(stderr, "veloxquant bench gen: --decode %d must be below --ctx %d\n", n_dec, ctx); return 2; }
    vq_model *m;
    vq_tokenizer *tok = NULL;
    if (cli_load_model(cmd, dir, &m, file ? &tok : NULL)) return 1;
    const vq_model_info *info = vq_model_get_info(m);
    int rc = 1, V = info->vocab_size, n_pre = ctx - n_dec;
    int32_t *ids = malloc(sizeof(int32_t) * (size_t)ctx);
    float *logits = malloc(sizeof(float) * (size_t)V);
    double *t[2][2]; /* [arm][prefill, decode] tokens/s */
    for (int a = 0; a < 2; a++)
        for (int k = 0; k < 2; k++) t[a][k] = malloc(sizeof(double) * (size_t)runs);
    vq_cache *cache[2] = {NULL, NULL};
    vq_pool *pool = NULL;
    char *text = NULL;
    if (!ids || !logits) { fprintf(stderr, "veloxquant bench gen: out of memory\n"); goto done; }
    if (ctx > info->max_position_embeddings) {
        fprintf(stderr, "veloxquant bench gen: --ctx %d passes the model's context length %d\n", ctx, info->max_position_embeddings);
        goto done;
    }
    if (file) { /* real text: the file's first ctx tokens */
        size_t len, n = 0;
        text = cli_read_text(cmd, file, &len);
        int32_t *all = text ? malloc(sizeof(int32_t) * (2 * len + 2)) : NULL;
        if (!all || vq_tokenizer_encode(tok, text, len, vq_tokenizer_bos(tok), all, 2 * len + 2, &n)) {
            fprintf(stderr, "veloxquant bench gen: %s\n", all ? vq_last_error() : "cannot read the file");
            free(all);
            goto done;
        }
        if (n < (size_t)ctx) {
            fprintf(stderr, "veloxquant bench gen: '%s' has %zu tokens, fewer than --ctx %d\n", file, n, ctx);
            free(all);
            goto done;
        }
        memcpy(ids, all, sizeof(int32_t) * (size_t)ctx);
        free(all);
    } else { /* seeded random ids: speed does not depend on the text */
        vq_rng r;
        vq_rng_seed(&r, 11);
        for (int i = 0; i < ctx; i++) ids[i] = (int32_t)(vq_rng_next(&r) % (uint64_t)V);
    }
    if (vq_model_cache_create(m, spec, 0, &cache[0]) || vq_model_cache_create(m, "fp16", 0, &cache[1]) ||
        vq_pool_create(threads, &pool)) {
        fprintf(stderr, "veloxquant bench gen: %s\n", vq_last_error());
        goto done;
    }
    size_t kv[2] = {0, 0};
    for (int run = -1; run < runs; run++) { /* run -1 warms up */
        for (int k = 0; k < 2; k++) {
            int a = (run & 1) ? 1 - k : k; /* alternate which arm goes first */
            vq_cache_reset(cache[a]);
            double t0 = vq_time_now();
            vq_status st = vq_model_forward(m, cache[a], ids, n_pre, 0, logits, 0, pool);
            double t1 = vq_time_now();
            for (int i = 0; !st && i < n_dec; i++) st = vq_model_forward(m, cache[a], ids + n_pre + i, 1, 1, logits, 0, pool);
            double t2 = vq_time_now();
            if (st) { fprintf(stderr, "veloxquant bench gen: %s\n", vq_last_error()); goto done; }
            kv[a] = vq_cache_bytes(cache[a]);
            if (run >= 0) {
                t[a][0][run] = n_pre / (t1 - t0);
                t[a][1][run] = n_dec / (t2 - t1);
            }
        }
    }
    double s[2][2][3];
    for (int a = 0; a < 2; a++)
        for (int k = 0; k < 2; k++) stats(t[a][k], runs, &s[a][k][0], &s[a][k][1], &s[a][k][2]);
    char b1[32], b2[32];
    printf("bench gen: %s, ctx %d (prefill %d in chunks of 512, then decode %d), %d threads, %d runs, %s\n", info->arch,
           ctx, n_pre, n_dec, threads, runs, file ? file : "random token ids");
    printf("  %-60s %26s %26s %12s\n", "spec", "prefill tok/s med [min,max]", "decode tok/s med [min,max]", "KV bytes");
    const char *names[2] = {vq_cache_spec(cache[0]), "fp16"};
    for (int a = 0; a < 2; a++)
        printf("  %-60s %9.1f [%6.1f,%6.1f] %9.1f [%6.1f,%6.1f] %12s\n", names[a], s[a][0][0], s[a][0][1], s[a][0][2],
               s[a][1][0], s[a][1][1], s[a][1][2], cli_bytes((double)kv[a], a ? b2 : b1, 32));
    char rb[48];
    printf("  decode speedup vs fp16 %.2fx, KV memory %s\n", s[0][1][0] / s[1][1][0],
           cli_size_ratio((double)kv[1], (double)kv[0], rb, sizeof rb));
    if (json)
        printf("{\"model\":\"%s\",\"spec\":\"%s\",\"ctx\":%d,\"decode_tokens\":%d,\"threads\":%d,\"runs\":%d,"
               "\"prefill_tps\":%.3f,\"prefill_tps_min\":%.3f,\"prefill_tps_max\":%.3f,\"decode_tps\":%.3f,"
               "\"decode_tps_min\":%.3f,\"decode_tps_max\":%.3f,\"fp16_prefill_tps\":%.3f,\"fp16_decode_tps\":%.3f,"
               "\"fp16_decode_tps_min\":%.3f,\"fp16_decode_tps_max\":%.3f,\"kv_bytes\":%zu,\"kv_bytes_fp16\":%zu}\n",
               info->arch, names[0], ctx, n_dec, threads, runs, s[0][0][0], s[0][0][1], s[0][0][2], s[0][1][0], s[0][1][1],
               s[0][1][2], s[1][0][0], s[1][1][0], s[1][1][1], s[1][1][2], kv[0], kv[1]);
    rc = 0;
done:
    for (int a = 0; a < 2; a++) {
        vq_cache_free(cache[a]);
        for (int k = 0; k < 2; k++) free(t[a][k]);
    }
    free(ids);
    free(logits);
    free(text);
    vq_pool_free(pool);
    vq_tokenizer_free(tok);
    vq_model_free(m);
    return rc;
}
