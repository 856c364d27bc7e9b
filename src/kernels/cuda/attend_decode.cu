/* Decode attention over rows that a warp reads token by token (one query
 * token, head dims 64, 128 and 256, up to 8 q heads per kv head): fp16 rows
 * (the blocks of fp16 caches and the fp16 window of every cache) and 4-bit
 * tq-mse codes.
 *
 * LPT = d / 8 lanes per token, 8 channels per lane: one load instruction
 * covers 32 / LPT whole rows, coalesced (fp16: 16 bytes per lane; tq-mse
 * 4-bit: 4 bytes, the lane's 8 codes, and the token's norm). Each lane
 * turns its 8 elements into fp32 (tq-mse: the centroids, looked up with a
 * shuffle from the lanes that hold the 16 of them), multiplies them by all
 * G q heads of the GQA group (q in fp32 registers: every byte read serves
 * every head), then the LPT lanes of a token sum their products with a
 * reduce-scatter (each shuffle step halves the number of heads a lane
 * carries), which leaves lane li of the token with the score of head
 * li / (LPT / G). Softmax is fp32 and online, per chunk of tokens; each
 * lane then adds p * v for its 8 channels and all heads. Partial sums over
 * the tokens of one lane slot are combined across the slots and the warps
 * at the end, and the thread block writes one partial (max, sum, acc) for
 * the reduction kernel (attend.cu).
 *
 * tq-mse works in the rotated domain: q is rotated once per thread block
 * (signs, Hadamard transform, 1/sqrt(d)); the values' sum stays rotated and
 * the reduction rotates it back.
 *
 * Token sources: the blocks of the stream (a partition, warps taking whole
 * blocks in turn) or, for the last partial slot, the stream's fp16 window
 * (warps taking WIN_SEG-token pieces in turn).
 *
 * Beside the KIVI kernel (MERGE, head dim 128): the window's thread block
 * of each (kv head, sequence) is launched as a programmatic dependent of
 * the KIVI kernel, takes the window while that kernel runs, keeps its own
 * state in shared memory, then waits for the KIVI kernel's end and merges
 * its partials and the window into the output itself: no reduction
 * kernel, whose launch, wait and passes over the partials were most of
 * the time of a decode call at batch 1 (bench/results notes, v17-v19). */
#include "codes.cuh"

#include <math.h>

#define WARPS VQ_CU_ROWS_WARPS
#define WIN_SEG 32 /* window tokens per warp piece */
/* KIVI partials whose loads a merging warp issues together, one per lane
 * for the max and sum: one memory latency per MERGE_BATCH partials (at
 * batch 1 the 32 KIVI thread blocks per kv head of one H200 wave take one
 * round). */
#define MERGE_BATCH 32

/* Row formats. */
enum { ROWS_FP16 = 0, ROWS_TQ4 = 1 };

/* The channel of lane li's element e: fp16, 8 consecutive channels; 4-bit
 * codes (byte j holds channels j and j + d/2), the two nibbles of bytes
 * 4 li .. 4 li + 3. */
template <int FMT, int D>
static __device__ __forceinline__ int lane_channel(int li, int e) {
    if (FMT == ROWS_FP16) return li * 8 + e;
    return (e < 4 ? 0 : D / 2) + 4 * li + (e & 3);
}

/* Lane's 8 elements of a row as fp32: x holds the 8 halves (fp16) or the 8
 * codes in x.x (4-bit), cent the lane's centroid (lane % 16). */
template <int FMT>
static __device__ __forceinline__ void row_values(uint4 x, float cent, float (&f)[8]) {
    if (FMT == ROWS_FP16) {
        const uint32_t w[4] = {x.x, x.y, x.z, x.w};
#pragma unroll
        for (int k = 0; k < 4; k++) {
            float2 v = __half22float2(*(const __half2 *)&w[k]);
            f[2 * k] = v.x;
            f[2 * k + 1] = v.y;
        }
    } else {
#pragma unroll
        for (int e = 0; e < 8; e++)
            f[e] = __shfl_sync(0xffffffffu, cent, (x.x >> (8 * (e & 3) + 4 * (e >> 2))) & 15);
    }
}

/* Sums s over the LPT lanes of a token, scattering the heads: returns the
 * full sum of head li / (LPT / G), li = lane % LPT. */
