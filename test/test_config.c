// test_config.c: config defaults, the shipped configs, strict validation messages, --set
// overrides, the resolved-JSON round trip (on fresh random configs) and file errors.
// Runs from the repository root (test/run_tests.sh does cd there).
#include <cjson/cJSON.h>  // independent reading of config_to_json's output
#include <dirent.h>       // listing configs/
#include <math.h>         // fabs, ldexp
#include <stdarg.h>       // has_all's variadic needles
#include <string.h>       // strstr, memcmp
#include <sys/stat.h>     // stat of the written file
#include <unistd.h>       // unlink, rmdir

#include "core/config.h"
#include "test.h"

// A minimal valid document with room for one extra section body appended by the caller.
#define MODEL_OK "\"model\": {\"d_model\": 128, \"n_layer\": 2, \"n_head\": 2, \"ffn_hidden\": 352, \"seq_len\": 64}"

static ErrBuf err;
static Config cfg;

static int parse(const char *json, const char *const *ov, int n_ov) {
    memset(&err, 0, sizeof err);
    return config_parse(json, "t/x.json", ov, n_ov, &cfg, &err);
}

// True when msg contains every needle (NULL-terminated list); prints what is missing.
static int has_all(const char *msg, ...) {
    va_list ap;
    va_start(ap, msg);
    int ok = 1;
    for (const char *s = va_arg(ap, const char *); s; s = va_arg(ap, const char *))
        if (!strstr(msg, s)) {
            printf("# message lacks '%s'\n", s);
            ok = 0;
        }
    va_end(ap);
    return ok;
}

// Expects the document to be rejected with a message holding every needle.
#define REJECTS(name, json, ...)                                                                   \
    do {                                                                                          \
        int rc_ = parse(json, NULL, 0);                                                           \
        CHECK(rc_ == -1 && has_all(err.msg, "t/x.json: ", __VA_ARGS__, (const char *)NULL), name, \
              "rc %d, message: %s", rc_, err.msg);                                                \
    } while (0)

static void test_defaults(void) {
    Config c;
    memset(&c, 0x5a, sizeof c);
    config_defaults(&c);
    CHECK(c.model.vocab_size == 50257 && c.model.d_model == 0 && c.model.position == POS_ROPE &&
          c.model.rope_theta == 10000.0 && !c.model.qk_norm && !c.model.tied_embeddings &&
          c.model.norm_eps == 1e-5 && c.model.init_std == 0.02,
          "defaults model", "vocab %d d_model %d", c.model.vocab_size, c.model.d_model);
    CHECK(c.data.train[0] == 0 && c.data.shuffle == 1 && c.data.seed == 1337, "defaults data", "seed %llu",
          c.data.seed);
    const TrainConfig *t = &c.train;
    CHECK(t->device == DEVICE_AUTO && t->micro_batch == 8 && t->batch_tokens == 0 && t->steps == 1000 &&
          t->lr == 6e-4 && t->min_lr_ratio == 0.1 && t->warmup_steps == 0 && t->schedule == SCHED_COSINE &&
          t->wsd_decay_fraction == 0.2 && t->weight_decay == 0.1 && t->beta1 == 0.9 && t->beta2 == 0.95 &&
          t->eps == 1e-8 && t->grad_clip == 1.0 && t->seed == 42 && !t->recompute && t->threads == 0 &&
          t->max_bad_steps == 5,
          "defaults train", "lr %g steps %d", t->lr, t->steps);
    const PrecisionConfig *p = &c.precision;
    CHECK(p->attention == ATTN_BF16 && p->attention_grad_format == GRADFMT_E4M3 &&
          p->attention_scaling == SCALING_BLOCK && p->attention_p_scale == 256 && p->attention_amax_history == 16 &&
          p->attention_block_q == 128 && p->attention_block_k == 128 && p->attention_keep_codes == 1 &&
          p->attention_center_keys == CENTER_KEYS_OFF && p->attention_rowsum_correction == 0 &&
          p->linear == LINEAR_BF16 &&
          p->linear_grad_format == GRADFMT_E4M3 && p->linear_wgrad_blocks == WGRAD_BLOCKS_NONE &&
          p->linear_scaling == LINEAR_SCALING_CURRENT && p->linear_amax_history == 16 &&
          p->linear_fast_accum == FAST_ACCUM_NONE,
          "defaults precision", "attention %d", (int)p->attention);
    CHECK(c.eval.interval == 100 && c.eval.batches == 10 && c.eval.sample_interval == 0 && c.eval.sample_tokens == 64 &&
          c.checkpoint.dir[0] == 0 && c.checkpoint.interval == 0 && c.checkpoint.keep == 3 && c.checkpoint.at_end == 1 && c.log.dir[0] == 0 &&
          c.log.interval == 1 && strcmp(c.log.metrics_file, "metrics.jsonl") == 0,
          "defaults eval/checkpoint/log", "metrics_file '%s'", c.log.metrics_file);
    // The 0x5a fill must be gone everywhere, padding included (the round trip relies on it).
    const unsigned char *bytes = (const unsigned char *)&c;
    size_t stale = 0;
    for (size_t i = 0; i < sizeof c; i++) stale += bytes[i] == 0x5a;
    CHECK(stale == 0, "defaults zero every byte first", "%zu bytes still hold the fill", stale);
}

// The parameter count of the shapes, from the formula of the configs' descriptions.
static long long param_count(const ModelConfig *m) {
    long long C = m->d_model, F = m->ffn_hidden, V = m->padded_vocab_size;
    return V * C * (m->tied_embeddings ? 1 : 2) + m->n_layer * (4 * C * C + 3 * C * F + 2 * C) + C;
}

static void test_roundtrip_of(const Config *c, const char *name) {
    char *json = config_to_json(c);
    Config back;
    ErrBuf e = {{0}};
    int rc = config_parse(json, c->source_path, NULL, 0, &back, &e);
    CHECK(rc == 0 && memcmp(&back, c, sizeof back) == 0, name, "rc %d (%s); JSON:\n%s", rc, e.msg, json);
    free(json);
}

