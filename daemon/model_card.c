/* model_card: the output made ready to use (see model_card.h). */
#include "daemon/model_card.h"

#include <errno.h>
#include <jansson.h>
#include <libgen.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/fileio.h"
#include "base/path.h"
#include "daemon/consolidate.h"
#include "daemon/data_prepare.h"
#include "daemon/log.h"
#include "daemon/plot.h"
#include "data/chat_template.h"
#include "data/tokenizer.h"
#include "proto/gen_config.h"
#include "proto/tokens.h"

#define JSON_FILE_MAX (64u << 20)

static int exists(const char *dir, const char *name) {
    char path[PATH_BYTES];
    errbuf ignored;
    return !path_join(path, PATH_BYTES, dir, name, &ignored) && access(path, F_OK) == 0;
}

static int write_file(const char *dir, const char *name, const char *text, size_t len, errbuf *err) {
    char path[PATH_BYTES];
    if (path_join(path, PATH_BYTES, dir, name, err)) return -1;
    file_chunk chunk = {text, len};
    return file_write_atomic(path, &chunk, 1, err);
}

/* dir/name's JSON object into *root (a new reference); flags: jansson's (tokenizer_config.json
 * needs JSON_DECODE_INT_AS_REAL: its model_max_length is often 1e30 written as an integer). */
static int read_object(const char *dir, const char *name, size_t flags, json_t **root, errbuf *err) {
    char path[PATH_BYTES], *text;
    size_t len;
    if (path_join(path, PATH_BYTES, dir, name, err) || file_read_all(path, JSON_FILE_MAX, &text, &len, err))
        return -1;
    json_error_t je;
    *root = json_loadb(text, len, flags, &je);
    free(text);
    if (!*root) return errf(err, "%s: not JSON: %s (line %d)", path, je.text, je.line);
    if (!json_is_object(*root)) {
        json_decref(*root);
        return errf(err, "%s: not a JSON object", path);
    }
    return 0;
}

/* root into dir/name, indented, its keys in their order (as transformers writes them). */
static int write_object(const char *dir, const char *name, json_t *root, errbuf *err) {
    char *text = json_dumps(root, JSON_INDENT(2) | JSON_PRESERVE_ORDER);
    if (!text) return errf(err, "%s: out of memory", name);
    size_t len = strlen(text);
    char *line = realloc(text, len + 2);
    if (!line) {
        free(text);
        return errf(err, "%s: out of memory", name);
    }
    memcpy(line + len, "\n", 2);
    int rc = write_file(dir, name, line, len + 1, err);
    free(line);
    return rc;
}

/* generation_config.json's eos_token_id with `stop` added (a list). */
static int add_stop_id(const char *dir, int32_t stop, errbuf *err) {
    json_t *g;
    if (read_object(dir, GEN_CONFIG_NAME, 0, &g, err)) return -1;
    char *text = json_dumps(g, JSON_COMPACT);
    gen_config have;
    int rc = text ? gen_config_parse(&have, text, strlen(text), GEN_CONFIG_NAME, err) : errf(err, "out of memory");
    free(text);
    json_t *ids = rc ? NULL : json_array();
    int seen = 0;
    for (int i = 0; ids && i < have.n_eos; i++) {
        seen |= have.eos[i] == stop;
        json_array_append_new(ids, json_integer(have.eos[i]));
    }
    if (ids && !seen) json_array_append_new(ids, json_integer(stop));
    if (ids && json_object_set_new(g, "eos_token_id", ids)) rc = errf(err, "out of memory");
    if (rc == 0) rc = write_object(dir, GEN_CONFIG_NAME, g, err);
    json_decref(g);
    return rc;
}

/* The integers a JSON_DECODE_INT_AS_REAL read turned into reals made integers again (those
 * below 2^53; 1e30 stays a real), so that the file is written back as it was. */
