/* The rotation-and-codebook methods (tq-mse, tq-prod, rvq, qjl, polar):
 * TurboQuant-MSE distortion against the paper's figures, unbiased inner
 * products (tq-prod, qjl) against tq-mse's shrinkage, RVQ against
 * single-pass, round trips and block layout, and the fused kernels
 * (prep_query + score, accum + finish_rows) against q . decode(k) and
 * sum_t w_t decode(v_t) at every kernel level. Options and errors, the
 * cache, and vq_attend end to end last. */
#include "check.h"
#include "core/rotate.h"
#include "methods/rotated.h"
#include "synth.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

static bool method(const char *spec, int d, bool value, vq_mparams *out) {
    vq_spec sp;
    if (vq_spec_parse(spec, d, &sp) != VQ_OK) {
        CHECK(0, "parse '%s' (d %d): %s", spec, d, vq_last_error());
        return false;
    }
    *out = value ? sp.v : sp.k;
    return true;
}

/* n random vectors of dimension d; unit length when `unit`. */
static float *random_rows(int n, int d, bool unit, vq_rng *rng) {
    float *x = malloc(sizeof(float) * (size_t)n * d);
    for (int i = 0; i < n; i++) {
        double s = 0;
        for (int c = 0; c < d; c++) {
            x[(size_t)i * d + c] = (float)vq_rng_normal(rng);
            s += (double)x[(size_t)i * d + c] * x[(size_t)i * d + c];
        }
        float scale = unit ? (float)(1 / sqrt(s)) : 1.0f;
        for (int c = 0; c < d; c++) x[(size_t)i * d + c] *= scale;
    }
    return x;
}

/* Encodes n rows into one block and decodes them back. */
static float *round_trip(const vq_mparams *p, const float *x, int n) {
    int d = p->head_dim;
    uint8_t *blk = calloc(1, p->method->block_bytes(p, n));
    float *y = malloc(sizeof(float) * (size_t)n * d);
    p->method->encode(p, x, (size_t)d, n, blk, n, 0);
    p->method->decode(p, blk, n, 0, n, y);
    free(blk);
    return y;
}

/* TurboQuant-MSE distortion E||x - x_hat||^2 for unit x, d = 128. The paper
 * (Theorem 1) prints 0.36, 0.117, 0.03, 0.009 for b = 1..4. We accept 5 %
 * or half a unit of the printed figure's last digit, whichever is larger:
 * 0.03 is printed with one significant digit (the Lloyd-Max value for a
 * Gaussian is 0.0345, Max 1960). */
static void test_distortion(void) {
    const double paper[] = {0.36, 0.117, 0.03, 0.009}, half_digit[] = {0.005, 0.0005, 0.005, 0.0005};
    const char *specs[] = {"tq-mse:bits=1", "tq-mse:bits=2", "tq-mse:bits=3", "tq-mse:bits=4"};
    int d = 128, n = 4000;
    vq_rng rng;
    vq_rng_seed(&rng, 5);
    float *x = random_rows(n, d, true, &rng);
    double mse[4];
    for (int b = 0; b < 4; b++) {
        vq_mparams p;
        if (!method(specs[b], d, false, &p)) continue;
        float *y = round_trip(&p, x, n);
        double s = 0;
        for (size_t i = 0; i < (size_t)n * d; i++) s += ((double)x[i] - y[i]) * ((double)x[i] - y[i]);
        mse[b] = s / n;
        double tol = fmax(0.05 * paper[b], half_digit[b]);
        printf("tq-mse b=%d d=128: distortion %.5f (paper %g, %+.1f %%; codebook expectation %.5f)\n", b + 1, mse[b],
               paper[b], 100 * (mse[b] / paper[b] - 1), p.cb[0]->mse * d);
        CHECK(fabs(mse[b] - paper[b]) <= tol, "tq-mse b=%d: distortion %.5f, paper %g (tolerance %g)", b + 1, mse[b],
              paper[b], tol);
        /* the measurement matches the codebook's own expectation */
        CHECK(fabs(mse[b] / (p.cb[0]->mse * d) - 1) < 0.03, "tq-mse b=%d: distortion %.5f vs expected %.5f", b + 1,
              mse[b], p.cb[0]->mse * d);
        free(y);
    }
    /* fractional rates sit between their neighbours */
    const char *frac[] = {"tq-mse:bits=2.5", "tq-mse:bits=3.5"};
    for (int i = 0; i < 2; i++) {
        vq_mparams p;
        if (!method(frac[i], d, false, &p)) continue;
        float *y = round_trip(&p, x, n);
        double s = 0;
        for (size_t k = 0; k < (size_t)n * d; k++) s += ((double)x[k] - y[k]) * ((double)x[k] - y[k]);
        s /= n;
        double want = 0.5 * (mse[i + 1] + mse[i + 2]);
        printf("tq-mse b=%s d=128: distortion %.5f (mean of neighbours %.5f)\n", frac[i] + 12, s, want);
        CHECK(s < mse[i + 1] && s > mse[i + 2] && fabs(s / want - 1) < 0.05, "%s: distortion %.5f, neighbours %.5f %.5f",
              frac[i], s, mse[i + 1], mse[i + 2]);
        free(y);
    }
    free(x);
}

