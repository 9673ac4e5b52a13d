/* fsdpctl init: a randomly initialised Llama in the Hugging Face layout (config.json,
 * generation_config.json, model.safetensors or shards + index), initialised as
 * transformers' LlamaPreTrainedModel._init_weights does: every linear and embedding weight
 * normal(0, initializer_range), every RMSNorm weight 1.
 *
 * Parameter i (checkpoint order) takes its values from the counter-based RNG stream
 * rng_stream(RNG_PURPOSE_INIT, i) under the seed, element j from counter j, so the weights
 * depend only on the config, the seed and the dtype, and any slice of them can be
 * regenerated alone.
 *
 * Memory: st_write_model takes every tensor at once, so the weights are generated into a
 * scratch file in the output directory (unlinked as soon as it is created, so nothing is
 * left behind) and mapped shared: the kernel writes the pages back and evicts them as it
 * needs, so a 70B model initialises in bounded RAM at the cost of a second copy on disk
 * while init runs.
 *
 * --tokenizer PATH (a model directory, whose tokenizer files are copied, or a tokenizer.json)
 * completes the directory, its ids checked against the vocabulary; --template T then writes
 * that chat template's Jinja into chat_template.jinja and tokenizer_config.json, and its end of
 * turn into generation_config.json's eos ids (daemon/model_card.h, as fsdpd's outputs). */
#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/bf16.h"
#include "base/fileio.h"
#include "base/path.h"
#include "ctl/fsdpctl.h"
#include "daemon/consolidate.h"
#include "daemon/model_card.h"
#include "data/chat_template.h"
#include "data/tokenizer.h"
#include "proto/model_config.h"
#include "proto/rng.h"
#include "proto/safetensors.h"

#define BF16_CHUNK 65536                         /* floats generated per step for bf16 */

typedef struct init_options {
    const char *config_path, *out, *tokenizer, *template_name;
    uint64_t seed, shard_bytes;
    st_dtype dtype;
} init_options;

static void init_usage(FILE *f) {
    fprintf(f, "usage: fsdpctl init --model-config CFG.json --out DIR [--seed N] "
               "[--dtype f32|bf16] [--shard-size BYTES|5GB|500MiB]\n"
               "         [--tokenizer PATH [--template llama3|llama2|chatml|alpaca]]\n"
               "  --tokenizer: a model directory (its tokenizer files) or a tokenizer.json to copy in\n");
}

static int parse_u64(const char *s, uint64_t *out) {
    char *end;
    errno = 0;
    unsigned long long v = strtoull(s, &end, 10);
    if (!*s || *s == '-' || *end || errno) return -1;
    *out = v;
    return 0;
}

/* A byte count: a plain number, or one with a decimal (KB, MB, GB, TB) or binary (KiB, MiB,
 * GiB, TiB) suffix, as transformers' max_shard_size accepts. */
static int parse_size(const char *s, uint64_t *out) {
    static const struct {
        const char *suffix;
        uint64_t scale;
    } units[] = {
        {"", 1},          {"B", 1},
        {"KB", 1000},     {"MB", 1000000},   {"GB", 1000000000}, {"TB", 1000000000000},
        {"KiB", 1 << 10}, {"MiB", 1 << 20},  {"GiB", 1 << 30},   {"TiB", UINT64_C(1) << 40},
    };
    char *end;
    errno = 0;
    unsigned long long v = strtoull(s, &end, 10);
    if (end == s || *s == '-' || errno) return -1;
    for (size_t i = 0; i < sizeof units / sizeof units[0]; i++) {
        if (strcasecmp(end, units[i].suffix)) continue;
        if (v == 0 || v > UINT64_MAX / units[i].scale) return -1;
        *out = v * units[i].scale;
        return 0;
    }
    return -1;
}

