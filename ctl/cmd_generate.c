/* fsdpctl generate: what a model (and an adapter over it) says, through the KV-cache decoder
 * (model/llama_decode.h) and the decoding loop (model/llama_generate.h).
 *
 * Prompts: --prompt TEXT (tokenized with the model's tokenizer, its BOS added as
 * transformers' tokenizer(text) adds it), --prompt-ids "1 2 3" (no tokenizer needed) and
 * --chat FILE.jsonl (each line a conversation that ends with a user turn, or with the reply
 * to it, which is taken off: rendered as training renders it with the job's chat template,
 * --template or the one the model's tokenizer_config.json names, up to the reply's first
 * token).  Several prompts decode in batches of --batch rows.
 *
 * Stops: the model's generation_config.json eos_token_id, its tokenizer's EOS, for --chat the
 * template's end of turn (<|eot_id|>, <|im_end|>) (none of these with --ignore-eos), and each
 * --stop (an id, or a string that is one token of the tokenizer).  The stop token ends the
 * reply's ids, not its text.  stderr gets the time and tokens/s of the decoding (the model's
 * loading not counted).
 *
 * Output: with one prompt the reply's text (ids without a tokenizer) as it comes; with
 * several each reply when it ends, "[i] text".  --json: JSON lines, {"event": "token",
 * "prompt": i, "id": ID, "text": PIECE} as each token comes and {"event": "reply", "prompt":
 * i, "prompt_ids": [...], "ids": [...], "text": ..., "stop": "stop"|"length"|"positions"}. */
#include <errno.h>
#include <getopt.h>
#include <jansson.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/clock.h"
#include "base/fileio.h"
#include "base/path.h"
#include "ctl/fsdpctl.h"
#include "data/chat_template.h"
#include "data/sample.h"
#include "data/tokenizer.h"
#include "model/llama.h"
#include "model/llama_decode.h"
#include "model/llama_generate.h"
#include "proto/gen_config.h"
#include "proto/model_image.h"
#include "proto/nf4.h"
#include "proto/peft.h"

#define MAX_ARGS 256       /* --prompt, --prompt-ids and --stop flags */
#define CHAT_FILE_MAX (1u << 30)

static void generate_usage(FILE *f) {
    fprintf(f,
            "usage: fsdpctl generate MODEL_DIR (--prompt TEXT | --prompt-ids \"1 2 3\" | --chat FILE.jsonl) ...\n"
            "         [--adapter PEFT_DIR] [--quant nf4] [--template llama3|llama2|chatml|alpaca]\n"
            "         [--max-new-tokens N] [--greedy | --temperature T --top-p P --top-k K --seed S]\n"
            "         [--stop TEXT|ID ...] [--ignore-eos] [--batch N] [--backend cpu|cuda] [--json]\n"
            "  greedy unless a sampling flag is given; --prompt, --prompt-ids and --stop repeat\n");
}

typedef struct options {
    const char *model_dir, *adapter, *chat, *template_name;
    const char *prompt[MAX_ARGS];
    int prompt_is_ids[MAX_ARGS], n_prompt;
    const char *stop[MAX_ARGS];
    int n_stop;
    int nf4, json, max_new, batch, greedy_flag, sampling_flag, ignore_eos;
    k_backend backend;
    gen_sampling s;
} options;

static int parse_double(const char *text, double *out) {
    char *end;
    errno = 0;
    *out = strtod(text, &end);
    return errno || end == text || *end ? -1 : 0;
}

static int parse_u64(const char *text, uint64_t *out) {
    char *end;
    errno = 0;
    unsigned long long v = strtoull(text, &end, 10);
    if (errno || end == text || *end || text[0] == '-') return -1;
    *out = v;
    return 0;
}

