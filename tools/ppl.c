/* veloxquant ppl: perplexity over consecutive non-overlapping windows of a
 * text file, optionally against an fp16 cache in lockstep (KL divergence of
 * the next-token distributions and top-1 agreement).
 *
 * Protocol: the file is tokenized as a whole (special tokens such as <|doc|>
 * are recognized). Windows of --ctx tokens follow each other with no
 * overlap; a window starts from an empty cache. When the tokenizer prepends
 * a BOS token, the model reads BOS + the window's first ctx-1 tokens and
 * every token of the window is scored; without one it reads the window and
 * the last ctx-1 tokens are scored. --mode decode feeds one token at a time
 * (what generation sees); --mode prefill feeds chunks of up to 512 tokens. */
#include "cli.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* log-softmax of row into out; returns the log of the normalizer. */
static void log_softmax(const float *row, int n, double *out) {
    double mx = row[0];
    for (int i = 1; i < n; i++) mx = row[i] > mx ? row[i] : mx;
    double s = 0;
    for (int i = 0; i < n; i++) s += exp((double)row[i] - mx);
    double lz = mx + log(s);
    for (int i = 0; i < n; i++) out[i] = (double)row[i] - lz;
}

static int argmax(const float *row, int n) {
    int b = 0;
    for (int i = 1; i < n; i++)
        if (row[i] > row[b]) b = i;
    return b;
}

