// train_gpt.c: main, the command line and the training run loop, on either backend (core/backend.h:
// the CPU reference or the GPU). Read it top to bottom: signals and small helpers, the Run state,
// evaluation and checkpoints, setup (every input validated before anything is written), the
// run loop (train_run), then the command line (main).
//
// Order of a run: validate the inputs (data shards, batch arithmetic, the device), take the run
// directory's lock (core/run_dir.h: one writer per run directory), validate the rest (the run
// directory's state, the checkpoint to resume from and the config changes since it) before
// writing anything; then remove the temporary files of interrupted writes, write the resolved
// config and train. One step = grad_accum micro-batches of (B, T) forward + backward,
// global-norm clipping, one AdamW update. A resumed run restores parameters, AdamW moments and
// step, the data loader position, the attention delayed-scaling state and the sampling RNG, so
// it reproduces the uninterrupted run's losses bit for bit on the CPU; it refuses a config that
// changes the run's trajectory (core/config_diff.h) unless --allow-config-change, which is then
// recorded in the run directory, and falls back past corrupt or non-finite checkpoints to the
// newest that loads. On the GPU the state is
// restored exactly too, but the attention backward's dQ atomics make any two GPU runs differ at
// FP32 rounding level, so a resumed GPU run follows the uninterrupted one closely, not bitwise.
//
// Data parallelism (a launcher started world > 1 processes, comm.h): every rank reads its own
// windows of the data (dataloader rank/world), runs grad_accum = batch_tokens / (micro_batch x
// seq_len x world) micro-batches, and the ranks sum their gradients (backend_dp_*: NCCL on the
// GPU, the host transport on the CPU) before one identical AdamW step (ZeRO-1: sharded). Rank 0
// alone prints, writes the run directory and loads a checkpoint to resume (it broadcasts the
// state); the others write nothing. A stop signal on any rank stops all after the same step
// (comm_any), with one checkpoint; a dead or hung rank makes the others fail within
// train.comm_timeout_s. World 1 makes no comm call: the single-process path is unchanged.
//
// Non-finite steps: a step whose loss or global gradient norm is not finite is not applied (no
// optimizer step; the delayed-scaling histories and key centres its backwards committed are put
// back), and is logged with its data position; the data moves on. train.max_bad_steps such steps
// in a row end the run with an error and no checkpoint. The decision reads the reduced loss and norm, the same
// on every rank, so all ranks decide alike. A diverged model is never checkpointed
// (checkpoint_save refuses one) and pruning never deletes the checkpoint just written.
//
// Evaluation (every eval.interval steps and at the end): the mean validation loss over
// eval.batches micro-batches of the validation rows (a fixed, seeded sample when data.order is
// "mixed"), with the loss per position bucket and per source (eval/val_stats.h); every
// eval.passkey_interval steps (and at the end) passkey retrieval per distance on rank 0
// (eval/passkey.h). Neither leaves a trace in the training state.
//
// Subcommands live with their concern: sample, passkey and attn-check in eval/, encode, decode
// and tokenize in tokenizer/.
#include <cjson/cJSON.h>  // parsing metrics lines when a resumed run trims them
#include <math.h>         // isfinite
#include <omp.h>          // omp_set_num_threads, omp_get_max_threads
#include <signal.h>       // sigaction for SIGINT / SIGTERM
#include <stdio.h>        // printf, fprintf
#include <stdlib.h>       // strtol, getenv, atoll (TRAIN_GPT_PROFILE)
#include <string.h>       // memcpy, strcmp, strncmp
#include <unistd.h>       // write (async-signal-safe) in the signal handler

#include "core/backend.h"         // Backend: the model and its optimizer on the CPU or the GPU
#include "core/checkpoint.h"      // CheckpointState, checkpoint_save/load, latest, prune
#include "core/common.h"          // ErrBuf, die_user
#include "core/config.h"          // config_load
#include "core/config_diff.h"     // config_changes: what a resume changes
#include "core/model.h"           // param_table_build, model_flops_per_token, model_print_summary (--dry-run)
#include "core/run_dir.h"         // RunLock, run_dir_remove_temp_files
#include "comm/comm.h"            // the process group of data parallelism
#include "dataloader.h"           // DataLoader
#include "eval/attn_check.h"      // cmd_attn_check
#include "eval/diagnostics.h"     // FP8-attention diagnostics on probe batches (diagnostics section)
#include "eval/passkey.h"         // passkey retrieval: the periodic evaluation, the mixing, cmd_passkey
#include "eval/sample.h"          // sample_generate for the periodic samples, cmd_sample
#include "eval/val_stats.h"       // validation loss per position bucket and per source
#include "gpu/gpu_info.h"         // GpuInfo: device name and peak for MFU
#include "core/precision.h"       // linear_delayed_on: the run log names the linear scaling
#include "optimizer.h"            // lr_at_step, grad_clip_factor
#include "tokenizer/tokenizer.h"  // decoding samples, cmd_encode, cmd_decode, cmd_tokenize

// The seed of the validation sample in the mixed order (and of the passkey evaluation's sequences):
// fixed, so every run of a comparison is evaluated on the same tokens.
#define VAL_SAMPLE_SEED 1

typedef struct {
    int resume;               // --resume given: continue the run in log.dir (from step 0 without a checkpoint)
    const char *resume_from;  // a checkpoint file, a run or checkpoint directory or a `latest` pointer;
                              // NULL or "latest": the newest of the run's checkpoints that loads
    int allow_config_change;  // --allow-config-change: a resume may change keys that change the trajectory
    long long stop_after;     // > 0: stop after this step, writing a checkpoint (tests, preemption drills)
} TrainOptions;

// ---------------------------------------------------------------------------------------------
// SIGINT / SIGTERM: finish the current step, checkpoint, exit 0. A second signal is not
// waited for: the default action (termination) is restored by the first one.
static volatile sig_atomic_t stop_signal;
static void on_stop_signal(int sig) {
    static const char msg[] = "\ntrain_gpt: stopping after this step (with a checkpoint); signal again to abort\n";
    stop_signal = sig;
    if (write(STDERR_FILENO, msg, sizeof msg - 1) < 0) { /* nothing to do in a handler */ }
    signal(sig, SIG_DFL);  // async-signal-safe
}

// Prints a number for JSON: non-finite values become null (JSON has no NaN).
static void fprint_json_num(FILE *f, const char *key, double x, const char *fmt) {
    fprintf(f, ", \"%s\": ", key);
    if (isfinite(x)) fprintf(f, fmt, x);
    else fprintf(f, "null");
}

// Prints s as a JSON string (quotes, backslashes and control characters escaped).
static void fprint_json_str(FILE *f, const char *s) {
    fputc('"', f);
    for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
        if (*p == '"' || *p == '\\') fprintf(f, "\\%c", *p);
        else if (*p < 0x20) fprintf(f, "\\u%04x", *p);
        else fputc(*p, f);
    }
    fputc('"', f);
}

static void format_duration(double s, char *out, size_t n) {
    long t = s > 0 && s < 1e9 ? (long)(s + 0.5) : 0;
    if (t >= 3600) snprintf(out, n, "%ldh%02ldm", t / 3600, (t % 3600) / 60);
    else if (t >= 60) snprintf(out, n, "%ldm%02lds", t / 60, t % 60);
    else snprintf(out, n, "%lds", t);
}

// Keeps the metrics lines of steps <= last_step (a resumed run replaces what came after its
// checkpoint) and drops a partial last line; rewrites the file atomically. Returns lines dropped.
static int trim_metrics(const char *path, long long last_step, ErrBuf *e) {
    size_t len;
    char *text = read_file_text(path, &len, e);
    if (!text) return -1;
    char *out = xmalloc(len + 1);
    size_t out_len = 0;
    int dropped = 0;
    for (char *line = text; *line;) {
        char *nl = strchr(line, '\n');
        if (!nl) { dropped++; break; }  // a partial line from a crash mid-write
        *nl = '\0';
        cJSON *obj = cJSON_Parse(line);
        cJSON *step = obj ? cJSON_GetObjectItemCaseSensitive(obj, "step") : NULL;
        if (cJSON_IsNumber(step) && step->valuedouble <= (double)last_step) {
            size_t n = (size_t)(nl - line);
            memcpy(out + out_len, line, n);
            out[out_len + n] = '\n';
            out_len += n + 1;
        } else {
            dropped++;
        }
        cJSON_Delete(obj);
        line = nl + 1;
    }
    int rc = dropped ? write_file_atomic(path, out, out_len, e) : 0;
    free(out);
    free(text);
    return rc ? -1 : dropped;
}

