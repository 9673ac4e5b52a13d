/* Tests of data/jsonl, data/chat_template, data/sample and data/cache_build (F25): the ids
 * and labels of tests/fixtures/data's conversations under the llama3 and llama2 templates (what
 * transformers' apply_chat_template and tokenizers give), special-token text in content kept
 * plain, template auto, truncation and dropped samples, the text and alpaca formats, and the
 * bad-record paths.  Run from the repository root (tests/run.sh does). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "data/cache_build.h"
#include "data/chat_template.h"
#include "data/sample.h"
#include "tests/unit/fixtures.h"

static char tmpdir[] = "/tmp/test_chat_data.XXXXXX";

/* tmpdir/NAME: a model directory with the family's tokenizer.json (and its
 * tokenizer_config.json when with_config). */
static const char *model_dir(const char *family, int with_config) {
    static char dir[600];
    char src[4096], dst[700], real[4096];
    snprintf(dir, sizeof dir, "%s/%s%s", tmpdir, family, with_config ? "-cfg" : "");
    if (access(dir, F_OK) == 0) return dir;
    if (mkdir(dir, 0755)) fail_msg("mkdir %s", dir);
    fixture_path(src, sizeof src, "tokenizers/%s-tokenizer.json", family);
    snprintf(dst, sizeof dst, "%s/tokenizer.json", dir);
    if (!realpath(src, real) || symlink(real, dst)) fail_msg("link %s", src);
    if (with_config) {
        fixture_path(src, sizeof src, "tokenizers/%s-tokenizer_config.json", family);
        snprintf(dst, sizeof dst, "%s/tokenizer_config.json", dir);
        if (!realpath(src, real) || symlink(real, dst)) fail_msg("link %s", src);
    }
    return dir;
}

static tokenizer *load(const char *dir) {
    errbuf err = {{0}};
    tokenizer *tk = tokenizer_load(dir, &err);
    if (!tk) fail_msg("%s", err.msg);
    return tk;
}

static void spec_ok(sample_spec *s, const tokenizer *tk, job_data_format f, chat_template t,
                    int seq_len, bool truncate) {
    errbuf err = {{0}};
    if (sample_spec_init(s, tk, f, t, seq_len, truncate, &err)) fail_msg("%s", err.msg);
}

static int sample_of(const sample_spec *s, sample_buf *b, const char *line, errbuf *err) {
    return sample_from_line(s, b, line, strlen(line), err);
}

/* Every entry of chat-FAMILY-expected.json, as a JSONL line, gives its input_ids and labels. */
static void check_golden(const char *expected, const char *dir, chat_template t) {
    char path[4096];
    fixture_path(path, sizeof path, "data/%s", expected);
    json_error_t je;
    json_t *all = json_load_file(path, 0, &je);
    if (!all) fail_msg("%s: %s", path, je.text);
    tokenizer *tk = load(dir);
    sample_spec s;
    spec_ok(&s, tk, JOB_DATA_CHAT, t, 4096, true);
    sample_buf b;
    errbuf err = {{0}};
    assert_int_equal(sample_buf_init(&b, tk, &err), 0);
    for (size_t e = 0; e < json_array_size(all); e++) {
        json_t *entry = json_array_get(all, e);
        json_t *line = json_pack("{s:O}", "messages", json_object_get(entry, "messages"));
        char *text = json_dumps(line, JSON_COMPACT);
        if (sample_of(&s, &b, text, &err) != SAMPLE_OK) fail_msg("entry %zu: %s", e, err.msg);
        json_t *ids = json_object_get(entry, "input_ids"), *labels = json_object_get(entry, "labels");
        assert_int_equal(b.ids.n, json_array_size(ids));
        for (size_t i = 0; i < b.ids.n; i++) {
            int want_id = (int)json_integer_value(json_array_get(ids, i));
            int want_label = (int)json_integer_value(json_array_get(labels, i));
            int label = b.mask[i] ? b.ids.v[i] : -100;
            if (b.ids.v[i] != want_id || label != want_label)
                fail_msg("%s entry %zu token %zu: id %d label %d, expected %d %d", expected, e, i,
                         b.ids.v[i], label, want_id, want_label);
        }
        free(text);
        json_decref(line);
    }
    sample_buf_free(&b);
    tokenizer_free(tk);
    json_decref(all);
}

