/* usage: what fsdpctl's commands say about a flag they cannot take; see fsdpctl.h. */
#include <getopt.h>
#include <stdio.h>

#include "ctl/fsdpctl.h"

void ctl_flag_error(const char *cmd, char *const argv[]) {
    fprintf(stderr, "fsdpctl %s: %s: %s\n", cmd, argv[optind - 1], optopt ? "needs a value" : "unknown flag");
}
