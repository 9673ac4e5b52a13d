/* fsdpctl reference: one forward and backward pass of a Hugging Face Llama on the CPU
 * backend, written out the way the golden files are (logits, loss, grad.<name> and, with
 * --adamw, adamw.<name> = the parameters after one AdamW step), so that this
 * implementation can be checked against transformers' outputs with `fsdpctl compare`.
 * With --adapter PEFT_DIR the base is frozen and the adapters are trained: grad.* and
 * adamw.* are the adapters', under PEFT's saved names; --quant nf4 first quantizes every
 * linear of the base to NF4 with double quantization and back, as bitsandbytes computes
 * with it (QLoRA).  OpenBLAS runs with its default thread count (OPENBLAS_NUM_THREADS, else
 * every core). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ctl/fsdpctl.h"
#include "proto/batch.h"
#include "proto/model_image.h"
#include "proto/nf4.h"
#include "proto/peft.h"
#include "model/llama.h"

static const char reference_usage[] =
    "usage: fsdpctl reference MODEL_DIR BATCH.safetensors --out OUT.safetensors "
    "[--adamw lr,beta1,beta2,eps,wd] [--backend cpu|cuda] [--adapter PEFT_DIR] [--quant nf4]\n";

/* What is trained: the model's parameters, or (--adapter) the adapters'. */
typedef struct trained {
    int n_units, n_tensors;
    const llama_unit *units;
    const llama_tensor_slot *tensors;
    void **params;
    float **grads;
} trained;

static trained trained_of(llama_model *m) {
    if (m->has_lora)
        return (trained){m->lora_layout.n_units, m->lora_layout.n_tensors, m->lora_layout.units,
                         m->lora_layout.tensors, m->adapters, m->adapter_grads};
    return (trained){m->layout.n_units, m->layout.n_tensors, m->layout.units, m->layout.tensors,
                     m->params, m->grads};
}

typedef struct adamw_settings {
    int on;
    float lr, beta1, beta2, eps, weight_decay;
} adamw_settings;

static int parse_adamw(const char *s, adamw_settings *a) {
    char tail;
    if (sscanf(s, "%f,%f,%f,%f,%f%c", &a->lr, &a->beta1, &a->beta2, &a->eps, &a->weight_decay,
               &tail) != 5)
        return -1;
    a->on = 1;
    return 0;
}

/* The output: tensors with names and host buffers it owns. */
typedef struct output {
    int n, cap;
    st_wtensor *t;
    char (*names)[ST_MAX_NAME];
    float **data;
} output;

static float *output_add(output *o, const char *prefix, const char *name, int ndim,
                         const int64_t *shape, errbuf *err) {
    if (o->n == o->cap) return errf(err, "reference: too many output tensors"), NULL;
    size_t numel = 1;
    for (int d = 0; d < ndim; d++) numel *= (size_t)shape[d];
    float *data = calloc(numel, sizeof *data);
    if (!data) return errf(err, "reference: out of memory for %s%s", prefix, name), NULL;
    int i = o->n++;
    snprintf(o->names[i], ST_MAX_NAME, "%s%s", prefix, name);
    o->data[i] = data;
    o->t[i] = (st_wtensor){.name = o->names[i], .dtype = ST_F32, .ndim = ndim, .data = data};
    memcpy(o->t[i].shape, shape, (size_t)ndim * sizeof *shape);
    return data;
}

static void output_free(output *o) {
    for (int i = 0; i < o->n; i++) free(o->data[i]);
    free(o->t);
    free(o->names);
    free(o->data);
}

static int compare_wtensor_names(const void *a, const void *b) {
    return strcmp(((const st_wtensor *)a)->name, ((const st_wtensor *)b)->name);
}

/* Writes adamw.<name> for every trained parameter: one AdamW step (step 1, zero moments,
 * weight decay on every parameter) applied unit by unit to fp32 copies of the parameters. */
