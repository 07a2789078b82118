// passkey_cmd.c: `train_gpt passkey generate` (passkey sequences to a token shard and a JSON index)
// and `train_gpt passkey eval` (a checkpoint's accuracy per distance, on either backend).
#include <stdlib.h>  // strtol, strtoull
#include <string.h>  // strcmp, strlen

#include "core/backend.h"     // Backend
#include "core/checkpoint.h"  // checkpoint_read_config, checkpoint_load
#include "core/config.h"      // config_parse
#include "dataloader.h"       // shard_write
#include "eval/passkey.h"
#include "eval/sample.h"      // sample_resolve_checkpoint

static void passkey_usage(FILE *f) {
    fprintf(f,
            "usage: train_gpt passkey generate --data GLOB --seq-len T --out FILE.bin [options]\n"
            "       train_gpt passkey eval --checkpoint PATH [--data GLOB] [options]\n"
            "\n"
            "Passkey retrieval (RULER-style): a 5-7 digit number in a key sentence hidden in real text,\n"
            "asked for at the end of a sequence of exactly T tokens:\n"
            "  filler | \\nThe pass key is 7 1 4 3 2. Remember it.\\n | DISTANCE filler tokens |\n"
            "  \\nWhat is the pass key? The pass key is | 7 1 4 3 2\n"
            "one digit per GPT-2 token, so the answer is the sequence's last 5-7 tokens. Filler rows\n"
            "come from the token shards of --data in a seeded order, the numbers from the seed: the\n"
            "same options give the same sequences.\n"
            "\n"
            "generate: writes FILE.bin (an llm.c token shard: the sequences one after another, T tokens\n"
            "  each, distances in the order given, --samples of each) and FILE.json (T, and per sequence\n"
            "  its distance, number, and the positions of the key, the question and the answer).\n"
            "eval: loads the checkpoint (a step_*.ckpt file, or a run or checkpoint directory: its\n"
            "  newest), T = its model.seq_len, and prints per distance: exact-match accuracy of greedy\n"
            "  decoding of the answer (with its binomial standard error), the fraction of answer digits\n"
            "  right, the teacher-forced probability of the whole answer (mean, standard error), its mean\n"
            "  log-probability, and chance (10^-digits).\n"
            "\n"
            "options:\n"
            "  --data GLOB          token shards for the filler (eval: default the config's data.val)\n"
            "  --seq-len T          tokens per sequence (generate; eval uses the model's)\n"
            "  --samples N          sequences per distance (default 50)\n"
            "  --distances D,D,...  distances (default: --min-distance, doubling while it fits, then the\n"
            "                       largest that fits T: the key at the start)\n"
            "  --min-distance D     the first default distance (default 512, or for a model too short for\n"
            "                       it the largest power of two that fits)\n"
            "  --seed S             seed of the filler rows and the numbers (default 1)\n"
            "  --vocab-size V       generate: the shards' vocabulary (default 50257)\n"
            "  --batch B            eval: sequences per forward (default 4)\n"
            "  --device D           eval: cpu, gpu or auto (default auto)\n"
            "  --json FILE          eval: also write the report as JSON\n");
}

static int bad(const char *fmt, const char *arg) {
    fprintf(stderr, "train_gpt passkey: error: ");
    fprintf(stderr, fmt, arg);
    fprintf(stderr, "\n(run 'train_gpt passkey --help' for the options)\n");
    return 2;
}

static int parse_int(const char *s, long lo, long hi, long *out) {
    char *end;
    long v = strtol(s, &end, 10);
    if (*end || end == s || v < lo || v > hi) return -1;
    *out = v;
    return 0;
}

// "512,1024,2048" -> distances; -1 if malformed.
static int parse_distances(const char *s, int *out, int cap) {
    int n = 0;
    const char *p = s;
    while (*p) {
        char *end;
        long v = strtol(p, &end, 10);
        if (end == p || v < 0 || v > 1 << 24 || n >= cap || (*end && *end != ',')) return -1;
        out[n++] = (int)v;
        p = *end ? end + 1 : end;
    }
    return n > 0 ? n : -1;
}

static int load_template(PasskeyTemplate *t, ErrBuf *e) {
    ErrBuf e2;
    Tokenizer *tok = tokenizer_load(NULL, &e2);
    if (!tok) return errf(e, "passkey sequences need the GPT-2 tokenizer: %s", e2.msg);
    int rc = passkey_template_init(t, tok, e);
    tokenizer_free(tok);
    return rc;
}

