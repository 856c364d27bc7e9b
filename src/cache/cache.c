/* The compressed KV cache. Each (layer, kv head) is a stream: a list of
 * blocks of packed codes (plus positions), then an fp16 window of the newest
 * tokens. Blocks come from a free list or a fresh aligned allocation; the
 * cache never reallocates token data. With an eviction policy, appends first
 * evict down to the budget (cache/evict.c) and evicted slots are compacted
 * in place (cache/compact.c), so heads may hold different counts. */
#include "vq_internal.h"
#include "evict/evict.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define DEFAULT_BLOCK_TOKENS 64 /* small enough that a part-filled last block wastes little */

static size_t round64(size_t x) { return (x + 63) & ~(size_t)63; }

vq_status vq_cache_create(const vq_cache_config *cfg, vq_cache **out) {
    if (!out) return vq_fail(VQ_ERR_ARG, "vq_cache_create: out is NULL");
    *out = NULL;
    if (!cfg) return vq_fail(VQ_ERR_ARG, "vq_cache_create: config is NULL");
    if (cfg->n_layers < 1 || cfg->n_layers > 1024)
        return vq_fail(VQ_ERR_ARG, "n_layers=%d is out of range [1, 1024]", cfg->n_layers);
    if (cfg->n_heads_kv < 1 || cfg->n_heads_kv > 1024)
        return vq_fail(VQ_ERR_ARG, "n_heads_kv=%d is out of range [1, 1024]", cfg->n_heads_kv);
    if (cfg->n_heads_q < cfg->n_heads_kv || cfg->n_heads_q > 8192 || cfg->n_heads_q % cfg->n_heads_kv)
        return vq_fail(VQ_ERR_ARG, "n_heads_q=%d must be a multiple of n_heads_kv=%d (at most 8192)",
                       cfg->n_heads_q, cfg->n_heads_kv);
    if (cfg->head_dim < 8 || cfg->head_dim > 1024 || cfg->head_dim % 8)
        return vq_fail(VQ_ERR_ARG, "head_dim=%d is out of range (a multiple of 8 in [8, 1024])", cfg->head_dim);
    if (cfg->capacity < 0 || cfg->capacity > ((int64_t)1 << 31) - 1)
        return vq_fail(VQ_ERR_ARG, "capacity=%lld is out of range [0, 2^31 - 1] (0 = unlimited)",
                       (long long)cfg->capacity);
    if (cfg->block_tokens < 0 || cfg->block_tokens > 65536)
        return vq_fail(VQ_ERR_ARG, "block_tokens=%d is out of range [0, 65536] (0 = default %d)",
                       cfg->block_tokens, DEFAULT_BLOCK_TOKENS);
    if (cfg->device != VQ_DEVICE_CPU && cfg->device != VQ_DEVICE_CUDA)
        return vq_fail(VQ_ERR_ARG, "device=%d is not VQ_DEVICE_CPU (0) or VQ_DEVICE_CUDA (1)", (int)cfg->device);
    vq_spec spec;
    vq_status st = vq_spec_parse(cfg->kv_spec, cfg->head_dim, &spec);
    if (st) return st;

    vq_cache *c = calloc(1, sizeof *c);
    if (!c) return vq_fail(VQ_ERR_NOMEM, "out of memory creating the cache");
    c->cfg = *cfg;
    c->cfg.kv_spec = NULL; /* the caller's string need not outlive the call */
    c->spec = spec;
    vq_spec_describe(&spec, c->spec_text, sizeof c->spec_text);

    int gk = spec.k.method->token_group(&spec.k), gv = spec.v.method->token_group(&spec.v);
    c->flush_tokens = gk > gv ? gk : gv; /* both are powers of two */
    c->residual = spec.k.residual > spec.v.residual ? spec.k.residual : spec.v.residual;
    c->win_cap = c->residual + c->flush_tokens;
    int bt = cfg->block_tokens ? cfg->block_tokens : DEFAULT_BLOCK_TOKENS;
    if (!cfg->block_tokens && bt < c->flush_tokens) bt = c->flush_tokens;
    if (spec.evict.policy && c->flush_tokens > 1) {
        /* eviction keeps a key group in a block of its own (cache/compact.c) */
        if (cfg->block_tokens && cfg->block_tokens != c->flush_tokens) {
            int group = c->flush_tokens;
            free(c);
            return vq_fail(VQ_ERR_ARG, "block_tokens=%d: with eviction a block holds one key group (allowed 0 or %d)",
                           cfg->block_tokens, group);
        }
        bt = c->flush_tokens;
    }
    if (bt % c->flush_tokens) {
        int group = c->flush_tokens;
        free(c);
        return vq_fail(VQ_ERR_ARG, "block_tokens=%d must be a multiple of the spec's token group %d", bt, group);
    }
    c->block_tokens = bt;
    c->n_classes = 1;
    c->cls[0].cap = bt;
    if (spec.evict.policy && c->flush_tokens > 1) {
        /* one group per block, and smaller classes to move thinned-out
         * groups into (cache/compact.c) */
        for (int cap = 8; cap < bt && c->n_classes < VQ_MAX_CLASSES; cap += 8) c->cls[c->n_classes++].cap = cap;
    }
    for (int k = 0; k < c->n_classes; k++) {
        vq_block_class *b = &c->cls[k];
        b->k_bytes = round64(spec.k.method->block_bytes(&spec.k, b->cap));
        b->v_bytes = round64(spec.v.method->block_bytes(&spec.v, b->cap));
        b->bytes = round64(b->k_bytes + b->v_bytes + (size_t)b->cap * sizeof(int32_t));
    }
    c->k_bytes = c->cls[0].k_bytes;
    c->v_bytes = c->cls[0].v_bytes;
    c->block_bytes = c->cls[0].bytes;

    size_t n_streams = (size_t)cfg->n_layers * cfg->n_heads_kv;
    c->streams = calloc(n_streams, sizeof *c->streams);
    c->last_pos = malloc(sizeof *c->last_pos * (size_t)cfg->n_layers);
    c->seen = calloc((size_t)cfg->n_layers, sizeof *c->seen);
    if (!c->streams || !c->last_pos || !c->seen) {
        vq_cache_free(c);
        return vq_fail(VQ_ERR_NOMEM, "out of memory creating the cache (%zu streams)", n_streams);
    }
    for (int l = 0; l < cfg->n_layers; l++) c->last_pos[l] = -1;
    if (spec.evict.policy) {
        if (cfg->device == VQ_DEVICE_CUDA) {
            vq_cache_free(c);
            return vq_fail(VQ_ERR_UNSUPPORTED, "eviction ('+%s') is not available for CUDA caches yet",
                           spec.evict.policy->name);
        }
        st = vq_evict_state_create(&spec.evict, cfg->n_layers, cfg->n_heads_kv, cfg->head_dim, &c->evict);
        if (st) {
            vq_cache_free(c);
            return st;
        }
    }
    if (cfg->device == VQ_DEVICE_CUDA && (st = vq_cuda_cache_init(c)) != VQ_OK) {
        vq_cache_free(c);
        return st;
    }
    *out = c;
    return VQ_OK;
}

