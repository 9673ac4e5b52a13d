/* cache_build: a JSONL file tokenized into a token cache on every core; see cache_build.h. */
#include "data/cache_build.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "base/fileio.h"
#include "base/sha256.h"
#include "data/sample.h"
#include "data/tokenizer.h"

enum { CHUNK_LINES = 256, LOGGED_SKIPS = 5, MAX_THREADS = 256 };

typedef struct line_ref {
    size_t off, len;
    long no;
} line_ref;

typedef struct bad_line {
    long no;
    char msg[300];
} bad_line;

/* What one chunk of lines became. */
typedef struct chunk_out {
    tk_ids ids;
    uint8_t *mask;
    size_t mask_cap;
    uint64_t *lens; /* per sample */
    size_t n_samples;
    cache_build_stats stats;
    bad_line bad[LOGGED_SKIPS]; /* fail: bad[0] is the error */
    int n_bad;
    int failed; /* a bad record under fail, or an error that is no record's fault */
    errbuf err;
} chunk_out;

typedef struct build {
    const cache_build_opts *o;
    sample_spec spec;
    const char *text;
    size_t len;
    line_ref *lines;
    size_t n_lines, n_chunks;
    chunk_out *out;
    atomic_size_t next_chunk, lines_done;
    atomic_size_t first_failed; /* the lowest failed chunk (SIZE_MAX: none): later ones stop */
    atomic_int setup_failed;    /* a thread could not start; its error in setup_err */
    errbuf setup_err;
} build;

static int chunk_push(chunk_out *c, const sample_buf *b) {
    size_t need = c->ids.n + b->ids.n;
    if (need > c->mask_cap) {
        size_t cap = c->mask_cap ? c->mask_cap : 4096;
        while (cap < need) cap *= 2;
        uint8_t *m = realloc(c->mask, cap);
        if (!m) return -1;
        c->mask = m;
        c->mask_cap = cap;
    }
    uint64_t *lens = realloc(c->lens, (c->n_samples + 2) * sizeof *lens);
    if (!lens) return -1;
    c->lens = lens;
    if (b->split) c->lens[c->n_samples++] = b->split; /* a pair: two records, one sample */
    c->lens[c->n_samples++] = b->ids.n - b->split;
    memcpy(c->mask + c->ids.n, b->mask, b->ids.n);
    for (size_t i = 0; i < b->ids.n; i++) {
        if (tk_ids_push(&c->ids, b->ids.v[i])) return -1;
        c->stats.loss_tokens += b->mask[i];
    }
    c->stats.tokens += b->ids.n;
    c->stats.samples++;
    c->stats.truncated += b->truncated;
    return 0;
}

/* One line: a sample, a drop, or a bad record (logged; fatal under fail). */
static void do_line(build *B, sample_buf *buf, chunk_out *c, const line_ref *l) {
    errbuf err;
    size_t max = B->o->max_record_bytes ? B->o->max_record_bytes : (size_t)JOB_MAX_RECORD_BYTES;
    /* Parsing and tokenizing one huge line costs ~35x its size in memory: refused unread. */
    int rc = l->len > max ? errf(&err, "a record of %zu bytes, above data.max_record_bytes = %zu", l->len, max)
                          : sample_from_line(&B->spec, buf, B->text + l->off, l->len, &err);
    c->stats.lines++;
    if (rc == SAMPLE_DROPPED) {
        c->stats.dropped++;
        return;
    }
    if (rc == SAMPLE_OK) {
        if (chunk_push(c, buf)) c->failed = errf(&c->err, "out of memory");
        return;
    }
    c->stats.skipped++;
    if (c->n_bad < LOGGED_SKIPS) {
        c->bad[c->n_bad].no = l->no;
        snprintf(c->bad[c->n_bad].msg, sizeof c->bad[c->n_bad].msg, "%.299s", err.msg);
        c->n_bad++;
    }
    if (B->o->on_bad_record == JOB_BAD_RECORD_FAIL) {
        errf(&c->err, "%s:%ld: %s (data.on_bad_record: skip passes over bad records)", B->o->data,
             l->no, err.msg);
        c->failed = -1;
    }
}

static void note_failure(build *B, size_t k) {
    size_t cur = atomic_load(&B->first_failed);
    while (k < cur && !atomic_compare_exchange_weak(&B->first_failed, &cur, k)) {
    }
}

static void *worker(void *arg) {
    build *B = arg;
    sample_buf buf;
    errbuf err;
    if (sample_buf_init(&buf, B->spec.tk, &err)) {
        int none = 0;
        if (atomic_compare_exchange_strong(&B->setup_failed, &none, 1)) B->setup_err = err;
        note_failure(B, 0);
        return NULL;
    }
    for (;;) {
        size_t k = atomic_fetch_add(&B->next_chunk, 1);
        /* chunks before a failed one still run: the first bad line in file order is reported */
        if (k >= B->n_chunks || k > atomic_load(&B->first_failed)) break;
        chunk_out *c = &B->out[k];
        size_t end = (k + 1) * CHUNK_LINES < B->n_lines ? (k + 1) * CHUNK_LINES : B->n_lines;
        for (size_t i = k * CHUNK_LINES; i < end && !c->failed; i++) do_line(B, &buf, c, &B->lines[i]);
        atomic_fetch_add(&B->lines_done, end - k * CHUNK_LINES);
        if (c->failed) note_failure(B, k);
    }
    sample_buf_free(&buf);
    return NULL;
}

