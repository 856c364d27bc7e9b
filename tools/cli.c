#include "cli.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

int cli_int(const char *cmd, const char *opt, const char *v, long lo, long hi, int *out) {
    char *end;
    errno = 0;
    long x = v ? strtol(v, &end, 10) : 0;
    if (!v || end == v || *end || errno || x < lo || x > hi) {
        fprintf(stderr, "veloxquant %s: %s '%s' is out of range [%ld, %ld]\n", cmd, opt, v ? v : "", lo, hi);
        return -1;
    }
    *out = (int)x;
    return 0;
}

int cli_float(const char *cmd, const char *opt, const char *v, double lo, double hi, float *out) {
    char *end;
    double x = v ? strtod(v, &end) : 0;
    if (!v || end == v || *end || !(x >= lo && x <= hi)) {
        fprintf(stderr, "veloxquant %s: %s '%s' is out of range [%g, %g]\n", cmd, opt, v ? v : "", lo, hi);
        return -1;
    }
    *out = (float)x;
    return 0;
}

int cli_default_threads(void) {
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    return n < 1 ? 1 : n > 256 ? 256 : (int)n;
}

int cli_load_model(const char *cmd, const char *dir, vq_model **m, vq_tokenizer **t) {
    if (!dir) {
        fprintf(stderr, "veloxquant %s: no model folder: give -m DIR\n", cmd);
        return -1;
    }
    if (vq_model_load(dir, m)) {
        fprintf(stderr, "veloxquant %s: %s\n", cmd, vq_last_error());
        return -1;
    }
    if (t) {
        char path[4096];
        snprintf(path, sizeof path, "%s/tokenizer.json", dir);
        if (vq_tokenizer_load(path, t)) {
            fprintf(stderr, "veloxquant %s: %s\n", cmd, vq_last_error());
            vq_model_free(*m);
            return -1;
        }
        snprintf(path, sizeof path, "%s/tokenizer_config.json", dir);
        if (vq_tokenizer_apply_config(*t, path)) {
            fprintf(stderr, "veloxquant %s: %s\n", cmd, vq_last_error());
            vq_tokenizer_free(*t);
            vq_model_free(*m);
            return -1;
        }
        if (vq_tokenizer_vocab_size(*t) > vq_model_get_info(*m)->vocab_size) {
            fprintf(stderr, "veloxquant %s: tokenizer.json has %d ids but the model's vocabulary is %d\n", cmd,
                    vq_tokenizer_vocab_size(*t), vq_model_get_info(*m)->vocab_size);
            vq_tokenizer_free(*t);
            vq_model_free(*m);
            return -1;
        }
    }
    return 0;
}

char *cli_read_text(const char *cmd, const char *path, size_t *len) {
    FILE *f = fopen(path, "rb");
    if (!f) {
        fprintf(stderr, "veloxquant %s: cannot open '%s': %s\n", cmd, path, strerror(errno));
        return NULL;
    }
    size_t cap = 1 << 16, n = 0;
    char *buf = malloc(cap + 1);
    while (buf) {
        size_t got = fread(buf + n, 1, cap - n, f);
        n += got;
        if (n < cap) break;
        char *nb = realloc(buf, cap * 2 + 1);
        if (!nb) {
            free(buf);
            buf = NULL;
            break;
        }
        buf = nb;
        cap *= 2;
    }
    int err = ferror(f);
    fclose(f);
    if (!buf || err) {
        fprintf(stderr, "veloxquant %s: cannot read '%s'\n", cmd, path);
        free(buf);
        return NULL;
    }
    buf[n] = 0;
    *len = n;
    return buf;
}

const char *cli_bytes(double b, char *buf, int size) {
    const char *unit[] = {"B", "KiB", "MiB", "GiB", "TiB"};
    int u = 0;
    while (b >= 1024 && u < 4) {
        b /= 1024;
        u++;
    }
    snprintf(buf, (size_t)size, u ? "%.2f %s" : "%.0f %s", b, unit[u]);
    return buf;
}

const char *cli_size_ratio(double fp16_bytes, double bytes, char *buf, int size) {
    if (!(bytes > 0) || !(fp16_bytes > 0)) snprintf(buf, (size_t)size, "no ratio (nothing cached)");
    else if (fp16_bytes >= bytes) snprintf(buf, (size_t)size, "%.2fx smaller", fp16_bytes / bytes);
    else snprintf(buf, (size_t)size, "%.2fx larger", bytes / fp16_bytes);
    return buf;
}
