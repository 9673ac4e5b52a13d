/* data_prepare: a JSONL data.path tokenized once into checkpoint.dir's cache, before the first run; see data_prepare.h. */
#include "daemon/data_prepare.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/bytes.h"
#include "base/fileio.h"
#include "base/sha256.h"
#include "daemon/log.h"
#include "data/cache_build.h"
#include "data/jsonl.h"
#include "proto/tokens.h"


/* The directory whose tokenizer.json goes with the model ("" when there is none). */
void data_tokenizer_dir(const job_config *j, char *out, size_t n) {
    if (j->model.init == JOB_INIT_PRETRAINED) snprintf(out, n, "%s", j->model.path);
    else {
        const char *slash = strrchr(j->model.config, '/');
        if (slash) snprintf(out, n, "%.*s", (int)(slash - j->model.config), j->model.config);
        else snprintf(out, n, ".");
    }
    char file[JOB_PATH_MAX + 32];
    snprintf(file, sizeof file, "%s/tokenizer.json", out);
    if (access(file, R_OK) != 0) out[0] = 0;
}

static int file_sha256(const char *path, uint8_t out[SHA256_BYTES], errbuf *err) {
    void *map;
    size_t len;
    if (file_map_readonly(path, &map, &len, err)) return -1;
    sha256(map, len, out);
    if (len) munmap(map, len);
    return 0;
}

/* checkpoint.dir/data-<hash of the inputs>.tokens */
static int cache_name(const job_config *j, const cache_build_opts *o, const uint8_t data_hash[SHA256_BYTES],
                      char *out, size_t n, errbuf *err) {
    uint8_t tk_hash[SHA256_BYTES], key[SHA256_BYTES];
    if (tokenizer_file_sha256(o->tokenizer, tk_hash, err)) return -1;
    char params[192];
    int len = snprintf(params, sizeof params, "v%d f%d t%d L%d tr%d bad%d", TOK_VERSION, (int)o->format,
                       (int)o->tpl, o->seq_len, (int)o->truncate, (int)o->on_bad_record);
    if (o->max_record_bytes != (size_t)JOB_MAX_RECORD_BYTES) /* the default keeps earlier caches' names */
        len += snprintf(params + len, sizeof params - (size_t)len, " max%zu", o->max_record_bytes);
    if (o->format == JOB_DATA_TEXT && o->text_field && strcmp(o->text_field, "text"))
        len += snprintf(params + len, sizeof params - (size_t)len, " field %.40s", o->text_field);
    if (o->format == JOB_DATA_PREFERENCE && o->truncation_mode == JOB_TRUNC_KEEP_END)
        len += snprintf(params + len, sizeof params - (size_t)len, " keep_end");
    sha256_ctx c;
    sha256_init(&c);
    sha256_update(&c, data_hash, SHA256_BYTES);
    sha256_update(&c, tk_hash, sizeof tk_hash);
    sha256_update(&c, params, (size_t)len);
    sha256_final(&c, key);
    char hex[17];
    for (int i = 0; i < 8; i++) snprintf(hex + 2 * i, 3, "%02x", key[i]);
    if (snprintf(out, n, "%s/data-%s.tokens", j->checkpoint.dir, hex) >= (int)n)
        return errf(err, "checkpoint.dir: %s is too long", j->checkpoint.dir);
    return 0;
}

static int build_cache(const cache_build_opts *o, const char *path, errbuf *err) {
    tok_writer w;
    cache_build_stats st;
    log_event(-1, "tokenizing %s (format %s, template %s) into %s", o->data, job_data_format_name(o->format),
              chat_template_name(o->tpl), path);
    int rc = cache_build(o, &w, &st, err);
    /* Saved under a name of this host and process, then renamed: nodes sharing checkpoint.dir
     * may build the cache at once (file_write_atomic's own tmp name has only the pid). */
    char part[JOB_PATH_MAX + 300], host[256] = "host";
    gethostname(host, sizeof host - 1);
    snprintf(part, sizeof part, "%s.%s-%d.part", path, host, (int)getpid());
    if (rc == 0) rc = tok_writer_save(&w, part, err);
    if (rc == 0 && rename(part, path) != 0) {
        rc = errf(err, "%s: rename to %s: %s", part, path, strerror(errno));
        unlink(part);
    }
    tok_writer_free(&w);
    if (rc) return -1;
    log_event(-1, "%s: %llu samples (%llu tokens, %llu with loss) from %llu records; %llu skipped, "
                  "%llu dropped (no loss token), %llu truncated", path,
              (unsigned long long)st.samples, (unsigned long long)st.tokens,
              (unsigned long long)st.loss_tokens, (unsigned long long)st.lines,
              (unsigned long long)st.skipped, (unsigned long long)st.dropped,
              (unsigned long long)st.truncated);
    return 0;
}

