/* Aligned memory, a monotonic clock and a seeded random generator. */
#include "vq_internal.h"

#include <math.h>
#include <stdlib.h>
#include <time.h>

void *vq_aligned_alloc(size_t bytes) {
    if (bytes == 0) bytes = 64;
    size_t rounded = (bytes + 63) & ~(size_t)63;
    if (rounded < bytes) return NULL;
    return aligned_alloc(64, rounded);
}

void vq_aligned_free(void *p) { free(p); }

double vq_time_now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

/* xoshiro256** seeded through splitmix64 (public-domain algorithms by
 * Blackman and Vigna). */
static uint64_t splitmix64(uint64_t *x) {
    uint64_t z = (*x += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

void vq_rng_seed(vq_rng *r, uint64_t seed) {
    for (int i = 0; i < 4; i++) r->s[i] = splitmix64(&seed);
}

static uint64_t rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }

uint64_t vq_rng_next(vq_rng *r) {
    uint64_t *s = r->s;
    uint64_t result = rotl(s[1] * 5, 7) * 9;
    uint64_t t = s[1] << 17;
    s[2] ^= s[0];
    s[3] ^= s[1];
    s[1] ^= s[2];
    s[0] ^= s[3];
    s[2] ^= t;
    s[3] = rotl(s[3], 45);
    return result;
}

double vq_rng_uniform(vq_rng *r) { return (double)(vq_rng_next(r) >> 11) * 0x1.0p-53; }

/* Box-Muller; uses two uniforms per call so the stream stays simple. */
double vq_rng_normal(vq_rng *r) {
    double u1 = vq_rng_uniform(r), u2 = vq_rng_uniform(r);
    if (u1 < 1e-300) u1 = 1e-300;
    return sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2);
}