static void test_shipped_configs(void) {
    DIR *d = opendir("configs");
    CHECK(d != NULL, "configs/ is readable", "run from the repository root");
    if (!d) return;
    int n = 0;
    struct dirent *ent;
    while ((ent = readdir(d))) {
        size_t len = strlen(ent->d_name);
        if (len < 6 || strcmp(ent->d_name + len - 5, ".json") != 0) continue;
        char path[512], name[600];
        snprintf(path, sizeof path, "configs/%s", ent->d_name);
        Config c;
        ErrBuf e = {{0}};
        int rc = config_load(path, NULL, 0, &c, &e);
        snprintf(name, sizeof name, "%s loads and validates", path);
        CHECK(rc == 0, name, "%s", e.msg);
        if (rc) continue;
        n++;
        snprintf(name, sizeof name, "%s has a description and data globs", path);
        CHECK(strlen(c.description) > 20 && c.data.train[0] && c.data.val[0], name, "description '%s'",
              c.description);
        snprintf(name, sizeof name, "%s round-trips through config_to_json", path);
        test_roundtrip_of(&c, name);
        if (strncmp(ent->d_name, "paper_", 6) == 0) {
            long long np = param_count(&c.model);
            char count[32];
            snprintf(count, sizeof count, "%lld", np);
            double target = strcmp(ent->d_name, "paper_569m.json") == 0    ? 569e6
                            : strcmp(ent->d_name, "paper_1p67b.json") == 0 ? 1.67e9
                                                                             : 5.29e9;
            snprintf(name, sizeof name, "%s: shapes as the paper's (within 1%%), count in the description", path);
            CHECK(fabs((double)np / target - 1) < 0.01 && strstr(c.description, count) &&
                      strstr(c.description, "exact shapes are unpublished") && c.model.head_dim == 128 &&
                      c.model.padded_vocab_size == 50304 && c.model.seq_len == 4096 && !c.model.tied_embeddings &&
                      c.train.batch_tokens == 524288,
                  name, "count %lld vs %.0f, head_dim %d", np, target, c.model.head_dim);
        }
    }
    closedir(d);
    CHECK(n >= 5, "all five shipped configs found", "found %d", n);
}

static void test_unknown_keys(void) {
    REJECTS("unknown nested key names path and allowed keys",
            "{" MODEL_OK ", \"train\": {\"lrr\": 0.1}}", "train.lrr", "unknown key",
            "allowed keys in train: device, micro_batch, batch_tokens, steps, lr,", "threads", "did you mean lr?");
    REJECTS("unknown top-level section lists the sections", "{" MODEL_OK ", \"modle\": {}}", "modle",
            "unknown section", "description, model, data, train, precision, eval, checkpoint, log");
    REJECTS("unknown key in precision", "{" MODEL_OK ", \"precision\": {\"p_scale\": 256}}",
            "precision.p_scale", "attention_p_scale, attention_amax_history");
    REJECTS("duplicate key", "{\"model\": {\"d_model\": 128, \"d_model\": 256}}", "model.d_model", "twice");
    REJECTS("section not an object", "{" MODEL_OK ", \"train\": [1, 2]}", "train: expected an object",
            "got an array");
    REJECTS("top level not an object", "[1, 2, 3]", "expected a JSON object at the top level");
}

static void test_types(void) {
    REJECTS("wrong type names key and type",
            "{\"model\": {\"d_model\": 128, \"n_layer\": 2, \"n_head\": \"12\", \"ffn_hidden\": 1, \"seq_len\": 8}}",
            "model.n_head: expected an integer, got string \"12\"");
    REJECTS("non-integral integer",
            "{\"model\": {\"d_model\": 128, \"n_layer\": 12.5, \"n_head\": 2, \"ffn_hidden\": 1, \"seq_len\": 8}}",
            "model.n_layer: expected an integer, got number 12.5");
    REJECTS("integer beyond int", "{" MODEL_OK ", \"train\": {\"steps\": 3e9}}", "train.steps", "expected an integer in");
    REJECTS("bool must be a JSON boolean", "{" MODEL_OK ", \"train\": {\"recompute\": 1}}",
            "train.recompute: expected true or false, got number 1");
    REJECTS("number expected", "{" MODEL_OK ", \"train\": {\"lr\": null}}", "train.lr: expected a number, got null");
    REJECTS("string expected", "{" MODEL_OK ", \"data\": {\"train\": 5}}", "data.train: expected a string");
    REJECTS("bad enum lists the allowed values", "{" MODEL_OK ", \"precision\": {\"attention\": \"fp9\"}}",
            "precision.attention", "\"fp32\", \"bf16\", \"fp8_naive\", \"fp8_hybrid\", \"fp8_dm\", \"fp8_dm_approx\"",
            "got string \"fp9\"");
    REJECTS("bad schedule enum", "{" MODEL_OK ", \"train\": {\"schedule\": \"cos\"}}", "train.schedule",
            "\"cosine\", \"linear\", \"wsd\", \"constant\"");
    REJECTS("negative seed", "{" MODEL_OK ", \"data\": {\"seed\": -1}}", "data.seed", "expected an integer in [0,");
}

