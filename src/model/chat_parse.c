/*
 * Lexer and parser for the Jinja2 subset of chat templates.
 *
 * The lexer follows jinja2's, configured as transformers configures it
 * (trim_blocks and lstrip_blocks on, keep_trailing_newline off):
 *   - "{%-", "{{-", "{#-" take all whitespace before the tag off the text,
 *     "-%}", "-}}", "-#}" all whitespace after it;
 *   - trim_blocks: a block or comment tag eats the one newline after it;
 *   - lstrip_blocks: spaces and tabs between the start of a line and a block
 *     or comment tag are dropped ("{%+" keeps them);
 *   - an end tag is only an end tag while brackets are balanced, so
 *     {{ "}}" }} and dict literals work.
 * The parser is recursive descent with jinja2's operator precedence, from
 * loosest to tightest: "x if c else y", or, and, not, comparisons (== != <
 * <= > >= in, not in), + -, ~, * / // %, **, unary - +, then postfix
 * (.attr, [index], [a:b:c], (call)) and filters / tests (| f, is t), which
 * bind tighter than every binary operator: "a + b | trim" trims only b.
 */
#include "model/chat_template.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef enum { T_DATA, T_VAR_BEGIN, T_VAR_END, T_BLOCK_BEGIN, T_BLOCK_END, T_NAME, T_STRING, T_INT, T_FLOAT, T_OP, T_EOF } ct_tok_type;

typedef struct {
    ct_tok_type type;
    size_t pos;
    const char *s;   /* text of a data, name or operator token; decoded string */
    size_t n;
    int64_t i;
    double f;
} ct_tok;

typedef struct {
    ct_ctx *c;
    ct_tok *toks;
    size_t n, cap, at;
    int loops;       /* for loops around the statement being parsed */
} parser;

/* Bytes of the whitespace character (Python's \s, Unicode included) that
 * starts at s[i], or 0. */
static size_t space_at(const char *s, size_t len, size_t i) {
    size_t j = i;
    return i < len && ct_py_space(ct_utf8_next(s, len, &j)) ? j - i : 0;
}

/* Bytes of the whitespace character that ends just before s[i] (not
 * reaching below lo), or 0. */
static size_t space_before(const char *s, size_t lo, size_t i) {
    if (i <= lo) return 0;
    size_t start = i - 1;
    while (start > lo && ((unsigned char)s[start] & 0xC0) == 0x80) start--;
    return space_at(s, i, start) == i - start ? i - start : 0;
}

static size_t skip_space(const char *s, size_t len, size_t i) {
    for (size_t k; (k = space_at(s, len, i));) i += k;
    return i;
}
static bool is_name_start(char ch) { return (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || ch == '_'; }
static bool is_digit(char ch) { return ch >= '0' && ch <= '9'; }
static bool is_name_char(char ch) { return is_name_start(ch) || is_digit(ch); }

static ct_tok *push(parser *p, ct_tok_type type, size_t pos, const char *s, size_t n) {
    if (p->n == p->cap) {
        size_t cap = p->cap ? p->cap * 2 : 256;
        ct_tok *t = ct_alloc(p->c, cap * sizeof *t);
        if (p->n) memcpy(t, p->toks, p->n * sizeof *t);
        p->toks = t;
        p->cap = cap;
    }
    ct_tok *t = &p->toks[p->n++];
    memset(t, 0, sizeof *t);
    t->type = type;
    t->pos = pos;
    t->s = s;
    t->n = n;
    return t;
}

static int hex_value(char ch) {
    if (ch >= '0' && ch <= '9') return ch - '0';
    if (ch >= 'a' && ch <= 'f') return ch - 'a' + 10;
    if (ch >= 'A' && ch <= 'F') return ch - 'A' + 10;
    return -1;
}

/* A string literal's body, decoded as jinja2 does it: Python's
 * "unicode-escape" (\n \t \\ \' \" \xHH \uHHHH \UHHHHHHHH, octal, and an
 * unknown escape kept as written). */
static void lex_string(parser *p, size_t start, size_t end) {
    ct_ctx *c = p->c;
    const char *s = c->src;
    char *out = ct_alloc(c, 2 * (end - start) + 1);
    size_t o = 0;
    for (size_t i = start; i < end;) {
        if (s[i] != '\\') {
            out[o++] = s[i++];
            continue;
        }
        char e = s[i + 1]; /* the closing quote guarantees i + 1 < end + 1 */
        size_t at = i;
        i += 2;
        uint32_t cp;
        int digits = 0;
        switch (e) {
        case '\n': continue; /* a line continuation */
        case '\\': out[o++] = '\\'; continue;
        case '\'': out[o++] = '\''; continue;
        case '"': out[o++] = '"'; continue;
        case 'a': out[o++] = '\a'; continue;
        case 'b': out[o++] = '\b'; continue;
        case 'f': out[o++] = '\f'; continue;
        case 'n': out[o++] = '\n'; continue;
        case 'r': out[o++] = '\r'; continue;
        case 't': out[o++] = '\t'; continue;
        case 'v': out[o++] = '\v'; continue;
        case 'x': digits = 2; break;
        case 'u': digits = 4; break;
        case 'U': digits = 8; break;
        case 'N':
            ct_fail(c, VQ_ERR_UNSUPPORTED, at, "the \\N{...} escape in a string is not supported");
        default:
            if (e >= '0' && e <= '7') {
                cp = (uint32_t)(e - '0');
                for (int k = 0; k < 2 && i < end && s[i] >= '0' && s[i] <= '7'; k++) cp = cp * 8 + (uint32_t)(s[i++] - '0');
                o += (size_t)ct_utf8_put(cp, out + o);
            } else if ((unsigned char)e >= 0x80) {
                /* jinja2 first turns the character into a \x, \u or \U
                 * escape, which this backslash then escapes */
                size_t k = i - 1;
                uint32_t ch = ct_utf8_next(s, end, &k);
                i = k;
                o += (size_t)sprintf(out + o, ch < 0x100 ? "\\x%02x" : ch < 0x10000 ? "\\u%04x" : "\\U%08x", ch);
            } else {
                out[o++] = '\\';
                out[o++] = e;
            }
            continue;
        }
        cp = 0;
        for (int k = 0; k < digits; k++, i++) {
            int h = i < end ? hex_value(s[i]) : -1;
            if (h < 0) ct_fail(c, VQ_ERR_FORMAT, at, "truncated \\%c escape in a string (needs %d hex digits)", e, digits);
            cp = cp * 16 + (uint32_t)h;
        }
        if (cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF))
            ct_fail(c, VQ_ERR_FORMAT, at, "escape \\%c names U+%X, not a Unicode scalar value", e, cp);
        o += (size_t)ct_utf8_put(cp, out + o);
    }
    push(p, T_STRING, start - 1, out, o);
}

