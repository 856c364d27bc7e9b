/*
 * Chat templates: the renders of real instruct-model templates and of small
 * templates for language corners equal Python jinja2's byte for byte
 * (goldens from tests/fixtures/make_chat_fixtures.py), tokenizer_config.json
 * loading, clear errors for what the subset lacks, and no crash on truncated
 * or mutated templates.
 *   test_chat_template FIXTURES_DIR
 */
#include "check.h"
#include "veloxquant.h"

#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char *fixtures;

static char *read_file(const char *name) {
    char path[4096];
    snprintf(path, sizeof path, "%s/chat/%s", fixtures, name);
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *s = malloc((size_t)n + 1);
    if (s && fread(s, 1, (size_t)n, f) != (size_t)n) {
        free(s);
        s = NULL;
    }
    if (s) s[n] = 0;
    fclose(f);
    return s;
}

static const char *str_or_null(const cJSON *v) { return cJSON_IsString(v) ? v->valuestring : NULL; }

/* Every golden case: same text, or an error whose message holds the
 * template's raise_exception text. */
static void test_goldens(void) {
    char *text = read_file("goldens.json");
    CHECK(text != NULL, "cannot read chat/goldens.json");
    if (!text) return;
    cJSON *cases = cJSON_Parse(text);
    free(text);
    CHECK(cJSON_IsArray(cases), "goldens.json is not a JSON list");
    int n_cases = 0, n_errors = 0;
    const cJSON *c;
    cJSON_ArrayForEach(c, cases) {
        const char *file = str_or_null(cJSON_GetObjectItem(c, "template"));
        char *tmpl = file ? read_file(file) : strdup(str_or_null(cJSON_GetObjectItem(c, "inline")));
        const char *label = file ? file : tmpl;
        CHECK(tmpl != NULL, "cannot read template %s", file ? file : "(inline)");
        if (!tmpl) continue;
        const cJSON *msgs = cJSON_GetObjectItem(c, "messages"), *m;
        int n = cJSON_GetArraySize(msgs), k = 0;
        vq_chat_message *list = calloc((size_t)n + 1, sizeof *list);
        cJSON_ArrayForEach(m, msgs) {
            list[k].role = str_or_null(cJSON_GetObjectItem(m, "role"));
            list[k].content = str_or_null(cJSON_GetObjectItem(m, "content"));
            k++;
        }
        int agp = cJSON_IsTrue(cJSON_GetObjectItem(c, "add_generation_prompt"));
        char *out = NULL;
        vq_status st = vq_chat_render(tmpl, list, n, agp, str_or_null(cJSON_GetObjectItem(c, "bos_token")),
                                      str_or_null(cJSON_GetObjectItem(c, "eos_token")), &out);
        const char *expected = str_or_null(cJSON_GetObjectItem(c, "expected"));
        const char *error = str_or_null(cJSON_GetObjectItem(c, "error"));
        if (expected) {
            CHECK(st == VQ_OK && out && strcmp(out, expected) == 0,
                  "case %d (%.60s, %d messages, agp %d): %s\n--- got ---\n%s\n--- want ---\n%s", n_cases, label, n, agp,
                  st ? vq_last_error() : "text differs", out ? out : "(none)", expected);
        } else {
            n_errors++;
            CHECK(st != VQ_OK && out == NULL, "case %d (%.60s): rendered, but jinja2 raised '%s'", n_cases, label,
                  error ? error : "?");
            if (st != VQ_OK && error && *error)
                CHECK(strstr(vq_last_error(), error) != NULL && st == VQ_ERR_ARG,
                      "case %d (%.60s): error '%s' (status %d) lacks '%s'", n_cases, label, vq_last_error(), st, error);
        }
        free(out);
        free(list);
        free(tmpl);
        n_cases++;
    }
    CHECK(n_cases > 150 && n_errors > 10, "only %d golden cases (%d errors)", n_cases, n_errors);
    cJSON_Delete(cases);
}