/* Returns 0 to go on, or -1 to stop with *status (0 after --help, 2 for bad usage). */
static int parse_options(int argc, char **argv, options *o, int *status) {
    static const struct option longopts[] = {
        {"adapter", required_argument, 0, 'a'}, {"quant", required_argument, 0, 'q'},
        {"prompt", required_argument, 0, 'p'}, {"prompt-ids", required_argument, 0, 'i'},
        {"chat", required_argument, 0, 'c'}, {"template", required_argument, 0, 'T'},
        {"max-new-tokens", required_argument, 0, 'n'}, {"greedy", no_argument, 0, 'g'},
        {"temperature", required_argument, 0, 't'}, {"top-p", required_argument, 0, 'P'},
        {"top-k", required_argument, 0, 'k'}, {"seed", required_argument, 0, 's'},
        {"stop", required_argument, 0, 'S'}, {"batch", required_argument, 0, 'b'},
        {"backend", required_argument, 0, 'B'}, {"json", no_argument, 0, 'j'},
        {"ignore-eos", no_argument, 0, 'e'},
        {"help", no_argument, 0, 'h'}, {0, 0, 0, 0}};
    *o = (options){.max_new = 128, .batch = 8, .backend = K_CPU,
                   .s = {.temperature = 1.0, .top_p = 1.0}};
    int opt;
    optind = 1;
    opterr = 0;
    *status = 2;
    while ((opt = getopt_long(argc, argv, "", longopts, NULL)) != -1) {
        const char *bad = NULL;
        switch (opt) {
        case 'a': o->adapter = optarg; break;
        case 'q': bad = strcmp(optarg, "nf4") ? "--quant '%s' is not nf4" : NULL, o->nf4 = 1; break;
        case 'p':
        case 'i':
            if (o->n_prompt == MAX_ARGS) bad = "more than 256 --prompt and --prompt-ids ('%s')";
            else o->prompt_is_ids[o->n_prompt] = opt == 'i', o->prompt[o->n_prompt++] = optarg;
            break;
        case 'c': o->chat = optarg; break;
        case 'T': o->template_name = optarg; break;
        case 'n':
            bad = fsdpctl_parse_int(optarg, 1, INT_MAX, &o->max_new) ? "--max-new-tokens '%s' is not a whole number >= 1" : NULL;
            break;
        case 'b': bad = fsdpctl_parse_int(optarg, 1, 4096, &o->batch) ? "--batch '%s' is not a number from 1 to 4096" : NULL; break;
        case 'g': o->greedy_flag = 1; break;
        case 't': bad = parse_double(optarg, &o->s.temperature) ? "--temperature '%s' is not a number" : NULL, o->sampling_flag = 1; break;
        case 'P': bad = parse_double(optarg, &o->s.top_p) ? "--top-p '%s' is not a number" : NULL, o->sampling_flag = 1; break;
        case 'k': bad = fsdpctl_parse_int(optarg, 0, INT_MAX, &o->s.top_k) ? "--top-k '%s' is not a whole number >= 0" : NULL, o->sampling_flag = 1; break;
        case 's': bad = parse_u64(optarg, &o->s.seed) ? "--seed '%s' is not a whole number >= 0" : NULL, o->sampling_flag = 1; break;
        case 'S':
            if (o->n_stop == MAX_ARGS) bad = "more than 256 --stop ('%s')";
            else o->stop[o->n_stop++] = optarg;
            break;
        case 'B':
            if (strcmp(optarg, "cpu") && strcmp(optarg, "cuda")) bad = "--backend '%s' is not cpu or cuda";
            o->backend = strcmp(optarg, "cuda") ? K_CPU : K_CUDA;
            break;
        case 'j': o->json = 1; break;
        case 'e': o->ignore_eos = 1; break;
        case 'h':
            generate_usage(stdout);
            *status = 0;
            return -1;
        default:
            ctl_flag_error("generate", argv);
            generate_usage(stderr);
            return -1;
        }
        if (bad) {
            fprintf(stderr, "fsdpctl generate: ");
            fprintf(stderr, bad, optarg);
            fprintf(stderr, "\n");
            return -1;
        }
    }
    const char *why = argc - optind != 1 ? "one MODEL_DIR"
                      : !o->n_prompt && !o->chat ? "a prompt: --prompt, --prompt-ids or --chat"
                      : o->greedy_flag && o->sampling_flag
                          ? "--greedy or sampling (--temperature, --top-p, --top-k, --seed), not both"
                          : NULL;
    if (why) {
        fprintf(stderr, "fsdpctl generate: needs %s\n", why);
        generate_usage(stderr);
        return -1;
    }
    o->model_dir = argv[optind];
    o->s.greedy = !o->sampling_flag;
    return 0;
}

/* ---- prompts ---- */

typedef struct prompts {
    int n, cap;
    tk_ids *ids;
} prompts;

