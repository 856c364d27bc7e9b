/*
 * Chat templates: evaluation of the parsed Jinja2 subset, and the public
 * calls (vq_chat_config_load, vq_chat_render).
 *
 * Values behave as the Python objects jinja2 hands around: strings are
 * Python str (lengths, slices and strip() count code points; whitespace is
 * Python's Unicode whitespace), numbers are int / float with Python's
 * arithmetic and printing, lists, tuples and dicts print as Python repr,
 * and a missing variable, key or attribute is jinja2's Undefined (prints
 * nothing, is false, iterates as empty, but using it in arithmetic or
 * reading an attribute of it is an error). Scoping follows jinja2: a
 * {% set %} inside a for loop is local to that iteration (hence
 * namespace()), one inside an if is not.
 *
 * What the subset lacks is refused with an error naming the construct and
 * the template line and column, never skipped: macros, {% call %},
 * filters and methods outside the list in the public header, string
 * formatting with %, and so on.
 */
#include "model/chat_template.h"
#include "model/model_internal.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* ------------------------------------------------------- arena, errors */

struct ct_chunk {
    ct_chunk *next;
    size_t used, cap;
    unsigned char *data;
};

void *ct_alloc(ct_ctx *c, size_t bytes) {
    bytes = (bytes + 15) & ~(size_t)15;
    ct_chunk *k = c->chunks;
    if (!k || k->cap - k->used < bytes) {
        size_t cap = bytes > ((size_t)64 << 10) ? bytes : (size_t)64 << 10;
        if (c->arena_bytes + cap > CT_MAX_MEMORY)
            ct_fail(c, VQ_ERR_NOMEM, SIZE_MAX, "rendering needs more than %zu MiB", CT_MAX_MEMORY >> 20);
        k = malloc(sizeof *k);
        unsigned char *data = k ? malloc(cap) : NULL;
        if (!data) {
            free(k);
            ct_fail(c, VQ_ERR_NOMEM, SIZE_MAX, "out of memory");
        }
        k->data = data;
        k->used = 0;
        k->cap = cap;
        k->next = c->chunks;
        c->chunks = k;
        c->arena_bytes += cap;
    }
    void *p = k->data + k->used;
    k->used += bytes;
    memset(p, 0, bytes);
    return p;
}

char *ct_strndup(ct_ctx *c, const char *s, size_t n) {
    char *p = ct_alloc(c, n + 1);
    memcpy(p, s, n);
    return p;
}

_Noreturn void ct_fail(ct_ctx *c, vq_status st, size_t pos, const char *fmt, ...) {
    char msg[600];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    if (pos == SIZE_MAX || !c->src) {
        snprintf(c->message, sizeof c->message, "chat template: %s", msg);
    } else {
        int line = 1, col = 1;
        for (size_t i = 0; i < pos && i < c->len; i++) {
            if (c->src[i] == '\n') line++, col = 1;
            else if (((unsigned char)c->src[i] & 0xC0) != 0x80) col++;
        }
        snprintf(c->message, sizeof c->message, "chat template line %d, column %d: %s", line, col, msg);
    }
    c->status = st;
    longjmp(c->on_error, 1);
}

void ct_enter(ct_ctx *c, size_t pos) {
    if (++c->depth > CT_MAX_DEPTH) ct_fail(c, VQ_ERR_UNSUPPORTED, pos, "nesting deeper than %d levels", CT_MAX_DEPTH);
}

void ct_leave(ct_ctx *c) { c->depth--; }

int ct_utf8_put(uint32_t cp, char *b) {
    if (cp < 0x80) return b[0] = (char)cp, 1;
    if (cp < 0x800) return b[0] = (char)(0xC0 | cp >> 6), b[1] = (char)(0x80 | (cp & 0x3F)), 2;
    if (cp < 0x10000)
        return b[0] = (char)(0xE0 | cp >> 12), b[1] = (char)(0x80 | ((cp >> 6) & 0x3F)), b[2] = (char)(0x80 | (cp & 0x3F)), 3;
    b[0] = (char)(0xF0 | cp >> 18);
    b[1] = (char)(0x80 | ((cp >> 12) & 0x3F));
    b[2] = (char)(0x80 | ((cp >> 6) & 0x3F));
    b[3] = (char)(0x80 | (cp & 0x3F));
    return 4;
}

uint32_t ct_utf8_next(const char *s, size_t n, size_t *i) {
    const unsigned char *u = (const unsigned char *)s;
    uint32_t cp = u[*i];
    int extra = cp >= 0xF0 ? 3 : cp >= 0xE0 ? 2 : cp >= 0xC0 ? 1 : 0;
    if (extra) cp &= 0x3Fu >> extra;
    (*i)++;
    for (int k = 0; k < extra && *i < n; k++) cp = cp << 6 | (u[(*i)++] & 0x3F);
    return cp;
}

/* Offset of the first byte that is not valid UTF-8 (overlongs, surrogates
 * and code points past U+10FFFF included), or SIZE_MAX when all is valid. */
static size_t utf8_invalid_at(const char *s, size_t n) {
    const unsigned char *u = (const unsigned char *)s;
    for (size_t i = 0; i < n;) {
        unsigned c0 = u[i];
        int extra = c0 < 0x80 ? 0 : c0 >= 0xC2 && c0 <= 0xDF ? 1 : c0 >= 0xE0 && c0 <= 0xEF ? 2 : c0 >= 0xF0 && c0 <= 0xF4 ? 3 : -1;
        if (extra < 0 || i + (size_t)extra >= n + (extra ? 0 : 1)) return i;
        for (int k = 1; k <= extra; k++)
            if ((u[i + (size_t)k] & 0xC0) != 0x80) return i;
        if ((c0 == 0xE0 && u[i + 1] < 0xA0) || (c0 == 0xED && u[i + 1] >= 0xA0) || (c0 == 0xF0 && u[i + 1] < 0x90) ||
            (c0 == 0xF4 && u[i + 1] >= 0x90))
            return i;
        i += (size_t)extra + 1;
    }
    return SIZE_MAX;
}

/* --------------------------------------------------------------- values */

typedef enum { V_UNDEF, V_NONE, V_BOOL, V_INT, V_FLOAT, V_STR, V_LIST, V_DICT, V_NS, V_FUNC, V_LOOP } vtype;

static const char *const type_names[] = {"Undefined", "NoneType", "bool", "int", "float", "str", "list",
                                         "dict", "Namespace", "function", "LoopContext"};

typedef struct val val;
typedef struct {
    const char *k;
    size_t kn;
    val *v;
} pair;

struct val {
    vtype t;
    bool tuple;       /* V_LIST written (a, b): prints with parentheses */
    int64_t i;        /* V_BOOL, V_INT; V_FUNC: which function */
    double f;
    const char *s;    /* V_STR; V_UNDEF: what was missing, for messages */
    size_t n;
    val **items;      /* V_LIST */
    int n_items;
    pair *pairs;      /* V_DICT, V_NS, in insertion order as Python keeps them */
    int n_pairs, cap_pairs;
    val *self;        /* V_FUNC: the bound object; V_LOOP: the list iterated */
    int index;        /* V_LOOP */
};

typedef struct scope {
    struct scope *parent;
    pair *vars;
    int n, cap;
} scope;

typedef struct {
    ct_ctx *c;
    scope *top;
    int jump;        /* S_BREAK or S_CONTINUE on its way out to the loop, else 0 */
} rctx;

/* The callables: globals and the methods of str and dict. */
enum { F_RAISE, F_STRFTIME, F_NAMESPACE, F_STRIP, F_LSTRIP, F_RSTRIP, F_STARTSWITH, F_ENDSWITH, F_SPLIT, F_UPPER,
       F_LOWER, F_REPLACE, F_ITEMS, F_KEYS, F_VALUES, F_GET, F_COUNT };
static const char *const fn_names[F_COUNT] = {"raise_exception", "strftime_now", "namespace", "strip", "lstrip",
                                              "rstrip", "startswith", "endswith", "split", "upper",
                                              "lower", "replace", "items", "keys", "values", "get"};

static val *mk(rctx *r, vtype t) {
    val *v = ct_alloc(r->c, sizeof *v);
    v->t = t;
    return v;
}
static val *mk_bool(rctx *r, bool b) {
    val *v = mk(r, V_BOOL);
    v->i = b;
    return v;
}
static val *mk_int(rctx *r, int64_t i) {
    val *v = mk(r, V_INT);
    v->i = i;
    return v;
}
static val *mk_float(rctx *r, double f) {
    val *v = mk(r, V_FLOAT);
    v->f = f;
    return v;
}
static val *mk_str(rctx *r, const char *s, size_t n) {
    val *v = mk(r, V_STR);
    v->s = s;
    v->n = n;
    return v;
}
static val *mk_undef(rctx *r, const char *what) {
    val *v = mk(r, V_UNDEF);
    v->s = what;
    return v;
}
static val *mk_list(rctx *r, int n) {
    val *v = mk(r, V_LIST);
    v->items = ct_alloc(r->c, sizeof *v->items * (size_t)(n ? n : 1));
    v->n_items = n;
    return v;
}
static val *mk_func(rctx *r, int fn, val *self) {
    val *v = mk(r, V_FUNC);
    v->i = fn;
    v->self = self;
    return v;
}

/* Sets key k in a list of pairs (a dict, a namespace or a scope), replacing
 * an existing entry; the list grows by doubling in the render's arena. */
static void pairs_set(rctx *r, pair **list, int *n, int *cap, const char *k, size_t kn, val *v) {
    for (int i = 0; i < *n; i++)
        if ((*list)[i].kn == kn && memcmp((*list)[i].k, k, kn) == 0) {
            (*list)[i].v = v;
            return;
        }
    if (*n == *cap) {
        int nc = *cap ? *cap * 2 : 4;
        pair *p = ct_alloc(r->c, sizeof *p * (size_t)nc);
        if (*n) memcpy(p, *list, sizeof *p * (size_t)*n);
        *list = p;
        *cap = nc;
    }
    (*list)[(*n)++] = (pair){k, kn, v};
}

/* Sets key in a dict or namespace. */
static void dict_set(rctx *r, val *d, const char *k, size_t kn, val *v) {
    pairs_set(r, &d->pairs, &d->n_pairs, &d->cap_pairs, k, kn, v);
}

static val *dict_get(const val *d, const char *k, size_t kn) {
    for (int i = 0; i < d->n_pairs; i++)
        if (d->pairs[i].kn == kn && memcmp(d->pairs[i].k, k, kn) == 0) return d->pairs[i].v;
    return NULL;
}

