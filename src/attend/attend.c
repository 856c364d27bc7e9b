/* Fused attention over the compressed cache.
 *
 * For each kv head, the rows (query tokens x the q heads of its GQA group)
 * stream over the head's blocks and then its fp16 window, a span of
 * consecutive blocks at a time (SPAN_FLOATS). The method scores the packed
 * keys of each block of the span into the span's logits, attention applies
 * the causal mask and an fp32 online softmax step (one max and at most one
 * rescale per span), and the method accumulates the packed values of each
 * block weighted by the probabilities. Nothing is dequantized into memory.
 *
 * Work split. With few rows (decode) each head's token stream is cut into
 * partitions of a fixed number of blocks (flash-decoding); every partition
 * yields (max, sum, acc) and the partitions are merged in order. With many
 * rows (prefill) the rows are cut into chunks instead and each chunk streams
 * all tokens. The cut depends only on the shapes, never on the thread count,
 * so results are identical for any number of threads.
 *
 * Key weights. When asked (vq_attend_args.key_weights, or the cache's
 * eviction policy), each observed row's masked logits are also copied per
 * slot into scratch during the same pass; once the row's final max and sum
 * are known (after the last span, or the partition merge), a second pass
 * over that scratch turns them into probabilities and sums them per slot
 * over the observed rows. Nothing is scored twice.
 */
#include "vq_internal.h"

#include <math.h>
#include <string.h>

/* Tokens per partition (task) in split mode. 1024 against 512 on a Zen 5
 * host (32768 tokens, 32/8 heads, 2 threads, interleaved, ms): kivi-2
 * 2.27-2.50 vs 2.45-2.77, kivi-4 2.57-2.68 vs 2.67-2.94, tq-mse 3-bit
 * 2.15-2.23 vs 2.30-2.32, fp16 unchanged within its noise: fewer task
 * starts, each of which begins with blocks no prefetch asked for (2048
 * measured as 1024). On a Zen 3 host 1024 and 2048 had measured within
 * the noise of 512. */
#define PART_TOKENS 1024
#define ROW_CHUNK 32      /* rows per task; more rows than this: row mode */
/* Logits of one softmax span, all rows together (8 KB: L1). Consecutive
 * blocks are scored into one span and take one softmax step: one max, at
 * most one rescale of the sums and one exp pass per row for the span
 * rather than per block. Decode with 4 rows a kv head spans 8 blocks of
 * 64 tokens (half a partition); prefill chunks of 32 rows one block. */
#define SPAN_FLOATS 2048
#define MAX_SPAN_BLOCKS 64

/* exp(x[i] - m) in place for i < n; returns the sum. Masked entries are -inf
 * and become 0. Scalar, AVX2 and AVX-512 versions (kernels/cpu/softmax_*.c). */
float vq_exp_shift_sum_avx2(float *x, int n, float m);
float vq_max_avx2(const float *x, int n);
float vq_exp_shift_sum_avx512(float *x, int n, float m);
float vq_max_avx512(const float *x, int n);

static float exp_shift_sum(float *x, int n, float m) {
#if defined(__x86_64__)
    if (vq_cpu_has_avx512()) return vq_exp_shift_sum_avx512(x, n, m);
    if (vq_cpu_has_avx2()) return vq_exp_shift_sum_avx2(x, n, m);
#endif
    float s = 0;
    for (int i = 0; i < n; i++) {
        x[i] = expf(x[i] - m);
        s += x[i];
    }
    return s;
}

static float max_of(const float *x, int n) {
#if defined(__x86_64__)
    if (vq_cpu_has_avx512()) return vq_max_avx512(x, n);
    if (vq_cpu_has_avx2()) return vq_max_avx2(x, n);
#endif
    float m = -INFINITY;
    for (int i = 0; i < n; i++) m = x[i] > m ? x[i] : m;
    return m;
}

typedef struct {
    vq_cache *c;
    int layer;
    const vq_attend_args *a;
    int g;              /* q heads per kv head */
    int rows_total;     /* n_q * g */
    int split;          /* 1: split-KV (decode), 0: row chunks (prefill) */
    /* Some key may lie in some row's future: q_pos given and its smallest
     * entry below the layer's last position. Otherwise (a decode step at
     * the newest position) no block's positions are read: they sit at
     * the end of each block, past the parts the prefetch asks for (KIVI-2,
     * 32768 tokens, 32/8 heads, 2 threads, Zen 5: a decode step with q_pos
     * took 4-7 % longer than without before this test, the same after). */
    bool masked;
    int part_blocks;    /* blocks per partition (split mode) */
    int n_parts;        /* partitions per head, the window included */
    int n_row_chunks;
    int tasks_per_head;
    int threads;        /* the pool's, the caller included */
    float scale;
    /* Keys whose method prepares queries (rotation, projection, tables):
     * split mode prepares the rows of every head once per call,
     * [H][rows_total][prep_w]; row mode prepares each task's rows in its
     * thread memory, so the prepared rows (QJL's byte tables: 33 KB a row
     * at m = 256) never grow with the number of query tokens. */
    float *prep;
    int prep_w;
    /* Values whose method accumulates in its own domain (finish_rows): the
     * fp16 window then sums into a second accumulator in output space. */
    bool split_acc;
    int acc_w;          /* floats per accumulator row: the values method's
                           acc_floats, or d */
    int part_w;         /* floats per row in a partial: 2 + acc_w (+ d) */
    float *partials;    /* split: [H][n_parts][rows_total][part_w] */
    float *thread_mem;  /* [threads][thread_floats] */
    size_t thread_floats;
    size_t method_floats;
    int span_tokens;    /* most tokens of one softmax span, >= block_tokens */
    int logit_ld;       /* floats per logits row: a span or the window */
    /* Key weights: rows from kw_first on are observed; their logits per
     * slot, [H][rows_total - kw_first][kw_ld], and every row's final max
     * and sum, [H][rows_total][2]. kw_logits NULL: not asked. */
    int kw_first;
    size_t kw_ld;
    float *kw_logits;
    float *kw_ml;
    float *kw_out;      /* [H][kw_ld] */
} job;

