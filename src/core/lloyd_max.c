/* Lloyd-Max scalar quantizers (Lloyd 1957 / Max 1960) for the densities the
 * rotation methods meet (see rotate.h).
 *
 * The density is tabulated once on a fine uniform grid together with the
 * running integrals of f, t f and t^2 f (trapezoid rule). A cell [a, b] then
 * costs two interpolations per moment, so the Lloyd iteration (boundaries =
 * midpoints of the centroids, centroids = conditional means of the cells) is
 * cheap and runs until the centroids stop moving. */
#include "rotate.h"

#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#define GRID 65536          /* intervals; the grid is symmetric and holds 0 */
#define MAX_ITERATIONS 20000
#define TOLERANCE 1e-11     /* largest centroid move, relative to the domain */

typedef struct {
    double lo, hi, h;
    double *m0, *m1, *m2; /* [GRID + 1] running integrals of f, t f, t^2 f (normalized) */
} moments;

static double density(vq_density dens, int param, double t) {
    switch (dens) {
    case VQ_DENSITY_SPHERE: {
        double e = 0.5 * (param - 3);
        if (e == 0) return 1;
        double u = 1 - t * t;
        return u <= 0 ? 0 : exp(e * log(u));
    }
    case VQ_DENSITY_GAUSS: return exp(-0.5 * t * t);
    case VQ_DENSITY_LAPLACE: return exp(-fabs(t));
    case VQ_DENSITY_POLAR_ANGLE: {
        double s = sin(2 * t);
        return param == 1 ? 1 : (s <= 0 ? 0 : pow(s, param - 1));
    }
    }
    return 0;
}

static void domain(vq_density dens, double *lo, double *hi) {
    *lo = -1; /* VQ_DENSITY_SPHERE */
    *hi = 1;
    if (dens == VQ_DENSITY_GAUSS) {
        *lo = -12;
        *hi = 12;
    } else if (dens == VQ_DENSITY_LAPLACE) {
        *lo = -60;
        *hi = 60;
    } else if (dens == VQ_DENSITY_POLAR_ANGLE) {
        *lo = 0;
        *hi = 1.5707963267948966;
    }
}

static bool moments_init(moments *mo, vq_density dens, int param) {
    domain(dens, &mo->lo, &mo->hi);
    mo->h = (mo->hi - mo->lo) / GRID;
    mo->m0 = malloc(sizeof(double) * 3 * (GRID + 1));
    if (!mo->m0) return false;
    mo->m1 = mo->m0 + GRID + 1;
    mo->m2 = mo->m1 + GRID + 1;
    double prev_t = mo->lo, prev_f = density(dens, param, prev_t);
    mo->m0[0] = mo->m1[0] = mo->m2[0] = 0;
    for (int i = 1; i <= GRID; i++) {
        double t = i == GRID ? mo->hi : mo->lo + i * mo->h, f = density(dens, param, t);
        double half = 0.5 * mo->h;
        mo->m0[i] = mo->m0[i - 1] + half * (prev_f + f);
        mo->m1[i] = mo->m1[i - 1] + half * (prev_t * prev_f + t * f);
        mo->m2[i] = mo->m2[i - 1] + half * (prev_t * prev_t * prev_f + t * t * f);
        prev_t = t;
        prev_f = f;
    }
    double z = mo->m0[GRID];
    for (int i = 0; i <= GRID; i++) {
        mo->m0[i] /= z;
        mo->m1[i] /= z;
        mo->m2[i] /= z;
    }
    return true;
}

/* A running integral at x, linear between grid points. */
static double at(const moments *mo, const double *m, double x) {
    double u = (x - mo->lo) / mo->h;
    if (u <= 0) return m[0];
    if (u >= GRID) return m[GRID];
    int i = (int)u;
    double f = u - i;
    return m[i] + f * (m[i + 1] - m[i]);
}

/* The x where the CDF reaches p (bisection on the tabulated CDF). */
static double quantile(const moments *mo, double p) {
    double a = mo->lo, b = mo->hi;
    for (int it = 0; it < 100; it++) {
        double m = 0.5 * (a + b);
        if (at(mo, mo->m0, m) < p) a = m;
        else b = m;
    }
    return 0.5 * (a + b);
}