static void scope_set(rctx *r, scope *s, const char *name, val *v) {
    pairs_set(r, &s->vars, &s->n, &s->cap, name, strlen(name), v);
}

static val *lookup(rctx *r, const char *name, size_t n) {
    for (scope *s = r->top; s; s = s->parent)
        for (int i = s->n - 1; i >= 0; i--)
            if (s->vars[i].kn == n && memcmp(s->vars[i].k, name, n) == 0) return s->vars[i].v;
    return NULL;
}

/* ------------------------------------------------------ string builder */

typedef struct {
    char *p;
    size_t n, cap;
} sb;

static void sb_put(rctx *r, sb *b, const char *s, size_t n) {
    if (b->n + n + 1 > b->cap) {
        size_t cap = b->cap * 2 > b->n + n + 64 ? b->cap * 2 : b->n + n + 64;
        if (cap > CT_MAX_OUTPUT) ct_fail(r->c, VQ_ERR_NOMEM, SIZE_MAX, "a string grows past %zu MiB", CT_MAX_OUTPUT >> 20);
        char *p = ct_alloc(r->c, cap);
        if (b->n) memcpy(p, b->p, b->n);
        b->p = p;
        b->cap = cap;
    }
    memcpy(b->p + b->n, s, n);
    b->n += n;
    b->p[b->n] = 0;
}
static void sb_str(rctx *r, sb *b, const char *s) { sb_put(r, b, s, strlen(s)); }
static val *sb_val(rctx *r, sb *b) { return mk_str(r, b->p ? b->p : "", b->n); }

/* --------------------------------------------------- Python formatting */

static void put_char(char *buf, size_t size, size_t *o, char ch) {
    if (*o + 1 < size) buf[(*o)++] = ch;
    buf[*o] = 0;
}

/* repr(float) / str(float): the shortest digits that read back the same,
 * fixed notation for exponents in [-4, 16), else d.ddde+XX. */
static void py_float(double x, char *buf, size_t size) {
    if (isnan(x)) {
        snprintf(buf, size, "nan");
        return;
    }
    if (isinf(x)) {
        snprintf(buf, size, x < 0 ? "-inf" : "inf");
        return;
    }
    char e[40];
    int prec = 1;
    for (; prec <= 17; prec++) {
        snprintf(e, sizeof e, "%.*e", prec - 1, x);
        if (strtod(e, NULL) == x) break;
    }
    /* e is [-]d[.ddd]e[+-]XX */
    char digits[24];
    int nd = 0, exp10;
    const char *q = e;
    bool neg = *q == '-';
    if (neg) q++;
    for (; *q && *q != 'e'; q++)
        if (*q != '.') digits[nd++] = *q;
    exp10 = atoi(q + 1);
    while (nd > 1 && digits[nd - 1] == '0') nd--;
    digits[nd] = 0;
    size_t o = 0;
    if (neg) put_char(buf, size, &o, '-');
    if (exp10 >= -4 && exp10 < 16) {
        if (exp10 < 0) {
            put_char(buf, size, &o, '0');
            put_char(buf, size, &o, '.');
            for (int k = 0; k < -exp10 - 1; k++) put_char(buf, size, &o, '0');
            for (int k = 0; k < nd; k++) put_char(buf, size, &o, digits[k]);
        } else {
            for (int k = 0; k <= exp10; k++) put_char(buf, size, &o, k < nd ? digits[k] : '0');
            put_char(buf, size, &o, '.');
            if (nd > exp10 + 1)
                for (int k = exp10 + 1; k < nd; k++) put_char(buf, size, &o, digits[k]);
            else
                put_char(buf, size, &o, '0');
        }
    } else {
        put_char(buf, size, &o, digits[0]);
        if (nd > 1) put_char(buf, size, &o, '.');
        for (int k = 1; k < nd; k++) put_char(buf, size, &o, digits[k]);
        char ex[16];
        snprintf(ex, sizeof ex, "e%c%02d", exp10 < 0 ? '-' : '+', exp10 < 0 ? -exp10 : exp10);
        for (int k = 0; ex[k]; k++) put_char(buf, size, &o, ex[k]);
    }
}

bool ct_py_space(uint32_t cp) {
    return (cp >= 9 && cp <= 13) || (cp >= 0x1C && cp <= 0x20) || cp == 0x85 || cp == 0xA0 || cp == 0x1680 ||
           (cp >= 0x2000 && cp <= 0x200A) || cp == 0x2028 || cp == 0x2029 || cp == 0x202F || cp == 0x205F ||
           cp == 0x3000;
}

/* Code points repr() escapes: controls, Unicode spaces other than ' ', and
 * the common format characters. (Python escapes every non-printable code
 * point; rarer unassigned or private-use ones print raw here.) */
static bool py_unprintable(uint32_t cp) {
    return cp < 0x20 || (cp >= 0x7F && cp <= 0xA0) || cp == 0xAD || (ct_py_space(cp) && cp != ' ') ||
           (cp >= 0x200B && cp <= 0x200F) || (cp >= 0x202A && cp <= 0x202E) || (cp >= 0x2060 && cp <= 0x2064) ||
           cp == 0xFEFF;
}

static void repr_str(rctx *r, sb *b, const char *s, size_t n) {
    bool has_sq = memchr(s, '\'', n) != NULL, has_dq = memchr(s, '"', n) != NULL;
    char q = has_sq && !has_dq ? '"' : '\'';
    sb_put(r, b, &q, 1);
    for (size_t i = 0; i < n;) {
        size_t at = i;
        uint32_t cp = ct_utf8_next(s, n, &i);
        char esc[16];
        if (cp == '\\') sb_str(r, b, "\\\\");
        else if (cp == (uint32_t)q) sb_str(r, b, q == '\'' ? "\\'" : "\\\"");
        else if (cp == '\n') sb_str(r, b, "\\n");
        else if (cp == '\r') sb_str(r, b, "\\r");
        else if (cp == '\t') sb_str(r, b, "\\t");
        else if (py_unprintable(cp)) {
            snprintf(esc, sizeof esc, cp < 0x100 ? "\\x%02x" : "\\u%04x", cp);
            sb_str(r, b, esc);
        } else {
            sb_put(r, b, s + at, i - at);
        }
    }
    sb_put(r, b, &q, 1);
}

static void to_text(rctx *r, sb *b, const val *v, bool repr, size_t pos);

/* str(v) as Python (and jinja2's output) writes it. */
static void to_text(rctx *r, sb *b, const val *v, bool repr, size_t pos) {
    char num[48];
    switch (v->t) {
    case V_UNDEF: /* jinja2 prints Undefined as nothing, inside a list as its repr */
        if (repr) sb_str(r, b, "Undefined");
        return;
    case V_NONE: sb_str(r, b, "None"); return;
    case V_BOOL: sb_str(r, b, v->i ? "True" : "False"); return;
    case V_INT: snprintf(num, sizeof num, "%lld", (long long)v->i), sb_str(r, b, num); return;
    case V_FLOAT: py_float(v->f, num, sizeof num), sb_str(r, b, num); return;
    case V_STR:
        if (repr) repr_str(r, b, v->s, v->n);
        else sb_put(r, b, v->s, v->n);
        return;
    case V_LIST:
        sb_str(r, b, v->tuple ? "(" : "[");
        for (int k = 0; k < v->n_items; k++) {
            if (k) sb_str(r, b, ", ");
            to_text(r, b, v->items[k], true, pos);
        }
        sb_str(r, b, v->tuple ? (v->n_items == 1 ? ",)" : ")") : "]");
        return;
    case V_DICT:
    case V_NS:
        sb_str(r, b, v->t == V_NS ? "<Namespace {" : "{");
        for (int k = 0; k < v->n_pairs; k++) {
            if (k) sb_str(r, b, ", ");
            repr_str(r, b, v->pairs[k].k, v->pairs[k].kn);
            sb_str(r, b, ": ");
            to_text(r, b, v->pairs[k].v, true, pos);
        }
        sb_str(r, b, v->t == V_NS ? "}>" : "}");
        return;
    case V_FUNC:
    case V_LOOP:
        ct_fail(r->c, VQ_ERR_UNSUPPORTED, pos, "printing a %s is not supported", type_names[v->t]);
    }
}

static val *str_of(rctx *r, val *v, size_t pos) {
    if (v->t == V_STR) return v;
    sb b = {0};
    to_text(r, &b, v, false, pos);
    return sb_val(r, &b);
}

/* json.dumps(v, ensure_ascii, indent, sort_keys) with Python's default
 * separators: ", " and ": " without indent, "," and ": " with it. */