/* Inner-product error est - <q, x> over many random pairs with <q, x> =
 * rho, x a random unit vector; est from the fused path (prep + score). The
 * promise is over the method's randomness, so every batch of 64 pairs uses
 * another seed (another rotation and projection). `keys` is the method's
 * spec with at least one option. */
static void ip_errors(const char *keys, int d, int trials, double rho, double *mean, double *se) {
    vq_rng rng;
    vq_rng_seed(&rng, 77);
    int bt = 64;
    double s = 0, s2 = 0;
    int n = 0;
    for (int t = 0; t < trials; t += bt) {
        char spec[128];
        snprintf(spec, sizeof spec, "k=%s,seed=%d;v=fp16", keys, 1000 + t / bt);
        vq_mparams p;
        if (!method(spec, d, false, &p)) return;
        uint8_t *blk = calloc(1, p.method->block_bytes(&p, bt));
        float *prep = malloc(sizeof(float) * p.method->prep_floats(&p));
        float *scratch = malloc(sizeof(float) * (p.method->scratch_floats(&p, 1) + 1));
        float *x = random_rows(bt, d, true, &rng), *z = random_rows(bt, d, false, &rng);
        p.method->encode(&p, x, (size_t)d, bt, blk, bt, 0);
        for (int j = 0; j < bt; j++) {
            float *xj = x + (size_t)j * d, *q = z + (size_t)j * d;
            double dot = 0, nn = 0;
            for (int c = 0; c < d; c++) dot += (double)q[c] * xj[c];
            for (int c = 0; c < d; c++) q[c] -= (float)dot * xj[c];
            for (int c = 0; c < d; c++) nn += (double)q[c] * q[c];
            for (int c = 0; c < d; c++) q[c] = (float)(rho * xj[c] + sqrt(1 - rho * rho) * q[c] / sqrt(nn));
            double truth = 0;
            for (int c = 0; c < d; c++) truth += (double)q[c] * xj[c];
            p.method->prep_query(&p, q, 1, prep);
            float est;
            p.method->score(&p, prep, 1, blk, bt, j, 1, &est, 1, scratch);
            double e = est - truth;
            s += e;
            s2 += e * e;
            n++;
        }
        free(x); free(z); free(blk); free(prep); free(scratch);
    }
    *mean = s / n;
    *se = sqrt((s2 / n - *mean * *mean) / n);
}

static void test_bias(void) {
    int d = 128, trials = 4096;
    double rho = 0.5, mean, se;
    const char *unbiased[] = {"tq-prod:bits=2", "tq-prod:bits=3", "tq-prod:bits=4", "qjl:m=256", "qjl:m=128,outliers=4"};
    for (int i = 0; i < 5; i++) {
        ip_errors(unbiased[i], d, trials, rho, &mean, &se);
        printf("%-22s <q,x> = 0.5: mean error %+.5f, standard error %.5f (%+.1f se)\n", unbiased[i], mean, se, mean / se);
        CHECK(fabs(mean) < 3 * se, "%s: mean inner-product error %g is not within 3 standard errors (%g)", unbiased[i],
              mean, se);
    }
    /* tq-mse shrinks inner products: at 1 bit E[est] = (2/pi) <q, x> for
     * large d (the paper's bias factor); the bias is significant at b = 1..3 */
    const char *biased[] = {"tq-mse:bits=1", "tq-mse:bits=2", "tq-mse:bits=3"};
    for (int i = 0; i < 3; i++) {
        ip_errors(biased[i], d, trials, rho, &mean, &se);
        printf("%-22s <q,x> = 0.5: mean error %+.5f, standard error %.5f (%+.1f se)\n", biased[i], mean, se, mean / se);
        CHECK(mean < -3 * se, "%s: expected a negative (shrinking) bias, got %g (se %g)", biased[i], mean, se);
        if (i == 0)
            CHECK(fabs((rho + mean) / rho - 2 / M_PI) < 0.02, "tq-mse 1-bit: E[est]/<q,x> = %.4f, want 2/pi = %.4f",
                  (rho + mean) / rho, 2 / M_PI);
    }
}

