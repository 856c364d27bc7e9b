/* Model files: safetensors checkpoints and config.json. Internal to the
 * library (the model runtime and the CLI use it); not installed. */
#ifndef VQ_MODEL_INTERNAL_H
#define VQ_MODEL_INTERNAL_H

#include "vq_internal.h"

/* ---------------------------------------------------------- safetensors */

/* Element types a safetensors header may name. Only F32, F16 and BF16 can be
 * computed with; the rest are recognized so that an error can say "I64 is not
 * supported" instead of "unknown dtype". */
typedef enum {
    VQ_ST_F32, VQ_ST_F16, VQ_ST_BF16,
    VQ_ST_F64, VQ_ST_I64, VQ_ST_I32, VQ_ST_I16, VQ_ST_I8,
    VQ_ST_U64, VQ_ST_U32, VQ_ST_U16, VQ_ST_U8, VQ_ST_BOOL,
    VQ_ST_F8_E4M3, VQ_ST_F8_E5M2
} vq_st_dtype;

#define VQ_ST_MAX_DIMS 8

const char *vq_st_dtype_name(vq_st_dtype t);
size_t vq_st_dtype_size(vq_st_dtype t);

/* One tensor of a mapped file. data points into the read-only mapping and
 * is valid until the file is closed. It is NOT necessarily aligned to the
 * element size (the header length decides), so read through memcpy or check
 * ((uintptr_t)data % size) before casting. */
typedef struct {
    const char *name;
    const char *file;      /* the file's name as given, for messages */
    vq_st_dtype dtype;
    int n_dims;            /* 0 (a scalar) .. VQ_ST_MAX_DIMS */
    int64_t shape[VQ_ST_MAX_DIMS];
    int64_t n_elems;
    const void *data;
    size_t n_bytes;
} vq_st_tensor;

/* One memory-mapped .safetensors file, fully validated at open: header
 * length, JSON, dtypes, shapes, offsets inside the data section, sizes that
 * match the shapes and no two tensors sharing bytes. */
typedef struct vq_st_file vq_st_file;

vq_status vq_st_open(const char *path, vq_st_file **out);
void vq_st_close(vq_st_file *f);
int vq_st_count(const vq_st_file *f);
const vq_st_tensor *vq_st_at(const vq_st_file *f, int i);  /* header order */
const vq_st_tensor *vq_st_find(const vq_st_file *f, const char *name); /* NULL if absent */

/* A checkpoint: one model.safetensors, or the shards a
 * model.safetensors.index.json names (each shard opened once). */
typedef struct vq_weights vq_weights;

/* dir holds model.safetensors.index.json (sharded) or model.safetensors. */
vq_status vq_weights_open(const char *dir, vq_weights **out);
void vq_weights_close(vq_weights *w);
int vq_weights_count(const vq_weights *w);
const vq_st_tensor *vq_weights_at(const vq_weights *w, int i);
const vq_st_tensor *vq_weights_find(const vq_weights *w, const char *name);
/* Finds a tensor that must exist with a computable dtype (F32, F16, BF16)
 * and exactly this shape; otherwise an error naming the tensor, its file and
 * what was expected. */
vq_status vq_weights_expect(const vq_weights *w, const char *name, int n_dims,
                            const int64_t *shape, const vq_st_tensor **out);

/* ------------------------------------------------------------- config */

typedef enum { VQ_ARCH_LLAMA, VQ_ARCH_MISTRAL, VQ_ARCH_QWEN2, VQ_ARCH_QWEN3 } vq_arch;
typedef enum { VQ_ROPE_DEFAULT, VQ_ROPE_LLAMA3 } vq_rope_type;

#define VQ_MAX_EOS 8

/* What a Hugging Face config.json says about a supported model, with the
 * transformers defaults filled in for fields it may leave out. */
typedef struct {
    vq_arch arch;
    const char *arch_name;      /* "LlamaForCausalLM", ... (static string) */
    int hidden_size;
    int intermediate_size;
    int n_layers;
    int n_heads;
    int n_kv_heads;             /* default n_heads */
    int head_dim;               /* default hidden_size / n_heads (Qwen3: 128) */
    int rotary_dim;             /* head_dim * partial_rotary_factor, even */
    double partial_rotary_factor; /* default 1.0 */
    double rms_norm_eps;
    double rope_theta;
    vq_rope_type rope_type;
    /* llama3 rope scaling; meaningful only when rope_type == VQ_ROPE_LLAMA3 */
    double rope_factor;
    double rope_low_freq_factor;
    double rope_high_freq_factor;
    int rope_original_max_pos;
    int max_position_embeddings;
    int vocab_size;
    int tie_word_embeddings;    /* 0 or 1 */
    int attention_bias;         /* q/k/v (and for Llama also o) projections carry a bias */
    int qk_norm;                /* Qwen3: RMSNorm on q and k per head */
    vq_dtype dtype;             /* torch_dtype / dtype; VQ_F32 when absent */
    int32_t bos_token_id;       /* -1 when absent */
    int n_eos;
    int32_t eos_token_ids[VQ_MAX_EOS];
} vq_model_config;

/* Parses config.json text; name is used in messages (e.g. the path). */
vq_status vq_config_parse(const char *json, size_t len, const char *name, vq_model_config *out);
vq_status vq_config_load(const char *path, vq_model_config *out);
/* Adds the eos ids (and a missing bos) of a generation_config.json to c;
 * a missing file is fine. */
vq_status vq_config_merge_generation(const char *path, vq_model_config *c);

/* ------------------------------------------------------------- hooks */

/* Sees every layer's queries and keys of each forward chunk right after RoPE
 * (what attention and the cache see): n rows of n_heads * head_dim (q) and
 * n_kv_heads * head_dim (k) floats, and the n absolute positions. For
 * calibration and analysis tools (Q-Filters); the pointers are valid only
 * during the call. */
typedef void (*vq_model_qk_hook)(void *user, int layer, int n, const int32_t *pos, const float *q, const float *k);
void vq_model_set_qk_hook(vq_model *m, vq_model_qk_hook hook, void *user); /* hook NULL: off */

/* ------------------------------------------------------------- helpers */

/* Reads a whole (small) file into a NUL-terminated malloc'd buffer. */
vq_status vq_read_file(const char *path, char **out, size_t *len);
/* Reads and parses a JSON file; the error names the file and the byte where
 * parsing failed. The caller frees *out with cJSON_Delete. */
struct cJSON;
vq_status vq_read_json(const char *path, struct cJSON **out);

#endif