/* Returns 0 to go on, or -1 to stop with *status (0 after --help, 2 for bad usage). */
static int parse_options(int argc, char **argv, init_options *o, int *status) {
    static const struct option longopts[] = {
        {"model-config", required_argument, 0, 'c'}, {"out", required_argument, 0, 'o'},
        {"seed", required_argument, 0, 's'},         {"dtype", required_argument, 0, 'd'},
        {"shard-size", required_argument, 0, 'z'},   {"help", no_argument, 0, 'h'},
        {"tokenizer", required_argument, 0, 't'},    {"template", required_argument, 0, 'T'},
        {0, 0, 0, 0}};
    *o = (init_options){.shard_bytes = CONSOLIDATE_SHARD_SIZE, .dtype = ST_F32};
    int opt;
    optind = 1;
    opterr = 0;
    *status = 2;
    while ((opt = getopt_long(argc, argv, "", longopts, NULL)) != -1) {
        switch (opt) {
        case 'c': o->config_path = optarg; break;
        case 'o': o->out = optarg; break;
        case 't': o->tokenizer = optarg; break;
        case 'T': o->template_name = optarg; break;
        case 'h':
            init_usage(stdout);
            *status = 0;
            return -1;
        case 's':
            if (parse_u64(optarg, &o->seed) < 0) {
                fprintf(stderr, "fsdpctl init: --seed '%s' is not a non-negative integer\n",
                        optarg);
                return -1;
            }
            break;
        case 'd':
            if (!strcmp(optarg, "f32") || !strcmp(optarg, "float32")) o->dtype = ST_F32;
            else if (!strcmp(optarg, "bf16") || !strcmp(optarg, "bfloat16")) o->dtype = ST_BF16;
            else {
                fprintf(stderr, "fsdpctl init: --dtype '%s' is not f32 or bf16\n", optarg);
                return -1;
            }
            break;
        case 'z':
            if (parse_size(optarg, &o->shard_bytes) < 0) {
                fprintf(stderr, "fsdpctl init: --shard-size '%s' is not a size such as 5GB\n",
                        optarg);
                return -1;
            }
            break;
        default:
            ctl_flag_error("init", argv);
            init_usage(stderr);
            return -1;
        }
    }
    if (!o->config_path || !o->out || optind != argc) {
        init_usage(stderr);
        return -1;
    }
    if (o->template_name && !o->tokenizer) {
        fprintf(stderr, "fsdpctl init: --template needs --tokenizer\n");
        return -1;
    }
    return 0;
}

/* --tokenizer: one the model's vocabulary holds (and, with --template, the template's tokens). */
static int check_tokenizer(const init_options *o, const llama_config *c, chat_template *t, errbuf *err) {
    *t = TPL_NONE;
    if (!o->tokenizer) return 0;
    if (o->template_name && chat_template_parse(o->template_name, t, err)) return errprefix(err, "--template");
    if (o->template_name && *t == TPL_NONE) return errf(err, "--template %s: not a template", o->template_name);
    tokenizer *tk = tokenizer_load(o->tokenizer, err);
    if (!tk) return errprefix(err, "--tokenizer");
    tpl_tokens tt;
    int rc = 0;
    if (tokenizer_vocab_size(tk) > c->vocab_size)
        rc = errf(err, "--tokenizer %s: its ids reach %d, past the model's vocab_size %d", o->tokenizer,
                  tokenizer_vocab_size(tk) - 1, c->vocab_size);
    else if (*t != TPL_NONE && tpl_tokens_find(*t, tk, &tt, err))
        rc = errprefix(err, "--tokenizer %s", o->tokenizer);
    tokenizer_free(tk);
    return rc;
}

/* The tokenizer files of a model directory, or a tokenizer.json, into dir. */
static int copy_tokenizer(const char *from, const char *dir, errbuf *err) {
    struct stat st;
    char dst[PATH_BYTES], src[PATH_BYTES];
    if (stat(from, &st) != 0) return errf(err, "--tokenizer %s: %s", from, strerror(errno));
    if (!S_ISDIR(st.st_mode))
        return path_join(dst, PATH_BYTES, dir, "tokenizer.json", err) || file_copy(from, dst, err) ? -1 : 0;
    for (size_t i = 0; i < HF_TOKENIZER_FILES; i++)
        if (path_join(src, PATH_BYTES, from, hf_tokenizer_files[i], err) ||
            path_join(dst, PATH_BYTES, dir, hf_tokenizer_files[i], err) || file_copy(src, dst, err) < 0)
            return -1;
    return 0;
}

