/* Tests of data/tokenizer: the two real tokenizers of tests/fixtures/tokenizers against the ids
 * and decodings the Hugging Face tokenizers library gives (*-expected.json, with and without
 * special tokens), the split-special mode, a tiny tokenizer.json exercising byte fallback,
 * fuse_unk, ignore_merges, normalized added tokens, NFC, Metaspace and tokenizers' added-token ids (its
 * expected values come from tokenizers 0.23), tokenizer_config.json's add_bos/add_eos, and
 * every refusal.  Run from the repository root (tests/run.sh does). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "data/tokenizer.h"
#include "tests/unit/fixtures.h"

/* ---------- helpers ---------- */

static tokenizer *load_family(const char *family) {
    char path[4096];
    fixture_path(path, sizeof path, "tokenizers/%s-tokenizer.json", family);
    errbuf err = {{0}};
    tokenizer *tk = tokenizer_load(path, &err);
    if (!tk) fail_msg("%s", err.msg);
    return tk;
}

static void encode_ok(const tokenizer *tk, const char *text, size_t len, int flags, tk_ids *ids) {
    tk_state *st = tk_state_new(tk);
    assert_non_null(st);
    errbuf err = {{0}};
    ids->n = 0;
    if (tokenizer_encode(tk, st, text, len, flags, ids, &err)) fail_msg("%s", err.msg);
    tk_state_free(st);
}

static void expect_ids(const tokenizer *tk, const char *text, int flags, const int32_t *want,
                       size_t n) {
    tk_ids ids = {0};
    encode_ok(tk, text, strlen(text), flags, &ids);
    int same = ids.n == n && (n == 0 || memcmp(ids.v, want, n * sizeof *want) == 0);
    if (!same) {
        char got[1024] = "";
        for (size_t i = 0; i < ids.n && strlen(got) < 1000; i++)
            snprintf(got + strlen(got), sizeof got - strlen(got), " %d", ids.v[i]);
        tk_ids_free(&ids);
        fail_msg("\"%s\" (flags %d): got%s", text, flags, got);
    }
    tk_ids_free(&ids);
}
#define EXPECT(tk, text, flags, ...)                                                        \
    do {                                                                                    \
        const int32_t want_[] = {__VA_ARGS__};                                              \
        expect_ids(tk, text, flags, want_, sizeof want_ / sizeof want_[0]);                 \
    } while (0)

static void expect_decode(const tokenizer *tk, const int32_t *ids, size_t n, const char *want,
                          size_t want_len) {
    errbuf err = {{0}};
    size_t len;
    char *text = tokenizer_decode(tk, ids, n, &len, &err);
    if (!text) fail_msg("%s", err.msg);
    if (len != want_len || memcmp(text, want, len) != 0) {
        fail_msg("decoded \"%s\", expected \"%s\"", text, want);
    }
    free(text);
}

static void ids_of(json_t *arr, tk_ids *ids) {
    ids->n = 0;
    for (size_t i = 0; i < json_array_size(arr); i++)
        assert_int_equal(tk_ids_push(ids, (int32_t)json_integer_value(json_array_get(arr, i))), 0);
}

static int same_ids(const tk_ids *a, const tk_ids *b) {
    return a->n == b->n && (a->n == 0 || memcmp(a->v, b->v, a->n * sizeof *a->v) == 0);
}

/* Every case of FAMILY-expected.json: ids with and without special tokens, and decode(ids). */
static void check_family(const char *family) {
    tokenizer *tk = load_family(family);
    char path[4096];
    fixture_path(path, sizeof path, "tokenizers/%s-expected.json", family);
    json_error_t je;
    json_t *cases = json_load_file(path, 0, &je);
    if (!cases) fail_msg("%s: %s", path, je.text);
    assert_true(json_array_size(cases) >= 30);
    tk_ids got = {0}, want = {0};
    size_t checked = 0;
    for (size_t i = 0; i < json_array_size(cases); i++) {
        json_t *c = json_array_get(cases, i), *text = json_object_get(c, "text");
        const char *s = json_string_value(text);
        static const char *const keys[] = {"ids_with_special", "ids"};
        for (int k = 0; k < 2; k++) {
            encode_ok(tk, s, json_string_length(text), k == 0 ? TK_ADD_SPECIAL : 0, &got);
            ids_of(json_object_get(c, keys[k]), &want);
            if (!same_ids(&got, &want)) fail_msg("%s: \"%s\": %s differ", family, s, keys[k]);
            checked++;
        }
        json_t *decoded = json_object_get(c, "decoded");
        expect_decode(tk, want.v, want.n, json_string_value(decoded), json_string_length(decoded));
    }
    assert_int_equal(checked, 2 * json_array_size(cases));
    tk_ids_free(&got);
    tk_ids_free(&want);
    json_decref(cases);
    tokenizer_free(tk);
}