// ---------------------------------------------------------------------------------------------
// Everything a run holds, so the helpers below stay short.
typedef struct {
    Config c;
    char ckpt_dir[2048], metrics_path[2048];
    int B, T, grad_accum;
    long long tokens_per_step;
    DataLoader train, val;
    int have_val;
    Backend be;                    // the model and its optimizer, on the CPU or the GPU
    GpuInfo gpu;                   // what gpu_info found (count 0 without a GPU)
    double flops_per_token;        // training FLOPs per token, for MFU
    AttnDelayedState *delayed;     // (n_delayed) the backend's delayed-scaling state, or NULL
    int n_delayed;                 // layers with delayed-scaling state (0 when not in use)
    AttnDelayedState *delayed_save;  // (n_delayed) scratch: eval and samples leave no trace
    AttnDelayedState *delayed_step;  // (n_delayed) the state before the step: a step not applied restores it
    float *centers_step;           // centred keys' delayed c before the step (same rule), or NULL
    int centers_ready_step;
    float *host_params, *host_m, *host_v;  // (total) the state checkpoints see (see checkpoint_state_of)
    int host_state_owned;          // host_* were allocated here (not the CPU backend's own arrays)
    int32_t *inputs, *targets;     // (B, T)
    unsigned long long sample_rng;
    Tokenizer *tok;
    int tok_failed;
    char *config_json;             // resolved config, stored in every checkpoint
    FILE *metrics;
    double elapsed_before;         // training time of earlier sessions (from the checkpoint)
    Comm comm;                     // the process group (world 1: never used)
    int rank, world;               // this process and the data-parallel world size
    Diagnostics diag;              // the diagnostics section: probe batches, buffers, last report
    ValStats val_stats;            // the last evaluation's sums per position bucket and source
    float *losses;                 // (B, T) per-token losses of an evaluation micro-batch
    PasskeyTemplate passkey;       // token ids of the passkey sentences (mixing or evaluation)
    PasskeySet passkey_set;        // eval.passkey_interval > 0: the evaluation's sequences (rank 0)
    int have_passkey;              // passkey_set is made
} Run;

// A failed collective (a peer died, hangs, or failed): say so and leave at once, non-zero.
static void dp_fail(Run *r, const ErrBuf *e) {
    fflush(stdout);
    fprintf(stderr, "train_gpt: error: %s\n", e->msg);
    comm_abort(&r->comm, 1);
}

// The same flag on every rank: 1 if any rank raised it.
static int dp_any(Run *r, int flag) {
    ErrBuf e;
    int any = flag;
    if (r->world > 1 && comm_any(&r->comm, flag, &any, &e)) dp_fail(r, &e);
    return any;
}

// Sums x over the ranks (rank order, so every rank gets the same double).
static double dp_sum(Run *r, double x) {
    ErrBuf e;
    if (r->world > 1 && comm_allreduce_sum(&r->comm, &x, 1, COMM_F64, &e)) dp_fail(r, &e);
    return x;
}

// Mean loss over eval.batches validation micro-batches (at most one epoch of them), the same
// every time, with its sums per position bucket and per source in r->val_stats (all ranks' sums).
// Leaves the training state exactly as it was: the delayed-scaling state is restored afterwards
// so that evaluation never changes the scales training uses (the model commits amax histories
// itself, at the end of each backward).
static double evaluate(Run *r) {
    if (r->n_delayed) memcpy(r->delayed_save, r->delayed, (size_t)r->n_delayed * sizeof *r->delayed_save);
    dataloader_reset(&r->val);
    long long n = r->c.eval.batches > 0 ? r->c.eval.batches : 1, epoch = dataloader_batches_per_epoch(&r->val);
    if (n > epoch) n = epoch;  // past one epoch the same rows would count twice
    val_stats_reset(&r->val_stats);
    int *sources = xmalloc(sizeof(int) * (size_t)r->B);
    for (long long i = 0; i < n; i++) {
        dataloader_next(&r->val, r->inputs, r->targets);
        backend_eval_detail(&r->be, r->inputs, r->targets, r->losses, 0, NULL, NULL);
        for (int b = 0; b < r->B; b++) sources[b] = r->val.source[r->val.row_file[b]];
        val_stats_add(&r->val_stats, r->losses, r->targets, r->B, sources);
    }
    free(sources);
    if (r->n_delayed) memcpy(r->delayed, r->delayed_save, (size_t)r->n_delayed * sizeof *r->delayed_save);
    ErrBuf e;  // each rank evaluated its own rows: add them up
    if (r->world > 1 &&
        comm_allreduce_sum(&r->comm, r->val_stats.acc, 2 * (size_t)val_stats_len(&r->val_stats), COMM_F64, &e))
        dp_fail(r, &e);
    return val_stats_mean(&r->val_stats, NULL);
}

// Passkey retrieval on rank 0 (the others wait at the next collective), printed and logged as
// {"step": N, "passkey": {...}}. Leaves no trace in the training state. Returns the mean
// exact-match accuracy over the distances.
static double passkey_eval_and_log(Run *r, long long step, int steps) {
    if (r->rank != 0 || !r->have_passkey) return NAN;
    if (r->n_delayed) memcpy(r->delayed_save, r->delayed, (size_t)r->n_delayed * sizeof *r->delayed_save);
    const ModelConfig *mc = &r->c.model;
    PasskeyReport rep;
    passkey_evaluate(&r->passkey_set, passkey_backend_forward, &r->be, r->B, mc->vocab_size, mc->padded_vocab_size, &rep);
    if (r->n_delayed) memcpy(r->delayed, r->delayed_save, (size_t)r->n_delayed * sizeof *r->delayed_save);
    double mean = 0;
    printf("step %lld/%d | passkey accuracy", step, steps);
    for (int d = 0; d < rep.n_distances; d++) {
        printf(" %d: %.3f", rep.distance[d], rep.accuracy[d]);
        mean += rep.accuracy[d] / rep.n_distances;
    }
    printf(" | log p(answer)");
    for (int d = 0; d < rep.n_distances; d++) printf(" %.2f", rep.logp_answer[d]);
    printf("\n");
    if (r->metrics) {
        fprintf(r->metrics, "{\"step\": %lld, \"passkey\": ", step);
        passkey_report_json(r->metrics, &rep);
        fprintf(r->metrics, "}\n");
        fflush(r->metrics);
    }
    return mean;
}

// Prints a sample of eval.sample_tokens tokens (skipped with one note if no tokenizer).
static void print_sample(Run *r, long long step) {
    if (r->tok_failed) return;
    if (!r->tok) {
        ErrBuf e;
        r->tok = tokenizer_load(NULL, &e);
        if (!r->tok) {
            printf("note: samples skipped: the tokenizer could not be loaded (%s)\n", e.msg);
            r->tok_failed = 1;
            return;
        }
    }
    if (r->n_delayed) memcpy(r->delayed_save, r->delayed, (size_t)r->n_delayed * sizeof *r->delayed_save);
    int n_new = r->c.eval.sample_tokens > 0 ? r->c.eval.sample_tokens : 32;
    int32_t *tokens = xmalloc((size_t)(n_new + 1) * sizeof(int32_t));
    tokens[0] = sample_default_start(r->c.model.vocab_size);
    int n = sample_generate(&r->be, tokens, 1, n_new, 1.0, 40, &r->sample_rng);
    if (r->n_delayed) memcpy(r->delayed, r->delayed_save, (size_t)r->n_delayed * sizeof *r->delayed_save);
    uint32_t *ids = xmalloc((size_t)n * sizeof(uint32_t));
    for (int i = 1; i < n; i++) ids[i - 1] = (uint32_t)tokens[i];
    size_t len;
    char *text = tokenizer_decode(r->tok, ids, (size_t)(n - 1), &len);
    if (text) printf("step %lld sample: %s\n", step, text);
    else printf("step %lld sample: (ids past the tokenizer's vocabulary)\n", step);
    free(text);
    free(ids);
    free(tokens);
}

