/* Internal declarations shared by the library's layers. Not installed. */
#ifndef VQ_INTERNAL_H
#define VQ_INTERNAL_H

#include "veloxquant.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* ---------------------------------------------------------------- core */

/* Records a formatted message as this thread's last error; returns s. */
vq_status vq_fail(vq_status s, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 2, 3)))
#endif
    ;

/* ---------------------------------------------------------------- methods */

/* Most codebooks one method instance uses (PolarQuant: one per level of a
 * 1024-dim head). */
#define VQ_MAX_LEVELS 10

/* Parameters of one method instance (the parsed "METHOD:key=value,..."). A
 * method reads only the fields it declares; the rest stay 0. */
typedef struct {
    const struct vq_method *method;
    bool is_value;   /* encoding values (true) or keys (false) */
    int head_dim;
    int bits;        /* kivi */
    int group;       /* kivi */
    int residual;    /* tokens kept in the fp16 window (KIVI's R) */
    /* The rotation-and-codebook methods (tq-mse, tq-prod, rvq, qjl, polar). */
    double rate;     /* tq-mse: bits per coordinate (1, 2, 3, 4, 2.5, 3.5) */
    int hi_channels; /* tq-mse: rotated coordinates that get bits + 1 */
    int sketch;      /* qjl: rows m of the Gaussian projection */
    int outliers;    /* qjl: channels per vector kept exact */
    int levels;      /* polar: recursion levels L (blocks of 2^L coordinates) */
    int level_bits[VQ_MAX_LEVELS]; /* polar: angle bits by level */
    /* polar: cosine and sine of every level's angle levels, computed once by
     * finish() (attention used to recompute them per block: about a tenth
     * of its time). Entries past a level's 2^bits repeat the first ones
     * (entry c holds level c mod 2^bits), which the AVX2 kernel reads as its
     * replicated lookup tables. */
    float angle_cos[VQ_MAX_LEVELS][16], angle_sin[VQ_MAX_LEVELS][16];
    uint64_t seed;   /* rotation and projection seed */
    /* Filled by finish(): process-wide shared objects (core/rotate.h). */
    const struct vq_rotation *rot;
    const float *proj; /* m x d Gaussian projection (qjl, tq-prod) */
    const struct vq_codebook *cb[VQ_MAX_LEVELS];
} vq_mparams;

/*
 * Scratch handed to the score/accum kernels, sized by the method's
 * scratch_floats() and owned by the attention call (one per task).
 */

/*
 * The method contract. A block holds block_tokens consecutive tokens of one
 * (layer, kv head); encode/decode/score/accum see only the method's payload
 * inside it. Token offsets t0 and counts n are multiples of token_group()
 * for encode; score and accum take any sub-range.
 *
 * Attention owns softmax, masking, GQA and threads. A method sees "rows":
 * the rows query vectors (q heads of one GQA group, times query tokens) that
 * share each read of the block.
 */
