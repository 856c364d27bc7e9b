/*
 * config.json of a Hugging Face model: the architecture and its sizes.
 *
 * Fields a config may leave out get the defaults transformers uses for that
 * architecture; the sizes that define the weights must be present. Anything
 * that would change the computation and is not implemented (another
 * architecture, an activation other than SiLU, a sliding window, an unknown
 * rope type) is refused by name rather than ignored.
 */
#include "model/model_internal.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const struct {
    const char *name;
    vq_arch arch;
    int max_pos;   /* transformers' default max_position_embeddings */
} archs[] = {
    {"LlamaForCausalLM", VQ_ARCH_LLAMA, 2048},
    {"MistralForCausalLM", VQ_ARCH_MISTRAL, 4096 * 32},
    {"Qwen2ForCausalLM", VQ_ARCH_QWEN2, 32768},
    {"Qwen3ForCausalLM", VQ_ARCH_QWEN3, 32768},
};
#define N_ARCHS ((int)(sizeof archs / sizeof archs[0]))

/* A field that is absent or JSON null counts as absent. */
static const cJSON *field(const cJSON *obj, const char *key) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(obj, key);
    return cJSON_IsNull(v) ? NULL : v;
}

/* An integer field in [lo, hi]; *out keeps its default when the field is
 * absent and required is false. */
static vq_status get_int(const cJSON *obj, const char *name, const char *key, bool required, long lo, long hi,
                         int *out) {
    const cJSON *v = field(obj, key);
    if (!v) {
        if (required) return vq_fail(VQ_ERR_FORMAT, "%s: missing \"%s\"", name, key);
        return VQ_OK;
    }
    if (!cJSON_IsNumber(v) || v->valuedouble != floor(v->valuedouble))
        return vq_fail(VQ_ERR_FORMAT, "%s: \"%s\" must be an integer", name, key);
    if (v->valuedouble < (double)lo || v->valuedouble > (double)hi)
        return vq_fail(VQ_ERR_FORMAT, "%s: \"%s\" is %.17g, allowed [%ld, %ld]", name, key, v->valuedouble, lo, hi);
    *out = (int)v->valuedouble;
    return VQ_OK;
}

/* A number field in the open-closed range (lo, hi]. */
static vq_status get_num(const cJSON *obj, const char *name, const char *key, double lo, double hi, double *out) {
    const cJSON *v = field(obj, key);
    if (!v) return VQ_OK;
    if (!cJSON_IsNumber(v)) return vq_fail(VQ_ERR_FORMAT, "%s: \"%s\" must be a number", name, key);
    if (!(v->valuedouble > lo && v->valuedouble <= hi))
        return vq_fail(VQ_ERR_FORMAT, "%s: \"%s\" is %.17g, allowed (%g, %g]", name, key, v->valuedouble, lo, hi);
    *out = v->valuedouble;
    return VQ_OK;
}

static vq_status get_bool(const cJSON *obj, const char *name, const char *key, int *out) {
    const cJSON *v = field(obj, key);
    if (!v) return VQ_OK;
    if (!cJSON_IsBool(v)) return vq_fail(VQ_ERR_FORMAT, "%s: \"%s\" must be true or false", name, key);
    *out = cJSON_IsTrue(v) ? 1 : 0;
    return VQ_OK;
}