// The checkpoint's view of the run: the parameters and AdamW moments as host FP32 arrays (the
// CPU backend's own, read and filled in place; for the GPU and ZeRO-1, host copies filled from
// the backend before a save and copied into it after a load) and the host-side state.
static CheckpointState checkpoint_state_of(Run *r) {
    const ParamTable *t = backend_table(&r->be);
    if (!r->host_params && !backend_state_in_place(&r->be, &r->host_params, &r->host_m, &r->host_v)) {
        r->host_state_owned = 1;
        r->host_params = xmalloc(t->total * sizeof(float));
        r->host_m = xmalloc(t->total * sizeof(float));
        r->host_v = xmalloc(t->total * sizeof(float));
    }
    CheckpointState s = {.model = &backend_config(&r->be)->model, .table = t, .config_json = r->config_json,
                         .params = r->host_params, .adam_m = r->host_m, .adam_v = r->host_v,
                         .sample_rng = r->sample_rng, .delayed = r->n_delayed ? r->delayed : NULL,
                         .n_delayed = r->n_delayed, .key_centers = backend_key_centers(&r->be)};
    return s;
}

static int save_checkpoint_file(Run *r, CheckpointState *sp, long long step, double elapsed, ErrBuf *e);

// Writes step_<step>.ckpt, points `latest` at it, prunes to checkpoint.keep. 0 or -1.
// With world > 1 every rank calls it (ZeRO-1 gathers the AdamW moments), rank 0 writes, and all
// agree on the outcome.
static int save_checkpoint(Run *r, long long step, double elapsed, ErrBuf *e) {
    CheckpointState s = checkpoint_state_of(r);
    if (r->world > 1) {
        if (backend_dp_get_state(&r->be, r->rank == 0 ? s.params : NULL, r->rank == 0 ? s.adam_m : NULL,
                                 r->rank == 0 ? s.adam_v : NULL, &s.adam_step, e))
            dp_fail(r, e);
        int failed = r->rank == 0 && save_checkpoint_file(r, &s, step, elapsed, e) != 0;
        int any = dp_any(r, failed);
        if (any && !failed) errf(e, "rank 0 could not write the checkpoint of step %lld (see its message)", step);
        return any ? -1 : 0;
    }
    backend_get_state(&r->be, s.params, s.adam_m, s.adam_v, &s.adam_step);
    return save_checkpoint_file(r, &s, step, elapsed, e);
}

static int save_checkpoint_file(Run *r, CheckpointState *sp, long long step, double elapsed, ErrBuf *e) {
    CheckpointState s = *sp;
    s.train_step = step;
    s.elapsed_s = elapsed;
    dataloader_get_state(&r->train, &s.data);
    // The loader counts windows per rank; the checkpoint counts those all ranks took together, so
    // that a run resumes on another world size at the same place (world 1: the same number).
    s.data.window_pos *= r->world;
    char path[4096];
    checkpoint_path_for_step(r->ckpt_dir, step, path, sizeof path);
    if (checkpoint_save(path, &s, e) != 0) return -1;
    if (checkpoint_mark_latest(r->ckpt_dir, path, e) != 0) return -1;
    checkpoint_prune(r->ckpt_dir, r->c.checkpoint.keep, step);
    printf("step %lld: checkpoint %s\n", step, path);
    return 0;
}

// The process group: world 1 (no launcher) makes no comm call at all. Otherwise the device is
// chosen first (it decides the transport: NCCL on the GPU, the host transport on the CPU), and
// the job token is a digest of the resolved config and device, so ranks that were given another
// config are turned away at the rendezvous. Ranks other than 0 print nothing to stdout.
static int setup_comm_or_die(Run *r, char *note, size_t note_len) {
    ErrBuf e;
    Config *c = &r->c;
    CommOptions o;
    comm_options_default(&o);
    o.timeout_s = c->train.comm_timeout_s;
    if (comm_detect(&r->comm, &o, &e) != 0) die_user(&e);
    int multi = r->comm.world > 1 || r->comm.launcher == COMM_MPI;
    if (multi && c->train.device != DEVICE_CPU) comm_select_device(&r->comm);
    int device = backend_choose_device(c, c->train.device, c->train.micro_batch, c->model.seq_len, "training", &r->gpu,
                                       note, (int)note_len, &e);
    if (device < 0) die_user(&e);
    r->rank = 0, r->world = 1;
    if (!multi) return device;

    char *json = config_to_json(c);
    size_t len = strlen(json);
    char *token = xmalloc(len + 32);
    snprintf(token, len + 32, "%s|device=%s", json, device == DEVICE_GPU ? "gpu" : "cpu");
    free(json);
    o.job_token = token;
    o.init_nccl = device == DEVICE_GPU;
    o.host_transport = device == DEVICE_CPU;
    int rc = comm_init(&r->comm, &o, &e);
    free(token);
    if (rc != 0) {
        fprintf(stderr, "train_gpt: error: %s\n", e.msg);
        comm_abort(&r->comm, 1);
    }
    r->rank = r->comm.rank, r->world = r->comm.world;
    if (r->world == 1) comm_destroy(&r->comm);  // mpirun -np 1
    if (r->rank != 0 && !freopen("/dev/null", "w", stdout)) FATAL("rank %d: cannot silence stdout", r->rank);
    return device;
}

// Rank 0 loaded the checkpoint into s's buffers and scalars; the other ranks receive them.
static void broadcast_resume(Run *r, CheckpointState *s) {
    struct {
        long long adam_step, train_step;
        double elapsed_s;
        unsigned long long sample_rng;
        DataLoaderState data;
    } sc = {s->adam_step, s->train_step, s->elapsed_s, s->sample_rng, s->data};
    const size_t n = backend_table(&r->be)->total * sizeof(float);
    ErrBuf e;
    if (comm_broadcast(&r->comm, &sc, sizeof sc, &e) || comm_broadcast(&r->comm, s->params, n, &e) ||
        comm_broadcast(&r->comm, s->adam_m, n, &e) || comm_broadcast(&r->comm, s->adam_v, n, &e) ||
        (r->n_delayed && comm_broadcast(&r->comm, r->delayed, (size_t)r->n_delayed * sizeof *r->delayed, &e)))
        dp_fail(r, &e);
    AttnKeyCenters *kc = s->key_centers;  // centred keys' delayed c: rank 0's, as the amax histories
    if (kc && (comm_broadcast(&r->comm, &kc->ready, sizeof kc->ready, &e) ||
               comm_broadcast(&r->comm, kc->center, (size_t)attn_key_centers_count(kc) * sizeof(float), &e)))
        dp_fail(r, &e);
    s->adam_step = sc.adam_step, s->train_step = sc.train_step, s->elapsed_s = sc.elapsed_s;
    s->sample_rng = sc.sample_rng, s->data = sc.data;
}

// Passkey mixing (data.passkey_fraction) and evaluation (eval.passkey_interval): the template from
// the GPT-2 tokenizer, the evaluation's sequences from data.val (rank 0). Any problem is a user
// error here, before anything is written.
static void setup_passkey_or_die(Run *r) {
    const Config *c = &r->c;
    ErrBuf e, e2;
    if (c->data.passkey_fraction <= 0 && c->eval.passkey_interval <= 0) return;
    const char *key = c->data.passkey_fraction > 0 ? "data.passkey_fraction" : "eval.passkey_interval";
    Tokenizer *tok = tokenizer_load(NULL, &e2);
    if (!tok) {
        errf(&e, "%s: passkey sequences need the GPT-2 tokenizer: %s", key, e2.msg);
        die_user(&e);
    }
    int rc = passkey_template_init(&r->passkey, tok, &e2);
    tokenizer_free(tok);
    if (rc != 0 || r->passkey.max_id >= (uint32_t)c->model.vocab_size) {
        errf(&e, "%s: %s", key, rc ? e2.msg : "the passkey sentences' token ids are outside model.vocab_size "
                                              "(passkey retrieval needs the GPT-2 vocabulary)");
        die_user(&e);
    }
    const int need = passkey_overhead(&r->passkey, PASSKEY_MAX_DIGITS);
    if (c->data.passkey_fraction > 0) {
        if (passkey_max_distance(&r->passkey, r->T + 1, PASSKEY_MAX_DIGITS) < 0) {
            errf(&e, "data.passkey_fraction: a passkey sequence takes %d tokens, more than a row of model.seq_len + 1 "
                     "= %d", need, r->T + 1);
            die_user(&e);
        }
        dataloader_mix_passkey(&r->train, &r->passkey, c->data.passkey_fraction);
    }
    if (c->eval.passkey_interval <= 0 || r->rank != 0) return;
    if (!r->have_val) {
        errf(&e, "eval.passkey_interval: the passkey evaluation takes its filler from data.val, which is empty");
        die_user(&e);
    }
    int dist[PASSKEY_MAX_DISTANCES];
    int nd = passkey_distances(&r->passkey, r->T, c->eval.passkey_min_distance, dist, PASSKEY_MAX_DISTANCES);
    if (nd == 0) {
        errf(&e, "eval.passkey_min_distance: %d does not fit a passkey sequence of model.seq_len = %d tokens (at most "
                 "%d: the sentences take %d)", c->eval.passkey_min_distance, r->T,
             passkey_max_distance(&r->passkey, r->T, PASSKEY_MAX_DIGITS), need);
        die_user(&e);
    }
    if (passkey_set_make(&r->passkey_set, &r->passkey, c->data.val, c->model.vocab_size, r->T, dist, nd,
                         c->eval.passkey_samples, VAL_SAMPLE_SEED, &e2) != 0) {
        errf(&e, "eval.passkey_interval: data.val (%s): %s", c->data.val, e2.msg);
        die_user(&e);
    }
    r->have_passkey = 1;
}