static int adamw_step(llama_model *m, const adamw_settings *a, output *o, errbuf *err) {
    trained t = trained_of(m);
    const trained *lo = &t;
    kctx *c = m->ctx;
    for (int u = 0; u < lo->n_units; u++) {
        size_t n = lo->units[u].numel;
        float *p = k_alloc(c, n * sizeof(float), err);
        float *mom = p ? k_alloc(c, n * sizeof(float), err) : NULL;
        float *var = mom ? k_alloc(c, n * sizeof(float), err) : NULL;
        int rc = var ? 0 : -1;
        if (!rc) {
            k_compute_to_f32(c, p, lo->params[u], n);
            k_adamw(c, p, lo->grads[u], mom, var, n, a->lr, a->beta1, a->beta2, a->eps,
                    a->weight_decay, 1, 1.0f, NULL);
        }
        for (int i = 0; !rc && i < lo->units[u].count; i++) {
            const llama_tensor_slot *s = &lo->tensors[lo->units[u].first + i];
            float *dst = output_add(o, "adamw.", s->name, s->ndim, s->shape, err);
            if (!dst) rc = -1;
            else k_copy_d2h(c, dst, p + s->offset, s->numel * sizeof(float));
        }
        if (!rc) rc = k_sync(c, err);
        if (var) k_free(c, var);
        if (mom) k_free(c, mom);
        if (p) k_free(c, p);
        if (rc) return errprefix(err, "adamw");
    }
    return 0;
}

/* Runs the model on the batch and writes every output tensor to out_path. */
static int forward_backward_and_write(llama_model *m, const batch_file *b, const char *batch_path,
                                      const char *out_path, const adamw_settings *adamw,
                                      errbuf *err) {
    /* The loss is HF's mean over unmasked (shifted) targets: gradients of sum / count. */
    int32_t *shifted = malloc((size_t)b->B * b->T * sizeof *shifted);
    if (!shifted) return errf(err, "reference: out of memory");
    int64_t count = k_shift_labels(b->labels, shifted, b->B, b->T);
    free(shifted);
    if (count == 0)
        return errf(err, "%s: every label is masked (-100) after the shift: the loss is undefined",
                    batch_path);

    const llama_layout *lo = &m->layout;
    trained t = trained_of(m);
    output o = {.cap = 2 + 2 * t.n_tensors};
    o.t = calloc((size_t)o.cap, sizeof *o.t);
    o.names = calloc((size_t)o.cap, sizeof *o.names);
    o.data = calloc((size_t)o.cap, sizeof *o.data);
    int rc = -1;
    if (!o.t || !o.names || !o.data) {
        errf(err, "reference: out of memory");
        goto done;
    }
    int64_t logits_shape[3] = {b->B, b->T, lo->cfg.vocab_size}, loss_shape[1] = {1};
    float *logits = output_add(&o, "", "logits", 3, logits_shape, err);
    float *loss = logits ? output_add(&o, "", "loss", 1, loss_shape, err) : NULL;
    float loss_sum;
    int64_t n_targets;
    if (!loss || llama_model_forward_backward(m, b->input_ids, b->labels, b->B, b->T,
                                              (float)(1.0 / (double)count), &loss_sum,
                                              &n_targets, logits, err))
        goto done;
    *loss = (float)((double)loss_sum / (double)n_targets);

    for (int i = 0; i < t.n_tensors; i++) {
        const llama_tensor_slot *s = &t.tensors[i];
        float *g = output_add(&o, "grad.", s->name, s->ndim, s->shape, err);
        if (!g || llama_model_get_grad(m, s->name, g, s->numel, err)) goto done;
    }
    if (adamw->on && adamw_step(m, adamw, &o, err)) goto done;

    /* Sorted by name, as the golden file (written by the Python safetensors package) is. */
    qsort(o.t, (size_t)o.n, sizeof *o.t, compare_wtensor_names);
    if (st_write(out_path, o.t, o.n, NULL, 0, err)) goto done;
    printf("loss %.7f over %lld tokens; wrote %d tensors to %s\n", (double)*loss,
           (long long)n_targets, o.n, out_path);
    rc = 0;
done:
    output_free(&o);
    return rc;
}

/* --quant nf4: every linear of every layer replaced by its NF4 round trip (double
 * quantization, from the checkpoint's weights as stored: not from the compute dtype's
 * rounding of them), what bitsandbytes computes with. */
static int quantize_base(llama_model *m, const st_model *st, errbuf *err) {
    const llama_layout *lo = &m->layout;
    float *w = malloc(lo->max_tensor_numel * sizeof *w);
    int rc = w ? 0 : errf(err, "reference: out of memory");
    for (int l = 0; rc == 0 && l < lo->n_layers; l++)
        for (int k = 0; rc == 0 && k < MODEL_IMAGE_LINEARS; k++) {
            const llama_tensor_slot *s = &lo->tensors[lo->units[llama_layer_unit(l)].first + k];
            rc = llama_read_tensor_f32(s, st, w, err);
            if (rc == 0) rc = nf4_round_trip(w, s->ndim, s->shape, w, err);
            if (rc == 0) rc = llama_model_set_param(m, s->name, w, s->numel, err);
        }
    free(w);
    return rc;
}

