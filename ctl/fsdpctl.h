/* fsdpctl subcommands (ctl/cmd_*.c).  Each takes the arguments after its name (argv[0] is the
 * subcommand) and returns the process exit status, printing its own errors to stderr. */
#ifndef FSDP_FSDPCTL_H
#define FSDP_FSDPCTL_H

#include <stdint.h>

#include "proto/safetensors.h"

int cmd_inspect(int argc, char **argv);
int cmd_init(int argc, char **argv);
int cmd_reference(int argc, char **argv);
int cmd_compare(int argc, char **argv);
int cmd_synth(int argc, char **argv);
int cmd_tokenize(int argc, char **argv);
int cmd_consolidate(int argc, char **argv);
int cmd_merge(int argc, char **argv);      /* ctl/cmd_merge.c */
int cmd_status(int argc, char **argv);     /* ctl/cmd_status.c */
int cmd_checkpoint(int argc, char **argv);
int cmd_stop(int argc, char **argv);
int cmd_plot(int argc, char **argv);       /* ctl/cmd_plot.c */
int cmd_fabric(int argc, char **argv);     /* ctl/cmd_fabric.c */
int cmd_quantize(int argc, char **argv);   /* ctl/cmd_quantize.c */
int cmd_plan(int argc, char **argv);       /* ctl/cmd_plan.c */
int cmd_generate(int argc, char **argv);   /* ctl/cmd_generate.c */

/* Option values shared by consolidate and merge (ctl/cmd_consolidate.c); 0 or -1. */
int fsdpctl_parse_dtype(const char *text, st_dtype *out);       /* bf16|bfloat16|f32|float32 */
int fsdpctl_parse_shard_size(const char *text, uint64_t *out);  /* as output.shard_size: "5GB" */
int fsdpctl_parse_threads(const char *text, int *out);          /* 1 to 256 */
int fsdpctl_parse_int(const char *text, int lo, int hi, int *out); /* a whole decimal in [lo, hi] */

/* After getopt_long (opterr 0) returned '?': says which flag, argv[optind - 1], is unknown
 * or lacks its value (ctl/usage.c). */
void ctl_flag_error(const char *cmd, char *const argv[]);

#endif
