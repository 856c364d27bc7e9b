/* veloxquant info: what a model folder holds and what its KV cache costs. */
#include "cli.h"

#include <stdio.h>
#include <string.h>

static const char *dtype_name(vq_dtype t) { return t == VQ_F32 ? "f32" : t == VQ_F16 ? "f16" : "bf16"; }

int vq_cmd_info(int argc, char **argv) {
    const char *dir = NULL, *spec = NULL;
    for (int i = 0; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!v) { fprintf(stderr, "veloxquant info: option '%s' needs a value (or is unknown)\n", a); return 2; }
        if (!strcmp(a, "-m") || !strcmp(a, "--model")) dir = v;
        else if (!strcmp(a, "--kv")) spec = v;
        else { fprintf(stderr, "veloxquant info: unknown option '%s' (try 'veloxquant help')\n", a); return 2; }
        i++;
    }
    vq_model *m;
    if (cli_load_model("info", dir, &m, NULL)) return 1;
    const vq_model_info *in = vq_model_get_info(m);
    printf("model            %s\n", dir);
    printf("architecture     %s\n", in->arch);
    printf("parameters       %.2f M (%lld)\n", (double)in->n_params / 1e6, (long long)in->n_params);
    printf("weights          %s\n", dtype_name(in->dtype));
    printf("layers           %d, hidden %d, intermediate %d\n", in->n_layers, in->hidden_size, in->intermediate_size);
    printf("heads            %d query / %d kv, head dim %d\n", in->n_heads, in->n_kv_heads, in->head_dim);
    printf("vocabulary       %d\n", in->vocab_size);
    printf("context length   %d\n", in->max_position_embeddings);
    double fp16_tok = (double)in->n_layers * in->n_kv_heads * in->head_dim * 2 * 2;
    printf("KV bytes/token   fp16: %.0f\n", fp16_tok);
    int rc = 0;
    if (spec) {
        vq_cache *c;
        if (vq_model_cache_create(m, spec, 0, &c)) {
            fprintf(stderr, "veloxquant info: %s\n", vq_last_error());
            rc = 1;
        } else {
            double bits = vq_cache_bits_per_elem(c);
            /* packed codes and metadata, plus a 4-byte position per token and head */
            double tok = (double)in->n_layers * in->n_kv_heads * (in->head_dim * 2 * bits / 8 + 4);
            printf("                 %s: %.0f (%.2f bits/element, %.2fx smaller than fp16, plus an fp16 window of the newest tokens)\n",
                   vq_cache_spec(c), tok, bits, fp16_tok / tok);
            vq_cache_free(c);
        }
    }
    vq_model_free(m);
    return rc;
}
