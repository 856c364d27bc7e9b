/* Model files: safetensors (single and sharded) and config.json. The test
 * writes good and corrupt files into a temporary folder and checks that each
 * problem is refused with a message naming the file, the tensor and what
 * was expected. Usage: test_model [FIXTURES_DIR] (unused). */
#include "check.h"
#include "model/model_internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static char tmpdir[] = "/tmp/vq_model_XXXXXX";
static char paths[16][256];
static int n_paths;

/* Records a path under tmpdir so that main can remove it at the end. */
static const char *tmp_path(const char *name) {
    for (int i = 0; i < n_paths; i++)
        if (strcmp(strrchr(paths[i], '/') + 1, name) == 0) return paths[i];
    snprintf(paths[n_paths], sizeof paths[0], "%s/%s", tmpdir, name);
    return paths[n_paths++];
}

/* A safetensors file: the 8-byte length, the header, then data_len bytes of
 * data (a counting pattern). */
static const char *write_st(const char *name, const char *header, size_t data_len) {
    const char *path = tmp_path(name);
    FILE *f = fopen(path, "wb");
    uint64_t n = strlen(header);
    for (int i = 0; i < 8; i++) fputc((int)(n >> (8 * i)) & 0xff, f);
    fputs(header, f);
    for (size_t i = 0; i < data_len; i++) fputc((int)(i & 0xff), f);
    fclose(f);
    return path;
}

static const char *write_raw(const char *name, const void *bytes, size_t n) {
    const char *path = tmp_path(name);
    FILE *f = fopen(path, "wb");
    fwrite(bytes, 1, n, f);
    fclose(f);
    return path;
}

static void expect_st_error(const char *header, size_t data_len, const char *needle1, const char *needle2) {
    const char *path = write_st("bad.safetensors", header, data_len);
    vq_st_file *f = (vq_st_file *)1;
    vq_status st = vq_st_open(path, &f);
    const char *m = vq_last_error();
    CHECK(st == VQ_ERR_FORMAT && f == NULL, "accepted: %s", header);
    CHECK(strstr(m, "bad.safetensors") != NULL, "message '%s' does not name the file", m);
    CHECK(strstr(m, needle1) != NULL, "message '%s' lacks '%s'", m, needle1);
    if (needle2) CHECK(strstr(m, needle2) != NULL, "message '%s' lacks '%s'", m, needle2);
    if (st == VQ_OK) vq_st_close(f);
}

