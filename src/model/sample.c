/* Next-token sampling: greedy, or temperature + nucleus (top-p). */
#include "vq_internal.h"

#include <math.h>
#include <stdlib.h>

typedef struct {
    float p;
    int32_t id;
} cand;

static int by_prob_desc(const void *a, const void *b) {
    const cand *x = a, *y = b;
    if (x->p != y->p) return x->p < y->p ? 1 : -1;
    return (x->id > y->id) - (x->id < y->id); /* ties: lower id first, so results are stable */
}

int32_t vq_sample(const float *logits, int vocab, float temperature, float top_p, vq_rng *rng, float *scratch) {
    int32_t best = 0;
    for (int i = 1; i < vocab; i++)
        if (logits[i] > logits[best]) best = i;
    if (!(temperature > 0) || !rng) return best;
    if (!(top_p > 0) || top_p > 1) top_p = 1;
    /* softmax at the temperature; scratch holds (p, id) pairs */
    cand *c = (cand *)scratch;
    float mx = logits[best], sum = 0;
    for (int i = 0; i < vocab; i++) {
        c[i].p = expf((logits[i] - mx) / temperature);
        c[i].id = i;
        sum += c[i].p;
    }
    int n = vocab;
    if (top_p < 1) {
        /* keep the smallest set of most likely tokens whose mass reaches top_p */
        qsort(c, (size_t)vocab, sizeof *c, by_prob_desc);
        float acc = 0;
        for (n = 0; n < vocab; n++) {
            acc += c[n].p / sum;
            if (acc >= top_p) {
                n++;
                break;
            }
        }
        if (n > vocab) n = vocab;
        sum = 0;
        for (int i = 0; i < n; i++) sum += c[i].p;
    }
    float r = (float)vq_rng_uniform(rng) * sum, acc = 0;
    for (int i = 0; i < n; i++) {
        acc += c[i].p;
        if (r < acc) return c[i].id;
    }
    return c[n - 1].id;
}
