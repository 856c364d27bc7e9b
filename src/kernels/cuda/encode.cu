/* The append kernel: one launch per append quantizes and packs every token
 * that leaves the fp16 window (the window flush) and writes the tokens that
 * stay into the window. Token i of an append's "stream" is the old window's
 * token i for i < win_n, else new token i - win_n; the first flushes * F
 * of them are encoded into blocks, the rest form the new window.
 *
 * Work is split into warp-sized items that need no shared state: (head,
 * unit of tokens, K or V) for the encoded tokens, (head, unit) for the
 * window. fp16 rows and the window are copied by lanes that own 8
 * consecutive channels of a row (16-byte loads and stores; a row of d
 * channels takes d / 8 lanes). The quantizers first stage up to 32 rows in
 * the warp's shared tile (by the bulk-copy engine when the rows are fp16 or
 * bf16 on 16-byte boundaries: one instruction per row, every row in flight
 * at once, bf16 converted in the tile; else through registers, 8 rows in
 * flight per lane) and work from there:
 * - KIVI codes a whole packed row per lane (codes.cuh's planes layout)
 *   from (scale, 1 / scale, zero) in the warp's shared memory, so lanes
 *   never exchange data: for values a lane first folds its own row's
 *   groups; for keys a lane folds its channel pairs over the group's
 *   tokens, then the warp shares the per-channel parameters.
 * - tq-mse keeps 8 channels of a row per lane: the Hadamard transform and
 *   the packing of codes are shuffles between the lanes of a row (a lane's
 *   8 codes fill one 8-byte word of a plane, and the lanes that share those
 *   bytes OR their words together); a code is a count read from a table of
 *   cells plus one comparison (tq_cell_table).
 * The kernel is compiled once per set of quantizers a cache uses, so each
 * instance allocates registers for its own paths only.
 *
 * Arithmetic gives the CPU encoders' results bit for bit: IEEE rounding
 * and no contraction into FMA (the _rn intrinsics); KIVI's quotients
 * (x - z) / s correctly rounded from 1 / s (code_bits); minima and maxima
 * equal to the CPU's in-order fold (fold_again); tq-mse's norm summed
 * channel by channel in fp64 by one lane per token. */
#include "codes.cuh"

#include <cuda_bf16.h>
#include <cudaTypedefs.h>
#include <stdint.h>

#define WARPS 4  /* warps per thread block, each on its own items */
#define UNROLL 8 /* row loads a lane issues before using any: bytes in flight */
#define FULL 0xffffffffu

/* Rows of a warp's shared tile: 32 (one tq-mse norm per lane) up to head
 * dim 128, 16 above, so a tile stays under 9 KB. */
static __host__ __device__ int tile_rows(int d) { return d <= 128 ? 32 : 16; }

/* The KIVI parameters (16 bytes each) a warp keeps in shared memory for
 * pack_row: 32 rows' per value group, or one per key channel; 0 without
 * KIVI. */
static __host__ __device__ int prm_slots(const vq_cu_append_args &a) {
    const int v = a.mv.kind == VQ_CU_KIVI ? 32 * ((a.d + a.mv.group - 1) / a.mv.group) : 0;
    const int k = a.mk.kind == VQ_CU_KIVI ? a.d : 0;
    return v > k ? v : k;
}

/* A lane's place in a warp: it holds channels [c0, c0 + 8) of row slot
 * `sub` (slots 0 .. tpw - 1); at d = 192 lanes 24..31 hold nothing (on is
 * false) but still take part in the shuffles. */
struct lanes {
    int lane, lpt, tpw, sub, c0;
    bool on;
};

__device__ __forceinline__ lanes lanes_for(int d) {
    lanes L;
    L.lane = threadIdx.x % 32;
    L.lpt = d / 8;
    L.tpw = 32 / L.lpt;
    L.sub = L.lane / L.lpt;
    L.c0 = 8 * (L.lane % L.lpt);
    L.on = L.sub < L.tpw;
    return L;
}

__device__ __forceinline__ uint32_t pack2h(float x, float y) {
    return (uint32_t)vq_cu_f2h(x) | (uint32_t)vq_cu_f2h(y) << 16;
}

/* Channels [c0, c0 + 8) of stream token i as loaded, for to_f16x8(): the
 * window's fp16 values, or the new row's fp16 or bf16 values as they are
 * (f32 rows, 32 bytes, are rounded to fp16 here). The copy loops convert
 * only in their store loops, so that a lane's unrolled loads can all be in
 * flight before the first conversion waits for its data: converting right
 * after each load, inside the branch that picks the source, made an fp16
 * cache's append of bf16 rows 22 % slower than of fp16 rows (H200; equal
 * since). `aligned`: the new rows are 16-byte aligned, so vector loads are
 * safe. */
__device__ __forceinline__ uint4 load8(const vq_cu_append_args &a, bool aligned, int h, int i, int c0, bool value) {
    if (i < a.win_n)
        return __ldg((const uint4 *)((value ? a.old_v : a.old_k) + ((size_t)h * a.win_cap + i) * a.d + c0));
    size_t idx = ((size_t)(i - a.win_n) * a.H + h) * a.d + c0;
    const void *x = value ? a.v : a.k;
    if (a.dtype != VQ_F32) { /* fp16 or bf16 bits */
        const uint16_t *p = (const uint16_t *)x + idx;
        if (aligned) return __ldg((const uint4 *)p);
        return make_uint4(p[0] | (uint32_t)p[1] << 16, p[2] | (uint32_t)p[3] << 16, p[4] | (uint32_t)p[5] << 16,
                          p[6] | (uint32_t)p[7] << 16);
    }
    float f[8];
    const float *p = (const float *)x + idx;
    if (aligned) {
        float4 lo = __ldg((const float4 *)p), hi = __ldg((const float4 *)p + 1);
        f[0] = lo.x, f[1] = lo.y, f[2] = lo.z, f[3] = lo.w, f[4] = hi.x, f[5] = hi.y, f[6] = hi.z, f[7] = hi.w;
    } else {
        for (int j = 0; j < 8; j++) f[j] = p[j];
    }
    return make_uint4(pack2h(f[0], f[1]), pack2h(f[2], f[3]), pack2h(f[4], f[5]), pack2h(f[6], f[7]));
}

/* 8 bf16 values as 8 fp16 values, each rounded once (a bf16 is the high
 * half of an fp32; cvt.rn.f16x2.f32 rounds like the CPU's conversion). */
__device__ __forceinline__ uint4 bf16x8_to_f16(uint4 u) {
    uint32_t w[4] = {u.x, u.y, u.z, u.w};
    for (int j = 0; j < 4; j++) {
        __half2 h = __floats2half2_rn(__uint_as_float(w[j] << 16), __uint_as_float(w[j] & 0xffff0000u));
        w[j] = *reinterpret_cast<uint32_t *>(&h);
    }
    return make_uint4(w[0], w[1], w[2], w[3]);
}

/* load8()'s result for stream token i as 8 fp16 values. */
__device__ __forceinline__ uint4 to_f16x8(const vq_cu_append_args &a, int i, uint4 u) {
    return a.dtype == VQ_BF16 && i >= a.win_n ? bf16x8_to_f16(u) : u;
}

__device__ __forceinline__ void to_float8(uint4 u, float f[8]) {
    uint32_t w[4] = {u.x, u.y, u.z, u.w};
    for (int j = 0; j < 4; j++) {
        f[2 * j] = vq_cu_h2f((uint16_t)(w[j] & 0xffff));
        f[2 * j + 1] = vq_cu_h2f((uint16_t)(w[j] >> 16));
    }
}