static void test_ranges(void) {
    REJECTS("missing model size is required", "{\"model\": {\"n_layer\": 2, \"n_head\": 2, \"ffn_hidden\": 8, \"seq_len\": 8}}",
            "model.d_model is required");
    REJECTS("missing model section", "{\"train\": {\"lr\": 0.1}}", "model.d_model is required");
    REJECTS("d_model not divisible by n_head",
            "{\"model\": {\"d_model\": 130, \"n_layer\": 2, \"n_head\": 3, \"ffn_hidden\": 8, \"seq_len\": 8}}",
            "model.d_model: 130 is not divisible by model.n_head 3");
    REJECTS("head_dim 96 rejected, says 64 or 128",
            "{\"model\": {\"d_model\": 768, \"n_layer\": 2, \"n_head\": 8, \"ffn_hidden\": 8, \"seq_len\": 8}}",
            "model.n_head", "96", "64 or 128", "n_head 12 or 6");
    REJECTS("seq_len >= 1", "{\"model\": {\"d_model\": 128, \"n_layer\": 2, \"n_head\": 2, \"ffn_hidden\": 8, \"seq_len\": 0}}",
            "model.seq_len: must be in [1, 1048576], got 0");
    REJECTS("n_layer above the parameter table's 1024",
            "{\"model\": {\"d_model\": 128, \"n_layer\": 2000, \"n_head\": 2, \"ffn_hidden\": 8, \"seq_len\": 8}}",
            "model.n_layer: must be in [1, 1024], got 2000");
    REJECTS("duplicate section", "{" MODEL_OK ", \"model\": {}}", "model: section appears twice");
    REJECTS("lr > 0", "{" MODEL_OK ", \"train\": {\"lr\": 0}}", "train.lr: must be > 0, got 0");
    REJECTS("beta2 < 1", "{" MODEL_OK ", \"train\": {\"beta2\": 1.0}}", "train.beta2: must be in [0, 1), got 1");
    REJECTS("eps > 0", "{" MODEL_OK ", \"train\": {\"eps\": -1e-8}}", "train.eps: must be > 0");
    REJECTS("max_bad_steps >= 1", "{" MODEL_OK ", \"train\": {\"max_bad_steps\": 0}}", "train.max_bad_steps",
            "must be in [1, 1000000], got 0");
    REJECTS("max_bad_steps is an integer", "{" MODEL_OK ", \"train\": {\"max_bad_steps\": 2.5}}",
            "train.max_bad_steps");
    REJECTS("warmup <= steps", "{" MODEL_OK ", \"train\": {\"steps\": 10, \"warmup_steps\": 11}}",
            "train.warmup_steps", "train.steps = 10", "got 11");
    REJECTS("batch_tokens divisible by micro-batch tokens", "{" MODEL_OK ", \"train\": {\"batch_tokens\": 1000}}",
            "train.batch_tokens: 1000 is not a multiple of", "8 * 64 = 512");
    REJECTS("p_scale power of two", "{" MODEL_OK ", \"precision\": {\"attention_p_scale\": 300}}",
            "precision.attention_p_scale", "power of two", "got 300");
    REJECTS("block_q power of two", "{" MODEL_OK ", \"precision\": {\"attention_block_q\": 96}}",
            "precision.attention_block_q: must be a power of two in [16, 256], got 96");
    REJECTS("block_k range", "{" MODEL_OK ", \"precision\": {\"attention_block_k\": 512}}",
            "precision.attention_block_k");
    REJECTS("keep_codes is a bool", "{" MODEL_OK ", \"precision\": {\"attention_keep_codes\": 1}}",
            "precision.attention_keep_codes: expected true or false");
    REJECTS("center_keys names", "{" MODEL_OK ", \"precision\": {\"attention\": \"fp8_dm\", \"attention_center_keys\": \"median\"}}",
            "precision.attention_center_keys");
    REJECTS("center_keys needs FP8 attention",
            "{" MODEL_OK ", \"precision\": {\"attention\": \"bf16\", \"attention_center_keys\": \"mean\"}}",
            "precision.attention_center_keys: \"mean\" needs an FP8 precision.attention");
    REJECTS("rowsum_correction needs FP8 attention",
            "{" MODEL_OK ", \"precision\": {\"attention\": \"fp32\", \"attention_rowsum_correction\": true}}",
            "precision.attention_rowsum_correction: true needs an FP8 precision.attention");
    REJECTS("rowsum_correction is a bool", "{" MODEL_OK ", \"precision\": {\"attention\": \"fp8_dm\", \"attention_rowsum_correction\": 1}}",
            "precision.attention_rowsum_correction: expected true or false");
    REJECTS("amax_history 1..64", "{" MODEL_OK ", \"precision\": {\"attention_amax_history\": 65}}",
            "precision.attention_amax_history: must be in [1, 64], got 65");
    REJECTS("linear_wgrad_blocks names", "{" MODEL_OK ", \"precision\": {\"linear\": \"fp8_block\", "
            "\"linear_wgrad_blocks\": \"weights\"}}", "precision.linear_wgrad_blocks", "\"activation\"", "weights");
    REJECTS("linear_scaling names", "{" MODEL_OK ", \"precision\": {\"linear\": \"fp8_tensor\", "
            "\"linear_scaling\": \"just_in_time\"}}", "precision.linear_scaling", "\"delayed\"", "just_in_time");
    REJECTS("linear_scaling delayed only with fp8_tensor", "{" MODEL_OK ", \"precision\": {\"linear\": \"fp8_block\", "
            "\"linear_scaling\": \"delayed\"}}", "precision.linear_scaling", "needs precision.linear = \"fp8_tensor\"",
            "fp8_block");
    REJECTS("linear_amax_history range", "{" MODEL_OK ", \"precision\": {\"linear\": \"fp8_tensor\", "
            "\"linear_scaling\": \"delayed\", \"linear_amax_history\": 65}}", "precision.linear_amax_history", "64",
            "65");
    REJECTS("linear_fast_accum names", "{" MODEL_OK ", \"precision\": {\"linear\": \"fp8_tensor\", "
            "\"linear_fast_accum\": \"dgrad\"}}", "precision.linear_fast_accum", "\"forward\"", "dgrad");
    REJECTS("linear_fast_accum only with fp8_tensor", "{" MODEL_OK ", \"precision\": {\"linear\": \"fp8_block\", "
            "\"linear_fast_accum\": \"forward\"}}", "precision.linear_fast_accum",
            "needs precision.linear = \"fp8_tensor\"", "fp8_block");
    REJECTS("linear_wgrad_blocks only with fp8_block", "{" MODEL_OK ", \"precision\": {\"linear\": \"fp8_tensor\", "
            "\"linear_wgrad_blocks\": \"gradient\"}}", "precision.linear_wgrad_blocks", "needs precision.linear = \"fp8_block\"",
            "got linear = \"fp8_tensor\"");
    int ok = parse("{\"model\": {\"vocab_size\": 0, \"d_model\": 128, \"n_layer\": 2, \"n_head\": 2, "
                   "\"ffn_hidden\": 8, \"seq_len\": 8}}", NULL, 0);
    CHECK(ok == -1 && strstr(err.msg, "model.vocab_size: must be in [1,"), "vocab_size >= 1", "%s", err.msg);
    ok = parse("{\"model\": {\"vocab_size\": 1000, \"d_model\": 256, \"n_layer\": 2, \"n_head\": 4, "
               "\"ffn_hidden\": 8, \"seq_len\": 8}}", NULL, 0);
    CHECK(ok == 0 && cfg.model.padded_vocab_size == 1024 && cfg.model.head_dim == 64, "derived padded vocab and head_dim",
          "rc %d padded %d head_dim %d (%s)", ok, cfg.model.padded_vocab_size, cfg.model.head_dim, err.msg);
}

