/* Unit tests for daemon/slurm: hostlist expansion (the expected lists are what Debian 12's
 * `scontrol show hostnames` prints; test_slurm_hostlists.sh compares with scontrol itself),
 * SLURM_TASKS_PER_NODE, and reading the environment. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "daemon/slurm.h"

static void expands_to(const char *list, const char *want) {
    char (*hosts)[SLURM_HOST_MAX];
    int n;
    errbuf err = {""};
    if (slurm_hostlist_expand(list, &hosts, &n, &err)) fail_msg("%s: %s", list, err.msg);
    char got[4096] = "";
    for (int i = 0; i < n; i++) {
        if (i) strcat(got, " ");
        strcat(got, hosts[i]);
    }
    free(hosts);
    if (strcmp(got, want)) fail_msg("%s: got '%s', want '%s'", list, got, want);
}

static void refused(const char *list, const char *want) {
    char (*hosts)[SLURM_HOST_MAX];
    int n;
    errbuf err = {""};
    if (slurm_hostlist_expand(list, &hosts, &n, &err) == 0) fail_msg("%s was accepted", list);
    if (!strstr(err.msg, want)) fail_msg("%s: '%s' lacks '%s'", list, err.msg, want);
}

static void test_hostlists(void **state) {
    (void)state;
    expands_to("n[01-3]", "n01 n02 n03");
    expands_to("n[9-011]", "n9 n10 n11");
    expands_to("a[0-1]b[2-3]", "a0b2 a0b3 a1b2 a1b3");
    expands_to("z[1-2]-[3-4]", "z1-3 z1-4 z2-3 z2-4");
    expands_to("n[1-2],n2", "n1 n2 n2");
    expands_to("n[1,3-4]", "n1 n3 n4");
    expands_to("n[001-3]", "n001 n002 n003");
    expands_to("n[1-2]x[3]", "n1x3 n2x3");
    expands_to("n[1-2][3-4]", "n13 n14 n23 n24");
    expands_to("n[1-2],m[5]", "n1 n2 m5");
    expands_to("gpu-node7", "gpu-node7");
    expands_to("n1,,n2", "n1 n2");
    expands_to(" n1", "n1");
    char (*hosts)[SLURM_HOST_MAX];
    int n;
    errbuf err;
    assert_int_equal(slurm_hostlist_expand("n[1-65536]", &hosts, &n, &err), 0);
    assert_int_equal(n, 65536);
    assert_string_equal(hosts[65535], "n65536");
    free(hosts);

    refused("n[3-1]", "invalid range '3-1'");
    refused("n[1-65537]", "invalid range '1-65537'");
    refused("n[1-40000],m[1-40000]", "more than 65536 hosts");
    refused("n[]", "invalid range ''");
    refused("n[a-b]", "invalid range 'a-b'");
    refused("n[1,]", "invalid range ''");
    refused("n[1-2]x", "text after the last ']'");
    refused("n[1-3", "unbalanced brackets");
    refused("n[1-2]][", "unbalanced brackets");
    refused("n]", "unbalanced brackets");
    refused("", "names no host");
    refused(",", "names no host");
}

/* The same lists through Debian's scontrol (slurm-client; it needs only a two-line
 * slurm.conf, no controller): every list it expands we expand alike, every list it calls
 * invalid we refuse.  Skipped, and counted, where scontrol is not installed. */
static void test_matches_scontrol(void **state) {
    (void)state;
    if (system("command -v scontrol > /dev/null 2>&1") != 0) {
        printf("scontrol is not installed (Debian's slurm-client): skipped\n");
        skip();
    }
    char conf[] = "/tmp/fsdp-slurm-conf-XXXXXX";
    int fd = mkstemp(conf);
    assert_true(fd >= 0);
    static const char text[] = "ClusterName=test\nSlurmctldHost=localhost\n";
    assert_int_equal(write(fd, text, sizeof text - 1), (ssize_t)(sizeof text - 1));
    close(fd);
    static const char *lists[] = {"n[01-3]", "n[9-011]", "a[0-1]b[2-3]", "z[1-2]-[3-4]", "n[1-2],n2",
                                  "n[1,3-4]", "n[001-3]", "n[1-2]x[3]", "n[1-2][3-4]", "host7",
                                  "n[3-1]", "n[1-65537]", "n[]", "n[a-b]", "n[1-2]x", "n[0-2],m"};
    for (size_t i = 0; i < sizeof lists / sizeof lists[0]; i++) {
        char cmd[512], out[4096] = "", line[256];
        snprintf(cmd, sizeof cmd, "SLURM_CONF=%s scontrol show hostnames '%s' 2>&1", conf, lists[i]);
        FILE *p = popen(cmd, "r");
        assert_non_null(p);
        while (fgets(line, sizeof line, p)) {
            line[strcspn(line, "\n")] = '\0';
            if (out[0]) strcat(out, " ");
            strncat(out, line, sizeof out - strlen(out) - 1);
        }
        pclose(p);
        if (strstr(out, "Invalid hostlist")) refused(lists[i], "hostlist");
        else expands_to(lists[i], out);
    }
    unlink(conf);
}