__device__ __forceinline__ int32_t pos_of(const vq_cu_append_args &a, int h, int i) {
    if (i < a.win_n) return a.old_pos[(size_t)h * a.win_cap + i];
    return a.pos ? a.pos[i - a.win_n] : a.last + 1 + (i - a.win_n);
}

/* The block and in-block offset of stream token i once quantized. */
__device__ __forceinline__ uint8_t *block_of(const vq_cu_append_args &a, int h, int i, int *t) {
    int q = a.nq0 + i;
    *t = q % a.bt;
    return a.table[(size_t)h * a.max_blocks + q / a.bt];
}

/* The same for tokens i + r of a chunk, from the block and offset of token
 * i: one division per chunk, then steps over block ends (rarely more than
 * one) instead of a division per row. */
struct cursor {
    int b, t;
};

__device__ __forceinline__ cursor cursor_at(const vq_cu_append_args &a, int i) {
    int q = a.nq0 + i;
    return {q / a.bt, q % a.bt};
}

__device__ __forceinline__ uint8_t *block_at(const vq_cu_append_args &a, int h, cursor c, int r, int *t) {
    int tt = c.t + r, b = c.b;
    while (tt >= a.bt) tt -= a.bt, b++;
    *t = tt;
    return a.table[(size_t)h * a.max_blocks + b];
}

/* One KIVI code, the CPU's rint((x - z) / s) clamped to mq, as the low
 * byte of a float's bits, without a division or a rounding instruction.
 * q = RN(a / s) from r = RN(1 / s) by Markstein's correction: q0 = RN(a r)
 * is within an ulp of a / s, so e = a - s q0 is exact in one FMA and
 * RN(q0 + e r) is the correctly rounded quotient (no overflow or underflow
 * here: a and s come from fp16 values). Clamping before rounding gives the
 * same code (rint is monotonic, mq an integer); adding 1.5 * 2^23 rounds to
 * the nearest even integer, which lands in the low mantissa bits. Only for
 * a scale_ok() s: the caller zeroes the other codes. */
__device__ __forceinline__ uint32_t code_bits(float x, float s, float r, float z, float mq) {
    float a = __fsub_rn(x, z);
    float q0 = __fmul_rn(a, r);
    float e = __fmaf_rn(-s, q0, a);
    float q = __fmaf_rn(e, r, q0);
    return __float_as_uint(__fadd_rn(fminf(q, mq), 12582912.0f));
}

/* The CPU codes a group with a scale that is not > 0 (0 or NaN) as 0; an
 * infinite scale (only from infinite inputs) gives it 0 for finite x too,
 * while code_bits() would see a NaN. */
__device__ __forceinline__ bool scale_ok(float s) { return s > 0 && s <= 65504.0f; }

/* The CPU folds a group in order with `x < mn ? x : mn` from its first
 * element: the earliest of equal minima wins (-0 vs +0) and a NaN counts
 * only as the first element. Partial folds over consecutive ranges, each
 * range after the first started from +inf (-inf for the maximum), merge to
 * the same result with the same rule, the earlier range on the left. */
__device__ __forceinline__ float min_in_order(float early, float late) { return late < early ? late : early; }
__device__ __forceinline__ float max_in_order(float early, float late) { return late > early ? late : early; }

/* A lane's 8 codes as the bytes of one word, for one plane: the codes
 * themselves (PART 0), their low 2 bits (1) or their bit 2 (2, 3-bit). */
template <int PART>
__device__ __forceinline__ unsigned long long plane_word(const int code[8]) {
    unsigned lo = 0, hi = 0;
    for (int j = 0; j < 4; j++) {
        unsigned a = (unsigned)code[j], b = (unsigned)code[j + 4];
        if (PART == 1) a &= 3, b &= 3;
        if (PART == 2) a >>= 2, b >>= 2;
        lo |= a << (8 * j);
        hi |= b << (8 * j);
    }
    return (unsigned long long)hi << 32 | lo;
}

/* Where a lane's codes go in a packed row, per plane: the bit offset of
 * its codes in their bytes, the lane distance to the next lane holding
 * codes of the same bytes and how many lanes share them, and the byte
 * offset of the lane's 8 bytes (it stores them only if it holds the
 * plane's first codes of those bytes). Computed once per item. */
struct plane {
    int bits, shift, step, ways, at;
    bool first;
};

struct packer {
    plane p[2];
    bool three; /* 3 bits: 2-bit planes of the low bits, then 1-bit planes of the high bit */
};

__device__ __forceinline__ plane plane_for(int bits, int stride, int at, const lanes &L) {
    plane p;
    p.bits = bits;
    p.shift = bits * (L.c0 / stride);
    p.step = stride / 8;
    p.ways = 8 / bits;
    p.at = at + L.c0;
    p.first = L.c0 < stride;
    return p;
}

__device__ __forceinline__ packer packer_for(int bits, int d, const lanes &L) {
    packer k;
    k.three = bits == 3;
    if (k.three) {
        k.p[0] = plane_for(2, d / 4, 0, L);
        k.p[1] = plane_for(1, d / 8, d / 4, L);
    } else {
        k.p[0] = k.p[1] = plane_for(bits, d * bits / 8, 0, L);
    }
    return k;
}

/* One plane: this lane's word shifted into place, ORed with the words of
 * the lanes sharing its bytes; every lane of the warp calls this
 * (shuffles). */
__device__ __forceinline__ void put_plane(unsigned long long w, const plane &p, const lanes &L, uint8_t *row,
                                          bool store) {
    w <<= p.shift;
    unsigned long long all = w; /* the shuffles read every lane's own word */
    for (int s = 1; s < p.ways; s++) all |= __shfl_sync(FULL, w, (L.lane + s * p.step) & 31);
    if (store && p.first) *(unsigned long long *)(row + p.at) = all;
}

/* One token's packed codes (d * bits / 8 bytes at row). */
__device__ __forceinline__ void put_codes(const int code[8], const packer &k, const lanes &L, uint8_t *row,
                                          bool store) {
    if (k.three) {
        put_plane(plane_word<1>(code), k.p[0], L, row, store);
        put_plane(plane_word<2>(code), k.p[1], L, row, store);
    } else {
        put_plane(plane_word<0>(code), k.p[0], L, row, store);
    }
}

/* fp16 rows into blocks: a copy. */
__device__ void enc_fp16(const vq_cu_append_args &a, bool al, size_t off, bool value, int h, int i0, int cnt,
                         const lanes &L) {
    const cursor at = cursor_at(a, i0);
    for (int r = 0; r < cnt; r += L.tpw * UNROLL) {
        uint4 v[UNROLL];
#pragma unroll
        for (int u = 0; u < UNROLL; u++) {
            int row = r + u * L.tpw + L.sub;
            if (L.on && row < cnt) v[u] = load8(a, al, h, i0 + row, L.c0, value);
        }
#pragma unroll
        for (int u = 0; u < UNROLL; u++) {
            int row = r + u * L.tpw + L.sub, t;
            if (!L.on || row >= cnt) continue;
            uint8_t *blk = block_at(a, h, at, row, &t) + off;
            *(uint4 *)(blk + ((size_t)t * a.d + L.c0) * 2) = to_f16x8(a, i0 + row, v[u]);
        }
    }
}

/* Rows [i, i + n) (n <= tile_rows) of head h's K or V into the warp's
 * tile as fp16 rows of pitch d + 8 (conflict-free 16-byte reads of a row
 * per lane), through registers: any dtype and alignment. Inlined: as a call
 * it made ptxas spill the KIVI key paths' registers around it (88-164 B at
 * 2, 4 and 8 bits), spill code that the bulk-copy path, which never makes
 * the call, ran too. */