void vq_cache_free(vq_cache *c) {
    if (!c) return;
    if (c->cuda) vq_cuda_cache_free(c);
    if (c->streams) {
        size_t n_streams = (size_t)c->cfg.n_layers * c->cfg.n_heads_kv;
        for (size_t i = 0; i < n_streams; i++) {
            vq_stream *s = &c->streams[i];
            for (int b = 0; b < s->n_blocks; b++) vq_aligned_free(s->blocks[b]);
            free(s->blocks);
            free(s->blk_n);
            free(s->blk_class);
            free(s->score);
            vq_aligned_free(s->win_k);
            vq_aligned_free(s->win_v);
            vq_aligned_free(s->win_pos);
        }
    }
    for (int i = 0; i < c->n_free; i++) vq_aligned_free(c->free_blocks[i]);
    free(c->free_blocks);
    free(c->streams);
    free(c->last_pos);
    free(c->seen);
    vq_evict_state_free(c->evict);
    vq_aligned_free(c->append_scratch);
    vq_aligned_free(c->attend_scratch);
    free(c);
}

static void give_block(vq_cache *c, uint8_t *b) {
    /* The free list has room for every full-size block ever allocated
     * (grown in vq_cache_append), so this cannot fail. */
    c->free_blocks[c->n_free++] = b;
}

uint8_t *vq_block_alloc(vq_cache *c, int cls) {
    uint8_t *b = vq_aligned_alloc(c->cls[cls].bytes);
    if (b) c->cls[cls].allocated++;
    return b;
}