// ---------------------------------------------------------------------------------------------
// The run directory: its lock, what a resume starts from, and what it changes.

// Held from before the run directory is looked at until the process ends (exit runs
// release_run_locks, so a refused run leaves no lock and no directory it created).
static RunLock run_lock = {.fd = -1}, ckpt_lock = {.fd = -1};
static void release_run_locks(void) {
    run_lock_release(&ckpt_lock);
    run_lock_release(&run_lock);
}

// Locks log.dir, and checkpoint.dir where it lies elsewhere (another run could share it).
static void lock_run_dirs_or_die(Run *r) {
    ErrBuf e;
    char note[1024], own[2100];
    atexit(release_run_locks);
    if (run_lock_acquire(&run_lock, r->c.log.dir, note, sizeof note, &e) != 0) die_user(&e);
    if (note[0]) printf("%s\n", note);
    snprintf(own, sizeof own, "%s/checkpoints", r->c.log.dir);
    if (strcmp(r->ckpt_dir, own) != 0) {
        if (run_lock_acquire(&ckpt_lock, r->ckpt_dir, note, sizeof note, &e) != 0) die_user(&e);
        if (note[0]) printf("%s\n", note);
    }
}

// The checkpoints --resume tries, newest first (*paths, the count returned; 0: none, the run
// starts at step 0). A checkpoint file named on the command line is the only one tried
// (*explicit_file = 1); a directory or `latest` pointer gives its checkpoints.
static int resume_candidates_or_die(Run *r, const TrainOptions *opt, char ***paths, int *explicit_file) {
    ErrBuf e, e2;
    *explicit_file = 0;
    if (!opt->resume_from || !strcmp(opt->resume_from, "latest")) return checkpoint_list_newest_first(r->ckpt_dir, paths);
    char where[4096];
    if (checkpoint_resolve(opt->resume_from, where, sizeof where, explicit_file, &e2) != 0) {
        errf(&e, "--resume %s", e2.msg);
        die_user(&e);
    }
    if (*explicit_file) {
        *paths = xcalloc(1, sizeof **paths);
        (*paths)[0] = xstrdup(where);
        return 1;
    }
    int n = checkpoint_list_newest_first(where, paths);
    if (n == 0) {  // named explicitly: a directory without checkpoints is a mistake, not a fresh start
        checkpoint_list_free(*paths, 0);
        errf(&e, "--resume %s: no checkpoint in %s (no 'latest' file and no step_*.ckpt)", opt->resume_from, where);
        die_user(&e);
    }
    return n;
}

// A change's value for messages: the JSON text, "(absent)" for a key one side lacks.
static const char *shown(const char *json) { return strcmp(json, "null") ? json : "(absent)"; }

// The differences between the config the run was made with (the checkpoint's, or without one the
// run directory's config.json) and this one. Keys that change the trajectory are refused with the
// list, unless --allow-config-change; the others are noted. Returns the number of changes (with
// *out and where they were measured from in from), all to be recorded before training.
static int resume_config_changes_or_die(Run *r, const TrainOptions *opt, const char *stored, const char *ckpt_path,
                                        ConfigChange **out, char *from, size_t from_len) {
    ErrBuf e, e2;
    char *text = NULL;
    *out = NULL;
    if (stored) {
        snprintf(from, from_len, "%s", ckpt_path);
    } else {
        snprintf(from, from_len, "%s/config.json", r->c.log.dir);
        if (!file_exists(from)) return 0;  // nothing recorded to compare with (a run killed before writing it)
        text = read_file_text(from, NULL, &e2);
        if (!text) die_user(&e2);
        stored = text;
    }
    int n = config_changes(stored, &r->c, out, &e2);
    free(text);
    if (n < 0) {
        if (opt->allow_config_change) {
            printf("note: the config %s was made with cannot be compared (%s): continuing (--allow-config-change)\n",
                   from, e2.msg);
            return 0;
        }
        errf(&e, "--resume: the config %s was made with cannot be compared with this one (%s): pass "
                 "--allow-config-change to resume anyway", from, e2.msg);
        die_user(&e);
    }
    int n_trajectory = 0;
    for (int i = 0; i < n; i++) n_trajectory += (*out)[i].trajectory;
    if (n_trajectory > 0 && !opt->allow_config_change) {
        fflush(stdout);
        fprintf(stderr, "train_gpt: error: --resume: the config differs from the one %s was made with in %d key%s "
                        "that change%s the run's trajectory:\n", from, n_trajectory, n_trajectory == 1 ? "" : "s",
                n_trajectory == 1 ? "s" : "");
        for (int i = 0; i < n; i++)
            if ((*out)[i].trajectory)
                fprintf(stderr, "  %s: %s -> %s\n", (*out)[i].key, shown((*out)[i].before), shown((*out)[i].after));
        fprintf(stderr, "to continue the run as it was, resume with the values it was made with (its config: %s/config.json); "
                        "to continue with the new values, add --allow-config-change (the change is recorded in "
                        "%s/config_changes.jsonl); or start a new run in another log.dir\n", r->c.log.dir, r->c.log.dir);
        exit(1);
    }
    for (int i = 0; i < n; i++)
        printf("note: resume changes %s: %s -> %s%s\n", (*out)[i].key, shown((*out)[i].before), shown((*out)[i].after),
               (*out)[i].trajectory ? " (changes the run's trajectory: allowed by --allow-config-change)" : "");
    return n;
}