static int index_lines(build *B, size_t len, errbuf *err) {
    jsonl_cursor cur;
    const char *line;
    size_t n, cap = 0;
    jsonl_cursor_init(&cur, B->text, len);
    while (jsonl_next(&cur, &line, &n)) {
        if (B->n_lines == cap) {
            cap = cap ? 2 * cap : 4096;
            line_ref *l = realloc(B->lines, cap * sizeof *l);
            if (!l) return errf(err, "%s: out of memory indexing lines", B->o->data);
            B->lines = l;
        }
        B->lines[B->n_lines++] = (line_ref){(size_t)(line - B->text), n, cur.line_no};
    }
    if (!B->n_lines) return errf(err, "%s: no records (the file is empty)", B->o->data);
    return 0;
}

static void draw_progress(size_t done, size_t total) {
    int width = 40, fill = total ? (int)(done * (size_t)width / total) : width;
    fprintf(stderr, "\rtokenizing [%.*s%*s] %3d%% %zu/%zu records", fill,
            "########################################", width - fill, "",
            total ? (int)(done * 100 / total) : 100, done, total);
    fflush(stderr);
}

static int run_threads(build *B, errbuf *err) {
    int n = B->o->threads > 0 ? B->o->threads : (int)sysconf(_SC_NPROCESSORS_ONLN);
    if (n < 1) n = 1;
    if (n > MAX_THREADS) n = MAX_THREADS;
    if ((size_t)n > B->n_chunks) n = (int)B->n_chunks;
    pthread_t tids[MAX_THREADS];
    int started = 0;
    for (; started < n; started++)
        if (pthread_create(&tids[started], NULL, worker, B)) break;
    if (!started) return errf(err, "cannot start a tokenizer thread");
    while (B->o->progress && atomic_load(&B->lines_done) < B->n_lines &&
           atomic_load(&B->first_failed) == SIZE_MAX) {
        draw_progress(atomic_load(&B->lines_done), B->n_lines);
        nanosleep(&(struct timespec){0, 100000000}, NULL);
    }
    for (int i = 0; i < started; i++) pthread_join(tids[i], NULL);
    if (atomic_load(&B->setup_failed)) {
        *err = B->setup_err;
        return -1;
    }
    if (B->o->progress) {
        draw_progress(atomic_load(&B->lines_done), B->n_lines);
        fputc('\n', stderr);
    }
    return 0;
}

static void add_stats(cache_build_stats *a, const cache_build_stats *b) {
    a->lines += b->lines;
    a->samples += b->samples;
    a->skipped += b->skipped;
    a->dropped += b->dropped;
    a->truncated += b->truncated;
    a->tokens += b->tokens;
    a->loss_tokens += b->loss_tokens;
}

/* The chunks in file order into the writer; the first failure in file order is the error. */
static int join_chunks(build *B, tok_writer *w, cache_build_stats *stats, errbuf *err) {
    int logged = 0;
    for (size_t k = 0; k < B->n_chunks; k++) {
        chunk_out *c = &B->out[k];
        if (c->failed) {
            *err = c->err;
            return -1;
        }
        add_stats(stats, &c->stats);
        for (int i = 0; i < c->n_bad && B->o->log && logged < LOGGED_SKIPS; i++, logged++)
            fprintf(B->o->log, "%s:%ld: skipped: %s\n", B->o->data, c->bad[i].no, c->bad[i].msg);
        uint64_t at = 0;
        for (size_t s = 0; s < c->n_samples; at += c->lens[s], s++)
            if (tok_writer_add(w, c->ids.v + at, c->mask + at, c->lens[s], err)) return -1;
    }
    if (B->o->log && stats->skipped > (uint64_t)logged)
        fprintf(B->o->log, "%s: %llu more records skipped\n", B->o->data,
                (unsigned long long)(stats->skipped - (uint64_t)logged));
    return 0;
}

static void free_build(build *B) {
    for (size_t k = 0; B->out && k < B->n_chunks; k++) {
        tk_ids_free(&B->out[k].ids);
        free(B->out[k].mask);
        free(B->out[k].lens);
    }
    free(B->out);
    free(B->lines);
}