// The data order, passkey mixing and evaluation keys: defaults, names and ranges.
static void test_eval_data_keys(void) {
    int ok = parse("{" MODEL_OK "}", NULL, 0);
    CHECK(ok == 0 && cfg.data.order == DATA_ORDER_MIXED && cfg.data.passkey_fraction == 0.0 &&
              cfg.eval.passkey_interval == 0 && cfg.eval.passkey_samples == 32 && cfg.eval.passkey_min_distance == 512,
          "data order, passkey defaults: mixed, no mixing, no passkey evaluation, 32 sequences from 512",
          "rc %d order %d fraction %g interval %d", ok, (int)cfg.data.order, cfg.data.passkey_fraction,
          cfg.eval.passkey_interval);
    const char *sets[] = {"data.order=shards", "eval.passkey_interval=50", "eval.passkey_min_distance=16"};
    ok = parse("{" MODEL_OK "}", sets, 3);
    CHECK(ok == 0 && cfg.data.order == DATA_ORDER_SHARDS && cfg.eval.passkey_interval == 50 &&
              cfg.eval.passkey_min_distance == 16, "data.order and passkey keys from --set", "rc %d: %s", ok, err.msg);
    REJECTS("data.order names", "{" MODEL_OK ", \"data\": {\"order\": \"random\"}}", "data.order", "\"mixed\"",
            "\"shards\"", "random");
    REJECTS("passkey_fraction in [0, 0.5]", "{" MODEL_OK ", \"data\": {\"passkey_fraction\": 0.6}}",
            "data.passkey_fraction: must be in [0, 0.5], got 0.6");
    REJECTS("passkey mixing needs the mixed order",
            "{" MODEL_OK ", \"data\": {\"order\": \"shards\", \"passkey_fraction\": 0.1}}",
            "data.passkey_fraction", "needs data.order = \"mixed\"", "shards");
    REJECTS("passkey_samples >= 1", "{" MODEL_OK ", \"eval\": {\"passkey_samples\": 0}}",
            "eval.passkey_samples: must be in [1, 100000], got 0");
    REJECTS("passkey_interval >= 0", "{" MODEL_OK ", \"eval\": {\"passkey_interval\": -1}}",
            "eval.passkey_interval: must be >= 0, got -1");
    REJECTS("passkey_min_distance >= 1", "{" MODEL_OK ", \"eval\": {\"passkey_min_distance\": 0}}",
            "eval.passkey_min_distance: must be in [1,");
}

static void test_overrides(void) {
    const char *ov[] = {"train.lr=1e-3", "data.train=foo/train_*.bin", "model.qk_norm=true",
                        "precision.attention=fp8_dm", "log.dir=2024", "train.steps=77", "data.val=\"v.bin\""};
    int rc = parse("{" MODEL_OK "}", ov, 7);
    CHECK(rc == 0 && cfg.train.lr == 1e-3 && strcmp(cfg.data.train, "foo/train_*.bin") == 0 && cfg.model.qk_norm &&
              cfg.precision.attention == ATTN_FP8_DM && strcmp(cfg.log.dir, "2024") == 0 && cfg.train.steps == 77 &&
              strcmp(cfg.data.val, "v.bin") == 0 && strcmp(cfg.checkpoint.dir, "2024/checkpoints") == 0,
          "overrides set values", "rc %d (%s) lr %g train '%s' log '%s'", rc, err.msg, cfg.train.lr, cfg.data.train,
          cfg.log.dir);
    const char *later[] = {"train.lr=1e-3", "train.lr=2e-3"};
    rc = parse("{" MODEL_OK ", \"train\": {\"lr\": 5e-4}}", later, 2);
    CHECK(rc == 0 && cfg.train.lr == 2e-3, "overrides apply in order, after the file", "lr %g", cfg.train.lr);
    const char *model_only[] = {"model.d_model=128", "model.n_layer=1", "model.n_head=1", "model.ffn_hidden=4",
                                "model.seq_len=4"};
    rc = parse("{}", model_only, 5);
    CHECK(rc == 0 && cfg.model.head_dim == 128, "required keys can come from --set", "%s", err.msg);

    const char *unknown[] = {"train.lrr=1"};
    rc = parse("{" MODEL_OK "}", unknown, 1);
    CHECK(rc == -1 && has_all(err.msg, "t/x.json", "train.lrr", "--set train.lrr=1", "allowed keys in train", "lr,",
                              (const char *)NULL),
          "override of unknown key fails", "%s", err.msg);
    const char *unknown_sec[] = {"trian.lr=1"};
    rc = parse("{" MODEL_OK "}", unknown_sec, 1);
    CHECK(rc == -1 && has_all(err.msg, "trian", "--set", "did you mean train?", (const char *)NULL),
          "override of unknown section fails", "%s", err.msg);
    const char *bad_syntax[][1] = {{"train.lr"}, {"trainlr=1"}, {".lr=1"}, {"train.=1"}, {"=1"}};
    for (int i = 0; i < 5; i++) {
        rc = parse("{" MODEL_OK "}", bad_syntax[i], 1);
        char name[64];
        snprintf(name, sizeof name, "malformed override '%s' fails", bad_syntax[i][0]);
        CHECK(rc == -1 && strstr(err.msg, "expected section.key=value"), name, "%s", err.msg);
    }
    const char *bad_type[] = {"model.n_head=abc"};
    rc = parse("{" MODEL_OK "}", bad_type, 1);
    CHECK(rc == -1 && has_all(err.msg, "model.n_head", "--set model.n_head=abc", "expected an integer",
                              "string \"abc\"", (const char *)NULL),
          "override of wrong type fails", "%s", err.msg);
    const char *bad_range[] = {"train.lr=-1"};
    rc = parse("{" MODEL_OK "}", bad_range, 1);
    CHECK(rc == -1 && has_all(err.msg, "train.lr: must be > 0", "value from --set train.lr=-1", (const char *)NULL),
          "override out of range says it came from --set", "%s", err.msg);
}

