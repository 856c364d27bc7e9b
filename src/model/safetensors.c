/*
 * safetensors checkpoints, memory-mapped.
 *
 * A file is: 8 bytes little-endian N, N bytes of JSON header, then the data
 * section. The header maps tensor names to {"dtype", "shape", "data_offsets":
 * [begin, end]} with offsets relative to the data section; an optional
 * "__metadata__" object holds strings. Everything is checked at open so the
 * model loader can trust every tensor it gets: a weight pointer always lies
 * inside the mapping and covers exactly product(shape) elements.
 */
#include "model/model_internal.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

/* The reference implementation refuses headers above 100 MB; so do we, which
 * also bounds what a corrupt length can make us parse. */
#define ST_MAX_HEADER (100u * 1000u * 1000u)

/* Offsets and dims arrive as JSON numbers (doubles): integers above 2^53
 * would already have lost precision, so they are refused. */
#define ST_MAX_INT 9007199254740992.0

static const struct {
    const char *name;
    size_t size;
} dtype_info[] = {
    [VQ_ST_F32] = {"F32", 4},   [VQ_ST_F16] = {"F16", 2},         [VQ_ST_BF16] = {"BF16", 2},
    [VQ_ST_F64] = {"F64", 8},   [VQ_ST_I64] = {"I64", 8},         [VQ_ST_I32] = {"I32", 4},
    [VQ_ST_I16] = {"I16", 2},   [VQ_ST_I8] = {"I8", 1},           [VQ_ST_U64] = {"U64", 8},
    [VQ_ST_U32] = {"U32", 4},   [VQ_ST_U16] = {"U16", 2},         [VQ_ST_U8] = {"U8", 1},
    [VQ_ST_BOOL] = {"BOOL", 1}, [VQ_ST_F8_E4M3] = {"F8_E4M3", 1}, [VQ_ST_F8_E5M2] = {"F8_E5M2", 1},
};
#define N_DTYPES ((int)(sizeof dtype_info / sizeof dtype_info[0]))

const char *vq_st_dtype_name(vq_st_dtype t) { return dtype_info[t].name; }
size_t vq_st_dtype_size(vq_st_dtype t) { return dtype_info[t].size; }

struct vq_st_file {
    char *path;
    const uint8_t *map;
    size_t map_size;
    char *names;            /* all tensor names, NUL-separated */
    vq_st_tensor *tensors;  /* header order */
    int n_tensors;
    const vq_st_tensor **by_name; /* the tensors sorted by name */
};

vq_status vq_read_file(const char *path, char **out, size_t *len) {
    *out = NULL;
    FILE *fp = fopen(path, "rb");
    if (!fp) return vq_fail(VQ_ERR_IO, "%s: cannot open: %s", path, strerror(errno));
    char *buf = NULL;
    size_t n = 0, cap = 0;
    for (;;) {
        if (cap - n < 65536) {
            size_t ncap = cap ? cap * 2 : 65536;
            char *nb = realloc(buf, ncap + 1);
            if (!nb) {
                free(buf);
                fclose(fp);
                return vq_fail(VQ_ERR_NOMEM, "%s: out of memory reading the file", path);
            }
            buf = nb;
            cap = ncap;
        }
        size_t got = fread(buf + n, 1, cap - n, fp);
        n += got;
        if (got == 0) break;
    }
    int err = ferror(fp);
    fclose(fp);
    if (err) {
        free(buf);
        return vq_fail(VQ_ERR_IO, "%s: read error", path);
    }
    buf[n] = '\0';
    *out = buf;
    if (len) *len = n;
    return VQ_OK;
}

void vq_st_close(vq_st_file *f) {
    if (!f) return;
    if (f->map) munmap((void *)f->map, f->map_size);
    free(f->path);
    free(f->names);
    free(f->tensors);
    free(f->by_name);
    free(f);
}

/* A JSON number that is a whole number in [0, 2^53]; false otherwise. */
static bool json_uint(const cJSON *v, int64_t *out) {
    if (!cJSON_IsNumber(v)) return false;
    double d = v->valuedouble;
    if (!(d >= 0 && d <= ST_MAX_INT) || d != floor(d)) return false;
    *out = (int64_t)d;
    return true;
}

