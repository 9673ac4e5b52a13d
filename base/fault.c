/* fault: the test-only fault-injection table read from FSDP_FAULTS; see fault.h. */
#include "base/fault.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define MAX_FAULTS 16

/* Each point's name and the fields of its value: R rank, A action (one of `actions`),
 * N integer >= 1 (n? : optional last), S seconds >= 0, P path (the rest). */
static const struct point_spec {
    const char *name, *fields, *actions;
} specs[FAULT_POINTS] = {
    [FAULT_NAN_LOSS] = {"nan_loss", "RN", NULL},
    [FAULT_NAN_GRAD] = {"nan_grad", "RN", NULL},
    [FAULT_FINAL_PARAMS] = {"final_params", "P", NULL},
    [FAULT_WORKER] = {"worker", "RAn", "exit hang hang_on_stop"},
    [FAULT_CKPT_WRITE] = {"ckpt_write", "RAn", "stall die"},
    [FAULT_CKPT_REQUEST] = {"ckpt_request", "N", NULL},
    [FAULT_COMM_STALL] = {"comm_stall", "RNS", NULL},
    [FAULT_NCCL_HANG] = {"nccl_hang", "N", NULL},
    [FAULT_STEP_DELAY] = {"step_delay", "RS", NULL},
    [FAULT_FABRIC_ROOT] = {"fabric_root", "P", NULL},
    [FAULT_HOST_MEMORY] = {"host_memory", "N", NULL},
};

static fault table[MAX_FAULTS];
static int n_faults;

static int word_in(const char *w, const char *list) {
    size_t n = strlen(w);
    for (const char *p = list; (p = strstr(p, w)); p += n)
        if ((p == list || p[-1] == ' ') && (p[n] == ' ' || p[n] == '\0')) return 1;
    return 0;
}

/* One field of a value: a ':'-separated token (for P, the rest of the value). */
static int parse_field(fault *f, char kind, const char *tok, const struct point_spec *sp,
                       errbuf *err) {
    char *end;
    switch (kind) {
    case 'R': {
        long v = strtol(tok, &end, 10);
        if (*tok == '\0' || *end || v < 0 || v > 1 << 20) return errf(err, "'%s' is not a rank", tok);
        f->rank = (int)v;
        return 0;
    }
    case 'N':
    case 'n': {
        long long v = strtoll(tok, &end, 10);
        if (*tok == '\0' || *end || v < 1) return errf(err, "'%s' is not a positive integer", tok);
        f->n = v;
        return 0;
    }
    case 'S': {
        double v = strtod(tok, &end);
        if (*tok == '\0' || *end || !(v >= 0 && v <= 1e6)) return errf(err, "'%s' is not a number of seconds", tok);
        f->seconds = v;
        return 0;
    }
    case 'A':
        if (strlen(tok) >= sizeof f->action || !word_in(tok, sp->actions))
            return errf(err, "'%s' is not one of: %s", tok, sp->actions);
        strcpy(f->action, tok);
        return 0;
    case 'P':
        if (*tok == '\0' || strlen(tok) >= sizeof f->path) return errf(err, "a path is needed");
        strcpy(f->path, tok);
        return 0;
    }
    return errf(err, "bad field kind");
}

static int parse_value(fault *f, const struct point_spec *sp, char *value, errbuf *err) {
    char *p = value;
    for (const char *k = sp->fields; *k; k++) {
        if (*k == 'P') return p ? parse_field(f, 'P', p, sp, err) : errf(err, "a path is needed");
        if (!p) {
            if (*k == 'n') return 0;
            return errf(err, "too few fields (expected %s)", sp->fields);
        }
        char *colon = strchr(p, ':');
        if (colon) *colon = '\0';
        if (parse_field(f, *k, p, sp, err)) return -1;
        p = colon ? colon + 1 : NULL;
    }
    return p ? errf(err, "too many fields (expected %s)", sp->fields) : 0;
}

static int parse_entry(fault *f, char *entry, errbuf *err) {
    char *eq = strchr(entry, '=');
    if (!eq) return errf(err, "'%s' is not NAME=VALUE", entry);
    *eq = '\0';
    for (int p = 0; p < FAULT_POINTS; p++) {
        if (strcmp(entry, specs[p].name)) continue;
        memset(f, 0, sizeof *f);
        f->point = (fault_point)p;
        f->rank = -1;
        return parse_value(f, &specs[p], eq + 1, err) ? errprefix(err, "%s", entry) : 0;
    }
    return errf(err, "'%s' is not a fault point", entry);
}

int fault_configure(const char *spec, errbuf *err) {
    n_faults = 0;
    if (!spec || !*spec) return 0;
    char *copy = strdup(spec), *save = NULL;
    if (!copy) return errf(err, "FSDP_FAULTS: out of memory");
    int rc = 0, n = 0;
    static fault parsed[MAX_FAULTS];
    for (char *e = strtok_r(copy, ";", &save); e && rc == 0; e = strtok_r(NULL, ";", &save)) {
        if (n == MAX_FAULTS) rc = errf(err, "more than %d entries", MAX_FAULTS);
        else rc = parse_entry(&parsed[n++], e, err);
    }
    free(copy);
    if (rc) return errprefix(err, "FSDP_FAULTS");
    memcpy(table, parsed, (size_t)n * sizeof *table);
    n_faults = n;
    return 0;
}

int fault_init(errbuf *err) { return fault_configure(getenv("FSDP_FAULTS"), err); }

const fault *fault_get(fault_point p, int rank) {
    for (int i = 0; i < n_faults; i++)
        if (table[i].point == p && (table[i].rank < 0 || table[i].rank == rank)) return &table[i];
    return NULL;
}

int fault_once(const fault *f) {
    return __atomic_exchange_n(&((fault *)f)->fired, 1, __ATOMIC_ACQ_REL) == 0;
}

void fault_hang(void) {
    for (;;) pause();
}
