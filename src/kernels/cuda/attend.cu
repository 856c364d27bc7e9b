/* Attention over CUDA caches: split-KV flash-decoding for any number of
 * query rows (decode and prefill chunks), then a reduction kernel.
 *
 * attend_kernel: one thread block per (partition of a stream's blocks,
 * kv head x chunk of query rows, sequence). The rows are the q heads of the
 * head's GQA group times the query tokens, so every K/V byte read serves all
 * of them. Per tile of tokens: scores (one thread per token), causal mask,
 * fp32 online softmax (one warp per row), then the values (one thread per
 * channel). The last partition also takes the fp16 window, except in
 * decode, where the window goes to the row kernel (attend_decode.cu).
 * Each block writes (max, sum, acc) per row. This kernel serves every
 * method and shape; decode over fp16, tq-mse 4-bit and KIVI 2/4-bit blocks
 * goes to kernels of their own (attend_decode.cu, attend_kivi.cu).
 *
 * reduce_kernel: one thread block per output row merges the partitions
 * (each warp a quarter of them, in a fixed order), applies tq-mse's inverse
 * rotation to the block part (values accumulate in the rotated domain),
 * adds the window part and writes fp32 or fp16.
 *
 * Decode over KIVI blocks launches no reduction kernel: the window's row
 * kernel is a programmatic dependent of the KIVI kernel (sm_90), which
 * lets it start as soon as the KIVI kernel's thread blocks have all
 * started, so the window runs beside it instead of after it; the window's
 * thread blocks then wait for the KIVI kernel's end and merge its
 * partials and the window into the output (attend_decode.cu). The KIVI
 * kernel is in turn a programmatic dependent of the stream's previous
 * kernel: after a decode's merge has seen its KIVI kernel end, the next
 * decode's KIVI thread blocks can become resident and wait there, which
 * takes their launch out of the time between two decode calls. */
#include "codes.cuh"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#define THREADS 128
#define TILE 128      /* tokens per tile: one per thread in the score step */
#define RMAX VQ_CU_RMAX
#define CPT (VQ_CU_MAX_DIM / THREADS) /* channels per thread in the value step */
/* Thread blocks to aim for per SM when choosing the partition count of
 * the generic kernel. */
#define BLOCKS_PER_SM 4
/* Thread blocks of the row decode kernels (attend_decode.cu) resident per
 * SM: about 168 registers x 128 threads each (the KIVI kernel's count is
 * asked of the runtime). */
#define DECODE_BLOCKS_PER_SM 3
/* Blocks per warp below which more decode partitions stop paying: each
 * warp's setup (q, key scales), its first block's latency (the cp.async
 * pipeline is one block deep) and its partial are fixed costs. */
#define DECODE_MIN_WARP_BLOCKS 4
/* Thread blocks per SM of the KIVI decode kernel when a shape gets one
 * wave (too few blocks for more): fewer, longer partitions, so each
 * warp's fixed costs (q, its first block's latency, its partial) weigh
 * less. H200, kivi 2-bit 1 x 32768 (2.6 -> 3.9 blocks per warp): 2 per SM
 * 25.9-26.1 us, the 3 resident 28.3 us. */
#define KIVI_ONE_WAVE_PER_SM 2

/* Whole waves of thread blocks that a decode launch starts from (fewer
 * while a warp would get under DECODE_MIN_WARP_BLOCKS blocks). H200, KIVI
 * 2-bit, two waves against three: 8 x 32768 84.6 -> 81.0 us (11 blocks per
 * warp instead of 7, fewer per-warp prologues and partials), 32 x 16384
 * -1.2 %, 8 x 131072 -0.3 %; fp16 and tq-mse 4-bit 8 x 16384 within 0.3 %. */
#define DECODE_WAVES 2

/* The most blocks a warp takes when parts partitions of a stream's
 * max_blocks blocks are split among warps warps each. */
