/* job_flags: fsdpd's command line — its own overrides (--section.key=value) and the flags
 * of the tools its users come from: fsdp_qlora's train.py and transformers' Trainer / TRL
 * (../shared/anchors/commands.md).  Each flag is mapped onto job keys, or refused with
 * what to do instead; a flag with no meaning here is accepted with a note that says so.
 * configs/jobs/README.md has the whole table.
 *
 * Syntax: --flag value and --flag=value; a boolean is true/false, True/False, 1/0, yes/no,
 * and a bare --flag is true.  --job FILE is optional (the defaults plus the flags make a
 * job); --defaults fsdpd|fsdp_qlora|trainer chooses whose defaults the keys not given take
 * (train.defaults).  Without --job and --defaults, a line that uses fsdp_qlora's flags only
 * takes fsdp_qlora's defaults, one that uses the Trainer's only takes the Trainer's.
 *
 * How fsdpd uses it:
 *   job_args_parse(argc, argv, &a)   the words into flags (syntax and names only)
 *   job_args_load(&j, &a, &notes)    defaults, job file, then every flag in order and the
 *                                    rules that need them all (a batch from --batch_size, a
 *                                    schedule's warm-up, clipping) */
#ifndef FSDP_JOB_FLAGS_H
#define FSDP_JOB_FLAGS_H

#include <stdbool.h>

#include "base/errbuf.h"
#include "job.h"

#define JOB_ARGS_MAX 256
#define JOB_NOTES_MAX 32
#define JOB_NOTE_BYTES 320

typedef struct job_arg {
    const char *name;  /* without the leading "--" */
    const char *value; /* NULL: a bare boolean flag */
} job_arg;

typedef struct job_args {
    bool help;
    const char *job_path; /* --job, or NULL */
    const char *defaults; /* --defaults (or --train.defaults), or NULL */
    int n;
    job_arg arg[JOB_ARGS_MAX];
    char names[JOB_ARGS_MAX][96]; /* the names of --name=value, cut at '=' */
} job_args;

/* What the flags decided that the log must say: a flag accepted with no effect here, a
 * difference from the tool it comes from, the defaults chosen. */
typedef struct job_notes {
    int n;
    char line[JOB_NOTES_MAX][JOB_NOTE_BYTES];
} job_notes;

/* argv[1..argc-1] into *a: every flag named (an unknown one is an error naming the closest
 * known flag or key), every value present.  argv's strings must outlive *a (and *a must
 * not be copied: its names point into it). */
int job_args_parse(int argc, char **argv, job_args *a, errbuf *err);

/* The job the command line describes, into *j: the defaults (train.defaults: --defaults,
 * else the job file's, else chosen from the flags), the job file when there is one, then
 * each flag.  *notes gets what the log must say (notes may be NULL). */
int job_args_load(job_config *j, const job_args *a, job_notes *notes, errbuf *err);

/* One override or flag with its value, "--name=value" (fsdpctl plan and consolidate take
 * the same overrides as fsdpd), over *j; notes are dropped. */
int job_apply_override(job_config *j, const char *arg, errbuf *err);

#endif
