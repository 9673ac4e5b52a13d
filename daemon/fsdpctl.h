/* fsdpctl subcommands.  Each takes the arguments after its name (argv[0] is the
 * subcommand) and returns the process exit status, printing its own errors to stderr. */
#ifndef FSDP_FSDPCTL_H
#define FSDP_FSDPCTL_H

int ctl_inspect(int argc, char **argv);
int ctl_init(int argc, char **argv);
int ctl_reference(int argc, char **argv);
int ctl_compare(int argc, char **argv);
int ctl_synth(int argc, char **argv);
int ctl_consolidate(int argc, char **argv);

#endif
