/* The model image (proto/model_image) and its sealed shared memory (daemon/model_shm). */
#include <errno.h>
#include <fcntl.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#include "base/bf16.h"
#include "ctl/fsdpctl.h"
#include "daemon/model_shm.h"
#include "proto/model_image.h"
#include "proto/nf4.h"
#include "tests/unit/fixtures.h"

static const char small_config[] =
    "{\"model_type\": \"llama\", \"hidden_size\": 24, \"intermediate_size\": 40,"
    " \"num_hidden_layers\": 2, \"num_attention_heads\": 4, \"num_key_value_heads\": 2,"
    " \"vocab_size\": 50, \"max_position_embeddings\": 32, \"rms_norm_eps\": 1e-5,"
    " \"initializer_range\": 0.5, \"tie_word_embeddings\": false}";

/* A linear larger than one fill chunk (MODEL_IMAGE_CHUNK values), whose numel is a multiple
 * of neither the chunk nor a block: up, gate and down are 520 x 2101 (1092520 values, 17071
 * blocks, the last of 40 values; 67 nested blocks, the last partial). */
static const char chunked_config[] =
    "{\"model_type\": \"llama\", \"hidden_size\": 520, \"intermediate_size\": 2101,"
    " \"num_hidden_layers\": 1, \"num_attention_heads\": 4, \"num_key_value_heads\": 2,"
    " \"vocab_size\": 64, \"max_position_embeddings\": 32, \"rms_norm_eps\": 1e-5,"
    " \"initializer_range\": 0.02, \"tie_word_embeddings\": false}";

static char dir[] = "/tmp/fsdp-test-image-XXXXXX";

static void *xcalloc(size_t n, size_t size) {
    void *p = calloc(n ? n : 1, size ? size : 1);
    assert_non_null(p);
    return p;
}

static void layout_of(llama_layout *lo, const char *json) {
    llama_config cfg;
    errbuf err;
    assert_int_equal(llama_config_parse(&cfg, json, strlen(json), "config", &err), 0);
    assert_int_equal(llama_layout_init(lo, &cfg, &err), 0);
}

static void *random_image(const llama_layout *lo, model_image_dtype dt, uint64_t seed) {
    void *image = malloc(model_image_bytes(lo, dt));
    errbuf err;
    assert_non_null(image);
    assert_int_equal(model_image_fill_random(image, lo, dt, seed, NULL, NULL, &err), 0);
    assert_int_equal(model_image_check(image, model_image_bytes(lo, dt), lo, &err), 0);
    return image;
}

/* An `fsdpctl init` checkpoint of config json (seed 11) in dir/name, opened. */
static void write_checkpoint(const char *json, const char *name, st_model *st) {
    char cfg_path[128], out[128], seed_arg[] = "11";
    snprintf(cfg_path, sizeof cfg_path, "%s/%s.json", dir, name);
    snprintf(out, sizeof out, "%s/%s", dir, name);
    FILE *f = fopen(cfg_path, "w");
    assert_non_null(f);
    fputs(json, f);
    assert_int_equal(fclose(f), 0);
    char *argv[] = {"init", "--model-config", cfg_path, "--out", out, "--seed", seed_arg, NULL};
    assert_int_equal(cmd_init(7, argv), 0);
    errbuf err = {{0}};
    if (st_model_open(st, out, &err)) fail_msg("%s", err.msg);
}