template <int G, int LPT>
static __device__ __forceinline__ float reduce_scatter(float (&s)[G], int li) {
    int n = G;
#pragma unroll
    for (int o = LPT / 2; o > 0; o /= 2) {
        if (n > 1) { /* the upper half of the lanes keeps the upper half of the heads */
            const bool up = (li & o) != 0;
#pragma unroll
            for (int e = 0; e < G / 2; e++) {
                if (e < n / 2) {
                    float send = up ? s[e] : s[e + n / 2];
                    float keep = up ? s[e + n / 2] : s[e];
                    s[e] = keep + __shfl_xor_sync(0xffffffffu, send, o);
                }
            }
            n /= 2;
        } else {
            s[0] += __shfl_xor_sync(0xffffffffu, s[0], o);
        }
    }
    return s[0];
}

/* MERGE: the window's row of head hh after the KIVI kernel's partials of
 * (kv head h, sequence seq): slots [0, P.n_parts - 1) read from the
 * partials, the window's state (wm, wl natural-log max and sum, wacc) from
 * shared memory; fixed order (the partials in slot order, then the
 * window), so repeated decodes give the same bits. One warp per row, 4
 * channels per lane (d = 128). Each round issues the loads of MERGE_BATCH
 * partials (max and sum: lane k for partial k; the channels: all of them
 * per lane) before their first use, then rescales the running sums. */
static __device__ void merge_row(const vq_cu_attn &P, int h, int seq, int hh, float wm, float wl, const float *wacc,
                                 int lane) {
    constexpr int D = 128;
    const int nk = P.n_parts - 1;
    const float *base = P.partials + ((size_t)seq * P.hkv + h) * P.n_parts * VQ_CU_RMAX * (size_t)P.part_w +
                        (size_t)hh * P.part_w;
    const size_t slot_w = (size_t)VQ_CU_RMAX * P.part_w;
    float M = -INFINITY, L = 0; /* L: this lane's share (partials lane, lane + 32, ...) */
    float4 A = make_float4(0, 0, 0, 0);
    for (int p0 = 0; p0 < nk; p0 += MERGE_BATCH) {
        const int pl = p0 + lane;
        float mp = -INFINITY, lp = 0;
        if (pl < nk) {
            mp = __ldcg(base + pl * slot_w);
            lp = __ldcg(base + pl * slot_w + 1);
        }
        float4 x[MERGE_BATCH];
#pragma unroll
        for (int k = 0; k < MERGE_BATCH; k++)
            x[k] = p0 + k < nk ? __ldcg((const float4 *)(base + (p0 + k) * slot_w + VQ_CU_PART_ACC) + lane)
                               : make_float4(0, 0, 0, 0);
        float mb = mp;
#pragma unroll
        for (int o = 16; o > 0; o /= 2) mb = fmaxf(mb, __shfl_xor_sync(0xffffffffu, mb, o));
        const float mnew = fmaxf(M, mb);
        const float f = M == -INFINITY ? 0.0f : __expf(M - mnew);
        const float w = mp == -INFINITY ? 0.0f : __expf(mp - mnew);
        M = mnew;
        L = L * f + lp * w;
        A.x *= f, A.y *= f, A.z *= f, A.w *= f;
#pragma unroll
        for (int k = 0; k < MERGE_BATCH; k++) {
            const float wk = __shfl_sync(0xffffffffu, w, k);
            A.x = fmaf(x[k].x, wk, A.x);
            A.y = fmaf(x[k].y, wk, A.y);
            A.z = fmaf(x[k].z, wk, A.z);
            A.w = fmaf(x[k].w, wk, A.w);
        }
    }
    /* the lanes' shares of L were rescaled alike: sum them in a fixed order */
#pragma unroll
    for (int o = 16; o > 0; o /= 2) L += __shfl_xor_sync(0xffffffffu, L, o);
    const float mnew = fmaxf(M, wm);
    const float f = M == -INFINITY ? 0.0f : __expf(M - mnew), w = wm == -INFINITY ? 0.0f : __expf(wm - mnew);
    L = L * f + wl * w;
    A.x = fmaf(wacc[4 * lane], w, A.x * f);
    A.y = fmaf(wacc[4 * lane + 1], w, A.y * f);
    A.z = fmaf(wacc[4 * lane + 2], w, A.z * f);
    A.w = fmaf(wacc[4 * lane + 3], w, A.w * f);
    const float inv = L > 0 ? 1.0f / L : 0.0f;
    const size_t off = ((size_t)seq * P.hq + (size_t)h * P.g + hh) * D + 4 * lane; /* one query token */
    const float o[4] = {A.x * inv, A.y * inv, A.z * inv, A.w * inv};
#pragma unroll
    for (int e = 0; e < 4; e++) {
        if (P.out_f16) ((uint16_t *)P.out)[off + e] = vq_cu_f2h(o[e]);
        else ((float *)P.out)[off + e] = o[e];
    }
}