static void test_config(void) {
    char path[4096];
    vq_chat_config cfg;
    snprintf(path, sizeof path, "%s/chat/config_string.json", fixtures);
    CHECK(vq_chat_config_load(path, &cfg) == VQ_OK, "%s", vq_last_error());
    char *want = read_file("mistral_v02_orig.jinja");
    CHECK(cfg.chat_template && want && strcmp(cfg.chat_template, want) == 0, "string chat_template not read");
    CHECK(cfg.bos_token && strcmp(cfg.bos_token, "<s>") == 0, "bos_token");
    CHECK(cfg.eos_token && strcmp(cfg.eos_token, "</s>") == 0, "eos_token given as {\"content\": ...}");
    vq_chat_config_free(&cfg);
    free(want);

    snprintf(path, sizeof path, "%s/chat/config_list.json", fixtures);
    CHECK(vq_chat_config_load(path, &cfg) == VQ_OK, "%s", vq_last_error());
    want = read_file("qwen2.jinja");
    CHECK(cfg.chat_template && want && strcmp(cfg.chat_template, want) == 0, "the 'default' template of a list");
    CHECK(cfg.bos_token == NULL && cfg.eos_token && strcmp(cfg.eos_token, "<|im_end|>") == 0, "tokens of the list config");
    vq_chat_config_free(&cfg);
    free(want);

    snprintf(path, sizeof path, "%s/chat/config_none.json", fixtures);
    CHECK(vq_chat_config_load(path, &cfg) == VQ_OK && cfg.chat_template == NULL && cfg.bos_token, "no chat_template");
    vq_chat_config_free(&cfg);
    snprintf(path, sizeof path, "%s/chat/no_such_file.json", fixtures);
    CHECK(vq_chat_config_load(path, &cfg) == VQ_OK && !cfg.chat_template && !cfg.bos_token, "a missing file is fine");

    /* malformed configs */
    const char *bad[][2] = {
        {"{\"chat_template\": 3}", "must be a string or a list"},
        {"{\"chat_template\": [{\"name\": \"tool_use\", \"template\": \"x\"}]}", "none named 'default'"},
        {"{\"chat_template\": [{\"name\": \"default\"}]}", "needs string \"name\" and \"template\""},
        {"{\"chat_template\": \"x\", \"eos_token\": 5}", "\"eos_token\" must be a string"},
        {"[1, 2]", "not a JSON object"},
        {"{\"chat_template\": ", "JSON"},
    };
    snprintf(path, sizeof path, "%s/chat_config_test_tmp.json", getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp");
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        FILE *f = fopen(path, "wb");
        CHECK(f != NULL, "cannot write %s", path);
        if (!f) return;
        fputs(bad[i][0], f);
        fclose(f);
        vq_status st = vq_chat_config_load(path, &cfg);
        CHECK(st != VQ_OK && strstr(vq_last_error(), bad[i][1]), "config %s: %s", bad[i][0], vq_last_error());
        CHECK(cfg.chat_template == NULL, "no template left after an error");
    }
    remove(path);
}

/* Constructs outside the subset, and template errors: each fails with a
 * message naming it and its position. */