/* The tokens of one {{ }} or {% %} tag from *pos (after its opening
 * delimiter); returns after the closing one with *pos past the whitespace
 * the close takes with it. */
static void lex_tag(parser *p, size_t open, bool block, size_t *pos, bool *line_starting) {
    ct_ctx *c = p->c;
    const char *s = c->src;
    size_t len = c->len, i = *pos;
    int balance = 0;
    for (;;) {
        i = skip_space(s, len, i);
        if (i >= len) ct_fail(c, VQ_ERR_FORMAT, open, "unexpected end of template: '%s' is not closed", block ? "{%" : "{{");
        if (balance == 0) {
            const char *close = block ? "%}" : "}}";
            size_t end = 0;
            bool strip = false, keep = false;
            if (s[i] == '-' && i + 2 < len && strncmp(s + i + 1, close, 2) == 0) end = i + 3, strip = true;
            else if (block && s[i] == '+' && i + 2 < len && strncmp(s + i + 1, close, 2) == 0) end = i + 3, keep = true;
            else if (i + 1 < len && strncmp(s + i, close, 2) == 0) end = i + 2;
            if (end) {
                push(p, block ? T_BLOCK_END : T_VAR_END, i, NULL, 0);
                if (strip)
                    end = skip_space(s, len, end);
                else if (block && !keep && end < len && s[end] == '\n')
                    end++; /* trim_blocks */
                *line_starting = s[end - 1] == '\n';
                *pos = end;
                return;
            }
        }
        size_t start = i;
        char ch = s[i];
        if (is_name_start(ch)) {
            while (i < len && is_name_char(s[i])) i++;
            push(p, T_NAME, start, s + start, i - start);
        } else if (is_digit(ch)) {
            while (i < len && is_digit(s[i])) i++;
            bool is_float = false;
            if (i + 1 < len && s[i] == '.' && is_digit(s[i + 1])) {
                is_float = true;
                i++;
                while (i < len && is_digit(s[i])) i++;
            }
            if (i < len && (s[i] == 'e' || s[i] == 'E')) {
                size_t k = i + 1;
                if (k < len && (s[k] == '+' || s[k] == '-')) k++;
                if (k < len && is_digit(s[k])) {
                    is_float = true;
                    i = k;
                    while (i < len && is_digit(s[i])) i++;
                }
            }
            char num[64];
            size_t nl = i - start < sizeof num - 1 ? i - start : sizeof num - 1;
            memcpy(num, s + start, nl);
            num[nl] = 0;
            ct_tok *t = push(p, is_float ? T_FLOAT : T_INT, start, s + start, i - start);
            if (is_float) {
                t->f = strtod(num, NULL);
            } else {
                if (i - start > 18) ct_fail(c, VQ_ERR_UNSUPPORTED, start, "integer literal %s is too large (at most 18 digits)", num);
                t->i = strtoll(num, NULL, 10);
            }
        } else if (ch == '\'' || ch == '"') {
            i++;
            while (i < len && s[i] != ch) i += s[i] == '\\' && i + 1 < len ? 2 : 1;
            if (i >= len) ct_fail(c, VQ_ERR_FORMAT, start, "unterminated string literal");
            lex_string(p, start + 1, i);
            i++;
        } else {
            static const char *const two[] = {"**", "//", "==", "!=", "<=", ">="};
            size_t n = 0;
            for (int k = 0; k < 6 && !n; k++)
                if (i + 1 < len && s[i] == two[k][0] && s[i + 1] == two[k][1]) n = 2;
            if (!n && ch && strchr("+-*/%~<>=()[]{}.,:|", ch)) n = 1;
            if (!n) ct_fail(c, VQ_ERR_FORMAT, start, "unexpected character '%c' in a tag", ch);
            if (n == 1 && strchr("([{", ch)) balance++;
            if (n == 1 && strchr(")]}", ch)) {
                if (balance == 0) ct_fail(c, VQ_ERR_FORMAT, start, "unexpected '%c'", ch);
                balance--;
            }
            i += n;
            push(p, T_OP, start, s + start, n);
        }
    }
}

