// test_checkpoint.c: checkpoint save/load round trip, the errors for truncated, corrupt and
// mismatched files, non-finite states (never written, refused on load without touching the
// buffers), atomic replacement, `latest`, the newest-first list a resume tries, what a
// --checkpoint argument names, and pruning to the last N.
#include <math.h>      // NAN, INFINITY
#include <stdlib.h>    // mkdtemp, rand
#include <string.h>    // memcmp, strstr
#include <sys/stat.h>  // mkdir
#include <unistd.h>    // getpid, unlink

#include "core/checkpoint.h"  // the module under test
#include "core/config.h"      // config_parse for real model configs
#include "core/model.h"       // param_table_build
#include "test.h"             // CHECK

static char dir[256];

// A validated config with the given d_model (n_head 1 or 2 keeps head_dim 64).
static Config make_config(int d_model, int ffn_hidden) {
    char json[512];
    snprintf(json, sizeof json,
             "{\"model\": {\"vocab_size\": 300, \"d_model\": %d, \"n_layer\": 2, \"n_head\": %d, "
             "\"ffn_hidden\": %d, \"seq_len\": 16, \"qk_norm\": true}, \"log\": {\"dir\": \"%s/run\"}}",
             d_model, d_model / 64, ffn_hidden, dir);
    Config c;
    ErrBuf e;
    if (config_parse(json, "test", NULL, 0, &c, &e) != 0) {
        printf("FAIL - config_parse: %s\n", e.msg);
        exit(1);
    }
    return c;
}

// Buffers for one checkpoint's state, filled with seeded random values (never zeros).
typedef struct {
    Config c;
    ParamTable t;
    float *p, *m, *v;
    AttnDelayedState delayed[2];
    CheckpointState s;
} State;

static unsigned long long rng = 88172645463325252ull;
static float frand(void) {
    rng ^= rng << 13; rng ^= rng >> 7; rng ^= rng << 17;
    return (float)((rng >> 11) * (1.0 / 9007199254740992.0)) * 2.0f - 1.0f;
}

static void state_init(State *st, int d_model, int ffn, int randomize) {
    st->c = make_config(d_model, ffn);
    param_table_build(&st->t, &st->c.model);
    size_t n = st->t.total;
    st->p = malloc(n * 4); st->m = malloc(n * 4); st->v = malloc(n * 4);
    for (size_t i = 0; i < n; i++) {
        st->p[i] = randomize ? frand() : 0; st->m[i] = randomize ? frand() : 0; st->v[i] = randomize ? frand() * frand() : 0;
    }
    memset(st->delayed, 0, sizeof st->delayed);
    for (int l = 0; l < 2 && randomize; l++) {
        st->delayed[l].len = 16; st->delayed[l].pos = 3 + l; st->delayed[l].filled = 5;
        for (int k = 0; k < 4; k++) {
            for (int h = 0; h < 16; h++) st->delayed[l].hist[k][h] = frand() * 100;
            st->delayed[l].cur_amax[k] = frand();
        }
    }
    st->s = (CheckpointState){.model = &st->c.model, .table = &st->t, .config_json = "{\"hello\": 1}",
                              .params = st->p, .adam_m = st->m, .adam_v = st->v,
                              .adam_step = randomize ? 41 : 0, .train_step = randomize ? 42 : 0,
                              .elapsed_s = randomize ? 12.5 : 0, .sample_rng = randomize ? 0xdeadbeefcafeull : 0,
                              .data = {randomize ? 1337 : 0, randomize ? 2 : 0, randomize ? 1 : 0, randomize ? 17 : 0},
                              .delayed = st->delayed, .n_delayed = 2};
}

static void state_free(State *st) {
    free(st->p); free(st->m); free(st->v);
    param_table_free(&st->t);
}

static long file_size(const char *path) {
    struct stat sb;
    return stat(path, &sb) == 0 ? (long)sb.st_size : -1;
}

// Copies src to dst, keeping the first keep bytes (all if keep < 0) and flipping byte flip (if >= 0).
static void copy_file(const char *src, const char *dst, long keep, long flip) {
    ErrBuf e;
    size_t len;
    char *buf = read_file_text(src, &len, &e);
    if (keep >= 0 && (size_t)keep < len) len = (size_t)keep;
    if (flip >= 0 && (size_t)flip < len) buf[flip] ^= 0x10;
    FILE *f = fopen(dst, "wb");
    fwrite(buf, 1, len, f);
    fclose(f);
    free(buf);
}