/* The scratch area holding every tensor (see the top of the file). */
typedef struct scratch {
    unsigned char *map;
    size_t len;
} scratch;

static int scratch_open(scratch *s, const char *dir, uint64_t bytes, errbuf *err) {
    char path[PATH_BYTES];
    if (snprintf(path, sizeof path, "%s/.init-scratch.XXXXXX", dir) >= (int)sizeof path)
        return errf(err, "%s: path too long", dir);
    int fd = mkstemp(path);
    if (fd < 0) return errf(err, "%s: %s", path, strerror(errno));
    int rc = -1;
    if (unlink(path) < 0)
        errf(err, "%s: unlink: %s", path, strerror(errno));
    else if (ftruncate(fd, (off_t)bytes) < 0)
        errf(err, "%s: cannot reserve %" PRIu64 " bytes: %s", dir, bytes, strerror(errno));
    else if ((s->map = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0)) == MAP_FAILED)
        errf(err, "%s: mmap of %" PRIu64 " bytes: %s", dir, bytes, strerror(errno));
    else {
        s->len = bytes;
        rc = 0;
    }
    close(fd); /* the mapping keeps the file */
    return rc;
}

static uint64_t param_numel(const llama_param_info *p) {
    return (uint64_t)p->shape[0] * (uint64_t)(p->ndim == 2 ? p->shape[1] : 1);
}

/* The values of parameter `index` (checkpoint order), as dtype, into dst; chunk is a
 * BF16_CHUNK-float work area. */
static void init_param(const llama_param_info *p, int index, const llama_config *c,
                       uint64_t seed, st_dtype dtype, void *dst, float *chunk) {
    uint64_t numel = param_numel(p);
    uint64_t stream = rng_stream(RNG_PURPOSE_INIT, (uint64_t)index);
    float std = (float)c->initializer_range;
    if (dtype == ST_F32) {
        float *out = dst;
        if (p->is_norm || p->is_bias)
            for (uint64_t j = 0; j < numel; j++) out[j] = p->is_norm ? 1.0f : 0.0f;
        else
            rng_fill_normal(out, numel, std, seed, stream, 0);
        return;
    }
    uint16_t *out = dst;
    for (uint64_t first = 0; first < numel; first += BF16_CHUNK) {
        size_t n = numel - first < BF16_CHUNK ? (size_t)(numel - first) : BF16_CHUNK;
        if (p->is_norm || p->is_bias)
            for (size_t j = 0; j < n; j++) chunk[j] = p->is_norm ? 1.0f : 0.0f;
        else
            rng_fill_normal(chunk, n, std, seed, stream, first);
        for (size_t j = 0; j < n; j++) out[first + j] = bf16_from_f32(chunk[j]);
    }
}

/* generation_config.json, as transformers derives it from the model config. */
static int write_generation_config(const char *dir, const llama_config *c, errbuf *err) {
    char path[PATH_BYTES];
    snprintf(path, sizeof path, "%s/generation_config.json", dir);
    json_t *root = json_pack("{s:b}", "_from_model_config", 1);
    int failed = !root;
    if (!failed && c->bos_token_id >= 0)
        failed = json_object_set_new(root, "bos_token_id", json_integer(c->bos_token_id));
    if (!failed && (c->eos_token_id >= 0 || c->eos_is_list)) /* a list stays a list */
        failed = json_object_set_new(root, "eos_token_id", llama_config_eos_json(c));
    char *text = failed ? NULL : json_dumps(root, JSON_INDENT(2) | JSON_SORT_KEYS);
    json_decref(root);
    if (!text) return errf(err, "%s: out of memory", path);
    file_chunk chunks[] = {{text, strlen(text)}, {"\n", 1}};
    int rc = file_write_atomic(path, chunks, 2, err);
    free(text);
    return rc;
}