// ---------------------------------------------------------------------------------------------
// Setup: every check that can fail on user input, in an order that writes nothing. With world > 1
// only rank 0 looks at the run directory (the others write nothing and get a resumed state from
// rank 0); a rank that fails here exits 1 and the others fail at their next collective.
static void setup_or_die(Run *r, const TrainOptions *opt, long long *start_step) {
    ErrBuf e, e2;
    Config *c = &r->c;
    r->B = c->train.micro_batch;
    r->T = c->model.seq_len;
    char note[1536];
    int device = setup_comm_or_die(r, note, sizeof note);
    const int world = r->world;
    long long per_micro = (long long)r->B * r->T * world;
    r->tokens_per_step = c->train.batch_tokens > 0 ? c->train.batch_tokens : per_micro;
    if (r->tokens_per_step % per_micro != 0) {
        errf(&e, "train.batch_tokens (%lld) must be a multiple of micro_batch x seq_len x world size = %d x %d x %d = %lld",
             r->tokens_per_step, r->B, r->T, world, per_micro);
        die_user(&e);
    }
    r->grad_accum = (int)(r->tokens_per_step / per_micro);
    if (note[0]) printf("%s\n", note);

    if (!c->data.train[0]) {
        errf(&e, "data.train is empty: set the training shards' glob in the config or with --set data.train=PATTERN");
        die_user(&e);
    }
    int (*open_data)(DataLoader *, const char *, int, int, int, int, int, unsigned long long, int, ErrBuf *) =
        c->data.order == DATA_ORDER_MIXED ? dataloader_open_mixed : dataloader_open;
    if (open_data(&r->train, c->data.train, r->B, r->T, r->rank, world, c->data.shuffle, c->data.seed,
                  c->model.vocab_size, &e2) != 0) {
        errf(&e, "data.train (%s): %s", c->data.train, e2.msg);
        die_user(&e);
    }
    r->have_val = c->data.val[0] != '\0';
    // In the mixed order the validation rows are one fixed sample whatever data.seed, so that runs
    // of different seeds are evaluated on the same tokens.
    const unsigned long long val_seed = c->data.order == DATA_ORDER_MIXED ? VAL_SAMPLE_SEED : c->data.seed;
    if (r->have_val && open_data(&r->val, c->data.val, r->B, r->T, r->rank, world, c->data.shuffle, val_seed,
                                 c->model.vocab_size, &e2) != 0) {
        errf(&e, "data.val (%s): %s", c->data.val, e2.msg);
        die_user(&e);
    }
    setup_passkey_or_die(r);

    checkpoint_dir_of(c, r->ckpt_dir, sizeof r->ckpt_dir);
    snprintf(r->metrics_path, sizeof r->metrics_path, "%s/%s", c->log.dir, c->log.metrics_file);
    // Rank 0 owns the run directory: it locks it, then finds what to resume from (the checkpoints
    // to try, newest first; none: the run starts at step 0).
    char **resume_paths = NULL;
    int n_resume = 0, resume_file = 0;
    if (r->rank == 0) {
        lock_run_dirs_or_die(r);
        int has_run = file_exists(r->metrics_path) || checkpoint_dir_has_any(r->ckpt_dir);
        if (has_run && !opt->resume) {
            errf(&e, "run dir %s already holds a run (%s): pass --resume to continue it (from its newest checkpoint, "
                     "or from step 0 if it has none), choose another log.dir via --set log.dir=..., or remove %s to "
                     "start over", c->log.dir, file_exists(r->metrics_path) ? r->metrics_path : r->ckpt_dir, c->log.dir);
            die_user(&e);
        }
        if (opt->resume) n_resume = resume_candidates_or_die(r, opt, &resume_paths, &resume_file);
    }

    // Each backward is scaled by 1 / (grad_accum x world): the ranks' sum is the mean gradient.
    // With world > 1 the backend learns the process group before it allocates (ZeRO-1 on the GPU
    // shards the allocation).
    if (backend_init_dp(&r->be, c, (DeviceKind)device, r->B, r->T, c->train.seed, r->grad_accum * world,
                        r->rank == 0 ? stdout : NULL, world > 1 ? &r->comm : NULL, c->train.zero1, &e) != 0)
        die_user(&e);
    if (r->be.kind == DEVICE_GPU && c->diagnostics.interval > 0 && c->diagnostics.reference != ATTN_BF16) {
        errf(&e, "diagnostics.reference \"%s\" runs on the CPU backend only: set it to \"bf16\" for the GPU "
                 "(or train.device \"cpu\")", attn_precision_name(c->diagnostics.reference));
        die_user(&e);
    }
    if (diagnostics_init(&r->diag, c, r->B, r->T, &e) != 0) die_user(&e);
    r->flops_per_token = model_flops_per_token(&c->model);
    r->delayed = backend_delayed_state(&r->be, &r->n_delayed);
    r->delayed_save = xcalloc((size_t)(r->n_delayed ? r->n_delayed : 1), sizeof(AttnDelayedState));
    r->delayed_step = xcalloc((size_t)(r->n_delayed ? r->n_delayed : 1), sizeof(AttnDelayedState));
    const AttnKeyCenters *kc = backend_key_centers(&r->be);
    if (kc) r->centers_step = xmalloc((size_t)attn_key_centers_count(kc) * sizeof(float));
    r->inputs = xmalloc((size_t)r->B * r->T * sizeof(int32_t));
    r->targets = xmalloc((size_t)r->B * r->T * sizeof(int32_t));
    r->losses = xmalloc((size_t)r->B * r->T * sizeof(float));
    val_stats_init(&r->val_stats, r->T, r->have_val ? r->val.n_sources : 1);
    r->sample_rng = sample_rng_seed(c->train.seed);
    r->config_json = config_to_json(c);
    *start_step = 0;

    // Rank 0 loads the newest candidate that loads (a refused file leaves the state untouched, so
    // the next one loads into the same buffers) and tells the others whether there was one.
    CheckpointState s = checkpoint_state_of(r);
    char *stored_config = NULL, resume_path[4096] = "";
    for (int i = 0; i < n_resume && !resume_path[0]; i++) {
        s = checkpoint_state_of(r);
        s.config_out = &stored_config;
        int rc = checkpoint_load(resume_paths[i], &s, &e2);
        if (rc == 0) {
            snprintf(resume_path, sizeof resume_path, "%s", resume_paths[i]);
        } else if (resume_file || rc == -2) {  // -2: made for another model, as the older ones are
            die_user(&e2);
        } else if (i + 1 < n_resume) {
            printf("note: not resuming from %s: %s\n", resume_paths[i], e2.msg);
        } else {
            errf(&e, "--resume: no checkpoint of %s loads (the oldest one: %s): start over in another log.dir, or "
                     "move them away to restart this run from step 0", r->ckpt_dir, e2.msg);
            die_user(&e);
        }
    }
    if (n_resume) checkpoint_list_free(resume_paths, n_resume);
    int have_ckpt = resume_path[0] != '\0';
    // What the resume changes against the config the run was made with: refused here, before
    // anything is written and before the other ranks are told to go on, when it changes the
    // trajectory without --allow-config-change.
    ConfigChange *changes = NULL;
    int n_changes = 0;
    char changes_from[4096] = "";
    if (r->rank == 0 && opt->resume) {
        if (have_ckpt) printf("resuming from %s (step %lld of %d)\n", resume_path, s.train_step, c->train.steps);
        else printf("note: --resume: no checkpoint in %s: the run starts from step 0\n", r->ckpt_dir);
        n_changes = resume_config_changes_or_die(r, opt, stored_config, resume_path, &changes, changes_from,
                                                 sizeof changes_from);
    }
    free(stored_config);
    if (world > 1 && opt->resume) {
        ErrBuf eb;
        if (comm_broadcast(&r->comm, &have_ckpt, sizeof have_ckpt, &eb)) dp_fail(r, &eb);
    }
    if (have_ckpt) {
        if (world > 1) broadcast_resume(r, &s);
        backend_set_state(&r->be, s.params, s.adam_m, s.adam_v, s.adam_step);
        s.data.window_pos /= world;  // windows of all ranks -> this loader's (see save_checkpoint_file)
        if (dataloader_set_state(&r->train, &s.data, &e2) != 0) {
            errf(&e, "checkpoint %s: its data loader position does not fit data.train (%s): %s", resume_path,
                 c->data.train, e2.msg);
            die_user(&e);
        }
        if (s.train_step > c->train.steps) {
            errf(&e, "checkpoint %s is at step %lld, past train.steps = %d (raise it with --set train.steps=N "
                     "--allow-config-change)", resume_path, s.train_step, c->train.steps);
            die_user(&e);
        }
        r->sample_rng = s.sample_rng;
        r->elapsed_before = s.elapsed_s;
        *start_step = s.train_step;
    }
    if (r->rank != 0) return;  // the run directory is rank 0's

    // Inputs are valid: now the run directory may be written.
    for (int d = 0; d < 2; d++) {
        char note[1024];
        long long bytes;
        if (run_dir_remove_temp_files(d ? r->ckpt_dir : c->log.dir, &bytes, note, sizeof note) > 0) printf("%s\n", note);
    }
    if (make_dirs(c->log.dir, &e) != 0 || make_dirs(r->ckpt_dir, &e) != 0) die_user(&e);
    if (n_changes > 0) {
        if (config_changes_record(c->log.dir, *start_step, changes_from, changes, n_changes, &e) != 0) die_user(&e);
        printf("note: the config changes recorded in %s/config_changes.jsonl; config.json now holds the new values\n",
               c->log.dir);
    }
    free(changes);
    if (config_write_resolved(c, c->log.dir, &e) != 0) die_user(&e);
    if (opt->resume && file_exists(r->metrics_path)) {
        // A resumed run replaces what came after its checkpoint (all of it without one).
        int dropped = trim_metrics(r->metrics_path, *start_step > 0 ? *start_step : -1, &e);
        if (dropped < 0) die_user(&e);
        if (dropped && *start_step > 0)
            printf("note: dropped %d metrics lines written after step %lld\n", dropped, *start_step);
        else if (dropped)
            printf("note: dropped %d metrics lines of the session that wrote no checkpoint\n", dropped);
    }
    r->metrics = fopen(r->metrics_path, *start_step > 0 ? "ab" : "wb");
    if (!r->metrics) FATAL("cannot open %s for writing (hint: is the run directory writable?)", r->metrics_path);
}

