/* KIVI: encoder output compared byte for byte with a plain implementation
 * written from the formulas in METHODS.md; decoding equals code*scale+zero;
 * round half to even; ragged value groups; the cache's decode path. */
#include "check.h"
#include "methods/pack.h"
#include "synth.h"
#include "vq_internal.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* Writes code bits one at a time at the position the layout defines. */
static void ref_pack(const uint8_t *codes, int d, int bits, uint8_t *out) {
    size_t nbytes = (size_t)d * bits / 8;
    memset(out, 0, nbytes);
    for (int c = 0; c < d; c++) {
        for (int i = 0; i < bits; i++) {
            int bit = (codes[c] >> i) & 1;
            size_t byte;
            int shift;
            if (bits == 3 && i == 2) { /* high bit: 1-bit planes after the 2-bit planes */
                int stride = d / 8;
                byte = (size_t)d / 4 + (size_t)(c % stride);
                shift = c / stride;
            } else {
                int b = bits == 3 ? 2 : bits, stride = d * b / 8;
                byte = (size_t)(c % stride);
                shift = b * (c / stride) + i;
            }
            out[byte] |= (uint8_t)(bit << shift);
        }
    }
}

static float f16r(float x) { return vq_f16_to_f32(vq_f32_to_f16(x)); }

/* The formulas: zero = min, scale = fp16((max - min) / (2^b - 1)), code =
 * rint((x - zero) / scale) clamped. */
static void ref_group(const float *x, int n, size_t stride, int bits, uint8_t *codes, size_t cstride,
                      uint16_t *s_h, uint16_t *z_h) {
    float mn = INFINITY, mx = -INFINITY;
    for (int i = 0; i < n; i++) {
        mn = fminf(mn, x[i * stride]);
        mx = fmaxf(mx, x[i * stride]);
    }
    int maxq = (1 << bits) - 1;
    *z_h = vq_f32_to_f16(mn);
    *s_h = vq_f32_to_f16((mx - mn) / (float)maxq);
    float s = vq_f16_to_f32(*s_h), z = vq_f16_to_f32(*z_h);
    for (int i = 0; i < n; i++) {
        double c = s > 0 ? nearbyint(((double)x[i * stride] - z) / s) : 0; /* default mode: ties to even */
        /* the library divides in fp32; redo exactly that division */
        c = s > 0 ? rintf((x[i * stride] - z) / s) : 0;
        if (c < 0) c = 0;
        if (c > maxq) c = maxq;
        codes[i * cstride] = (uint8_t)c;
    }
}

/* Encodes n tokens (fp16-rounded) with the library and with the reference,
 * compares the block bytes and the decoded values. */