static void lex(parser *p) {
    ct_ctx *c = p->c;
    const char *s = c->src;
    size_t len = c->len, pos = 0;
    bool line_starting = true;
    while (pos < len) {
        size_t t = pos;
        while (t + 1 < len && !(s[t] == '{' && (s[t + 1] == '{' || s[t + 1] == '%' || s[t + 1] == '#'))) t++;
        if (t + 1 >= len) {
            push(p, T_DATA, pos, s + pos, len - pos);
            break;
        }
        char kind = s[t + 1], sign = t + 2 < len ? s[t + 2] : 0;
        size_t data_end = t;
        if (sign == '-') {
            for (size_t k; (k = space_before(s, pos, data_end));) data_end -= k;
        } else if (sign != '+' && kind != '{') {
            /* lstrip_blocks: only whitespace since the line began */
            size_t line = data_end;
            while (line > pos && s[line - 1] != '\n') line--;
            if (line > pos || line_starting) {
                if (skip_space(s, data_end, line) == data_end) data_end = line;
            }
        }
        if (data_end > pos) push(p, T_DATA, pos, s + pos, data_end - pos);
        size_t body = t + 2 + (sign == '-' || sign == '+');
        if (kind == '#') {
            const char *end = NULL;
            for (size_t k = body; k + 1 < len && !end; k++)
                if (s[k] == '#' && s[k + 1] == '}') end = s + k;
            if (!end) ct_fail(c, VQ_ERR_FORMAT, t, "unexpected end of template: comment '{#' is not closed");
            size_t q = (size_t)(end - s), after = q + 2;
            if (q > body && s[q - 1] == '-')
                after = skip_space(s, len, after);
            else if (!(q > body && s[q - 1] == '+') && after < len && s[after] == '\n')
                after++;
            line_starting = s[after - 1] == '\n';
            pos = after;
            continue;
        }
        push(p, kind == '%' ? T_BLOCK_BEGIN : T_VAR_BEGIN, t, NULL, 0);
        pos = body;
        lex_tag(p, t, kind == '%', &pos, &line_starting);
    }
    push(p, T_EOF, len, NULL, 0);
}

/* ------------------------------------------------------------- parser */

static ct_tok *cur(parser *p) { return &p->toks[p->at]; }
static ct_tok *peek(parser *p, size_t k) { return &p->toks[p->at + k < p->n ? p->at + k : p->n - 1]; }
static void advance(parser *p) {
    if (p->toks[p->at].type != T_EOF) p->at++;
}
static bool tok_is(const ct_tok *t, ct_tok_type type, const char *text) {
    return t->type == type && (!text || (t->n == strlen(text) && memcmp(t->s, text, t->n) == 0));
}
static bool is_op(parser *p, const char *op) { return tok_is(cur(p), T_OP, op); }
static bool is_name(parser *p, const char *name) { return tok_is(cur(p), T_NAME, name); }

static const char *describe(const ct_tok *t, char *buf, size_t size) {
    switch (t->type) {
    case T_EOF: return "the end of the template";
    case T_DATA: return "template text";
    case T_VAR_BEGIN: return "'{{'";
    case T_VAR_END: return "'}}'";
    case T_BLOCK_BEGIN: return "'{%'";
    case T_BLOCK_END: return "'%}'";
    case T_STRING: return "a string";
    default:
        snprintf(buf, size, "'%.*s'", (int)(t->n < 40 ? t->n : 40), t->s);
        return buf;
    }
}