/* Asks for a block's parts ahead of use. Blocks are separate allocations
 * and the hardware prefetcher stops at their page edges, so without this
 * the start of every block is a run of demand misses. A span reads its
 * blocks' key parts, then their value parts, then goes on to the next
 * span's first keys part (`after`); while it works on part i it touches
 * each page of part i + 2 (one prefetch a page), then asks for every line
 * of part i + 1, then for every line of part i + 2 (prefetch_part).
 *
 * Measured on a Zen 5 host, 32768 tokens, 32/8 heads, d = 128, interleaved
 * runs, medians in ms. One thread: every line one part ahead (the order
 * before, then for KIVI only; fp16 blocks were left to the hardware):
 * KIVI-2 5.8-6.1, fp16 13.1-14.4; every line one part ahead for fp16 too:
 * fp16 10.4; every line two parts ahead only: KIVI-2 5.5-6.1; every line
 * one and then two parts ahead: KIVI-2 4.9-5.1, fp16 8.3-9.4; pages two
 * ahead and lines one ahead: KIVI-2 4.66-5.16, fp16 8.6-9.8; that and the
 * lines two ahead last (this): KIVI-2 4.72-4.89, fp16 8.0-8.3; every
 * second line: KIVI-2 8.6-9.2, worse than none. Two threads: pages two
 * ahead and lines one ahead KIVI-2 2.41-2.76, fp16 4.53-4.81; this
 * 2.46-2.56 and 4.08-4.44; the lines two ahead asked for before those one
 * ahead: fp16 4.9-5.0; pages or lines three ahead as well: no better. Why
 * the early touch matters was not established (a guess: a prefetch that
 * misses the TLB may start the walk and be dropped). In cache the fp16
 * path pays for its prefetches (13.7-14.2 -> 16.5 ns per token and kv head
 * at 2048 tokens, 8/2 heads). On a Zen 3 host one part ahead in two bursts
 * had beaten the whole next block at once (KIVI-2, 2 threads: 2-7 % less
 * median time) and prefetching fp16 blocks had measured slower, without
 * kept figures.
 *
 * The lines of a part two ahead go with the non-temporal hint (prefetchnta)
 * when the part is small (compressed blocks: KIVI-2 3 KB a part), with
 * the L1 hint like the rest when it is big (fp16: 16 KB). Zen 5, 32768
 * tokens, medians of interleaved runs: KIVI-2 2.38 -> 2.15 ms on two
 * threads and 4.67 -> 4.00 ms on one, KIVI-4 2.59 -> 2.39, tq-mse 3-bit
 * 2.28 -> 2.16; the L2 hint (prefetcht1) gave KIVI-2 2.17. For fp16 the
 * non-temporal hint measured 7.7 -> 8.4 ms on one thread, so big parts
 * keep the L1 hint. */
#define PREFETCH_PAGE 4096
#define PREFETCH_NTA_BYTES 8192
/* Blocks that stay one per span (see vq_attend). */
#define SPAN_BIG_BYTES 32768

/* prefetch_range and prefetch_part are inlined into run_blocks on purpose:
 * GCC takes a function whose only effect is __builtin_prefetch for one
 * without side effects and drops the calls to it (this file's prefetches
 * once vanished that way from an -O2 build). */
#if defined(__GNUC__)
#define PREFETCH_INLINE inline __attribute__((always_inline))
#else
#define PREFETCH_INLINE inline
#endif

/* One prefetch every `step` bytes of [p, p + bytes), and its last byte;
 * with the non-temporal hint when nta, and then every other step only:
 * the near prefetch asks for every line of the part again one part later.
 * Zen 5, 32768 tokens, 2 threads, medians of 12 interleaved runs: KIVI-2
 * 2.17 -> 2.09 ms, KIVI-4 2.41 -> 2.32 (tq-mse 3-bit, tq-prod 4-bit and
 * polar within 2 %); every other line for the near prefetch as well:
 * KIVI-2 2.35. */
