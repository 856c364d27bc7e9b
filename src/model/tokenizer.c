/*
 * BPE read from a Hugging Face tokenizer.json, in one of two styles:
 * byte-level (GPT-2, Llama 3, Qwen2) or SentencePiece-like (Llama 2,
 * Mistral), where spaces are spelled U+2581 ("\u2581", the metaspace) and
 * merges work on characters.
 *
 * Encoding, in the order Hugging Face tokenizers applies it:
 *   1. added tokens ("<|eot_id|>", "<s>" ...) are found literally,
 *      leftmost-longest, and become one id each; the text between them is a
 *      segment;
 *   2. byte-level: each segment is cut by the pre-tokenizer: every Split
 *      regex in turn (the matches and the gaps between them are pieces), then
 *      ByteLevel (optionally a prefix space, and with use_regex the GPT-2
 *      pattern); each piece's bytes become one symbol per byte, spelled with
 *      the ByteLevel byte->character table;
 *      SentencePiece-like: spaces become metaspaces and a metaspace may be
 *      put first (the Prepend normalizer on every segment, or the Metaspace
 *      pre-tokenizer on the first one only); the segment is one piece, and
 *      each character a symbol, or its <0xXX> byte tokens with byte_fallback;
 *   3. adjacent symbols are merged, the pair of lowest merge rank first
 *      (leftmost on ties), until no pair has a merge.
 * Decoding maps each token back to bytes (and undoes the metaspaces).
 */
#include "model/model_internal.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <cjson/cJSON.h>
#include <pcre2.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Ids above this are taken for a corrupt file rather than a big vocab. */
#define TOK_MAX_ID (1 << 24)
#define TOK_MAX_REGEX 8

/* U+2581, which SentencePiece-like vocabularies use for a space */
static const char metaspace[] = "\xe2\x96\x81";

/* When a SentencePiece-like segment gets a metaspace put first. */
enum { PREPEND_NEVER, PREPEND_ALWAYS, PREPEND_FIRST };

/* What Hugging Face's ByteLevel use_regex=true splits with (GPT-2). */
static const char gpt2_pattern[] =
    "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+";

/* A string -> id table with open addressing; keys point into the arena. */
typedef struct {
    const char *key;
    uint32_t len;
    int32_t id;
} str_slot;

typedef struct {
    uint64_t pair;  /* left id << 32 | right id; 0 with rank < 0 is empty */
    int32_t rank;
    int32_t result;
} merge_slot;

typedef struct {
    const char *text;
    size_t len;
    int32_t id;
    int special;
} added_token;

struct vq_tokenizer {
    char *arena;               /* vocab keys, pieces, added contents */
    size_t arena_used, arena_cap;
    str_slot *vocab;           /* byte-level spelling -> id */
    size_t vocab_cap;          /* a power of two */
    merge_slot *merges;
    size_t merges_cap;         /* a power of two */
    int32_t n_ids;             /* 1 + the largest id */
    const char **piece;        /* [n_ids] decoded bytes, NULL if unused */
    uint32_t *piece_len;       /* [n_ids] */
    const char **text;         /* [n_ids] the token as tokenizer.json spells it */
    uint32_t *text_len;        /* [n_ids] */
    uint8_t *special;          /* [n_ids] */
    added_token *added;        /* sorted by first byte, then longest first */
    int n_added;
    int added_start[257];      /* added[added_start[b] .. added_start[b+1]) start with byte b */
    int32_t byte_id[256];      /* id of each byte's one-character token, -1 if none */
    uint16_t byte_char[256];   /* ByteLevel: byte -> code point */
    int16_t char_byte[512];    /* and back; -1 for code points no byte uses */
    int32_t fallback_id[256];  /* id of each byte's <0xXX> token, -1 if none */
    int32_t unk_id;            /* -1 when there is no unk token */
    int byte_fallback;         /* a character without a token becomes <0xXX> tokens */
    int fuse_unk;              /* consecutive unknown characters become one unk */
    int ignore_merges;         /* a piece that is a vocab entry is taken whole */
    pcre2_code *regex[TOK_MAX_REGEX]; /* the pre-tokenizer's splits, in order */
    int n_regex;
    int bytelevel_level;       /* regex index before which ByteLevel prefixes */
    int add_prefix_space;
    int32_t bos_prepend;       /* what the post-processor puts first, -1 if nothing */
    int32_t eos;               /* tokenizer_config.json's eos_token, -1 if none */
    int sp;                    /* SentencePiece-like rather than byte-level */
    int sp_normalizer;         /* the metaspaces come from the normalizer */
    int sp_prepend;            /* PREPEND_* */
    int sp_prepend_unless_meta;/* Metaspace: not before a segment that starts with one */
    int dec_bytes;             /* the decoder turns <0xXX> tokens into their byte */
    int dec_first_meta;        /* Metaspace decoder: drops the first token's metaspaces */
    int dec_strip;             /* Strip decoder: leading spaces taken off the text */
};

/* ------------------------------------------------------------ small parts */

static uint64_t hash_bytes(const char *s, size_t n) {
    uint64_t h = 1469598103934665603ull; /* FNV-1a */
    for (size_t i = 0; i < n; i++) h = (h ^ (uint8_t)s[i]) * 1099511628211ull;
    return h;
}

static uint64_t hash_pair(uint64_t x) {
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdull;
    x ^= x >> 33;
    return x;
}

static size_t pow2_at_least(size_t n) {
    size_t c = 16;
    while (c < n) c *= 2;
    return c;
}

static char *arena_add(vq_tokenizer *t, const char *s, size_t n) {
    if (t->arena_used + n + 1 > t->arena_cap) return NULL;
    char *p = t->arena + t->arena_used;
    memcpy(p, s, n);
    p[n] = '\0';
    t->arena_used += n + 1;
    return p;
}

static int32_t vocab_get(const vq_tokenizer *t, const char *s, size_t n) {
    size_t mask = t->vocab_cap - 1;
    for (size_t i = hash_bytes(s, n) & mask;; i = (i + 1) & mask) {
        const str_slot *e = &t->vocab[i];
        if (!e->key) return -1;
        if (e->len == n && memcmp(e->key, s, n) == 0) return e->id;
    }
}

/* Inserts key -> id; returns the id already there for a duplicate key. */
static int32_t vocab_put(vq_tokenizer *t, const char *key, size_t n, int32_t id) {
    size_t mask = t->vocab_cap - 1;
    for (size_t i = hash_bytes(key, n) & mask;; i = (i + 1) & mask) {
        str_slot *e = &t->vocab[i];
        if (!e->key) {
            e->key = key;
            e->len = (uint32_t)n;
            e->id = id;
            return -1;
        }
        if (e->len == n && memcmp(e->key, key, n) == 0) return e->id;
    }
}

static const merge_slot *merge_get(const vq_tokenizer *t, int32_t a, int32_t b) {
    uint64_t key = (uint64_t)(uint32_t)a << 32 | (uint32_t)b;
    size_t mask = t->merges_cap - 1;
    for (size_t i = hash_pair(key) & mask;; i = (i + 1) & mask) {
        const merge_slot *e = &t->merges[i];
        if (e->rank < 0) return NULL;
        if (e->pair == key) return e;
    }
}