static void to_json(rctx *r, sb *b, const val *v, int indent, bool ensure_ascii, bool sort_keys, int level, size_t pos) {
    char num[48];
    ct_enter(r->c, pos);
    switch (v->t) {
    case V_NONE: sb_str(r, b, "null"); break;
    case V_BOOL: sb_str(r, b, v->i ? "true" : "false"); break;
    case V_INT: snprintf(num, sizeof num, "%lld", (long long)v->i), sb_str(r, b, num); break;
    case V_FLOAT:
        if (isnan(v->f)) sb_str(r, b, "NaN");
        else if (isinf(v->f)) sb_str(r, b, v->f < 0 ? "-Infinity" : "Infinity");
        else py_float(v->f, num, sizeof num), sb_str(r, b, num);
        break;
    case V_STR:
        sb_str(r, b, "\"");
        for (size_t i = 0; i < v->n;) {
            size_t at = i;
            uint32_t cp = ct_utf8_next(v->s, v->n, &i);
            const char *esc = cp == '"' ? "\\\"" : cp == '\\' ? "\\\\" : cp == '\n' ? "\\n" : cp == '\r' ? "\\r"
                            : cp == '\t' ? "\\t" : cp == '\b' ? "\\b" : cp == '\f' ? "\\f" : NULL;
            if (esc) {
                sb_str(r, b, esc);
            } else if (cp < 0x20 || (ensure_ascii && cp > 0x7E)) {
                if (cp > 0xFFFF) {
                    snprintf(num, sizeof num, "\\u%04x\\u%04x", 0xD800 + ((cp - 0x10000) >> 10), 0xDC00 + ((cp - 0x10000) & 0x3FF));
                } else {
                    snprintf(num, sizeof num, "\\u%04x", cp);
                }
                sb_str(r, b, num);
            } else {
                sb_put(r, b, v->s + at, i - at);
            }
        }
        sb_str(r, b, "\"");
        break;
    case V_LIST:
    case V_DICT: {
        bool dict = v->t == V_DICT;
        int n = dict ? v->n_pairs : v->n_items;
        if (n == 0) {
            sb_str(r, b, dict ? "{}" : "[]");
            break;
        }
        int *order = ct_alloc(r->c, sizeof *order * (size_t)n);
        for (int k = 0; k < n; k++) order[k] = k;
        if (dict && sort_keys) /* insertion sort: dicts in templates are small */
            for (int k = 1; k < n; k++)
                for (int j = k; j > 0; j--) {
                    const pair *x = &v->pairs[order[j - 1]], *y = &v->pairs[order[j]];
                    size_t m = x->kn < y->kn ? x->kn : y->kn;
                    int cmp = memcmp(x->k, y->k, m);
                    if (cmp < 0 || (cmp == 0 && x->kn <= y->kn)) break;
                    int t = order[j];
                    order[j] = order[j - 1];
                    order[j - 1] = t;
                }
        sb_str(r, b, dict ? "{" : "[");
        for (int k = 0; k < n; k++) {
            if (k) sb_str(r, b, indent >= 0 ? "," : ", ");
            if (indent >= 0) {
                sb_str(r, b, "\n");
                for (int s = 0; s < indent * (level + 1); s++) sb_str(r, b, " ");
            }
            if (dict) {
                val key = {.t = V_STR, .s = v->pairs[order[k]].k, .n = v->pairs[order[k]].kn};
                to_json(r, b, &key, indent, ensure_ascii, sort_keys, level + 1, pos);
                sb_str(r, b, ": ");
                to_json(r, b, v->pairs[order[k]].v, indent, ensure_ascii, sort_keys, level + 1, pos);
            } else {
                to_json(r, b, v->items[k], indent, ensure_ascii, sort_keys, level + 1, pos);
            }
        }
        if (indent >= 0) {
            sb_str(r, b, "\n");
            for (int s = 0; s < indent * level; s++) sb_str(r, b, " ");
        }
        sb_str(r, b, dict ? "}" : "]");
        break;
    }
    default:
        ct_fail(r->c, VQ_ERR_FORMAT, pos, "tojson: a value of type %s is not JSON serializable", type_names[v->t]);
    }
    ct_leave(r->c);
}

/* ----------------------------------------------------- Python semantics */

static bool truthy(const val *v) {
    switch (v->t) {
    case V_UNDEF:
    case V_NONE: return false;
    case V_BOOL:
    case V_INT: return v->i != 0;
    case V_FLOAT: return v->f != 0;
    case V_STR: return v->n != 0;
    case V_LIST: return v->n_items != 0;
    case V_DICT: return v->n_pairs != 0;
    default: return true;
    }
}

static bool is_num(const val *v) { return v->t == V_BOOL || v->t == V_INT || v->t == V_FLOAT; }
static double num_of(const val *v) { return v->t == V_FLOAT ? v->f : (double)v->i; }

/* Python ==. */
static bool equal(const val *a, const val *b) {
    if (is_num(a) && is_num(b)) {
        if (a->t != V_FLOAT && b->t != V_FLOAT) return a->i == b->i;
        return num_of(a) == num_of(b);
    }
    if (a->t != b->t) return false;
    switch (a->t) {
    case V_UNDEF:
    case V_NONE: return true;
    case V_STR: return a->n == b->n && memcmp(a->s, b->s, a->n) == 0;
    case V_LIST:
        if (a->tuple != b->tuple || a->n_items != b->n_items) return false;
        for (int k = 0; k < a->n_items; k++)
            if (!equal(a->items[k], b->items[k])) return false;
        return true;
    case V_DICT:
        if (a->n_pairs != b->n_pairs) return false;
        for (int k = 0; k < a->n_pairs; k++) {
            const val *other = dict_get(b, a->pairs[k].k, a->pairs[k].kn);
            if (!other || !equal(a->pairs[k].v, other)) return false;
        }
        return true;
    default: return a == b;
    }
}

/* Python's <, for the types that order: -1, 0 or 1. */
static int order(rctx *r, const val *a, const val *b, const char *op, size_t pos) {
    if (is_num(a) && is_num(b)) {
        if (a->t != V_FLOAT && b->t != V_FLOAT) return a->i < b->i ? -1 : a->i > b->i;
        double x = num_of(a), y = num_of(b);
        return x < y ? -1 : x > y;
    }
    if (a->t == V_STR && b->t == V_STR) {
        size_t m = a->n < b->n ? a->n : b->n;
        int cmp = memcmp(a->s, b->s, m);
        return cmp ? (cmp < 0 ? -1 : 1) : (a->n < b->n ? -1 : a->n > b->n);
    }
    if (a->t == V_LIST && b->t == V_LIST && a->tuple == b->tuple) {
        for (int k = 0; k < a->n_items && k < b->n_items; k++)
            if (!equal(a->items[k], b->items[k])) return order(r, a->items[k], b->items[k], op, pos);
        return a->n_items < b->n_items ? -1 : a->n_items > b->n_items;
    }
    ct_fail(r->c, VQ_ERR_FORMAT, pos, "'%s' is not supported between a %s and a %s", op, type_names[a->t], type_names[b->t]);
}

static _Noreturn void undefined_error(rctx *r, const val *v, size_t pos) {
    if (v->s) ct_fail(r->c, VQ_ERR_FORMAT, pos, "'%s' is undefined", v->s);
    ct_fail(r->c, VQ_ERR_FORMAT, pos, "a value is undefined");
}

/* Code point count and the byte offset of each code point of a string. */
static size_t *cp_offsets(rctx *r, const val *s, size_t *count) {
    size_t n = 0;
    for (size_t i = 0; i < s->n; i++) n += ((unsigned char)s->s[i] & 0xC0) != 0x80;
    size_t *off = ct_alloc(r->c, sizeof *off * (n + 1));
    size_t k = 0;
    for (size_t i = 0; i < s->n; i++)
        if (((unsigned char)s->s[i] & 0xC0) != 0x80) off[k++] = i;
    off[n] = s->n;
    *count = n;
    return off;
}

static int64_t checked(rctx *r, bool overflow, int64_t v, size_t pos) {
    if (overflow) ct_fail(r->c, VQ_ERR_UNSUPPORTED, pos, "integer overflow (64-bit integers only)");
    return v;
}

static val *arith(rctx *r, const char *op, val *a, val *b, size_t pos) {
    if (a->t == V_UNDEF) undefined_error(r, a, pos);
    if (b->t == V_UNDEF) undefined_error(r, b, pos);
    char o = op[0];
    bool two = op[1] != 0;
    if (is_num(a) && is_num(b)) {
        bool ints = a->t != V_FLOAT && b->t != V_FLOAT;
        int64_t x = a->i, y = b->i, z = 0;
        double fx = num_of(a), fy = num_of(b);
        if ((o == '/' || o == '%') && (ints ? y == 0 : fy == 0))
            ct_fail(r->c, VQ_ERR_FORMAT, pos, "division by zero");
        if (o == '+' && !ints) return mk_float(r, fx + fy);
        if (o == '-' && !ints) return mk_float(r, fx - fy);
        if (o == '*' && !two && !ints) return mk_float(r, fx * fy);
        bool overflow = false;
        if (o == '+') overflow = __builtin_add_overflow(x, y, &z);
        else if (o == '-') overflow = __builtin_sub_overflow(x, y, &z);
        else if (o == '*' && !two) overflow = __builtin_mul_overflow(x, y, &z);
        if ((o == '+' || o == '-' || (o == '*' && !two))) return mk_int(r, checked(r, overflow, z, pos));
        if (o == '/' && !two) return mk_float(r, fx / fy);
        if (o == '/' || o == '%') { /* floor division and modulo round toward minus infinity */
            if (ints) {
                if (x == INT64_MIN && y == -1) checked(r, true, 0, pos);
                int64_t q = x / y, m = x % y;
                if (m != 0 && ((m < 0) != (y < 0))) q--, m += y;
                return mk_int(r, o == '/' ? q : m);
            }
            double q = floor(fx / fy), m = fx - q * fy;
            return mk_float(r, o == '/' ? q : m);
        }
        if (o == '*' && two) {
            if (ints && y >= 0) {
                int64_t acc = 1;
                for (int64_t k = 0; k < y; k++) {
                    if (__builtin_mul_overflow(acc, x, &acc)) checked(r, true, 0, pos);
                    if (acc == 0 || acc == 1) break;
                }
                return mk_int(r, acc);
            }
            return mk_float(r, pow(fx, fy));
        }
    }
    if (o == '+' && a->t == V_STR && b->t == V_STR) {
        sb s = {0};
        sb_put(r, &s, a->s, a->n);
        sb_put(r, &s, b->s, b->n);
        return sb_val(r, &s);
    }
    if (o == '+' && a->t == V_LIST && b->t == V_LIST && a->tuple == b->tuple) {
        val *l = mk_list(r, a->n_items + b->n_items);
        l->tuple = a->tuple;
        memcpy(l->items, a->items, sizeof *l->items * (size_t)a->n_items);
        memcpy(l->items + a->n_items, b->items, sizeof *l->items * (size_t)b->n_items);
        return l;
    }
    if (o == '%' && a->t == V_STR)
        ct_fail(r->c, VQ_ERR_UNSUPPORTED, pos, "string formatting with '%%' is not supported");
    if (o == '*' && !two && (a->t == V_INT || a->t == V_BOOL) && (b->t == V_STR || b->t == V_LIST)) {
        val *t = a; /* int * str repeats as str * int does */
        a = b;
        b = t;
    }
    if (o == '*' && !two && ((a->t == V_STR || a->t == V_LIST) && (b->t == V_INT || b->t == V_BOOL))) {
        int64_t times = b->i < 0 ? 0 : b->i;
        size_t unit = a->t == V_STR ? a->n : (size_t)a->n_items * sizeof(val *);
        if (times > 0 && unit > CT_MAX_OUTPUT / (size_t)times)
            ct_fail(r->c, VQ_ERR_NOMEM, pos, "repetition makes a value past %zu MiB", CT_MAX_OUTPUT >> 20);
        if (a->t == V_STR) {
            sb s = {0};
            sb_put(r, &s, "", 0);
            for (int64_t k = 0; k < times; k++) sb_put(r, &s, a->s, a->n);
            return sb_val(r, &s);
        }
        val *l = mk_list(r, (int)(a->n_items * times));
        for (int64_t k = 0; k < times; k++) memcpy(l->items + k * a->n_items, a->items, sizeof *l->items * (size_t)a->n_items);
        return l;
    }
    ct_fail(r->c, VQ_ERR_FORMAT, pos, "unsupported operand types for %s: %s and %s", op, type_names[a->t], type_names[b->t]);
}

