/* Shared declarations of the CUDA backend (.cu files only). */
#ifndef VQ_CUDA_INTERNAL_H
#define VQ_CUDA_INTERNAL_H

extern "C" {
#include "vq_internal.h"
}

#include <cuda.h> /* CUtensorMap (a type only: the driver API is reached through the runtime) */
#include <cuda_fp16.h>
#include <cuda_runtime.h>

/* Methods with CUDA kernels. */
enum { VQ_CU_FP16 = 0, VQ_CU_KIVI = 1, VQ_CU_TQ_MSE = 2 };

#define VQ_CU_MAX_DIM 256 /* head dims: a multiple of 64 up to this */

/* One method instance as the kernels see it (passed by value). */
typedef struct {
    int kind;          /* VQ_CU_* */
    int is_value;
    int bits;          /* kivi, tq-mse */
    int group;         /* kivi */
    int code_bytes;    /* packed bytes of one token's codes */
    const float *signs; /* tq-mse: the Hadamard signs [d] in device memory */
    float centroid[16]; /* tq-mse */
    /* tq-mse: threshold i is the smallest y with RN(y s) above the
     * codebook's boundary i, s = 1 / sqrt(d) rounded as the CPU's rotation
     * rounds it, so the append kernel compares Hadamard outputs y before
     * the scaling. It codes by a
     * table of cells (encode.cu), cell c holding the y with
     * RN(y cell_scale + 1.5 * 2^23) = 1.5 * 2^23 + c, cell_lo .. cell_lo +
     * n_cells - 1 (the ends take everything beyond); cell_scale is a power
     * of two for which no cell holds two thresholds. */
    float threshold[15];
    float cell_scale;
    int cell_lo, n_cells;
} vq_cu_method;

#define VQ_CU_TQ_CELLS 64 /* the most cells a tq-mse table has */

/* One sequence's (cache, layer) for the attention kernels. */
typedef struct {
    uint8_t *const *table; /* [n_heads_kv][max_blocks] device block pointers */
    const uint16_t *win_k, *win_v; /* [n_heads_kv][win_cap][d] */
    const int32_t *win_pos;        /* [n_heads_kv][win_cap] */
    int n_quant, win_n;
} vq_cu_seq;

/* A chunk of device memory that blocks are carved from. */
typedef struct {
    uint8_t *base;
    size_t blocks, used;
} vq_cu_chunk;

struct vq_cuda_cache {
    int dev;
    int max_blocks;        /* per stream: ceil(capacity / block_tokens) */
    uint8_t **table_host;  /* [n_streams][max_blocks] */
    uint8_t **table_dev;
    int *assigned;         /* [n_streams] blocks given to the stream so far */
    vq_cu_chunk *chunks;
    int n_chunks, cap_chunks;
    /* The fp16 window, twice: an append that flushes reads one buffer and
     * writes the other, so no token is overwritten before it is read. */
    uint16_t *win_k[2], *win_v[2]; /* [n_streams][win_cap][d] */
    int32_t *win_pos[2];           /* [n_streams][win_cap] */
    unsigned char *win_sel;        /* [n_layers]: the buffer in use */
    vq_cu_method mk, mv;
    float *signs;                  /* device copies of the Hadamard signs: k then v */
    /* Staging buffers, grown on demand and kept. */
    void *staging;
    size_t staging_bytes;
    float *partials;
    size_t partial_bytes;
    int n_sms;
};

/* Records a CUDA error as the last error; returns VQ_ERR_STATE. */
vq_status vq_cu_fail(cudaError_t e, const char *what);
/* Makes sure the cache's staging buffer holds bytes. */
vq_status vq_cu_staging(struct vq_cuda_cache *g, size_t bytes);

/* Queues the append kernel for one layer (encode.cu). */
typedef struct {
    vq_cu_method mk, mv;
    int d, bt, H, win_cap, flush;
    size_t k_bytes, v_bytes;
    uint8_t *const *table; /* the layer's [H][max_blocks] */
    int max_blocks;
    int nq0, win_n, n, flushes;
    const uint16_t *old_k, *old_v; /* the layer's window buffers [H][win_cap][d] */
    const int32_t *old_pos;
    uint16_t *new_k, *new_v;
    int32_t *new_pos;
    const void *k, *v;
    int dtype;
    const int32_t *pos; /* device, or NULL: last + 1 + i */
    int32_t last;
    /* Set by vq_cu_launch_append where it can: the new K and V rows as 2-D
     * tensors for the bulk tensor copy (encode.cu, stage_bulk) */
    int tmaps;
    CUtensorMap tmap[2];
    int n_sms; /* the device's SMs */
} vq_cu_append_args;
cudaError_t vq_cu_launch_append(const vq_cu_append_args *a);
/* Kernel attributes for the append kernels of a cache with tq-mse, once
 * on its device. */
cudaError_t vq_cu_append_init(void);

#define VQ_CU_RMAX 8 /* query rows per attention thread block */
/* Offset of the accumulator in a partial row (after max and sum): 16-byte
 * aligned rows for the reduction's vector loads. */
#define VQ_CU_PART_ACC 4
#define VQ_CU_INLINE_SEQS 32
#define VQ_CU_INLINE_QPOS 64