/* Writes "[a, b, c]" of a shape for messages. */
static void format_shape(const int64_t *shape, int n, char *buf, size_t size) {
    size_t used = (size_t)snprintf(buf, size, "[");
    for (int i = 0; i < n && used < size; i++)
        used += (size_t)snprintf(buf + used, size - used, "%s%lld", i ? ", " : "", (long long)shape[i]);
    if (used < size) snprintf(buf + used, size - used, "]");
}

static int cmp_by_name(const void *a, const void *b) {
    return strcmp((*(const vq_st_tensor *const *)a)->name, (*(const vq_st_tensor *const *)b)->name);
}

static int cmp_by_offset(const void *a, const void *b) {
    const vq_st_tensor *ta = *(const vq_st_tensor *const *)a, *tb = *(const vq_st_tensor *const *)b;
    if (ta->data != tb->data) return (const uint8_t *)ta->data < (const uint8_t *)tb->data ? -1 : 1;
    return ta->n_bytes < tb->n_bytes ? -1 : ta->n_bytes > tb->n_bytes;
}

/* Fills one tensor from its header entry; data_begin is the data section. */
static vq_status parse_tensor(vq_st_file *f, const cJSON *e, vq_st_tensor *t,
                              const uint8_t *data_begin, size_t data_size) {
    const char *p = f->path, *nm = e->string;
    if (!cJSON_IsObject(e)) return vq_fail(VQ_ERR_FORMAT, "%s: tensor '%s': entry is not a JSON object", p, nm);

    const cJSON *jd = cJSON_GetObjectItemCaseSensitive(e, "dtype");
    if (!cJSON_IsString(jd))
        return vq_fail(VQ_ERR_FORMAT, "%s: tensor '%s': missing \"dtype\" string", p, nm);
    int dt = -1;
    for (int i = 0; i < N_DTYPES; i++)
        if (strcmp(jd->valuestring, dtype_info[i].name) == 0) dt = i;
    if (dt < 0)
        return vq_fail(VQ_ERR_FORMAT, "%s: tensor '%s': unknown dtype '%s'", p, nm, jd->valuestring);
    t->dtype = (vq_st_dtype)dt;

    const cJSON *js = cJSON_GetObjectItemCaseSensitive(e, "shape");
    if (!cJSON_IsArray(js))
        return vq_fail(VQ_ERR_FORMAT, "%s: tensor '%s': missing \"shape\" array", p, nm);
    int nd = cJSON_GetArraySize(js);
    if (nd > VQ_ST_MAX_DIMS)
        return vq_fail(VQ_ERR_FORMAT, "%s: tensor '%s': %d dims, at most %d supported", p, nm, nd,
                       VQ_ST_MAX_DIMS);
    t->n_dims = nd;
    /* The element count and the byte size must both fit: a product that
     * overflows is a corrupt header, not a huge tensor. */
    uint64_t elems = 1;
    int i = 0;
    for (const cJSON *d = js->child; d; d = d->next, i++) {
        int64_t v;
        if (!json_uint(d, &v))
            return vq_fail(VQ_ERR_FORMAT, "%s: tensor '%s': shape dim %d is not a non-negative integer", p,
                           nm, i);
        t->shape[i] = v;
        if (v != 0 && elems > (uint64_t)ST_MAX_INT / (uint64_t)v)
            return vq_fail(VQ_ERR_FORMAT, "%s: tensor '%s': shape overflows the element count", p, nm);
        elems *= (uint64_t)v;
    }
    t->n_elems = (int64_t)elems;
    uint64_t need = elems * dtype_info[dt].size; /* elems <= 2^53, size <= 8: fits */

    const cJSON *jo = cJSON_GetObjectItemCaseSensitive(e, "data_offsets");
    int64_t b, en;
    if (!cJSON_IsArray(jo) || cJSON_GetArraySize(jo) != 2 || !json_uint(jo->child, &b) ||
        !json_uint(jo->child->next, &en))
        return vq_fail(VQ_ERR_FORMAT, "%s: tensor '%s': \"data_offsets\" must be [begin, end], two non-negative integers",
                       p, nm);
    if (en < b)
        return vq_fail(VQ_ERR_FORMAT, "%s: tensor '%s': data_offsets [%lld, %lld] end before begin", p, nm,
                       (long long)b, (long long)en);
    if ((uint64_t)en > data_size)
        return vq_fail(VQ_ERR_FORMAT,
                       "%s: tensor '%s': data_offsets [%lld, %lld] run past the data section of %zu bytes",
                       p, nm, (long long)b, (long long)en, data_size);
    if ((uint64_t)(en - b) != need) {
        char sh[160];
        format_shape(t->shape, nd, sh, sizeof sh);
        return vq_fail(VQ_ERR_FORMAT,
                       "%s: tensor '%s': data_offsets [%lld, %lld] hold %lld bytes, shape %s of %s needs %llu",
                       p, nm, (long long)b, (long long)en, (long long)(en - b), sh, dtype_info[dt].name,
                       (unsigned long long)need);
    }
    t->data = data_begin + b;
    t->n_bytes = (size_t)need;
    t->file = f->path;
    return VQ_OK;
}