static void print_plan(const Run *r, long long start_step) {
    const Config *c = &r->c;
    double n_params = (double)backend_table(&r->be)->total;
    long long shard_tokens = 0;
    for (int i = 0; i < r->train.n_files; i++) shard_tokens += r->train.n_tokens[i];
    printf("train_gpt: %s | run dir %s\n", c->source_path[0] ? c->source_path : "(config)", c->log.dir);
    printf("model: %.3fM parameters, %d layers, d_model %d, %d heads | attention %s | linears %s", n_params / 1e6,
           c->model.n_layer, c->model.d_model, c->model.n_head, attn_precision_name(c->precision.attention),
           linear_precision_name(c->precision.linear));
    if (linear_delayed_on(&c->precision))
        printf(" (delayed scaling, %d micro-batches of amax history)", c->precision.linear_amax_history);
    if (c->precision.linear_fast_accum != FAST_ACCUM_NONE)
        printf(" (fast accumulation: %s GEMMs%s)",
               c->precision.linear_fast_accum == FAST_ACCUM_FORWARD ? "forward" : "all",
               r->be.kind == DEVICE_CPU ? "; GPU only, the CPU backend sums in FP32" : "");
    printf(" | ");
    if (r->be.kind == DEVICE_CPU) printf("memory: params, grads, AdamW m and v 4 x %.1f MB fp32\n", n_params * 4 / 1e6);
    else printf("memory: the GPU memory plan above\n");
    printf("batch: %d x %d tokens x %d accumulation", r->B, r->T, r->grad_accum);
    if (r->world > 1) printf(" x %d ranks", r->world);
    printf(" = %lld tokens/step | %d steps from step %lld | data: %d train shard(s), %lld tokens%s\n",
           r->tokens_per_step, c->train.steps, start_step, r->train.n_files, shard_tokens,
           r->have_val ? "" : " | no data.val: evaluation skipped");
    if (c->data.order == DATA_ORDER_MIXED)
        printf("data order: mixed (rows of %d tokens from %d source(s) in one seeded permutation)%s", r->T + 1,
               r->train.n_sources, c->data.passkey_fraction > 0 ? "" : "\n");
    else
        printf("data order: shards (windows of %d x %d tokens, shard by shard)\n", r->B, r->T);
    if (c->data.passkey_fraction > 0) printf(" | passkey sequences: %.1f%% of the rows\n", 100 * c->data.passkey_fraction);
    if (r->train.n_short || (r->have_val && r->val.n_short))
        printf("note: %d train and %d val shard(s) are shorter than one row of %d tokens and give none\n",
               r->train.n_short, r->have_val ? r->val.n_short : 0, r->T + 1);
    if (r->have_val) {
        long long n = c->eval.batches, epoch = dataloader_batches_per_epoch(&r->val);
        printf("evaluation: %lld validation tokens from %d source(s)%s", (n < epoch ? n : epoch) * r->B * r->T * r->world,
               r->val.n_sources, n > epoch ? " (all of data.val: fewer than eval.batches)" : "");
        if (r->have_passkey)
            printf(" | passkey: %d sequences at distances %d..%d every %d steps", r->passkey_set.n,
                   r->passkey_set.distance[0], r->passkey_set.distance[r->passkey_set.n_distances - 1],
                   c->eval.passkey_interval);
        printf("\n");
    }
    if (r->world > 1)
        printf("data parallel: %d ranks (%s launcher, %d per node) | %s | ZeRO-1 %s | overlap %s | comm timeout %g s\n",
               r->world, comm_launcher_name(r->comm.launcher), r->comm.local_world,
               r->be.kind == DEVICE_GPU ? "NCCL" : "host transport over TCP",
               r->be.zero1 ? "on (AdamW state sharded)" : "off",
               r->be.overlap ? "on (gradient buckets reduced during the last backward)" : "off", r->comm.timeout_s);
    if (r->be.kind == DEVICE_CPU) {
        printf("device: cpu (%d threads) | MFU n/a (CPU)\n", omp_get_max_threads());
    } else {
        printf("device: gpu (%s, %.0f GiB, sm_%d%d) | %.4g FLOPs/token | ", r->gpu.name, r->gpu.mem_gib,
               r->gpu.sm_major, r->gpu.sm_minor, r->flops_per_token);
        if (r->gpu.peak_bf16_tflops > 0) printf("MFU against a bf16 peak of %.0f TFLOP/s\n", r->gpu.peak_bf16_tflops);
        else printf("MFU n/a (unknown GPU peak)\n");
    }
    fflush(stdout);
}

// Model FLOPs utilisation of a step at tok_s tokens/s (all ranks together): achieved FLOP/s over
// the dense BF16 peak of the world's GPUs (one per rank), so the number is per GPU whatever the
// world size. -1 on the CPU or when the GPU's peak is unknown.
static double mfu_of(const Run *r, double tok_s) {
    if (r->be.kind != DEVICE_GPU || !(r->gpu.peak_bf16_tflops > 0) || !(tok_s > 0)) return -1.0;
    return tok_s * r->flops_per_token / (r->gpu.peak_bf16_tflops * 1e12 * (r->world > 0 ? r->world : 1));
}

// Evaluates, prints the validation loss (and, with several sources, the loss per source) and
// appends it to the metrics file with its tokens, the mean loss per position bucket and per
// source: {"step": N, "val_loss": x, "val_tokens": n, "val_pos": {"start": [...], "end": [...],
// "mean": [...], "tokens": [...]}, "val_source": {"name": {"mean": x, "tokens": n}, ...}}.
static double evaluate_and_log(Run *r, long long step, int steps) {
    double val = evaluate(r), tokens;
    const ValStats *v = &r->val_stats;
    val_stats_mean(v, &tokens);
    printf("step %lld/%d | val loss %.4f\n", step, steps, val);
    if (v->n_sources > 1) {
        printf("step %lld/%d | val by source:", step, steps);
        int unseen = 0;
        for (int i = 0; i < v->n_sources; i++) {
            double t, x = val_stats_source(v, i, &t);
            if (t > 0) printf(" %s %.3f", r->val.source_names[i], x);
            else printf(" %s n/a", r->val.source_names[i]), unseen = 1;
        }
        // a source whose validation split is shorter than one row, or outside eval.batches' rows
        printf("%s\n", unseen ? " (n/a: no row of the evaluation comes from it)" : "");
    }
    if (!r->metrics) return val;  // ranks other than 0
    FILE *f = r->metrics;
    fprintf(f, "{\"step\": %lld", step);
    fprint_json_num(f, "val_loss", val, "%.9g");
    fprintf(f, ", \"val_tokens\": %.0f, \"val_pos\": {\"start\": [", tokens);
    for (int b = 0; b < v->n_buckets; b++) fprintf(f, "%s%d", b ? ", " : "", v->bucket_start[b]);
    fprintf(f, "], \"end\": [");
    for (int b = 0; b < v->n_buckets; b++) fprintf(f, "%s%d", b ? ", " : "", v->bucket_start[b + 1]);
    fprintf(f, "], \"mean\": [");
    for (int b = 0; b < v->n_buckets; b++) {
        double x = val_stats_bucket(v, b, NULL);
        fprintf(f, b ? ", " : "");
        if (isfinite(x)) fprintf(f, "%.9g", x);
        else fprintf(f, "null");
    }
    fprintf(f, "], \"tokens\": [");
    for (int b = 0; b < v->n_buckets; b++) {
        double t;
        val_stats_bucket(v, b, &t);
        fprintf(f, "%s%.0f", b ? ", " : "", t);
    }
    fprintf(f, "]}, \"val_source\": {");
    for (int i = 0; i < v->n_sources; i++) {
        double t, x = val_stats_source(v, i, &t);
        fprintf(f, "%s", i ? ", " : "");
        fprint_json_str(f, r->val.source_names[i]);
        fprintf(f, ": {\"mean\": ");
        if (isfinite(x)) fprintf(f, "%.9g", x);
        else fprintf(f, "null");
        fprintf(f, ", \"tokens\": %.0f}", t);
    }
    fprintf(f, "}}\n");
    fflush(f);
    return val;
}