static int restore_ints(json_t *v) {
    const char *key;
    json_t *e;
    size_t i;
    if (json_is_object(v)) {
        json_object_foreach(v, key, e) {
            double x = json_is_real(e) ? json_real_value(e) : 0.5;
            if (x == floor(x) && fabs(x) < 9007199254740992.0) {
                if (json_object_set_new(v, key, json_integer((json_int_t)x))) return -1;
            } else if (restore_ints(e)) return -1;
        }
    } else if (json_is_array(v)) {
        json_array_foreach(v, i, e) {
            double x = json_is_real(e) ? json_real_value(e) : 0.5;
            if (x == floor(x) && fabs(x) < 9007199254740992.0) {
                if (json_array_set_new(v, i, json_integer((json_int_t)x))) return -1;
            } else if (restore_ints(e)) return -1;
        }
    }
    return 0;
}

/* The Jinja to write for t: fsdpd's own, or, for the templates it has none of (Qwen's and
 * Mistral's), the one dir's tokenizer_config.json holds (the base's) when that renders t;
 * NULL when there is neither. */
static char *template_jinja(const char *dir, chat_template t) {
    const char *own = chat_template_jinja(t);
    if (own) return strdup(own);
    json_t *c;
    errbuf ignored;
    if (!exists(dir, "tokenizer_config.json") || read_object(dir, "tokenizer_config.json", 0, &c, &ignored))
        return NULL;
    const char *base = json_string_value(json_object_get(c, "chat_template"));
    char *jinja = base && chat_template_recognise(base) == t ? strdup(base) : NULL;
    json_decref(c);
    return jinja;
}

int model_card_template(const char *dir, int t, bool *written, errbuf *err) {
    *written = false;
    if (t == TPL_NONE) return 0;
    char *jinja = template_jinja(dir, (chat_template)t);
    if (!jinja) return 0;
    *written = true;
    int wrc = write_file(dir, "chat_template.jinja", jinja, strlen(jinja), err);
    if (wrc) {
        free(jinja);
        return -1;
    }
    if (exists(dir, "tokenizer_config.json")) {
        json_t *c;
        if (read_object(dir, "tokenizer_config.json", JSON_DECODE_INT_AS_REAL, &c, err)) return -1;
        int rc = json_object_set_new(c, "chat_template", json_string(jinja)) || restore_ints(c)
                     ? errf(err, "out of memory")
                     : write_object(dir, "tokenizer_config.json", c, err);
        json_decref(c);
        if (rc) {
            free(jinja);
            return -1;
        }
    }
    free(jinja);
    if (!exists(dir, GEN_CONFIG_NAME) || !exists(dir, "tokenizer.json")) return 0;
    tokenizer *tk = tokenizer_load(dir, err);
    if (!tk) return -1;
    tpl_tokens tt;
    int rc = tpl_tokens_find((chat_template)t, tk, &tt, err);
    tokenizer_free(tk);
    if (rc) return errprefix(err, "%s", dir);
    int32_t end = tt.eot >= 0 ? tt.eot : tt.im_end >= 0 ? tt.im_end : tt.eos;
    return end >= 0 ? add_stop_id(dir, end, err) : 0;
}

/* The tokenizer files beside the data's tokenizer when dir has none (a random init's output). */
static int copy_tokenizer(const job_config *j, const char *dir, errbuf *err) {
    char from[PATH_BYTES];
    data_tokenizer_dir(j, from, sizeof from);
    if (exists(dir, "tokenizer.json") || !from[0]) return 0;
    for (size_t i = 0; i < HF_TOKENIZER_FILES; i++) {
        char src[PATH_BYTES], dst[PATH_BYTES];
        if (path_join(src, PATH_BYTES, from, hf_tokenizer_files[i], err) ||
            path_join(dst, PATH_BYTES, dir, hf_tokenizer_files[i], err) || file_copy(src, dst, err) < 0)
            return -1;
    }
    return 0;
}

/* ---- README.md ---- */

typedef struct data_facts {
    const char *file;
    uint64_t records, tokens;
    int format, tpl; /* the cache's TOK_FORMAT_* and chat template */
} data_facts;

