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
 * the reduction kernel (attend.cu) or, in a fused launch (fp16 caches, the
 * window alone), for the merge by the launch's last thread block
 * (attend_merge.cuh). The body is rows_partial (attend_rows.cuh), which
 * the KIVI decode kernel runs too.
 *
 * tq-mse works in the rotated domain: q is rotated once per thread block
 * (signs, Hadamard transform, 1/sqrt(d)); the values' sum stays rotated and
 * the reduction rotates it back.
 *
 * Token sources: the blocks of the stream (a partition, warps taking whole
 * blocks in turn) or, for the last partial slot, the stream's fp16 window
 * (warps taking ROWS_WIN_SEG-token pieces in turn). */
#include "attend_merge.cuh"
#include "attend_rows.cuh"

template <int FMT, int D, int G, int U>
__global__ void __launch_bounds__(ROWS_WARPS * 32) rows_decode(const __grid_constant__ vq_cu_attn P, int first_slot) {
    __shared__ rows_smem<G, D> sm;
    rows_partial<FMT, D, G, U>(P, first_slot + blockIdx.x, sm);
    if (P.fused && vq_cu_last_block(P)) vq_cu_merge(P);
}

bool vq_cu_rows_decode_ok(const vq_cu_attn *P) {
    return P->n_q == 1 && P->g <= 8 && (P->d == 64 || P->d == 128 || P->d == 256) && ((uintptr_t)P->q & 15) == 0;
}

bool vq_cu_tq4_decode_ok(const vq_cu_attn *P) {
    return vq_cu_rows_decode_ok(P) && P->mk.kind == VQ_CU_TQ_MSE && P->mv.kind == VQ_CU_TQ_MSE && P->mk.bits == 4 &&
           P->mv.bits == 4;
}

template <int FMT, int D, int G>
static cudaError_t launch(const vq_cu_attn *P, int parts, int n_seqs, int first_slot) {
    /* rows of K and V in flight per lane and chunk: 8, fewer when the
     * accumulators take more registers */
    constexpr int U = G == 8 ? 4 : 8;
    rows_decode<FMT, D, G, U><<<dim3(parts, P->hkv, n_seqs), ROWS_WARPS * 32>>>(*P, first_slot);
    return cudaGetLastError();
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
