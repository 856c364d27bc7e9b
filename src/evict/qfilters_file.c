/* Reading and writing the Q-Filters file (layout in qfilters_file.h). The
 * file is small (6 layers x 2 heads x 128 floats = 6 KiB for the reference
 * model), so it is read whole and checked field by field before any value is
 * trusted. */
#include "evict/qfilters_file.h"
#include "vq_internal.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static const unsigned char MAGIC[8] = {'V', 'Q', 'Q', 'F', 'I', 'L', 'T', 0};
#define HEADER_BYTES 24
#define CRC_BYTES 4

/* CRC-32, reflected polynomial 0xEDB88320 (zlib, PNG, gzip); bitwise since
 * the file is a few KiB. */
static uint32_t crc32_ieee(const unsigned char *p, size_t n) {
    uint32_t c = 0xFFFFFFFFu;
    for (size_t i = 0; i < n; i++) {
        c ^= p[i];
        for (int b = 0; b < 8; b++) c = (c >> 1) ^ (0xEDB88320u & (0u - (c & 1u)));
    }
    return c ^ 0xFFFFFFFFu;
}

static uint32_t get_u32(const unsigned char *p) {
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

static void put_u32(unsigned char *p, uint32_t v) {
    p[0] = (unsigned char)v;
    p[1] = (unsigned char)(v >> 8);
    p[2] = (unsigned char)(v >> 16);
    p[3] = (unsigned char)(v >> 24);
}

static float get_f32(const unsigned char *p) {
    uint32_t u = get_u32(p);
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

static void put_f32(unsigned char *p, float f) {
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    put_u32(p, u);
}

static vq_status check_dims(const char *what, long n_layers, long n_heads_kv, long head_dim) {
    if (n_layers < 1 || n_layers > VQ_QFILTERS_MAX_LAYERS)
        return vq_fail(VQ_ERR_FORMAT, "%s: n_layers=%ld is out of range [1, %d]", what, n_layers, VQ_QFILTERS_MAX_LAYERS);
    if (n_heads_kv < 1 || n_heads_kv > VQ_QFILTERS_MAX_HEADS)
        return vq_fail(VQ_ERR_FORMAT, "%s: n_heads_kv=%ld is out of range [1, %d]", what, n_heads_kv, VQ_QFILTERS_MAX_HEADS);
    if (head_dim < 2 || head_dim > VQ_QFILTERS_MAX_DIM)
        return vq_fail(VQ_ERR_FORMAT, "%s: head_dim=%ld is out of range [2, %d]", what, head_dim, VQ_QFILTERS_MAX_DIM);
    return VQ_OK;
}

/* Every vector finite and of unit length (within VQ_QFILTERS_NORM_TOL). */
static vq_status check_dirs(const char *what, const vq_qfilters *f) {
    for (int l = 0; l < f->n_layers; l++)
        for (int h = 0; h < f->n_heads_kv; h++) {
            const float *v = f->dirs + ((size_t)l * f->n_heads_kv + h) * f->head_dim;
            double ss = 0;
            for (int i = 0; i < f->head_dim; i++) {
                if (!isfinite(v[i]))
                    return vq_fail(VQ_ERR_FORMAT, "%s: layer %d, kv head %d, element %d is %g (not finite)", what, l, h, i,
                                   (double)v[i]);
                ss += (double)v[i] * v[i];
            }
            double norm = sqrt(ss);
            if (fabs(norm - 1.0) > VQ_QFILTERS_NORM_TOL)
                return vq_fail(VQ_ERR_FORMAT, "%s: layer %d, kv head %d has norm %.6g (a filter must have norm 1 +- %g)",
                               what, l, h, norm, VQ_QFILTERS_NORM_TOL);
        }
    return VQ_OK;
}

static size_t file_bytes(int n_layers, int n_heads_kv, int head_dim) {
    return HEADER_BYTES + sizeof(float) * (size_t)n_layers * n_heads_kv * head_dim + CRC_BYTES;
}

void vq_qfilters_free(vq_qfilters *f) {
    if (!f) return;
    free(f->dirs);
    memset(f, 0, sizeof *f);
}

vq_status vq_qfilters_load(const char *path, vq_qfilters *out) {
    if (!out) return vq_fail(VQ_ERR_ARG, "vq_qfilters_load: out is NULL");
    memset(out, 0, sizeof *out);
    if (!path) return vq_fail(VQ_ERR_ARG, "vq_qfilters_load: path is NULL");
    FILE *fp = fopen(path, "rb");
    if (!fp) return vq_fail(VQ_ERR_IO, "Q-Filters file '%s': cannot open: %s", path, strerror(errno));
    unsigned char head[HEADER_BYTES];
    size_t n = fread(head, 1, HEADER_BYTES, fp);
    vq_status st = VQ_OK;
    unsigned char *buf = NULL;
    if (n < HEADER_BYTES) {
        st = ferror(fp) ? vq_fail(VQ_ERR_IO, "Q-Filters file '%s': read error", path)
                        : vq_fail(VQ_ERR_FORMAT, "Q-Filters file '%s' is truncated: %zu bytes, the header alone is %d",
                                  path, n, HEADER_BYTES);
        goto done;
    }
    if (memcmp(head, MAGIC, sizeof MAGIC)) {
        st = vq_fail(VQ_ERR_FORMAT, "'%s' is not a Q-Filters file (bad magic; expected \"VQQFILT\")", path);
        goto done;
    }
    uint32_t version = get_u32(head + 8);
    if (version != VQ_QFILTERS_VERSION) {
        st = vq_fail(VQ_ERR_FORMAT, "Q-Filters file '%s' has version %u; this build reads version %d", path,
                     (unsigned)version, VQ_QFILTERS_VERSION);
        goto done;
    }
    uint32_t nl = get_u32(head + 12), nh = get_u32(head + 16), hd = get_u32(head + 20);
    char what[4200];
    snprintf(what, sizeof what, "Q-Filters file '%s'", path);
    st = check_dims(what, (long)nl, (long)nh, (long)hd);
    if (st) goto done;
    /* The dims bound the size, so a huge file is never read whole. */
    size_t want = file_bytes((int)nl, (int)nh, (int)hd);
    buf = malloc(want + 1);
    if (!buf) {
        st = vq_fail(VQ_ERR_NOMEM, "out of memory reading '%s' (%zu bytes)", path, want);
        goto done;
    }
    memcpy(buf, head, HEADER_BYTES);
    /* one byte past the expected end tells trailing garbage from a clean end */
    n = HEADER_BYTES + fread(buf + HEADER_BYTES, 1, want + 1 - HEADER_BYTES, fp);
    if (ferror(fp)) {
        st = vq_fail(VQ_ERR_IO, "Q-Filters file '%s': read error", path);
        goto done;
    }
    if (n < want) {
        st = vq_fail(VQ_ERR_FORMAT, "Q-Filters file '%s' is truncated: %zu bytes, %u x %u x %u filters need %zu", path, n,
                     (unsigned)nl, (unsigned)nh, (unsigned)hd, want);
        goto done;
    }
    if (n > want) {
        st = vq_fail(VQ_ERR_FORMAT, "Q-Filters file '%s' has bytes after its checksum (expected exactly %zu bytes)", path,
                     want);
        goto done;
    }
    uint32_t stored = get_u32(buf + want - CRC_BYTES), actual = crc32_ieee(buf, want - CRC_BYTES);
    if (stored != actual) {
        st = vq_fail(VQ_ERR_FORMAT, "Q-Filters file '%s' is corrupt: checksum %08x, contents give %08x", path,
                     (unsigned)stored, (unsigned)actual);
        goto done;
    }
    size_t count = (size_t)nl * nh * hd;
    out->dirs = malloc(sizeof(float) * count);
    if (!out->dirs) {
        st = vq_fail(VQ_ERR_NOMEM, "out of memory reading '%s'", path);
        goto done;
    }
    for (size_t i = 0; i < count; i++) out->dirs[i] = get_f32(buf + HEADER_BYTES + 4 * i);
    out->n_layers = (int)nl;
    out->n_heads_kv = (int)nh;
    out->head_dim = (int)hd;
    st = check_dirs(what, out);
done:
    if (st) vq_qfilters_free(out);
    free(buf);
    fclose(fp);
    return st;
}

vq_status vq_qfilters_save(const char *path, const vq_qfilters *f) {
    if (!path || !f || !f->dirs) return vq_fail(VQ_ERR_ARG, "vq_qfilters_save: path, filters or their data is NULL");
    vq_status st = check_dims("vq_qfilters_save", f->n_layers, f->n_heads_kv, f->head_dim);
    if (!st) st = check_dirs("vq_qfilters_save", f);
    if (st) return st;
    size_t bytes = file_bytes(f->n_layers, f->n_heads_kv, f->head_dim), count = (bytes - HEADER_BYTES - CRC_BYTES) / 4;
    unsigned char *buf = malloc(bytes);
    size_t plen = strlen(path);
    char *tmp = malloc(plen + 16);
    if (!buf || !tmp) {
        free(buf);
        free(tmp);
        return vq_fail(VQ_ERR_NOMEM, "out of memory writing '%s'", path);
    }
    memcpy(buf, MAGIC, sizeof MAGIC);
    put_u32(buf + 8, VQ_QFILTERS_VERSION);
    put_u32(buf + 12, (uint32_t)f->n_layers);
    put_u32(buf + 16, (uint32_t)f->n_heads_kv);
    put_u32(buf + 20, (uint32_t)f->head_dim);
    for (size_t i = 0; i < count; i++) put_f32(buf + HEADER_BYTES + 4 * i, f->dirs[i]);
    put_u32(buf + bytes - CRC_BYTES, crc32_ieee(buf, bytes - CRC_BYTES));
    /* The temporary file sits in the target's folder so that rename() stays
     * on one file system and replaces the target in one step. */
    snprintf(tmp, plen + 16, "%s.tmp.XXXXXX", path);
    int fd = mkstemp(tmp);
    if (fd < 0) {
        st = vq_fail(VQ_ERR_IO, "cannot create a temporary file next to '%s': %s", path, strerror(errno));
        goto done;
    }
    /* mkstemp makes the file private (0600); a filters file is data to share */
    fchmod(fd, 0644);
    FILE *fp = fdopen(fd, "wb");
    if (!fp) {
        close(fd);
        st = vq_fail(VQ_ERR_IO, "cannot write '%s': %s", tmp, strerror(errno));
        unlink(tmp);
        goto done;
    }
    int ok = fwrite(buf, 1, bytes, fp) == bytes;
    ok &= fflush(fp) == 0;
    ok &= fsync(fileno(fp)) == 0;
    ok &= fclose(fp) == 0;
    if (!ok) {
        st = vq_fail(VQ_ERR_IO, "cannot write '%s': %s", tmp, strerror(errno));
        unlink(tmp);
        goto done;
    }
    if (rename(tmp, path)) {
        st = vq_fail(VQ_ERR_IO, "cannot rename '%s' to '%s': %s", tmp, path, strerror(errno));
        unlink(tmp);
    }
done:
    free(buf);
    free(tmp);
    return st;
}
