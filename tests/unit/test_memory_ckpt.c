/* Unit tests for daemon/memory_ckpt (in-memory checkpoints): the images a node opens (none when
 * off; an earlier launch's manifest removed by the leader), what a node holds for a run (each
 * file of its ranks whole in one of its writer's two images, the manifest's world the run's),
 * and how many images a rank keeps for the node's free memory. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmocka.h>

#include "base/fault.h"
#include "base/fileio.h"
#include "daemon/memory_ckpt.h"
#include "proto/ckpt.h"
#include "proto/model_layout.h"

static const char *model_json =
    "{\"model_type\": \"llama\", \"hidden_size\": 36, \"intermediate_size\": 70, \"num_hidden_layers\": 2,"
    " \"num_attention_heads\": 4, \"num_key_value_heads\": 2, \"head_dim\": 10, \"vocab_size\": 61,"
    " \"max_position_embeddings\": 64, \"rms_norm_eps\": 1e-5, \"rope_theta\": 10000.0}";

static char dir[] = "/tmp/fsdp-test-memory-XXXXXX";

typedef struct fixture {
    job_config job;
    llama_config cfg;
    ckpt_manifest m; /* 4 ranks, 2 a node, step 7 */
    memory_images im;
} fixture;

/* The memory manifest of step 7 of a 4-rank full fine-tune of the small model. */
static void write_manifest(fixture *x) {
    errbuf err = {""};
    llama_layout lo;
    ckpt_manifest *m = &x->m;
    memset(m, 0, sizeof *m);
    assert_int_equal(llama_layout_init(&lo, &x->cfg, &err), 0);
    assert_int_equal(ckpt_layout_from_slots(&m->layout, 4, lo.units, lo.n_units, lo.tensors, lo.n_tensors, &err), 0);
    llama_layout_free(&lo);
    m->step = m->optimizer_step = 7;
    m->global_batch = 4, m->global_sample = 28, m->world_size = 4;
    strcpy(m->sharding, "full_shard");
    m->train = (ckpt_train_settings){.lr = 1e-3, .betas = {0.9, 0.95}, .eps = 1e-8, .schedule = "constant",
                                     .warmup_round = "up", .total_steps = 20, .objective = "sft", .dpo_loss = "sigmoid"};
    m->model_config = json_loads(model_json, 0, NULL);
    m->files = calloc(4, sizeof *m->files);
    assert_non_null(m->files);
    for (int r = 0; r < 4; r++) {
        ckpt_file_header h;
        assert_int_equal(ckpt_plan(&h, &m->layout, r, 7, &err), 0);
        uint8_t *image = calloc(1, h.file_bytes);
        assert_non_null(image);
        ckpt_seal_image(image, &h);
        m->files[r] = (ckpt_file_entry){.rank = r, .bytes = h.file_bytes, .header_crc = h.crc};
        ckpt_file_name(m->files[r].name, sizeof m->files[r].name, r, 4);
        free(image);
        ckpt_file_header_free(&h);
    }
    char *text, path[600];
    assert_int_equal(ckpt_manifest_to_json(m, &text, &err), 0);
    snprintf(path, sizeof path, "%s/%s", dir, CKPT_MEMORY_MANIFEST);
    file_chunk c = {text, strlen(text)};
    assert_int_equal(file_write_atomic(path, &c, 1, &err), 0);
    free(text);
}

/* Image `slot` of place k holds file `file` sealed at `step` (the zero state). */
static void put_image(fixture *x, int k, int slot, int file, int64_t step) {
    errbuf err = {""};
    ckpt_file_header h;
    assert_int_equal(ckpt_plan(&h, &x->m.layout, file, step, &err), 0);
    uint8_t *image = calloc(1, h.file_bytes);
    assert_non_null(image);
    ckpt_seal_image(image, &h);
    int fd = x->im.fd[2 * k + slot];
    assert_int_equal(ftruncate(fd, 0), 0);
    assert_int_equal(pwrite(fd, image, h.file_bytes, 0), (ssize_t)h.file_bytes);
    free(image);
    ckpt_file_header_free(&h);
}

static int setup(void **state) {
    fixture *x = calloc(1, sizeof *x);
    errbuf err = {""};
    if (!x || !mkdtemp(dir)) return -1;
    job_defaults(&x->job);
    snprintf(x->job.checkpoint.dir, sizeof x->job.checkpoint.dir, "%s", dir);
    x->job.checkpoint.memory_interval_steps = 1;
    x->job.runtime.workers_per_node = 2;
    if (llama_config_parse(&x->cfg, model_json, strlen(model_json), "model", &err)) return -1;
    write_manifest(x);
    if (memory_ckpt_open(&x->job, 1, 2, &x->im, &err)) return -1; /* node 1: keeps the manifest */
    *state = x;
    return 0;
}

static int teardown(void **state) {
    fixture *x = *state;
    errbuf err;
    memory_ckpt_close(&x->im);
    ckpt_manifest_free(&x->m);
    file_remove_tree(dir, &err);
    free(x);
    return 0;
}