static PREFETCH_INLINE void prefetch_range(const uint8_t *p, size_t bytes, size_t step, bool nta) {
#if defined(__GNUC__)
    if (bytes == 0) return;
    if (nta) {
        for (size_t o = 0; o < bytes; o += 2 * step) __builtin_prefetch(p + o, 0, 0);
        __builtin_prefetch(p + bytes - 1, 0, 0);
        return;
    }
    for (size_t o = 0; o < bytes; o += step) __builtin_prefetch(p + o, 0, 3);
    __builtin_prefetch(p + bytes - 1, 0, 3);
#else
    (void)p;
    (void)bytes;
    (void)step;
    (void)nta;
#endif
}

/* The payload of a block: its keys part and the rest (values, positions). */
typedef struct {
    const uint8_t *k, *v;
    size_t k_bytes, v_bytes;
} next_block;

static next_block block_parts(const vq_cache *c, const vq_stream *s, int b) {
    const vq_block_class *k = &c->cls[s->blk_class[b]];
    return (next_block){s->blocks[b], s->blocks[b] + k->k_bytes, k->k_bytes, k->bytes - k->k_bytes};
}

/* Part j of span [b0, b1)'s reading order (keys of b0 + j for j < n, values
 * of b0 + j - n for j < 2 n, then after's keys), one prefetch every step
 * bytes; far: the lines of a part two ahead (see PREFETCH_NTA_BYTES). */
static PREFETCH_INLINE void prefetch_part(const vq_cache *c, const vq_stream *s, int b0, int b1,
                                          const next_block *after, int j, size_t step, bool far) {
    int n = b1 - b0;
    if (j < n) {
        next_block p = block_parts(c, s, b0 + j);
        prefetch_range(p.k, p.k_bytes, step, far && p.k_bytes <= PREFETCH_NTA_BYTES);
    } else if (j < 2 * n) {
        next_block p = block_parts(c, s, b0 + j - n);
        prefetch_range(p.v, p.v_bytes, step, far && p.v_bytes <= PREFETCH_NTA_BYTES);
    } else if (j == 2 * n && after) {
        prefetch_range(after->k, after->k_bytes, step, far && after->k_bytes <= PREFETCH_NTA_BYTES);
    }
}

/* The online-softmax step for n new logits per row (already masked): each
 * row's max over them, one rescale of the row's sums when it grows, then
 * the logits turned into exp(logit - max) in place, summed into l. acc has
 * acc_w floats a row; accw (d a row) is rescaled too when it is separate. */
static void softmax_span(const job *jb, int nr, float *logits, int n, float *m, float *l, float *acc, float *accw,
                         float *kw_head, int row0, int64_t slot0) {
    int d = jb->c->cfg.head_dim, ld = jb->logit_ld;
    for (int r = 0; r < nr; r++) {
        float *lr = logits + (size_t)r * ld;
        if (kw_head && row0 + r >= jb->kw_first)
            memcpy(kw_head + (size_t)(row0 + r - jb->kw_first) * jb->kw_ld + slot0, lr, sizeof(float) * (size_t)n);
        float mb = max_of(lr, n);
        if (mb == -INFINITY) { /* nothing visible to this row here */
            memset(lr, 0, sizeof(float) * (size_t)n);
            continue;
        }
        if (mb > m[r]) {
            /* A row that has seen nothing yet has all-zero sums: nothing to
             * rescale (multiplying them by exp(-inf) = 0 changed no bit). */
            if (m[r] != -INFINITY) {
                float alpha = expf(m[r] - mb);
                l[r] *= alpha;
                float *ar = acc + (size_t)r * jb->acc_w;
                for (int i = 0; i < jb->acc_w; i++) ar[i] *= alpha;
                if (accw != acc) {
                    float *aw = accw + (size_t)r * d;
                    for (int i = 0; i < d; i++) aw[i] *= alpha;
                }
            }
            m[r] = mb;
        }
        l[r] += exp_shift_sum(lr, n, m[r]);
    }
}

/* Sets the logits of keys in a row's future to -inf: n columns of a span
 * whose key positions are kpos. */
static void mask_future(const job *jb, int nr, const int32_t *qpos, const int32_t *kpos, int n, float *logits) {
    if (!qpos || kpos[n - 1] <= qpos[0]) return; /* every key visible to every row */
    for (int r = 0; r < nr; r++) {
        float *lr = logits + (size_t)r * jb->logit_ld;
        int32_t qp = qpos[r];
        for (int j = 0; j < n; j++)
            if (kpos[j] > qp) lr[j] = -INFINITY;
    }
}

/* Blocks [b0, b1) of stream s as one softmax span: every block's keys are
 * scored into its columns of the logits rows, one softmax step covers
 * them all, then every block's values are accumulated. At most
 * jb->span_tokens tokens. Prefetch, in the span's reading order (keys
 * parts, values parts, then `after`'s keys, or nothing when it is NULL):
 * the pages of the part two ahead, the lines of the part one ahead, then
 * the lines of the part two ahead (the order measured; see PREFETCH_PAGE). */
