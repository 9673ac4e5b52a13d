/* fsdpctl plot METRICS --out FILE.svg: daemon/plot.h's SVG of a metrics file. */
#include <getopt.h>
#include <stdio.h>

#include "ctl/fsdpctl.h"
#include "daemon/plot.h"

static void plot_usage(FILE *f) {
    fprintf(f, "usage: fsdpctl plot METRICS.jsonl --out FILE.svg\n"
               "  loss, learning rate, tokens/s and the eval loss (when there is one) over the steps of\n"
               "  a job's metrics file; resumes, restarts and requeues as vertical lines\n"
               "  --out FILE.svg  the SVG to write\n");
}

int cmd_plot(int argc, char **argv) {
    static const struct option longopts[] = {{"out", required_argument, 0, 'o'}, {"help", no_argument, 0, 'h'},
                                             {0, 0, 0, 0}};
    const char *out = NULL;
    int opt;
    optind = 1;
    opterr = 0;
    while ((opt = getopt_long(argc, argv, "", longopts, NULL)) != -1) {
        if (opt == 'o') out = optarg;
        else if (opt == 'h') {
            plot_usage(stdout);
            return 0;
        } else {
            ctl_flag_error("plot", argv);
            plot_usage(stderr);
            return 2;
        }
    }
    if (!out || argc - optind != 1) {
        if (!out) fprintf(stderr, "fsdpctl plot: --out FILE.svg is required\n");
        else fprintf(stderr, "fsdpctl plot: one metrics file, not %d arguments\n", argc - optind);
        plot_usage(stderr);
        return 2;
    }
    errbuf err;
    plot_result r;
    if (plot_metrics(argv[optind], out, &r, &err)) {
        fprintf(stderr, "fsdpctl plot: %s\n", err.msg);
        return 1;
    }
    if (r.markers) printf("%s: %zu steps (%ld to %ld), %d run%s marked\n", out, r.steps, r.first, r.last,
                          r.markers, r.markers == 1 ? " start" : " starts");
    else printf("%s: %zu steps (%ld to %ld)\n", out, r.steps, r.first, r.last);
    return 0;
}
