/* Fuzzes proto/job: input starting with "--" is a list of overrides (one per line) applied
 * to the defaults, input starting with "@" a command line (proto/job_flags: words separated
 * by spaces, without --job), anything else is job-file text.  Whatever parses is validated, and a
 * valid config must survive job_to_object -> job_from_object unchanged. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "proto/job.h"
#include "proto/job_flags.h"

static void apply_overrides(job_config *j, const uint8_t *data, size_t size) {
    char *text = malloc(size + 1);
    if (!text) return;
    memcpy(text, data, size);
    text[size] = '\0';
    errbuf err;
    for (char *line = strtok(text, "\n"); line; line = strtok(NULL, "\n"))
        job_apply_override(j, line, &err);
    free(text);
}

static void apply_command_line(job_config *j, const uint8_t *data, size_t size) {
    static char text[4096], *argv[JOB_ARGS_MAX + 2];
    static job_args a;
    static job_notes notes;
    if (size > sizeof text - 1) size = sizeof text - 1;
    memcpy(text, data, size);
    text[size] = '\0';
    int argc = 0;
    argv[argc++] = "fsdpd";
    for (char *w = strtok(text + 1, " \n"); w && argc < JOB_ARGS_MAX + 2; w = strtok(NULL, " \n")) argv[argc++] = w;
    errbuf err;
    job_defaults(j);
    if (job_args_parse(argc, argv, &a, &err) || a.job_path) return; /* never a file the input names */
    if (job_args_load(j, &a, &notes, &err)) job_defaults(j);
    if (notes.n < 0 || notes.n > JOB_NOTES_MAX) abort();
}

/* A config that validated must come back identical from its JSON. */
static void check_round_trip(const job_config *j, int world) {
    static job_config back;
    errbuf err;
    json_t *obj = job_to_object(j, &err), *again;
    if (!obj) abort();
    if (job_from_object(&back, obj, &err) || job_resolve(&back, world, &err) ||
        job_validate(&back, world, &err))
        abort();
    if (!(again = job_to_object(&back, &err)) || !json_equal(obj, again)) abort();
    json_decref(obj);
    json_decref(again);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    static job_config j;
    errbuf err;
    if (size >= 1 && data[0] == '@') {
        apply_command_line(&j, data, size);
        strcpy(j.model.path, "m");
        strcpy(j.data.path, "d");
    } else if (size >= 2 && data[0] == '-' && data[1] == '-') {
        job_defaults(&j);
        apply_overrides(&j, data, size);
        strcpy(j.model.path, "m");
        strcpy(j.data.path, "d");
    } else if (job_parse_text(&j, (const char *)data, size, "fuzz", &err)) {
        return 0;
    }
    int world = 1 + (int)(size % 4);
    if (job_resolve_runtime(&j, (int)(size % 9), &err) == 0 && job_resolve(&j, world, &err) == 0 &&
        job_validate(&j, world, &err) == 0)
        check_round_trip(&j, world);
    return 0;
}
