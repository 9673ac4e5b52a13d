/* Unit tests for daemon/host_memory: this machine's figure (MemAvailable or a cgroup's
 * headroom: more than nothing, less than MemTotal), and the fault point standing in for it. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <cmocka.h>

#include "base/fault.h"
#include "daemon/host_memory.h"

static uint64_t mem_total(void) {
    FILE *f = fopen("/proc/meminfo", "r");
    assert_non_null(f);
    unsigned long long kb = 0;
    char line[256];
    while (fgets(line, sizeof line, f))
        if (sscanf(line, "MemTotal: %llu kB", &kb) == 1) break;
    fclose(f);
    return (uint64_t)kb * 1024;
}

static void test_this_machine(void **state) {
    (void)state;
    errbuf err = {""};
    assert_int_equal(fault_configure(NULL, &err), 0);
    uint64_t bytes = 0;
    const char *source = NULL;
    if (host_memory_available(&bytes, &source, &err)) fail_msg("%s", err.msg);
    assert_true(!strcmp(source, "MemAvailable") || !strcmp(source, "the cgroup's memory limit"));
    assert_true(bytes > 0 && bytes <= mem_total());
}

static void test_fault_stands_in(void **state) {
    (void)state;
    errbuf err = {""};
    assert_int_equal(fault_configure("host_memory=4096", &err), 0);
    uint64_t bytes = 0;
    const char *source = NULL;
    assert_int_equal(host_memory_available(&bytes, &source, &err), 0);
    assert_int_equal(bytes, 4096);
    assert_string_equal(source, "FSDP_FAULTS host_memory");
    assert_int_not_equal(fault_configure("host_memory=0", &err), 0);
    assert_non_null(strstr(err.msg, "is not a positive integer"));
    assert_int_equal(fault_configure(NULL, &err), 0);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_this_machine),
        cmocka_unit_test(test_fault_stands_in),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