static _Noreturn void unexpected(parser *p, const char *wanted) {
    char buf[64];
    ct_fail(p->c, VQ_ERR_FORMAT, cur(p)->pos, "expected %s, found %s", wanted, describe(cur(p), buf, sizeof buf));
}

static void expect_op(parser *p, const char *op) {
    if (!is_op(p, op)) {
        char want[16];
        snprintf(want, sizeof want, "'%s'", op);
        unexpected(p, want);
    }
    advance(p);
}

static const char *expect_name(parser *p, const char *what) {
    if (cur(p)->type != T_NAME) unexpected(p, what);
    const char *s = ct_strndup(p->c, cur(p)->s, cur(p)->n);
    advance(p);
    return s;
}

static ct_expr *node(parser *p, ct_expr_kind kind, size_t pos) {
    ct_expr *e = ct_alloc(p->c, sizeof *e);
    e->kind = kind;
    e->pos = pos;
    return e;
}

/* Growable argument lists while parsing. */
typedef struct {
    ct_expr **items;
    const char **names;
    int n, cap;
} arglist;

static void arg_push(parser *p, arglist *l, ct_expr *e, const char *name) {
    if (l->n == l->cap) {
        int cap = l->cap ? l->cap * 2 : 4;
        ct_expr **items = ct_alloc(p->c, sizeof *items * (size_t)cap);
        const char **names = ct_alloc(p->c, sizeof *names * (size_t)cap);
        if (l->n) {
            memcpy(items, l->items, sizeof *items * (size_t)l->n);
            memcpy(names, l->names, sizeof *names * (size_t)l->n);
        }
        l->items = items;
        l->names = names;
        l->cap = cap;
    }
    l->items[l->n] = e;
    l->names[l->n] = name;
    l->n++;
}

static void arg_store(ct_expr *e, const arglist *l) {
    e->args = l->items;
    e->names = l->names;
    e->n_args = l->n;
}

static ct_expr *parse_expr(parser *p, bool with_cond);
static ct_expr *parse_or(parser *p);
static ct_expr *parse_unary(parser *p, bool with_filter);

/* "(" args ")" with keyword arguments; the "(" is current. */
static void parse_args(parser *p, ct_expr *e) {
    arglist l = {0};
    expect_op(p, "(");
    while (!is_op(p, ")")) {
        if (l.n) expect_op(p, ",");
        if (is_op(p, ")")) break; /* a trailing comma */
        if (is_op(p, "*") || is_op(p, "**"))
            ct_fail(p->c, VQ_ERR_UNSUPPORTED, cur(p)->pos, "'*' / '**' argument unpacking is not supported");
        const char *kw = NULL;
        if (cur(p)->type == T_NAME && tok_is(peek(p, 1), T_OP, "=")) {
            kw = expect_name(p, "an argument name");
            advance(p);
        } else if (l.n && l.names[l.n - 1]) {
            ct_fail(p->c, VQ_ERR_FORMAT, cur(p)->pos, "a positional argument follows a keyword argument");
        }
        arg_push(p, &l, parse_expr(p, true), kw);
    }
    advance(p);
    arg_store(e, &l);
}

static ct_expr *parse_primary(parser *p) {
    ct_tok *t = cur(p);
    ct_expr *e;
    if (t->type == T_NAME) {
        static const char *const consts[] = {"true", "True", "false", "False", "none", "None"};
        for (int k = 0; k < 6; k++)
            if (tok_is(t, T_NAME, consts[k])) {
                e = node(p, k < 4 ? E_BOOL : E_NONE, t->pos);
                e->i = k < 2;
                advance(p);
                return e;
            }
        e = node(p, E_NAME, t->pos);
        e->s = expect_name(p, "a name");
        e->n = strlen(e->s);
        return e;
    }
    if (t->type == T_STRING) {
        /* adjacent literals concatenate: 'a' 'b' is 'ab' */
        e = node(p, E_STR, t->pos);
        size_t total = 0, k = 0;
        while (peek(p, k)->type == T_STRING) total += peek(p, k++)->n;
        char *s = ct_alloc(p->c, total + 1);
        e->s = s;
        e->n = total;
        while (cur(p)->type == T_STRING) {
            memcpy(s, cur(p)->s, cur(p)->n);
            s += cur(p)->n;
            advance(p);
        }
        return e;
    }
    if (t->type == T_INT || t->type == T_FLOAT) {
        e = node(p, t->type == T_INT ? E_INT : E_FLOAT, t->pos);
        e->i = t->i;
        e->f = t->f;
        advance(p);
        return e;
    }
    if (is_op(p, "(")) {
        advance(p);
        if (is_op(p, ")")) {
            advance(p);
            return node(p, E_TUPLE, t->pos);
        }
        ct_expr *first = parse_expr(p, true);
        if (!is_op(p, ",")) {
            expect_op(p, ")");
            return first;
        }
        arglist l = {0};
        arg_push(p, &l, first, NULL);
        while (is_op(p, ",")) {
            advance(p);
            if (is_op(p, ")")) break;
            arg_push(p, &l, parse_expr(p, true), NULL);
        }
        expect_op(p, ")");
        e = node(p, E_TUPLE, t->pos);
        arg_store(e, &l);
        return e;
    }
    if (is_op(p, "[") || is_op(p, "{")) {
        bool dict = is_op(p, "{");
        const char *close = dict ? "}" : "]";
        e = node(p, dict ? E_DICT : E_LIST, t->pos);
        arglist l = {0};
        advance(p);
        while (!is_op(p, close)) {
            if (l.n) expect_op(p, ",");
            if (is_op(p, close)) break;
            arg_push(p, &l, parse_expr(p, true), NULL);
            if (dict) {
                expect_op(p, ":");
                arg_push(p, &l, parse_expr(p, true), NULL);
            }
        }
        advance(p);
        arg_store(e, &l);
        return e;
    }
    unexpected(p, "an expression");
}

