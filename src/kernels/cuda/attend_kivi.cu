/* Decode attention over KIVI keys and values (2 or 4 bits, head dim 128,
 * one query token, up to 8 q heads per kv head, blocks of up to 64 tokens)
 * on the tensor cores.
 *
 * Each warp streams whole blocks into shared memory with 16-byte cp.async
 * copies, one block ahead: a block's key part (codes, scales, zeros) with
 * its positions and its value part go to buffers of their own, two of
 * each (the staging that overlapping one block's scores with the previous
 * block's values needed; that overlap measured slower and was dropped, this
 * staging is the one the kept kernel was measured with). Each warp keeps
 * its own online-softmax state; at the end the warps' states are merged in
 * shared memory and the thread block writes one partial (max, sum, acc),
 * which the window's kernel merges (attend_decode.cu).
 *
 * Scores, per 16 tokens: S^T = C^T Q' with mma.sync m16n8k16 (fp16 in,
 * fp32 accumulate): A = the key codes (exact fp16 subnormals, below), B = Q'[c][n]
 * = q_n,c * scale_g,c (the key group's per-channel scale folded into q once
 * per group, as an fp16 hi + lo pair built with half2 arithmetic from q's
 * own hi + lo pair, so the scores keep about fp32 accuracy), plus
 * sum_c q_n,c zero_g,c, one more mma per block (A = the zeros of the
 * block's key groups, B = q hi and lo). With at most 4 q heads per kv
 * head (G4) B's 8 columns hold hi and lo of every head, so one mma per
 * k-step gives both terms, half the key mma of one per term. With 2-bit
 * keys (PAIRS) columns 2n and 2n + 1 are hi and lo of head n: a lane's
 * two C elements of a token are one head's two terms, summed in the lane,
 * and the softmax takes one head and two tokens per lane. With 4-bit keys
 * columns n and n + 4 are hi and lo of head n, summed across lane pairs,
 * and the softmax takes two heads and one token per lane (PAIRS measured
 * 0.8 % slower there: ptxas then reloads two values at the loop head).
 * Values, per 16 tokens and channel group g: O^T += C^T P'_g with A = the
 * raw value codes and B = P'_g[t][n] = p_n,t * scale_t,g in fp16, plus
 * sum_t p_n,t zero_t,g, one more mma per 16 tokens (A = the zeros, rows =
 * channel groups), added to the group's channels at the merge. The dot products
 * run over the channels (keys) and tokens (values) in whatever order makes
 * the packed bytes land in the mma fragments cheaply; the B operands use
 * the same order, so the sums are the same.
 *
 * Codes as subnormals: a code masked in place at bit k of a half (k + bits
 * <= 10), with the exponent bits left 0, is the fp16 subnormal code *
 * 2^(k - 24), exact, and the tensor cores multiply subnormal inputs
 * exactly into fp32; so the A operands take one LOP3 per two codes. The
 * value tiles are one bit position each, and their power of two is taken
 * out afterwards (it joins the merge's unit). The key k-steps are ordered
 * so that each takes one bit position k of four bytes of each token, and
 * q's B operands of that k-step carry 2^-k (key_bit; q is scaled by it
 * once, exactly), so every product is in units of 2^-24 and a tile's
 * k-steps run in one accumulator chain (one chain per bit position,
 * combined per tile as a0 + a1 / 4 + a2 / 16 + a3 / 64, took 2.5 % longer
 * on an H200: more registers and instructions); the scores stay in units
 * of 2^-24 up to the softmax. (The code ORed into a half
 * with exponent 25 - k, 2^(10-k) + code, would need a second instruction
 * to subtract 2^(10-k).)
 *
 * The probabilities go through shared memory as fp16, the rounding that
 * the values' B operand applies anyway.
 *
 * Precision: P'_g = fp16(fp16(p) * scale) rounds twice, like the
 * dequantized value and p did before; the p are taken times a power of two
 * 2^e_run (the softmax sums carry the same unit), set from the blocks'
 * value scales (value_exponent) so that P'_g stays finite and out of
 * fp16's subnormal range whatever the scale of the values.
 *
 * Fragment layout of m16n8k16 (lane = 4 i + j): A regs {row i, k 2j..2j+1},
 * {row i+8, k 2j..}, {row i, k 2j+8..}, {row i+8, k 2j+8..}; B regs {k 2j..
 * 2j+1, col i}, {k 2j+8.., col i}; C {row i, col 2j..2j+1}, {row i+8, ..}. */
#include "codes.cuh"

#include <math.h>

#define WARPS VQ_CU_KIVI_WARPS
#define D 128
#define MAX_BT 64 /* tokens per block (the default block of KIVI with group 32 or 64) */
#define SMEM_LIMIT (110 * 1024) /* at least two thread blocks per SM (three for 2-bit) */
/* Row stride (halves) of the fp16 probabilities in shared memory (bt is
 * a multiple of 32). G4, 4 rows: bt / 2 + 8 words puts the lanes of both
 * the writes (score layout) and the reads (value layout) in different
 * banks; 8 rows: bt / 2 + 4 words keeps the writes apart (the reads of 8
 * rows cannot all be). */
template <bool G4>
static __host__ __device__ constexpr int ps_stride(int bt) { return bt + (G4 ? 16 : 8); }
/* Shared memory of one warp: two key buffers (key part, then the
 * positions), two value buffers, then the probabilities. */
template <bool G4>
static __host__ __device__ constexpr size_t warp_stride(int bt, size_t k_bytes, size_t v_bytes) {
    return 2 * (k_bytes + 4 * (size_t)bt + v_bytes) + (G4 ? 4 : 8) * 2 * (size_t)ps_stride<G4>(bt);
}
/* The key and value parts of a block with 64 tokens and key groups of 32
 * (FIXED): codes, then a (scale, zero) pair per key group and channel or per
 * token and value group. kernel_g takes the FIXED instance only when the
 * cache's sizes are these. */
template <int KB>
static __host__ __device__ constexpr int fixed_k_bytes() { return MAX_BT * KB * D / 8 + (MAX_BT / 32) * 2 * D * 2; }
template <int VB, int GV>
static __host__ __device__ constexpr int fixed_v_bytes() { return MAX_BT * VB * D / 8 + MAX_BT * (D / GV) * 2 * 2; }
/* A warp's state per q row in the merge: max, sum, acc[D], the sums of
 * p * zero per value channel group (at most 4 groups at d = 128). */
#define ROW_W (2 + D + 4)
/* q is scaled by 16 before its split into fp16 hi + lo (and the scores
 * back after the mma): the lo terms, about 2^-11 of q * scale, then stay
 * out of fp16's subnormal range for q * scale down to ~0.03, while
 * q * scale * 16 stays finite up to 4094 (attention scale included). */
#define Q_SCALE 16.0f
/* Lazy rescaling (see softmax): how far (log2 units) a score may exceed
 * the running maximum before the maximum moves, and how many powers of two
 * the unit 2^e_run may sit below what a block's value scales allow. */
#define LAZY_MAX 3
#define LAZY_UNIT 4

static __device__ __forceinline__ void mma16816(float (&c)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3,
                                                uint32_t b0, uint32_t b1) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
                 "{%0,%1,%2,%3};\n"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