/* ---------- the real tokenizers ---------- */

static void test_sp32k_expected(void **state) {
    (void)state;
    check_family("sp32k");
}

static void test_llama3_expected(void **state) {
    (void)state;
    check_family("llama3");
}

/* Special-token text as plain text (tokenizers' encode_special_tokens=True). */
static void test_split_special(void **state) {
    (void)state;
    tokenizer *sp = load_family("sp32k"), *l3 = load_family("llama3");
    EXPECT(sp, "<s>", TK_ADD_SPECIAL, 1, 1);
    EXPECT(sp, "<s>", TK_ADD_SPECIAL | TK_SPLIT_SPECIAL, 1, 523, 28713, 28767);
    EXPECT(sp, "</s> after", TK_ADD_SPECIAL | TK_SPLIT_SPECIAL, 1, 1867, 28713, 28767, 1024);
    EXPECT(l3, "<s>", TK_SPLIT_SPECIAL, 45147, 29);
    EXPECT(l3, "<|begin_of_text|>hi<|eot_id|>", 0, 128000, 6151, 128009);
    EXPECT(l3, "<|begin_of_text|>hi<|eot_id|>", TK_SPLIT_SPECIAL, 27, 91, 7413, 3659, 4424, 91,
           29, 6151, 27, 91, 68, 354, 851, 91, 29);
    tokenizer_free(sp);
    tokenizer_free(l3);
}

/* Letters, digits and spaces as tokenizers' regex engine (Unicode 16) knows them, not as
 * PCRE2's tables (Unicode 14): CJK Extension H/I letters, Garay digits, U+180E not a space. */
static void test_unicode_classes(void **state) {
    (void)state;
    tokenizer *tk = load_family("llama3");
    EXPECT(tk, "\xf0\xb2\x81\xab'b", 0, 172, 110, 223, 104, 91953); /* U+3206B */
    EXPECT(tk, "\xf0\xae\xaf\xb0!!", 0, 172, 106, 107, 108, 3001);  /* U+2EBF0 */
    EXPECT(tk, " \xe1\xa0\x8ex", 0, 87189, 254, 236, 87);            /* U+180E */
    EXPECT(tk, " \xf0\x90\xb5\x80x", 0, 220, 172, 238, 113, 222, 87); /* U+10D40 */
    tokenizer_free(tk);
}

static void test_rejects_bad_text_and_ids(void **state) {
    (void)state;
    tokenizer *tk = load_family("llama3");
    tk_state *st = tk_state_new(tk);
    tk_ids ids = {0};
    errbuf err = {{0}};
    assert_int_equal(tokenizer_encode(tk, st, "ok\xff", 3, 0, &ids, &err), -1);
    assert_non_null(strstr(err.msg, "not valid UTF-8 (at byte 2)"));
    const int32_t bad[] = {9906, 128256};
    size_t len;
    assert_null(tokenizer_decode(tk, bad, 2, &len, &err));
    assert_non_null(strstr(err.msg, "id 128256 is not in the vocabulary"));
    assert_int_equal(tokenizer_vocab_size(tk), 128256);
    tk_ids_free(&ids);
    tk_state_free(st);
    tokenizer_free(tk);
}

/* ---------- a tiny tokenizer.json ---------- */

