/* Where a unit test finds its fixtures (tests/fixtures/README.md), and how it measures a result
 * against a golden one.  Tests run from the
 * repository root (tests/run.sh does). */
#ifndef FSDP_TESTS_UNIT_FIXTURES_H
#define FSDP_TESTS_UNIT_FIXTURES_H

#include <stddef.h>

/* fixture_path: OUT (N bytes) set to the path of the fixture whose path under tests/fixtures/
 * is FMT, ...: "tests/fixtures/REL", or "$FSDP_BUILD/fixtures/REL" (FSDP_BUILD default
 * "build") for a fixture stored compressed, which the Makefile unpacks there.  Returns OUT;
 * fails the test when the path does not fit or the fixture is in neither place. */
const char *fixture_path(char *out, size_t n, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* large_fixture_path: OUT set to "$FSDP_SHARED/REL", a fixture of the large group (kept
 * outside the repository); NULL, with WHY (WHY_N bytes) saying so, when FSDP_SHARED is unset
 * or has no REL: the caller skips (counted; a failure under CI=true, tests/run.sh). */
const char *large_fixture_path(char *out, size_t n, const char *rel, char *why, size_t why_n);

/* rel_error: sqrt(sum (a-b)^2 / sum b^2) over n floats, a tensor's error against its golden
 * b (the absolute sqrt(sum (a-b)^2) where b is all zero). */
double rel_error(const float *a, const float *b, size_t n);

#endif
