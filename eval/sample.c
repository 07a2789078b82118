// sample.c: sampling from a model on either backend, and the `sample` command.
#include "eval/sample.h"

#include <math.h>      // exp
#include <stdlib.h>    // qsort, strtol, strtod
#include <string.h>    // strcmp

#include "core/checkpoint.h"  // checkpoint_resolve, checkpoint_list_newest_first, checkpoint_load
#include "core/config.h"      // config_parse
#include "core/rng.h"         // splitmix64 for the sampling generator

// ---------------------------------------------------------------------------------------------
// splitmix64: tiny, full-period over 2^64 states, and its state is one integer to checkpoint.
unsigned long long sample_rng_seed(unsigned long long seed) { return seed ^ 0x5DEECE66Dull; }

static unsigned long long rng_next(unsigned long long *state) {
    return splitmix64_mix(*state += SPLITMIX64_GAMMA);
}

double sample_rng_uniform(unsigned long long *state) {
    return (double)(rng_next(state) >> 11) * (1.0 / 9007199254740992.0);  // / 2^53
}

static int cmp_float_desc(const void *a, const void *b) {
    float x = *(const float *)a, y = *(const float *)b;
    return (x < y) - (x > y);
}

int sample_pick(const float *logits, int vocab, double temperature, int top_k, unsigned long long *rng,
                float *scratch) {
    int best = 0;
    for (int i = 1; i < vocab; i++)
        if (logits[i] > logits[best]) best = i;
    if (temperature <= 0) return best;
    // Threshold: the k-th largest logit (everything below it gets probability 0).
    float threshold = -INFINITY;
    if (top_k > 0 && top_k < vocab) {
        memcpy(scratch, logits, (size_t)vocab * sizeof(float));
        qsort(scratch, (size_t)vocab, sizeof(float), cmp_float_desc);
        threshold = scratch[top_k - 1];
    }
    // Softmax of logits / temperature, shifted by the max so exp never overflows.
    double max = logits[best], sum = 0.0;
    for (int i = 0; i < vocab; i++) {
        double p = logits[i] >= threshold ? exp((logits[i] - max) / temperature) : 0.0;
        scratch[i] = (float)p;
        sum += p;
    }
    double u = sample_rng_uniform(rng) * sum, acc = 0.0;
    int last = best;
    for (int i = 0; i < vocab; i++) {
        if (scratch[i] <= 0.0f) continue;
        acc += scratch[i];
        last = i;
        if (u < acc) return i;
    }
    return last;  // rounding left u at the very top: the last candidate
}

int sample_generate(Backend *b, int32_t *tokens, int n_prompt, int n_new, double temperature, int top_k,
                    unsigned long long *rng) {
    const ModelConfig *mc = &backend_config(b)->model;
    int vocab = mc->vocab_size;
    float *logits = xmalloc((size_t)mc->padded_vocab_size * sizeof(float));           // (Vp)
    float *scratch = xmalloc((size_t)vocab * sizeof(float));                          // (V)
    int n = n_prompt;
    for (int i = 0; i < n_new; i++) {
        int ctx = n < b->T ? n : b->T;  // the model sees its last T tokens at most
        backend_next_logits(b, tokens + (n - ctx), ctx, logits);
        tokens[n++] = sample_pick(logits, vocab, temperature, top_k, rng, scratch);
    }
    free(logits);
    free(scratch);
    return n;
}

int32_t sample_default_start(int vocab_size) { return vocab_size > GPT2_EOT ? GPT2_EOT : 0; }

// ---------------------------------------------------------------------------------------------
// The command.

static void sample_usage(FILE *f) {
    fprintf(f,
            "usage: train_gpt sample --checkpoint PATH [--prompt TEXT] [--tokens N] [--temperature T]\n"
            "                        [--top-k K] [--seed S] [--device cpu|gpu|auto]\n"
            "  --checkpoint PATH  a step_*.ckpt file, or a run or checkpoint directory or its 'latest' file\n"
            "                     (the newest checkpoint that loads)\n"
            "  --prompt TEXT      text to continue (default: start from <|endoftext|>)\n"
            "  --tokens N         tokens to generate (default 64)\n"
            "  --temperature T    softmax temperature, 0 = greedy (default 1.0)\n"
            "  --top-k K          sample among the K most likely tokens, 0 = all (default 40)\n"
            "  --seed S           RNG seed (default 1337)\n"
            "  --device D         cpu, gpu or auto (default auto: the GPU when there is one and it runs\n"
            "                     the checkpoint's config, else the CPU)\n");
}