static double mean_cosine(const char *spec, const float *x, int n, int d) {
    vq_mparams p;
    if (!method(spec, d, false, &p)) return 0;
    float *y = round_trip(&p, x, n);
    double s = 0;
    for (int i = 0; i < n; i++) {
        double xy = 0, yy = 0, xx = 0;
        for (int c = 0; c < d; c++) {
            xy += (double)x[(size_t)i * d + c] * y[(size_t)i * d + c];
            xx += (double)x[(size_t)i * d + c] * x[(size_t)i * d + c];
            yy += (double)y[(size_t)i * d + c] * y[(size_t)i * d + c];
        }
        s += xy / sqrt(xx * yy);
    }
    free(y);
    return s / n;
}

/* RVQ at b bits per stage against single-pass TurboQuant-MSE at b bits
 * (the articles' comparison); the equal-total-bits comparison is printed. */
static void test_rvq(void) {
    int d = 128, n = 1000;
    vq_rng rng;
    vq_rng_seed(&rng, 9);
    float *x = random_rows(n, d, false, &rng);
    for (int b = 1; b <= 2; b++) {
        char rs[32], ms[32], ms2[32];
        snprintf(rs, sizeof rs, "rvq:bits=%d", b);
        snprintf(ms, sizeof ms, "tq-mse:bits=%d", b);
        snprintf(ms2, sizeof ms2, "tq-mse:bits=%d", 2 * b);
        double cr = mean_cosine(rs, x, n, d), cm = mean_cosine(ms, x, n, d), cm2 = mean_cosine(ms2, x, n, d);
        printf("cosine: %s %.4f, single-pass %s %.4f, single-pass at equal total bits %s %.4f\n", rs, cr, ms, cm, ms2, cm2);
        CHECK(cr > cm, "%s cosine %.4f does not beat %s %.4f", rs, cr, ms, cm);
    }
    free(x);
}

static const char *const all_specs[] = {
    "tq-mse:bits=1", "tq-mse:bits=2", "tq-mse:bits=3", "tq-mse:bits=4", "tq-mse:bits=2.5", "tq-mse:bits=3.5",
    "tq-prod:bits=2", "tq-prod:bits=3", "tq-prod:bits=4", "rvq:bits=1", "rvq:bits=2", "k=qjl;v=fp16",
    "k=qjl:m=64,outliers=3;v=fp16", "polar", "polar:bits=3/3/2", "polar:bits=4/2/2/2/2/2"};
#define N_SPECS (int)(sizeof all_specs / sizeof all_specs[0])

/* Encoding in pieces at offsets equals encoding at once; decoding a
 * sub-range equals the matching rows; the error is bounded. */