/* The GPT-2 byte -> character table: printable Latin-1 bytes stand for
 * themselves, the other 68 bytes take code points from 256 up, so every
 * byte is a visible character and none is a space. */
static void init_byte_chars(vq_tokenizer *t) {
    int next = 256;
    for (int c = 0; c < 512; c++) t->char_byte[c] = -1;
    for (int b = 0; b < 256; b++) {
        bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
        t->byte_char[b] = (uint16_t)(printable ? b : next++);
        t->char_byte[t->byte_char[b]] = (int16_t)b;
    }
}

/* Code points below 0x800 take at most two UTF-8 bytes. */
static size_t put_char(char *out, unsigned cp) {
    if (cp < 0x80) {
        out[0] = (char)cp;
        return 1;
    }
    out[0] = (char)(0xC0 | (cp >> 6));
    out[1] = (char)(0x80 | (cp & 0x3F));
    return 2;
}

/* Length of a valid UTF-8 sequence at s (n bytes available), 0 if invalid.
 * Strict: no overlong forms, no surrogates, nothing above U+10FFFF. */
static size_t utf8_len(const uint8_t *s, size_t n, uint32_t *cp) {
    uint8_t c = s[0];
    if (c < 0x80) {
        *cp = c;
        return 1;
    }
    size_t k;
    uint32_t v, min;
    if (c >= 0xC2 && c <= 0xDF) k = 2, v = c & 0x1F, min = 0x80;
    else if (c >= 0xE0 && c <= 0xEF) k = 3, v = c & 0x0F, min = 0x800;
    else if (c >= 0xF0 && c <= 0xF4) k = 4, v = c & 0x07, min = 0x10000;
    else return 0;
    if (n < k) return 0;
    for (size_t i = 1; i < k; i++) {
        if ((s[i] & 0xC0) != 0x80) return 0;
        v = v << 6 | (s[i] & 0x3F);
    }
    if (v < min || v > 0x10FFFF || (v >= 0xD800 && v <= 0xDFFF)) return 0;
    *cp = v;
    return k;
}

/* The bytes a token's text stands for, as the ByteLevel decoder gives them:
 * each character mapped back to its byte, or, when some character is not in
 * the table, the text's own UTF-8 bytes. Writes at most strlen(s) bytes. */
static size_t token_bytes(const int16_t *char_byte, const char *s, size_t n, char *out) {
    size_t o = 0;
    for (size_t i = 0; i < n;) {
        uint32_t cp;
        size_t k = utf8_len((const uint8_t *)s + i, n - i, &cp);
        int b = k && cp < 512 ? char_byte[cp] : -1;
        if (b < 0) {
            memcpy(out, s, n);
            return n;
        }
        out[o++] = (char)b;
        i += k;
    }
    return o;
}

/* The byte b of a <0xXX> token, as the ByteFallback decoder reads it. */
static bool byte_token(const char *s, size_t n, int *b) {
    if (n != 6 || memcmp(s, "<0x", 3) != 0 || s[5] != '>') return false;
    int v = 0;
    for (int i = 3; i < 5; i++) {
        char c = s[i];
        if (c >= '0' && c <= '9') v = v * 16 + c - '0';
        else if (c >= 'a' && c <= 'f') v = v * 16 + c - 'a' + 10;
        else if (c >= 'A' && c <= 'F') v = v * 16 + c - 'A' + 10;
        else return false;
    }
    *b = v;
    return true;
}

/* The bytes a SentencePiece-like token stands for: a byte token its byte,
 * anything else its text with metaspaces as spaces. Writes at most n bytes. */
static size_t sp_token_bytes(const char *s, size_t n, char *out) {
    int b;
    if (byte_token(s, n, &b)) {
        out[0] = (char)b;
        return 1;
    }
    size_t o = 0;
    for (size_t i = 0; i < n;) {
        if (n - i >= 3 && memcmp(s + i, metaspace, 3) == 0) {
            out[o++] = ' ';
            i += 3;
        } else {
            out[o++] = s[i++];
        }
    }
    return o;
}

void vq_tokenizer_free(vq_tokenizer *t) {
    if (!t) return;
    for (int i = 0; i < t->n_regex; i++) pcre2_code_free(t->regex[i]);
    free(t->arena);
    free(t->vocab);
    free(t->merges);
    free(t->piece);
    free(t->piece_len);
    free(t->text);
    free(t->text_len);
    free(t->special);
    free(t->added);
    free(t);
}

/* ------------------------------------------------------------ loading */

static vq_status add_regex(vq_tokenizer *t, const char *path, const char *pattern, bool literal) {
    if (t->n_regex == TOK_MAX_REGEX)
        return vq_fail(VQ_ERR_UNSUPPORTED, "%s: more than %d pre-tokenizer splits", path, TOK_MAX_REGEX);
    int err;
    PCRE2_SIZE at;
    uint32_t opts = PCRE2_UTF | PCRE2_UCP | (literal ? PCRE2_LITERAL : 0);
    pcre2_code *re = pcre2_compile((PCRE2_SPTR)pattern, PCRE2_ZERO_TERMINATED, opts, &err, &at, NULL);
    if (!re) {
        PCRE2_UCHAR msg[200];
        pcre2_get_error_message(err, msg, sizeof msg);
        return vq_fail(VQ_ERR_FORMAT, "%s: pre-tokenizer regex '%s' does not compile at offset %zu: %s", path,
                       pattern, (size_t)at, (const char *)msg);
    }
    /* JIT makes matching several times faster; without it the interpreter
     * gives the same matches. */
    pcre2_jit_compile(re, PCRE2_JIT_COMPLETE);
    t->regex[t->n_regex++] = re;
    return VQ_OK;
}

static const char *str_field(const cJSON *o, const char *key) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    return cJSON_IsString(v) ? v->valuestring : NULL;
}

/* true when the boolean field is present and true */
static bool flag(const cJSON *o, const char *key) {
    return cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(o, key));
}

static vq_status parse_bytelevel(vq_tokenizer *t, const char *path, const cJSON *bl) {
    t->bytelevel_level = t->n_regex;
    t->add_prefix_space = flag(bl, "add_prefix_space");
    /* use_regex defaults to true in Hugging Face tokenizers */
    const cJSON *ur = cJSON_GetObjectItemCaseSensitive(bl, "use_regex");
    if (!ur || cJSON_IsTrue(ur)) return add_regex(t, path, gpt2_pattern, false);
    return VQ_OK;
}

static vq_status parse_split(vq_tokenizer *t, const char *path, const cJSON *sp) {
    const char *behavior = str_field(sp, "behavior");
    if (!behavior || strcmp(behavior, "Isolated") != 0)
        return vq_fail(VQ_ERR_UNSUPPORTED, "%s: Split behavior '%s' is not supported (supported: Isolated)", path,
                       behavior ? behavior : "(missing)");
    if (flag(sp, "invert")) return vq_fail(VQ_ERR_UNSUPPORTED, "%s: Split with invert=true is not supported", path);
    const cJSON *pat = cJSON_GetObjectItemCaseSensitive(sp, "pattern");
    const char *re = str_field(pat, "Regex");
    const char *lit = str_field(pat, "String");
    if (!re && !lit) return vq_fail(VQ_ERR_FORMAT, "%s: Split pattern must be {\"Regex\": ...} or {\"String\": ...}", path);
    return add_regex(t, path, re ? re : lit, re == NULL);
}