/* Parses the header and fills f->tensors; the mapping is in place. */
static vq_status parse_header(vq_st_file *f) {
    const char *p = f->path;
    if (f->map_size < 8)
        return vq_fail(VQ_ERR_FORMAT, "%s: %zu bytes, too short for a safetensors file (8-byte header length first)",
                       p, f->map_size);
    uint64_t n = 0;
    for (int i = 7; i >= 0; i--) n = (n << 8) | f->map[i];
    if (n > f->map_size - 8)
        return vq_fail(VQ_ERR_FORMAT, "%s: header length %llu runs past the end of the file (%zu bytes)", p,
                       (unsigned long long)n, f->map_size);
    if (n > ST_MAX_HEADER)
        return vq_fail(VQ_ERR_FORMAT, "%s: header length %llu is above the %u-byte limit", p,
                       (unsigned long long)n, ST_MAX_HEADER);
    const char *hdr = (const char *)f->map + 8;
    if (n < 2 || hdr[0] != '{')
        return vq_fail(VQ_ERR_FORMAT, "%s: header does not start with a JSON object ('{')", p);

    const char *end = NULL;
    cJSON *root = cJSON_ParseWithLengthOpts(hdr, (size_t)n, &end, 0);
    if (!root) {
        size_t at = end ? (size_t)(end - hdr) : 0;
        return vq_fail(VQ_ERR_FORMAT, "%s: header is not valid JSON (error near byte %zu of %llu)", p, at,
                       (unsigned long long)n);
    }
    /* The format pads the header with spaces; nothing else may follow. */
    for (const char *c = end; c < hdr + n; c++) {
        if (*c != ' ' && *c != '\t' && *c != '\n' && *c != '\r') {
            cJSON_Delete(root);
            return vq_fail(VQ_ERR_FORMAT, "%s: header has bytes after the JSON object (at byte %zu of %llu)", p,
                           (size_t)(c - hdr), (unsigned long long)n);
        }
    }
    if (!cJSON_IsObject(root)) {
        cJSON_Delete(root);
        return vq_fail(VQ_ERR_FORMAT, "%s: header is not a JSON object", p);
    }

    int count = 0;
    size_t name_bytes = 0;
    for (const cJSON *e = root->child; e; e = e->next) {
        if (strcmp(e->string, "__metadata__") == 0) continue;
        count++;
        name_bytes += strlen(e->string) + 1;
    }
    f->tensors = calloc(count ? (size_t)count : 1, sizeof *f->tensors);
    f->by_name = calloc(count ? (size_t)count : 1, sizeof *f->by_name);
    f->names = malloc(name_bytes ? name_bytes : 1);
    if (!f->tensors || !f->by_name || !f->names) {
        cJSON_Delete(root);
        return vq_fail(VQ_ERR_NOMEM, "%s: out of memory for %d tensors", p, count);
    }

    const uint8_t *data = f->map + 8 + n;
    size_t data_size = f->map_size - 8 - (size_t)n;
    char *np = f->names;
    vq_status st = VQ_OK;
    for (const cJSON *e = root->child; e && st == VQ_OK; e = e->next) {
        if (strcmp(e->string, "__metadata__") == 0) {
            if (!cJSON_IsObject(e)) st = vq_fail(VQ_ERR_FORMAT, "%s: \"__metadata__\" is not a JSON object", p);
            continue;
        }
        vq_st_tensor *t = &f->tensors[f->n_tensors];
        st = parse_tensor(f, e, t, data, data_size);
        if (st != VQ_OK) break;
        size_t len = strlen(e->string) + 1;
        memcpy(np, e->string, len);
        t->name = np;
        np += len;
        f->by_name[f->n_tensors] = t;
        f->n_tensors++;
    }
    cJSON_Delete(root);
    if (st != VQ_OK) return st;

    /* Duplicate names: cJSON keeps both, a lookup would silently pick one. */
    qsort(f->by_name, (size_t)f->n_tensors, sizeof *f->by_name, cmp_by_name);
    for (int i = 1; i < f->n_tensors; i++) {
        const char *a = f->by_name[i]->name;
        if (strcmp(a, f->by_name[i - 1]->name) == 0)
            return vq_fail(VQ_ERR_FORMAT, "%s: tensor '%s' appears twice in the header", p, a);
    }

    /* No two tensors may share bytes (empty tensors take no bytes). */
    const vq_st_tensor **order = malloc((f->n_tensors ? (size_t)f->n_tensors : 1) * sizeof *order);
    if (!order) return vq_fail(VQ_ERR_NOMEM, "%s: out of memory", p);
    memcpy(order, f->by_name, (size_t)f->n_tensors * sizeof *order);
    qsort(order, (size_t)f->n_tensors, sizeof *order, cmp_by_offset);
    const vq_st_tensor *prev = NULL;
    for (int i = 0; i < f->n_tensors && st == VQ_OK; i++) {
        const vq_st_tensor *t = order[i];
        if (t->n_bytes == 0) continue;
        if (prev && (const uint8_t *)prev->data + prev->n_bytes > (const uint8_t *)t->data) {
            long long pb = (const uint8_t *)prev->data - data, tb = (const uint8_t *)t->data - data;
            st = vq_fail(VQ_ERR_FORMAT, "%s: tensors '%s' [%lld, %lld] and '%s' [%lld, %lld] overlap", p,
                         prev->name, pb, pb + (long long)prev->n_bytes, t->name, tb,
                         tb + (long long)t->n_bytes);
        }
        prev = t;
    }
    free(order);
    return st;
}

