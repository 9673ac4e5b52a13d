/* sample_prompts: the prompts of samples during training (see sample_prompts.h). */
#include "daemon/sample_prompts.h"

#include <stdlib.h>
#include <string.h>

#include "base/fileio.h"
#include "daemon/data_prepare.h"
#include "daemon/log.h"
#include "data/cache_build.h"
#include "data/jsonl.h"
#include "data/sample.h"

#define PROMPTS_FILE_MAX (64u << 20)

/* What reading the lines needs: the tokenizer, a chat spec once a chat line comes. */
typedef struct reader {
    const job_config *j;
    const char *tk_dir;
    const tokenizer *tk;
    int have_spec;
    sample_spec spec;
    sample_buf b;
    tk_ids ids, stops;
} reader;

static int add_stop(tk_ids *stops, int32_t id) {
    for (size_t i = 0; i < stops->n; i++)
        if (stops->v[i] == id) return 0;
    return id >= 0 ? tk_ids_push(stops, id) : 0;
}

/* The job's template, for the first chat line; its end of turn joins the stops. */
static int chat_spec(reader *r, errbuf *err) {
    if (r->have_spec) return 0;
    chat_template tpl;
    if (resolve_template(r->j->data.template_name, JOB_DATA_CHAT, r->tk_dir, &tpl, err) ||
        sample_spec_init(&r->spec, r->tk, JOB_DATA_CHAT, tpl, r->j->data.seq_len, false, err))
        return errprefix(err, "a chat prompt needs the job's chat template (data.template)");
    r->have_spec = 1;
    const tpl_tokens *t = &r->spec.tok;
    int32_t end = t->eot >= 0 ? t->eot : t->im_end >= 0 ? t->im_end : t->eos;
    return add_stop(&r->stops, end) ? errf(err, "out of memory") : 0;
}

/* {"prompt": S} or {"text": S}: the tokenizer's leading ids and S. */
static int plain_prompt(reader *r, const char *line, size_t len, const char *field, errbuf *err) {
    if (record_parse(&r->b.rec, JOB_DATA_TEXT, field, line, len, err)) return -1;
    size_t n_prefix;
    const int32_t *prefix = tokenizer_prefix_ids(r->tk, &n_prefix);
    r->ids.n = 0;
    for (size_t i = 0; i < n_prefix; i++)
        if (tk_ids_push(&r->ids, prefix[i])) return errf(err, "out of memory");
    int rc = tokenizer_encode(r->tk, r->b.st, r->b.rec.text.s, r->b.rec.text.len, 0, &r->ids, err);
    record_clear(&r->b.rec);
    if (rc == 0 && r->ids.n == 0) rc = errf(err, "the prompt is empty");
    if (rc == 0 && r->ids.n > (size_t)r->j->data.seq_len)
        rc = errf(err, "the prompt has %zu tokens, more than data.seq_len %d", r->ids.n, r->j->data.seq_len);
    return rc;
}

/* One line's prompt ids into r->ids. */
static int read_line(reader *r, const char *line, size_t len, errbuf *err) {
    job_data_format format;
    char why[64];
    const char *field = "prompt";
    errbuf ignored; /* its messages speak of a data file's first record */
    if (record_guess_format(line, len, field, &format, why, sizeof why, &ignored) ||
        (format != JOB_DATA_CHAT && format != JOB_DATA_TEXT)) {
        field = "text";
        if (record_guess_format(line, len, field, &format, why, sizeof why, &ignored) ||
            (format != JOB_DATA_CHAT && format != JOB_DATA_TEXT))
            return errf(err, "not a prompt: a JSON object with messages or conversations (a chat), or "
                             "a string prompt or text");
    }
    if (format == JOB_DATA_TEXT) return plain_prompt(r, line, len, field, err);
    text_field reference;
    if (chat_spec(r, err) || sample_prompt_from_line(&r->spec, &r->b, line, len, &reference, err)) return -1;
    r->ids.n = 0;
    for (size_t i = 0; i < r->b.ids.n; i++)
        if (tk_ids_push(&r->ids, r->b.ids.v[i])) return errf(err, "out of memory");
    return 0;
}

/* Appends r->ids as prompt p->n. */
static int add_prompt(msg_sample_prompts *p, const tk_ids *ids, errbuf *err) {
    int *offsets = realloc(p->offsets, ((size_t)p->n + 2) * sizeof *offsets);
    if (!offsets) return errf(err, "out of memory");
    p->offsets = offsets;
    if (p->n == 0) offsets[0] = 0;
    int32_t *v = realloc(p->ids, ((size_t)offsets[p->n] + ids->n) * sizeof *v);
    if (!v) return errf(err, "out of memory");
    p->ids = v;
    memcpy(v + offsets[p->n], ids->v, ids->n * sizeof *v);
    offsets[p->n + 1] = offsets[p->n] + (int)ids->n;
    p->n++;
    return 0;
}

static int read_lines(reader *r, const char *path, msg_sample_prompts *p, errbuf *err) {
    char *text;
    size_t len;
    if (file_read_all(path, PROMPTS_FILE_MAX, &text, &len, err)) return -1;
    jsonl_cursor c;
    jsonl_cursor_init(&c, text, len);
    const char *line;
    size_t n;
    int rc = 0;
    while (rc == 0 && jsonl_next(&c, &line, &n))
        if (read_line(r, line, n, err) || add_prompt(p, &r->ids, err)) rc = errprefix(err, "line %ld", c.line_no);
    if (rc == 0 && p->n == 0) rc = errf(err, "no prompts");
    free(text);
    return rc;
}

int sample_prompts_load(sample_prompts *s, const job_config *j, errbuf *err) {
    memset(s, 0, sizeof *s);
    const char *path = j->train.sample_prompts;
    if (!path[0]) return 0;
    char tk_dir[JOB_PATH_MAX];
    data_tokenizer_dir(j, tk_dir, sizeof tk_dir);
    if (!tk_dir[0])
        return errf(err, "train.sample_prompts: %s needs the model's tokenizer.json (model.path's, or with "
                         "model.init random one next to model.config); none found", path);
    if (!(s->tk = tokenizer_load(tk_dir, err))) return errprefix(err, "train.sample_prompts");
    reader r = {.j = j, .tk_dir = tk_dir, .tk = s->tk};
    int rc = sample_buf_init(&r.b, s->tk, err);
    if (rc == 0) rc = add_stop(&r.stops, tokenizer_eos_id(s->tk)) ? errf(err, "out of memory") : 0;
    if (rc == 0) rc = read_lines(&r, path, &s->p, err);
    sample_buf_free(&r.b);
    tk_ids_free(&r.ids);
    if (rc == 0) {
        s->p.stop = r.stops.v; /* tk_ids' malloc'd array, now the prompts' */
        s->p.n_stop = (int)r.stops.n;
        log_event(-1, "train.sample_prompts: %d prompts from %s, %d stop ids, up to %d new tokens",
                  s->p.n, path, s->p.n_stop, j->train.sample_max_new_tokens);
        return 0;
    }
    tk_ids_free(&r.stops);
    sample_prompts_free(s);
    return errprefix(err, "train.sample_prompts: %s", path);
}

void sample_prompts_free(sample_prompts *s) {
    msg_sample_prompts_free(&s->p);
    tokenizer_free(s->tk);
    s->tk = NULL;
}

char *sample_prompts_text(const sample_prompts *s, const int32_t *ids, int n, errbuf *err) {
    size_t len;
    return tokenizer_decode(s->tk, ids, (size_t)n, &len, err);
}