/* Two codes of b bits at bit k of both halves of x (k + b <= 10: inside
 * the fp16 mantissa) as exact fp16 subnormals: the half with exponent 0
 * and those mantissa bits is code * 2^(k - 24). One LOP3; the power of two
 * is taken out of the sums afterwards (see the top of the file). */
static __device__ __forceinline__ uint32_t codes_sub(uint32_t x, int b, int k) {
    const uint32_t mask = ((1u << b) - 1) << k;
    return x & (mask | mask << 16);
}

/* x >> 8: the odd bytes of a word of key codes (the odd k-steps) in the
 * even bytes' place. 2 bits: as a multiply-high, which runs on the FMA pipe,
 * not on the busier ALU pipe that a shift takes (4-bit keys keep the shift:
 * there ptxas spilled a few registers in the loop with the multiply). */
template <int KB>
static __device__ __forceinline__ uint32_t odd_bytes(uint32_t x) {
    return KB == 2 ? __umulhi(x, 1u << 24) : x >> 8;
}

/* 2^x with results below 2^-126 flushed to 0: one MUFU.EX2, where exp2f
 * adds a range test and two multiplies (on the busy ALU and FMA pipes) to
 * keep such results. For the probabilities that loss changes nothing: p
 * below 2^-126 rounds to fp16 0 before the values take it, and the row sum
 * it is added to is at least 2^-5 (the term of the token that set the
 * running maximum is 2^e_run, e_run >= -5), so the outputs stay
 * bit-identical. */
static __device__ __forceinline__ float exp2_ftz(float x) {
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
    return y;
}

/* A register whose value does not matter: the A rows i + 8 of the zeros'
 * mma, whose sums (C elements 2 and 3) are never read. No instruction sets
 * it, where a 0 took a register move per operand and mma (in the 2-bit G4
 * FIXED instance 44 of ~990 instructions per block; kivi 2-bit 0.6-0.9 %
 * less time on an H200). PAIRS instances only: with 8 q heads ptxas spilled
 * more (stack 32 -> 72 bytes), and kivi 4-bit took 0.5 % longer. */
static __device__ __forceinline__ uint32_t unused_u32() {
    uint32_t x;
    asm("" : "=r"(x));
    return x;
}

static __device__ __forceinline__ uint32_t hmul2_u(uint32_t a, uint32_t b) {
    __half2 v = __hmul2(*(__half2 *)&a, *(__half2 *)&b);
    return *(uint32_t *)&v;
}

static __device__ __forceinline__ uint32_t pack_h2(float lo, float hi) {
    __half2 v = __floats2half2_rn(lo, hi);
    return *(uint32_t *)&v;
}

static __device__ __forceinline__ void cp_async16(void *smem, const void *gmem) {
    uint32_t s = (uint32_t)__cvta_generic_to_shared(smem);
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(s), "l"(gmem));
}
static __device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int N>
static __device__ __forceinline__ void cp_async_wait() { asm volatile("cp.async.wait_group %0;\n" ::"n"(N)); }

/* The bit position of key k-step s's codes in their bytes (see
 * key_channel): q's B operands of that k-step carry 2^-key_bit, so that
 * the codes, exact fp16 subnormals code * 2^(key_bit - 24), give products
 * in one unit whatever their bit position. */
template <int KB>
static __host__ __device__ constexpr int key_bit(int s) { return KB == 2 ? 2 * (s >> 1) : 4 * (s >> 2); }

/* One k-step of a 16-token key tile into one accumulator: G4 one mma
 * (B holds hi and lo in its columns), else the hi and lo terms. */
template <bool G4>
static __device__ __forceinline__ void key_mma(float (&c)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3,
                                               const uint32_t (&bh)[2], const uint32_t (&bl)[2]) {
    mma16816(c, a0, a1, a2, a3, bh[0], bh[1]);
    if (!G4) mma16816(c, a0, a1, a2, a3, bl[0], bl[1]);
}

/* The key channel that lane group j's k-step s, element e (0, 1: A reg 0/1
 * halves; 2, 3: A reg 2/3 halves) stands for. Lane group j reads bytes
 * [8j, 8j + 8) (2 bits) or [16j, 16j + 16) (4 bits) of each token's
 * codes, byte b holding channels b + 32 p (2 bits) or b + 64 p (4 bits)
 * at bit position p. k-step s takes bit position p of words w and w + 1
 * (A regs 0/1 and 2/3): 2 bits: p = s / 2, w = 0; 4 bits: p = s / 4,
 * w = 2 ((s / 2) & 1). PERM: each word is taken with its bytes in the
 * order 0, 2, 1, 3 (key_word), so that its halves' low bytes are bytes 0
 * and 1 and their high bytes 2 and 3, and k-step s takes bytes 0 and 1 of
 * each word (even s) or 2 and 3 (odd s, after a shift by 8): adjacent
 * channels, whose parameters are adjacent halves in memory
 * (load_key_pairs). Otherwise bytes 0 and 2 (even s) or 1 and 3 (odd s). */
template <int KB, bool PERM>
static __device__ __forceinline__ int key_channel(int j, int s, int e) {
    const int byte = PERM ? 2 * (s & 1) + (e & 1) + 4 * (e >> 1) : (s & 1) + 2 * (e & 1) + 4 * (e >> 1);
    if (KB == 2) return 8 * j + 32 * (s >> 1) + byte;
    return 16 * j + 64 * (s >> 2) + 8 * ((s >> 1) & 1) + byte;
}

/* The value channel of tile T, m-row i (+8 when hi). Tiles: (slot, half,
 * pair u); 2 bits: 4 slots x 2 (u: the even or odd bytes), 4 bits: 2 slots
 * x 2 halves x 2. 2 bits: row i is byte 2i + u of the token's codes, row
 * i + 8 byte 16 + 2i + u (the ldmatrix layout, see values); byte b holds
 * channels b + 32 p. */
template <int VB>
static __device__ __forceinline__ int value_channel(int T, int i, int hi) {
    int u = T & 1, h = VB == 4 ? (T >> 1) & 1 : 0, slot = VB == 4 ? T >> 2 : T >> 1;
    if (VB == 2) return 2 * i + u + 16 * hi + 32 * slot;
    return 32 * h + 4 * i + 2 * u + hi + 64 * slot;
}

/* A word of key codes in key_channel's order: PERM, its bytes in the
 * order 0, 2, 1, 3 (one PRMT per word and tile, where pairing the
 * channels' parameters took two PRMT per k-step and parameter set); else
 * as it is. */
template <bool PERM>
static __device__ __forceinline__ uint32_t key_word(uint32_t x) { return PERM ? __byte_perm(x, 0, 0x3120) : x; }

/* The per-channel key parameters (fp16) lane group j needs, as the half2
 * pairs of the B fragments: out[s][0] = channels key_channel(j, s, 0..1),
 * out[s][1] = key_channel(j, s, 2..3). Its channels are runs of 8 (2 bits)
 * or 16 (4 bits) consecutive ones, read with 16-byte loads. */