static void test_golden_llama3(void **state) {
    (void)state;
    /* with tokenizer_config.json: its 1e30 model_max_length must not refuse the directory */
    check_golden("chat-llama3-expected.json", model_dir("llama3", 1), TPL_LLAMA3);
}

static void test_golden_llama2(void **state) {
    (void)state;
    check_golden("chat-llama2-expected.json", model_dir("sp32k", 0), TPL_LLAMA2);
}

/* "<|eot_id|>" and "</s>" inside content are plain text, never the control token. */
static void test_special_text_is_plain(void **state) {
    (void)state;
    tokenizer *tk = load(model_dir("llama3", 1));
    sample_spec s;
    spec_ok(&s, tk, JOB_DATA_CHAT, TPL_LLAMA3, 512, true);
    sample_buf b;
    errbuf err = {{0}};
    assert_int_equal(sample_buf_init(&b, tk, &err), 0);
    const char *line = "{\"messages\":[{\"role\":\"user\",\"content\":\"say <|eot_id|>\"},"
                       "{\"role\":\"assistant\",\"content\":\"<|eot_id|> and <|begin_of_text|>\"}]}";
    assert_int_equal(sample_of(&s, &b, line, &err), SAMPLE_OK);
    int eot = tokenizer_token_id(tk, "<|eot_id|>", 10), bos = tokenizer_bos_id(tk), n_eot = 0, n_bos = 0;
    for (size_t i = 0; i < b.ids.n; i++) {
        n_eot += b.ids.v[i] == eot;
        n_bos += b.ids.v[i] == bos;
    }
    assert_int_equal(n_eot, 2); /* the two turns' own */
    assert_int_equal(n_bos, 1);
    assert_int_equal(b.ids.v[b.ids.n - 1], eot);
    sample_buf_free(&b);
    tokenizer_free(tk);
}

static void test_template_auto(void **state) {
    (void)state;
    chat_template t;
    errbuf err = {{0}};
    assert_int_equal(resolve_template("auto", JOB_DATA_CHAT, model_dir("llama3", 1), &t, &err), 0);
    assert_int_equal(t, TPL_LLAMA3);
    assert_int_equal(resolve_template("", JOB_DATA_CHAT, model_dir("sp32k", 1), &t, &err), -1);
    assert_non_null(strstr(err.msg, "data.template"));
    assert_non_null(strstr(err.msg, "no chat_template"));
    assert_int_equal(resolve_template("auto", JOB_DATA_CHAT, model_dir("sp32k", 0), &t, &err), -1);
    assert_non_null(strstr(err.msg, "data.template"));
    assert_int_equal(resolve_template("llama2", JOB_DATA_CHAT, model_dir("sp32k", 0), &t, &err), 0);
    assert_int_equal(t, TPL_LLAMA2);
    char path[4096], *jinja;
    size_t len;
    fixture_path(path, sizeof path, "tokenizers/llama2-chat_template.jinja");
    FILE *f = fopen(path, "r");
    assert_non_null(f);
    jinja = calloc(1, 1 << 16);
    len = fread(jinja, 1, (1 << 16) - 1, f);
    fclose(f);
    assert_true(len > 0);
    assert_int_equal(chat_template_recognise(jinja), TPL_LLAMA2);
    assert_int_equal(chat_template_recognise("{{ messages }}"), TPL_NONE);
    /* F43: the strings that tell the families apart (the models' own templates:
     * tests/integration/test_chat_data.sh) */
    assert_int_equal(chat_template_recognise("{{ ' [INST] ' + c + ' [/INST]' }}"), TPL_MISTRAL);
    assert_int_equal(chat_template_recognise("{{ \"[INST] \" + c + \"[/INST]\" }}"), TPL_MISTRAL_V3);
    assert_int_equal(chat_template_recognise("{{ \"[INST]\" + c + \"[/INST]\" }}"), TPL_MISTRAL_TEKKEN);
    assert_int_equal(chat_template_recognise("{{ '[INST] ' + c + ' [/INST]' }}{{ c + eos }}"), TPL_NONE);
    assert_int_equal(chat_template_recognise("<|im_start|>{{ c }}<|im_end|>"), TPL_CHATML);
    assert_int_equal(chat_template_recognise("<|im_start|>You are Qwen, created by Alibaba Cloud. "
                                             "You are a helpful assistant.<|im_end|>"), TPL_QWEN25);
    assert_int_equal(chat_template_recognise("<|im_start|>system\\nYou are a helpful assistant.<|im_end|>"),
                     TPL_QWEN2);
    assert_int_equal(chat_template_recognise("<|im_start|><think>\\n</think><|im_end|>"), TPL_QWEN3);
    free(jinja);
    assert_int_equal(chat_template_parse("vicuna", &t, &err), -1);
    assert_non_null(strstr(err.msg, "data.template"));
}

