/* Eviction's storage side: dropping slots from a stream in place.
 *
 * Tokens are never decoded and re-encoded: a kept token's packed codes and
 * its per-token metadata move as bytes (vq_move_tokens, driven by each
 * method's token_layout), so what attention reads after an eviction is
 * bit for bit what it read before, minus the evicted slots.
 *
 * Two layouts, chosen at cache creation:
 *   - Per-token methods (token_group 1 for keys and values: fp16, tq-mse,
 *     tq-prod, rvq, qjl, polar, KIVI values with fp16/per-token keys): the
 *     kept tokens of all blocks slide to the front of the stream, and the
 *     blocks left empty at the end are freed. Memory follows the kept count
 *     to within one block.
 *   - A key-grouped method (KIVI keys: G tokens of a channel share a scale
 *     and a zero, so a token's codes cannot join another group): every
 *     block holds exactly one group (block_tokens = G). Kept tokens slide to
 *     the front of their own block; a block that now fits a smaller size
 *     class (multiples of 8 slots) moves into a fresh block of that class,
 *     codes, per-token metadata and the group's scales and zeros, and the
 *     old block is freed; an emptied block is freed with its group's
 *     metadata. Memory per group: ceil(kept / 8) * 8 slots of per-token
 *     bytes plus the group's metadata while any of its tokens is kept.
 * The fp16 window compacts the same way as per-token blocks. */
#include "vq_internal.h"

#include <string.h>

void vq_move_tokens(const vq_mparams *p, const uint8_t *src, int bt_src, int s0, uint8_t *dst, int bt_dst, int t0,
                    int n) {
    size_t rows[VQ_MAX_TOKEN_ARRAYS];
    int na = p->method->token_layout(p, rows);
    size_t off_src = 0, off_dst = 0;
    for (int a = 0; a < na; a++) {
        if (n > 0 && rows[a] > 0 && (src != dst || s0 != t0))
            memmove(dst + off_dst + (size_t)t0 * rows[a], src + off_src + (size_t)s0 * rows[a], (size_t)n * rows[a]);
        off_src += (size_t)bt_src * rows[a];
        off_dst += (size_t)bt_dst * rows[a];
    }
    int G = p->method->token_group(p);
    if (G > 1 && src != dst) {
        /* the group's metadata: what block_bytes counts past the token rows */
        size_t meta = p->method->block_bytes(p, G) - (off_src / (size_t)bt_src) * (size_t)G;
        memcpy(dst + off_dst, src + off_src, meta);
    }
}

/* Moves n tokens (keys, values, positions) between two blocks of the
 * stream's cache. */
static void move_slots(const vq_cache *c, uint8_t *src, int cls_src, int s0, uint8_t *dst, int cls_dst, int t0, int n) {
    const vq_block_class *a = &c->cls[cls_src], *b = &c->cls[cls_dst];
    vq_move_tokens(&c->spec.k, src, a->cap, s0, dst, b->cap, t0, n);
    vq_move_tokens(&c->spec.v, src + a->k_bytes, a->cap, s0, dst + b->k_bytes, b->cap, t0, n);
    int32_t *ps = (int32_t *)(src + a->k_bytes + a->v_bytes), *pd = (int32_t *)(dst + b->k_bytes + b->v_bytes);
    if (src != dst || s0 != t0) memmove(pd + t0, ps + s0, sizeof(int32_t) * (size_t)n);
}

/* The next run of kept slots of keep[0..n) at or after *i: moves *i to
 * its start and returns its length (0 when none is left). */
static int64_t next_run(const uint8_t *keep, int64_t n, int64_t *i) {
    while (*i < n && !keep[*i]) (*i)++;
    int64_t j = *i;
    while (j < n && keep[j]) j++;
    return j - *i;
}