static void test_round_trip(const char *spec, int d, bool value) {
    vq_mparams p;
    if (!method(spec, d, value, &p)) return;
    int bt = 64;
    size_t bb = p.method->block_bytes(&p, bt);
    vq_rng rng;
    vq_rng_seed(&rng, (uint64_t)d);
    float *x = random_rows(bt, d, false, &rng);
    for (int i = 0; i < bt * d; i++) x[i] = vq_f16_to_f32(vq_f32_to_f16(x[i] * 3)); /* the cache gives fp16 values */
    uint8_t *a = calloc(1, bb), *b = calloc(1, bb);
    p.method->encode(&p, x, (size_t)d, bt, a, bt, 0);
    p.method->encode(&p, x, (size_t)d, 10, b, bt, 0);
    p.method->encode(&p, x + 10 * d, (size_t)d, 27, b, bt, 10);
    p.method->encode(&p, x + 37 * d, (size_t)d, bt - 37, b, bt, 37);
    CHECK(memcmp(a, b, bb) == 0, "%s d %d: encoding in pieces differs", spec, d);
    float *all = malloc(sizeof(float) * bt * d), *part = malloc(sizeof(float) * 20 * d);
    p.method->decode(&p, a, bt, 0, bt, all);
    p.method->decode(&p, a, bt, 30, 20, part);
    CHECK(memcmp(all + 30 * d, part, sizeof(float) * 20 * d) == 0, "%s d %d: sub-range decode differs", spec, d);
    double num = 0, den = 0;
    bool finite = true;
    for (int i = 0; i < bt * d; i++) {
        finite &= isfinite(all[i]);
        num += ((double)all[i] - x[i]) * ((double)all[i] - x[i]);
        den += (double)x[i] * x[i];
    }
    double rel = sqrt(num / den);
    /* sqrt of the distortion with room; the sketches (tq-prod's QJL part,
     * qjl) trade a larger per-vector error for unbiased inner products */
    double bound = p.sketch ? 0.5 + 1.2 * sqrt((double)d / p.sketch)
                   : strstr(spec, "tq-prod") ? 1.0 : strstr(spec, "bits=1") ? 0.7 : 0.45;
    CHECK(finite && rel < bound, "%s d %d: relative error %.3f (bound %.2f)", spec, d, rel, bound);
    /* layout: block_bytes matches bits_per_elem */
    double bits = 8.0 * (double)bb / ((double)bt * d);
    CHECK(fabs(bits - p.method->bits_per_elem(&p)) < 1e-9, "%s d %d: block bytes give %.4f bits/elem, reported %.4f",
          spec, d, bits, p.method->bits_per_elem(&p));
    free(x); free(a); free(b); free(all); free(part);
}

/* Fused kernels against the decoded block: score() from prepared rows vs
 * q . decode(k) and accum() + finish_rows() vs sum_t w_t decode(v_t), on a
 * sub-range of a block, several rows, a logits stride wider than n. */
static void test_fused(const char *spec, int d, bool value) {
    vq_mparams p;
    if (!method(spec, d, value, &p)) return;
    int bt = 64, t0 = 5, n = 37, rows = 7, ld = 41; /* rows: a group of four, a pair and one more */
    vq_rng rng;
    vq_rng_seed(&rng, (uint64_t)d * 3 + value);
    float *x = random_rows(bt, d, false, &rng), *q = random_rows(rows, d, false, &rng);
    uint8_t *blk = calloc(1, p.method->block_bytes(&p, bt));
    p.method->encode(&p, x, (size_t)d, bt, blk, bt, 0);
    float *dec = malloc(sizeof(float) * n * d);
    p.method->decode(&p, blk, bt, t0, n, dec);
    float *scratch = malloc(sizeof(float) * (p.method->scratch_floats(&p, rows) + 1));
    if (!value) {
        size_t pf = p.method->prep_floats ? p.method->prep_floats(&p) : (size_t)d;
        float *prep = malloc(sizeof(float) * pf * rows), *logits = malloc(sizeof(float) * rows * ld);
        const float *qq = q;
        if (p.method->prep_query) {
            p.method->prep_query(&p, q, rows, prep);
            qq = prep;
        }
        p.method->score(&p, qq, rows, blk, bt, t0, n, logits, ld, scratch);
        double worst = 0;
        for (int r = 0; r < rows; r++)
            for (int j = 0; j < n; j++) {
                double ref = 0, qn = 0, kn = 0;
                for (int c = 0; c < d; c++) {
                    ref += (double)q[r * d + c] * dec[j * d + c];
                    qn += (double)q[r * d + c] * q[r * d + c];
                    kn += (double)dec[j * d + c] * dec[j * d + c];
                }
                worst = fmax(worst, fabs(logits[r * ld + j] - ref) / sqrt(qn * kn));
            }
        CHECK(worst < 1e-4, "%s d %d level %s: score vs q . decode(k): relative error %g", spec, d,
              vq_cpu_level_name(vq_cpu_level_in_use()), worst);
        free(prep); free(logits);
    } else {
        /* accumulator rows as wide as the method's domain (tq-prod: 2 d) */
        int aw = p.method->acc_floats ? (int)p.method->acc_floats(&p) : d;
        float *w = malloc(sizeof(float) * rows * ld), *acc = calloc((size_t)rows * aw, sizeof(float));
        for (int i = 0; i < rows * ld; i++) w[i] = (float)vq_rng_uniform(&rng);
        w[ld + 3] = 0; /* a zero weight is skipped, not mis-added */
        p.method->accum(&p, w, ld, rows, blk, bt, t0, 20, acc, scratch);
        p.method->accum(&p, w + 20, ld, rows, blk, bt, t0 + 20, n - 20, acc, scratch); /* two calls, one sum */
        if (p.method->finish_rows) p.method->finish_rows(&p, acc, rows);
        for (int r = 0; r < rows; r++) {
            double num = 0, den = 0;
            for (int c = 0; c < d; c++) {
                double ref = 0;
                for (int j = 0; j < n; j++) ref += (double)w[r * ld + j] * dec[j * d + c];
                num += (acc[r * aw + c] - ref) * (acc[r * aw + c] - ref);
                den += ref * ref;
            }
            CHECK(sqrt(num / den) < 1e-4, "%s d %d level %s row %d: accum vs sum w decode(v): relative error %g", spec,
                  d, vq_cpu_level_name(vq_cpu_level_in_use()), r, sqrt(num / den));
        }
        free(w); free(acc);
    }
    free(x); free(q); free(blk); free(dec); free(scratch);
}

