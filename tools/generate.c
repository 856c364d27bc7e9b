/* veloxquant generate: text generation on the compressed cache, streamed. */
#include "cli.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The prompt as the model's chat template lays it out: an optional system
 * message, the prompt as one user message, and the opening of the
 * assistant's turn. The template comes from DIR/chat_template.jinja when
 * present (where newer transformers saves it), else tokenizer_config.json.
 * Returns malloc'd text, or NULL after printing why. */
static char *chat_prompt(const char *dir, const char *system, const char *prompt) {
    const char *cmd = "generate";
    char path[4096];
    vq_chat_config cfg;
    snprintf(path, sizeof path, "%s/tokenizer_config.json", dir);
    if (vq_chat_config_load(path, &cfg)) {
        fprintf(stderr, "veloxquant %s: %s\n", cmd, vq_last_error());
        return NULL;
    }
    snprintf(path, sizeof path, "%s/chat_template.jinja", dir);
    FILE *f = fopen(path, "rb");
    if (f) {
        fclose(f);
        size_t len;
        char *text = cli_read_text(cmd, path, &len);
        if (!text) {
            vq_chat_config_free(&cfg);
            return NULL;
        }
        free(cfg.chat_template);
        cfg.chat_template = text;
    }
    if (!cfg.chat_template) {
        fprintf(stderr,
                "veloxquant %s: --chat: the model in '%s' has no chat template (no \"chat_template\" in "
                "tokenizer_config.json and no chat_template.jinja); leave out --chat for plain text\n",
                cmd, dir);
        vq_chat_config_free(&cfg);
        return NULL;
    }
    vq_chat_message msgs[2] = {{"system", system}, {"user", prompt}};
    int first = system ? 0 : 1;
    char *text = NULL;
    if (vq_chat_render(cfg.chat_template, msgs + first, 2 - first, 1, cfg.bos_token, cfg.eos_token, &text))
        fprintf(stderr, "veloxquant %s: --chat: %s\n", cmd, vq_last_error());
    vq_chat_config_free(&cfg);
    return text;
}