/* fsdpd's random init and `fsdpctl init` draw the same model for a seed. */
static void test_random_image_equals_fsdpctl_init(void **state) {
    (void)state;
    llama_layout lo;
    layout_of(&lo, small_config);
    st_model st;
    errbuf err;
    write_checkpoint(small_config, "model", &st);
    size_t n = model_image_bytes(&lo, MODEL_IMAGE_F32);
    void *from_files = malloc(n);
    assert_int_equal(model_image_fill_hf(from_files, &lo, MODEL_IMAGE_F32, &st, NULL, NULL, &err), 0);
    void *drawn = random_image(&lo, MODEL_IMAGE_F32, 11);
    assert_memory_equal(from_files, drawn, n);
    void *other_seed = random_image(&lo, MODEL_IMAGE_F32, 12);
    assert_true(memcmp(from_files, other_seed, n) != 0);

    /* Every tensor reads back as the checkpoint holds it; norms are 1. */
    for (int i = 0; i < lo.n_tensors; i++) {
        const llama_tensor_slot *s = &lo.tensors[i];
        float *a = malloc(s->numel * sizeof *a), *b = malloc(s->numel * sizeof *b);
        model_image_read_f32(drawn, &lo, s->unit, s->offset, s->numel, a);
        const st_tensor *t = llama_checkpoint_tensor(s, &st, &err);
        assert_non_null(t);
        assert_int_equal(st_read_f32(t, 0, s->numel, b, &err), 0);
        assert_memory_equal(a, b, s->numel * sizeof *a);
        if (s->is_norm) assert_true(a[0] == 1.0f);
        free(a);
        free(b);
    }
    st_model_close(&st);
    free(from_files);
    free(drawn);
    free(other_seed);
    llama_layout_free(&lo);
}

static void test_bf16_image_rounds(void **state) {
    (void)state;
    llama_layout lo;
    layout_of(&lo, small_config);
    void *f32 = random_image(&lo, MODEL_IMAGE_F32, 5), *bf16 = random_image(&lo, MODEL_IMAGE_BF16, 5);
    assert_true(model_image_bytes(&lo, MODEL_IMAGE_BF16) < model_image_bytes(&lo, MODEL_IMAGE_F32));
    const llama_tensor_slot *s = &lo.tensors[1]; /* layer 0 q_proj */
    float a[64], b[64];
    model_image_read_f32(f32, &lo, s->unit, s->offset + 3, 64, a);
    model_image_read_f32(bf16, &lo, s->unit, s->offset + 3, 64, b);
    for (int i = 0; i < 64; i++) assert_true(b[i] == bf16_to_f32(bf16_from_f32(a[i])));
    free(f32);
    free(bf16);
    llama_layout_free(&lo);
}

static void test_check_rejects_another_model(void **state) {
    (void)state;
    llama_layout lo, other;
    layout_of(&lo, small_config);
    layout_of(&other, "{\"hidden_size\": 24, \"intermediate_size\": 48, \"num_hidden_layers\": 2,"
                      " \"num_attention_heads\": 4, \"vocab_size\": 50,"
                      " \"max_position_embeddings\": 32, \"rms_norm_eps\": 1e-5}");
    void *image = random_image(&lo, MODEL_IMAGE_F32, 1);
    errbuf err;
    size_t n = model_image_bytes(&lo, MODEL_IMAGE_F32);
    assert_int_equal(model_image_check(image, n, &other, &err), -1);
    assert_non_null(strstr(err.msg, "model image"));
    assert_int_equal(model_image_check(image, n - 1, &lo, &err), -1);
    memcpy(image, "XXXX", 4);
    assert_int_equal(model_image_check(image, n, &lo, &err), -1);
    assert_non_null(strstr(err.msg, "bad header"));
    free(image);
    llama_layout_free(&lo);
    llama_layout_free(&other);
}

/* The memfd is sealed: no write, no resize, no writable mapping; readers see the image. */
static void test_shared_memory_is_sealed(void **state) {
    (void)state;
    llama_layout lo;
    layout_of(&lo, small_config);
    job_config job;
    job_defaults(&job);
    job.model.init = JOB_INIT_RANDOM;
    job.model.dtype = JOB_DTYPE_F32;
    job.train.seed = 9;
    int fd;
    size_t bytes;
    errbuf err;
    assert_int_equal(model_shm_create(&job, &lo, MODEL_IMAGE_PLAIN, 0, "fsdp-test-model", &fd, &bytes, &err), 0);
    assert_int_equal(bytes, model_image_bytes(&lo, MODEL_IMAGE_F32));
    char byte = 0;
    assert_int_equal(pwrite(fd, &byte, 1, 0), -1);
    assert_int_equal(errno, EPERM);
    assert_int_not_equal(ftruncate(fd, (off_t)bytes * 2), 0);
    assert_true(mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0) == MAP_FAILED);
    assert_true(fcntl(fd, F_GET_SEALS) & F_SEAL_WRITE);

    const void *image;
    size_t mapped;
    assert_int_equal(model_image_map(fd, &lo, &image, &mapped, &err), 0);
    void *want = random_image(&lo, MODEL_IMAGE_F32, 9);
    assert_memory_equal(image, want, bytes);
    munmap((void *)image, mapped);
    free(want);
    close(fd);
    llama_layout_free(&lo);
}