static tk_ids *prompt_add(prompts *p, errbuf *err) {
    if (p->n == p->cap) {
        int cap = p->cap ? 2 * p->cap : 16;
        tk_ids *v = realloc(p->ids, (size_t)cap * sizeof *v);
        if (!v) return errf(err, "out of memory"), NULL;
        p->ids = v, p->cap = cap;
    }
    p->ids[p->n] = (tk_ids){0};
    return &p->ids[p->n++];
}

static void prompts_free(prompts *p) {
    for (int i = 0; i < p->n; i++) tk_ids_free(&p->ids[i]);
    free(p->ids);
}

static int parse_ids(const char *text, int vocab, tk_ids *out, errbuf *err) {
    const char *s = text;
    for (;;) {
        while (*s == ' ' || *s == ',' || *s == '\t') s++;
        if (!*s) break;
        char *end;
        errno = 0;
        long v = strtol(s, &end, 10);
        if (errno || end == s || v < 0 || v >= vocab)
            return errf(err, "--prompt-ids '%s': '%.20s' is not a token id of the model (vocabulary %d)",
                        text, s, vocab);
        if (tk_ids_push(out, (int32_t)v)) return errf(err, "out of memory");
        s = end;
    }
    return out->n ? 0 : errf(err, "--prompt-ids '%s' has no ids", text);
}

/* The template --chat renders with: --template, else the model's tokenizer_config.json's. */
static int chat_template_of(const options *o, chat_template *t, errbuf *err) {
    if (o->template_name && *o->template_name && strcmp(o->template_name, "auto")) {
        if (chat_template_parse(o->template_name, t, err)) return errprefix(err, "--template");
        return 0;
    }
    if (chat_template_from_model(o->model_dir, t, err))
        return errprefix(err, "--chat needs the template the model was trained with (--template)");
    return 0;
}

static int read_chat(const options *o, const tokenizer *tk, chat_template tpl, int max_len,
                     prompts *p, errbuf *err) {
    sample_spec spec;
    sample_buf b;
    char *text;
    size_t len;
    if (sample_spec_init(&spec, tk, JOB_DATA_CHAT, tpl, max_len, false, err)) return -1;
    if (file_read_all(o->chat, CHAT_FILE_MAX, &text, &len, err)) return -1;
    if (sample_buf_init(&b, tk, err)) {
        free(text);
        return -1;
    }
    jsonl_cursor c;
    jsonl_cursor_init(&c, text, len);
    const char *line;
    size_t n;
    int rc = 0;
    while (rc == 0 && jsonl_next(&c, &line, &n)) {
        text_field reference;
        tk_ids *ids = prompt_add(p, err);
        if (!ids) rc = -1;
        else if (sample_prompt_from_line(&spec, &b, line, n, &reference, err))
            rc = errprefix(err, "%s:%ld", o->chat, c.line_no);
        for (size_t i = 0; rc == 0 && i < b.ids.n; i++)
            if (tk_ids_push(ids, b.ids.v[i])) rc = errf(err, "out of memory");
    }
    if (rc == 0 && c.line_no == 0) rc = errf(err, "%s: no conversations", o->chat);
    sample_buf_free(&b);
    free(text);
    return rc;
}

static int make_prompts(const options *o, const llama_config *cfg, const tokenizer *tk,
                        chat_template tpl, prompts *p, errbuf *err) {
    tk_state *st = tk ? tk_state_new(tk) : NULL;
    if (tk && !st) return errf(err, "out of memory");
    int rc = 0;
    for (int i = 0; rc == 0 && i < o->n_prompt; i++) {
        tk_ids *ids = prompt_add(p, err);
        if (!ids) rc = -1;
        else if (o->prompt_is_ids[i]) rc = parse_ids(o->prompt[i], cfg->vocab_size, ids, err);
        else if (!tk) rc = errf(err, "--prompt: %s has no tokenizer.json (give --prompt-ids)", o->model_dir);
        else rc = tokenizer_encode(tk, st, o->prompt[i], strlen(o->prompt[i]), TK_ADD_SPECIAL, ids, err);
    }
    tk_state_free(st);
    if (rc == 0 && o->chat) rc = read_chat(o, tk, tpl, cfg->max_position_embeddings, p, err);
    for (int i = 0; rc == 0 && i < p->n; i++)
        if (p->ids[i].n > (size_t)cfg->max_position_embeddings)
            rc = errf(err, "prompt %d has %zu tokens, more than the model's max_position_embeddings %d",
                      i, p->ids[i].n, cfg->max_position_embeddings);
    return rc;
}