static void test_safetensors(void) {
    /* 6 F32 (24 bytes) then 4 BF16 (8 bytes); header padded with spaces */
    const char *good = "{\"__metadata__\":{\"format\":\"pt\"},"
                       "\"w\":{\"dtype\":\"F32\",\"shape\":[2,3],\"data_offsets\":[0,24]},"
                       "\"b\":{\"dtype\":\"BF16\",\"shape\":[4],\"data_offsets\":[24,32]},"
                       "\"s\":{\"dtype\":\"F32\",\"shape\":[],\"data_offsets\":[32,36]},"
                       "\"e\":{\"dtype\":\"F16\",\"shape\":[0,5],\"data_offsets\":[36,36]}}   ";
    const char *path = write_st("good.safetensors", good, 36);
    vq_st_file *f = NULL;
    vq_status st = vq_st_open(path, &f);
    CHECK(st == VQ_OK, "good file: %s", vq_last_error());
    if (st == VQ_OK) {
        CHECK(vq_st_count(f) == 4, "count %d", vq_st_count(f));
        const vq_st_tensor *w = vq_st_find(f, "w"), *b = vq_st_find(f, "b");
        CHECK(w && w->dtype == VQ_ST_F32 && w->n_dims == 2 && w->shape[0] == 2 && w->shape[1] == 3 &&
                  w->n_elems == 6 && w->n_bytes == 24,
              "tensor w");
        CHECK(b && b->dtype == VQ_ST_BF16 && b->n_bytes == 8 && ((const uint8_t *)b->data)[0] == 24, "tensor b");
        CHECK(w && ((const uint8_t *)w->data)[5] == 5, "data pointer of w");
        const vq_st_tensor *s = vq_st_find(f, "s"), *e = vq_st_find(f, "e");
        CHECK(s && s->n_dims == 0 && s->n_elems == 1, "scalar");
        CHECK(e && e->n_elems == 0 && e->n_bytes == 0, "empty tensor");
        CHECK(vq_st_find(f, "__metadata__") == NULL && vq_st_find(f, "x") == NULL, "absent names");
        CHECK(strcmp(vq_st_at(f, 0)->name, "w") == 0, "header order");
        vq_st_close(f);
    }

    write_raw("short.safetensors", "\x10\0\0", 3);
    st = vq_st_open(tmp_path("short.safetensors"), &f);
    CHECK(st == VQ_ERR_FORMAT && strstr(vq_last_error(), "too short"), "short: %s", vq_last_error());
    /* header length past the end of the file */
    write_raw("past.safetensors", "\xff\0\0\0\0\0\0\0{}", 10);
    st = vq_st_open(tmp_path("past.safetensors"), &f);
    CHECK(st == VQ_ERR_FORMAT && strstr(vq_last_error(), "header length 255 runs past the end of the file (10 bytes)"),
          "past: %s", vq_last_error());
    /* a file cut in the middle of the data */
    expect_st_error("{\"w\":{\"dtype\":\"F32\",\"shape\":[64],\"data_offsets\":[0,256]}}", 100, "'w'",
                    "run past the data section of 100 bytes");
    st = vq_st_open(tmp_path("nothere.safetensors"), &f);
    CHECK(st == VQ_ERR_IO && strstr(vq_last_error(), "nothere.safetensors"), "missing: %s", vq_last_error());

    expect_st_error("{\"w\":{\"dtype\":\"F32\",", 0, "not valid JSON", NULL);
    expect_st_error("[1, 2]", 0, "does not start with a JSON object", NULL);
    expect_st_error("{\"w\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}} x", 4, "bytes after the JSON",
                    NULL);
    expect_st_error("{\"model.layers.0.self_attn.q_proj.weight\":{\"dtype\":\"BF16\",\"shape\":[64,64],"
                    "\"data_offsets\":[0,100]}}",
                    100,
                    "tensor 'model.layers.0.self_attn.q_proj.weight': data_offsets [0, 100] hold 100 bytes, shape "
                    "[64, 64] of BF16 needs 8192",
                    NULL);
    expect_st_error("{\"a\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[0,16]},"
                    "\"b\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[8,24]}}",
                    24, "tensors 'a' [0, 16] and 'b' [8, 24] overlap", NULL);
    expect_st_error("{\"a\":{\"dtype\":\"Q4_K\",\"shape\":[4],\"data_offsets\":[0,4]}}", 4, "tensor 'a'",
                    "unknown dtype 'Q4_K'");
    expect_st_error("{\"a\":{\"dtype\":\"F32\",\"shape\":[-1],\"data_offsets\":[0,4]}}", 4, "shape dim 0",
                    "non-negative integer");
    expect_st_error("{\"a\":{\"dtype\":\"F32\",\"shape\":[1099511627776,1099511627776],\"data_offsets\":[0,4]}}", 4,
                    "'a'", "overflows");
    expect_st_error("{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[8,4]}}", 8, "end before begin", NULL);
    expect_st_error("{\"a\":{\"dtype\":\"F32\",\"shape\":[1]}}", 4, "'a'", "data_offsets");
    expect_st_error("{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]},"
                    "\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,8]}}",
                    8, "'a' appears twice", NULL);
    expect_st_error("{\"a\":{\"dtype\":\"F32\",\"shape\":[1,1,1,1,1,1,1,1,1],\"data_offsets\":[0,4]}}", 4, "9 dims",
                    "at most 8");
}