/* The thread block's warps' states of head hh at channel c: the largest
 * max M (log2 units), and the sum L and channel c's accumulator A
 * rescaled to it. */
template <int G, int D>
__device__ __forceinline__ void combine_warps(const float (*red_m)[G], const float (*red_l)[G],
                                              const float (*red_acc)[G][D], int hh, int c, float &M, float &L,
                                              float &A) {
    M = -INFINITY;
#pragma unroll
    for (int w = 0; w < WARPS; w++) M = fmaxf(M, red_m[w][hh]);
    L = 0;
    A = 0;
#pragma unroll
    for (int w = 0; w < WARPS; w++) {
        const float f = red_m[w][hh] == -INFINITY ? 0.0f : exp2f(red_m[w][hh] - M);
        L += red_l[w][hh] * f;
        A += red_acc[w][hh][c] * f;
    }
}

/* The merging instances (KIVI's window, up to 4 q heads per kv head) are held
 * to 3 thread blocks per SM (168 registers): uncapped they take 205, and then
 * the next decode's KIVI thread blocks, which start early and wait beside
 * them, cannot fit. A minimum of 0 leaves every other instance exactly as
 * ptxas allocates it without one (an explicit 1 does not: fp16 went 168 ->
 * 206 registers and 2.7 % slower). */