static bool contains(rctx *r, val *hay, val *needle, size_t pos) {
    switch (hay->t) {
    case V_UNDEF: return false;
    case V_STR:
        if (needle->t != V_STR) ct_fail(r->c, VQ_ERR_FORMAT, pos, "'in <string>' needs a string on the left, not a %s", type_names[needle->t]);
        if (needle->n == 0) return true;
        for (size_t i = 0; i + needle->n <= hay->n; i++)
            if (memcmp(hay->s + i, needle->s, needle->n) == 0) return true;
        return false;
    case V_LIST:
        for (int k = 0; k < hay->n_items; k++)
            if (equal(hay->items[k], needle)) return true;
        return false;
    case V_DICT: return needle->t == V_STR && dict_get(hay, needle->s, needle->n) != NULL;
    default: ct_fail(r->c, VQ_ERR_FORMAT, pos, "argument of type %s is not iterable", type_names[hay->t]);
    }
}

/* The items a for loop (or a filter) walks: a list's items, a dict's keys,
 * a string's characters; nothing for Undefined. */
static val *iterable(rctx *r, val *v, size_t pos) {
    if (v->t == V_LIST) return v;
    if (v->t == V_UNDEF) return mk_list(r, 0);
    if (v->t == V_DICT) {
        val *l = mk_list(r, v->n_pairs);
        for (int k = 0; k < v->n_pairs; k++) l->items[k] = mk_str(r, v->pairs[k].k, v->pairs[k].kn);
        return l;
    }
    if (v->t == V_STR) {
        size_t n, *off = cp_offsets(r, v, &n);
        val *l = mk_list(r, (int)n);
        for (size_t k = 0; k < n; k++) l->items[k] = mk_str(r, v->s + off[k], off[k + 1] - off[k]);
        return l;
    }
    ct_fail(r->c, VQ_ERR_FORMAT, pos, "a %s is not iterable", type_names[v->t]);
}

/* ------------------------------------------------------ string methods */

/* Python's str.strip / lstrip / rstrip: chars NULL means whitespace. */
static val *py_strip(rctx *r, val *s, const val *chars, bool left, bool right) {
    size_t cn = 0, *coff = NULL;
    if (chars) coff = cp_offsets(r, chars, &cn);
    size_t b = 0, e = s->n;
    if (left)
        while (b < e) {
            size_t i = b;
            uint32_t cp = ct_utf8_next(s->s, e, &i);
            bool in = !chars ? ct_py_space(cp) : false;
            for (size_t k = 0; chars && k < cn && !in; k++) {
                size_t j = coff[k];
                in = ct_utf8_next(chars->s, chars->n, &j) == cp;
            }
            if (!in) break;
            b = i;
        }
    if (right)
        while (e > b) {
            size_t start = e - 1;
            while (start > b && ((unsigned char)s->s[start] & 0xC0) == 0x80) start--;
            size_t i = start;
            uint32_t cp = ct_utf8_next(s->s, e, &i);
            bool in = !chars ? ct_py_space(cp) : false;
            for (size_t k = 0; chars && k < cn && !in; k++) {
                size_t j = coff[k];
                in = ct_utf8_next(chars->s, chars->n, &j) == cp;
            }
            if (!in) break;
            e = start;
        }
    return mk_str(r, s->s + b, e - b);
}

/* Python's str.split(sep, maxsplit). */
static val *py_split(rctx *r, val *s, const val *sep, int64_t maxsplit, size_t pos) {
    val **parts = ct_alloc(r->c, sizeof *parts * (s->n + 2));
    int n = 0;
    if (!sep) {
        size_t i = 0;
        for (;;) {
            while (i < s->n) { /* skip whitespace */
                size_t j = i;
                if (!ct_py_space(ct_utf8_next(s->s, s->n, &j))) break;
                i = j;
            }
            if (i >= s->n) break;
            if (maxsplit >= 0 && n == maxsplit) {
                size_t e = s->n;
                parts[n++] = mk_str(r, s->s + i, e - i);
                break;
            }
            size_t start = i;
            while (i < s->n) {
                size_t j = i;
                if (ct_py_space(ct_utf8_next(s->s, s->n, &j))) break;
                i = j;
            }
            parts[n++] = mk_str(r, s->s + start, i - start);
        }
    } else {
        if (sep->n == 0) ct_fail(r->c, VQ_ERR_FORMAT, pos, "split: empty separator");
        size_t start = 0;
        for (size_t i = 0; i + sep->n <= s->n;) {
            if ((maxsplit < 0 || n < maxsplit) && memcmp(s->s + i, sep->s, sep->n) == 0) {
                parts[n++] = mk_str(r, s->s + start, i - start);
                i += sep->n;
                start = i;
            } else {
                i++;
            }
        }
        parts[n++] = mk_str(r, s->s + start, s->n - start);
    }
    val *l = mk_list(r, n);
    memcpy(l->items, parts, sizeof *parts * (size_t)n);
    return l;
}

static val *py_replace(rctx *r, val *s, val *old, val *new, int64_t count) {
    sb b = {0};
    sb_put(r, &b, "", 0);
    int64_t done = 0;
    if (old->n == 0) { /* Python puts new before every character and at the end */
        size_t n, *off = cp_offsets(r, s, &n);
        for (size_t k = 0; k <= n; k++) {
            if (count < 0 || done < count) sb_put(r, &b, new->s, new->n), done++;
            if (k < n) sb_put(r, &b, s->s + off[k], off[k + 1] - off[k]);
        }
        return sb_val(r, &b);
    }
    size_t i = 0, start = 0;
    while (i + old->n <= s->n && (count < 0 || done < count)) {
        if (memcmp(s->s + i, old->s, old->n) == 0) {
            sb_put(r, &b, s->s + start, i - start);
            sb_put(r, &b, new->s, new->n);
            i += old->n;
            start = i;
            done++;
        } else {
            i++;
        }
    }
    sb_put(r, &b, s->s + start, s->n - start);
    return sb_val(r, &b);
}

static val *ascii_case(rctx *r, val *s, bool upper, const char *name, size_t pos) {
    char *p = ct_strndup(r->c, s->s, s->n);
    for (size_t i = 0; i < s->n; i++) {
        unsigned char ch = (unsigned char)p[i];
        if (ch >= 0x80) ct_fail(r->c, VQ_ERR_UNSUPPORTED, pos, "%s of non-ASCII text is not supported", name);
        if (upper && ch >= 'a' && ch <= 'z') p[i] = (char)(ch - 32);
        if (!upper && ch >= 'A' && ch <= 'Z') p[i] = (char)(ch + 32);
    }
    return mk_str(r, p, s->n);
}

static bool affix(const val *s, const val *a, bool start) {
    if (a->n > s->n) return false;
    return memcmp(start ? s->s : s->s + s->n - a->n, a->s, a->n) == 0;
}

/* --------------------------------------------------------- call args */

#define MAX_ARGS 8

typedef struct {
    val *pos[MAX_ARGS];
    int n_pos;
    const char *kw[MAX_ARGS];
    val *kv[MAX_ARGS];
    int n_kw;
} args;

static val *eval(rctx *r, ct_expr *e);

static void eval_args(rctx *r, ct_expr *e, args *a) {
    memset(a, 0, sizeof *a);
    if (e->n_args > MAX_ARGS) ct_fail(r->c, VQ_ERR_UNSUPPORTED, e->pos, "more than %d arguments", MAX_ARGS);
    for (int k = 0; k < e->n_args; k++) {
        val *v = eval(r, e->args[k]);
        if (e->names && e->names[k]) {
            a->kw[a->n_kw] = e->names[k];
            a->kv[a->n_kw++] = v;
        } else {
            a->pos[a->n_pos++] = v;
        }
    }
}

/* Argument i (positional) or keyword name; NULL when not given. Checks
 * that no more than max positional arguments came and that every keyword
 * is one of the names in kws (a NULL-terminated list). */
static void check_args(rctx *r, const args *a, const char *fname, int max_pos, const char *const *kws, size_t pos) {
    if (a->n_pos > max_pos)
        ct_fail(r->c, VQ_ERR_UNSUPPORTED, pos, "%s takes at most %d positional argument%s, %d given", fname, max_pos,
                max_pos == 1 ? "" : "s", a->n_pos);
    for (int k = 0; k < a->n_kw; k++) {
        bool known = false;
        for (int j = 0; kws && kws[j] && !known; j++) known = strcmp(kws[j], a->kw[k]) == 0;
        if (!known) ct_fail(r->c, VQ_ERR_UNSUPPORTED, pos, "%s: keyword argument '%s' is not supported", fname, a->kw[k]);
    }
}

static val *arg(const args *a, int i, const char *name) {
    if (i >= 0 && i < a->n_pos) return a->pos[i];
    for (int k = 0; name && k < a->n_kw; k++)
        if (strcmp(a->kw[k], name) == 0) return a->kv[k];
    return NULL;
}

static val *want(rctx *r, val *v, vtype t, const char *what, size_t pos) {
    if (!v) ct_fail(r->c, VQ_ERR_FORMAT, pos, "%s is missing", what);
    if (v->t == V_BOOL && t == V_INT) return v;
    if (v->t != t) ct_fail(r->c, VQ_ERR_FORMAT, pos, "%s must be a %s, not a %s", what, type_names[t], type_names[v->t]);
    return v;
}