/* .attr, [index], [a:b:c] and calls after a primary. */
static ct_expr *parse_postfix(parser *p, ct_expr *e) {
    for (;;) {
        size_t pos = cur(p)->pos;
        if (is_op(p, ".")) {
            advance(p);
            ct_expr *x;
            if (cur(p)->type == T_INT) {
                /* x.0 is x[0] */
                x = node(p, E_ITEM, pos);
                x->b = node(p, E_INT, pos);
                x->b->i = cur(p)->i;
                advance(p);
            } else {
                x = node(p, E_ATTR, pos);
                x->s = expect_name(p, "an attribute name after '.'");
                x->n = strlen(x->s);
            }
            x->a = e;
            e = x;
        } else if (is_op(p, "[")) {
            advance(p);
            ct_expr *parts[3] = {NULL, NULL, NULL};
            int n_colons = 0;
            for (;;) {
                if (!is_op(p, ":") && !is_op(p, "]")) parts[n_colons] = parse_expr(p, true);
                if (is_op(p, ":") && n_colons < 2) {
                    advance(p);
                    n_colons++;
                    continue;
                }
                break;
            }
            if (is_op(p, ",")) ct_fail(p->c, VQ_ERR_UNSUPPORTED, cur(p)->pos, "tuple subscripts (x[a, b]) are not supported");
            expect_op(p, "]");
            ct_expr *x = node(p, n_colons ? E_SLICE : E_ITEM, pos);
            if (!n_colons && !parts[0]) ct_fail(p->c, VQ_ERR_FORMAT, pos, "empty subscript '[]'");
            x->a = e;
            x->b = parts[0];
            x->c = parts[1];
            x->d = parts[2];
            e = x;
        } else if (is_op(p, "(")) {
            ct_expr *x = node(p, E_CALL, pos);
            x->a = e;
            parse_args(p, x);
            e = x;
        } else {
            return e;
        }
    }
}

/* "| filter(args)" and "is [not] test args" after a unary expression. */
static ct_expr *parse_filters(parser *p, ct_expr *e) {
    for (;;) {
        size_t pos = cur(p)->pos;
        if (is_op(p, "|") || is_name(p, "is")) {
            bool test = is_name(p, "is");
            advance(p);
            ct_expr *x = node(p, test ? E_TEST : E_FILTER, pos);
            if (test && is_name(p, "not")) {
                x->negate = true;
                advance(p);
            }
            x->a = e;
            x->s = expect_name(p, test ? "a test name after 'is'" : "a filter name after '|'");
            while (is_op(p, ".")) { /* dotted names: only to name them in the error */
                advance(p);
                char *dotted = ct_alloc(p->c, strlen(x->s) + cur(p)->n + 2);
                sprintf(dotted, "%s.%.*s", x->s, (int)cur(p)->n, cur(p)->s ? cur(p)->s : "");
                x->s = dotted;
                advance(p);
            }
            x->n = strlen(x->s);
            if (is_op(p, "(")) {
                parse_args(p, x);
            } else if (test) {
                /* one argument without parentheses: "x is divisibleby 3" */
                ct_tok *t = cur(p);
                bool starts = t->type == T_STRING || t->type == T_INT || t->type == T_FLOAT || is_op(p, "[") ||
                              is_op(p, "{") ||
                              (t->type == T_NAME && !is_name(p, "else") && !is_name(p, "or") && !is_name(p, "and") &&
                               !is_name(p, "if") && !is_name(p, "is") && !is_name(p, "in") && !is_name(p, "not"));
                if (starts) {
                    arglist l = {0};
                    arg_push(p, &l, parse_postfix(p, parse_primary(p)), NULL);
                    arg_store(x, &l);
                }
            }
            e = x;
        } else if (is_op(p, "(")) {
            ct_expr *x = node(p, E_CALL, pos);
            x->a = e;
            parse_args(p, x);
            e = x;
        } else {
            return e;
        }
    }
}

