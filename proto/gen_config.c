/* gen_config: a model's generation_config.json, the part fsdpd reads (see gen_config.h). */
#include "proto/gen_config.h"

#include <errno.h>
#include <jansson.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/fileio.h"
#include "base/path.h"

static int read_id(json_t *v, int32_t *out) {
    if (!json_is_integer(v) || json_integer_value(v) < 0 || json_integer_value(v) > INT32_MAX)
        return -1;
    *out = (int32_t)json_integer_value(v);
    return 0;
}

int gen_config_parse(gen_config *g, const char *text, size_t len, const char *name, errbuf *err) {
    memset(g, 0, sizeof *g);
    json_error_t je;
    json_t *root = json_loadb(text, len, 0, &je);
    if (!root) return errf(err, "%s: not JSON: %s (line %d)", name, je.text, je.line);
    int rc = 0;
    json_t *eos = json_object_get(root, "eos_token_id");
    if (!json_is_object(root)) {
        rc = errf(err, "%s: not a JSON object", name);
    } else if (json_is_array(eos)) {
        if (json_array_size(eos) > GEN_CONFIG_MAX_STOP)
            rc = errf(err, "%s: eos_token_id: %zu ids, more than %d", name, json_array_size(eos),
                      GEN_CONFIG_MAX_STOP);
        for (size_t i = 0; rc == 0 && i < json_array_size(eos); i++)
            if (read_id(json_array_get(eos, i), &g->eos[g->n_eos++]))
                rc = errf(err, "%s: eos_token_id[%zu] is not a token id", name, i);
    } else if (eos && !json_is_null(eos)) {
        if (read_id(eos, &g->eos[0])) rc = errf(err, "%s: eos_token_id is not a token id or a list of them", name);
        else g->n_eos = 1;
    }
    json_decref(root);
    if (rc) memset(g, 0, sizeof *g);
    return rc;
}

int gen_config_read(gen_config *g, const char *model_dir, errbuf *err) {
    char path[PATH_BYTES], *text;
    size_t len;
    memset(g, 0, sizeof *g);
    if (path_join(path, PATH_BYTES, model_dir, GEN_CONFIG_NAME, err)) return -1;
    if (access(path, F_OK) != 0 && errno == ENOENT) return 0;
    if (file_read_all(path, GEN_CONFIG_MAX_BYTES, &text, &len, err)) return -1;
    int rc = gen_config_parse(g, text, len, path, err);
    free(text);
    return rc;
}
