/* fsdpctl quantize: NF4 as bitsandbytes stores it (proto/nf4.h).
 *
 *   fsdpctl quantize --tensors IN.safetensors OUT.safetensors [--double-quant]
 *     every F32, BF16 or F16 tensor N of IN (others are skipped, and said so) gives the fields
 *     of the golden nf4 files: N.packed (U8, two codes a byte), N.absmax (F32) and N.dq (F32,
 *     dequantized and rounded to N's dtype); with --double-quant N.dq2.packed, N.dq2.absmax_q,
 *     N.dq2.nested_absmax, N.dq2.nested_code, N.dq2.offset and N.dq2.dq instead.
 *
 *   fsdpctl quantize MODEL_DIR OUT_DIR [--compute-dtype bf16|f16|f32]
 *     a "-bnb-4bit" model directory as transformers saves a model loaded with load_in_4bit,
 *     nf4, double quantization: every linear of every decoder layer (q, k, v, o, gate, up,
 *     down) as W.weight (U8 [n/2, 1]), W.weight.absmax, .quant_map, .nested_absmax,
 *     .nested_quant_map and .quant_state.bitsandbytes__nf4; every other tensor (embeddings,
 *     norms, lm_head) copied as it is; config.json with transformers' quantization_config
 *     (bnb_4bit_compute_dtype the --compute-dtype, default bf16); generation_config.json and
 *     the tokenizer files copied.  Written into OUT_DIR.partial, renamed to OUT_DIR at the
 *     end; OUT_DIR must not exist. */
#include <dirent.h>
#include <errno.h>
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <jansson.h>

#include "base/fileio.h"
#include "base/path.h"
#include "daemon/consolidate.h"
#include "ctl/fsdpctl.h"
#include "proto/lora_layout.h"
#include "proto/model_config.h"
#include "proto/model_layout.h"
#include "proto/nf4.h"
#include "proto/safetensors.h"

static const char quantize_usage[] =
    "usage: fsdpctl quantize --tensors IN.safetensors OUT.safetensors [--double-quant]\n"
    "       fsdpctl quantize MODEL_DIR OUT_DIR [--compute-dtype bf16|f16|f32]\n"
    "  NF4 as bitsandbytes stores it: the golden fields of every floating tensor of IN, or a\n"
    "  bnb-4bit model directory (every decoder linear quantized with double quantization)\n";

#define CONFIG_NAME "config.json"
#define GENERATION_NAME "generation_config.json"
#define PARTIAL_SUFFIX ".partial"

/* ---- --tensors: the golden fields ---- */

#define GOLDEN_FIELDS 6 /* the most a tensor gives (double quantization) */

typedef struct quantized {
    nf4_tensor t;
    float *dq;
    char names[GOLDEN_FIELDS][ST_MAX_NAME];
} quantized;

static int is_nf4_input(st_dtype d) { return d == ST_F32 || d == ST_BF16 || d == ST_F16; }

static int quantize_one(const st_tensor *in, int double_quant, quantized *q, errbuf *err) {
    float *w = malloc(in->numel * sizeof(float));
    q->dq = malloc(in->numel * sizeof(float));
    if (!w || !q->dq) {
        free(w);
        return errf(err, "%s: out of memory", in->name);
    }
    int rc = st_read_f32(in, 0, in->numel, w, err);
    if (rc == 0) rc = nf4_quantize(w, in->dtype, in->ndim, in->shape, double_quant, &q->t, err);
    if (rc == 0) rc = nf4_dequantize(&q->t, q->dq, err);
    free(w);
    if (rc == 0) return 0;
    nf4_free(&q->t);
    free(q->dq);
    q->dq = NULL;
    return errprefix(err, "%s", in->name);
}

/* out[(*n)++] = base+suffix, its name kept in q->names[k]. */
static void field(st_wtensor *out, int *n, quantized *q, int k, const char *base, const char *suffix,
                  st_dtype dtype, int ndim, const int64_t *shape, const void *data) {
    if (snprintf(q->names[k], ST_MAX_NAME, "%s%s", base, suffix) >= ST_MAX_NAME)
        q->names[k][0] = 0; /* not reached: quantize_tensors checks the lengths */
    st_wtensor *w = &out[(*n)++];
    memset(w, 0, sizeof *w);
    w->name = q->names[k];
    w->dtype = dtype;
    w->ndim = ndim;
    memcpy(w->shape, shape, (size_t)ndim * sizeof(int64_t));
    w->data = data;
}