/* Arguments of the attention kernels (attend.cu, attend_kivi.cu). */
typedef struct {
    vq_cu_method mk, mv;
    int d, bt, win_cap, g, n_q, hq, hkv, rows, row_chunks, part_blocks, n_parts, max_blocks, part_w, split;
    int generic_window;  /* the generic kernel's last partition takes the fp16 window */
    size_t k_bytes, v_bytes, block_bytes;
    float scale;
    const float *q;
    /* Sequences and q positions: in the arguments themselves for small
     * batches (no upload before the launch), else in device memory. */
    const int32_t *qpos; /* device [n_seqs][n_q] or NULL */
    const vq_cu_seq *seqs;
    int n_inline_seqs, n_inline_qpos;
    vq_cu_seq inline_seqs[VQ_CU_INLINE_SEQS];
    int32_t inline_qpos[VQ_CU_INLINE_QPOS];
    float *partials;     /* [seq][hkv][row_chunk][slot][RMAX][part_w]: max, sum, pad, acc */
    void *out;
    int out_f16;
    /* Decode over KIVI blocks: the window's kernel, which also merges,
     * is launched as a programmatic dependent (see attend.cu). */
    int pdl;
    /* The KIVI kernel is itself launched as a programmatic dependent of the
     * stream's previous kernel: it waits for that kernel's end first. */
    int pdl_prior;
} vq_cu_attn;

/* Programmatic dependent launch (sm_90): let the next kernel of the
 * stream, launched as a programmatic dependent, start now; wait until the
 * kernel this one depends on has finished and its writes are visible.
 * Both are no-ops in a kernel launched the ordinary way. */
__device__ __forceinline__ void vq_cu_launch_dependents() {
    asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
}
__device__ __forceinline__ void vq_cu_wait_primary() { asm volatile("griddepcontrol.wait;\n" ::: "memory"); }
/* A launch of grid x block threads with smem bytes of dynamic shared
 * memory, as a programmatic dependent of the stream's previous kernel when
 * dependent is set; *at must live until the launch. */
static inline cudaLaunchConfig_t vq_cu_launch_config(dim3 grid, dim3 block, size_t smem, bool dependent,
                                                     cudaLaunchAttribute *at) {
    at->id = cudaLaunchAttributeProgrammaticStreamSerialization;
    at->val.programmaticStreamSerializationAllowed = 1;
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = grid;
    cfg.blockDim = block;
    cfg.dynamicSmemBytes = smem;
    cfg.attrs = at;
    cfg.numAttrs = dependent ? 1 : 0;
    return cfg;
}

/* Sequence s of the attention arguments. The kernels take them as a
 * __grid_constant__ parameter, so the inline arrays are read in place. */
__device__ __forceinline__ const vq_cu_seq &vq_cu_seq_at(const vq_cu_attn &P, int s) {
    return P.n_inline_seqs ? P.inline_seqs[s] : P.seqs[s];
}
/* Whether rows are masked by position, and q position i of [n_seqs][n_q]. */
__device__ __forceinline__ bool vq_cu_has_qpos(const vq_cu_attn &P) { return P.n_inline_qpos || P.qpos; }
__device__ __forceinline__ int32_t vq_cu_qpos_at(const vq_cu_attn &P, size_t i) {
    return P.n_inline_qpos ? P.inline_qpos[i] : P.qpos[i];
}

/* The tensor-core decode kernel for KIVI keys and values (attend_kivi.cu):
 * whether it takes these arguments, and its launch over blocks
 * [0, parts * part_blocks), thread block x writing partial slot x. */
#define VQ_CU_KIVI_WARPS 4
bool vq_cu_kivi_fast_ok(const vq_cu_attn *P);
cudaError_t vq_cu_kivi_fast_launch(const vq_cu_attn *P, int parts, int n_seqs);
/* Its thread blocks resident per SM for these arguments (at least 1; the
 * runtime's occupancy for the kernel instance and its shared memory). */
int vq_cu_kivi_resident(const vq_cu_attn *P);

/* The row decode kernel (attend_decode.cu): whether it takes these
 * arguments (one query token, head dim 64/128/256, at most 8 q heads per
 * kv head, q 16-byte aligned; tq4: and 4-bit tq-mse keys and values), and
 * its launches of `parts` thread blocks per (kv head, sequence). fp16:
 * thread block x writes partial slot first_slot + x; the last slot
 * (n_parts - 1) takes the fp16 window of any cache, the others blocks
 * [x * part_blocks, (x + 1) * part_blocks) of an fp16 cache. tq4: thread
 * block x takes those blocks of a tq-mse cache into slot x. */
#define VQ_CU_ROWS_WARPS 4
bool vq_cu_rows_decode_ok(const vq_cu_attn *P);
bool vq_cu_tq4_decode_ok(const vq_cu_attn *P);
cudaError_t vq_cu_fp16_decode_launch(const vq_cu_attn *P, int parts, int n_seqs, int first_slot);
cudaError_t vq_cu_tq4_decode_launch(const vq_cu_attn *P, int parts, int n_seqs);
/* Beside the KIVI kernel (head dim 128, launched after it as a
 * programmatic dependent): one thread block per (kv head, sequence) takes
 * the fp16 window, waits for the KIVI kernel's end, merges its partials
 * (slots [0, n_parts - 1)) and the window, and writes the output. */
cudaError_t vq_cu_kivi_window_launch(const vq_cu_attn *P, int n_seqs);

#endif
