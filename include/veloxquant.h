/*
 * veloxquant: a compressed KV cache for transformer language models, with
 * fused attention computed straight from the packed codes.
 *
 * This is the one public header. Every fallible call returns a vq_status
 * (VQ_OK == 0); on failure vq_last_error() returns a message for the calling
 * thread that names the bad value and the allowed range. The library never
 * prints and never exits.
 */
#ifndef VELOXQUANT_H
#define VELOXQUANT_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define VQ_VERSION_MAJOR 0
#define VQ_VERSION_MINOR 1
#define VQ_VERSION_PATCH 0

/* ---------------------------------------------------------------- errors */

typedef enum {
    VQ_OK = 0,
    VQ_ERR_ARG = 1,         /* an argument or option is out of range */
    VQ_ERR_NOMEM = 2,       /* an allocation failed */
    VQ_ERR_IO = 3,          /* a file could not be read or written */
    VQ_ERR_FORMAT = 4,      /* a file or string is malformed */
    VQ_ERR_UNSUPPORTED = 5, /* valid, but not supported by this build */
    VQ_ERR_STATE = 6        /* the call does not fit the object's state */
} vq_status;

/* Message for the last failed call on this thread ("" if none). */
const char *vq_last_error(void);
const char *vq_status_name(vq_status s);
const char *vq_version(void);

/* ---------------------------------------------------------------- dtypes */

typedef enum { VQ_F32 = 0, VQ_F16 = 1, VQ_BF16 = 2 } vq_dtype;

size_t vq_dtype_size(vq_dtype t);

/* IEEE binary16 and bfloat16. Conversions to 16 bits round to nearest,
 * ties to even; NaN stays NaN (quiet), infinities and subnormals are exact. */
uint16_t vq_f32_to_f16(float x);
float vq_f16_to_f32(uint16_t h);
uint16_t vq_f32_to_bf16(float x);
float vq_bf16_to_f32(uint16_t h);
/* Array forms; use F16C / AVX2 when the CPU has them, identical results. */
void vq_f32_to_f16_array(const float *x, uint16_t *out, size_t n);
void vq_f16_to_f32_array(const uint16_t *h, float *out, size_t n);
void vq_f32_to_bf16_array(const float *x, uint16_t *out, size_t n);
void vq_bf16_to_f32_array(const uint16_t *h, float *out, size_t n);

/* ----------------------------------------------------------------- CPU */

/* Kernel levels. VQ_CPU_AUTO picks the best the running CPU supports. */
typedef enum {
    VQ_CPU_AUTO = -1,
    VQ_CPU_SCALAR = 0,
    VQ_CPU_AVX2 = 1,    /* AVX2 + FMA + F16C */
    VQ_CPU_AVX512 = 2   /* AVX-512 F/BW/VL (VNNI, BF16 where present) for the kernels that have an AVX-512 version (README, "What is here"); the others run their AVX2 versions */
} vq_cpu_level;

vq_cpu_level vq_cpu_detect(void);           /* what the CPU supports */
const char *vq_cpu_level_name(vq_cpu_level l);
/* Force a lower kernel level for the whole process (tests, benchmarks).
 * Asking for a level the CPU lacks is an error. */
vq_status vq_cpu_set_level(vq_cpu_level l);
vq_cpu_level vq_cpu_level_in_use(void);

/* ---------------------------------------------------------------- utils */

void *vq_aligned_alloc(size_t bytes);       /* 64-byte aligned, NULL on failure */
void vq_aligned_free(void *p);
double vq_time_now(void);                   /* monotonic seconds */

/* Seeded generator (xoshiro256**): same seed, same stream on every platform. */
typedef struct { uint64_t s[4]; } vq_rng;
void vq_rng_seed(vq_rng *r, uint64_t seed);
uint64_t vq_rng_next(vq_rng *r);
double vq_rng_uniform(vq_rng *r);           /* [0, 1) */
double vq_rng_normal(vq_rng *r);            /* N(0, 1) */

