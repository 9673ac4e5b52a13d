/* fsdpctl subcommands (daemon/cmd_*.c).  Each takes the arguments after its name (argv[0] is the
 * subcommand) and returns the process exit status, printing its own errors to stderr. */
#ifndef FSDP_FSDPCTL_H
#define FSDP_FSDPCTL_H

int cmd_inspect(int argc, char **argv);
int cmd_init(int argc, char **argv);
int cmd_reference(int argc, char **argv);
int cmd_compare(int argc, char **argv);
int cmd_synth(int argc, char **argv);
int cmd_tokenize(int argc, char **argv);
int cmd_consolidate(int argc, char **argv);
int cmd_status(int argc, char **argv);     /* daemon/cmd_status.c */
int cmd_checkpoint(int argc, char **argv);
int cmd_stop(int argc, char **argv);
int cmd_plot(int argc, char **argv);       /* daemon/cmd_plot.c */
int cmd_fabric(int argc, char **argv);     /* daemon/cmd_fabric.c */
int cmd_quantize(int argc, char **argv);   /* daemon/cmd_quantize.c */

#endif
