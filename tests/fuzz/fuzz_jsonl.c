/* Fuzzes the JSONL reader: the input's lines as records of each format, and every chat
 * record rendered by each template (control tokens given made-up ids), then checked: the
 * segments stay inside the record's strings or the templates' own text.  Each line also as a
 * generation prompt (record_parse_prompt: an empty assistant turn last; rendered too), and as
 * a preference record (F49): its three conversations inside the message list, sharing the
 * prompt, the last an empty assistant turn, each rendered; a string record's fields inside
 * the line's strings, an implicit prompt the start of chosen. */
#include <jansson.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "data/chat_template.h"
#include "data/jsonl.h"

static const tpl_tokens fake_tokens = {.bos = 1, .eos = 2, .start_header = 3, .end_header = 4,
                                       .eot = 5, .im_start = 6, .im_end = 7, .inst = 8,
                                       .inst_end = 9};

static void render_all(const chat_msg *m, size_t n, tpl_segs *segs) {
    errbuf err;
    for (int t = TPL_LLAMA3; t < TPL_COUNT; t++) {
        if (chat_render((chat_template)t, &fake_tokens, m, n, segs, &err)) continue;
        for (size_t i = 0; i < segs->n; i++)
            if (segs->v[i].id < 0 && (!segs->v[i].s || !segs->v[i].len)) abort();
    }
}

static bool same_text(const chat_msg *a, const chat_msg *b) {
    return a->role == b->role && a->len == b->len && !memcmp(a->text, b->text, a->len);
}

static void check_preference(const data_record *r, bool explicit_prompt, tpl_segs *segs) {
    if (!r->pref_conversational) {
        if (!r->prompt.s || !r->chosen.s || !r->rejected.s) abort();
        if (!explicit_prompt && r->prompt.s + r->prompt.len != r->chosen.s) abort();
        return;
    }
    size_t np = r->conv[PREF_PROMPT].n - 1;
    const chat_msg *p = r->msgs + r->conv[PREF_PROMPT].start;
    if (r->conv[PREF_PROMPT].start + np + 1 != r->n_msgs || p[np].role != ROLE_ASSISTANT || p[np].len ||
        !np || p[np - 1].role != ROLE_USER)
        abort();
    for (int k = PREF_CHOSEN; k <= PREF_REJECTED; k++) {
        const chat_msg *m = r->msgs + r->conv[k].start;
        if (r->conv[k].n <= np || m[np].role != ROLE_ASSISTANT) abort();
        for (size_t i = 0; i < np; i++)
            if (!same_text(&m[i], &p[i])) abort();
        render_all(m, r->conv[k].n, segs);
    }
    render_all(p, np + 1, segs);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    static const job_data_format formats[] = {JOB_DATA_ALPACA, JOB_DATA_CHAT, JOB_DATA_TEXT, JOB_DATA_PREFERENCE};
    jsonl_cursor c;
    const char *line;
    size_t len;
    data_record r = {0};
    tpl_segs segs = {0};
    errbuf err;
    jsonl_cursor_init(&c, (const char *)data, size);
    while (jsonl_next(&c, &line, &len)) {
        if (c.line_no < 1 || line < (const char *)data || line + len > (const char *)data + size) abort();
        for (size_t f = 0; f < sizeof formats / sizeof formats[0]; f++) {
            if (record_parse(&r, formats[f], "text", line, len, &err)) continue;
            if (formats[f] == JOB_DATA_CHAT) render_all(r.msgs, r.n_msgs, &segs);
            if (formats[f] != JOB_DATA_PREFERENCE) continue;
            bool conversational; /* what cache_build decides a file's kind by */
            if (!record_pref_kind(line, len, &conversational) || conversational != r.pref_conversational) abort();
            check_preference(&r, json_object_get(r.root, "prompt") != NULL, &segs);
        }
        job_data_format guessed;
        char why[96];
        if (record_guess_format(line, len, "content", &guessed, why, sizeof why, &err) == 0 &&
            guessed != JOB_DATA_CHAT && guessed != JOB_DATA_ALPACA && guessed != JOB_DATA_TEXT &&
            guessed != JOB_DATA_PREFERENCE)
            abort();
        text_field reply;
        if (record_parse_prompt(&r, line, len, &reply, &err) == 0) {
            if (r.msgs[r.n_msgs - 1].role != ROLE_ASSISTANT || r.msgs[r.n_msgs - 1].len) abort();
            render_all(r.msgs, r.n_msgs, &segs);
        }
    }
    record_free(&r);
    tpl_segs_free(&segs);
    return 0;
}
