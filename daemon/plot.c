/* plot: a metrics file's loss, learning rate, tokens/s and the eval loss over the
 * steps of a metrics file (runtime.metrics: one JSON object per step with "step", "loss", "lr",
 * "tokens", "seconds", "eval_loss" after an evaluation), drawn as an SVG written here: one panel
 * a series that has data, over a shared step axis, each with ticks, grid lines and labels, one
 * polyline point per step.  A run's first line carries "run_start" (daemon/supervisor.c): a
 * resume, a restart or a requeue is drawn as a dashed vertical line at the step it started
 * from, across every panel, labelled with its kind.
 *
 * A metrics file is appended to by every run of a job: a step seen again (a resumed or
 * restarted run) replaces the earlier record.  A last line without its '\n' is a record
 * being written and is left out; any other line that is not a metrics record is an error. */
#include "daemon/plot.h"

#include <errno.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/fileio.h"
#include "base/path.h"

typedef struct point {
    long step;
    long line;       /* where it was read: the later record of a step wins */
    double value[4]; /* loss, lr, tokens/s, eval loss (NAN when not known) */
    char run_start[16]; /* the kind of run it began ("" for none) */
    long from_step;
} point;

/* A run that did not start at step 0: where it started from and how. */
#define MAX_MARKERS 256
typedef struct marker {
    long step;
    char kind[16];
} marker;

enum { SERIES_LOSS, SERIES_LR, SERIES_TPS, SERIES_EVAL, N_SERIES };

static const struct {
    const char *name, *label, *color;
} series[N_SERIES] = {
    [SERIES_LOSS] = {"loss", "loss", "#1f77b4"},
    [SERIES_LR] = {"lr", "learning rate", "#d62728"},
    [SERIES_TPS] = {"tokens_per_s", "tokens/s", "#2ca02c"},
    [SERIES_EVAL] = {"eval_loss", "eval loss", "#9467bd"},
};

/* The page: the panels with data stacked over one step axis (eval loss: the steps an
 * evaluation followed; no panel without data.eval_fraction). */
#define WIDTH 900
#define LEFT 90
#define RIGHT 30
#define TOP 50
#define PANEL_H 160
#define PANEL_GAP 70
#define HEIGHT(panels) (TOP + (panels) * (PANEL_H + PANEL_GAP) + 10)

/* ---- reading ---- */

static int parse_record(const char *text, size_t len, point *p, const char *where, errbuf *err) {
    json_error_t je;
    json_t *m = json_loadb(text, len, 0, &je);
    if (!m) return errf(err, "%s: not JSON: %s", where, je.text);
    const json_t *step = json_object_get(m, "step"), *loss = json_object_get(m, "loss"),
                 *lr = json_object_get(m, "lr"), *tokens = json_object_get(m, "tokens"),
                 *secs = json_object_get(m, "seconds"), *eval = json_object_get(m, "eval_loss"),
                 *start = json_object_get(m, "run_start");
    int rc = 0;
    p->run_start[0] = '\0';
    if (start) {
        const json_t *kind = json_object_get(start, "kind"), *from = json_object_get(start, "from_step");
        const char *k = json_string_value(kind);
        if (!k || (strcmp(k, "start") && strcmp(k, "resume") && strcmp(k, "restart") && strcmp(k, "requeue")) ||
            !json_is_integer(from) || json_integer_value(from) < 0)
            rc = errf(err, "%s: \"run_start\" is not {\"kind\": start|resume|restart|requeue, \"from_step\": N}",
                      where);
        else {
            snprintf(p->run_start, sizeof p->run_start, "%s", k);
            p->from_step = (long)json_integer_value(from);
        }
    }
    if (!json_is_integer(step) || json_integer_value(step) < 1)
        rc = errf(err, "%s: no \"step\" (a metrics record has a step from 1)", where);
    else if (!json_is_number(loss) || !json_is_number(lr))
        rc = errf(err, "%s: a metrics record has numbers \"loss\" and \"lr\"", where);
    if (rc == 0 && json_is_integer(step) && json_integer_value(step) >= 1) {
        p->step = (long)json_integer_value(step);
        p->value[SERIES_LOSS] = json_number_value(loss);
        p->value[SERIES_LR] = json_number_value(lr);
        p->value[SERIES_TPS] = json_is_number(tokens) && json_is_number(secs) && json_number_value(secs) > 0
                                   ? json_number_value(tokens) / json_number_value(secs)
                                   : NAN;
        p->value[SERIES_EVAL] = json_is_number(eval) ? json_number_value(eval) : NAN;
    }
    json_decref(m);
    return rc;
}

