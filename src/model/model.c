/* The transformer forward pass for Llama-family models (Llama 2/3, Mistral,
 * Qwen2, Qwen3), written to follow Hugging Face transformers' modeling code:
 *
 *   x = embed(token)
 *   per layer:  h = rmsnorm(x); q, k, v = h Wq (+b), h Wk (+b), h Wv (+b)
 *               [Qwen3: rmsnorm over each head of q and k]
 *               rope(q, k) at the token's absolute position (rotate-half)
 *               append k, v to the compressed cache; a = attend(q, cache)
 *               x += a Wo;  h = rmsnorm(x);  x += (silu(h Wg) * h Wu) Wd
 *   logits = rmsnorm(x) Wlm   (Wlm = the embedding when tied)
 *
 * Tokens go through in chunks (prefill) or one by one (decode). Weights stay
 * in the memory-mapped checkpoint; norms and biases are converted to fp32 at
 * load since they are small.
 */
#include "matmul.h"
#include "model_internal.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define DEFAULT_CHUNK 512

typedef struct {
    const void *data;
    vq_dtype dtype;
} wref; /* a weight matrix [out][in] inside the checkpoint */

typedef struct {
    float *attn_norm, *mlp_norm; /* [hidden] */
    float *q_norm, *k_norm;      /* [head_dim], Qwen3 */
    float *bq, *bk, *bv, *bo;    /* biases or NULL */
    wref wq, wk, wv, wo, wg, wu, wd;
} layer_w;

struct vq_model {
    vq_model_config cfg;
    vq_model_info info;
    vq_weights *weights;
    wref embed, lm_head;
    float *final_norm;
    layer_w *layers;
    float *rope_inv_freq; /* [rotary_dim / 2] */
    /* activations for one chunk, allocated once */
    int chunk_cap;
    float *x, *xb, *xb2, *q, *k, *v, *att, *h1, *h2;
    int32_t *pos;
    vq_model_qk_hook qk_hook; /* NULL unless a tool watches the queries and keys */
    void *qk_user;
};

static vq_dtype dtype_of(vq_st_dtype t) {
    return t == VQ_ST_F32 ? VQ_F32 : t == VQ_ST_F16 ? VQ_F16 : VQ_BF16;
}

/* Finds a [rows][cols] matrix (or a vector when cols == 0). */
static vq_status get_tensor(const vq_weights *w, const char *name, int64_t rows, int64_t cols, wref *out) {
    int64_t shape[2] = {rows, cols};
    const vq_st_tensor *t;
    vq_status st = vq_weights_expect(w, name, cols ? 2 : 1, shape, &t);
    if (st) return st;
    out->data = t->data;
    out->dtype = dtype_of(t->dtype);
    return VQ_OK;
}

/* Copies a small vector weight to fp32 (the mapping may be unaligned). */
static vq_status get_vector(const vq_weights *w, const char *name, int64_t n, float **out) {
    wref r;
    vq_status st = get_tensor(w, name, n, 0, &r);
    if (st) return st;
    float *v = vq_aligned_alloc(sizeof(float) * (size_t)n);
    if (!v) return vq_fail(VQ_ERR_NOMEM, "out of memory converting '%s'", name);
    for (int64_t i = 0; i < n; i++) v[i] = vq_weight_at((const char *)r.data + (size_t)i * vq_dtype_size(r.dtype), r.dtype);
    *out = v;
    return VQ_OK;
}

static vq_status layer_tensor(const vq_weights *w, int l, const char *part, int64_t rows, int64_t cols, wref *out) {
    char name[160];
    snprintf(name, sizeof name, "model.layers.%d.%s", l, part);
    return get_tensor(w, name, rows, cols, out);
}

static vq_status layer_vector(const vq_weights *w, int l, const char *part, int64_t n, float **out) {
    char name[160];
    snprintf(name, sizeof name, "model.layers.%d.%s", l, part);
    return get_vector(w, name, n, out);
}

/* Inverse frequencies as transformers computes them: 1 / theta^(2i / dim),
 * then for "llama3" the wavelength-dependent scaling. */
