/* fp16/bf16 conversion, exhaustive over all 65 536 bit patterns, checked
 * against values computed independently in double precision, and the SIMD
 * array paths against the scalar ones. */
#include "check.h"
#include "veloxquant.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* The value of an fp16 pattern, from the definition. */
static double f16_value(uint16_t h) {
    int s = h >> 15, e = (h >> 10) & 31, m = h & 1023;
    double v;
    if (e == 31) v = m ? NAN : INFINITY;
    else if (e == 0) v = ldexp((double)m, -24);
    else v = ldexp(1.0 + m / 1024.0, e - 15);
    return s ? -v : v;
}

static double bf16_value(uint16_t h) {
    int s = h >> 15, e = (h >> 7) & 255, m = h & 127;
    double v;
    if (e == 255) v = m ? NAN : INFINITY;
    else if (e == 0) v = ldexp((double)m, -133);
    else v = ldexp(1.0 + m / 128.0, e - 127);
    return s ? -v : v;
}

static uint32_t bits_of(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}

/* Checks that converting x gives the pattern `want`. */
#define CHECK_F16(x, want) CHECK(vq_f32_to_f16(x) == (want), "f32 %a -> f16 0x%04x, want 0x%04x", (double)(x), vq_f32_to_f16(x), (want))
#define CHECK_BF16(x, want) CHECK(vq_f32_to_bf16(x) == (want), "f32 %a -> bf16 0x%04x, want 0x%04x", (double)(x), vq_f32_to_bf16(x), (want))