static int prepare_jsonl(job_config *j, const char *tk_dir, ckpt_data_identity *id, errbuf *err) {
    if (!tk_dir[0])
        return errf(err, "data.path: %s is JSONL, which needs a tokenizer: model.path's tokenizer.json "
                         "(with model.init random: a tokenizer.json next to model.config); none found",
                    j->data.path);
    cache_build_opts o = {.tokenizer = tk_dir, .data = j->data.path, .format = j->data.format,
                          .text_field = j->data.text_field,
                          .seq_len = j->data.seq_len, .truncate = j->data.truncate,
                          .truncation_mode = j->data.truncation_mode,
                          .on_bad_record = j->data.on_bad_record,
                          .max_record_bytes = (size_t)j->data.max_record_bytes, .log = stderr,
                          .progress = isatty(2)};
    if (resolve_template(j->data.template_name, j->data.format, tk_dir, &o.tpl, err)) return -1;
    char path[JOB_PATH_MAX];
    uint8_t data_hash[SHA256_BYTES];
    if (file_sha256(j->data.path, data_hash, err) || file_mkdir_p(j->checkpoint.dir, err) ||
        cache_name(j, &o, data_hash, path, sizeof path, err))
        return -1;
    snprintf(id->source, sizeof id->source, "jsonl");
    hex_encode(data_hash, SHA256_BYTES, id->sha256);
    tok_cache c;
    errbuf ignored;
    if (tok_open(&c, path, &ignored) == 0) {
        tok_close(&c);
        log_event(-1, "reusing the token cache %s made from %s", path, j->data.path);
    } else if (build_cache(&o, path, err)) {
        return -1;
    }
    snprintf(j->data.path, sizeof j->data.path, "%s", path);
    return 0;
}

/* A cache made by a tokenizer must come from the model's (when the model names one; a cache
 * of token ids, tokens or pairs, has no tokenizer).  A file that is no cache is left to the
 * workers, whose data loader reports it. */
static int check_cache(const job_config *j, const char *tk_dir, errbuf *err) {
    tok_source src;
    errbuf ignored;
    if (tok_read_source(j->data.path, &src, &ignored) || src.format == TOK_FORMAT_TOKENS ||
        src.format == TOK_FORMAT_PAIRS || !tk_dir[0]) /* ids of no tokenizer */
        return 0;
    uint8_t h[SHA256_BYTES];
    if (tokenizer_file_sha256(tk_dir, h, err)) return -1;
    if (memcmp(h, src.tokenizer_sha256, SHA256_BYTES) != 0)
        return errf(err, "data.path: %s was tokenized with another tokenizer than %s/tokenizer.json "
                         "(its sha256 differs); tokenize the data again with the model's tokenizer",
                    j->data.path, tk_dir);
    return 0;
}

/* A token cache's identity: the sha256 of its header, which holds its counts and the CRC32C of
 * every byte after it.  A file that is no cache (missing, short) gets none: the workers' data
 * loader reports it, before any checkpoint is written. */
static void cache_identity(const char *path, ckpt_data_identity *id) {
    uint8_t header[TOK_HEADER_BYTES], h[SHA256_BYTES];
    errbuf ignored;
    snprintf(id->source, sizeof id->source, "tokens");
    int fd = file_open_regular(path, &ignored);
    if (fd < 0) return;
    int rc = file_pread_full(fd, header, sizeof header, 0, path, &ignored);
    close(fd);
    if (rc) return;
    sha256(header, sizeof header, h);
    hex_encode(h, SHA256_BYTES, id->sha256);
}