/* A small pool of worker threads. Work is split into numbered tasks; which
 * thread runs a task never changes a result. Idle workers poll for about
 * 2 ms after each run before they sleep, so runs that follow each other
 * (the layers of a decode step) start without a wake-up; give the pool no
 * more threads than there are free cores. */
typedef struct vq_pool vq_pool;
vq_status vq_pool_create(int n_threads, vq_pool **out); /* 1..256 */
void vq_pool_free(vq_pool *p);
int vq_pool_threads(const vq_pool *p);
/* Runs fn(ctx, task, thread) for task in [0, n_tasks); returns when all are
 * done. thread is in [0, vq_pool_threads). A NULL pool runs inline. */
void vq_pool_run(vq_pool *p, int n_tasks, void (*fn)(void *ctx, int task, int thread),
                 void *ctx);

/* ------------------------------------------------------------- the cache */

/*
 * A KV spec string picks the compression:
 *   METHOD[:key=value,...]                the same method for K and V
 *   k=METHOD[:...];v=METHOD[:...]         different methods or bits for K and V
 *   ...+POLICY[:key=value,...]            token eviction on top of either
 * Methods: fp16, kivi, tq-mse, tq-prod, rvq, qjl, polar (README, "KV specs").
 *
 * Eviction policies: streaming, h2o, tova, keyformer, snapkv, pyramidkv,
 * knorm, qfilters. Options every policy takes:
 *   budget=N   keep at most N tokens per (layer, kv head), 1..2^31-1, or
 *   ratio=R    keep at most ceil(R * tokens appended so far), 0 < R <= 1
 *              (exactly one of the two);
 *   sinks=S    the S oldest tokens held are protected (default 4);
 *   recent=W   the W newest tokens held are protected (default budget/4);
 *   adakv=1    Ada-KV: the heads of a layer share n_heads_kv * budget slots
 *              (normalized scores compete across heads; not for streaming);
 *   floor=F    with adakv, every head keeps at least F * budget (default 0.2).
 * Policy options: keyformer tau (Gumbel noise scale, default 1; 0 = h2o),
 * seed; snapkv and pyramidkv window (observed queries, default 32), pool
 * (max-pooling kernel, odd, default 7); pyramidkv beta (first/last layer
 * budget ratio, default 20; budget is the mean over layers); qfilters
 * filters=FILE (required; from `veloxquant calibrate qfilters`).
 * E.g. "kivi:bits=2+snapkv:budget=1024", "fp16+h2o:ratio=0.25",
 * "k=tq-mse:bits=4;v=kivi:bits=2+tova:budget=512",
 * "kivi+h2o:budget=512,adakv=1".
 *
 * Budget semantics: an append of n tokens first evicts each head down to
 * budget - n slots (by the scores known then: sinks and recent protected,
 * then the best scores, ties to the lower position), then appends; so a
 * head never holds more than its budget, not even during the attention of
 * the appending step. When protection alone passes budget - n, the recent
 * window shrinks first, then the sinks. An append of more tokens than the
 * budget is an error (vq_cache_append_limit). Evicted tokens free their
 * memory; kept tokens keep their absolute positions, and new tokens get
 * theirs.
 */
/* Where a cache's blocks live. */
typedef enum { VQ_DEVICE_CPU = 0, VQ_DEVICE_CUDA = 1 } vq_device;

typedef struct {
    int n_layers;        /* 1..1024 */
    int n_heads_q;       /* query heads, a multiple of n_heads_kv */
    int n_heads_kv;      /* 1..1024 */
    int head_dim;        /* 8..1024, a multiple of 8 (a method may ask for more) */
    const char *kv_spec; /* NULL means "fp16" */
    int64_t capacity;    /* max tokens per (layer, head); 0 = unlimited */
    int block_tokens;    /* tokens per storage block; 0 = default (64, or the
                            spec's token group if larger; with eviction and
                            KIVI keys exactly their group, the only value
                            allowed besides 0) */
    vq_device device;    /* where the blocks live; 0 (zero-initialized) = CPU */
    int device_index;    /* CUDA device ordinal (device == VQ_DEVICE_CUDA) */
} vq_cache_config;

typedef struct vq_cache vq_cache;

