/* How fast the append kernel's input can be read, by access pattern: a
 * read-only kernel over 8192 fp16 tokens of K and V ([token][8 heads][128],
 * 33.5 MB), split like the append kernel into 4096 warp items of 8 KB.
 *
 *   rows: an item reads one head's 256-byte rows of 32 tokens (a 2 KB
 *         stride), as the append kernel stages them;
 *   runs: an item reads 8 KB in one piece (4 whole tokens of all heads).
 *
 * Same bytes, same grid, same residency (dynamic shared memory caps it at
 * the append kernel's 16 warps per SM); items in the append kernel's order
 * (K/V fastest, then head, then unit) or heads fastest; 4 or 8 warps per
 * block; loads by the bulk-copy engine into shared memory (one 256-byte
 * copy per lane, or for runs one 2 KB copy per 4 lanes) or 16-byte loads
 * into registers; the last two variants let 6 blocks run per SM (24 warps) to
 * see whether more loads in flight help. "empty" launches the same
 * grid and reads nothing (launch and block overhead). The copy line is a
 * device-to-device cudaMemcpy of the same bytes (read + write).
 *
 * GPU time per launch from CUDA events started behind a 512 MB copy (the
 * host's issue time hidden), median (min..max) of 15, variants interleaved. */
#include <cuda_runtime.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#define T 8192
#define H 8
#define D 128
#define ROWS 32 /* rows (tokens) per item */
#define REPS 15
#define BUSY_BYTES ((size_t)512 << 20)

enum { EMPTY, BULK, LOADS };

struct mode {
    const char *name;
    int kind, runs, heads_fastest, warps, smem; /* smem: dynamic bytes per block, caps residency */
    int copy; /* bytes per bulk copy: 256, or 2048 (runs only: 4 lanes copy an item) */
};

/* The first byte of piece r (0..31, 256 bytes each) of an item. */
__device__ __forceinline__ const char *piece(const char *k, const char *v, int item, int r, int runs, int hf) {
    int value, h, u;
    if (hf) h = item % H, value = (item / H) & 1, u = item / (2 * H);
    else value = item & 1, h = (item >> 1) % H, u = (item >> 1) / H;
    const char *x = value ? v : k;
    size_t tok0 = (size_t)u * ROWS;
    if (runs) return x + (tok0 * H * D + (size_t)h * ROWS * D) * 2 + (size_t)r * 256;
    return x + ((tok0 + r) * H + h) * D * 2;
}

__global__ void reads(const char *k, const char *v, int kind, int runs, int hf, int copy, unsigned *sink) {
    extern __shared__ uint4 smem[];
    __shared__ uint64_t bars[8];
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int item = blockIdx.x * (blockDim.x / 32) + warp;
    unsigned acc = 0;
    if (kind == BULK) {
        unsigned bar = (unsigned)__cvta_generic_to_shared(&bars[warp]);
        char *tile = (char *)smem + (size_t)warp * ROWS * 256;
        if (lane == 0) {
            asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;\n" ::"r"(bar) : "memory");
            asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
            asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar), "r"(ROWS * 256) : "memory");
        }
        __syncwarp();
        const int per = copy / 256; /* pieces per copy */
        if (lane % per == 0) {
            const char *src = piece(k, v, item, lane, runs, hf);
            unsigned dst = (unsigned)__cvta_generic_to_shared(tile + lane * 256);
            asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n" ::"r"(dst),
                         "l"(src), "r"(copy), "r"(bar)
                         : "memory");
        }
        unsigned done;
        do {
            asm volatile("{\n .reg .pred p;\n mbarrier.try_wait.parity.shared::cta.b64 p, [%1], 0;\n selp.u32 %0, 1, 0, p;\n}\n"
                         : "=r"(done)
                         : "r"(bar)
                         : "memory");
        } while (!done);
        acc = ((const unsigned *)tile)[lane * 64];
    } else if (kind == LOADS) {
        /* lanes 0..15 cover one 256-byte piece, 16..31 the next */
        uint4 x[16];
#pragma unroll
        for (int j = 0; j < 16; j++)
            x[j] = __ldg((const uint4 *)(piece(k, v, item, 2 * j + lane / 16, runs, hf)) + lane % 16);
#pragma unroll
        for (int j = 0; j < 16; j++) acc ^= x[j].x ^ x[j].y ^ x[j].z ^ x[j].w;
    }
    if (acc == 0x9e3779b9u) sink[item] = acc; /* keeps the loads; practically never stores */
}

