/* Unit tests for base/fileio's refusal of files that are not regular files, through every
 * reader of a user-given path: the job file, a model's config.json and safetensors files, a
 * token cache.  A FIFO with no writer used to block open() forever; an alarm turns such a
 * regression into a failure instead of a hang. */
#include <ftw.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmocka.h>

#include "base/fileio.h"
#include "proto/job.h"
#include "proto/model_config.h"
#include "proto/safetensors.h"
#include "proto/tokens.h"

#define HANG_SECONDS 10

static void on_alarm(int sig) {
    (void)sig;
    static const char msg[] = "test_fileio: timed out: opening or reading a FIFO blocked\n";
    if (write(STDERR_FILENO, msg, sizeof msg - 1) < 0) _exit(2);
    _exit(1);
}

typedef struct fixture {
    char dir[64];
    char fifo[128];
} fixture;

static int setup(void **state) {
    fixture *f = calloc(1, sizeof *f);
    if (!f) return -1;
    strcpy(f->dir, "/tmp/test_fileio_XXXXXX");
    if (!mkdtemp(f->dir)) return -1;
    snprintf(f->fifo, sizeof f->fifo, "%s/fifo", f->dir);
    if (mkfifo(f->fifo, 0600) != 0) return -1;
    signal(SIGALRM, on_alarm);
    alarm(HANG_SECONDS);
    *state = f;
    return 0;
}

static int remove_entry(const char *path, const struct stat *st, int type, struct FTW *ftw) {
    (void)st, (void)type, (void)ftw;
    return remove(path);
}

static int teardown(void **state) {
    fixture *f = *state;
    alarm(0);
    int rc = nftw(f->dir, remove_entry, 16, FTW_DEPTH | FTW_PHYS);
    free(f);
    return rc;
}

/* The call failed with a message naming the path and saying it is a FIFO. */
static void refused_as_fifo(int rc, const errbuf *err, const char *path) {
    if (rc == 0) fail_msg("%s (a FIFO) was accepted", path);
    if (!strstr(err->msg, path)) fail_msg("message \"%s\" does not name %s", err->msg, path);
    if (!strstr(err->msg, "is a FIFO, not a regular file"))
        fail_msg("message \"%s\" does not say it is a FIFO", err->msg);
}

/* A directory holding a FIFO named `name`, e.g. a model directory whose config.json is one. */
static void fifo_in_dir(const fixture *f, const char *sub, const char *name, char *dir,
                        size_t size) {
    snprintf(dir, size, "%s/%s", f->dir, sub);
    assert_int_equal(mkdir(dir, 0700), 0);
    char path[256];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    assert_int_equal(mkfifo(path, 0600), 0);
}

static void test_fileio_refuses_non_regular(void **state) {
    fixture *f = *state;
    errbuf err = {""};
    refused_as_fifo(file_open_regular(f->fifo, &err) >= 0 ? 0 : -1, &err, f->fifo);
    char *text = NULL;
    size_t len = 0;
    refused_as_fifo(file_read_all(f->fifo, 1024, &text, &len, &err), &err, f->fifo);
    assert_null(text);
    void *map = NULL;
    refused_as_fifo(file_map_readonly(f->fifo, &map, &len, &err), &err, f->fifo);
    assert_null(map);

    assert_int_equal(file_read_all(f->dir, 1024, &text, &len, &err), -1);
    assert_non_null(strstr(err.msg, "is a directory, not a regular file"));
    assert_int_equal(file_read_all("/dev/null", 1024, &text, &len, &err), -1);
    assert_non_null(strstr(err.msg, "/dev/null: is a character device"));

    /* A regular file is read as before, and blocking again after the check. */
    char path[128];
    snprintf(path, sizeof path, "%s/regular", f->dir);
    file_chunk c = {"hello", 5};
    if (file_write_atomic(path, &c, 1, &err)) fail_msg("%s", err.msg);
    if (file_read_all(path, 1024, &text, &len, &err)) fail_msg("%s", err.msg);
    assert_string_equal(text, "hello");
    free(text);
    if (file_map_readonly(path, &map, &len, &err)) fail_msg("%s", err.msg);
    assert_int_equal(len, 5);
    assert_memory_equal(map, "hello", 5);
    munmap(map, len);
}

static void test_job_file_fifo(void **state) {
    fixture *f = *state;
    job_config j;
    errbuf err = {""};
    refused_as_fifo(job_load(&j, f->fifo, &err), &err, f->fifo);
}