static void write_summary(const Run *r, long long steps_done, double train_loss, double val_loss, double passkey,
                          double elapsed) {
    if (r->rank != 0) return;
    long long tokens = steps_done * r->tokens_per_step;
    char dur[32];
    format_duration(elapsed, dur, sizeof dur);
    printf("done: %lld steps | final train loss %.4f | final val loss ", steps_done, train_loss);
    if (isfinite(val_loss)) printf("%.4f", val_loss); else printf("n/a");
    printf(" | %s | %lld tokens (%.0f tok/s)\n", dur, tokens, elapsed > 0 ? tokens / elapsed : 0.0);
    char path[4096], text[1024];
    snprintf(path, sizeof path, "%s/summary.json", r->c.log.dir);
    FILE *mem = fmemopen(text, sizeof text, "w");
    if (!mem) return;
    fprintf(mem, "{\"steps\": %lld", steps_done);
    fprint_json_num(mem, "final_train_loss", train_loss, "%.9g");
    fprint_json_num(mem, "final_val_loss", val_loss, "%.9g");
    if (r->have_passkey) fprint_json_num(mem, "final_passkey_accuracy", passkey, "%.6g");
    fprint_json_num(mem, "elapsed_s", elapsed, "%.3f");
    fprintf(mem, ", \"tokens\": %lld}\n", tokens);
    long n = ftell(mem);
    fclose(mem);
    ErrBuf e;
    if (write_file_atomic(path, text, (size_t)n, &e) != 0) fprintf(stderr, "train_gpt: warning: %s\n", e.msg);
}

// ---------------------------------------------------------------------------------------------
// Trains cfg (validated) on the device train.device names: "auto" takes the GPU when there is one
// and the GPU backend runs the config (else the CPU, with a note saying why); "gpu" without
// either is an error. Bad input (data, run dir, checkpoint, device) is reported as
// "train_gpt: error: ..." before anything is written. Returns the process exit status.
static int train_run(const Config *cfg, const TrainOptions *opt) {
    Run *r = xcalloc(1, sizeof *r);
    r->c = *cfg;
    Config *c = &r->c;
    if (c->train.threads > 0) omp_set_num_threads(c->train.threads);
    long long start_step;
    setup_or_die(r, opt, &start_step);
    print_plan(r, start_step);

    struct sigaction sa = {0}, old_int, old_term;
    sa.sa_handler = on_stop_signal;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, &old_int);
    sigaction(SIGTERM, &sa, &old_term);
    stop_signal = 0;

    const int steps = c->train.steps;
    const int log_every = c->log.interval > 0 ? c->log.interval : 1;
    double t_start = now_seconds(), t_first = 0.0;  // t_first: the end of this session's first step
    double last_loss = NAN, last_val = NAN, last_passkey = NAN;
    long long step = start_step, last_ckpt = -1, not_applied = 0;
    int status = 0, bad_streak = 0;
    ErrBuf e;

    // The validation loss before the first step, so a run's log shows the whole fall from the
    // initial ln(V). Evaluation leaves no trace in the training state, so resumes stay exact.
    if (start_step == 0 && r->have_val && c->eval.interval > 0) last_val = evaluate_and_log(r, 0, steps);
    if (start_step == 0 && r->have_passkey) last_passkey = passkey_eval_and_log(r, 0, steps);
    // TRAIN_GPT_PROFILE=N (GPU): the phase profile of the model stream over the steps from step
    // N + 1 of this session on, printed at the end. It pauses between steps, so evaluation,
    // diagnostics, samples and checkpoints are not in it (until 2026-11-30 the evaluation's
    // forwards were, in the forward's phases).
    const char *prof_env = getenv("TRAIN_GPT_PROFILE");
    long long prof_skip = prof_env && *prof_env && r->be.kind == DEVICE_GPU ? atoll(prof_env) : -1, prof_steps = 0;
    for (step = start_step + 1; step <= steps; step++) {
        const int profiling = prof_skip >= 0 && step > start_step + prof_skip;
        if (profiling) {
            if (step == start_step + 1 + prof_skip) gpu_model_profile(&r->be.gpu, 1);
            else gpu_model_profile_pause(&r->be.gpu, 0);
            prof_steps++;
        }
        double t0 = now_seconds();
        DataLoaderState data_pos;  // where the step reads (for the log of a step not applied)
        dataloader_get_state(&r->train, &data_pos);
        long long data_file = -1;
        if (r->n_delayed) memcpy(r->delayed_step, r->delayed, (size_t)r->n_delayed * sizeof *r->delayed_step);
        AttnKeyCenters *kc = backend_key_centers(&r->be);
        if (kc) {
            memcpy(r->centers_step, kc->center, (size_t)attn_key_centers_count(kc) * sizeof(float));
            r->centers_ready_step = kc->ready;
        }
        backend_zero_grad(&r->be);
        double loss_sum = 0.0;
        for (int a = 0; a < r->grad_accum; a++) {
            dataloader_next(&r->train, r->inputs, r->targets);
            if (a == 0) data_file = r->train.mixed ? r->train.row_file[0] : r->train.cur_file;  // its first row's shard
            loss_sum += backend_forward_backward(&r->be, r->inputs, r->targets);
        }
        double norm, clip = 0.0, lr = lr_at_step(&c->train, (int)(step - 1));
        if (r->world == 1) {
            norm = backend_grad_norm(&r->be);
        } else {  // the mean gradient of all ranks and its norm, the same on every rank
            loss_sum = dp_sum(r, loss_sum);
            if (backend_dp_sync_grads(&r->be, &norm, &e) != 0) dp_fail(r, &e);
        }
        last_loss = loss_sum / ((double)r->grad_accum * r->world);
        // The reduced loss and the global norm are the same on every rank: so is this decision.
        const int applied = isfinite(last_loss) && isfinite(norm);
        if (applied) {
            clip = grad_clip_factor(&c->train, norm);
            if (r->world == 1) backend_step(&r->be, lr, clip, &c->train);
            else if (backend_dp_step(&r->be, lr, clip, &c->train, &e) != 0) dp_fail(r, &e);
            bad_streak = 0;
        } else {  // no optimizer step; the amaxes and key centres the step's backwards committed are taken back
            if (r->n_delayed) memcpy(r->delayed, r->delayed_step, (size_t)r->n_delayed * sizeof *r->delayed);
            if (kc) {
                memcpy(kc->center, r->centers_step, (size_t)attn_key_centers_count(kc) * sizeof(float));
                kc->ready = r->centers_ready_step;
            }
            bad_streak++;
            not_applied++;
        }
        double t1 = now_seconds();  // the GPU calls return after their stream is done
        double tok_s = r->tokens_per_step / (t1 - t0 > 0 ? t1 - t0 : 1e-9);
        double mfu = mfu_of(r, tok_s);  // < 0: not applicable (CPU, unknown peak)
        double session = t1 - t_start, elapsed = r->elapsed_before + session;
        // Data position in the checkpoint's terms (windows, or the mixed order's micro-batches, of all
        // ranks together).
        const long long data_window = data_pos.window_pos * r->world;
        const char *data_name = data_file >= 0 ? r->train.files[data_file] : "?";

        if (r->metrics) {  // rank 0
            fprintf(r->metrics, "{\"step\": %lld", step);
            fprint_json_num(r->metrics, "loss", last_loss, "%.9g");
            fprint_json_num(r->metrics, "lr", lr, "%.9g");
            fprint_json_num(r->metrics, "grad_norm", norm, "%.9g");
            fprint_json_num(r->metrics, "tokens_per_s", tok_s, "%.1f");
            fprint_json_num(r->metrics, "elapsed_s", elapsed, "%.3f");
            if (mfu >= 0) fprint_json_num(r->metrics, "mfu", mfu, "%.4f");
            if (!applied) {
                fprintf(r->metrics, ", \"skipped\": true, \"data\": {\"epoch\": %lld, \"shard_pos\": %lld, "
                                    "\"window_pos\": %lld, \"file\": ", data_pos.epoch, data_pos.shard_pos, data_window);
                cJSON *name = cJSON_CreateString(data_name);
                char *quoted = cJSON_PrintUnformatted(name);
                fprintf(r->metrics, "%s}", quoted ? quoted : "null");
                cJSON_free(quoted);
                cJSON_Delete(name);
            }
            fprintf(r->metrics, "}\n");
            fflush(r->metrics);
        }
        if (!applied) {
            char where[1400];  // the mixed order's position is its micro-batch; the shards order's a shard's window
            if (r->train.mixed)
                snprintf(where, sizeof where, "epoch %lld, micro-batch %lld, first row from %s", data_pos.epoch,
                         data_window, data_name);
            else
                snprintf(where, sizeof where, "epoch %lld, shard position %lld = %s, window %lld", data_pos.epoch,
                         data_pos.shard_pos, data_name, data_window);
            printf("warning: step %lld not applied: the loss is %g and the gradient norm %g (data: %s); %d in a row, "
                   "the run stops at train.max_bad_steps = %d\n",
                   step, last_loss, norm, where, bad_streak, c->train.max_bad_steps);
        }

        if (step % log_every == 0 || step == start_step + 1 || step == steps) {
            // The first step of a session carries one-time costs (allocation, warm-up, the initial
            // evaluation): the ETA is measured from the steps after it.
            char eta[32] = "pending";
            if (step > start_step + 1 && t_first > 0)
                format_duration((t1 - t_first) / (double)(step - start_step - 1) * (double)(steps - step), eta, sizeof eta);
            printf("step %lld/%d | loss %.4f | lr %.2e | norm %.2f | %.0f tok/s | ETA %s", step, steps, last_loss, lr,
                   norm, tok_s, eta);
            if (r->be.kind == DEVICE_GPU) {
                if (mfu >= 0) printf(" | MFU %.1f%%", 100.0 * mfu);
                else printf(" | MFU n/a (unknown GPU peak)");
            }
            printf("\n");
            fflush(stdout);
        }
        if (step == start_step + 1) t_first = now_seconds();
        if (profiling) gpu_model_profile_pause(&r->be.gpu, 1);  // the step's own work ends here
        if (bad_streak >= c->train.max_bad_steps) {
            fflush(stdout);
            char newest[4096];
            ErrBuf e2;
            if (r->rank == 0) {
                fprintf(stderr, "train_gpt: error: %d steps in a row (%lld..%lld) had a non-finite loss or gradient "
                                "norm and were not applied (train.max_bad_steps = %d): the run diverged; no checkpoint "
                                "written. ", bad_streak, step - bad_streak + 1, step, c->train.max_bad_steps);
                if (checkpoint_find_latest(r->ckpt_dir, newest, sizeof newest, &e2) == 0)
                    fprintf(stderr, "Its newest checkpoint is %s: resume from it with a lower train.lr (--resume "
                                    "--allow-config-change --set train.lr=...)\n", newest);
                else
                    fprintf(stderr, "It has no checkpoint: start it again with a lower train.lr\n");
            }
            status = 1;
            break;
        }
        // Diagnostics probe the model between steps and leave no trace in the training state;
        // under data parallelism rank 0 runs them while the others wait at the next collective.
        if (r->rank == 0)
            diagnostics_maybe_run(&r->diag, r->be.kind == DEVICE_CPU ? &r->be.cpu : NULL,
                                  r->be.kind == DEVICE_GPU ? &r->be.gpu : NULL, step, r->metrics, stdout);
        if (r->have_val && ((c->eval.interval > 0 && step % c->eval.interval == 0) || step == steps)) {
            last_val = evaluate_and_log(r, step, steps);
        }
        if (r->have_passkey && (step % c->eval.passkey_interval == 0 || step == steps))
            last_passkey = passkey_eval_and_log(r, step, steps);
        if (r->rank == 0 && c->eval.sample_interval > 0 && step % c->eval.sample_interval == 0) print_sample(r, step);

        int stopping = dp_any(r, stop_signal || (opt->stop_after > 0 && step >= opt->stop_after));
        // A stop (signal, --stop-after) always checkpoints: that run is meant to be resumed. A
        // periodic checkpoint waits for a step that was applied.
        int periodic = c->checkpoint.interval > 0 && step % c->checkpoint.interval == 0;
        if (periodic && !applied && !stopping && step != steps) {
            printf("note: step %lld: no checkpoint: the step was not applied\n", step);
            periodic = 0;
        }
        if (periodic || (step == steps && c->checkpoint.at_end) || stopping) {
            if (save_checkpoint(r, step, r->elapsed_before + (now_seconds() - t_start), &e) != 0) {
                fprintf(stderr, "train_gpt: error: %s\n", e.msg);
                status = 1;
                break;
            }
            last_ckpt = step;
        }
        if (stopping && step < steps) {
            if (stop_signal) printf("stopped by signal %d after step %lld: ", (int)stop_signal, step);
            else if (opt->stop_after > 0 && step >= opt->stop_after) printf("stopped after step %lld (--stop-after): ", step);
            else printf("stopped after step %lld (a stop signal reached another rank): ", step);
            printf("checkpoint written; continue with --resume\n");
            break;
        }
    }
    if (step > steps) step = steps;
    if (not_applied > 0 && r->rank == 0)
        printf("note: %lld step%s of this session %s not applied (a non-finite loss or gradient norm; \"skipped\" in %s)\n",
               not_applied, not_applied == 1 ? "" : "s", not_applied == 1 ? "was" : "were", r->metrics_path);
    if (status == 0 && start_step >= steps) printf("the run is already at step %lld of %d: nothing to do\n", start_step, steps);
    if (status == 0 && step == steps && (last_ckpt == steps || !c->checkpoint.at_end))
        write_summary(r, step, last_loss, last_val, last_passkey, r->elapsed_before + (now_seconds() - t_start));

    if (prof_steps > 0 && r->rank == 0) gpu_model_profile_report(&r->be.gpu, stdout, prof_steps);
    sigaction(SIGINT, &old_int, NULL);
    sigaction(SIGTERM, &old_term, NULL);
    if (r->metrics) fclose(r->metrics);
    if (r->world > 1) comm_destroy(&r->comm);
    if (r->tok) tokenizer_free(r->tok);
    free(r->config_json);
    free(r->inputs);
    free(r->targets);
    free(r->delayed_save);
    free(r->delayed_step);
    free(r->centers_step);
    free(r->losses);
    val_stats_free(&r->val_stats);
    if (r->have_passkey) passkey_set_free(&r->passkey_set);
    if (r->host_state_owned) {
        free(r->host_params);
        free(r->host_m);
        free(r->host_v);
    }
    diagnostics_free(&r->diag);
    backend_free(&r->be);
    dataloader_close(&r->train);
    if (r->have_val) dataloader_close(&r->val);
    free(r);
    return status;
}

