/* data_prepare: the job's data, ready for the workers, before the first run.
 *
 * A JSONL data.path (by its content, whatever its name; data.format alpaca, chat or text) is tokenized into a token cache
 * (data/cache_build.h) in checkpoint.dir, named after a hash of everything that makes it
 * (the data file's and tokenizer.json's contents, format, template, seq_len, truncate,
 * on_bad_record), written atomically (tmp + rename, so nodes building it at once cannot
 * corrupt it) and reused when present; data.path then names the cache.  The tokenizer is
 * model.path's tokenizer.json, or with model.init random the one next to model.config;
 * data.template auto reads that directory's tokenizer_config.json.
 *
 * A token cache made from a tokenizer must match the model's tokenizer.json (its sha256),
 * where the model has one, else the job is refused.
 *
 * *id gets what identifies the data for the checkpoints' manifests (proto/ckpt.h): a JSONL
 * file's sha256, or a token cache's header's (it carries the cache's counts and the CRC32C of
 * all its bytes, so reading 128 bytes identifies a file of any size), and the sha256 of the
 * model's tokenizer.json ("" when there is none). */
#ifndef FSDP_DAEMON_DATA_PREPARE_H
#define FSDP_DAEMON_DATA_PREPARE_H

#include "base/errbuf.h"
#include "proto/ckpt.h"
#include "proto/job.h"

/* data.path against data.format, decided by the file's content (proto/tokens.h tok_probe),
 * never its name: a token cache needs data.format tokens (its format, template, truncation
 * and bad-record handling were fixed when it was made), JSONL needs alpaca, chat or text; a
 * JSON array, an empty file or anything else is refused.  Messages name the format found.
 * data_prepare runs it first; fsdpctl plan runs it too. */
int data_check(const job_config *j, errbuf *err);
int data_prepare(job_config *j, ckpt_data_identity *id, errbuf *err);
/* The directory of the tokenizer a JSONL data.path is tokenized with: model.path, or with
 * model.init random model.config's directory; "" when it has no tokenizer.json. */
void data_tokenizer_dir(const job_config *j, char *out, size_t n);

#endif