static vq_status parse_pre_tokenizer(vq_tokenizer *t, const char *path, const cJSON *pt) {
    const char *type = str_field(pt, "type");
    if (type && strcmp(type, "ByteLevel") == 0) return parse_bytelevel(t, path, pt);
    if (!type || strcmp(type, "Sequence") != 0)
        return vq_fail(VQ_ERR_UNSUPPORTED,
                       "%s: pre_tokenizer '%s' is not supported (supported: ByteLevel, a Sequence of Split then "
                       "ByteLevel, Metaspace, or none with a metaspace normalizer)",
                       path, type ? type : "null");
    const cJSON *list = cJSON_GetObjectItemCaseSensitive(pt, "pretokenizers");
    if (!cJSON_IsArray(list)) return vq_fail(VQ_ERR_FORMAT, "%s: Sequence pre_tokenizer without \"pretokenizers\"", path);
    int i = 0, n = cJSON_GetArraySize(list);
    for (const cJSON *e = list->child; e; e = e->next, i++) {
        const char *et = str_field(e, "type");
        vq_status st;
        if (et && strcmp(et, "Split") == 0 && i < n - 1) st = parse_split(t, path, e);
        else if (et && strcmp(et, "ByteLevel") == 0 && i == n - 1) st = parse_bytelevel(t, path, e);
        else
            st = vq_fail(VQ_ERR_UNSUPPORTED,
                         "%s: pre_tokenizer step %d '%s' is not supported (supported: Split steps, then ByteLevel last)",
                         path, i, et ? et : "(no type)");
        if (st != VQ_OK) return st;
    }
    if (i == 0 || t->bytelevel_level < 0)
        return vq_fail(VQ_ERR_UNSUPPORTED, "%s: the pre_tokenizer Sequence must end with ByteLevel", path);
    return VQ_OK;
}

static bool is_type(const char *type, const char *want) { return type && strcmp(type, want) == 0; }

/* A Replace normalizer or decoder step: from -> to with a String pattern. */
static bool is_replace(const cJSON *o, const char *from, const char *to) {
    const char *pat = str_field(cJSON_GetObjectItemCaseSensitive(o, "pattern"), "String");
    const char *content = str_field(o, "content");
    return pat && content && strcmp(pat, from) == 0 && strcmp(content, to) == 0;
}

/* Llama 2: Sequence[Prepend("\u2581"), Replace(" " -> "\u2581")] (or the
 * Replace alone, which puts no metaspace first). */
static vq_status parse_sp_normalizer(vq_tokenizer *t, const char *path, const cJSON *norm) {
    const cJSON *list = cJSON_GetObjectItemCaseSensitive(norm, "normalizers");
    const cJSON *first = is_type(str_field(norm, "type"), "Sequence") ? (list ? list->child : NULL) : norm;
    bool replace = false;
    int i = 0;
    for (const cJSON *e = first; e; e = e == norm ? NULL : e->next, i++) {
        const char *type = str_field(e, "type");
        const char *pre = str_field(e, "prepend");
        if (is_type(type, "Prepend") && pre && strcmp(pre, metaspace) == 0) t->sp_prepend = PREPEND_ALWAYS;
        else if (is_type(type, "Replace") && is_replace(e, " ", metaspace)) replace = true;
        else
            return vq_fail(VQ_ERR_UNSUPPORTED,
                           "%s: normalizer '%s' (step %d) is not supported (supported: none, NFC, or Prepend(\"%s\") "
                           "then Replace(\" \" -> \"%s\") as Llama 2 has)",
                           path, type ? type : "(no type)", i, metaspace, metaspace);
    }
    if (!replace)
        return vq_fail(VQ_ERR_UNSUPPORTED, "%s: a normalizer without Replace(\" \" -> \"%s\") is not supported", path,
                       metaspace);
    t->sp_normalizer = 1;
    return VQ_OK;
}

/* Metaspace, as pre-tokenizer or decoder: sets *prepend from prepend_scheme
 * (or the older add_prefix_space). */
static vq_status parse_metaspace(const char *path, const cJSON *ms, int *prepend) {
    const char *rep = str_field(ms, "replacement");
    if (!rep || strcmp(rep, metaspace) != 0)
        return vq_fail(VQ_ERR_UNSUPPORTED, "%s: Metaspace replacement '%s' is not supported (supported: \"%s\")", path,
                       rep ? rep : "(missing)", metaspace);
    const char *scheme = str_field(ms, "prepend_scheme");
    if (!scheme) *prepend = flag(ms, "add_prefix_space") ? PREPEND_ALWAYS : PREPEND_NEVER;
    else if (strcmp(scheme, "first") == 0) *prepend = PREPEND_FIRST;
    else if (strcmp(scheme, "always") == 0) *prepend = PREPEND_ALWAYS;
    else if (strcmp(scheme, "never") == 0) *prepend = PREPEND_NEVER;
    else return vq_fail(VQ_ERR_UNSUPPORTED, "%s: Metaspace prepend_scheme '%s' is not supported", path, scheme);
    return VQ_OK;
}

/* Llama 2's decoder Sequence[Replace("\u2581" -> " "), ByteFallback, Fuse,
 * Strip(" ", start, 0)] (Strip optional), or Metaspace. */
static vq_status parse_sp_decoder(vq_tokenizer *t, const char *path, const cJSON *dec) {
    const char *type = str_field(dec, "type");
    if (is_type(type, "Metaspace")) {
        int prepend;
        vq_status st = parse_metaspace(path, dec, &prepend);
        t->dec_first_meta = prepend != PREPEND_NEVER;
        return st;
    }
    static const char *const steps[] = {"Replace", "ByteFallback", "Fuse", "Strip"};
    int i = 0;
    const cJSON *e = NULL;
    if (is_type(type, "Sequence")) {
        const cJSON *list = cJSON_GetObjectItemCaseSensitive(dec, "decoders");
        for (e = list ? list->child : NULL; e; e = e->next, i++) {
            const char *et = str_field(e, "type");
            const char *content = str_field(e, "content");
            const cJSON *start = cJSON_GetObjectItemCaseSensitive(e, "start");
            const cJSON *stop = cJSON_GetObjectItemCaseSensitive(e, "stop");
            if (i == 4 || !is_type(et, steps[i])) break;
            if (i == 0 && !is_replace(e, metaspace, " ")) break;
            if (i == 3) {
                /* Strip after Fuse sees the whole text as one token. */
                if (!content || strcmp(content, " ") != 0 || !cJSON_IsNumber(start) || start->valueint < 0 ||
                    !cJSON_IsNumber(stop) || stop->valueint != 0)
                    break;
                t->dec_strip = start->valueint;
            }
        }
    }
    if (e || i < 3)
        return vq_fail(VQ_ERR_UNSUPPORTED,
                       "%s: decoder '%s'%s is not supported with a metaspace vocab (supported: Metaspace, or a Sequence "
                       "of Replace(\"%s\" -> \" \"), ByteFallback, Fuse and optionally Strip(\" \", start, 0))",
                       path, type ? type : "null", e ? " (a step of it)" : "", metaspace);
    t->dec_bytes = 1;
    return VQ_OK;
}