static const char *tiny_text =
    "{\"version\": \"1.0\", \"truncation\": null, \"padding\": null,"
    " \"added_tokens\": ["
    "  {\"id\": 0, \"content\": \"<unk>\", \"normalized\": false, \"special\": true},"
    "  {\"id\": 1, \"content\": \"<s>\", \"normalized\": false, \"special\": true},"
    "  {\"id\": 2, \"content\": \"</s>\", \"normalized\": false, \"special\": true},"
    "  {\"id\": 13, \"content\": \"ab\", \"normalized\": true, \"special\": false}],"
    " \"normalizer\": {\"type\": \"Sequence\", \"normalizers\": [{\"type\": \"Prepend\", "
    "\"prepend\": \"_\"}, {\"type\": \"Replace\", \"pattern\": {\"String\": \" \"}, \"content\": \"_\"}]},"
    " \"pre_tokenizer\": null,"
    " \"post_processor\": {\"type\": \"TemplateProcessing\","
    "  \"single\": [{\"SpecialToken\": {\"id\": \"<s>\", \"type_id\": 0}}, {\"Sequence\": {\"id\": \"A\", "
    "\"type_id\": 0}}, {\"SpecialToken\": {\"id\": \"</s>\", \"type_id\": 0}}],"
    "  \"special_tokens\": {\"<s>\": {\"id\": \"<s>\", \"ids\": [1], \"tokens\": [\"<s>\"]},"
    "   \"</s>\": {\"id\": \"</s>\", \"ids\": [2], \"tokens\": [\"</s>\"]}}},"
    " \"decoder\": {\"type\": \"Sequence\", \"decoders\": [{\"type\": \"Replace\", \"pattern\": "
    "{\"String\": \"_\"}, \"content\": \" \"}, {\"type\": \"ByteFallback\"}, {\"type\": \"Fuse\"},"
    " {\"type\": \"Strip\", \"content\": \" \", \"start\": 1, \"stop\": 0}]},"
    " \"model\": {\"type\": \"BPE\", \"dropout\": null, \"unk_token\": \"<unk>\","
    "  \"continuing_subword_prefix\": null, \"end_of_word_suffix\": null,"
    "  \"fuse_unk\": true, \"byte_fallback\": true, \"ignore_merges\": false,"
    "  \"vocab\": {\"<unk>\": 0, \"<s>\": 1, \"</s>\": 2, \"<0xC3>\": 3, \"<0xA9>\": 4, \"_\": 5,"
    " \"a\": 6, \"b\": 7, \"c\": 8, \"_a\": 9, \"bc\": 10, \"_abc\": 11, \"cc\": 12, \"ab\": 14,"
    " \"abc\": 15, \"_ccc\": 16},"
    "  \"merges\": [[\"b\", \"c\"], [\"_\", \"a\"], [\"_a\", \"bc\"], [\"c\", \"c\"], [\"a\", \"b\"],"
    " [\"ab\", \"c\"], [\"b\", \"c\"]]}}";

static json_t *tiny(void) {
    json_error_t je;
    json_t *j = json_loads(tiny_text, 0, &je);
    if (!j) fail_msg("tiny: %s", je.text);
    return j;
}

static tokenizer *parse_obj(json_t *j, const char *config, errbuf *err) {
    char *text = json_dumps(j, 0);
    assert_non_null(text);
    tokenizer *tk = tokenizer_parse(text, strlen(text), config, config ? strlen(config) : 0,
                                    "test.json", err);
    free(text);
    json_decref(j);
    return tk;
}

static tokenizer *tiny_with(const char *model_key, json_t *value) {
    json_t *j = tiny();
    if (model_key) json_object_set_new(json_object_get(j, "model"), model_key, value);
    errbuf err = {{0}};
    tokenizer *tk = parse_obj(j, NULL, &err);
    if (!tk) fail_msg("%s", err.msg);
    return tk;
}