int vq_cmd_ppl(int argc, char **argv) {
    const char *cmd = "ppl", *dir = NULL, *file = NULL, *spec = "fp16", *mode = "prefill", *ref = NULL;
    int ctx = 512, max_tokens = 0, threads = cli_default_threads(), json = 0;
    for (int i = 0; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        int rc = 0;
        if (!strcmp(a, "--json")) { json = 1; continue; }
        if (!v) { fprintf(stderr, "veloxquant ppl: option '%s' needs a value (or is unknown)\n", a); return 2; }
        if (!strcmp(a, "-m") || !strcmp(a, "--model")) dir = v;
        else if (!strcmp(a, "-f") || !strcmp(a, "--file")) file = v;
        else if (!strcmp(a, "--ctx")) rc = cli_int(cmd, "--ctx", v, 2, 1 << 20, &ctx);
        else if (!strcmp(a, "--max-tokens")) rc = cli_int(cmd, "--max-tokens", v, 0, 2147483647, &max_tokens);
        else if (!strcmp(a, "--kv")) spec = v;
        else if (!strcmp(a, "--mode")) mode = v;
        else if (!strcmp(a, "--ref")) ref = v;
        else if (!strcmp(a, "--threads")) rc = cli_int(cmd, "--threads", v, 1, 256, &threads);
        else { fprintf(stderr, "veloxquant ppl: unknown option '%s' (try 'veloxquant help')\n", a); return 2; }
        if (rc) return 2;
        i++;
    }
    int decode = !strcmp(mode, "decode");
    if (!decode && strcmp(mode, "prefill")) { fprintf(stderr, "veloxquant ppl: --mode '%s' is not 'prefill' or 'decode'\n", mode); return 2; }
    if (ref && strcmp(ref, "fp16")) { fprintf(stderr, "veloxquant ppl: --ref '%s' is not supported (only 'fp16')\n", ref); return 2; }
    if (!file) { fprintf(stderr, "veloxquant ppl: no text: give -f FILE\n"); return 2; }
    size_t text_len;
    char *text = cli_read_text(cmd, file, &text_len);
    if (!text) return 1;
    vq_model *m;
    vq_tokenizer *tok;
    if (cli_load_model(cmd, dir, &m, &tok)) { free(text); return 1; }
    const vq_model_info *info = vq_model_get_info(m);
    int V = info->vocab_size, rc = 1;
    int32_t bos = vq_tokenizer_bos(tok);
    size_t n_ids = 0;
    int32_t *ids = malloc(sizeof(int32_t) * (2 * text_len + 2));
    vq_cache *cs = NULL, *cr = NULL;
    vq_pool *pool = NULL;
    /* logits for a piece of the window at a time, bounded to ~256 MiB */
    int piece = decode ? 1 : 512;
    while (piece > 1 && (size_t)piece * V > ((size_t)64 << 20)) piece /= 2;
    float *lg = malloc(sizeof(float) * (size_t)piece * V), *lr = ref ? malloc(sizeof(float) * (size_t)piece * V) : NULL;
    double *ls = malloc(sizeof(double) * V), *lq = malloc(sizeof(double) * V);
    int32_t *input = malloc(sizeof(int32_t) * (size_t)ctx);
    if (!ids || !lg || (ref && !lr) || !ls || !lq || !input) { fprintf(stderr, "veloxquant ppl: out of memory\n"); goto done; }
    if (vq_tokenizer_encode(tok, text, text_len, -1, ids, 2 * text_len + 2, &n_ids) || vq_pool_create(threads, &pool) ||
        vq_model_cache_create(m, spec, 0, &cs) || (ref && vq_model_cache_create(m, "fp16", 0, &cr))) {
        fprintf(stderr, "veloxquant ppl: %s\n", vq_last_error());
        goto done;
    }
    if (ctx > info->max_position_embeddings) {
        fprintf(stderr, "veloxquant ppl: --ctx %d passes the model's context length %d\n", ctx, info->max_position_embeddings);
        goto done;
    }
    size_t usable = max_tokens > 0 && (size_t)max_tokens < n_ids ? (size_t)max_tokens : n_ids;
    size_t n_windows = usable / (size_t)ctx;
    if (n_windows == 0) {
        fprintf(stderr, "veloxquant ppl: the text has %zu tokens, fewer than one window of --ctx %d\n", usable, ctx);
        goto done;
    }
    double nll = 0, nll_ref = 0, kl = 0, t_spec = 0;
    size_t scored = 0, agree = 0, kv_peak = 0, kv16_peak = 0;
    for (size_t w = 0; w < n_windows; w++) {
        const int32_t *win = ids + w * (size_t)ctx;
        /* input[j] predicts target win[j + shift] */
        int n_in, shift;
        if (bos >= 0) {
            input[0] = bos;
            memcpy(input + 1, win, sizeof(int32_t) * (size_t)(ctx - 1));
            n_in = ctx;
            shift = 0;
        } else {
            memcpy(input, win, sizeof(int32_t) * (size_t)ctx);
            n_in = ctx - 1; /* the last token is only a target */
            shift = 1;
        }
        vq_cache_reset(cs);
        if (cr) vq_cache_reset(cr);
        for (int j0 = 0; j0 < n_in; j0 += piece) {
            int n = n_in - j0 < piece ? n_in - j0 : piece;
            double t0 = vq_time_now();
            vq_status st = vq_model_forward(m, cs, input + j0, n, decode ? 1 : 0, lg, 1, pool);
            t_spec += vq_time_now() - t0;
            if (!st && cr) st = vq_model_forward(m, cr, input + j0, n, decode ? 1 : 0, lr, 1, pool);
            if (st) { fprintf(stderr, "\nveloxquant ppl: %s\n", vq_last_error()); goto done; }
            for (int j = 0; j < n; j++) {
                int32_t target = win[j0 + j + shift];
                const float *row = lg + (size_t)j * V;
                log_softmax(row, V, ls);
                nll -= ls[target];
                if (cr) {
                    const float *rrow = lr + (size_t)j * V;
                    log_softmax(rrow, V, lq);
                    nll_ref -= lq[target];
                    double k = 0;
                    for (int i = 0; i < V; i++) k += exp(lq[i]) * (lq[i] - ls[i]);
                    kl += k;
                    agree += argmax(row, V) == argmax(rrow, V);
                }
                scored++;
            }
        }
        /* the peak: with eviction, blocks come and go within a window */
        size_t kv = vq_cache_peak_bytes(cs), kv16 = vq_cache_bytes_fp16_equiv(cs);
        if (kv > kv_peak) kv_peak = kv;
        if (kv16 > kv16_peak) kv16_peak = kv16;
        /* progress */
        int bar = (int)(30 * (w + 1) / n_windows);
        fprintf(stderr, "\rppl [%.*s%*s] window %zu/%zu  ppl %.4f", bar, "==============================", 30 - bar, "",
                w + 1, n_windows, exp(nll / (double)scored));
        fflush(stderr);
    }
    fprintf(stderr, "\n");
    double ppl = exp(nll / (double)scored);
    double tps = (double)(n_windows * (size_t)(bos >= 0 ? ctx : ctx - 1)) / t_spec;
    char b1[32], b2[32];
    printf("model %s, spec %s, mode %s, ctx %d, %zu windows, %zu tokens scored\n", info->arch, vq_cache_spec(cs), mode, ctx,
           n_windows, scored);
    printf("ppl %.4f", ppl);
    if (cr)
        printf(" | fp16 ppl %.4f | KL(fp16||spec) %.6f nats/token | top-1 agreement %.4f", exp(nll_ref / (double)scored),
               kl / (double)scored, (double)agree / (double)scored);
    char b3[48];
    printf("\nKV cache at the end of a window: %s allocated, fp16 %s (%s) | %.1f tokens/s\n",
           cli_bytes((double)kv_peak, b1, sizeof b1), cli_bytes((double)kv16_peak, b2, sizeof b2),
           cli_size_ratio((double)kv16_peak, (double)kv_peak, b3, sizeof b3), tps);
    if (json) {
        printf("{\"ppl\":%.6f,", ppl);
        if (cr)
            printf("\"ppl_ref\":%.6f,\"kl\":%.8f,\"top1_agree\":%.6f,", exp(nll_ref / (double)scored), kl / (double)scored,
                   (double)agree / (double)scored);
        printf("\"tokens\":%zu,\"windows\":%zu,\"ctx\":%d,\"mode\":\"%s\",\"spec\":\"%s\",\"kv_bytes\":%zu,"
               "\"kv_bytes_fp16\":%zu,\"bits_per_elem\":%.4f,\"tokens_per_s\":%.3f,\"threads\":%d}\n",
               scored, n_windows, ctx, mode, vq_cache_spec(cs), kv_peak, kv16_peak, vq_cache_bits_per_elem(cs), tps, threads);
    }
    rc = 0;
done:
    free(text); free(ids); free(lg); free(lr); free(ls); free(lq); free(input);
    vq_cache_free(cs);
    vq_cache_free(cr);
    vq_pool_free(pool);
    vq_tokenizer_free(tok);
    vq_model_free(m);
    return rc;
}
