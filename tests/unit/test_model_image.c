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
#include <unistd.h>

#include <cmocka.h>

#include "base/bf16.h"
#include "daemon/fsdpctl.h"
#include "daemon/model_shm.h"
#include "proto/model_image.h"

static const char small_config[] =
    "{\"model_type\": \"llama\", \"hidden_size\": 24, \"intermediate_size\": 40,"
    " \"num_hidden_layers\": 2, \"num_attention_heads\": 4, \"num_key_value_heads\": 2,"
    " \"vocab_size\": 50, \"max_position_embeddings\": 32, \"rms_norm_eps\": 1e-5,"
    " \"initializer_range\": 0.5, \"tie_word_embeddings\": false}";

static char dir[] = "/tmp/fsdp-test-image-XXXXXX";

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

/* fsdpd's random init and `fsdpctl init` draw the same model for a seed. */
static void test_random_image_equals_fsdpctl_init(void **state) {
    (void)state;
    char cfg_path[128], out[128], seed_arg[] = "11";
    snprintf(cfg_path, sizeof cfg_path, "%s/config.json", dir);
    snprintf(out, sizeof out, "%s/model", dir);
    FILE *f = fopen(cfg_path, "w");
    assert_non_null(f);
    fputs(small_config, f);
    fclose(f);
    char *argv[] = {"init", "--model-config", cfg_path, "--out", out, "--seed", seed_arg, NULL};
    assert_int_equal(cmd_init(7, argv), 0);

    llama_layout lo;
    layout_of(&lo, small_config);
    st_model st;
    errbuf err;
    assert_int_equal(st_model_open(&st, out, &err), 0);
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
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