/* ---- stops ---- */

static int stop_add(tk_ids *stops, int32_t id, errbuf *err) {
    for (size_t i = 0; i < stops->n; i++)
        if (stops->v[i] == id) return 0;
    return tk_ids_push(stops, id) ? errf(err, "out of memory") : 0;
}

static int make_stops(const options *o, const llama_config *cfg, const tokenizer *tk,
                      chat_template tpl, tk_ids *stops, errbuf *err) {
    gen_config g;
    if (gen_config_read(&g, o->model_dir, err)) return -1;
    if (o->ignore_eos) g.n_eos = 0;
    int rc = 0;
    for (int i = 0; rc == 0 && i < g.n_eos; i++)
        if (g.eos[i] < cfg->vocab_size) rc = stop_add(stops, g.eos[i], err);
    if (rc == 0 && !o->ignore_eos && tk && tokenizer_eos_id(tk) >= 0 && tokenizer_eos_id(tk) < cfg->vocab_size)
        rc = stop_add(stops, tokenizer_eos_id(tk), err);
    if (rc == 0 && !o->ignore_eos && o->chat && tk) { /* the template's end of turn */
        tpl_tokens t;
        if (tpl_tokens_find(tpl, tk, &t, err)) return -1;
        int32_t end = t.eot >= 0 ? t.eot : t.im_end >= 0 ? t.im_end : t.eos;
        if (end >= 0) rc = stop_add(stops, end, err);
    }
    for (int i = 0; rc == 0 && i < o->n_stop; i++) {
        const char *s = o->stop[i];
        char *end;
        long v = strtol(s, &end, 10);
        if (*s && !*end && s[0] != '-') {
            if (v >= cfg->vocab_size)
                return errf(err, "--stop %s: not a token id of the model (vocabulary %d)", s, cfg->vocab_size);
            rc = stop_add(stops, (int32_t)v, err);
            continue;
        }
        int32_t id = tk ? tokenizer_token_id(tk, s, strlen(s)) : -1;
        if (id < 0)
            return errf(err, "--stop '%s': unknown stop string: not one token of %s's tokenizer%s",
                        s, o->model_dir, tk ? "" : " (it has no tokenizer.json: give an id)");
        rc = stop_add(stops, id, err);
    }
    return rc;
}

/* ---- the model ---- */

/* --quant nf4: every linear of every layer as its NF4 round trip (what QLoRA computes with). */
static int quantize_linears(llama_decoder *d, const st_model *st, errbuf *err) {
    const llama_layout *lo = &d->layout;
    float *w = malloc(lo->max_tensor_numel * sizeof *w);
    int rc = w ? 0 : errf(err, "out of memory");
    for (int l = 0; rc == 0 && l < lo->n_layers; l++)
        for (int k = 0; rc == 0 && k < MODEL_IMAGE_LINEARS; k++) {
            const llama_tensor_slot *s = &lo->tensors[lo->units[llama_layer_unit(l)].first + k];
            rc = llama_read_tensor_f32(s, st, w, err);
            if (rc == 0) rc = nf4_round_trip(w, s->ndim, s->shape, w, err);
            if (rc == 0) rc = llama_decoder_set_param(d, s, w, err);
        }
    free(w);
    return rc;
}

/* --adapter: merged into the base (W + scale B A), which computes what PEFT's unmerged
 * forward computes. */
static int merge_adapter(llama_decoder *d, const char *dir, const char *model_dir, errbuf *err) {
    lora_layout lo;
    float **units;
    if (peft_load(dir, &d->layout.cfg, &lo, &units, err))
        return errprefix(err, "--adapter %s: not an adapter for %s", dir, model_dir);
    int rc = 0;
    float scale = (float)lora_scale(&lo.cfg);
    for (int l = 0; rc == 0 && l < lo.n_layers; l++)
        for (int m = 0; rc == 0 && m < LORA_MODULES; m++) {
            const lora_site *s = &lo.site[m];
            if (s->on)
                rc = llama_decoder_merge_lora(d, l, m, units[l] + s->a_off, units[l] + s->b_off,
                                              lo.cfg.rank, scale, err);
        }
    peft_units_free(units, lo.n_units);
    lora_layout_free(&lo);
    return rc;
}

