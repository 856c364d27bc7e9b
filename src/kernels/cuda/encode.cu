/* The append kernel: one launch per append quantizes and packs every token
 * that leaves the fp16 window (the window flush) and writes the tokens that
 * stay into the window. Token i of an append's "stream" is the old window's
 * token i for i < win_n, else new token i - win_n; the first flushes * F
 * of them are encoded into blocks, the rest form the new window.
 *
 * Arithmetic follows the CPU encoders step for step (IEEE division, rint,
 * no contraction into FMA: the _rn intrinsics), so KIVI codes and scales
 * are bit-identical to the CPU's; tq-mse's norm sums in another order (fp64,
 * then rounded to fp32 and fp16). */
#include "codes.cuh"

#include <cuda_bf16.h>

#define THREADS 128
#define TQ_TOKENS 16    /* tq-mse tokens rotated at once in shared memory */
#define KV_TOKENS 32    /* kivi value tokens handled at once */

/* Token i of the append's stream, channel c, as fp16. */
__device__ __forceinline__ uint16_t fetch_h(const vq_cu_append_args &a, int h, int i, int c, bool value) {
    if (i < a.win_n) return (value ? a.old_v : a.old_k)[((size_t)h * a.win_cap + i) * a.d + c];
    size_t idx = ((size_t)(i - a.win_n) * a.H + h) * a.d + c;
    const void *x = value ? a.v : a.k;
    if (a.dtype == VQ_F16) return ((const uint16_t *)x)[idx];
    float f = a.dtype == VQ_F32 ? ((const float *)x)[idx] : __bfloat162float(((const __nv_bfloat16 *)x)[idx]);
    return vq_cu_f2h(f);
}