static long long warp_blocks(int max_blocks, long long parts, int warps) {
    return ((max_blocks + parts - 1) / parts + warps - 1) / warps;
}

/* Partitions per (kv head, sequence) for the decode kernels, whose warps
 * take whole blocks: whole waves of thread blocks (a part-filled last wave
 * leaves SMs idle at the end), DECODE_WAVES or fewer, as
 * long as every warp keeps DECODE_MIN_WARP_BLOCKS blocks, else one wave of
 * at most one_wave_per_sm thread blocks per SM, each warp at least one
 * block; per_sm: the kernel's resident thread blocks per SM. Where the
 * busiest warp of one wave of longer partitions takes fewer blocks than
 * the busiest warps of the waves in turn (8 x 65536 KIVI 2-bit: 43 against
 * 2 x 22), one wave: a thread block's fixed costs (q, its first block's
 * latency, its partial, the merge of its warps) are paid once per slot, and
 * the merge has fewer partials. H200, one wave against two: KIVI 2-bit
 * 8 x 65536 -0.7 %, 1 x 131072 -11 %, fp16 8 x 16384 -2 %, tq-mse 4-bit
 * -7 %; where the counts tie, one wave measured +0.6 % (8 x 131072) and
 * -2.5 % (8 x 32768), so ties keep the waves. Earlier, KIVI 2-bit: 8 x
 * 131072 at 1.45 waves took 721 us, at 2.75 waves 661 us; 1 x 32768 at
 * 1.3 waves (2 blocks per warp) 46 us, at 0.65 waves (4 per warp) 42 us. */
static int decode_parts(int n_sms, int per_sm, int one_wave_per_sm, long long pairs, int max_blocks, int warps) {
    const long long slots = (long long)n_sms * per_sm;
    for (int waves = DECODE_WAVES; waves > 1; waves--) {
        long long parts = slots * waves / pairs;
        if (parts >= 1 && max_blocks >= parts * warps * DECODE_MIN_WARP_BLOCKS) {
            const long long one = slots / pairs;
            if (one >= 1 && warp_blocks(max_blocks, one, warps) < waves * warp_blocks(max_blocks, parts, warps))
                return (int)one;
            return (int)parts;
        }
    }
    long long parts = (long long)n_sms * (one_wave_per_sm < per_sm ? one_wave_per_sm : per_sm) / pairs,
              most = max_blocks / warps;
    parts = parts < most ? parts : most;
    return parts > 1 ? (int)parts : 1;
}

typedef vq_cu_attn params;

/* Element c of token t of a block payload, dequantized (tq-mse: in the
 * rotated domain, times the token's norm). */
__device__ __forceinline__ float deq(const vq_cu_method &m, const uint8_t *pay, int bt, int d, int t, int c) {
    if (m.kind == VQ_CU_FP16) return vq_cu_h2f(((const uint16_t *)pay)[(size_t)t * d + c]);
    const int cb = m.code_bytes;
    int code = vq_cu_code_at(pay + (size_t)t * cb, c, m.bits, d);
    const uint16_t *meta = (const uint16_t *)(pay + (size_t)bt * cb);
    if (m.kind == VQ_CU_KIVI) {
        float s, z;
        if (m.is_value) {
            int ng = (d + m.group - 1) / m.group;
            const uint16_t *mm = meta + ((size_t)t * ng + c / m.group) * 2;
            s = vq_cu_h2f(mm[0]);
            z = vq_cu_h2f(mm[1]);
        } else {
            const uint16_t *mm = meta + (size_t)(t / m.group) * 2 * d;
            s = vq_cu_h2f(mm[c]);
            z = vq_cu_h2f(mm[d + c]);
        }
        return __fadd_rn(__fmul_rn((float)code, s), z);
    }
    return vq_cu_h2f(meta[t]) * m.centroid[code];
}