vq_status vq_cache_create(const vq_cache_config *cfg, vq_cache **out);
void vq_cache_free(vq_cache *c);

/*
 * Appends n_tokens new tokens to one layer. k and v are rows laid out
 * [n_tokens][n_heads_kv][head_dim] in dtype. positions[i] is the absolute
 * position of token i (strictly increasing, greater than every position
 * already in the layer); NULL continues from the last position + 1 (0 for
 * an empty layer).
 */
vq_status vq_cache_append(vq_cache *c, int layer, int n_tokens, const void *k, const void *v,
                          vq_dtype dtype, const int32_t *positions);

/* Tokens held by one layer: the largest count of its kv heads (without
 * eviction, and with per-head budgets filled up, every head holds the
 * same). It sizes a per-head row of vq_attend_args.key_weights. */
int64_t vq_cache_tokens(const vq_cache *c, int layer);
/* Tokens held by one (layer, kv head); 0 when out of range. */
int64_t vq_cache_head_tokens(const vq_cache *c, int layer, int kv_head);
/* Tokens ever appended to a layer since creation or reset (evicted ones
 * included). */
int64_t vq_cache_tokens_seen(const vq_cache *c, int layer);
/* The most tokens one vq_cache_append may add to any layer now without
 * passing the eviction budget; INT64_MAX without a policy. */
int64_t vq_cache_append_limit(const vq_cache *c);
/* Bytes actually allocated for K/V data and their metadata (codes, scales,
 * positions, the fp16 window, eviction scores), all layers. */
size_t vq_cache_bytes(const vq_cache *c);
/* The most vq_cache_bytes has been since creation or the last reset. */
size_t vq_cache_peak_bytes(const vq_cache *c);
/* Bytes the same tokens would take as plain fp16 K and V. */
size_t vq_cache_bytes_fp16_equiv(const vq_cache *c);
/* Drops every token; keeps allocated full-size blocks for reuse. */
void vq_cache_reset(vq_cache *c);
/* Keeps the first n_tokens tokens of every layer (n_tokens <= tokens held);
 * VQ_ERR_STATE on a cache with an eviction policy.
 * Quantized groups that would be cut are not split: tokens can only be
 * truncated down to a group boundary of the quantized part, or anywhere in
 * the fp16 window; other counts are an error naming the allowed values. */
vq_status vq_cache_truncate(vq_cache *c, int64_t n_tokens);
/* The absolute position of the newest token of a layer; -1 when empty. The
 * next token's position is this + 1, whatever was evicted or truncated. */
int32_t vq_cache_last_pos(const vq_cache *c, int layer);
/* The spec as parsed, with every default filled in, e.g.
 * "k=kivi:bits=2,group=32,residual=128;v=kivi:bits=2,group=32,residual=128". */
const char *vq_cache_spec(const vq_cache *c);
/* Bits per K/V element including metadata, averaged over K and V, for the
 * quantized part (the fp16 window excluded). */
double vq_cache_bits_per_elem(const vq_cache *c);

/* Decodes the tokens of one (layer, kv head) to fp32 rows [n][head_dim], in
 * position order, with their positions. For tests and the reference path:
 * attention never does this. n is vq_cache_head_tokens(c, layer, kv_head). */
vq_status vq_cache_decode(const vq_cache *c, int layer, int kv_head, float *k, float *v,
                          int32_t *positions);

/* A CPU copy of a cache (CPU or CUDA), holding the same bytes: blocks,
 * positions and the fp16 window. For a CUDA cache it waits for queued GPU
 * work first. Free it with vq_cache_free. */
vq_status vq_cache_to_host(const vq_cache *c, vq_cache **out);

/* ----------------------------------------------------------------- CUDA */

/*
 * CUDA caches (device = VQ_DEVICE_CUDA) need a build with VQ_CUDA, a
 * capacity > 0 (device blocks come from a pool grown in chunks, never by
 * reallocating) and the methods fp16, kivi or tq-mse (integer bits 1..4,
 * power-of-two head dim) with a head dim that is a multiple of 64 up to 256.
 *
 * For such a cache, vq_cache_append takes k and v as DEVICE pointers (same
 * dtypes and layout as on the CPU; positions stay a host pointer or NULL),
 * and vq_attend / vq_attend_batch take q (fp32) and out as DEVICE pointers
 * (q_pos stays a host pointer; pool is ignored). GPU work is queued on the
 * legacy default stream and the calls return without waiting for it (time
 * with CUDA events); errors found on the host are returned at once. Values
 * are not checked for finiteness on the GPU.
 */
