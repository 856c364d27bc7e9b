/* Core rotation math: the Walsh-Hadamard transform (scalar and AVX2 agree,
 * H H = d I, orthogonal), the randomized Hadamard and dense rotations
 * (orthogonal, inverse, which one a dimension gets), the Gaussian
 * projection, and the Lloyd-Max codebooks (known Gaussian values from Max
 * 1960, symmetry, convergence, quantization = nearest centroid). */
#include "check.h"
#include "core/rotate.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

static void check_fwht(int d, vq_rng *rng) {
    float *x = malloc(sizeof(float) * d), *a = malloc(sizeof(float) * d), *b = malloc(sizeof(float) * d);
    for (int i = 0; i < d; i++) x[i] = (float)vq_rng_normal(rng);
    memcpy(a, x, sizeof(float) * d);
    memcpy(b, x, sizeof(float) * d);
    vq_fwht_scalar(a, d);
    vq_fwht(b, d);
    CHECK(memcmp(a, b, sizeof(float) * d) == 0, "d %d: dispatched FWHT differs from the scalar one", d);
    /* its own inverse up to scale: H H x = d x */
    vq_fwht(b, d);
    double worst = 0;
    for (int i = 0; i < d; i++) worst = fmax(worst, fabs(b[i] / d - x[i]));
    CHECK(worst < 1e-5, "d %d: H H x != d x (max error %g)", d, worst);
    /* orthogonal up to scale: ||H x||^2 = d ||x||^2 */
    double n0 = 0, n1 = 0;
    for (int i = 0; i < d; i++) {
        n0 += (double)x[i] * x[i];
        n1 += (double)a[i] * a[i];
    }
    CHECK(fabs(n1 / (d * n0) - 1) < 1e-5, "d %d: ||Hx||^2 / (d ||x||^2) = %g", d, n1 / (d * n0));
    free(x); free(a); free(b);
}

/* Rows R e_i are orthonormal, R^T R x = x, and the kind matches d. */
static void check_rotation(int d, bool want_hadamard) {
    const vq_rotation *r = vq_rotation_get(d, 7);
    CHECK(r != NULL, "d %d: %s", d, vq_last_error());
    if (!r) return;
    CHECK(r->hadamard == want_hadamard, "d %d: expected the %s rotation", d, want_hadamard ? "Hadamard" : "dense");
    CHECK(vq_rotation_get(d, 7) == r, "d %d: the rotation is not shared", d);
    float *cols = malloc(sizeof(float) * d * d), *x = malloc(sizeof(float) * d), *y = malloc(sizeof(float) * d);
    for (int i = 0; i < d; i++) {
        memset(x, 0, sizeof(float) * d);
        x[i] = 1;
        vq_rotate(r, x, cols + (size_t)i * d);
    }
    double worst = 0;
    for (int i = 0; i < d; i++)
        for (int j = 0; j <= i; j++) {
            double s = 0;
            for (int c = 0; c < d; c++) s += (double)cols[(size_t)i * d + c] * cols[(size_t)j * d + c];
            worst = fmax(worst, fabs(s - (i == j)));
        }
    CHECK(worst < 1e-5, "d %d: R is not orthogonal (max |R^T R - I| = %g)", d, worst);
    vq_rng rng;
    vq_rng_seed(&rng, (uint64_t)d);
    for (int i = 0; i < d; i++) x[i] = (float)vq_rng_normal(&rng);
    vq_rotate(r, x, y);
    vq_rotate_inverse(r, y, y);
    worst = 0;
    for (int i = 0; i < d; i++) worst = fmax(worst, fabs(y[i] - x[i]));
    CHECK(worst < 1e-5, "d %d: R^T R x != x (max error %g)", d, worst);
    /* a different seed gives a different rotation */
    const vq_rotation *r2 = vq_rotation_get(d, 8);
    vq_rotate(r2, x, y);
    vq_rotate(r, x, cols);
    CHECK(memcmp(y, cols, sizeof(float) * d) != 0, "d %d: seeds 7 and 8 give the same rotation", d);
    free(cols); free(x); free(y);
}

static void check_codebook(vq_density dens, int param, int bits, double center) {
    const vq_codebook *cb = vq_codebook_get(dens, param, bits);
    CHECK(cb != NULL, "codebook %d/%d/%d: %s", (int)dens, param, bits, vq_last_error());
    if (!cb) return;
    CHECK(cb->converged, "codebook %d/%d/%d did not converge in %d iterations", (int)dens, param, bits, cb->iterations);
    CHECK(vq_codebook_get(dens, param, bits) == cb, "codebook not cached");
    double asym = 0, scale = fabs(cb->centroid[cb->n - 1] - center);
    for (int i = 0; i < cb->n; i++) asym = fmax(asym, fabs((cb->centroid[i] - center) + (cb->centroid[cb->n - 1 - i] - center)));
    CHECK(asym < 1e-5 * scale, "codebook %d/%d/%d not symmetric about %g (%g)", (int)dens, param, bits, center, asym);
    for (int i = 0; i + 1 < cb->n; i++) {
        CHECK(cb->centroid[i] < cb->centroid[i + 1], "codebook %d/%d/%d: centroids not ascending", (int)dens, param, bits);
        CHECK(fabsf(cb->boundary[i] - 0.5f * (cb->centroid[i] + cb->centroid[i + 1])) <= 1e-6f * (float)(fabs(center) + scale),
              "codebook %d/%d/%d: boundary %d is not a midpoint", (int)dens, param, bits, i);
    }
    /* counting boundaries gives the nearest centroid */
    vq_rng rng;
    vq_rng_seed(&rng, 11);
    int wrong = 0;
    for (int k = 0; k < 1000; k++) {
        float x = (float)(center + 2 * scale * (vq_rng_uniform(&rng) - 0.5) * 1.3);
        int code = vq_codebook_quantize(cb, x), best = 0;
        for (int i = 1; i < cb->n; i++)
            if (fabsf(x - cb->centroid[i]) < fabsf(x - cb->centroid[best])) best = i;
        wrong += fabsf(x - cb->centroid[code]) > fabsf(x - cb->centroid[best]);
    }
    CHECK(wrong == 0, "codebook %d/%d/%d: %d samples not quantized to the nearest centroid", (int)dens, param, bits, wrong);
}

