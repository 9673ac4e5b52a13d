/* fsdpctl consolidate: a sharded checkpoint into a Hugging Face model directory, or a PEFT
 * adapter directory for an adapter job's (daemon/consolidate.h says what is written and how).
 * Also the option parsers fsdpctl merge shares (fsdpctl.h). */
#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "daemon/consolidate.h"
#include "ctl/fsdpctl.h"
#include "proto/job.h"
#include "proto/job_flags.h"

static void consolidate_usage(FILE *f) {
    fprintf(f, "usage: fsdpctl consolidate CKPT[/step-N] OUT [--dtype bf16|f32] [--shard-size 5GB] "
               "[--threads N] [--tokenizer-from MODEL_DIR] [--merge]\n"
               "  CKPT: a checkpoint directory (its latest checkpoint) or one step-N directory\n"
               "  the tokenizer files and generation_config.json come from MODEL_DIR, else from\n"
               "  the model directory the checkpoint's job started from (if any)\n"
               "  an adapter job's checkpoint gives a PEFT adapter directory, in --dtype when given,\n"
               "  else F32 as PEFT saves it; --merge also writes OUT/merged, the base model with the\n"
               "  adapters merged in (in --dtype, default bf16)\n");
}

int fsdpctl_parse_dtype(const char *text, st_dtype *out) {
    if (!strcmp(text, "bf16") || !strcmp(text, "bfloat16")) *out = ST_BF16;
    else if (!strcmp(text, "f32") || !strcmp(text, "float32")) *out = ST_F32;
    else return -1;
    return 0;
}

int fsdpctl_parse_shard_size(const char *text, uint64_t *out) {
    static job_config scratch;
    char arg[256];
    errbuf err;
    job_defaults(&scratch);
    if (snprintf(arg, sizeof arg, "--output.shard_size=%s", text) >= (int)sizeof arg ||
        job_apply_override(&scratch, arg, &err))
        return -1;
    *out = (uint64_t)scratch.output.shard_size;
    return 0;
}

int fsdpctl_parse_int(const char *text, int lo, int hi, int *out) {
    char *end;
    errno = 0;
    long v = strtol(text, &end, 10);
    if (!*text || *end || errno || v < lo || v > hi) return -1;
    *out = (int)v;
    return 0;
}

int fsdpctl_parse_threads(const char *text, int *out) { return fsdpctl_parse_int(text, 1, 256, out); }

/* Returns 0 to go on, or -1 to stop with *status (0 after --help, 2 for bad usage). */
static int parse_options(int argc, char **argv, consolidate_options *o, int *status) {
    static const struct option longopts[] = {
        {"dtype", required_argument, 0, 'd'},   {"shard-size", required_argument, 0, 'z'},
        {"threads", required_argument, 0, 't'}, {"tokenizer-from", required_argument, 0, 'k'},
        {"merge", no_argument, 0, 'm'},         {"help", no_argument, 0, 'h'},
        {0, 0, 0, 0}};
    *o = (consolidate_options){.dtype = ST_BF16, .adapter_dtype = ST_F32, .shard_bytes = CONSOLIDATE_SHARD_SIZE,
                               .threads = 4};
    int opt;
    optind = 1;
    opterr = 0;
    *status = 2;
    while ((opt = getopt_long(argc, argv, "", longopts, NULL)) != -1) {
        switch (opt) {
        case 'd':
            if (fsdpctl_parse_dtype(optarg, &o->dtype)) {
                fprintf(stderr, "fsdpctl consolidate: --dtype '%s' is not bf16 or f32\n", optarg);
                return -1;
            }
            o->adapter_dtype = o->dtype;
            break;
        case 'm': o->merge = 1; break;
        case 'z':
            if (fsdpctl_parse_shard_size(optarg, &o->shard_bytes)) {
                fprintf(stderr, "fsdpctl consolidate: --shard-size '%s' is not a size such as 5GB\n",
                        optarg);
                return -1;
            }
            break;
        case 't':
            if (fsdpctl_parse_threads(optarg, &o->threads)) {
                fprintf(stderr, "fsdpctl consolidate: --threads '%s' is not a number from 1 to 256\n",
                        optarg);
                return -1;
            }
            break;
        case 'k': o->tokenizer_from = optarg; break;
        case 'h':
            consolidate_usage(stdout);
            *status = 0;
            return -1;
        default:
            ctl_flag_error("consolidate", argv);
            consolidate_usage(stderr);
            return -1;
        }
    }
    if (argc - optind != 2) {
        consolidate_usage(stderr);
        return -1;
    }
    o->ckpt = argv[optind];
    o->out = argv[optind + 1];
    return 0;
}

int cmd_consolidate(int argc, char **argv) {
    consolidate_options o;
    consolidate_result r;
    int status;
    if (parse_options(argc, argv, &o, &status)) return status;
    o.result = &r;
    errbuf err = {{0}};
    if (consolidate(&o, &err)) {
        fprintf(stderr, "fsdpctl consolidate: %s\n", err.msg);
        return 1;
    }
    if (r.warning[0]) fprintf(stderr, "fsdpctl consolidate: warning: %s\n", r.warning);
    if (r.adapter) {
        printf("%s: step %" PRId64 " (%s): a PEFT adapter, %d tensors, %" PRIu64 " bytes %s, %d "
               "tokenizer file%s", o.out, r.step, r.ckpt, r.tensors, r.bytes, st_dtype_name(o.adapter_dtype),
               r.tokenizer_files, r.tokenizer_files == 1 ? "" : "s");
        if (o.merge)
            printf("; merged/: %d tensors in %d file%s, %" PRIu64 " bytes %s", r.merged_tensors,
                   r.merged_files, r.merged_files == 1 ? "" : "s", r.merged_bytes, st_dtype_name(o.dtype));
        printf(", %.2f s\n", r.seconds);
        return 0;
    }
    printf("%s: step %" PRId64 " (%s): %d tensors in %d file%s, %" PRIu64 " bytes %s, %d tokenizer "
           "file%s%s%s, %.2f s (%.2f GB/s)\n",
           o.out, r.step, r.ckpt, r.tensors, r.files, r.files == 1 ? "" : "s", r.bytes,
           st_dtype_name(o.dtype), r.tokenizer_files, r.tokenizer_files == 1 ? "" : "s",
           r.tokenizer_source[0] ? " from " : "", r.tokenizer_source, r.seconds,
           r.seconds > 0 ? (double)r.bytes / r.seconds / 1e9 : 0.0);
    return 0;
}