vq_status vq_st_open(const char *path, vq_st_file **out) {
    *out = NULL;
    vq_st_file *f = calloc(1, sizeof *f);
    if (!f || !(f->path = strdup(path))) {
        free(f);
        return vq_fail(VQ_ERR_NOMEM, "%s: out of memory", path);
    }
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        vq_status st = vq_fail(VQ_ERR_IO, "%s: cannot open: %s", path, strerror(errno));
        vq_st_close(f);
        return st;
    }
    struct stat sb;
    if (fstat(fd, &sb) != 0 || !S_ISREG(sb.st_mode)) {
        close(fd);
        vq_st_close(f);
        return vq_fail(VQ_ERR_IO, "%s: not a regular file", path);
    }
    f->map_size = (size_t)sb.st_size;
    if (f->map_size > 0) {
        /* MAP_SHARED + read-only: the pages are the page cache's, shared by
         * every process that maps the same checkpoint. */
        void *m = mmap(NULL, f->map_size, PROT_READ, MAP_SHARED, fd, 0);
        if (m == MAP_FAILED) {
            vq_status st = vq_fail(VQ_ERR_IO, "%s: mmap failed: %s", path, strerror(errno));
            close(fd);
            f->map_size = 0;
            vq_st_close(f);
            return st;
        }
        f->map = m;
    }
    close(fd);
    vq_status st = parse_header(f);
    if (st != VQ_OK) {
        vq_st_close(f);
        return st;
    }
    *out = f;
    return VQ_OK;
}

int vq_st_count(const vq_st_file *f) { return f->n_tensors; }
const vq_st_tensor *vq_st_at(const vq_st_file *f, int i) { return &f->tensors[i]; }

const vq_st_tensor *vq_st_find(const vq_st_file *f, const char *name) {
    int lo = 0, hi = f->n_tensors;
    while (lo < hi) {
        int mid = lo + (hi - lo) / 2;
        int c = strcmp(f->by_name[mid]->name, name);
        if (c == 0) return f->by_name[mid];
        if (c < 0) lo = mid + 1;
        else hi = mid;
    }
    return NULL;
}

