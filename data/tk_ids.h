/* tk_ids: a growable list of token ids (its functions are in tk_util.c). */
#ifndef FSDP_DATA_TK_IDS_H
#define FSDP_DATA_TK_IDS_H

#include <stddef.h>
#include <stdint.h>

typedef struct tk_ids {
    int32_t *v;
    size_t n, cap;
} tk_ids;

/* Appends id; -1 when out of memory. */
int tk_ids_push(tk_ids *a, int32_t id);
void tk_ids_free(tk_ids *a);

#endif
