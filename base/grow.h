/* grow: the capacity doubling of a growable array, the one copy its users share (the token
 * cache's writer, the tokenizer's buffers and maps). */
#ifndef FSDP_GROW_H
#define FSDP_GROW_H

#include <stddef.h>

/* Makes *p (realloc'd, *cap elements of elem bytes) hold at least need elements: the
 * capacity doubles from 16 until it does.  0, or -1 out of memory (or on an overflowing
 * size), *p and *cap then unchanged. */
int grow_array(void **p, size_t *cap, size_t need, size_t elem);

#endif
