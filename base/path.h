/* path: the one size every path buffer has, and joining a directory and a name into one.
 * A path that does not fit is an error naming it, never a silently cut one. */
#ifndef FSDP_PATH_H
#define FSDP_PATH_H

#include <stddef.h>

#include "base/errbuf.h"

#define PATH_BYTES 4096 /* PATH_MAX on Linux, its NUL included */

/* out = dir/name, in n bytes; err may be NULL. */
int path_join(char *out, size_t n, const char *dir, const char *name, errbuf *err);

#endif