int main(void) {
    int bad_up = 0, bad_rt = 0, bad_mid = 0, bad_bf = 0;
    for (uint32_t i = 0; i < 65536; i++) {
        uint16_t h = (uint16_t)i;
        double want = f16_value(h);
        float f = vq_f16_to_f32(h);
        if (isnan(want)) {
            /* NaN stays NaN and becomes quiet, keeping its payload's top bits */
            if (!isnan(f) || !(bits_of(f) & 0x400000) || ((bits_of(f) >> 13) & 0x1ff) != (h & 0x1ff)) bad_up++;
            if ((vq_f32_to_f16(f) & 0x7e00) != 0x7e00) bad_rt++;
            continue;
        }
        if ((double)f != want || (signbit(f) != 0) != (h >> 15)) bad_up++;
        if (vq_f32_to_f16(f) != h) bad_rt++;
        /* Between this value and the next one up in magnitude: the midpoint
         * ties to the even pattern, and one float ulp either side of it
         * rounds to the nearer. */
        if ((h & 0x7fff) < 0x7bff) { /* the last step, to inf, is checked below */
            uint16_t next = (uint16_t)(h + 1); /* next magnitude, same sign (0x7bff + 1 = inf) */
            double mid = 0.5 * (want + f16_value(next));
            float fm = (float)mid; /* exact: fp16 midpoints fit in fp32 */
            if ((double)fm != mid) bad_mid++;
            uint16_t even = (h & 1) ? next : h;
            if (vq_f32_to_f16(fm) != even) bad_mid++;
            float below = nextafterf(fm, 0.0f), above = nextafterf(fm, fm > 0 ? INFINITY : -INFINITY);
            if (vq_f32_to_f16(below) != h) bad_mid++;
            if (vq_f32_to_f16(above) != next) bad_mid++;
        }
        /* bf16 */
        double bw = bf16_value(h);
        float bfv = vq_bf16_to_f32(h);
        if (isnan(bw)) {
            if (!isnan(bfv)) bad_bf++;
            continue;
        }
        if ((double)bfv != bw || vq_f32_to_bf16(bfv) != h) bad_bf++;
        if ((h & 0x7fff) < 0x7f7f) {
            uint16_t next = (uint16_t)(h + 1);
            float fm = (float)(0.5 * (bw + bf16_value(next)));
            uint16_t even = (h & 1) ? next : h;
            if (vq_f32_to_bf16(fm) != even) bad_bf++;
            if (vq_f32_to_bf16(nextafterf(fm, 0.0f)) != h) bad_bf++;
        }
    }
    CHECK(bad_up == 0, "%d fp16 patterns convert to the wrong fp32 value", bad_up);
    CHECK(bad_rt == 0, "%d fp16 patterns do not survive fp16 -> fp32 -> fp16", bad_rt);
    CHECK(bad_mid == 0, "%d fp16 rounding cases (ties to even, one ulp off a tie) are wrong", bad_mid);
    CHECK(bad_bf == 0, "%d bf16 patterns or rounding cases are wrong", bad_bf);

    /* edges */
    CHECK_F16(65504.0f, 0x7bff);
    CHECK_F16(65519.996f, 0x7bff);
    CHECK_F16(65520.0f, 0x7c00);     /* the tie above the largest finite rounds to inf */
    CHECK_F16(1e10f, 0x7c00);
    CHECK_F16(-1e10f, 0xfc00);
    CHECK_F16(0x1p-24f, 0x0001);     /* smallest subnormal */
    CHECK_F16(0x1p-25f, 0x0000);     /* half of it: tie to even (0) */
    CHECK_F16(0x1.000002p-25f, 0x0001);
    CHECK_F16(0x1.8p-24f, 0x0002);   /* 1.5 ulp: tie to even (2) */
    CHECK_F16(0x1p-14f, 0x0400);     /* smallest normal */
    CHECK_F16(0x1.ff8p-15f, 0x03ff); /* largest subnormal */
    CHECK_F16(0x1.ffcp-15f, 0x0400); /* tie between it and the smallest normal: even */
    CHECK_F16(1e-30f, 0x0000);
    CHECK_F16(-0.0f, 0x8000);
    CHECK_F16(INFINITY, 0x7c00);
    CHECK(vq_f32_to_f16(NAN) == 0x7e00 || (vq_f32_to_f16(NAN) & 0x7e00) == 0x7e00, "NaN -> 0x%04x", vq_f32_to_f16(NAN));
    CHECK_BF16(1.0f, 0x3f80);
    CHECK_BF16(0x1.01p0f, 0x3f80);   /* tie to even down */
    CHECK_BF16(0x1.03p0f, 0x3f82);   /* tie to even up */
    CHECK_BF16(3.4e38f, 0x7f80);     /* rounds to inf */
    CHECK((vq_f32_to_bf16(NAN) & 0x7fc0) == 0x7fc0, "bf16 NaN -> 0x%04x", vq_f32_to_bf16(NAN));

    /* Array paths (SIMD where available) equal the scalar ones, on every
     * fp16/bf16 pattern and on a spread of fp32 values including ties. */
    vq_cpu_level levels[3] = {VQ_CPU_SCALAR};
    int n_levels = 1;
    for (int l = VQ_CPU_AVX2; l <= vq_cpu_detect(); l++) levels[n_levels++] = (vq_cpu_level)l;
    uint16_t *pat = malloc(sizeof(uint16_t) * 65536), *h2 = malloc(sizeof(uint16_t) * 1000003);
    float *f = malloc(sizeof(float) * 1000003);
    for (int li = 0; li < n_levels; li++) {
        vq_cpu_set_level(levels[li]);
        for (uint32_t i = 0; i < 65536; i++) pat[i] = (uint16_t)i;
        float *out = malloc(sizeof(float) * 65536);
        vq_f16_to_f32_array(pat, out, 65536);
        int bad = 0;
        for (uint32_t i = 0; i < 65536; i++) bad += bits_of(out[i]) != bits_of(vq_f16_to_f32((uint16_t)i));
        CHECK(bad == 0, "[%s] f16->f32 array differs from scalar on %d patterns", vq_cpu_level_name(levels[li]), bad);
        vq_bf16_to_f32_array(pat, out, 65536);
        bad = 0;
        for (uint32_t i = 0; i < 65536; i++) bad += bits_of(out[i]) != bits_of(vq_bf16_to_f32((uint16_t)i));
        CHECK(bad == 0, "[%s] bf16->f32 array differs from scalar on %d patterns", vq_cpu_level_name(levels[li]), bad);
        free(out);
        /* fp32 values: every fp16 midpoint and neighbours, random bit patterns */
        vq_rng r;
        vq_rng_seed(&r, 42);
        size_t n = 1000003;
        for (size_t i = 0; i < n; i++) {
            uint32_t u = (uint32_t)vq_rng_next(&r);
            if (i % 3 == 0) u = ((uint32_t)(i / 3 % 65536) << 13) ^ (u & 0x80001fff) ; /* near fp16 grid */
            if (i % 3 == 1) u = (u & 0x80000000) | ((u % (0x47800000 - 0x33000000)) + 0x33000000); /* fp16 range */
            memcpy(&f[i], &u, 4);
        }
        vq_f32_to_f16_array(f, h2, n);
        bad = 0;
        for (size_t i = 0; i < n; i++) bad += h2[i] != vq_f32_to_f16(f[i]) && !(isnan(f[i]) && (h2[i] & 0x7e00) == 0x7e00);
        CHECK(bad == 0, "[%s] f32->f16 array differs from scalar on %d of %zu values", vq_cpu_level_name(levels[li]), bad, n);
        vq_f32_to_bf16_array(f, h2, n);
        bad = 0;
        for (size_t i = 0; i < n; i++) bad += h2[i] != vq_f32_to_bf16(f[i]);
        CHECK(bad == 0, "[%s] f32->bf16 array differs from scalar on %d of %zu values", vq_cpu_level_name(levels[li]), bad, n);
    }
    vq_cpu_set_level(VQ_CPU_AUTO);
    free(pat);
    free(h2);
    free(f);
    return check_done();
}
