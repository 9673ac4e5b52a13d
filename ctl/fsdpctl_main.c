/* fsdpctl: offline tools and the client of a running job's status socket. */
#include <stdio.h>
#include <string.h>

#include "ctl/fsdpctl.h"

typedef struct subcommand {
    const char *name;
    int (*run)(int argc, char **argv);
    const char *usage;
} subcommand;

static const subcommand subcommands[] = {
    {"inspect", cmd_inspect, "inspect MODEL_DIR\n  fsdpctl inspect --rope CONFIG"},
    {"init", cmd_init,
     "init --model-config CFG.json --out DIR [--seed N] [--dtype f32|bf16] [--shard-size 5GB]\n"
     "                [--tokenizer PATH [--template TEMPLATE]]"},
    {"reference", cmd_reference,
     "reference MODEL_DIR BATCH.safetensors --out OUT.safetensors [--adamw lr,b1,b2,eps,wd]\n"
     "                    [--backend cpu|cuda] [--adapter PEFT_DIR] [--quant nf4]"},
    {"compare", cmd_compare,
     "compare A.safetensors B.safetensors [--rtol R] [--prefix P] [--total-rtol R] [--subset]\n"
     "                  [--peft-default]"},
    {"synth", cmd_synth,
     "synth --out FILE [--records N] [--seq-len T] [--vocab V] [--alphabet A] [--seed S]"},
    {"tokenize", cmd_tokenize,
     "tokenize --from-safetensors FILE --out CACHE [--vocab V]\n"
     "  fsdpctl tokenize --tokenizer PATH (--text TEXT | --decode \"1 2 3\" | --jsonl FILE)\n"
     "                   [--no-add-special] [--split-special] [--json]\n"
     "  fsdpctl tokenize --tokenizer PATH --data FILE.jsonl --format alpaca|chat|text --seq-len N\n"
     "                   [--template llama3|llama2|chatml|qwen2|qwen2.5|qwen3|mistral|mistral-v3|\n"
     "                    mistral-tekken|alpaca|auto]\n"
     "                   [--out CACHE] [--show K]\n"
     "                   [--dump-jsonl OUT] [--no-truncate] [--on-bad-record fail|skip] [--threads N]"},
    {"consolidate", cmd_consolidate,
     "consolidate CKPT[/step-N] OUT [--dtype bf16|f32] [--shard-size 5GB] [--threads N] "
     "[--tokenizer-from MODEL_DIR] [--merge]"},
    {"merge", cmd_merge, "merge MODEL_DIR PEFT_DIR OUT_DIR [--dtype bf16|f32] [--shard-size 5GB] [--threads N]"},
    {"status", cmd_status, "status [--socket PATH | --job-id ID | --output DIR] [--json] [--timeout S]"},
    {"checkpoint", cmd_checkpoint, "checkpoint [--socket PATH | --job-id ID] [--json] [--timeout S]"},
    {"stop", cmd_stop, "stop [--socket PATH | --job-id ID] [--json] [--timeout S]"},
    {"plot", cmd_plot, "plot METRICS.jsonl --out FILE.svg"},
    {"fabric", cmd_fabric, "fabric [--no-require]"},
    {"plan", cmd_plan,
     "plan JOB.json [--nodes N] [--gpus-per-node G] [--gpu NAME] [--rates FILE] [--net-gbps X] [--json]\n"
     "               [--section.key=value ...]"},
    {"generate", cmd_generate,
     "generate MODEL_DIR (--prompt TEXT | --prompt-ids \"1 2 3\" | --chat FILE.jsonl) ... [--adapter PEFT_DIR]\n"
     "                   [--quant nf4] [--template T] [--max-new-tokens N] [--greedy | --temperature T\n"
     "                   --top-p P --top-k K --seed S] [--stop TEXT|ID ...] [--ignore-eos] [--batch N]\n"
     "                   [--backend cpu|cuda] [--json]"},
    {"quantize", cmd_quantize,
     "quantize --tensors IN.safetensors OUT.safetensors [--double-quant]\n"
     "  fsdpctl quantize MODEL_DIR OUT_DIR [--compute-dtype bf16|f16|f32]"},
};

static void usage(FILE *f) {
    fprintf(f, "usage: fsdpctl COMMAND [ARGS]   (fsdpctl COMMAND --help: the command's own)\ncommands:\n");
    for (size_t i = 0; i < sizeof subcommands / sizeof subcommands[0]; i++)
        fprintf(f, "  fsdpctl %s\n", subcommands[i].usage);
}

int main(int argc, char **argv) {
    if (argc < 2 || !strcmp(argv[1], "-h") || !strcmp(argv[1], "--help")) {
        usage(argc < 2 ? stderr : stdout);
        return argc < 2 ? 2 : 0;
    }
    for (size_t i = 0; i < sizeof subcommands / sizeof subcommands[0]; i++)
        if (!strcmp(argv[1], subcommands[i].name)) return subcommands[i].run(argc - 1, argv + 1);
    fprintf(stderr, "fsdpctl: unknown command '%s'\n", argv[1]);
    usage(stderr);
    return 2;
}