/* q's golden fields appended to out (*n grows by 3 or 6). */
static void golden_fields(const char *base, quantized *q, st_wtensor *out, int *n) {
    const nf4_tensor *t = &q->t;
    int64_t packed[1] = {(int64_t)nf4_packed_bytes(t->numel)}, blocks[1] = {(int64_t)t->n_blocks};
    int64_t nested[1] = {(int64_t)t->n_nested}, code[1] = {256}, one[1] = {1};
    if (!t->double_quant) {
        field(out, n, q, 0, base, ".packed", ST_U8, 1, packed, t->packed);
        field(out, n, q, 1, base, ".absmax", ST_F32, 1, blocks, t->absmax);
        field(out, n, q, 2, base, ".dq", ST_F32, t->ndim, t->shape, q->dq);
        return;
    }
    field(out, n, q, 0, base, ".dq2.packed", ST_U8, 1, packed, t->packed);
    field(out, n, q, 1, base, ".dq2.absmax_q", ST_U8, 1, blocks, t->absmax_q);
    field(out, n, q, 2, base, ".dq2.nested_absmax", ST_F32, 1, nested, t->nested_absmax);
    field(out, n, q, 3, base, ".dq2.nested_code", ST_F32, 1, code, nf4_dynamic_map);
    field(out, n, q, 4, base, ".dq2.offset", ST_F32, 1, one, &t->offset);
    field(out, n, q, 5, base, ".dq2.dq", ST_F32, t->ndim, t->shape, q->dq);
}

static int quantize_tensors(const char *in_path, const char *out_path, int double_quant) {
    st_file in;
    errbuf err = {{0}};
    if (st_open(&in, in_path, &err)) {
        fprintf(stderr, "fsdpctl quantize: %s\n", err.msg);
        return 1;
    }
    quantized *q = calloc((size_t)in.n_tensors + 1, sizeof *q);
    st_wtensor *out = calloc((size_t)in.n_tensors * GOLDEN_FIELDS + 1, sizeof *out);
    int rc = q && out ? 0 : errf(&err, "out of memory");
    int n_out = 0, n_q = 0;
    for (int i = 0; rc == 0 && i < in.n_tensors; i++) {
        const st_tensor *t = &in.tensors[i];
        if (!is_nf4_input(t->dtype)) {
            printf("%s: %s, not quantized\n", t->name, st_dtype_name(t->dtype));
            continue;
        }
        if (strlen(t->name) + strlen(".dq2.nested_absmax") >= ST_MAX_NAME) {
            rc = errf(&err, "%s: name too long for its .dq2.nested_absmax", t->name);
            break;
        }
        rc = quantize_one(t, double_quant, &q[n_q], &err);
        if (rc == 0) golden_fields(t->name, &q[n_q++], out, &n_out);
    }
    if (rc == 0 && n_q == 0) rc = errf(&err, "%s: no F32, BF16 or F16 tensor to quantize", in_path);
    if (rc == 0) rc = st_write(out_path, out, n_out, NULL, 0, &err);
    if (rc == 0)
        printf("%s: %d tensor%s quantized to NF4%s\n", out_path, n_q, n_q == 1 ? "" : "s",
               double_quant ? " with double quantization" : "");
    for (int i = 0; q && i < n_q; i++) {
        nf4_free(&q[i].t);
        free(q[i].dq);
    }
    free(q);
    free(out);
    st_close(&in);
    if (rc) fprintf(stderr, "fsdpctl quantize: %s\n", err.msg);
    return rc ? 1 : 0;
}

/* ---- MODEL_DIR OUT_DIR: a bnb-4bit model directory ---- */

/* Whether name is one of the decoder linears ("model.layers.L.self_attn.q_proj.weight" ...). */
static int is_decoder_linear(const char *name, int n_layers) {
    char want[ST_MAX_NAME];
    for (int l = 0; l < n_layers; l++)
        for (int m = 0; m < LORA_MODULES; m++) {
            lora_base_name(want, sizeof want, l, m);
            if (!strcmp(name, want)) return 1;
        }
    return 0;
}

