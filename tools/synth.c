#include "synth.h"

#include "veloxquant.h"

#include <math.h>

/* Deterministic per-(seed, token, head) generator so any chunk of the stream
 * can be produced independently. */
static void seed_for(vq_rng *r, uint64_t seed, int64_t t, int h, uint64_t salt) {
    vq_rng_seed(r, seed * 0x9e3779b97f4a7c15ull ^ ((uint64_t)t << 20) ^ ((uint64_t)h << 4) ^ salt);
}

/* Approximately N(0, 1) from one 64-bit draw: the sum of four 16-bit
 * uniforms, centred and scaled (Irwin-Hall); fast enough to fill caches of
 * millions of rows. */
static float fast_normal(vq_rng *r) {
    uint64_t x = vq_rng_next(r);
    float s = (float)(x & 0xffff) + (float)((x >> 16) & 0xffff) + (float)((x >> 32) & 0xffff) +
              (float)(x >> 48);
    return (s * (1.0f / 65536.0f) - 2.0f) * 1.7320508f;
}

/* Per-channel key offset and magnitude: channels 3 and d/2+5 (per head) are
 * outliers, as seen in real models' keys. */
static void key_channel(int h, int c, int d, float *mean, float *sd) {
    int outlier = c == (3 + h) % d || c == (d / 2 + 5 + h) % d;
    *mean = outlier ? 6.0f : 0.2f * (float)((c * 7 + h) % 5 - 2);
    *sd = outlier ? 4.0f : 0.6f + 0.4f * (float)((c * 13 + h * 3) % 7) / 6.0f;
}

void vq_synth_kv(const vq_synth *s, int64_t t0, int n, float *k, float *v) {
    int H = s->n_heads_kv, d = s->head_dim;
    vq_rng r;
    for (int i = 0; i < n; i++) {
        int64_t t = t0 + i;
        float drift[8]; /* a slow drift along the sequence, like positional structure */
        for (int j = 0; j < 8; j++) drift[j] = 0.5f * sinf((float)t * 0.001f * (float)(1 + j));
        for (int h = 0; h < H; h++) {
            seed_for(&r, s->seed, t, h, 1);
            float *kr = k + ((int64_t)i * H + h) * d, *vr = v + ((int64_t)i * H + h) * d;
            float tok_scale = 0.8f + 0.4f * (float)vq_rng_uniform(&r);
            for (int c = 0; c < d; c++) {
                float mean, sd;
                key_channel(h, c, d, &mean, &sd);
                kr[c] = mean + drift[c % 8] + sd * fast_normal(&r);
                vr[c] = tok_scale * fast_normal(&r);
            }
            if (t == 0) { /* the sink: a key aligned with the outliers, a small value */
                for (int c = 0; c < d; c++) {
                    float mean, sd;
                    key_channel(h, c, d, &mean, &sd);
                    kr[c] = mean * 3.0f;
                    vr[c] *= 0.1f;
                }
            }
        }
    }
}

void vq_synth_q(const vq_synth *s, int64_t step, float *q) {
    int Hq = s->n_heads_q, d = s->head_dim, g = s->n_heads_q / s->n_heads_kv;
    vq_rng r;
    for (int hq = 0; hq < Hq; hq++) {
        int h = hq / g;
        seed_for(&r, s->seed ^ 0x5151, step, hq, 2);
        for (int c = 0; c < d; c++) {
            float mean, sd;
            key_channel(h, c, d, &mean, &sd);
            /* queries lean towards the outlier channels, as real ones do */
            q[(int64_t)hq * d + c] = 0.15f * mean + fast_normal(&r);
        }
    }
}