// Builds the model a checkpoint describes (its stored config) on the chosen device and loads its
// parameters. 0; -1 with e when the checkpoint is the problem; -2 with e when the device is (nothing
// left allocated either way). note: the device note, if any.
static int open_model(const char *path, DeviceKind device, Backend *model, Config *cfg, long long *step,
                      char *note, int note_len, ErrBuf *e) {
    char *cfg_text = checkpoint_read_config(path, e);
    if (!cfg_text) return -1;
    int rc = config_parse(cfg_text, path, NULL, 0, cfg, e);
    free(cfg_text);
    if (rc != 0) return -1;
    // One sequence of up to seq_len tokens; the parameters come from the checkpoint.
    int kind = backend_choose_device(cfg, device, 1, cfg->model.seq_len, "sampling", NULL, note, note_len, e);
    if (kind < 0) return -2;
    if (backend_init(model, cfg, (DeviceKind)kind, 1, cfg->model.seq_len, cfg->train.seed, 1, NULL, e) != 0)
        return -2;
    float *params = xmalloc(backend_table(model)->total * sizeof(float));
    int n_delayed;
    AttnDelayedState *delayed = backend_delayed_state(model, &n_delayed);
    CheckpointState st = {.model = &backend_config(model)->model, .table = backend_table(model), .params = params,
                          .delayed = delayed, .n_delayed = n_delayed};
    rc = checkpoint_load(path, &st, e) == 0 ? 0 : -1;  // (a file at odds with its own config is a bad file)
    if (rc == 0) backend_set_state(model, params, NULL, NULL, 0);
    else backend_free(model);
    free(params);
    *step = st.train_step;
    return rc;
}

int sample_resolve_checkpoint(const char *arg, char *out, size_t out_len, ErrBuf *e) {
    char where[4096];
    int is_file;
    if (checkpoint_resolve(arg, where, sizeof where, &is_file, e) != 0) return -1;
    if (is_file) {
        snprintf(out, out_len, "%s", where);
        return 0;
    }
    char **paths;
    const int n = checkpoint_list_newest_first(where, &paths);
    if (n == 0) return errf(e, "%s: no checkpoint in %s (no 'latest' file and no step_*.ckpt)", arg, where);
    snprintf(out, out_len, "%s", paths[0]);
    checkpoint_list_free(paths, n);
    return 0;
}