/* The fewest significant digits (15 to 17) that print every real of v exactly: Python
 * writes 1e-05 and 6.0 where jansson's default of 17 would write 1.0000000000000001e-05. */
static int real_digits(const json_t *v, int digits) {
    if (json_is_real(v)) {
        for (; digits < 17; digits++) {
            char s[40];
            snprintf(s, sizeof s, "%.*g", digits, json_real_value(v));
            if (strtod(s, NULL) == json_real_value(v)) break;
        }
        return digits;
    }
    const char *key;
    size_t i;
    json_t *child;
    if (json_is_object(v)) json_object_foreach((json_t *)v, key, child) digits = real_digits(child, digits);
    if (json_is_array(v)) json_array_foreach(v, i, child) digits = real_digits(child, digits);
    return digits;
}

/* The source's config.json with quantization_config added, as transformers writes it
 * (2-space indent, sorted keys, ASCII); malloc'd.  A quantized model is refused. */
static char *bnb_config_text(const char *model_dir, st_dtype compute_dtype, errbuf *err) {
    char src[PATH_BYTES], *text = NULL;
    size_t len;
    if (path_join(src, PATH_BYTES, model_dir, CONFIG_NAME, err) || file_read_all(src, 1u << 20, &text, &len, err))
        return NULL;
    json_error_t je;
    json_t *root = json_loadb(text, len, JSON_REJECT_DUPLICATES, &je);
    free(text);
    text = NULL;
    if (!json_is_object(root)) errf(err, "%s: not a JSON object", src);
    else if (json_object_get(root, "quantization_config"))
        errf(err, "%s: the model is quantized already (it has a quantization_config)", src);
    else if (json_object_set_new(root, "quantization_config",
                                 nf4_model_quant_json(&(nf4_model_quant){1, compute_dtype})) ||
             !(text = json_dumps(root, JSON_INDENT(2) | JSON_SORT_KEYS | JSON_ENSURE_ASCII |
                                           JSON_REAL_PRECISION(real_digits(root, 15)))))
        errf(err, "%s: out of memory", src);
    json_decref(root);
    return text;
}

static int write_config(const char *dir, const char *text, errbuf *err) {
    char dst[PATH_BYTES];
    if (path_join(dst, PATH_BYTES, dir, CONFIG_NAME, err)) return -1;
    file_chunk chunks[] = {{text, strlen(text)}, {"\n", 1}}; /* transformers ends it with one */
    return file_write_atomic(dst, chunks, 2, err);
}

/* generation_config.json and the tokenizer files the source has; *copied counts them. */
static int copy_side_files(const char *model_dir, const char *dir, int *copied, errbuf *err) {
    *copied = 0;
    for (int i = -1; i < HF_TOKENIZER_FILES; i++) {
        const char *name = i < 0 ? GENERATION_NAME : hf_tokenizer_files[i];
        char src[PATH_BYTES], dst[PATH_BYTES];
        if (path_join(src, PATH_BYTES, model_dir, name, err) || path_join(dst, PATH_BYTES, dir, name, err)) return -1;
        int rc = file_copy(src, dst, err);
        if (rc < 0) return -1;
        *copied += rc == 0;
    }
    return 0;
}

/* The output tensors: each decoder linear as its bnb tensors, everything else as it is. */
typedef struct bnb_plan {
    st_wtensor *out;
    int n_out, n_quantized;
    nf4_tensor *q;
    char (*names)[NF4_MAX_OUT][ST_MAX_NAME];
    char **states;
    uint64_t bytes_in, bytes_out;
} bnb_plan;

static void plan_free(bnb_plan *p, int n) {
    for (int i = 0; i < n; i++) {
        nf4_free(&p->q[i]);
        free(p->states[i]);
    }
    free(p->out);
    free(p->q);
    free(p->names);
    free(p->states);
}

