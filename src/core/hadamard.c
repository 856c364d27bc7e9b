/* The Walsh-Hadamard transform behind the randomized Hadamard rotation
 * (rotation.c): log2(n) butterfly passes in place, O(n log n). */
#include "rotate.h"

void vq_fwht_avx2(float *x, int n);

void vq_fwht_scalar(float *x, int n) {
    for (int h = 1; h < n; h *= 2)
        for (int i = 0; i < n; i += 2 * h)
            for (int j = i; j < i + h; j++) {
                float a = x[j], b = x[j + h];
                x[j] = a + b;
                x[j + h] = a - b;
            }
}

void vq_fwht(float *x, int n) {
#if defined(__x86_64__)
    if (vq_cpu_has_avx2() && n >= 8) {
        vq_fwht_avx2(x, n);
        return;
    }
#endif
    vq_fwht_scalar(x, n);
}
