/* path: joining a directory and a name, too long an error; see path.h. */
#include "base/path.h"

#include <stdio.h>

int path_join(char *out, size_t n, const char *dir, const char *name, errbuf *err) {
    int len = snprintf(out, n, "%s/%s", dir, name);
    if (len >= 0 && (size_t)len < n) return 0;
    /* The path is too long for the message too: its start is enough to recognise it. */
    return err ? errf(err, "path too long (more than %zu bytes): %.400s.../%s", n - 1, dir, name) : -1;
}