/* The sign-sketch kernels (rotated.h) against fp64 sums straight from the
 * bits: tables of S x scored for rows in fours and leftovers, sketch lengths
 * with an odd number of bytes and one longer than the AVX2 accumulation's
 * 1024-sign span, odd token counts; accumulation with a row stride wider
 * than m. At level avx512 also the nibble tables (m = 48: three runs of 16
 * signs in the value sums; 24: a short last 16-byte read) and the value
 * sums of m a multiple of 16. Run at every kernel level. */
static void test_signs(void) {
    const int ms[] = {8, 24, 48, 256, 1032}, rows_list[] = {1, 3, 4, 5, 8};
    vq_rng rng;
    vq_rng_seed(&rng, 77);
    for (int a = 0; a < 5; a++)
        for (int b = 0; b < 5; b++) {
            int m = ms[a], rows = rows_list[b], d = 40, n = 37, ld = 39, sb = m / 8 + 3;
            float *s = random_rows(m, d, false, &rng), *x = random_rows(rows, d, false, &rng);
            float *tab = malloc(sizeof(float) * vq_signs_table_floats(m, rows));
            float *out = malloc(sizeof(float) * (size_t)rows * ld), *gain = malloc(sizeof(float) * n);
            float *w = malloc(sizeof(float) * (size_t)rows * ld), *z = calloc((size_t)rows * (m + 5), sizeof(float));
            float *nib = malloc(sizeof(float) * 4 * (size_t)m * rows), *out2 = malloc(sizeof(float) * (size_t)rows * ld);
            uint8_t *signs = malloc((size_t)n * sb + 15); /* the nibble kernel may read 15 bytes past the last */
            for (int i = 0; i < n * sb; i++) signs[i] = (uint8_t)(vq_rng_next(&rng) >> 56);
            for (int t = 0; t < n; t++) gain[t] = (float)(0.5 + vq_rng_uniform(&rng));
            for (int i = 0; i < rows * ld; i++) {
                out[i] = out2[i] = 1.0f; /* add mode adds to this */
                w[i] = (float)vq_rng_uniform(&rng);
            }
            vq_signs_table(s, m, d, x, (size_t)d, rows, tab);
            vq_signs_score(tab, m, rows, signs, (size_t)sb, gain, n, out, ld, true);
            bool nibbled = vq_signs_nibbled(m);
            if (nibbled) {
                vq_signs_nibbles(s, m, d, x, (size_t)d, rows, nib);
                vq_signs_score_nibbles(nib, m, rows, signs, (size_t)sb, gain, n, out2, ld, true);
            }
            vq_signs_accum(signs, (size_t)sb, m, gain, n, w, ld, rows, z, (size_t)m + 5);
            double worst_s = 0, worst_z = 0;
            for (int r = 0; r < rows; r++) {
                double vn = 0, zn = 0;
                double *v = malloc(sizeof(double) * m), *zr = calloc((size_t)m, sizeof(double));
                for (int i = 0; i < m; i++) {
                    v[i] = 0;
                    for (int c = 0; c < d; c++) v[i] += (double)s[i * d + c] * x[r * d + c];
                    vn += v[i] * v[i];
                }
                for (int t = 0; t < n; t++) {
                    double dot = 0;
                    for (int i = 0; i < m; i++) {
                        double sg = (signs[t * sb + i / 8] >> (i % 8)) & 1 ? 1.0 : -1.0;
                        dot += sg * v[i];
                        zr[i] += sg * (double)w[r * ld + t] * gain[t];
                    }
                    double want = 1.0 + gain[t] * dot;
                    worst_s = fmax(worst_s, fabs(out[r * ld + t] - want) / (gain[t] * sqrt(vn * m)));
                    if (nibbled) worst_s = fmax(worst_s, fabs(out2[r * ld + t] - want) / (gain[t] * sqrt(vn * m)));
                }
                for (int i = 0; i < m; i++) zn += zr[i] * zr[i];
                for (int i = 0; i < m; i++)
                    worst_z = fmax(worst_z, fabs(z[r * (m + 5) + i] - zr[i]) / sqrt(zn / m));
                free(v);
                free(zr);
            }
            CHECK(worst_s < 1e-5 && worst_z < 1e-5, "signs m %d rows %d level %s: score error %g, accum error %g", m,
                  rows, vq_cpu_level_name(vq_cpu_level_in_use()), worst_s, worst_z);
            free(s); free(x); free(tab); free(out); free(gain); free(w); free(z); free(signs); free(nib); free(out2);
        }
}