/* ---- NF4 images ---- */

/* Linear k of layer unit u: nf4_quantize of the whole tensor as the plain image holds it,
 * placed in dst (the unit's data) where model_image_nf4_layer says. */
static void reference_linear(unsigned char *dst, const void *plain, const llama_layout *lo, int u,
                             int k, const model_image_nf4_layer *nl, model_image_quant q) {
    const llama_tensor_slot *s = &lo->tensors[lo->units[u].first + k];
    st_dtype dtype = model_image_dtype_of(plain) == MODEL_IMAGE_BF16 ? ST_BF16 : ST_F32;
    int dq = q == MODEL_IMAGE_NF4_DQ;
    float *w = xcalloc(s->numel, sizeof *w);
    model_image_read_f32(plain, lo, u, s->offset, s->numel, w);
    nf4_tensor t;
    errbuf err = {{0}};
    if (nf4_quantize(w, dtype, s->ndim, s->shape, dq, &t, &err)) fail_msg("%s", err.msg);
    memcpy(dst + nl->packed + nl->t_packed[k], t.packed, nf4_packed_bytes(t.numel));
    if (dq) {
        memcpy(dst + nl->absmax + nl->t_block[k], t.absmax_q, t.n_blocks);
        memcpy(dst + nl->nested + nl->t_nested[k] * sizeof(float), t.nested_absmax, t.n_nested * sizeof(float));
        memcpy(dst + nl->offsets + (size_t)k * sizeof(float), &t.offset, sizeof(float));
    } else {
        memcpy(dst + nl->absmax + nl->t_block[k] * sizeof(float), t.absmax, t.n_blocks * sizeof(float));
    }
    nf4_free(&t);
    free(w);
}

/* The NF4 image of a plain image as whole-tensor quantization makes it: the linears through
 * nf4_quantize, the rest copied (the header, which the fill writes as it always has, is
 * taken from nf4). */
static unsigned char *nf4_reference(const void *plain, const void *nf4, const llama_layout *lo,
                                    model_image_quant q) {
    model_image_dtype dt = model_image_dtype_of(plain);
    size_t eb = dt == MODEL_IMAGE_BF16 ? 2 : 4;
    unsigned char *ref = xcalloc(1, model_image_bytes_q(lo, dt, q));
    memcpy(ref, nf4, (size_t)(model_image_unit(nf4, lo, 0) - (const unsigned char *)nf4));
    model_image_nf4_layer nl;
    model_image_nf4_layer_of(lo, dt, q, &nl);
    for (int u = 0; u < lo->n_units; u++) {
        unsigned char *dst = (unsigned char *)model_image_unit(ref, lo, u);
        const unsigned char *src = model_image_unit(plain, lo, u);
        if (u < llama_layer_unit(0) || u >= llama_layer_unit(lo->n_layers)) {
            memcpy(dst, src, lo->units[u].numel * eb);
            continue;
        }
        for (int k = 0; k < MODEL_IMAGE_LINEARS; k++) reference_linear(dst, plain, lo, u, k, &nl, q);
        for (int n = 0; n < 2; n++) { /* input_layernorm, post_attention_layernorm */
            const llama_tensor_slot *s = &lo->tensors[lo->units[u].first + LLAMA_LN1 + n];
            memcpy(dst + nl.norms + (size_t)n * s->numel * eb, src + s->offset * eb, s->numel * eb);
        }
    }
    return ref;
}