static void test_open(void **state) {
    fixture *x = *state;
    errbuf err = {""};
    assert_non_null(x->im.fd);
    for (int i = 0; i < 4; i++) {
        struct stat st;
        assert_int_equal(fstat(x->im.fd[i], &st), 0);
        assert_true(S_ISREG(st.st_mode));
    }
    job_config off = x->job;
    off.checkpoint.memory_interval_steps = 0;
    memory_images none;
    assert_int_equal(memory_ckpt_open(&off, 0, 2, &none, &err), 0);
    assert_null(none.fd);
    memory_ckpt_close(&none);
    char path[600];
    snprintf(path, sizeof path, "%s/%s", dir, CKPT_MEMORY_MANIFEST);
    assert_int_equal(access(path, F_OK), 0); /* a follower leaves it */
}

/* Node 1 of 2 (files 2 and 3): file 2 in place 0's first image, file 3 in place 1's second
 * with an older step in its first: held; a world of another size, a planned step it does not
 * hold, an image unsealed: not held. */
static void test_held(void **state) {
    fixture *x = *state;
    errbuf err = {""};
    assert_int_equal(memory_ckpt_held(&x->job, &x->im, 1, 4), -1); /* nothing in the images yet */
    put_image(x, 0, 0, 2, 7);
    put_image(x, 1, 0, 3, 6);
    assert_int_equal(memory_ckpt_held(&x->job, &x->im, 1, 4), -1); /* file 3 only of step 6 */
    put_image(x, 1, 1, 3, 7);
    assert_int_equal(memory_ckpt_held(&x->job, &x->im, 1, 4), 7);
    assert_int_equal(memory_ckpt_check(&x->job, &x->im, 1, 4, 7, &err), 0);
    assert_int_equal(memory_ckpt_check(&x->job, &x->im, 1, 4, 8, &err), -1);
    assert_non_null(strstr(err.msg, "not of the planned step 8"));
    assert_int_equal(memory_ckpt_held(&x->job, &x->im, 1, 6), -1);    /* another world */
    assert_int_equal(memory_ckpt_held(&x->job, &x->im, 0, 4), -1);    /* node 0's files are not here */
    put_image(x, 0, 1, 2, 5);                                         /* place 0's other image: older */
    assert_int_equal(memory_ckpt_held(&x->job, &x->im, 1, 4), 7);
    uint8_t zero[8] = {0};
    assert_int_equal(pwrite(x->im.fd[3], zero, sizeof zero, 0), (ssize_t)sizeof zero); /* unsealed */
    assert_int_equal(memory_ckpt_check(&x->job, &x->im, 1, 4, 7, &err), -1);
    assert_non_null(strstr(err.msg, "rank-00003-of-00004.bin"));
    job_config off = x->job;
    off.checkpoint.memory_interval_steps = 0;
    memory_images none = {.workers = 2};
    assert_int_equal(memory_ckpt_held(&off, &none, 1, 4), -1);
}

/* Two images a rank while twice the node's fit in half its free memory, one while once fits
 * in 80% of it, none past that. */
static void test_slots(void **state) {
    fixture *x = *state;
    errbuf err = {""};
    int slots = -1;
    assert_int_equal(fault_configure(NULL, &err), 0);
    assert_int_equal(memory_ckpt_slots(&x->job, &x->cfg, &x->im, 4, &slots, &err), 0);
    assert_int_equal(slots, 2);
    ckpt_file_header h;
    assert_int_equal(ckpt_plan(&h, &x->m.layout, 0, 0, &err), 0);
    uint64_t node = 2 * h.file_bytes, held = 0;
    ckpt_file_header_free(&h);
    put_image(x, 0, 0, 2, 7); /* one image held: counted as free */
    for (int i = 1; i < 4; i++) assert_int_equal(ftruncate(x->im.fd[i], 0), 0);
    struct stat st;
    assert_int_equal(fstat(x->im.fd[0], &st), 0);
    held = (uint64_t)st.st_blocks * 512;
    assert_true(held >= node / 2);
    char spec[64];
    int want[] = {2, 1, 1, 0};
    uint64_t have[] = {4 * node, 4 * node - 4096, 5 * node / 4 + 4, 5 * node / 4 - 4096};
    for (int i = 0; i < 4; i++) {
        snprintf(spec, sizeof spec, "host_memory=%llu", (unsigned long long)(have[i] - held));
        assert_int_equal(fault_configure(spec, &err), 0);
        assert_int_equal(memory_ckpt_slots(&x->job, &x->cfg, &x->im, 4, &slots, &err), 0);
        if (slots != want[i]) fail_msg("%llu bytes free: %d images, want %d", (unsigned long long)have[i], slots, want[i]);
    }
    assert_int_equal(fault_configure(NULL, &err), 0);
}

/* A launch's leader removes the memory manifest an earlier launch left. */
static void test_leader_removes_manifest(void **state) {
    fixture *x = *state;
    errbuf err = {""};
    char path[600];
    memory_images leader;
    snprintf(path, sizeof path, "%s/%s", dir, CKPT_MEMORY_MANIFEST);
    assert_int_equal(access(path, F_OK), 0);
    assert_int_equal(memory_ckpt_open(&x->job, 0, 2, &leader, &err), 0);
    assert_int_equal(access(path, F_OK), -1);
    memory_ckpt_close(&leader);
    assert_null(leader.fd);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_open),
        cmocka_unit_test(test_held),
        cmocka_unit_test(test_slots),
        cmocka_unit_test(test_leader_removes_manifest),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
