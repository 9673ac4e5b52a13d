/* Fuzzes the JSONL reader: the input's lines as records of each format, and every chat
 * record rendered by each template (control tokens given made-up ids), then checked: the
 * segments stay inside the record's strings or the templates' own text.  Each line also as a
 * generation prompt (record_parse_prompt: an empty assistant turn last; rendered too). */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "data/chat_template.h"
#include "data/jsonl.h"

static const tpl_tokens fake_tokens = {.bos = 1, .eos = 2, .start_header = 3, .end_header = 4,
                                       .eot = 5, .im_start = 6, .im_end = 7, .inst = 8,
                                       .inst_end = 9};

static void render_all(const data_record *r, tpl_segs *segs) {
    errbuf err;
    for (int t = TPL_LLAMA3; t < TPL_COUNT; t++) {
        if (chat_render((chat_template)t, &fake_tokens, r->msgs, r->n_msgs, segs, &err)) continue;
        for (size_t i = 0; i < segs->n; i++)
            if (segs->v[i].id < 0 && (!segs->v[i].s || !segs->v[i].len)) abort();
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    static const job_data_format formats[] = {JOB_DATA_ALPACA, JOB_DATA_CHAT, JOB_DATA_TEXT};
    jsonl_cursor c;
    const char *line;
    size_t len;
    data_record r = {0};
    tpl_segs segs = {0};
    errbuf err;
    jsonl_cursor_init(&c, (const char *)data, size);
    while (jsonl_next(&c, &line, &len)) {
        if (c.line_no < 1 || line < (const char *)data || line + len > (const char *)data + size) abort();
        for (size_t f = 0; f < sizeof formats / sizeof formats[0]; f++)
            if (record_parse(&r, formats[f], "text", line, len, &err) == 0 && formats[f] == JOB_DATA_CHAT)
                render_all(&r, &segs);
        job_data_format guessed;
        char why[96];
        if (record_guess_format(line, len, "content", &guessed, why, sizeof why, &err) == 0 &&
            guessed != JOB_DATA_CHAT && guessed != JOB_DATA_ALPACA && guessed != JOB_DATA_TEXT)
            abort();
        text_field reply;
        if (record_parse_prompt(&r, line, len, &reply, &err) == 0) {
            if (r.msgs[r.n_msgs - 1].role != ROLE_ASSISTANT || r.msgs[r.n_msgs - 1].len) abort();
            render_all(&r, &segs);
        }
    }
    record_free(&r);
    tpl_segs_free(&segs);
    return 0;
}