/* Usable CUDA devices; 0 when built without CUDA or without a usable
 * GPU or driver. */
int vq_cuda_device_count(void);
/* Waits for queued GPU work and reports an asynchronous error. VQ_OK
 * without CUDA. */
vq_status vq_cuda_synchronize(void);

/* --------------------------------------------------------------- attend */

typedef struct {
    int n_q;               /* query rows (1 for a decode step) */
    const float *q;        /* [n_q][n_heads_q][head_dim] fp32 */
    const int32_t *q_pos;  /* [n_q] absolute positions; a row sees keys with
                              position <= its own. NULL: no mask */
    float scale;           /* softmax scale; 0 means 1/sqrt(head_dim) */
    void *out;             /* [n_q][n_heads_q][head_dim] */
    vq_dtype out_dtype;    /* VQ_F32 or VQ_F16 */
    vq_pool *pool;         /* NULL: run on the calling thread */
    /* Optional: for each kv head h and slot j (position order), the
     * softmax probability the slot received, summed over the observed
     * query rows: the last key_weight_rows query tokens (0 = all) times
     * the q heads of h's GQA group. Laid out [n_heads_kv][T], T =
     * vq_cache_tokens(c, layer) after any append; slots past a head's
     * count are 0. Computed in the same fused pass. When NULL, a cache
     * whose eviction policy needs attention weights computes them for
     * the policy itself. */
    float *key_weights;
    int key_weight_rows;
} vq_attend_args;

/* Fused attention of one layer over the compressed cache. Reads packed codes
 * directly; never writes a dequantized K or V. The result does not depend on
 * the pool's thread count. A query row that sees no key gets zeros. */
vq_status vq_attend(vq_cache *c, int layer, const vq_attend_args *a);

/* Attention of one layer for a batch of independent sequences, one cache
 * each (same config and spec, any lengths): q and out are
 * [n_caches][n_q][n_heads_q][head_dim]; q_pos, if set, is [n_caches][n_q].
 * CPU caches: vq_attend per cache. CUDA caches (all on one device): one
 * attention launch and one reduction launch for the whole batch. */
vq_status vq_attend_batch(vq_cache *const *caches, int n_caches, int layer, const vq_attend_args *a);

/* Plain fp64 attention over rows (the tests' reference). k, v: [n_k][head_dim]
 * per kv head laid out [n_heads_kv][n_k][head_dim]; kpos [n_k]; q and out as
 * in vq_attend (out is double). */
void vq_attend_reference(int n_heads_q, int n_heads_kv, int head_dim, int n_q, const float *q,
                         const int32_t *q_pos, int n_k, const float *k, const float *v,
                         const int32_t *kpos, double scale, double *out);

/* ------------------------------------------------------------ tokenizer */

/*
 * A BPE tokenizer read from a Hugging Face tokenizer.json: byte-level (the
 * kind GPT-2, Llama 3 and Qwen2 use: the pre-tokenizer's Split regexes and
 * ByteLevel mapping) or SentencePiece-like (Llama 2, Mistral: spaces as
 * U+2581 from the Prepend/Replace normalizer or the Metaspace pre-tokenizer,
 * byte_fallback to <0xXX> tokens, unk). Added/special tokens are matched
 * literally first, then merges apply by rank. Ids match Hugging Face
 * tokenizers' encode(text, add_special_tokens=False). The post-processor is
 * not applied: the caller adds BOS (see vq_tokenizer_encode). A tokenizer is
 * read-only after loading and may be used by several threads at once.
 */
typedef struct vq_tokenizer vq_tokenizer;

