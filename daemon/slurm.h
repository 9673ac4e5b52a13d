/* slurm: what SLURM tells fsdpd about its job, read from the environment srun gives every
 * task (DESIGN.md, "SLURM, rendezvous, fabric").
 *
 *   SLURM_JOB_ID              the job id ("" outside SLURM)
 *   SLURM_RESTART_COUNT       requeues so far; unset on the first run (read as 0)
 *   SLURM_STEP_ID             the job step (one srun) every node of it shares ("" unset)
 *   SLURM_NNODES (or SLURM_JOB_NUM_NODES), SLURM_NODEID   node count and this node's index
 *   SLURMD_NODENAME           this node's name
 *   SLURM_JOB_NODELIST        every node, in SLURM's hostlist syntax (n[01-04],gpu7)
 *   SLURM_TASKS_PER_NODE      tasks per node, run-length coded: "8(x2),4"
 *   SLURM_GPUS_ON_NODE        GPUs allocated on this node (unset: not given)
 *
 * A value that is present but malformed is an error naming the variable; nothing falls back
 * to a default that would quietly make a node a world of its own. */
#ifndef FSDP_SLURM_H
#define FSDP_SLURM_H

#include <stdbool.h>

#include "base/errbuf.h"

#define SLURM_HOST_MAX 256       /* a host name, with its NUL */
#define SLURM_MAX_HOSTS 65536    /* SLURM's own bound on one range */

typedef struct slurm_env {
    bool in_slurm;               /* SLURM_JOB_ID is set */
    char job_id[64];
    int restart_count;           /* 0 when unset */
    bool restarted;              /* SLURM_RESTART_COUNT was set */
    char step_id[32];            /* "" when unset: a second srun in one allocation has another */
    int nnodes, node_id;         /* 1 and 0 outside SLURM */
    char nodename[SLURM_HOST_MAX];
    int n_hosts;
    char (*hosts)[SLURM_HOST_MAX]; /* [n_hosts], the expanded node list (malloc'd) */
    int tasks_on_node;           /* this node's entry of SLURM_TASKS_PER_NODE, 0 when unset */
    int gpus_on_node;            /* -1 when unset */
} slurm_env;

/* Reads the variables above (outside SLURM: one node, index 0, no hosts).  Checks that the
 * node count, the node index and the node list agree. */
int slurm_env_read(slurm_env *e, errbuf *err);
void slurm_env_free(slurm_env *e);

/* Expands a hostlist as `scontrol show hostnames` does: comma-separated entries, each a
 * prefix with bracket groups of ranges ("n[01-3,7]", "a[0-1]b[2-3]": every combination, the
 * first group outermost), zero-padded to the width of each range's first bound; duplicates
 * and order kept.  *hosts is malloc'd.  A reversed or empty range, more than SLURM_MAX_HOSTS
 * hosts, an unbalanced bracket or text after the last group is an error naming it. */
int slurm_hostlist_expand(const char *list, char (**hosts)[SLURM_HOST_MAX], int *n, errbuf *err);

/* The tasks of node `index` from SLURM_TASKS_PER_NODE's syntax ("8(x2),4"). */
int slurm_tasks_on_node(const char *spec, int index, int *tasks, errbuf *err);

/* Runs scontrol ARGS... (argv[0] "scontrol"); its output, stdout and stderr together, the
 * first n - 1 bytes in out (NUL-terminated).  0 when it exited 0, else -1 saying how it ended. */
int slurm_scontrol(char *const argv[], char *out, size_t n, errbuf *err);

/* `scontrol show job -o ID`: the job's JobState (RUNNING, COMPLETING, PENDING, COMPLETED...)
 * into state, and Restarts (the requeues SLURM has counted; -1 when it does not say).  1 when SLURM no longer knows the
 * job ("Invalid job id": ended and purged); -1 when scontrol cannot tell (not installed, no
 * controller), with the reason. */
int slurm_job_query(const char *job_id, char *state, size_t n, int *restarts, errbuf *err);

#endif
