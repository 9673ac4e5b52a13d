/* sample: one JSONL record -> one training sample: token ids and a loss mask.
 *
 * The record is rendered (data/chat_template.h) into text and control-token segments.  The
 * text between two control tokens is encoded at once, as tokenizers encodes a whole rendered
 * string (TK_SPLIT_SPECIAL: text that looks like a special token stays plain text); where
 * the loss switches on or off inside it, the tokens before the switch are as many as the
 * text before it encodes to alone (exactly fsdp_qlora's prompt-length rule for alpaca, and
 * the tokens a character boundary falls between for the chat templates).
 *
 *   alpaca  the alpaca template (data/chat_template.h)
 *   chat    the job's template
 *   text    the post-processor's leading ids (BOS), the text, EOS; loss on every token
 *
 *   preference  a pair, as TRL 1.16.0's DPOTrainer makes one (data/README.md names the TRL
 *           function of each step): the prompt, prompt + chosen and prompt + rejected
 *           tokenized (strings: each with the post-processor's special tokens, chosen and
 *           rejected ending with the EOS token's text unless they do; conversational: the
 *           template's render, the prompt's with the generation prompt); the completion starts
 *           where the prompt's ids and each side's first differ (the smaller of the two); the
 *           loss on the completion; a side longer than seq_len keeps its first (keep_start) or
 *           last (keep_end) seq_len tokens.  keep_start drops a pair whose prompt alone fills
 *           seq_len (as TRL's filter); a pair with a side left without a loss token is dropped.
 *
 * A sample longer than seq_len is cut to seq_len (truncate) or refused; one with no loss
 * token left is dropped (SAMPLE_DROPPED). */
#ifndef FSDP_DATA_SAMPLE_H
#define FSDP_DATA_SAMPLE_H

#include <stdbool.h>
#include <stdint.h>

#include "data/chat_template.h"
#include "data/jsonl.h"
#include "data/tokenizer.h"
#include "proto/job.h"

enum { SAMPLE_OK = 0, SAMPLE_DROPPED = 1 };

typedef struct sample_spec {
    const tokenizer *tk;
    job_data_format format;
    chat_template tpl;
    tpl_tokens tok;
    int seq_len;
    bool truncate;
    const char *text_field; /* data.format text's field: "text" unless set after init */
    /* preference, set after init: the records are conversational (else strings; the other
     * kind is a bad record), and which end of a long side is kept */
    bool pref_conversational;
    job_truncation_mode truncation_mode;
} sample_spec;

/* Checks that format and template go together and that the tokenizer has their tokens. */
int sample_spec_init(sample_spec *s, const tokenizer *tk, job_data_format format,
                     chat_template tpl, int seq_len, bool truncate, errbuf *err);

/* One thread's working space. */
typedef struct sample_buf {
    tk_state *st;
    data_record rec;
    tpl_segs segs;
    char *run;
    size_t run_cap;
    tk_ids ids, scratch;
    uint8_t *mask;
    size_t mask_cap;
    bool truncated; /* the last sample was cut to seq_len */
    size_t split;   /* preference: ids[0, split) the chosen record, [split, n) the rejected */
    tk_ids three;   /* preference: the prompt's, prompt + chosen's and prompt + rejected's ids */
} sample_buf;

int sample_buf_init(sample_buf *b, const tokenizer *tk, errbuf *err);
void sample_buf_free(sample_buf *b);

/* line -> b->ids and b->mask: SAMPLE_OK, SAMPLE_DROPPED, or -1 with the reason (a bad
 * record). */
int sample_from_line(const sample_spec *s, sample_buf *b, const char *line, size_t len,
                     errbuf *err);

/* A chat line as a generation prompt (record_parse_prompt): b->ids are the tokens training
 * puts before the reply (the conversation and the reply's header, rendered and tokenized as
 * sample_from_line does, cut before the reply's first loss token); more than seq_len of them
 * is an error.  *reference: the reply the line had, if any. */
int sample_prompt_from_line(const sample_spec *s, sample_buf *b, const char *line, size_t len,
                            text_field *reference, errbuf *err);

#endif