template <int FMT, int D, int G, int U, bool MERGE>
__global__ void __launch_bounds__(WARPS * 32, MERGE && G <= 4 ? 3 : 0) rows_decode(const __grid_constant__ vq_cu_attn P, int first_slot) {
    constexpr int LPT = D / 8, TPI = 32 / LPT, HL = LPT / G; /* HL lanes per head inside a token */
    static_assert(!MERGE || (FMT == ROWS_FP16 && D == 128), "the merge is the KIVI window's (d = 128)");
    __shared__ float red_m[WARPS][G], red_l[WARPS][G];
    __shared__ float red_acc[WARPS][G][D]; /* tq-mse: q rotated, first */
    __shared__ float win_ml[MERGE ? G : 1][2]; /* MERGE: the window's max (natural log) and sum per head */
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, li = lane % LPT, slot = lane / LPT;
    const int h = blockIdx.y, seq = blockIdx.z, g = P.g;
    const vq_cu_seq S = vq_cu_seq_at(P, seq);
    const int my_head = li / HL;
    const int slot_idx = first_slot + blockIdx.x;
    const bool window = FMT == ROWS_FP16 && slot_idx == P.n_parts - 1;

    /* q (scaled for exp2) of every head, lane's 8 channels */
    const float qs = P.scale * 1.4426950408889634f;
    const float *qg = P.q + ((size_t)seq * P.hq + (size_t)h * g) * D;
    float q[G][8];
    if (FMT == ROWS_FP16) {
#pragma unroll
        for (int hh = 0; hh < G; hh++) {
            float4 a = make_float4(0, 0, 0, 0), b = a;
            if (hh < g) {
                a = *(const float4 *)(qg + hh * D + li * 8);
                b = *(const float4 *)(qg + hh * D + li * 8 + 4);
            }
            q[hh][0] = a.x * qs, q[hh][1] = a.y * qs, q[hh][2] = a.z * qs, q[hh][3] = a.w * qs;
            q[hh][4] = b.x * qs, q[hh][5] = b.y * qs, q[hh][6] = b.z * qs, q[hh][7] = b.w * qs;
        }
    } else { /* R q = H (signs * q) / sqrt(d), in shared memory */
        float(*qr)[D] = red_acc[0];
        for (int idx = threadIdx.x; idx < G * D; idx += WARPS * 32) {
            const int hh = idx / D, c = idx % D;
            qr[hh][c] = hh < g ? qg[hh * D + c] * P.mk.signs[c] : 0.0f;
        }
        __syncthreads();
        for (int hs = 1; hs < D; hs *= 2) {
            for (int idx = threadIdx.x; idx < G * D / 2; idx += WARPS * 32) {
                const int hh = idx / (D / 2), k = idx % (D / 2), j = (k / hs) * 2 * hs + k % hs;
                const float x = qr[hh][j], y = qr[hh][j + hs];
                qr[hh][j] = x + y;
                qr[hh][j + hs] = x - y;
            }
            __syncthreads();
        }
        const float qsr = qs / sqrtf((float)D);
#pragma unroll
        for (int hh = 0; hh < G; hh++)
#pragma unroll
            for (int e = 0; e < 8; e++) q[hh][e] = qr[hh][lane_channel<FMT, D>(li, e)] * qsr;
        __syncthreads(); /* red_acc is written again at the end */
    }
    /* tq-mse: lane's centroid, for the shuffle lookups */
    const float cent_k = FMT == ROWS_TQ4 ? P.mk.centroid[lane & 15] : 0.0f;
    const float cent_v = FMT == ROWS_TQ4 ? P.mv.centroid[lane & 15] : 0.0f;
    const int32_t qpos = vq_cu_has_qpos(P) ? vq_cu_qpos_at(P, seq) : INT32_MAX;

    float m = -INFINITY, l = 0; /* head my_head, this lane slot's tokens (log2 units) */
    float acc[G][8];
#pragma unroll
    for (int hh = 0; hh < G; hh++)
#pragma unroll
        for (int e = 0; e < 8; e++) acc[hh][e] = 0;

    /* the warp's pieces: whole blocks of the partition, or window pieces */
    int first, end;
    if (window) {
        first = 0;
        end = (S.win_n + WIN_SEG - 1) / WIN_SEG;
    } else {
        const int n_blocks = (S.n_quant + P.bt - 1) / P.bt;
        first = slot_idx * P.part_blocks;
        end = min(first + P.part_blocks, n_blocks);
    }
    for (int piece = first + warp; piece < end; piece += WARPS) {
        const uint8_t *K, *V;
        const int32_t *pos;
        int n;
        if (window) {
            const size_t off = (size_t)h * P.win_cap + (size_t)piece * WIN_SEG;
            K = (const uint8_t *)(S.win_k + off * D);
            V = (const uint8_t *)(S.win_v + off * D);
            pos = S.win_pos + off;
            n = min(WIN_SEG, S.win_n - piece * WIN_SEG);
        } else {
            K = S.table[(size_t)h * P.max_blocks + piece];
            V = K + P.k_bytes;
            pos = (const int32_t *)(K + P.k_bytes + P.v_bytes);
            n = min(P.bt, S.n_quant - piece * P.bt);
        }
        /* tq-mse: the tokens' norms after the codes */
        const uint16_t *k_norm = (const uint16_t *)(K + (size_t)P.bt * (D / 2));
        const uint16_t *v_norm = (const uint16_t *)(V + (size_t)P.bt * (D / 2));
        for (int t0 = 0; t0 < n; t0 += U * TPI) {
            /* every load of the chunk first: U rows of K and of V per lane */
            uint4 kx[U], vx[U];
            float kn[U], vn[U];
            bool ok[U];
#pragma unroll
            for (int u = 0; u < U; u++) {
                const int t = t0 + u * TPI + slot;
                ok[u] = t < n;
                kx[u] = vx[u] = make_uint4(0, 0, 0, 0); /* past the end: no bytes read, v = 0 */
                kn[u] = vn[u] = 0;
                if (ok[u]) {
                    if (FMT == ROWS_FP16) {
                        kx[u] = *(const uint4 *)(K + ((size_t)t * D + li * 8) * 2);
                        vx[u] = *(const uint4 *)(V + ((size_t)t * D + li * 8) * 2);
                    } else {
                        kx[u].x = *(const uint32_t *)(K + (size_t)t * (D / 2) + 4 * li);
                        vx[u].x = *(const uint32_t *)(V + (size_t)t * (D / 2) + 4 * li);
                        kn[u] = vq_cu_h2f(k_norm[t]);
                        vn[u] = vq_cu_h2f(v_norm[t]);
                    }
                    ok[u] = pos[t] <= qpos;
                }
            }
            float sc[U], mx = -INFINITY;
#pragma unroll
            for (int u = 0; u < U; u++) {
                float f[8], s[G];
                row_values<FMT>(kx[u], cent_k, f);
#pragma unroll
                for (int hh = 0; hh < G; hh++) {
                    float a = 0;
#pragma unroll
                    for (int e = 0; e < 8; e++) a = fmaf(q[hh][e], f[e], a);
                    s[hh] = a;
                }
                float x = reduce_scatter<G, LPT>(s, li);
                if (FMT == ROWS_TQ4) x *= kn[u];
                sc[u] = ok[u] ? x : -INFINITY;
                mx = fmaxf(mx, sc[u]);
            }
            /* the chunk's maximum of each head: over the slots */
#pragma unroll
            for (int o = LPT; o < 32; o *= 2) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));
            const float mnew = fmaxf(m, mx);
            const float alpha = m == -INFINITY ? (mnew == -INFINITY ? 1.0f : 0.0f) : exp2f(m - mnew);
            m = mnew;
            l *= alpha;
#pragma unroll
            for (int hh = 0; hh < G; hh++) {
                const float a = __shfl_sync(0xffffffffu, alpha, hh * HL);
#pragma unroll
                for (int e = 0; e < 8; e++) acc[hh][e] *= a;
            }
#pragma unroll
            for (int u = 0; u < U; u++) {
                const float p = mnew == -INFINITY ? 0.0f : exp2f(sc[u] - mnew);
                l += p;
                float f[8];
                row_values<FMT>(vx[u], cent_v, f);
#pragma unroll
                for (int hh = 0; hh < G; hh++) {
                    float ph = __shfl_sync(0xffffffffu, p, slot * LPT + hh * HL);
                    if (FMT == ROWS_TQ4) ph *= vn[u];
#pragma unroll
                    for (int e = 0; e < 8; e++) acc[hh][e] = fmaf(ph, f[e], acc[hh][e]);
                }
            }
        }
    }
    /* the slots of the warp share m (per head); sum their l and acc */