static int plan_linear(bnb_plan *p, const st_tensor *t, errbuf *err) {
    int k = p->n_quantized++; /* q[k] and states[k] are freed by plan_free from here on */
    float *w = malloc(t->numel * sizeof(float));
    if (!w) return errf(err, "%s: out of memory", t->name);
    int rc = st_read_f32(t, 0, t->numel, w, err);
    if (rc == 0) rc = nf4_quantize(w, t->dtype, t->ndim, t->shape, 1, &p->q[k], err);
    free(w);
    if (rc) return errprefix(err, "%s", t->name);
    int n = nf4_bnb_tensors(t->name, &p->q[k], p->out + p->n_out, p->names[k], &p->states[k], err);
    if (n < 0) return -1;
    p->n_out += n;
    p->bytes_in += t->nbytes;
    for (int i = 0; i < n; i++) {
        uint64_t numel = 1;
        for (int d = 0; d < p->out[p->n_out - n + i].ndim; d++) numel *= (uint64_t)p->out[p->n_out - n + i].shape[d];
        p->bytes_out += numel * st_dtype_size(p->out[p->n_out - n + i].dtype);
    }
    return 0;
}

static int plan_model(bnb_plan *p, const st_model *m, int n_layers, errbuf *err) {
    memset(p, 0, sizeof *p);
    size_t n = (size_t)m->n_tensors;
    p->out = calloc(n * NF4_MAX_OUT + 1, sizeof *p->out);
    p->q = calloc(n + 1, sizeof *p->q);
    p->names = calloc(n + 1, sizeof *p->names);
    p->states = calloc(n + 1, sizeof *p->states);
    if (!p->out || !p->q || !p->names || !p->states) return errf(err, "%s: out of memory", m->dir);
    for (int i = 0; i < m->n_tensors; i++) {
        const st_tensor *t = m->tensors[i];
        if (is_decoder_linear(t->name, n_layers)) {
            if (plan_linear(p, t, err)) return -1;
            continue;
        }
        st_wtensor *w = &p->out[p->n_out++];
        w->name = t->name, w->dtype = t->dtype, w->ndim = t->ndim, w->data = t->data;
        memcpy(w->shape, t->shape, sizeof w->shape);
        p->bytes_in += t->nbytes, p->bytes_out += t->nbytes;
    }
    if (p->n_quantized != n_layers * LORA_MODULES)
        return errf(err, "%s: %d of the %d decoder linears found", m->dir, p->n_quantized, n_layers * LORA_MODULES);
    return 0;
}

/* Removes dir's files and dir (a failed run's OUT_DIR.partial). */
static void remove_partial(const char *dir) {
    DIR *d = opendir(dir);
    struct dirent *e;
    while (d && (e = readdir(d))) {
        char path[PATH_BYTES];
        if (strcmp(e->d_name, ".") && strcmp(e->d_name, "..") &&
            snprintf(path, sizeof path, "%s/%s", dir, e->d_name) < (int)sizeof path)
            unlink(path);
    }
    if (d) closedir(d);
    rmdir(dir);
}

static int write_bnb_dir(const char *model_dir, const char *partial, const char *config,
                         const bnb_plan *p, int *side_files, errbuf *err) {
    if (mkdir(partial, 0755) != 0)
        return errf(err, "%s: %s%s", partial, strerror(errno),
                    errno == EEXIST ? " (a stopped run's output: remove it)" : "");
    int rc = st_write_model(partial, p->out, p->n_out, CONSOLIDATE_SHARD_SIZE, err);
    if (rc == 0) rc = write_config(partial, config, err);
    if (rc == 0) rc = copy_side_files(model_dir, partial, side_files, err);
    if (rc) remove_partial(partial);
    return rc;
}

/* Every tensor config.json describes is in m with its shape (what fsdpd checks when it loads the
 * model), so a directory whose config.json disagrees with its weights is refused here rather than
 * written and then refused by fsdpd. */
static int check_shapes(const st_model *m, const llama_config *cfg, const char *model_dir, errbuf *err) {
    llama_layout lo;
    if (llama_layout_init(&lo, cfg, err)) return errprefix(err, "%s/%s", model_dir, CONFIG_NAME);
    int rc = 0;
    for (int i = 0; rc == 0 && i < lo.n_tensors; i++)
        if (!llama_checkpoint_tensor(&lo.tensors[i], m, err))
            rc = errprefix(err, "%s/%s disagrees with the weights", model_dir, CONFIG_NAME);
    llama_layout_free(&lo);
    return rc;
}