static void rope_frequencies(const vq_model_config *c, float *inv) {
    int half = c->rotary_dim / 2;
    for (int i = 0; i < half; i++) {
        float e = (float)(2 * i) / (float)c->rotary_dim;
        inv[i] = 1.0f / powf((float)c->rope_theta, e);
    }
    if (c->rope_type != VQ_ROPE_LLAMA3) return;
    double old = c->rope_original_max_pos;
    double low_wavelen = old / c->rope_low_freq_factor, high_wavelen = old / c->rope_high_freq_factor;
    for (int i = 0; i < half; i++) {
        double f = inv[i], wavelen = 2.0 * M_PI / f;
        if (wavelen > low_wavelen) {
            f = f / c->rope_factor;
        } else if (wavelen >= high_wavelen) {
            double smooth = (old / wavelen - c->rope_low_freq_factor) / (c->rope_high_freq_factor - c->rope_low_freq_factor);
            f = (1.0 - smooth) * f / c->rope_factor + smooth * f;
        }
        inv[i] = (float)f;
    }
}

void vq_model_free(vq_model *m) {
    if (!m) return;
    if (m->layers) {
        for (int l = 0; l < m->cfg.n_layers; l++) {
            layer_w *L = &m->layers[l];
            vq_aligned_free(L->attn_norm);
            vq_aligned_free(L->mlp_norm);
            vq_aligned_free(L->q_norm);
            vq_aligned_free(L->k_norm);
            vq_aligned_free(L->bq);
            vq_aligned_free(L->bk);
            vq_aligned_free(L->bv);
            vq_aligned_free(L->bo);
        }
        free(m->layers);
    }
    vq_aligned_free(m->final_norm);
    vq_aligned_free(m->rope_inv_freq);
    float *bufs[] = {m->x, m->xb, m->xb2, m->q, m->k, m->v, m->att, m->h1, m->h2};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) vq_aligned_free(bufs[i]);
    vq_aligned_free(m->pos);
    vq_weights_close(m->weights);
    free(m);
}

static vq_status load_layers(vq_model *m) {
    const vq_model_config *c = &m->cfg;
    const vq_weights *w = m->weights;
    int64_t H = c->hidden_size, qd = (int64_t)c->n_heads * c->head_dim, kd = (int64_t)c->n_kv_heads * c->head_dim;
    int64_t I = c->intermediate_size;
    for (int l = 0; l < c->n_layers; l++) {
        layer_w *L = &m->layers[l];
        vq_status st = layer_vector(w, l, "input_layernorm.weight", H, &L->attn_norm);
        if (!st) st = layer_vector(w, l, "post_attention_layernorm.weight", H, &L->mlp_norm);
        if (!st) st = layer_tensor(w, l, "self_attn.q_proj.weight", qd, H, &L->wq);
        if (!st) st = layer_tensor(w, l, "self_attn.k_proj.weight", kd, H, &L->wk);
        if (!st) st = layer_tensor(w, l, "self_attn.v_proj.weight", kd, H, &L->wv);
        if (!st) st = layer_tensor(w, l, "self_attn.o_proj.weight", H, qd, &L->wo);
        if (!st) st = layer_tensor(w, l, "mlp.gate_proj.weight", I, H, &L->wg);
        if (!st) st = layer_tensor(w, l, "mlp.up_proj.weight", I, H, &L->wu);
        if (!st) st = layer_tensor(w, l, "mlp.down_proj.weight", H, I, &L->wd);
        if (!st && c->attention_bias) {
            st = layer_vector(w, l, "self_attn.q_proj.bias", qd, &L->bq);
            if (!st) st = layer_vector(w, l, "self_attn.k_proj.bias", kd, &L->bk);
            if (!st) st = layer_vector(w, l, "self_attn.v_proj.bias", kd, &L->bv);
            /* Llama's attention_bias also covers o_proj; Qwen2 has none there */
            if (!st && c->arch != VQ_ARCH_QWEN2) st = layer_vector(w, l, "self_attn.o_proj.bias", H, &L->bo);
        }
        if (!st && c->qk_norm) {
            st = layer_vector(w, l, "self_attn.q_norm.weight", c->head_dim, &L->q_norm);
            if (!st) st = layer_vector(w, l, "self_attn.k_norm.weight", c->head_dim, &L->k_norm);
        }
        if (st) return st;
    }
    return VQ_OK;
}

