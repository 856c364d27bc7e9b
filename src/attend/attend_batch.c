/* Attention for a batch of independent sequences, one cache each. CPU
 * caches run one after another; CUDA caches go to the GPU as one launch. */
#include "vq_internal.h"

#include <math.h>
#include <string.h>

vq_status vq_attend_batch(vq_cache *const *caches, int n_caches, int layer, const vq_attend_args *a) {
    if (!caches || !a) return vq_fail(VQ_ERR_ARG, "vq_attend_batch: caches or args is NULL");
    if (n_caches < 1 || n_caches > 65535)
        return vq_fail(VQ_ERR_ARG, "n_caches=%d is out of range [1, 65535]", n_caches);
    for (int i = 0; i < n_caches; i++)
        if (!caches[i]) return vq_fail(VQ_ERR_ARG, "vq_attend_batch: cache %d is NULL", i);
    const vq_cache_config *c0 = &caches[0]->cfg;
    for (int i = 1; i < n_caches; i++) {
        const vq_cache_config *ci = &caches[i]->cfg;
        if (ci->n_layers != c0->n_layers || ci->n_heads_q != c0->n_heads_q || ci->n_heads_kv != c0->n_heads_kv ||
            ci->head_dim != c0->head_dim || caches[i]->block_tokens != caches[0]->block_tokens ||
            strcmp(caches[i]->spec_text, caches[0]->spec_text) != 0)
            return vq_fail(VQ_ERR_ARG, "vq_attend_batch: cache %d differs from cache 0 in shape, block size or spec", i);
        if ((caches[i]->cuda != NULL) != (caches[0]->cuda != NULL) || ci->device_index != c0->device_index)
            return vq_fail(VQ_ERR_ARG, "vq_attend_batch: cache %d is on another device than cache 0", i);
    }
    if (layer < 0 || layer >= c0->n_layers)
        return vq_fail(VQ_ERR_ARG, "layer %d is out of range [0, %d)", layer, c0->n_layers);
    if (a->n_q < 1 || a->n_q > (1 << 20)) return vq_fail(VQ_ERR_ARG, "n_q=%d is out of range [1, 2^20]", a->n_q);
    if (!a->q || !a->out) return vq_fail(VQ_ERR_ARG, "vq_attend_batch: q or out is NULL");
    if (a->out_dtype != VQ_F32 && a->out_dtype != VQ_F16)
        return vq_fail(VQ_ERR_ARG, "out_dtype %d is not VQ_F32 or VQ_F16", (int)a->out_dtype);
    if (!(a->scale >= 0) || isinf(a->scale))
        return vq_fail(VQ_ERR_ARG, "scale %g is out of range (finite and >= 0; 0 = 1/sqrt(head_dim))", (double)a->scale);
    if (caches[0]->cuda) return vq_cuda_attend(caches, n_caches, layer, a);
    size_t rows = (size_t)a->n_q * c0->n_heads_q * c0->head_dim;
    size_t out_es = vq_dtype_size(a->out_dtype);
    for (int i = 0; i < n_caches; i++) {
        vq_attend_args ai = *a;
        ai.q = a->q + rows * i;
        ai.out = (char *)a->out + rows * out_es * i;
        ai.q_pos = a->q_pos ? a->q_pos + (size_t)a->n_q * i : NULL;
        vq_status st = vq_attend(caches[i], layer, &ai);
        if (st) return st;
    }
    return VQ_OK;
}