// precision.recipe: a preset under the keys the config gives, wherever they appear.
static void test_recipes(void) {
    int rc = parse("{" MODEL_OK ", \"precision\": {\"recipe\": \"fp8\"}}", NULL, 0);
    const PrecisionConfig *p = &cfg.precision;
    CHECK(rc == 0 && p->recipe == RECIPE_FP8 && p->attention == ATTN_FP8_DM && p->attention_keep_codes &&
              p->attention_scaling == SCALING_BLOCK && p->linear == LINEAR_FP8_TENSOR &&
              p->linear_scaling == LINEAR_SCALING_DELAYED && p->linear_grad_format == GRADFMT_E5M2 &&
              !p->linear_keep_lm_head_bf16 && p->linear_fast_accum == FAST_ACCUM_FORWARD,
          "recipe fp8 sets its keys", "rc %d (%s) attention %d linear %d", rc, err.msg, p->attention, p->linear);
    // a key given in the file wins, before or after the recipe in the object
    rc = parse("{" MODEL_OK ", \"precision\": {\"attention\": \"fp8_naive\", \"recipe\": \"fp8\", "
               "\"linear_fast_accum\": \"none\"}}", NULL, 0);
    CHECK(rc == 0 && p->attention == ATTN_FP8_NAIVE && p->linear_fast_accum == FAST_ACCUM_NONE &&
              p->linear == LINEAR_FP8_TENSOR,
          "keys in the file override the recipe", "rc %d (%s) attention %d", rc, err.msg, p->attention);
    // --set precision.recipe applies under the file's keys too, and --set keys win over it
    const char *ov[] = {"precision.recipe=fp8", "precision.linear_grad_format=e4m3"};
    rc = parse("{" MODEL_OK ", \"precision\": {\"attention\": \"fp8_hybrid\"}}", ov, 2);
    CHECK(rc == 0 && p->recipe == RECIPE_FP8 && p->attention == ATTN_FP8_HYBRID && p->linear == LINEAR_FP8_TENSOR &&
              p->linear_grad_format == GRADFMT_E4M3,
          "--set recipe keeps the file's keys and later --set keys", "rc %d (%s)", rc, err.msg);
    const char *back[] = {"precision.recipe=bf16"};
    rc = parse("{" MODEL_OK ", \"precision\": {\"recipe\": \"fp8\"}}", back, 1);
    CHECK(rc == 0 && p->recipe == RECIPE_BF16 && p->attention == ATTN_BF16 && p->linear == LINEAR_BF16 &&
              p->linear_scaling == LINEAR_SCALING_CURRENT && p->linear_keep_lm_head_bf16,
          "--set recipe=bf16 replaces the file's recipe", "rc %d (%s) linear %d", rc, err.msg, p->linear);
    rc = parse("{" MODEL_OK "}", NULL, 0);
    CHECK(rc == 0 && p->recipe == RECIPE_NONE && p->attention == ATTN_BF16 && p->linear == LINEAR_BF16,
          "no recipe: the keys' defaults", "rc %d", rc);
    REJECTS("unknown recipe", "{" MODEL_OK ", \"precision\": {\"recipe\": \"fp4\"}}", "precision.recipe",
            "\"fp8\"", "fp4");
    // a recipe whose keys contradict a given key is still validated: fast accumulation needs fp8_tensor
    REJECTS("recipe keys are validated with the given ones",
            "{" MODEL_OK ", \"precision\": {\"recipe\": \"fp8\", \"linear\": \"fp8_block\"}}",
            "precision.linear_fast_accum");
    // the resolved config reads back to the same config
    rc = parse("{" MODEL_OK ", \"precision\": {\"recipe\": \"fp8\", \"attention\": \"fp8_naive\"}}", NULL, 0);
    Config first = cfg;
    char *json = config_to_json(&first);
    rc = parse(json, NULL, 0);
    free(json);
    CHECK(rc == 0 && first.precision.attention == cfg.precision.attention &&
              memcmp(&first.precision, &cfg.precision, sizeof cfg.precision) == 0,
          "a recipe's resolved config reads back the same", "rc %d (%s)", rc, err.msg);
}

static void test_default_dirs(void) {
    Config c;
    ErrBuf e = {{0}};
    int rc = config_parse("{" MODEL_OK "}", "some/where/my_run.json", NULL, 0, &c, &e);
    CHECK(rc == 0 && strcmp(c.log.dir, "runs/my_run") == 0 && strcmp(c.checkpoint.dir, "runs/my_run/checkpoints") == 0 &&
              strcmp(c.source_path, "some/where/my_run.json") == 0,
          "log.dir defaults to runs/<config name>", "log '%s' ckpt '%s'", c.log.dir, c.checkpoint.dir);
    rc = config_parse("{" MODEL_OK "}", NULL, NULL, 0, &c, &e);
    CHECK(rc == 0 && strcmp(c.log.dir, "runs/default") == 0, "log.dir defaults to runs/default without a name",
          "log '%s'", c.log.dir);
}