static int build_from_text(build *B, tok_writer *w, cache_build_stats *stats, size_t len, errbuf *err) {
    if (index_lines(B, len, err)) return -1;
    B->n_chunks = (B->n_lines + CHUNK_LINES - 1) / CHUNK_LINES;
    if (!(B->out = calloc(B->n_chunks, sizeof *B->out))) return errf(err, "out of memory");
    if (run_threads(B, err) || join_chunks(B, w, stats, err)) return -1;
    if (!stats->samples)
        return errf(err, "%s: no samples (%llu records skipped, %llu with no loss token dropped)",
                    B->o->data, (unsigned long long)stats->skipped, (unsigned long long)stats->dropped);
    return 0;
}

static uint32_t format_code(job_data_format f) {
    return f == JOB_DATA_ALPACA ? TOK_FORMAT_ALPACA : f == JOB_DATA_CHAT ? TOK_FORMAT_CHAT
         : f == JOB_DATA_PREFERENCE ? TOK_FORMAT_PREFERENCE : TOK_FORMAT_TEXT;
}

/* Preference: the first record that says decides the kind; conversational records need a
 * template, string records use none (TRL tokenizes them as they are). */
static int pref_kind(const build *B, chat_template *tpl, bool *conv, errbuf *err) {
    jsonl_cursor cur;
    const char *line;
    size_t n;
    *conv = false;
    jsonl_cursor_init(&cur, B->text, B->len);
    while (jsonl_next(&cur, &line, &n) && !record_pref_kind(line, n, conv)) {
    }
    if (*conv && *tpl == TPL_NONE)
        return errf(err, "%s: conversational preference records need a chat template: set data.template "
                         "(one of " CHAT_TEMPLATE_NAMES "; auto found none)", B->o->data);
    if (!*conv) *tpl = TPL_NONE;
    return 0;
}

int cache_build(const cache_build_opts *o, tok_writer *w, cache_build_stats *stats, errbuf *err) {
    memset(stats, 0, sizeof *stats);
    build B = {.o = o, .first_failed = SIZE_MAX};
    tokenizer *tk = tokenizer_load(o->tokenizer, err);
    if (!tk) return -1;
    tok_writer_init(w, (uint32_t)tokenizer_vocab_size(tk));
    w->source.format = format_code(o->format);
    void *map = NULL;
    size_t len = 0;
    chat_template tpl = o->tpl;
    int rc = tokenizer_file_sha256(o->tokenizer, w->source.tokenizer_sha256, err) ||
             file_map_readonly(o->data, &map, &len, err);
    B.text = map;
    B.len = len;
    bool conv = false;
    if (rc == 0 && o->format == JOB_DATA_PREFERENCE) rc = pref_kind(&B, &tpl, &conv, err);
    if (rc == 0) rc = sample_spec_init(&B.spec, tk, o->format, tpl, o->seq_len, o->truncate, err);
    B.spec.pref_conversational = conv;
    B.spec.truncation_mode = o->truncation_mode;
    w->source.template_id = o->format == JOB_DATA_ALPACA ? TPL_ALPACA : (uint32_t)tpl;
    if (o->text_field) B.spec.text_field = o->text_field;
    if (rc == 0) rc = build_from_text(&B, w, stats, len, err);
    if (map && len) munmap(map, len);
    free_build(&B);
    tokenizer_free(tk);
    return rc ? -1 : 0;
}

static int tokenizer_json_path(const char *path, char *out, size_t n, errbuf *err) {
    struct stat st;
    bool dir = stat(path, &st) == 0 && S_ISDIR(st.st_mode);
    if (snprintf(out, n, dir ? "%s/tokenizer.json" : "%s", path) >= (int)n)
        return errf(err, "%s: path too long", path);
    return 0;
}

int tokenizer_file_sha256(const char *path, uint8_t out[TOK_SHA256_BYTES], errbuf *err) {
    char file[4096];
    void *map;
    size_t len;
    if (tokenizer_json_path(path, file, sizeof file, err) || file_map_readonly(file, &map, &len, err))
        return -1;
    sha256(map, len, out);
    if (len) munmap(map, len);
    return 0;
}

int resolve_template(const char *name, job_data_format format, const char *tokenizer_path,
                     chat_template *t, errbuf *err) {
    if (chat_template_parse(name, t, err)) return -1;
    bool automatic = !name[0] || !strcmp(name, "auto");
    if (!automatic || (format != JOB_DATA_CHAT && format != JOB_DATA_PREFERENCE)) return 0;
    struct stat st;
    bool dir = stat(tokenizer_path, &st) == 0 && S_ISDIR(st.st_mode);
    errbuf ignored;
    if (format == JOB_DATA_PREFERENCE) /* cache_build refuses conversational records without one */
    {
        if (dir && chat_template_from_model(tokenizer_path, t, &ignored)) *t = TPL_NONE;
        return 0;
    }
    if (!dir)
        return errf(err, "data.template: auto needs a model directory's tokenizer_config.json (%s "
                         "is a file); set data.template to one of " CHAT_TEMPLATE_NAMES,
                    tokenizer_path);
    return chat_template_from_model(tokenizer_path, t, err);
}
