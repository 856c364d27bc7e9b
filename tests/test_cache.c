/* The cache: bytes allocated vs the analytic size, input dtypes, reset,
 * truncate, capacity, positions, different K and V methods. */
#include "check.h"
#include "synth.h"
#include "veloxquant.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* Analytic bytes of a cache holding n tokens per layer: quantized tokens at
 * the method's bits per element (codes + fp16 scale/zero) plus a 4-byte
 * position, and the fp16 window (allocated at its full size). */
static double analytic_bytes(int L, int H, int d, int64_t n, double bits_k, double bits_v, int residual, int group) {
    int win = residual + group;
    int64_t n_quant = n >= win ? ((n - residual) / group) * group : 0;
    if (n_quant > n) n_quant = n;
    double per_tok = (double)d * (bits_k + bits_v) / 8.0 + 4.0;
    double window = n > 0 ? (double)win * ((double)d * 4.0 + 4.0) : 0;
    if (bits_k == 16 && bits_v == 16) window = 0, n_quant = n; /* fp16 has no window */
    return (double)L * H * ((double)n_quant * per_tok + window);
}

int main(void) {
    struct {
        const char *spec;
        double bk, bv;
        int residual, group;
    } cases[] = {
        {"fp16", 16, 16, 0, 1},
        {"kivi:bits=2", 2 + 32.0 / 32, 2 + 32.0 / 32, 128, 32},
        {"kivi:bits=4,group=64", 4 + 32.0 / 64, 4 + 32.0 / 64, 128, 64},
        {"kivi:bits=3,group=128,residual=0", 3 + 32.0 / 128, 3 + 32.0 / 128, 0, 128},
        {"k=kivi:bits=4;v=kivi:bits=2,residual=32", 4 + 1, 2 + 1, 128, 32},
    };
    int L = 2, H = 4, d = 128;
    int64_t lens[] = {5000, 32768};
    vq_synth syn = {.n_heads_kv = H, .n_heads_q = 8, .head_dim = d, .seed = 1};
    int chunk = 512;
    float *k = malloc(sizeof(float) * chunk * H * d), *v = malloc(sizeof(float) * chunk * H * d);
    for (size_t ci = 0; ci < sizeof cases / sizeof cases[0]; ci++)
        for (int li = 0; li < 2; li++) {
            vq_cache_config cfg = {.n_layers = L, .n_heads_q = 8, .n_heads_kv = H, .head_dim = d, .kv_spec = cases[ci].spec};
            vq_cache *c;
            if (vq_cache_create(&cfg, &c)) {
                CHECK(0, "%s: %s", cases[ci].spec, vq_last_error());
                continue;
            }
            for (int64_t t = 0; t < lens[li]; t += chunk) {
                int n = (int)(lens[li] - t < chunk ? lens[li] - t : chunk);
                vq_synth_kv(&syn, t, n, k, v);
                for (int l = 0; l < L; l++) vq_cache_append(c, l, n, k, v, VQ_F32, NULL);
            }
            double want = analytic_bytes(L, H, d, lens[li], cases[ci].bk, cases[ci].bv, cases[ci].residual, cases[ci].group);
            double got = (double)vq_cache_bytes(c);
            CHECK(fabs(got / want - 1) < 0.02, "%s, %lld tokens: %.0f bytes allocated, analytic %.0f (%.2f%%)", cases[ci].spec,
                  (long long)lens[li], got, want, (got / want - 1) * 100);
            double fp16 = (double)L * H * lens[li] * d * 4.0;
            CHECK((double)vq_cache_bytes_fp16_equiv(c) == fp16, "fp16 equivalent %zu, want %.0f", vq_cache_bytes_fp16_equiv(c), fp16);
            /* reset keeps the blocks for reuse; refilling allocates nothing new */
            size_t before = vq_cache_bytes(c);
            vq_cache_reset(c);
            CHECK(vq_cache_tokens(c, 0) == 0 && vq_cache_tokens(c, 1) == 0, "reset left tokens");
            for (int64_t t = 0; t < lens[li]; t += chunk) {
                int n = (int)(lens[li] - t < chunk ? lens[li] - t : chunk);
                vq_synth_kv(&syn, t, n, k, v);
                for (int l = 0; l < L; l++) vq_cache_append(c, l, n, k, v, VQ_F32, NULL);
            }
            CHECK(vq_cache_bytes(c) == before, "%s: refill after reset allocated more (%zu vs %zu)", cases[ci].spec, vq_cache_bytes(c), before);
            vq_cache_free(c);
        }
    free(k);
    free(v);

    /* Input dtypes: f16 and bf16 rows give the same cache as the same values in f32. */
    {
        int n = 300;
        float *kf = malloc(sizeof(float) * n * H * d), *vf = malloc(sizeof(float) * n * H * d);
        uint16_t *kh = malloc(2 * (size_t)n * H * d), *vh = malloc(2 * (size_t)n * H * d);
        vq_synth_kv(&syn, 0, n, kf, vf);
        vq_dtype dts[] = {VQ_F16, VQ_BF16};
        for (int di = 0; di < 2; di++) {
            if (dts[di] == VQ_F16) {
                vq_f32_to_f16_array(kf, kh, (size_t)n * H * d);
                vq_f32_to_f16_array(vf, vh, (size_t)n * H * d);
            } else {
                vq_f32_to_bf16_array(kf, kh, (size_t)n * H * d);
                vq_f32_to_bf16_array(vf, vh, (size_t)n * H * d);
            }
            float *k2 = malloc(sizeof(float) * n * H * d), *v2 = malloc(sizeof(float) * n * H * d);
            for (size_t i = 0; i < (size_t)n * H * d; i++) {
                k2[i] = dts[di] == VQ_F16 ? vq_f16_to_f32(kh[i]) : vq_bf16_to_f32(kh[i]);
                v2[i] = dts[di] == VQ_F16 ? vq_f16_to_f32(vh[i]) : vq_bf16_to_f32(vh[i]);
            }
            vq_cache_config cfg = {.n_layers = 1, .n_heads_q = 8, .n_heads_kv = H, .head_dim = d, .kv_spec = "kivi:bits=4"};
            vq_cache *a, *b;
            vq_cache_create(&cfg, &a);
            vq_cache_create(&cfg, &b);
            CHECK(vq_cache_append(a, 0, n, kh, vh, dts[di], NULL) == VQ_OK, "%s", vq_last_error());
            CHECK(vq_cache_append(b, 0, n, k2, v2, VQ_F32, NULL) == VQ_OK, "%s", vq_last_error());
            float *da = malloc(sizeof(float) * n * d * 2), *db = malloc(sizeof(float) * n * d * 2);
            int same = 1;
            for (int h = 0; h < H; h++) {
                vq_cache_decode(a, 0, h, da, da + n * d, NULL);
                vq_cache_decode(b, 0, h, db, db + n * d, NULL);
                same &= memcmp(da, db, sizeof(float) * n * d * 2) == 0;
            }
            CHECK(same, "dtype %d input differs from the same values in f32", (int)dts[di]);
            free(da); free(db); free(k2); free(v2);
            vq_cache_free(a);
            vq_cache_free(b);
        }
        free(kf); free(vf); free(kh); free(vh);
    }

    /* Truncate: to the window, to a group boundary, refused mid-group. */
    {
        int n = 700;
        float *kk = malloc(sizeof(float) * n * H * d), *vv = malloc(sizeof(float) * n * H * d);
        vq_synth_kv(&syn, 0, n, kk, vv);
        vq_cache_config cfg = {.n_layers = 1, .n_heads_q = 8, .n_heads_kv = H, .head_dim = d, .kv_spec = "kivi:bits=2"};
        vq_cache *c;
        vq_cache_create(&cfg, &c);
        vq_cache_append(c, 0, n, kk, vv, VQ_F32, NULL);
        /* n_quant = ((700 - 128) / 32) * 32 = 544; window 156 */
        CHECK(vq_cache_truncate(c, 650) == VQ_OK, "truncate inside the window: %s", vq_last_error());
        CHECK(vq_cache_tokens(c, 0) == 650, "tokens after truncate %lld", (long long)vq_cache_tokens(c, 0));
        CHECK(vq_cache_truncate(c, 300) == VQ_ERR_ARG, "mid-group truncate accepted");
        CHECK(strstr(vq_last_error(), "multiple of 32") != NULL, "message: %s", vq_last_error());
        CHECK(vq_cache_truncate(c, 320) == VQ_OK, "group-aligned truncate: %s", vq_last_error());
        CHECK(vq_cache_truncate(c, 1000) == VQ_ERR_ARG, "truncate past the end accepted");
        /* appending after a truncate continues from the kept last position */
        CHECK(vq_cache_append(c, 0, 10, kk, vv, VQ_F32, NULL) == VQ_OK, "%s", vq_last_error());
        int32_t *pos = malloc(sizeof(int32_t) * 330);
        vq_cache_decode(c, 0, 0, NULL, NULL, pos);
        CHECK(pos[319] == 319 && pos[320] == 320 && pos[329] == 329, "positions after truncate+append: %d %d %d", pos[319], pos[320], pos[329]);
        free(pos);
        /* positions must increase */
        int32_t bad[2] = {500, 400};
        CHECK(vq_cache_append(c, 0, 2, kk, vv, VQ_F32, bad) == VQ_ERR_ARG, "decreasing positions accepted");
        CHECK(vq_cache_tokens(c, 0) == 330, "a failed append changed the cache");
        /* non-finite input is refused and changes nothing */
        kk[5] = INFINITY;
        CHECK(vq_cache_append(c, 0, 3, kk, vv, VQ_F32, NULL) == VQ_ERR_ARG, "inf accepted");
        CHECK(strstr(vq_last_error(), "not finite") != NULL, "message: %s", vq_last_error());
        kk[5] = 70000.0f;
        CHECK(vq_cache_append(c, 0, 3, kk, vv, VQ_F32, NULL) == VQ_ERR_ARG, "70000 (fp16 overflow) accepted");
        CHECK(vq_cache_tokens(c, 0) == 330, "a failed append changed the cache");
        vq_cache_free(c);
        /* capacity */
        cfg.capacity = 100;
        vq_cache_create(&cfg, &c);
        kk[5] = 0;
        CHECK(vq_cache_append(c, 0, 100, kk, vv, VQ_F32, NULL) == VQ_OK, "%s", vq_last_error());
        CHECK(vq_cache_append(c, 0, 1, kk, vv, VQ_F32, NULL) == VQ_ERR_ARG, "append past capacity accepted");
        CHECK(strstr(vq_last_error(), "capacity 100") != NULL, "message: %s", vq_last_error());
        vq_cache_free(c);
        free(kk);
        free(vv);
    }

    /* The spec as parsed, with defaults. */
    {
        vq_cache_config cfg = {.n_layers = 1, .n_heads_q = 8, .n_heads_kv = H, .head_dim = d,
                               .kv_spec = "k=kivi:bits=4;v=kivi:bits=2,group=64"};
        vq_cache *c;
        vq_cache_create(&cfg, &c);
        CHECK(strcmp(vq_cache_spec(c), "k=kivi:bits=4,group=32,residual=128;v=kivi:bits=2,group=64,residual=128") == 0,
              "spec '%s'", vq_cache_spec(c));
        CHECK(fabs(vq_cache_bits_per_elem(c) - 0.5 * (5.0 + 2.5)) < 1e-9, "bits %g", vq_cache_bits_per_elem(c));
        vq_cache_free(c);
    }
    return check_done();
}