static void test_tiny_bpe(void **state) {
    (void)state;
    tokenizer *tk = tiny_with(NULL, NULL);
    /* "_ab" is the normalized added token (content normalized too) with the vocab's id 14 */
    EXPECT(tk, "abc", TK_ADD_SPECIAL, 1, 14, 8, 2);
    EXPECT(tk, "abc", 0, 14, 8);
    EXPECT(tk, "ab ab", 0, 14, 14);
    EXPECT(tk, "a bc cc", 0, 9, 5, 10, 5, 12);
    EXPECT(tk, "ccc", 0, 5, 12, 8);
    EXPECT(tk, "xyz", 0, 5, 0);       /* fuse_unk */
    EXPECT(tk, "\xc3\xa9", 0, 5, 3, 4); /* byte fallback */
    EXPECT(tk, "x\xc3\xa9", 0, 5, 3, 4, 0); /* tokenizers flushes the unk after the bytes */
    EXPECT(tk, "<s>x", TK_ADD_SPECIAL, 1, 1, 5, 0, 2);
    EXPECT(tk, "<s>x", TK_ADD_SPECIAL | TK_SPLIT_SPECIAL, 1, 5, 0, 2);
    EXPECT(tk, "zz</s>", 0, 5, 0, 2);
    EXPECT(tk, "zz</s>", TK_SPLIT_SPECIAL, 5, 0);
    EXPECT(tk, "", TK_ADD_SPECIAL, 1, 2);
    const int32_t ids[] = {1, 9, 10, 5, 12, 2, 3, 4, 0, 3};
    static const char want[] = "<s> abc cc</s>\xc3\xa9<unk>\xef\xbf\xbd";
    expect_decode(tk, ids, 10, want, sizeof want - 1);
    tokenizer_free(tk);
}

static void test_tiny_options(void **state) {
    (void)state;
    tokenizer *tk = tiny_with("ignore_merges", json_true());
    EXPECT(tk, "ccc", 0, 16); /* the whole word is in the vocab */
    tokenizer_free(tk);
    tk = tiny_with("fuse_unk", json_false());
    EXPECT(tk, "xyz", 0, 5, 0, 0, 0);
    tokenizer_free(tk);
    tk = tiny_with("byte_fallback", json_false());
    EXPECT(tk, "x\xc3\xa9", 0, 5, 0); /* fused unk over x and the two bytes */
    tokenizer_free(tk);
    tk = tiny_with("unk_token", json_null());
    tokenizer_free(tk);
    /* the "a b" string form of merges gives the same model */
    json_t *j = tiny(), *m = json_object_get(json_object_get(j, "model"), "merges"), *pair;
    json_t *strings = json_array();
    size_t i;
    json_array_foreach(m, i, pair) {
        char s[64];
        snprintf(s, sizeof s, "%s %s", json_string_value(json_array_get(pair, 0)),
                 json_string_value(json_array_get(pair, 1)));
        json_array_append_new(strings, json_string(s));
    }
    json_object_set_new(json_object_get(j, "model"), "merges", strings);
    errbuf err = {{0}};
    tk = parse_obj(j, NULL, &err);
    if (!tk) fail_msg("%s", err.msg);
    EXPECT(tk, "a bc cc", 0, 9, 5, 10, 5, 12);
    tokenizer_free(tk);
}

/* NFC (Qwen) and Metaspace (SentencePiece models as transformers converts them): the tiny
 * tokenizer with them, its ids from tokenizers 0.23. */
static tokenizer *tiny_nfc_metaspace(const char *scheme) {
    json_t *j = tiny();
    json_error_t je;
    char pre[160];
    snprintf(pre, sizeof pre, "{\"type\": \"Metaspace\", \"replacement\": \"_\", "
             "\"prepend_scheme\": \"%s\", \"split\": false}", scheme);
    json_object_set_new(j, "normalizer", json_pack("{s:s}", "type", "NFC"));
    json_object_set_new(j, "pre_tokenizer", json_loads(pre, 0, &je));
    errbuf err = {{0}};
    tokenizer *tk = parse_obj(j, NULL, &err);
    if (!tk) fail_msg("%s", err.msg);
    return tk;
}

