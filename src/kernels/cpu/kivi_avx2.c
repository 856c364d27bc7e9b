/* AVX2 kernels for KIVI scoring and value accumulation. */
#include "vq_internal.h"

#include <immintrin.h>

bool vq_kivi_score_avx2(const vq_mparams *p, const float *q, int rows, const uint8_t *blk,
                        int block_tokens, int t0, int n, float *logits, int ld, float *scratch) {
    (void)p; (void)q; (void)rows; (void)blk; (void)block_tokens; (void)t0; (void)n; (void)logits; (void)ld; (void)scratch;
    return false;
}

bool vq_kivi_accum_avx2(const vq_mparams *p, const float *w, int ld, int rows, const uint8_t *blk,
                        int block_tokens, int t0, int n, float *acc, float *scratch) {
    (void)p; (void)w; (void)ld; (void)rows; (void)blk; (void)block_tokens; (void)t0; (void)n; (void)acc; (void)scratch;
    return false;
}