static void expect_error(const char *spec, int d, const char *needle) {
    vq_spec sp;
    vq_status st = vq_spec_parse(spec, d, &sp);
    CHECK(st == VQ_ERR_ARG && strstr(vq_last_error(), needle), "'%s' (d %d): status %d, message '%s', want '%s'", spec,
          d, (int)st, st ? vq_last_error() : "", needle);
}

static void test_options(void) {
    struct {
        const char *spec, *described;
        double bits;
    } ok[] = {
        {"tq-mse:bits=2.5", "tq-mse:bits=2.5,seed=0,residual=0", 2.625},
        {"tq-mse:bits=3.5,seed=9,residual=32", "tq-mse:bits=3.5,seed=9,residual=32", 3.625},
        {"tq-mse", "tq-mse:bits=4,seed=0,residual=0", 4.125},
        {"tq-prod:bits=3", "tq-prod:bits=3,seed=0,residual=0", 3.25},
        {"rvq:bits=2", "rvq:bits=2,seed=0,residual=0", 4.125},
        {"rvq:bits=1", "rvq:bits=1,seed=0,residual=0", 2.125},
        {"polar", "polar:bits=4/2/2/2,seed=0,residual=0", 3.875},
        {"polar:bits=3/3", "polar:bits=3/3,seed=0,residual=0", (6 + 3 + 16) / 4.0},
    };
    for (size_t i = 0; i < sizeof ok / sizeof ok[0]; i++) {
        vq_mparams p;
        if (!method(ok[i].spec, 128, true, &p)) continue;
        char buf[200];
        p.method->describe(&p, buf, sizeof buf);
        CHECK(strcmp(buf, ok[i].described) == 0, "describe '%s': '%s', want '%s'", ok[i].spec, buf, ok[i].described);
        CHECK(fabs(p.method->bits_per_elem(&p) - ok[i].bits) < 1e-9, "'%s': %g bits/elem, want %g", ok[i].spec,
              p.method->bits_per_elem(&p), ok[i].bits);
        vq_mparams again;
        if (method(buf, 128, true, &again)) {
            char buf2[200];
            again.method->describe(&again, buf2, sizeof buf2);
            CHECK(strcmp(buf, buf2) == 0, "describe is not canonical: '%s' -> '%s'", buf, buf2);
        }
    }
    vq_mparams p;
    if (method("k=qjl:m=256,outliers=2;v=fp16", 128, false, &p)) {
        char buf[200];
        p.method->describe(&p, buf, sizeof buf);
        CHECK(strcmp(buf, "qjl:m=256,outliers=2,seed=0,residual=128") == 0, "describe qjl: '%s'", buf);
        CHECK(fabs(p.method->bits_per_elem(&p) - (256 + 16 + 64) / 128.0) < 1e-9, "qjl bits %g", p.method->bits_per_elem(&p));
    }
    expect_error("qjl", 128, "keys only");
    expect_error("k=fp16;v=qjl", 128, "keys only");
    expect_error("tq-mse:bits=5", 128, "allowed 1, 2, 3, 4, 2.5, 3.5");
    expect_error("tq-mse:bits=2.5", 72, "multiple of 16");
    expect_error("tq-prod:bits=1", 128, "bits=1 is out of range (allowed 2, 3, 4)");
    expect_error("rvq:bits=3", 128, "allowed 1, 2");
    expect_error("k=qjl:m=100;v=fp16", 128, "multiple of 8");
    expect_error("k=qjl:outliers=65;v=fp16", 128, "allowed 0..64");
    expect_error("k=qjl:outliers=40;v=fp16", 64, "allowed 0..32");
    expect_error("polar:bits=4/5", 128, "each 1..4");
    expect_error("polar:bits=4//2", 128, "each 1..4");
    expect_error("polar:bits=2/2/2/2/2/2/2/2", 64, "head dim 64");
    expect_error("tq-mse:seed=-1", 128, "not an unsigned integer");
    expect_error("rvq:group=32", 128, "unknown option 'group'");
    expect_error("tq-mse:bits=2", 100, "head dim 100");
}

