/* fsdpctl subcommands.  Each takes the arguments after its name (argv[0] is the
 * subcommand) and returns the process exit status, printing its own errors to stderr. */
#ifndef FSDP_FSDPCTL_H
#define FSDP_FSDPCTL_H

int ctl_inspect(int argc, char **argv);
int ctl_init(int argc, char **argv);
int ctl_reference(int argc, char **argv);
int ctl_compare(int argc, char **argv);
int ctl_synth(int argc, char **argv);
int ctl_tokenize(int argc, char **argv);
int ctl_consolidate(int argc, char **argv);
int ctl_status(int argc, char **argv);     /* daemon/ctl_status.c */
int ctl_checkpoint(int argc, char **argv);
int ctl_stop(int argc, char **argv);
int ctl_plot(int argc, char **argv);       /* daemon/plot.c */

#endif