/* The weights: every parameter generated into the scratch mapping, then written. */
static int write_weights(const init_options *o, const llama_config *c, errbuf *err) {
    int n = llama_config_params(c, NULL, 0);
    llama_param_info *p = calloc((size_t)n, sizeof *p);
    st_wtensor *t = calloc((size_t)n, sizeof *t);
    float *chunk = malloc(BF16_CHUNK * sizeof *chunk);
    scratch s = {NULL, 0};
    int rc = -1;
    if (!p || !t || !chunk) {
        errf(err, "%s: out of memory", o->out);
        goto out;
    }
    llama_config_params(c, p, n);
    uint64_t total = 0, elem = st_dtype_size(o->dtype);
    for (int i = 0; i < n; i++) total += param_numel(&p[i]) * elem;
    if (scratch_open(&s, o->out, total, err) < 0) goto out;
    uint64_t offset = 0;
    for (int i = 0; i < n; i++) {
        t[i] = (st_wtensor){.name = p[i].name, .dtype = o->dtype, .ndim = p[i].ndim,
                            .data = s.map + offset};
        t[i].shape[0] = p[i].shape[0];
        t[i].shape[1] = p[i].shape[1];
        init_param(&p[i], i, c, o->seed, o->dtype, s.map + offset, chunk);
        offset += param_numel(&p[i]) * elem;
    }
    rc = st_write_model(o->out, t, n, o->shard_bytes, err);
    if (rc == 0)
        printf("%s: %d tensors, %" PRIu64 " parameters, %" PRIu64 " bytes (%s), seed %" PRIu64 "\n",
               o->out, n, llama_config_num_params(c), total, st_dtype_name(o->dtype), o->seed);
out:
    if (s.map && munmap(s.map, s.len) < 0 && rc == 0)
        rc = errf(err, "%s: munmap: %s", o->out, strerror(errno));
    free(chunk);
    free(t);
    free(p);
    return rc;
}

static int init_model(const init_options *o, errbuf *err) {
    llama_config c;
    if (llama_config_load(&c, o->config_path, err) < 0) return -1;
    snprintf(c.dtype, sizeof c.dtype, "%s", o->dtype == ST_BF16 ? "bfloat16" : "float32");

    /* config.json is written last: a directory with one is a finished model. */
    char config_path[PATH_BYTES];
    int len = snprintf(config_path, sizeof config_path, "%s/config.json", o->out);
    if (len < 0 || (size_t)len >= sizeof config_path) return errf(err, "%s: path too long", o->out);
    struct stat st;
    if (stat(config_path, &st) == 0)
        return errf(err, "%s already exists: refusing to overwrite a model; choose a new --out",
                    config_path);
    if (errno != ENOENT) return errf(err, "%s: %s", config_path, strerror(errno));
    chat_template t;
    if (check_tokenizer(o, &c, &t, err) || file_mkdir(o->out, err) < 0) return -1;
    if (write_weights(o, &c, err) < 0 || write_generation_config(o->out, &c, err) < 0)
        return -1;
    bool written;
    if (o->tokenizer && (copy_tokenizer(o->tokenizer, o->out, err) || model_card_template(o->out, t, &written, err)))
        return -1;
    if (o->tokenizer && t != TPL_NONE && !written)
        fprintf(stderr, "fsdpctl init: no chat template written: fsdpd has no Jinja of its own for %s and the "
                        "tokenizer's tokenizer_config.json has none that renders it\n", chat_template_name(t));
    return llama_config_save(&c, config_path, err);
}

int cmd_init(int argc, char **argv) {
    init_options o;
    int status;
    if (parse_options(argc, argv, &o, &status) < 0) return status;
    errbuf err = {{0}};
    if (init_model(&o, &err) < 0) {
        fprintf(stderr, "fsdpctl init: %s\n", err.msg);
        return 1;
    }
    return 0;
}