/* Checks the parts of tokenizer.json around the model and picks the style:
 * SentencePiece-like when the Metaspace pre-tokenizer or a metaspace
 * normalizer (with no pre-tokenizer) is there, byte-level otherwise. */
static vq_status parse_pipeline(vq_tokenizer *t, const char *path, const cJSON *root) {
    const cJSON *norm = cJSON_GetObjectItemCaseSensitive(root, "normalizer");
    const cJSON *pt = cJSON_GetObjectItemCaseSensitive(root, "pre_tokenizer");
    const cJSON *dec = cJSON_GetObjectItemCaseSensitive(root, "decoder");
    const char *ntype = str_field(norm, "type"), *ptype = str_field(pt, "type");
    bool no_norm = !norm || cJSON_IsNull(norm), no_pt = !pt || cJSON_IsNull(pt);
    t->bytelevel_level = -1;
    vq_status st;
    if (is_type(ptype, "Metaspace")) {
        t->sp = 1;
        if (!no_norm)
            return vq_fail(VQ_ERR_UNSUPPORTED, "%s: normalizer '%s' with the Metaspace pre-tokenizer is not supported",
                           path, ntype ? ntype : "(no type)");
        /* Hugging Face splits when "split" is missing */
        const cJSON *split = cJSON_GetObjectItemCaseSensitive(pt, "split");
        if (!cJSON_IsFalse(split))
            return vq_fail(VQ_ERR_UNSUPPORTED, "%s: Metaspace pre-tokenizer with split=true is not supported", path);
        st = parse_metaspace(path, pt, &t->sp_prepend);
        t->sp_prepend_unless_meta = 1;
    } else if (no_pt && !no_norm && !is_type(ntype, "NFC")) {
        t->sp = 1;
        st = parse_sp_normalizer(t, path, norm);
    } else {
        /* Qwen2 declares NFC. Text is taken to be NFC already (nearly all
         * text is); decomposed input would tokenize differently. */
        if (!no_norm && !is_type(ntype, "NFC"))
            return vq_fail(VQ_ERR_UNSUPPORTED, "%s: normalizer '%s' is not supported (supported: none, NFC)", path,
                           ntype ? ntype : "(no type)");
        st = parse_pre_tokenizer(t, path, pt);
    }
    if (st != VQ_OK) return st;
    if (t->sp) return parse_sp_decoder(t, path, dec);
    const char *dtype = str_field(dec, "type");
    if (!is_type(dtype, "ByteLevel"))
        return vq_fail(VQ_ERR_UNSUPPORTED, "%s: decoder '%s' is not supported with a byte-level vocab (supported: ByteLevel)",
                       path, dtype ? dtype : "null");
    return VQ_OK;
}

/* The token a TemplateProcessing post-processor puts before a single
 * sequence (Llama 3's <|begin_of_text|>), looked for also inside a Sequence
 * of processors. Needs the vocab and added tokens to be read already. */
static void parse_post_processor(vq_tokenizer *t, const cJSON *pp) {
    const char *type = str_field(pp, "type");
    if (!type) return;
    if (strcmp(type, "Sequence") == 0) {
        const cJSON *e;
        cJSON_ArrayForEach(e, cJSON_GetObjectItemCaseSensitive(pp, "processors")) parse_post_processor(t, e);
        return;
    }
    if (strcmp(type, "TemplateProcessing") != 0) return;
    const cJSON *first = cJSON_GetArrayItem(cJSON_GetObjectItemCaseSensitive(pp, "single"), 0);
    const cJSON *sp = cJSON_GetObjectItemCaseSensitive(first, "SpecialToken");
    const char *name = str_field(sp, "id");
    if (!name) return;
    const cJSON *entry = cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(pp, "special_tokens"), name);
    const cJSON *id = cJSON_GetArrayItem(cJSON_GetObjectItemCaseSensitive(entry, "ids"), 0);
    if (cJSON_IsNumber(id) && id->valueint >= 0 && id->valueint < t->n_ids) t->bos_prepend = id->valueint;
    else t->bos_prepend = vq_tokenizer_find(t, name);
}