static const char *source_format_name(uint32_t format) {
    return format == TOK_FORMAT_TOKENS || format == TOK_FORMAT_PAIRS ? "token ids (no tokenizer)" : tok_format_name(format);
}

int data_check(const job_config *j, errbuf *err) {
    tok_file_kind kind;
    const char *format = job_data_format_name(j->data.format);
    if (tok_probe(j->data.path, &kind, err)) return errprefix(err, "data.path");
    if (kind == TOK_FILE_CACHE && j->data.format != JOB_DATA_TOKENS) {
        tok_source src;
        char made[96] = "";
        if (tok_read_source(j->data.path, &src, err) == 0)
            snprintf(made, sizeof made, ", made from %s data", source_format_name(src.format));
        return errf(err, "data.format: '%s' but data.path %s is a token cache (FSDPTOK1%s): its format, "
                         "template, truncation and bad-record handling were fixed when it was tokenized; "
                         "leave data.format at tokens", format, j->data.path, made);
    }
    if (kind == TOK_FILE_JSONL && j->data.format == JOB_DATA_TOKENS)
        return errf(err, "data.format: tokens, but data.path %s is JSONL (its first record starts with '{'), "
                         "not a token cache: set data.format to alpaca, chat, text or preference", j->data.path);
    if (kind == TOK_FILE_JSON_ARRAY)
        return errf(err, "data.path: %s is a JSON array; data.format %s reads %s: %s", j->data.path, format,
                    j->data.format == JOB_DATA_TOKENS ? "a token cache" : "JSONL, one JSON object a line",
                    "write one record a line (jq -c '.[]' FILE) and set data.format to alpaca, chat, text or preference");
    if (kind == TOK_FILE_EMPTY || kind == TOK_FILE_OTHER)
        return errf(err, "data.path: %s is %s (data.format %s wants %s)", j->data.path, tok_file_kind_name(kind),
                    format, j->data.format == JOB_DATA_TOKENS ? "a token cache, made by fsdpctl tokenize"
                                                              : "JSONL, one JSON object a line");
    return 0;
}

/* data.format auto: a token cache is tokens; a JSONL file's format is its first record's. */
static int resolve_format(job_config *j, errbuf *err) {
    tok_file_kind kind;
    if (j->data.format != JOB_DATA_AUTO) return 0;
    if (tok_probe(j->data.path, &kind, err)) return errprefix(err, "data.path");
    if (kind != TOK_FILE_JSONL) {
        j->data.format = JOB_DATA_TOKENS; /* a cache; anything else data_check names */
        return 0;
    }
    void *map = NULL;
    size_t len = 0;
    if (file_map_readonly(j->data.path, &map, &len, err)) return errprefix(err, "data.path");
    jsonl_cursor c;
    const char *line = NULL;
    size_t n = 0;
    jsonl_cursor_init(&c, map, len);
    char why[96] = "";
    int rc = jsonl_next(&c, &line, &n) ? record_guess_format(line, n, j->data.text_field, &j->data.format, why,
                                                             sizeof why, err)
                                       : errf(err, "no record");
    if (map && len) munmap(map, len);
    if (rc) return errprefix(err, "data.format auto: %s", j->data.path);
    log_event(-1, "data.format auto: %s (%s)", job_data_format_name(j->data.format), why);
    return 0;
}

int data_prepare(job_config *j, ckpt_data_identity *id, errbuf *err) {
    char tk_dir[JOB_PATH_MAX];
    uint8_t h[SHA256_BYTES];
    memset(id, 0, sizeof *id);
    data_tokenizer_dir(j, tk_dir, sizeof tk_dir);
    if (tk_dir[0]) {
        if (tokenizer_file_sha256(tk_dir, h, err)) return -1;
        hex_encode(h, SHA256_BYTES, id->tokenizer_sha256);
    }
    if (resolve_format(j, err) || data_check(j, err)) return -1;
    if (j->data.format != JOB_DATA_TOKENS) return prepare_jsonl(j, tk_dir, id, err);
    if (check_cache(j, tk_dir, err)) return -1;
    cache_identity(j->data.path, id);
    return 0;
}
