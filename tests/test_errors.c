/* Bad configurations and arguments: a clear error that names the value and
 * the allowed range, never a crash. */
#include "check.h"
#include "veloxquant.h"

#include <math.h>
#include <string.h>

static void expect_create_error(const char *spec, int hq, int hkv, int d, const char *needle1, const char *needle2) {
    vq_cache_config cfg = {.n_layers = 2, .n_heads_q = hq, .n_heads_kv = hkv, .head_dim = d, .kv_spec = spec};
    vq_cache *c = (vq_cache *)1;
    vq_status st = vq_cache_create(&cfg, &c);
    CHECK(st != VQ_OK, "spec '%s' (hq %d hkv %d d %d) was accepted", spec, hq, hkv, d);
    CHECK(c == NULL, "failed create left a handle");
    const char *m = vq_last_error();
    CHECK(strstr(m, needle1) != NULL, "spec '%s': message '%s' lacks '%s'", spec, m, needle1);
    if (needle2) CHECK(strstr(m, needle2) != NULL, "spec '%s': message '%s' lacks '%s'", spec, m, needle2);
}

int main(void) {
    expect_create_error("kivi:bits=5", 8, 2, 128, "bits=5", "2, 3, 4, 8");
    expect_create_error("kivi:group=0", 8, 2, 128, "group=0", "32, 64, 128");
    expect_create_error("kivi:group=48", 8, 2, 128, "group=48", "32, 64, 128");
    expect_create_error("kivi:bits=two", 8, 2, 128, "'two'", "integer");
    expect_create_error("kivi:residual=-1", 8, 2, 128, "residual=-1", "0..4096");
    expect_create_error("kivi:colour=blue", 8, 2, 128, "unknown option 'colour'", "bits, group, residual");
    expect_create_error("kivi:bits", 8, 2, 128, "'bits'", "key=value");
    expect_create_error("kivi:", 8, 2, 128, "empty option list", NULL);
    expect_create_error("fp16:bits=4", 8, 2, 128, "takes no options", NULL);
    expect_create_error("zstd", 8, 2, 128, "unknown method 'zstd'", "fp16, kivi");
    expect_create_error("k=kivi:bits=4", 8, 2, 128, "k=METHOD;v=METHOD", NULL);
    expect_create_error("k=kivi;x=fp16", 8, 2, 128, "expected", NULL);
    expect_create_error("k=kivi;v=kivi;v=fp16", 8, 2, 128, "more than one", NULL);
    expect_create_error("kivi+snapkv:budget=0", 8, 2, 128, "budget=0", "1..2147483647");
    /* head dims the cache or method cannot take */
    expect_create_error("kivi", 8, 2, 100, "head_dim=100", "multiple of 8");
    expect_create_error("fp16", 8, 2, 0, "head_dim=0", "[8, 1024]");
    expect_create_error("fp16", 8, 2, 2048, "head_dim=2048", "[8, 1024]");
    expect_create_error("fp16", 6, 4, 64, "n_heads_q=6", "multiple of n_heads_kv=4");
    expect_create_error("fp16", 8, 0, 64, "n_heads_kv=0", "[1, 1024]");
    {
        vq_cache_config cfg = {.n_layers = 0, .n_heads_q = 8, .n_heads_kv = 2, .head_dim = 64};
        vq_cache *c;
        CHECK(vq_cache_create(&cfg, &c) == VQ_ERR_ARG && strstr(vq_last_error(), "n_layers=0"), "%s", vq_last_error());
        cfg.n_layers = 1;
        cfg.block_tokens = 48;
        cfg.kv_spec = "kivi:group=32";
        CHECK(vq_cache_create(&cfg, &c) == VQ_ERR_ARG && strstr(vq_last_error(), "block_tokens=48"), "%s", vq_last_error());
        cfg.block_tokens = 0;
        cfg.capacity = -3;
        CHECK(vq_cache_create(&cfg, &c) == VQ_ERR_ARG && strstr(vq_last_error(), "capacity=-3"), "%s", vq_last_error());
    }
    /* bad calls on a good cache */
    {
        vq_cache_config cfg = {.n_layers = 2, .n_heads_q = 8, .n_heads_kv = 2, .head_dim = 64, .kv_spec = "kivi"};
        vq_cache *c;
        CHECK(vq_cache_create(&cfg, &c) == VQ_OK, "%s", vq_last_error());
        float k[2 * 64] = {0}, v[2 * 64] = {0}, q[8 * 64] = {0}, out[8 * 64];
        CHECK(vq_cache_append(c, 2, 1, k, v, VQ_F32, NULL) == VQ_ERR_ARG && strstr(vq_last_error(), "layer 2"), "%s", vq_last_error());
        CHECK(vq_cache_append(c, -1, 1, k, v, VQ_F32, NULL) == VQ_ERR_ARG, "layer -1 accepted");
        CHECK(vq_cache_append(c, 0, -4, k, v, VQ_F32, NULL) == VQ_ERR_ARG, "negative count accepted");
        CHECK(vq_cache_append(c, 0, 1, NULL, v, VQ_F32, NULL) == VQ_ERR_ARG, "NULL k accepted");
        CHECK(vq_cache_append(c, 0, 1, k, v, (vq_dtype)7, NULL) == VQ_ERR_ARG && strstr(vq_last_error(), "dtype 7"), "%s", vq_last_error());
        k[3] = NAN;
        CHECK(vq_cache_append(c, 0, 1, k, v, VQ_F32, NULL) == VQ_ERR_ARG && strstr(vq_last_error(), "dim 3"), "%s", vq_last_error());
        k[3] = 0;
        CHECK(vq_cache_append(c, 0, 1, k, v, VQ_F32, NULL) == VQ_OK, "%s", vq_last_error());
        vq_attend_args a = {.n_q = 1, .q = q, .out = out, .out_dtype = VQ_F32};
        CHECK(vq_attend(c, 0, &a) == VQ_OK, "%s", vq_last_error());
        a.n_q = 0;
        CHECK(vq_attend(c, 0, &a) == VQ_ERR_ARG && strstr(vq_last_error(), "n_q=0"), "%s", vq_last_error());
        a.n_q = 1;
        a.out_dtype = VQ_BF16;
        CHECK(vq_attend(c, 0, &a) == VQ_ERR_ARG && strstr(vq_last_error(), "out_dtype"), "%s", vq_last_error());
        a.out_dtype = VQ_F32;
        a.scale = -1;
        CHECK(vq_attend(c, 0, &a) == VQ_ERR_ARG && strstr(vq_last_error(), "scale -1"), "%s", vq_last_error());
        a.scale = NAN;
        CHECK(vq_attend(c, 0, &a) == VQ_ERR_ARG, "NaN scale accepted");
        a.scale = 0;
        CHECK(vq_attend(c, 5, &a) == VQ_ERR_ARG && strstr(vq_last_error(), "layer 5"), "%s", vq_last_error());
        CHECK(vq_cache_decode(c, 0, 9, NULL, NULL, NULL) == VQ_ERR_ARG && strstr(vq_last_error(), "kv_head 9"), "%s", vq_last_error());
        vq_cache_free(c);
    }
    {
        vq_pool *p;
        CHECK(vq_pool_create(0, &p) == VQ_ERR_ARG && strstr(vq_last_error(), "[1, 256]"), "%s", vq_last_error());
        CHECK(vq_cpu_set_level((vq_cpu_level)9) == VQ_ERR_ARG, "cpu level 9 accepted");
    }
    return check_done();
}
