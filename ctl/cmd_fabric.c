/* fsdpctl fabric [--no-require]: what fsdpd's fabric probe finds on this node and the
 * environment it would give the workers of a CUDA job (daemon/fabric.h; the workers'
 * LD_LIBRARY_PATH as a last line when it has one); exit 1 when fsdpd would refuse to start
 * (EFA without an NCCL net plugin). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/fault.h"
#include "daemon/fabric.h"
#include "ctl/fsdpctl.h"

int cmd_fabric(int argc, char **argv) {
    int require = 1;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--no-require")) {
            require = 0;
            continue;
        }
        fprintf(stderr, "fsdpctl fabric: %s: %s\nusage: fsdpctl fabric [--no-require]\n", argv[i],
                argv[i][0] == '-' ? "unknown flag" : "unexpected argument");
        return 2;
    }
    errbuf err;
    fabric_found f;
    char line[4 * PATH_BYTES];
    if (fault_init(&err) || fabric_probe(&f, &err)) {
        fprintf(stderr, "fsdpctl fabric: %s\n", err.msg);
        return 1;
    }
    fabric_describe(&f, line, sizeof line);
    printf("fabric: %s (%s)\n", fabric_kind(&f), line);
    if (fabric_setenv(&f, require, "", &err)) {
        fprintf(stderr, "fsdpctl fabric: fsdpd would refuse to start: %s\n", err.msg);
        return 1;
    }
    const char *ld = getenv("LD_LIBRARY_PATH");
    if (ld && *ld) printf("workers' LD_LIBRARY_PATH=%s\n", ld);
    return 0;
}