/* Through the cache: what it stores decodes like a direct encoding. */
static void test_cache(void) {
    int d = 128, H = 2, n = 200;
    vq_cache_config cfg = {.n_layers = 1, .n_heads_q = 4, .n_heads_kv = H, .head_dim = d,
                           .kv_spec = "k=tq-mse:bits=3.5;v=polar"};
    vq_cache *c;
    if (vq_cache_create(&cfg, &c) != VQ_OK) {
        CHECK(0, "cache: %s", vq_last_error());
        return;
    }
    vq_rng rng;
    vq_rng_seed(&rng, 4);
    float *k = random_rows(n * H, d, false, &rng), *v = random_rows(n * H, d, false, &rng);
    for (int i = 0; i < n * H * d; i++) {
        k[i] = vq_f16_to_f32(vq_f32_to_f16(k[i]));
        v[i] = vq_f16_to_f32(vq_f32_to_f16(v[i]));
    }
    CHECK(vq_cache_append(c, 0, n, k, v, VQ_F32, NULL) == VQ_OK, "%s", vq_last_error());
    float *dk = malloc(sizeof(float) * n * d), *dv = malloc(sizeof(float) * n * d);
    int32_t *pos = malloc(sizeof(int32_t) * n);
    vq_cache_decode(c, 0, 1, dk, dv, pos);
    vq_spec sp;
    vq_spec_parse("k=tq-mse:bits=3.5;v=polar", d, &sp);
    float *want = malloc(sizeof(float) * 2 * d);
    uint8_t *blk = calloc(1, sp.k.method->block_bytes(&sp.k, 1) + sp.v.method->block_bytes(&sp.v, 1));
    bool same = true;
    for (int t = 0; t < n; t += 17) {
        sp.k.method->encode(&sp.k, k + ((size_t)t * H + 1) * d, (size_t)d, 1, blk, 1, 0);
        sp.k.method->decode(&sp.k, blk, 1, 0, 1, want);
        sp.v.method->encode(&sp.v, v + ((size_t)t * H + 1) * d, (size_t)d, 1, blk, 1, 0);
        sp.v.method->decode(&sp.v, blk, 1, 0, 1, want + d);
        same &= memcmp(want, dk + (size_t)t * d, sizeof(float) * d) == 0 && memcmp(want + d, dv + (size_t)t * d, sizeof(float) * d) == 0;
    }
    CHECK(same, "cache contents differ from direct encoding");
    free(k); free(v); free(dk); free(dv); free(pos); free(want); free(blk);
    vq_cache_free(c);
}

/* Fused attention through vq_attend (prepared queries, values finished once
 * per row) against fp64 attention over the decoded cache. */