static vq_status alloc_activations(vq_model *m, int chunk) {
    const vq_model_config *c = &m->cfg;
    size_t n = (size_t)chunk;
    size_t qd = (size_t)c->n_heads * c->head_dim, kd = (size_t)c->n_kv_heads * c->head_dim;
    size_t hmax = (size_t)c->hidden_size > qd ? (size_t)c->hidden_size : qd;
    m->x = vq_aligned_alloc(sizeof(float) * n * c->hidden_size);
    m->xb = vq_aligned_alloc(sizeof(float) * n * hmax);
    m->xb2 = vq_aligned_alloc(sizeof(float) * n * c->hidden_size);
    m->q = vq_aligned_alloc(sizeof(float) * n * qd);
    m->k = vq_aligned_alloc(sizeof(float) * n * kd);
    m->v = vq_aligned_alloc(sizeof(float) * n * kd);
    m->att = vq_aligned_alloc(sizeof(float) * n * qd);
    m->h1 = vq_aligned_alloc(sizeof(float) * n * c->intermediate_size);
    m->h2 = vq_aligned_alloc(sizeof(float) * n * c->intermediate_size);
    m->pos = vq_aligned_alloc(sizeof(int32_t) * n);
    if (!m->x || !m->xb || !m->xb2 || !m->q || !m->k || !m->v || !m->att || !m->h1 || !m->h2 || !m->pos)
        return vq_fail(VQ_ERR_NOMEM, "out of memory for activations of %d tokens", chunk);
    m->chunk_cap = chunk;
    return VQ_OK;
}

vq_status vq_model_load(const char *dir, vq_model **out) {
    if (!out) return vq_fail(VQ_ERR_ARG, "vq_model_load: out is NULL");
    *out = NULL;
    if (!dir) return vq_fail(VQ_ERR_ARG, "vq_model_load: dir is NULL");
    vq_model *m = calloc(1, sizeof *m);
    if (!m) return vq_fail(VQ_ERR_NOMEM, "out of memory loading a model");
    char path[4096];
    snprintf(path, sizeof path, "%s/config.json", dir);
    vq_status st = vq_config_load(path, &m->cfg);
    snprintf(path, sizeof path, "%s/generation_config.json", dir);
    if (!st) st = vq_config_merge_generation(path, &m->cfg);
    if (!st) st = vq_weights_open(dir, &m->weights);
    if (st) {
        vq_model_free(m);
        return st;
    }
    const vq_model_config *c = &m->cfg;
    m->layers = calloc((size_t)c->n_layers, sizeof *m->layers);
    m->rope_inv_freq = vq_aligned_alloc(sizeof(float) * (size_t)(c->rotary_dim / 2 + 1));
    if (!m->layers || !m->rope_inv_freq) {
        vq_model_free(m);
        return vq_fail(VQ_ERR_NOMEM, "out of memory loading a model");
    }
    rope_frequencies(c, m->rope_inv_freq);
    st = get_tensor(m->weights, "model.embed_tokens.weight", c->vocab_size, c->hidden_size, &m->embed);
    if (!st) st = get_vector(m->weights, "model.norm.weight", c->hidden_size, &m->final_norm);
    if (!st) {
        if (c->tie_word_embeddings && !vq_weights_find(m->weights, "lm_head.weight")) m->lm_head = m->embed;
        else st = get_tensor(m->weights, "lm_head.weight", c->vocab_size, c->hidden_size, &m->lm_head);
    }
    if (!st) st = load_layers(m);
    if (!st) st = alloc_activations(m, DEFAULT_CHUNK);
    if (st) {
        vq_model_free(m);
        return st;
    }
    vq_model_info *in = &m->info;
    in->arch = c->arch_name;
    in->n_layers = c->n_layers;
    in->hidden_size = c->hidden_size;
    in->intermediate_size = c->intermediate_size;
    in->n_heads = c->n_heads;
    in->n_kv_heads = c->n_kv_heads;
    in->head_dim = c->head_dim;
    in->vocab_size = c->vocab_size;
    in->max_position_embeddings = c->max_position_embeddings;
    in->dtype = m->layers[0].wq.dtype;
    in->bos_token_id = c->bos_token_id;
    in->n_eos = c->n_eos < 8 ? c->n_eos : 8;
    memcpy(in->eos_token_ids, c->eos_token_ids, sizeof(int32_t) * (size_t)in->n_eos);
    for (int i = 0; i < vq_weights_count(m->weights); i++) in->n_params += vq_weights_at(m->weights, i)->n_elems;
    *out = m;
    return VQ_OK;
}

const vq_model_info *vq_model_get_info(const vq_model *m) { return m ? &m->info : NULL; }

void vq_model_set_qk_hook(vq_model *m, vq_model_qk_hook hook, void *user) {
    m->qk_hook = hook;
    m->qk_user = user;
}

