/* fsdpctl merge: a base model directory and a PEFT LoRA adapter directory into one Hugging
 * Face model directory with the adapters merged in (W + scale * B A, as PEFT's
 * merge_and_unload; daemon/consolidate.h, consolidate_merge). */
#include <getopt.h>
#include <inttypes.h>
#include <stdio.h>
#include <string.h>

#include "daemon/consolidate.h"
#include "ctl/fsdpctl.h"

static void merge_usage(FILE *f) {
    fprintf(f, "usage: fsdpctl merge MODEL_DIR PEFT_DIR OUT_DIR [--dtype bf16|f32] [--shard-size 5GB] "
               "[--threads N]\n"
               "  MODEL_DIR: the base model (Hugging Face); PEFT_DIR: adapter_config.json +\n"
               "  adapter_model.safetensors; OUT_DIR: the merged model (bf16 by default), with\n"
               "  MODEL_DIR's tokenizer files\n");
}

/* Returns 0 to go on, or -1 to stop with *status (0 after --help, 2 for bad usage). */
static int parse_options(int argc, char **argv, merge_options *o, int *status) {
    static const struct option longopts[] = {
        {"dtype", required_argument, 0, 'd'},   {"shard-size", required_argument, 0, 'z'},
        {"threads", required_argument, 0, 't'}, {"help", no_argument, 0, 'h'},
        {0, 0, 0, 0}};
    *o = (merge_options){.dtype = ST_BF16, .shard_bytes = CONSOLIDATE_SHARD_SIZE, .threads = 4};
    int opt;
    optind = 1;
    opterr = 0;
    *status = 2;
    while ((opt = getopt_long(argc, argv, "", longopts, NULL)) != -1) {
        const char *bad = NULL;
        switch (opt) {
        case 'd': bad = fsdpctl_parse_dtype(optarg, &o->dtype) ? "--dtype '%s' is not bf16 or f32" : NULL; break;
        case 'z':
            bad = fsdpctl_parse_shard_size(optarg, &o->shard_bytes) ? "--shard-size '%s' is not a size such as 5GB" : NULL;
            break;
        case 't':
            bad = fsdpctl_parse_threads(optarg, &o->threads) ? "--threads '%s' is not a number from 1 to 256" : NULL;
            break;
        case 'h':
            merge_usage(stdout);
            *status = 0;
            return -1;
        default:
            ctl_flag_error("merge", argv);
            merge_usage(stderr);
            return -1;
        }
        if (bad) {
            fprintf(stderr, "fsdpctl merge: ");
            fprintf(stderr, bad, optarg);
            fprintf(stderr, "\n");
            return -1;
        }
    }
    if (argc - optind != 3) {
        merge_usage(stderr);
        return -1;
    }
    o->model_dir = argv[optind];
    o->adapter_dir = argv[optind + 1];
    o->out = argv[optind + 2];
    return 0;
}

int cmd_merge(int argc, char **argv) {
    merge_options o;
    consolidate_result r;
    int status;
    if (parse_options(argc, argv, &o, &status)) return status;
    o.result = &r;
    errbuf err = {{0}};
    if (consolidate_merge(&o, &err)) {
        fprintf(stderr, "fsdpctl merge: %s\n", err.msg);
        return 1;
    }
    printf("%s: %s merged into %s: %d tensors in %d file%s, %" PRIu64 " bytes %s, %d tokenizer "
           "file%s, %.2f s\n",
           o.out, o.adapter_dir, o.model_dir, r.tensors, r.files, r.files == 1 ? "" : "s", r.bytes,
           st_dtype_name(o.dtype), r.tokenizer_files, r.tokenizer_files == 1 ? "" : "s", r.seconds);
    return 0;
}
