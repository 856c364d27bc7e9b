/* CUDA caches: device memory for blocks, block tables and the fp16 window,
 * and the host side of append and truncate. The cache's streams keep their
 * token counts on the host; the data stays on the device. */
#include "cuda_internal.h"

extern "C" {
#include "core/rotate.h"
}

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* Blocks a new chunk holds at least: few cudaMalloc calls while a cache
 * grows token by token, and at most this many blocks of slack. */
#define CHUNK_MIN_BLOCKS 64

vq_status vq_cu_fail(cudaError_t e, const char *what) {
    return vq_fail(VQ_ERR_STATE, "CUDA error in %s: %s (%s)", what, cudaGetErrorName(e), cudaGetErrorString(e));
}

extern "C" int vq_cuda_device_count(void) {
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess) {
        cudaGetLastError(); /* no driver or no device: not an error to keep */
        return 0;
    }
    return n;
}

extern "C" vq_status vq_cuda_synchronize(void) {
    cudaError_t e = cudaDeviceSynchronize();
    if (e == cudaSuccess) e = cudaGetLastError();
    return e == cudaSuccess ? VQ_OK : vq_cu_fail(e, "queued GPU work");
}

extern "C" vq_status vq_cuda_copy_to_host(void *dst, const void *src, size_t bytes) {
    cudaError_t e = cudaMemcpy(dst, src, bytes, cudaMemcpyDeviceToHost);
    return e == cudaSuccess ? VQ_OK : vq_cu_fail(e, "a device-to-host copy");
}

vq_status vq_cu_staging(struct vq_cuda_cache *g, size_t bytes) {
    if (g->staging_bytes >= bytes) return VQ_OK;
    size_t cap = g->staging_bytes ? g->staging_bytes : 4096;
    while (cap < bytes) cap *= 2;
    cudaFree(g->staging); /* stream-ordered after earlier uses on the default stream */
    g->staging = NULL;
    g->staging_bytes = 0;
    cudaError_t e = cudaMalloc(&g->staging, cap);
    if (e != cudaSuccess) return vq_cu_fail(e, "allocating a staging buffer");
    g->staging_bytes = cap;
    return VQ_OK;
}

/* The cell of x in a tq-mse cell table (cuda_internal.h), with the
 * kernel's arithmetic: one correctly rounded x * scale + 1.5 * 2^23, less
 * 1.5 * 2^23 (the integer cell). */
static int tq_cell(float x, float scale) {
    const float magic = 12582912.0f;
    return (int)(fmaf(x, scale, magic) - magic);
}

/* The smallest float y with RN(y * scale) > b (the CPU's rotation scales
 * by `scale`, then counts the boundaries b below). y -> RN(y * scale) never
 * decreases as y grows (scale > 0), so for every y but a NaN, RN(y * scale)
 * > b exactly when y >= the returned value; the two loops step one ulp at a
 * time from b / scale, which is within a few ulps of it. */
static float tq_threshold(float b, float scale) {
    float y = b / scale;
    while (y * scale > b) y = nextafterf(y, -INFINITY);
    while (!(y * scale > b)) y = nextafterf(y, INFINITY);
    return y;
}

/* The codebook's thresholds at head dim d, then the smallest power of two
 * that puts no two of them in one cell, and the cells from the lowest
 * threshold's to the highest's; an error if that needs more than
 * VQ_CU_TQ_CELLS cells (Lloyd-Max codebooks at head dims 64..256 and
 * 1..4 bits need 1..21). */
