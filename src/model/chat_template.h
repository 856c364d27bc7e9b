/*
 * The Jinja2 subset behind chat templates, shared by the parser
 * (chat_parse.c) and the evaluator (chat_template.c).
 *
 * A render owns one ct_ctx: every node and value lives in its arena, which
 * is freed whole at the end, so nothing is freed piecemeal. Errors anywhere
 * (lexing, parsing, evaluation) go through ct_fail(), which records the
 * message with the template position and longjmps back to the render call:
 * an interpreter would otherwise check a status after nearly every line.
 */
#ifndef VQ_CHAT_TEMPLATE_H
#define VQ_CHAT_TEMPLATE_H

#include "vq_internal.h"

#include <setjmp.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* Limits that keep a hostile template from exhausting the machine. */
#define CT_MAX_MEMORY ((size_t)256 << 20) /* arena bytes for one render */
#define CT_MAX_OUTPUT ((size_t)64 << 20)  /* rendered bytes */
#define CT_MAX_DEPTH 100                  /* nesting of expressions and blocks */

/* ------------------------------------------------------------- the AST */

typedef enum {
    E_STR, E_INT, E_FLOAT, E_BOOL, E_NONE, /* literals */
    E_NAME,   /* s */
    E_ATTR,   /* a.s */
    E_ITEM,   /* a[b] */
    E_SLICE,  /* a[b:c:d], any of b, c, d NULL */
    E_CALL,   /* a(args) */
    E_FILTER, /* a | s(args) */
    E_TEST,   /* a is [not] s(args); negate */
    E_BIN,    /* a op b: + - * / // % ** ~ */
    E_NEG, E_POS, E_NOT,
    E_AND, E_OR,
    E_CMP,    /* a ops[0] args[0] ops[1] args[1] ... (== != < <= > >= in notin) */
    E_COND,   /* a if b else c (c NULL: undefined) */
    E_LIST, E_TUPLE, /* args */
    E_DICT    /* args: key0, value0, key1, value1, ... */
} ct_expr_kind;

typedef struct ct_expr ct_expr;
struct ct_expr {
    ct_expr_kind kind;
    size_t pos;          /* byte offset in the template, for messages */
    const char *s;       /* E_STR (n bytes), names of variables, attributes, filters, tests, operators */
    size_t n;
    int64_t i;           /* E_INT, E_BOOL */
    double f;            /* E_FLOAT */
    bool negate;         /* E_TEST with "is not" */
    ct_expr *a, *b, *c, *d;
    ct_expr **args;      /* call / filter / test arguments, list items, compare operands */
    const char **names;  /* keyword of each argument (NULL: positional); E_CMP: the operators */
    int n_args;
};

typedef enum { S_DATA, S_OUTPUT, S_IF, S_FOR, S_SET, S_BLOCK, S_BREAK, S_CONTINUE } ct_stmt_kind;

typedef struct ct_stmt ct_stmt;
typedef struct {
    ct_stmt **items;
    int n;
} ct_body;

struct ct_stmt {
    ct_stmt_kind kind;
    size_t pos;
    const char *s;       /* S_DATA text, S_SET variable */
    size_t n;
    const char *attr;    /* S_SET of a namespace attribute (ns.attr = ...), else NULL */
    ct_expr *e;          /* S_OUTPUT, S_SET value, S_FOR iterable */
    ct_expr *cond;       /* S_FOR filter ("for x in y if cond"), or NULL */
    const char **targets;/* S_FOR loop variables */
    int n_targets;
    ct_expr **conds;     /* S_IF: condition of each branch, NULL for else */
    ct_body *bodies;     /* S_IF branch bodies */
    int n_branches;
    ct_body body;        /* S_FOR, S_BLOCK */
    ct_body else_body;   /* S_FOR: run when nothing was iterated */
};

/* ------------------------------------------------------------- context */

typedef struct ct_chunk ct_chunk;

typedef struct {
    const char *src;     /* the template with newlines normalized */
    size_t len;
    ct_chunk *chunks;    /* the arena */
    size_t arena_bytes;
    jmp_buf on_error;
    vq_status status;
    char message[768];
    int depth;           /* recursion guard */
    char *out;           /* the rendered text (malloc'd, not in the arena) */
    size_t out_len, out_cap;
} ct_ctx;

/* Zeroed memory from the arena (fails over CT_MAX_MEMORY). */
void *ct_alloc(ct_ctx *c, size_t bytes);
char *ct_strndup(ct_ctx *c, const char *s, size_t n);
/* Records "chat template line L, column C: MESSAGE" and unwinds. */
_Noreturn void ct_fail(ct_ctx *c, vq_status st, size_t pos, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 4, 5)))
#endif
    ;
/* Enters one level of recursion; fails past CT_MAX_DEPTH. ct_leave undoes it. */
void ct_enter(ct_ctx *c, size_t pos);
void ct_leave(ct_ctx *c);
/* Lexes and parses c->src into a statement list. */
ct_body ct_parse(ct_ctx *c);
/* Appends the UTF-8 encoding of code point cp to buf (at most 4 bytes); returns the length. */
int ct_utf8_put(uint32_t cp, char *buf);
/* Decodes the code point at s[*i] (valid UTF-8 assumed) and advances *i. */
uint32_t ct_utf8_next(const char *s, size_t n, size_t *i);
/* Python's str.isspace() (and the regex \s) for one code point. */
bool ct_py_space(uint32_t cp);

#endif