static void check_block(int bits, int group, int d, bool is_value, int n, uint64_t seed) {
    vq_mparams p;
    memset(&p, 0, sizeof p);
    char spec[64];
    snprintf(spec, sizeof spec, "kivi:bits=%d,group=%d", bits, group);
    vq_spec sp;
    if (vq_spec_parse(spec, d, &sp)) {
        CHECK(0, "parse %s: %s", spec, vq_last_error());
        return;
    }
    p = is_value ? sp.v : sp.k;
    int bt = 128;
    size_t bb = p.method->block_bytes(&p, bt);
    uint8_t *blk = calloc(1, bb), *ref = calloc(1, bb);
    float *x = malloc(sizeof(float) * (size_t)n * d);
    vq_rng r;
    vq_rng_seed(&r, seed);
    for (int i = 0; i < n * d; i++) x[i] = f16r((float)(vq_rng_normal(&r) * (1 + (i % d == 3) * 10)));
    if (n > 1) x[d + 1] = x[1]; /* a tie of min and max in some groups is fine; also constant groups: */
    for (int t = 0; t < n; t++) x[(size_t)t * d + 7] = 0.75f; /* channel 7 constant over tokens */
    p.method->encode(&p, x, (size_t)d, n, blk, bt, 0);
    /* reference */
    size_t cb = (size_t)d * bits / 8;
    uint8_t *codes = malloc((size_t)n * d);
    uint16_t *meta = (uint16_t *)(ref + (size_t)bt * cb);
    float *want = malloc(sizeof(float) * (size_t)n * d);
    float *step = malloc(sizeof(float) * (size_t)n * d); /* the group's scale, per element */
    if (!is_value) {
        for (int g = 0; g < n / group; g++)
            for (int c = 0; c < d; c++) {
                uint16_t *s = meta + (size_t)g * 2 * d + c, *z = meta + (size_t)g * 2 * d + d + c;
                ref_group(x + (size_t)g * group * d + c, group, (size_t)d, bits, codes + (size_t)g * group * d + c, (size_t)d, s, z);
                for (int t = 0; t < group; t++) {
                    size_t i = ((size_t)g * group + t) * d + c;
                    want[i] = (float)codes[i] * vq_f16_to_f32(*s) + vq_f16_to_f32(*z);
                    step[i] = vq_f16_to_f32(*s);
                }
            }
    } else {
        int ng = (d + group - 1) / group;
        for (int t = 0; t < n; t++)
            for (int g = 0; g < ng; g++) {
                int c0 = g * group, len = d - c0 < group ? d - c0 : group;
                uint16_t *m = meta + ((size_t)t * ng + g) * 2;
                ref_group(x + (size_t)t * d + c0, len, 1, bits, codes + (size_t)t * d + c0, 1, m, m + 1);
                for (int c = c0; c < c0 + len; c++) {
                    want[(size_t)t * d + c] = (float)codes[(size_t)t * d + c] * vq_f16_to_f32(m[0]) + vq_f16_to_f32(m[1]);
                    step[(size_t)t * d + c] = vq_f16_to_f32(m[0]);
                }
            }
    }
    for (int t = 0; t < n; t++) ref_pack(codes + (size_t)t * d, d, bits, ref + (size_t)t * cb);
    CHECK(memcmp(blk, ref, bb) == 0, "kivi bits %d group %d d %d %s: block bytes differ from the reference", bits,
          group, d, is_value ? "values" : "keys");
    float *dec = malloc(sizeof(float) * (size_t)n * d);
    p.method->decode(&p, blk, bt, 0, n, dec);
    CHECK(memcmp(dec, want, sizeof(float) * (size_t)n * d) == 0, "kivi bits %d group %d d %d %s: decode differs from code*scale+zero",
          bits, group, d, is_value ? "values" : "keys");
    /* The error is at most half a step, plus what rounding the scale to fp16
     * costs at the top code: (2^b - 1) * scale * 2^-11 <= 0.125 * scale. */
    double worst = 0;
    for (int i = 0; i < n * d; i++) worst = fmax(worst, fabs((double)dec[i] - x[i]) / (step[i] > 0 ? step[i] : 1));
    CHECK(worst <= 0.63, "kivi bits %d: max error %.3f steps", bits, worst);
    free(blk); free(ref); free(x); free(codes); free(want); free(dec); free(step);
}