#pragma unroll
    for (int o = LPT; o < 32; o *= 2) {
        l += __shfl_xor_sync(0xffffffffu, l, o);
#pragma unroll
        for (int hh = 0; hh < G; hh++)
#pragma unroll
            for (int e = 0; e < 8; e++) acc[hh][e] += __shfl_xor_sync(0xffffffffu, acc[hh][e], o);
    }
    if (slot == 0) {
        if (li % HL == 0) {
            red_m[warp][my_head] = m;
            red_l[warp][my_head] = l;
        }
#pragma unroll
        for (int hh = 0; hh < G; hh++)
#pragma unroll
            for (int e = 0; e < 8; e++) red_acc[warp][hh][lane_channel<FMT, D>(li, e)] = acc[hh][e];
    }
    __syncthreads();
    if constexpr (MERGE) {
        /* the window's state per head into red_acc[0] and win_ml (each
         * thread rewrites only the elements it alone reads) */
        for (int idx = threadIdx.x; idx < g * D; idx += WARPS * 32) {
            const int hh = idx / D, c = idx % D;
            float M, L, A;
            combine_warps<G, D>(red_m, red_l, red_acc, hh, c, M, L, A);
            red_acc[0][hh][c] = A;
            if (c == 0) {
                win_ml[hh][0] = M * 0.6931471805599453f; /* natural-log units, as the partials */
                win_ml[hh][1] = L;
            }
        }
        __syncthreads();
        /* the KIVI kernel's end: its partials are written and visible */
        vq_cu_wait_primary();
        vq_cu_launch_dependents(); /* the next decode's KIVI kernel */
        for (int hh = warp; hh < g; hh += WARPS)
            merge_row(P, h, seq, hh, win_ml[hh][0], win_ml[hh][1], red_acc[0][hh], lane);
        return;
    }
    /* the warps' states merged into the thread block's partial */
    float *out = P.partials + (((size_t)seq * P.hkv + h) * P.n_parts + slot_idx) * VQ_CU_RMAX * (size_t)P.part_w;
    const int acc_off = VQ_CU_PART_ACC + (window && P.split ? D : 0);
    for (int idx = threadIdx.x; idx < g * D; idx += WARPS * 32) {
        const int hh = idx / D, c = idx % D;
        float M, L, A;
        combine_warps<G, D>(red_m, red_l, red_acc, hh, c, M, L, A);
        float *o = out + (size_t)hh * P.part_w;
        if (c == 0) {
            o[0] = M * 0.6931471805599453f; /* back to natural-log units */
            o[1] = L;
        }
        o[acc_off + c] = A;
        if (P.split) o[(window ? VQ_CU_PART_ACC : VQ_CU_PART_ACC + D) + c] = 0; /* the other domain's sum */
    }
}