/* rope_scaling (or the newer rope_parameters): null, "default" or "llama3". */
static vq_status parse_rope(const cJSON *rs, const char *name, const char *key, vq_model_config *c) {
    if (!cJSON_IsObject(rs)) return vq_fail(VQ_ERR_FORMAT, "%s: \"%s\" must be an object or null", name, key);
    const cJSON *t = field(rs, "rope_type");
    if (!t) t = field(rs, "type");
    if (!t) {
        /* rope_parameters may only carry rope_theta */
        if (strcmp(key, "rope_parameters") == 0) return VQ_OK;
        return vq_fail(VQ_ERR_FORMAT, "%s: \"%s\" has no \"rope_type\"", name, key);
    }
    if (!cJSON_IsString(t)) return vq_fail(VQ_ERR_FORMAT, "%s: \"%s\".rope_type must be a string", name, key);
    if (strcmp(t->valuestring, "default") == 0) {
        c->rope_type = VQ_ROPE_DEFAULT;
        return VQ_OK;
    }
    if (strcmp(t->valuestring, "llama3") != 0)
        return vq_fail(VQ_ERR_UNSUPPORTED, "%s: rope type '%s' is not supported (supported: default, llama3)",
                       name, t->valuestring);
    c->rope_type = VQ_ROPE_LLAMA3;
    const char *need[] = {"factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings"};
    for (int i = 0; i < 4; i++)
        if (!field(rs, need[i]))
            return vq_fail(VQ_ERR_FORMAT, "%s: llama3 rope scaling lacks \"%s\"", name, need[i]);
    char sub[300];
    snprintf(sub, sizeof sub, "%s: %s", name, key);
    vq_status st;
    if ((st = get_num(rs, sub, "factor", 0, 1e6, &c->rope_factor)) ||
        (st = get_num(rs, sub, "low_freq_factor", 0, 1e6, &c->rope_low_freq_factor)) ||
        (st = get_num(rs, sub, "high_freq_factor", 0, 1e6, &c->rope_high_freq_factor)) ||
        (st = get_int(rs, sub, "original_max_position_embeddings", true, 1, 1 << 24, &c->rope_original_max_pos)))
        return st;
    /* The llama3 formula divides by (high - low). */
    if (!(c->rope_high_freq_factor > c->rope_low_freq_factor))
        return vq_fail(VQ_ERR_FORMAT, "%s: high_freq_factor %g must be greater than low_freq_factor %g", sub,
                       c->rope_high_freq_factor, c->rope_low_freq_factor);
    return VQ_OK;
}

/* bos_token_id / eos_token_id: an integer, a list of integers, or null. */
static vq_status get_ids(const cJSON *obj, const char *name, const char *key, int vocab, int32_t *ids, int max,
                         int *n) {
    const cJSON *v = field(obj, key);
    *n = 0;
    if (!v) return VQ_OK;
    const cJSON *one = v;
    if (cJSON_IsArray(v)) {
        if (cJSON_GetArraySize(v) > max)
            return vq_fail(VQ_ERR_UNSUPPORTED, "%s: \"%s\" lists %d ids, at most %d supported", name, key,
                           cJSON_GetArraySize(v), max);
        one = v->child;
    }
    for (; one; one = cJSON_IsArray(v) ? one->next : NULL) {
        if (!cJSON_IsNumber(one) || one->valuedouble != floor(one->valuedouble))
            return vq_fail(VQ_ERR_FORMAT, "%s: \"%s\" must be an integer or a list of integers", name, key);
        if (one->valuedouble < 0 || one->valuedouble >= vocab)
            return vq_fail(VQ_ERR_FORMAT, "%s: \"%s\" %.17g is outside the vocabulary [0, %d)", name, key,
                           one->valuedouble, vocab);
        ids[(*n)++] = (int32_t)one->valuedouble;
    }
    return VQ_OK;
}