template <int KB, bool PERM>
static __device__ __forceinline__ void load_key_pairs(const uint16_t *m, int j, uint32_t (&out)[8][2]) {
    uint4 x[2][2]; /* 8 channels each: [p][h] = channels 8j + 32p + 8h (2 bits: x[p / 2][p % 2]) or 16j + 64p + 8h */
#pragma unroll
    for (int r = 0; r < 4; r++) {
        const int p = KB == 2 ? r : r >> 1, h = KB == 2 ? 0 : r & 1;
        const uint4 v = *(const uint4 *)(m + (KB == 2 ? 8 * j + 32 * p : 16 * j + 64 * p + 8 * h));
        x[r >> 1][r & 1] = v;
    }
    /* k-step s: x[s / 4][(s / 2) & 1] holds its channels. PERM: words x,
     * z (even s) or y, w (odd s); else halves s & 1 of words (x, y) and
     * (z, w) */
#pragma unroll
    for (int s = 0; s < 8; s++) {
        const uint4 &v = x[s >> 2][(s >> 1) & 1];
        if constexpr (PERM) {
            out[s][0] = (s & 1) ? v.y : v.x;
            out[s][1] = (s & 1) ? v.w : v.z;
        } else {
            const uint32_t sel = (s & 1) ? 0x7632 : 0x5410;
            out[s][0] = __byte_perm(v.x, v.y, sel);
            out[s][1] = __byte_perm(v.z, v.w, sel);
        }
    }
}

/* The largest power of two 2^eb that a block's probabilities may be
 * scaled by (p <= 2^eb): the block's largest value scale (tokens [0, n))
 * times 2^eb stays below 2^15, so P' = p * scale cannot overflow fp16,
 * and small scales are lifted out of its subnormal range (unscaled,
 * p * scale for 4-bit values of scale ~4e-4 missed the 1e-3 parity); eb
 * is at most 15, so that p, the B operand of the zeros' mma, stays finite
 * too. Scales are non-negative halves: the largest is the largest bit
 * pattern. */
template <int NG>
static __device__ __forceinline__ int value_exponent(const uint16_t *vmeta, int n, int bt, int lane) {
    uint32_t mx = 0; /* per half: the low halves are the scales */
#pragma unroll
    for (int x = 0; x < MAX_BT / 32; x++) {
        const int t = lane + 32 * x;
        const uint32_t *mp = (const uint32_t *)(vmeta + (size_t)min(t, bt - 1) * NG * 2); /* inside the block */
        uint32_t v;
        if constexpr (NG == 4) {
            const uint4 w = *(const uint4 *)mp;
            v = __vmaxu2(__vmaxu2(w.x, w.y), __vmaxu2(w.z, w.w));
        } else if constexpr (NG == 2) {
            const uint2 w = *(const uint2 *)mp;
            v = __vmaxu2(w.x, w.y);
        } else {
            v = *mp;
        }
        mx = t < n ? __vmaxu2(mx, v) : mx;
    }
    mx = __reduce_max_sync(0xffffffffu, mx & 0xffffu);
    return min(29 - (int)(mx >> 10), 15); /* scale < 2^(e - 14), e = the biased exponent */
}

/* FIXED: 64-token blocks and key groups of 32 (KIVI's defaults), bt and the
 * key group compile-time constants: the loops over tiles then have no
 * branches (the tile count and the key-group test are known), so the
 * compiler schedules across the whole block (-8 % time at 8 x 131072). */
