/* Decode without a reduction kernel: every thread block of a (sequence,
 * kv head) writes its partial (max, sum, acc per q head), takes a ticket
 * from an atomic counter, and the block that takes the last ticket merges
 * all the partials of that (sequence, kv head) into its output rows. A
 * second kernel would cost its launch and the wait for the first
 * kernel's end; here the merge starts as soon as the last partial is
 * written.
 *
 * The merge reads the partials in slot order whichever block comes last,
 * so the output does not depend on the order the blocks finish in. The
 * last block sets the counter back to 0 for the next launch (which the
 * stream orders after this one). */
#ifndef VQ_CUDA_ATTEND_MERGE_CUH
#define VQ_CUDA_ATTEND_MERGE_CUH

#include "cuda_internal.h"

#include <math.h>

/* Partials per round of loads in the merge: a lane holds MERGE_BATCH
 * float4 of them (96 registers), all in flight at once. Each round is a
 * memory latency on the call's critical path. */
#define MERGE_BATCH 24

/* After the thread block has written its partial: whether it is the last
 * of its (sequence, kv head) (blockIdx.z, blockIdx.y) to do so. The
 * barrier orders every thread's partial stores before thread 0's fence
 * and ticket (so the block with the last ticket sees them); that block's
 * thread 0 fences again after its ticket, and the barrier orders the
 * merge's reads after it. */
__device__ __forceinline__ bool vq_cu_last_block(const vq_cu_attn &P) {
    __shared__ unsigned ticket;
    unsigned *counter = P.tickets + (size_t)blockIdx.z * P.hkv + blockIdx.y;
    __syncthreads();
    if (threadIdx.x == 0) {
        __threadfence();
        ticket = atomicAdd(counter, 1u);
        if (ticket == (unsigned)P.n_parts - 1) {
            __threadfence();
            *counter = 0;
        }
    }
    __syncthreads();
    return ticket == (unsigned)P.n_parts - 1;
}

/* The output rows of (sequence blockIdx.z, kv head blockIdx.y) from its
 * n_parts partials (one query token, no second value domain), in one pass
 * over the partials with a running maximum: warp w takes q heads w,
 * w + warps, ...; lane l channels 4 l + 128 k; per round of MERGE_BATCH
 * partials, lane k loads partial k's max and sum and every lane its
 * channels of all of them, then the sums are rescaled to the round's
 * maximum and the partials added in slot order. Loads bypass L1 (the
 * partials were written by other SMs). */
__device__ __forceinline__ void vq_cu_merge(const vq_cu_attn &P) {
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, d = P.d, n = P.n_parts, h = blockIdx.y,
              seq = blockIdx.z;
    const size_t slot = (size_t)VQ_CU_RMAX * P.part_w;
    for (int r = warp; r < P.g; r += blockDim.x / 32) {
        const float *base = P.partials + ((size_t)seq * P.hkv + h) * n * slot + (size_t)r * P.part_w;
        const size_t off = ((size_t)seq * P.hq + (size_t)h * P.g + r) * d;
        for (int c0 = 0; c0 < d; c0 += 128) {
            const int c = c0 + 4 * lane;
            const bool mine = c < d; /* d = 64: lanes 16-31 only help with the maxima and sums */
            float M = -INFINITY, L = 0;
            float4 a = make_float4(0, 0, 0, 0);
            for (int p0 = 0; p0 < n; p0 += MERGE_BATCH) {
                const bool lp = lane < MERGE_BATCH && p0 + lane < n;
                const float pm = lp ? __ldcg(base + (p0 + lane) * slot) : -INFINITY;
                const float pl = lp ? __ldcg(base + (p0 + lane) * slot + 1) : 0.0f;
                float4 x[MERGE_BATCH];
#pragma unroll
                for (int k = 0; k < MERGE_BATCH; k++)
                    x[k] = mine && p0 + k < n ? __ldcg((const float4 *)(base + (p0 + k) * slot + VQ_CU_PART_ACC + c))
                                              : make_float4(0, 0, 0, 0);
                float mr = pm;
                for (int o = 16; o > 0; o /= 2) mr = fmaxf(mr, __shfl_xor_sync(0xffffffffu, mr, o));
                const float mnew = fmaxf(M, mr);
                const float s = M == -INFINITY ? 0.0f : __expf(M - mnew);
                M = mnew;
                L *= s;
                a.x *= s, a.y *= s, a.z *= s, a.w *= s;
                const float wl = pm == -INFINITY ? 0.0f : __expf(pm - mnew);
#pragma unroll
                for (int k = 0; k < MERGE_BATCH; k++) {
                    const float w = __shfl_sync(0xffffffffu, wl, k);
                    L += __shfl_sync(0xffffffffu, pl, k) * w;
                    a.x += x[k].x * w;
                    a.y += x[k].y * w;
                    a.z += x[k].z * w;
                    a.w += x[k].w * w;
                }
            }
            const float inv = L > 0 ? 1.0f / L : 0.0f;
            const float v[4] = {a.x * inv, a.y * inv, a.z * inv, a.w * inv};
#pragma unroll
            for (int e = 0; e < 4; e++) {
                if (!mine) break;
                if (P.out_f16) ((uint16_t *)P.out)[off + c + e] = __half_as_ushort(__float2half_rn(v[e]));
                else ((float *)P.out)[off + c + e] = v[e];
            }
        }
    }
}

#endif
