/* BPE, byte-level and SentencePiece-like: ids identical to Hugging Face
 * tokenizers on the fixture tokenizers (goldens made by
 * tests/fixtures/make_tokenizer_fixtures.py), decode(encode(s)) equal to
 * Hugging Face's decode, and clear errors for malformed tokenizer.json.
 * Usage: test_tokenizer FIXTURES_DIR */
#include "check.h"
#include "veloxquant.h"

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static char tmpdir[] = "/tmp/vq_tok_XXXXXX";

static int hexval(int c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    return 0;
}

/* Reads one line without its newline into a malloc'd buffer; NULL at EOF. */
static char *read_line(FILE *f) {
    size_t cap = 256, n = 0;
    char *s = malloc(cap);
    int c;
    while ((c = fgetc(f)) != EOF && c != '\n') {
        if (n + 1 == cap) s = realloc(s, cap *= 2);
        s[n++] = (char)c;
    }
    if (c == EOF && n == 0) {
        free(s);
        return NULL;
    }
    s[n] = '\0';
    return s;
}

static char *from_hex(const char *hex, size_t *len) {
    *len = strlen(hex) / 2;
    char *s = malloc(*len + 1);
    for (size_t i = 0; i < *len; i++) s[i] = (char)(hexval(hex[2 * i]) * 16 + hexval(hex[2 * i + 1]));
    s[*len] = '\0';
    return s;
}

/* Golden file: pairs of lines, the text as hex UTF-8 then its ids, and when
 * Hugging Face decodes the ids to other text, " | " and that text as hex. */
static void check_golden(const char *tok_path, const char *golden_path) {
    vq_tokenizer *t = NULL;
    vq_status st = vq_tokenizer_load(tok_path, &t);
    CHECK(st == VQ_OK, "load %s: %s", tok_path, vq_last_error());
    if (st != VQ_OK) return;
    FILE *f = fopen(golden_path, "r");
    CHECK(f != NULL, "cannot open %s", golden_path);
    int cases = 0;
    char *hex;
    while (f && (hex = read_line(f)) != NULL) {
        char *idline = read_line(f);
        size_t len;
        char *text = from_hex(hex, &len);
        char *bar = idline ? strstr(idline, " | ") : NULL;
        size_t dlen = len;
        char *decoded = bar ? from_hex(bar + 3, &dlen) : NULL;
        int32_t want[1024];
        size_t n_want = 0;
        for (char *p = idline ? idline : "", *end; *p && n_want < 1024; p = end) {
            long v = strtol(p, &end, 10);
            if (end == p) break;
            want[n_want++] = (int32_t)v;
        }

        /* the prefix metaspace may take an id of its own: 2 * len + 2 */
        size_t cap = 2 * len + 2;
        int32_t *ids = malloc(cap * sizeof *ids);
        size_t n = 0;
        st = vq_tokenizer_encode(t, text, len, -1, ids, cap, &n);
        CHECK(st == VQ_OK, "encode '%s': %s", text, vq_last_error());
        size_t diff = 0;
        while (diff < n && diff < n_want && ids[diff] == want[diff]) diff++;
        CHECK(n == n_want && diff == n, "%s: '%s': %zu ids, golden %zu, first difference at %zu", tok_path, text, n,
              n_want, diff);

        const char *expect = decoded ? decoded : text;
        char *back = malloc(dlen + 1);
        size_t blen = 0;
        st = vq_tokenizer_decode(t, ids, n, 0, back, dlen, &blen);
        CHECK(st == VQ_OK && blen == dlen && memcmp(back, expect, dlen) == 0, "%s: decode(encode('%s')) is '%.*s'",
              tok_path, text, (int)blen, back);

        /* BOS goes first when asked for, the rest unchanged. */
        int32_t *ids2 = malloc((cap + 1) * sizeof *ids2);
        size_t n2 = 0;
        st = vq_tokenizer_encode(t, text, len, 0, ids2, cap + 1, &n2);
        CHECK(st == VQ_OK && n2 == n + 1 && ids2[0] == 0 && memcmp(ids2 + 1, ids, n * sizeof *ids) == 0,
              "encode with bos of '%s'", text);

        free(ids2);
        free(back);
        free(ids);
        free(text);
        free(decoded);
        free(hex);
        free(idline);
        cases++;
    }
    if (f) fclose(f);
    CHECK(cases >= 20, "%s: only %d cases", golden_path, cases);
    vq_tokenizer_free(t);
}