static void expect_weights_error(const char *needle1, const char *needle2) {
    vq_weights *w = (vq_weights *)1;
    vq_status st = vq_weights_open(tmpdir, &w);
    const char *m = vq_last_error();
    CHECK(st != VQ_OK && w == NULL, "weights accepted");
    CHECK(strstr(m, needle1) != NULL, "message '%s' lacks '%s'", m, needle1);
    if (needle2) CHECK(strstr(m, needle2) != NULL, "message '%s' lacks '%s'", m, needle2);
    if (st == VQ_OK) vq_weights_close(w);
}

static void test_weights(void) {
    expect_weights_error("neither model.safetensors nor model.safetensors.index.json", NULL);

    /* one file */
    write_st("model.safetensors",
             "{\"x.weight\":{\"dtype\":\"F16\",\"shape\":[2,4],\"data_offsets\":[0,16]},"
             "\"pos\":{\"dtype\":\"I64\",\"shape\":[2],\"data_offsets\":[16,32]}}",
             32);
    vq_weights *w = NULL;
    vq_status st = vq_weights_open(tmpdir, &w);
    CHECK(st == VQ_OK, "single file: %s", vq_last_error());
    if (st == VQ_OK) {
        const vq_st_tensor *t;
        int64_t good[2] = {2, 4}, bad[2] = {4, 2};
        CHECK(vq_weights_count(w) == 2, "count");
        CHECK(vq_weights_expect(w, "x.weight", 2, good, &t) == VQ_OK && t && t->dtype == VQ_ST_F16, "expect ok");
        st = vq_weights_expect(w, "x.weight", 2, bad, &t);
        CHECK(st == VQ_ERR_FORMAT && t == NULL &&
                  strstr(vq_last_error(), "model.safetensors: tensor 'x.weight' has shape [2, 4], expected [4, 2]"),
              "shape mismatch: %s", vq_last_error());
        st = vq_weights_expect(w, "pos", 1, good, &t);
        CHECK(st == VQ_ERR_UNSUPPORTED && strstr(vq_last_error(), "'pos' has dtype I64"), "dtype: %s",
              vq_last_error());
        st = vq_weights_expect(w, "lm_head.weight", 2, good, &t);
        CHECK(st == VQ_ERR_FORMAT && strstr(vq_last_error(), "'lm_head.weight' is missing"), "missing: %s",
              vq_last_error());
        vq_weights_close(w);
    }
    unlink(tmp_path("model.safetensors"));

    /* two shards */
    write_st("model-00001-of-00002.safetensors",
             "{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
             "\"b\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[8,12]}}",
             12);
    write_st("model-00002-of-00002.safetensors", "{\"c\":{\"dtype\":\"BF16\",\"shape\":[3],\"data_offsets\":[0,6]}}",
             6);
    const char *idx_good = "{\"metadata\":{\"total_size\":18},\"weight_map\":{"
                           "\"a\":\"model-00001-of-00002.safetensors\",\"c\":\"model-00002-of-00002.safetensors\","
                           "\"b\":\"model-00001-of-00002.safetensors\"}}";
    write_raw("model.safetensors.index.json", idx_good, strlen(idx_good));
    st = vq_weights_open(tmpdir, &w);
    CHECK(st == VQ_OK, "sharded: %s", vq_last_error());
    if (st == VQ_OK) {
        CHECK(vq_weights_count(w) == 3, "sharded count %d", vq_weights_count(w));
        const vq_st_tensor *c = vq_weights_find(w, "c"), *a = vq_weights_find(w, "a");
        CHECK(c && strstr(c->file, "00002") && c->dtype == VQ_ST_BF16, "c in shard 2");
        CHECK(a && strstr(a->file, "00001"), "a in shard 1");
        CHECK(vq_weights_find(w, "d") == NULL, "d absent");
        vq_weights_close(w);
    }

    const char *idx_missing = "{\"weight_map\":{\"a\":\"model-00001-of-00002.safetensors\","
                              "\"z\":\"model-00009-of-00009.safetensors\"}}";
    write_raw("model.safetensors.index.json", idx_missing, strlen(idx_missing));
    expect_weights_error("shard 'model-00009-of-00009.safetensors' (for tensor 'z')", "cannot open");
    const char *idx_wrong = "{\"weight_map\":{\"c\":\"model-00001-of-00002.safetensors\"}}";
    write_raw("model.safetensors.index.json", idx_wrong, strlen(idx_wrong));
    expect_weights_error("tensor 'c' is mapped to shard 'model-00001-of-00002.safetensors', which does not hold it",
                         NULL);
    const char *idx_escape = "{\"weight_map\":{\"a\":\"../model-00001-of-00002.safetensors\"}}";
    write_raw("model.safetensors.index.json", idx_escape, strlen(idx_escape));
    expect_weights_error("must be a plain file name", NULL);
    write_raw("model.safetensors.index.json", "{\"weight\":{}}", 13);
    expect_weights_error("missing \"weight_map\"", NULL);
    write_raw("model.safetensors.index.json", "{\"weight_map\":", 14);
    expect_weights_error("model.safetensors.index.json: not valid JSON", NULL);
    /* a shard that is itself corrupt: its own message comes through */
    write_st("model-00002-of-00002.safetensors", "{\"c\":{\"dtype\":\"BF16\",\"shape\":[3],\"data_offsets\":[0,6]}}",
             4);
    const char *idx_two = "{\"weight_map\":{\"c\":\"model-00002-of-00002.safetensors\"}}";
    write_raw("model.safetensors.index.json", idx_two, strlen(idx_two));
    expect_weights_error("model-00002-of-00002.safetensors: tensor 'c'", "run past the data section");
}