/* ------------------------------------------------------------ checkpoints */

struct vq_weights {
    vq_st_file **files;
    int n_files;
    /* Every tensor of every file, sorted by name, so a lookup does not care
     * which shard holds it. */
    const vq_st_tensor **all;
    int n_all;
};

void vq_weights_close(vq_weights *w) {
    if (!w) return;
    for (int i = 0; i < w->n_files; i++) vq_st_close(w->files[i]);
    free(w->files);
    free(w->all);
    free(w);
}

static char *join_path(const char *dir, const char *name) {
    size_t a = strlen(dir), b = strlen(name);
    char *s = malloc(a + b + 2);
    if (!s) return NULL;
    memcpy(s, dir, a);
    s[a] = '/';
    memcpy(s + a + 1, name, b + 1);
    return s;
}

static vq_status add_file(vq_weights *w, const char *path) {
    vq_st_file **nf = realloc(w->files, (size_t)(w->n_files + 1) * sizeof *nf);
    if (!nf) return vq_fail(VQ_ERR_NOMEM, "%s: out of memory", path);
    w->files = nf;
    vq_st_file *f;
    vq_status st = vq_st_open(path, &f);
    if (st != VQ_OK) return st;
    w->files[w->n_files++] = f;
    return VQ_OK;
}

vq_status vq_read_json(const char *path, cJSON **out) {
    char *text;
    size_t len;
    *out = NULL;
    vq_status st = vq_read_file(path, &text, &len);
    if (st != VQ_OK) return st;
    const char *end = NULL;
    *out = cJSON_ParseWithLengthOpts(text, len, &end, 0);
    if (!*out)
        st = vq_fail(VQ_ERR_FORMAT, "%s: not valid JSON (error near byte %zu)", path, end ? (size_t)(end - text) : (size_t)0);
    free(text);
    return st;
}

/* Opens the shards an index names, each once, and checks that every tensor
 * of the weight map is in the shard the index says. */
static vq_status open_sharded(vq_weights *w, const char *dir, const char *index_path) {
    cJSON *root;
    vq_status st = vq_read_json(index_path, &root);
    if (st != VQ_OK) return st;
    const cJSON *map = cJSON_GetObjectItemCaseSensitive(root, "weight_map");
    if (!cJSON_IsObject(map)) {
        cJSON_Delete(root);
        return vq_fail(VQ_ERR_FORMAT, "%s: missing \"weight_map\" object", index_path);
    }
    /* Shard names in first-seen order; a model has few shards, so a linear
     * search over the names opened so far is enough. */
    const char **shard_names = calloc((size_t)cJSON_GetArraySize(map) + 1, sizeof *shard_names);
    if (!shard_names) {
        cJSON_Delete(root);
        return vq_fail(VQ_ERR_NOMEM, "%s: out of memory", index_path);
    }
    for (const cJSON *e = map->child; e && st == VQ_OK; e = e->next) {
        if (!cJSON_IsString(e)) {
            st = vq_fail(VQ_ERR_FORMAT, "%s: weight_map entry '%s' is not a file name string", index_path,
                         e->string);
            break;
        }
        const char *shard = e->valuestring;
        /* Shards live next to the index; a name with a slash could point
         * anywhere on the machine. */
        if (shard[0] == '\0' || strchr(shard, '/') || strcmp(shard, "..") == 0) {
            st = vq_fail(VQ_ERR_FORMAT, "%s: tensor '%s': shard name '%s' must be a plain file name", index_path,
                         e->string, shard);
            break;
        }
        int k = 0;
        while (k < w->n_files && strcmp(shard_names[k], shard) != 0) k++;
        if (k == w->n_files) {
            char *path = join_path(dir, shard);
            if (!path) {
                st = vq_fail(VQ_ERR_NOMEM, "%s: out of memory", index_path);
                break;
            }
            st = add_file(w, path);
            free(path);
            if (st != VQ_OK) {
                if (st == VQ_ERR_IO) {
                    /* vq_fail formats into the buffer vq_last_error reads */
                    char why[512];
                    snprintf(why, sizeof why, "%s", vq_last_error());
                    st = vq_fail(st, "%s: shard '%s' (for tensor '%s'): %s", index_path, shard, e->string, why);
                }
                break;
            }
            shard_names[k] = shard;
        }
        if (!vq_st_find(w->files[k], e->string))
            st = vq_fail(VQ_ERR_FORMAT, "%s: tensor '%s' is mapped to shard '%s', which does not hold it",
                         index_path, e->string, shard);
    }
    free(shard_names);
    cJSON_Delete(root);
    return st;
}