template <int KB, int VB, int GV, bool G4, bool FIXED>
__global__ void __launch_bounds__(WARPS * 32, 3) kivi_decode(const __grid_constant__ vq_cu_attn P) {
    constexpr int NG = D / GV; /* value channel groups */
    constexpr int PROWS = G4 ? 4 : 8;
    /* B columns hi, lo per head (see the top of the file); a lane's q rows
     * (heads) in the softmax: PAIRS row j, else rows 2j, 2j + 1 (G4 but not
     * PAIRS: 2 (j & 1), + 1) */
    constexpr bool PAIRS = G4 && KB == 2;
    /* the key code words' byte order (key_channel): G4 only. H200: kivi
     * 2-bit 8 x 131072 -1.0 %, 8 x 65536 -0.9 % (32 fewer PRMT, 16 more
     * register moves a block: 871 -> 857 instructions, 155 -> 160
     * registers); with 8 q heads per kv head ptxas gave the instances 5
     * more registers and 8 B of stack, and 64 q heads ran 1.5 % slower */
    constexpr bool PERM = G4;
    constexpr int NR = PAIRS ? 1 : 2;
    /* the scores come out in units of 2^-24 (key codes as subnormals)
     * times Q_SCALE; SC takes them to log2 units */
    constexpr float SUB_UNIT = 5.9604644775390625e-08f, SC = 16777216.0f / Q_SCALE;
    extern __shared__ __align__(16) unsigned char smem[];
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, i = lane >> 2, j = lane & 3;
    const int h = blockIdx.y, seq = blockIdx.z, part = blockIdx.x;
    const int bt = FIXED ? 64 : P.bt, GK = FIXED ? 32 : P.mk.group;
    /* FIXED: the parts' sizes as constants, so the staging copies unroll
     * without loop control (~170 fewer instructions per block) */
    const int kbytes = FIXED ? fixed_k_bytes<KB>() : (int)P.k_bytes;
    const int vbytes = FIXED ? fixed_v_bytes<VB, GV>() : (int)P.v_bytes, kp = kbytes + 4 * bt;
    const int pst = ps_stride<G4>(bt);
    unsigned char *const kbuf = smem + (size_t)warp * warp_stride<G4>(bt, P.k_bytes, P.v_bytes);
    unsigned char *const vbuf = kbuf + 2 * (size_t)kp;
    __half *ps = (__half *)(vbuf + 2 * (size_t)vbytes); /* [PROWS][pst] probabilities */
    const vq_cu_seq S = vq_cu_seq_at(P, seq);
    const int n_blocks = (S.n_quant + bt - 1) / bt;
    const int b0 = part * P.part_blocks, b1 = min(b0 + P.part_blocks, n_blocks);
    uint8_t *const *table = S.table + (size_t)h * P.max_blocks;
    /* Launched as a programmatic dependent of the previous decode's merge,
     * this block may be resident before that kernel ends: wait for it before
     * reading q or the cache, or writing partials the merge still reads. S and
     * the table pointer above come from the parameters, or from a descriptor
     * copy that the stream orders before this launch. */
    if (P.pdl_prior) vq_cu_wait_primary();
    if (P.pdl) vq_cu_launch_dependents(); /* the window kernel reads this one's partials after its end */

    /* q of head qn (zero past the group), scaled for exp2 and by Q_SCALE,
     * as an fp16 hi + lo pair in the B fragment layout. G4: B column i
     * holds hi or lo of a head (PAIRS: hi if i is even, of head i / 2; else
     * hi if i < 4, of head i & 3), so one mma gives both terms of up to 4
     * heads; qb is the lane's own term (qh or ql). PAIRS: qh stays only in
     * the lanes of lo columns (0 in the others), for the select-free fold
     * below. Otherwise column i is head i and hi, lo take one mma each. qh and
     * qb of k-step s carry 2^-key_bit(s). */
    const float qs = P.scale * 1.4426950408889634f * Q_SCALE;
    const bool lo_col = G4 && (PAIRS ? (i & 1) : i >= 4);
    const int qn = G4 ? (PAIRS ? i >> 1 : i & 3) : i;
    uint32_t qh[8][2], qb[8][2];
    const int g = P.g;
#pragma unroll
    for (int s = 0; s < 8; s++) {
        const float qsb = qs / (float)(1 << key_bit<KB>(s)); /* exact: a power of two */
#pragma unroll
        for (int e = 0; e < 2; e++) {
            float v[2];
#pragma unroll
            for (int x = 0; x < 2; x++) {
                int c = key_channel<KB, PERM>(j, s, 2 * e + x);
                v[x] = qn < g ? P.q[((size_t)seq * P.hq + (size_t)h * g + qn) * D + c] * qsb : 0.0f;
            }
            qh[s][e] = pack_h2(v[0], v[1]);
            float2 hf = __half22float2(*(const __half2 *)&qh[s][e]);
            const uint32_t lo = pack_h2(v[0] - hf.x, v[1] - hf.y);
            qb[s][e] = G4 ? (lo_col ? lo : qh[s][e]) : lo;
            if (PAIRS && !lo_col) qh[s][e] = 0;
        }
    }
    /* The full-block test below takes has_qpos, from the parameters alone:
     * tested on qpos, the build with the PAIRS fold spent 12 % of its stall
     * samples on that test's instruction (ncu, 8 x 131072), and ran 4.7 %
     * longer than with the flag (H200). */
    const bool has_qpos = vq_cu_has_qpos(P);
    const int32_t qpos = has_qpos ? vq_cu_qpos_at(P, seq) : INT32_MAX;

    float m[NR], l[NR]; /* the lane's rows (log2 units) */
#pragma unroll
    for (int r = 0; r < NR; r++) m[r] = -INFINITY, l[r] = 0;
    float acc[8][4];
#pragma unroll
    for (int T = 0; T < 8; T++) acc[T][0] = acc[T][1] = acc[T][2] = acc[T][3] = 0;
    /* sum_t p_t zero_t,g: {row i = group i, col 2j, 2j + 1}; rows i + 8 stay 0 */
    float zacc[4] = {0, 0, 0, 0};
    /* acc and zacc hold their sums times 2^e_run (see value_exponent) */
    int e_run = 0;

    const int kcb = KB * D / 8, vcb = VB * D / 8;
    /* the warp takes blocks b0 + warp + k WARPS, k in [0, nb) */
    const int nb = b0 + warp < b1 ? (b1 - b0 - warp + WARPS - 1) / WARPS : 0;
    auto tokens = [&](int k) { return k < nb ? min(bt, S.n_quant - (b0 + warp + k * WARPS) * bt) : 0; };
    /* The k-th block's key part and positions into key buffer k % 2, its
     * value part into value buffer k % 2. The block's address comes from
     * the block table, a global load: G4 loads it one block ahead (src),
     * so that the copies need not wait for it (the wait took ~7 % of the
     * kernel's stall samples at 8 x 131072 on an H200; loaded ahead, kivi
     * 2-bit there took 2.6 % less time and kivi 4-bit 6 % less). With 8 q
     * heads per kv head the two registers it holds cost more than that
     * (ptxas spilled more; 1.4 % slower). */
    const uint8_t *src = G4 && nb > 0 ? table[b0 + warp] : nullptr;
    auto issue = [&](int k) {
        if (k < nb) {
            if (!G4) src = table[b0 + warp + k * WARPS];
            unsigned char *kd = kbuf + (size_t)(k & 1) * kp, *vd = vbuf + (size_t)(k & 1) * vbytes;
#pragma unroll
            for (int x = lane; x < kbytes / 16; x += 32) cp_async16(kd + 16 * x, src + 16 * x);
#pragma unroll
            for (int x = lane; x < bt / 4; x += 32) cp_async16(kd + kbytes + 16 * x, src + kbytes + vbytes + 16 * x);
            cp_async_commit();
#pragma unroll
            for (int x = lane; x < vbytes / 16; x += 32) cp_async16(vd + 16 * x, src + kbytes + 16 * x);
            if (G4 && k + 1 < nb) src = table[b0 + warp + (k + 1) * WARPS];
        } else {
            cp_async_commit();
        }
        cp_async_commit();
    };
    using score_t = float[MAX_BT / 16][G4 ? 2 : 4];
    /* scores, still times Q_SCALE: PAIRS: tokens i, i + 8 for head j;
     * other G4: the lane's token i + 8 (j >> 1) for heads 2 (j & 1) +
     * {0, 1}; else tokens i, i + 8 for heads 2j + {0, 1}; mx: the lane's
     * largest per row */
    auto scores = [&](const unsigned char *blk, int n, int32_t qp, score_t &sc, float (&mx)[NR]) {
        const uint16_t *kmeta = (const uint16_t *)(blk + (size_t)bt * kcb);
        const int32_t *kpos = (const int32_t *)(blk + kbytes);
#pragma unroll
        for (int r = 0; r < NR; r++) mx[r] = -INFINITY;
        /* two 16-token tiles at a time (both in one key group: groups are
         * multiples of 32 tokens); at most 4 tiles */
        /* Q' = hi + lo, two fp16 terms: fp32-like accuracy. G4: the lane's
         * own term; else bqh and bql */
        uint32_t bqh[8][2], bql[G4 ? 1 : 8][2];
        /* sum_c q_n,c zero_g,c of the block's key groups g on the tensor
         * cores: A row i = the zeros of group i (rows past the groups
         * repeat one; never read), B = q hi and lo; lane (g, j) ends with
         * the sums of B columns 2j, 2j + 1 */
        float qzc[4] = {0, 0, 0, 0};
        {
            /* one chain per bit position: its B carries 2^-key_bit, taken
             * out when the chains are summed */
            constexpr int NP = 8 / KB;
            float qzp[NP][4];
#pragma unroll
            for (int p = 0; p < NP; p++) qzp[p][0] = qzp[p][1] = qzp[p][2] = qzp[p][3] = 0;
            uint32_t zp[8][2];
            load_key_pairs<KB, PERM>(kmeta + (size_t)(i % ((bt + GK - 1) / GK)) * 2 * D + D, j, zp);
#pragma unroll
            for (int s = 0; s < 8; s++) {
                float(&c)[4] = qzp[key_bit<KB>(s) / KB];
                if constexpr (G4) {
                    mma16816(c, zp[s][0], PAIRS ? unused_u32() : 0u, zp[s][1], PAIRS ? unused_u32() : 0u, qb[s][0],
                             qb[s][1]);
                } else {
                    mma16816(c, zp[s][0], 0u, zp[s][1], 0u, qh[s][0], qh[s][1]);
                    mma16816(c, zp[s][0], 0u, zp[s][1], 0u, qb[s][0], qb[s][1]);
                }
            }
#pragma unroll
            for (int p = 0; p < NP; p++) {
                qzc[0] = fmaf(qzp[p][0], (float)(1 << (KB * p)), qzc[0]);
                qzc[1] = fmaf(qzp[p][1], (float)(1 << (KB * p)), qzc[1]);
            }
        }
        float qz0 = 0, qz1 = 0;
#pragma unroll
        for (int tp = 0; tp < MAX_BT / 32; tp++) {
            if (tp * 32 >= bt) break;
            const int t0 = tp * 32;
            if (t0 % GK == 0) { /* a new key group: fold its scales into q */
                /* Q' = q * scale in fp16 hi + lo: hi = q_hi * scale rounded,
                 * the product's exact remainder q_hi * scale - hi (an fma,
                 * exact in fp16), plus q_lo * scale */
                uint32_t sp[8][2];
                load_key_pairs<KB, PERM>(kmeta + (size_t)(t0 / GK) * 2 * D, j, sp);
#pragma unroll
                for (int s = 0; s < 8; s++)
#pragma unroll
                    for (int e = 0; e < 2; e++) {
                        const __half2 a = *(const __half2 *)&qh[s][e], al = *(const __half2 *)&qb[s][e];
                        const __half2 sc2 = *(const __half2 *)&sp[s][e];
                        const __half2 hi = __hmul2(a, sc2);
                        const __half2 lo = __hfma2(al, sc2, __hfma2(a, sc2, __hneg2(hi)));
                        if constexpr (PAIRS) {
                            /* the lane's own term from one formula: qh is 0
                             * in the lanes of hi terms, so there lo is
                             * q_hi * scale + 0 (q_hi in qb), rounded once
                             * like hi. The select it replaces took one or two
                             * register moves per pair; without it kivi 2-bit
                             * 8 x 131072 ran 2.4 % faster on an H200 (the
                             * 4-bit G4 instances keep it: they spilled) */
                            bqh[s][e] = *(const uint32_t *)&lo;
                        } else if constexpr (G4) {
                            bqh[s][e] = lo_col ? *(const uint32_t *)&lo : *(const uint32_t *)&hi;
                        } else {
                            bqh[s][e] = *(const uint32_t *)&hi;
                            bql[s][e] = *(const uint32_t *)&lo;
                        }
                    }
                qz0 = __shfl_sync(0xffffffffu, qzc[0], 4 * (t0 / GK) + j);
                qz1 = __shfl_sync(0xffffffffu, qzc[1], 4 * (t0 / GK) + j);
            }
            /* the two tiles' scores (in units of 2^-24, see key_bit): one
             * accumulator chain per tile, started at the zero sum */
            float cc[2][4];
#pragma unroll
            for (int tt = 0; tt < 2; tt++) {
                const unsigned char *r0 = blk + (size_t)(t0 + 16 * tt + i) * kcb, *r1 = r0 + (size_t)8 * kcb;
                uint32_t w[2][KB]; /* tokens i, i + 8: the lane's 4 KB bytes of each */
                if constexpr (KB == 2) {
                    const uint2 x0 = *(const uint2 *)(r0 + 8 * j), x1 = *(const uint2 *)(r1 + 8 * j);
                    w[0][0] = key_word<PERM>(x0.x), w[0][1] = key_word<PERM>(x0.y);
                    w[1][0] = key_word<PERM>(x1.x), w[1][1] = key_word<PERM>(x1.y);
                } else {
                    const uint4 x0 = *(const uint4 *)(r0 + 16 * j), x1 = *(const uint4 *)(r1 + 16 * j);
                    w[0][0] = key_word<PERM>(x0.x), w[0][1] = key_word<PERM>(x0.y);
                    w[0][2] = key_word<PERM>(x0.z), w[0][3] = key_word<PERM>(x0.w);
                    w[1][0] = key_word<PERM>(x1.x), w[1][1] = key_word<PERM>(x1.y);
                    w[1][2] = key_word<PERM>(x1.z), w[1][3] = key_word<PERM>(x1.w);
                }
                float(&a)[4] = cc[tt];
#pragma unroll
                for (int x = 0; x < 4; x++) a[x] = (x & 1 ? qz1 : qz0) * SUB_UNIT;
#pragma unroll
                for (int s = 0; s < 8; s++) {
                    const int eo = s & 1, wd = KB == 2 ? 0 : 2 * ((s >> 1) & 1);
                    const int k = key_bit<KB>(s);
                    const uint32_t a0 = codes_sub(eo ? odd_bytes<KB>(w[0][wd]) : w[0][wd], KB, k);
                    const uint32_t a1 = codes_sub(eo ? odd_bytes<KB>(w[1][wd]) : w[1][wd], KB, k);
                    const uint32_t a2 = codes_sub(eo ? odd_bytes<KB>(w[0][wd + 1]) : w[0][wd + 1], KB, k);
                    const uint32_t a3 = codes_sub(eo ? odd_bytes<KB>(w[1][wd + 1]) : w[1][wd + 1], KB, k);
                    key_mma<G4>(a, a0, a1, a2, a3, bqh[s], bql[G4 ? 0 : s]);
                }
            }
#pragma unroll
            for (int tt = 0; tt < 2; tt++) {
                const int t16 = tp * 2 + tt;
                const float(&c)[4] = cc[tt];
                if constexpr (PAIRS) {
                    /* columns 2j, 2j + 1: the hi and lo terms of head j,
                     * of tokens i (c[0], c[1]) and i + 8 (c[2], c[3]) */
                    int ta = t0 + 16 * tt + i, tb = ta + 8;
                    bool va = ta < n && kpos[ta] <= qp, vb = tb < n && kpos[tb] <= qp;
                    sc[t16][0] = va ? c[0] + c[1] : -INFINITY;
                    sc[t16][1] = vb ? c[2] + c[3] : -INFINITY;
                    mx[0] = fmaxf(mx[0], fmaxf(sc[t16][0], sc[t16][1]));
                } else if constexpr (G4) {
                    /* lane j < 2 holds the hi terms (columns 2j, 2j + 1) of
                     * tokens i and i + 8, lane j + 2 the lo terms: each keeps
                     * one token and trades the other for its partner's term
                     * (the two sums are the same fp32 additions) */
                    const bool up = j < 2;
                    const float s0 = (up ? c[0] : c[2]) + __shfl_xor_sync(0xffffffffu, up ? c[2] : c[0], 2);
                    const float s1 = (up ? c[1] : c[3]) + __shfl_xor_sync(0xffffffffu, up ? c[3] : c[1], 2);
                    const int tk = t0 + 16 * tt + i + 8 * (j >> 1);
                    const bool v = tk < n && kpos[tk] <= qp;
                    sc[t16][0] = v ? s0 : -INFINITY;
                    sc[t16][1] = v ? s1 : -INFINITY;
                    mx[0] = fmaxf(mx[0], sc[t16][0]);
                    mx[NR - 1] = fmaxf(mx[NR - 1], sc[t16][1]);
                } else {
                    int ta = t0 + 16 * tt + i, tb = ta + 8;
                    bool va = ta < n && kpos[ta] <= qp, vb = tb < n && kpos[tb] <= qp;
                    sc[t16][0] = va ? c[0] : -INFINITY;
                    sc[t16][1] = va ? c[1] : -INFINITY;
                    sc[t16][2] = vb ? c[2] : -INFINITY;
                    sc[t16][3] = vb ? c[3] : -INFINITY;
                    mx[0] = fmaxf(mx[0], fmaxf(sc[t16][0], sc[t16][2]));
                    mx[NR - 1] = fmaxf(mx[NR - 1], fmaxf(sc[t16][1], sc[t16][3]));
                }
            }
        }
    };
    /* the online softmax over a block whose scores are sc: p into ps,
     * the running state rescaled */
    auto softmax = [&](const unsigned char *vblk, int n, score_t &sc, float (&mx)[NR]) {
        const uint16_t *vmeta = (const uint16_t *)(vblk + (size_t)bt * vcb);
        /* online softmax: the lane's rows (see NR) over the block; the
         * scores are still times Q_SCALE. The p of a block are
         * exp2(score - m + e_run): m, the running maximum, and e_run, the
         * unit (see value_exponent), move only when they must (lazy
         * rescaling), so that most blocks skip the rescale of l, acc and
         * zacc (per lane 34 multiplies, the maxima's reduction across lanes
         * and two shuffles). The bound both keep is
         * p <= 2^(e_run + LAZY_MAX) <= 2^eb: a block moves them when a
         * score of it exceeds m by more than LAZY_MAX (log2 units), or when
         * its values' scales need a smaller unit (eb < e_run + LAZY_MAX),
         * or allow one more than 2^LAZY_UNIT times larger (small scales are
         * lifted out of fp16's subnormal range); the unit is then set one
         * bit below the bound, so that scales up to twice as large keep it.
         * The decision is the warp's (one branch); a move is the eager
         * form's: a power of two for the unit, exp2 of the maxima's
         * difference for m. kivi 2-bit 8 x 131072 on an H200: 244.2 ->
         * 236.4 us (the rescale on every block took 56 of the 2-bit full
         * body's 864 instructions). */
        const int eb = value_exponent<NG>(vmeta, n, bt, lane);
        bool move = eb < e_run + LAZY_MAX || eb > e_run + LAZY_MAX + 1 + LAZY_UNIT;
        /* the lanes of a row share its m: the test needs no reduction of mx */
#pragma unroll
        for (int r = 0; r < NR; r++) move = move || mx[r] * SC > m[r] + LAZY_MAX;
        if (__any_sync(0xffffffffu, move)) {
            const int e_new = eb - LAZY_MAX - 1;
            const float fs = __int_as_float((127 + e_new - e_run) << 23);
            e_run = e_new;
            float alpha[NR];
#pragma unroll
            for (int r = 0; r < NR; r++) {
                for (int o = G4 && !PAIRS ? 2 : 4; o < 32; o *= 2)
                    mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], o));
                float mnew = fmaxf(m[r], mx[r] * SC);
                alpha[r] = (m[r] == -INFINITY ? (mnew == -INFINITY ? 1.0f : 0.0f) : exp2f(m[r] - mnew)) * fs;
                m[r] = mnew;
                l[r] *= alpha[r];
            }
            /* acc and zacc hold columns (heads) 2j, 2j + 1; PAIRS: their
             * alphas from lanes 2j, 2j + 1 (lanes j >= 2 hold the zero
             * columns 4-7) */
            const float a0 = PAIRS ? __shfl_sync(0xffffffffu, alpha[0], (2 * j) & 3) : alpha[0];
            const float a1 = PAIRS ? __shfl_sync(0xffffffffu, alpha[0], (2 * j + 1) & 3) : alpha[NR - 1];
