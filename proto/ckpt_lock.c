/* ckpt_lock: the checkpoint directory's lock file.  See ckpt_lock.h. */
#include "ckpt_lock.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <jansson.h>

int ckpt_lock_to_json(const ckpt_lock_holder *h, char **text, errbuf *err) {
    json_t *o = json_pack("{s:s, s:i, s:s, s:s, s:i, s:I, s:s, s:I}", "format", CKPT_LOCK_FORMAT, "version",
                          CKPT_LOCK_VERSION, "job_id", h->job_id, "host", h->host, "pid", h->pid, "start_time",
                          (json_int_t)h->start_time, "boot_id", h->boot_id, "started", (json_int_t)h->started);
    *text = o ? json_dumps(o, JSON_COMPACT | JSON_PRESERVE_ORDER) : NULL;
    json_decref(o);
    return *text ? 0 : errf(err, "lock file: out of memory (or a name that is not UTF-8)");
}

static int get_text(const json_t *o, const char *key, char *out, size_t n, const char *name, errbuf *err) {
    const char *s = json_string_value(json_object_get(o, key));
    if (!s) return errf(err, "%s: \"%s\": missing or not a string", name, key);
    if (strlen(s) >= n) return errf(err, "%s: \"%s\": longer than %zu bytes", name, key, n - 1);
    strcpy(out, s);
    return 0;
}

static int get_count(const json_t *o, const char *key, long long max, long long *out, const char *name,
                     errbuf *err) {
    const json_t *v = json_object_get(o, key);
    if (!json_is_integer(v)) return errf(err, "%s: \"%s\": missing or not an integer", name, key);
    if (json_integer_value(v) < 0 || json_integer_value(v) > max)
        return errf(err, "%s: \"%s\": %lld is out of range", name, key, (long long)json_integer_value(v));
    *out = json_integer_value(v);
    return 0;
}

static int check_keys(const json_t *o, const char *name, errbuf *err) {
    static const char *const known[] = {"format", "version", "job_id", "host", "pid", "start_time", "boot_id",
                                        "started"};
    const char *key;
    json_t *v;
    json_object_foreach((json_t *)o, key, v) {
        size_t i = 0;
        while (i < sizeof known / sizeof known[0] && strcmp(known[i], key)) i++;
        if (i == sizeof known / sizeof known[0]) return errf(err, "%s: unknown key \"%s\"", name, key);
    }
    return 0;
}

static int read_holder(ckpt_lock_holder *h, const json_t *o, const char *name, errbuf *err) {
    char format[16];
    long long version, pid, start, started;
    if (!json_is_object(o)) return errf(err, "%s: not a JSON object", name);
    if (check_keys(o, name, err) || get_text(o, "format", format, sizeof format, name, err)) return -1;
    if (strcmp(format, CKPT_LOCK_FORMAT)) return errf(err, "%s: \"format\" is not \"%s\"", name, CKPT_LOCK_FORMAT);
    if (get_count(o, "version", 1000, &version, name, err)) return -1;
    if (version != CKPT_LOCK_VERSION)
        return errf(err, "%s: version %lld (this build reads %d)", name, version, CKPT_LOCK_VERSION);
    if (get_text(o, "job_id", h->job_id, sizeof h->job_id, name, err) ||
        get_text(o, "host", h->host, sizeof h->host, name, err) ||
        get_text(o, "boot_id", h->boot_id, sizeof h->boot_id, name, err) ||
        get_count(o, "pid", 0x7fffffff, &pid, name, err) ||
        get_count(o, "start_time", INT64_MAX, &start, name, err) ||
        get_count(o, "started", INT64_MAX, &started, name, err))
        return -1;
    if (pid < 1 || !h->host[0]) return errf(err, "%s: no holder (pid %lld, host \"%s\")", name, pid, h->host);
    h->pid = (int)pid;
    h->start_time = (uint64_t)start;
    h->started = started;
    return 0;
}

int ckpt_lock_parse(ckpt_lock_holder *h, const char *text, size_t len, const char *name, errbuf *err) {
    memset(h, 0, sizeof *h);
    if (len > CKPT_LOCK_MAX) return errf(err, "%s: %zu bytes, more than a lock file holds", name, len);
    json_error_t je;
    json_t *o = json_loadb(text, len, JSON_REJECT_DUPLICATES, &je);
    if (!o) return errf(err, "%s: not JSON (%s)", name, je.text);
    int rc = read_holder(h, o, name, err);
    json_decref(o);
    if (rc) memset(h, 0, sizeof *h);
    return rc;
}

void ckpt_lock_describe(const ckpt_lock_holder *h, char *out, size_t n) {
    char when[64] = "?";
    time_t t = (time_t)h->started;
    struct tm tm;
    if (gmtime_r(&t, &tm)) strftime(when, sizeof when, "%Y-%m-%d %H:%M:%S UTC", &tm);
    snprintf(out, n, "%s%s%shost %s, pid %d, since %s", h->job_id[0] ? "SLURM job " : "", h->job_id,
             h->job_id[0] ? ", " : "", h->host, h->pid, when);
}