/* Reads model.vocab, model.merges and added_tokens into t. */
static vq_status parse_model(vq_tokenizer *t, const char *path, const cJSON *root) {
    const cJSON *model = cJSON_GetObjectItemCaseSensitive(root, "model");
    const char *type = str_field(model, "type");
    if (!cJSON_IsObject(model)) return vq_fail(VQ_ERR_FORMAT, "%s: missing \"model\" object", path);
    if (type && strcmp(type, "BPE") != 0)
        return vq_fail(VQ_ERR_UNSUPPORTED, "%s: model type '%s' is not supported (supported: BPE)", path, type);
    t->byte_fallback = flag(model, "byte_fallback");
    t->fuse_unk = flag(model, "fuse_unk");
    const cJSON *dropout = cJSON_GetObjectItemCaseSensitive(model, "dropout");
    if (dropout && !cJSON_IsNull(dropout))
        return vq_fail(VQ_ERR_UNSUPPORTED, "%s: BPE dropout is not supported (it is for training)", path);
    const char *csp = str_field(model, "continuing_subword_prefix");
    const char *eow = str_field(model, "end_of_word_suffix");
    if ((csp && *csp) || (eow && *eow))
        return vq_fail(VQ_ERR_UNSUPPORTED, "%s: BPE continuing_subword_prefix / end_of_word_suffix are not supported",
                       path);
    t->ignore_merges = flag(model, "ignore_merges");

    const cJSON *vocab = cJSON_GetObjectItemCaseSensitive(model, "vocab");
    const cJSON *merges = cJSON_GetObjectItemCaseSensitive(model, "merges");
    const cJSON *added = cJSON_GetObjectItemCaseSensitive(root, "added_tokens");
    if (!cJSON_IsObject(vocab)) return vq_fail(VQ_ERR_FORMAT, "%s: missing \"model.vocab\" object", path);
    if (!cJSON_IsArray(merges)) return vq_fail(VQ_ERR_FORMAT, "%s: missing \"model.merges\" array", path);
    if (added && !cJSON_IsArray(added) && !cJSON_IsNull(added))
        return vq_fail(VQ_ERR_FORMAT, "%s: \"added_tokens\" is not an array", path);

    /* Sizes first, so that everything is allocated once. A piece is never
     * longer than its spelling, so the arena holds each string twice. */
    size_t n_vocab = 0, n_added = 0, bytes = 0;
    int32_t max_id = -1;
    for (const cJSON *e = vocab->child; e; e = e->next) {
        if (!cJSON_IsNumber(e) || e->valuedouble < 0 || e->valuedouble >= TOK_MAX_ID ||
            e->valuedouble != (double)(int32_t)e->valuedouble)
            return vq_fail(VQ_ERR_FORMAT, "%s: vocab entry '%s' has id %s, expected an integer in [0, %d)", path,
                           e->string, cJSON_IsNumber(e) ? "out of range" : "that is not a number", TOK_MAX_ID);
        if (e->valueint > max_id) max_id = e->valueint;
        n_vocab++;
        bytes += 2 * (strlen(e->string) + 1);
    }
    for (const cJSON *e = added ? added->child : NULL; e; e = e->next) {
        const cJSON *id = cJSON_GetObjectItemCaseSensitive(e, "id");
        const char *content = str_field(e, "content");
        if (!cJSON_IsNumber(id) || id->valuedouble < 0 || id->valuedouble >= TOK_MAX_ID ||
            id->valuedouble != (double)(int32_t)id->valuedouble || !content || !*content)
            return vq_fail(VQ_ERR_FORMAT,
                           "%s: added token %zu needs an \"id\" in [0, %d) and a non-empty \"content\" string", path,
                           n_added, TOK_MAX_ID);
        if (flag(e, "single_word") || flag(e, "lstrip") || flag(e, "rstrip"))
            return vq_fail(VQ_ERR_UNSUPPORTED, "%s: added token '%s': single_word, lstrip and rstrip are not supported",
                           path, content);
        /* Such a token is looked for in the normalized text, after the
         * metaspace normalizer has changed it. */
        const cJSON *nz = cJSON_GetObjectItemCaseSensitive(e, "normalized");
        if (t->sp_normalizer && (nz ? cJSON_IsTrue(nz) : !flag(e, "special")))
            return vq_fail(VQ_ERR_UNSUPPORTED,
                           "%s: added token '%s' with normalized=true is not supported with a metaspace normalizer",
                           path, content);
        if (id->valueint > max_id) max_id = id->valueint;
        n_added++;
        bytes += 2 * (strlen(content) + 1);
    }
    if (n_vocab == 0) return vq_fail(VQ_ERR_FORMAT, "%s: \"model.vocab\" is empty", path);

    t->n_ids = max_id + 1;
    t->arena_cap = bytes;
    t->arena = malloc(bytes);
    t->vocab_cap = pow2_at_least(2 * (n_vocab + n_added));
    t->vocab = calloc(t->vocab_cap, sizeof *t->vocab);
    size_t n_merges = (size_t)cJSON_GetArraySize(merges);
    t->merges_cap = pow2_at_least(2 * n_merges);
    t->merges = malloc(t->merges_cap * sizeof *t->merges);
    t->piece = calloc((size_t)t->n_ids, sizeof *t->piece);
    t->piece_len = calloc((size_t)t->n_ids, sizeof *t->piece_len);
    t->text = calloc((size_t)t->n_ids, sizeof *t->text);
    t->text_len = calloc((size_t)t->n_ids, sizeof *t->text_len);
    t->special = calloc((size_t)t->n_ids, 1);
    t->added = calloc(n_added ? n_added : 1, sizeof *t->added);
    if (!t->arena || !t->vocab || !t->merges || !t->piece || !t->piece_len || !t->text || !t->text_len ||
        !t->special || !t->added)
        return vq_fail(VQ_ERR_NOMEM, "%s: out of memory for %zu tokens", path, n_vocab);
    for (size_t i = 0; i < t->merges_cap; i++) t->merges[i].rank = -1;

    char *scratch = malloc(bytes / 2 + 1);
    if (!scratch) return vq_fail(VQ_ERR_NOMEM, "%s: out of memory", path);
    vq_status st = VQ_OK;
    for (const cJSON *e = vocab->child; e && st == VQ_OK; e = e->next) {
        size_t n = strlen(e->string);
        const char *key = arena_add(t, e->string, n);
        int32_t id = e->valueint;
        int32_t dup = vocab_put(t, key, n, id);
        if (dup >= 0) st = vq_fail(VQ_ERR_FORMAT, "%s: vocab entry '%s' appears twice", path, e->string);
        else if (t->piece[id])
            st = vq_fail(VQ_ERR_FORMAT, "%s: vocab entries '%s' and another both have id %d", path, e->string, id);
        else {
            size_t pn = t->sp ? sp_token_bytes(key, n, scratch) : token_bytes(t->char_byte, key, n, scratch);
            t->piece[id] = arena_add(t, scratch, pn);
            t->piece_len[id] = (uint32_t)pn;
            t->text[id] = key;
            t->text_len[id] = (uint32_t)n;
        }
    }
    /* Added tokens: an id may also be in the vocab; decoding then uses the
     * added token's content, as Hugging Face does. */
    for (const cJSON *e = added ? added->child : NULL; e && st == VQ_OK; e = e->next) {
        const char *content = str_field(e, "content");
        size_t n = strlen(content);
        int32_t id = cJSON_GetObjectItemCaseSensitive(e, "id")->valueint;
        added_token *a = &t->added[t->n_added++];
        a->text = arena_add(t, content, n);
        a->len = n;
        a->id = id;
        a->special = flag(e, "special");
        t->special[id] = (uint8_t)a->special;
        size_t pn = t->sp ? sp_token_bytes(content, n, scratch) : token_bytes(t->char_byte, content, n, scratch);
        t->piece[id] = arena_add(t, scratch, pn);
        t->piece_len[id] = (uint32_t)pn;
        t->text[id] = a->text;
        t->text_len[id] = (uint32_t)n;
    }
    free(scratch);
    if (st != VQ_OK) return st;

    /* Merges, either "a b" strings or ["a", "b"] pairs; the rank is the
     * position in the list. */
    int32_t rank = 0;
    for (const cJSON *e = merges->child; e; e = e->next, rank++) {
        char buf[1024];
        const char *a, *b;
        size_t an, bn;
        if (cJSON_IsString(e)) {
            const char *sp = strchr(e->valuestring, ' ');
            if (!sp || strchr(sp + 1, ' '))
                return vq_fail(VQ_ERR_FORMAT, "%s: merge %d '%s' is not two tokens separated by one space", path,
                               rank, e->valuestring);
            a = e->valuestring;
            an = (size_t)(sp - a);
            b = sp + 1;
            bn = strlen(b);
        } else if (cJSON_IsArray(e) && cJSON_GetArraySize(e) == 2 && cJSON_IsString(e->child) &&
                   cJSON_IsString(e->child->next)) {
            a = e->child->valuestring;
            an = strlen(a);
            b = e->child->next->valuestring;
            bn = strlen(b);
        } else {
            return vq_fail(VQ_ERR_FORMAT, "%s: merge %d is neither \"a b\" nor [\"a\", \"b\"]", path, rank);
        }
        int32_t ia = vocab_get(t, a, an), ib = vocab_get(t, b, bn);
        if (ia < 0 || ib < 0)
            return vq_fail(VQ_ERR_FORMAT, "%s: merge %d ('%.*s' '%.*s'): '%.*s' is not in the vocab", path, rank,
                           (int)an, a, (int)bn, b, ia < 0 ? (int)an : (int)bn, ia < 0 ? a : b);
        if (an + bn >= sizeof buf)
            return vq_fail(VQ_ERR_FORMAT, "%s: merge %d is longer than %zu bytes", path, rank, sizeof buf - 1);
        memcpy(buf, a, an);
        memcpy(buf + an, b, bn);
        int32_t ir = vocab_get(t, buf, an + bn);
        if (ir < 0)
            return vq_fail(VQ_ERR_FORMAT, "%s: merge %d ('%.*s' '%.*s'): the result '%.*s' is not in the vocab",
                           path, rank, (int)an, a, (int)bn, b, (int)(an + bn), buf);
        uint64_t key = (uint64_t)(uint32_t)ia << 32 | (uint32_t)ib;
        size_t mask = t->merges_cap - 1;
        size_t i = hash_pair(key) & mask;
        while (t->merges[i].rank >= 0 && t->merges[i].pair != key) i = (i + 1) & mask;
        /* A repeated pair keeps its first (best) rank. */
        if (t->merges[i].rank < 0) t->merges[i] = (merge_slot){key, rank, ir};
    }

    const char *unk = str_field(model, "unk_token");
    t->unk_id = unk ? vocab_get(t, unk, strlen(unk)) : -1;
    if (unk && t->unk_id < 0) return vq_fail(VQ_ERR_FORMAT, "%s: unk_token '%s' is not in the vocab", path, unk);
    return VQ_OK;
}