void vq_block_release(vq_cache *c, uint8_t *blk, int cls) {
    vq_aligned_free(blk);
    c->cls[cls].allocated--;
}

/* Makes sure the free list can hold every block the cache will own. */
static vq_status reserve_free_list(vq_cache *c, size_t total) {
    if (total <= (size_t)c->cap_free) return VQ_OK;
    size_t cap = c->cap_free ? (size_t)c->cap_free : 64;
    while (cap < total) cap *= 2;
    uint8_t **nf = realloc(c->free_blocks, sizeof *nf * cap);
    if (!nf) return vq_fail(VQ_ERR_NOMEM, "out of memory growing the free list to %zu blocks", cap);
    c->free_blocks = nf;
    c->cap_free = (int)cap;
    return VQ_OK;
}

/* Makes sure s can hold `blocks` blocks without growing its arrays during
 * the append. */
static vq_status stream_reserve(vq_stream *s, int64_t blocks) {
    if (blocks <= s->cap_blocks) return VQ_OK;
    int64_t cap = s->cap_blocks ? s->cap_blocks : 8;
    while (cap < blocks) cap *= 2;
    uint8_t **nb = realloc(s->blocks, sizeof *nb * (size_t)cap);
    if (nb) s->blocks = nb;
    int32_t *nn = nb ? realloc(s->blk_n, sizeof *nn * (size_t)cap) : NULL;
    if (nn) s->blk_n = nn;
    uint8_t *nc = nn ? realloc(s->blk_class, (size_t)cap) : NULL;
    if (nc) s->blk_class = nc;
    if (!nc) return vq_fail(VQ_ERR_NOMEM, "out of memory growing a block list to %lld blocks", (long long)cap);
    s->cap_blocks = (int)cap;
    return VQ_OK;
}

/* Makes sure s can score `slots` slots. */
static vq_status score_reserve(vq_cache *c, vq_stream *s, int64_t slots) {
    if (slots <= s->score_cap) return VQ_OK;
    int64_t cap = s->score_cap ? s->score_cap : 64;
    while (cap < slots) cap *= 2;
    float *ns = realloc(s->score, sizeof *ns * (size_t)cap);
    if (!ns) return vq_fail(VQ_ERR_NOMEM, "out of memory for the eviction scores of %lld slots", (long long)cap);
    c->score_bytes += sizeof *ns * (size_t)(cap - s->score_cap);
    s->score = ns;
    s->score_cap = cap;
    return VQ_OK;
}

/* Slots the stream's last block can still take from a flush: a full-size
 * block filled up to a group boundary continues; anything else (a block
 * thinned out by eviction in a key-grouped layout, a smaller class) does
 * not. */
static int last_block_room(const vq_cache *c, const vq_stream *s) {
    if (!s->n_blocks) return 0;
    int b = s->n_blocks - 1, n = s->blk_n[b];
    if (s->blk_class[b] != 0 || n % c->flush_tokens) return 0;
    return c->block_tokens - n;
}

static vq_status window_alloc(vq_cache *c, vq_stream *s) {
    if (s->win_k) return VQ_OK;
    size_t rows = (size_t)c->win_cap * c->cfg.head_dim;
    s->win_k = vq_aligned_alloc(rows * 2);
    s->win_v = vq_aligned_alloc(rows * 2);
    s->win_pos = vq_aligned_alloc(sizeof(int32_t) * (size_t)c->win_cap);
    if (!s->win_k || !s->win_v || !s->win_pos) {
        vq_aligned_free(s->win_k);
        vq_aligned_free(s->win_v);
        vq_aligned_free(s->win_pos);
        s->win_k = s->win_v = NULL;
        s->win_pos = NULL;
        return vq_fail(VQ_ERR_NOMEM, "out of memory allocating an fp16 window of %d tokens", c->win_cap);
    }
    c->window_bytes += round64(rows * 2) * 2 + round64(sizeof(int32_t) * (size_t)c->win_cap);
    return VQ_OK;
}

/* Moves the oldest flush_tokens tokens of the window into blocks. The caller
 * has put enough blocks on the free list. */