__device__ __forceinline__ void stage_loads(const vq_cu_append_args &a, bool al, int h, int i, int n, bool value, lanes L,
                                         uint16_t *tile) {
    const int pitch = a.d + 8;
    __syncwarp(); /* earlier reads of the tile are done */
    for (int r = 0; r < n; r += L.tpw * UNROLL) {
        uint4 v[UNROLL];
#pragma unroll
        for (int u = 0; u < UNROLL; u++) {
            int row = r + u * L.tpw + L.sub;
            if (L.on && row < n) v[u] = to_f16x8(a, i + row, load8(a, al, h, i + row, L.c0, value));
        }
#pragma unroll
        for (int u = 0; u < UNROLL; u++) {
            int row = r + u * L.tpw + L.sub;
            if (L.on && row < n) *(uint4 *)(tile + row * pitch + L.c0) = v[u];
        }
    }
    __syncwarp();
}

/* The first byte of stream token i's row of K or V (window rows are
 * fp16; new rows come in the input dtype). */
__device__ __forceinline__ const char *row_addr(const vq_cu_append_args &a, int h, int i, bool value) {
    if (i < a.win_n) return (const char *)((value ? a.old_v : a.old_k) + ((size_t)h * a.win_cap + i) * a.d);
    const int es = a.dtype == VQ_F32 ? 4 : 2;
    return (const char *)(value ? a.v : a.k) + ((size_t)(i - a.win_n) * a.H + h) * a.d * es;
}

/* A warp's mbarrier for bulk copies and the parity of its current phase;
 * copy: the new rows are fp16 or bf16 on 16-byte boundaries, so the tile
 * is staged by bulk copies (a compile-time constant of the kernel instance:
 * see launch()). */
struct bulk {
    unsigned bar, phase;
    bool copy;
};

/* stage_loads() for fp16 or bf16 rows on 16-byte boundaries (bf16 rows
 * arrive as they are), by the bulk-copy engine: lane r copies row r in one
 * instruction and the warp's mbarrier counts the bytes, so every row of the
 * chunk is in flight at once and no registers hold them (against 16-byte
 * cp.async per lane and row, 1-1.5 us less per 8192-token append on an
 * H200). */
__device__ __forceinline__ void stage_bulk(const vq_cu_append_args &a, int h, int i, int n, bool value,
                                           const lanes &L, uint16_t *tile, bulk &B) {
    const int pitch = a.d + 8;
    const unsigned bytes = (unsigned)a.d * 2;
    __syncwarp(); /* earlier reads of the tile are done */
    asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
    /* 32 new rows: one tensor copy of a box of 32 tokens x (d + 8)
     * channels from channel h d, which lands as the tile's padded rows (the
     * 8 channels past the head are the next head's, or zeros past the last
     * one, and nobody reads them). One instruction where a copy per row took
     * a 32-trip issue loop (the loop's branches held ~15 % of the kernel's
     * stall samples on an H200). Else a bulk copy per row. */
    const bool box = a.tmaps && n == 32 && i >= a.win_n;
    if (L.lane == 0)
        asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(B.bar),
                     "r"(box ? (unsigned)pitch * 2 * 32 : bytes * n)
                     : "memory");
    if (box) {
        if (L.lane == 0) {
            const unsigned dst = (unsigned)__cvta_generic_to_shared(tile);
            asm volatile("cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3}], "
                         "[%4];\n" ::"r"(dst),
                         "l"(&a.tmap[value]), "r"(h * a.d), "r"(i - a.win_n), "r"(B.bar)
                         : "memory");
        }
    } else {
        __syncwarp(); /* the expected bytes are set before any copy completes */
        if (L.lane < n) {
            const char *src = row_addr(a, h, i + L.lane, value);
            unsigned dst = (unsigned)__cvta_generic_to_shared(tile + L.lane * pitch);
            asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n" ::"r"(dst),
                         "l"(src), "r"(bytes), "r"(B.bar)
                         : "memory");
        }
    }
    unsigned done;
    do {
        asm volatile("{\n .reg .pred p;\n mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n selp.u32 %0, 1, 0, p;\n}\n"
                     : "=r"(done)
                     : "r"(B.bar), "r"(B.phase)
                     : "memory");
    } while (!done);
    B.phase ^= 1;
    __syncwarp();
}

/* Rows into the tile: by bulk copies when the new rows are fp16 or bf16
 * (the tile's 2 bytes a value) on 16-byte boundaries (the window's rows
 * always are), else through registers. bf16 rows are copied as they are and
 * converted in the tile afterwards, a lane converting its 8 channels of
 * every tpw-th row: a KIVI append of bf16 rows staged through registers
 * took 1.9x as long as one of fp16 rows by bulk copy (see the notes, "the
 * chunked bf16 prefill"). */
__device__ __forceinline__ void stage(const vq_cu_append_args &a, bool al, int h, int i, int n, bool value,
                                      const lanes &L, uint16_t *tile, bulk &B) {
    if (!B.copy) {
        stage_loads(a, al, h, i, n, value, L, tile);
        return;
    }
    stage_bulk(a, h, i, n, value, L, tile, B);
    if (a.dtype != VQ_BF16 || i + n <= a.win_n) return; /* fp16, or window rows only */
    const int pitch = a.d + 8;
    if (a.d == 128 && n == 32 && i >= a.win_n) {
        /* the common case, a full tile of new rows at d = 128 (two rows a
         * pass): a constant trip count without the window test, so the loop
         * unrolls and its per-row bookkeeping goes (about half of the ~12
         * instructions a row that bf16 rows cost over fp16 rows). Unrolled
         * by 4: by 8 (or 2) the whole kernel's allocation changed enough to
         * slow fp16 rows by ~2 % (measured) */
        const int step = 2 * (128 + 8) / 8; /* two tile rows, in 16-byte words */
        uint4 *p = (uint4 *)(tile + L.sub * pitch + L.c0);
#pragma unroll 4
        for (int k = 0; k < 16; k++) p[k * step] = bf16x8_to_f16(p[k * step]);
    } else {
        /* from the lane's first row past the window's rows (those are fp16) */
        const int skip = a.win_n - i > 0 ? a.win_n - i : 0;
        const int r0 = L.sub + (skip > L.sub ? (skip - L.sub + L.tpw - 1) / L.tpw * L.tpw : 0);
#pragma unroll 1
        for (int r = r0; L.on && r < n; r += L.tpw) {
            uint4 *p = (uint4 *)(tile + r * pitch + L.c0);
            *p = bf16x8_to_f16(*p);
        }
    }
    __syncwarp();
}

/* KIVI: each lane codes whole packed rows, a tile row per lane, from
 * parameters in the warp's shared prm (pack_row), so no lane waits for
 * another (no shuffles); the min and max folds run in the lane, over a
 * token's channel groups for values and over a key group's rows for the
 * lane's key channels. */

/* The CPU's in-order min and max of a group equal FMNMX's (fminf, fmaxf;
 * HMNMX2 on fp16 pairs) except when the result is a zero (+0 and -0 compare
 * equal and the CPU keeps the earliest) or the group's first element is a
 * NaN (the CPU keeps it, FMNMX skips it): such groups are folded again in
 * order. */
__device__ __forceinline__ bool fold_again(float first, float mn, float mx) {
    return mn == 0.0f || mx == 0.0f || first != first;
}

/* __frcp_rn and __fdiv_rn are a fast path plus a slow one (denormal, huge
 * or special operands) that is a called subroutine, and ptxas saves live
 * registers around every call site. The operands here never need the slow
 * path, so both are written out. */

/* RN(1 / s) for a scale s: the approximate reciprocal and one Newton step,
 * equal to __frcp_rn for every positive finite fp16 value (checked
 * exhaustively on an H200). Other s (0, inf, NaN) only occur with
 * !scale_ok(s), whose codes are masked to 0. */
