/* The Q-Filters file: round trip, and a clear error for every kind of
 * corruption (truncation, trailing bytes, magic, version, dims, non-finite
 * or non-unit vectors, checksum). Corrupt files are made by editing the
 * bytes of a good file and, where the test is about a field rather than the
 * checksum, recomputing the checksum with this file's own CRC-32 so that the
 * loader's field check, not its checksum check, must catch it. */
#include "check.h"
#include "evict/qfilters_file.h"

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <dirent.h>
#include <unistd.h>

static char dir[64], good[128], bad[128];

/* Table-driven CRC-32 (IEEE), written independently of the library's. */
static uint32_t crc32_table(const unsigned char *p, size_t n) {
    static uint32_t t[256];
    if (!t[1])
        for (uint32_t i = 0; i < 256; i++) {
            uint32_t c = i;
            for (int k = 0; k < 8; k++) c = c & 1 ? 0xEDB88320u ^ (c >> 1) : c >> 1;
            t[i] = c;
        }
    uint32_t c = 0xFFFFFFFFu;
    for (size_t i = 0; i < n; i++) c = t[(c ^ p[i]) & 0xFF] ^ (c >> 8);
    return c ^ 0xFFFFFFFFu;
}

static unsigned char *slurp(const char *path, size_t *n) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long len = ftell(f);
    fseek(f, 0, SEEK_SET);
    unsigned char *b = malloc((size_t)len + 1);
    *n = fread(b, 1, (size_t)len, f);
    fclose(f);
    return b;
}

static void spit(const char *path, const unsigned char *b, size_t n) {
    FILE *f = fopen(path, "wb");
    fwrite(b, 1, n, f);
    fclose(f);
}

static void put_u32(unsigned char *p, uint32_t v) {
    for (int i = 0; i < 4; i++) p[i] = (unsigned char)(v >> (8 * i));
}

static void fix_crc(unsigned char *b, size_t n) { put_u32(b + n - 4, crc32_table(b, n - 4)); }

/* Loads `bad` and checks that it fails with status want and a message holding
 * every one of the (up to two) fragments. */
static void expect_fail(const char *label, vq_status want, const char *frag1, const char *frag2) {
    vq_qfilters f;
    vq_status st = vq_qfilters_load(bad, &f);
    const char *msg = vq_last_error();
    CHECK(st == want, "%s: status %d, want %d (%s)", label, st, want, msg);
    CHECK(strstr(msg, frag1) != NULL, "%s: message '%s' lacks '%s'", label, msg, frag1);
    CHECK(!frag2 || strstr(msg, frag2) != NULL, "%s: message '%s' lacks '%s'", label, msg, frag2);
    CHECK(f.dirs == NULL && f.n_layers == 0, "%s: a failed load left data behind", label);
}

/* Random unit vectors, seeded. */
static void fill(vq_qfilters *f, int L, int H, int D, unsigned seed) {
    f->n_layers = L;
    f->n_heads_kv = H;
    f->head_dim = D;
    f->dirs = malloc(sizeof(float) * (size_t)L * H * D);
    srand(seed);
    for (int v = 0; v < L * H; v++) {
        float *p = f->dirs + (size_t)v * D;
        double ss = 0;
        for (int i = 0; i < D; i++) {
            p[i] = (float)rand() / RAND_MAX - 0.5f;
            ss += (double)p[i] * p[i];
        }
        for (int i = 0; i < D; i++) p[i] = (float)(p[i] / sqrt(ss));
    }
}

static int tmp_files_left(void) {
    DIR *d = opendir(dir);
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d)))
        if (strstr(e->d_name, ".tmp.")) n++;
    closedir(d);
    return n;
}