static void run_blocks(const job *jb, const vq_stream *s, int b0, int b1, const next_block *after, int nr,
                       const float *kq, const int32_t *qpos, int32_t qpos_max, float *m, float *l, float *acc,
                       float *logits, float *mscratch, float *kw_head, int row0, int64_t slot0) {
    const vq_cache *c = jb->c;
    const vq_mparams *pk = &c->spec.k, *pv = &c->spec.v;
    const int n_all = b1 - b0; /* the span's blocks before any is cut off by the query positions */
    int col = 0;
    for (int b = b0; b < b1; b++) {
        int n = s->blk_n[b];
        if (n <= 0) continue;
        if (qpos && vq_blk_pos(c, s, b)[0] > qpos_max) { /* this block and all later ones are in every row's future */
            b1 = b;
            break;
        }
        prefetch_part(c, s, b0, b0 + n_all, after, b - b0 + 2, PREFETCH_PAGE, false);
        prefetch_part(c, s, b0, b0 + n_all, after, b - b0 + 1, 64, false);
        prefetch_part(c, s, b0, b0 + n_all, after, b - b0 + 2, 64, true);
        const vq_block_class *k = &c->cls[s->blk_class[b]];
        pk->method->score(pk, kq, nr, s->blocks[b], k->cap, 0, n, logits + col, jb->logit_ld, mscratch);
        mask_future(jb, nr, qpos, vq_blk_pos(c, s, b), n, logits + col);
        col += n;
    }
    if (col == 0) return;
    softmax_span(jb, nr, logits, col, m, l, acc, acc, kw_head, row0, slot0);
    col = 0;
    for (int b = b0; b < b1; b++) {
        int n = s->blk_n[b];
        if (n <= 0) continue;
        prefetch_part(c, s, b0, b0 + n_all, after, n_all + b - b0 + 2, PREFETCH_PAGE, false);
        prefetch_part(c, s, b0, b0 + n_all, after, n_all + b - b0 + 1, 64, false);
        prefetch_part(c, s, b0, b0 + n_all, after, n_all + b - b0 + 2, 64, true);
        const vq_block_class *k = &c->cls[s->blk_class[b]];
        pv->method->accum(pv, logits + col, jb->logit_ld, nr, s->blocks[b] + k->k_bytes, k->cap, 0, n, acc, mscratch);
        col += n;
    }
}

/* The fp16 window's n tokens as one span, scored with q itself and summed
 * into accw (output space). */
static void run_window(const job *jb, const vq_stream *s, int nr, const float *qbuf, const int32_t *qpos,
                       int32_t qpos_max, float *m, float *l, float *acc, float *accw, float *logits, float *mscratch,
                       float *kw_head, int row0) {
    const vq_cache *c = jb->c;
    int n = s->win_n;
    if (n <= 0 || (qpos && s->win_pos[0] > qpos_max)) return;
    vq_mparams fk;
    memset(&fk, 0, sizeof fk);
    fk.method = &vq_method_fp16;
    fk.head_dim = c->cfg.head_dim;
    vq_mparams fv = fk;
    fv.is_value = true;
    vq_method_fp16.score(&fk, qbuf, nr, (const uint8_t *)s->win_k, c->win_cap, 0, n, logits, jb->logit_ld, mscratch);
    mask_future(jb, nr, qpos, s->win_pos, n, logits);
    softmax_span(jb, nr, logits, n, m, l, acc, accw, kw_head, row0, s->n_quant);
    vq_method_fp16.accum(&fv, logits, jb->logit_ld, nr, (const uint8_t *)s->win_v, c->win_cap, 0, n, accw, mscratch);
}

/* The rows of task `row_chunk` of head h: q (scaled) into qbuf, positions
 * into qpos. Returns the row count. */
static int load_rows(const job *jb, int h, int r0, int nr, float *qbuf, int32_t *qpos, int32_t *qpos_max) {
    const vq_cache *c = jb->c;
    const vq_attend_args *a = jb->a;
    int d = c->cfg.head_dim, Hq = c->cfg.n_heads_q, g = jb->g;
    int32_t mx = INT32_MIN;
    for (int r = 0; r < nr; r++) {
        int row = r0 + r, qi = row / g, j = row % g;
        const float *src = a->q + ((size_t)qi * Hq + (size_t)h * g + j) * d;
        for (int i = 0; i < d; i++) qbuf[(size_t)r * d + i] = src[i] * jb->scale;
        if (a->q_pos) {
            qpos[r] = a->q_pos[qi];
            mx = qpos[r] > mx ? qpos[r] : mx;
        }
    }
    *qpos_max = mx;
    return nr;
}

/* Blocks [b0, b1) of one stream, in spans of at most jb->span_tokens
 * tokens, then its window if asked. `after` (or NULL) is prefetched during
 * the last block: the first block of the task this thread will likely take
 * next. */
