/* slurm: SLURM's environment (job, nodes, hostlists, tasks) and scontrol; see slurm.h. */
#include "daemon/slurm.h"

#include <ctype.h>
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <fcntl.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

/* ---- hostlists ---- */

typedef struct host_buf {
    char (*v)[SLURM_HOST_MAX];
    int n, cap;
} host_buf;

static int push_host(host_buf *b, const char *name, const char *list, errbuf *err) {
    if (b->n == SLURM_MAX_HOSTS) return errf(err, "hostlist '%.64s': more than %d hosts", list, SLURM_MAX_HOSTS);
    if (strlen(name) >= SLURM_HOST_MAX) return errf(err, "hostlist '%.64s': a host name is too long", list);
    if (b->n == b->cap) {
        int cap = b->cap ? 2 * b->cap : 16;
        void *v = realloc(b->v, (size_t)cap * sizeof *b->v);
        if (!v) return errf(err, "hostlist: out of memory");
        b->v = v, b->cap = cap;
    }
    strcpy(b->v[b->n++], name);
    return 0;
}

/* One range of a bracket group: "7" or "01-03"; *width is the first bound's digit count. */
static int parse_range(const char *s, size_t len, long *lo, long *hi, int *width) {
    char buf[32];
    if (len == 0 || len >= sizeof buf) return -1;
    memcpy(buf, s, len);
    buf[len] = '\0';
    char *dash = strchr(buf, '-'), *end;
    if (dash) *dash = '\0';
    if (!isdigit((unsigned char)buf[0])) return -1;
    *lo = strtol(buf, &end, 10);
    if (*end) return -1;
    *width = (int)strlen(buf);
    *hi = *lo;
    if (dash) {
        if (!isdigit((unsigned char)dash[1])) return -1;
        *hi = strtol(dash + 1, &end, 10);
        if (*end) return -1;
    }
    return *lo <= *hi && *hi - *lo < SLURM_MAX_HOSTS ? 0 : -1;
}

/* Expands entry[at..] after `name` (what the earlier groups gave) into b, recursively: the
 * text up to the next '[' is appended, then every value of that group in turn. */
static int expand_from(const char *entry, size_t at, char *name, size_t name_len, host_buf *b,
                       const char *list, errbuf *err) {
    const char *open = strchr(entry + at, '[');
    if (!open) {
        if (strchr(entry + at, ']'))
            return errf(err, "hostlist '%.64s': unbalanced brackets in '%.64s'", list, entry);
        if (at > 0 && entry[at]) /* as SLURM: "n[1-2]x" is not a hostlist */
            return errf(err, "hostlist '%.64s': text after the last ']' in '%.64s'", list, entry);
        if (name_len + strlen(entry + at) >= SLURM_HOST_MAX)
            return errf(err, "hostlist '%.64s': a host name is too long", list);
        strcpy(name + name_len, entry + at);
        return push_host(b, name, list, err);
    }
    size_t text = (size_t)(open - (entry + at));
    const char *close = strchr(open, ']');
    if (!close || memchr(entry + at, ']', text) || memchr(open + 1, '[', (size_t)(close - open - 1)))
        return errf(err, "hostlist '%.64s': unbalanced brackets in '%.64s'", list, entry);
    if (name_len + text >= SLURM_HOST_MAX) return errf(err, "hostlist '%.64s': a host name is too long", list);
    memcpy(name + name_len, entry + at, text);
    name_len += text;
    for (const char *r = open + 1; r <= close;) { /* every ','-separated range, empty ones too */
        const char *comma = memchr(r, ',', (size_t)(close - r));
        size_t len = (size_t)((comma ? comma : close) - r);
        long lo, hi;
        int width;
        if (parse_range(r, len, &lo, &hi, &width))
            return errf(err, "hostlist '%.64s': invalid range '%.*s'", list, (int)len, r);
        for (long v = lo; v <= hi; v++) {
            int n = snprintf(name + name_len, SLURM_HOST_MAX - name_len, "%0*ld", width, v);
            if (n < 0 || name_len + (size_t)n >= SLURM_HOST_MAX)
                return errf(err, "hostlist '%.64s': a host name is too long", list);
            if (expand_from(entry, (size_t)(close + 1 - entry), name, name_len + (size_t)n, b, list, err))
                return -1;
        }
        r += len + 1;
    }
    return 0;
}

/* The top-level entries: commas outside brackets separate them; blanks and empty entries
 * are skipped. */
