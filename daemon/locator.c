/* locator: see locator.h. */
#include "daemon/locator.h"

#include <stdio.h>
#include <string.h>

typedef struct coll_view {
    long long rank, node, started, finished, unit;
    const char *op;
    double still_s;
} coll_view;

/* A row's figures; 0 when it has none. */
static int view_of(const json_t *row, coll_view *v) {
    const json_t *c = json_object_get(row, "coll");
    if (!json_is_object(c)) return 0;
    *v = (coll_view){.rank = json_integer_value(json_object_get(row, "rank")),
                     .node = json_integer_value(json_object_get(row, "node")),
                     .started = json_integer_value(json_object_get(c, "started")),
                     .finished = json_integer_value(json_object_get(c, "finished")),
                     .unit = json_integer_value(json_object_get(c, "unit")),
                     .op = json_string_value(json_object_get(c, "op")),
                     .still_s = json_number_value(json_object_get(row, "coll_still_s"))};
    if (!v->op) v->op = "unknown";
    return 1;
}

static const char *host_of(const json_t *nodes, long long node) {
    size_t i;
    const json_t *n;
    json_array_foreach(nodes, i, n) if (json_integer_value(json_object_get(n, "node")) == node) {
        const char *h = json_string_value(json_object_get(n, "host"));
        if (h) return h;
    }
    return NULL;
}

/* "node 2 (10.0.0.3)", or "node 2" without its host. */
static void where(char *out, size_t n, const json_t *nodes, long long node) {
    const char *host = host_of(nodes, node);
    if (host) snprintf(out, n, "node %lld (%s)", node, host);
    else snprintf(out, n, "node %lld", node);
}

/* " of unit 17", or "" for a collective of no unit. */
static void unit_text(char *out, size_t n, long long unit) {
    if (unit >= 0) snprintf(out, n, " of unit %lld", unit);
    else out[0] = '\0';
}

json_t *locator_find(const json_t *ranks, const json_t *nodes, double settle_s) {
    json_t *found = json_array();
    size_t i;
    const json_t *row;
    coll_view v, top = {.started = -1};
    int n = 0;
    json_array_foreach(ranks, i, row) {
        if (!view_of(row, &v)) continue;
        if (v.still_s < settle_s) return found; /* it moves: no hang to locate */
        if (v.started > top.started) top = v;
        n++;
    }
    if (n < 2) return found;
    char node[160], unit[48], line[512];
    unit_text(unit, sizeof unit, top.unit);
    int behind = 0;
    json_array_foreach(ranks, i, row) {
        if (!view_of(row, &v) || v.started >= top.started) continue;
        where(node, sizeof node, nodes, v.node);
        snprintf(line, sizeof line, "rank %lld on %s never started %s #%lld%s; its last was %s #%lld", v.rank, node,
                 top.op, top.started, unit, v.op, v.started);
        json_array_append_new(found, json_string(line));
        behind++;
    }
    if (behind) return found;
    json_array_foreach(ranks, i, row) { /* every rank started it: who did not finish? */
        if (!view_of(row, &v) || v.finished >= top.started) continue;
        where(node, sizeof node, nodes, v.node);
        snprintf(line, sizeof line, "rank %lld on %s started %s #%lld%s and never finished it", v.rank, node,
                 top.op, top.started, unit);
        json_array_append_new(found, json_string(line));
    }
    return found;
}