static void stream_range(const job *jb, const vq_stream *s, int b0, int b1, bool window, const next_block *after,
                         int nr, const float *qbuf, const float *kq, const int32_t *qpos, int32_t qpos_max, float *m,
                         float *l, float *acc, float *accw, float *logits, float *mscratch, float *kw_head, int row0) {
    const vq_cache *c = jb->c;
    int64_t slot0 = 0;
    for (int b = 0; b < b0; b++) slot0 += s->blk_n[b];
    for (int b = b0; b < b1;) {
        int e = b, tokens = 0;
        while (e < b1 && (e == b || (tokens + s->blk_n[e] <= jb->span_tokens && e - b < MAX_SPAN_BLOCKS)))
            tokens += s->blk_n[e++];
        next_block nx;
        if (e < b1) nx = block_parts(c, s, e);
        const next_block *next = e < b1 ? &nx : after;
        run_blocks(jb, s, b, e, next, nr, kq, qpos, qpos_max, m, l, acc, logits, mscratch, kw_head, row0, slot0);
        slot0 += tokens;
        b = e;
    }
    if (window) run_window(jb, s, nr, qbuf, qpos, qpos_max, m, l, acc, accw, logits, mscratch, kw_head, row0);
}

/* Turns summed rows into output: the values method's finish (e.g. the
 * inverse rotation) on acc, plus the window's part, divided by l. */
static void write_row(const job *jb, int h, int row, float *acc, const float *accw, float l) {
    const vq_cache *c = jb->c;
    const vq_attend_args *a = jb->a;
    int d = c->cfg.head_dim, Hq = c->cfg.n_heads_q, g = jb->g;
    if (jb->split_acc) {
        c->spec.v.method->finish_rows(&c->spec.v, acc, 1);
        for (int i = 0; i < d; i++) acc[i] += accw[i];
    }
    int qi = row / g, j = row % g;
    size_t off = ((size_t)qi * Hq + (size_t)h * g + j) * d;
    float inv = l > 0 ? 1.0f / l : 0.0f;
    if (a->out_dtype == VQ_F32) {
        float *o = (float *)a->out + off;
        for (int i = 0; i < d; i++) o[i] = acc[i] * inv;
    } else {
        uint16_t *o = (uint16_t *)a->out + off;
        for (int i = 0; i < d; i++) o[i] = vq_f32_to_f16(acc[i] * inv);
    }
}

/* The per-thread scratch layout of a task. */
typedef struct {
    float *qbuf, *acc, *accw, *m, *l, *logits, *mscratch, *prep;
} task_mem;

static task_mem carve(const job *jb, int thread) {
    int d = jb->c->cfg.head_dim, maxr = jb->split ? jb->rows_total : ROW_CHUNK;
    task_mem t;
    t.qbuf = jb->thread_mem + (size_t)thread * jb->thread_floats;
    t.acc = t.qbuf + (size_t)maxr * d;
    t.accw = jb->split_acc ? t.acc + (size_t)maxr * jb->acc_w : t.acc;
    t.m = t.accw + (size_t)maxr * d;
    t.l = t.m + maxr;
    t.logits = t.l + maxr;
    t.mscratch = t.logits + (size_t)maxr * jb->logit_ld;
    t.prep = t.mscratch + jb->method_floats; /* row mode only */
    return t;
}