static vq_status tq_cells(const vq_codebook *cb, int d, vq_cu_method *m) {
    const int nb = cb->n - 1;
    const float rot_scale = 1.0f / sqrtf((float)d); /* as vq_rotate computes it */
    for (int i = 0; i < nb; i++) m->threshold[i] = tq_threshold(cb->boundary[i], rot_scale);
    for (int k = -8; k <= 16; k++) {
        const float scale = ldexpf(1.0f, k);
        int c[VQ_CODEBOOK_MAX], lo = 0, hi = 0, apart = 1;
        for (int i = 0; i < nb; i++) {
            c[i] = tq_cell(m->threshold[i], scale);
            if (i == 0 || c[i] < lo) lo = c[i];
            if (i == 0 || c[i] > hi) hi = c[i];
            for (int j = 0; j < i; j++) apart &= c[j] != c[i];
        }
        if (!apart) continue;
        if (hi - lo + 1 > VQ_CU_TQ_CELLS) break;
        m->cell_scale = scale;
        m->cell_lo = lo;
        m->n_cells = hi - lo + 1;
        return VQ_OK;
    }
    return vq_fail(VQ_ERR_UNSUPPORTED, "tq-mse: %d-bit codebook boundaries too close for the CUDA encoder's table of %d "
                   "cells", cb->bits, VQ_CU_TQ_CELLS);
}

/* The kernels' view of one method instance, or an error naming what is
 * not supported on the GPU. */
static vq_status method_for_gpu(const vq_mparams *p, int d, vq_cu_method *m) {
    memset(m, 0, sizeof *m);
    m->is_value = p->is_value;
    const char *name = p->method->name;
    if (p->method == &vq_method_fp16) {
        m->kind = VQ_CU_FP16;
        m->code_bytes = 2 * d;
        return VQ_OK;
    }
    if (p->method == &vq_method_kivi) {
        m->kind = VQ_CU_KIVI;
        m->bits = p->bits;
        m->group = p->group;
        m->code_bytes = d * p->bits / 8;
        return VQ_OK;
    }
    if (p->method == &vq_method_tq_mse) {
        if (p->hi_channels || p->bits < 1 || p->bits > 4)
            return vq_fail(VQ_ERR_UNSUPPORTED, "tq-mse: bits=%g has no CUDA kernels (allowed on CUDA: 1, 2, 3, 4)",
                           p->rate);
        if (!p->rot->hadamard)
            return vq_fail(VQ_ERR_UNSUPPORTED, "tq-mse: head dim %d has no CUDA kernels (a power of two)", d);
        m->kind = VQ_CU_TQ_MSE;
        m->bits = p->bits;
        m->code_bytes = d * p->bits / 8;
        const vq_codebook *cb = p->cb[0];
        for (int i = 0; i < cb->n; i++) m->centroid[i] = cb->centroid[i];
        return tq_cells(cb, d, m);
    }
    return vq_fail(VQ_ERR_UNSUPPORTED, "method '%s' has no CUDA kernels (CUDA caches support fp16, kivi, tq-mse)", name);
}

