/* jsonl: a user's JSONL data file, line by line, each line read as a record of its format.
 *
 *   alpaca  {"instruction": S, "input": S (optional, may be ""), "output": S}
 *   chat    {"messages": [{"role": "system"|"user"|"assistant", "content": S}, ...]} or
 *           ShareGPT's {"conversations": [{"from": "system"|"human"|"user"|"gpt"|"assistant",
 *           "value": S}, ...]}; at least one assistant turn
 *   text    {"text": S} (or another field: data.text_field)
 *   preference  {"prompt": P, "chosen": C, "rejected": R}, each a string or (TRL's
 *           conversational preference format) a list of {"role", "content"} messages, all three
 *           of one kind; a list prompt ends with a user turn, chosen and rejected start with an
 *           assistant turn.  Without "prompt" (TRL's implicit prompt), the prompt is what chosen
 *           and rejected share, as TRL's extract_prompt takes it: their common first messages,
 *           or of strings their common first characters less a last space; refused when they
 *           share nothing or one is the other's start.  A record with "tools",
 *           "chat_template_kwargs", "images" or "image" (not null) is refused: not built yet.
 *
 * Other fields are ignored.  Strings are UTF-8 without NUL characters.  A record's strings
 * point into its parsed JSON, valid until record_clear or the next record_parse. */
#ifndef FSDP_DATA_JSONL_H
#define FSDP_DATA_JSONL_H

#include <stdbool.h>
#include <stddef.h>

#include "base/errbuf.h"
#include "proto/job.h"

/* The lines of a buffer: blank (whitespace-only) lines are passed over, but counted. */
typedef struct jsonl_cursor {
    const char *p, *end;
    long line_no; /* of the line last returned, 1-based */
} jsonl_cursor;

void jsonl_cursor_init(jsonl_cursor *c, const char *buf, size_t len);
/* The next non-blank line (without its newline): true, or false at the end. */
bool jsonl_next(jsonl_cursor *c, const char **line, size_t *len);

typedef enum chat_role { ROLE_SYSTEM, ROLE_USER, ROLE_ASSISTANT } chat_role;

typedef struct chat_msg {
    chat_role role;
    const char *text;
    size_t len;
} chat_msg;

typedef struct text_field {
    const char *s;
    size_t len;
} text_field;

typedef struct data_record {
    void *root; /* the parsed line (a json_t) */
    chat_msg *msgs; /* chat */
    size_t n_msgs, cap_msgs;
    text_field instruction, input, output; /* alpaca */
    text_field text;                       /* text */
    /* preference: pref_conversational false: prompt, chosen, rejected strings; true: three
     * conversations in msgs, conv[PREF_CHOSEN] prompt + chosen, conv[PREF_REJECTED] prompt +
     * rejected, conv[PREF_PROMPT] the prompt and an empty assistant turn (the generation
     * prompt: data/sample.h) */
    bool pref_conversational;
    text_field prompt, chosen, rejected;
    struct {
        size_t start, n;
    } conv[3];
} data_record;

enum { PREF_CHOSEN, PREF_REJECTED, PREF_PROMPT };

/* Reads one line as a record of format (alpaca, chat or text, whose string is the field
 * text_field); the reason in err when it is not one. */
int record_parse(data_record *r, job_data_format format, const char *text_field, const char *line,
                 size_t len, errbuf *err);
/* data.format auto: the format of the JSONL record `line` by its fields: "messages" or
 * "conversations": chat; "chosen" and "rejected": preference; "instruction" and "output":
 * alpaca; text_field: text.  *why says
 * which fields decided. */
int record_guess_format(const char *line, size_t len, const char *text_field, job_data_format *out,
                        char *why, size_t why_n, errbuf *err);
/* A chat line as a prompt to generate from (fsdpctl generate --chat, samples during
 * training): a conversation that ends with a user turn, or with the assistant's reply to it,
 * which is taken off (*reference: its text, else {NULL, 0}); an empty assistant turn is
 * appended for the template to render the reply's start.  No assistant turn is needed. */
int record_parse_prompt(data_record *r, const char *line, size_t len, text_field *reference,
                        errbuf *err);
/* data.format preference: whether line's chosen is a list of messages (*conversational) or
 * a string: 1, or 0 when the line does not say (not JSON, no chosen). */
int record_pref_kind(const char *line, size_t len, bool *conversational);
/* Forgets the record's JSON (its message list is kept for the next line). */
void record_clear(data_record *r);
void record_free(data_record *r);

#endif