static void test_truncate_and_drop(void **state) {
    (void)state;
    tokenizer *tk = load(model_dir("sp32k", 0));
    sample_spec s;
    sample_buf b;
    errbuf err = {{0}};
    assert_int_equal(sample_buf_init(&b, tk, &err), 0);
    const char *line = "{\"messages\":[{\"role\":\"user\",\"content\":\"one two three four five six "
                       "seven eight nine ten\"},{\"role\":\"assistant\",\"content\":\"eleven\"}]}";
    spec_ok(&s, tk, JOB_DATA_CHAT, TPL_LLAMA2, 10, true);
    assert_int_equal(sample_of(&s, &b, line, &err), SAMPLE_DROPPED); /* only the prompt is left */
    assert_int_equal(b.ids.n, 10);
    spec_ok(&s, tk, JOB_DATA_CHAT, TPL_LLAMA2, 10, false);
    assert_int_equal(sample_of(&s, &b, line, &err), -1);
    assert_non_null(strstr(err.msg, "more than data.seq_len 10"));
    spec_ok(&s, tk, JOB_DATA_CHAT, TPL_LLAMA2, 4096, false);
    assert_int_equal(sample_of(&s, &b, line, &err), SAMPLE_OK);
    /* llama2: roles alternate */
    const char *twice = "{\"messages\":[{\"role\":\"user\",\"content\":\"a\"},{\"role\":\"user\","
                        "\"content\":\"b\"},{\"role\":\"assistant\",\"content\":\"c\"}]}";
    assert_int_equal(sample_of(&s, &b, twice, &err), -1);
    assert_non_null(strstr(err.msg, "roles alternate"));
    sample_buf_free(&b);
    tokenizer_free(tk);
}

/* text: BOS, the text, EOS, loss everywhere; alpaca: the prompt's own token count is masked
 * (fsdp_qlora's rule), then the output and EOS carry the loss. */
static void test_text_and_alpaca(void **state) {
    (void)state;
    tokenizer *tk = load(model_dir("sp32k", 0));
    sample_spec s;
    sample_buf b;
    errbuf err = {{0}};
    tk_state *st = tk_state_new(tk);
    tk_ids want = {0};
    assert_int_equal(sample_buf_init(&b, tk, &err), 0);
    spec_ok(&s, tk, JOB_DATA_TEXT, TPL_NONE, 4096, true);
    assert_int_equal(sample_of(&s, &b, "{\"text\":\"Hello world\"}", &err), SAMPLE_OK);
    assert_int_equal(tokenizer_encode(tk, st, "Hello world", 11, TK_ADD_SPECIAL, &want, &err), 0);
    assert_int_equal(b.ids.n, want.n + 1);
    assert_memory_equal(b.ids.v, want.v, want.n * sizeof *want.v);
    assert_int_equal(b.ids.v[want.n], tokenizer_eos_id(tk));
    for (size_t i = 0; i < b.ids.n; i++) assert_int_equal(b.mask[i], 1);

    spec_ok(&s, tk, JOB_DATA_ALPACA, TPL_NONE, 4096, true);
    assert_int_equal(sample_of(&s, &b, "{\"instruction\":\"Add 2 and 3.\",\"output\":\" 5\"}", &err), SAMPLE_OK);
    const char *prompt = "Below is an instruction that describes a task. Write a response that "
                         "appropriately completes the request.\n\n### Instruction:\nAdd 2 and 3.\n\n### Response:";
    want.n = 0;
    assert_int_equal(tokenizer_encode(tk, st, prompt, strlen(prompt), TK_ADD_SPECIAL, &want, &err), 0);
    for (size_t i = 0; i < b.ids.n; i++) assert_int_equal(b.mask[i], i >= want.n);
    assert_int_equal(b.ids.v[b.ids.n - 1], tokenizer_eos_id(tk));
    assert_int_equal(sample_spec_init(&s, tk, JOB_DATA_ALPACA, TPL_LLAMA3, 64, true, &err), -1);
    assert_non_null(strstr(err.msg, "data.template"));
    tk_ids_free(&want);
    tk_state_free(st);
    sample_buf_free(&b);
    tokenizer_free(tk);
}