typedef struct vq_method {
    const char *name;
    /* Applies one "key=value" option; unknown keys are an error. */
    vq_status (*set_option)(vq_mparams *p, const char *key, const char *value);
    /* Fills defaults and checks the combination (head_dim, is_value). */
    vq_status (*finish)(vq_mparams *p);
    /* Writes the canonical spec ("kivi:bits=2,group=32,residual=128"). */
    void (*describe)(const vq_mparams *p, char *buf, size_t size);
    /* Tokens that must be encoded together (KIVI keys: the group). */
    int (*token_group)(const vq_mparams *p);
    /* Payload bytes for block_tokens tokens. */
    size_t (*block_bytes)(const vq_mparams *p, int block_tokens);
    /* Bits per element including metadata, for reporting. */
    double (*bits_per_elem)(const vq_mparams *p);

    /* x: n rows of head_dim fp32 (already rounded to fp16 by the cache),
     * row stride x_stride floats; written at token offset t0 of the block. */
    void (*encode)(const vq_mparams *p, const float *x, size_t x_stride, int n, uint8_t *blk,
                   int block_tokens, int t0);
    /* Reference decode of tokens [t0, t0 + n) to fp32 rows. */
    void (*decode)(const vq_mparams *p, const uint8_t *blk, int block_tokens, int t0, int n,
                   float *out);

    /* Optional (NULL when unused), keys: the query rows as the method scores
     * them (rotated, projected, tables ...), computed once per attention
     * call (or per task of many rows). When set, score() receives what
     * prep_query wrote, rows x prep_floats(p) floats laid out as the method
     * likes, for exactly the same rows. The q rows are already multiplied by
     * the softmax scale. */
    size_t (*prep_floats)(const vq_mparams *p);
    void (*prep_query)(const vq_mparams *p, const float *q, int rows, float *prep);
    /* Optional (NULL when unused), values: accum() adds into the method's own
     * domain (e.g. rotated); finish_rows turns `rows` summed rows of
     * acc_floats(p) floats (head_dim when acc_floats is NULL) into output
     * space in place, the first head_dim floats of each row (e.g. the
     * inverse rotation). It must be linear: attention applies it once per
     * output row, after summing every block, and adds the fp16 window's part
     * afterwards. A domain wider than head_dim (tq-prod: the rotated codes
     * and the sign sketch) moves per-block work into finish_rows. */
    void (*finish_rows)(const vq_mparams *p, float *acc, int rows);
    size_t (*acc_floats)(const vq_mparams *p);

    /* The payload's per-token arrays, for eviction to move tokens between
     * slots and blocks without decoding them: writes the bytes per token of
     * each array into row_bytes (at most VQ_MAX_TOKEN_ARRAYS) and returns
     * how many there are. A block of bt tokens holds [bt][row_bytes[0]],
     * then [bt][row_bytes[1]], ...; a method with token_group() = G > 1
     * follows them with metadata for each group of G slots (ceil(bt / G)
     * groups), which block_bytes() counts. */
    int (*token_layout)(const vq_mparams *p, size_t *row_bytes);
    /* Floats of per-task scratch score/accum need for `rows` query rows. */
    size_t (*scratch_floats)(const vq_mparams *p, int rows);
    /* logits[r * ld + j] = q_r . k_(t0 + j) for r < rows, j < n. q is rows x
     * head_dim, already multiplied by the softmax scale. */
    void (*score)(const vq_mparams *p, const float *q, int rows, const uint8_t *blk,
                  int block_tokens, int t0, int n, float *logits, int ld, float *scratch);
    /* acc[r * A + d] += sum_j w[r * ld + j] * v_(t0 + j)[d], A = acc_floats(p)
     * or head_dim (in the method's domain when finish_rows is set). */
    void (*accum)(const vq_mparams *p, const float *w, int ld, int rows, const uint8_t *blk,
                  int block_tokens, int t0, int n, float *acc, float *scratch);
} vq_method;

#define VQ_MAX_TOKEN_ARRAYS 4

extern const vq_method vq_method_fp16;
extern const vq_method vq_method_kivi;
extern const vq_method vq_method_tq_mse;
extern const vq_method vq_method_tq_prod;
extern const vq_method vq_method_rvq;
extern const vq_method vq_method_qjl;
extern const vq_method vq_method_polar;

/* Looks a method up by name; NULL if unknown. */
const vq_method *vq_method_find(const char *name);
/* Comma-separated list of method names, for error messages. */
const char *vq_method_names(void);
/* token_group of the per-token methods: every token is encoded alone. */
int vq_token_group_one(const vq_mparams *p);

/* Parameters of an eviction policy (the parsed "+POLICY:key=value,...");
 * see src/evict/evict.h. */
typedef struct {
    const struct vq_policy *policy; /* NULL: no eviction */
    int64_t budget;  /* tokens kept per head; 0 when ratio is given */
    double ratio;    /* keep ceil(ratio * tokens seen); 0 when budget is given */
    int sinks;       /* oldest tokens protected */
    int recent;      /* newest tokens protected; -1: a quarter of the budget */
    int window;      /* snapkv, pyramidkv: observation window (queries) */
    int pool;        /* snapkv, pyramidkv: max-pooling kernel (slots, odd) */
    double beta;     /* pyramidkv: first-to-last layer budget ratio */
    double tau;      /* keyformer: Gumbel noise scale */
    uint64_t seed;   /* keyformer: noise seed */
    int adakv;       /* 1: one budget per layer shared by its heads */
    double floor;    /* adakv: share of the per-head budget every head keeps */
    char filters[256]; /* qfilters: the calibrated filters file */
} vq_evict_params;

/* A parsed KV spec: one method instance for keys and one for values, and
 * the eviction policy. */
typedef struct {
    vq_mparams k, v;
    vq_evict_params evict;
} vq_spec;