int main(void) {
    int bitss[] = {2, 3, 4, 8}, groups[] = {32, 64, 128}, dims[] = {64, 96, 128, 256};
    for (int bi = 0; bi < 4; bi++)
        for (int gi = 0; gi < 3; gi++)
            for (int di = 0; di < 4; di++) {
                check_block(bitss[bi], groups[gi], dims[di], false, 128, (uint64_t)(bi * 100 + gi * 10 + di));
                check_block(bitss[bi], groups[gi], dims[di], true, 128, (uint64_t)(bi * 100 + gi * 10 + di + 7));
                check_block(bitss[bi], groups[gi], dims[di], true, 5, (uint64_t)(bi * 100 + gi * 10 + di + 9));
            }

    /* round half to even: values on exact half steps */
    {
        vq_spec sp;
        vq_spec_parse("kivi:bits=2,group=32", 32, &sp);
        float x[32];
        for (int i = 0; i < 32; i++) x[i] = 0;
        x[0] = 0.0f;  /* min */
        x[1] = 3.0f;  /* max: scale = 1, zero = 0 */
        x[2] = 0.5f;  /* -> 0 (even) */
        x[3] = 1.5f;  /* -> 2 */
        x[4] = 2.5f;  /* -> 2 */
        x[5] = 1.49f; /* -> 1 */
        uint8_t blk[64];
        memset(blk, 0, sizeof blk);
        sp.v.method->encode(&sp.v, x, 32, 1, blk, 1, 0);
        uint8_t codes[32];
        vq_unpack_codes(blk, 32, 2, codes);
        CHECK(codes[0] == 0 && codes[1] == 3 && codes[2] == 0 && codes[3] == 2 && codes[4] == 2 && codes[5] == 1,
              "round half to even: codes %d %d %d %d %d %d", codes[0], codes[1], codes[2], codes[3], codes[4], codes[5]);
    }

    /* pack/unpack round trip for every bits value */
    {
        vq_rng r;
        vq_rng_seed(&r, 3);
        int bl[] = {1, 2, 3, 4, 8};
        for (int bi = 0; bi < 5; bi++) {
            uint8_t codes[256], back[256], packed[256], refp[256];
            for (int c = 0; c < 256; c++) codes[c] = (uint8_t)(vq_rng_next(&r) & ((1u << bl[bi]) - 1));
            vq_pack_codes(codes, 256, bl[bi], packed);
            ref_pack(codes, 256, bl[bi], refp);
            vq_unpack_codes(packed, 256, bl[bi], back);
            CHECK(memcmp(codes, back, 256) == 0, "bits %d: unpack(pack(x)) != x", bl[bi]);
            CHECK(memcmp(packed, refp, (size_t)256 * bl[bi] / 8) == 0, "bits %d: pack differs from reference", bl[bi]);
        }
    }

    /* Through the cache: appended tokens decode to the reference values,
     * the fp16 window holds the newest tokens exactly, positions kept. */
    {
        int d = 128, H = 2, n = 1000;
        vq_cache_config cfg = {.n_layers = 1, .n_heads_q = 4, .n_heads_kv = H, .head_dim = d,
                               .kv_spec = "kivi:bits=4,group=32,residual=64"};
        vq_cache *c;
        CHECK(vq_cache_create(&cfg, &c) == VQ_OK, "%s", vq_last_error());
        vq_synth syn = {.n_heads_kv = H, .n_heads_q = 4, .head_dim = d, .seed = 9};
        float *k = malloc(sizeof(float) * n * H * d), *v = malloc(sizeof(float) * n * H * d);
        vq_synth_kv(&syn, 0, n, k, v);
        int32_t *pos = malloc(sizeof(int32_t) * n);
        for (int i = 0; i < n; i++) pos[i] = 10 + 3 * i;
        CHECK(vq_cache_append(c, 0, 300, k, v, VQ_F32, pos) == VQ_OK, "%s", vq_last_error());
        CHECK(vq_cache_append(c, 0, n - 300, k + 300 * H * d, v + 300 * H * d, VQ_F32, pos + 300) == VQ_OK, "%s", vq_last_error());
        CHECK(vq_cache_tokens(c, 0) == n, "tokens %lld", (long long)vq_cache_tokens(c, 0));
        float *dk = malloc(sizeof(float) * n * d), *dv = malloc(sizeof(float) * n * d);
        int32_t *dp = malloc(sizeof(int32_t) * n);
        vq_cache_decode(c, 0, 1, dk, dv, dp);
        /* quantized part: [0, n_quant) with n_quant = n - window; window in [64, 96) */
        int n_quant = ((n - 64) / 32) * 32;
        int pos_ok = 1, win_ok = 1;
        double kerr = 0, kref = 0;
        for (int i = 0; i < n; i++) {
            pos_ok &= dp[i] == pos[i];
            for (int j = 0; j < d; j++) {
                float kx = f16r(k[((size_t)i * H + 1) * d + j]), vx = f16r(v[((size_t)i * H + 1) * d + j]);
                if (i >= n_quant) win_ok &= dk[(size_t)i * d + j] == kx && dv[(size_t)i * d + j] == vx;
                else {
                    kerr += (dk[(size_t)i * d + j] - kx) * (dk[(size_t)i * d + j] - kx);
                    kref += kx * kx;
                }
            }
        }
        CHECK(pos_ok, "positions not kept");
        CHECK(win_ok, "the fp16 window does not hold the newest %d tokens exactly", n - n_quant);
        CHECK(sqrt(kerr / kref) < 0.1, "4-bit key relative error %g", sqrt(kerr / kref));
        /* the quantized part equals encoding the same rows directly */
        vq_spec sp;
        vq_spec_parse("kivi:bits=4,group=32,residual=64", d, &sp);
        float *rows = malloc(sizeof(float) * 128 * d);
        for (int i = 0; i < 128; i++)
            for (int j = 0; j < d; j++) rows[i * d + j] = f16r(k[((size_t)i * H + 1) * d + j]);
        uint8_t *blk = calloc(1, sp.k.method->block_bytes(&sp.k, 128));
        sp.k.method->encode(&sp.k, rows, (size_t)d, 128, blk, 128, 0);
        float *dec = malloc(sizeof(float) * 128 * d);
        sp.k.method->decode(&sp.k, blk, 128, 0, 128, dec);
        CHECK(memcmp(dec, dk, sizeof(float) * 128 * d) == 0, "cache keys differ from direct encoding");
        free(rows); free(blk); free(dec);
        free(k); free(v); free(pos); free(dk); free(dv); free(dp);
        vq_cache_free(c);
    }
    return check_done();
}