typedef struct progress_log {
    size_t calls, last, total;
    int backwards;
} progress_log;

static void log_progress(void *arg, size_t done, size_t total) {
    progress_log *p = arg;
    p->backwards |= done < p->last;
    p->calls++;
    p->last = done;
    p->total = total;
}

/* The NF4 image of the model in st (NULL: drawn) equals the reference made from the plain
 * image of the same model, and progress was reported. */
static void check_nf4_image(const llama_layout *lo, const st_model *st, model_image_dtype dt,
                            model_image_quant q) {
    errbuf err = {{0}};
    size_t bytes = model_image_bytes_q(lo, dt, q);
    void *plain = xcalloc(1, model_image_bytes(lo, dt)), *image = xcalloc(1, bytes);
    int rc = st ? model_image_fill_hf(plain, lo, dt, st, NULL, NULL, &err)
                : model_image_fill_random(plain, lo, dt, 7, NULL, NULL, &err);
    progress_log log = {0};
    if (rc || model_image_fill_nf4(image, lo, dt, q, st, 0, 7, log_progress, &log, &err) ||
        model_image_check(image, bytes, lo, &err))
        fail_msg("%s", err.msg);
    unsigned char *ref = nf4_reference(plain, image, lo, q);
    assert_memory_equal(image, ref, bytes);
    size_t eb = dt == MODEL_IMAGE_BF16 ? 2 : 4, model_bytes = 0;
    for (int u = 0; u < lo->n_units; u++) model_bytes += lo->units[u].numel * eb;
    assert_true(log.calls > 0 && !log.backwards);
    assert_int_equal(log.total, model_bytes);
    assert_true(log.last <= model_bytes);
    free(ref);
    free(plain);
    free(image);
}

/* The chunked fill gives the bytes whole-tensor quantization gives: the golden model (from
 * its checkpoint and drawn) and a model whose linears span chunks, in both dtypes, single and
 * double quantization. */
static void test_nf4_image_is_whole_tensor_quantization(void **state) {
    (void)state;
    llama_layout golden, chunked;
    llama_config cfg;
    st_model golden_st, chunked_st;
    errbuf err = {{0}};
    char path[700];
    fixture_path(path, sizeof path, "golden/tiny-mha");
    if (llama_config_load(&cfg, path, &err) || llama_layout_init(&golden, &cfg, &err) ||
        st_model_open(&golden_st, path, &err))
        fail_msg("%s", err.msg);
    layout_of(&chunked, chunked_config);
    write_checkpoint(chunked_config, "chunked", &chunked_st);
    const llama_tensor_slot *up = &chunked.tensors[chunked.units[llama_layer_unit(0)].first + LLAMA_UP];
    assert_true(up->numel > MODEL_IMAGE_CHUNK && up->numel % MODEL_IMAGE_CHUNK && up->numel % NF4_BLOCK);
    model_image_dtype dts[] = {MODEL_IMAGE_F32, MODEL_IMAGE_BF16};
    model_image_quant qs[] = {MODEL_IMAGE_NF4, MODEL_IMAGE_NF4_DQ};
    for (int d = 0; d < 2; d++)
        for (int q = 0; q < 2; q++) {
            check_nf4_image(&golden, &golden_st, dts[d], qs[q]);
            check_nf4_image(&golden, NULL, dts[d], qs[q]);
            check_nf4_image(&chunked, &chunked_st, dts[d], qs[q]);
            check_nf4_image(&chunked, NULL, dts[d], qs[q]);
        }
    st_model_close(&golden_st);
    st_model_close(&chunked_st);
    llama_layout_free(&golden);
    llama_layout_free(&chunked);
}

/* A few-hundred-MB model (350 MB in fp32: 3 layers, MLP linears of 8.4 M values). */
static const char memory_config[] =
    "{\"model_type\": \"llama\", \"hidden_size\": 1024, \"intermediate_size\": 8192,"
    " \"num_hidden_layers\": 3, \"num_attention_heads\": 8, \"num_key_value_heads\": 8,"
    " \"vocab_size\": 256, \"max_position_embeddings\": 32, \"rms_norm_eps\": 1e-5,"
    " \"initializer_range\": 0.02, \"tie_word_embeddings\": false}";