extern "C" vq_status vq_cuda_cache_init(vq_cache *c) {
    const vq_cache_config *cfg = &c->cfg;
    if (cfg->capacity <= 0)
        return vq_fail(VQ_ERR_ARG, "capacity=%lld: a CUDA cache needs a capacity > 0 (its device memory pool is sized "
                       "from it)", (long long)cfg->capacity);
    int d = cfg->head_dim;
    if (d % 64 || d > VQ_CU_MAX_DIM)
        return vq_fail(VQ_ERR_UNSUPPORTED, "head_dim=%d has no CUDA kernels (allowed: 64, 128, 192, 256)", d);
    int n_dev = vq_cuda_device_count();
    if (cfg->device_index < 0 || cfg->device_index >= n_dev)
        return vq_fail(n_dev ? VQ_ERR_ARG : VQ_ERR_UNSUPPORTED, "device_index=%d is out of range [0, %d) (CUDA devices found: %d)",
                       cfg->device_index, n_dev, n_dev);
    vq_cu_method mk, mv;
    vq_status st = method_for_gpu(&c->spec.k, d, &mk);
    if (!st) st = method_for_gpu(&c->spec.v, d, &mv);
    if (st) return st;
    struct vq_cuda_cache *g = (struct vq_cuda_cache *)calloc(1, sizeof *g);
    if (!g) return vq_fail(VQ_ERR_NOMEM, "out of memory creating a CUDA cache");
    c->cuda = g; /* vq_cache_free releases whatever is set below */
    g->dev = cfg->device_index;
    g->mk = mk;
    g->mv = mv;
    cudaError_t e = cudaSetDevice(g->dev);
    if (e != cudaSuccess) return vq_cu_fail(e, "selecting the device");
    cudaDeviceGetAttribute(&g->n_sms, cudaDevAttrMultiProcessorCount, g->dev);
    size_t n_streams = (size_t)cfg->n_layers * cfg->n_heads_kv;
    g->max_blocks = (int)((cfg->capacity + c->block_tokens - 1) / c->block_tokens);
    size_t table = n_streams * (size_t)g->max_blocks;
    g->table_host = (uint8_t **)calloc(table, sizeof *g->table_host);
    g->assigned = (int *)calloc(n_streams, sizeof *g->assigned);
    g->win_sel = (unsigned char *)calloc((size_t)cfg->n_layers, 1);
    if (!g->table_host || !g->assigned || !g->win_sel) return vq_fail(VQ_ERR_NOMEM, "out of memory creating a CUDA cache");
    e = cudaMalloc(&g->table_dev, table * sizeof(uint8_t *));
    size_t win_rows = n_streams * (size_t)c->win_cap;
    for (int i = 0; i < 2 && e == cudaSuccess; i++) {
        e = cudaMalloc(&g->win_k[i], win_rows * d * 2);
        if (e == cudaSuccess) e = cudaMalloc(&g->win_v[i], win_rows * d * 2);
        if (e == cudaSuccess) e = cudaMalloc(&g->win_pos[i], win_rows * sizeof(int32_t));
    }
    if (e == cudaSuccess && (mk.kind == VQ_CU_TQ_MSE || mv.kind == VQ_CU_TQ_MSE)) {
        e = cudaMalloc(&g->signs, 2 * (size_t)d * sizeof(float));
        if (e == cudaSuccess && mk.kind == VQ_CU_TQ_MSE)
            e = cudaMemcpy(g->signs, c->spec.k.rot->signs, d * sizeof(float), cudaMemcpyHostToDevice);
        if (e == cudaSuccess && mv.kind == VQ_CU_TQ_MSE)
            e = cudaMemcpy(g->signs + d, c->spec.v.rot->signs, d * sizeof(float), cudaMemcpyHostToDevice);
        g->mk.signs = g->signs;
        g->mv.signs = g->signs + d;
    }
    if (e != cudaSuccess) return vq_cu_fail(e, "allocating a CUDA cache's tables and window");
    if (mk.kind == VQ_CU_TQ_MSE || mv.kind == VQ_CU_TQ_MSE) {
        e = vq_cu_append_init();
        if (e != cudaSuccess) return vq_cu_fail(e, "setting the append kernel's attributes");
    }
    /* both window buffers count: they are real device memory */
    c->window_bytes = 2 * win_rows * ((size_t)d * 4 + sizeof(int32_t));
    return VQ_OK;
}

extern "C" void vq_cuda_cache_free(vq_cache *c) {
    struct vq_cuda_cache *g = c->cuda;
    cudaSetDevice(g->dev);
    for (int i = 0; i < g->n_chunks; i++) cudaFree(g->chunks[i].base);
    for (int i = 0; i < 2; i++) {
        cudaFree(g->win_k[i]);
        cudaFree(g->win_v[i]);
        cudaFree(g->win_pos[i]);
    }
    cudaFree(g->table_dev);
    cudaFree(g->signs);
    cudaFree(g->staging);
    cudaFree(g->partials);
    free(g->chunks);
    free(g->table_host);
    free(g->assigned);
    free(g->win_sel);
    free(g);
    c->cuda = NULL;
}

/* Gives stream s blocks until it has `need`, carving them from chunks, and
 * uploads the new table entries. */
