/* Seeded random rotations and Gaussian projections, computed once per
 * parameter set and shared for the life of the process (see rotate.h). */
#include "rotate.h"

#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

/* Different objects made from the same user seed draw from unrelated
 * streams: the kind, the sizes and the seed all go into the generator. */
static void seed_stream(vq_rng *r, uint64_t seed, uint64_t kind, int a, int b) {
    vq_rng_seed(r, seed ^ (kind << 56) ^ ((uint64_t)(uint32_t)a << 28) ^ (uint64_t)(uint32_t)b);
}

/* Orthonormalizes the rows of the d x d matrix g (double) in place by
 * modified Gram-Schmidt. The result is the Q of a QR factorization with a
 * positive diagonal, which makes it Haar-distributed for a Gaussian g. */
static void gram_schmidt_rows(double *g, int d) {
    for (int i = 0; i < d; i++) {
        double *v = g + (size_t)i * d;
        for (int j = 0; j < i; j++) {
            const double *u = g + (size_t)j * d;
            double dot = 0;
            for (int c = 0; c < d; c++) dot += u[c] * v[c];
            for (int c = 0; c < d; c++) v[c] -= dot * u[c];
        }
        double nrm = 0;
        for (int c = 0; c < d; c++) nrm += v[c] * v[c];
        nrm = 1.0 / sqrt(nrm); /* a Gaussian matrix is singular with probability 0 */
        for (int c = 0; c < d; c++) v[c] *= nrm;
    }
}

static vq_rotation *rotation_new(int d, uint64_t seed) {
    vq_rotation *r = calloc(1, sizeof *r);
    if (!r) return NULL;
    r->d = d;
    r->seed = seed;
    r->hadamard = (d & (d - 1)) == 0;
    vq_rng rng;
    seed_stream(&rng, seed, 1, d, 0);
    if (r->hadamard) {
        r->signs = malloc(sizeof(float) * (size_t)d);
        if (!r->signs) {
            free(r);
            return NULL;
        }
        for (int i = 0; i < d; i++) r->signs[i] = (vq_rng_next(&rng) >> 63) ? -1.0f : 1.0f;
        return r;
    }
    double *g = malloc(sizeof(double) * (size_t)d * d);
    r->matrix = malloc(sizeof(float) * (size_t)d * d);
    if (!g || !r->matrix) {
        free(g);
        free(r->matrix);
        free(r);
        return NULL;
    }
    for (size_t i = 0; i < (size_t)d * d; i++) g[i] = vq_rng_normal(&rng);
    gram_schmidt_rows(g, d);
    for (size_t i = 0; i < (size_t)d * d; i++) r->matrix[i] = (float)g[i];
    free(g);
    return r;
}

/* The shared objects: two short lists, searched under one mutex. They are
 * never freed (their number is bounded by the distinct specs in use). */
typedef struct gauss_entry {
    int m, d;
    uint64_t seed;
    float *s;
    struct gauss_entry *next;
} gauss_entry;

typedef struct rot_entry {
    vq_rotation *r;
    struct rot_entry *next;
} rot_entry;

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static rot_entry *rotations;
static gauss_entry *gaussians;

const vq_rotation *vq_rotation_get(int d, uint64_t seed) {
    if (d < 2 || d > 1024) {
        vq_fail(VQ_ERR_ARG, "rotation: dimension %d is out of range [2, 1024]", d);
        return NULL;
    }
    pthread_mutex_lock(&lock);
    for (rot_entry *e = rotations; e; e = e->next)
        if (e->r->d == d && e->r->seed == seed) {
            pthread_mutex_unlock(&lock);
            return e->r;
        }
    rot_entry *e = malloc(sizeof *e);
    vq_rotation *r = e ? rotation_new(d, seed) : NULL;
    if (!r) {
        free(e);
        pthread_mutex_unlock(&lock);
        vq_fail(VQ_ERR_NOMEM, "rotation: out of memory for dimension %d", d);
        return NULL;
    }
    e->r = r;
    e->next = rotations;
    rotations = e;
    pthread_mutex_unlock(&lock);
    return r;
}

void vq_rotate(const vq_rotation *r, const float *x, float *y) {
    int d = r->d;
    if (r->hadamard) {
        float scale = 1.0f / sqrtf((float)d);
        for (int i = 0; i < d; i++) y[i] = x[i] * r->signs[i];
        vq_fwht(y, d);
        for (int i = 0; i < d; i++) y[i] *= scale;
        return;
    }
    float tmp[1024];
    for (int i = 0; i < d; i++) tmp[i] = vq_vec_dot(r->matrix + (size_t)i * d, x, d);
    memcpy(y, tmp, sizeof(float) * (size_t)d);
}

void vq_rotate_inverse(const vq_rotation *r, const float *y, float *x) {
    int d = r->d;
    if (r->hadamard) {
        /* R^T = diag(s) H / sqrt(d), H symmetric */
        float scale = 1.0f / sqrtf((float)d);
        if (x != y) memcpy(x, y, sizeof(float) * (size_t)d);
        vq_fwht(x, d);
        for (int i = 0; i < d; i++) x[i] *= scale * r->signs[i];
        return;
    }
    float tmp[1024];
    memset(tmp, 0, sizeof(float) * (size_t)d);
    for (int i = 0; i < d; i++) vq_vec_axpy(y[i], r->matrix + (size_t)i * d, tmp, d);
    memcpy(x, tmp, sizeof(float) * (size_t)d);
}

const float *vq_gaussian_matrix_get(int m, int d, uint64_t seed) {
    if (m < 1 || d < 1 || (size_t)m * (size_t)d > ((size_t)1 << 24)) {
        vq_fail(VQ_ERR_ARG, "projection: %d x %d is out of range (at most 2^24 entries)", m, d);
        return NULL;
    }
    pthread_mutex_lock(&lock);
    for (gauss_entry *e = gaussians; e; e = e->next)
        if (e->m == m && e->d == d && e->seed == seed) {
            pthread_mutex_unlock(&lock);
            return e->s;
        }
    gauss_entry *e = malloc(sizeof *e);
    float *s = e ? malloc(sizeof(float) * (size_t)m * d) : NULL;
    if (!s) {
        free(e);
        pthread_mutex_unlock(&lock);
        vq_fail(VQ_ERR_NOMEM, "projection: out of memory for %d x %d", m, d);
        return NULL;
    }
    vq_rng rng;
    seed_stream(&rng, seed, 2, m, d);
    for (size_t i = 0; i < (size_t)m * d; i++) s[i] = (float)vq_rng_normal(&rng);
    e->m = m;
    e->d = d;
    e->seed = seed;
    e->s = s;
    e->next = gaussians;
    gaussians = e;
    pthread_mutex_unlock(&lock);
    return s;
}
