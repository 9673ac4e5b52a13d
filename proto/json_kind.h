/* json_kind: how error messages name the type of a JSON value ("an integer", "a list"). */
#ifndef FSDP_JSON_KIND_H
#define FSDP_JSON_KIND_H

#include <jansson.h>

const char *json_kind(const json_t *v);

#endif