static void test_py_strip(void **state) {
    (void)state;
    const char *s = "\xc2\xa0 \t x y\n\xe3\x80\x80"; /* NBSP, space, tab ... IDEOGRAPHIC SPACE */
    text_field t = py_strip(s, strlen(s));
    assert_int_equal(t.len, 3);
    assert_memory_equal(t.s, "x y", 3);
    t = py_strip(" \n ", 3);
    assert_int_equal(t.len, 0);
}

static const char *write_file(const char *name, const char *text) {
    static char path[700];
    snprintf(path, sizeof path, "%s/%s", tmpdir, name);
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fputs(text, f);
    fclose(f);
    return path;
}

/* skip: bad records are counted and the first logged with their line numbers; fail: the
 * first bad line stops the build, named with its reason. */
static void test_bad_records(void **state) {
    (void)state;
    const char *data = write_file("bad.jsonl",
        "{\"messages\":[{\"role\":\"user\",\"content\":\"hi\"},{\"role\":\"assistant\",\"content\":\"yo\"}]}\n"
        "not json\n"
        "\n"
        "{\"messages\":[{\"role\":\"bot\",\"content\":\"x\"}]}\n"
        "{\"messages\":[{\"role\":\"user\",\"content\":\"only a question\"}]}\n"
        "{\"conversations\":[{\"from\":\"human\",\"value\":\"hi\"},{\"from\":\"gpt\",\"value\":\"ok\"}]}\n");
    char log_path[700];
    snprintf(log_path, sizeof log_path, "%s/skips.log", tmpdir);
    FILE *log = fopen(log_path, "w+");
    cache_build_opts o = {.tokenizer = model_dir("sp32k", 0), .data = data, .format = JOB_DATA_CHAT,
                          .tpl = TPL_LLAMA2, .seq_len = 64, .truncate = true, .threads = 2,
                          .on_bad_record = JOB_BAD_RECORD_SKIP, .log = log};
    tok_writer w;
    cache_build_stats st;
    errbuf err = {{0}};
    if (cache_build(&o, &w, &st, &err)) fail_msg("%s", err.msg);
    assert_int_equal(st.samples, 2);
    assert_int_equal(st.skipped, 3);
    assert_int_equal(w.n_records, 2);
    assert_int_equal(w.source.format, TOK_FORMAT_CHAT);
    assert_int_equal(w.source.template_id, TPL_LLAMA2);
    tok_writer_free(&w);
    char text[4096] = "";
    rewind(log);
    size_t n = fread(text, 1, sizeof text - 1, log);
    text[n] = 0;
    fclose(log);
    assert_non_null(strstr(text, "bad.jsonl:2: skipped: not JSON"));
    assert_non_null(strstr(text, "bad.jsonl:4: skipped: messages[0].role: \"bot\" is not one of"));
    assert_non_null(strstr(text, "bad.jsonl:5: skipped: \"messages\" has no assistant turn"));

    o.on_bad_record = JOB_BAD_RECORD_FAIL;
    o.log = NULL;
    assert_int_equal(cache_build(&o, &w, &st, &err), -1);
    assert_non_null(strstr(err.msg, "bad.jsonl:2: not JSON"));
    tok_writer_free(&w);

    o.data = write_file("empty.jsonl", "\n\n");
    assert_int_equal(cache_build(&o, &w, &st, &err), -1);
    assert_non_null(strstr(err.msg, "no records"));
    tok_writer_free(&w);
}

/* A line above max_record_bytes is a bad record, refused unread: named by its line under
 * fail, skipped and counted under skip; a line of exactly the bound is read. */