#define LLAMA3_CONFIG                                                                                          \
    "{\"architectures\":[\"LlamaForCausalLM\"],\"hidden_size\":256,\"intermediate_size\":512,"                \
    "\"num_hidden_layers\":2,\"num_attention_heads\":4,\"num_key_value_heads\":2,\"vocab_size\":1000,"        \
    "\"rms_norm_eps\":1e-5,\"rope_theta\":500000.0,\"max_position_embeddings\":8192,"                         \
    "\"rope_scaling\":{\"rope_type\":\"llama3\",\"factor\":8.0,\"low_freq_factor\":1.0,"                      \
    "\"high_freq_factor\":4.0,\"original_max_position_embeddings\":8192},\"tie_word_embeddings\":true,"       \
    "\"torch_dtype\":\"bfloat16\",\"bos_token_id\":0,\"eos_token_id\":[1,2],\"hidden_act\":\"silu\"}"

static void expect_config_error(const char *json, const char *needle1, const char *needle2) {
    vq_model_config c;
    vq_status st = vq_config_parse(json, strlen(json), "config.json", &c);
    const char *m = vq_last_error();
    CHECK(st != VQ_OK, "config accepted: %s", json);
    CHECK(strstr(m, "config.json") != NULL && strstr(m, needle1) != NULL, "message '%s' lacks '%s'", m, needle1);
    if (needle2) CHECK(strstr(m, needle2) != NULL, "message '%s' lacks '%s'", m, needle2);
}

/* LLAMA3_CONFIG with one "key": value replaced (the value text up to the
 * next comma or brace) or, when the key is absent, added. */
static const char *config_with(const char *key, const char *value) {
    static char buf[2048];
    char pat[64];
    snprintf(pat, sizeof pat, "\"%s\":", key);
    const char *base = LLAMA3_CONFIG, *at = strstr(base, pat);
    if (!at) {
        snprintf(buf, sizeof buf, "{\"%s\":%s,%s", key, value, base + 1);
        return buf;
    }
    const char *v = at + strlen(pat), *end = v;
    int depth = 0;
    while (*end && (depth > 0 || (*end != ',' && *end != '}'))) {
        if (*end == '{' || *end == '[') depth++;
        if (*end == '}' || *end == ']') depth--;
        end++;
    }
    snprintf(buf, sizeof buf, "%.*s%s%s", (int)(v - base), base, value, end);
    return buf;
}