static void print_value(FILE *f, json_t *v) {
    char *s = json_dumps(v, JSON_ENCODE_ANY | JSON_COMPACT | JSON_REAL_PRECISION(15));
    fputs(s ? s : "?", f);
    free(s);
}

static int print_settings(FILE *f, const job_config *j, errbuf *err) {
    json_t *root = job_to_object(j, err);
    if (!root) return -1;
    fputs("## Settings\n\nEvery setting of the job as fsdpd resolved it (`job.json` in the job's output "
          "directory; `fsdpd --job job.json` runs it again):\n\n| setting | value |\n|---|---|\n", f);
    const char *section, *key;
    json_t *keys, *v;
    json_object_foreach(root, section, keys) {
        json_object_foreach(keys, key, v) {
            fprintf(f, "| `%s.%s` | `", section, key);
            print_value(f, v);
            fputs("` |\n", f);
        }
    }
    json_decref(root);
    return 0;
}

static void print_results(FILE *f, const run_record *r) {
    fputs("## Results\n\n", f);
    if (!r->has_summary) {
        fputs("The job has no summary.\n\n", f);
        return;
    }
    const run_summary *s = &r->summary;
    fprintf(f, "- steps: %lld, label tokens trained on: %lld (%lld computed), %.0f s, %.0f tokens/s\n",
            (long long)s->steps, (long long)s->tokens, (long long)s->tokens_computed, s->wall_s, s->tokens_per_s);
    fprintf(f, "- final training loss: %.4f\n", s->final_loss);
    if (s->has_eval)
        fprintf(f, "- final eval loss: %.4f; best eval loss: %.4f (step %lld)\n", s->final_eval_loss,
                s->best_eval_loss, (long long)s->best_eval_step);
    else
        fputs("- eval loss: none (data.eval_fraction 0)\n", f);
    fputs("\n", f);
}

static char *card_text(const job_config *j, const data_facts *d, const run_record *r, const char *plot, bool has_template,
                       int merged, size_t *len, errbuf *err) {
    char *text = NULL;
    FILE *f = open_memstream(&text, len);
    if (!f) return errf(err, "out of memory"), NULL;
    int adapter = j->train.type != JOB_TRAIN_FULL && !merged; /* output.dir is the PEFT adapter */
    const char *base = j->model.init == JOB_INIT_PRETRAINED ? j->model.path : NULL;
    fprintf(f, "---\n");
    if (base) fprintf(f, "base_model: %s\n", base);
    fprintf(f, "library_name: %s\ntags:\n- fsdpd\n- %s\n%s---\n\n", adapter ? "peft" : "transformers",
            r->train_type, adapter ? "- lora\n" : "");
    fprintf(f, "# %s\n\n", merged ? "Merged model" : adapter ? "LoRA adapter" : "Fine-tuned model");
    fprintf(f, "Trained by fsdpd %s: %s training (%s) of ", r->fsdpd_version, r->train_type, r->dtypes);
    if (base) fprintf(f, "`%s`", base);
    else fprintf(f, "a random initialisation of `%s`", j->model.config);
    fprintf(f, "%s, on %lld %s rank%s.\n\n", adapter ? ", saved as a PEFT adapter" : merged ? ", the adapter merged in" : "",
            (long long)r->world_size, r->backend, r->world_size == 1 ? "" : "s");
    if (adapter)
        fprintf(f, "Adapter: rank %lld, alpha %g (scale %g) on %d module kinds.\n\n", (long long)r->lora_rank,
                r->lora_alpha, r->lora_scale, r->n_lora_targets);
    fprintf(f, "## Data\n\n- file: `%s`\n- format: %s", d->file, tok_format_name((uint32_t)d->format));
    if (d->tpl != TPL_NONE) fprintf(f, ", chat template %s", chat_template_name((chat_template)d->tpl));
    fprintf(f, "\n- records: %llu, tokens: %llu (sequence length %lld)\n\n", (unsigned long long)d->records,
            (unsigned long long)d->tokens, (long long)r->seq_len);
    if (has_template)
        fprintf(f, "The chat template is in `chat_template.jinja` and `tokenizer_config.json`: "
                   "`apply_chat_template` renders a conversation into the tokens this model was trained on "
                   "(`add_generation_prompt=True` for a reply).\n\n");
    print_results(f, r);
    if (plot) fprintf(f, "![loss curve](%s)\n\n", plot);
    fputs("## Use\n\n```python\n", f);
    if (adapter)
        fprintf(f, "from peft import AutoPeftModelForCausalLM\nmodel = AutoPeftModelForCausalLM.from_pretrained(\"%s\")\n",
                j->output.dir);
    else
        fprintf(f, "from transformers import AutoModelForCausalLM, AutoTokenizer\n"
                   "model = AutoModelForCausalLM.from_pretrained(\"%s%s\")\n"
                   "tokenizer = AutoTokenizer.from_pretrained(\"%s%s\")\n",
                j->output.dir, merged ? "/merged" : "", j->output.dir, merged ? "/merged" : "");
    fprintf(f, "```\n\nor `fsdpctl generate %s%s --prompt \"...\"`.\n\n", j->output.dir, merged ? "/merged" : "");
    int rc = print_settings(f, j, err);
    if (fclose(f) != 0 && rc == 0) rc = errf(err, "out of memory");
    if (rc) {
        free(text);
        return NULL;
    }
    return text;
}