static void check_api(const char *tok_path) {
    vq_tokenizer *t = NULL;
    vq_status st = vq_tokenizer_load(tok_path, &t);
    CHECK(st == VQ_OK, "load %s: %s", tok_path, vq_last_error());
    if (st != VQ_OK) return;
    CHECK(vq_tokenizer_vocab_size(t) == 1000, "vocab size %d", vq_tokenizer_vocab_size(t));
    int32_t bos = vq_tokenizer_find(t, "<|bos|>"), eos = vq_tokenizer_find(t, "<|eos|>");
    CHECK(bos == 0 && eos == 1, "bos %d eos %d", bos, eos);
    CHECK(vq_tokenizer_find(t, "<|nothing|>") == -1, "found a token that does not exist");
    CHECK(vq_tokenizer_is_special(t, bos) && !vq_tokenizer_is_special(t, 500), "special flags");
    /* 'Ġ' is the byte-level spelling of a space */
    int32_t sp = vq_tokenizer_find(t, "\xc4\xa0");
    size_t plen = 0;
    const char *piece = vq_tokenizer_piece(t, sp, &plen);
    CHECK(sp >= 0 && piece && plen == 1 && piece[0] == ' ', "the space token");
    CHECK(vq_tokenizer_piece(t, 5000, &plen) == NULL && plen == 0, "piece of an id out of range");

    const char *text = "a<|eos|>b";
    int32_t ids[16];
    size_t n = 0;
    st = vq_tokenizer_encode(t, text, strlen(text), -1, ids, 16, &n);
    CHECK(st == VQ_OK && n == 3 && ids[1] == eos, "special token inside text");
    char out[16];
    size_t len = 0;
    st = vq_tokenizer_decode(t, ids, n, 1, out, sizeof out, &len);
    CHECK(st == VQ_OK && len == 2 && memcmp(out, "ab", 2) == 0, "skip_special decode");
    st = vq_tokenizer_decode(t, ids, n, 0, out, 3, &len);
    CHECK(st == VQ_ERR_ARG && len == 9 && strstr(vq_last_error(), "9 needed"), "small decode buffer: %s",
          vq_last_error());
    int32_t bad = 99999;
    st = vq_tokenizer_decode(t, &bad, 1, 0, out, sizeof out, &len);
    CHECK(st == VQ_ERR_ARG && strstr(vq_last_error(), "id 99999"), "bad id: %s", vq_last_error());

    st = vq_tokenizer_encode(t, "hello world", 11, -1, ids, 1, &n);
    CHECK(st == VQ_ERR_ARG && strstr(vq_last_error(), "too small"), "small id buffer: %s", vq_last_error());
    st = vq_tokenizer_encode(t, "ok\xff", 3, -1, ids, 16, &n);
    CHECK(st == VQ_ERR_ARG && strstr(vq_last_error(), "UTF-8 at byte 2"), "invalid UTF-8: %s", vq_last_error());
    st = vq_tokenizer_encode(t, "\xed\xa0\x80", 3, -1, ids, 16, &n);
    CHECK(st == VQ_ERR_ARG && strstr(vq_last_error(), "UTF-8 at byte 0"), "a surrogate: %s", vq_last_error());
    st = vq_tokenizer_encode(t, "x", 1, 5000, ids, 16, &n);
    CHECK(st == VQ_ERR_ARG && strstr(vq_last_error(), "bos_id 5000"), "bad bos: %s", vq_last_error());
    st = vq_tokenizer_encode(t, "", 0, -1, ids, 0, &n);
    CHECK(st == VQ_OK && n == 0, "empty text");

    /* A long run with no split point exercises the merge queue; it must
     * round-trip (and take well under a second). */
    size_t big = 20000;
    char *run = malloc(big);
    for (size_t i = 0; i < big; i++) run[i] = "abcde"[i % 5];
    int32_t *bids = malloc((big + 1) * sizeof *bids);
    st = vq_tokenizer_encode(t, run, big, -1, bids, big + 1, &n);
    CHECK(st == VQ_OK && n > 0 && n < big, "long word: %s", vq_last_error());
    char *back = malloc(big);
    st = vq_tokenizer_decode(t, bids, n, 0, back, big, &len);
    CHECK(st == VQ_OK && len == big && memcmp(back, run, big) == 0, "long word round trip");
    free(back);
    free(bids);
    free(run);
    vq_tokenizer_free(t);
}