static void test_model_files_fifo(void **state) {
    fixture *f = *state;
    errbuf err = {""};
    llama_config c;
    refused_as_fifo(llama_config_load(&c, f->fifo, &err), &err, f->fifo);
    char dir[256], path[512];
    fifo_in_dir(f, "config_model", "config.json", dir, sizeof dir);
    snprintf(path, sizeof path, "%s/config.json", dir);
    refused_as_fifo(llama_config_load(&c, dir, &err), &err, path);

    st_file sf;
    refused_as_fifo(st_open(&sf, f->fifo, &err), &err, f->fifo);
    st_model m;
    fifo_in_dir(f, "single_model", "model.safetensors", dir, sizeof dir);
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    refused_as_fifo(st_model_open(&m, dir, &err), &err, path);
    fifo_in_dir(f, "sharded_model", "model.safetensors.index.json", dir, sizeof dir);
    snprintf(path, sizeof path, "%s/model.safetensors.index.json", dir);
    refused_as_fifo(st_model_open(&m, dir, &err), &err, path);
}

static void test_token_cache_fifo(void **state) {
    fixture *f = *state;
    errbuf err = {""};
    tok_cache c;
    refused_as_fifo(tok_open(&c, f->fifo, &err), &err, f->fifo);
    tok_source src;
    refused_as_fifo(tok_read_source(f->fifo, &src, &err), &err, f->fifo);
}

/* Appending (runtime.metrics) and reading a private file (the rendezvous file) refuse a FIFO
 * too, without blocking; a missing private file is 1, a regular one of mode 0644 refused. */
static void test_append_and_private_fifo(void **state) {
    fixture *f = *state;
    errbuf err = {""};
    refused_as_fifo(file_open_append(f->fifo, &err) >= 0 ? 0 : -1, &err, f->fifo);
    char *text = NULL;
    size_t len;
    assert_int_equal(file_read_private(f->fifo, 1024, &text, &len, &err), -1);
    assert_non_null(strstr(err.msg, "not trusted: a FIFO"));
    char path[128];
    snprintf(path, sizeof path, "%s/appended", f->dir);
    for (int i = 0; i < 2; i++) {
        int fd = file_open_append(path, &err);
        if (fd < 0) fail_msg("%s", err.msg);
        assert_int_equal(write(fd, "ab", 2), 2);
        close(fd);
    }
    assert_int_equal(file_read_all(path, 16, &text, &len, &err), 0);
    assert_string_equal(text, "abab");
    free(text);
    assert_int_equal(chmod(path, 0644), 0);
    assert_int_equal(file_read_private(path, 16, &text, &len, &err), -1);
    assert_non_null(strstr(err.msg, "not trusted: readable or writable by others (owner uid"));
    assert_int_equal(chmod(path, 0600), 0);
    assert_int_equal(file_read_private(path, 16, &text, &len, &err), 0);
    assert_string_equal(text, "abab");
    free(text);
    snprintf(path, sizeof path, "%s/absent", f->dir);
    assert_int_equal(file_read_private(path, 16, &text, &len, &err), 1);
}

/* file_copy: 1 for a missing source, the bytes copied, an existing target or a FIFO refused. */
static void test_file_copy(void **state) {
    fixture *f = *state;
    errbuf err = {""};
    char src[128], dst[128], missing[128];
    snprintf(src, sizeof src, "%s/src", f->dir);
    snprintf(dst, sizeof dst, "%s/dst", f->dir);
    snprintf(missing, sizeof missing, "%s/missing", f->dir);
    assert_int_equal(file_copy(missing, dst, &err), 1);
    file_chunk c = {"tokenizer", 9};
    if (file_write_atomic(src, &c, 1, &err)) fail_msg("%s", err.msg);
    if (file_copy(src, dst, &err)) fail_msg("%s", err.msg);
    char *text = NULL;
    size_t len = 0;
    if (file_read_all(dst, 1024, &text, &len, &err)) fail_msg("%s", err.msg);
    assert_string_equal(text, "tokenizer");
    free(text);
    assert_int_equal(file_copy(src, dst, &err), -1);
    assert_non_null(strstr(err.msg, "File exists"));
    refused_as_fifo(file_copy(f->fifo, missing, &err), &err, f->fifo);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_fileio_refuses_non_regular, setup, teardown),
        cmocka_unit_test_setup_teardown(test_file_copy, setup, teardown),
        cmocka_unit_test_setup_teardown(test_job_file_fifo, setup, teardown),
        cmocka_unit_test_setup_teardown(test_model_files_fifo, setup, teardown),
        cmocka_unit_test_setup_teardown(test_token_cache_fifo, setup, teardown),
        cmocka_unit_test_setup_teardown(test_append_and_private_fifo, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