static void task_fn(void *ctx, int task, int thread) {
    const job *jb = ctx;
    const vq_cache *c = jb->c;
    int d = c->cfg.head_dim;
    int h = task / jb->tasks_per_head, sub = task % jb->tasks_per_head;
    const vq_stream *s = &c->streams[(size_t)jb->layer * c->cfg.n_heads_kv + h];
    task_mem t = carve(jb, thread);
    int32_t qpos[ROW_CHUNK];
    int32_t qpos_max;
    int r0 = jb->split ? 0 : sub * ROW_CHUNK;
    int nr = jb->split ? jb->rows_total : (jb->rows_total - r0 < ROW_CHUNK ? jb->rows_total - r0 : ROW_CHUNK);
    load_rows(jb, h, r0, nr, t.qbuf, qpos, &qpos_max);
    const float *kq = t.qbuf;
    if (jb->prep_w && jb->split) {
        kq = jb->prep + (size_t)h * jb->rows_total * jb->prep_w;
    } else if (jb->prep_w) {
        c->spec.k.method->prep_query(&c->spec.k, t.qbuf, nr, t.prep);
        kq = t.prep;
    }
    const int32_t *qp = jb->masked ? qpos : NULL;
    float *kw_head = jb->kw_logits ? jb->kw_logits + (size_t)h * (jb->rows_total - jb->kw_first) * jb->kw_ld : NULL;
    for (int r = 0; r < nr; r++) {
        t.m[r] = -INFINITY;
        t.l[r] = 0;
    }
    memset(t.acc, 0, sizeof(float) * (size_t)nr * jb->acc_w);
    if (jb->split_acc) memset(t.accw, 0, sizeof(float) * (size_t)nr * d);
    if (jb->split) {
        int b0 = sub * jb->part_blocks, b1 = b0 + jb->part_blocks;
        if (b1 > s->n_blocks) b1 = s->n_blocks;
        bool window = sub == jb->n_parts - 1;
        /* The pool hands tasks out in order, so this thread's next task is
         * likely `threads` further on; the first block of a partition has no
         * block before it to prefetch it (at 1024 tokens a partition, 1 of
         * 16 KIVI blocks). */
        next_block la, *after = NULL;
        int nt = task + jb->threads, h2 = nt / jb->tasks_per_head, b2 = nt % jb->tasks_per_head * jb->part_blocks;
        if (nt < c->cfg.n_heads_kv * jb->tasks_per_head) {
            const vq_stream *s2 = &c->streams[(size_t)jb->layer * c->cfg.n_heads_kv + h2];
            if (b2 < s2->n_blocks) {
                la = block_parts(c, s2, b2);
                after = &la;
            }
        }
        if (b0 < b1 || window)
            stream_range(jb, s, b0 < b1 ? b0 : 0, b0 < b1 ? b1 : 0, window, after, nr, t.qbuf, kq, qp, qpos_max, t.m,
                         t.l, t.acc, t.accw, t.logits, t.mscratch, kw_head, r0);
        float *part = jb->partials + ((size_t)h * jb->n_parts + sub) * nr * jb->part_w;
        for (int r = 0; r < nr; r++) {
            float *pr = part + (size_t)r * jb->part_w;
            pr[0] = t.m[r];
            pr[1] = t.l[r];
            memcpy(pr + 2, t.acc + (size_t)r * jb->acc_w, sizeof(float) * jb->acc_w);
            if (jb->split_acc) memcpy(pr + 2 + jb->acc_w, t.accw + (size_t)r * d, sizeof(float) * d);
        }
        return;
    }
    stream_range(jb, s, 0, s->n_blocks, true, NULL, nr, t.qbuf, kq, qp, qpos_max, t.m, t.l, t.acc, t.accw, t.logits,
                 t.mscratch, kw_head, r0);
    for (int r = 0; r < nr; r++)
        write_row(jb, h, r0 + r, t.acc + (size_t)r * jb->acc_w, t.accw + (size_t)r * d, t.l[r]);
    if (jb->kw_logits)
        for (int r = 0; r < nr; r++) {
            float *ml = jb->kw_ml + ((size_t)h * jb->rows_total + r0 + r) * 2;
            ml[0] = t.m[r];
            ml[1] = t.l[r];
        }
}

/* Merges the partitions of head h, in partition order. */
static void merge_fn(void *ctx, int h, int thread) {
    const job *jb = ctx;
    int d = jb->c->cfg.head_dim, aw = jb->acc_w, nr = jb->rows_total, pw = jb->part_w;
    task_mem t = carve(jb, thread);
    float *acc = t.acc, *accw = jb->split_acc ? acc + aw : acc;
    for (int r = 0; r < nr; r++) {
        float M = -INFINITY;
        for (int p = 0; p < jb->n_parts; p++) {
            float mp = jb->partials[(((size_t)h * jb->n_parts + p) * nr + r) * pw];
            M = mp > M ? mp : M;
        }
        float L = 0;
        memset(acc, 0, sizeof(float) * (size_t)(jb->split_acc ? aw + d : d));
        if (M != -INFINITY) {
            for (int p = 0; p < jb->n_parts; p++) {
                const float *pr = jb->partials + (((size_t)h * jb->n_parts + p) * nr + r) * pw;
                if (pr[0] == -INFINITY) continue;
                float w = expf(pr[0] - M);
                L += pr[1] * w;
                for (int i = 0; i < aw; i++) acc[i] += pr[2 + i] * w;
                if (jb->split_acc)
                    for (int i = 0; i < d; i++) accw[i] += pr[2 + aw + i] * w;
            }
        }
        write_row(jb, h, r, acc, accw, L);
        if (jb->kw_logits) {
            float *ml = jb->kw_ml + ((size_t)h * nr + r) * 2;
            ml[0] = M;
            ml[1] = L;
        }
    }
}

/* Key weights of head h: each observed row's probabilities, summed per
 * slot in row order (so the result does not depend on threads). */
static void weights_fn(void *ctx, int h, int thread) {
    (void)thread;
    const job *jb = ctx;
    const vq_stream *s = vq_stream_at(jb->c, jb->layer, h);
    int64_t n = s->n_quant + s->win_n;
    int rows = jb->rows_total - jb->kw_first;
    float *out = jb->kw_out + (size_t)h * jb->kw_ld;
    memset(out, 0, sizeof(float) * jb->kw_ld);
    for (int r = 0; r < rows; r++) {
        const float *ml = jb->kw_ml + ((size_t)h * jb->rows_total + jb->kw_first + r) * 2;
        if (ml[0] == -INFINITY || !(ml[1] > 0)) continue; /* the row saw nothing */
        const float *lg = jb->kw_logits + ((size_t)h * rows + r) * jb->kw_ld;
        float inv = 1.0f / ml[1];
        for (int64_t j = 0; j < n; j++)
            if (lg[j] != -INFINITY) out[j] += expf(lg[j] - ml[0]) * inv;
    }
}

