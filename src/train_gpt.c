// train_gpt.c: main: the command line and command dispatch. The run loop (and the choice of
// device, which needs the micro-batch shape) lives in trainer.c; each subcommand in its module.
#include <stdio.h>   // printf, fprintf
#include <stdlib.h>  // strtol
#include <string.h>  // strcmp, strncmp

#include "attention_cpu.h"  // cmd_attn_check
#include "common.h"         // ErrBuf, die_user
#include "config.h"         // config_load
#include "model.h"          // param_table_build, model_print_summary for --dry-run
#include "sample.h"         // cmd_sample
#include "tokenizer.h"      // cmd_encode, cmd_decode, cmd_tokenize
#include "trainer.h"        // train_run

#define TRAIN_GPT_VERSION "0.1.0"
#define MAX_OVERRIDES 256

static void usage(FILE *f) {
    fprintf(f,
            "usage: train_gpt --config FILE [--set section.key=value]... [--device cpu|gpu|auto]\n"
            "                 [--resume [CHECKPOINT|latest]] [--stop-after N]\n"
            "       train_gpt --config FILE --dry-run [--world-size N] [--zero1] [--micro-batch N]\n"
            "       train_gpt COMMAND [options]    (COMMAND --help for its options)\n"
            "\n"
            "Training:\n"
            "  --config FILE        JSON run configuration, e.g. configs/tiny.json\n"
            "  --set KEY=VALUE      override one config key, e.g. --set train.steps=100 (repeatable)\n"
            "  --device D           cpu, gpu or auto (default: the config's train.device)\n"
            "  --resume [C]         continue the run in log.dir from its newest checkpoint, or from C\n"
            "  --zero1              shard the AdamW state across data-parallel ranks (= --set train.zero1=true)\n"
            "  multi-GPU / multi-node: start one process per GPU with RANK, WORLD_SIZE, MASTER_ADDR and\n"
            "                       MASTER_PORT set, or with srun or mpirun (docs/multi-gpu.md)\n"
            "  --stop-after N       stop after step N with a checkpoint, as a preemption would (for tests\n"
            "                       and preemption drills; the schedule still follows train.steps)\n"
            "  --dry-run            print the model's shapes, parameter count and memory plan, then exit\n"
            "    --world-size N     GPUs the plan assumes (default 1)\n"
            "    --zero1            the plan with the AdamW state sharded (as above)\n"
            "    --micro-batch N    sequences per GPU per micro-step in the plan (default: the config's)\n"
            "\n"
            "Commands:\n"
            "  sample      generate text from a checkpoint\n"
            "  attn-check  compare the attention precisions against an FP64 reference\n"
            "  encode      text to GPT-2 token ids\n"
            "  decode      GPT-2 token ids to text\n"
            "  tokenize    text files to token shards\n"
            "\n"
            "  --help, --version\n");
}

static int usage_error(const char *fmt, const char *arg) {
    fprintf(stderr, "train_gpt: error: ");
    fprintf(stderr, fmt, arg);
    fprintf(stderr, "\n(run 'train_gpt --help' for usage)\n");
    return 2;
}

// Parses a positive int option value; -1 if it is not one.
static long parse_positive(const char *s) {
    char *end;
    long v = strtol(s, &end, 10);
    return (*end || end == s || v <= 0 || v > 1000000000L) ? -1 : v;
}