static int by_step_then_line(const void *a, const void *b) {
    const point *p = a, *q = b;
    if (p->step != q->step) return p->step < q->step ? -1 : 1;
    return (p->line > q->line) - (p->line < q->line);
}

/* The records of path, by step, one per step; the runs that began past step 0 (or after
 * another run), in file order, into markers. */
static int read_metrics(const char *path, point **out, size_t *n_out, marker *markers, int *n_markers, errbuf *err) {
    int fd = file_open_regular(path, err);
    FILE *f = fd >= 0 ? fdopen(fd, "r") : NULL;
    if (!f) {
        if (fd >= 0) close(fd);
        return fd >= 0 ? errf(err, "%s: fdopen: %s", path, strerror(errno)) : -1;
    }
    point *pts = NULL;
    size_t n = 0, cap = 0, linecap = 0;
    char *line = NULL;
    ssize_t len;
    int rc = 0;
    for (long lineno = 1; rc == 0 && (len = getline(&line, &linecap, f)) > 0; lineno++) {
        if (line[len - 1] != '\n') break; /* being written */
        if (len == 1) continue;
        if (n == cap) {
            point *bigger = realloc(pts, (cap = cap ? 2 * cap : 256) * sizeof *pts);
            if (!bigger) {
                rc = errf(err, "out of memory");
                break;
            }
            pts = bigger;
        }
        char where[PATH_BYTES];
        snprintf(where, sizeof where, "%s:%ld", path, lineno);
        pts[n].line = lineno;
        if ((rc = parse_record(line, (size_t)len, &pts[n], where, err)) == 0) {
            /* every run_start but a fresh start that opens the file */
            if (pts[n].run_start[0] && (n > 0 || pts[n].from_step > 0) && *n_markers < MAX_MARKERS) {
                markers[*n_markers].step = pts[n].from_step;
                snprintf(markers[*n_markers].kind, sizeof markers[0].kind, "%s", pts[n].run_start);
                (*n_markers)++;
            }
            n++;
        }
    }
    if (rc == 0 && ferror(f)) rc = errf(err, "%s: %s", path, strerror(errno));
    free(line);
    fclose(f);
    if (rc == 0 && n == 0) rc = errf(err, "%s: no metrics records", path);
    if (rc) {
        free(pts);
        return -1;
    }
    qsort(pts, n, sizeof *pts, by_step_then_line);
    size_t kept = 0;
    for (size_t i = 0; i < n; i++) {
        if (kept && pts[kept - 1].step == pts[i].step) kept--;
        pts[kept++] = pts[i];
    }
    *out = pts;
    *n_out = kept;
    return 0;
}

/* ---- drawing ---- */

typedef struct axis {
    double lo, hi, tick; /* the range shown and the distance between ticks */
} axis;

/* Ticks at 1, 2 or 5 times a power of ten, about `target` of them over [lo, hi]. */
static axis nice_axis(double lo, double hi, int target, int integer) {
    if (!(hi > lo)) {
        double pad = fabs(lo) > 0 ? fabs(lo) * 0.1 : 1.0;
        lo -= pad;
        hi += pad;
    }
    double raw = (hi - lo) / target, mag = pow(10, floor(log10(raw))), f = raw / mag;
    double tick = (f < 1.5 ? 1 : f < 3 ? 2 : f < 7 ? 5 : 10) * mag;
    if (integer && tick < 1) tick = 1;
    return (axis){floor(lo / tick) * tick, ceil(hi / tick) * tick, tick};
}

static double scale(const axis *a, double v, double from, double to) {
    return from + (v - a->lo) / (a->hi - a->lo) * (to - from);
}