static void test_record_bound(void **state) {
    (void)state;
    const char *good = "{\"text\":\"short\"}\n";
    char big[300];
    int n = snprintf(big, sizeof big, "{\"text\":\"%0200d\"}", 7);
    char text[1024];
    snprintf(text, sizeof text, "%s%s\n%s", good, big, good);
    cache_build_opts o = {.tokenizer = model_dir("sp32k", 0), .data = write_file("big.jsonl", text),
                          .format = JOB_DATA_TEXT, .seq_len = 64, .truncate = true, .threads = 1,
                          .max_record_bytes = (size_t)n - 1};
    tok_writer w;
    cache_build_stats st;
    errbuf err = {{0}};
    assert_int_equal(cache_build(&o, &w, &st, &err), -1);
    assert_non_null(strstr(err.msg, "big.jsonl:2: a record of 211 bytes, above data.max_record_bytes = 210"));
    tok_writer_free(&w);
    o.on_bad_record = JOB_BAD_RECORD_SKIP;
    if (cache_build(&o, &w, &st, &err)) fail_msg("%s", err.msg);
    assert_int_equal(st.skipped, 1);
    assert_int_equal(st.samples, 2);
    tok_writer_free(&w);
    o.max_record_bytes = (size_t)n;
    if (cache_build(&o, &w, &st, &err)) fail_msg("%s", err.msg);
    assert_int_equal(st.skipped, 0);
    assert_int_equal(st.samples, 3);
    tok_writer_free(&w);
}

/* A tokenizer_config.json that is not JSON (or not an object) is said to be so, naming it,
 * when the tokenizer loads and when data.template auto reads its chat_template. */
static void test_config_not_json(void **state) {
    (void)state;
    char dir[700], src[4096], real[4096], path[800];
    snprintf(dir, sizeof dir, "%s/badcfg", tmpdir);
    assert_int_equal(mkdir(dir, 0755), 0);
    fixture_path(src, sizeof src, "tokenizers/sp32k-tokenizer.json");
    snprintf(path, sizeof path, "%s/tokenizer.json", dir);
    assert_non_null(realpath(src, real));
    assert_int_equal(symlink(real, path), 0);
    snprintf(path, sizeof path, "%s/tokenizer_config.json", dir);
    const char *bodies[] = {"{\"chat_template\": ", "[1, 2]"}, *said[] = {"not JSON", "not a JSON object"};
    for (int i = 0; i < 2; i++) {
        FILE *f = fopen(path, "w");
        assert_non_null(f);
        fputs(bodies[i], f);
        fclose(f);
        char want[900];
        snprintf(want, sizeof want, "%s: %s", path, said[i]);
        errbuf err = {{0}};
        assert_null(tokenizer_load(dir, &err));
        if (!strstr(err.msg, want)) fail_msg("\"%s\" lacks \"%s\"", err.msg, want);
        chat_template t;
        assert_int_equal(resolve_template("auto", JOB_DATA_CHAT, dir, &t, &err), -1);
        if (!strstr(err.msg, want)) fail_msg("\"%s\" lacks \"%s\"", err.msg, want);
    }
}

static int setup(void **state) {
    (void)state;
    return mkdtemp(tmpdir) ? 0 : -1;
}

static int teardown(void **state) {
    (void)state;
    char cmd[600];
    snprintf(cmd, sizeof cmd, "rm -rf %s", tmpdir);
    return system(cmd) == 0 ? 0 : -1;
}

/* Each template's Jinja (what fsdpd writes into its outputs) is recognised as that template, so
 * data.template auto and fsdpctl generate --chat read an output's template back; TPL_NONE has
 * none, nor have Qwen's and Mistral's (an output keeps its base's own, daemon/model_card.c).
 * (test_output_card.sh renders them with transformers.) */
static void test_jinja_recognised(void **state) {
    (void)state;
    const chat_template own[] = {TPL_LLAMA3, TPL_LLAMA2, TPL_CHATML, TPL_ALPACA};
    for (size_t i = 0; i < sizeof own / sizeof own[0]; i++) {
        const char *j = chat_template_jinja(own[i]);
        assert_non_null(j);
        assert_int_equal(chat_template_recognise(j), own[i]);
    }
    for (int t = TPL_QWEN25; t < TPL_COUNT; t++) assert_null(chat_template_jinja((chat_template)t));
    assert_null(chat_template_jinja(TPL_NONE));
}