// The sidecar of FILE.bin: FILE.json.
static void sidecar_path(const char *out, char *path, size_t cap) {
    size_t n = strlen(out);
    if (n > 4 && strcmp(out + n - 4, ".bin") == 0) n -= 4;
    snprintf(path, cap, "%.*s.json", (int)n, out);
}

static int write_index(const PasskeySet *s, const char *path, ErrBuf *e) {
    size_t cap = 256 + (size_t)s->n * 160, len = 0;
    char *text = xmalloc(cap);
    len += (size_t)snprintf(text + len, cap - len, "{\"seq_len\": %d, \"sequences\": [", s->L);
    for (int i = 0; i < s->n; i++) {
        const PasskeyItem *it = &s->items[i];
        len += (size_t)snprintf(text + len, cap - len,
                                "%s\n  {\"distance\": %d, \"digits\": \"%s\", \"key_pos\": %d, \"question_pos\": %d, "
                                "\"answer_pos\": %d}",
                                i ? "," : "", it->distance, it->digits, it->key_pos, it->question_pos, it->answer_pos);
    }
    len += (size_t)snprintf(text + len, cap - len, "\n]}\n");
    int rc = write_file_atomic(path, text, len, e);
    free(text);
    return rc;
}

int cmd_passkey(int argc, char **argv) {
    if (argc < 2 || !strcmp(argv[1], "--help") || !strcmp(argv[1], "-h")) {
        passkey_usage(argc < 2 ? stderr : stdout);
        return argc < 2 ? 2 : 0;
    }
    const char *verb = argv[1];
    int generate = !strcmp(verb, "generate");
    if (!generate && strcmp(verb, "eval"))
        return bad("unknown subcommand '%s' (expected generate or eval)", verb);
    const char *data = NULL, *out = NULL, *ckpt_arg = NULL, *json = NULL, *dist_arg = NULL;
    long seq_len = 0, samples = 50, min_distance = 0, vocab = 50257, batch = 4;  // min_distance 0: the default
    unsigned long long seed = 1;
    DeviceKind device = DEVICE_AUTO;
    for (int i = 2; i < argc; i++) {
        const char *a = argv[i];
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            passkey_usage(stdout);
            return 0;
        }
        if (!v) return bad("option '%s' needs a value (or is unknown)", a);
        i++;
        char *end;
        if (!strcmp(a, "--data")) data = v;
        else if (generate && !strcmp(a, "--out")) out = v;
        else if (!generate && !strcmp(a, "--checkpoint")) ckpt_arg = v;
        else if (!generate && !strcmp(a, "--json")) json = v;
        else if (!strcmp(a, "--distances")) dist_arg = v;
        else if (generate && !strcmp(a, "--seq-len")) {
            if (parse_int(v, 2, 1 << 20, &seq_len)) return bad("--seq-len '%s': expected an integer in [2, 1048576]", v);
        } else if (!strcmp(a, "--samples")) {
            if (parse_int(v, 1, 1000000, &samples)) return bad("--samples '%s': expected a positive integer", v);
        } else if (!strcmp(a, "--min-distance")) {
            if (parse_int(v, 1, 1 << 24, &min_distance)) return bad("--min-distance '%s': expected a positive integer", v);
        } else if (generate && !strcmp(a, "--vocab-size")) {
            if (parse_int(v, 1, 1 << 30, &vocab)) return bad("--vocab-size '%s': expected a positive integer", v);
        } else if (!generate && !strcmp(a, "--batch")) {
            if (parse_int(v, 1, 4096, &batch)) return bad("--batch '%s': expected an integer in [1, 4096]", v);
        } else if (!strcmp(a, "--seed")) {
            seed = strtoull(v, &end, 10);
            if (*end || end == v) return bad("--seed '%s': expected a non-negative integer", v);
        } else if (!generate && !strcmp(a, "--device")) {
            if (!strcmp(v, "cpu")) device = DEVICE_CPU;
            else if (!strcmp(v, "gpu")) device = DEVICE_GPU;
            else if (!strcmp(v, "auto")) device = DEVICE_AUTO;
            else return bad("--device '%s': expected cpu, gpu or auto", v);
        } else {
            return bad("unknown option '%s'", a);
        }
    }
    if (generate && (!data || !out || !seq_len))
        return bad("%s needs --data GLOB, --seq-len T and --out FILE.bin", "generate");
    if (!generate && !ckpt_arg) return bad("%s needs --checkpoint PATH (e.g. --checkpoint runs/tiny)", "eval");

    ErrBuf e;
    PasskeyTemplate t;
    if (load_template(&t, &e) != 0) die_user(&e);

    Config cfg;
    char path[4096] = "";
    long long step = 0;
    if (!generate) {
        if (sample_resolve_checkpoint(ckpt_arg, path, sizeof path, &e) != 0) die_user(&e);
        char *cfg_text = checkpoint_read_config(path, &e);
        if (!cfg_text) die_user(&e);
        if (config_parse(cfg_text, path, NULL, 0, &cfg, &e) != 0) die_user(&e);
        free(cfg_text);
        seq_len = cfg.model.seq_len;
        vocab = cfg.model.vocab_size;
        if (!data) data = cfg.data.val;
        if (!data[0]) {
            errf(&e, "%s: the checkpoint's config has no data.val: pass --data GLOB", path);
            die_user(&e);
        }
    }
    int distances[PASSKEY_MAX_DISTANCES], n_distances;
    if (dist_arg) {
        if ((n_distances = parse_distances(dist_arg, distances, PASSKEY_MAX_DISTANCES)) < 0)
            return bad("--distances '%s': expected comma-separated non-negative integers (at most 16)", dist_arg);
    } else {
        if (min_distance == 0) {  // 512, or for a short model the largest power of two that fits
            const int max = passkey_max_distance(&t, (int)seq_len, PASSKEY_MAX_DIGITS);
            for (min_distance = 512; min_distance > 1 && min_distance > max; min_distance /= 2) {}
        }
        n_distances = passkey_distances(&t, (int)seq_len, (int)min_distance, distances, PASSKEY_MAX_DISTANCES);
    }
    if (!dist_arg && n_distances == 0) {
        errf(&e, "--min-distance %ld does not fit a passkey sequence of %ld tokens (at most %d)", min_distance, seq_len,
             passkey_max_distance(&t, (int)seq_len, PASSKEY_MAX_DIGITS));
        die_user(&e);
    }
    PasskeySet set;
    if (passkey_set_make(&set, &t, data, (int)vocab, (int)seq_len, distances, n_distances, (int)samples, seed, &e) != 0)
        die_user(&e);

    if (generate) {
        char index[4200];
        sidecar_path(out, index, sizeof index);
        if (shard_write(out, set.tokens, (long long)set.n * set.L, &e) != 0 || write_index(&set, index, &e) != 0)
            die_user(&e);
        printf("passkey: %d sequences of %d tokens (%d distances x %ld) -> %s, %s\n", set.n, set.L, n_distances,
               samples, out, index);
        passkey_set_free(&set);
        return 0;
    }

    char note[1536];
    int kind = backend_choose_device(&cfg, device, (int)batch, cfg.model.seq_len, "passkey evaluation", NULL, note,
                                     sizeof note, &e);
    if (kind < 0) die_user(&e);
    if (note[0] && device == DEVICE_AUTO) fprintf(stderr, "%s\n", note);
    Backend model;
    if (backend_init(&model, &cfg, (DeviceKind)kind, (int)batch, cfg.model.seq_len, cfg.train.seed, 1, NULL, &e) != 0)
        die_user(&e);
    float *params = xmalloc(backend_table(&model)->total * sizeof(float));
    int n_delayed;
    AttnDelayedState *delayed = backend_delayed_state(&model, &n_delayed);
    CheckpointState st = {.model = &backend_config(&model)->model, .table = backend_table(&model), .params = params,
                          .delayed = delayed, .n_delayed = n_delayed};
    if (checkpoint_load(path, &st, &e) != 0) die_user(&e);
    backend_set_state(&model, params, NULL, NULL, 0);
    free(params);
    step = st.train_step;

    PasskeyReport rep;
    passkey_evaluate(&set, passkey_backend_forward, &model, (int)batch, cfg.model.vocab_size, cfg.model.padded_vocab_size,
                     &rep);
    printf("passkey: %s (step %lld, %s attention, %s), %d sequences of %d tokens, seed %llu, filler from %s\n", path,
           step, attn_precision_name(cfg.precision.attention), backend_name(&model), set.n, set.L, seed, data);
    passkey_report_print(stdout, &rep, "  ");
    if (json) {
        char *buf = NULL;
        size_t len = 0;
        FILE *mem = open_memstream(&buf, &len);
        if (!mem) FATAL("open_memstream failed (out of memory?)");
        fprintf(mem, "{\"checkpoint\": \"%s\", \"step\": %lld, \"seed\": %llu, \"passkey\": ", path, step, seed);
        passkey_report_json(mem, &rep);
        fprintf(mem, "}\n");
        fclose(mem);
        int rc = write_file_atomic(json, buf, len, &e);
        free(buf);
        if (rc != 0) die_user(&e);
    }
    passkey_set_free(&set);
    backend_free(&model);
    return 0;
}