int vq_cmd_generate(int argc, char **argv) {
    const char *cmd = "generate", *dir = NULL, *prompt = NULL, *prompt_file = NULL, *spec = "fp16", *system = NULL;
    int n_new = 128, threads = cli_default_threads(), seed = 42, chat = 0;
    float temp = 0.7f, top_p = 0.9f;
    for (int i = 0; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        int rc = 0;
        if (!strcmp(a, "--chat")) {
            chat = 1;
            continue;
        }
        if (!v) { fprintf(stderr, "veloxquant generate: option '%s' needs a value (or is unknown)\n", a); return 2; }
        if (!strcmp(a, "-m") || !strcmp(a, "--model")) dir = v;
        else if (!strcmp(a, "-p") || !strcmp(a, "--prompt")) prompt = v;
        else if (!strcmp(a, "-f") || !strcmp(a, "--prompt-file")) prompt_file = v;
        else if (!strcmp(a, "-n")) rc = cli_int(cmd, "-n", v, 0, 1 << 20, &n_new);
        else if (!strcmp(a, "--kv")) spec = v;
        else if (!strcmp(a, "--system")) system = v;
        else if (!strcmp(a, "--temp")) rc = cli_float(cmd, "--temp", v, 0, 100, &temp);
        else if (!strcmp(a, "--top-p")) rc = cli_float(cmd, "--top-p", v, 1e-6, 1, &top_p);
        else if (!strcmp(a, "--seed")) rc = cli_int(cmd, "--seed", v, 0, 2147483647, &seed);
        else if (!strcmp(a, "--threads")) rc = cli_int(cmd, "--threads", v, 1, 256, &threads);
        else { fprintf(stderr, "veloxquant generate: unknown option '%s' (try 'veloxquant help')\n", a); return 2; }
        if (rc) return 2;
        i++;
    }
    if (prompt && prompt_file) { fprintf(stderr, "veloxquant generate: give -p TEXT or -f FILE, not both\n"); return 2; }
    if (system && !chat) { fprintf(stderr, "veloxquant generate: --system needs --chat\n"); return 2; }
    char *file_text = NULL;
    if (prompt_file) {
        size_t flen;
        file_text = cli_read_text(cmd, prompt_file, &flen);
        if (!file_text) return 1;
        if (strlen(file_text) != flen) {
            fprintf(stderr, "veloxquant generate: '%s' holds a NUL byte (not text)\n", prompt_file);
            free(file_text);
            return 1;
        }
        prompt = file_text;
    }
    if (!prompt) { fprintf(stderr, "veloxquant generate: no prompt: give -p TEXT or -f FILE\n"); return 2; }
    if (!*prompt) {
        fprintf(stderr, "veloxquant generate: the prompt%s%s is empty\n", prompt_file ? " file " : "", prompt_file ? prompt_file : "");
        free(file_text);
        return 2;
    }
    vq_model *m;
    vq_tokenizer *tok;
    if (cli_load_model(cmd, dir, &m, &tok)) {
        free(file_text);
        return 1;
    }
    const vq_model_info *info = vq_model_get_info(m);
    int rc = 1;
    vq_cache *cache = NULL;
    vq_pool *pool = NULL;
    /* With --chat the model reads the rendered conversation. It is encoded
     * as transformers' apply_chat_template encodes it: special tokens in the
     * text ("<|im_start|>", the template's own BOS) are matched, and no BOS
     * is added on top. */
    char *chat_text = NULL;
    int32_t bos = vq_tokenizer_bos(tok), *ids = NULL;
    float *logits = NULL, *scratch = NULL;
    size_t plen = 0, n_prompt = 0;
    if (chat) {
        chat_text = chat_prompt(dir, system, prompt);
        if (!chat_text) goto done;
        prompt = chat_text;
        bos = -1;
    }
    plen = strlen(prompt);
    ids = malloc(sizeof(int32_t) * (2 * plen + 2));
    logits = malloc(sizeof(float) * (size_t)info->vocab_size);
    scratch = malloc(sizeof(float) * 2 * (size_t)info->vocab_size);
    if (!ids || !logits || !scratch) { fprintf(stderr, "veloxquant generate: out of memory\n"); goto done; }
    if (vq_tokenizer_encode(tok, prompt, plen, bos, ids, 2 * plen + 2, &n_prompt) ||
        vq_model_cache_create(m, spec, 0, &cache) || vq_pool_create(threads, &pool)) {
        fprintf(stderr, "veloxquant generate: %s\n", vq_last_error());
        goto done;
    }
    if (n_prompt == 0) { fprintf(stderr, "veloxquant generate: the prompt has no tokens\n"); goto done; }
    if ((int64_t)n_prompt + n_new > info->max_position_embeddings) {
        fprintf(stderr, "veloxquant generate: %zu prompt tokens + -n %d pass the model's context length %d\n",
                n_prompt, n_new, info->max_position_embeddings);
        goto done;
    }
    fwrite(prompt, 1, plen, stdout);
    fflush(stdout);
    double t0 = vq_time_now();
    if (vq_model_forward(m, cache, ids, (int)n_prompt, 0, logits, 0, pool)) {
        fprintf(stderr, "\nveloxquant generate: %s\n", vq_last_error());
        goto done;
    }
    double t_prompt = vq_time_now() - t0;
    vq_rng rng;
    vq_rng_seed(&rng, (uint64_t)seed);
    int generated = 0;
    double t1 = vq_time_now();
    for (; generated < n_new; generated++) {
        int32_t next = vq_sample(logits, info->vocab_size, temp, top_p, &rng, scratch);
        int is_eos = next == vq_tokenizer_eos(tok);
        for (int e = 0; e < info->n_eos; e++) is_eos |= next == info->eos_token_ids[e];
        if (is_eos) break;
        size_t len;
        const char *piece = vq_tokenizer_piece(tok, next, &len);
        if (piece && !vq_tokenizer_is_special(tok, next)) {
            fwrite(piece, 1, len, stdout);
            fflush(stdout);
        }
        if (generated + 1 < n_new && vq_model_forward(m, cache, &next, 1, 0, logits, 0, pool)) {
            fprintf(stderr, "\nveloxquant generate: %s\n", vq_last_error());
            goto done;
        }
    }
    double t_gen = vq_time_now() - t1;
    printf("\n");
    fflush(stdout);
    char b1[32], b2[32];
    size_t kv = vq_cache_peak_bytes(cache), kv16 = vq_cache_bytes_fp16_equiv(cache);
    fprintf(stderr, "prompt: %zu tokens, %.1f tokens/s | generation: %d tokens, %.1f tokens/s | %d threads\n",
            n_prompt, n_prompt / t_prompt, generated, generated > 0 ? generated / t_gen : 0.0, threads);
    char b3[48];
    fprintf(stderr, "KV cache (%s): %s allocated at the peak, fp16 would take %s: %s\n", vq_cache_spec(cache),
            cli_bytes((double)kv, b1, sizeof b1), cli_bytes((double)kv16, b2, sizeof b2),
            cli_size_ratio((double)kv16, (double)kv, b3, sizeof b3));
    rc = 0;
done:
    free(chat_text);
    free(file_text);
    free(ids);
    free(logits);
    free(scratch);
    vq_cache_free(cache);
    vq_pool_free(pool);
    vq_tokenizer_free(tok);
    vq_model_free(m);
    return rc;
}