static void test_round_trip(void) {
    vq_qfilters f, g;
    fill(&f, 6, 2, 128, 7);
    CHECK(vq_qfilters_save(good, &f) == VQ_OK, "save: %s", vq_last_error());
    size_t n;
    unsigned char *b = slurp(good, &n);
    CHECK(b && n == 24 + 4 * 6 * 2 * 128 + 4, "file size %zu", n);
    CHECK(b && !memcmp(b, "VQQFILT", 8), "magic");
    CHECK(b && crc32_table(b, n - 4) == ((uint32_t)b[n - 4] | (uint32_t)b[n - 3] << 8 | (uint32_t)b[n - 2] << 16 |
                                         (uint32_t)b[n - 1] << 24), "checksum is CRC-32 (IEEE)");
    free(b);
    CHECK(vq_qfilters_load(good, &g) == VQ_OK, "load: %s", vq_last_error());
    CHECK(g.n_layers == 6 && g.n_heads_kv == 2 && g.head_dim == 128, "dims %d %d %d", g.n_layers, g.n_heads_kv, g.head_dim);
    CHECK(g.dirs && !memcmp(f.dirs, g.dirs, sizeof(float) * 6 * 2 * 128), "values round-trip bit-exactly");
    vq_qfilters_free(&g);
    CHECK(g.dirs == NULL && g.n_layers == 0, "free empties the struct");
    vq_qfilters_free(&g); /* twice is harmless */

    /* overwrite in place with other dims: the old file is replaced whole */
    vq_qfilters h;
    fill(&h, 1, 1, 2, 9);
    CHECK(vq_qfilters_save(good, &h) == VQ_OK, "save over: %s", vq_last_error());
    CHECK(vq_qfilters_load(good, &g) == VQ_OK && g.n_layers == 1 && g.head_dim == 2, "reload smallest dims");
    vq_qfilters_free(&g);
    vq_qfilters_free(&h);
    CHECK(tmp_files_left() == 0, "no temporary file left after saving");
    /* good holds the 6 x 2 x 128 file again for the corruption tests */
    CHECK(vq_qfilters_save(good, &f) == VQ_OK, "save: %s", vq_last_error());
    vq_qfilters_free(&f);
}

static void test_save_rejects(void) {
    vq_qfilters f;
    fill(&f, 2, 2, 16, 3);
    char path[160];
    snprintf(path, sizeof path, "%s/rejected.bin", dir);
    f.dirs[16 + 3] *= 1.5f;
    CHECK(vq_qfilters_save(path, &f) == VQ_ERR_FORMAT && strstr(vq_last_error(), "layer 0, kv head 1") &&
              strstr(vq_last_error(), "norm"), "save: non-unit vector: %s", vq_last_error());
    f.dirs[16 + 3] = NAN;
    CHECK(vq_qfilters_save(path, &f) == VQ_ERR_FORMAT && strstr(vq_last_error(), "not finite"), "save: NaN: %s",
          vq_last_error());
    f.dirs[16 + 3] = 0.25f;
    f.n_layers = 0;
    CHECK(vq_qfilters_save(path, &f) == VQ_ERR_FORMAT && strstr(vq_last_error(), "n_layers=0"), "save: 0 layers: %s",
          vq_last_error());
    CHECK(access(path, F_OK) != 0, "a rejected save writes no file");
    vq_qfilters_free(&f);
    fill(&f, 2, 2, 16, 3);
    CHECK(vq_qfilters_save("/nonexistent-folder-for-a-test/f.bin", &f) == VQ_ERR_IO &&
              strstr(vq_last_error(), "nonexistent-folder-for-a-test"), "save into a missing folder: %s", vq_last_error());
    CHECK(vq_qfilters_save(path, NULL) == VQ_ERR_ARG, "save NULL");
    vq_qfilters_free(&f);
    CHECK(tmp_files_left() == 0, "no temporary file left after failed saves");
}

