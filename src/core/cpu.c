/* Runtime CPU feature detection and the process-wide kernel level. */
#include "vq_internal.h"

#include <stdatomic.h>

static atomic_int level_in_use = -1; /* -1: not chosen yet */

vq_cpu_level vq_cpu_detect(void) {
#if defined(__x86_64__) && defined(__GNUC__)
    __builtin_cpu_init();
    int avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
               __builtin_cpu_supports("f16c");
    int avx512 = avx2 && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                 __builtin_cpu_supports("avx512vl");
    if (avx512) return VQ_CPU_AVX512;
    if (avx2) return VQ_CPU_AVX2;
#endif
    return VQ_CPU_SCALAR;
}

const char *vq_cpu_level_name(vq_cpu_level l) {
    switch (l) {
    case VQ_CPU_AUTO: return "auto";
    case VQ_CPU_SCALAR: return "scalar";
    case VQ_CPU_AVX2: return "avx2";
    case VQ_CPU_AVX512: return "avx512";
    }
    return "unknown";
}

vq_status vq_cpu_set_level(vq_cpu_level l) {
    vq_cpu_level have = vq_cpu_detect();
    if (l == VQ_CPU_AUTO) l = have;
    if (l < VQ_CPU_SCALAR || l > VQ_CPU_AVX512)
        return vq_fail(VQ_ERR_ARG, "cpu level %d is out of range (auto, scalar, avx2, avx512)",
                       (int)l);
    if (l > have)
        return vq_fail(VQ_ERR_UNSUPPORTED, "cpu level '%s' is not supported by this CPU (best: '%s')",
                       vq_cpu_level_name(l), vq_cpu_level_name(have));
    atomic_store(&level_in_use, (int)l);
    return VQ_OK;
}

vq_cpu_level vq_cpu_level_in_use(void) {
    int l = atomic_load(&level_in_use);
    if (l < 0) {
        l = (int)vq_cpu_detect();
        atomic_store(&level_in_use, l);
    }
    return (vq_cpu_level)l;
}

/* The AVX-512 level runs its own kernels where one exists (conversions, the
 * fp16 attention path, matmul) and the AVX2 ones elsewhere. */
bool vq_cpu_has_avx2(void) { return vq_cpu_level_in_use() >= VQ_CPU_AVX2; }
bool vq_cpu_has_avx512(void) { return vq_cpu_level_in_use() >= VQ_CPU_AVX512; }

/* AVX512_BF16 is not part of the AVX512 level (Skylake-X and Ice Lake lack
 * it), so it is checked on its own, and only used when that level is in use. */
bool vq_cpu_has_avx512_bf16(void) {
#if defined(__x86_64__) && defined(__GNUC__)
    if (vq_cpu_level_in_use() != VQ_CPU_AVX512) return false;
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx512bf16");
#else
    return false;
#endif
}

/* Set by vq_cpu_hide_vnni. */
static bool vnni_hidden;

void vq_cpu_hide_vnni(bool hide) { vnni_hidden = hide; }

/* AVX512_VNNI likewise (the KIVI kernels' vpdpwssd and vpdpbusd). */
bool vq_cpu_has_avx512_vnni(void) {
#if defined(__x86_64__) && defined(__GNUC__)
    if (vnni_hidden || vq_cpu_level_in_use() != VQ_CPU_AVX512) return false;
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx512vnni");
#else
    return false;
#endif
}