int slurm_hostlist_expand(const char *list, char (**hosts)[SLURM_HOST_MAX], int *n, errbuf *err) {
    host_buf b = {0};
    size_t len = strlen(list);
    char *entry = malloc(len + 1), name[SLURM_HOST_MAX];
    int rc = entry ? 0 : errf(err, "hostlist: out of memory");
    for (size_t i = 0; rc == 0 && i <= len;) {
        size_t j = i;
        int depth = 0;
        while (j < len && (depth > 0 || list[j] != ',')) {
            depth += list[j] == '[' ? 1 : list[j] == ']' ? -1 : 0;
            j++;
        }
        size_t k = 0;
        for (size_t p = i; p < j; p++)
            if (!isspace((unsigned char)list[p])) entry[k++] = list[p];
        entry[k] = '\0';
        if (k > 0) rc = expand_from(entry, 0, name, 0, &b, list, err);
        i = j + 1;
    }
    free(entry);
    if (rc == 0 && b.n == 0) rc = errf(err, "hostlist '%.64s' names no host", list);
    if (rc) {
        free(b.v);
        return -1;
    }
    *hosts = b.v;
    *n = b.n;
    return 0;
}

/* ---- tasks per node ---- */

int slurm_tasks_on_node(const char *spec, int index, int *tasks, errbuf *err) {
    const char *p = spec;
    int node = 0;
    while (*p) {
        char *end;
        long count = strtol(p, &end, 10), repeat = 1;
        if (end == p || count < 1 || count > INT_MAX) break;
        p = end;
        if (*p == '(') {
            if (p[1] != 'x') break;
            repeat = strtol(p + 2, &end, 10);
            if (end == p + 2 || *end != ')' || repeat < 1) break;
            p = end + 1;
        }
        if (index < node + repeat) {
            *tasks = (int)count;
            return 0;
        }
        node += (int)repeat;
        if (*p == ',') p++;
        else if (*p) break;
    }
    if (*p) return errf(err, "SLURM_TASKS_PER_NODE '%.64s' is not like '8(x2),4'", spec);
    return errf(err, "SLURM_TASKS_PER_NODE '%.64s' has no entry for node %d", spec, index);
}

/* ---- the environment ---- */

static int env_int(const char *name, int min, int *out, bool *present, errbuf *err) {
    const char *s = getenv(name);
    *present = s != NULL;
    if (!s) return 0;
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (*s == '\0' || *end || errno || v < min || v > INT_MAX)
        return errf(err, "%s '%.64s' is not an integer >= %d", name, s, min);
    *out = (int)v;
    return 0;
}

static int env_str(const char *name, char *out, size_t size, errbuf *err) {
    const char *s = getenv(name);
    if (!s) return 0;
    if (strlen(s) >= size) return errf(err, "%s is longer than %zu bytes", name, size - 1);
    strcpy(out, s);
    return 0;
}

static int read_nodes(slurm_env *e, errbuf *err) {
    bool have_n, have_id, have_job_n, have_gpus;
    int job_n = 0;
    if (env_int("SLURM_NNODES", 1, &e->nnodes, &have_n, err) ||
        env_int("SLURM_JOB_NUM_NODES", 1, &job_n, &have_job_n, err) ||
        env_int("SLURM_NODEID", 0, &e->node_id, &have_id, err) ||
        env_int("SLURM_GPUS_ON_NODE", 0, &e->gpus_on_node, &have_gpus, err))
        return -1;
    if (!have_gpus) e->gpus_on_node = -1;
    if (!have_n && have_job_n) e->nnodes = job_n;
    if (!have_n && !have_job_n) return errf(err, "SLURM_JOB_ID is set but SLURM_NNODES is not: run fsdpd through srun");
    if (!have_id) return errf(err, "SLURM_JOB_ID is set but SLURM_NODEID is not: run fsdpd through srun");
    if (e->node_id >= e->nnodes)
        return errf(err, "SLURM_NODEID %d is not below SLURM_NNODES %d", e->node_id, e->nnodes);
    return 0;
}

int slurm_env_read(slurm_env *e, errbuf *err) {
    memset(e, 0, sizeof *e);
    e->nnodes = 1;
    e->gpus_on_node = -1;
    const char *job = getenv("SLURM_JOB_ID");
    if (!job) {
        /* srun always sets the job id: node counts without it are a broken environment, and
         * running one world per node on it would be worse. */
        static const char *const counts[] = {"SLURM_NNODES", "SLURM_JOB_NUM_NODES"};
        for (size_t i = 0; i < sizeof counts / sizeof counts[0]; i++)
            if (getenv(counts[i])) return errf(err, "%s is set but SLURM_JOB_ID is not", counts[i]);
        return 0;
    }
    e->in_slurm = true;
    int rc = env_str("SLURM_JOB_ID", e->job_id, sizeof e->job_id, err);
    if (rc == 0) rc = env_int("SLURM_RESTART_COUNT", 0, &e->restart_count, &e->restarted, err);
    if (rc == 0) rc = env_str("SLURM_STEP_ID", e->step_id, sizeof e->step_id, err);
    if (rc == 0) rc = read_nodes(e, err);
    if (rc == 0) rc = env_str("SLURMD_NODENAME", e->nodename, sizeof e->nodename, err);
    const char *list = getenv("SLURM_JOB_NODELIST");
    if (rc == 0 && !list) rc = errf(err, "SLURM_JOB_ID is set but SLURM_JOB_NODELIST is not: run fsdpd through srun");
    if (rc == 0 && slurm_hostlist_expand(list, &e->hosts, &e->n_hosts, err)) rc = errprefix(err, "SLURM_JOB_NODELIST");
    if (rc == 0 && e->n_hosts != e->nnodes)
        rc = errf(err, "SLURM_JOB_NODELIST names %d hosts but SLURM_NNODES is %d", e->n_hosts, e->nnodes);
    const char *tasks = getenv("SLURM_TASKS_PER_NODE");
    if (rc == 0 && tasks) rc = slurm_tasks_on_node(tasks, e->node_id, &e->tasks_on_node, err);
    if (rc) slurm_env_free(e);
    return rc;
}