static void test_nfc_metaspace(void **state) {
    (void)state;
    tokenizer *tk = tiny_nfc_metaspace("first");
    EXPECT(tk, "e\xcc\x81", 0, 5, 3, 4); /* e + U+0301 is U+00E9: "_" and its two bytes */
    EXPECT(tk, "<s>a bc", 0, 1, 6, 5, 10); /* no "_" after an added token */
    EXPECT(tk, "a bc", 0, 9, 5, 10);
    EXPECT(tk, " ab", 0, 5, 14);
    tokenizer_free(tk);
    tk = tiny_nfc_metaspace("always");
    EXPECT(tk, "<s>a bc", 0, 1, 9, 5, 10);
    tokenizer_free(tk);
    tk = tiny_nfc_metaspace("never");
    EXPECT(tk, "a bc", 0, 6, 5, 10);
    tokenizer_free(tk);
}

/* tokenizer_config.json's add_bos_token/add_eos_token win over the post-processor. */
static void test_config_bos_eos(void **state) {
    (void)state;
    errbuf err = {{0}};
    tokenizer *tk = parse_obj(tiny(), "{\"add_bos_token\": true, \"add_eos_token\": true, "
                              "\"bos_token\": \"<s>\", \"eos_token\": {\"content\": \"</s>\"}}", &err);
    assert_non_null(tk);
    assert_string_equal(tokenizer_note(tk), ""); /* they agree */
    tokenizer_free(tk);
    tk = parse_obj(tiny(), "{\"add_bos_token\": false, \"add_eos_token\": false}", &err);
    assert_non_null(tk);
    EXPECT(tk, "xyz", TK_ADD_SPECIAL, 5, 0);
    assert_non_null(strstr(tokenizer_note(tk), "following tokenizer_config.json"));
    tokenizer_free(tk);
    tk = parse_obj(tiny(), "{\"add_eos_token\": true, \"eos_token\": \"<unk>\"}", &err);
    assert_non_null(tk);
    EXPECT(tk, "xyz", TK_ADD_SPECIAL, 1, 5, 0, 0);
    tokenizer_free(tk);
    assert_null(parse_obj(tiny(), "{\"add_bos_token\": true, \"bos_token\": \"<nope>\"}", &err));
    assert_non_null(strstr(err.msg, "bos_token is not a token"));
}

/* A model directory: tokenizer.json beside tokenizer_config.json. */
static void test_load_model_dir(void **state) {
    (void)state;
    char dir[] = "/tmp/test_tokenizer.XXXXXX", path[256];
    assert_non_null(mkdtemp(dir));
    snprintf(path, sizeof path, "%s/tokenizer.json", dir);
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fputs(tiny_text, f);
    fclose(f);
    snprintf(path, sizeof path, "%s/tokenizer_config.json", dir);
    f = fopen(path, "w");
    assert_non_null(f);
    fputs("{\"add_bos_token\": false}", f);
    fclose(f);
    errbuf err = {{0}};
    tokenizer *tk = tokenizer_load(dir, &err);
    if (!tk) fail_msg("%s", err.msg);
    EXPECT(tk, "xyz", TK_ADD_SPECIAL, 5, 0, 2);
    tokenizer_free(tk);
    unlink(path);
    snprintf(path, sizeof path, "%s/tokenizer.json", dir);
    unlink(path);
    assert_null(tokenizer_load(dir, &err)); /* no tokenizer.json in the directory */
    assert_non_null(strstr(err.msg, "tokenizer.json"));
    rmdir(dir);
}

/* ---------- refusals ---------- */

typedef struct refusal {
    const char *section, *key, *value; /* section "" = top level; value NULL = remove */
    const char *needle;
} refusal;