__device__ __forceinline__ float rcp_scale(float s) {
    float r;
    asm("rcp.approx.ftz.f32 %0, %1;" : "=f"(r) : "f"(s));
    return __fmaf_rn(r, __fmaf_rn(-s, r, 1.0f), r);
}

/* RN(x / q) for x = max - min of a group (>= 0, or inf or NaN, passed
 * through as the division would) and q = 2^BITS - 1, without a division.
 * Markstein's correction from q's rounded reciprocal (as in code_bits) is
 * within an ulp of x / q; of it and its two neighbours the rounded quotient
 * is the one with the smallest remainder |x - q y|, exact in one FMA (x and
 * q y are multiples of the smallest of their ulps, and the remainder is
 * under 2 q of them); no two are equally near (a midpoint times the odd q
 * would need more than 24 bits). Equal to __fdiv_rn for every x from two
 * fp16 values (checked exhaustively on an H200; the correction alone
 * differs only at x = -0, returned unchanged here). */
template <int BITS> __device__ __forceinline__ float div_maxq(float x) {
    constexpr float q = (float)((1 << BITS) - 1), rq = 1.0f / q;
    if (!(x > 0 && x < INFINITY)) return x; /* 0, inf, NaN */
    const float y0 = __fmul_rn(x, rq), y = __fmaf_rn(__fmaf_rn(-q, y0, x), rq, y0);
    const float lo = __uint_as_float(__float_as_uint(y) - 1), hi = __uint_as_float(__float_as_uint(y) + 1);
    const float e = fabsf(__fmaf_rn(-q, y, x)), elo = fabsf(__fmaf_rn(-q, lo, x)), ehi = fabsf(__fmaf_rn(-q, hi, x));
    return elo < e ? lo : ehi < e ? hi : y;
}

/* A group's fp16 scale and zero, rounded as the CPU rounds them. */
template <int BITS> __device__ __forceinline__ void group_params(float mn, float mx, uint16_t *sh, uint16_t *zh) {
    *sh = vq_cu_f2h(div_maxq<BITS>(__fsub_rn(mx, mn)));
    *zh = vq_cu_f2h(mn);
}

/* A packed row of BITS-bit codes has one plane of BITS-bit fields, or at 3
 * bits a plane of the low 2 bits then a plane of the high bit (codes.cuh).
 * Plane p: field width plane_bits, stride d * plane_bits / 8 bytes, first
 * byte plane_at. */
template <int BITS> __device__ __forceinline__ constexpr int n_planes() { return BITS == 3 ? 2 : 1; }
template <int BITS> __device__ __forceinline__ constexpr int plane_bits(int p) { return BITS == 3 ? 2 - p : BITS; }
__device__ __forceinline__ int plane_at(int p, int d) { return p ? d / 4 : 0; }

/* Plane p's field of a code from code_bits() (only the low byte of its
 * argument counts). */
template <int BITS> __device__ __forceinline__ uint32_t plane_field(uint32_t c, int p) {
    return BITS == 3 ? (p ? c >> 2 & 1 : c & 3) : c & ((1u << BITS) - 1);
}

/* A code from code_bits() with the group's mask: 2^BITS - 1 for a usable
 * scale, else 0 (the CPU's code for such groups). */
__device__ __forceinline__ uint32_t code_masked(float x, float s, float r, float z, float maxq, uint32_t mask) {
    return code_bits(x, s, r, z, maxq) & mask;
}

/* A packed row of KIVI codes from its tile row, one lane per row, 8 bytes
 * (one store) at a time: byte u of a plane of stride S holds channels
 * u + S j, j < 8 / b, so 8 consecutive bytes take one 16-byte tile read
 * (pitch d + 8: conflict-free for a lane per row) per j. The parameters
 * (scale, 1 / scale, zero, code mask) come from prm: per channel for keys
 * (prm[c], the same for every row: broadcast reads), per value group and
 * row for values (prm[group * 32 + lane]: a byte's channels fall in
 * different groups). */
template <int BITS, bool KEYS>
__device__ __forceinline__ void pack_row(const uint16_t *row, uint8_t *out, const float4 *prm, int d, int gshift,
                                         int lane) {
    const float maxq = (float)((1 << BITS) - 1);
#pragma unroll
    for (int p = 0; p < n_planes<BITS>(); p++) {
        const int b = plane_bits<BITS>(p), S = d * b / 8;
#pragma unroll 1
        for (int u0 = 0; u0 < S; u0 += 8) {
            uint32_t w[2] = {0, 0};
#pragma unroll
            for (int j = 0; j < 8; j++) {
                if (j >= 8 / b) break; /* a constant trip count */
                const int cc = u0 + S * j;
                const float4 qg = KEYS ? make_float4(0, 0, 0, 0) : prm[(cc >> gshift) * 32 + lane];
                float x[8];
                to_float8(*(const uint4 *)(row + cc), x);
#pragma unroll
                for (int e = 0; e < 8; e++) {
                    const float4 q = KEYS ? prm[cc + e] : qg;
                    uint32_t code = code_masked(x[e], q.x, q.y, q.z, maxq, __float_as_uint(q.w));
                    w[e / 4] |= plane_field<BITS>(code, p) << (8 * (e % 4) + b * j);
                }
            }
            *(uint2 *)(out + plane_at(p, d) + u0) = make_uint2(w[0], w[1]);
        }
    }
}

/* A group's parameters for pack_row: the fp16 scale and zero from its min
 * and max, 1 / scale, and the mask that zeroes the codes of an unusable
 * scale. */
template <int BITS> __device__ __forceinline__ float4 code_params(float mn, float mx, uint16_t *sh, uint16_t *zh) {
    group_params<BITS>(mn, mx, sh, zh);
    const float s = vq_cu_h2f(*sh);
    return make_float4(s, rcp_scale(s), vq_cu_h2f(*zh), __uint_as_float(scale_ok(s) ? (1u << BITS) - 1 : 0));
}

#define KEY_PAIRS (VQ_CU_MAX_DIM / 64) /* key channel pairs a lane folds: d / 64 */

/* Min and max of the lane's key channels 2 (lane + 32 i) + e over the G
 * rows from stream token g0, staged R rows at a time: HMNMX2 on the fp16
 * pairs (one 32-bit tile read per pair and row), or (IN_ORDER) the CPU's
 * fold channel by channel. Returns whether the lane met a fold_again()
 * case. */
template <bool IN_ORDER>
__device__ __forceinline__ bool key_minmax(const vq_cu_append_args &a, bool al, int h, int g0, int G, const lanes &L,
                                           uint16_t *tile, bulk &B, float (*mn)[2], float (*mx)[2]) {
    const int R = tile_rows(a.d), pitch = a.d + 8, np = a.d / 64;
    __half2 lo[KEY_PAIRS], hi[KEY_PAIRS], first[KEY_PAIRS];
#pragma unroll
    for (int i = 0; i < KEY_PAIRS; i++) lo[i] = __float2half2_rn(INFINITY), hi[i] = __float2half2_rn(-INFINITY);
    for (int c = 0; c < G; c += R) {
        stage(a, al, h, g0 + c, R, false, L, tile, B);
#pragma unroll(IN_ORDER ? 1 : 4) /* the in-order fold is rare: no registers for it */
        for (int t = 0; t < R; t++) {
            const __half2 *row = (const __half2 *)(tile + t * pitch) + L.lane;
#pragma unroll
            for (int i = 0; i < KEY_PAIRS; i++) {
                if (i >= np) break;
                const __half2 x = row[32 * i];
                if (!IN_ORDER) {
                    lo[i] = __hmin2(lo[i], x), hi[i] = __hmax2(hi[i], x);
                    if (c == 0 && t == 0) first[i] = x;
                } else if (c == 0 && t == 0) {
                    mn[i][0] = mx[i][0] = __low2float(x);
                    mn[i][1] = mx[i][1] = __high2float(x);
                } else {
                    mn[i][0] = min_in_order(mn[i][0], __low2float(x));
                    mx[i][0] = max_in_order(mx[i][0], __low2float(x));
                    mn[i][1] = min_in_order(mn[i][1], __high2float(x));
                    mx[i][1] = max_in_order(mx[i][1], __high2float(x));
                }
            }
        }
    }
    bool again = false;
    if (!IN_ORDER)
#pragma unroll
        for (int i = 0; i < KEY_PAIRS; i++) {
            if (i >= np) break;
            mn[i][0] = __low2float(lo[i]), mn[i][1] = __high2float(lo[i]);
            mx[i][0] = __low2float(hi[i]), mx[i][1] = __high2float(hi[i]);
            again |= fold_again(__low2float(first[i]), mn[i][0], mx[i][0]);
            again |= fold_again(__high2float(first[i]), mn[i][1], mx[i][1]);
        }
    return again;
}