bool vq_cu_rows_decode_ok(const vq_cu_attn *P) {
    return P->n_q == 1 && P->g <= 8 && (P->d == 64 || P->d == 128 || P->d == 256) && ((uintptr_t)P->q & 15) == 0;
}

bool vq_cu_tq4_decode_ok(const vq_cu_attn *P) {
    return vq_cu_rows_decode_ok(P) && P->mk.kind == VQ_CU_TQ_MSE && P->mv.kind == VQ_CU_TQ_MSE && P->mk.bits == 4 &&
           P->mv.bits == 4;
}

template <int FMT, int D, int G, bool MERGE = false>
static cudaError_t launch(const vq_cu_attn *P, int parts, int n_seqs, int first_slot) {
    /* rows of K and V in flight per lane and chunk: 8, fewer when the
     * accumulators take more registers */
    constexpr int U = G == 8 ? 4 : 8;
    cudaLaunchAttribute at;
    cudaLaunchConfig_t cfg = vq_cu_launch_config(dim3(parts, P->hkv, n_seqs), dim3(WARPS * 32), 0, P->pdl, &at);
    return cudaLaunchKernelEx(&cfg, rows_decode<FMT, D, G, U, MERGE>, *P, first_slot);
}

template <int FMT, int D>
static cudaError_t launch_heads(const vq_cu_attn *P, int parts, int n_seqs, int first_slot) {
    if (P->g == 1) return launch<FMT, D, 1>(P, parts, n_seqs, first_slot);
    if (P->g == 2) return launch<FMT, D, 2>(P, parts, n_seqs, first_slot);
    if (P->g <= 4) return launch<FMT, D, 4>(P, parts, n_seqs, first_slot);
    return launch<FMT, D, 8>(P, parts, n_seqs, first_slot);
}

template <int FMT>
static cudaError_t launch_dim(const vq_cu_attn *P, int parts, int n_seqs, int first_slot) {
    if (P->d == 64) return launch_heads<FMT, 64>(P, parts, n_seqs, first_slot);
    if (P->d == 128) return launch_heads<FMT, 128>(P, parts, n_seqs, first_slot);
    return launch_heads<FMT, 256>(P, parts, n_seqs, first_slot);
}

cudaError_t vq_cu_fp16_decode_launch(const vq_cu_attn *P, int parts, int n_seqs, int first_slot) {
    return launch_dim<ROWS_FP16>(P, parts, n_seqs, first_slot);
}

cudaError_t vq_cu_tq4_decode_launch(const vq_cu_attn *P, int parts, int n_seqs) {
    return launch_dim<ROWS_TQ4>(P, parts, n_seqs, 0);
}

cudaError_t vq_cu_kivi_window_launch(const vq_cu_attn *P, int n_seqs) {
    const int last = P->n_parts - 1;
    if (P->g == 1) return launch<ROWS_FP16, 128, 1, true>(P, 1, n_seqs, last);
    if (P->g == 2) return launch<ROWS_FP16, 128, 2, true>(P, 1, n_seqs, last);
    if (P->g <= 4) return launch<ROWS_FP16, 128, 4, true>(P, 1, n_seqs, last);
    return launch<ROWS_FP16, 128, 8, true>(P, 1, n_seqs, last);
}