static int data_facts_of(const job_config *j, const char *data_file, data_facts *d, errbuf *err) {
    tok_cache c;
    if (tok_open(&c, j->data.path, err)) return errprefix(err, "the model card's data");
    *d = (data_facts){.file = data_file, .records = c.n_records, .tokens = c.n_tokens,
                      .format = (int)c.source.format, .tpl = (int)c.source.template_id};
    tok_close(&c);
    return 0;
}

/* One output directory: tokenizer, template, stops, plot and card. */
static int complete_dir(const job_config *j, const char *dir, const data_facts *d, const run_record *r,
                        int merged, errbuf *err) {
    bool template_written;
    if (copy_tokenizer(j, dir, err) || model_card_template(dir, d->tpl, &template_written, err)) return -1;
    if (d->tpl != TPL_NONE && !template_written)
        log_event(-1, "%s: no chat template written: fsdpd has no Jinja of its own for %s and the base's "
                      "tokenizer_config.json has none that renders it; apply_chat_template needs one set by hand",
                  dir, chat_template_name((chat_template)d->tpl));
    char svg[PATH_BYTES];
    const char *plot = NULL;
    if (path_join(svg, PATH_BYTES, dir, MODEL_CARD_PLOT, err)) return -1;
    errbuf why;
    if (access(j->runtime.metrics, R_OK) == 0 && plot_metrics(j->runtime.metrics, svg, NULL, &why) == 0)
        plot = MODEL_CARD_PLOT;
    size_t len;
    char *text = card_text(j, d, r, plot, template_written, merged, &len, err);
    if (!text) return -1;
    int rc = write_file(dir, MODEL_CARD_NAME, text, len, err);
    free(text);
    return rc;
}

int model_card_write(const job_config *j, const char *data_file, const run_record *r, errbuf *err) {
    data_facts d;
    char name[PATH_BYTES], merged[PATH_BYTES];
    snprintf(name, sizeof name, "%s", data_file);
    if (data_facts_of(j, basename(name), &d, err) || complete_dir(j, j->output.dir, &d, r, 0, err))
        return errprefix(err, "completing %s", j->output.dir);
    if (!j->output.merge || path_join(merged, PATH_BYTES, j->output.dir, "merged", err) || access(merged, F_OK) != 0)
        return 0;
    return complete_dir(j, merged, &d, r, 1, err) ? errprefix(err, "completing %s", merged) : 0;
}