static void test_tasks_per_node(void **state) {
    (void)state;
    int t;
    errbuf err = {""};
    static const struct { const char *spec; int index, want; } ok[] = {
        {"8", 0, 8}, {"1(x2)", 1, 1}, {"8(x2),4", 1, 8}, {"8(x2),4", 2, 4}, {"2,3,4", 2, 4}};
    for (size_t i = 0; i < sizeof ok / sizeof ok[0]; i++) {
        if (slurm_tasks_on_node(ok[i].spec, ok[i].index, &t, &err)) fail_msg("%s: %s", ok[i].spec, err.msg);
        assert_int_equal(t, ok[i].want);
    }
    assert_int_equal(slurm_tasks_on_node("8(x2),4", 3, &t, &err), -1);
    assert_non_null(strstr(err.msg, "has no entry for node 3"));
    assert_int_equal(slurm_tasks_on_node("8(2)", 0, &t, &err), -1);
    assert_non_null(strstr(err.msg, "is not like '8(x2),4'"));
    assert_int_equal(slurm_tasks_on_node("x", 0, &t, &err), -1);
    assert_int_equal(slurm_tasks_on_node("0", 0, &t, &err), -1);
}

static void clear_env(void) {
    static const char *names[] = {"SLURM_JOB_ID", "SLURM_RESTART_COUNT", "SLURM_NNODES", "SLURM_JOB_NUM_NODES",
                                  "SLURM_NODEID", "SLURMD_NODENAME", "SLURM_JOB_NODELIST",
                                  "SLURM_TASKS_PER_NODE", "SLURM_GPUS_ON_NODE"};
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) unsetenv(names[i]);
}

static void env_refused(const char *name, const char *value, const char *want) {
    setenv(name, value, 1);
    slurm_env e;
    errbuf err = {""};
    if (slurm_env_read(&e, &err) == 0) fail_msg("%s=%s accepted", name, value);
    if (!strstr(err.msg, want)) fail_msg("%s=%s: '%s' lacks '%s'", name, value, err.msg, want);
}

static void test_environment(void **state) {
    (void)state;
    clear_env();
    slurm_env e;
    errbuf err = {""};
    assert_int_equal(slurm_env_read(&e, &err), 0);
    assert_false(e.in_slurm);
    assert_int_equal(e.nnodes, 1);
    assert_int_equal(e.gpus_on_node, -1);
    slurm_env_free(&e);

    setenv("SLURM_JOB_ID", "4242", 1);
    setenv("SLURM_JOB_NUM_NODES", "3", 1);
    setenv("SLURM_NODEID", "2", 1);
    setenv("SLURMD_NODENAME", "gpu03", 1);
    setenv("SLURM_JOB_NODELIST", "gpu[01-03]", 1);
    setenv("SLURM_TASKS_PER_NODE", "1(x3)", 1);
    setenv("SLURM_GPUS_ON_NODE", "8", 1);
    if (slurm_env_read(&e, &err)) fail_msg("%s", err.msg);
    assert_true(e.in_slurm);
    assert_string_equal(e.job_id, "4242");
    assert_false(e.restarted);
    assert_int_equal(e.restart_count, 0);
    assert_int_equal(e.nnodes, 3);
    assert_int_equal(e.node_id, 2);
    assert_string_equal(e.hosts[2], "gpu03");
    assert_string_equal(e.nodename, "gpu03");
    assert_int_equal(e.tasks_on_node, 1);
    assert_int_equal(e.gpus_on_node, 8);
    slurm_env_free(&e);
    setenv("SLURM_RESTART_COUNT", "2", 1);
    if (slurm_env_read(&e, &err)) fail_msg("%s", err.msg);
    assert_true(e.restarted);
    assert_int_equal(e.restart_count, 2);
    slurm_env_free(&e);

    env_refused("SLURM_RESTART_COUNT", "x", "SLURM_RESTART_COUNT 'x' is not an integer >= 0");
    setenv("SLURM_RESTART_COUNT", "0", 1);
    env_refused("SLURM_NODEID", "3", "SLURM_NODEID 3 is not below SLURM_NNODES 3");
    setenv("SLURM_NODEID", "2", 1);
    env_refused("SLURM_JOB_NODELIST", "gpu[01-02]", "names 2 hosts but SLURM_NNODES is 3");
    env_refused("SLURM_JOB_NODELIST", "gpu[02-01]", "SLURM_JOB_NODELIST: hostlist 'gpu[02-01]': invalid range");
    setenv("SLURM_JOB_NODELIST", "gpu[01-03]", 1);
    env_refused("SLURM_TASKS_PER_NODE", "1(x2)", "has no entry for node 2");
    setenv("SLURM_TASKS_PER_NODE", "1(x3)", 1);
    unsetenv("SLURM_NODEID");
    env_refused("SLURM_JOB_NUM_NODES", "3", "SLURM_NODEID is not: run fsdpd through srun");
    clear_env();
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_hostlists),
        cmocka_unit_test(test_matches_scontrol),
        cmocka_unit_test(test_tasks_per_node),
        cmocka_unit_test(test_environment),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