struct attn_smem {
    float qa[RMAX][VQ_CU_MAX_DIM]; /* q * scale */
    float qr[RMAX][VQ_CU_MAX_DIM]; /* rotated (tq-mse keys) */
    float p[RMAX][TILE];
    float alpha[RMAX], m[RMAX], l[RMAX];
    int32_t qpos[RMAX];
};

/* One tile of n tokens: kp/vp are K and V payloads (or the window's fp16
 * rows), kpos their positions, t0 the first token inside them. */
__device__ void run_tile(const params &P, attn_smem &sm, int R, const vq_cu_method &mk, const vq_cu_method &mv,
                         const uint8_t *kp, const uint8_t *vp, int bt, const int32_t *kpos, int t0, int n,
                         float (&acc)[CPT][RMAX], float (&accw)[CPT][RMAX], bool into_w, bool rotated_q) {
    const int tid = threadIdx.x, d = P.d;
    if (tid < n) {
        float s[RMAX];
#pragma unroll
        for (int r = 0; r < RMAX; r++) s[r] = 0;
        for (int c = 0; c < d; c++) {
            float k = deq(mk, kp, bt, d, t0 + tid, c);
#pragma unroll
            for (int r = 0; r < RMAX; r++) s[r] += (rotated_q ? sm.qr[r][c] : sm.qa[r][c]) * k;
        }
        int32_t kp_pos = kpos[t0 + tid];
#pragma unroll
        for (int r = 0; r < RMAX; r++)
            if (r < R) sm.p[r][tid] = kp_pos > sm.qpos[r] ? -INFINITY : s[r];
    }
    __syncthreads();
    const int warp = tid / 32, lane = tid % 32;
    for (int r = warp; r < R; r += THREADS / 32) {
        float mb = -INFINITY;
        for (int j = lane; j < n; j += 32) mb = fmaxf(mb, sm.p[r][j]);
        for (int o = 16; o > 0; o /= 2) mb = fmaxf(mb, __shfl_xor_sync(0xffffffffu, mb, o));
        float mold = sm.m[r], mnew = fmaxf(mold, mb);
        float sum = 0;
        for (int j = lane; j < n; j += 32) {
            float e = mnew == -INFINITY ? 0.0f : __expf(sm.p[r][j] - mnew);
            sm.p[r][j] = e;
            sum += e;
        }
        for (int o = 16; o > 0; o /= 2) sum += __shfl_xor_sync(0xffffffffu, sum, o);
        __syncwarp();
        if (lane == 0) {
            float alpha = mold == -INFINITY ? 0.0f : __expf(mold - mnew);
            sm.alpha[r] = alpha;
            sm.l[r] = sm.l[r] * alpha + sum;
            sm.m[r] = mnew;
        }
    }
    __syncthreads();
#pragma unroll
    for (int i = 0; i < CPT; i++) {
        int c = tid + i * THREADS;
        if (c >= d) break;
#pragma unroll
        for (int r = 0; r < RMAX; r++) {
            float al = r < R ? sm.alpha[r] : 0.0f;
            acc[i][r] *= al;
            accw[i][r] *= al;
        }
        for (int j = 0; j < n; j++) {
            float v = deq(mv, vp, bt, d, t0 + j, c);
#pragma unroll
            for (int r = 0; r < RMAX; r++) {
                if (into_w) accw[i][r] += sm.p[r][j] * v;
                else acc[i][r] += sm.p[r][j] * v;
            }
        }
    }
    __syncthreads();
}