static int load_model(const options *o, llama_decoder *d, errbuf *err) {
    st_model st;
    if (st_model_open(&st, o->model_dir, err)) return -1;
    int rc = llama_decoder_load_hf(d, &st, err);
    if (rc == 0 && o->nf4) rc = quantize_linears(d, &st, err);
    st_model_close(&st);
    if (rc == 0 && o->adapter) rc = merge_adapter(d, o->adapter, o->model_dir, err);
    return rc;
}

/* ---- output ---- */

typedef struct printer {
    const options *o;
    const tokenizer *tk;
    const tk_ids *stops;
    int n;
    tk_ids *ids;     /* [n] each reply so far */
    size_t *printed; /* [n] bytes of its text out so far */
    int failed;
} printer;

static int is_stop_id(const tk_ids *stops, int32_t id) {
    for (size_t i = 0; i < stops->n; i++)
        if (stops->v[i] == id) return 1;
    return 0;
}

/* Reply i's text (a final stop id left out), malloc'd; *ready: the bytes of it that no later
 * token can change (a trailing U+FFFD, a byte-fallback character not yet whole, held back). */
static char *reply_text(const printer *P, int i, int final, size_t *len, size_t *ready) {
    const tk_ids *ids = &P->ids[i];
    size_t n = ids->n && is_stop_id(P->stops, ids->v[ids->n - 1]) ? ids->n - 1 : ids->n;
    errbuf err;
    char *text = tokenizer_decode(P->tk, ids->v, n, len, &err);
    if (!text) return NULL;
    *ready = *len;
    while (!final && *ready >= 3 && !memcmp(text + *ready - 3, "\xEF\xBF\xBD", 3)) *ready -= 3;
    return text;
}

static void print_json(json_t *o) {
    char *s = o ? json_dumps(o, JSON_COMPACT | JSON_ENSURE_ASCII) : NULL;
    if (s) printf("%s\n", s);
    free(s);
    json_decref(o);
}

static int on_token(void *user, int i, int32_t id) {
    printer *P = user;
    if (tk_ids_push(&P->ids[i], id)) return P->failed = 1;
    const char *piece = NULL;
    size_t len = 0, ready = 0, from = P->printed[i];
    char *text = P->tk ? reply_text(P, i, 0, &len, &ready) : NULL;
    if (P->tk && !text) return P->failed = 1;
    if (text && ready > from) piece = text + from, P->printed[i] = ready;
    if (P->o->json) {
        json_t *e = json_pack("{s:s,s:i,s:i}", "event", "token", "prompt", i, "id", id);
        if (e && P->tk) json_object_set_new(e, "text", json_stringn(piece ? piece : "", piece ? ready - from : 0));
        print_json(e);
    } else if (P->n == 1) {
        if (!P->tk) printf("%s%d", P->ids[i].n > 1 ? " " : "", id);
        else if (piece) fwrite(piece, 1, ready - from, stdout);
    }
    fflush(stdout);
    free(text);
    return 0;
}

static json_t *ids_json(const int32_t *v, size_t n) {
    json_t *a = json_array();
    for (size_t i = 0; a && i < n; i++) json_array_append_new(a, json_integer(v[i]));
    return a;
}

static int print_replies(printer *P, const prompts *p, const gen_reply *r, errbuf *err) {
    for (int i = 0; i < P->n; i++) {
        size_t len = 0, ready = 0;
        char *text = P->tk ? reply_text(P, i, 1, &len, &ready) : NULL;
        if (P->tk && !text) return errf(err, "reply %d: its ids do not decode", i);
        if (P->o->json) {
            json_t *e = json_pack("{s:s,s:i,s:o,s:o,s:s}", "event", "reply", "prompt", i,
                                  "prompt_ids", ids_json(p->ids[i].v, p->ids[i].n), "ids",
                                  ids_json(r[i].ids, (size_t)r[i].n), "stop", gen_stop_name(r[i].stop));
            if (e && text) json_object_set_new(e, "text", json_stringn(text, len));
            print_json(e);
        } else if (P->n == 1) {
            if (text) fwrite(text + P->printed[i], 1, len - P->printed[i], stdout);
            printf("\n");
            fflush(stdout);
            fprintf(stderr, "(%d tokens, stop: %s)\n", r[i].n, gen_stop_name(r[i].stop));
        } else {
            printf("[%d] ", i);
            if (text) fwrite(text, 1, len, stdout);
            for (int k = 0; !text && k < r[i].n; k++) printf(k ? " %d" : "%d", r[i].ids[k]);
            printf("\n");
        }
        free(text);
    }
    fflush(stdout);
    return 0;
}