static void test_config(void) {
    vq_model_config c;
    vq_status st = vq_config_parse(LLAMA3_CONFIG, strlen(LLAMA3_CONFIG), "config.json", &c);
    CHECK(st == VQ_OK, "llama3 config: %s", vq_last_error());
    CHECK(c.arch == VQ_ARCH_LLAMA && c.hidden_size == 256 && c.n_layers == 2 && c.n_heads == 4 && c.n_kv_heads == 2 &&
              c.head_dim == 64 && c.rotary_dim == 64 && c.vocab_size == 1000 && c.intermediate_size == 512,
          "llama3 sizes");
    CHECK(c.rope_type == VQ_ROPE_LLAMA3 && c.rope_factor == 8.0 && c.rope_low_freq_factor == 1.0 &&
              c.rope_high_freq_factor == 4.0 && c.rope_original_max_pos == 8192 && c.rope_theta == 500000.0,
          "llama3 rope");
    CHECK(c.tie_word_embeddings == 1 && c.dtype == VQ_BF16 && c.bos_token_id == 0 && c.n_eos == 2 &&
              c.eos_token_ids[1] == 2 && c.rms_norm_eps == 1e-5 && c.attention_bias == 0 && c.qk_norm == 0,
          "llama3 misc");

    const char *qwen2 = "{\"architectures\":[\"Qwen2ForCausalLM\"],\"hidden_size\":128,\"intermediate_size\":256,"
                        "\"num_hidden_layers\":1,\"num_attention_heads\":2,\"vocab_size\":100,\"eos_token_id\":5,"
                        "\"sliding_window\":4096,\"use_sliding_window\":false,\"rope_scaling\":null}";
    st = vq_config_parse(qwen2, strlen(qwen2), "config.json", &c);
    CHECK(st == VQ_OK && c.arch == VQ_ARCH_QWEN2 && c.attention_bias == 1 && c.n_kv_heads == 2 && c.head_dim == 64 &&
              c.n_eos == 1 && c.eos_token_ids[0] == 5 && c.bos_token_id == -1 && c.rope_type == VQ_ROPE_DEFAULT &&
              c.dtype == VQ_F32,
          "qwen2 defaults: %s", vq_last_error());
    const char *qwen3 = "{\"architectures\":[\"Qwen3ForCausalLM\"],\"hidden_size\":128,\"intermediate_size\":256,"
                        "\"num_hidden_layers\":1,\"num_attention_heads\":2,\"vocab_size\":100,\"dtype\":\"float16\","
                        "\"rope_parameters\":{\"rope_type\":\"default\",\"rope_theta\":1000000.0}}";
    st = vq_config_parse(qwen3, strlen(qwen3), "config.json", &c);
    CHECK(st == VQ_OK && c.qk_norm == 1 && c.head_dim == 128 && c.attention_bias == 0 && c.dtype == VQ_F16 &&
              c.rope_theta == 1e6,
          "qwen3 defaults: %s", vq_last_error());
    st = vq_config_parse(config_with("partial_rotary_factor", "0.5"), strlen(config_with("partial_rotary_factor", "0.5")),
                         "config.json", &c);
    CHECK(st == VQ_OK && c.rotary_dim == 32, "partial rotary: %s", vq_last_error());
    st = vq_config_parse(config_with("architectures", "[\"MistralForCausalLM\"]"),
                         strlen(config_with("architectures", "[\"MistralForCausalLM\"]")), "config.json", &c);
    CHECK(st == VQ_OK && c.arch == VQ_ARCH_MISTRAL, "mistral without a window: %s", vq_last_error());

    expect_config_error("{\"architectures\":", "not valid JSON", NULL);
    expect_config_error(config_with("architectures", "[\"GPT2LMHeadModel\"]"), "architecture 'GPT2LMHeadModel'",
                        "Qwen3ForCausalLM");
    expect_config_error(config_with("architectures", "[]"), "\"architectures\"", NULL);
    expect_config_error(config_with("rope_scaling", "{\"rope_type\":\"yarn\",\"factor\":4.0}"), "rope type 'yarn'",
                        "default, llama3");
    expect_config_error(config_with("rope_scaling", "{\"rope_type\":\"llama3\",\"factor\":8.0}"),
                        "llama3 rope scaling lacks \"low_freq_factor\"", NULL);
    expect_config_error(config_with("num_key_value_heads", "3"), "num_attention_heads 4", "num_key_value_heads 3");
    expect_config_error(config_with("hidden_size", "0"), "\"hidden_size\" is 0", "[8, 65536]");
    expect_config_error(config_with("hidden_size", "\"big\""), "\"hidden_size\" must be an integer", NULL);
    expect_config_error(config_with("num_hidden_layers", "2.5"), "\"num_hidden_layers\" must be an integer", NULL);
    expect_config_error(config_with("head_dim", "36"), "head_dim 36", "multiple of 8");
    expect_config_error(config_with("rms_norm_eps", "-1"), "\"rms_norm_eps\" is -1", NULL);
    expect_config_error(config_with("hidden_act", "\"gelu\""), "hidden_act 'gelu'", "silu");
    expect_config_error(config_with("torch_dtype", "\"int8\""), "torch_dtype 'int8'", NULL);
    expect_config_error(config_with("eos_token_id", "1000"), "\"eos_token_id\" 1000", "[0, 1000)");
    expect_config_error(config_with("mlp_bias", "true"), "mlp_bias", NULL);
    expect_config_error(config_with("partial_rotary_factor", "0.01"), "partial_rotary_factor", "even");
    const char *mistral_sw = "{\"architectures\":[\"MistralForCausalLM\"],\"hidden_size\":128,\"intermediate_size\":256,"
                             "\"num_hidden_layers\":1,\"num_attention_heads\":2,\"vocab_size\":100,"
                             "\"max_position_embeddings\":32768,\"sliding_window\":4096}";
    expect_config_error(mistral_sw, "sliding-window attention (sliding_window 4096 < max_position_embeddings 32768)",
                        NULL);
    const char *qwen_sw = "{\"architectures\":[\"Qwen2ForCausalLM\"],\"hidden_size\":128,\"intermediate_size\":256,"
                          "\"num_hidden_layers\":1,\"num_attention_heads\":2,\"vocab_size\":100,"
                          "\"sliding_window\":4096,\"use_sliding_window\":true}";
    expect_config_error(qwen_sw, "sliding-window", NULL);
    const char *no_vocab = "{\"architectures\":[\"LlamaForCausalLM\"],\"hidden_size\":128,\"intermediate_size\":256,"
                           "\"num_hidden_layers\":1,\"num_attention_heads\":2}";
    expect_config_error(no_vocab, "missing \"vocab_size\"", NULL);

    st = vq_config_load(tmp_path("config.json"), &c);
    CHECK(st == VQ_ERR_IO && strstr(vq_last_error(), "config.json: cannot open"), "missing config: %s",
          vq_last_error());
    write_raw("config.json", LLAMA3_CONFIG, strlen(LLAMA3_CONFIG));
    st = vq_config_load(tmp_path("config.json"), &c);
    CHECK(st == VQ_OK && c.n_layers == 2, "config from a file: %s", vq_last_error());
}

int main(void) {
    if (!mkdtemp(tmpdir)) {
        perror("mkdtemp");
        return 2;
    }
    test_safetensors();
    test_weights();
    test_config();
    for (int i = 0; i < n_paths; i++) unlink(paths[i]);
    if (rmdir(tmpdir) != 0) CHECK(0, "temporary folder %s not empty", tmpdir);
    return check_done();
}
