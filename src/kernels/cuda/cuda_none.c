/* The CUDA entry points of a build without CUDA: no devices, and a CUDA
 * cache cannot be created, so the other entry points are never reached. */
#include "vq_internal.h"

int vq_cuda_device_count(void) { return 0; }

vq_status vq_cuda_synchronize(void) { return VQ_OK; }

vq_status vq_cuda_cache_init(vq_cache *c) {
    (void)c;
    return vq_fail(VQ_ERR_UNSUPPORTED, "device=VQ_DEVICE_CUDA: this build has no CUDA support (configure with "
                   "-DVQ_CUDA=ON where nvcc is installed)");
}

static vq_status unreachable(const char *what) {
    return vq_fail(VQ_ERR_STATE, "%s: no CUDA cache can exist in a build without CUDA", what);
}

void vq_cuda_cache_free(vq_cache *c) { (void)c; }

vq_status vq_cuda_append(vq_cache *c, int layer, int n_tokens, const void *k, const void *v, vq_dtype dtype,
                         const int32_t *positions) {
    (void)c, (void)layer, (void)n_tokens, (void)k, (void)v, (void)dtype, (void)positions;
    return unreachable("vq_cache_append");
}

vq_status vq_cuda_truncate(vq_cache *c, int64_t n_tokens) {
    (void)c, (void)n_tokens;
    return unreachable("vq_cache_truncate");
}

vq_status vq_cuda_attend(vq_cache *const *caches, int n_caches, int layer, const vq_attend_args *a) {
    (void)caches, (void)n_caches, (void)layer, (void)a;
    return unreachable("vq_attend");
}

void vq_cuda_stream_get(const vq_cache *c, int layer, int head, vq_cuda_stream_view *out) {
    (void)c, (void)layer, (void)head;
    out->blocks = NULL;
    out->win_k = out->win_v = NULL;
    out->win_pos = NULL;
}

vq_status vq_cuda_copy_to_host(void *dst, const void *src, size_t bytes) {
    (void)dst, (void)src, (void)bytes;
    return unreachable("vq_cache_to_host");
}