/* KIVI keys: each group of G tokens gets a per-channel (scale, zero). Pass
 * 1 folds the lane's channel pairs over the group's rows (key_minmax, in
 * order when any lane needs it) and puts the channels' parameters into prm
 * (and their fp16 scales and zeros into the block, a pair per 32-bit
 * store); pass 2 codes one tile row per lane with pack_row (the tile is
 * staged again when the group is taller than it; its rows are in L2 by
 * then): one 16-byte tile read per 8 channels, the parameters by broadcast
 * reads, and no per-channel registers (8 channels a lane spilled). */
template <int BITS>
__device__ void enc_kivi_keys(const vq_cu_append_args &a, bool al, const vq_cu_method &m, int h, int i0, int cnt,
                              const lanes &L, uint16_t *tile, float4 *prm, bulk &B) {
    const int d = a.d, G = m.group, cb = m.code_bytes, R = tile_rows(d), pitch = d + 8, np = d / 64;
    for (int g0 = i0; g0 < i0 + cnt; g0 += G) {
        /* the group's block first: its block-table load then overlaps the
         * tile's copy (read after the wait, it held 2.7 % of the kernel's
         * stall samples on an H200) */
        int t0;
        uint8_t *blk = block_of(a, h, g0, &t0);
        float mn[KEY_PAIRS][2], mx[KEY_PAIRS][2];
        if (__any_sync(FULL, key_minmax<false>(a, al, h, g0, G, L, tile, B, mn, mx)))
            key_minmax<true>(a, al, h, g0, G, L, tile, B, mn, mx);
        /* the group's fp16 scales [d], then zeros [d] */
        uint32_t *sz = (uint32_t *)(blk + (size_t)a.bt * cb) + (size_t)(t0 / G) * d;
#pragma unroll
        for (int i = 0; i < KEY_PAIRS; i++) {
            if (i >= np) break;
            const int p = L.lane + 32 * i;
            uint16_t s0, z0, s1, z1;
            prm[2 * p] = code_params<BITS>(mn[i][0], mx[i][0], &s0, &z0);
            prm[2 * p + 1] = code_params<BITS>(mn[i][1], mx[i][1], &s1, &z1);
            sz[p] = s0 | (uint32_t)s1 << 16;
            sz[d / 2 + p] = z0 | (uint32_t)z1 << 16;
        }
        __syncwarp(); /* prm is complete (the next group's writes wait in stage) */
        for (int c = 0; c < G; c += R) {
            if (G > R) stage(a, al, h, g0 + c, R, false, L, tile, B);
            if (L.lane < R)
                pack_row<BITS, true>(tile + L.lane * pitch, blk + (size_t)(t0 + c + L.lane) * cb, prm, d, 0, L.lane);
        }
    }
}

/* One chunk of n <= tile_rows rows of KIVI values, a lane per row: the
 * row's groups' min and max (HMNMX2 on the tile's fp16 pairs), their
 * (scale, zero) into the block and their parameters into prm
 * ([group][lane]), then the packed row (pack_row). blk, t: the lane's
 * row's value part and in-block token. Lanes from n on have no row. */
template <int BITS>
__device__ void vals_chunk(const vq_cu_method &m, int d, int bt, uint8_t *blk, int t, int n, int lane,
                           const uint16_t *tile, float4 *prm) {
    const int G = m.group, cb = m.code_bytes, ng = (d + G - 1) / G, pitch = d + 8;
    const int gshift = __ffs(G) - 1; /* G is a power of two */
    if (lane >= n) return;
    uint32_t *meta = (uint32_t *)(blk + (size_t)bt * cb) + (size_t)t * ng;
    const uint16_t *row = tile + lane * pitch;
    for (int g = 0; g < ng; g++) {
        const int c0 = g * G, c1 = c0 + G < d ? c0 + G : d;
        __half2 lo = __float2half2_rn(INFINITY), hi = __float2half2_rn(-INFINITY);
        for (int cc = c0; cc < c1; cc += 8) {
            const uint4 w = *(const uint4 *)(row + cc);
            const __half2 *x = reinterpret_cast<const __half2 *>(&w);
            lo = __hmin2(lo, __hmin2(__hmin2(x[0], x[1]), __hmin2(x[2], x[3])));
            hi = __hmax2(hi, __hmax2(__hmax2(x[0], x[1]), __hmax2(x[2], x[3])));
        }
        float mn = __half2float(__hmin(__low2half(lo), __high2half(lo)));
        float mx = __half2float(__hmax(__low2half(hi), __high2half(hi)));
        const float first = vq_cu_h2f(row[c0]);
        if (fold_again(first, mn, mx)) {
            mn = mx = first;
            for (int cc = c0 + 1; cc < c1; cc++) {
                float x = vq_cu_h2f(row[cc]);
                mn = min_in_order(mn, x);
                mx = max_in_order(mx, x);
            }
        }
        uint16_t sh, zh;
        prm[g * 32 + lane] = code_params<BITS>(mn, mx, &sh, &zh);
        meta[g] = sh | (uint32_t)zh << 16;
    }
    pack_row<BITS, false>(row, blk + (size_t)t * cb, prm, d, gshift, lane);
}

/* KIVI values: each token's channels in groups of G (the last one shorter
 * when G does not divide d) get a (scale, zero). */
template <int BITS>
__device__ void enc_kivi_values(const vq_cu_append_args &a, bool al, const vq_cu_method &m, int h, int i0, int cnt,
                                const lanes &L, uint16_t *tile, float4 *prm, bulk &B) {
    const int R = tile_rows(a.d);
    for (int c = i0; c < i0 + cnt; c += R) {
        const int n = i0 + cnt - c < R ? i0 + cnt - c : R;
        /* the lane's row's block before the staging, so that the
         * block-table load overlaps the tile's copy */
        int t = 0;
        uint8_t *blk = L.lane < n ? block_at(a, h, cursor_at(a, c), L.lane, &t) + a.k_bytes : nullptr;
        stage(a, al, h, c, n, true, L, tile, B);
        vals_chunk<BITS>(m, a.d, a.bt, blk, t, n, L.lane, tile, prm);
    }
}

/* A KIVI item with the method's bits as a compile-time constant. */
template <int BITS>
__device__ __forceinline__ void enc_kivi_bits(const vq_cu_append_args &a, bool al, const vq_cu_method &m, bool value,
                                              int h, int i0, int cnt, const lanes &L, uint16_t *tile, float4 *prm,
                                              bulk &B) {
    if (value) enc_kivi_values<BITS>(a, al, m, h, i0, cnt, L, tile, prm, B);
    else enc_kivi_keys<BITS>(a, al, m, h, i0, cnt, L, tile, prm, B);
}

