// test_config_diff.c: what a resume may change (core/config_diff.h): which keys change the run's
// trajectory, the differences between a stored resolved config and a new one (every key of the
// config walked, each changed alone on a random config), keys a stored config lacks (defaults),
// and the record appended to the run directory.
#include <cjson/cJSON.h>  // reading the record back
#include <stdio.h>        // P_tmpdir
#include <stdlib.h>       // mkdtemp, system
#include <string.h>       // strcmp, strstr

#include "core/config.h"       // Config, config_parse, config_to_json
#include "core/config_diff.h"  // the module under test
#include "test.h"              // CHECK

#define MODEL_OK "\"model\": {\"d_model\": 128, \"n_layer\": 2, \"n_head\": 2, \"ffn_hidden\": 256, \"seq_len\": 16}"

static Config parse_or_die(const char *json, const char *const *ov, int n) {
    Config c;
    ErrBuf e;
    if (config_parse(json, "t.json", ov, n, &c, &e) != 0) {
        printf("FAIL - config_parse: %s\n", e.msg);
        exit(1);
    }
    return c;
}

// The change of key in changes, or NULL.
static const ConfigChange *find(const ConfigChange *c, int n, const char *key) {
    for (int i = 0; i < n; i++)
        if (!strcmp(c[i].key, key)) return &c[i];
    return NULL;
}

static void test_classes(void) {
    const char *trajectory[] = {"model.d_model", "model.rope_theta", "precision.attention", "precision.linear_scaling",
                                "data.train", "data.seed", "data.shuffle", "train.lr", "train.steps",
                                "train.schedule", "train.warmup_steps", "train.batch_tokens", "train.micro_batch",
                                "train.grad_clip", "train.seed", "train.beta2", "newsection.newkey"};
    const char *same[] = {"description", "data.val", "train.device", "train.threads", "train.recompute",
                          "train.zero1", "train.comm_timeout_s", "train.overlap_comm", "train.max_bad_steps",
                          "eval.interval", "eval.batches", "checkpoint.keep", "checkpoint.dir", "log.interval",
                          "log.dir", "diagnostics.interval", "precision.recipe", "precision.fuse_fp8_producers",
                          "precision.fuse_attention_rope", "precision.fuse_qkv_epilogue"};
    int bad = 0;
    char first[128] = "";
    for (size_t i = 0; i < sizeof trajectory / sizeof *trajectory; i++)
        if (!config_key_changes_trajectory(trajectory[i]) && !bad++) snprintf(first, sizeof first, "%s", trajectory[i]);
    CHECK(bad == 0, "keys that change the trajectory (a key of an unknown section too)", "%d wrong, e.g. %s", bad, first);
    bad = 0;
    for (size_t i = 0; i < sizeof same / sizeof *same; i++)
        if (config_key_changes_trajectory(same[i]) && !bad++) snprintf(first, sizeof first, "%s", same[i]);
    CHECK(bad == 0, "keys that leave the trajectory", "%d wrong, e.g. %s", bad, first);
}