int cmd_sample(int argc, char **argv) {
    const char *ckpt_arg = NULL, *prompt = NULL;
    long n_tokens = 64, top_k = 40;
    double temperature = 1.0;
    unsigned long long seed = 1337;
    DeviceKind device = DEVICE_AUTO;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        int has_val = i + 1 < argc;
        char *end = NULL;
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            sample_usage(stdout);
            return 0;
        } else if (!strcmp(a, "--checkpoint") && has_val) {
            ckpt_arg = argv[++i];
        } else if (!strcmp(a, "--prompt") && has_val) {
            prompt = argv[++i];
        } else if (!strcmp(a, "--tokens") && has_val) {
            n_tokens = strtol(argv[++i], &end, 10);
            if (*end || n_tokens < 0 || n_tokens > 1000000) goto bad_value;
        } else if (!strcmp(a, "--temperature") && has_val) {
            temperature = strtod(argv[++i], &end);
            if (*end || !(temperature >= 0) || temperature > 1e6) goto bad_value;
        } else if (!strcmp(a, "--top-k") && has_val) {
            top_k = strtol(argv[++i], &end, 10);
            if (*end || top_k < 0) goto bad_value;
        } else if (!strcmp(a, "--device") && has_val) {
            const char *d = argv[++i];
            if (!strcmp(d, "cpu")) device = DEVICE_CPU;
            else if (!strcmp(d, "gpu")) device = DEVICE_GPU;
            else if (!strcmp(d, "auto")) device = DEVICE_AUTO;
            else goto bad_value;
        } else if (!strcmp(a, "--seed") && has_val) {
            seed = strtoull(argv[++i], &end, 10);
            if (*end) goto bad_value;
        } else {
            fprintf(stderr, "train_gpt sample: error: %s option '%s'\n",
                    a[0] == '-' && !has_val ? "missing value or unknown" : "unknown", a);
            fprintf(stderr, "(run 'train_gpt sample --help' for the options)\n");
            return 2;
        }
        continue;
    bad_value:
        fprintf(stderr, "train_gpt sample: error: bad value '%s' for %s\n", argv[i], a);
        return 2;
    }
    if (!ckpt_arg) {
        fprintf(stderr, "train_gpt sample: error: --checkpoint is required (e.g. --checkpoint runs/tiny)\n");
        return 2;
    }

    // A file is used as given; a directory (or its `latest` pointer) gives its newest checkpoint
    // that loads, with a note for each newer one that does not (corrupt, diverged).
    ErrBuf e;
    char where[4096];
    int is_file;
    if (checkpoint_resolve(ckpt_arg, where, sizeof where, &is_file, &e) != 0) die_user(&e);
    char **paths;
    int n_paths;
    if (is_file) {
        paths = xcalloc(1, sizeof *paths);
        paths[0] = xstrdup(where);
        n_paths = 1;
    } else if ((n_paths = checkpoint_list_newest_first(where, &paths)) == 0) {
        errf(&e, "--checkpoint %s: no checkpoint in %s (no 'latest' file and no step_*.ckpt)", ckpt_arg, where);
        die_user(&e);
    }
    Backend model;
    Config cfg;
    long long step = 0;
    char note[1536], path[4096] = "";
    for (int i = 0; i < n_paths && !path[0]; i++) {
        int rc = open_model(paths[i], device, &model, &cfg, &step, note, sizeof note, &e);
        if (rc == 0) {
            snprintf(path, sizeof path, "%s", paths[i]);
        } else if (rc == -1 && i + 1 < n_paths) {
            fprintf(stderr, "note: skipping %s: %s\n", paths[i], e.msg);
        } else {
            if (rc == -1 && i > 0) {
                ErrBuf last = e;
                errf(&e, "no checkpoint of %s loads; the oldest one: %s", where, last.msg);
            }
            die_user(&e);
        }
    }
    checkpoint_list_free(paths, n_paths);
    if (note[0] && device == DEVICE_AUTO) fprintf(stderr, "%s\n", note);

    ErrBuf tok_err;
    Tokenizer *tok = tokenizer_load(NULL, &tok_err);
    if (!tok && prompt) {
        errf(&e, "--prompt needs the GPT-2 tokenizer: %s", tok_err.msg);
        die_user(&e);
    }
    int vocab = cfg.model.vocab_size;
    int32_t *tokens;
    int n_prompt;
    if (prompt) {
        uint32_t *ids = NULL;
        size_t n_ids = tokenizer_encode(tok, prompt, strlen(prompt), &ids);
        tokens = xmalloc((n_ids + (size_t)n_tokens + 1) * sizeof(int32_t));
        for (size_t i = 0; i < n_ids; i++) {
            if (ids[i] >= (uint32_t)vocab) {
                errf(&e, "the prompt's token %u is outside this model's vocabulary (model.vocab_size %d)", ids[i], vocab);
                die_user(&e);
            }
            tokens[i] = (int32_t)ids[i];
        }
        n_prompt = (int)n_ids;
        free(ids);
        if (n_prompt == 0) tokens[n_prompt++] = sample_default_start(vocab);
    } else {
        tokens = xmalloc(((size_t)n_tokens + 1) * sizeof(int32_t));
        tokens[0] = sample_default_start(vocab);
        n_prompt = 1;
    }
    fprintf(stderr, "sampling %ld tokens from %s (step %lld, temperature %g, top-k %ld, seed %llu, %s)\n", n_tokens,
            path, step, temperature, top_k, seed, backend_name(&model));
    unsigned long long rng = sample_rng_seed(seed);
    int n = sample_generate(&model, tokens, n_prompt, (int)n_tokens, temperature, (int)top_k, &rng);

    int first = prompt ? 0 : n_prompt;  // an unprompted sample prints only what was generated
    if (tok) {
        uint32_t *ids = xmalloc((size_t)(n - first + 1) * sizeof(uint32_t));
        for (int i = first; i < n; i++) ids[i - first] = (uint32_t)tokens[i];
        size_t len = 0;
        char *text = tokenizer_decode(tok, ids, (size_t)(n - first), &len);
        if (text) {
            fwrite(text, 1, len, stdout);
            printf("\n");
            free(text);
        } else {  // ids past the tokenizer's vocabulary (a model with a larger vocab_size)
            for (int i = first; i < n; i++) printf("%s%d", i > first ? " " : "", tokens[i]);
            printf("\n");
        }
        free(ids);
        tokenizer_free(tok);
    } else {
        fprintf(stderr, "note: no tokenizer (%s): printing token ids\n", tok_err.msg);
        for (int i = first; i < n; i++) printf("%s%d", i > first ? " " : "", tokens[i]);
        printf("\n");
    }
    free(tokens);
    backend_free(&model);
    return 0;
}
