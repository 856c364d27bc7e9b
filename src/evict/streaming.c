/* StreamingLLM (Xiao et al., "Efficient Streaming Language Models with
 * Attention Sinks", arXiv 2309.17453): keep the first tokens (the attention
 * sinks) and a window of the newest ones. The score is the position, so
 * selection keeps the newest slots after the protected sinks; the recent
 * protection changes nothing here. */
#include "evict.h"

static int streaming_rows(const vq_evict_params *p, int n_q) {
    (void)p;
    (void)n_q;
    return 0;
}

static void streaming_init(const vq_evict_params *p, const vq_evict_state *e, int layer, int head, const float *k,
                           size_t k_stride, const int32_t *pos, int n, int head_dim, float *score) {
    (void)p, (void)e, (void)layer, (void)head, (void)k, (void)k_stride, (void)head_dim;
    /* positions up to 2^24 are exact in a float; past that, neighbours may
     * tie and the lower one is kept, which is still the order of age */
    for (int i = 0; i < n; i++) score[i] = (float)pos[i];
}

const vq_policy vq_policy_streaming = {
    .name = "streaming",
    .options = "",
    .weight_rows = streaming_rows,
    .init = streaming_init,
};
