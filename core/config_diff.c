// config_diff.c: the key-by-key comparison of two resolved configs and its record (config_diff.h).
#include "core/config_diff.h"

#include <cjson/cJSON.h>  // walking the resolved JSON texts
#include <stdio.h>        // fopen, fprintf
#include <string.h>       // strcmp, strncmp
#include <time.h>         // the record's time stamp
#include <unistd.h>       // fsync

// Keys whose value does not change what the run computes (see config_diff.h), and whole sections.
static const char *const SAME_TRAJECTORY_KEYS[] = {
    "description",       "data.val",           "train.device",       "train.threads",   "train.recompute",
    "train.zero1",       "train.comm_timeout_s", "train.overlap_comm", "train.max_bad_steps",
    // the fusions give the same values bit for bit; a recipe's effect is in the keys it sets
    "precision.recipe",  "precision.fuse_fp8_producers", "precision.fuse_attention_rope",
    "precision.fuse_qkv_epilogue", NULL};
static const char *const SAME_TRAJECTORY_SECTIONS[] = {"eval.", "checkpoint.", "log.", "diagnostics.", NULL};

int config_key_changes_trajectory(const char *key) {
    for (int i = 0; SAME_TRAJECTORY_KEYS[i]; i++)
        if (!strcmp(key, SAME_TRAJECTORY_KEYS[i])) return 0;
    for (int i = 0; SAME_TRAJECTORY_SECTIONS[i]; i++)
        if (!strncmp(key, SAME_TRAJECTORY_SECTIONS[i], strlen(SAME_TRAJECTORY_SECTIONS[i]))) return 0;
    return 1;
}

// One "section.key" = value pair of a resolved config.
typedef struct {
    char key[96];
    char *value;  // JSON text (cJSON_PrintUnformatted)
} Entry;

// Flattens a resolved config's JSON text into entries; returns the count or -1.
static int flatten(const char *json, Entry **out) {
    cJSON *root = cJSON_Parse(json);
    if (!cJSON_IsObject(root)) {
        cJSON_Delete(root);
        return -1;
    }
    int n = 0, cap = 64;
    Entry *entries = xmalloc((size_t)cap * sizeof *entries);
    const cJSON *sec;
    cJSON_ArrayForEach(sec, root) {
        const cJSON *item = cJSON_IsObject(sec) ? sec->child : sec;
        for (; item; item = cJSON_IsObject(sec) ? item->next : NULL) {
            if (n == cap) entries = xrealloc(entries, (size_t)(cap *= 2) * sizeof *entries);
            Entry *en = &entries[n++];
            if (cJSON_IsObject(sec)) snprintf(en->key, sizeof en->key, "%s.%s", sec->string, item->string);
            else snprintf(en->key, sizeof en->key, "%s", sec->string);
            en->value = cJSON_PrintUnformatted(item);
        }
    }
    cJSON_Delete(root);
    *out = entries;
    return n;
}

static void free_entries(Entry *en, int n) {
    for (int i = 0; i < n; i++) cJSON_free(en[i].value);
    free(en);
}

static const char *value_of(const Entry *en, int n, const char *key) {
    for (int i = 0; i < n; i++)
        if (!strcmp(en[i].key, key)) return en[i].value;
    return NULL;
}

static void add_change(ConfigChange **out, int *n, int *cap, const char *key, const char *before, const char *after) {
    if (*n == *cap) *out = xrealloc(*out, (size_t)(*cap = *cap ? 2 * *cap : 8) * sizeof **out);
    ConfigChange *c = &(*out)[(*n)++];
    snprintf(c->key, sizeof c->key, "%s", key);
    snprintf(c->before, sizeof c->before, "%s", before ? before : "null");
    snprintf(c->after, sizeof c->after, "%s", after ? after : "null");
    c->trajectory = config_key_changes_trajectory(key);
}

int config_changes(const char *stored_json, const Config *now, ConfigChange **out, ErrBuf *e) {
    *out = NULL;
    Config stored;
    ErrBuf pe;
    if (config_parse(stored_json, "the stored config", NULL, 0, &stored, &pe) != 0)
        return errf(e, "this build cannot read it: %s", pe.msg);
    char *a_json = config_to_json(&stored), *b_json = config_to_json(now);
    Entry *a = NULL, *b = NULL;
    int na = flatten(a_json, &a), nb = flatten(b_json, &b);
    free(a_json);
    free(b_json);
    if (na < 0 || nb < 0) FATAL("config_to_json wrote text that is not a JSON object");
    int n = 0, cap = 0;
    for (int i = 0; i < nb; i++) {
        const char *before = value_of(a, na, b[i].key);
        if (!before || strcmp(before, b[i].value) != 0) add_change(out, &n, &cap, b[i].key, before, b[i].value);
    }
    for (int i = 0; i < na; i++)
        if (!value_of(b, nb, a[i].key)) add_change(out, &n, &cap, a[i].key, a[i].value, NULL);
    free_entries(a, na);
    free_entries(b, nb);
    return n;
}

// Writes s as a JSON string.
static void put_json_string(FILE *f, const char *s) {
    cJSON *str = cJSON_CreateString(s);
    char *text = cJSON_PrintUnformatted(str);
    fputs(text ? text : "\"\"", f);
    cJSON_free(text);
    cJSON_Delete(str);
}

int config_changes_record(const char *dir, long long step, const char *from, const ConfigChange *changes, int n,
                          ErrBuf *e) {
    char path[4096];
    snprintf(path, sizeof path, "%s/config_changes.jsonl", dir);
    FILE *f = fopen(path, "ab");
    if (!f) return errf(e, "%s: cannot open for appending", path);
    char when[64] = "?";
    time_t now = time(NULL);
    struct tm tm;
    if (localtime_r(&now, &tm)) strftime(when, sizeof when, "%Y-%m-%dT%H:%M:%S", &tm);
    fprintf(f, "{\"time\": \"%s\", \"resumed_at_step\": %lld, \"from\": ", when, step);
    put_json_string(f, from);
    fprintf(f, ", \"changes\": [");
    for (int i = 0; i < n; i++)
        fprintf(f, "%s{\"key\": \"%s\", \"before\": %s, \"after\": %s, \"changes_trajectory\": %s}", i ? ", " : "",
                changes[i].key, changes[i].before, changes[i].after, changes[i].trajectory ? "true" : "false");
    fprintf(f, "]}\n");
    int ok = fflush(f) == 0 && fsync(fileno(f)) == 0;
    ok = fclose(f) == 0 && ok;
    return ok ? 0 : errf(e, "%s: write failed (is the disk full?)", path);
}