static int cmp_added(const void *pa, const void *pb) {
    const added_token *a = pa, *b = pb;
    int fa = (uint8_t)a->text[0], fb = (uint8_t)b->text[0];
    if (fa != fb) return fa - fb;
    if (a->len != b->len) return a->len > b->len ? -1 : 1; /* longest first */
    return strcmp(a->text, b->text);
}

vq_status vq_tokenizer_load(const char *path, vq_tokenizer **out) {
    *out = NULL;
    cJSON *root;
    vq_status st = vq_read_json(path, &root);
    if (st != VQ_OK) return st;
    vq_tokenizer *t = calloc(1, sizeof *t);
    if (!t) {
        cJSON_Delete(root);
        return vq_fail(VQ_ERR_NOMEM, "%s: out of memory", path);
    }
    init_byte_chars(t);
    if (!cJSON_IsObject(root)) st = vq_fail(VQ_ERR_FORMAT, "%s: not a JSON object", path);
    if (st == VQ_OK) st = parse_pipeline(t, path, root);
    if (st == VQ_OK) st = parse_model(t, path, root);
    t->bos_prepend = -1;
    t->eos = -1;
    if (st == VQ_OK) parse_post_processor(t, cJSON_GetObjectItemCaseSensitive(root, "post_processor"));
    cJSON_Delete(root);
    if (st != VQ_OK) {
        vq_tokenizer_free(t);
        return st;
    }

    qsort(t->added, (size_t)t->n_added, sizeof *t->added, cmp_added);
    int k = 0;
    for (int b = 0; b <= 256; b++) {
        while (k < t->n_added && (uint8_t)t->added[k].text[0] < b) k++;
        t->added_start[b] = k;
    }
    for (int b = 0; b < 256; b++) {
        char s[8];
        t->byte_id[b] = t->sp ? -1 : vocab_get(t, s, put_char(s, t->byte_char[b]));
        snprintf(s, sizeof s, "<0x%02X>", b);
        t->fallback_id[b] = t->byte_fallback ? vocab_get(t, s, 6) : -1;
    }
    *out = t;
    return VQ_OK;
}

/* ------------------------------------------------------------ encoding */

/* A heap entry: the pair starting at symbol pos, as it was when pushed. */
typedef struct {
    int32_t rank, pos, left, right;
} heap_item;

typedef struct {
    const vq_tokenizer *t;
    pcre2_match_data *md[TOK_MAX_REGEX];
    int32_t *ids;
    size_t cap, n;
    /* BPE scratch, grown to the longest piece seen */
    size_t scratch_cap;
    int32_t *sym, *prev, *next;
    heap_item *heap;
    char *spelled;
} encoder;

static vq_status emit(encoder *e, int32_t id) {
    if (e->n == e->cap)
        return vq_fail(VQ_ERR_ARG,
                       "vq_tokenizer_encode: the id buffer of %zu is too small (2 * len + 2 always suffices)", e->cap);
    e->ids[e->n++] = id;
    return VQ_OK;
}

static bool heap_less(const heap_item *a, const heap_item *b) {
    return a->rank != b->rank ? a->rank < b->rank : a->pos < b->pos;
}

static void heap_push(heap_item *h, size_t *n, heap_item x) {
    size_t i = (*n)++;
    while (i > 0 && heap_less(&x, &h[(i - 1) / 2])) {
        h[i] = h[(i - 1) / 2];
        i = (i - 1) / 2;
    }
    h[i] = x;
}

static heap_item heap_pop(heap_item *h, size_t *n) {
    heap_item top = h[0], x = h[--(*n)];
    size_t i = 0;
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= *n) break;
        if (c + 1 < *n && heap_less(&h[c + 1], &h[c])) c++;
        if (!heap_less(&h[c], &x)) break;
        h[i] = h[c];
        i = c;
    }
    if (*n) h[i] = x;
    return top;
}

static void push_pair(const vq_tokenizer *t, encoder *e, size_t *hn, int32_t pos) {
    int32_t nx = e->next[pos];
    if (nx < 0) return;
    const merge_slot *m = merge_get(t, e->sym[pos], e->sym[nx]);
    if (m) heap_push(e->heap, hn, (heap_item){m->rank, pos, e->sym[pos], e->sym[nx]});
}