static void pref_parses(const char *line, const char *prompt, const char *chosen, const char *rejected) {
    data_record r = {0};
    errbuf err = {{0}};
    if (record_parse(&r, JOB_DATA_PREFERENCE, NULL, line, strlen(line), &err)) fail_msg("%s: %s", line, err.msg);
    assert_false(r.pref_conversational);
    const text_field got[] = {r.prompt, r.chosen, r.rejected};
    const char *want[] = {prompt, chosen, rejected};
    for (int i = 0; i < 3; i++) {
        assert_int_equal(got[i].len, strlen(want[i]));
        assert_memory_equal(got[i].s, want[i], got[i].len);
    }
    record_free(&r);
}

static void pref_refused(const char *line, const char *needle) {
    data_record r = {0};
    errbuf err = {{0}};
    assert_int_equal(record_parse(&r, JOB_DATA_PREFERENCE, NULL, line, strlen(line), &err), -1);
    if (!strstr(err.msg, needle)) fail_msg("%s: '%s', not '%s'", line, err.msg, needle);
    record_free(&r);
}

/* F49: preference records.  The implicit prompt as TRL's extract_prompt takes it (the first
 * differing character, one less after a space; of UTF-8, whole code points), three
 * conversations of a conversational record, and a cache of pairs: two records a pair, the
 * prompt without loss, TRL's EOS text on string sides, keep_end keeping the ends. */