static val *call(rctx *r, val *f, const args *a, size_t pos) {
    val *self = f->self;
    const char *name = fn_names[f->i];
    switch (f->i) {
    case F_RAISE: {
        check_args(r, a, name, 1, NULL, pos);
        val *msg = a->n_pos ? str_of(r, a->pos[0], pos) : mk_str(r, "", 0);
        ct_fail(r->c, VQ_ERR_ARG, pos, "raise_exception: %.*s", (int)(msg->n < 400 ? msg->n : 400), msg->s);
    }
    case F_STRFTIME: {
        check_args(r, a, name, 1, NULL, pos);
        val *fmt = want(r, arg(a, 0, NULL), V_STR, "strftime_now's format", pos);
        time_t now = time(NULL);
        struct tm tmv;
        char buf[256];
        char *cfmt = ct_strndup(r->c, fmt->s, fmt->n);
        size_t n = localtime_r(&now, &tmv) ? strftime(buf, sizeof buf, cfmt, &tmv) : 0;
        return mk_str(r, ct_strndup(r->c, buf, n), n);
    }
    case F_NAMESPACE: {
        val *ns = mk(r, V_NS);
        if (a->n_pos > 1) ct_fail(r->c, VQ_ERR_UNSUPPORTED, pos, "namespace() takes at most one positional argument (a dict)");
        if (a->n_pos) {
            val *d = want(r, a->pos[0], V_DICT, "namespace's argument", pos);
            for (int k = 0; k < d->n_pairs; k++) dict_set(r, ns, d->pairs[k].k, d->pairs[k].kn, d->pairs[k].v);
        }
        for (int k = 0; k < a->n_kw; k++) dict_set(r, ns, a->kw[k], strlen(a->kw[k]), a->kv[k]);
        return ns;
    }
    case F_STRIP:
    case F_LSTRIP:
    case F_RSTRIP: {
        check_args(r, a, name, 1, NULL, pos);
        val *chars = arg(a, 0, NULL);
        if (chars && chars->t == V_NONE) chars = NULL;
        if (chars) want(r, chars, V_STR, "the characters to strip", pos);
        return py_strip(r, self, chars, f->i != F_RSTRIP, f->i != F_LSTRIP);
    }
    case F_STARTSWITH:
    case F_ENDSWITH: {
        check_args(r, a, name, 1, NULL, pos);
        val *x = arg(a, 0, NULL);
        if (!x) ct_fail(r->c, VQ_ERR_FORMAT, pos, "%s needs a prefix", name);
        if (x->t == V_LIST && x->tuple) {
            for (int k = 0; k < x->n_items; k++)
                if (affix(self, want(r, x->items[k], V_STR, "each prefix", pos), f->i == F_STARTSWITH)) return mk_bool(r, true);
            return mk_bool(r, false);
        }
        return mk_bool(r, affix(self, want(r, x, V_STR, "the prefix", pos), f->i == F_STARTSWITH));
    }
    case F_SPLIT: {
        static const char *const kws[] = {"sep", "maxsplit", NULL};
        check_args(r, a, name, 2, kws, pos);
        val *sep = arg(a, 0, "sep"), *maxsplit = arg(a, 1, "maxsplit");
        if (sep && sep->t == V_NONE) sep = NULL;
        if (sep) want(r, sep, V_STR, "split's separator", pos);
        return py_split(r, self, sep, maxsplit ? want(r, maxsplit, V_INT, "maxsplit", pos)->i : -1, pos);
    }
    case F_UPPER:
    case F_LOWER:
        check_args(r, a, name, 0, NULL, pos);
        return ascii_case(r, self, f->i == F_UPPER, name, pos);
    case F_REPLACE: {
        check_args(r, a, name, 3, NULL, pos);
        val *old = want(r, arg(a, 0, NULL), V_STR, "replace's first argument", pos);
        val *new = want(r, arg(a, 1, NULL), V_STR, "replace's second argument", pos);
        val *count = arg(a, 2, NULL);
        return py_replace(r, self, old, new, count ? want(r, count, V_INT, "replace's count", pos)->i : -1);
    }
    case F_ITEMS:
    case F_KEYS:
    case F_VALUES: {
        check_args(r, a, name, 0, NULL, pos);
        val *l = mk_list(r, self->n_pairs);
        for (int k = 0; k < self->n_pairs; k++) {
            val *key = mk_str(r, self->pairs[k].k, self->pairs[k].kn);
            if (f->i == F_ITEMS) {
                val *t = mk_list(r, 2);
                t->tuple = true;
                t->items[0] = key;
                t->items[1] = self->pairs[k].v;
                l->items[k] = t;
            } else {
                l->items[k] = f->i == F_KEYS ? key : self->pairs[k].v;
            }
        }
        return l;
    }
    case F_GET: {
        check_args(r, a, name, 2, NULL, pos);
        val *key = arg(a, 0, NULL), *dflt = arg(a, 1, NULL);
        if (!key) ct_fail(r->c, VQ_ERR_FORMAT, pos, "get needs a key");
        val *v = key->t == V_STR ? dict_get(self, key->s, key->n) : NULL;
        return v ? v : dflt ? dflt : mk(r, V_NONE);
    }
    default:
        ct_fail(r->c, VQ_ERR_UNSUPPORTED, pos, "calling %s is not supported", name);
    }
}

/* ------------------------------------------------------ attribute / item */

static const char *const str_methods_missing[] = {
    "capitalize", "casefold", "center", "count", "encode", "expandtabs", "find", "format", "format_map", "index",
    "isalnum", "isalpha", "isascii", "isdecimal", "isdigit", "isidentifier", "islower", "isnumeric", "isprintable",
    "isspace", "istitle", "isupper", "join", "ljust", "partition", "removeprefix", "removesuffix", "rfind", "rindex",
    "rjust", "rpartition", "rsplit", "splitlines", "swapcase", "title", "translate", "zfill", NULL};
static const char *const dict_methods_missing[] = {"clear", "copy", "fromkeys", "pop", "popitem", "setdefault", "update", NULL};
static const char *const list_methods_missing[] = {"append", "clear", "copy", "count", "extend", "index", "insert",
                                                   "pop", "remove", "reverse", "sort", NULL};

static bool in_list(const char *const *names, const char *s, size_t n) {
    for (int k = 0; names[k]; k++)
        if (strlen(names[k]) == n && memcmp(names[k], s, n) == 0) return true;
    return false;
}

/* A method of a str or dict by name, or NULL. */
static val *method(rctx *r, val *obj, const char *name, size_t n, size_t pos) {
    int lo = obj->t == V_STR ? F_STRIP : F_ITEMS, hi = obj->t == V_STR ? F_REPLACE : F_GET;
    for (int f = lo; f <= hi; f++)
        if (strlen(fn_names[f]) == n && memcmp(fn_names[f], name, n) == 0) return mk_func(r, f, obj);
    const char *const *missing = obj->t == V_STR ? str_methods_missing : dict_methods_missing;
    if (in_list(missing, name, n))
        ct_fail(r->c, VQ_ERR_UNSUPPORTED, pos, "the %s method '%.*s' is not supported", type_names[obj->t], (int)n, name);
    return NULL;
}

static val *loop_attr(rctx *r, val *l, const char *name, size_t n, size_t pos) {
    int i = l->index, len = l->self->n_items;
    static const char *const names[] = {"index", "index0", "revindex", "revindex0", "first", "last", "length",
                                        "previtem", "nextitem", "depth", "depth0", NULL};
    int which = -1;
    for (int k = 0; names[k] && which < 0; k++)
        if (strlen(names[k]) == n && memcmp(names[k], name, n) == 0) which = k;
    switch (which) {
    case 0: return mk_int(r, i + 1);
    case 1: return mk_int(r, i);
    case 2: return mk_int(r, len - i);
    case 3: return mk_int(r, len - i - 1);
    case 4: return mk_bool(r, i == 0);
    case 5: return mk_bool(r, i == len - 1);
    case 6: return mk_int(r, len);
    case 7: return i > 0 ? l->self->items[i - 1] : mk_undef(r, "loop.previtem");
    case 8: return i + 1 < len ? l->self->items[i + 1] : mk_undef(r, "loop.nextitem");
    case 9: return mk_int(r, 1);
    case 10: return mk_int(r, 0);
    default: break;
    }
    if ((n == 5 && memcmp(name, "cycle", 5) == 0) || (n == 7 && memcmp(name, "changed", 7) == 0))
        ct_fail(r->c, VQ_ERR_UNSUPPORTED, pos, "loop.%.*s is not supported", (int)n, name);
    return mk_undef(r, "loop attribute");
}

/* obj.name (attr) or obj["name"] (!attr): jinja2 tries the attribute first
 * for ".", the item first for "[]"; a miss is Undefined. */
static val *get_named(rctx *r, val *obj, const char *name, size_t n, bool attr, size_t pos) {
    val *v;
    switch (obj->t) {
    case V_UNDEF:
        if (obj->s) ct_fail(r->c, VQ_ERR_FORMAT, pos, "'%s' is undefined (reading '%.*s' of it)", obj->s, (int)n, name);
        ct_fail(r->c, VQ_ERR_FORMAT, pos, "reading '%.*s' of an undefined value", (int)n, name);
    case V_DICT:
        if (attr && (v = method(r, obj, name, n, pos))) return v;
        if ((v = dict_get(obj, name, n))) return v;
        if (!attr && (v = method(r, obj, name, n, pos))) return v;
        break;
    case V_NS:
        if ((v = dict_get(obj, name, n))) return v;
        break;
    case V_STR:
        if ((v = method(r, obj, name, n, pos))) return v;
        break;
    case V_LIST:
        if (in_list(list_methods_missing, name, n))
            ct_fail(r->c, VQ_ERR_UNSUPPORTED, pos, "the list method '%.*s' is not supported", (int)n, name);
        break;
    case V_LOOP: return loop_attr(r, obj, name, n, pos);
    default: break;
    }
    return mk_undef(r, ct_strndup(r->c, name, n));
}

static val *get_index(rctx *r, val *obj, val *key, size_t pos) {
    if (obj->t == V_UNDEF) undefined_error(r, obj, pos);
    if (key->t == V_STR) return get_named(r, obj, key->s, key->n, false, pos);
    if ((key->t == V_INT || key->t == V_BOOL) && (obj->t == V_LIST || obj->t == V_STR)) {
        int64_t i = key->i;
        if (obj->t == V_LIST) {
            if (i < 0) i += obj->n_items;
            return i >= 0 && i < obj->n_items ? obj->items[i] : mk_undef(r, "list index out of range");
        }
        size_t n, *off = cp_offsets(r, obj, &n);
        if (i < 0) i += (int64_t)n;
        return i >= 0 && (size_t)i < n ? mk_str(r, obj->s + off[i], off[i + 1] - off[i]) : mk_undef(r, "string index out of range");
    }
    return mk_undef(r, "item");
}

static int64_t slice_bound(rctx *r, val *v, size_t pos) { return want(r, v, V_INT, "a slice bound", pos)->i; }

/* A given slice bound, clamped as Python's PySlice_AdjustIndices does. */
static int64_t slice_adjust(int64_t i, int64_t len, int64_t step) {
    if (i < 0) {
        i += len;
        if (i < 0) i = step < 0 ? -1 : 0;
    } else if (i >= len) {
        i = step < 0 ? len - 1 : len;
    }
    return i;
}

