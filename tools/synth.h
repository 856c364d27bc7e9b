/* Synthetic but realistic K/V and queries for benchmarks and tests: a few
 * outlier key channels with large magnitude and offset, a sink-like first
 * token that most queries attend to, smooth per-token variation. */
#ifndef VQ_SYNTH_H
#define VQ_SYNTH_H

#include <stdint.h>

typedef struct {
    int n_heads_kv, n_heads_q, head_dim;
    uint64_t seed;
} vq_synth;

/* Rows for tokens [t0, t0 + n): k, v as [n][n_heads_kv][head_dim] fp32. */
void vq_synth_kv(const vq_synth *s, int64_t t0, int n, float *k, float *v);
/* One query token: [n_heads_q][head_dim] fp32, with stream index `step`. */
void vq_synth_q(const vq_synth *s, int64_t step, float *q);

#endif