int main(int argc, char **argv) {
    if (argc >= 2 && argv[1][0] != '-') {
        const char *cmd = argv[1];
        if (!strcmp(cmd, "sample")) return cmd_sample(argc - 1, argv + 1);
        if (!strcmp(cmd, "attn-check")) return cmd_attn_check(argc - 1, argv + 1);
        if (!strcmp(cmd, "encode")) return cmd_encode(argc - 1, argv + 1);
        if (!strcmp(cmd, "decode")) return cmd_decode(argc - 1, argv + 1);
        if (!strcmp(cmd, "tokenize")) return cmd_tokenize(argc - 1, argv + 1);
        return usage_error("unknown command '%s' (commands: sample, attn-check, encode, decode, tokenize)", cmd);
    }

    const char *config_path = NULL, *device = NULL;
    const char *overrides[MAX_OVERRIDES + 3];
    int n_overrides = 0, dry_run = 0, zero1 = 0;
    long world_size = 1, micro_batch = 0, stop_after = 0;
    TrainOptions topt = {0};
    char device_override[64], micro_override[64];
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        int has_val = i + 1 < argc;
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            usage(stdout);
            return 0;
        } else if (!strcmp(a, "--version")) {
            printf("train_gpt %s\n", TRAIN_GPT_VERSION);
            return 0;
        } else if (!strcmp(a, "--config")) {
            if (!has_val) return usage_error("%s needs a file name, e.g. --config configs/tiny.json", a);
            config_path = argv[++i];
        } else if (!strcmp(a, "--set")) {
            if (!has_val) return usage_error("%s needs section.key=value, e.g. --set train.steps=100", a);
            const char *kv = argv[++i];
            if (!strchr(kv, '=') || kv[0] == '=')
                return usage_error("--set '%s': expected section.key=value, e.g. --set train.steps=100", kv);
            if (n_overrides >= MAX_OVERRIDES) return usage_error("too many --set options (at most %s)", "256");
            overrides[n_overrides++] = kv;
        } else if (!strcmp(a, "--dry-run")) {
            dry_run = 1;
        } else if (!strcmp(a, "--zero1")) {
            zero1 = 1;
        } else if (!strcmp(a, "--world-size")) {
            if (!has_val || (world_size = parse_positive(argv[++i])) < 0)
                return usage_error("%s needs a positive integer", a);
        } else if (!strcmp(a, "--micro-batch")) {
            if (!has_val || (micro_batch = parse_positive(argv[++i])) < 0)
                return usage_error("%s needs a positive integer", a);
        } else if (!strcmp(a, "--stop-after")) {
            if (!has_val || (stop_after = parse_positive(argv[++i])) < 0)
                return usage_error("%s needs a positive step number", a);
        } else if (!strcmp(a, "--device")) {
            if (!has_val) return usage_error("%s needs cpu, gpu or auto", a);
            device = argv[++i];
            if (strcmp(device, "cpu") && strcmp(device, "gpu") && strcmp(device, "auto"))
                return usage_error("--device '%s': expected cpu, gpu or auto", device);
        } else if (!strcmp(a, "--resume")) {
            topt.resume = 1;
            if (has_val && strncmp(argv[i + 1], "--", 2) != 0) topt.resume_from = argv[++i];
        } else {
            return usage_error(a[0] == '-' ? "unknown option '%s'" : "unexpected argument '%s'", a);
        }
    }
    if (!config_path)
        return usage_error("no config given%s: pass one with --config FILE, e.g. --config configs/tiny.json", "");
    if (device) {  // after the user's --set options, so the command-line flag wins
        snprintf(device_override, sizeof device_override, "train.device=%s", device);
        overrides[n_overrides++] = device_override;
    }
    if (micro_batch > 0) {
        snprintf(micro_override, sizeof micro_override, "train.micro_batch=%ld", micro_batch);
        overrides[n_overrides++] = micro_override;
    }
    if (zero1) overrides[n_overrides++] = "train.zero1=true";
    if (world_size != 1 && !dry_run)
        return usage_error("%s applies to --dry-run only: a training run's world size comes from its launcher "
                           "(RANK and WORLD_SIZE, srun or mpirun; see docs/multi-gpu.md)", "--world-size");

    ErrBuf e;
    Config c;
    if (config_load(config_path, overrides, n_overrides, &c, &e) != 0) die_user(&e);

    if (dry_run) {
        ParamTable t;
        param_table_build(&t, &c.model);
        model_print_summary(stdout, &c, &t, (int)world_size, c.train.zero1);
        param_table_free(&t);
        return 0;
    }
    topt.stop_after = stop_after;
    return train_run(&c, &topt);
}