static ct_expr *parse_unary(parser *p, bool with_filter) {
    ct_enter(p->c, cur(p)->pos);
    size_t pos = cur(p)->pos;
    ct_expr *e;
    if (is_op(p, "-") || is_op(p, "+")) {
        e = node(p, is_op(p, "-") ? E_NEG : E_POS, pos);
        advance(p);
        e->a = parse_unary(p, false);
    } else {
        e = parse_primary(p);
    }
    e = parse_postfix(p, e);
    if (with_filter) e = parse_filters(p, e);
    ct_leave(p->c);
    return e;
}

static ct_expr *binary(parser *p, const char *op, size_t pos, ct_expr *a, ct_expr *b) {
    ct_expr *e = node(p, E_BIN, pos);
    e->s = op;
    e->n = strlen(op);
    e->a = a;
    e->b = b;
    return e;
}

static ct_expr *parse_pow(parser *p) {
    ct_expr *e = parse_unary(p, true);
    while (is_op(p, "**")) {
        size_t pos = cur(p)->pos;
        advance(p);
        e = binary(p, "**", pos, e, parse_unary(p, true));
    }
    return e;
}

static ct_expr *parse_math2(parser *p) {
    ct_expr *e = parse_pow(p);
    for (;;) {
        static const char *const ops[] = {"*", "/", "//", "%"};
        const char *op = NULL;
        for (int k = 0; k < 4 && !op; k++)
            if (is_op(p, ops[k])) op = ops[k];
        if (!op) return e;
        size_t pos = cur(p)->pos;
        advance(p);
        e = binary(p, op, pos, e, parse_pow(p));
    }
}

static ct_expr *parse_concat(parser *p) {
    ct_expr *e = parse_math2(p);
    while (is_op(p, "~")) {
        size_t pos = cur(p)->pos;
        advance(p);
        e = binary(p, "~", pos, e, parse_math2(p));
    }
    return e;
}

static ct_expr *parse_math1(parser *p) {
    ct_expr *e = parse_concat(p);
    while (is_op(p, "+") || is_op(p, "-")) {
        const char *op = is_op(p, "+") ? "+" : "-";
        size_t pos = cur(p)->pos;
        advance(p);
        e = binary(p, op, pos, e, parse_concat(p));
    }
    return e;
}

static ct_expr *parse_compare(parser *p) {
    size_t pos = cur(p)->pos;
    ct_expr *first = parse_math1(p);
    arglist l = {0};
    for (;;) {
        static const char *const ops[] = {"==", "!=", "<", "<=", ">", ">="};
        const char *op = NULL;
        for (int k = 0; k < 6 && !op; k++)
            if (is_op(p, ops[k])) op = ops[k];
        if (!op && is_name(p, "in")) op = "in";
        if (!op && is_name(p, "not") && tok_is(peek(p, 1), T_NAME, "in")) {
            op = "not in";
            advance(p);
        }
        if (!op) break;
        advance(p);
        arg_push(p, &l, parse_math1(p), op);
    }
    if (!l.n) return first;
    ct_expr *e = node(p, E_CMP, pos);
    e->a = first;
    arg_store(e, &l);
    return e;
}

static ct_expr *parse_not(parser *p) {
    if (is_name(p, "not")) {
        ct_enter(p->c, cur(p)->pos);
        ct_expr *e = node(p, E_NOT, cur(p)->pos);
        advance(p);
        e->a = parse_not(p);
        ct_leave(p->c);
        return e;
    }
    return parse_compare(p);
}

static ct_expr *parse_and(parser *p) {
    ct_expr *e = parse_not(p);
    while (is_name(p, "and")) {
        ct_expr *x = node(p, E_AND, cur(p)->pos);
        advance(p);
        x->a = e;
        x->b = parse_not(p);
        e = x;
    }
    return e;
}

static ct_expr *parse_or(parser *p) {
    ct_expr *e = parse_and(p);
    while (is_name(p, "or")) {
        ct_expr *x = node(p, E_OR, cur(p)->pos);
        advance(p);
        x->a = e;
        x->b = parse_and(p);
        e = x;
    }
    return e;
}

/* with_cond: whether "x if c else y" is allowed (not in a for loop's
 * iterable, where "if" starts the loop filter). */
static ct_expr *parse_expr(parser *p, bool with_cond) {
    ct_enter(p->c, cur(p)->pos);
    ct_expr *e = parse_or(p);
    while (with_cond && is_name(p, "if")) {
        ct_expr *x = node(p, E_COND, cur(p)->pos);
        advance(p);
        x->a = e;
        x->b = parse_or(p);
        if (is_name(p, "else")) {
            advance(p);
            x->c = parse_expr(p, true);
        }
        e = x;
    }
    ct_leave(p->c);
    return e;
}