/* Per-token layout: kept tokens slide over block boundaries. */
static void keep_dense(vq_cache *c, vq_stream *s, const uint8_t *keep) {
    int db = 0, dn = 0; /* destination block and slot */
    int64_t base = 0;
    for (int b = 0; b < s->n_blocks; b++) {
        int n = s->blk_n[b];
        int64_t i = 0, len;
        while ((len = next_run(keep + base, n, &i)) > 0) {
            int64_t done = 0;
            while (done < len) {
                int cap = vq_blk_cap(c, s, db);
                int take = (int)(len - done < cap - dn ? len - done : cap - dn);
                move_slots(c, s->blocks[b], s->blk_class[b], (int)(i + done), s->blocks[db], s->blk_class[db], dn, take);
                done += take;
                dn += take;
                if (dn == cap) {
                    s->blk_n[db] = cap;
                    db++;
                    dn = 0;
                }
            }
            i += len;
        }
        base += n;
    }
    int used = db + (dn > 0);
    if (dn > 0) s->blk_n[db] = dn;
    for (int b = used; b < s->n_blocks; b++) vq_block_release(c, s->blocks[b], s->blk_class[b]);
    s->n_blocks = used;
}

/* The smallest class that holds n tokens (cls[0] is the full size). */
static int class_for(const vq_cache *c, int n) {
    int best = 0;
    for (int k = 1; k < c->n_classes; k++)
        if (c->cls[k].cap >= n && c->cls[k].cap < c->cls[best].cap) best = k;
    return best;
}

/* Key-grouped layout: kept tokens stay in their block (their group). */
static void keep_grouped(vq_cache *c, vq_stream *s, const uint8_t *keep) {
    int out = 0;
    int64_t base = 0;
    for (int b = 0; b < s->n_blocks; b++) {
        int n = s->blk_n[b], kept = 0;
        uint8_t *blk = s->blocks[b];
        int k = s->blk_class[b];
        int64_t i = 0, len;
        while ((len = next_run(keep + base, n, &i)) > 0) {
            move_slots(c, blk, k, (int)i, blk, k, kept, (int)len);
            kept += (int)len;
            i += len;
        }
        base += n;
        if (kept == 0) {
            vq_block_release(c, blk, k);
            continue;
        }
        int want = class_for(c, kept);
        if (c->cls[want].cap < c->cls[k].cap) {
            uint8_t *nb = vq_block_alloc(c, want);
            if (nb) { /* out of memory: the tokens stay where they are */
                move_slots(c, blk, k, 0, nb, want, 0, kept);
                vq_block_release(c, blk, k);
                blk = nb;
                k = want;
            }
        }
        s->blocks[out] = blk;
        s->blk_class[out] = (uint8_t)k;
        s->blk_n[out] = kept;
        out++;
    }
    s->n_blocks = out;
}

void vq_stream_keep(vq_cache *c, vq_stream *s, const uint8_t *keep) {
    int64_t held = s->n_quant + s->win_n, kept_q = 0;
    for (int64_t i = 0; i < s->n_quant; i++) kept_q += keep[i] != 0;
    if (c->flush_tokens > 1) keep_grouped(c, s, keep);
    else keep_dense(c, s, keep);
    /* the window: rows slide down */
    int d = c->cfg.head_dim, w = 0;
    const uint8_t *kw = keep + s->n_quant;
    for (int i = 0; i < s->win_n; i++) {
        if (!kw[i]) continue;
        if (w != i) {
            memcpy(s->win_k + (size_t)w * d, s->win_k + (size_t)i * d, sizeof(uint16_t) * (size_t)d);
            memcpy(s->win_v + (size_t)w * d, s->win_v + (size_t)i * d, sizeof(uint16_t) * (size_t)d);
            s->win_pos[w] = s->win_pos[i];
        }
        w++;
    }
    /* the scores follow their slots */
    int64_t o = 0;
    for (int64_t i = 0; i < held; i++)
        if (keep[i]) s->score[o++] = s->score[i];
    s->n_quant = kept_q;
    s->win_n = w;
}