static void flush_window(vq_cache *c, vq_stream *s) {
    int F = c->flush_tokens, d = c->cfg.head_dim, bt = c->block_tokens;
    if (last_block_room(c, s) < F) {
        s->blocks[s->n_blocks] = c->free_blocks[--c->n_free];
        s->blk_n[s->n_blocks] = 0;
        s->blk_class[s->n_blocks] = 0;
        s->n_blocks++;
    }
    int b = s->n_blocks - 1, t0 = s->blk_n[b];
    uint8_t *blk = s->blocks[b];
    float *x = c->append_scratch; /* [F][d] */
    vq_f16_to_f32_array(s->win_k, x, (size_t)F * d);
    c->spec.k.method->encode(&c->spec.k, x, (size_t)d, F, blk, bt, t0);
    vq_f16_to_f32_array(s->win_v, x, (size_t)F * d);
    c->spec.v.method->encode(&c->spec.v, x, (size_t)d, F, blk + c->k_bytes, bt, t0);
    memcpy(vq_blk_pos(c, s, b) + t0, s->win_pos, sizeof(int32_t) * (size_t)F);
    s->blk_n[b] += F;
    s->n_quant += F;
    int rest = s->win_n - F;
    memmove(s->win_k, s->win_k + (size_t)F * d, sizeof(uint16_t) * (size_t)rest * d);
    memmove(s->win_v, s->win_v + (size_t)F * d, sizeof(uint16_t) * (size_t)rest * d);
    memmove(s->win_pos, s->win_pos + F, sizeof(int32_t) * (size_t)rest);
    s->win_n = rest;
}

/* Checks that every value of an append converts to a finite fp16 number
 * (the window and the quantizers store fp16), before anything changes. */
static vq_status check_values(const void *x, vq_dtype dt, int n_tokens, int H, int d, const char *what) {
    size_t n = (size_t)n_tokens * H * d;
    for (size_t i = 0; i < n; i++) {
        float f;
        bool ok;
        if (dt == VQ_F16) {
            uint16_t h = ((const uint16_t *)x)[i];
            ok = (h & 0x7c00) != 0x7c00;
            f = vq_f16_to_f32(h);
        } else {
            f = dt == VQ_F32 ? ((const float *)x)[i] : vq_bf16_to_f32(((const uint16_t *)x)[i]);
            ok = f > -65520.0f && f < 65520.0f; /* what rounds to a finite fp16 */
        }
        if (!ok) {
            size_t row = i / (size_t)d;
            return vq_fail(VQ_ERR_ARG, "%s value %g at token %zu, head %zu, dim %zu is not finite in fp16 (allowed |x| < 65520)",
                           what, (double)f, row / (size_t)H, row % (size_t)H, i % (size_t)d);
        }
    }
    return VQ_OK;
}

static void row_to_f16(const void *src, vq_dtype dt, int d, uint16_t *dst, float *tmp) {
    if (dt == VQ_F16) {
        memcpy(dst, src, (size_t)d * 2);
    } else if (dt == VQ_F32) {
        vq_f32_to_f16_array(src, dst, (size_t)d);
    } else {
        vq_bf16_to_f32_array(src, tmp, (size_t)d);
        vq_f32_to_f16_array(tmp, dst, (size_t)d);
    }
}

vq_status vq_cache_check_room(const vq_cache *c, int layer, int64_t held, int n_tokens) {
    if (c->cfg.capacity && held + n_tokens > c->cfg.capacity)
        return vq_fail(VQ_ERR_ARG, "appending %d tokens to layer %d would hold %lld tokens, over the capacity %lld",
                       n_tokens, layer, (long long)(held + n_tokens), (long long)c->cfg.capacity);
    return VQ_OK;
}