/* KiB of a /proc/self/status line ("VmRSS", "VmHWM"); 0 when unreadable. */
static size_t status_kib(const char *key) {
    FILE *f = fopen("/proc/self/status", "r");
    char line[256];
    size_t kib = 0, n = strlen(key);
    while (f && fgets(line, sizeof line, f))
        if (!strncmp(line, key, n) && line[n] == ':') kib = strtoull(line + n + 1, NULL, 10);
    if (f) fclose(f);
    return kib;
}

#define MEMORY_SLACK_MIB 16 /* thread stacks, malloc's arenas, libc */

/* The forked child's part: fills a double-quantized bf16 NF4 image of memory_config into a
 * shared mapping (as fsdpd's memfd) and returns 0 when the peak RSS grew by less than the
 * bound model_image.h states (beyond the image's own pages). */
static int fill_within_bound(void) {
    llama_layout lo;
    llama_config cfg;
    errbuf err = {{0}};
    if (llama_config_parse(&cfg, memory_config, strlen(memory_config), "config", &err) ||
        llama_layout_init(&lo, &cfg, &err))
        return printf("%s\n", err.msg), 3;
    size_t bytes = model_image_bytes_q(&lo, MODEL_IMAGE_BF16, MODEL_IMAGE_NF4_DQ);
    void *image = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (image == MAP_FAILED) return printf("mmap: %s\n", strerror(errno)), 3;
    size_t before = status_kib("VmRSS");
    if (model_image_fill_nf4(image, &lo, MODEL_IMAGE_BF16, MODEL_IMAGE_NF4_DQ, NULL, 0, 3, NULL, NULL, &err))
        return printf("%s\n", err.msg), 3;
    size_t peak = status_kib("VmHWM"), image_kib = (bytes + 1023) / 1024;
    size_t largest = (size_t)cfg.hidden_size * (size_t)cfg.intermediate_size;
    size_t bound_kib = (size_t)model_image_fill_threads() * (MODEL_IMAGE_CHUNK * 4 + largest / 16) / 1024 +
                       MEMORY_SLACK_MIB * 1024;
    size_t grew = peak > before + image_kib ? peak - before - image_kib : 0;
    size_t params = 0;
    for (int u = 0; u < lo.n_units; u++) params += lo.units[u].numel;
    printf("nf4 random fill of a %.0f MB (fp32) model: peak RSS +%zu KiB beyond the %zu KiB image"
           " (bound %zu KiB, %d threads)\n",
           (double)params * 4 / 1e6, grew, image_kib, bound_kib, model_image_fill_threads());
    return before && peak && grew < bound_kib ? 0 : 2;
}

/* model.init=random for an NF4 model never holds the model (or a whole linear) in fp32. */
static void test_nf4_random_fill_memory_is_bounded(void **state) {
    (void)state;
    fflush(stdout);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        int rc = fill_within_bound();
        fflush(stdout);
        _exit(rc);
    }
    int status;
    assert_int_equal(waitpid(pid, &status, 0), pid);
    assert_true(WIFEXITED(status));
    assert_int_equal(WEXITSTATUS(status), 0);
}

static int setup(void **state) {
    (void)state;
    return mkdtemp(dir) ? 0 : -1;
}

static int teardown(void **state) {
    (void)state;
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    return system(cmd) == 0 ? 0 : -1;
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_random_image_equals_fsdpctl_init),
        cmocka_unit_test(test_bf16_image_rounds),
        cmocka_unit_test(test_check_rejects_another_model),
        cmocka_unit_test(test_shared_memory_is_sealed),
        cmocka_unit_test(test_nf4_random_fill_memory_is_bounded),
        cmocka_unit_test(test_nf4_image_is_whole_tensor_quantization),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