/* ---- the command ---- */

static int has_tokenizer(const char *dir) {
    char path[PATH_BYTES];
    errbuf err;
    return !path_join(path, PATH_BYTES, dir, "tokenizer.json", &err) && access(path, F_OK) == 0;
}

static int generate(const options *o, errbuf *err) {
    llama_config cfg;
    if (llama_config_load(&cfg, o->model_dir, err) || gen_sampling_check(&o->s, err)) return -1;
    tokenizer *tk = has_tokenizer(o->model_dir) ? tokenizer_load(o->model_dir, err) : NULL;
    if (has_tokenizer(o->model_dir) && !tk) return -1;
    chat_template tpl = TPL_NONE;
    prompts p = {0};
    tk_ids stops = {0};
    int rc = -1;
    if (o->chat && !tk) {
        errf(err, "--chat: %s has no tokenizer.json", o->model_dir);
        goto done;
    }
    if ((o->chat && chat_template_of(o, &tpl, err)) || make_prompts(o, &cfg, tk, tpl, &p, err) ||
        make_stops(o, &cfg, tk, tpl, &stops, err))
        goto done;
    int longest = 0;
    for (int i = 0; i < p.n; i++) longest = (int)p.ids[i].n > longest ? (int)p.ids[i].n : longest;
    long want = (long)longest + o->max_new;
    int max_len = want < cfg.max_position_embeddings ? (int)want : cfg.max_position_embeddings;
    int rows = p.n < o->batch ? p.n : o->batch;
    kctx ctx;
    if (kctx_init(&ctx, o->backend, 0, err)) goto done;
    llama_decoder d;
    if (llama_decoder_init(&d, &cfg, &ctx, rows, max_len, err) == 0) {
        gen_prompt *gp = calloc((size_t)p.n, sizeof *gp);
        gen_reply *r = calloc((size_t)p.n, sizeof *r);
        printer P = {.o = o, .tk = tk, .stops = &stops, .n = p.n,
                     .ids = calloc((size_t)p.n, sizeof(tk_ids)), .printed = calloc((size_t)p.n, sizeof(size_t))};
        if (!gp || !r || !P.ids || !P.printed) errf(err, "out of memory");
        else if (load_model(o, &d, err) == 0) {
            for (int i = 0; i < p.n; i++) gp[i] = (gen_prompt){p.ids[i].v, (int)p.ids[i].n};
            gen_model m = llama_decoder_gen_model(&d);
            gen_options go = {.max_new_tokens = o->max_new, .stop_ids = stops.v, .n_stop = (int)stops.n,
                              .sampling = o->s, .on_token = on_token, .user = &P};
            double t0 = clock_now_s();
            if (gen_run(&m, gp, p.n, &go, r, err) == 0) {
                double sec = clock_now_s() - t0;
                long total = 0;
                for (int i = 0; i < p.n; i++) total += r[i].n;
                rc = P.failed ? errf(err, "out of memory") : print_replies(&P, &p, r, err);
                fprintf(stderr, "fsdpctl generate: %ld new tokens for %d prompt%s in %.3f s: %.1f tokens/s (%s, %d row%s)\n",
                        total, p.n, p.n == 1 ? "" : "s", sec, (double)total / sec,
                        o->backend == K_CUDA ? "cuda" : "cpu", rows, rows == 1 ? "" : "s");
                gen_replies_free(r, p.n);
            } else if (P.failed) {
                errf(err, "out of memory");
            }
        }
        for (int i = 0; P.ids && i < p.n; i++) tk_ids_free(&P.ids[i]);
        free(P.ids), free(P.printed), free(gp), free(r);
        llama_decoder_destroy(&d);
    }
    kctx_destroy(&ctx);
done:
    prompts_free(&p);
    tk_ids_free(&stops);
    tokenizer_free(tk);
    return rc;
}

int cmd_generate(int argc, char **argv) {
    options o;
    int status;
    if (parse_options(argc, argv, &o, &status)) return status;
    errbuf err = {{0}};
    if (generate(&o, &err)) {
        fprintf(stderr, "fsdpctl generate: %s\n", err.msg);
        return 1;
    }
    return 0;
}