static vq_status parse(const cJSON *root, const char *name, vq_model_config *c) {
    if (!cJSON_IsObject(root)) return vq_fail(VQ_ERR_FORMAT, "%s: not a JSON object", name);

    const cJSON *ar = field(root, "architectures");
    if (!cJSON_IsArray(ar) || !cJSON_IsString(ar->child))
        return vq_fail(VQ_ERR_FORMAT, "%s: missing \"architectures\" (a list naming the model class)", name);
    int a = 0;
    while (a < N_ARCHS && strcmp(archs[a].name, ar->child->valuestring) != 0) a++;
    if (a == N_ARCHS)
        return vq_fail(VQ_ERR_UNSUPPORTED,
                       "%s: architecture '%s' is not supported (supported: LlamaForCausalLM, MistralForCausalLM, "
                       "Qwen2ForCausalLM, Qwen3ForCausalLM)",
                       name, ar->child->valuestring);
    c->arch = archs[a].arch;
    c->arch_name = archs[a].name;

    vq_status st;
    if ((st = get_int(root, name, "hidden_size", true, 8, 1 << 16, &c->hidden_size)) ||
        (st = get_int(root, name, "intermediate_size", true, 1, 1 << 20, &c->intermediate_size)) ||
        (st = get_int(root, name, "num_hidden_layers", true, 1, 1024, &c->n_layers)) ||
        (st = get_int(root, name, "num_attention_heads", true, 1, 1024, &c->n_heads)) ||
        (st = get_int(root, name, "vocab_size", true, 1, 1 << 24, &c->vocab_size)))
        return st;

    c->n_kv_heads = c->n_heads;
    c->head_dim = c->arch == VQ_ARCH_QWEN3 ? 128 : c->hidden_size / c->n_heads;
    c->max_position_embeddings = archs[a].max_pos;
    c->rms_norm_eps = 1e-6;
    c->rope_theta = 10000.0;
    c->partial_rotary_factor = 1.0;
    c->rope_type = VQ_ROPE_DEFAULT;
    c->attention_bias = c->arch == VQ_ARCH_QWEN2; /* Qwen2 always has q/k/v biases */
    c->qk_norm = c->arch == VQ_ARCH_QWEN3;
    c->dtype = VQ_F32;
    c->bos_token_id = -1;
    int mlp_bias = 0;
    if ((st = get_int(root, name, "num_key_value_heads", false, 1, 1024, &c->n_kv_heads)) ||
        (st = get_int(root, name, "head_dim", false, 8, 1024, &c->head_dim)) ||
        (st = get_int(root, name, "max_position_embeddings", false, 1, 1 << 24, &c->max_position_embeddings)) ||
        (st = get_num(root, name, "rms_norm_eps", 0, 0.1, &c->rms_norm_eps)) ||
        (st = get_num(root, name, "rope_theta", 0, 1e12, &c->rope_theta)) ||
        (st = get_num(root, name, "partial_rotary_factor", 0, 1, &c->partial_rotary_factor)) ||
        (st = get_bool(root, name, "tie_word_embeddings", &c->tie_word_embeddings)) ||
        (st = get_bool(root, name, "mlp_bias", &mlp_bias)))
        return st;
    /* Qwen2 has no attention_bias key: its biases are part of the model. */
    if (c->arch != VQ_ARCH_QWEN2 && (st = get_bool(root, name, "attention_bias", &c->attention_bias))) return st;
    if (mlp_bias) return vq_fail(VQ_ERR_UNSUPPORTED, "%s: \"mlp_bias\": true is not supported", name);

    if (c->n_heads % c->n_kv_heads != 0)
        return vq_fail(VQ_ERR_FORMAT, "%s: num_attention_heads %d is not a multiple of num_key_value_heads %d",
                       name, c->n_heads, c->n_kv_heads);
    if (!field(root, "head_dim") && c->arch != VQ_ARCH_QWEN3 && c->hidden_size % c->n_heads != 0)
        return vq_fail(VQ_ERR_FORMAT, "%s: hidden_size %d is not a multiple of num_attention_heads %d (and no head_dim)",
                       name, c->hidden_size, c->n_heads);
    /* The cache stores heads in groups of 8 channels. */
    if (c->head_dim < 8 || c->head_dim > 1024 || c->head_dim % 8 != 0)
        return vq_fail(VQ_ERR_UNSUPPORTED, "%s: head_dim %d must be a multiple of 8 in [8, 1024]", name, c->head_dim);
    c->rotary_dim = (int)(c->head_dim * c->partial_rotary_factor);
    if (c->rotary_dim < 2 || c->rotary_dim % 2 != 0)
        return vq_fail(VQ_ERR_FORMAT, "%s: partial_rotary_factor %g gives %d rotary dims of head_dim %d; need an even count >= 2",
                       name, c->partial_rotary_factor, c->rotary_dim, c->head_dim);

    const cJSON *act = field(root, "hidden_act");
    if (act && (!cJSON_IsString(act) || strcmp(act->valuestring, "silu") != 0))
        return vq_fail(VQ_ERR_UNSUPPORTED, "%s: hidden_act '%s' is not supported (supported: silu)", name,
                       cJSON_IsString(act) ? act->valuestring : "(not a string)");

    /* transformers 4.56+ writes rope settings under rope_parameters. */
    const cJSON *rp = field(root, "rope_parameters");
    if (rp) {
        if ((st = parse_rope(rp, name, "rope_parameters", c))) return st;
        if ((st = get_num(rp, name, "rope_theta", 0, 1e12, &c->rope_theta))) return st;
    }
    const cJSON *rs = field(root, "rope_scaling");
    if (rs && (st = parse_rope(rs, name, "rope_scaling", c))) return st;

    /* Sliding-window attention would need a different mask; refuse it when it
     * would actually cut the context. */
    int window = 0;
    const cJSON *sw = field(root, "sliding_window");
    if (sw && (st = get_int(root, name, "sliding_window", false, 0, 1 << 30, &window))) return st;
    bool sw_on = false;
    if (c->arch == VQ_ARCH_MISTRAL) {
        sw_on = sw && window < c->max_position_embeddings;
    } else if (c->arch == VQ_ARCH_QWEN2 || c->arch == VQ_ARCH_QWEN3) {
        int use = 0;
        if ((st = get_bool(root, name, "use_sliding_window", &use))) return st;
        sw_on = use && sw && window < c->max_position_embeddings;
    }
    if (sw_on)
        return vq_fail(VQ_ERR_UNSUPPORTED,
                       "%s: sliding-window attention (sliding_window %d < max_position_embeddings %d) is not supported",
                       name, window, c->max_position_embeddings);

    const cJSON *dt = field(root, "torch_dtype");
    if (!dt) dt = field(root, "dtype");
    if (dt) {
        const char *s = cJSON_IsString(dt) ? dt->valuestring : "(not a string)";
        if (strcmp(s, "float32") == 0) c->dtype = VQ_F32;
        else if (strcmp(s, "float16") == 0) c->dtype = VQ_F16;
        else if (strcmp(s, "bfloat16") == 0) c->dtype = VQ_BF16;
        else
            return vq_fail(VQ_ERR_UNSUPPORTED, "%s: torch_dtype '%s' is not supported (float32, float16, bfloat16)",
                           name, s);
    }

    int32_t bos[1];
    int n_bos;
    if ((st = get_ids(root, name, "bos_token_id", c->vocab_size, bos, 1, &n_bos)) ||
        (st = get_ids(root, name, "eos_token_id", c->vocab_size, c->eos_token_ids, VQ_MAX_EOS, &c->n_eos)))
        return st;
    if (n_bos) c->bos_token_id = bos[0];
    return VQ_OK;
}