static void test_errors(void) {
    static const struct {
        const char *tmpl;
        vq_status status;
        const char *msg1, *msg2;
    } cases[] = {
        {"{% macro m() %}x{% endmacro %}", VQ_ERR_UNSUPPORTED, "{% macro %} statement is not supported", "line 1, column 1"},
        {"ok\n  {{ messages | sort }}", VQ_ERR_UNSUPPORTED, "filter 'sort' is not supported", "line 2, column 15"},
        {"{{ range(3) }}", VQ_ERR_UNSUPPORTED, "function 'range' is not supported", "line 1"},
        {"{% if true %}{% break %}{% endif %}", VQ_ERR_FORMAT, "{% break %} outside a for loop", "column 14"},
        {"{% call m() %}x{% endcall %}", VQ_ERR_UNSUPPORTED, "{% call %} statement is not supported", "line 1"},
        {"{{ '%s' % 1 }}", VQ_ERR_UNSUPPORTED, "string formatting", "line 1"},
        {"{{ '\xc3\x89t\xc3\xa9' | upper }}", VQ_ERR_UNSUPPORTED, "non-ASCII", "line 1"},
        {"\n\n{{ 'a'.title() }}", VQ_ERR_UNSUPPORTED, "method 'title' is not supported", "line 3"},
        {"{{ messages.append(1) }}", VQ_ERR_UNSUPPORTED, "list method 'append'", "line 1"},
        {"{% if true %}x", VQ_ERR_FORMAT, "{% if %} is not closed (expected {% endif %})", "line 1, column 1"},
        {"{% for m in messages %}x{% endif %}", VQ_ERR_FORMAT, "unexpected {% endif %}", "column 25"},
        {"abc {{ messages", VQ_ERR_FORMAT, "'{{' is not closed", "column 5"},
        {"{# never closed", VQ_ERR_FORMAT, "comment", "line 1"},
        {"{{ 1 + }}", VQ_ERR_FORMAT, "expected an expression, found '}}'", "line 1"},
        {"{{ 'unterminated }}", VQ_ERR_FORMAT, "unterminated string", "column 4"},
        {"{% set x %}y{% endset %}", VQ_ERR_UNSUPPORTED, "block assignment", "line 1"},
        {"{% frobnicate %}", VQ_ERR_FORMAT, "unknown statement", "line 1"},
        {"{{ messages[0].tool_calls[0].function }}", VQ_ERR_FORMAT, "'tool_calls' is undefined", "line 1"},
        {"{{ nothing + 'x' }}", VQ_ERR_FORMAT, "'nothing' is undefined", "line 1"},
        {"{{ 'a' + 1 }}", VQ_ERR_FORMAT, "unsupported operand types for +: str and int", "line 1"},
        {"{{ 1 // 0 }}", VQ_ERR_FORMAT, "division by zero", "line 1"},
        {"{{ 999999999999999999 * 100 }}", VQ_ERR_UNSUPPORTED, "integer overflow", "line 1"},
        {"{{ 1 < 'a' }}", VQ_ERR_FORMAT, "'<' is not supported between a int and a str", "line 1"},
        {"{{ raise_exception('roles must alternate') }}", VQ_ERR_ARG, "raise_exception: roles must alternate", "line 1"},
        {"{% set ns.x = 1 %}", VQ_ERR_FORMAT, "'ns' is not a namespace()", "line 1"},
        {"{{ messages | tojson(separators=(',', ':')) }}", VQ_ERR_UNSUPPORTED, "separators are not supported", "line 1"},
        {"{{ loop }}", VQ_ERR_FORMAT, "", "line 1"}, /* an undefined name prints as nothing: not an error */
        {"{% for a, b in messages %}{% endfor %}", VQ_ERR_FORMAT, "cannot unpack a dict into 2 loop variables", "line 1"},
        {"{{ '\\N{BULLET}' }}", VQ_ERR_UNSUPPORTED, "\\N{...}", "line 1"},
        {"{{ '\\x4' }}", VQ_ERR_FORMAT, "truncated \\x escape", "line 1"},
        {"{{ messages | items }}", VQ_ERR_FORMAT, "items: a list is not a mapping", "line 1"},
        {"{{ messages[0][1:] }}", VQ_ERR_FORMAT, "a dict cannot be sliced", "column 15"},
        {"{{ x }", VQ_ERR_FORMAT, "unexpected '}'", "line 1"},
    };
    vq_chat_message msg = {"user", "hi"};
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char *out = NULL;
        vq_status st = vq_chat_render(cases[i].tmpl, &msg, 1, 1, "<s>", "</s>", &out);
        if (!*cases[i].msg1) {
            CHECK(st == VQ_OK && out && !*out, "'%s' should render empty: %s", cases[i].tmpl, vq_last_error());
            free(out);
            continue;
        }
        CHECK(st == cases[i].status && out == NULL, "'%s': status %d, want %d (%s)", cases[i].tmpl, st, cases[i].status,
              vq_last_error());
        CHECK(strstr(vq_last_error(), cases[i].msg1) && strstr(vq_last_error(), cases[i].msg2),
              "'%s': message '%s' lacks '%s' / '%s'", cases[i].tmpl, vq_last_error(), cases[i].msg1, cases[i].msg2);
        free(out);
    }

    /* bad arguments */
    char *out = (char *)1;
    CHECK(vq_chat_render(NULL, &msg, 1, 1, NULL, NULL, &out) == VQ_ERR_ARG && out == NULL, "NULL template");
    CHECK(vq_chat_render("x", NULL, 1, 1, NULL, NULL, &out) == VQ_ERR_ARG, "NULL messages");
    CHECK(vq_chat_render("x", &msg, -1, 1, NULL, NULL, &out) == VQ_ERR_ARG, "negative count");
    vq_chat_message bad = {"user", "ok \xff here"};
    CHECK(vq_chat_render("x", &bad, 1, 1, NULL, NULL, &out) == VQ_ERR_ARG && strstr(vq_last_error(), "byte 3"),
          "invalid UTF-8 content: %s", vq_last_error());
    CHECK(vq_chat_render("{{ '\xe2\x82' }}", &msg, 1, 1, NULL, NULL, &out) == VQ_ERR_FORMAT &&
              strstr(vq_last_error(), "not valid UTF-8"),
          "invalid UTF-8 template: %s", vq_last_error());
    vq_chat_message none_content = {"user", NULL};
    CHECK(vq_chat_render("x", &none_content, 1, 1, NULL, NULL, &out) == VQ_ERR_ARG, "NULL content");
    /* zero messages render (a template that reads messages[0] sees Undefined) */
    CHECK(vq_chat_render("[{{ messages | length }}]", NULL, 0, 0, NULL, NULL, &out) == VQ_OK && strcmp(out, "[0]") == 0,
          "no messages");
    free(out);
    /* hostile nesting is refused, not a stack overflow */
    char deep[2200];
    memset(deep, 0, sizeof deep);
    strcpy(deep, "{{ ");
    for (int k = 0; k < 1000; k++) strcat(deep, "(");
    strcat(deep, "1");
    for (int k = 0; k < 1000; k++) strcat(deep, ")");
    strcat(deep, " }}");
    CHECK(vq_chat_render(deep, &msg, 1, 1, NULL, NULL, &out) == VQ_ERR_UNSUPPORTED && strstr(vq_last_error(), "nesting"),
          "deep nesting: %s", vq_last_error());
    /* while 30 levels are fine */
    strcpy(deep, "{{ ");
    for (int k = 0; k < 30; k++) strcat(deep, "(");
    strcat(deep, "7");
    for (int k = 0; k < 30; k++) strcat(deep, ")");
    strcat(deep, " }}");
    CHECK(vq_chat_render(deep, &msg, 1, 1, NULL, NULL, &out) == VQ_OK && strcmp(out, "7") == 0, "30 levels: %s",
          vq_last_error());
    free(out);
    /* a doubling loop stops at the memory limit */
    const char *grow = "{% set ns = namespace(s='xxxxxxxxxxxxxxxx') %}{% for a in messages %}{% for b in messages %}"
                       "{% for c in messages %}{% for d in messages %}{% set ns.s = ns.s + ns.s %}{% endfor %}{% endfor %}"
                       "{% endfor %}{% endfor %}{{ ns.s | length }}";
    vq_chat_message many[8];
    for (int k = 0; k < 8; k++) many[k] = msg;
    CHECK(vq_chat_render(grow, many, 8, 1, NULL, NULL, &out) == VQ_ERR_NOMEM && out == NULL, "runaway growth: %s",
          vq_last_error());
}

