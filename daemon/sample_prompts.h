/* sample_prompts: train.sample_prompts, read and tokenized by fsdpd before any worker starts
 * (a missing or unreadable file, a line that is no prompt, a prompt longer than data.seq_len
 * stop the job there), sent to the workers in CONFIG (proto/msg.h msg_sample_prompts), and
 * their replies (SAMPLE, rank 0) turned back into text for the log and samples.jsonl.
 *
 * A line is a chat (messages or conversations: data/sample's sample_prompt_from_line renders
 * it as training renders a conversation with the job's data.template, up to the reply's
 * header; a trailing assistant turn is taken off) or a plain {"prompt": S} or {"text": S}
 * (the tokenizer's leading ids, BOS, then S).  The stop ids: the tokenizer's EOS and, where
 * the template resolves, its end of turn.  The tokenizer is data_prepare's
 * (data_tokenizer_dir). */
#ifndef FSDP_DAEMON_SAMPLE_PROMPTS_H
#define FSDP_DAEMON_SAMPLE_PROMPTS_H

#include <stddef.h>
#include <stdint.h>

#include "base/errbuf.h"
#include "data/tokenizer.h"
#include "proto/job.h"
#include "proto/msg.h"

typedef struct sample_prompts {
    msg_sample_prompts p; /* p.n 0: the job has none */
    tokenizer *tk;
} sample_prompts;

/* Reads j's train.sample_prompts (nothing when it is ""). */
int sample_prompts_load(sample_prompts *s, const job_config *j, errbuf *err);
void sample_prompts_free(sample_prompts *s);
/* ids[n] as text (special tokens kept), malloc'd. */
char *sample_prompts_text(const sample_prompts *s, const int32_t *ids, int n, errbuf *err);

#endif