vq_status vq_cache_append(vq_cache *c, int layer, int n_tokens, const void *k, const void *v,
                          vq_dtype dtype, const int32_t *positions) {
    if (!c) return vq_fail(VQ_ERR_ARG, "vq_cache_append: cache is NULL");
    if (layer < 0 || layer >= c->cfg.n_layers)
        return vq_fail(VQ_ERR_ARG, "layer %d is out of range [0, %d)", layer, c->cfg.n_layers);
    if (n_tokens < 0) return vq_fail(VQ_ERR_ARG, "n_tokens=%d is negative", n_tokens);
    if (n_tokens == 0) return VQ_OK;
    if (!k || !v) return vq_fail(VQ_ERR_ARG, "vq_cache_append: k or v is NULL");
    if (dtype != VQ_F32 && dtype != VQ_F16 && dtype != VQ_BF16)
        return vq_fail(VQ_ERR_ARG, "dtype %d is not one of VQ_F32, VQ_F16, VQ_BF16", (int)dtype);
    int32_t last = c->last_pos[layer];
    if (positions) {
        for (int i = 0; i < n_tokens; i++) {
            if (positions[i] <= (i ? positions[i - 1] : last))
                return vq_fail(VQ_ERR_ARG, "position %d of token %d is not greater than the previous position %d",
                               positions[i], i, i ? positions[i - 1] : last);
        }
    } else if ((int64_t)last + n_tokens > INT32_MAX) {
        return vq_fail(VQ_ERR_ARG, "positions would pass 2^31 - 1");
    }
    if (c->cuda) {
        vq_status cst = vq_cache_check_room(c, layer, vq_cache_tokens(c, layer), n_tokens);
        return cst ? cst : vq_cuda_append(c, layer, n_tokens, k, v, dtype, positions);
    }
    int H = c->cfg.n_heads_kv, d = c->cfg.head_dim;
    size_t es = vq_dtype_size(dtype), row = (size_t)d * es;
    /* scratch: F rows for flushing, plus one row for conversions */
    size_t need = (size_t)(c->flush_tokens + 1) * d;
    if (c->append_scratch_floats < need) {
        float *ns = vq_aligned_alloc(need * sizeof(float));
        if (!ns) return vq_fail(VQ_ERR_NOMEM, "out of memory for append scratch");
        vq_aligned_free(c->append_scratch);
        c->append_scratch = ns;
        c->append_scratch_floats = need;
    }
    float *tmp = c->append_scratch + (size_t)c->flush_tokens * d;
    /* Check everything first: a rejected append changes nothing. */
    vq_status st = check_values(k, dtype, n_tokens, H, d, "key");
    if (!st) st = check_values(v, dtype, n_tokens, H, d, "value");
    if (st) return st;
    /* With a policy, make room first: the budget holds during the
     * attention that follows too. Eviction checks the capacity against
     * what it would keep before it evicts anything. */
    st = c->evict ? vq_cache_evict_for(c, layer, n_tokens) : vq_cache_check_room(c, layer, vq_cache_tokens(c, layer), n_tokens);
    if (st) return st;
    size_t new_blocks = 0;
    for (int h = 0; h < H; h++) {
        vq_stream *s = vq_stream_at(c, layer, h);
        /* the window flushes flush_tokens each time it reaches win_cap */
        int64_t w = (int64_t)s->win_n + n_tokens, flushes = 0;
        if (w >= c->win_cap) flushes = (w - c->win_cap) / c->flush_tokens + 1;
        int64_t flushed = flushes * c->flush_tokens, room = last_block_room(c, s);
        int64_t more = flushed > room ? (flushed - room + c->block_tokens - 1) / c->block_tokens : 0;
        st = window_alloc(c, s);
        if (!st) st = stream_reserve(s, s->n_blocks + more);
        if (!st && c->evict) st = score_reserve(c, s, s->n_quant + s->win_n + n_tokens);
        if (st) return st;
        new_blocks += (size_t)more;
    }
    size_t missing = (size_t)c->n_free < new_blocks ? new_blocks - (size_t)c->n_free : 0;
    st = reserve_free_list(c, c->cls[0].allocated + missing);
    if (st) return st;
    while ((size_t)c->n_free < new_blocks) {
        uint8_t *b = vq_block_alloc(c, 0);
        if (!b) return vq_fail(VQ_ERR_NOMEM, "out of memory allocating a %zu-byte block", c->block_bytes);
        give_block(c, b);
    }
    for (int i = 0; i < n_tokens; i++) {
        int32_t pos = positions ? positions[i] : last + 1 + i;
        for (int h = 0; h < H; h++) {
            vq_stream *s = vq_stream_at(c, layer, h);
            size_t off = ((size_t)i * H + h) * row;
            uint16_t *kw = s->win_k + (size_t)s->win_n * d;
            row_to_f16((const char *)k + off, dtype, d, kw, tmp);
            row_to_f16((const char *)v + off, dtype, d, s->win_v + (size_t)s->win_n * d, tmp);
            if (c->evict) {
                /* the policy scores the key as stored (rounded to fp16) */
                vq_f16_to_f32_array(kw, tmp, (size_t)d);
                c->evict->p.policy->init(&c->evict->p, c->evict, layer, h, tmp, (size_t)d, &pos, 1, d,
                                         s->score + s->n_quant + s->win_n);
            }
            s->win_pos[s->win_n++] = pos;
            if (s->win_n >= c->win_cap) flush_window(c, s);
        }
    }
    c->last_pos[layer] = positions ? positions[n_tokens - 1] : last + n_tokens;
    c->seen[layer] += n_tokens;
    size_t now = vq_cache_bytes(c);
    if (now > c->peak_bytes) c->peak_bytes = now;
    return VQ_OK;
}