/* Prepared query rows for the keys method, all heads, once per call (split
 * mode). */
typedef struct {
    const job *jb;
    float *qtmp; /* [threads][rows_total][d] */
} prep_ctx;

static void prep_fn(void *ctx, int h, int thread) {
    const prep_ctx *pc = ctx;
    const job *jb = pc->jb;
    const vq_cache *c = jb->c;
    int d = c->cfg.head_dim;
    float *q = pc->qtmp + (size_t)thread * jb->rows_total * d;
    int32_t unused_pos[ROW_CHUNK], unused_max;
    for (int r0 = 0; r0 < jb->rows_total; r0 += ROW_CHUNK) {
        int nr = jb->rows_total - r0 < ROW_CHUNK ? jb->rows_total - r0 : ROW_CHUNK;
        load_rows(jb, h, r0, nr, q + (size_t)r0 * d, unused_pos, &unused_max);
    }
    c->spec.k.method->prep_query(&c->spec.k, q, jb->rows_total, jb->prep + (size_t)h * jb->rows_total * jb->prep_w);
}

static vq_status ensure_scratch(vq_cache *c, size_t floats) {
    if (c->attend_scratch_floats >= floats) return VQ_OK;
    float *p = vq_aligned_alloc(floats * sizeof(float));
    if (!p) return vq_fail(VQ_ERR_NOMEM, "out of memory for %zu bytes of attention scratch", floats * sizeof(float));
    vq_aligned_free(c->attend_scratch);
    c->attend_scratch = p;
    c->attend_scratch_floats = floats;
    return VQ_OK;
}