/* The Llama 2 style fixture: <s> from the post-processor, byte tokens,
 * metaspaces as spaces, and the leading space the decoder strips. */
static void check_sp_api(const char *tok_path) {
    vq_tokenizer *t = NULL;
    vq_status st = vq_tokenizer_load(tok_path, &t);
    CHECK(st == VQ_OK, "load %s: %s", tok_path, vq_last_error());
    if (st != VQ_OK) return;
    int32_t bos = vq_tokenizer_find(t, "<s>");
    CHECK(bos == 1 && vq_tokenizer_bos(t) == bos && vq_tokenizer_is_special(t, bos), "bos %d", bos);
    size_t plen = 0;
    const char *piece = vq_tokenizer_piece(t, vq_tokenizer_find(t, "<0x0A>"), &plen);
    CHECK(piece && plen == 1 && piece[0] == '\n', "a byte token's piece");
    piece = vq_tokenizer_piece(t, vq_tokenizer_find(t, "\xe2\x96\x81"), &plen);
    CHECK(piece && plen == 1 && piece[0] == ' ', "the metaspace's piece");

    /* "<s>" ends a segment, and the next one gets its own metaspace */
    const char *text = "hi<s>hi";
    int32_t ids[32];
    size_t n = 0;
    st = vq_tokenizer_encode(t, text, strlen(text), bos, ids, 32, &n);
    CHECK(st == VQ_OK && n >= 4 && ids[0] == bos, "encode with bos: %s", vq_last_error());
    size_t half = (n - 2) / 2;
    CHECK(n == 2 + 2 * half && ids[1 + half] == bos && memcmp(ids + 1, ids + 2 + half, half * sizeof *ids) == 0,
          "both halves alike");
    char out[32];
    size_t len = 0;
    st = vq_tokenizer_decode(t, ids, n, 1, out, sizeof out, &len);
    CHECK(st == VQ_OK && len == 5 && memcmp(out, "hi hi", 5) == 0, "skip_special decode: '%.*s'", (int)len, out);
    st = vq_tokenizer_decode(t, ids, n, 0, out, sizeof out, &len);
    CHECK(st == VQ_OK && len == 12 && memcmp(out, "<s> hi<s> hi", 12) == 0, "decode: '%.*s'", (int)len, out);
    st = vq_tokenizer_decode(t, ids, n, 0, out, 2, &len);
    CHECK(st == VQ_ERR_ARG && len == 12, "small decode buffer: %zu", len);
    vq_tokenizer_free(t);
}

/* Writes text to tmpdir/name and returns the path (static buffer). */
static const char *write_tmp(const char *name, const char *text) {
    static char path[256];
    snprintf(path, sizeof path, "%s/%s", tmpdir, name);
    FILE *f = fopen(path, "wb");
    if (f) {
        fputs(text, f);
        fclose(f);
    }
    return path;
}

#define PRE_OK_NODEC "\"normalizer\":null,\"pre_tokenizer\":{\"type\":\"ByteLevel\",\"use_regex\":false}"
#define PRE_OK PRE_OK_NODEC ",\"decoder\":{\"type\":\"ByteLevel\"}"
#define VOCAB_OK "\"vocab\":{\"a\":0,\"b\":1,\"ab\":2}"

static void expect_load_error(const char *json, const char *needle1, const char *needle2) {
    const char *path = write_tmp("tokenizer.json", json);
    vq_tokenizer *t = (vq_tokenizer *)1;
    vq_status st = vq_tokenizer_load(path, &t);
    const char *m = vq_last_error();
    CHECK(st != VQ_OK && t == NULL, "accepted: %s", json);
    CHECK(strstr(m, needle1) != NULL, "message '%s' lacks '%s'", m, needle1);
    if (needle2) CHECK(strstr(m, needle2) != NULL, "message '%s' lacks '%s'", m, needle2);
    if (st == VQ_OK) vq_tokenizer_free(t);
    unlink(path);
}