static void test_refuses_unsupported_parts(void **state) {
    (void)state;
    static const refusal cases[] = {
        {"model", "type", "\"WordPiece\"", "model type \"WordPiece\" is not supported"},
        {"model", "type", "\"Unigram\"", "model type \"Unigram\" is not supported"},
        {"", "normalizer", "{\"type\": \"NFKC\"}", "normalizer type \"NFKC\" is not supported"},
        {"", "normalizer", "{\"type\": \"Sequence\", \"normalizers\": [{\"type\": \"Lowercase\"}]}",
         "normalizer type \"Lowercase\""},
        {"", "normalizer", "{\"type\": \"Replace\", \"pattern\": {\"Regex\": \" +\"}, \"content\": \"_\"}",
         "normalizer Replace with a Regex pattern"},
        {"", "pre_tokenizer", "{\"type\": \"Metaspace\", \"replacement\": \"_\"}", "Metaspace with split true"},
        {"", "pre_tokenizer", "{\"type\": \"Metaspace\", \"replacement\": \"_\", \"split\": false, "
         "\"prepend_scheme\": \"sometimes\"}", "prepend_scheme \"sometimes\""},
        {"", "pre_tokenizer", "{\"type\": \"Unigram\"}", "pre_tokenizer type \"Unigram\""},
        {"", "pre_tokenizer", "{\"type\": \"Split\", \"pattern\": {\"Regex\": \"a\"}, \"behavior\": "
         "\"MergedWithNext\", \"invert\": false}", "Split behavior \"MergedWithNext\""},
        {"", "pre_tokenizer", "{\"type\": \"Split\", \"pattern\": {\"Regex\": \"(\"}, \"behavior\": "
         "\"Isolated\", \"invert\": false}", "does not compile"},
        {"", "post_processor", "{\"type\": \"RobertaProcessing\"}", "post_processor type \"RobertaProcessing\""},
        {"", "decoder", "{\"type\": \"WordPiece\"}", "decoder type \"WordPiece\""},
        {"", "truncation", "{\"max_length\": 512}", "truncation is not supported"},
        {"", "padding", "{}", "padding is not supported"},
        {"", "added_tokens", "[{\"id\": 3, \"content\": \"x\", \"lstrip\": true}]", "lstrip is not supported"},
        {"", "model", NULL, "missing \"model\""},
        {"model", "dropout", "0.1", "model.dropout is not supported"},
        {"model", "continuing_subword_prefix", "\"##\"", "continuing_subword_prefix is not supported"},
        {"model", "merges", "[\"a b c\"]", "model.merges[0]"},
        {"model", "merges", "[\"a x\"]", "model.merges[0]: \"x\" is not in the vocab"},
        {"model", "merges", "[[\"a\", \"b\"], \"b c\"]", "mixes"},
        {"model", "vocab", "{\"a\": -1}", "model.vocab[\"a\"]"},
        {"model", "byte_fallback", "\"yes\"", "model.byte_fallback must be a boolean"},
        {"model", "vocab", NULL, "model.vocab must be an object, got nothing"},
        {"model", "merges", NULL, "model.merges must be a list, got nothing"},
        {"", "decoder", "{\"type\": \"Strip\", \"content\": \"ab\", \"start\": 1, \"stop\": 0}", "decoder Strip needs one character"},
        {"", "post_processor", "{\"type\": \"TemplateProcessing\"}", "needs a \"single\" list"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        json_t *j = tiny(), *at = cases[i].section[0] ? json_object_get(j, cases[i].section) : j;
        if (cases[i].value) {
            json_error_t je;
            json_t *v = json_loads(cases[i].value, JSON_DECODE_ANY, &je);
            if (!v) fail_msg("case %zu: %s", i, je.text);
            json_object_set_new(at, cases[i].key, v);
        } else json_object_del(at, cases[i].key);
        errbuf err = {{0}};
        tokenizer *tk = parse_obj(j, NULL, &err);
        if (tk) fail_msg("case %zu (%s) was accepted", i, cases[i].needle);
        if (!strstr(err.msg, cases[i].needle) || !strstr(err.msg, "test.json"))
            fail_msg("case %zu: \"%s\" does not mention \"%s\"", i, err.msg, cases[i].needle);
    }
    errbuf err = {{0}};
    assert_null(tokenizer_parse("{\"model\": ", 10, NULL, 0, "test.json", &err));
    assert_non_null(strstr(err.msg, "test.json"));
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_sp32k_expected),
        cmocka_unit_test(test_llama3_expected),
        cmocka_unit_test(test_split_special),
        cmocka_unit_test(test_unicode_classes),
        cmocka_unit_test(test_rejects_bad_text_and_ids),
        cmocka_unit_test(test_tiny_bpe),
        cmocka_unit_test(test_tiny_options),
        cmocka_unit_test(test_nfc_metaspace),
        cmocka_unit_test(test_config_bos_eos),
        cmocka_unit_test(test_load_model_dir),
        cmocka_unit_test(test_refuses_unsupported_parts),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