__device__ __forceinline__ void enc_kivi(const vq_cu_append_args &a, bool al, const vq_cu_method &m, bool value, int h,
                                         int i0, int cnt, const lanes &L, uint16_t *tile, float4 *prm, bulk &B) {
    switch (m.bits) {
    case 2: enc_kivi_bits<2>(a, al, m, value, h, i0, cnt, L, tile, prm, B); break;
    case 3: enc_kivi_bits<3>(a, al, m, value, h, i0, cnt, L, tile, prm, B); break;
    case 4: enc_kivi_bits<4>(a, al, m, value, h, i0, cnt, L, tile, prm, B); break;
    default: enc_kivi_bits<8>(a, al, m, value, h, i0, cnt, L, tile, prm, B); break;
    }
}

/* tq-mse codes: the CPU's code of a Hadamard output y is the number of
 * boundaries b with RN(y s) > b, s = 1 / sqrt(d) as a float. RN(y s) never
 * decreases as y grows, so that is the number of thresholds t (the
 * smallest y with RN(y s) > b, found by cuda_cache.cu) with y >= t, and
 * the kernel skips the product (a NaN y passes neither test). It maps y
 * to a cell, RN(y S + M) - M clamped to the table (S = cell_scale,
 * M = 1.5 * 2^23: an integer in the low mantissa bits), which never
 * decreases as y grows either; so every threshold of a lower cell is at
 * most y and none of a higher cell is, and the code is the count of
 * thresholds in lower cells plus one comparison with the threshold in y's
 * cell, which holds at most one (cuda_cache.cu picks S). A NaN is clamped
 * into the lowest cell, whose count is 0, and compares false. Entry c of a
 * table: (the threshold in cell cell_lo + c, or a NaN that no y reaches,
 * the count below it as int bits), built by thread `c` from the method's
 * thresholds with the same arithmetic as the codes. */
#define TQ_MAGIC 12582912.0f
static_assert(WARPS * 32 == 2 * VQ_CU_TQ_CELLS, "a thread per cell of the two tables");

__device__ __forceinline__ void tq_cell_table(const vq_cu_method &m, int c, float2 *cells) {
    if (m.kind != VQ_CU_TQ_MSE || c >= m.n_cells) return;
    const float lo = TQ_MAGIC + (float)m.cell_lo;
    float thr = __int_as_float(0x7fc00000); /* NaN */
    int below = 0;
    for (int i = 0; i < (1 << m.bits) - 1; i++) {
        const int ci = __float_as_int(__fmaf_rn(m.threshold[i], m.cell_scale, TQ_MAGIC)) - __float_as_int(lo);
        below += ci < c;
        if (ci == c) thr = m.threshold[i];
    }
    cells[c] = make_float2(thr, __int_as_float(below));
}

/* One chunk of n <= 32 rows (stream tokens c ..) of tq-mse, from a tile.
 * Kept apart from its loop: this way ptxas spills less (24 B of spill
 * stores for the kernel, 32 B inline) and 8192 tq-mse tokens appended in
 * 60.0 us against 61.4 us inline (two calls on an H200). LPT: the lanes of
 * a row (d / 8) when fixed at compile time (d = 128), else 0 (L.lpt): with
 * a fixed count the butterflies across lanes unroll without a branch and a
 * mask per stage and row. */
template <int LPT>
__device__ __forceinline__ void tq_chunk(const vq_cu_append_args &a, const vq_cu_method &m, size_t off, int h, int c,
                                         int n, const lanes &L, const uint16_t *tile, const float2 *cells,
                                         uint4 sgn, const packer &pk) {
    const int d = a.d, cb = m.code_bytes, pitch = d + 8, lpt = LPT ? LPT : L.lpt, tpw = 32 / lpt;
    const float cs = m.cell_scale, lo = TQ_MAGIC + (float)m.cell_lo, hi = lo + (float)(m.n_cells - 1);
    const cursor at = cursor_at(a, c);
    float inv = 0;
    uint8_t *dst = NULL; /* where lane r's row, row r of the chunk, puts its codes */
    if (L.lane < n) {
        const uint16_t *row = tile + L.lane * pitch;
        double ss = 0;
        for (int c8 = 0; c8 < d; c8 += 8) {
            /* fp16 straight to fp64 (one conversion, not two); the square
             * of an fp16 value has at most 22 significant bits, so it is
             * exact in fp64 and one fused multiply-add rounds as the CPU's
             * product and then sum do */
            const uint4 u = *(const uint4 *)(row + c8);
            const uint32_t w[4] = {u.x, u.y, u.z, u.w};
            for (int j = 0; j < 8; j++) {
                double x;
                const unsigned short hv = (unsigned short)(w[j / 2] >> (16 * (j % 2)));
                asm("cvt.f64.f16 %0, %1;" : "=d"(x) : "h"(hv));
                ss = __fma_rn(x, x, ss);
            }
        }
        double len = sqrt(ss);
        inv = len > 0 ? (float)(1.0 / len) : 0.0f;
        int t;
        uint8_t *blk = block_at(a, h, at, L.lane, &t) + off;
        ((uint16_t *)(blk + (size_t)a.bt * cb))[t] = vq_cu_f2h((float)len);
        dst = blk + (size_t)t * cb;
    }
    /* across lanes, stage s (lanes 2^s apart): the lower lane of a pair
     * gets x + o, the upper o - x, both as o + pm[s] x in one FMA (the
     * product is exact, so it rounds as the CPU's add or subtract) */
    float pm[5];
    for (int s = 0; s < 5; s++) pm[s] = L.lane & (1 << s) ? -1.0f : 1.0f;
#pragma unroll 1
    for (int r = 0; r < n; r += tpw) {
        int row = r + L.sub;
        bool ok = row < n;
        /* the signs as the fp16 values' sign bits: RN(-x iv) = -RN(x iv),
         * the CPU's (x inv) * sign bit for bit */
        uint4 u = ok ? *(const uint4 *)(tile + row * pitch + L.c0) : make_uint4(0, 0, 0, 0);
        u = make_uint4(u.x ^ sgn.x, u.y ^ sgn.y, u.z ^ sgn.z, u.w ^ sgn.w);
        float x[8];
        to_float8(u, x);
        float iv = __shfl_sync(FULL, inv, row & 31);
        for (int j = 0; j < 8; j++) x[j] = __fmul_rn(x[j], iv);
        for (int hh = 1; hh < 8; hh *= 2)
            for (int j = 0; j < 8; j++)
                if (!(j & hh)) {
                    float p = x[j], q = x[j + hh];
                    x[j] = __fadd_rn(p, q);
                    x[j + hh] = __fsub_rn(p, q);
                }
#pragma unroll
        for (int s = 0; s < 5; s++) {
            if ((1 << s) >= lpt) break;
            for (int j = 0; j < 8; j++) x[j] = __fmaf_rn(x[j], pm[s], __shfl_xor_sync(FULL, x[j], 1 << s));
        }
        /* the number of thresholds at or below x: those of the cells below
         * x's cell, plus the one in its cell if x reaches it (tq_cell_table) */
        int code[8];
        for (int j = 0; j < 8; j++) {
            const float f = fminf(fmaxf(__fmaf_rn(x[j], cs, TQ_MAGIC), lo), hi); /* a NaN goes to the lowest */
            const float2 e = cells[__float_as_int(f) - __float_as_int(lo)];
            code[j] = __float_as_int(e.y) + (x[j] >= e.x);
        }
        /* the row's destination from the lane that stored its norm: two
         * shuffles instead of a block-table load and a walk per row */
        uint8_t *out = (uint8_t *)__shfl_sync(FULL, (unsigned long long)dst, row & 31);
        put_codes(code, pk, L, out, ok);
    }
}