int main(void) {
    snprintf(dir, sizeof dir, "/tmp/test_checkpoint_XXXXXX");
    if (!mkdtemp(dir)) { printf("FAIL - mkdtemp\n"); return 1; }
    ErrBuf e;
    char path[512], bad[512];
    snprintf(path, sizeof path, "%s/step_000042.ckpt", dir);

    // --- round trip ------------------------------------------------------------------------
    State a, b;
    state_init(&a, 128, 352, 1);
    state_init(&b, 128, 352, 0);
    int rc = checkpoint_save(path, &a.s, &e);
    CHECK(rc == 0, "save", "%s", e.msg);
    rc = checkpoint_load(path, &b.s, &e);
    CHECK(rc == 0, "load", "%s", e.msg);
    size_t nb = a.t.total * sizeof(float);
    CHECK(!memcmp(a.p, b.p, nb) && !memcmp(a.m, b.m, nb) && !memcmp(a.v, b.v, nb), "round trip params and moments",
          "buffers differ after load");
    CHECK(b.s.adam_step == 41 && b.s.train_step == 42 && b.s.elapsed_s == 12.5 && b.s.sample_rng == 0xdeadbeefcafeull,
          "round trip scalars", "adam %lld train %lld elapsed %g rng %llx", b.s.adam_step, b.s.train_step, b.s.elapsed_s,
          b.s.sample_rng);
    CHECK(b.s.data.seed == 1337 && b.s.data.epoch == 2 && b.s.data.shard_pos == 1 && b.s.data.window_pos == 17,
          "round trip data loader state", "seed %llu epoch %lld shard %lld window %lld", b.s.data.seed,
          b.s.data.epoch, b.s.data.shard_pos, b.s.data.window_pos);
    CHECK(!memcmp(a.delayed, b.delayed, sizeof a.delayed), "round trip delayed-scaling state", "differs");
    char *cfg = checkpoint_read_config(path, &e);
    CHECK(cfg && !strcmp(cfg, "{\"hello\": 1}"), "stored config text", "got %s", cfg ? cfg : e.msg);
    free(cfg);

    // Loading only the parameters (what `sample` does).
    State c;
    state_init(&c, 128, 352, 0);
    c.s.adam_m = c.s.adam_v = NULL;
    c.s.delayed = NULL;
    rc = checkpoint_load(path, &c.s, &e);
    CHECK(rc == 0 && !memcmp(a.p, c.p, nb), "load params only", "rc %d: %s", rc, e.msg);
    state_free(&c);

    // --- truncated, corrupt, wrong magic -----------------------------------------------------
    long size = file_size(path);
    snprintf(bad, sizeof bad, "%s/truncated.ckpt", dir);
    copy_file(path, bad, size - 100, -1);
    rc = checkpoint_load(bad, &b.s, &e);
    CHECK(rc != 0 && strstr(e.msg, bad) && strstr(e.msg, "truncated"), "truncated file names the file",
          "rc %d msg: %s", rc, e.msg);
    char sizes[64];
    snprintf(sizes, sizeof sizes, "%ld", size);
    CHECK(rc != 0 && strstr(e.msg, sizes), "truncated file gives the expected size", "msg: %s", e.msg);
    copy_file(path, bad, 20, -1);
    rc = checkpoint_load(bad, &b.s, &e);
    CHECK(rc != 0 && strstr(e.msg, "truncated"), "truncated header", "rc %d msg: %s", rc, e.msg);

    snprintf(bad, sizeof bad, "%s/corrupt.ckpt", dir);
    for (int trial = 0; trial < 3; trial++) {
        long where = trial == 0 ? size / 2 : trial == 1 ? 30 : size - 3;  // data, header field, checksum
        copy_file(path, bad, -1, where);
        rc = checkpoint_load(bad, &b.s, &e);
        CHECK(rc != 0 && strstr(e.msg, "corrupt") && strstr(e.msg, bad), "flipped byte is reported corrupt",
              "byte %ld: rc %d msg: %s", where, rc, e.msg);
    }
    copy_file(path, bad, -1, 0);
    rc = checkpoint_load(bad, &b.s, &e);
    CHECK(rc != 0 && strstr(e.msg, "not a train_gpt checkpoint"), "bad magic", "msg: %s", e.msg);
    copy_file(path, bad, -1, 4);
    rc = checkpoint_load(bad, &b.s, &e);
    CHECK(rc != 0 && strstr(e.msg, "version"), "bad version", "msg: %s", e.msg);
    rc = checkpoint_load("/nonexistent/x.ckpt", &b.s, &e);
    CHECK(rc != 0 && strstr(e.msg, "/nonexistent/x.ckpt"), "missing file named", "msg: %s", e.msg);

    // --- shape mismatches ----------------------------------------------------------------------
    State d;
    state_init(&d, 256, 352, 0);
    rc = checkpoint_load(path, &d.s, &e);
    CHECK(rc != 0 && strstr(e.msg, "model.d_model is 128 in the checkpoint but 256 in the config") &&
              strstr(e.msg, path),
          "different d_model names the field and both values", "msg: %s", e.msg);
    state_free(&d);
    state_init(&d, 128, 512, 0);
    rc = checkpoint_load(path, &d.s, &e);
    CHECK(rc != 0 && strstr(e.msg, "model.ffn_hidden is 352 in the checkpoint but 512"), "different ffn_hidden",
          "msg: %s", e.msg);
    state_free(&d);
    // Same header, one tensor shaped differently: the message names the tensor and both shapes.
    state_init(&d, 128, 352, 0);
    ParamDesc *fc = NULL;
    for (int i = 0; i < d.t.n; i++)
        if (d.t.p[i].kind == P_MLP_FC && d.t.p[i].layer == 0) fc = &d.t.p[i];
    long rows = fc->rows;
    fc->rows = 512;
    rc = checkpoint_load(path, &d.s, &e);
    char want[256];
    snprintf(want, sizeof want, "%s: checkpoint has shape (%ld, 128), model has (512, 128)", fc->name, rows);
    CHECK(rc != 0 && strstr(e.msg, want), "different tensor shape names the tensor", "msg: %s (wanted %s)", e.msg,
          want);
    fc->rows = rows;
    state_free(&d);

    // --- non-finite states --------------------------------------------------------------------
    // Never written: a NaN parameter, an Inf moment, a NaN amax; the message names the value.
    char nf_path[512];
    snprintf(nf_path, sizeof nf_path, "%s/nonfinite.ckpt", dir);
    const ParamDesc *last = &a.t.p[a.t.n - 1];
    float keep_p = a.p[last->offset + 3], keep_m = a.m[7], keep_amax = a.delayed[1].hist[2][5];
    a.p[last->offset + 3] = NAN;
    rc = checkpoint_save(nf_path, &a.s, &e);
    char want_nf[256];
    snprintf(want_nf, sizeof want_nf, "not finite (parameter %s[3] is nan)", last->name);
    CHECK(rc != 0 && strstr(e.msg, want_nf) && !file_exists(nf_path), "save refuses a NaN parameter, naming it",
          "rc %d msg: %s", rc, e.msg);
    a.p[last->offset + 3] = keep_p;
    a.m[7] = INFINITY;
    rc = checkpoint_save(nf_path, &a.s, &e);
    CHECK(rc != 0 && strstr(e.msg, "AdamW first moment") && strstr(e.msg, "is inf") && !file_exists(nf_path),
          "save refuses an Inf moment", "rc %d msg: %s", rc, e.msg);
    a.m[7] = keep_m;
    a.delayed[1].hist[2][5] = NAN;
    rc = checkpoint_save(nf_path, &a.s, &e);
    CHECK(rc != 0 && strstr(e.msg, "delayed-scaling state 1") && !file_exists(nf_path), "save refuses a NaN amax",
          "rc %d msg: %s", rc, e.msg);
    a.delayed[1].hist[2][5] = keep_amax;
    // Refused on load (a file a diverged run wrote, with a valid checksum), the caller's buffers
    // untouched, so a resume can try an older checkpoint into them.
    for (int which = 0; which < 2; which++) {  // a parameter, then a second moment
        size_t len;
        unsigned char *bytes = (unsigned char *)read_file_text(path, &len, &e);
        uint64_t cfg_len;
        memcpy(&cfg_len, bytes + 16 + 8 * 12, 8);
        size_t at = 16 + 8 * 12 + 8 + cfg_len + (size_t)a.t.n * 80 + (which ? 2 * nb : 0) + 4 * 1000;
        float nan = NAN;
        memcpy(bytes + at, &nan, 4);
        uint64_t h = checkpoint_checksum(bytes, len - 8);
        memcpy(bytes + len - 8, &h, 8);
        FILE *f = fopen(nf_path, "wb");
        fwrite(bytes, 1, len, f);
        fclose(f);
        free(bytes);
        State z;
        state_init(&z, 128, 352, 0);
        for (size_t i = 0; i < z.t.total; i++) z.p[i] = z.m[i] = z.v[i] = 7.0f;
        z.s.train_step = -5;
        rc = checkpoint_load(nf_path, &z.s, &e);
        int untouched = z.s.train_step == -5 && z.p[0] == 7.0f && z.m[0] == 7.0f && z.v[z.t.total - 1] == 7.0f;
        CHECK(rc == -1 && strstr(e.msg, "not finite") && strstr(e.msg, which ? "AdamW second moment" : "parameter") &&
                  strstr(e.msg, "diverged") && untouched,
              which ? "load refuses a NaN moment, buffers untouched" : "load refuses a NaN parameter, buffers untouched",
              "rc %d untouched %d msg: %s", rc, untouched, e.msg);
        if (which == 1) {  // sampling reads the parameters only: the moments are not its concern
            z.s.adam_m = z.s.adam_v = NULL;
            rc = checkpoint_load(nf_path, &z.s, &e);
            CHECK(rc == 0 && !memcmp(a.p, z.p, nb), "params-only load ignores the moments' NaN", "rc %d: %s", rc, e.msg);
        }
        state_free(&z);
    }
    // A mismatch with the model is -2 (not the file's fault: an older checkpoint would not help).
    state_init(&d, 256, 352, 0);
    rc = checkpoint_load(path, &d.s, &e);
    CHECK(rc == -2, "a model mismatch is -2", "rc %d", rc);
    state_free(&d);
    // The stored config text, on request.
    char *stored = NULL;
    b.s.config_out = &stored;
    rc = checkpoint_load(path, &b.s, &e);
    CHECK(rc == 0 && stored && !strcmp(stored, "{\"hello\": 1}"), "load hands out the stored config", "got %s",
          stored ? stored : e.msg);
    free(stored);
    b.s.config_out = NULL;

    // --- atomic replace: a failed save leaves the old checkpoint intact -------------------------
    State a2;
    state_init(&a2, 128, 352, 1);  // different random values
    char blocker[600];
    snprintf(blocker, sizeof blocker, "%s.tmp.%d", path, (int)getpid());
    mkdir(blocker, 0777);  // the temp file cannot be created where a directory stands
    rc = checkpoint_save(path, &a2.s, &e);
    CHECK(rc != 0 && strstr(e.msg, "cannot create"), "failed save reports the error", "rc %d msg: %s", rc, e.msg);
    rmdir(blocker);
    rc = checkpoint_load(path, &b.s, &e);
    CHECK(rc == 0 && !memcmp(a.p, b.p, nb), "failed save left the old checkpoint intact", "rc %d: %s", rc, e.msg);
    state_free(&a2);

    // --- latest, pruning ----------------------------------------------------------------------
    char ckdir[512], found[1024];
    snprintf(ckdir, sizeof ckdir, "%s/ck", dir);
    make_dirs(ckdir, &e);
    rc = checkpoint_find_latest(ckdir, found, sizeof found, &e);
    CHECK(rc != 0 && strstr(e.msg, "no checkpoint") && strstr(e.msg, ckdir), "no checkpoint to resume from",
          "rc %d msg: %s", rc, e.msg);
    CHECK(!checkpoint_dir_has_any(ckdir), "empty dir holds no run", "has_any said yes");
    for (int step = 10; step <= 50; step += 10) {
        char p[1024];
        checkpoint_path_for_step(ckdir, step, p, sizeof p);
        a.s.train_step = step;
        if (checkpoint_save(p, &a.s, &e) != 0 || checkpoint_mark_latest(ckdir, p, &e) != 0)
            printf("FAIL - save %d: %s\n", step, e.msg);
        checkpoint_prune(ckdir, 2, step);
    }
    int present = 0;
    for (int step = 10; step <= 50; step += 10) {
        char p[1024];
        checkpoint_path_for_step(ckdir, step, p, sizeof p);
        present |= file_exists(p) << (step / 10);
    }
    CHECK(present == ((1 << 4) | (1 << 5)), "keep-last-2 keeps steps 40 and 50", "bitmask of present steps 0x%x",
          present);
    rc = checkpoint_find_latest(ckdir, found, sizeof found, &e);
    CHECK(rc == 0 && strstr(found, "step_000050.ckpt"), "latest names the newest", "rc %d found %s", rc, found);
    char latest[600];
    snprintf(latest, sizeof latest, "%s/latest", ckdir);
    unlink(latest);
    rc = checkpoint_find_latest(ckdir, found, sizeof found, &e);
    CHECK(rc == 0 && strstr(found, "step_000050.ckpt"), "without latest: the highest step file", "found %s", found);
    rc = checkpoint_load(found, &b.s, &e);
    CHECK(rc == 0 && b.s.train_step == 50, "newest checkpoint loads", "rc %d step %lld: %s", rc, b.s.train_step, e.msg);

    // --- the newest-first list a resume tries, and what --checkpoint names --------------------
    char **paths;
    checkpoint_mark_latest(ckdir, found, &e);  // latest -> step 50 again
    int n = checkpoint_list_newest_first(ckdir, &paths);
    CHECK(n == 2 && strstr(paths[0], "step_000050.ckpt") && strstr(paths[1], "step_000040.ckpt"),
          "newest first: latest's, then by step", "n %d: %s, %s", n, n > 0 ? paths[0] : "", n > 1 ? paths[1] : "");
    checkpoint_list_free(paths, n);
    char p40[1024];
    checkpoint_path_for_step(ckdir, 40, p40, sizeof p40);
    checkpoint_mark_latest(ckdir, p40, &e);  // a resume from 40 pointed latest back at it
    n = checkpoint_list_newest_first(ckdir, &paths);
    CHECK(n == 2 && strstr(paths[0], "step_000040.ckpt") && strstr(paths[1], "step_000050.ckpt"),
          "newest first: the one latest names comes first", "n %d: %s", n, n > 0 ? paths[0] : "");
    checkpoint_list_free(paths, n);
    char where[1024];
    int is_file = -1;
    rc = checkpoint_resolve(latest, where, sizeof where, &is_file, &e);
    CHECK(rc == 0 && !is_file && !strcmp(where, ckdir), "resolve: a latest pointer names its directory",
          "rc %d is_file %d where %s: %s", rc, is_file, where, e.msg);
    rc = checkpoint_resolve(ckdir, where, sizeof where, &is_file, &e);
    CHECK(rc == 0 && !is_file && !strcmp(where, ckdir), "resolve: a checkpoint directory", "rc %d %s", rc, where);
    char run2[512], run2ck[600];
    snprintf(run2, sizeof run2, "%s/run2", dir);
    snprintf(run2ck, sizeof run2ck, "%s/checkpoints", run2);
    make_dirs(run2ck, &e);
    rc = checkpoint_resolve(run2, where, sizeof where, &is_file, &e);
    CHECK(rc == 0 && !is_file && !strcmp(where, run2ck), "resolve: a run directory names its checkpoints/",
          "rc %d %s", rc, where);
    rc = checkpoint_resolve(p40, where, sizeof where, &is_file, &e);
    CHECK(rc == 0 && is_file && !strcmp(where, p40), "resolve: a checkpoint file", "rc %d %s", rc, where);
    char notes[600];
    snprintf(notes, sizeof notes, "%s/notes.txt", dir);
    FILE *nf = fopen(notes, "w");
    fputs("hello\n", nf);
    fclose(nf);
    rc = checkpoint_resolve(notes, where, sizeof where, &is_file, &e);
    CHECK(rc != 0 && strstr(e.msg, "neither a train_gpt checkpoint nor a 'latest' pointer"),
          "resolve: a text file that names no checkpoint", "rc %d msg %s", rc, e.msg);
    rc = checkpoint_resolve("/nonexistent/run", where, sizeof where, &is_file, &e);
    CHECK(rc != 0 && strstr(e.msg, "/nonexistent/run"), "resolve: a missing path is named", "msg %s", e.msg);

    // --- pruning stops at the step just written ------------------------------------------------
    // (a run resumed from step 20 while 30..50 of another trajectory are still there)
    for (int step = 10; step <= 50; step += 10) {
        char p[1024];
        checkpoint_path_for_step(ckdir, step, p, sizeof p);
        a.s.train_step = step;
        if (!file_exists(p) && checkpoint_save(p, &a.s, &e) != 0) printf("FAIL - save %d: %s\n", step, e.msg);
    }
    int deleted = checkpoint_prune(ckdir, 1, 20);
    present = 0;
    for (int step = 10; step <= 50; step += 10) {
        char p[1024];
        checkpoint_path_for_step(ckdir, step, p, sizeof p);
        present |= file_exists(p) << (step / 10);
    }
    CHECK(deleted == 1 && present == ((1 << 2) | (1 << 3) | (1 << 4) | (1 << 5)),
          "prune keeps the step just written and leaves later steps alone", "deleted %d, present 0x%x", deleted,
          present);

    state_free(&a);
    state_free(&b);
    char cmd[600];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    if (system(cmd) != 0) printf("# could not remove %s\n", dir);
    return test_summary("test_checkpoint");
}