static void xml_text(FILE *f, const char *s) {
    for (; *s; s++) {
        if (*s == '<') fputs("&lt;", f);
        else if (*s == '>') fputs("&gt;", f);
        else if (*s == '&') fputs("&amp;", f);
        else if (*s == '"') fputs("&quot;", f);
        else if ((unsigned char)*s >= 0x20 || *s == '\t') fputc(*s, f);
    }
}

/* A tick label: short, and 0 rather than -1e-17. */
static void tick_label(char *out, size_t n, double v, double tick) {
    if (fabs(v) < tick * 1e-6) v = 0;
    snprintf(out, n, "%.6g", v);
}

/* Over the grid lines, under the data. */
static void draw_frame(FILE *f, double top, double left, double right) {
    fprintf(f, "<rect x=\"%g\" y=\"%g\" width=\"%g\" height=\"%d\" class=\"frame\"/>\n", left, top, right - left,
            PANEL_H);
}

static int has_data(int s, const point *pts, size_t n) {
    for (size_t i = 0; i < n; i++)
        if (isfinite(pts[i].value[s])) return 1;
    return 0;
}

/* Series s in the slot-th panel from the top (a series with data). */
static void draw_panel(FILE *f, int s, int slot, const point *pts, size_t n, const axis *x, const marker *mk,
                       int n_markers) {
    double top = TOP + slot * (PANEL_H + PANEL_GAP), bottom = top + PANEL_H, left = LEFT, right = WIDTH - RIGHT;
    double lo = INFINITY, hi = -INFINITY;
    for (size_t i = 0; i < n; i++) {
        double v = pts[i].value[s];
        if (!isfinite(v)) continue;
        lo = fmin(lo, v);
        hi = fmax(hi, v);
    }
    fprintf(f, "<g class=\"panel\" id=\"%s\">\n", series[s].name);
    fprintf(f, "<text x=\"%g\" y=\"%g\" class=\"title\">%s</text>\n", left, top - 8, series[s].label);
    char label[64];
    /* The step axis: grid lines and labels under every panel. */
    for (double t = x->lo; t <= x->hi + x->tick * 1e-9; t += x->tick) {
        double px = scale(x, t, left, right);
        tick_label(label, sizeof label, t, x->tick);
        fprintf(f, "<line x1=\"%.2f\" y1=\"%g\" x2=\"%.2f\" y2=\"%g\" class=\"grid\"/>\n", px, top, px, bottom);
        fprintf(f, "<line x1=\"%.2f\" y1=\"%g\" x2=\"%.2f\" y2=\"%g\" class=\"tick\"/>\n", px, bottom, px, bottom + 5);
        fprintf(f, "<text x=\"%.2f\" y=\"%g\" class=\"xlabel\">%s</text>\n", px, bottom + 18, label);
    }
    fprintf(f, "<text x=\"%g\" y=\"%g\" class=\"xtitle\">step</text>\n", (left + right) / 2, bottom + 36);
    fprintf(f, "<text transform=\"translate(%g %g) rotate(-90)\" class=\"ytitle\">%s</text>\n", left - 62,
            (top + bottom) / 2, series[s].label);
    axis y = nice_axis(lo, hi, 5, 0);
    for (double t = y.lo; t <= y.hi + y.tick * 1e-9; t += y.tick) {
        double py = scale(&y, t, bottom, top);
        tick_label(label, sizeof label, t, y.tick);
        fprintf(f, "<line x1=\"%g\" y1=\"%.2f\" x2=\"%g\" y2=\"%.2f\" class=\"grid\"/>\n", left, py, right, py);
        fprintf(f, "<line x1=\"%g\" y1=\"%.2f\" x2=\"%g\" y2=\"%.2f\" class=\"tick\"/>\n", left - 5, py, left, py);
        fprintf(f, "<text x=\"%g\" y=\"%.2f\" class=\"ylabel\">%s</text>\n", left - 8, py + 4, label);
    }
    draw_frame(f, top, left, right);
    fprintf(f, "<polyline class=\"series\" data-series=\"%s\" stroke=\"%s\" points=\"", series[s].name,
            series[s].color);
    for (size_t i = 0, k = 0; i < n; i++)
        if (isfinite(pts[i].value[s]))
            fprintf(f, "%s%.2f,%.2f", k++ ? " " : "", scale(x, (double)pts[i].step, left, right),
                    scale(&y, pts[i].value[s], bottom, top));
    fprintf(f, "\"/>\n");
    for (int i = 0; i < n_markers; i++) {
        double px = scale(x, (double)mk[i].step, left, right);
        fprintf(f, "<line x1=\"%.2f\" y1=\"%g\" x2=\"%.2f\" y2=\"%g\" class=\"marker\" data-kind=\"%s\" "
                   "data-step=\"%ld\"/>\n", px, top, px, bottom, mk[i].kind, mk[i].step);
        if (slot == 0)
            fprintf(f, "<text x=\"%.2f\" y=\"%g\" class=\"mlabel\">%s at %ld</text>\n", px + 3, top + 12,
                    mk[i].kind, mk[i].step);
    }
    fprintf(f, "</g>\n");
}