/* --------------------------------------------------------- statements */

static ct_stmt *stmt(parser *p, ct_stmt_kind kind, size_t pos) {
    ct_stmt *s = ct_alloc(p->c, sizeof *s);
    s->kind = kind;
    s->pos = pos;
    return s;
}

static void expect_block_end(parser *p) {
    if (cur(p)->type != T_BLOCK_END) unexpected(p, "'%}'");
    advance(p);
}

/* Statements until a "{% NAME" with NAME in ends (NULL-terminated; the
 * tokens "{%" NAME are consumed and NAME returned), or until the end of the
 * template when ends is NULL. opened names the block being read, for the
 * error when it never closes. */
static ct_body parse_body(parser *p, const char *const *ends, const char *opened, size_t opened_pos,
                          const char **which);

static ct_stmt *parse_if(parser *p, size_t pos) {
    ct_stmt *s = stmt(p, S_IF, pos);
    static const char *const ends[] = {"elif", "else", "endif", NULL};
    static const char *const end_only[] = {"endif", NULL};
    ct_expr *conds[64];
    ct_body bodies[64];
    int n = 0;
    const char *which = "elif";
    while (strcmp(which, "elif") == 0) {
        if (n == 63) ct_fail(p->c, VQ_ERR_UNSUPPORTED, cur(p)->pos, "more than 62 elif branches");
        conds[n] = parse_expr(p, true);
        expect_block_end(p);
        bodies[n] = parse_body(p, ends, "{% if %}", pos, &which);
        n++;
    }
    if (strcmp(which, "else") == 0) {
        expect_block_end(p);
        conds[n] = NULL;
        bodies[n] = parse_body(p, end_only, "{% if %}", pos, &which);
        n++;
    }
    expect_block_end(p);
    s->conds = ct_alloc(p->c, sizeof *s->conds * (size_t)n);
    s->bodies = ct_alloc(p->c, sizeof *s->bodies * (size_t)n);
    memcpy(s->conds, conds, sizeof *conds * (size_t)n);
    memcpy(s->bodies, bodies, sizeof *bodies * (size_t)n);
    s->n_branches = n;
    return s;
}

static ct_stmt *parse_for(parser *p, size_t pos) {
    ct_stmt *s = stmt(p, S_FOR, pos);
    const char *targets[8];
    int n = 0;
    bool paren = is_op(p, "(");
    if (paren) advance(p);
    do {
        if (n && !is_op(p, ",")) break;
        if (n) advance(p);
        if (n == 8) ct_fail(p->c, VQ_ERR_UNSUPPORTED, cur(p)->pos, "more than 8 loop variables");
        targets[n++] = expect_name(p, "a loop variable name");
    } while (is_op(p, ","));
    if (paren) expect_op(p, ")");
    if (!is_name(p, "in")) unexpected(p, "'in'");
    advance(p);
    s->e = parse_expr(p, false);
    if (is_name(p, "if")) {
        advance(p);
        s->cond = parse_expr(p, true);
    }
    if (is_name(p, "recursive")) ct_fail(p->c, VQ_ERR_UNSUPPORTED, cur(p)->pos, "recursive for loops are not supported");
    expect_block_end(p);
    s->targets = ct_alloc(p->c, sizeof *s->targets * (size_t)n);
    memcpy(s->targets, targets, sizeof *targets * (size_t)n);
    s->n_targets = n;
    static const char *const ends[] = {"else", "endfor", NULL};
    static const char *const end_only[] = {"endfor", NULL};
    const char *which;
    p->loops++;
    s->body = parse_body(p, ends, "{% for %}", pos, &which);
    p->loops--;
    if (strcmp(which, "else") == 0) {
        expect_block_end(p);
        s->else_body = parse_body(p, end_only, "{% for %}", pos, &which);
    }
    expect_block_end(p);
    return s;
}

static ct_stmt *parse_set(parser *p, size_t pos) {
    ct_stmt *s = stmt(p, S_SET, pos);
    s->s = expect_name(p, "a variable name after 'set'");
    s->n = strlen(s->s);
    if (is_op(p, ".")) {
        advance(p);
        s->attr = expect_name(p, "an attribute name");
    }
    if (is_op(p, ","))
        ct_fail(p->c, VQ_ERR_UNSUPPORTED, cur(p)->pos, "'{%% set a, b = ... %%}' (several targets) is not supported");
    if (cur(p)->type == T_BLOCK_END)
        ct_fail(p->c, VQ_ERR_UNSUPPORTED, pos, "block assignment '{%% set %s %%}...{%% endset %%}' is not supported", s->s);
    expect_op(p, "=");
    s->e = parse_expr(p, true);
    expect_block_end(p);
    return s;
}