static vq_status assign_blocks(vq_cache *c, size_t s, int need) {
    struct vq_cuda_cache *g = c->cuda;
    int have = g->assigned[s];
    if (have >= need) return VQ_OK;
    uint8_t **row = g->table_host + s * g->max_blocks;
    for (int b = have; b < need; b++) {
        vq_cu_chunk *ch = g->n_chunks ? &g->chunks[g->n_chunks - 1] : NULL;
        if (!ch || ch->used == ch->blocks) {
            if (g->n_chunks == g->cap_chunks) {
                int cap = g->cap_chunks ? 2 * g->cap_chunks : 16;
                vq_cu_chunk *nc = (vq_cu_chunk *)realloc(g->chunks, sizeof *nc * cap);
                if (!nc) return vq_fail(VQ_ERR_NOMEM, "out of memory growing the chunk list");
                g->chunks = nc;
                g->cap_chunks = cap;
            }
            /* at least what this append still needs across the layer's heads */
            size_t want = (size_t)(need - b) * c->cfg.n_heads_kv;
            if (want < CHUNK_MIN_BLOCKS) want = CHUNK_MIN_BLOCKS;
            vq_cu_chunk nc = {NULL, want, 0};
            cudaError_t e = cudaMalloc(&nc.base, want * c->block_bytes);
            if (e != cudaSuccess)
                return vq_fail(VQ_ERR_NOMEM, "out of GPU memory allocating %zu blocks of %zu bytes (%s)", want,
                               c->block_bytes, cudaGetErrorString(e));
            g->chunks[g->n_chunks++] = nc;
            c->cls[0].allocated += want;
            ch = &g->chunks[g->n_chunks - 1];
        }
        row[b] = ch->base + ch->used++ * c->block_bytes;
    }
    g->assigned[s] = need;
    cudaError_t e = cudaMemcpyAsync(g->table_dev + s * g->max_blocks + have, row + have,
                                    sizeof(uint8_t *) * (size_t)(need - have), cudaMemcpyHostToDevice, 0);
    return e == cudaSuccess ? VQ_OK : vq_cu_fail(e, "uploading a block table");
}

extern "C" vq_status vq_cuda_append(vq_cache *c, int layer, int n_tokens, const void *k, const void *v,
                                    vq_dtype dtype, const int32_t *positions) {
    struct vq_cuda_cache *g = c->cuda;
    int H = c->cfg.n_heads_kv, F = c->flush_tokens, bt = c->block_tokens;
    cudaError_t e = cudaSetDevice(g->dev);
    if (e != cudaSuccess) return vq_cu_fail(e, "selecting the device");
    vq_stream *s0 = &c->streams[(size_t)layer * H];
    int64_t w = (int64_t)s0->win_n + n_tokens, flushes = 0;
    if (w >= c->win_cap) flushes = (w - c->win_cap) / F + 1;
    int64_t nq_after = s0->n_quant + flushes * F;
    int need = (int)((nq_after + bt - 1) / bt);
    for (int h = 0; h < H; h++) {
        vq_status st = assign_blocks(c, (size_t)layer * H + h, need);
        if (st) return st;
    }
    const int32_t *dpos = NULL;
    if (positions) {
        vq_status st = vq_cu_staging(g, sizeof(int32_t) * (size_t)n_tokens);
        if (st) return st;
        e = cudaMemcpyAsync(g->staging, positions, sizeof(int32_t) * (size_t)n_tokens, cudaMemcpyHostToDevice, 0);
        if (e != cudaSuccess) return vq_cu_fail(e, "uploading positions");
        dpos = (const int32_t *)g->staging;
    }
    int sel = g->win_sel[layer], nsel = flushes ? 1 - sel : sel;
    size_t woff = (size_t)layer * H * c->win_cap;
    int d = c->cfg.head_dim;
    vq_cu_append_args a;
    a.mk = g->mk;
    a.mv = g->mv;
    a.d = d;
    a.bt = bt;
    a.H = H;
    a.win_cap = c->win_cap;
    a.flush = F;
    a.k_bytes = c->k_bytes;
    a.v_bytes = c->v_bytes;
    a.table = g->table_dev + (size_t)layer * H * g->max_blocks;
    a.max_blocks = g->max_blocks;
    a.nq0 = (int)s0->n_quant;
    a.win_n = s0->win_n;
    a.n = n_tokens;
    a.flushes = (int)flushes;
    a.old_k = g->win_k[sel] + woff * d;
    a.old_v = g->win_v[sel] + woff * d;
    a.old_pos = g->win_pos[sel] + woff;
    a.new_k = g->win_k[nsel] + woff * d;
    a.new_v = g->win_v[nsel] + woff * d;
    a.new_pos = g->win_pos[nsel] + woff;
    a.k = k;
    a.v = v;
    a.dtype = (int)dtype;
    a.pos = dpos;
    a.last = c->last_pos[layer];
    a.n_sms = g->n_sms;
    e = vq_cu_launch_append(&a);
    if (e != cudaSuccess) return vq_cu_fail(e, "launching the append kernel");
    g->win_sel[layer] = (unsigned char)nsel;
    for (int h = 0; h < H; h++) {
        vq_stream *s = &c->streams[(size_t)layer * H + h];
        s->n_quant = nq_after;
        s->win_n = (int)(w - flushes * F);
    }
    c->last_pos[layer] = positions ? positions[n_tokens - 1] : c->last_pos[layer] + n_tokens;
    c->seen[layer] += n_tokens;
    return VQ_OK;
}