#define SP_PIPE                                                                                                    \
    "\"normalizer\":{\"type\":\"Sequence\",\"normalizers\":[{\"type\":\"Prepend\",\"prepend\":\"\xe2\x96\x81\"},"         \
    "{\"type\":\"Replace\",\"pattern\":{\"String\":\" \"},\"content\":\"\xe2\x96\x81\"}]},\"pre_tokenizer\":null,"       \
    "\"decoder\":{\"type\":\"Sequence\",\"decoders\":[{\"type\":\"Replace\",\"pattern\":{\"String\":\"\xe2\x96\x81\"},"   \
    "\"content\":\" \"},{\"type\":\"ByteFallback\"},{\"type\":\"Fuse\"},{\"type\":\"Strip\",\"content\":\" \",\"start\":1,"  \
    "\"stop\":0}]}"
#define SP_VOCAB "\"vocab\":{\"<unk>\":0,\"\xe2\x96\x81\":1,\"a\":2,\"\xe2\x96\x81\x61\":3,\"<0x78>\":4}"

/* Characters without a token: unk, fused or not, dropped without unk, and
 * byte fallback where the byte tokens exist (ids as Hugging Face gives). */
static void check_unk(void) {
    static const struct {
        const char *opts;
        size_t n;
        int32_t ids[6];
    } cases[] = {
        {"\"unk_token\":\"<unk>\",\"fuse_unk\":true", 4, {3, 1, 0, 3}},
        {"\"unk_token\":\"<unk>\",\"fuse_unk\":false", 6, {3, 1, 0, 0, 0, 3}},
        {"\"unk_token\":null,\"fuse_unk\":true", 3, {3, 1, 3}},
        {"\"unk_token\":\"<unk>\",\"fuse_unk\":true,\"byte_fallback\":true", 5, {3, 1, 4, 0, 3}},
    };
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        char json[1024];
        snprintf(json, sizeof json, "{" SP_PIPE ",\"model\":{\"type\":\"BPE\",%s," SP_VOCAB ",\"merges\":[\"\xe2\x96\x81 a\"]}}",
                 cases[c].opts);
        const char *path = write_tmp("tokenizer.json", json);
        vq_tokenizer *t = NULL;
        vq_status st = vq_tokenizer_load(path, &t);
        CHECK(st == VQ_OK, "unk case %zu: %s", c, vq_last_error());
        if (st == VQ_OK) {
            int32_t ids[16];
            size_t n = 0;
            st = vq_tokenizer_encode(t, "a xyz a", 7, -1, ids, 16, &n);
            CHECK(st == VQ_OK && n == cases[c].n && memcmp(ids, cases[c].ids, n * sizeof *ids) == 0,
                  "unk case %zu: %zu ids", c, n);
            vq_tokenizer_free(t);
        }
        unlink(path);
    }
}