/* tq-mse: ||x||, then the codes of R x / ||x|| with R = H diag(signs) /
 * sqrt(d). Lane t sums tile row t's squares in channel order (the CPU's
 * fp64 sum, bit for bit); the Hadamard butterflies run in registers, then
 * across lanes. */
__device__ void enc_tq_mse(const vq_cu_append_args &a, bool al, const vq_cu_method &m, size_t off, bool value, int h,
                           int i0, int cnt, const lanes &L, uint16_t *tile, const float2 *cells, bulk &B) {
    const int R = tile_rows(a.d);
    const packer pk = packer_for(m.bits, a.d, L);
    uint32_t w[4];
    for (int j = 0; j < 4; j++)
        w[j] = (m.signs[L.c0 + 2 * j] < 0 ? 0x8000u : 0) | (m.signs[L.c0 + 2 * j + 1] < 0 ? 0x80000000u : 0);
    const uint4 sgn = make_uint4(w[0], w[1], w[2], w[3]);
    for (int c = i0; c < i0 + cnt; c += R) {
        const int n = i0 + cnt - c < R ? i0 + cnt - c : R;
        stage(a, al, h, c, n, value, L, tile, B);
        if (a.d == 128) tq_chunk<16>(a, m, off, h, c, n, L, tile, cells, sgn, pk);
        else tq_chunk<0>(a, m, off, h, c, n, L, tile, cells, sgn, pk);
    }
}

/* The kernel is compiled once per set of quantizers that a cache's K and V
 * use (PATHS: PATH_KIVI | PATH_TQ, 0 for fp16 alone) and, with quantizers,
 * per way of staging rows (COPY: by bulk copies), so that each instance
 * holds, and allocates registers for, only the paths it runs. */
enum { PATH_KIVI = 1, PATH_TQ = 2 };

/* One item: a (head, unit, K or V) of the encoded tokens, or a (head,
 * unit) of the window. */
template <int PATHS>
__device__ __forceinline__ void run_item(const vq_cu_append_args &a, int item, int unit, int enc_units,
                                         int one_kind_items, bool aligned, const lanes &L, uint16_t *tile, float4 *prm,
                                         float2 (*cells)[VQ_CU_TQ_CELLS], bulk &B) {
    const int enc_tokens = a.flushes * a.flush, enc_items = 2 * enc_units * a.H;
    if (item < enc_items) {
        /* item -> (K or V, head and unit): K and V of a (head, unit) in
         * turn, or (items below one_kind_items, see launch_one) the warps of
         * a thread block (items 4b .. 4b + 3) on 4 items of one kind, key
         * items in even thread blocks, value items in odd ones */
        const bool one_kind = PATHS == PATH_KIVI && item < one_kind_items;
        const bool value = one_kind ? (item / WARPS) & 1 : item & 1;
        const int hu = one_kind ? item / (2 * WARPS) * WARPS + item % WARPS : item >> 1;
        const int h = hu % a.H, u = hu / a.H;
        const int i0 = u * unit, cnt = enc_tokens - i0 < unit ? enc_tokens - i0 : unit;
        const vq_cu_method &m = value ? a.mv : a.mk;
        const size_t off = value ? a.k_bytes : 0;
        if (m.kind == VQ_CU_FP16) enc_fp16(a, aligned, off, value, h, i0, cnt, L);
        else if ((PATHS & PATH_KIVI) && m.kind == VQ_CU_KIVI) enc_kivi(a, aligned, m, value, h, i0, cnt, L, tile, prm, B);
        else if (PATHS & PATH_TQ) enc_tq_mse(a, aligned, m, off, value, h, i0, cnt, L, tile, cells[value], B);
        if (!value)
            for (int t = L.lane; t < cnt; t += 32) {
                int tb;
                uint8_t *blk = block_of(a, h, i0 + t, &tb);
                ((int32_t *)(blk + a.k_bytes + a.v_bytes))[tb] = pos_of(a, h, i0 + t);
            }
        return;
    }
    /* tokens that stay in (or join) the window */
    const int w = item - enc_items, h = w % a.H, j0 = (w / a.H) * unit;
    const int src0 = a.flushes ? enc_tokens : a.win_n, dst0 = a.flushes ? 0 : a.win_n;
    const int count = a.win_n + a.n - src0, cnt = count - j0 < unit ? count - j0 : unit;
    for (int r = 0; r < cnt; r += L.tpw * UNROLL / 2) {
        uint4 kv[UNROLL / 2], vv[UNROLL / 2];
#pragma unroll
        for (int u = 0; u < UNROLL / 2; u++) {
            int row = r + u * L.tpw + L.sub;
            if (L.on && row < cnt) {
                kv[u] = load8(a, aligned, h, src0 + j0 + row, L.c0, false);
                vv[u] = load8(a, aligned, h, src0 + j0 + row, L.c0, true);
            }
        }
#pragma unroll
        for (int u = 0; u < UNROLL / 2; u++) {
            int row = r + u * L.tpw + L.sub;
            if (!L.on || row >= cnt) continue;
            size_t o = ((size_t)h * a.win_cap + dst0 + j0 + row) * a.d + L.c0;
            *(uint4 *)(a.new_k + o) = to_f16x8(a, src0 + j0 + row, kv[u]);
            *(uint4 *)(a.new_v + o) = to_f16x8(a, src0 + j0 + row, vv[u]);
        }
    }
    for (int t = L.lane; t < cnt; t += 32)
        a.new_pos[(size_t)h * a.win_cap + dst0 + j0 + t] = pos_of(a, h, src0 + j0 + t);
}

/* At most 128 registers: 4 thread blocks (16 warps) per SM. KIVI alone at
 * 5 blocks (96 registers) spilled in the key paths and took 20-30 % longer
 * on an H200. tq-mse alone staged by bulk copies fits 5 blocks (20 warps)
 * without spills (72 registers then, 89 now), and its appends of 65536
 * tokens took 4 % less than at 4 blocks (6 blocks: the same as 5). */
#define APPEND_BLOCKS 4
#define TQ_BULK_BLOCKS 5
template <int PATHS, bool COPY>
__global__ void __launch_bounds__(WARPS * 32, PATHS == PATH_TQ && COPY ? TQ_BULK_BLOCKS : APPEND_BLOCKS)
    append_kernel(const __grid_constant__ vq_cu_append_args a, int unit, int enc_units, int items, bool aligned,
                  int one_kind_items) {
    extern __shared__ __align__(128) uint4 tiles[]; /* quantizers: one tile per warp, then one prm per warp
                                                      * (128-byte aligned tiles: the tensor copy's destination) */
    __shared__ float2 cells[2][VQ_CU_TQ_CELLS]; /* tq-mse cell tables, k then v */
    __shared__ uint64_t bars[WARPS];            /* one mbarrier per warp for its bulk copies */
    const int warp = threadIdx.x / 32;
    if (PATHS & PATH_TQ) tq_cell_table(threadIdx.x < VQ_CU_TQ_CELLS ? a.mk : a.mv, threadIdx.x % VQ_CU_TQ_CELLS,
                                       cells[threadIdx.x / VQ_CU_TQ_CELLS]);
    bulk B = {(unsigned)__cvta_generic_to_shared(&bars[warp]), 0, COPY};
    if (threadIdx.x % 32 == 0) {
        asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;\n" ::"r"(B.bar) : "memory");
        asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
    }
    __syncthreads();
    const lanes L = lanes_for(a.d);
    uint16_t *tile = (uint16_t *)tiles + (size_t)warp * tile_rows(a.d) * (a.d + 8);
    float4 *prm = (float4 *)((uint16_t *)tiles + (size_t)WARPS * tile_rows(a.d) * (a.d + 8)) +
                  (size_t)warp * prm_slots(a);
    const int item = blockIdx.x * WARPS + warp;
    if (item < items) run_item<PATHS>(a, item, unit, enc_units, one_kind_items, aligned, L, tile, prm, cells, B);
}