static int cmp_f(const void *a, const void *b) {
    float x = *(const float *)a, y = *(const float *)b;
    return x < y ? -1 : x > y;
}

int main(void) {
    const size_t bytes = (size_t)T * H * D * 2; /* K or V */
    char *k, *v, *ck, *cv;
    void *busy[2];
    unsigned *sink;
    if (cudaMalloc(&k, bytes) || cudaMalloc(&v, bytes) || cudaMalloc(&ck, bytes) || cudaMalloc(&cv, bytes) ||
        cudaMalloc(&busy[0], BUSY_BYTES) || cudaMalloc(&busy[1], BUSY_BYTES) || cudaMalloc(&sink, 4 * 4096)) {
        fprintf(stderr, "encode_reads: cudaMalloc failed\n");
        return 1;
    }
    cudaMemset(k, 1, bytes);
    cudaMemset(v, 2, bytes);
    cudaFuncSetAttribute(reads, cudaFuncAttributeMaxDynamicSharedMemorySize, 100 << 10);
    const mode modes[] = {
        {"empty, 4 warps", EMPTY, 0, 0, 4, 50 << 10, 256},
        {"rows bulk, 4 warps", BULK, 0, 0, 4, 50 << 10, 256},
        {"runs bulk, 4 warps", BULK, 1, 0, 4, 50 << 10, 256},
        {"runs bulk 2 KB copies, 4 warps", BULK, 1, 0, 4, 50 << 10, 2048},
        {"rows bulk, 4 warps, heads fastest", BULK, 0, 1, 4, 50 << 10, 256},
        {"rows bulk, 8 warps, heads fastest", BULK, 0, 1, 8, 100 << 10, 256},
        {"runs bulk, 8 warps, heads fastest", BULK, 1, 1, 8, 100 << 10, 256},
        {"rows loads, 4 warps", LOADS, 0, 0, 4, 50 << 10, 256},
        {"runs loads, 4 warps", LOADS, 1, 0, 4, 50 << 10, 256},
        {"rows bulk, 4 warps, 6 blocks/SM", BULK, 0, 0, 4, 32 << 10, 256},
        {"runs bulk, 4 warps, 6 blocks/SM", BULK, 1, 0, 4, 32 << 10, 256},
    };
    const int nm = sizeof modes / sizeof modes[0];
    float t[nm + 1][REPS];
    cudaEvent_t e0, e1;
    cudaEventCreate(&e0);
    cudaEventCreate(&e1);
    for (int rep = -1; rep < REPS; rep++) /* rep -1: warm-up */
        for (int m = 0; m <= nm; m++) {
            cudaMemcpyAsync(busy[1], busy[0], BUSY_BYTES, cudaMemcpyDeviceToDevice, 0);
            cudaEventRecord(e0, 0);
            if (m == nm) {
                cudaMemcpyAsync(ck, k, bytes, cudaMemcpyDeviceToDevice, 0);
                cudaMemcpyAsync(cv, v, bytes, cudaMemcpyDeviceToDevice, 0);
            } else {
                const mode *o = &modes[m];
                reads<<<4096 / o->warps, 32 * o->warps, o->smem>>>(k, v, o->kind, o->runs, o->heads_fastest, o->copy,
                                                                       sink);
            }
            cudaEventRecord(e1, 0);
            cudaEventSynchronize(e1);
            float ms = 0;
            cudaEventElapsedTime(&ms, e0, e1);
            if (rep >= 0) t[m][rep] = ms * 1000;
        }
    cudaError_t e = cudaDeviceSynchronize();
    if (e != cudaSuccess) {
        fprintf(stderr, "encode_reads: %s\n", cudaGetErrorString(e));
        return 1;
    }
    printf("%-36s %8s %16s %8s\n", "variant (33.5 MB read)", "us", "min..max", "GB/s (copy: read + write)");
    for (int m = 0; m <= nm; m++) {
        qsort(t[m], REPS, sizeof(float), cmp_f);
        float med = t[m][REPS / 2];
        printf("%-36s %8.1f %7.1f..%-7.1f %8.0f\n", m == nm ? "cudaMemcpy of the same bytes" : modes[m].name, med,
               t[m][0], t[m][REPS - 1], (m == nm ? 4.0 : modes[m].kind != EMPTY ? 2.0 : 0.0) * bytes / (med * 1e-6) / 1e9);
    }
    return 0;
}