vq_status vq_model_cache_create(const vq_model *m, const char *kv_spec, int64_t capacity, vq_cache **out) {
    if (!m) return vq_fail(VQ_ERR_ARG, "vq_model_cache_create: model is NULL");
    vq_cache_config cfg = {.n_layers = m->cfg.n_layers, .n_heads_q = m->cfg.n_heads, .n_heads_kv = m->cfg.n_kv_heads,
                           .head_dim = m->cfg.head_dim, .kv_spec = kv_spec, .capacity = capacity};
    return vq_cache_create(&cfg, out);
}

/* out = x / sqrt(mean(x^2) + eps) * w, in fp32 as transformers' RMSNorm. */
static void rmsnorm(float *out, const float *x, const float *w, int n, float eps) {
    float ss = 0;
    for (int i = 0; i < n; i++) ss += x[i] * x[i];
    float inv = 1.0f / sqrtf(ss / (float)n + eps);
    for (int i = 0; i < n; i++) out[i] = w[i] * (x[i] * inv);
}

/* Rotate-half RoPE on each head of one token's vector: pairs (i, i + r/2)
 * over the first r = rotary_dim channels of each head. */
static void rope(float *v, int n_heads, int head_dim, int rotary_dim, const float *inv_freq, int32_t pos) {
    int half = rotary_dim / 2;
    for (int i = 0; i < half; i++) {
        float angle = (float)pos * inv_freq[i];
        float c = cosf(angle), s = sinf(angle);
        for (int h = 0; h < n_heads; h++) {
            float *p = v + (size_t)h * head_dim;
            float a = p[i], b = p[i + half];
            p[i] = a * c - b * s;
            p[i + half] = b * c + a * s;
        }
    }
}

static void embed_row(const wref *e, int hidden, int32_t token, float *out) {
    const char *row = (const char *)e->data + (size_t)token * hidden * vq_dtype_size(e->dtype);
    for (int i = 0; i < hidden; i++) out[i] = vq_weight_at(row + (size_t)i * vq_dtype_size(e->dtype), e->dtype);
}

/* One chunk of n <= chunk_cap tokens through every layer. */
static vq_status forward_chunk(vq_model *m, vq_cache *cache, const int32_t *tokens, int n, int32_t pos0,
                               float *logits, int all_logits, vq_pool *pool) {
    const vq_model_config *c = &m->cfg;
    int H = c->hidden_size, D = c->head_dim, I = c->intermediate_size;
    int qd = c->n_heads * D, kd = c->n_kv_heads * D;
    float eps = (float)c->rms_norm_eps;
    for (int j = 0; j < n; j++) {
        embed_row(&m->embed, H, tokens[j], m->x + (size_t)j * H);
        m->pos[j] = pos0 + j;
    }
    for (int l = 0; l < c->n_layers; l++) {
        const layer_w *L = &m->layers[l];
        for (int j = 0; j < n; j++) rmsnorm(m->xb + (size_t)j * H, m->x + (size_t)j * H, L->attn_norm, H, eps);
        vq_matmul(pool, m->q, m->xb, n, H, L->wq.data, L->wq.dtype, qd, L->bq);
        vq_matmul(pool, m->k, m->xb, n, H, L->wk.data, L->wk.dtype, kd, L->bk);
        vq_matmul(pool, m->v, m->xb, n, H, L->wv.data, L->wv.dtype, kd, L->bv);
        for (int j = 0; j < n; j++) {
            float *qj = m->q + (size_t)j * qd, *kj = m->k + (size_t)j * kd;
            if (c->qk_norm) {
                for (int h = 0; h < c->n_heads; h++) rmsnorm(qj + (size_t)h * D, qj + (size_t)h * D, L->q_norm, D, eps);
                for (int h = 0; h < c->n_kv_heads; h++) rmsnorm(kj + (size_t)h * D, kj + (size_t)h * D, L->k_norm, D, eps);
            }
            rope(qj, c->n_heads, D, c->rotary_dim, m->rope_inv_freq, m->pos[j]);
            rope(kj, c->n_kv_heads, D, c->rotary_dim, m->rope_inv_freq, m->pos[j]);
        }
        if (m->qk_hook) m->qk_hook(m->qk_user, l, n, m->pos, m->q, m->k);
        vq_status st = vq_cache_append(cache, l, n, m->k, m->v, VQ_F32, m->pos);
        if (st) return st;
        vq_attend_args a = {.n_q = n, .q = m->q, .q_pos = m->pos, .out = m->att, .out_dtype = VQ_F32, .pool = pool};
        st = vq_attend(cache, l, &a);
        if (st) return st;
        vq_matmul(pool, m->xb2, m->att, n, qd, L->wo.data, L->wo.dtype, H, L->bo);
        for (size_t i = 0; i < (size_t)n * H; i++) m->x[i] += m->xb2[i];
        for (int j = 0; j < n; j++) rmsnorm(m->xb + (size_t)j * H, m->x + (size_t)j * H, L->mlp_norm, H, eps);
        vq_matmul(pool, m->h1, m->xb, n, H, L->wg.data, L->wg.dtype, I, NULL);
        vq_matmul(pool, m->h2, m->xb, n, H, L->wu.data, L->wu.dtype, I, NULL);
        for (size_t i = 0; i < (size_t)n * I; i++) {
            float g = m->h1[i];
            m->h1[i] = g / (1.0f + expf(-g)) * m->h2[i]; /* silu(g) * up */
        }
        vq_matmul(pool, m->xb2, m->h1, n, I, L->wd.data, L->wd.dtype, H, NULL);
        for (size_t i = 0; i < (size_t)n * H; i++) m->x[i] += m->xb2[i];
    }
    if (!logits) return VQ_OK;
    int first = all_logits ? 0 : n - 1, rows = n - first;
    for (int j = first; j < n; j++) rmsnorm(m->xb + (size_t)(j - first) * H, m->x + (size_t)j * H, m->final_norm, H, eps);
    vq_matmul(pool, logits, m->xb, rows, H, m->lm_head.data, m->lm_head.dtype, c->vocab_size, NULL);
    return VQ_OK;
}