template <int PATHS, bool COPY>
static cudaError_t launch_one(const vq_cu_append_args *a, int unit, int enc_units, long long items, bool aligned,
                              size_t smem) {
    /* above the default 48 KB only at d = 256 with value groups of 32; 4
     * blocks still fit an SM */
    if (smem > 48 * 1024) {
        cudaError_t e =
            cudaFuncSetAttribute(append_kernel<PATHS, COPY>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
        if (e != cudaSuccess) return e;
    }
    /* KIVI, with at least two waves of thread blocks: thread blocks of key
     * items and thread blocks of value items (run_item) instead of two of
     * each kind in every thread block, which then ran as long as its key
     * items (the longer kind; a thread block's slot frees when its last
     * warp ends). H200, bf16 rows, 8 kv heads, d = 128, kivi 2-bit: 32768
     * tokens appended in 71.2-72.2 us instead of 75.3 (-4 to -5 %),
     * 131072 in 284-287 instead of 299, 16384 -2 to -4 %; kivi 4-bit 32768
     * -3 to -4 %. With fewer waves it did not pay: kivi 2-bit 6144 tokens
     * (1.45 waves) +4 %, 8192 (1.94) -0.5 to -1.3 %, 4096 (one wave) +4 %
     * (kivi 4-bit there -6 %) */
    const long long blocks = (items + WARPS - 1) / WARPS, enc_items = 2LL * enc_units * a->H;
    const int one_kind_items = PATHS == PATH_KIVI && blocks >= 2LL * a->n_sms * APPEND_BLOCKS
                                   ? (int)(enc_items / (2 * WARPS) * (2 * WARPS))
                                   : 0;
    append_kernel<PATHS, COPY><<<(unsigned)blocks, WARPS * 32, smem>>>(*a, unit, enc_units, (int)items, aligned,
                                                                       one_kind_items);
    return cudaGetLastError();
}

/* Quantizers have an instance that stages by bulk copies (fp16 or bf16
 * rows on 16-byte boundaries) and one that stages through registers (f32 or
 * unaligned rows). With both ways in one instance, ptxas spilled in the
 * KIVI paths (160 B of spill stores; 228 B once bf16 rows were converted in
 * the tile too, and an fp16 append then took 20 % longer: see the notes);
 * the bulk-copy instance alone spills nothing, and its fp16 appends are
 * 2-7 % faster than the shared instance's were. fp16 alone stages
 * nothing. */
template <int PATHS>
static cudaError_t launch(const vq_cu_append_args *a, int unit, int enc_units, long long items, bool aligned,
                          size_t smem) {
    if constexpr (PATHS != 0)
        if (aligned && a->dtype != VQ_F32) return launch_one<PATHS, true>(a, unit, enc_units, items, aligned, smem);
    return launch_one<PATHS, false>(a, unit, enc_units, items, aligned, smem);
}

/* 5 blocks of the tq-mse bulk-copy instance need 5 x 36 KB of shared
 * memory an SM: the carveout at its maximum (measured so; set once per
 * cache, on its device, rather than per launch, which one-token appends
 * would pay in host time). */
cudaError_t vq_cu_append_init(void) {
    return cudaFuncSetAttribute(append_kernel<PATH_TQ, true>, cudaFuncAttributePreferredSharedMemoryCarveout,
                                cudaSharedmemCarveoutMaxShared);
}

/* cuTensorMapEncodeTiled from the driver, through the runtime (no link to
 * the driver library); NULL where the driver has none. Looked up once (a
 * static's initializer: safe when several threads append at once). */
static PFN_cuTensorMapEncodeTiled_v12000 tensor_map_encoder(void) {
    static const PFN_cuTensorMapEncodeTiled_v12000 fn = [] {
        cudaDriverEntryPointQueryResult q;
        void *p = NULL;
        cudaError_t e = cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &p, 12000, cudaEnableDefault, &q);
        return e == cudaSuccess && q == cudaDriverEntryPointSuccess ? (PFN_cuTensorMapEncodeTiled_v12000)p : nullptr;
    }();
    return fn;
}

/* The new K and V rows ([n][H][d], fp16 or bf16 bits, 16-byte aligned) as
 * 2-D tensors of n rows of H d channels, boxes of 32 rows by d + 8
 * channels: a staged tile with its padding (stage_bulk). Only at head dims
 * 64 and 128 (32-row tiles; the box's row stays within its 256-element
 * limit). Returns whether both maps were made. */
static bool tensor_maps(vq_cu_append_args *a) {
    if ((a->d != 64 && a->d != 128) || a->dtype == VQ_F32 || a->n < 32) return false;
    PFN_cuTensorMapEncodeTiled_v12000 enc = tensor_map_encoder();
    if (!enc) return false;
    const cuuint64_t dims[2] = {(cuuint64_t)a->H * a->d, (cuuint64_t)a->n};
    const cuuint64_t stride[1] = {(cuuint64_t)a->H * a->d * 2};
    const cuuint32_t box[2] = {(cuuint32_t)a->d + 8, 32}, estride[2] = {1, 1};
    const void *src[2] = {a->k, a->v};
    for (int x = 0; x < 2; x++)
        if (enc(&a->tmap[x], CU_TENSOR_MAP_DATA_TYPE_UINT16, 2, (void *)src[x], dims, stride, box, estride,
                CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_NONE, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
                CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) != CUDA_SUCCESS)
            return false;
    return true;
}

cudaError_t vq_cu_launch_append(const vq_cu_append_args *args) {
    vq_cu_append_args b = *args;
    const vq_cu_append_args *a = &b;
    /* a unit holds whole key groups (flush tokens) and at least 32 tokens */
    int unit = a->flush >= 32 ? a->flush : 32;
    int enc_tokens = a->flushes * a->flush;
    int enc_units = (enc_tokens + unit - 1) / unit;
    int src0 = a->flushes ? enc_tokens : a->win_n;
    int count = a->win_n + a->n - src0;
    int win_units = (count + unit - 1) / unit;
    long long items = (long long)a->H * (2 * enc_units + win_units);
    if (items == 0) return cudaSuccess;
    bool quant = a->mk.kind != VQ_CU_FP16 || a->mv.kind != VQ_CU_FP16;
    size_t smem = quant ? (size_t)WARPS * tile_rows(a->d) * (a->d + 8) * sizeof(uint16_t) : 0;
    smem += (size_t)WARPS * prm_slots(*a) * sizeof(float4);
    bool aligned = ((uintptr_t)a->k | (uintptr_t)a->v) % 16 == 0;
    /* the kernel instances that stage by bulk copies (launch) */
    b.tmaps = quant && aligned && tensor_maps(&b);
    const int paths = (a->mk.kind == VQ_CU_KIVI || a->mv.kind == VQ_CU_KIVI ? PATH_KIVI : 0) |
                      (a->mk.kind == VQ_CU_TQ_MSE || a->mv.kind == VQ_CU_TQ_MSE ? PATH_TQ : 0);
    switch (paths) {
    case 0: return launch<0>(a, unit, enc_units, items, aligned, smem);
    case PATH_KIVI: return launch<PATH_KIVI>(a, unit, enc_units, items, aligned, smem);
    case PATH_TQ: return launch<PATH_TQ>(a, unit, enc_units, items, aligned, smem);
    default: return launch<PATH_KIVI | PATH_TQ>(a, unit, enc_units, items, aligned, smem);
    }
}