static void test_corruptions(void) {
    size_t n;
    unsigned char *g = slurp(good, &n), *b = malloc(n + 8);
    vq_qfilters f;
    snprintf(bad, sizeof bad, "%s/missing.bin", dir);
    CHECK(vq_qfilters_load(bad, &f) == VQ_ERR_IO && strstr(vq_last_error(), "missing.bin"), "missing file: %s",
          vq_last_error());
    snprintf(bad, sizeof bad, "%s/bad.bin", dir);

    /* truncation at every interesting length */
    size_t cuts[] = {0, 7, 23, 24, 25, 24 + 4 * 128, n - 5, n - 4, n - 1};
    for (size_t i = 0; i < sizeof cuts / sizeof cuts[0]; i++) {
        spit(bad, g, cuts[i]);
        char label[32];
        snprintf(label, sizeof label, "truncated at %zu", cuts[i]);
        expect_fail(label, VQ_ERR_FORMAT, "truncated", cuts[i] < 24 ? "header" : "need");
    }
    /* a byte after the checksum */
    memcpy(b, g, n);
    b[n] = 0;
    spit(bad, b, n + 1);
    expect_fail("trailing byte", VQ_ERR_FORMAT, "after its checksum", NULL);

    memcpy(b, g, n);
    b[0] = 'X';
    fix_crc(b, n);
    spit(bad, b, n);
    expect_fail("magic", VQ_ERR_FORMAT, "not a Q-Filters file", NULL);

    memcpy(b, g, n);
    put_u32(b + 8, 2);
    fix_crc(b, n);
    spit(bad, b, n);
    expect_fail("version", VQ_ERR_FORMAT, "version 2", NULL);

    struct { int off; uint32_t v; const char *frag; } dims[] = {
        {12, 0, "n_layers=0"}, {12, 1025, "n_layers=1025"}, {12, 0xFFFFFFFFu, "n_layers=4294967295"},
        {16, 0, "n_heads_kv=0"}, {16, 5000, "n_heads_kv=5000"}, {20, 1, "head_dim=1"}, {20, 4097, "head_dim=4097"},
    };
    for (size_t i = 0; i < sizeof dims / sizeof dims[0]; i++) {
        memcpy(b, g, n);
        put_u32(b + dims[i].off, dims[i].v);
        fix_crc(b, n);
        spit(bad, b, n);
        expect_fail(dims[i].frag, VQ_ERR_FORMAT, dims[i].frag, "out of range");
    }
    /* dims in range but not the ones the data was written for: the size check */
    memcpy(b, g, n);
    put_u32(b + 20, 64);
    fix_crc(b, n);
    spit(bad, b, n);
    expect_fail("dims that do not match the size", VQ_ERR_FORMAT, "after its checksum", NULL);

    /* layer 3, kv head 1, element 5 */
    size_t at = 24 + 4 * ((size_t)(3 * 2 + 1) * 128 + 5);
    float nan = NAN, inf = INFINITY, big = 2.0f;
    float *vals[] = {&nan, &inf, &big};
    const char *frags[] = {"not finite", "not finite", "norm"};
    for (int i = 0; i < 3; i++) {
        memcpy(b, g, n);
        memcpy(b + at, vals[i], 4); /* the test machine is little-endian like the file */
        fix_crc(b, n);
        spit(bad, b, n);
        expect_fail(frags[i], VQ_ERR_FORMAT, "layer 3, kv head 1", frags[i]);
    }
    /* a zero vector */
    memcpy(b, g, n);
    memset(b + 24 + 4 * 128, 0, 4 * 128);
    fix_crc(b, n);
    spit(bad, b, n);
    expect_fail("zero vector", VQ_ERR_FORMAT, "layer 0, kv head 1 has norm 0", NULL);

    /* one flipped bit anywhere is a checksum error, without fixing the CRC */
    size_t flips[] = {30, at, n - 6, n - 1};
    for (size_t i = 0; i < sizeof flips / sizeof flips[0]; i++) {
        memcpy(b, g, n);
        b[flips[i]] ^= 0x10;
        spit(bad, b, n);
        expect_fail("bit flip", VQ_ERR_FORMAT, "checksum", NULL);
    }
    CHECK(vq_qfilters_load(NULL, &f) == VQ_ERR_ARG, "load NULL path");
    CHECK(vq_qfilters_load(good, NULL) == VQ_ERR_ARG, "load NULL out");
    free(g);
    free(b);
    unlink(bad);
}

int main(void) {
    snprintf(dir, sizeof dir, "/tmp/vq_test_qfilters.XXXXXX");
    if (!mkdtemp(dir)) {
        perror("mkdtemp");
        return 1;
    }
    snprintf(good, sizeof good, "%s/good.bin", dir);
    test_round_trip();
    test_save_rejects();
    test_corruptions();
    unlink(good);
    rmdir(dir);
    return check_done();
}