static void draw(FILE *f, const char *source, const point *pts, size_t n, const marker *mk, int n_markers) {
    long first = pts[0].step;
    for (int i = 0; i < n_markers; i++)
        if (mk[i].step < first) first = mk[i].step;
    axis x = nice_axis((double)first, (double)pts[n - 1].step, 10, 1);
    int panels = 0;
    for (int s = 0; s < N_SERIES; s++) panels += has_data(s, pts, n);
    fprintf(f, "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n"
               "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%d\" height=\"%d\" viewBox=\"0 0 %d %d\">\n"
               "<style>\n"
               "text { font-family: sans-serif; font-size: 12px; fill: #222; }\n"
               ".title { font-size: 14px; font-weight: bold; }\n"
               ".heading { font-size: 15px; }\n"
               ".xlabel, .xtitle, .ytitle, .empty { text-anchor: middle; }\n"
               ".ylabel { text-anchor: end; }\n"
               ".frame { fill: none; stroke: #444; }\n"
               ".grid { stroke: #e4e4e4; }\n"
               ".tick { stroke: #444; }\n"
               ".series { fill: none; stroke-width: 1.5; }\n"
               ".marker { stroke: #ff7f0e; stroke-width: 1.2; stroke-dasharray: 4 3; }\n"
               ".mlabel { font-size: 11px; fill: #ff7f0e; }\n"
               "</style>\n"
               "<rect width=\"100%%\" height=\"100%%\" fill=\"white\"/>\n",
            WIDTH, HEIGHT(panels), WIDTH, HEIGHT(panels));
    fprintf(f, "<text x=\"%d\" y=\"22\" class=\"heading\">", LEFT);
    xml_text(f, source);
    fprintf(f, ": steps %ld to %ld (%zu points)</text>\n", pts[0].step, pts[n - 1].step, n);
    for (int s = 0, slot = 0; s < N_SERIES; s++)
        if (has_data(s, pts, n)) draw_panel(f, s, slot++, pts, n, &x, mk, n_markers);
    fprintf(f, "</svg>\n");
}

static int write_svg(const char *out, const char *source, const point *pts, size_t n, const marker *mk,
                     int n_markers, errbuf *err) {
    char *text = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&text, &len);
    if (!f) return errf(err, "out of memory");
    draw(f, source, pts, n, mk, n_markers);
    if (fclose(f) != 0) {
        free(text);
        return errf(err, "out of memory");
    }
    file_chunk chunk = {text, len};
    int rc = file_write_atomic(out, &chunk, 1, err);
    free(text);
    return rc;
}

int plot_metrics(const char *metrics, const char *out, plot_result *r, errbuf *err) {
    point *pts = NULL;
    size_t n = 0;
    static marker markers[MAX_MARKERS];
    int n_markers = 0;
    if (read_metrics(metrics, &pts, &n, markers, &n_markers, err)) return -1;
    int rc = write_svg(out, metrics, pts, n, markers, n_markers, err);
    if (rc == 0 && r) *r = (plot_result){.steps = n, .first = pts[0].step, .last = pts[n - 1].step, .markers = n_markers};
    free(pts);
    return rc;
}