vq_status vq_tokenizer_load(const char *path, vq_tokenizer **out);
void vq_tokenizer_free(vq_tokenizer *t);
/* One more than the largest id (ids below it may be unused). */
int32_t vq_tokenizer_vocab_size(const vq_tokenizer *t);
/* The id of a token by its text in tokenizer.json (an added token's content,
 * or a vocab entry in its byte-level spelling); -1 if there is none. */
int32_t vq_tokenizer_find(const vq_tokenizer *t, const char *token);
/* The token tokenizer.json's post-processor puts before a text (a
 * TemplateProcessing that starts with a special token, as Llama 3's does), or
 * -1 when it adds none. Pass it as bos_id to encode as transformers does. */
int32_t vq_tokenizer_bos(const vq_tokenizer *t);
/* Applies a tokenizer_config.json (a missing file is fine): add_bos_token
 * false means no BOS; true adds bos_token when the post-processor adds
 * nothing; eos_token becomes vq_tokenizer_eos(). Its chat_template is read
 * by vq_chat_config_load. */
vq_status vq_tokenizer_apply_config(vq_tokenizer *t, const char *tokenizer_config_path);
/* tokenizer_config.json's eos_token, or -1. */
int32_t vq_tokenizer_eos(const vq_tokenizer *t);
/* 1 for added tokens marked special, 0 otherwise (also for unused ids). */
int vq_tokenizer_is_special(const vq_tokenizer *t, int32_t id);
/*
 * Encodes len bytes of UTF-8 text. bos_id >= 0 is put first; -1 adds none.
 * Writes at most cap ids and sets *n_ids; len + 1 ids always suffice for a
 * byte-level tokenizer, 2 * len + 2 for a SentencePiece-like one (the U+2581
 * put before each segment between added tokens may be an id of its own).
 * Invalid UTF-8 is an error naming the byte offset.
 */
vq_status vq_tokenizer_encode(const vq_tokenizer *t, const char *text, size_t len, int32_t bos_id,
                              int32_t *ids, size_t cap, size_t *n_ids);
/* The bytes one token stands for (not NUL-terminated, and not always whole
 * UTF-8 characters: a character may span tokens; U+2581 is given as a space
 * and a <0xXX> token as its byte); NULL for an unused id. */
const char *vq_tokenizer_piece(const vq_tokenizer *t, int32_t id, size_t *len);
/* Concatenates the pieces of ids (skipping special tokens when skip_special)
 * into out, as tokenizer.json's decoder does (for SentencePiece-like ones:
 * Strip's leading spaces removed, Metaspace's first-token U+2581 dropped;
 * byte tokens that are not valid UTF-8 stay raw bytes where Hugging Face
 * gives U+FFFD). *len is set to the bytes needed even when cap is too
 * small, which is an error. An id that is out of range or unused is an
 * error. */
vq_status vq_tokenizer_decode(const vq_tokenizer *t, const int32_t *ids, size_t n, int skip_special,
                              char *out, size_t cap, size_t *len);

/* --------------------------------------------------------- chat templates */

/*
 * Hugging Face chat templates: the Jinja2 text in tokenizer_config.json that
 * turns a conversation into the prompt a model was tuned on. The renderer is
 * a Jinja2 subset, written to give byte for byte what transformers'
 * apply_chat_template gives (jinja2 with trim_blocks and lstrip_blocks; a
 * single trailing newline of the template dropped; messages, tools = None,
 * documents = None, add_generation_prompt, bos_token and eos_token passed):
 *   {{ }}, {% %} and {# #} with "-" / "+" whitespace control; if / elif /
 *   else, for (tuple targets, an "if" filter, else, loop.index / index0 /
 *   revindex / revindex0 / first / last / length / previtem / nextitem),
 *   break / continue, set (also namespace() and "set ns.attr = ..."),
 *   {% generation %};
 *   literals (strings with Python escapes, integers, floats, true / false /
 *   none, lists, tuples, dicts); + - * / // % ** ~, comparisons, in / not
 *   in, and / or / not, "x if c else y"; .attr, [index], [a:b:c];
 *   filters trim, length / count, tojson (indent, ensure_ascii, sort_keys),
 *   upper, lower, replace, list, string, join, items, first, last,
 *   default, select / reject / selectattr / rejectattr, map, safe; tests
 *   defined, undefined, none, string, number, integer, float, boolean,
 *   true, false, mapping, iterable, sequence, callable, equalto (eq, ==),
 *   ne, lt, le, gt, ge, in, sameas, odd, even, divisibleby; str methods
 *   strip / lstrip / rstrip / startswith / endswith / split / upper / lower /
 *   replace; dict methods items / keys / values / get; functions
 *   raise_exception, strftime_now and namespace.
 * Anything else (macros, other filters or methods, %
 * string formatting, upper / lower of non-ASCII text) is an error that
 * names the construct and the template line and column, as are the
 * template's own raise_exception() calls (VQ_ERR_ARG) and type errors
 * jinja2 would raise. Messages carry only role and content, so a template's
 * tool-call paths see no tool_calls and tools is None.
 */
