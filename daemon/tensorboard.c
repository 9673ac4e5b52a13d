/* tensorboard: the leader's TensorBoard event file; see tensorboard.h. */
#include "daemon/tensorboard.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/time.h>
#include <unistd.h>

#include "base/fileio.h"
#include "base/path.h"
#include "daemon/step_scalars.h"
#include "proto/tb_event.h"

struct tb_writer {
    int fd;
    char path[PATH_BYTES];
};

static double wall_time(void) {
    struct timeval tv;
    gettimeofday(&tv, NULL);
    return (double)tv.tv_sec + tv.tv_usec / 1e6;
}

/* The records in b to the file, at once: TensorBoard reads a file as it grows. */
static int write_out(tb_writer *w, tb_buf *b, int rc, errbuf *err) {
    if (rc == 0) rc = file_write_full(w->fd, b->data, b->len, w->path, err);
    tb_buf_free(b);
    return rc;
}

/* The job as a JSON code block (TensorBoard's text plugin renders markdown). */
static int job_text(const job_config *j, tb_buf *out, double t, int64_t step, errbuf *err) {
    json_t *o = job_to_object(j, err);
    char *json = o ? json_dumps(o, JSON_INDENT(2)) : NULL;
    json_decref(o);
    if (!json) return o ? errf(err, "out of memory") : -1;
    size_t n = strlen(json) + 16;
    char *text = malloc(n);
    int rc = text ? 0 : errf(err, "out of memory");
    if (text) snprintf(text, n, "```json\n%s\n```", json);
    if (rc == 0) rc = tb_record_text(out, t, step, "job", text, strlen(text), err);
    free(text);
    free(json);
    return rc;
}

int tb_writer_open(tb_writer **out, const job_config *j, int restart, int64_t first_step, errbuf *err) {
    *out = NULL;
    char dir[PATH_BYTES], host[256] = "localhost", name[512];
    if (path_join(dir, sizeof dir, j->output.dir, "tensorboard", err) || file_mkdir_p(dir, err))
        return errprefix(err, "runtime.log_to tensorboard");
    if (gethostname(host, sizeof host - 1) != 0) snprintf(host, sizeof host, "localhost");
    double t = wall_time();
    snprintf(name, sizeof name, "events.out.tfevents.%010lld.%s.%d.%d", (long long)t, host, (int)getpid(), restart);
    tb_writer *w = calloc(1, sizeof *w);
    if (!w) return errf(err, "out of memory");
    if (path_join(w->path, sizeof w->path, dir, name, err)) {
        free(w);
        return errprefix(err, "runtime.log_to tensorboard");
    }
    w->fd = open(w->path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
    if (w->fd < 0) {
        errf(err, "runtime.log_to tensorboard: %s: %s", w->path, strerror(errno));
        free(w);
        return -1;
    }
    tb_buf b = {0};
    int rc = tb_record_file_version(&b, t, err) || tb_record_session_start(&b, t, first_step, err) ||
             job_text(j, &b, t, first_step, err);
    if (write_out(w, &b, rc, err)) {
        tb_writer_close(w);
        return errprefix(err, "runtime.log_to tensorboard");
    }
    *out = w;
    return 0;
}

int tb_writer_step(tb_writer *w, const msg_metrics *m, errbuf *err) {
    step_scalar v[STEP_SCALARS_MAX];
    tb_scalar s[STEP_SCALARS_MAX];
    size_t n = step_scalars(m, v);
    for (size_t i = 0; i < n; i++) s[i] = (tb_scalar){v[i].name, (float)v[i].value};
    tb_buf b = {0};
    return write_out(w, &b, tb_record_scalars(&b, wall_time(), m->step, s, n, err), err);
}

const char *tb_writer_path(const tb_writer *w) { return w->path; }

void tb_writer_close(tb_writer *w) {
    if (!w) return;
    if (w->fd >= 0) close(w->fd);
    free(w);
}