static void test_diff(void) {
    Config a = parse_or_die("{" MODEL_OK "}", NULL, 0);
    char *stored = config_to_json(&a);
    ConfigChange *ch;
    ErrBuf e;
    int n = config_changes(stored, &a, &ch, &e);
    CHECK(n == 0 && ch == NULL, "the same config: no change", "n %d", n);
    free(ch);

    const char *ov[] = {"train.lr=0.002", "precision.attention=\"fp8_dm\"", "log.interval=7", "data.val=\"v_*.bin\""};
    Config b = parse_or_die("{" MODEL_OK "}", ov, 4);
    n = config_changes(stored, &b, &ch, &e);
    const ConfigChange *lr = find(ch, n, "train.lr"), *att = find(ch, n, "precision.attention");
    const ConfigChange *li = find(ch, n, "log.interval"), *val = find(ch, n, "data.val");
    CHECK(n == 4 && lr && att && li && val, "four keys changed: four changes", "n %d", n);
    CHECK(lr && !strcmp(lr->before, "0.0006") && !strcmp(lr->after, "0.002") && lr->trajectory,
          "train.lr: both values as JSON, changes the trajectory", "%s -> %s (%d)", lr ? lr->before : "",
          lr ? lr->after : "", lr ? lr->trajectory : -1);
    CHECK(att && !strcmp(att->before, "\"bf16\"") && !strcmp(att->after, "\"fp8_dm\"") && att->trajectory,
          "precision.attention: strings quoted", "%s -> %s", att ? att->before : "", att ? att->after : "");
    CHECK(li && !li->trajectory && val && !val->trajectory, "log.interval and data.val leave the trajectory", "%s",
          li ? li->key : "log.interval not found");
    free(ch);

    // Every key, changed alone: found, and only it. The keys come from config_to_json itself.
    cJSON *root = cJSON_Parse(stored);
    int keys = 0, found = 0;
    char miss[160] = "";
    const cJSON *sec, *item;
    cJSON_ArrayForEach(sec, root) {
        if (!cJSON_IsObject(sec)) continue;
        cJSON_ArrayForEach(item, sec) {
            // a value that parses and differs: numbers + 1 (x2 for powers of two), bools flipped,
            // strings and enums to another valid value where one is known
            char kv[256], key[128];
            snprintf(key, sizeof key, "%s.%s", sec->string, item->string);
            if (cJSON_IsBool(item)) snprintf(kv, sizeof kv, "%s=%s", key, cJSON_IsTrue(item) ? "false" : "true");
            else if (cJSON_IsNumber(item)) snprintf(kv, sizeof kv, "%s=%.17g", key, item->valuedouble ? item->valuedouble * 2 : 1);
            else snprintf(kv, sizeof kv, "%s=\"x_%s\"", key, item->valuestring);
            const char *one[] = {kv};
            Config c;
            if (config_parse(stored, "t.json", one, 1, &c, &e) != 0) continue;  // not valid alone (enums, ranges)
            keys++;
            n = config_changes(stored, &c, &ch, &e);
            // (a key that derives another, such as log.dir -> checkpoint.dir, may change two)
            if (n >= 1 && find(ch, n, key)) found++;
            else printf("# missed: %s (n %d)\n", key, n), snprintf(miss, sizeof miss, "%s (n %d)", key, n);
            free(ch);
        }
    }
    cJSON_Delete(root);
    CHECK(keys > 40 && found == keys, "each key changed alone is found", "%d of %d; first missed: %s", found, keys, miss);

    // A stored config without a key added since takes its default: no change when the new one is
    // at the default, a change when it is not.
    const char *old_text = "{" MODEL_OK ", \"train\": {\"lr\": 0.0006}, \"log\": {\"dir\": \"runs/t\"}}";
    n = config_changes(old_text, &a, &ch, &e);
    CHECK(n == 0, "a stored config that lacks keys: defaults, no change", "n %d, first %s", n, n > 0 ? ch[0].key : "");
    free(ch);
    n = config_changes("{\"model\": 3}", &a, &ch, &e);
    CHECK(n == -1 && strstr(e.msg, "cannot read it"), "a stored config this build cannot read", "n %d: %s", n, e.msg);
    free(stored);
}

static void test_record(void) {
    char dir[256];
    snprintf(dir, sizeof dir, "%s/test_config_diff_XXXXXX", P_tmpdir);  // the system's temporary directory
    if (!mkdtemp(dir)) { printf("FAIL - mkdtemp\n"); return; }
    Config a = parse_or_die("{" MODEL_OK "}", NULL, 0);
    const char *ov[] = {"train.lr=0.002", "data.train=\"a \\\"quoted\\\" glob\""};
    Config b = parse_or_die("{" MODEL_OK "}", ov, 2);
    char *stored = config_to_json(&a);
    ConfigChange *ch;
    ErrBuf e;
    int n = config_changes(stored, &b, &ch, &e);
    int rc = config_changes_record(dir, 6, "run/checkpoints/step_000006.ckpt", ch, n, &e);
    rc |= config_changes_record(dir, 9, "run/config.json", ch, 1, &e);
    char path[300];
    snprintf(path, sizeof path, "%s/config_changes.jsonl", dir);
    char *text = read_file_text(path, NULL, &e);
    int lines = 0, ok = text != NULL;
    for (char *line = text; ok && line && *line; lines++) {
        char *nl = strchr(line, '\n');
        if (nl) *nl = '\0';
        cJSON *obj = cJSON_Parse(line);
        cJSON *changes = cJSON_GetObjectItemCaseSensitive(obj, "changes");
        cJSON *first = cJSON_GetArrayItem(changes, 0);
        cJSON *step = cJSON_GetObjectItemCaseSensitive(obj, "resumed_at_step");
        ok = cJSON_IsArray(changes) && cJSON_IsNumber(step) && step->valuedouble == (lines ? 9 : 6) &&
             cJSON_GetArraySize(changes) == (lines ? 1 : n) &&
             cJSON_IsBool(cJSON_GetObjectItemCaseSensitive(first, "changes_trajectory"));
        if (ok && !lines) {  // the glob with quotes survives as a JSON string
            cJSON *item;
            int quoted = 0;
            cJSON_ArrayForEach(item, changes) {
                cJSON *after = cJSON_GetObjectItemCaseSensitive(item, "after");
                quoted |= cJSON_IsString(after) && !strcmp(after->valuestring, "a \"quoted\" glob");
            }
            ok = quoted;
        }
        cJSON_Delete(obj);
        line = nl ? nl + 1 : NULL;
    }
    CHECK(rc == 0 && ok && lines == 2, "the record: one JSON line per resume, appended", "rc %d ok %d lines %d: %s", rc,
          ok, lines, text ? text : e.msg);
    free(text);
    free(ch);
    free(stored);
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    if (system(cmd) != 0) printf("# could not remove %s\n", dir);
}

int main(void) {
    test_classes();
    test_diff();
    test_record();
    return test_summary("test_config_diff");
}