static void check_errors(void) {
    vq_tokenizer *t = NULL;
    CHECK(vq_tokenizer_load("/nonexistent/tokenizer.json", &t) == VQ_ERR_IO, "missing file");
    CHECK(strstr(vq_last_error(), "/nonexistent/tokenizer.json"), "names the file: %s", vq_last_error());

    expect_load_error("{\"model\": [1, 2", "not valid JSON", "tokenizer.json");
    expect_load_error("{" PRE_OK "}", "missing \"model\"", NULL);
    expect_load_error("{" PRE_OK ",\"model\":{\"type\":\"Unigram\"}}", "model type 'Unigram'", "BPE");
    expect_load_error("{" SP_PIPE ",\"added_tokens\":[{\"id\":5,\"content\":\"x y\",\"normalized\":true}],"
                      "\"model\":{\"type\":\"BPE\"," SP_VOCAB ",\"merges\":[]}}",
                      "added token 'x y' with normalized=true", NULL);
    expect_load_error("{" PRE_OK ",\"model\":{\"type\":\"BPE\"," VOCAB_OK ",\"merges\":[\"a c\"]}}",
                      "merge 0 ('a' 'c'): 'c' is not in the vocab", NULL);
    expect_load_error("{" PRE_OK ",\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":0,\"b\":1},\"merges\":[[\"a\",\"b\"]]}}",
                      "the result 'ab' is not in the vocab", NULL);
    expect_load_error("{" PRE_OK ",\"model\":{\"type\":\"BPE\"," VOCAB_OK ",\"merges\":[\"ab\"]}}",
                      "merge 0 'ab' is not two tokens", NULL);
    expect_load_error("{" PRE_OK ",\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":0,\"b\":-3},\"merges\":[]}}",
                      "vocab entry 'b'", "[0, 16777216)");
    expect_load_error("{" PRE_OK ",\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":0,\"b\":0},\"merges\":[]}}",
                      "both have id 0", NULL);
    expect_load_error("{" PRE_OK ",\"added_tokens\":[{\"id\":5,\"content\":\"\"}],\"model\":{\"type\":\"BPE\"," VOCAB_OK
                      ",\"merges\":[]}}",
                      "added token 0", "non-empty");
    expect_load_error("{\"normalizer\":{\"type\":\"NFKC\"},\"decoder\":{\"type\":\"ByteLevel\"},\"pre_tokenizer\":null,"
                      "\"model\":{}}",
                      "normalizer 'NFKC'", NULL);
    expect_load_error("{\"normalizer\":null,\"decoder\":{\"type\":\"ByteLevel\"},\"pre_tokenizer\":{\"type\":\"Metaspace\","
                      "\"replacement\":\"\xe2\x96\x81\"},\"model\":{}}",
                      "Metaspace pre-tokenizer with split=true", NULL);
    expect_load_error("{\"normalizer\":null,\"decoder\":{\"type\":\"ByteLevel\"},\"pre_tokenizer\":{\"type\":\"Metaspace\","
                      "\"replacement\":\"_\",\"split\":false},\"model\":{}}",
                      "Metaspace replacement '_'", NULL);
    expect_load_error("{\"normalizer\":null,\"decoder\":{\"type\":\"ByteLevel\"},\"pre_tokenizer\":{\"type\":\"Metaspace\","
                      "\"replacement\":\"\xe2\x96\x81\",\"split\":false},\"model\":{}}",
                      "decoder 'ByteLevel' is not supported with a metaspace vocab", NULL);
    expect_load_error("{\"normalizer\":{\"type\":\"Sequence\",\"normalizers\":[{\"type\":\"Prepend\",\"prepend\":"
                      "\"\xe2\x96\x81\"},{\"type\":\"NFKD\"}]},\"decoder\":null,\"pre_tokenizer\":null,\"model\":{}}",
                      "normalizer 'NFKD' (step 1)", NULL);
    expect_load_error("{\"normalizer\":null,\"decoder\":{\"type\":\"ByteLevel\"},\"pre_tokenizer\":{\"type\":\"Sequence\","
                      "\"pretokenizers\":[{\"type\":\"Split\",\"pattern\":{\"Regex\":\"(a\"},\"behavior\":\"Isolated\"},"
                      "{\"type\":\"ByteLevel\",\"use_regex\":false}]},\"model\":{}}",
                      "regex '(a' does not compile", NULL);
    expect_load_error("{\"normalizer\":null,\"decoder\":{\"type\":\"ByteLevel\"},\"pre_tokenizer\":{\"type\":\"Sequence\","
                      "\"pretokenizers\":[{\"type\":\"Split\",\"pattern\":{\"Regex\":\"a\"},\"behavior\":\"Removed\"},"
                      "{\"type\":\"ByteLevel\",\"use_regex\":false}]},\"model\":{}}",
                      "Split behavior 'Removed'", NULL);
    expect_load_error("{" PRE_OK_NODEC ",\"decoder\":{\"type\":\"Metaspace\"},\"model\":{}}",
                      "decoder 'Metaspace' is not supported with a byte-level vocab", NULL);

    /* A minimal valid file: plain ByteLevel without regex, one merge. */
    const char *path = write_tmp("tokenizer.json", "{" PRE_OK ",\"model\":{\"type\":\"BPE\"," VOCAB_OK
                                                   ",\"merges\":[\"a b\"]}}");
    vq_status st = vq_tokenizer_load(path, &t);
    CHECK(st == VQ_OK, "minimal tokenizer: %s", vq_last_error());
    if (st == VQ_OK) {
        int32_t ids[8];
        size_t n = 0;
        /* 'c' has no token and there is no unk: dropped, as in Hugging Face */
        st = vq_tokenizer_encode(t, "abca", 4, -1, ids, 8, &n);
        CHECK(st == VQ_OK && n == 2 && ids[0] == 2 && ids[1] == 0, "minimal encode (%zu ids)", n);
        vq_tokenizer_free(t);
    }
    unlink(path);
}