vq_status vq_weights_open(const char *dir, vq_weights **out) {
    *out = NULL;
    vq_weights *w = calloc(1, sizeof *w);
    char *index_path = join_path(dir, "model.safetensors.index.json");
    char *single_path = join_path(dir, "model.safetensors");
    vq_status st = VQ_OK;
    if (!w || !index_path || !single_path) {
        st = vq_fail(VQ_ERR_NOMEM, "%s: out of memory", dir);
    } else if (access(index_path, F_OK) == 0) {
        st = open_sharded(w, dir, index_path);
    } else if (access(single_path, F_OK) == 0) {
        st = add_file(w, single_path);
    } else {
        st = vq_fail(VQ_ERR_IO, "%s: neither model.safetensors nor model.safetensors.index.json is there", dir);
    }
    free(index_path);
    free(single_path);

    if (st == VQ_OK) {
        int total = 0;
        for (int i = 0; i < w->n_files; i++) total += vq_st_count(w->files[i]);
        w->all = malloc((total ? (size_t)total : 1) * sizeof *w->all);
        if (!w->all) st = vq_fail(VQ_ERR_NOMEM, "%s: out of memory", dir);
        for (int i = 0; st == VQ_OK && i < w->n_files; i++)
            for (int j = 0; j < vq_st_count(w->files[i]); j++) w->all[w->n_all++] = vq_st_at(w->files[i], j);
    }
    if (st == VQ_OK) {
        qsort(w->all, (size_t)w->n_all, sizeof *w->all, cmp_by_name);
        for (int i = 1; i < w->n_all && st == VQ_OK; i++)
            if (strcmp(w->all[i]->name, w->all[i - 1]->name) == 0)
                st = vq_fail(VQ_ERR_FORMAT, "tensor '%s' is in both %s and %s", w->all[i]->name,
                             w->all[i - 1]->file, w->all[i]->file);
    }
    if (st != VQ_OK) {
        vq_weights_close(w);
        return st;
    }
    *out = w;
    return VQ_OK;
}

int vq_weights_count(const vq_weights *w) { return w->n_all; }
const vq_st_tensor *vq_weights_at(const vq_weights *w, int i) { return w->all[i]; }

const vq_st_tensor *vq_weights_find(const vq_weights *w, const char *name) {
    int lo = 0, hi = w->n_all;
    while (lo < hi) {
        int mid = lo + (hi - lo) / 2;
        int c = strcmp(w->all[mid]->name, name);
        if (c == 0) return w->all[mid];
        if (c < 0) lo = mid + 1;
        else hi = mid;
    }
    return NULL;
}

vq_status vq_weights_expect(const vq_weights *w, const char *name, int n_dims, const int64_t *shape,
                            const vq_st_tensor **out) {
    *out = NULL;
    const vq_st_tensor *t = vq_weights_find(w, name);
    if (!t) return vq_fail(VQ_ERR_FORMAT, "tensor '%s' is missing from the checkpoint", name);
    if (t->dtype != VQ_ST_F32 && t->dtype != VQ_ST_F16 && t->dtype != VQ_ST_BF16)
        return vq_fail(VQ_ERR_UNSUPPORTED, "%s: tensor '%s' has dtype %s; supported are F32, F16, BF16", t->file,
                       name, dtype_info[t->dtype].name);
    bool same = t->n_dims == n_dims;
    for (int i = 0; same && i < n_dims; i++) same = t->shape[i] == shape[i];
    if (!same) {
        char want[160], have[160];
        format_shape(shape, n_dims, want, sizeof want);
        format_shape(t->shape, t->n_dims, have, sizeof have);
        return vq_fail(VQ_ERR_FORMAT, "%s: tensor '%s' has shape %s, expected %s", t->file, name, have, want);
    }
    *out = t;
    return VQ_OK;
}