#pragma unroll
            for (int T = 0; T < 8; T++) {
                acc[T][0] *= a0;
                acc[T][1] *= a1;
                acc[T][2] *= a0;
                acc[T][3] *= a1;
            }
            zacc[0] *= a0;
            zacc[1] *= a1;
        }
        /* a row with no score yet has only -inf scores: exp2 gives 0 */
        float mb[NR];
#pragma unroll
        for (int r = 0; r < NR; r++) mb[r] = m[r] == -INFINITY ? 0.0f : m[r] - (float)e_run;
        /* p rounded to fp16 here is what the values' B operand takes */
#pragma unroll
        for (int t16 = 0; t16 < MAX_BT / 16; t16++) {
            if (t16 * 16 >= bt) break;
#pragma unroll
            for (int x = 0; x < (G4 ? 2 : 4); x++) {
                const int r = PAIRS ? 0 : x & 1;
                /* 2-bit keys only: with 4-bit keys ptxas's other schedule
                 * (two reloads at the loop head) made kivi 4-bit 8 x 131072
                 * 1.7 % slower on the H200 */
                const float e2 = fmaf(sc[t16][x], SC, -mb[r]), p = KB == 2 ? exp2_ftz(e2) : exp2f(e2);
                l[r] += p;
                const int row = PAIRS ? j : G4 ? 2 * (j & 1) + r : 2 * j + r;
                const int tok = PAIRS ? 8 * x : G4 ? 8 * (j >> 1) : (x >> 1) * 8;
                ps[row * pst + t16 * 16 + i + tok] = __float2half_rn(p);
            }
        }
    };
    /* the values of a block whose p are in ps */
    auto values = [&](const unsigned char *vblk, int n) {
        const uint16_t *vmeta = (const uint16_t *)(vblk + (size_t)bt * vcb);
        /* values, 16 tokens per k-step; lane group j takes tokens
         * 2j, 2j + 1, 2j + 8, 2j + 9 (2 bits: the k order of the codes that
         * ldmatrix delivers) or 4j + ((q + j) & 3) (4 bits: the rotation
         * puts the code loads of the four lane groups in different banks).
         * Per channel group, O^T += C^T P' with A = the raw codes (exact
         * halves) and B = P' = p * scale, the token's scale of the group
         * folded into its probability; the zeros add sum_t p_t zero_t,g to
         * the group's channels, one more mma per k-step with rows = channel
         * groups, A = the zeros, B = p.
         * Padding tokens (past n) have p = 0; their scales and zeros are
         * masked to 0 as well, whatever their bytes hold. */
#pragma unroll
        for (int t0 = 0; t0 < MAX_BT; t0 += 16) {
            if (t0 >= bt) break;
            int tq[4];
#pragma unroll
            for (int q = 0; q < 4; q++)
                tq[q] = VB == 2 ? t0 + 2 * j + (q & 1) + 8 * (q >> 1) : t0 + 4 * j + ((q + j) & 3);
            uint32_t ph[4]; /* fp16 p of B column i (G4: zero past the 4 rows) */
            uint32_t mw[4][NG]; /* [q][group]: (scale, zero) as two halves */
#pragma unroll
            for (int q = 0; q < 4; q++) {
                if constexpr (VB == 4) ph[q] = !G4 || i < PROWS ? __half_as_ushort(ps[i * pst + tq[q]]) : 0u;
                const uint32_t *mp = (const uint32_t *)(vmeta + (size_t)tq[q] * NG * 2);
                if constexpr (NG == 4) {
                    uint4 x = *(const uint4 *)mp;
                    mw[q][0] = x.x, mw[q][1] = x.y, mw[q][2] = x.z, mw[q][3] = x.w;
                } else if constexpr (NG == 2) {
                    uint2 x = *(const uint2 *)mp;
                    mw[q][0] = x.x, mw[q][1] = x.y;
                } else {
                    mw[q][0] = *mp;
                }
            }
            const uint32_t ok01 = (tq[0] < n ? 0xffffu : 0u) | (tq[1] < n ? 0xffff0000u : 0u);
            const uint32_t ok23 = (tq[2] < n ? 0xffffu : 0u) | (tq[3] < n ? 0xffff0000u : 0u);
            uint32_t bp0, bp1; /* p of B column i, tokens tq[0], tq[1] and tq[2], tq[3] */
            if constexpr (VB == 2) { /* adjacent tokens: one 32-bit load each */
                bp0 = !G4 || i < PROWS ? *(const uint32_t *)(ps + i * pst + tq[0]) : 0u;
                bp1 = !G4 || i < PROWS ? *(const uint32_t *)(ps + i * pst + tq[2]) : 0u;
            } else {
                bp0 = ph[0] | ph[1] << 16, bp1 = ph[2] | ph[3] << 16;
            }
            uint32_t bs[NG][2];
#pragma unroll
            for (int gr = 0; gr < NG; gr++) {
                bs[gr][0] = hmul2_u(bp0, __byte_perm(mw[0][gr], mw[1][gr], 0x5410)) & ok01;
                bs[gr][1] = hmul2_u(bp1, __byte_perm(mw[2][gr], mw[3][gr], 0x5410)) & ok23;
            }
            { /* zeros: A row i = group i (rows past the groups repeat one; their sums are never read) */
                const uint16_t *zp = vmeta + 2 * (i % NG) + 1;
                uint32_t z01 = (uint32_t)zp[tq[0] * NG * 2] | (uint32_t)zp[tq[1] * NG * 2] << 16;
                uint32_t z23 = (uint32_t)zp[tq[2] * NG * 2] | (uint32_t)zp[tq[3] * NG * 2] << 16;
                mma16816(zacc, z01 & ok01, PAIRS ? unused_u32() : 0u, z23 & ok23, PAIRS ? unused_u32() : 0u, bp0, bp1);
            }
            if constexpr (VB == 2) {
                /* the A fragments of 16 tokens in one ldmatrix.x4.trans of
                 * b16 elements: matrix m = tokens t0 + 8 (m >> 1) + [0, 8),
                 * bytes 16 (m & 1) + [0, 16) (lane l gives the row address
                 * of matrix l / 8, row l % 8); lane (i, j) gets, in r[m],
                 * bytes 2i, 2i + 1 (of that 16-byte part) of tokens 2j and
                 * 2j + 1 of the matrix, one token per half: the even byte
                 * (u = 0) in each half's low byte, the odd byte (u = 1) there
                 * after a right shift by 8, written as a multiply-high so it
                 * runs on the FMA pipe (the ALU pipe is the kernel's busiest) */
                uint32_t r[4];
                const unsigned char *ra =
                    vblk + (size_t)(t0 + 8 * (lane >> 4) + (lane & 7)) * vcb + 16 * ((lane >> 3) & 1);
                asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                             : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                             : "r"((uint32_t)__cvta_generic_to_shared(ra)));
#pragma unroll
                for (int u = 0; u < 2; u++) {
                    uint32_t y[4];
#pragma unroll
                    for (int x = 0; x < 4; x++) y[x] = u ? __umulhi(r[x], 1u << 24) : r[x];
#pragma unroll
                    for (int slot = 0; slot < 4; slot++) {
                        const int gr = 32 * slot / GV, k = 2 * slot;
                        mma16816(acc[slot * 2 + u], codes_sub(y[0], 2, k), codes_sub(y[1], 2, k),
                                 codes_sub(y[2], 2, k), codes_sub(y[3], 2, k), bs[gr][0], bs[gr][1]);
                    }
                }
            } else { /* 4 bits: two 32-bit loads per token and half, pairs of bytes by PRMT */
#pragma unroll
                for (int hh = 0; hh < 2; hh++) {
                    uint32_t w[4];
#pragma unroll
                    for (int q = 0; q < 4; q++)
                        w[q] = *(const uint32_t *)(vblk + (size_t)tq[q] * vcb + 4 * (i + 8 * hh));
#pragma unroll
                    for (int u = 0; u < 2; u++) {
                        /* byte 2u (channel 4i + 2u) and byte 2u + 1 (channel +1,
                         * the A rows i + 8) of two tokens, in the low byte of
                         * each half */
                        const uint32_t lo = (2 * u) | ((4 + 2 * u) << 8), hi = (2 * u + 1) | ((5 + 2 * u) << 8);
                        const uint32_t y01 = __byte_perm(w[0], w[1], lo), y01h = __byte_perm(w[0], w[1], hi);
                        const uint32_t y23 = __byte_perm(w[2], w[3], lo), y23h = __byte_perm(w[2], w[3], hi);
#pragma unroll
                        for (int slot = 0; slot < 2; slot++) {
                            const int gr = (32 * hh + 64 * slot) / GV, k = 4 * slot;
                            mma16816(acc[slot * 4 + hh * 2 + u], codes_sub(y01, 4, k), codes_sub(y01h, 4, k),
                                     codes_sub(y23, 4, k), codes_sub(y23h, 4, k), bs[gr][0], bs[gr][1]);
                        }
                    }
                }
            }
        }
    };
    score_t sc;
    float mx[NR];
    issue(0);
    for (int k = 0; k < nb; k++) {
        issue(k + 1);
        cp_async_wait<2>();
        __syncwarp();
        const unsigned char *kb = kbuf + (size_t)(k & 1) * kp, *vb = vbuf + (size_t)(k & 1) * vbytes;
        const int n = tokens(k);
        /* FIXED: a block whose 64 tokens are all valid (every block but a
         * sequence's last, unless the query position masks keys) runs a copy
         * of the body with the token count and the query position as
         * constants, so the padding and position masks compile away (the
         * ALU pipe is the kernel's busiest: -12 % of its instructions per
         * block). The test is uniform across the warp. */
        bool full = FIXED && n == MAX_BT;
        if (full && has_qpos) {
            const int32_t *kpos = (const int32_t *)(kb + kbytes);
            full = __reduce_max_sync(0xffffffffu, max(kpos[lane], kpos[lane + 32])) <= qpos;
        }
        if (full) {
            scores(kb, MAX_BT, INT32_MAX, sc, mx);
            softmax(vb, MAX_BT, sc, mx);
            __syncwarp();
            values(vb, MAX_BT);
        } else {
            scores(kb, n, qpos, sc, mx);
            softmax(vb, n, sc, mx);
            __syncwarp();
            values(vb, n);
        }
        __syncwarp();
    }
    cp_async_wait<0>();
    /* the warps' states merged into one partial per thread block: rows
     * 2j, 2j+1 of each warp into its own (now idle) staging space (G4:
     * lanes j < 2 hold rows 0-3 of acc; other G4: and of m and l; PAIRS:
     * lane j holds row j of m and l) */