vq_status vq_spec_parse(const char *spec, int head_dim, vq_spec *out);
void vq_spec_describe(const vq_spec *s, char *buf, size_t size);

/* ---------------------------------------------------------------- cache */

/* One (layer, kv head) stream of tokens, in position order: the tokens of
 * its blocks in block order, then the fp16 window. A token's index in that
 * order is its slot. */
typedef struct {
    uint8_t **blocks;    /* full and partially filled quantized blocks */
    int32_t *blk_n;      /* tokens held by each block, from its slot 0 */
    uint8_t *blk_class;  /* each block's size class (vq_cache.cls) */
    int n_blocks;        /* blocks in use */
    int cap_blocks;      /* length of the block arrays */
    int64_t n_quant;     /* tokens in blocks */
    /* The fp16 window: the newest tokens, not yet quantized. */
    uint16_t *win_k, *win_v; /* [win_cap][head_dim] */
    int32_t *win_pos;        /* [win_cap] */
    int win_n;
    /* Eviction: the policy's score of every slot (higher is kept longer),
     * moved along when slots are compacted. */
    float *score;
    int64_t score_cap;
} vq_stream;

/* Blocks come in size classes: one class of block_tokens slots, and with
 * eviction of a key-grouped method (KIVI keys) smaller classes that a
 * thinned-out block moves into (see cache/compact.c). */
#define VQ_MAX_CLASSES 16
typedef struct {
    int cap;              /* token slots */
    size_t k_bytes, v_bytes; /* payload bytes, each rounded to 64 */
    size_t bytes;         /* k + v payload + positions, rounded to 64 */
    size_t allocated;     /* blocks of this class currently owned */
} vq_block_class;

struct vq_cache {
    vq_cache_config cfg;
    vq_spec spec;
    char spec_text[1024];
    int block_tokens;
    int flush_tokens;      /* tokens moved from the window to blocks at once */
    int residual;          /* tokens kept in the window after a flush */
    int win_cap;           /* residual + flush_tokens */
    size_t k_bytes, v_bytes; /* payload bytes per full block */
    size_t block_bytes;      /* k + v payload + positions, rounded to 64 */
    vq_block_class cls[VQ_MAX_CLASSES]; /* cls[0]: block_tokens slots */
    int n_classes;
    vq_stream *streams;    /* [n_layers][n_heads_kv] */
    int32_t *last_pos;     /* [n_layers], -1 when empty */
    int64_t *seen;         /* [n_layers] tokens ever appended (ratio budgets) */
    /* Free full-size blocks kept for reuse after reset/truncate. */
    uint8_t **free_blocks;
    int n_free, cap_free;
    size_t window_bytes;     /* bytes of allocated windows */
    size_t score_bytes;      /* bytes of the eviction scores */
    size_t peak_bytes;       /* the most vq_cache_bytes has been */
    struct vq_evict_state *evict; /* NULL without a policy */
    /* Scratch for append (fp32 rows) and attend (partials); grown on demand
     * and kept, so the hot path stops allocating after warm-up. */
    float *append_scratch;
    size_t append_scratch_floats;
    float *attend_scratch;
    size_t attend_scratch_floats;
    /* CUDA caches (kernels/cuda/): the device state; NULL for CPU caches.
     * The streams then keep only their counts (n_quant, win_n). */
    struct vq_cuda_cache *cuda;
};

static inline vq_stream *vq_stream_at(const vq_cache *c, int layer, int head) {
    return &c->streams[(size_t)layer * c->cfg.n_heads_kv + head];
}

/* A block's capacity, its value payload and its positions. */
static inline int vq_blk_cap(const vq_cache *c, const vq_stream *s, int b) { return c->cls[s->blk_class[b]].cap; }
static inline uint8_t *vq_blk_v(const vq_cache *c, const vq_stream *s, int b) {
    return s->blocks[b] + c->cls[s->blk_class[b]].k_bytes;
}
static inline int32_t *vq_blk_pos(const vq_cache *c, const vq_stream *s, int b) {
    const vq_block_class *k = &c->cls[s->blk_class[b]];
    return (int32_t *)(s->blocks[b] + k->k_bytes + k->v_bytes);
}

/* Block allocation by size class (cache.c); release gives the memory back
 * to the system. */