// ---------------------------------------------------------------------------------------------
// The command line.

#define TRAIN_GPT_VERSION "0.1.0"
#define MAX_OVERRIDES 256

static void usage(FILE *f) {
    fprintf(f,
            "usage: train_gpt --config FILE [--set section.key=value]... [--device cpu|gpu|auto]\n"
            "                 [--resume [CHECKPOINT|DIR|latest]] [--allow-config-change] [--stop-after N]\n"
            "       train_gpt --config FILE --dry-run [--world-size N] [--zero1] [--micro-batch N]\n"
            "       train_gpt COMMAND [options]    (COMMAND --help for its options)\n"
            "\n"
            "Training:\n"
            "  --config FILE        JSON run configuration, e.g. configs/tiny.json\n"
            "  --set KEY=VALUE      override one config key, e.g. --set train.steps=100 (repeatable)\n"
            "  --device D           cpu, gpu or auto (default: the config's train.device)\n"
            "  --resume [C]         continue the run in log.dir from its newest checkpoint that loads (from\n"
            "                       step 0 if it has none), or from C: a checkpoint file, a run or checkpoint\n"
            "                       directory, or a 'latest' file\n"
            "  --allow-config-change  let --resume change keys that change the run's trajectory (train.lr,\n"
            "                       precision.*, data.seed, ...; docs/config.md); recorded in the run directory\n"
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
            "  passkey     passkey retrieval: generate sequences, evaluate a checkpoint\n"
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
    // A write past `ulimit -f` then fails with EFBIG and its clear message (and the temporary file
    // is removed) instead of killing the process silently, leaving the temporary file behind.
    signal(SIGXFSZ, SIG_IGN);
    if (argc >= 2 && argv[1][0] != '-') {
        const char *cmd = argv[1];
        if (!strcmp(cmd, "sample")) return cmd_sample(argc - 1, argv + 1);
        if (!strcmp(cmd, "passkey")) return cmd_passkey(argc - 1, argv + 1);
        if (!strcmp(cmd, "attn-check")) return cmd_attn_check(argc - 1, argv + 1);
        if (!strcmp(cmd, "encode")) return cmd_encode(argc - 1, argv + 1);
        if (!strcmp(cmd, "decode")) return cmd_decode(argc - 1, argv + 1);
        if (!strcmp(cmd, "tokenize")) return cmd_tokenize(argc - 1, argv + 1);
        return usage_error("unknown command '%s' (commands: sample, passkey, attn-check, encode, decode, tokenize)", cmd);
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
        } else if (!strcmp(a, "--allow-config-change")) {
            topt.allow_config_change = 1;
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
    if (topt.allow_config_change && !topt.resume)
        return usage_error("%s applies to --resume only", "--allow-config-change");
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