// Random valid configs (every field drawn fresh) must survive to_json -> parse bytewise.
static unsigned long long rng_state = 0x9e3779b97f4a7c15ull;
static unsigned long long rng_next(void) {
    rng_state ^= rng_state << 13, rng_state ^= rng_state >> 7, rng_state ^= rng_state << 17;
    return rng_state;
}
static double rng_unit(void) { return (double)(rng_next() >> 11) * 0x1p-53; }  // [0, 1), full mantissa
static int rng_int(int lo, int hi) { return lo + (int)(rng_next() % (unsigned long long)(hi - lo + 1)); }

// Strings are compared bytewise: clear the rest of the field as config.c does.
#define SET_STR(field, ...) (memset(field, 0, sizeof(field)), snprintf(field, sizeof(field), __VA_ARGS__))

static void random_config(Config *c, int i) {
    config_defaults(c);
    snprintf(c->source_path, sizeof c->source_path, "rand/cfg_%d.json", i);
    snprintf(c->description, sizeof c->description, "random \"config\" %d\twith\\escapes\n and \x01 control, ü", i);
    ModelConfig *m = &c->model;
    m->vocab_size = rng_int(1, 200000);
    m->n_head = rng_int(1, 32);
    m->d_model = m->n_head * (rng_next() & 1 ? 64 : 128);
    m->n_layer = rng_int(1, 100);
    m->ffn_hidden = rng_int(1, 20000);
    m->seq_len = rng_int(1, 8192);
    m->position = (PositionKind)rng_int(0, 1);
    m->rope_theta = 1 + 1e6 * rng_unit();
    m->qk_norm = rng_int(0, 1);
    m->tied_embeddings = rng_int(0, 1);
    m->norm_eps = 1e-3 * rng_unit() + 1e-12;
    m->init_std = rng_unit() + 1e-9;
    snprintf(c->data.train, sizeof c->data.train, "d/%llx/train_*.bin", rng_next());
    c->data.shuffle = rng_int(0, 1);
    c->data.seed = rng_next() >> 11;  // < 2^53
    TrainConfig *t = &c->train;
    t->device = (DeviceKind)rng_int(0, 2);
    t->micro_batch = rng_int(1, 64);
    t->batch_tokens = (long long)t->micro_batch * m->seq_len * rng_int(0, 50);
    t->steps = rng_int(1, 1000000);
    t->lr = rng_unit() + 1e-12;
    t->min_lr_ratio = rng_unit();
    t->warmup_steps = rng_int(0, t->steps);
    t->schedule = (ScheduleKind)rng_int(0, 3);
    t->wsd_decay_fraction = rng_unit();
    t->weight_decay = rng_unit();
    t->beta1 = rng_unit();
    t->beta2 = rng_unit();
    t->eps = ldexp(1 + rng_unit(), -rng_int(1, 60));
    t->grad_clip = 10 * rng_unit();
    t->seed = rng_next() >> 11;
    t->recompute = rng_int(0, 1);
    t->threads = rng_int(0, 256);
    PrecisionConfig *p = &c->precision;
    p->recipe = (PrecisionRecipe)rng_int(0, 2);
    p->attention = (AttnPrecision)rng_int(0, ATTN_N_PRECISIONS - 1);
    p->attention_grad_format = (GradFormat)rng_int(0, 1);
    p->attention_scaling = (ScalingKind)rng_int(0, 1);
    p->attention_p_scale = ldexp(1, rng_int(0, 15));
    p->attention_amax_history = rng_int(1, 64);
    p->attention_block_q = 16 << rng_int(0, 4);
    p->attention_block_k = 16 << rng_int(0, 4);
    p->attention_keep_codes = rng_int(0, 1);
    p->attention_center_keys = attn_precision_is_fp8(p->attention) ? (AttnCenterKeys)rng_int(0, 2) : CENTER_KEYS_OFF;
    p->attention_rowsum_correction = attn_precision_is_fp8(p->attention) ? rng_int(0, 1) : 0;
    p->linear = (LinearPrecision)rng_int(0, 2);
    p->linear_grad_format = (GradFormat)rng_int(0, 1);
    p->linear_keep_lm_head_bf16 = rng_int(0, 1);
    p->linear_wgrad_blocks = p->linear == LINEAR_FP8_BLOCK ? (WgradBlocks)rng_int(0, 2) : WGRAD_BLOCKS_NONE;
    p->linear_scaling = p->linear == LINEAR_FP8_TENSOR ? (LinearScaling)rng_int(0, 1) : LINEAR_SCALING_CURRENT;
    p->linear_amax_history = rng_int(1, 64);
    p->linear_fast_accum = p->linear == LINEAR_FP8_TENSOR ? (FastAccum)rng_int(0, 2) : FAST_ACCUM_NONE;
    p->fuse_fp8_producers = rng_int(0, 1);
    p->fuse_attention_rope = rng_int(0, 1);
    p->fuse_qkv_epilogue = rng_int(0, 1);
    c->train.zero1 = rng_int(0, 1);
    c->train.comm_timeout_s = 0.5 + rng_int(0, 1000);
    c->train.overlap_comm = rng_int(0, 1);
    c->train.max_bad_steps = rng_int(1, 1000);
    c->diagnostics.interval = rng_int(0, 1000);
    c->diagnostics.bias_probe_batches = rng_int(0, 64);
    c->diagnostics.reference = (AttnPrecision)rng_int(0, 1);
    p->linear_bf16_first_layers = rng_int(0, c->model.n_layer);
    p->linear_bf16_last_layers = rng_int(0, c->model.n_layer);
    c->eval.interval = rng_int(0, 10000);
    c->eval.batches = rng_int(1, 100);
    c->eval.sample_interval = rng_int(0, 10000);
    c->eval.sample_tokens = rng_int(1, 1000);
    c->checkpoint.interval = rng_int(0, 10000);
    c->checkpoint.keep = rng_int(1, 10);
    c->checkpoint.at_end = rng_int(0, 1);
    if (i % 2) snprintf(c->log.dir, sizeof c->log.dir, "runs/r%d", i);  // else: derived from the name
    c->log.interval = rng_int(1, 100);
    SET_STR(c->log.metrics_file, "m%d.jsonl", i);
    // data order, passkey mixing and evaluation
    c->data.order = (DataOrder)rng_int(0, 1);
    c->data.passkey_fraction = c->data.order == DATA_ORDER_MIXED ? 0.5 * rng_unit() : 0.0;
    c->eval.passkey_interval = rng_int(0, 10000);
    c->eval.passkey_samples = rng_int(1, 1000);
    c->eval.passkey_min_distance = rng_int(1, 100000);
    config_derive(c);
}

