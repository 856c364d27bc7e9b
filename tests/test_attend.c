/* Fused attention against "decode the cache, then fp64 attention", over
 * methods, head dims, GQA ratios, sequence lengths, prefill chunks with
 * causal masks, fp16 output, every kernel level (and level avx512 with
 * AVX512_VNNI hidden), thread counts, and softmaxes sharp enough to
 * underflow most weights. */
#include "check.h"
#include "synth.h"
#include "veloxquant.h"
#include "vq_internal.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* Builds a cache of `seq` synthetic tokens (appended in uneven chunks; keys
 * times kscale), runs vq_attend for n_q query rows at the end of the
 * sequence and compares with the reference over the decoded cache. Returns
 * the relative error. qscale (NULL: none) scales q head h of every row by
 * qscale[h % 4]. */
static double run_qk(const char *spec, int hq, int hkv, int d, int seq, int n_q, vq_pool *pool, float *out_keep,
                     float kscale, const float *qscale) {
    vq_cache_config cfg = {.n_layers = 2, .n_heads_q = hq, .n_heads_kv = hkv, .head_dim = d, .kv_spec = spec};
    vq_cache *c;
    if (vq_cache_create(&cfg, &c)) {
        fprintf(stderr, "create %s: %s\n", spec, vq_last_error());
        return 1e9;
    }
    vq_synth syn = {.n_heads_kv = hkv, .n_heads_q = hq, .head_dim = d, .seed = (uint64_t)(seq * 31 + d + hq)};
    float *k = malloc(sizeof(float) * (size_t)seq * hkv * d), *v = malloc(sizeof(float) * (size_t)seq * hkv * d);
    vq_synth_kv(&syn, 0, seq, k, v);
    for (size_t i = 0; i < (size_t)seq * hkv * d; i++) k[i] *= kscale;
    /* append in chunks of varying size into layer 1 (layer 0 stays empty) */
    int t = 0, step = 1;
    while (t < seq) {
        int n = seq - t < step ? seq - t : step;
        vq_status st = vq_cache_append(c, 1, n, k + (size_t)t * hkv * d, v + (size_t)t * hkv * d, VQ_F32, NULL);
        if (st) fprintf(stderr, "append: %s\n", vq_last_error());
        t += n;
        step = step * 3 + 1;
    }
    float *q = malloc(sizeof(float) * (size_t)n_q * hq * d);
    int32_t *qpos = malloc(sizeof(int32_t) * (size_t)n_q);
    for (int i = 0; i < n_q; i++) {
        vq_synth_q(&syn, i, q + (size_t)i * hq * d);
        for (int h = 0; qscale && h < hq; h++)
            for (int j = 0; j < d; j++) q[((size_t)i * hq + h) * d + j] *= qscale[h % 4];
        qpos[i] = seq - n_q + i; /* the last n_q tokens: a prefill chunk's causal pattern */
    }
    float *out = malloc(sizeof(float) * (size_t)n_q * hq * d);
    for (size_t i = 0; i < (size_t)n_q * hq * d; i++) out[i] = NAN; /* poison */
    vq_attend_args a = {.n_q = n_q, .q = q, .q_pos = n_q > 1 ? qpos : NULL, .out = out, .out_dtype = VQ_F32, .pool = pool};
    vq_status st = vq_attend(c, 1, &a);
    if (st) fprintf(stderr, "attend: %s\n", vq_last_error());
    /* decode and reference */
    float *dk = malloc(sizeof(float) * (size_t)seq * hkv * d), *dv = malloc(sizeof(float) * (size_t)seq * hkv * d);
    int32_t *pos = malloc(sizeof(int32_t) * (size_t)seq);
    for (int h = 0; h < hkv; h++)
        vq_cache_decode(c, 1, h, dk + (size_t)h * seq * d, dv + (size_t)h * seq * d, pos);
    double *ref = malloc(sizeof(double) * (size_t)n_q * hq * d);
    vq_attend_reference(hq, hkv, d, n_q, q, n_q > 1 ? qpos : NULL, seq, dk, dv, pos, 1.0 / sqrt((double)d), ref);
    double err = rel_l2(out, ref, (size_t)n_q * hq * d);
    if (out_keep) memcpy(out_keep, out, sizeof(float) * (size_t)n_q * hq * d);
    free(k); free(v); free(q); free(qpos); free(out); free(dk); free(dv); free(pos); free(ref);
    vq_cache_free(c);
    return err;
}

static double run_scaled(const char *spec, int hq, int hkv, int d, int seq, int n_q, vq_pool *pool,
                         float *out_keep, float kscale) {
    return run_qk(spec, hq, hkv, d, seq, n_q, pool, out_keep, kscale, NULL);
}