#pragma unroll
    for (int r = 0; r < NR; r++)
        for (int o = G4 && !PAIRS ? 2 : 4; o < 32; o *= 2) l[r] += __shfl_xor_sync(0xffffffffu, l[r], o);
    __syncwarp();
    float *mine = (float *)kbuf; /* [8 rows][ROW_W]: max (log2 units), sum, acc, zero sums */
    const float unit = __int_as_float((127 - e_run) << 23); /* 2^-e_run */
    if (PAIRS && i == 0 && j < g) {
        mine[(size_t)j * ROW_W] = m[0];
        mine[(size_t)j * ROW_W + 1] = l[0] * unit;
    }
#pragma unroll
    for (int r = 0; r < 2; r++) {
        int row = 2 * j + r;
        if (row >= g) continue;
        float *o = mine + (size_t)row * ROW_W;
        if constexpr (!PAIRS) {
            if (i == 0) {
                o[0] = m[r];
                o[1] = l[r] * unit;
            }
        }
        if (i < NG) o[2 + D + i] = zacc[r] * unit;
#pragma unroll
        for (int T = 0; T < 8; T++) {
            int c0 = value_channel<VB>(T, i, 0), c1 = value_channel<VB>(T, i, 1);
            /* tile T's codes were subnormals, code * 2^(k - 24) */
            const int k = VB * (VB == 4 ? T >> 2 : T >> 1);
            const float f = unit * (float)(1 << (24 - k));
            o[2 + c0] = acc[T][r] * f;
            o[2 + c1] = acc[T][2 + r] * f;
        }
    }
    __syncthreads();
    const size_t wb = warp_stride<G4>(bt, P.k_bytes, P.v_bytes);
    float *out = P.partials + (((size_t)seq * P.hkv + h) * P.n_parts + part) * VQ_CU_RMAX * (size_t)P.part_w;
    for (int idx = threadIdx.x; idx < g * D; idx += WARPS * 32) {
        const int row = idx / D, c = idx % D;
        float M = -INFINITY;
#pragma unroll
        for (int w = 0; w < WARPS; w++) M = fmaxf(M, ((const float *)(smem + w * wb))[row * ROW_W]);
        float L = 0, A = 0;
#pragma unroll
        for (int w = 0; w < WARPS; w++) {
            const float *o = (const float *)(smem + w * wb) + row * ROW_W;
            const float f = o[0] == -INFINITY ? 0.0f : exp2f(o[0] - M);
            L += o[1] * f;
            A += (o[2 + c] + o[2 + D + c / GV]) * f;
        }
        float *po = out + (size_t)row * P.part_w;
        if (c == 0) {
            po[0] = M * 0.6931471805599453f; /* back to natural-log units */
            po[1] = L;
        }
        po[VQ_CU_PART_ACC + c] = A;
    }
}