/* tokenizer_config.json: add_bos_token and eos_token, as transformers'
 * Llama tokenizers read them. */
static void check_tokenizer_config(const char *tok_path) {
    char cfg[1100];
    snprintf(cfg, sizeof cfg, "%s/tokenizer_config.json", tmpdir);
    vq_tokenizer *t;
    if (vq_tokenizer_load(tok_path, &t)) {
        CHECK(0, "%s: %s", tok_path, vq_last_error());
        return;
    }
    int32_t bos = vq_tokenizer_bos(t), s_id = vq_tokenizer_find(t, "<|bos|>"), e_id = vq_tokenizer_find(t, "<|eos|>");
    CHECK(vq_tokenizer_apply_config(t, cfg) == VQ_OK && vq_tokenizer_bos(t) == bos, "a missing config changed bos");
    FILE *f = fopen(cfg, "w");
    fputs("{\"add_bos_token\": true, \"bos_token\": \"<|bos|>\", \"eos_token\": {\"content\": \"<|eos|>\"}}", f);
    fclose(f);
    CHECK(vq_tokenizer_apply_config(t, cfg) == VQ_OK, "%s", vq_last_error());
    CHECK(vq_tokenizer_bos(t) == (bos >= 0 ? bos : s_id), "add_bos_token true: bos %d", vq_tokenizer_bos(t));
    CHECK(vq_tokenizer_eos(t) == e_id && e_id >= 0, "eos_token object form: %d, want %d", vq_tokenizer_eos(t), e_id);
    f = fopen(cfg, "w");
    fputs("{\"add_bos_token\": false}", f);
    fclose(f);
    CHECK(vq_tokenizer_apply_config(t, cfg) == VQ_OK && vq_tokenizer_bos(t) == -1, "add_bos_token false keeps a bos");
    f = fopen(cfg, "w");
    fputs("{\"add_bos_token\": ", f);
    fclose(f);
    CHECK(vq_tokenizer_apply_config(t, cfg) == VQ_ERR_FORMAT && strstr(vq_last_error(), "JSON"), "bad JSON: %s",
          vq_last_error());
    unlink(cfg);
    vq_tokenizer_free(t);
}

int main(int argc, char **argv) {
    if (argc != 2) {
        fprintf(stderr, "usage: %s FIXTURES_DIR\n", argv[0]);
        return 2;
    }
    if (!mkdtemp(tmpdir)) {
        perror("mkdtemp");
        return 2;
    }
    char a[1024], b[1024];
    const char *sets[][2] = {{"llama3/tokenizer.json", "llama3/golden.txt"},
                             {"llama3/tokenizer_strmerges.json", "llama3/golden.txt"},
                             {"gpt2/tokenizer.json", "gpt2/golden.txt"},
                             {"llama2/tokenizer.json", "llama2/golden.txt"},
                             {"metaspace/tokenizer.json", "metaspace/golden.txt"}};
    for (int i = 0; i < 5; i++) {
        snprintf(a, sizeof a, "%s/tok/%s", argv[1], sets[i][0]);
        snprintf(b, sizeof b, "%s/tok/%s", argv[1], sets[i][1]);
        check_golden(a, b);
    }
    snprintf(a, sizeof a, "%s/tok/llama3/tokenizer.json", argv[1]);
    check_api(a);
    snprintf(a, sizeof a, "%s/tok/llama2/tokenizer.json", argv[1]);
    check_sp_api(a);
    check_unk();
    check_errors();
    snprintf(a, sizeof a, "%s/tok/gpt2/tokenizer.json", argv[1]); /* no post-processor BOS */
    check_tokenizer_config(a);
    rmdir(tmpdir);
    return check_done();
}