/* Python slicing of a list or string: s[start:stop:step]. */
static val *get_slice(rctx *r, val *obj, val *start_v, val *stop_v, val *step_v, size_t pos) {
    if (obj->t == V_UNDEF) undefined_error(r, obj, pos);
    if (obj->t != V_LIST && obj->t != V_STR) ct_fail(r->c, VQ_ERR_FORMAT, pos, "a %s cannot be sliced", type_names[obj->t]);
    size_t n_cp = 0, *off = NULL;
    if (obj->t == V_STR) off = cp_offsets(r, obj, &n_cp);
    int64_t len = obj->t == V_LIST ? obj->n_items : (int64_t)n_cp;
    int64_t step = step_v && step_v->t != V_NONE ? slice_bound(r, step_v, pos) : 1;
    if (step == 0) ct_fail(r->c, VQ_ERR_FORMAT, pos, "slice step cannot be zero");
    int64_t start = start_v && start_v->t != V_NONE ? slice_adjust(slice_bound(r, start_v, pos), len, step)
                                                    : (step < 0 ? len - 1 : 0);
    int64_t stop = stop_v && stop_v->t != V_NONE ? slice_adjust(slice_bound(r, stop_v, pos), len, step)
                                                 : (step < 0 ? -1 : len);
    int64_t count = 0;
    if (step > 0 && stop > start) count = (stop - start - 1) / step + 1;
    if (step < 0 && start > stop) count = (start - stop - 1) / -step + 1;
    if (obj->t == V_LIST) {
        val *l = mk_list(r, (int)count);
        l->tuple = obj->tuple;
        for (int64_t k = 0; k < count; k++) l->items[k] = obj->items[start + k * step];
        return l;
    }
    sb b = {0};
    sb_put(r, &b, "", 0);
    for (int64_t k = 0; k < count; k++) {
        int64_t c = start + k * step;
        sb_put(r, &b, obj->s + off[c], off[c + 1] - off[c]);
    }
    return sb_val(r, &b);
}

/* ------------------------------------------------------ filters, tests */

static bool test(rctx *r, const char *name, val *v, const args *a, size_t pos);

static bool named(const char *name, const char *s) { return strcmp(name, s) == 0; }

static int64_t length_of(rctx *r, val *v, size_t pos) {
    switch (v->t) {
    case V_UNDEF: return 0;
    case V_STR: {
        size_t n;
        cp_offsets(r, v, &n);
        return (int64_t)n;
    }
    case V_LIST: return v->n_items;
    case V_DICT: return v->n_pairs;
    default: ct_fail(r->c, VQ_ERR_FORMAT, pos, "a %s has no length", type_names[v->t]);
    }
}

/* select / reject / selectattr / rejectattr. */
static val *select_items(rctx *r, val *seq, const args *a, bool by_attr, bool keep, const char *fname, size_t pos) {
    val *items = truthy(seq) ? iterable(r, seq, pos) : mk_list(r, 0); /* jinja2 skips a false value */
    val *attr = NULL;
    int first = 0;
    if (by_attr) {
        attr = want(r, arg(a, 0, NULL), V_STR, "the attribute name", pos);
        first = 1;
    }
    if (a->n_kw) ct_fail(r->c, VQ_ERR_UNSUPPORTED, pos, "%s: keyword arguments are not supported", fname);
    val *tname = arg(a, first, NULL);
    if (tname) want(r, tname, V_STR, "the test name", pos);
    args targs = {0};
    for (int k = first + 1; k < a->n_pos; k++) targs.pos[targs.n_pos++] = a->pos[k];
    val *out = mk_list(r, items->n_items);
    out->n_items = 0;
    for (int k = 0; k < items->n_items; k++) {
        val *x = items->items[k];
        val *subject = by_attr ? get_named(r, x, attr->s, attr->n, true, pos) : x;
        char *tn = tname ? ct_strndup(r->c, tname->s, tname->n) : NULL;
        bool ok = tname ? test(r, tn, subject, &targs, pos) : truthy(subject);
        if (ok == keep) out->items[out->n_items++] = x;
    }
    return out;
}

static val *filter(rctx *r, const char *name, val *v, const args *a, size_t pos) {
    if (named(name, "trim")) {
        check_args(r, a, name, 1, NULL, pos);
        val *chars = arg(a, 0, NULL);
        if (chars && chars->t == V_NONE) chars = NULL;
        return py_strip(r, str_of(r, v, pos), chars ? want(r, chars, V_STR, "trim's characters", pos) : NULL, true, true);
    }
    if (named(name, "length") || named(name, "count")) {
        check_args(r, a, name, 0, NULL, pos);
        return mk_int(r, length_of(r, v, pos));
    }
    if (named(name, "tojson")) {
        /* transformers' tojson(x, ensure_ascii=False, indent=None,
         * separators=None, sort_keys=False), not jinja2's own */
        static const char *const kws[] = {"ensure_ascii", "indent", "separators", "sort_keys", NULL};
        check_args(r, a, name, 4, kws, pos);
        val *asc = arg(a, 0, "ensure_ascii"), *ind = arg(a, 1, "indent"), *sep = arg(a, 2, "separators"),
            *sort = arg(a, 3, "sort_keys");
        if (sep && sep->t != V_NONE) ct_fail(r->c, VQ_ERR_UNSUPPORTED, pos, "tojson: separators are not supported");
        int indent = -1;
        if (ind && ind->t != V_NONE) {
            int64_t k = want(r, ind, V_INT, "tojson's indent", pos)->i;
            if (k < 0 || k > 64) ct_fail(r->c, VQ_ERR_UNSUPPORTED, pos, "tojson indent %lld is outside [0, 64]", (long long)k);
            indent = (int)k;
        }
        sb b = {0};
        sb_put(r, &b, "", 0);
        to_json(r, &b, v, indent, asc && truthy(asc), sort && truthy(sort), 0, pos);
        return sb_val(r, &b);
    }
    if (named(name, "upper") || named(name, "lower")) {
        check_args(r, a, name, 0, NULL, pos);
        return ascii_case(r, str_of(r, v, pos), named(name, "upper"), name, pos);
    }
    if (named(name, "replace")) {
        check_args(r, a, name, 3, NULL, pos);
        val *count = arg(a, 2, NULL);
        return py_replace(r, str_of(r, v, pos), str_of(r, want(r, arg(a, 0, NULL), V_STR, "replace's first argument", pos), pos),
                          str_of(r, want(r, arg(a, 1, NULL), V_STR, "replace's second argument", pos), pos),
                          count && count->t != V_NONE ? want(r, count, V_INT, "replace's count", pos)->i : -1);
    }
    if (named(name, "list")) {
        check_args(r, a, name, 0, NULL, pos);
        val *items = iterable(r, v, pos), *l = mk_list(r, items->n_items);
        memcpy(l->items, items->items, sizeof *l->items * (size_t)items->n_items);
        return l;
    }
    if (named(name, "string")) {
        check_args(r, a, name, 0, NULL, pos);
        return str_of(r, v, pos);
    }
    if (named(name, "safe")) {
        check_args(r, a, name, 0, NULL, pos);
        return v;
    }
    if (named(name, "join")) {
        static const char *const kws[] = {"d", "attribute", NULL};
        check_args(r, a, name, 1, kws, pos);
        val *sep = arg(a, 0, "d"), *attr = arg(a, -1, "attribute");
        val *items = iterable(r, v, pos);
        sb b = {0};
        sb_put(r, &b, "", 0);
        for (int k = 0; k < items->n_items; k++) {
            if (k && sep) to_text(r, &b, str_of(r, sep, pos), false, pos);
            val *x = items->items[k];
            if (attr) x = get_named(r, x, want(r, attr, V_STR, "join's attribute", pos)->s, attr->n, true, pos);
            to_text(r, &b, x, false, pos);
        }
        return sb_val(r, &b);
    }
    if (named(name, "items")) {
        check_args(r, a, name, 0, NULL, pos);
        if (v->t == V_UNDEF) return mk_list(r, 0);
        if (v->t != V_DICT) ct_fail(r->c, VQ_ERR_FORMAT, pos, "items: a %s is not a mapping", type_names[v->t]);
        val f = {.t = V_FUNC, .i = F_ITEMS, .self = v};
        args none = {0};
        return call(r, &f, &none, pos);
    }
    if (named(name, "first") || named(name, "last")) {
        check_args(r, a, name, 0, NULL, pos);
        val *items = iterable(r, v, pos);
        if (!items->n_items) return mk_undef(r, "first / last of an empty sequence");
        return items->items[named(name, "first") ? 0 : items->n_items - 1];
    }
    if (named(name, "default") || named(name, "d")) {
        static const char *const kws[] = {"default_value", "boolean", NULL};
        check_args(r, a, name, 2, kws, pos);
        val *dflt = arg(a, 0, "default_value"), *boolean = arg(a, 1, "boolean");
        bool use = v->t == V_UNDEF || (boolean && truthy(boolean) && !truthy(v));
        return use ? (dflt ? dflt : mk_str(r, "", 0)) : v;
    }
    if (named(name, "select") || named(name, "reject") || named(name, "selectattr") || named(name, "rejectattr"))
        return select_items(r, v, a, name[strlen(name) - 1] == 'r', name[0] == 's', name, pos);
    if (named(name, "map")) {
        static const char *const kws[] = {"attribute", "default", NULL};
        val *attr = arg(a, -1, "attribute"), *dflt = arg(a, -1, "default");
        val *items = truthy(v) ? iterable(r, v, pos) : mk_list(r, 0), *out = mk_list(r, items->n_items);
        if (attr) {
            check_args(r, a, name, 0, kws, pos);
            want(r, attr, V_STR, "map's attribute", pos);
            for (int k = 0; k < items->n_items; k++) {
                val *x = get_named(r, items->items[k], attr->s, attr->n, true, pos);
                out->items[k] = x->t == V_UNDEF && dflt ? dflt : x;
            }
            return out;
        }
        if (a->n_kw) ct_fail(r->c, VQ_ERR_UNSUPPORTED, pos, "map: keyword arguments other than attribute= are not supported");
        val *fname = want(r, arg(a, 0, NULL), V_STR, "map's filter name", pos);
        args rest = {0};
        for (int k = 1; k < a->n_pos; k++) rest.pos[rest.n_pos++] = a->pos[k];
        char *fn = ct_strndup(r->c, fname->s, fname->n);
        for (int k = 0; k < items->n_items; k++) out->items[k] = filter(r, fn, items->items[k], &rest, pos);
        return out;
    }
    ct_fail(r->c, VQ_ERR_UNSUPPORTED, pos, "the filter '%s' is not supported", name);
}