__global__ void __launch_bounds__(THREADS) attend_kernel(const __grid_constant__ params P) {
    __shared__ attn_smem sm;
    const int part = blockIdx.x, h = blockIdx.y / P.row_chunks, rc = blockIdx.y % P.row_chunks, seq = blockIdx.z;
    const int tid = threadIdx.x, d = P.d, r0 = rc * RMAX;
    const int R = P.rows - r0 < RMAX ? P.rows - r0 : RMAX;
    const vq_cu_seq S = vq_cu_seq_at(P, seq);
    for (int idx = tid; idx < RMAX * d; idx += THREADS) {
        int r = idx / d, c = idx % d;
        float x = 0;
        if (r < R) {
            int row = r0 + r, qi = row / P.g, j = row % P.g;
            x = P.q[(((size_t)seq * P.n_q + qi) * P.hq + (size_t)h * P.g + j) * d + c] * P.scale;
        }
        sm.qa[r][c] = x;
        sm.qr[r][c] = P.mk.kind == VQ_CU_TQ_MSE ? x * P.mk.signs[c] : x;
    }
    if (tid < RMAX) {
        int row = r0 + tid, qi = row / P.g;
        sm.qpos[tid] = vq_cu_has_qpos(P) && tid < R ? vq_cu_qpos_at(P, (size_t)seq * P.n_q + qi) : INT32_MAX;
        sm.m[tid] = -INFINITY;
        sm.l[tid] = 0;
    }
    __syncthreads();
    if (P.mk.kind == VQ_CU_TQ_MSE) { /* q -> R q: signs (above), Hadamard, 1/sqrt(d) */
        for (int hh = 1; hh < d; hh *= 2) {
            for (int idx = tid; idx < RMAX * d / 2; idx += THREADS) {
                int r = idx / (d / 2), k = idx % (d / 2), j = (k / hh) * 2 * hh + k % hh;
                float x = sm.qr[r][j], y = sm.qr[r][j + hh];
                sm.qr[r][j] = x + y;
                sm.qr[r][j + hh] = x - y;
            }
            __syncthreads();
        }
        float sc = 1.0f / sqrtf((float)d);
        for (int idx = tid; idx < RMAX * d; idx += THREADS) sm.qr[idx / d][idx % d] *= sc;
        __syncthreads();
    }
    float acc[CPT][RMAX], accw[CPT][RMAX];
#pragma unroll
    for (int i = 0; i < CPT; i++)
#pragma unroll
        for (int r = 0; r < RMAX; r++) acc[i][r] = accw[i][r] = 0;
    const int n_blocks = (S.n_quant + P.bt - 1) / P.bt;
    const int b0 = part * P.part_blocks;
    const int b1 = b0 + P.part_blocks < n_blocks ? b0 + P.part_blocks : n_blocks;
    const bool rot = P.mk.kind == VQ_CU_TQ_MSE;
    for (int b = b0; b < b1; b++) {
        const uint8_t *blk = S.table[(size_t)h * P.max_blocks + b];
        int n = S.n_quant - b * P.bt < P.bt ? S.n_quant - b * P.bt : P.bt;
        const int32_t *kpos = (const int32_t *)(blk + P.k_bytes + P.v_bytes);
        for (int t0 = 0; t0 < n; t0 += TILE)
            run_tile(P, sm, R, P.mk, P.mv, blk, blk + P.k_bytes, P.bt, kpos, t0, n - t0 < TILE ? n - t0 : TILE, acc,
                     accw, false, rot);
    }
    /* the window: all of it in the last partition */
    const int w1 = P.generic_window && part == P.n_parts - 1 ? S.win_n : 0;
    if (w1 > 0) {
        /* the window holds plain fp16 rows: score with q itself and, when
         * the values method has its own domain, sum into accw */
        vq_cu_method f16;
        memset(&f16, 0, sizeof f16);
        f16.kind = VQ_CU_FP16;
        f16.code_bytes = 2 * d;
        const size_t wo = (size_t)h * P.win_cap;
        const uint8_t *wk = (const uint8_t *)(S.win_k + wo * d), *wv = (const uint8_t *)(S.win_v + wo * d);
        for (int t0 = 0; t0 < w1; t0 += TILE) {
            int n = w1 - t0 < TILE ? w1 - t0 : TILE;
            run_tile(P, sm, R, f16, f16, wk, wv, P.win_cap, S.win_pos + wo, t0, n, acc, accw, P.split, false);
        }
    }
    float *out = P.partials +
                 ((((size_t)seq * P.hkv + h) * P.row_chunks + rc) * P.n_parts + part) * RMAX * (size_t)P.part_w;
    if (tid < R) {
        out[(size_t)tid * P.part_w] = sm.m[tid];
        out[(size_t)tid * P.part_w + 1] = sm.l[tid];
    }
#pragma unroll
    for (int i = 0; i < CPT; i++) {
        int c = tid + i * THREADS;
        if (c >= d) break;
#pragma unroll
        for (int r = 0; r < RMAX; r++) {
            if (r >= R) break;
            out[(size_t)r * P.part_w + VQ_CU_PART_ACC + c] = acc[i][r];
            if (P.split) out[(size_t)r * P.part_w + VQ_CU_PART_ACC + d + c] = accw[i][r];
        }
    }
}