uint8_t *vq_block_alloc(vq_cache *c, int cls);
void vq_block_release(vq_cache *c, uint8_t *blk, int cls);
/* Keeps the slots of one stream with keep[slot] != 0 and drops the rest,
 * moving packed codes in place; frees emptied blocks and moves thinned-out
 * key-grouped blocks to smaller ones (cache/compact.c). */
void vq_stream_keep(vq_cache *c, vq_stream *s, const uint8_t *keep);
/* Moves n tokens of a method's payload from slot s0 of src (bt_src slots)
 * to slot t0 of dst (bt_dst slots). src == dst with t0 <= s0 is allowed.
 * With token_group > 1 the whole block is one group and its metadata is
 * copied when the blocks differ. */
void vq_move_tokens(const vq_mparams *p, const uint8_t *src, int bt_src, int s0, uint8_t *dst, int bt_dst, int t0,
                    int n);

/* Capacity (0 = unlimited) bounds the tokens a layer holds after an
 * append: an error when a layer holding `held` tokens (its largest head)
 * cannot take n_tokens more (cache/cache.c). */
vq_status vq_cache_check_room(const vq_cache *c, int layer, int64_t held, int n_tokens);

/* Eviction driven by the cache's policy (cache/evict.c). Before appending
 * n_new tokens to a layer: evicts so that the layer holds at most its
 * budget once they are in. */
vq_status vq_cache_evict_for(vq_cache *c, int layer, int n_new);
/* Query tokens of an attention call of n_q tokens whose attention the
 * policy observes; 0 when it needs no attention weights. */
int vq_cache_weight_rows(const vq_cache *c, int n_q);
/* Feeds the attention weights of one call ([n_heads_kv][ld], slot order)
 * to the policy. */
void vq_cache_observe(vq_cache *c, int layer, int n_q, const float *w, size_t ld);
/* Scratch of the policy for key weights, at least floats long; NULL when
 * out of memory. */
float *vq_cache_weight_scratch(vq_cache *c, size_t floats);

/* ---------------------------------------------------------------- kernels */

/* Dispatch level chosen once per process (vq_cpu_level_in_use). */
bool vq_cpu_has_avx2(void);
/* True when the level in use is VQ_CPU_AVX512 (AVX-512 F/BW/VL). */
bool vq_cpu_has_avx512(void);
/* True when the level in use is VQ_CPU_AVX512 and the CPU has AVX512_BF16. */
bool vq_cpu_has_avx512_bf16(void);
/* True when the level in use is VQ_CPU_AVX512, the CPU has AVX512_VNNI
 * and vq_cpu_hide_vnni has not hidden it. */
bool vq_cpu_has_avx512_vnni(void);
/* For tests: hide AVX512_VNNI (true) so that level avx512 runs the kernels
 * an AVX-512 CPU without it (Skylake-X) runs; not thread-safe, set it
 * between calls. */
void vq_cpu_hide_vnni(bool hide);

/* fp32 helpers with scalar and AVX2 bodies, picked at run time. */
float vq_dot_f32(const float *a, const float *b, int n);
void vq_axpy_f32(float a, const float *x, float *y, int n);

/* ---------------------------------------------------------------- CUDA */

/* The CUDA side of a cache (src/kernels/cuda/; without VQ_CUDA every entry
 * point but vq_cuda_cache_init is unreachable). Called by cache.c and
 * attend.c after their argument checks. */
vq_status vq_cuda_cache_init(vq_cache *c); /* device == VQ_DEVICE_CUDA */
void vq_cuda_cache_free(vq_cache *c);
vq_status vq_cuda_append(vq_cache *c, int layer, int n_tokens, const void *k, const void *v, vq_dtype dtype,
                         const int32_t *positions);
vq_status vq_cuda_truncate(vq_cache *c, int64_t n_tokens);
vq_status vq_cuda_attend(vq_cache *const *caches, int n_caches, int layer, const vq_attend_args *a);
/* One stream's data as device pointers (blocks: its block table's host
 * mirror), and a blocking device-to-host copy, for vq_cache_to_host. */
typedef struct {
    uint8_t *const *blocks;
    const uint16_t *win_k, *win_v;
    const int32_t *win_pos;
} vq_cuda_stream_view;
void vq_cuda_stream_get(const vq_cache *c, int layer, int head, vq_cuda_stream_view *out);
vq_status vq_cuda_copy_to_host(void *dst, const void *src, size_t bytes);

#endif
