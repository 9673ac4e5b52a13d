/* model_card: what makes a consolidated output (daemon/consolidate.h) ready to use (F41), run
 * by fsdpd after the job's summary, in output.dir and, with output.merge, output.dir/merged:
 *
 *   tokenizer files: the model's as consolidate copied them; where there are none (model.init
 *     random), those beside model.config (the tokenizer the data was tokenized with);
 *   chat_template.jinja and tokenizer_config.json's chat_template: the Jinja of the template
 *     the job trained with (data/chat_template.h chat_template_jinja, which transformers'
 *     apply_chat_template renders into exactly the ids fsdpd trained on), the same string in
 *     both (transformers reads the .jinja first); nothing for text or token data;
 *   generation_config.json: its eos_token_id with the template's end of turn added
 *     (<|eot_id|>, <|im_end|>, EOS), a list;
 *   loss.svg: daemon/plot.h's plot of runtime.metrics (as `fsdpctl plot` draws it);
 *   README.md: a model card (YAML front matter: base_model, library_name transformers or peft,
 *     tags) with the base, the data (its file, records, tokens, format, template), the results
 *     (steps, tokens, final loss, final and best eval loss), the loss curve (loss.svg), how to
 *     load it, and every resolved setting of the job (section.key = value, as job.json).
 * Each file is written atomically. */
#ifndef FSDP_DAEMON_MODEL_CARD_H
#define FSDP_DAEMON_MODEL_CARD_H

#include <stdbool.h>

#include "base/errbuf.h"
#include "proto/job.h"
#include "proto/run_record.h"

#define MODEL_CARD_NAME "README.md"
#define MODEL_CARD_PLOT "loss.svg"

/* j: the resolved job after data_prepare (data.path names the token cache); data_file: the
 * data.path the job gave; r: run.json's record with its summary. */
int model_card_write(const job_config *j, const char *data_file, const run_record *r, errbuf *err);

/* chat_template.jinja and tokenizer_config.json's chat_template in dir (the latter where dir
 * has one) for template t (data/chat_template.h; TPL_NONE: nothing; a template fsdpd has no
 * Jinja of, Qwen's and Mistral's: the base's own when it renders t, else nothing, *written
 * false), and generation_config.json's
 * stop ids (where dir has one and a tokenizer.json): model_card_write's part that fsdpctl
 * init --template also runs. */
int model_card_template(const char *dir, int t, bool *written, errbuf *err);

#endif