/* max (is_max) or sum of v over the thread block, in a fixed order; every
 * thread gets the result. */
__device__ float block_reduce(float v, bool is_max, float *red) {
    for (int o = 16; o > 0; o /= 2) {
        float x = __shfl_xor_sync(0xffffffffu, v, o);
        v = is_max ? fmaxf(v, x) : v + x;
    }
    if (threadIdx.x % 32 == 0) red[threadIdx.x / 32] = v;
    __syncthreads();
    v = red[0];
    for (int w = 1; w < THREADS / 32; w++) v = is_max ? fmaxf(v, red[w]) : v + red[w];
    __syncthreads();
    return v;
}

/* Partitions each reduction warp has in flight. */
#define RED_BATCH 4
/* 16-byte loads per lane that cover a partial's acc (and accw): 2 * 256
 * floats / 4 / 32 lanes. */
#define RED_V4 (2 * VQ_CU_MAX_DIM / 128)

/* One thread block per output row (grid: rows, kv heads, sequences). Warp
 * w sums partitions w, w + 4, ... in a fixed order, RED_BATCH of them in
 * flight with 16-byte loads (a serial loop over the partials would be a
 * chain of memory latencies, about 0.4 us each); the warps' sums are then
 * added in a fixed order. */
__global__ void __launch_bounds__(THREADS) reduce_kernel(const __grid_constant__ params P) {
    constexpr int RW = THREADS / 32;
    __shared__ float acc[VQ_CU_MAX_DIM];
    __shared__ __align__(16) float wsum[RW][2 * VQ_CU_MAX_DIM];
    __shared__ float red[RW];
    const int row = blockIdx.x, h = blockIdx.y, seq = blockIdx.z, tid = threadIdx.x, d = P.d;
    const int warp = tid / 32, lane = tid % 32;
    const int rc = row / RMAX, r = row % RMAX;
    if (row >= P.rows) return;
    const float *base = P.partials + (((size_t)seq * P.hkv + h) * P.row_chunks + rc) * P.n_parts * RMAX * (size_t)P.part_w;
    float M = -INFINITY;
    for (int p = tid; p < P.n_parts; p += THREADS) M = fmaxf(M, base[((size_t)p * RMAX + r) * P.part_w]);
    M = block_reduce(M, true, red);
    float L = 0;
    for (int p = tid; p < P.n_parts; p += THREADS) {
        const float *pr = base + ((size_t)p * RMAX + r) * P.part_w;
        L += pr[0] == -INFINITY ? 0.0f : pr[1] * __expf(pr[0] - M);
    }
    L = block_reduce(L, false, red);
    const int width = d * (P.split ? 2 : 1);
    float4 s[RED_V4];
#pragma unroll
    for (int i = 0; i < RED_V4; i++) s[i] = make_float4(0, 0, 0, 0);
    for (int p0 = warp; p0 < P.n_parts; p0 += RED_BATCH * RW) {
        float pm[RED_BATCH];
        float4 x[RED_BATCH][RED_V4];
#pragma unroll
        for (int k = 0; k < RED_BATCH; k++) {
            const int p = p0 + k * RW;
            const float *pr = base + ((size_t)p * RMAX + r) * P.part_w;
            pm[k] = p < P.n_parts ? pr[0] : -INFINITY;
#pragma unroll
            for (int i = 0; i < RED_V4; i++) {
                const int c = 4 * (lane + 32 * i);
                x[k][i] = p < P.n_parts && c < width ? *(const float4 *)(pr + VQ_CU_PART_ACC + c) : make_float4(0, 0, 0, 0);
            }
        }
#pragma unroll
        for (int k = 0; k < RED_BATCH; k++) {
            const float w = pm[k] == -INFINITY ? 0.0f : __expf(pm[k] - M);
#pragma unroll
            for (int i = 0; i < RED_V4; i++) {
                s[i].x += x[k][i].x * w;
                s[i].y += x[k][i].y * w;
                s[i].z += x[k][i].z * w;
                s[i].w += x[k][i].w * w;
            }
        }
    }
#pragma unroll
    for (int i = 0; i < RED_V4; i++) {
        const int c = 4 * (lane + 32 * i);
        if (c < width) *(float4 *)&wsum[warp][c] = s[i];
    }
    __syncthreads();
    float a[CPT], aw[CPT];
#pragma unroll
    for (int i = 0; i < CPT; i++) {
        const int c = tid + i * THREADS;
        a[i] = aw[i] = 0;
        for (int w = 0; w < RW && c < d; w++) {
            a[i] += wsum[w][c];
            if (P.split) aw[i] += wsum[w][d + c];
        }
    }
    if (P.split) { /* acc = R^T a: Hadamard, then signs and 1/sqrt(d) */
#pragma unroll
        for (int i = 0; i < CPT; i++)
            if (tid + i * THREADS < d) acc[tid + i * THREADS] = a[i];
        __syncthreads();
        for (int hh = 1; hh < d; hh *= 2) {
            for (int k = tid; k < d / 2; k += THREADS) {
                int j = (k / hh) * 2 * hh + k % hh;
                float x = acc[j], y = acc[j + hh];
                acc[j] = x + y;
                acc[j + hh] = x - y;
            }
            __syncthreads();
        }
        float sc = 1.0f / sqrtf((float)d);
#pragma unroll
        for (int i = 0; i < CPT; i++) {
            int c = tid + i * THREADS;
            if (c < d) a[i] = acc[c] * sc * P.mv.signs[c] + aw[i];
        }
    }
    int qi = (rc * RMAX + r) / P.g, j = (rc * RMAX + r) % P.g;
    size_t off = (((size_t)seq * P.n_q + qi) * P.hq + (size_t)h * P.g + j) * d;
    float inv = L > 0 ? 1.0f / L : 0.0f;
#pragma unroll
    for (int i = 0; i < CPT; i++) {
        int c = tid + i * THREADS;
        if (c >= d) break;
        if (P.out_f16) ((uint16_t *)P.out)[off + c] = vq_cu_f2h(a[i] * inv);
        else ((float *)P.out)[off + c] = a[i] * inv;
    }
}