static double attend_case(const char *spec, int hq, int hkv, int d, int seq, int n_q, vq_pool *pool) {
    vq_cache_config cfg = {.n_layers = 1, .n_heads_q = hq, .n_heads_kv = hkv, .head_dim = d, .kv_spec = spec};
    vq_cache *c;
    if (vq_cache_create(&cfg, &c)) {
        CHECK(0, "create %s: %s", spec, vq_last_error());
        return 1e9;
    }
    vq_synth syn = {.n_heads_kv = hkv, .n_heads_q = hq, .head_dim = d, .seed = (uint64_t)(seq + d)};
    float *k = malloc(sizeof(float) * (size_t)seq * hkv * d), *v = malloc(sizeof(float) * (size_t)seq * hkv * d);
    vq_synth_kv(&syn, 0, seq, k, v);
    int half = seq / 3;
    vq_cache_append(c, 0, half, k, v, VQ_F32, NULL);
    vq_cache_append(c, 0, seq - half, k + (size_t)half * hkv * d, v + (size_t)half * hkv * d, VQ_F32, NULL);
    float *q = malloc(sizeof(float) * (size_t)n_q * hq * d), *out = malloc(sizeof(float) * (size_t)n_q * hq * d);
    int32_t *qpos = malloc(sizeof(int32_t) * (size_t)n_q);
    for (int i = 0; i < n_q; i++) {
        vq_synth_q(&syn, i, q + (size_t)i * hq * d);
        qpos[i] = seq - n_q + i;
    }
    vq_attend_args a = {.n_q = n_q, .q = q, .q_pos = n_q > 1 ? qpos : NULL, .out = out, .out_dtype = VQ_F32, .pool = pool};
    CHECK(vq_attend(c, 0, &a) == VQ_OK, "attend %s: %s", spec, vq_last_error());
    float *dk = malloc(sizeof(float) * (size_t)seq * hkv * d), *dv = malloc(sizeof(float) * (size_t)seq * hkv * d);
    int32_t *pos = malloc(sizeof(int32_t) * (size_t)seq);
    for (int h = 0; h < hkv; h++) vq_cache_decode(c, 0, h, dk + (size_t)h * seq * d, dv + (size_t)h * seq * d, pos);
    double *ref = malloc(sizeof(double) * (size_t)n_q * hq * d);
    vq_attend_reference(hq, hkv, d, n_q, q, n_q > 1 ? qpos : NULL, seq, dk, dv, pos, 1.0 / sqrt((double)d), ref);
    double num = 0, den = 0;
    for (size_t i = 0; i < (size_t)n_q * hq * d; i++) {
        num += (out[i] - ref[i]) * (out[i] - ref[i]);
        den += ref[i] * ref[i];
    }
    free(k); free(v); free(q); free(out); free(qpos); free(dk); free(dv); free(pos); free(ref);
    vq_cache_free(c);
    return sqrt(num / den);
}

static void test_attend(void) {
    const char *specs[] = {"tq-mse:bits=3", "tq-mse:bits=2.5", "tq-prod:bits=3", "tq-prod:bits=4", "rvq:bits=1", "polar",
                           "k=qjl:outliers=2;v=tq-mse:bits=4", "k=tq-mse:bits=4;v=kivi:bits=2",
                           "k=kivi:bits=4;v=rvq:bits=2,residual=16"};
    vq_pool *pool;
    vq_pool_create(2, &pool);
    for (int s = 0; s < (int)(sizeof specs / sizeof specs[0]); s++) {
        double e1 = attend_case(specs[s], 8, 2, 128, 700, 1, pool), e2 = attend_case(specs[s], 4, 2, 64, 300, 5, NULL);
        /* 40 query tokens x 2 heads: more rows than one task takes, so the
         * rows are cut into chunks (32, 32, 16) that prepare their own
         * query rows */
        double e3 = attend_case(specs[s], 4, 2, 128, 200, 40, pool);
        CHECK(e1 < 1e-4 && e2 < 1e-4 && e3 < 1e-4,
              "%s: vq_attend vs reference over the decoded cache: %.3g (decode), %.3g, %.3g (prefill)", specs[s], e1, e2,
              e3);
    }
    vq_pool_free(pool);
}

int main(int argc, char **argv) {
    (void)argc;
    (void)argv;
    test_distortion();
    test_bias();
    test_rvq();
    int dims[] = {64, 128, 96, 256};
    for (int s = 0; s < N_SPECS; s++)
        for (int i = 0; i < 4; i++) {
            if (dims[i] == 96 && strstr(all_specs[s], "4/2/2/2/2/2")) continue; /* 2^6 does not divide 96 */
            test_round_trip(all_specs[s], dims[i], false);
            if (!strstr(all_specs[s], "qjl")) test_round_trip(all_specs[s], dims[i], true);
        }
    vq_cpu_level best = vq_cpu_detect();
    for (int lvl = VQ_CPU_SCALAR; lvl <= best; lvl++) {
        vq_cpu_set_level((vq_cpu_level)lvl);
        test_signs();
        for (int s = 0; s < N_SPECS; s++)
            for (int i = 0; i < 4; i++) {
                if (dims[i] == 96 && strstr(all_specs[s], "4/2/2/2/2/2")) continue;
                test_fused(all_specs[s], dims[i], false);
                if (!strstr(all_specs[s], "qjl")) test_fused(all_specs[s], dims[i], true);
            }
    }
    vq_cpu_set_level(VQ_CPU_AUTO);
    test_options();
    test_cache();
    test_attend();
    return check_done();
}