vq_status vq_attend(vq_cache *c, int layer, const vq_attend_args *a) {
    if (!c || !a) return vq_fail(VQ_ERR_ARG, "vq_attend: cache or args is NULL");
    if (layer < 0 || layer >= c->cfg.n_layers)
        return vq_fail(VQ_ERR_ARG, "layer %d is out of range [0, %d)", layer, c->cfg.n_layers);
    if (a->n_q < 1 || a->n_q > (1 << 20))
        return vq_fail(VQ_ERR_ARG, "n_q=%d is out of range [1, 2^20]", a->n_q);
    if (!a->q || !a->out) return vq_fail(VQ_ERR_ARG, "vq_attend: q or out is NULL");
    if (a->out_dtype != VQ_F32 && a->out_dtype != VQ_F16)
        return vq_fail(VQ_ERR_ARG, "out_dtype %d is not VQ_F32 or VQ_F16", (int)a->out_dtype);
    if (!(a->scale >= 0) || isinf(a->scale))
        return vq_fail(VQ_ERR_ARG, "scale %g is out of range (finite and >= 0; 0 = 1/sqrt(head_dim))", (double)a->scale);
    if (a->key_weight_rows < 0 || a->key_weight_rows > a->n_q)
        return vq_fail(VQ_ERR_ARG, "key_weight_rows=%d is out of range [0, n_q=%d] (0 = all rows)", a->key_weight_rows,
                       a->n_q);
    if (c->cuda) {
        if (a->key_weights)
            return vq_fail(VQ_ERR_UNSUPPORTED, "vq_attend: key_weights are not available for CUDA caches");
        return vq_cuda_attend(&c, 1, layer, a);
    }
    int d = c->cfg.head_dim, H = c->cfg.n_heads_kv;
    job jb;
    memset(&jb, 0, sizeof jb);
    jb.c = c;
    jb.layer = layer;
    jb.a = a;
    jb.g = c->cfg.n_heads_q / H;
    jb.rows_total = a->n_q * jb.g;
    jb.scale = a->scale > 0 ? a->scale : 1.0f / sqrtf((float)d);
    jb.split = jb.rows_total <= ROW_CHUNK;
    if (a->q_pos) {
        int32_t lo = a->q_pos[0];
        for (int i = 1; i < a->n_q; i++) lo = a->q_pos[i] < lo ? a->q_pos[i] : lo;
        jb.masked = lo < c->last_pos[layer];
    }
    jb.split_acc = c->spec.v.method->finish_rows != NULL;
    jb.acc_w = jb.split_acc && c->spec.v.method->acc_floats ? (int)c->spec.v.method->acc_floats(&c->spec.v) : d;
    jb.part_w = 2 + jb.acc_w + (jb.split_acc ? d : 0);
    /* which query tokens' attention is observed: the caller's, else the
     * policy's (0: none) */
    int kw_q = a->key_weights ? (a->key_weight_rows ? a->key_weight_rows : a->n_q) : vq_cache_weight_rows(c, a->n_q);
    jb.kw_first = (a->n_q - kw_q) * jb.g;
    jb.kw_ld = (size_t)vq_cache_tokens(c, layer);
    if (jb.kw_ld == 0) kw_q = 0;
    int max_blocks = 0;
    for (int h = 0; h < H; h++) {
        int nb = c->streams[(size_t)layer * H + h].n_blocks;
        max_blocks = nb > max_blocks ? nb : max_blocks;
    }
    jb.part_blocks = PART_TOKENS / c->block_tokens > 0 ? PART_TOKENS / c->block_tokens : 1;
    if (jb.split) {
        jb.n_parts = (max_blocks + jb.part_blocks - 1) / jb.part_blocks;
        if (jb.n_parts == 0) jb.n_parts = 1; /* the window alone */
        jb.tasks_per_head = jb.n_parts;
    } else {
        jb.n_row_chunks = (jb.rows_total + ROW_CHUNK - 1) / ROW_CHUNK;
        jb.tasks_per_head = jb.n_row_chunks;
    }
    int maxr = jb.split ? jb.rows_total : ROW_CHUNK;
    /* whole blocks per span, fixed by the shapes (never by the threads) */
    int span_blocks = SPAN_FLOATS / maxr / c->block_tokens;
    if (span_blocks > jb.part_blocks) span_blocks = jb.part_blocks;
    if (span_blocks > MAX_SPAN_BLOCKS) span_blocks = MAX_SPAN_BLOCKS;
    /* Blocks bigger than L1's share (fp16's: 66 KB at d = 128) stay one per
     * span, the order the fp16 baseline has always been measured with: a
     * block's keys part, then its values part. */
    if (c->block_bytes > SPAN_BIG_BYTES) span_blocks = 1;
    jb.span_tokens = (span_blocks > 1 ? span_blocks : 1) * c->block_tokens;
    jb.logit_ld = jb.span_tokens > c->win_cap ? jb.span_tokens : c->win_cap;
    jb.logit_ld = (jb.logit_ld + 15) & ~15;
    size_t mk = c->spec.k.method->scratch_floats(&c->spec.k, maxr);
    size_t mv = c->spec.v.method->scratch_floats(&c->spec.v, maxr);
    jb.method_floats = mk > mv ? mk : mv;
    bool prep = c->spec.k.method->prep_query != NULL;
    jb.prep_w = prep ? (int)c->spec.k.method->prep_floats(&c->spec.k) : 0;
    jb.thread_floats = (size_t)maxr * (d + jb.acc_w + (jb.split_acc ? d : 0)) + (size_t)maxr * 2 + (size_t)maxr * jb.logit_ld +
                       jb.method_floats + (jb.split ? 0 : (size_t)ROW_CHUNK * jb.prep_w);
    jb.thread_floats = (jb.thread_floats + 15) & ~(size_t)15;
    int threads = vq_pool_threads(a->pool);
    jb.threads = threads;
    size_t partial_floats = jb.split ? (size_t)H * jb.n_parts * jb.rows_total * jb.part_w : 0;
    bool prep_all = prep && jb.split;
    size_t prep_floats = prep_all ? (size_t)H * jb.rows_total * jb.prep_w : 0;
    size_t qtmp_floats = prep_all ? (size_t)threads * jb.rows_total * d : 0;
    size_t kw_floats = kw_q ? (size_t)H * ((size_t)kw_q * jb.g * jb.kw_ld + (size_t)jb.rows_total * 2) : 0;
    vq_status st = ensure_scratch(c, jb.thread_floats * threads + partial_floats + prep_floats + qtmp_floats + kw_floats);
    if (st) return st;
    jb.thread_mem = c->attend_scratch;
    jb.partials = c->attend_scratch + jb.thread_floats * threads;
    if (kw_q) {
        jb.kw_logits = jb.partials + partial_floats + prep_floats + qtmp_floats;
        jb.kw_ml = jb.kw_logits + (size_t)H * kw_q * jb.g * jb.kw_ld;
        /* slots no span reaches (all in the future) stay masked */
        for (size_t i = 0; i < (size_t)H * kw_q * jb.g * jb.kw_ld; i++) jb.kw_logits[i] = -INFINITY;
        jb.kw_out = a->key_weights ? a->key_weights : vq_cache_weight_scratch(c, (size_t)H * jb.kw_ld);
        if (!jb.kw_out) return vq_fail(VQ_ERR_NOMEM, "out of memory for key weights of %zu slots", jb.kw_ld);
    }
    if (prep_all) {
        jb.prep = jb.partials + partial_floats;
        prep_ctx pc = {.jb = &jb, .qtmp = jb.prep + prep_floats};
        vq_pool_run(a->pool, H, prep_fn, &pc);
    }
    vq_pool_run(a->pool, H * jb.tasks_per_head, task_fn, &jb);
    if (jb.split) vq_pool_run(a->pool, H, merge_fn, &jb);
    if (kw_q) {
        vq_pool_run(a->pool, H, weights_fn, &jb);
        if (!a->key_weights) vq_cache_observe(c, layer, a->n_q, jb.kw_out, jb.kw_ld);
    }
    return VQ_OK;
}