static void test_preference(void **state) {
    (void)state;
    pref_parses("{\"prompt\": \"Q\", \"chosen\": \" a\", \"rejected\": \"b\", \"x\": 1}", "Q", " a", "b");
    pref_parses("{\"chosen\": \"Hi there yes\", \"rejected\": \"Hi there no\"}", "Hi there", " yes", " no");
    job_data_format guessed;
    char why[96];
    errbuf gerr = {{0}};
    const char *implicit = "{\"chosen\": \"Q a\", \"rejected\": \"Q b\"}";
    assert_int_equal(record_guess_format(implicit, strlen(implicit), "text", &guessed, why, sizeof why, &gerr), 0);
    assert_int_equal(guessed, JOB_DATA_PREFERENCE);
    pref_parses("{\"chosen\": \"Hi yes\", \"rejected\": \"Hi yo\"}", "Hi y", "es", "o");
    pref_parses("{\"chosen\": \"x\u00e9\", \"rejected\": \"x\u00e8\"}", "x", "\u00e9", "\u00e8");
    pref_refused("{\"chosen\": \"\u00e9\", \"rejected\": \"\u00e8\"}", "differ from their first character");
    pref_refused("{\"chosen\": \"ab\", \"rejected\": \"abc\"}", "do not differ");
    pref_refused("{\"prompt\": \"Q\", \"chosen\": \"a\", \"rejected\": \"b\", \"tools\": []}", "\"tools\": preference records with it are not built yet");
    pref_parses("{\"prompt\": \"Q\", \"chosen\": \"a\", \"rejected\": \"b\", \"tools\": null}", "Q", "a", "b");
    pref_refused("{\"prompt\": null, \"chosen\": \"a\", \"rejected\": \"b\"}", "\"prompt\" is neither a string nor a list");
    pref_refused("{\"prompt\": [], \"chosen\": [], \"rejected\": []}", "\"prompt\" is an empty list");
    pref_refused("{\"prompt\": [{\"role\": \"tool\", \"content\": \"x\"}], \"chosen\": [{\"role\": \"assistant\", \"content\": \"a\"}], "
                 "\"rejected\": [{\"role\": \"assistant\", \"content\": \"b\"}]}", "prompt[0].role: \"tool\" is not one of");

    const char *u = "{\"role\": \"user\", \"content\": \"Q\"}", *a = "{\"role\": \"assistant\", \"content\": \"A\"}";
    char line[1024];
    snprintf(line, sizeof line, "{\"chosen\": [%s, %s, %s, {\"role\": \"assistant\", \"content\": \"yes\"}], "
             "\"rejected\": [%s, %s, %s, {\"role\": \"assistant\", \"content\": \"no\"}, %s]}", u, a, u, u, a, u, u);
    data_record r = {0};
    errbuf err = {{0}};
    if (record_parse(&r, JOB_DATA_PREFERENCE, NULL, line, strlen(line), &err)) fail_msg("%s", err.msg);
    assert_true(r.pref_conversational);
    assert_int_equal(r.conv[PREF_CHOSEN].n, 4);   /* Q A Q + yes */
    assert_int_equal(r.conv[PREF_REJECTED].n, 5); /* Q A Q + no Q */
    assert_int_equal(r.conv[PREF_PROMPT].n, 4);   /* Q A Q + the empty assistant turn */
    const chat_msg *g = r.msgs + r.conv[PREF_PROMPT].start;
    assert_true(g[2].role == ROLE_USER && g[3].role == ROLE_ASSISTANT && g[3].len == 0);
    assert_memory_equal(r.msgs[r.conv[PREF_REJECTED].start + 3].text, "no", 2);
    record_free(&r);

    const char *data = write_file("pref.jsonl",
        "{\"prompt\": \"The sky is\", \"chosen\": \" blue\", \"rejected\": \" green</s>\"}\n"
        "{\"prompt\": [{\"role\": \"user\", \"content\": \"hi\"}], \"chosen\": [], \"rejected\": \"x\"}\n"
        "{\"prompt\": \"A long prompt of many words\", \"chosen\": \" yes\", \"rejected\": \" no\"}\n");
    cache_build_opts o = {.tokenizer = model_dir("sp32k", 0), .data = data, .format = JOB_DATA_PREFERENCE,
                          .seq_len = 64, .truncate = true, .threads = 2, .on_bad_record = JOB_BAD_RECORD_SKIP};
    tok_writer w;
    cache_build_stats st;
    if (cache_build(&o, &w, &st, &err)) fail_msg("%s", err.msg);
    assert_int_equal(st.samples, 2); /* pairs */
    assert_int_equal(st.skipped, 1);
    assert_int_equal(w.n_records, 4);
    assert_int_equal(w.source.format, TOK_FORMAT_PREFERENCE);
    assert_int_equal(w.source.template_id, TPL_NONE);
    for (uint64_t k = 0; k < 4; k++) { /* BOS and the prompt without loss, the side with it, EOS last */
        const int32_t *ids = w.tokens + w.offsets[k];
        const uint8_t *m = w.mask + w.offsets[k];
        size_t n = w.offsets[k + 1] - w.offsets[k];
        assert_true(ids[0] == 1 && !m[0] && !m[1] && ids[n - 1] == 2 && m[n - 1]);
        assert_memory_equal(ids, w.tokens + w.offsets[k ^ 1], 2);
    }
    size_t eos = 0; /* " green</s>" keeps its EOS: one, not two */
    for (uint64_t i = w.offsets[1]; i < w.offsets[2]; i++) eos += w.tokens[i] == 2;
    assert_int_equal(eos, 1);
    tok_writer_free(&w);
    o.seq_len = 4, o.truncation_mode = JOB_TRUNC_KEEP_END; /* the last 4 tokens: the prompt's end, the side */
    if (cache_build(&o, &w, &st, &err)) fail_msg("%s", err.msg);
    assert_int_equal(st.truncated, 2);
    assert_int_equal(w.offsets[4] - w.offsets[2], 8);
    assert_true(w.tokens[w.offsets[3] - 1] == 2 && w.mask[w.offsets[3] - 1] && !w.mask[w.offsets[2]]);
    tok_writer_free(&w);
    o.truncation_mode = JOB_TRUNC_KEEP_START; /* the prompts fill 4 tokens: dropped, as TRL's filter */
    assert_int_equal(cache_build(&o, &w, &st, &err), -1);
    assert_non_null(strstr(err.msg, "2 with no loss token dropped"));
    tok_writer_free(&w);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_golden_llama3),
        cmocka_unit_test(test_golden_llama2),
        cmocka_unit_test(test_special_text_is_plain),
        cmocka_unit_test(test_template_auto),
        cmocka_unit_test(test_truncate_and_drop),
        cmocka_unit_test(test_text_and_alpaca),
        cmocka_unit_test(test_py_strip),
        cmocka_unit_test(test_bad_records),
        cmocka_unit_test(test_record_bound),
        cmocka_unit_test(test_config_not_json),
        cmocka_unit_test(test_jinja_recognised),
        cmocka_unit_test(test_preference),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