extern "C" vq_status vq_cuda_attend(vq_cache *const *caches, int n, int layer, const vq_attend_args *a) {
    const vq_cache *c = caches[0];
    struct vq_cuda_cache *g = c->cuda;
    cudaError_t e = cudaSetDevice(g->dev);
    if (e != cudaSuccess) return vq_cu_fail(e, "selecting the device");
    const int H = c->cfg.n_heads_kv, d = c->cfg.head_dim;
    params P;
    memset(&P, 0, sizeof P);
    P.mk = g->mk;
    P.mv = g->mv;
    P.d = d;
    P.bt = c->block_tokens;
    P.win_cap = c->win_cap;
    P.g = c->cfg.n_heads_q / H;
    P.n_q = a->n_q;
    P.hq = c->cfg.n_heads_q;
    P.hkv = H;
    P.rows = a->n_q * P.g;
    P.row_chunks = (P.rows + RMAX - 1) / RMAX;
    P.max_blocks = g->max_blocks;
    P.split = g->mv.kind == VQ_CU_TQ_MSE;
    P.part_w = VQ_CU_PART_ACC + d * (P.split ? 2 : 1);
    P.k_bytes = c->k_bytes;
    P.v_bytes = c->v_bytes;
    P.scale = a->scale > 0 ? a->scale : 1.0f / sqrtf((float)d);
    P.q = a->q;
    int max_blocks = 0;
    for (int i = 0; i < n; i++) {
        int nb = (int)((caches[i]->streams[(size_t)layer * H].n_quant + P.bt - 1) / P.bt);
        max_blocks = nb > max_blocks ? nb : max_blocks;
    }
    P.block_bytes = c->block_bytes;
    /* decode: the fp16 window in the row kernel (one partial per kv head,
     * in the same launch as the blocks of an fp16 cache), the blocks of
     * fp16, KIVI 2/4-bit and tq-mse 4-bit caches in kernels of their own;
     * everything else in the generic kernel */
    const bool decode = vq_cu_rows_decode_ok(&P);
    const bool kivi = decode && max_blocks > 0 && vq_cu_kivi_fast_ok(&P);
    const bool f16 = decode && max_blocks > 0 && P.mk.kind == VQ_CU_FP16 && P.mv.kind == VQ_CU_FP16;
    const bool tq4 = decode && max_blocks > 0 && vq_cu_tq4_decode_ok(&P);
    long long pairs = (long long)n * H * P.row_chunks;
    int parts;
    if (kivi || f16 || tq4) {
        const int per_sm = kivi ? vq_cu_kivi_resident(&P) : DECODE_BLOCKS_PER_SM;
        parts = decode_parts(g->n_sms, per_sm, kivi ? KIVI_ONE_WAVE_PER_SM : per_sm, pairs, max_blocks,
                             kivi ? VQ_CU_KIVI_WARPS : VQ_CU_ROWS_WARPS);
    } else { /* enough thread blocks to fill the GPU, a partition at least one block */
        long long want = ((long long)g->n_sms * BLOCKS_PER_SM + pairs - 1) / pairs;
        parts = (int)(want < max_blocks ? want : max_blocks);
        if (parts < 1) parts = 1;
    }
    P.part_blocks = max_blocks ? (max_blocks + parts - 1) / parts : 1;
    const int block_parts = max_blocks ? (max_blocks + P.part_blocks - 1) / P.part_blocks : decode ? 0 : 1;
    P.n_parts = block_parts + (decode ? 1 : 0);
    P.generic_window = !decode;
    if (pairs * P.n_parts > 65535LL * 65535LL || (long long)H * P.row_chunks > 65535)
        return vq_fail(VQ_ERR_ARG, "n_q=%d gives too many row chunks for one launch (at most %d rows per kv head)",
                       a->n_q, 65535 / H * RMAX);
    /* the sequences' descriptors and q positions: inline when they fit,
     * else uploaded to the staging buffer */
    size_t desc_bytes = sizeof(vq_cu_seq) * (size_t)n;
    size_t n_qpos = a->q_pos ? (size_t)n * a->n_q : 0;
    bool inline_seqs = n <= VQ_CU_INLINE_SEQS, inline_qpos = n_qpos <= VQ_CU_INLINE_QPOS;
    vq_cu_seq *host = inline_seqs ? P.inline_seqs : (vq_cu_seq *)malloc(desc_bytes);
    if (!host) return vq_fail(VQ_ERR_NOMEM, "out of memory for %d sequence descriptors", n);
    for (int i = 0; i < n; i++) {
        const vq_cache *ci = caches[i];
        const struct vq_cuda_cache *gi = ci->cuda;
        const vq_stream *s = &ci->streams[(size_t)layer * H];
        size_t so = (size_t)layer * H;
        int sel = gi->win_sel[layer];
        host[i].table = gi->table_dev + so * gi->max_blocks;
        host[i].win_k = gi->win_k[sel] + so * ci->win_cap * d;
        host[i].win_v = gi->win_v[sel] + so * ci->win_cap * d;
        host[i].win_pos = gi->win_pos[sel] + so * ci->win_cap;
        host[i].n_quant = (int)s->n_quant;
        host[i].win_n = s->win_n;
        if (gi->max_blocks != g->max_blocks) {
            if (!inline_seqs) free(host);
            return vq_fail(VQ_ERR_ARG, "vq_attend_batch: cache %d has capacity %lld, cache 0 has %lld (they must match)",
                           i, (long long)ci->cfg.capacity, (long long)c->cfg.capacity);
        }
    }
    size_t up_desc = inline_seqs ? 0 : desc_bytes, up_qpos = inline_qpos ? 0 : n_qpos * sizeof(int32_t);
    if (up_desc + up_qpos) {
        vq_status st = vq_cu_staging(g, up_desc + up_qpos);
        if (st) {
            if (!inline_seqs) free(host);
            return st;
        }
    }
    e = cudaSuccess;
    if (up_desc) {
        e = cudaMemcpyAsync(g->staging, host, desc_bytes, cudaMemcpyHostToDevice, 0);
        free(host);
        P.seqs = (const vq_cu_seq *)g->staging;
    } else {
        P.n_inline_seqs = n;
    }
    if (e == cudaSuccess && up_qpos) {
        e = cudaMemcpyAsync((char *)g->staging + up_desc, a->q_pos, up_qpos, cudaMemcpyHostToDevice, 0);
        P.qpos = (const int32_t *)((char *)g->staging + up_desc);
    } else if (n_qpos) {
        memcpy(P.inline_qpos, a->q_pos, n_qpos * sizeof(int32_t));
        P.n_inline_qpos = (int)n_qpos;
    }
    if (e != cudaSuccess) return vq_cu_fail(e, "uploading attention arguments");
    size_t pbytes = sizeof(float) * (size_t)n * H * P.row_chunks * P.n_parts * RMAX * P.part_w;
    if (g->partial_bytes < pbytes) {
        cudaFree(g->partials);
        g->partials = NULL;
        g->partial_bytes = 0;
        e = cudaMalloc(&g->partials, pbytes);
        if (e != cudaSuccess) return vq_cu_fail(e, "allocating attention partials");
        g->partial_bytes = pbytes;
    }
    P.partials = g->partials;
    P.out = a->out;
    P.out_f16 = a->out_dtype == VQ_F16;
    if (kivi) { /* the window's kernel merges: no reduction kernel */
        P.pdl = 1;
        P.pdl_prior = 1;
        e = vq_cu_kivi_fast_launch(&P, block_parts, n);
        if (e == cudaSuccess) e = vq_cu_kivi_window_launch(&P, n);
        return e == cudaSuccess ? VQ_OK : vq_cu_fail(e, "launching attention");
    }
    if (f16) { /* the blocks and the window in one launch */
        e = vq_cu_fp16_decode_launch(&P, P.n_parts, n, 0);
    } else {
        if (tq4) {
            e = vq_cu_tq4_decode_launch(&P, block_parts, n);
        } else if (block_parts) {
            attend_kernel<<<dim3(block_parts, H * P.row_chunks, n), THREADS>>>(P);
            e = cudaGetLastError();
        }
        if (e == cudaSuccess && decode) e = vq_cu_fp16_decode_launch(&P, 1, n, P.n_parts - 1);
    }
    if (e == cudaSuccess) {
        reduce_kernel<<<dim3(P.row_chunks * RMAX, H, n), THREADS>>>(P);
        e = cudaGetLastError();
    }
    return e == cudaSuccess ? VQ_OK : vq_cu_fail(e, "launching attention");
}