static size_t first_difference(const void *a, const void *b, size_t n) {
    const unsigned char *x = a, *y = b;
    size_t i = 0;
    while (i < n && x[i] == y[i]) i++;
    return i;
}

static void test_random_roundtrip(void) {
    int n_ok = 0, n_valid = 0, n = 300;
    char first_failure[2200] = "";
    for (int i = 0; i < n; i++) {
        Config c;
        random_config(&c, i);
        ErrBuf e = {{0}};
        if (config_validate(&c, &e) == 0) n_valid++;
        else if (!first_failure[0]) snprintf(first_failure, sizeof first_failure, "validate: %s", e.msg);
        char *json = config_to_json(&c);
        Config back;
        int rc = config_parse(json, c.source_path, NULL, 0, &back, &e);
        if (rc == 0 && memcmp(&back, &c, sizeof c) == 0) n_ok++;
        else if (!first_failure[0])
            snprintf(first_failure, sizeof first_failure, "parse: %.300s; first differing byte at offset %zu; %.600s",
                     rc ? e.msg : "ok", rc ? 0 : first_difference(&back, &c, sizeof c), json);
        free(json);
    }
    CHECK(n_valid == n, "random configs validate", "%d of %d; %s", n_valid, n, first_failure);
    CHECK(n_ok == n, "random configs round-trip bytewise", "%d of %d; %s", n_ok, n, first_failure);
    // to_json writes every key: counted independently with cJSON.
    Config c;
    random_config(&c, 1);
    char *json = config_to_json(&c);
    cJSON *root = cJSON_Parse(json);
    const char *sections[] = {"model", "data", "train", "precision", "eval", "checkpoint", "log", "diagnostics"};
    const int expected[] = {12, 6, 21, 23, 7, 4, 3, 3};
    int all = root && cJSON_IsString(cJSON_GetObjectItemCaseSensitive(root, "description"));
    for (int s = 0; s < 8 && all; s++)
        all = cJSON_GetArraySize(cJSON_GetObjectItemCaseSensitive(root, sections[s])) == expected[s];
    CHECK(all && cJSON_GetArraySize(root) == 9, "to_json writes every key", "%s", json);
    size_t raw_controls = 0;  // strict JSON readers (Python's json) reject raw control characters
    for (const char *p = json; *p; p++) raw_controls += (unsigned char)*p < 0x20 && *p != '\n';
    CHECK(raw_controls == 0 && strstr(json, "\\u0001") && strstr(json, "\\\"config\\\""),
          "to_json escapes strings", "%zu raw control characters", raw_controls);
    cJSON *lr = cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(root, "train"), "lr");
    CHECK(lr && lr->valuedouble == c.train.lr, "to_json lr exact", "%.17g vs %.17g", lr ? lr->valuedouble : -1.0,
          c.train.lr);
    cJSON_Delete(root);
    free(json);
}

static void test_files(void) {
    char dir[] = "/tmp/test_config_XXXXXX";
    CHECK(mkdtemp(dir) != NULL, "mkdtemp", "cannot create a scratch directory");
    char path[256];
    ErrBuf e = {{0}};
    Config c;
    // truncated: the error is on line 4 (the last one), at the end
    snprintf(path, sizeof path, "%s/trunc.json", dir);
    const char *trunc = "{\n  \"model\": {\n    \"d_model\": 128,\n    \"n_layer\": 2";
    FILE *f = fopen(path, "w");
    fputs(trunc, f), fclose(f);
    int rc = config_load(path, NULL, 0, &c, &e);
    CHECK(rc == -1 && has_all(e.msg, path, "invalid JSON", "line 4", "end of the file", (const char *)NULL),
          "truncated JSON names file and line", "%s", e.msg);
    // a missing comma on line 3
    snprintf(path, sizeof path, "%s/comma.json", dir);
    f = fopen(path, "w");
    fputs("{\n  \"model\": {\"d_model\": 128,\n     \"n_layer\": 2 \"n_head\": 2}\n}\n", f), fclose(f);
    rc = config_load(path, NULL, 0, &c, &e);
    CHECK(rc == -1 && has_all(e.msg, path, "line 3, column 19", "n_head", (const char *)NULL),
          "missing comma: line and column", "%s", e.msg);
    snprintf(path, sizeof path, "%s/empty.json", dir);
    f = fopen(path, "w");
    fclose(f);
    rc = config_load(path, NULL, 0, &c, &e);
    CHECK(rc == -1 && has_all(e.msg, path, "empty", (const char *)NULL), "empty file", "%s", e.msg);
    f = fopen(path, "w");
    fputs("  \n\n ", f), fclose(f);
    rc = config_load(path, NULL, 0, &c, &e);
    CHECK(rc == -1 && has_all(e.msg, path, "empty", (const char *)NULL), "whitespace-only file", "%s", e.msg);
    snprintf(path, sizeof path, "%s/nope/missing.json", dir);
    rc = config_load(path, NULL, 0, &c, &e);
    CHECK(rc == -1 && has_all(e.msg, path, "cannot open", (const char *)NULL), "non-existent file names the path",
          "%s", e.msg);
    rc = config_load(dir, NULL, 0, &c, &e);  // a directory where a file is expected
    CHECK(rc == -1 && has_all(e.msg, dir, "directory", (const char *)NULL), "a directory is refused by name",
          "%s", e.msg);
    // write_resolved creates nested directories; the written file loads back to the same config
    rc = config_load("configs/tiny.json", NULL, 0, &c, &e);
    char run_dir[64];
    snprintf(run_dir, sizeof run_dir, "%s/a/b", dir);
    rc = rc || config_write_resolved(&c, run_dir, &e);
    snprintf(path, sizeof path, "%s/config.json", run_dir);
    Config back;
    int rc2 = rc ? -1 : config_load(path, NULL, 0, &back, &e);
    if (rc2 == 0) memcpy(back.source_path, c.source_path, sizeof back.source_path);
    CHECK(rc == 0 && rc2 == 0 && memcmp(&back, &c, sizeof c) == 0, "write_resolved writes a loadable config.json",
          "rc %d/%d: %s", rc, rc2, e.msg);
    rc = config_write_resolved(&c, run_dir, &e);  // again, over the existing file
    CHECK(rc == 0 && file_exists(path), "write_resolved replaces an existing config.json", "%s", e.msg);
    snprintf(path, sizeof path, "%s/afile", dir);
    f = fopen(path, "w");
    fclose(f);
    rc = config_write_resolved(&c, path, &e);
    CHECK(rc == -1 && strstr(e.msg, "afile"), "write_resolved into a file path fails cleanly", "%s", e.msg);
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    if (system(cmd) != 0) printf("# could not remove %s\n", dir);
}

