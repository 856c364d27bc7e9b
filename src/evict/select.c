/* Selection shared by every policy: protected slots first, then the best
 * ranks up to the budget. Deterministic: ties go to the lower slot, which
 * is the lower position since slots stay in position order. */
#include "evict.h"

#include <math.h>
#include <string.h>

/* a ranks before b: higher key, then the lower index */
static int before(const float *key, int64_t a, int64_t b) { return key[a] > key[b] || (key[a] == key[b] && a < b); }

/* Stable merge sort of idx[0..m) by before(); tmp holds m entries. */
static void sort_by_key(int64_t *idx, int64_t m, const float *key, int64_t *tmp) {
    for (int64_t w = 1; w < m; w *= 2) {
        for (int64_t lo = 0; lo < m; lo += 2 * w) {
            int64_t mid = lo + w < m ? lo + w : m, hi = lo + 2 * w < m ? lo + 2 * w : m;
            int64_t i = lo, j = mid, o = lo;
            while (i < mid && j < hi) tmp[o++] = before(key, idx[j], idx[i]) ? idx[j++] : idx[i++];
            while (i < mid) tmp[o++] = idx[i++];
            while (j < hi) tmp[o++] = idx[j++];
        }
        memcpy(idx, tmp, sizeof(int64_t) * (size_t)m);
    }
}

/* Clips the protection of one head to keep_n: the recent window yields
 * first, then the sinks. */
static void clip_protection(int64_t keep_n, int *sinks, int *recent) {
    if (*sinks > keep_n) *sinks = (int)keep_n;
    if (*recent > keep_n - *sinks) *recent = (int)(keep_n - *sinks);
}

void vq_evict_select(const float *rank, int64_t n, int64_t keep_n, int sinks, int recent, uint8_t *keep,
                     int64_t *order) {
    if (n <= keep_n) {
        memset(keep, 1, (size_t)n);
        return;
    }
    memset(keep, 0, (size_t)n);
    if (keep_n <= 0) return;
    clip_protection(keep_n, &sinks, &recent);
    for (int i = 0; i < sinks; i++) keep[i] = 1;
    for (int i = 0; i < recent; i++) keep[n - 1 - i] = 1;
    int64_t m = 0;
    for (int64_t i = sinks; i < n - recent; i++) order[m++] = i;
    sort_by_key(order, m, rank, order + n);
    for (int64_t i = 0; i < keep_n - sinks - recent; i++) keep[order[i]] = 1;
}

void vq_evict_select_shared(int H, float *const *ranks, const int64_t *n, int64_t total, int64_t floor_n, int sinks,
                            int recent, int mass, uint8_t *const *keep, float *norm, int64_t *order) {
    int64_t all = 0;
    for (int h = 0; h < H; h++) all += n[h];
    if (all <= total) {
        for (int h = 0; h < H; h++) memset(keep[h], 1, (size_t)n[h]);
        return;
    }
    /* every head's protection fits its share of the total */
    int64_t share = total / H;
    clip_protection(share, &sinks, &recent);
    if (floor_n > share) floor_n = share;
    int64_t kept = 0, base = 0, m = 0;
    for (int h = 0; h < H; h++) {
        int s = sinks < n[h] ? sinks : (int)n[h];
        int r = recent < n[h] - s ? recent : (int)(n[h] - s);
        memset(keep[h], 0, (size_t)n[h]);
        for (int i = 0; i < s; i++) keep[h][i] = 1;
        for (int i = 0; i < r; i++) keep[h][n[h] - 1 - i] = 1;
        kept += s + r;
        /* normalized ranks of the candidates, so heads compare */
        const float *x = ranks[h];
        int64_t c0 = s, c1 = n[h] - r;
        double z = 0, mx = -INFINITY;
        for (int64_t i = c0; i < c1; i++) mx = x[i] > mx ? x[i] : mx;
        for (int64_t i = c0; i < c1; i++) z += mass ? (x[i] > 0 ? x[i] : 0) : exp((double)x[i] - mx);
        for (int64_t i = 0; i < n[h]; i++) {
            double v;
            if (i < c0 || i >= c1) v = -INFINITY; /* already kept */
            else if (mass) v = z > 0 ? (x[i] > 0 ? x[i] : 0) / z : 1.0 / (double)(c1 - c0);
            else v = exp((double)x[i] - mx) / z;
            norm[base + i] = (float)v;
        }
        /* the floor: this head's best candidates up to floor_n kept slots */
        int64_t mh = 0;
        for (int64_t i = c0; i < c1; i++) order[m + mh++] = base + i;
        sort_by_key(order + m, mh, norm, order + all);
        int64_t f = floor_n - (s + r);
        for (int64_t i = 0; i < f && i < mh; i++) {
            keep[h][order[m + i] - base] = 1;
            norm[order[m + i]] = -INFINITY;
            kept++;
        }
        base += n[h];
        m += mh;
    }
    /* the rest of the total: the best normalized ranks of all heads */
    int64_t g = 0;
    for (int64_t i = 0; i < m; i++)
        if (norm[order[i]] != -INFINITY) order[g++] = order[i];
    sort_by_key(order, g, norm, order + all);
    int64_t left = total - kept;
    for (int64_t i = 0; i < g && i < left; i++) {
        int64_t idx = order[i], b = 0;
        int h = 0;
        while (idx >= b + n[h]) b += n[h++];
        keep[h][idx - b] = 1;
    }
}

void vq_evict_max_pool(const float *x, int64_t n, int kernel, float *out) {
    int64_t r = kernel / 2;
    for (int64_t i = 0; i < n; i++) {
        int64_t a = i - r > 0 ? i - r : 0, b = i + r < n - 1 ? i + r : n - 1;
        float m = x[a];
        for (int64_t j = a + 1; j <= b; j++) m = x[j] > m ? x[j] : m;
        out[i] = m;
    }
}