static bool test(rctx *r, const char *name, val *v, const args *a, size_t pos) {
    val *x = arg(a, 0, NULL);
    int max = named(name, "equalto") || named(name, "eq") || named(name, "==") || named(name, "ne") || named(name, "!=") || named(name, "lt") || named(name, "<") || named(name, "le") ||
                      named(name, "<=") || named(name, "gt") || named(name, ">") || named(name, "ge") || named(name, ">=") || named(name, "in") || named(name, "divisibleby") ||
                      named(name, "sameas")
                  ? 1
                  : 0;
    check_args(r, a, name, max, NULL, pos);
    if (max && !x) ct_fail(r->c, VQ_ERR_FORMAT, pos, "the test '%s' needs an argument", name);
    if (named(name, "defined")) return v->t != V_UNDEF;
    if (named(name, "undefined")) return v->t == V_UNDEF;
    if (named(name, "none")) return v->t == V_NONE;
    if (named(name, "string")) return v->t == V_STR;
    if (named(name, "number")) return is_num(v);
    if (named(name, "integer")) return v->t == V_INT;
    if (named(name, "float")) return v->t == V_FLOAT;
    if (named(name, "boolean")) return v->t == V_BOOL;
    if (named(name, "true")) return v->t == V_BOOL && v->i;
    if (named(name, "false")) return v->t == V_BOOL && !v->i;
    if (named(name, "mapping")) return v->t == V_DICT;
    if (named(name, "iterable")) return v->t == V_STR || v->t == V_LIST || v->t == V_DICT || v->t == V_UNDEF;
    if (named(name, "sequence")) return v->t == V_STR || v->t == V_LIST || v->t == V_DICT || v->t == V_UNDEF;
    if (named(name, "callable")) return v->t == V_FUNC;
    if (named(name, "equalto") || named(name, "eq") || named(name, "==")) return equal(v, x);
    if (named(name, "ne") || named(name, "!=")) return !equal(v, x);
    if (named(name, "lt") || named(name, "<")) return order(r, v, x, "<", pos) < 0;
    if (named(name, "le") || named(name, "<=")) return order(r, v, x, "<=", pos) <= 0;
    if (named(name, "gt") || named(name, ">")) return order(r, v, x, ">", pos) > 0;
    if (named(name, "ge") || named(name, ">=")) return order(r, v, x, ">=", pos) >= 0;
    if (named(name, "in")) return contains(r, x, v, pos);
    if (named(name, "sameas")) return v == x || (v->t == x->t && (v->t == V_NONE || (v->t == V_BOOL && v->i == x->i)));
    if (named(name, "odd") || named(name, "even") || named(name, "divisibleby")) {
        /* jinja2: value % 2 == 1, value % 2 == 0, value % num == 0 */
        val *rem = arith(r, "%", v, named(name, "divisibleby") ? x : mk_int(r, 2), pos);
        return equal(rem, mk_int(r, named(name, "odd") ? 1 : 0));
    }
    ct_fail(r->c, VQ_ERR_UNSUPPORTED, pos, "the test '%s' is not supported", name);
}

/* ---------------------------------------------------------- evaluation */

static val *eval(rctx *r, ct_expr *e) {
    ct_enter(r->c, e->pos);
    val *v = NULL, *a, *b;
    switch (e->kind) {
    case E_STR: v = mk_str(r, e->s, e->n); break;
    case E_INT: v = mk_int(r, e->i); break;
    case E_FLOAT: v = mk_float(r, e->f); break;
    case E_BOOL: v = mk_bool(r, e->i != 0); break;
    case E_NONE: v = mk(r, V_NONE); break;
    case E_NAME:
        v = lookup(r, e->s, e->n);
        if (!v) v = mk_undef(r, e->s);
        break;
    case E_ATTR: v = get_named(r, eval(r, e->a), e->s, e->n, true, e->pos); break;
    case E_ITEM:
        a = eval(r, e->a);
        v = get_index(r, a, eval(r, e->b), e->pos);
        break;
    case E_SLICE:
        a = eval(r, e->a);
        v = get_slice(r, a, e->b ? eval(r, e->b) : NULL, e->c ? eval(r, e->c) : NULL, e->d ? eval(r, e->d) : NULL, e->pos);
        break;
    case E_CALL: {
        val *f = eval(r, e->a);
        if (f->t != V_FUNC) {
            static const char *const globals[] = {"range", "dict", "lipsum", "cycler", "joiner", NULL};
            if (f->t == V_UNDEF && e->a->kind == E_NAME && in_list(globals, e->a->s, e->a->n))
                ct_fail(r->c, VQ_ERR_UNSUPPORTED, e->pos, "the function '%s' is not supported", e->a->s);
            if (f->t == V_UNDEF) undefined_error(r, f, e->pos);
            ct_fail(r->c, VQ_ERR_FORMAT, e->pos, "a %s is not callable", type_names[f->t]);
        }
        args x;
        eval_args(r, e, &x);
        v = call(r, f, &x, e->pos);
        break;
    }
    case E_FILTER: {
        a = eval(r, e->a);
        args x;
        eval_args(r, e, &x);
        v = filter(r, e->s, a, &x, e->pos);
        break;
    }
    case E_TEST: {
        a = eval(r, e->a);
        args x;
        eval_args(r, e, &x);
        v = mk_bool(r, test(r, e->s, a, &x, e->pos) != e->negate);
        break;
    }
    case E_BIN:
        a = eval(r, e->a);
        b = eval(r, e->b);
        if (e->s[0] == '~') {
            sb s = {0};
            sb_put(r, &s, "", 0);
            to_text(r, &s, a, false, e->pos);
            to_text(r, &s, b, false, e->pos);
            v = sb_val(r, &s);
        } else {
            v = arith(r, e->s, a, b, e->pos);
        }
        break;
    case E_NEG:
    case E_POS:
        a = eval(r, e->a);
        if (!is_num(a)) ct_fail(r->c, VQ_ERR_FORMAT, e->pos, "bad operand type for unary %c: %s", e->kind == E_NEG ? '-' : '+', type_names[a->t]);
        if (e->kind == E_POS) v = a->t == V_BOOL ? mk_int(r, a->i) : a;
        else if (a->t == V_FLOAT) v = mk_float(r, -a->f);
        else v = mk_int(r, checked(r, a->i == INT64_MIN, -a->i, e->pos));
        break;
    case E_NOT: v = mk_bool(r, !truthy(eval(r, e->a))); break;
    case E_AND:
        a = eval(r, e->a);
        v = truthy(a) ? eval(r, e->b) : a;
        break;
    case E_OR:
        a = eval(r, e->a);
        v = truthy(a) ? a : eval(r, e->b);
        break;
    case E_CMP: {
        a = eval(r, e->a);
        bool ok = true;
        for (int k = 0; k < e->n_args && ok; k++) {
            const char *op = e->names[k];
            b = eval(r, e->args[k]);
            if (strcmp(op, "==") == 0) ok = equal(a, b);
            else if (strcmp(op, "!=") == 0) ok = !equal(a, b);
            else if (strcmp(op, "in") == 0) ok = contains(r, b, a, e->pos);
            else if (strcmp(op, "not in") == 0) ok = !contains(r, b, a, e->pos);
            else {
                int c = order(r, a, b, op, e->pos);
                ok = op[0] == '<' ? (op[1] ? c <= 0 : c < 0) : (op[1] ? c >= 0 : c > 0);
            }
            a = b;
        }
        v = mk_bool(r, ok);
        break;
    }
    case E_COND:
        if (truthy(eval(r, e->b))) v = eval(r, e->a);
        else v = e->c ? eval(r, e->c) : mk_undef(r, NULL);
        break;
    case E_LIST:
    case E_TUPLE:
        v = mk_list(r, e->n_args);
        v->tuple = e->kind == E_TUPLE;
        for (int k = 0; k < e->n_args; k++) v->items[k] = eval(r, e->args[k]);
        break;
    case E_DICT:
        v = mk(r, V_DICT);
        for (int k = 0; k + 1 < e->n_args; k += 2) {
            val *key = eval(r, e->args[k]);
            if (key->t != V_STR)
                ct_fail(r->c, VQ_ERR_UNSUPPORTED, e->args[k]->pos, "dict keys other than strings are not supported");
            dict_set(r, v, key->s, key->n, eval(r, e->args[k + 1]));
        }
        break;
    }
    ct_leave(r->c);
    return v;
}

static void out_put(ct_ctx *c, const char *s, size_t n, size_t pos) {
    if (c->out_len + n + 1 > c->out_cap) {
        if (c->out_len + n > CT_MAX_OUTPUT)
            ct_fail(c, VQ_ERR_NOMEM, pos, "the rendered text passes %zu MiB", CT_MAX_OUTPUT >> 20);
        size_t cap = c->out_cap ? c->out_cap : 4096;
        while (cap < c->out_len + n + 1) cap *= 2;
        char *p = realloc(c->out, cap);
        if (!p) ct_fail(c, VQ_ERR_NOMEM, pos, "out of memory");
        c->out = p;
        c->out_cap = cap;
    }
    memcpy(c->out + c->out_len, s, n);
    c->out_len += n;
    c->out[c->out_len] = 0;
}

static void run(rctx *r, const ct_body *body);