__device__ __forceinline__ float fetch(const vq_cu_append_args &a, int h, int i, int c, bool value) {
    return vq_cu_h2f(fetch_h(a, h, i, c, value));
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

__device__ __forceinline__ int kivi_code(float x, float s, float z, int bits) {
    if (!(s > 0)) return 0;
    float c = rintf(__fdiv_rn(__fsub_rn(x, z), s));
    float maxq = (float)((1 << bits) - 1);
    c = c < 0 ? 0 : c;
    c = c > maxq ? maxq : c;
    return (int)c;
}

struct smem_t {
    float sf[VQ_CU_MAX_DIM], zf[VQ_CU_MAX_DIM];       /* kivi keys: one group's per-channel params */
    float vs[KV_TOKENS][8], vz[KV_TOKENS][8];         /* kivi values: per token and channel group */
    float u[TQ_TOKENS][VQ_CU_MAX_DIM];                /* tq-mse: rotated rows */
    float inv[TQ_TOKENS];
};

/* Encodes stream tokens [i0, i0 + cnt) of head h with method m into the
 * payload at byte offset `off` of their blocks. */
__device__ void encode_range(const vq_cu_append_args &a, const vq_cu_method &m, size_t off, int h, int i0, int cnt,
                             smem_t &sm) {
    const int d = a.d, cb = m.code_bytes, bits = m.bits, tid = threadIdx.x;
    const bool value = m.is_value;
    if (m.kind == VQ_CU_FP16) {
        for (int idx = tid; idx < cnt * d; idx += THREADS) {
            int i = i0 + idx / d, c = idx % d, t;
            uint8_t *blk = block_of(a, h, i, &t) + off;
            ((uint16_t *)blk)[(size_t)t * d + c] = fetch_h(a, h, i, c, value);
        }
        return;
    }
    if (m.kind == VQ_CU_KIVI && !value) {
        const int G = m.group;
        for (int g0 = i0; g0 < i0 + cnt; g0 += G) {
            int t0;
            uint8_t *blk = block_of(a, h, g0, &t0) + off;
            uint16_t *sc = (uint16_t *)(blk + (size_t)a.bt * cb) + (size_t)(t0 / G) * 2 * d, *zr = sc + d;
            for (int c = tid; c < d; c += THREADS) {
                float mn = fetch(a, h, g0, c, false), mx = mn;
                for (int t = 1; t < G; t++) {
                    float x = fetch(a, h, g0 + t, c, false);
                    mn = x < mn ? x : mn;
                    mx = x > mx ? x : mx;
                }
                uint16_t zh = vq_cu_f2h(mn), sh = vq_cu_f2h(__fdiv_rn(__fsub_rn(mx, mn), (float)((1 << bits) - 1)));
                sc[c] = sh;
                zr[c] = zh;
                sm.sf[c] = vq_cu_h2f(sh);
                sm.zf[c] = vq_cu_h2f(zh);
            }
            __syncthreads();
            for (int idx = tid; idx < G * cb; idx += THREADS) {
                int t = idx / cb, j = idx % cb, i = g0 + t;
                blk[(size_t)(t0 + t) * cb + j] = vq_cu_pack_byte(j, bits, d, [&](int c) {
                    return kivi_code(fetch(a, h, i, c, false), sm.sf[c], sm.zf[c], bits);
                });
            }
            __syncthreads();
        }
        return;
    }
    if (m.kind == VQ_CU_KIVI) {
        const int G = m.group, ng = (d + G - 1) / G;
        for (int c0 = i0; c0 < i0 + cnt; c0 += KV_TOKENS) {
            int nt = i0 + cnt - c0 < KV_TOKENS ? i0 + cnt - c0 : KV_TOKENS;
            for (int idx = tid; idx < nt * ng; idx += THREADS) {
                int t = idx / ng, g = idx % ng, i = c0 + t, tb;
                uint8_t *blk = block_of(a, h, i, &tb) + off;
                int ch0 = g * G, ch1 = ch0 + G < d ? ch0 + G : d;
                float mn = fetch(a, h, i, ch0, true), mx = mn;
                for (int c = ch0 + 1; c < ch1; c++) {
                    float x = fetch(a, h, i, c, true);
                    mn = x < mn ? x : mn;
                    mx = x > mx ? x : mx;
                }
                uint16_t zh = vq_cu_f2h(mn), sh = vq_cu_f2h(__fdiv_rn(__fsub_rn(mx, mn), (float)((1 << bits) - 1)));
                uint16_t *meta = (uint16_t *)(blk + (size_t)a.bt * cb) + ((size_t)tb * ng + g) * 2;
                meta[0] = sh;
                meta[1] = zh;
                sm.vs[t][g] = vq_cu_h2f(sh);
                sm.vz[t][g] = vq_cu_h2f(zh);
            }
            __syncthreads();
            for (int idx = tid; idx < nt * cb; idx += THREADS) {
                int t = idx / cb, j = idx % cb, i = c0 + t, tb;
                uint8_t *blk = block_of(a, h, i, &tb) + off;
                blk[(size_t)tb * cb + j] = vq_cu_pack_byte(j, bits, d, [&](int c) {
                    return kivi_code(fetch(a, h, i, c, true), sm.vs[t][c / G], sm.vz[t][c / G], bits);
                });
            }
            __syncthreads();
        }
        return;
    }
    /* tq-mse: ||x||, then the codes of R x / ||x|| */
    const float scale = 1.0f / sqrtf((float)d);
    const int warp = tid / 32, lane = tid % 32;
    for (int c0 = i0; c0 < i0 + cnt; c0 += TQ_TOKENS) {
        int nt = i0 + cnt - c0 < TQ_TOKENS ? i0 + cnt - c0 : TQ_TOKENS;
        for (int idx = tid; idx < nt * d; idx += THREADS) sm.u[idx / d][idx % d] = fetch(a, h, c0 + idx / d, idx % d, value);
        __syncthreads();
        for (int t = warp; t < nt; t += THREADS / 32) {
            double s = 0;
            for (int c = lane; c < d; c += 32) s = __dadd_rn(s, __dmul_rn((double)sm.u[t][c], (double)sm.u[t][c]));
            for (int o = 16; o > 0; o /= 2) s = __dadd_rn(s, __shfl_xor_sync(0xffffffffu, s, o));
            if (lane == 0) {
                double len = sqrt(s);
                sm.inv[t] = len > 0 ? (float)(1.0 / len) : 0.0f;
                int tb;
                uint8_t *blk = block_of(a, h, c0 + t, &tb) + off;
                ((uint16_t *)(blk + (size_t)a.bt * cb))[tb] = vq_cu_f2h((float)len);
            }
        }
        __syncthreads();
        for (int idx = tid; idx < nt * d; idx += THREADS) {
            int t = idx / d, c = idx % d;
            sm.u[t][c] = __fmul_rn(__fmul_rn(sm.u[t][c], sm.inv[t]), m.signs[c]);
        }
        __syncthreads();
        for (int hh = 1; hh < d; hh *= 2) {
            for (int idx = tid; idx < nt * d / 2; idx += THREADS) {
                int t = idx / (d / 2), k = idx % (d / 2), j = (k / hh) * 2 * hh + k % hh;
                float x = sm.u[t][j], y = sm.u[t][j + hh];
                sm.u[t][j] = __fadd_rn(x, y);
                sm.u[t][j + hh] = __fsub_rn(x, y);
            }
            __syncthreads();
        }
        for (int idx = tid; idx < nt * cb; idx += THREADS) {
            int t = idx / cb, j = idx % cb, tb;
            uint8_t *blk = block_of(a, h, c0 + t, &tb) + off;
            blk[(size_t)tb * cb + j] = vq_cu_pack_byte(j, bits, d, [&](int c) {
                float x = __fmul_rn(sm.u[t][c], scale);
                int code = 0;
                for (int b = 0; b < (1 << bits) - 1; b++) code += x > m.boundary[b];
                return code;
            });
        }
        __syncthreads();
    }
}

__global__ void __launch_bounds__(THREADS) append_kernel(const vq_cu_append_args a, int unit, int enc_units) {
    __shared__ smem_t sm;
    const int h = blockIdx.y, u = blockIdx.x, tid = threadIdx.x;
    const int enc_tokens = a.flushes * a.flush;
    if (u < enc_units) {
        int i0 = u * unit, cnt = enc_tokens - i0 < unit ? enc_tokens - i0 : unit;
        encode_range(a, a.mk, 0, h, i0, cnt, sm);
        encode_range(a, a.mv, a.k_bytes, h, i0, cnt, sm);
        for (int t = tid; t < cnt; t += THREADS) {
            int tb;
            uint8_t *blk = block_of(a, h, i0 + t, &tb);
            ((int32_t *)(blk + a.k_bytes + a.v_bytes))[tb] = pos_of(a, h, i0 + t);
        }
        return;
    }
    /* tokens that stay in (or join) the window */
    int src0 = a.flushes ? enc_tokens : a.win_n, dst0 = a.flushes ? 0 : a.win_n;
    int count = a.win_n + a.n - src0;
    int j0 = (u - enc_units) * unit, cnt = count - j0 < unit ? count - j0 : unit;
    const int d = a.d;
    for (int idx = tid; idx < cnt * d; idx += THREADS) {
        int t = idx / d, c = idx % d;
        size_t o = ((size_t)h * a.win_cap + dst0 + j0 + t) * d + c;
        a.new_k[o] = fetch_h(a, h, src0 + j0 + t, c, false);
        a.new_v[o] = fetch_h(a, h, src0 + j0 + t, c, true);
    }
    for (int t = tid; t < cnt; t += THREADS) a.new_pos[(size_t)h * a.win_cap + dst0 + j0 + t] = pos_of(a, h, src0 + j0 + t);
}

cudaError_t vq_cu_launch_append(const vq_cu_append_args *a) {
    int unit = a->flush >= 32 ? a->flush : 32;
    int enc_tokens = a->flushes * a->flush;
    int enc_units = (enc_tokens + unit - 1) / unit;
    int src0 = a->flushes ? enc_tokens : a->win_n;
    int count = a->win_n + a->n - src0;
    int win_units = (count + unit - 1) / unit;
    if (enc_units + win_units == 0) return cudaSuccess;
    dim3 grid(enc_units + win_units, a->H);
    append_kernel<<<grid, THREADS>>>(*a, unit, enc_units);
    return cudaGetLastError();
}