static size_t smem_bytes(const vq_cu_attn *P) {
    const size_t w = P->g <= 4 ? warp_stride<true>(P->bt, P->k_bytes, P->v_bytes)
                               : warp_stride<false>(P->bt, P->k_bytes, P->v_bytes);
    return (size_t)WARPS * w;
}

bool vq_cu_kivi_fast_ok(const vq_cu_attn *P) {
    return P->mk.kind == VQ_CU_KIVI && P->mv.kind == VQ_CU_KIVI && (P->mk.bits == 2 || P->mk.bits == 4) &&
           (P->mv.bits == 2 || P->mv.bits == 4) && P->d == D && P->n_q == 1 && P->g <= 8 && P->bt % 32 == 0 &&
           P->bt <= MAX_BT && smem_bytes(P) <= SMEM_LIMIT &&
           2 * (P->k_bytes + 4 * (size_t)P->bt + P->v_bytes) >= 8 * ROW_W * sizeof(float); /* room for the merge */
}

typedef void (*kernel_t)(vq_cu_attn);

template <int KB, int VB, int GV, bool FIXED>
static kernel_t kernel_f(const vq_cu_attn *P) {
    return P->g <= 4 ? kivi_decode<KB, VB, GV, true, FIXED> : kivi_decode<KB, VB, GV, false, FIXED>;
}