static void run_for(rctx *r, ct_stmt *s) {
    val *items = iterable(r, eval(r, s->e), s->e->pos);
    if (s->cond) { /* the loop filter runs first, so loop.length counts what it kept */
        val *kept = mk_list(r, items->n_items);
        kept->n_items = 0;
        for (int k = 0; k < items->n_items; k++) {
            scope sc = {.parent = r->top};
            r->top = &sc;
            if (s->n_targets == 1) scope_set(r, &sc, s->targets[0], items->items[k]);
            else {
                val *it = items->items[k];
                if (it->t != V_LIST || it->n_items != s->n_targets)
                    ct_fail(r->c, VQ_ERR_FORMAT, s->pos, "cannot unpack a %s into %d loop variables", type_names[it->t], s->n_targets);
                for (int t = 0; t < s->n_targets; t++) scope_set(r, &sc, s->targets[t], it->items[t]);
            }
            bool keep = truthy(eval(r, s->cond));
            r->top = sc.parent;
            if (keep) kept->items[kept->n_items++] = items->items[k];
        }
        items = kept;
    }
    if (items->n_items == 0) {
        run(r, &s->else_body);
        return;
    }
    for (int k = 0; k < items->n_items; k++) {
        scope sc = {.parent = r->top};
        r->top = &sc;
        val *it = items->items[k];
        if (s->n_targets == 1) {
            scope_set(r, &sc, s->targets[0], it);
        } else {
            if (it->t != V_LIST || it->n_items != s->n_targets)
                ct_fail(r->c, VQ_ERR_FORMAT, s->pos, "cannot unpack a %s into %d loop variables", type_names[it->t], s->n_targets);
            for (int t = 0; t < s->n_targets; t++) scope_set(r, &sc, s->targets[t], it->items[t]);
        }
        val *loop = mk(r, V_LOOP);
        loop->self = items;
        loop->index = k;
        scope_set(r, &sc, "loop", loop);
        run(r, &s->body);
        r->top = sc.parent;
        int jump = r->jump;
        r->jump = 0;
        if (jump == S_BREAK) break;
    }
}

static void run(rctx *r, const ct_body *body) {
    ct_enter(r->c, body->n ? body->items[0]->pos : 0);
    for (int k = 0; k < body->n && !r->jump; k++) {
        ct_stmt *s = body->items[k];
        switch (s->kind) {
        case S_DATA: out_put(r->c, s->s, s->n, s->pos); break;
        case S_OUTPUT: {
            val *v = eval(r, s->e);
            if (v->t == V_STR) {
                out_put(r->c, v->s, v->n, s->pos);
            } else {
                sb b = {0};
                to_text(r, &b, v, false, s->e->pos);
                out_put(r->c, b.p ? b.p : "", b.n, s->pos);
            }
            break;
        }
        case S_IF:
            for (int i = 0; i < s->n_branches; i++)
                if (!s->conds[i] || truthy(eval(r, s->conds[i]))) {
                    run(r, &s->bodies[i]);
                    break;
                }
            break;
        case S_FOR: run_for(r, s); break;
        case S_SET:
            if (s->attr) {
                val *ns = lookup(r, s->s, s->n);
                if (!ns || ns->t != V_NS)
                    ct_fail(r->c, VQ_ERR_FORMAT, s->pos, "cannot set '%s.%s': '%s' is not a namespace()", s->s, s->attr, s->s);
                dict_set(r, ns, s->attr, strlen(s->attr), eval(r, s->e));
            } else {
                scope_set(r, r->top, s->s, eval(r, s->e));
            }
            break;
        case S_BLOCK: run(r, &s->body); break;
        case S_BREAK:
        case S_CONTINUE: r->jump = (int)s->kind; break;
        }
    }
    ct_leave(r->c);
}

/* ------------------------------------------------------------- the API */

static void ctx_free(ct_ctx *c) {
    while (c->chunks) {
        ct_chunk *next = c->chunks->next;
        free(c->chunks->data);
        free(c->chunks);
        c->chunks = next;
    }
    free(c->out);
    free(c);
}

vq_status vq_chat_render(const char *tmpl, const vq_chat_message *msgs, int n, int add_generation_prompt,
                         const char *bos_token, const char *eos_token, char **out) {
    if (out) *out = NULL;
    if (!tmpl || !out || n < 0 || n > (1 << 20) || (n && !msgs))
        return vq_fail(VQ_ERR_ARG, "vq_chat_render: template, messages or out is NULL, or n = %d is outside [0, %d]", n, 1 << 20);
    for (int k = 0; k < n; k++) {
        if (!msgs[k].role || !msgs[k].content)
            return vq_fail(VQ_ERR_ARG, "vq_chat_render: message %d has a NULL role or content", k);
        size_t bad = utf8_invalid_at(msgs[k].content, strlen(msgs[k].content));
        if (bad == SIZE_MAX) bad = utf8_invalid_at(msgs[k].role, strlen(msgs[k].role));
        if (bad != SIZE_MAX) return vq_fail(VQ_ERR_ARG, "vq_chat_render: message %d is not valid UTF-8 (byte %zu)", k, bad);
    }
    size_t tlen = strlen(tmpl), bad = utf8_invalid_at(tmpl, tlen);
    if (bad != SIZE_MAX) return vq_fail(VQ_ERR_FORMAT, "chat template: not valid UTF-8 (byte %zu)", bad);
    ct_ctx *c = calloc(1, sizeof *c);
    if (!c) return vq_fail(VQ_ERR_NOMEM, "vq_chat_render: out of memory");
    if (setjmp(c->on_error)) {
        vq_status st = vq_fail(c->status, "%s", c->message);
        ctx_free(c);
        return st;
    }
    /* jinja2 reads "\r\n" and "\r" as "\n" and drops one final newline */
    char *src = ct_alloc(c, tlen + 1);
    size_t len = 0;
    for (size_t i = 0; i < tlen; i++) {
        if (tmpl[i] == '\r') {
            src[len++] = '\n';
            if (i + 1 < tlen && tmpl[i + 1] == '\n') i++;
        } else {
            src[len++] = tmpl[i];
        }
    }
    if (len && src[len - 1] == '\n') len--;
    c->src = src;
    c->len = len;
    ct_body body = ct_parse(c);

    rctx r = {.c = c};
    scope globals = {0};
    r.top = &globals;
    val *list = mk_list(&r, n);
    for (int k = 0; k < n; k++) {
        val *m = mk(&r, V_DICT);
        dict_set(&r, m, "role", 4, mk_str(&r, msgs[k].role, strlen(msgs[k].role)));
        dict_set(&r, m, "content", 7, mk_str(&r, msgs[k].content, strlen(msgs[k].content)));
        list->items[k] = m;
    }
    /* what transformers' apply_chat_template passes */
    scope_set(&r, &globals, "messages", list);
    scope_set(&r, &globals, "tools", mk(&r, V_NONE));
    scope_set(&r, &globals, "documents", mk(&r, V_NONE));
    scope_set(&r, &globals, "add_generation_prompt", mk_bool(&r, add_generation_prompt != 0));
    if (bos_token) scope_set(&r, &globals, "bos_token", mk_str(&r, bos_token, strlen(bos_token)));
    if (eos_token) scope_set(&r, &globals, "eos_token", mk_str(&r, eos_token, strlen(eos_token)));
    scope_set(&r, &globals, "raise_exception", mk_func(&r, F_RAISE, NULL));
    scope_set(&r, &globals, "strftime_now", mk_func(&r, F_STRFTIME, NULL));
    scope_set(&r, &globals, "namespace", mk_func(&r, F_NAMESPACE, NULL));
    scope top = {.parent = &globals};
    r.top = &top;
    run(&r, &body);
    out_put(c, "", 0, SIZE_MAX);
    if (strlen(c->out) != c->out_len) ct_fail(c, VQ_ERR_FORMAT, SIZE_MAX, "the rendered text holds a NUL character");
    *out = c->out;
    c->out = NULL;
    ctx_free(c);
    return VQ_OK;
}

/* A token named in tokenizer_config.json: a string or {"content": ...}. */
static vq_status config_token(const cJSON *root, const char *key, const char *path, char **out) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(root, key);
    *out = NULL;
    if (!v || cJSON_IsNull(v)) return VQ_OK;
    if (cJSON_IsObject(v)) v = cJSON_GetObjectItemCaseSensitive(v, "content");
    if (!cJSON_IsString(v)) return vq_fail(VQ_ERR_FORMAT, "%s: \"%s\" must be a string or an object with \"content\"", path, key);
    *out = strdup(v->valuestring);
    return *out ? VQ_OK : vq_fail(VQ_ERR_NOMEM, "%s: out of memory", path);
}

void vq_chat_config_free(vq_chat_config *cfg) {
    if (!cfg) return;
    free(cfg->chat_template);
    free(cfg->bos_token);
    free(cfg->eos_token);
    memset(cfg, 0, sizeof *cfg);
}

vq_status vq_chat_config_load(const char *path, vq_chat_config *cfg) {
    if (!path || !cfg) return vq_fail(VQ_ERR_ARG, "vq_chat_config_load: path or config is NULL");
    memset(cfg, 0, sizeof *cfg);
    FILE *f = fopen(path, "rb");
    if (!f) return VQ_OK; /* tokenizer_config.json is optional */
    fclose(f);
    cJSON *root;
    vq_status st = vq_read_json(path, &root);
    if (st) return st;
    if (!cJSON_IsObject(root)) {
        cJSON_Delete(root);
        return vq_fail(VQ_ERR_FORMAT, "%s: not a JSON object", path);
    }
    const cJSON *t = cJSON_GetObjectItemCaseSensitive(root, "chat_template");
    const char *text = NULL;
    if (cJSON_IsString(t)) {
        text = t->valuestring;
    } else if (cJSON_IsArray(t)) {
        /* several named templates: transformers uses "default" */
        char names[256] = "";
        const cJSON *item;
        cJSON_ArrayForEach(item, t) {
            const cJSON *name = cJSON_GetObjectItemCaseSensitive(item, "name");
            const cJSON *body = cJSON_GetObjectItemCaseSensitive(item, "template");
            if (!cJSON_IsString(name) || !cJSON_IsString(body)) {
                cJSON_Delete(root);
                return vq_fail(VQ_ERR_FORMAT, "%s: each \"chat_template\" entry needs string \"name\" and \"template\"", path);
            }
            if (strcmp(name->valuestring, "default") == 0) text = body->valuestring;
            size_t used = strlen(names);
            snprintf(names + used, sizeof names - used, "%s'%s'", used ? ", " : "", name->valuestring);
        }
        if (!text) {
            vq_status s = vq_fail(VQ_ERR_FORMAT, "%s: \"chat_template\" lists templates %s but none named 'default'", path, names);
            cJSON_Delete(root);
            return s;
        }
    } else if (t && !cJSON_IsNull(t)) {
        cJSON_Delete(root);
        return vq_fail(VQ_ERR_FORMAT, "%s: \"chat_template\" must be a string or a list of {\"name\", \"template\"}", path);
    }
    if (text && !(cfg->chat_template = strdup(text))) st = vq_fail(VQ_ERR_NOMEM, "%s: out of memory", path);
    if (!st) st = config_token(root, "bos_token", path, &cfg->bos_token);
    if (!st) st = config_token(root, "eos_token", path, &cfg->eos_token);
    cJSON_Delete(root);
    if (st) vq_chat_config_free(cfg);
    return st;
}