static int quantize_model(const char *model_dir, const char *out_dir, st_dtype compute_dtype) {
    errbuf err = {{0}};
    char partial[PATH_BYTES];
    struct stat sb;
    llama_config cfg;
    st_model m = {0};
    bnb_plan p = {0};
    char *config = NULL;
    int side_files = 0, rc = 0;
    if (snprintf(partial, sizeof partial, "%s%s", out_dir, PARTIAL_SUFFIX) >= (int)sizeof partial)
        rc = errf(&err, "%s: path too long", out_dir);
    else if (stat(out_dir, &sb) == 0) rc = errf(&err, "%s exists already", out_dir);
    if (rc == 0) rc = llama_config_load(&cfg, model_dir, &err);
    if (rc == 0 && !(config = bnb_config_text(model_dir, compute_dtype, &err))) rc = -1;
    if (rc == 0) rc = st_model_open(&m, model_dir, &err);
    if (rc == 0) rc = check_shapes(&m, &cfg, model_dir, &err);
    if (rc == 0) rc = plan_model(&p, &m, cfg.num_hidden_layers, &err);
    if (rc == 0) rc = write_bnb_dir(model_dir, partial, config, &p, &side_files, &err);
    if (rc == 0 && rename(partial, out_dir) != 0) {
        rc = errf(&err, "rename %s to %s: %s", partial, out_dir, strerror(errno));
        remove_partial(partial);
    }
    if (rc == 0)
        printf("%s: %d linears in NF4 (double quantization), %d tensors copied, %d side files; "
               "%llu bytes from %llu\n",
               out_dir, p.n_quantized, p.n_out - p.n_quantized * NF4_MAX_OUT, side_files,
               (unsigned long long)p.bytes_out, (unsigned long long)p.bytes_in);
    plan_free(&p, p.n_quantized);
    free(config);
    if (m.dir) st_model_close(&m);
    if (rc) fprintf(stderr, "fsdpctl quantize: %s\n", err.msg);
    return rc ? 1 : 0;
}

static int compute_dtype_parse(const char *arg, st_dtype *out) {
    if (!strcmp(arg, "bf16") || !strcmp(arg, "bfloat16")) *out = ST_BF16;
    else if (!strcmp(arg, "f16") || !strcmp(arg, "float16")) *out = ST_F16;
    else if (!strcmp(arg, "f32") || !strcmp(arg, "float32")) *out = ST_F32;
    else return -1;
    return 0;
}

int cmd_quantize(int argc, char **argv) {
    static const struct option longopts[] = {{"tensors", no_argument, 0, 't'},
                                             {"double-quant", no_argument, 0, 'q'},
                                             {"compute-dtype", required_argument, 0, 'c'},
                                             {"help", no_argument, 0, 'h'},
                                             {0, 0, 0, 0}};
    int tensors = 0, double_quant = 0, compute_given = 0, opt;
    st_dtype compute_dtype = ST_BF16;
    optind = 1;
    opterr = 0;
    while ((opt = getopt_long(argc, argv, "", longopts, NULL)) != -1) {
        switch (opt) {
        case 't': tensors = 1; break;
        case 'q': double_quant = 1; break;
        case 'c':
            compute_given = 1;
            if (compute_dtype_parse(optarg, &compute_dtype)) {
                fprintf(stderr, "fsdpctl quantize: --compute-dtype '%s' is not bf16, f16 or f32\n", optarg);
                return 2;
            }
            break;
        case 'h': fputs(quantize_usage, stdout); return 0;
        default:
            ctl_flag_error("quantize", argv);
            fputs(quantize_usage, stderr);
            return 2;
        }
    }
    if (argc - optind != 2) {
        fputs(quantize_usage, stderr);
        return 2;
    }
    if (!tensors && double_quant) {
        fprintf(stderr, "fsdpctl quantize: --double-quant goes with --tensors (a model directory always has it)\n");
        return 2;
    }
    if (tensors && compute_given) {
        fprintf(stderr, "fsdpctl quantize: --compute-dtype goes with a model directory, not --tensors\n");
        return 2;
    }
    return tensors ? quantize_tensors(argv[optind], argv[optind + 1], double_quant)
                   : quantize_model(argv[optind], argv[optind + 1], compute_dtype);
}