template <int KB, int VB, int GV>
static kernel_t kernel_g(const vq_cu_attn *P) {
    const bool fixed = P->bt == MAX_BT && P->mk.group == 32 && P->k_bytes == (size_t)fixed_k_bytes<KB>() &&
                       P->v_bytes == (size_t)fixed_v_bytes<VB, GV>();
    return fixed ? kernel_f<KB, VB, GV, true>(P) : kernel_f<KB, VB, GV, false>(P);
}

template <int KB, int VB>
static kernel_t kernel_b(const vq_cu_attn *P) {
    if (P->mv.group == 32) return kernel_g<KB, VB, 32>(P);
    if (P->mv.group == 64) return kernel_g<KB, VB, 64>(P);
    return kernel_g<KB, VB, 128>(P);
}

/* The kernel instance for these arguments. */
static kernel_t kernel_for(const vq_cu_attn *P) {
    int kb = P->mk.bits, vb = P->mv.bits;
    if (kb == 2 && vb == 2) return kernel_b<2, 2>(P);
    if (kb == 2 && vb == 4) return kernel_b<2, 4>(P);
    if (kb == 4 && vb == 2) return kernel_b<4, 2>(P);
    return kernel_b<4, 4>(P);
}

/* Per (kernel instance, device): the shared-memory limit set so far (it
 * only grows; setting it is a driver call, so it is done once per size)
 * and the resident thread blocks per SM at the last size asked for. */
typedef struct {
    kernel_t k;
    int dev, limit, smem, resident;
} kernel_info;

static kernel_info *info_for(kernel_t k, int dev) {
    static kernel_info infos[128];
    static int n_infos;
    for (int x = 0; x < n_infos; x++)
        if (infos[x].k == k && infos[x].dev == dev) return &infos[x];
    if (n_infos == 128) return NULL;
    infos[n_infos] = kernel_info{k, dev, 0, -1, 0};
    return &infos[n_infos++];
}

/* Makes the kernel for P launchable with its shared memory; *resident:
 * its thread blocks per SM. */
static cudaError_t prepare(const vq_cu_attn *P, kernel_t *k, int *resident) {
    *k = kernel_for(P);
    const int sm = (int)smem_bytes(P);
    int dev = 0;
    cudaError_t e = cudaGetDevice(&dev);
    if (e != cudaSuccess) return e;
    kernel_info *in = info_for(*k, dev);
    kernel_info scratch = {*k, dev, 0, -1, 0};
    if (!in) in = &scratch;
    if (sm > in->limit) {
        e = cudaFuncSetAttribute(*k, cudaFuncAttributeMaxDynamicSharedMemorySize, sm);
        if (e != cudaSuccess) return e;
        in->limit = sm;
    }
    if (sm != in->smem) {
        e = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&in->resident, *k, WARPS * 32, sm);
        if (e != cudaSuccess) return e;
        in->smem = sm;
    }
    *resident = in->resident;
    return cudaSuccess;
}

int vq_cu_kivi_resident(const vq_cu_attn *P) {
    kernel_t k;
    int r = 0;
    return prepare(P, &k, &r) == cudaSuccess && r > 0 ? r : 1;
}

cudaError_t vq_cu_kivi_fast_launch(const vq_cu_attn *P, int parts, int n_seqs) {
    kernel_t k;
    int r = 0;
    cudaError_t e = prepare(P, &k, &r);
    if (e != cudaSuccess) return e;
    cudaLaunchAttribute at;
    cudaLaunchConfig_t cfg =
        vq_cu_launch_config(dim3(parts, P->hkv, n_seqs), dim3(WARPS * 32), smem_bytes(P), P->pdl_prior, &at);
    return cudaLaunchKernelEx(&cfg, k, *P);
}