int main(int argc, char **argv) {
    (void)argc;
    (void)argv;
    vq_rng rng;
    vq_rng_seed(&rng, 1);
    vq_cpu_level best = vq_cpu_detect();
    for (int lvl = VQ_CPU_SCALAR; lvl <= (best >= VQ_CPU_AVX2 ? VQ_CPU_AVX2 : VQ_CPU_SCALAR); lvl++) {
        vq_cpu_set_level((vq_cpu_level)lvl);
        for (int d = 2; d <= 1024; d *= 2) check_fwht(d, &rng);
        int pow2[] = {16, 64, 128, 256};
        for (int i = 0; i < 4; i++) check_rotation(pow2[i], true);
    }
    vq_cpu_set_level(VQ_CPU_AUTO);
    /* Hadamard matrix entries: H e_j has entries +-1 only, columns orthogonal */
    {
        int d = 32;
        float h[32][32];
        for (int j = 0; j < d; j++) {
            for (int i = 0; i < d; i++) h[j][i] = i == j;
            vq_fwht(h[j], d);
        }
        int bad = 0;
        for (int j = 0; j < d; j++)
            for (int k = 0; k < d; k++) {
                float s = 0;
                for (int i = 0; i < d; i++) s += h[j][i] * h[k][i];
                bad += s != (j == k ? (float)d : 0.0f);
                bad += fabsf(h[j][k]) != 1.0f;
            }
        CHECK(bad == 0, "H (d 32) is not a +-1 matrix with H^T H = d I (%d bad entries)", bad);
    }
    int dense[] = {3, 80, 96, 100, 160};
    for (int i = 0; i < 5; i++) check_rotation(dense[i], false);
    CHECK(vq_rotation_get(1, 0) == NULL && strstr(vq_last_error(), "[2, 1024]"), "d = 1: %s", vq_last_error());
    CHECK(vq_rotation_get(2048, 0) == NULL, "d = 2048 accepted");

    /* Gaussian projection: shared, deterministic, mean 0 and variance 1 */
    {
        const float *s = vq_gaussian_matrix_get(256, 128, 3);
        CHECK(s && vq_gaussian_matrix_get(256, 128, 3) == s, "projection not shared");
        double m = 0, v = 0;
        for (int i = 0; i < 256 * 128; i++) {
            m += s[i];
            v += (double)s[i] * s[i];
        }
        m /= 256 * 128;
        v = v / (256 * 128) - m * m;
        CHECK(fabs(m) < 0.02 && fabs(v - 1) < 0.03, "projection mean %g variance %g", m, v);
    }

    /* Lloyd-Max: Max's (1960) Gaussian values */
    {
        const double mse[] = {0.3634, 0.1175, 0.03455, 0.009497}, top[] = {0.7979, 1.5104, 2.1519, 2.7326};
        for (int b = 1; b <= 4; b++) {
            const vq_codebook *g = vq_codebook_get(VQ_DENSITY_GAUSS, 0, b);
            CHECK(fabs(g->mse / mse[b - 1] - 1) < 2e-3, "Gaussian %d-bit mse %.5f, want %.5f", b, g->mse, mse[b - 1]);
            CHECK(fabs(g->centroid[g->n - 1] - top[b - 1]) < 2e-3, "Gaussian %d-bit top level %.4f, want %.4f", b,
                  g->centroid[g->n - 1], top[b - 1]);
        }
        /* 1-bit Laplace(scale 1): the levels are +-E|t| = +-1 */
        const vq_codebook *l = vq_codebook_get(VQ_DENSITY_LAPLACE, 0, 1);
        CHECK(fabs(l->centroid[1] - 1) < 1e-4, "Laplace 1-bit level %g, want 1", l->centroid[1]);
        /* the sphere density approaches N(0, 1/d): d * mse within 2 % of the Gaussian value */
        for (int b = 1; b <= 4; b++) {
            const vq_codebook *s = vq_codebook_get(VQ_DENSITY_SPHERE, 1024, b);
            CHECK(fabs(s->mse * 1024 / mse[b - 1] - 1) < 0.02, "sphere d=1024 %d-bit d*mse %.5f", b, s->mse * 1024);
        }
    }
    for (int b = 1; b <= 4; b++) {
        check_codebook(VQ_DENSITY_GAUSS, 0, b, 0);
        check_codebook(VQ_DENSITY_LAPLACE, 0, b, 0);
        int ds[] = {3, 64, 96, 128, 256};
        for (int i = 0; i < 5; i++) check_codebook(VQ_DENSITY_SPHERE, ds[i], b, 0);
        for (int k = 1; k <= 512; k *= 2) check_codebook(VQ_DENSITY_POLAR_ANGLE, k, b, 0.7853981633974483);
    }
    CHECK(vq_codebook_get(VQ_DENSITY_GAUSS, 0, 5) == NULL && strstr(vq_last_error(), "[1, 4]"), "bits 5: %s", vq_last_error());
    return check_done();
}