/* Every prefix of every real template, and seeded single-character
 * mutations: each renders or fails with a message, and never crashes (the
 * sanitizer build checks memory). */
static void test_fuzz(void) {
    static const char *const names[] = {"llama3.jinja", "llama31.jinja", "llama2.jinja", "mistral_v01.jinja",
                                        "mistral_v02_orig.jinja", "mistral_v03.jinja", "qwen2.jinja", "qwen25.jinja",
                                        "qwen3.jinja"};
    vq_chat_message msgs[3] = {{"system", "sys"}, {"user", "hi"}, {"assistant", "<think>\nx\n</think>\n\ny"}};
    uint64_t seed = 12345;
    int rendered = 0, failed = 0, silent = 0;
    for (size_t t = 0; t < sizeof names / sizeof names[0]; t++) {
        char *tmpl = read_file(names[t]);
        if (!tmpl) continue;
        size_t len = strlen(tmpl);
        char *buf = malloc(len + 1);
        for (size_t cut = 0; cut <= len; cut += 1 + cut / 512) {
            memcpy(buf, tmpl, cut);
            buf[cut] = 0;
            char *out = NULL;
            vq_status st = vq_chat_render(buf, msgs, 3, 1, "<s>", "</s>", &out);
            if (st == VQ_OK) rendered++;
            else failed++, silent += !*vq_last_error();
            free(out);
        }
        static const char syntax[] = "{}%#-+()[]'\".|~:, \nx0";
        for (int k = 0; k < 150; k++) {
            memcpy(buf, tmpl, len + 1);
            for (int edits = 0; edits < 3; edits++) {
                seed = seed * 6364136223846793005ull + 1442695040888963407ull;
                buf[(seed >> 33) % len] = syntax[(seed >> 17) % (sizeof syntax - 1)];
            }
            char *out = NULL;
            vq_status st = vq_chat_render(buf, msgs, 3, 1, "<s>", "</s>", &out);
            if (st == VQ_OK) rendered++;
            else failed++, silent += !*vq_last_error();
            free(out);
        }
        free(buf);
        free(tmpl);
    }
    CHECK(silent == 0, "%d failures without a message", silent);
    CHECK(rendered > 100 && failed > 1000, "fuzz: %d rendered, %d failed", rendered, failed);
}

int main(int argc, char **argv) {
    fixtures = argc > 1 ? argv[1] : "tests/fixtures";
    test_goldens();
    test_config();
    test_errors();
    test_fuzz();
    return check_done();
}