static void test_names(void) {
    int ok = 1;
    for (int p = 0; p < ATTN_N_PRECISIONS; p++) {
        AttnPrecision back;
        ok &= attn_precision_from_name(attn_precision_name((AttnPrecision)p), &back) == 0 && back == (AttnPrecision)p;
    }
    AttnPrecision dummy;
    ok &= attn_precision_from_name("fp8", &dummy) == -1 && attn_precision_from_name(NULL, &dummy) == -1;
    ok &= strcmp(attn_precision_name(ATTN_FP8_DM_APPROX), "fp8_dm_approx") == 0;
    ok &= strcmp(attn_precision_name(ATTN_FP8_HYBRID_DM), "fp8_hybrid_dm") == 0;
    CHECK(ok, "attention precision names round-trip", "names disagree");
    CHECK(strcmp(grad_format_name(GRADFMT_E5M2), "e5m2") == 0 && strcmp(scaling_name(SCALING_DELAYED), "delayed") == 0 &&
              strcmp(schedule_name(SCHED_WSD), "wsd") == 0 && strcmp(linear_precision_name(LINEAR_FP8_BLOCK), "fp8_block") == 0 &&
              strcmp(device_name(DEVICE_GPU), "gpu") == 0 && strcmp(device_name((DeviceKind)7), "?") == 0,
          "enum names", "a name is wrong");
}

// The GPU fusion switches: on by default, booleans only, settable from the file and by --set,
// written by config_to_json.
static void test_fusion_keys(void) {
    int rc = parse("{" MODEL_OK "}", NULL, 0);
    const PrecisionConfig *p = &cfg.precision;
    CHECK(rc == 0 && p->fuse_fp8_producers == 1 && p->fuse_attention_rope == 1 && p->fuse_qkv_epilogue == 1,
          "fusion keys default to true", "rc %d: %d %d %d", rc, p->fuse_fp8_producers, p->fuse_attention_rope,
          p->fuse_qkv_epilogue);
    rc = parse("{" MODEL_OK ", \"precision\": {\"fuse_fp8_producers\": false, \"fuse_attention_rope\": false}}", NULL, 0);
    CHECK(rc == 0 && p->fuse_fp8_producers == 0 && p->fuse_attention_rope == 0 && p->fuse_qkv_epilogue == 1,
          "fusion keys read from the file", "rc %d (%s): %d %d %d", rc, err.msg, p->fuse_fp8_producers,
          p->fuse_attention_rope, p->fuse_qkv_epilogue);
    const char *off[] = {"precision.fuse_qkv_epilogue=false"};
    rc = parse("{" MODEL_OK "}", off, 1);
    char *json = rc == 0 ? config_to_json(&cfg) : NULL;
    CHECK(rc == 0 && p->fuse_qkv_epilogue == 0 && p->fuse_fp8_producers == 1 && json &&
              strstr(json, "\"fuse_qkv_epilogue\": false") && strstr(json, "\"fuse_attention_rope\": true"),
          "fusion keys set by --set and written back", "rc %d (%s); JSON:\n%s", rc, err.msg, json ? json : "");
    free(json);
    REJECTS("fuse_fp8_producers is a bool", "{" MODEL_OK ", \"precision\": {\"fuse_fp8_producers\": 0}}",
            "precision.fuse_fp8_producers: expected true or false");
    REJECTS("fuse_attention_rope is a bool", "{" MODEL_OK ", \"precision\": {\"fuse_attention_rope\": \"off\"}}",
            "precision.fuse_attention_rope: expected true or false");
    const char *bad[] = {"precision.fuse_qkv_epilogue=no"};
    rc = parse("{" MODEL_OK "}", bad, 1);
    CHECK(rc == -1 && has_all(err.msg, "precision.fuse_qkv_epilogue", "expected true or false", (const char *)NULL),
          "fuse_qkv_epilogue from --set is a bool", "rc %d: %s", rc, err.msg);
}

int main(void) {
    test_defaults();
    test_shipped_configs();
    test_unknown_keys();
    test_types();
    test_ranges();
    test_eval_data_keys();
    test_overrides();
    test_recipes();
    test_default_dirs();
    test_random_roundtrip();
    test_files();
    test_names();
    test_fusion_keys();
    return test_summary("test_config");
}