static bool solve(vq_codebook *cb, vq_density dens, int param, int bits) {
    moments mo;
    if (!moments_init(&mo, dens, param)) return false;
    int n = 1 << bits;
    double c[VQ_CODEBOOK_MAX], b[VQ_CODEBOOK_MAX + 1];
    /* start from the centres of n equal-probability cells */
    for (int i = 0; i < n; i++) c[i] = quantile(&mo, (i + 0.5) / n);
    b[0] = mo.lo;
    b[n] = mo.hi;
    double tol = TOLERANCE * (mo.hi - mo.lo);
    cb->converged = false;
    int it;
    for (it = 1; it <= MAX_ITERATIONS; it++) {
        for (int i = 1; i < n; i++) b[i] = 0.5 * (c[i - 1] + c[i]);
        double moved = 0;
        for (int i = 0; i < n; i++) {
            double p = at(&mo, mo.m0, b[i + 1]) - at(&mo, mo.m0, b[i]);
            if (p <= 0) continue; /* an empty cell keeps its centroid */
            double nc = (at(&mo, mo.m1, b[i + 1]) - at(&mo, mo.m1, b[i])) / p;
            moved = fmax(moved, fabs(nc - c[i]));
            c[i] = nc;
        }
        if (moved < tol) {
            cb->converged = true;
            break;
        }
    }
    for (int i = 1; i < n; i++) b[i] = 0.5 * (c[i - 1] + c[i]);
    double mse = 0;
    for (int i = 0; i < n; i++) {
        double p0 = at(&mo, mo.m0, b[i + 1]) - at(&mo, mo.m0, b[i]);
        double p1 = at(&mo, mo.m1, b[i + 1]) - at(&mo, mo.m1, b[i]);
        double p2 = at(&mo, mo.m2, b[i + 1]) - at(&mo, mo.m2, b[i]);
        mse += p2 - 2 * c[i] * p1 + c[i] * c[i] * p0;
    }
    free(mo.m0);
    cb->density = dens;
    cb->param = param;
    cb->bits = bits;
    cb->n = n;
    for (int i = 0; i < n; i++) cb->centroid[i] = (float)c[i];
    for (int i = 0; i + 1 < n; i++) cb->boundary[i] = (float)b[i + 1];
    cb->mse = mse;
    cb->iterations = it > MAX_ITERATIONS ? MAX_ITERATIONS : it;
    return true;
}

typedef struct cb_entry {
    vq_codebook cb;
    struct cb_entry *next;
} cb_entry;

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static cb_entry *codebooks; /* never freed: one per (density, param, bits) in use */

const vq_codebook *vq_codebook_get(vq_density dens, int param, int bits) {
    if (bits < 1 || bits > 4) {
        vq_fail(VQ_ERR_ARG, "codebook: bits=%d is out of range [1, 4]", bits);
        return NULL;
    }
    if (dens == VQ_DENSITY_SPHERE && (param < 3 || param > 65536)) {
        vq_fail(VQ_ERR_ARG, "codebook: sphere dimension %d is out of range [3, 65536]", param);
        return NULL;
    }
    if (dens == VQ_DENSITY_POLAR_ANGLE && (param < 1 || param > 4096)) {
        vq_fail(VQ_ERR_ARG, "codebook: polar angle order %d is out of range [1, 4096]", param);
        return NULL;
    }
    if (dens == VQ_DENSITY_GAUSS || dens == VQ_DENSITY_LAPLACE) param = 0;
    pthread_mutex_lock(&lock);
    for (cb_entry *e = codebooks; e; e = e->next)
        if (e->cb.density == dens && e->cb.param == param && e->cb.bits == bits) {
            pthread_mutex_unlock(&lock);
            return &e->cb;
        }
    cb_entry *e = calloc(1, sizeof *e);
    if (!e || !solve(&e->cb, dens, param, bits)) {
        free(e);
        pthread_mutex_unlock(&lock);
        vq_fail(VQ_ERR_NOMEM, "codebook: out of memory");
        return NULL;
    }
    e->next = codebooks;
    codebooks = e;
    pthread_mutex_unlock(&lock);
    return &e->cb;
}
