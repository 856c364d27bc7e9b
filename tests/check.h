/* A tiny test harness: CHECK records a failure and keeps going; each test
 * program ends with "N passed, N failed". */
#ifndef VQ_CHECK_H
#define VQ_CHECK_H

#include <math.h>
#include <stddef.h>
#include <stdio.h>

static int check_passed, check_failed;

#define CHECK(cond, ...)                                                  \
    do {                                                                  \
        if (cond) {                                                       \
            check_passed++;                                               \
        } else {                                                          \
            check_failed++;                                               \
            fprintf(stderr, "%s:%d: CHECK(%s) failed: ", __FILE__, __LINE__, #cond); \
            fprintf(stderr, __VA_ARGS__);                                 \
            fprintf(stderr, "\n");                                        \
        }                                                                 \
    } while (0)

static int check_done(void) {
    printf("%d passed, %d failed\n", check_passed, check_failed);
    return check_failed ? 1 : 0;
}

/* Relative L2 distance between out and ref (absolute when ref is zero). */
static inline double rel_l2(const float *out, const double *ref, size_t n) {
    double num = 0, den = 0;
    for (size_t i = 0; i < n; i++) {
        double e = (double)out[i] - ref[i];
        num += e * e;
        den += ref[i] * ref[i];
    }
    return den > 0 ? sqrt(num / den) : sqrt(num);
}

#endif
