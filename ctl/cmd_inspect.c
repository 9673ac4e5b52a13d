/* fsdpctl inspect MODEL_DIR: prints a Hugging Face Llama-family directory's config and
 * tensors and checks them against each other: every parameter the config implies must be
 * present with its shape and a floating-point dtype.
 * fsdpctl inspect --rope CONFIG: the config and the RoPE frequencies and attention factor the
 * model computes from it (tests/integration/test_rope_scaling.sh checks them against
 * transformers). */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ctl/fsdpctl.h"
#include "model/llama.h"
#include "proto/model_config.h"
#include "proto/safetensors.h"

static void print_rope(const rope_config *r) {
    switch (r->type) {
    case ROPE_LLAMA3:
        printf("rope              llama3 theta %g (factor %g, low %g, high %g, original %d)\n",
               r->theta, r->factor, r->low_freq_factor, r->high_freq_factor,
               r->original_max_position_embeddings);
        break;
    case ROPE_LINEAR: printf("rope              linear theta %g (factor %g)\n", r->theta, r->factor); break;
    case ROPE_YARN:
        printf("rope              yarn theta %g (factor %g, original %d, beta %g/%g, attention "
               "factor %.6g)\n",
               r->theta, r->factor, r->original_max_position_embeddings, r->beta_fast,
               r->beta_slow, rope_attention_factor(r));
        break;
    default: printf("rope              default theta %g\n", r->theta);
    }
}

static void print_config(const char *dir, const llama_config *c) {
    printf("model             %s\n", dir);
    printf("family            %s (%s)\n", llama_family_model_type(c->family),
           llama_family_architecture(c->family));
    printf("layers            %d\n", c->num_hidden_layers);
    printf("hidden            %d\n", c->hidden_size);
    printf("intermediate      %d\n", c->intermediate_size);
    printf("heads             %d (kv heads %d)\n", c->num_attention_heads, c->num_key_value_heads);
    printf("head_dim          %d\n", c->head_dim);
    printf("vocab             %d\n", c->vocab_size);
    printf("max_position      %d\n", c->max_position_embeddings);
    print_rope(&c->rope);
    if (c->attention_bias) printf("attention bias    q, k, v\n");
    if (c->qk_norm) printf("q/k norm          per head\n");
    if (c->sliding_window) printf("sliding window    %d\n", c->sliding_window);
    printf("tied embeddings   %s\n", c->tie_word_embeddings ? "yes" : "no");
    if (c->dtype[0]) printf("dtype             %s\n", c->dtype);
}

/* --rope: one "inv_freq I VALUE" line per frequency, then "attention_factor VALUE". */
static int inspect_rope(const char *path, errbuf *err) {
    llama_config c;
    if (llama_config_load(&c, path, err) < 0) return -1;
    print_config(path, &c);
    float *inv_freq = calloc((size_t)c.head_dim / 2, sizeof *inv_freq);
    if (!inv_freq) return errf(err, "%s: out of memory", path);
    llama_rope_inv_freq(&c, inv_freq);
    for (int i = 0; i < c.head_dim / 2; i++) printf("inv_freq %d %.9g\n", i, inv_freq[i]);
    printf("attention_factor %.17g\n", rope_attention_factor(&c.rope));
    free(inv_freq);
    return 0;
}

static void format_shape(char *buf, size_t size, const int64_t *shape, int ndim) {
    size_t used = (size_t)snprintf(buf, size, "[");
    for (int d = 0; d < ndim && used < size; d++)
        used += (size_t)snprintf(buf + used, size - used, "%s%" PRId64, d ? ", " : "", shape[d]);
    if (used < size) snprintf(buf + used, size - used, "]");
}

static int is_float(st_dtype d) {
    return d == ST_F32 || d == ST_BF16 || d == ST_F16 || d == ST_F64;
}

