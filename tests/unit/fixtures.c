/* tests/unit/fixtures.h */
#include "tests/unit/fixtures.h"

#include <setjmp.h>
#include <math.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#include <cmocka.h>

/* print into OUT (N bytes), failing the test when it does not fit. */
static void put(char *out, size_t n, const char *what, const char *dir, const char *rel) {
    int len = snprintf(out, n, "%s/%s", dir, rel);
    if (len < 0 || (size_t)len >= n) fail_msg("%s: the path of %s/%s is too long", what, dir, rel);
}

const char *fixture_path(char *out, size_t n, const char *fmt, ...) {
    char rel[1024];
    va_list ap;
    va_start(ap, fmt);
    int len = vsnprintf(rel, sizeof rel, fmt, ap);
    va_end(ap);
    if (len < 0 || (size_t)len >= sizeof rel) fail_msg("fixture_path: the name is too long");
    put(out, n, "fixture_path", "tests/fixtures", rel);
    if (access(out, F_OK) == 0) return out;
    const char *build = getenv("FSDP_BUILD");
    char unpacked[1024];
    put(unpacked, sizeof unpacked, "fixture_path", build && *build ? build : "build", "fixtures");
    put(out, n, "fixture_path", unpacked, rel);
    if (access(out, F_OK) == 0) return out;
    fail_msg("fixture_path: no tests/fixtures/%s, nor %s (run from the repository root, after make)", rel, out);
    return NULL;
}

const char *large_fixture_path(char *out, size_t n, const char *rel, char *why, size_t why_n) {
    const char *shared = getenv("FSDP_SHARED");
    if (!shared || !*shared) {
        snprintf(why, why_n, "large fixture %s: FSDP_SHARED is not set (tests/fixtures/README.md)", rel);
        return NULL;
    }
    put(out, n, "large_fixture_path", shared, rel);
    if (access(out, R_OK) == 0) return out;
    snprintf(why, why_n, "large fixture %s: FSDP_SHARED=%s has no %s", rel, shared, rel);
    return NULL;
}

double rel_error(const float *a, const float *b, size_t n) {
    double diff = 0.0, ref = 0.0;
    for (size_t i = 0; i < n; i++) {
        diff += ((double)a[i] - b[i]) * ((double)a[i] - b[i]);
        ref += (double)b[i] * b[i];
    }
    return ref > 0 ? sqrt(diff / ref) : sqrt(diff);
}