vq_status vq_config_parse(const char *json, size_t len, const char *name, vq_model_config *out) {
    memset(out, 0, sizeof *out);
    const char *end = NULL;
    cJSON *root = cJSON_ParseWithLengthOpts(json, len, &end, 0);
    if (!root) {
        size_t off = end ? (size_t)(end - json) : 0;
        return vq_fail(VQ_ERR_FORMAT, "%s: not valid JSON (error near byte %zu)", name, off);
    }
    vq_model_config c;
    memset(&c, 0, sizeof c);
    vq_status st = parse(root, name, &c);
    cJSON_Delete(root);
    if (st == VQ_OK) *out = c;
    return st;
}

vq_status vq_config_load(const char *path, vq_model_config *out) {
    char *text;
    size_t len;
    memset(out, 0, sizeof *out);
    vq_status st = vq_read_file(path, &text, &len);
    if (st != VQ_OK) return st;
    st = vq_config_parse(text, len, path, out);
    free(text);
    return st;
}

vq_status vq_config_merge_generation(const char *path, vq_model_config *c) {
    FILE *f = fopen(path, "rb");
    if (!f) return VQ_OK; /* optional */
    fclose(f);
    cJSON *root;
    vq_status st = vq_read_json(path, &root);
    if (st != VQ_OK) return st;
    int32_t eos[VQ_MAX_EOS], bos[1];
    int n_eos = 0, n_bos = 0;
    st = get_ids(root, path, "eos_token_id", c->vocab_size, eos, VQ_MAX_EOS, &n_eos);
    if (!st) st = get_ids(root, path, "bos_token_id", c->vocab_size, bos, 1, &n_bos);
    cJSON_Delete(root);
    if (st) return st;
    /* generation_config.json is what transformers' generate() stops on: add
     * its ids to config.json's */
    for (int i = 0; i < n_eos; i++) {
        int known = 0;
        for (int j = 0; j < c->n_eos; j++) known |= c->eos_token_ids[j] == eos[i];
        if (!known && c->n_eos < VQ_MAX_EOS) c->eos_token_ids[c->n_eos++] = eos[i];
    }
    if (n_bos && c->bos_token_id < 0) c->bos_token_id = bos[0];
    return VQ_OK;
}
