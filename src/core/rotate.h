/* Random rotations and Lloyd-Max codebooks: the shared math of the
 * rotation-and-codebook methods (TurboQuant, RVQ, QJL, PolarQuant).
 *
 * Both kinds of object are computed once per parameter set and kept for the
 * life of the process (method instances are plain structs copied by value,
 * so they hold pointers to these shared, immutable objects). */
#ifndef VQ_ROTATE_H
#define VQ_ROTATE_H

#include "vq_internal.h"

/* Plain fp32 loops used by the rotation code (dense rotations, projections,
 * PolarQuant's blocks). */
static inline float vq_vec_dot(const float *a, const float *b, int n) {
    float s = 0;
    for (int i = 0; i < n; i++) s += a[i] * b[i];
    return s;
}
static inline void vq_vec_axpy(float a, const float *x, float *y, int n) {
    for (int i = 0; i < n; i++) y[i] += a * x[i];
}

/* ------------------------------------------------------------ rotations */

/* An orthogonal d x d map R. Power-of-two d up to 1024: the randomized
 * Hadamard transform R x = H diag(s) x / sqrt(d), O(d log d), s seeded.
 * Other d: a dense Haar-random orthogonal matrix (QR of a seeded Gaussian
 * matrix), Theta(d^2) storage and work. */
typedef struct vq_rotation {
    int d;
    uint64_t seed;
    bool hadamard;
    float *signs;  /* [d] +1 / -1 (Hadamard) */
    float *matrix; /* [d][d] row-major R (dense) */
} vq_rotation;

/* The process-wide rotation for (d, seed); NULL (and the last error set)
 * when d is out of range [2, 4096] or memory runs out. */
const vq_rotation *vq_rotation_get(int d, uint64_t seed);
/* y = R x (x and y may be the same array). */
void vq_rotate(const vq_rotation *r, const float *x, float *y);
/* x = R^T y (the inverse; x and y may be the same array). */
void vq_rotate_inverse(const vq_rotation *r, const float *y, float *x);

/* Unnormalized in-place Walsh-Hadamard transform x <- H x, n a power of
 * two (H H = n I). Scalar and AVX2 bodies, picked at run time. */
void vq_fwht(float *x, int n);
void vq_fwht_scalar(float *x, int n);

/* An m x d matrix of iid N(0, 1) entries from a seed (row-major, fp32),
 * shared process-wide like the rotations: QJL's projection S. NULL when the
 * size is out of range or memory runs out. */
const float *vq_gaussian_matrix_get(int m, int d, uint64_t seed);

/* ------------------------------------------------------------ Lloyd-Max */

typedef enum {
    /* One coordinate of a uniformly random unit vector in R^d (what a random
     * rotation makes of x / ||x||): f(t) ~ (1 - t^2)^((d-3)/2) on [-1, 1]. */
    VQ_DENSITY_SPHERE,
    VQ_DENSITY_GAUSS,   /* N(0, 1) */
    VQ_DENSITY_LAPLACE, /* f(t) = exp(-|t|) / 2: scale 1, variance 2 */
    /* PolarQuant's angle atan2(|b|, |a|) of two independent chi(k) norms:
     * f(psi) ~ sin(2 psi)^(k-1) on [0, pi/2]. */
    VQ_DENSITY_POLAR_ANGLE,
} vq_density;

#define VQ_CODEBOOK_MAX 16

/* A scalar quantizer with 2^bits levels, optimal (Lloyd-Max) for its density. */
typedef struct vq_codebook {
    vq_density density;
    int param;                         /* d for SPHERE, k for POLAR_ANGLE, else 0 */
    int bits, n;                       /* n = 2^bits centroids */
    float centroid[VQ_CODEBOOK_MAX];   /* ascending */
    float boundary[VQ_CODEBOOK_MAX - 1]; /* boundary[i] = midpoint of centroids i, i+1 */
    double mse;                        /* expected squared error per sample */
    int iterations;                    /* Lloyd iterations until converged */
    bool converged;
} vq_codebook;

/* The cached codebook for (density, param, bits), bits 1..4; NULL (and the
 * last error set) for an unsupported combination. Thread-safe. */
const vq_codebook *vq_codebook_get(vq_density density, int param, int bits);

/* Code of x: the number of boundaries x exceeds (no distance computations). */
static inline int vq_codebook_quantize(const vq_codebook *cb, float x) {
    int code = 0;
    for (int i = 0; i < cb->n - 1; i++) code += x > cb->boundary[i];
    return code;
}

#endif