int64_t vq_cache_head_tokens(const vq_cache *c, int layer, int kv_head) {
    if (!c || layer < 0 || layer >= c->cfg.n_layers || kv_head < 0 || kv_head >= c->cfg.n_heads_kv) return 0;
    const vq_stream *s = vq_stream_at(c, layer, kv_head);
    return s->n_quant + s->win_n;
}

int64_t vq_cache_tokens(const vq_cache *c, int layer) {
    if (!c || layer < 0 || layer >= c->cfg.n_layers) return 0;
    int64_t mx = 0;
    for (int h = 0; h < c->cfg.n_heads_kv; h++) {
        int64_t n = vq_cache_head_tokens(c, layer, h);
        mx = n > mx ? n : mx;
    }
    return mx;
}

int64_t vq_cache_tokens_seen(const vq_cache *c, int layer) {
    if (!c || layer < 0 || layer >= c->cfg.n_layers) return 0;
    return c->seen[layer];
}

size_t vq_cache_bytes(const vq_cache *c) {
    if (!c) return 0;
    size_t b = c->window_bytes + c->score_bytes;
    for (int k = 0; k < c->n_classes; k++) b += c->cls[k].allocated * c->cls[k].bytes;
    return b;
}

size_t vq_cache_peak_bytes(const vq_cache *c) {
    if (!c) return 0;
    size_t now = vq_cache_bytes(c);
    return now > c->peak_bytes ? now : c->peak_bytes;
}

size_t vq_cache_bytes_fp16_equiv(const vq_cache *c) {
    if (!c) return 0;
    size_t tokens = 0;
    for (int l = 0; l < c->cfg.n_layers; l++)
        for (int h = 0; h < c->cfg.n_heads_kv; h++) tokens += (size_t)vq_cache_head_tokens(c, l, h);
    return tokens * (size_t)c->cfg.head_dim * 2 * 2;
}

/* Returns the blocks past `keep_blocks` of a stream: full-size ones to the
 * free list, smaller classes to the system. */
static void stream_drop_blocks(vq_cache *c, vq_stream *s, int keep_blocks) {
    while (s->n_blocks > keep_blocks) {
        s->n_blocks--;
        if (s->blk_class[s->n_blocks] == 0) give_block(c, s->blocks[s->n_blocks]);
        else vq_block_release(c, s->blocks[s->n_blocks], s->blk_class[s->n_blocks]);
    }
}

void vq_cache_reset(vq_cache *c) {
    if (!c) return;
    size_t n_streams = (size_t)c->cfg.n_layers * c->cfg.n_heads_kv;
    for (size_t i = 0; i < n_streams; i++) {
        vq_stream *s = &c->streams[i];
        stream_drop_blocks(c, s, 0);
        s->n_quant = 0;
        s->win_n = 0;
    }
    for (int l = 0; l < c->cfg.n_layers; l++) {
        c->last_pos[l] = -1;
        c->seen[l] = 0;
    }
    c->peak_bytes = vq_cache_bytes(c);
}