void slurm_env_free(slurm_env *e) {
    free(e->hosts);
    e->hosts = NULL;
    e->n_hosts = 0;
}

/* ---- scontrol ---- */

extern char **environ;

/* Reads fd to its end: the first n - 1 bytes into out, NUL-terminated; the rest dropped. */
static void read_output(int fd, char *out, size_t n) {
    size_t have = 0;
    for (;;) {
        char sink[512];
        int keep = have + 1 < n;
        ssize_t got = read(fd, keep ? out + have : sink, keep ? n - 1 - have : sizeof sink);
        if (got == 0 || (got < 0 && errno != EINTR)) break;
        if (got > 0 && keep) have += (size_t)got;
    }
    out[have] = '\0';
}

int slurm_scontrol(char *const argv[], char *out, size_t n, errbuf *err) {
    int fds[2];
    if (pipe2(fds, O_CLOEXEC) != 0) return errf(err, "pipe: %s", strerror(errno));
    posix_spawn_file_actions_t fa;
    pid_t pid;
    int rc = posix_spawn_file_actions_init(&fa);
    if (rc == 0) {
        rc = posix_spawn_file_actions_adddup2(&fa, fds[1], STDOUT_FILENO);
        if (rc == 0) rc = posix_spawn_file_actions_adddup2(&fa, fds[1], STDERR_FILENO);
        if (rc == 0) rc = posix_spawnp(&pid, "scontrol", &fa, NULL, argv, environ);
        posix_spawn_file_actions_destroy(&fa);
    }
    close(fds[1]);
    if (rc) {
        close(fds[0]);
        return errf(err, "cannot run scontrol: %s", strerror(rc));
    }
    read_output(fds[0], out, n);
    close(fds[0]);
    int status;
    while (waitpid(pid, &status, 0) < 0)
        if (errno != EINTR) return errf(err, "waiting for scontrol: %s", strerror(errno));
    if (WIFEXITED(status) && WEXITSTATUS(status) == 0) return 0;
    if (WIFEXITED(status)) return errf(err, "scontrol %s %s exited %d", argv[1], argv[2], WEXITSTATUS(status));
    return errf(err, "scontrol %s %s was killed by signal %d", argv[1], argv[2], WTERMSIG(status));
}

/* One field of `scontrol show job -o ID` (JobState=RUNNING, Restarts=1, ...). */
static int job_field(const char *text, const char *job_id, const char *name, char *out, size_t n, errbuf *err) {
    char key[32];
    snprintf(key, sizeof key, " %s=", name);
    const char *at = strstr(text, key);
    if (!at) return errf(err, "scontrol show job %s: no %s", job_id, name);
    at += strlen(key);
    size_t len = strcspn(at, " \n");
    if (len == 0 || len >= n) return errf(err, "scontrol show job %s: a malformed %s", job_id, name);
    memcpy(out, at, len);
    out[len] = '\0';
    return 0;
}

int slurm_job_query(const char *job_id, char *state, size_t n, int *restarts, errbuf *err) {
    char *argv[] = {"scontrol", "show", "job", "-o", (char *)job_id, NULL}, text[8192], count[16];
    text[1] = '\0'; /* what scontrol said, if it ran */
    if (slurm_scontrol(argv, text + 1, sizeof text - 1, err)) return strstr(text + 1, "Invalid job id") ? 1 : -1;
    text[0] = ' '; /* every field then follows a space */
    if (job_field(text, job_id, "JobState", state, n, err)) return -1;
    *restarts = -1;
    if (!strstr(text, " Restarts=")) return 0; /* older or trimmed output: unknown */
    if (job_field(text, job_id, "Restarts", count, sizeof count, err)) return -1;
    char *end;
    long v = strtol(count, &end, 10);
    if (*end || v < 0 || v > INT_MAX) return errf(err, "scontrol show job %s: Restarts=%s is not a count", job_id, count);
    *restarts = (int)v;
    return 0;
}