typedef struct {
    const char *role;     /* "system", "user", "assistant", ... */
    const char *content;  /* UTF-8 */
} vq_chat_message;

/* Renders tmpl for n messages. *out receives the NUL-terminated text
 * (release it with free()); NULL on failure. bos_token / eos_token are the
 * strings the template may use; NULL leaves them undefined, as
 * transformers does for tokens a model does not set. */
vq_status vq_chat_render(const char *tmpl, const vq_chat_message *msgs, int n, int add_generation_prompt,
                         const char *bos_token, const char *eos_token, char **out);

/* What a tokenizer_config.json says about chat: its chat_template (a string,
 * or the one named "default" of a list of {"name", "template"}) and its
 * bos_token / eos_token strings. Each field is NULL when absent; a missing
 * file leaves all three NULL. Release with vq_chat_config_free. */
typedef struct {
    char *chat_template;
    char *bos_token;
    char *eos_token;
} vq_chat_config;

vq_status vq_chat_config_load(const char *tokenizer_config_path, vq_chat_config *out);
void vq_chat_config_free(vq_chat_config *cfg);

/* ---------------------------------------------------------------- model */

/*
 * A Hugging Face model folder (config.json + model.safetensors or sharded
 * model-*.safetensors with model.safetensors.index.json) for
 * LlamaForCausalLM, MistralForCausalLM, Qwen2ForCausalLM or
 * Qwen3ForCausalLM. Weights are memory-mapped and used in place (f32, f16 or
 * bf16); activations are fp32. All attention goes through a vq_cache.
 */
typedef struct vq_model vq_model;

typedef struct {
    const char *arch;          /* "LlamaForCausalLM", ... */
    int n_layers, hidden_size, intermediate_size;
    int n_heads, n_kv_heads, head_dim;
    int vocab_size, max_position_embeddings;
    int64_t n_params;          /* weights in the checkpoint (tied embeddings once) */
    vq_dtype dtype;            /* of the projection weights */
    int32_t bos_token_id;      /* -1 if none */
    int n_eos;
    int32_t eos_token_ids[8];
} vq_model_info;

vq_status vq_model_load(const char *dir, vq_model **out);
void vq_model_free(vq_model *m);
const vq_model_info *vq_model_get_info(const vq_model *m);
/* A cache shaped for the model (all layers) with the given KV spec. */
vq_status vq_model_cache_create(const vq_model *m, const char *kv_spec, int64_t capacity, vq_cache **out);
/*
 * Runs n tokens through the model, appending their K/V to the cache at the
 * positions that follow the cache's last one, in chunks of at most
 * `chunk` tokens (0 = 512; 1 = token by token). logits receives
 * vocab_size floats per row: for every token when all_logits, else only for
 * the last token. The result does not depend on the pool's thread count.
 */
vq_status vq_model_forward(vq_model *m, vq_cache *c, const int32_t *tokens, int n, int chunk,
                           float *logits, int all_logits, vq_pool *pool);

/* Sampling: temperature 0 = greedy (ties to the lowest id); top_p in (0, 1]. */
int32_t vq_sample(const float *logits, int vocab, float temperature, float top_p, vq_rng *rng,
                  float *scratch /* 2 * vocab floats */);

#ifdef __cplusplus
}
#endif
#endif