static ct_body parse_body(parser *p, const char *const *ends, const char *opened, size_t opened_pos,
                          const char **which) {
    ct_enter(p->c, cur(p)->pos);
    ct_stmt **items = NULL;
    int n = 0, cap = 0;
    for (;;) {
        ct_tok *t = cur(p);
        ct_stmt *s = NULL;
        if (t->type == T_EOF) {
            if (ends) {
                int last = 0;
                while (ends[last + 1]) last++;
                ct_fail(p->c, VQ_ERR_FORMAT, opened_pos, "unexpected end of template: %s is not closed (expected {%% %s %%})",
                        opened, ends[last]);
            }
            break;
        }
        if (t->type == T_DATA) {
            s = stmt(p, S_DATA, t->pos);
            s->s = t->s;
            s->n = t->n;
            advance(p);
        } else if (t->type == T_VAR_BEGIN) {
            advance(p);
            s = stmt(p, S_OUTPUT, t->pos);
            s->e = parse_expr(p, true);
            if (cur(p)->type != T_VAR_END) unexpected(p, "'}}'");
            advance(p);
        } else if (t->type == T_BLOCK_BEGIN) {
            advance(p);
            ct_tok *name = cur(p);
            if (name->type != T_NAME) unexpected(p, "a statement name after '{%'");
            for (int k = 0; ends && ends[k]; k++)
                if (tok_is(name, T_NAME, ends[k])) {
                    *which = ends[k];
                    advance(p);
                    ct_leave(p->c);
                    return (ct_body){items, n};
                }
            advance(p);
            if (tok_is(name, T_NAME, "if")) {
                s = parse_if(p, t->pos);
            } else if (tok_is(name, T_NAME, "for")) {
                s = parse_for(p, t->pos);
            } else if (tok_is(name, T_NAME, "set")) {
                s = parse_set(p, t->pos);
            } else if (tok_is(name, T_NAME, "break") || tok_is(name, T_NAME, "continue")) {
                /* transformers enables jinja2's loopcontrols extension */
                bool brk = tok_is(name, T_NAME, "break");
                if (!p->loops)
                    ct_fail(p->c, VQ_ERR_FORMAT, t->pos, "{%% %s %%} outside a for loop", brk ? "break" : "continue");
                expect_block_end(p);
                s = stmt(p, brk ? S_BREAK : S_CONTINUE, t->pos);
            } else if (tok_is(name, T_NAME, "generation")) {
                /* transformers' {% generation %} marks assistant text; it
                 * renders its body unchanged */
                static const char *const end_gen[] = {"endgeneration", NULL};
                const char *w;
                expect_block_end(p);
                s = stmt(p, S_BLOCK, t->pos);
                s->body = parse_body(p, end_gen, "{% generation %}", t->pos, &w);
                expect_block_end(p);
            } else {
                static const char *const closers[] = {"elif", "else", "endif", "endfor", "endgeneration", "endset", NULL};
                for (int k = 0; closers[k]; k++)
                    if (tok_is(name, T_NAME, closers[k]))
                        ct_fail(p->c, VQ_ERR_FORMAT, t->pos, "unexpected {%% %s %%}%s%s", closers[k],
                                opened ? " inside " : " outside any block", opened ? opened : "");
                static const char *const jinja[] = {"macro", "call", "filter", "include", "import", "from", "extends",
                                                    "block", "raw", "with", "autoescape", "do", "trans", NULL};
                for (int k = 0; jinja[k]; k++)
                    if (tok_is(name, T_NAME, jinja[k]))
                        ct_fail(p->c, VQ_ERR_UNSUPPORTED, t->pos, "the {%% %s %%} statement is not supported", jinja[k]);
                ct_fail(p->c, VQ_ERR_FORMAT, t->pos, "unknown statement '{%% %.*s %%}'", (int)(name->n < 40 ? name->n : 40),
                        name->s);
            }
        } else {
            char buf[64];
            ct_fail(p->c, VQ_ERR_FORMAT, t->pos, "unexpected %s", describe(t, buf, sizeof buf));
        }
        if (n == cap) {
            cap = cap ? cap * 2 : 8;
            ct_stmt **grown = ct_alloc(p->c, sizeof *grown * (size_t)cap);
            if (n) memcpy(grown, items, sizeof *items * (size_t)n);
            items = grown;
        }
        items[n++] = s;
    }
    ct_leave(p->c);
    return (ct_body){items, n};
}

ct_body ct_parse(ct_ctx *c) {
    parser p = {.c = c};
    lex(&p);
    const char *which = NULL;
    return parse_body(&p, NULL, NULL, 0, &which);
}
