/* vq_cache_to_host: a CPU cache holding the same bytes as a CPU or CUDA
 * cache. Blocks keep their layout on both sides, so this is a plain copy;
 * the tests run the CPU attention on the copy of a GPU cache. */
#include "vq_internal.h"

#include <stdlib.h>
#include <string.h>

static size_t round64(size_t x) { return (x + 63) & ~(size_t)63; }

/* Copies bytes from the source cache's memory: host memory, or device
 * memory for a CUDA cache. */
static vq_status copy_from(const vq_cache *src, void *dst, const void *from, size_t bytes) {
    if (!bytes) return VQ_OK;
    if (src->cuda) return vq_cuda_copy_to_host(dst, from, bytes);
    memcpy(dst, from, bytes);
    return VQ_OK;
}

static vq_status copy_stream(const vq_cache *src, int layer, int head, vq_cache *dst) {
    size_t idx = (size_t)layer * src->cfg.n_heads_kv + head;
    const vq_stream *s = &src->streams[idx];
    vq_stream *o = &dst->streams[idx];
    int d = src->cfg.head_dim, bt = src->block_tokens;
    vq_cuda_stream_view view;
    if (src->cuda) {
        vq_cuda_stream_get(src, layer, head, &view);
    } else {
        view.blocks = s->blocks;
        view.win_k = s->win_k;
        view.win_v = s->win_v;
        view.win_pos = s->win_pos;
    }
    int nb = (int)((s->n_quant + bt - 1) / bt);
    if (nb) {
        o->blocks = calloc((size_t)nb, sizeof *o->blocks);
        o->blk_n = calloc((size_t)nb, sizeof *o->blk_n);
        o->blk_class = calloc((size_t)nb, 1);
        if (!o->blocks || !o->blk_n || !o->blk_class)
            return vq_fail(VQ_ERR_NOMEM, "out of memory copying a cache (%d blocks)", nb);
        o->cap_blocks = nb;
    }
    /* A CUDA cache has no eviction: every block but the last is full. */
    for (int b = 0; b < nb; b++) {
        o->blocks[b] = vq_block_alloc(dst, 0);
        if (!o->blocks[b]) return vq_fail(VQ_ERR_NOMEM, "out of memory copying a %zu-byte block", dst->block_bytes);
        o->n_blocks = b + 1;
        o->blk_n[b] = (int32_t)(s->n_quant - (int64_t)b * bt < bt ? s->n_quant - (int64_t)b * bt : bt);
        vq_status st = copy_from(src, o->blocks[b], view.blocks[b], dst->block_bytes);
        if (st) return st;
    }
    o->n_quant = s->n_quant;
    size_t rows = (size_t)dst->win_cap * d;
    o->win_k = vq_aligned_alloc(rows * 2);
    o->win_v = vq_aligned_alloc(rows * 2);
    o->win_pos = vq_aligned_alloc(sizeof(int32_t) * (size_t)dst->win_cap);
    if (!o->win_k || !o->win_v || !o->win_pos)
        return vq_fail(VQ_ERR_NOMEM, "out of memory copying an fp16 window of %d tokens", dst->win_cap);
    dst->window_bytes += round64(rows * 2) * 2 + round64(sizeof(int32_t) * (size_t)dst->win_cap);
    size_t wn = (size_t)s->win_n;
    vq_status st = copy_from(src, o->win_k, view.win_k, wn * d * 2);
    if (!st) st = copy_from(src, o->win_v, view.win_v, wn * d * 2);
    if (!st) st = copy_from(src, o->win_pos, view.win_pos, wn * sizeof(int32_t));
    o->win_n = s->win_n;
    return st;
}

vq_status vq_cache_to_host(const vq_cache *c, vq_cache **out) {
    if (!out) return vq_fail(VQ_ERR_ARG, "vq_cache_to_host: out is NULL");
    *out = NULL;
    if (!c) return vq_fail(VQ_ERR_ARG, "vq_cache_to_host: cache is NULL");
    if (c->evict)
        return vq_fail(VQ_ERR_UNSUPPORTED, "vq_cache_to_host: a cache with eviction ('%s') cannot be copied",
                       c->spec_text);
    vq_cache_config cfg = c->cfg;
    cfg.kv_spec = c->spec_text;
    cfg.device = VQ_DEVICE_CPU;
    cfg.block_tokens = c->block_tokens;
    vq_cache *h = NULL;
    vq_status st = vq_cache_create(&cfg, &h);
    if (st) return st;
    if (c->cuda && (st = vq_cuda_synchronize()) != VQ_OK) {
        vq_cache_free(h);
        return st;
    }
    size_t n_streams = (size_t)cfg.n_layers * cfg.n_heads_kv;
    for (size_t i = 0; i < n_streams && !st; i++)
        st = copy_stream(c, (int)(i / cfg.n_heads_kv), (int)(i % cfg.n_heads_kv), h);
    /* the free list must be able to take back every block (cache.c) */
    if (!st && h->cls[0].allocated) {
        h->free_blocks = malloc(sizeof *h->free_blocks * h->cls[0].allocated);
        if (!h->free_blocks) st = vq_fail(VQ_ERR_NOMEM, "out of memory copying a cache's free list");
        else h->cap_free = (int)h->cls[0].allocated;
    }
    if (st) {
        vq_cache_free(h);
        return st;
    }
    memcpy(h->last_pos, c->last_pos, sizeof *h->last_pos * (size_t)cfg.n_layers);
    memcpy(h->seen, c->seen, sizeof *h->seen * (size_t)cfg.n_layers);
    *out = h;
    return VQ_OK;
}