static double run_case(const char *spec, int hq, int hkv, int d, int seq, int n_q, vq_pool *pool,
                       float *out_keep) {
    return run_scaled(spec, hq, hkv, d, seq, n_q, pool, out_keep, 1.0f);
}

int main(void) {
    const char *specs[] = {"fp16", "kivi:bits=2", "kivi:bits=3,group=64", "kivi:bits=4,group=128,residual=32",
                           "kivi:bits=8,residual=0", "k=kivi:bits=4;v=kivi:bits=2,group=64", "k=fp16;v=kivi:bits=2",
                           /* rotation methods: prepared queries and values summed in the rotated domain */
                           "tq-mse:bits=2,residual=16", "tq-mse:bits=3.5", "k=qjl:outliers=2;v=tq-mse:bits=3",
                           "tq-prod:bits=3,residual=8", "rvq:bits=1", "k=polar;v=rvq:bits=2,residual=40"};
    int n_specs = (int)(sizeof specs / sizeof specs[0]);
    vq_pool *pool;
    vq_pool_create(2, &pool);
    vq_cpu_level best = vq_cpu_detect();
    /* every level, then (on a CPU with AVX512_VNNI) level avx512 once more
     * with VNNI hidden: the KIVI kernels of an AVX-512 CPU without it */
    vq_cpu_set_level(best);
    const bool vnni = vq_cpu_has_avx512_vnni();
    for (int pass = VQ_CPU_SCALAR; pass <= (int)best + (vnni ? 1 : 0); pass++) {
        const int lvl = pass > (int)best ? (int)best : pass;
        vq_cpu_set_level((vq_cpu_level)lvl);
        vq_cpu_hide_vnni(pass > (int)best);
        const char *lname = pass > (int)best ? "avx512 without VNNI" : vq_cpu_level_name((vq_cpu_level)lvl);
        /* sequence lengths around group and block edges */
        int seqs[] = {1, 31, 32, 33, 129, 5000};
        for (int si = 0; si < 6; si++)
            for (int s = 0; s < n_specs; s++) {
                double e = run_case(specs[s], 8, 2, 128, seqs[si], 1, pool, NULL);
                CHECK(e < 1e-4, "[%s] %s seq %d: rel err %.3g", lname, specs[s], seqs[si], e);
            }
        /* head dims and GQA ratios (7: a kv head's rows go 4, 2 and 1 at a
         * time through the KIVI kernels; at level avx512 the 4-row groups of
         * 2, 4 and 8 bits run kivi_avx512.c where the plane strides allow) */
        int dims[] = {64, 128, 256};
        int ratios[] = {1, 2, 4, 7, 8};
        for (int di = 0; di < 3; di++)
            for (int ri = 0; ri < 5; ri++)
                for (int s = 0; s < 5; s++) {
                    int hkv = 2, hq = hkv * ratios[ri];
                    double e = run_case(specs[s], hq, hkv, dims[di], 700, 1, pool, NULL);
                    CHECK(e < 1e-4, "[%s] %s d %d gqa %d: rel err %.3g", lname, specs[s],
                          dims[di], ratios[ri], e);
                }
        /* head dim 96: plane strides that are not whole 16-byte runs (KIVI
         * 2-bit: 24 bytes; the AVX2 values take runs of 8), 3-bit codes
         * whose 1-bit planes are 12 bytes (a run of 8 channels takes its
         * high bits from both halves; tq-prod 4-bit has 3-bit codes), and
         * 1-bit codes of 12 bytes (a run of 4 at the end; tq-prod 2-bit has
         * 1-bit codes) */
        const char *specs96[] = {"kivi:bits=2",   "kivi:bits=3",   "kivi:bits=4",
                                 "kivi:bits=8,residual=0",         "tq-mse:bits=3",
                                 "tq-prod:bits=4,residual=8",      "tq-mse:bits=1",
                                 "tq-prod:bits=2,residual=8",      "tq-mse:bits=2.5",
                                 "tq-mse:bits=3.5"};
        int ratios96[] = {1, 4, 7};
        for (int ri = 0; ri < 3; ri++)
            for (int s = 0; s < 10; s++) {
                double e = run_case(specs96[s], 2 * ratios96[ri], 2, 96, 700, 1, pool, NULL);
                CHECK(e < 1e-4, "[%s] %s d 96 gqa %d: rel err %.3g", lname, specs96[s],
                      ratios96[ri], e);
            }
        /* head dim 80: value groups of 32 leave a last group of 16 (of
         * 64: one of 16; of 128: one group of 80); 2-bit planes of 20
         * bytes (keys end in a step of 4, values take runs of 4 where a
         * run of 8 would cross a group); 1-bit codes of 10 bytes (a run of
         * 2 at the end; tq-prod 2-bit has 1-bit codes); tq-mse 2.5- and 3.5-bit
         * parts of 40 channels (2-bit slots of 10 bytes, 1-bit slots of
         * 5, 4-bit slots of 20). Head dim 64, 3-bit:
         * 1-bit planes of 8 bytes (the values' runs of 8 channels) */
        const char *specs80[] = {"kivi:bits=2",          "kivi:bits=2,group=64",     "kivi:bits=3",
                                 "kivi:bits=4,group=128", "kivi:bits=8,residual=0",   "tq-mse:bits=1",
                                 "tq-prod:bits=2,residual=8", "tq-mse:bits=2.5",          "tq-mse:bits=3.5"};
        for (int ri = 0; ri < 3; ri++) {
            for (int s = 0; s < 9; s++) {
                double e = run_case(specs80[s], 2 * ratios96[ri], 2, 80, 700, 1, pool, NULL);
                CHECK(e < 1e-4, "[%s] %s d 80 gqa %d: rel err %.3g", lname, specs80[s],
                      ratios96[ri], e);
            }
            double e = run_case("kivi:bits=3", 2 * ratios96[ri], 2, 64, 700, 1, pool, NULL);
            CHECK(e < 1e-4, "[%s] kivi:bits=3 d 64 gqa %d: rel err %.3g", lname,
                  ratios96[ri], e);
        }
        /* KIVI at head dims 48 and 112: 2-bit planes of 12 and 28 bytes,
         * 3-bit 1-bit planes of 6 and 14 bytes (runs of 8 channels that
         * take their high bits from both ends of the plane, 6 and 2 bytes
         * from the end); tq-mse 2.5-bit: 2- and 3-bit parts of 24 and 56
         * channels (2-bit slots of 6 and 14 bytes, 1-bit slots of 3 and 7)
         * and 3.5-bit: 4-bit parts whose slots end in a run of 4 */
        const char *specs_k[] = {"kivi:bits=2", "kivi:bits=3", "kivi:bits=4", "tq-mse:bits=2.5", "tq-mse:bits=3.5"};
        int kdims[] = {48, 112}, kratios[] = {1, 7};
        for (int di = 0; di < 2; di++)
            for (int ri = 0; ri < 2; ri++)
                for (int s = 0; s < 5; s++) {
                    double e = run_case(specs_k[s], 2 * kratios[ri], 2, kdims[di], 700, 1, pool, NULL);
                    CHECK(e < 1e-4, "[%s] %s d %d gqa %d: rel err %.3g", lname,
                          specs_k[s], kdims[di], kratios[ri], e);
                }
        /* tq-prod's sign sketches (m = d signs a token) at level avx512:
         * scored 32 tokens a step from nibble tables, summed in runs of 64
         * and 16 signs (d = 48: 3 runs of 16, 112: one of 64 and three of
         * 16, 256: two 16-byte chunks a token); 1 row and 4 + 3 x 1 */
        const char *specs_p[] = {"tq-prod:bits=2,residual=8", "tq-prod:bits=3,residual=8", "tq-prod:bits=4,residual=8"};
        int pq_dims[] = {48, 64, 112, 256};
        for (int di = 0; di < 4; di++)
            for (int ri = 0; ri < 2; ri++)
                for (int s = 0; s < 3; s++) {
                    double e = run_case(specs_p[s], 2 * kratios[ri], 2, pq_dims[di], 700, 1, pool, NULL);
                    CHECK(e < 1e-4, "[%s] %s d %d gqa %d: rel err %.3g", lname,
                          specs_p[s], pq_dims[di], kratios[ri], e);
                }
        /* PolarQuant 4/2/2/2 at head dims that are not whole groups of 8
         * coordinate blocks of 16 (the AVX2 kernels' lanes): 3, 4, 5, 6 and
         * 9 blocks; an odd count starts level 4 half-way into a byte */
        int pdims[] = {48, 64, 80, 96, 144};
        for (int di = 0; di < 5; di++)
            for (int ri = 0; ri < 3; ri++) {
                double e = run_case("polar", 2 * ratios96[ri], 2, pdims[di], 700, 1, pool, NULL);
                CHECK(e < 1e-4, "[%s] polar d %d gqa %d: rel err %.3g", lname, pdims[di],
                      ratios96[ri], e);
            }
        /* d = 48 and 64 take four tokens a register at level avx512, d = 80
         * three: a last block of 1, 2 or 3 tokens (641-643) leaves 1, 2 or 3
         * in its last four or three */
        for (int di = 0; di < 3; di++)
            for (int extra = 1; extra <= 3; extra++) {
                double e = run_case("polar:residual=0", 8, 2, pdims[di], 640 + extra, 1, pool, NULL);
                CHECK(e < 1e-4, "[%s] polar d %d, %d tokens: rel err %.3g", lname,
                      pdims[di], 640 + extra, e);
            }
        /* head dim 48: 2- and 3-bit parts of 48 channels alone (2-bit
         * plane slots of 12 bytes: runs of 8, then of 4) */
        const char *specs48[] = {"tq-mse:bits=2", "tq-mse:bits=3", "tq-mse:bits=2.5"};
        for (int s = 0; s < 3; s++) {
            double e = run_case(specs48[s], 8, 2, 48, 700, 1, pool, NULL);
            CHECK(e < 1e-4, "[%s] %s d 48: rel err %.3g", lname, specs48[s], e);
        }
        /* keys x 60: most weights underflow to 0 or to subnormals (a value
         * chunk whose weights all did once gave NaN through an inf scale) */
        for (int s = 0; s < n_specs; s++) {
            double e = run_scaled(specs[s], 8, 2, 128, 1500, 1, pool, NULL, 60.0f);
            CHECK(e < 1e-4, "[%s] %s keys x 60: rel err %.3g", lname, specs[s], e);
        }
        /* query heads of zeros and of 1e-30 times q next to normal ones in
         * one GQA group (KIVI's VNNI keys leave such groups to the float
         * kernels: no power of two scales them to integers), and a group
         * of normal heads */
        const char *qspecs[] = {"kivi:bits=2", "kivi:bits=3", "kivi:bits=4", "kivi:bits=8"};
        const float qscale[4] = {1.0f, 0.0f, 1e-30f, 2.0f};
        for (int s = 0; s < 4; s++)
            for (int dq = 64; dq <= 128; dq += 64) {
                double e = run_qk(qspecs[s], 8, 2, dq, 700, 1, pool, NULL, 1.0f, qscale);
                CHECK(e < 1e-4, "[%s] %s d %d, zero and tiny q heads: rel err %.3g", lname, qspecs[s], dq, e);
            }
        /* prefill chunks: many query rows with a causal mask (row mode) and
         * a few rows (split mode) */
        int nqs[] = {3, 40};
        for (int ni = 0; ni < 2; ni++)
            for (int s = 0; s < n_specs; s++) {
                double e = run_case(specs[s], 8, 2, 64, 1000, nqs[ni], pool, NULL);
                CHECK(e < 1e-4, "[%s] %s prefill n_q %d: rel err %.3g", lname, specs[s],
                      nqs[ni], e);
            }
    }
    vq_cpu_hide_vnni(false);
    vq_cpu_set_level(VQ_CPU_AUTO);

    /* bit-identical results for 1, 2 and 4 threads */
    for (int s = 0; s < n_specs; s++) {
        int hq = 8, d = 128, seq = 3000;
        float *o1 = malloc(sizeof(float) * hq * d), *ox = malloc(sizeof(float) * hq * d);
        run_case(specs[s], hq, 2, d, seq, 1, NULL, o1);
        int threads[] = {2, 4};
        for (int ti = 0; ti < 2; ti++) {
            vq_pool *p;
            vq_pool_create(threads[ti], &p);
            run_case(specs[s], hq, 2, d, seq, 1, p, ox);
            CHECK(memcmp(o1, ox, sizeof(float) * hq * d) == 0, "%s: %d threads differ from 1 thread", specs[s], threads[ti]);
            vq_pool_free(p);
        }
        free(o1);
        free(ox);
    }

    /* fp16 output equals the fp32 output rounded */
    {
        vq_cache_config cfg = {.n_layers = 1, .n_heads_q = 4, .n_heads_kv = 1, .head_dim = 64, .kv_spec = "kivi:bits=4"};
        vq_cache *c;
        vq_cache_create(&cfg, &c);
        vq_synth syn = {.n_heads_kv = 1, .n_heads_q = 4, .head_dim = 64, .seed = 5};
        float k[300 * 64], v[300 * 64], q[4 * 64], o32[4 * 64];
        uint16_t o16[4 * 64];
        vq_synth_kv(&syn, 0, 300, k, v);
        vq_synth_q(&syn, 0, q);
        vq_cache_append(c, 0, 300, k, v, VQ_F32, NULL);
        vq_attend_args a = {.n_q = 1, .q = q, .out = o32, .out_dtype = VQ_F32};
        vq_attend(c, 0, &a);
        a.out = o16;
        a.out_dtype = VQ_F16;
        vq_attend(c, 0, &a);
        int same = 1;
        for (int i = 0; i < 4 * 64; i++) same &= o16[i] == vq_f32_to_f16(o32[i]);
        CHECK(same, "fp16 output is not the rounded fp32 output");
        /* a query row that sees no key gets zeros */
        int32_t qp = -5;
        a.q_pos = &qp;
        a.out = o32;
        a.out_dtype = VQ_F32;
        vq_attend(c, 0, &a);
        int zeros = 1;
        for (int i = 0; i < 4 * 64; i++) zeros &= o32[i] == 0.0f;
        CHECK(zeros, "a row with no visible key is not zero");
        vq_cache_free(c);
    }
    vq_pool_free(pool);
    return check_done();
}