/* BPE of one pre-tokenized piece. */
static vq_status encode_piece(encoder *e, const uint8_t *s, size_t n) {
    const vq_tokenizer *t = e->t;
    if (n > e->scratch_cap) {
        size_t c = n < 64 ? 64 : n;
        free(e->sym);
        free(e->prev);
        free(e->next);
        free(e->heap);
        free(e->spelled);
        e->sym = malloc(c * sizeof *e->sym);
        e->prev = malloc(c * sizeof *e->prev);
        e->next = malloc(c * sizeof *e->next);
        /* each merge pushes at most two pairs on top of the first n - 1 */
        e->heap = malloc(3 * c * sizeof *e->heap);
        e->spelled = malloc(2 * c);
        e->scratch_cap = c;
        if (!e->sym || !e->prev || !e->next || !e->heap || !e->spelled) {
            e->scratch_cap = 0;
            return vq_fail(VQ_ERR_NOMEM, "vq_tokenizer_encode: out of memory for a %zu-byte word", n);
        }
    }
    if (t->ignore_merges) {
        size_t k = n;
        const char *word = (const char *)s;
        if (!t->sp) {
            k = 0;
            for (size_t i = 0; i < n; i++) k += put_char(e->spelled + k, t->byte_char[s[i]]);
            word = e->spelled;
        }
        int32_t id = vocab_get(t, word, k);
        if (id >= 0) return emit(e, id);
    }
    /* One symbol per character (byte-level: per byte). A character without
     * a token becomes its <0xXX> tokens when byte_fallback has them all,
     * else unk (a run of them one unk with fuse_unk), else it is dropped.
     * As in Hugging Face, a pending unk is put out only before the next
     * character that has a token or at the end, so byte tokens can come
     * before it. There are never more symbols than bytes. */
    int32_t m = 0;
    bool unk_pending = false;
    for (size_t i = 0; i < n;) {
        size_t k = 1;
        int32_t id;
        if (t->sp) {
            uint32_t cp;
            k = utf8_len(s + i, n - i, &cp); /* valid: checked by the caller */
            id = vocab_get(t, (const char *)s + i, k);
        } else {
            id = t->byte_id[s[i]];
        }
        bool fallback = id < 0 && t->byte_fallback;
        for (size_t j = i; fallback && j < i + k; j++) fallback = t->fallback_id[s[j]] >= 0;
        if (id >= 0 && unk_pending) {
            e->sym[m++] = t->unk_id;
            unk_pending = false;
        }
        if (id >= 0) {
            e->sym[m++] = id;
        } else if (fallback) {
            for (size_t j = i; j < i + k; j++) e->sym[m++] = t->fallback_id[s[j]];
        } else if (t->unk_id >= 0) {
            if (unk_pending && !t->fuse_unk) e->sym[m++] = t->unk_id;
            unk_pending = true;
        }
        i += k;
    }
    if (unk_pending) e->sym[m++] = t->unk_id;
    if (m == 0) return VQ_OK;
    for (int32_t i = 0; i < m; i++) {
        e->prev[i] = i - 1;
        e->next[i] = i + 1;
    }
    e->next[m - 1] = -1;
    size_t hn = 0;
    for (int32_t i = 0; i + 1 < m; i++) push_pair(t, e, &hn, i);
    while (hn > 0) {
        heap_item h = heap_pop(e->heap, &hn);
        int32_t p = h.pos, q = e->next[p];
        /* Stale entries: the pair changed since it was pushed. A merged-away
         * symbol has sym -1, so it never matches. */
        if (q < 0 || e->sym[p] != h.left || e->sym[q] != h.right) continue;
        e->sym[p] = merge_get(t, h.left, h.right)->result;
        e->sym[q] = -1;
        e->next[p] = e->next[q];
        if (e->next[q] >= 0) e->prev[e->next[q]] = p;
        if (e->prev[p] >= 0) push_pair(t, e, &hn, e->prev[p]);
        push_pair(t, e, &hn, p);
    }
    for (int32_t i = 0; i >= 0; i = e->next[i]) {
        vq_status st = emit(e, e->sym[i]);
        if (st != VQ_OK) return st;
    }
    return VQ_OK;
}

static vq_status split_piece(encoder *e, const char *s, size_t n, int level);

/* Runs split level `level` on s: the matches and the gaps between them each
 * go on to the next level; empty pieces are dropped. */
static vq_status split_level(encoder *e, const char *s, size_t n, int level) {
    const pcre2_code *re = e->t->regex[level];
    pcre2_match_data *md = e->md[level];
    size_t off = 0, done = 0;
    vq_status st = VQ_OK;
    while (off < n && st == VQ_OK) {
        /* The text was checked once as a whole: no per-call UTF-8 check,
         * which would make matching quadratic. */
        int rc = pcre2_match(re, (PCRE2_SPTR)s, n, off, PCRE2_NO_UTF_CHECK, md, NULL);
        if (rc == PCRE2_ERROR_JIT_STACKLIMIT)
            rc = pcre2_match(re, (PCRE2_SPTR)s, n, off, PCRE2_NO_UTF_CHECK | PCRE2_NO_JIT, md, NULL);
        if (rc == PCRE2_ERROR_NOMATCH) break;
        if (rc < 0) {
            PCRE2_UCHAR msg[200];
            pcre2_get_error_message(rc, msg, sizeof msg);
            return vq_fail(VQ_ERR_ARG, "vq_tokenizer_encode: pre-tokenizer regex failed: %s", (const char *)msg);
        }
        const PCRE2_SIZE *ov = pcre2_get_ovector_pointer(md);
        size_t ms = ov[0], me = ov[1];
        if (ms > done) st = split_piece(e, s + done, ms - done, level + 1);
        if (st == VQ_OK && me > ms) st = split_piece(e, s + ms, me - ms, level + 1);
        done = me;
        if (me > ms) {
            off = me;
        } else {
            /* an empty match: step over one character */
            uint32_t cp;
            size_t k = ms < n ? utf8_len((const uint8_t *)s + ms, n - ms, &cp) : 1;
            off = ms + (k ? k : 1);
        }
    }
    if (st == VQ_OK && done < n) st = split_piece(e, s + done, n - done, level + 1);
    return st;
}

static vq_status split_piece(encoder *e, const char *s, size_t n, int level) {
    const vq_tokenizer *t = e->t;
    if (n == 0) return VQ_OK;
    if (level == t->bytelevel_level && t->add_prefix_space && s[0] != ' ') {
        /* ByteLevel(add_prefix_space) puts a space before each piece that
         * reaches it without one. */
        char *buf = malloc(n + 1);
        if (!buf) return vq_fail(VQ_ERR_NOMEM, "vq_tokenizer_encode: out of memory");
        buf[0] = ' ';
        memcpy(buf + 1, s, n);
        vq_status st = level < t->n_regex ? split_level(e, buf, n + 1, level) : encode_piece(e, (const uint8_t *)buf, n + 1);
        free(buf);
        return st;
    }
    if (level < t->n_regex) return split_level(e, s, n, level);
    return encode_piece(e, (const uint8_t *)s, n);
}

/* A SentencePiece-like segment: spaces become metaspaces, one may be put
 * first, and the result is one piece. first: the segment starts the text. */
static vq_status sp_segment(encoder *e, const char *s, size_t n, bool first) {
    const vq_tokenizer *t = e->t;
    if (n == 0) return VQ_OK;
    bool prepend = t->sp_prepend == PREPEND_ALWAYS || (t->sp_prepend == PREPEND_FIRST && first);
    /* The Metaspace pre-tokenizer adds none before a metaspace or a space
     * (which becomes one); the Prepend normalizer always does. */
    if (t->sp_prepend_unless_meta && (s[0] == ' ' || (n >= 3 && memcmp(s, metaspace, 3) == 0))) prepend = false;
    char *buf = malloc(3 * n + 3);
    if (!buf) return vq_fail(VQ_ERR_NOMEM, "vq_tokenizer_encode: out of memory");
    size_t m = 0;
    if (prepend) {
        memcpy(buf, metaspace, 3);
        m = 3;
    }
    for (size_t i = 0; i < n; i++) {
        if (s[i] == ' ') {
            memcpy(buf + m, metaspace, 3);
            m += 3;
        } else {
            buf[m++] = s[i];
        }
    }
    vq_status st = encode_piece(e, (const uint8_t *)buf, m);
    free(buf);
    return st;
}

/* The text between added tokens, from byte `from` of the whole text. */
static vq_status encode_segment(encoder *e, const char *text, size_t from, size_t to) {
    if (e->t->sp) return sp_segment(e, text + from, to - from, from == 0);
    return split_piece(e, text + from, to - from, 0);
}

/* The added token that starts at s, longest first; NULL if none. */
static const added_token *match_added(const vq_tokenizer *t, const char *s, size_t n) {
    uint8_t b = (uint8_t)s[0];
    for (int i = t->added_start[b]; i < t->added_start[b + 1]; i++) {
        const added_token *a = &t->added[i];
        if (a->len <= n && memcmp(a->text, s, a->len) == 0) return a;
    }
    return NULL;
}