vq_status vq_model_forward(vq_model *m, vq_cache *cache, const int32_t *tokens, int n, int chunk, float *logits,
                           int all_logits, vq_pool *pool) {
    if (!m || !cache || !tokens) return vq_fail(VQ_ERR_ARG, "vq_model_forward: model, cache or tokens is NULL");
    if (n < 1) return vq_fail(VQ_ERR_ARG, "vq_model_forward: n=%d tokens (at least 1)", n);
    if (chunk < 0 || chunk > m->chunk_cap)
        return vq_fail(VQ_ERR_ARG, "chunk=%d is out of range [0, %d] (0 = %d)", chunk, m->chunk_cap, DEFAULT_CHUNK);
    if (chunk == 0) chunk = DEFAULT_CHUNK;
    const vq_model_config *c = &m->cfg;
    if (cache->cfg.n_layers != c->n_layers || cache->cfg.n_heads_q != c->n_heads ||
        cache->cfg.n_heads_kv != c->n_kv_heads || cache->cfg.head_dim != c->head_dim)
        return vq_fail(VQ_ERR_ARG, "the cache (%d layers, %d/%d heads, dim %d) does not fit the model (%d layers, %d/%d heads, dim %d)",
                       cache->cfg.n_layers, cache->cfg.n_heads_q, cache->cfg.n_heads_kv, cache->cfg.head_dim,
                       c->n_layers, c->n_heads, c->n_kv_heads, c->head_dim);
    for (int j = 0; j < n; j++)
        if (tokens[j] < 0 || tokens[j] >= c->vocab_size)
            return vq_fail(VQ_ERR_ARG, "token %d at index %d is out of range [0, %d)", tokens[j], j, c->vocab_size);
    int32_t pos0 = vq_cache_last_pos(cache, 0) + 1;
    if ((int64_t)pos0 + n > c->max_position_embeddings)
        return vq_fail(VQ_ERR_ARG, "positions up to %lld pass the model's context length %d",
                       (long long)pos0 + n - 1, c->max_position_embeddings);
    for (int j0 = 0; j0 < n;) {
        int nc = n - j0 < chunk ? n - j0 : chunk;
        /* With eviction a chunk must fit the budget; half of what fits leaves
         * the chunk's queries the older half of the budget to look at. */
        int64_t fit = vq_cache_append_limit(cache);
        if (fit < INT32_MAX) {
            int64_t half = fit / 2 > 0 ? fit / 2 : 1;
            if (nc > half) nc = (int)half;
        }
        float *lg = NULL;
        if (logits && all_logits) lg = logits + (size_t)j0 * c->vocab_size;
        else if (logits && j0 + nc == n) lg = logits;
        vq_status st = forward_chunk(m, cache, tokens + j0, nc, pos0 + j0, lg, all_logits, pool);
        if (st) return st;
        j0 += nc;
    }
    return VQ_OK;
}
