/* Fuzzes proto/mlflow's decoders of a tracking server's answers: the input as a get-by-name,
 * experiments/create and runs/create answer, and as an error answer.  An id that is accepted
 * is 1 to MLFLOW_ID_MAX - 1 characters of [A-Za-z0-9_-]; the error text is printable and fits;
 * nothing reads past the bytes given. */
#include <ctype.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "proto/mlflow.h"

static void check_id(const char *id) {
    size_t n = strnlen(id, MLFLOW_ID_MAX);
    if (n == 0 || n >= MLFLOW_ID_MAX) abort();
    for (size_t i = 0; i < n; i++)
        if (!isalnum((unsigned char)id[i]) && id[i] != '-' && id[i] != '_') abort();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t len) {
    char *text = malloc(len ? len : 1); /* an exact-size copy: reading past it is caught */
    if (!text) return 0;
    memcpy(text, data, len);
    char id[MLFLOW_ID_MAX];
    errbuf err;
    if (mlflow_parse_experiment(text, len, id, &err) == 0) check_id(id);
    if (mlflow_parse_experiment_created(text, len, id, &err) == 0) check_id(id);
    if (mlflow_parse_run(text, len, id, &err) == 0) check_id(id);
    char why[64];
    mlflow_error_text(text, len, why, sizeof why);
    size_t n = strnlen(why, sizeof why);
    if (n >= sizeof why) abort();
    for (size_t i = 0; i < n; i++)
        if (!isprint((unsigned char)why[i])) abort();
    free(text);
    return 0;
}