/* Every parameter of the config is in the model with its shape. */
static int check_params(const st_model *m, const llama_param_info *p, int n, errbuf *err) {
    for (int i = 0; i < n; i++) {
        char want[192], got[192];
        format_shape(want, sizeof want, p[i].shape, p[i].ndim);
        const st_tensor *t = st_model_find(m, p[i].name);
        if (!t)
            return errf(err, "%s: tensor %s %s is missing", m->dir, p[i].name, want);
        format_shape(got, sizeof got, t->shape, t->ndim);
        if (strcmp(want, got))
            return errf(err, "%s: tensor %s has shape %s, the config expects %s", m->dir,
                        p[i].name, got, want);
        if (!is_float(t->dtype))
            return errf(err, "%s: tensor %s has dtype %s, expected a floating-point type",
                        m->dir, p[i].name, st_dtype_name(t->dtype));
    }
    return 0;
}

static int cmp_param_name(const void *a, const void *b) {
    return strcmp(((const llama_param_info *)a)->name, ((const llama_param_info *)b)->name);
}

static int cmp_name_to_param(const void *name, const void *param) {
    return strcmp(name, ((const llama_param_info *)param)->name);
}

/* Tensors the config does not know (an old checkpoint's rotary inv_freq, say) are
 * reported but tolerated. */
static void warn_extra_tensors(const st_model *m, llama_param_info *p, int n) {
    qsort(p, (size_t)n, sizeof *p, cmp_param_name);
    for (int i = 0; i < m->n_tensors; i++) {
        if (!bsearch(m->tensors[i]->name, p, (size_t)n, sizeof *p, cmp_name_to_param))
            fprintf(stderr,
                    "fsdpctl inspect: warning: %s: tensor %s is not a parameter of the config\n",
                    m->dir, m->tensors[i]->name);
    }
}

static int inspect(const char *dir, errbuf *err) {
    llama_config c;
    if (llama_config_load(&c, dir, err) < 0) return -1;
    st_model m;
    if (st_model_open(&m, dir, err) < 0) return -1;

    print_config(dir, &c);
    uint64_t params = 0, bytes = 0;
    for (int i = 0; i < m.n_tensors; i++) {
        const st_tensor *t = m.tensors[i]; /* sorted by name */
        char shape[192];
        format_shape(shape, sizeof shape, t->shape, t->ndim);
        printf("  %-56s %-5s %s\n", t->name, st_dtype_name(t->dtype), shape);
        params += t->numel;
        bytes += t->nbytes;
    }
    printf("tensors           %d\n", m.n_tensors);
    printf("parameters        %" PRIu64 "\n", params);
    printf("bytes             %" PRIu64 " in %d file%s\n", bytes, m.n_files,
           m.n_files == 1 ? "" : "s");

    int n = llama_config_params(&c, NULL, 0);
    llama_param_info *p = calloc((size_t)n, sizeof *p);
    int rc = -1;
    if (!p) {
        errf(err, "%s: out of memory", dir);
    } else {
        llama_config_params(&c, p, n);
        rc = check_params(&m, p, n, err);
        if (rc == 0) warn_extra_tensors(&m, p, n);
        if (rc == 0 && params != llama_config_num_params(&c))
            fprintf(stderr,
                    "fsdpctl inspect: warning: %s: %" PRIu64 " parameters, the config has %" PRIu64
                    "\n",
                    dir, params, llama_config_num_params(&c));
    }
    free(p);
    st_model_close(&m);
    return rc;
}

#define INSPECT_USAGE "usage: fsdpctl inspect MODEL_DIR\n       fsdpctl inspect --rope CONFIG\n"

int cmd_inspect(int argc, char **argv) {
    if (argc == 2 && (!strcmp(argv[1], "-h") || !strcmp(argv[1], "--help"))) {
        printf(INSPECT_USAGE);
        return 0;
    }
    int rope = argc == 3 && !strcmp(argv[1], "--rope");
    if (!rope && (argc != 2 || argv[1][0] == '-')) {
        for (int i = 1; i < argc; i++)
            if (argv[i][0] == '-' && strcmp(argv[i], "--rope"))
                fprintf(stderr, "fsdpctl inspect: %s: unknown flag\n", argv[i]);
        fprintf(stderr, INSPECT_USAGE);
        return 2;
    }
    errbuf err = {{0}};
    if ((rope ? inspect_rope(argv[2], &err) : inspect(argv[1], &err)) < 0) {
        fflush(stdout);
        fprintf(stderr, "fsdpctl inspect: %s\n", err.msg);
        return 1;
    }
    return 0;
}