vq_status vq_tokenizer_encode(const vq_tokenizer *t, const char *text, size_t len, int32_t bos_id, int32_t *ids,
                              size_t cap, size_t *n_ids) {
    *n_ids = 0;
    if (!text && len) return vq_fail(VQ_ERR_ARG, "vq_tokenizer_encode: text is NULL");
    if (bos_id >= t->n_ids || (bos_id >= 0 && !t->piece[bos_id]) || bos_id < -1)
        return vq_fail(VQ_ERR_ARG, "vq_tokenizer_encode: bos_id %d is not a token (ids are [0, %d), or -1 for none)",
                       bos_id, t->n_ids);
    for (size_t i = 0; i < len;) {
        uint32_t cp;
        size_t k = utf8_len((const uint8_t *)text + i, len - i, &cp);
        if (!k) return vq_fail(VQ_ERR_ARG, "vq_tokenizer_encode: text is not valid UTF-8 at byte %zu", i);
        i += k;
    }

    encoder e = {.t = t, .ids = ids, .cap = cap};
    vq_status st = VQ_OK;
    for (int i = 0; i < t->n_regex && st == VQ_OK; i++) {
        e.md[i] = pcre2_match_data_create_from_pattern(t->regex[i], NULL);
        if (!e.md[i]) st = vq_fail(VQ_ERR_NOMEM, "vq_tokenizer_encode: out of memory");
    }
    if (st == VQ_OK && bos_id >= 0) st = emit(&e, bos_id);
    size_t seg = 0;
    for (size_t i = 0; i < len && st == VQ_OK;) {
        const added_token *a = match_added(t, text + i, len - i);
        if (!a) {
            i++;
            continue;
        }
        st = encode_segment(&e, text, seg, i);
        if (st == VQ_OK) st = emit(&e, a->id);
        i += a->len;
        seg = i;
    }
    if (st == VQ_OK) st = encode_segment(&e, text, seg, len);

    for (int i = 0; i < t->n_regex; i++) pcre2_match_data_free(e.md[i]);
    free(e.sym);
    free(e.prev);
    free(e.next);
    free(e.heap);
    free(e.spelled);
    if (st == VQ_OK) *n_ids = e.n;
    return st;
}

/* ------------------------------------------------------------ the rest */

int32_t vq_tokenizer_vocab_size(const vq_tokenizer *t) { return t->n_ids; }

int32_t vq_tokenizer_find(const vq_tokenizer *t, const char *token) {
    size_t n = strlen(token);
    for (int i = 0; n && i < t->n_added; i++)
        if (t->added[i].len == n && memcmp(t->added[i].text, token, n) == 0) return t->added[i].id;
    return vocab_get(t, token, n);
}

int vq_tokenizer_is_special(const vq_tokenizer *t, int32_t id) {
    return id >= 0 && id < t->n_ids && t->special[id];
}

const char *vq_tokenizer_piece(const vq_tokenizer *t, int32_t id, size_t *len) {
    *len = 0;
    if (id < 0 || id >= t->n_ids || !t->piece[id]) return NULL;
    *len = t->piece_len[id];
    return t->piece[id];
}

/* Appends s to out (as far as cap allows; *need counts all), leaving out the
 * first *strip spaces of the whole text. */
static void put_text(char *out, size_t cap, size_t *need, const char *s, size_t n, int *strip) {
    for (size_t i = 0; i < n; i++) {
        if (*strip > 0 && *need == 0 && s[i] == ' ') {
            (*strip)--;
            continue;
        }
        *strip = 0;
        if (*need < cap) out[*need] = s[i];
        (*need)++;
    }
}

vq_status vq_tokenizer_decode(const vq_tokenizer *t, const int32_t *ids, size_t n, int skip_special, char *out,
                              size_t cap, size_t *len) {
    size_t need = 0;
    int strip = t->dec_strip;
    bool first = true;
    *len = 0;
    for (size_t i = 0; i < n; i++) {
        int32_t id = ids[i];
        if (id < 0 || id >= t->n_ids || !t->piece[id])
            return vq_fail(VQ_ERR_ARG, "vq_tokenizer_decode: id %d at index %zu is not a token (ids are [0, %d))", id,
                           i, t->n_ids);
        if (skip_special && t->special[id]) continue;
        const char *s = t->text[id];
        size_t k = t->text_len[id];
        int b;
        if (t->sp && first && t->dec_first_meta) {
            /* The Metaspace decoder drops every metaspace of the first token
             * (the one put first, it assumes) and spells the rest as spaces. */
            for (size_t j = 0; j < k;) {
                size_t c = k - j >= 3 && memcmp(s + j, metaspace, 3) == 0 ? 3 : 1;
                if (c == 1) put_text(out, cap, &need, s + j, 1, &strip);
                j += c;
            }
        } else if (t->sp && !t->dec_bytes && byte_token(s, k, &b)) {
            /* without ByteFallback in the decoder, "<0xE2>" stays text */
            put_text(out, cap, &need, s, k, &strip);
        } else {
            put_text(out, cap, &need, t->piece[id], t->piece_len[id], &strip);
        }
        first = false;
    }
    *len = need;
    if (need > cap)
        return vq_fail(VQ_ERR_ARG, "vq_tokenizer_decode: the output buffer of %zu bytes is too small, %zu needed", cap,
                       need);
    return VQ_OK;
}

int32_t vq_tokenizer_bos(const vq_tokenizer *t) { return t ? t->bos_prepend : -1; }

/* A token named in tokenizer_config.json: a string or {"content": ...}. */
static int32_t config_token(const vq_tokenizer *t, const cJSON *v) {
    if (cJSON_IsObject(v)) v = cJSON_GetObjectItemCaseSensitive(v, "content");
    return cJSON_IsString(v) ? vq_tokenizer_find(t, v->valuestring) : -1;
}

vq_status vq_tokenizer_apply_config(vq_tokenizer *t, const char *path) {
    if (!t || !path) return vq_fail(VQ_ERR_ARG, "vq_tokenizer_apply_config: tokenizer or path is NULL");
    FILE *f = fopen(path, "rb");
    if (!f) return VQ_OK; /* optional */
    fclose(f);
    cJSON *root;
    vq_status st = vq_read_json(path, &root);
    if (st != VQ_OK) return st;
    if (!cJSON_IsObject(root)) {
        cJSON_Delete(root);
        return vq_fail(VQ_ERR_FORMAT, "%s: not a JSON object", path);
    }
    /* add_bos_token as the Llama tokenizers apply it: false drops what the
     * post-processor would add, true adds bos_token when it adds nothing */
    const cJSON *add_bos = cJSON_GetObjectItemCaseSensitive(root, "add_bos_token");
    int32_t bos = config_token(t, cJSON_GetObjectItemCaseSensitive(root, "bos_token"));
    if (cJSON_IsFalse(add_bos)) t->bos_prepend = -1;
    else if (cJSON_IsTrue(add_bos) && t->bos_prepend < 0 && bos >= 0) t->bos_prepend = bos;
    t->eos = config_token(t, cJSON_GetObjectItemCaseSensitive(root, "eos_token"));
    cJSON_Delete(root);
    return VQ_OK;
}

int32_t vq_tokenizer_eos(const vq_tokenizer *t) { return t ? t->eos : -1; }