/* --adapter: the base frozen, PEFT's adapters from dir trained.  Dropout is off whatever the
 * adapter's lora_dropout: a reference is deterministic (and torch's masks are not ours). */
static int load_adapter(llama_model *m, const char *dir, errbuf *err) {
    lora_layout lo;
    float **units;
    if (peft_load(dir, &m->layout.cfg, &lo, &units, err)) return -1;
    lo.cfg.dropout = 0;
    int rc = llama_model_init_lora(m, &lo.cfg, 0, err);
    for (int i = 0; rc == 0 && i < lo.n_tensors; i++) {
        const llama_tensor_slot *s = &lo.tensors[i];
        rc = llama_model_set_param(m, s->name, units[s->unit] + s->offset, s->numel, err);
    }
    peft_units_free(units, lo.n_units);
    lora_layout_free(&lo);
    return rc ? errprefix(err, "%s", dir) : 0;
}

static int run_reference(const char *model_dir, const char *batch_path, const char *out_path,
                         const adamw_settings *adamw, k_backend backend, const char *adapter,
                         int nf4, errbuf *err) {
    llama_config cfg;
    batch_file b = {0};
    if (llama_config_load(&cfg, model_dir, err) || batch_read(&b, batch_path, err)) return -1;
    int rc = -1;
    if (llama_check_batch(&cfg, b.input_ids, b.labels, b.B, b.T, err)) {
        errprefix(err, "%s", batch_path);
        goto free_batch;
    }
    st_model st;
    if (st_model_open(&st, model_dir, err)) goto free_batch;
    kctx ctx;
    if (kctx_init(&ctx, backend, 0, err)) goto close_model;
    llama_model m;
    if (llama_model_init(&m, &cfg, &ctx, 0, err)) goto destroy_ctx;
    if (!llama_model_load_hf(&m, &st, err) && (!nf4 || !quantize_base(&m, &st, err)) &&
        (!adapter || !load_adapter(&m, adapter, err)))
        rc = forward_backward_and_write(&m, &b, batch_path, out_path, adamw, err);
    llama_model_destroy(&m);
destroy_ctx:
    kctx_destroy(&ctx);
close_model:
    st_model_close(&st);
free_batch:
    batch_free(&b);
    return rc;
}

int cmd_reference(int argc, char **argv) {
    const char *positional[2], *out = NULL;
    int n_positional = 0;
    adamw_settings adamw = {0};
    k_backend backend = K_CPU;
    const char *adapter = NULL;
    int nf4 = 0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--out") && i + 1 < argc) {
            out = argv[++i];
        } else if (!strcmp(argv[i], "--backend") && i + 1 < argc) {
            const char *b = argv[++i];
            if (strcmp(b, "cpu") != 0 && strcmp(b, "cuda") != 0) {
                fprintf(stderr, "fsdpctl reference: --backend is cpu or cuda, not '%s'\n%s", b,
                        reference_usage);
                return 2;
            }
            backend = !strcmp(b, "cuda") ? K_CUDA : K_CPU;
        } else if (!strcmp(argv[i], "--adamw") && i + 1 < argc) {
            if (parse_adamw(argv[++i], &adamw)) {
                fprintf(stderr,
                        "fsdpctl reference: --adamw wants lr,beta1,beta2,eps,wd, not '%s'\n%s",
                        argv[i], reference_usage);
                return 2;
            }
        } else if (!strcmp(argv[i], "--adapter") && i + 1 < argc) {
            adapter = argv[++i];
        } else if (!strcmp(argv[i], "--quant") && i + 1 < argc) {
            if (strcmp(argv[++i], "nf4") != 0) {
                fprintf(stderr, "fsdpctl reference: --quant is nf4, not '%s'\n%s", argv[i], reference_usage);
                return 2;
            }
            nf4 = 1;
        } else if (argv[i][0] != '-' && n_positional < 2) {
            positional[n_positional++] = argv[i];
        } else {
            fprintf(stderr, "fsdpctl reference: unexpected argument '%s'\n%s", argv[i],
                    reference_usage);
            return 2;
        }
    }
    if (n_positional != 2 || !out) {
        fputs(reference_usage, stderr);
        return 2;
    }
    errbuf err = {{0}};
    if (run_reference(positional[0], positional[1], out, &adamw, backend, adapter, nf4, &err)) {
        fprintf(stderr, "fsdpctl reference: %s\n", err.msg);
        return 1;
    }
    return 0;
}