vq_status vq_cache_truncate(vq_cache *c, int64_t n_tokens) {
    if (!c) return vq_fail(VQ_ERR_ARG, "vq_cache_truncate: cache is NULL");
    if (c->evict)
        return vq_fail(VQ_ERR_STATE, "vq_cache_truncate: the cache evicts tokens (%s); its slots are not a prefix of "
                                     "the sequence, so only vq_cache_reset applies", c->spec_text);
    /* check every layer first, then cut */
    for (int l = 0; l < c->cfg.n_layers; l++) {
        const vq_stream *s = vq_stream_at(c, l, 0);
        int64_t held = s->n_quant + s->win_n;
        if (n_tokens < 0 || n_tokens > held)
            return vq_fail(VQ_ERR_ARG, "truncate to %lld tokens: layer %d holds %lld (allowed 0..%lld)",
                           (long long)n_tokens, l, (long long)held, (long long)held);
        if (n_tokens < s->n_quant && n_tokens % c->flush_tokens)
            return vq_fail(VQ_ERR_ARG, "truncate to %lld tokens would split a quantized group of %d tokens in layer %d "
                           "(allowed: a multiple of %d below %lld, or any count in [%lld, %lld])",
                           (long long)n_tokens, c->flush_tokens, l, c->flush_tokens, (long long)s->n_quant,
                           (long long)s->n_quant, (long long)held);
    }
    if (c->cuda) return vq_cuda_truncate(c, n_tokens);
    int bt = c->block_tokens;
    for (int l = 0; l < c->cfg.n_layers; l++) {
        for (int h = 0; h < c->cfg.n_heads_kv; h++) {
            vq_stream *s = vq_stream_at(c, l, h);
            if (n_tokens >= s->n_quant) {
                s->win_n = (int)(n_tokens - s->n_quant);
            } else {
                /* without eviction every block but the last is full */
                s->win_n = 0;
                s->n_quant = n_tokens;
                int keep = (int)((n_tokens + bt - 1) / bt);
                stream_drop_blocks(c, s, keep);
                if (keep) s->blk_n[keep - 1] = (int)(n_tokens - (int64_t)(keep - 1) * bt);
            }
        }
        const vq_stream *s = vq_stream_at(c, l, 0);
        if (s->win_n) c->last_pos[l] = s->win_pos[s->win_n - 1];
        else if (s->n_blocks) c->last_pos[l] = vq_blk_pos(c, s, s->n_blocks - 1)[s->blk_n[s->n_blocks - 1] - 1];
        else c->last_pos[l] = -1;
        c->seen[l] = n_tokens;
    }
    return VQ_OK;
}

const char *vq_cache_spec(const vq_cache *c) { return c ? c->spec_text : ""; }

double vq_cache_bits_per_elem(const vq_cache *c) {
    if (!c) return 0;
    return 0.5 * (c->spec.k.method->bits_per_elem(&c->spec.k) + c->spec.v.method->bits_per_elem(&c->spec.v));
}

vq_status vq_cache_decode(const vq_cache *c, int layer, int kv_head, float *k, float *v, int32_t *positions) {
    if (!c) return vq_fail(VQ_ERR_ARG, "vq_cache_decode: cache is NULL");
    if (layer < 0 || layer >= c->cfg.n_layers)
        return vq_fail(VQ_ERR_ARG, "layer %d is out of range [0, %d)", layer, c->cfg.n_layers);
    if (kv_head < 0 || kv_head >= c->cfg.n_heads_kv)
        return vq_fail(VQ_ERR_ARG, "kv_head %d is out of range [0, %d)", kv_head, c->cfg.n_heads_kv);
    if (c->cuda) { /* through a host copy: a test and reference path */
        vq_cache *h = NULL;
        vq_status st = vq_cache_to_host(c, &h);
        if (!st) st = vq_cache_decode(h, layer, kv_head, k, v, positions);
        vq_cache_free(h);
        return st;
    }
    const vq_stream *s = vq_stream_at(c, layer, kv_head);
    int d = c->cfg.head_dim;
    int64_t t0 = 0;
    for (int b = 0; b < s->n_blocks; b++) {
        int n = s->blk_n[b], bt = vq_blk_cap(c, s, b);
        const uint8_t *blk = s->blocks[b];
        if (k) c->spec.k.method->decode(&c->spec.k, blk, bt, 0, n, k + t0 * d);
        if (v) c->spec.v.method->decode(&c->spec.v, vq_blk_v(c, s, b), bt, 0, n, v + t0 * d);
        if (positions) memcpy(positions + t0, vq_blk_pos(c, s, b), sizeof(int32_t) * (size_t)n);
        t0 += n;
    }
    if (k) vq_f16_to_f32_array(s->win_k, k + t0 * d, (size_t)s->win_n * d);
    if (v) vq_f16_to_f32_array(s->win_v, v + t0 * d, (size_t)s->win_n * d);
    if (positions) memcpy(positions + t0, s->win_pos, sizeof(int32_t) * (size_t)s->win_n);
    return VQ_OK;
}

int32_t vq_cache_last_pos(const vq_cache *c, int layer) {
    if (!c || layer < 0 || layer >= c->cfg.n_layers) return -1;
    return c->last_pos[layer];
}