/* Reads the position of token t of a layer (head 0) from the device. */
static vq_status position_of(const vq_cache *c, int layer, int64_t t, int32_t *out) {
    const struct vq_cuda_cache *g = c->cuda;
    const vq_stream *s = &c->streams[(size_t)layer * c->cfg.n_heads_kv];
    const int32_t *src;
    if (t >= s->n_quant) {
        src = g->win_pos[g->win_sel[layer]] + (size_t)layer * c->cfg.n_heads_kv * c->win_cap + (t - s->n_quant);
    } else {
        const uint8_t *blk = g->table_host[(size_t)layer * c->cfg.n_heads_kv * g->max_blocks + t / c->block_tokens];
        src = (const int32_t *)(blk + c->k_bytes + c->v_bytes) + t % c->block_tokens;
    }
    return vq_cuda_copy_to_host(out, src, sizeof *out);
}

extern "C" vq_status vq_cuda_truncate(vq_cache *c, int64_t n_tokens) {
    cudaError_t e = cudaSetDevice(c->cuda->dev);
    if (e != cudaSuccess) return vq_cu_fail(e, "selecting the device");
    for (int l = 0; l < c->cfg.n_layers; l++) {
        for (int h = 0; h < c->cfg.n_heads_kv; h++) {
            vq_stream *s = &c->streams[(size_t)l * c->cfg.n_heads_kv + h];
            /* blocks stay assigned to their stream for reuse */
            if (n_tokens >= s->n_quant) {
                s->win_n = (int)(n_tokens - s->n_quant);
            } else {
                s->win_n = 0;
                s->n_quant = n_tokens;
            }
        }
        if (n_tokens == 0) {
            c->last_pos[l] = -1;
            continue;
        }
        vq_status st = position_of(c, l, n_tokens - 1, &c->last_pos[l]);
        if (st) return st;
    }
    return VQ_OK;
}

extern "C" void vq_cuda_stream_get(const vq_cache *c, int layer, int head, vq_cuda_stream_view *out) {
    const struct vq_cuda_cache *g = c->cuda;
    size_t s = (size_t)layer * c->cfg.n_heads_kv + head;
    int sel = g->win_sel[layer];
    out->blocks = g->table_host + s * g->max_blocks;
    out->win_k = g->win_k[sel] + s * c->win_cap * c->cfg.head_dim;
    out->win_v = g->win_v[sel] + s * c->win_cap * c->cfg.head_dim;
    out->win_pos = g->win_pos[sel] + s * c->win_cap;
}
