#include "base/path.h"

#include <stdio.h>

int path_join(char *out, size_t n, const char *dir, const char *name, errbuf *err) {
    int len = snprintf(out, n, "%s/%s", dir, name);
    if (len < 0 || (size_t)len >= n) return err ? errf(err, "%s/%s: path too long", dir, name) : -1;
    return 0;
}
