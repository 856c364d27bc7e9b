/* Plain fp64 attention: the yardstick the fused kernels are tested against. */
#include "vq_internal.h"

#include <math.h>
#include <stdlib.h>

void vq_attend_reference(int n_heads_q, int n_heads_kv, int head_dim, int n_q, const float *q,
                         const int32_t *q_pos, int n_k, const float *k, const float *v,
                         const int32_t *kpos, double scale, double *out) {
    int g = n_heads_q / n_heads_kv, d = head_dim;
    double *w = malloc(sizeof(double) * (size_t)(n_k > 0 ? n_k : 1));
    if (!w) return;
    for (int qi = 0; qi < n_q; qi++)
        for (int hq = 0; hq < n_heads_q; hq++) {
            int h = hq / g;
            const float *qr = q + ((size_t)qi * n_heads_q + hq) * d;
            const float *kh = k + (size_t)h * n_k * d, *vh = v + (size_t)h * n_k * d;
            double mx = -INFINITY;
            for (int t = 0; t < n_k; t++) {
                if (q_pos && kpos[t] > q_pos[qi]) {
                    w[t] = -INFINITY;
                    continue;
                }
                double s = 0;
                for (int i = 0; i < d; i++) s += (double)qr[i] * (double)kh[(size_t)t * d + i];
                w[t] = s * scale;
                if (w[t] > mx) mx = w[t];
            }
            double *o = out + ((size_t)qi * n_heads_q + hq) * d;
            for (int i = 0; i < d; i++) o[i] = 0;
            if (mx == -INFINITY) continue;
            double sum = 0;
            for (int t = 0; t < n_k; t++) {
                w[t] = w[t] == -INFINITY ? 0 : exp(w[t] - mx);
                sum += w[t];
            }
            for (int t = 0; t < n_k; t++)
                if (w[t] != 0)
                    for (int i = 0; i < d; i++) o[i] += w[t] / sum * (double)vh[(size_t)t * d + i];
        }
    free(w);
}
