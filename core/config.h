// config.h: the typed run configuration, read from JSON (config.c) and validated strictly.
//
// The JSON file has these sections, every key optional unless marked (defaults in config.c):
//   description   string, free text
//   model         vocab_size (50257; padded up to a multiple of 128 for the embedding and head),
//                 d_model*, n_layer*, n_head*, ffn_hidden* (SwiGLU hidden width), seq_len*,
//                 position ("rope" | "none"), rope_theta (10000), qk_norm (false),
//                 tied_embeddings (false), norm_eps (1e-5), init_std (0.02)
//   data          train (glob, required for training), val (glob), shuffle (true), seed (1337),
//                 order ("mixed" | "shards"), passkey_fraction (0)
//   train         device ("auto" | "cpu" | "gpu"), micro_batch (sequences per rank per
//                 micro-step), batch_tokens (global tokens per optimizer step; 0 = one
//                 micro-batch per rank), steps, lr, min_lr_ratio, warmup_steps, schedule
//                 ("cosine" | "linear" | "wsd" | "constant"), wsd_decay_fraction, weight_decay,
//                 beta1, beta2, eps, grad_clip (0 = off), seed, recompute (false), threads (0=all)
//   precision     attention ("fp32" | "bf16" | "fp8_naive" | "fp8_hybrid" | "fp8_dm" |
//                 "fp8_dm_approx" | "fp8_hybrid_dm"), attention_grad_format ("e4m3" | "e5m2"),
//                 attention_scaling ("block" | "delayed"), attention_p_scale (256, a power of two),
//                 attention_amax_history (16), attention_block_q (128), attention_block_k (128),
//                 attention_keep_codes (true), attention_center_keys ("off" | "mean" | "delayed"),
//                 attention_rowsum_correction (false),
//                 linear ("bf16" | "fp8_tensor" | "fp8_block"), linear_grad_format,
//                 linear_keep_lm_head_bf16 (true), linear_bf16_first_layers (0),
//                 linear_bf16_last_layers (0), linear_wgrad_blocks ("none" | "activation" |
//                 "gradient": fp8_block's wgrad operand in 128x128 blocks), linear_scaling
//                 ("current" | "delayed": fp8_tensor's scales from an amax history),
//                 linear_amax_history (16), linear_fast_accum ("none" | "forward" | "all":
//                 fp8_tensor GEMMs without FP32 promotion, GPU only), fuse_fp8_producers,
//                 fuse_attention_rope, fuse_qkv_epilogue (true: GPU fusions, off to measure them)
//   eval          interval (steps; 0 = only at the end), batches, sample_interval (0 = off),
//                 sample_tokens, passkey_interval (0 = off), passkey_samples (32),
//                 passkey_min_distance (512)
//   checkpoint    dir ("" = <log.dir>/checkpoints), interval (steps; 0 = only at the end),
//                 keep (last N kept), at_end (true; false = none after the last step, e.g. for
//                 throughput runs: a 5.29B model's checkpoint is ~63 GB)
//   log           dir (the run directory, "runs/<config name>"), interval (progress line every
//                 N steps), metrics_file ("metrics.jsonl", inside log.dir)
//   diagnostics   interval (0 = off), bias_probe_batches (8; 0 = off), reference ("bf16" | "fp32")
// and in train: zero1 (false), comm_timeout_s (60), overlap_comm (true), max_bad_steps (5)
#ifndef CONFIG_H
#define CONFIG_H

#include "core/common.h"     // ErrBuf
#include "core/precision.h"  // the precision section: PrecisionConfig and its enums

#ifdef __cplusplus
extern "C" {
#endif

typedef enum { DEVICE_AUTO = 0, DEVICE_CPU, DEVICE_GPU } DeviceKind;
typedef enum { POS_ROPE = 0, POS_NONE } PositionKind;
typedef enum { SCHED_COSINE = 0, SCHED_LINEAR, SCHED_WSD, SCHED_CONSTANT } ScheduleKind;
typedef enum { DATA_ORDER_MIXED = 0, DATA_ORDER_SHARDS } DataOrder;  // dataloader.h

typedef struct {
    int vocab_size;         // real vocabulary (GPT-2: 50257)
    int padded_vocab_size;  // derived: vocab_size rounded up to a multiple of 128
    int d_model, n_layer, n_head, head_dim /* derived: d_model / n_head */, ffn_hidden;
    int seq_len;
    PositionKind position;
    double rope_theta;
    int qk_norm, tied_embeddings;
    double norm_eps, init_std;
} ModelConfig;

typedef struct {
    char train[1024], val[1024];  // glob patterns of llm.c token shards
    int shuffle;
    unsigned long long seed;
    DataOrder order;          // rows of all shards in one permutation, or shard by shard
    double passkey_fraction;  // share of training rows made passkey sequences (mixed order)
} DataConfig;

typedef struct {
    DeviceKind device;
    int micro_batch;
    long long batch_tokens;  // 0 = micro_batch * seq_len * world_size
    int steps;
    double lr, min_lr_ratio;
    int warmup_steps;
    ScheduleKind schedule;
    double wsd_decay_fraction;
    double weight_decay, beta1, beta2, eps, grad_clip;
    unsigned long long seed;
    int recompute;
    int threads;
    int zero1;               // shard FP32 masters and AdamW state across data-parallel ranks
    double comm_timeout_s;   // a collective or rendezvous waiting longer than this is an error
    int overlap_comm;        // GPU data parallelism: reduce gradients during the last backward
    int max_bad_steps;       // consecutive non-finite steps (not applied) after which the run stops
} TrainConfig;

typedef struct {
    int interval, batches, sample_interval, sample_tokens;
    int passkey_interval;      // steps between passkey evaluations (and at the end); 0 = off
    int passkey_samples;       // sequences per distance
    int passkey_min_distance;  // the first distance; then doubling, then the largest that fits
} EvalConfig;

typedef struct {
    char dir[1024];
    int interval, keep;
    int at_end;  // write one after the last step (false: throughput runs that need none)
} CheckpointConfig;

// FP8 attention diagnostics on a probe micro-batch (docs/fp8-attention.md; issue "FP8 attention
// on the GPU"): per-layer row-sum residuals of dS, FP8 saturation counts, the error of the
// attention input gradients against a recomputation in `reference` precision, and the
// gradient-bias ratio over bias_probe_batches probes.
typedef struct {
    int interval;            // steps between diagnostics; 0 = off
    int bias_probe_batches;  // N probe batches of the gradient-bias ratio; 0 = off
    AttnPrecision reference; // precision of the recomputation the FP8 gradients are compared with
} DiagnosticsConfig;

typedef struct {
    char dir[1024];
    int interval;
    char metrics_file[256];
} LogConfig;

typedef struct {
    char source_path[1024];  // the file it was read from ("" for built-in defaults)
    char description[1024];
    ModelConfig model;
    DataConfig data;
    TrainConfig train;
    PrecisionConfig precision;
    EvalConfig eval;
    CheckpointConfig checkpoint;
    LogConfig log;
    DiagnosticsConfig diagnostics;
} Config;

// Fills every field with its default (model sizes 0: they must come from the file).
void config_defaults(Config *c);

// Reads and validates a JSON config file, then applies overrides ("section.key=value", parsed
// as JSON when it parses, else as a string) in order, then validates the result. Returns 0, or
// -1 with a message that names the file, the full key path (e.g. "model.n_head") and what was
// expected (for an unknown key: the keys allowed there).
int config_load(const char *path, const char *const *overrides, int n_overrides, Config *out, ErrBuf *e);

// The same, from a JSON text in memory (name is used in messages in place of a file name).
int config_parse(const char *json_text, const char *name, const char *const *overrides,
                 int n_overrides, Config *out, ErrBuf *e);

// Cross-field validation (also run by config_load/parse).
int config_validate(const Config *c, ErrBuf *e);

// Fills the derived fields (model.padded_vocab_size, model.head_dim) and the default
// directories (log.dir "" -> runs/<source_path's name without .json> or runs/default;
// checkpoint.dir "" -> <log.dir>/checkpoints). Done by config_load/parse; call it after changing
// a Config in code, before config_validate.
void config_derive(Config *c);

// The resolved config (every key, defaults filled in) as a JSON text; caller frees.
char *config_to_json(const Config *c);

// Writes the resolved config to dir/config.json atomically.
int config_write_resolved(const Config *c, const char *dir, ErrBuf *e);

// Names of enum values as they appear in JSON ("fp8_dm", "e5m2", ...).
const char *attn_precision_name(AttnPrecision p);
int attn_precision_from_name(const char *s, AttnPrecision *out);  // 0 ok, -1 unknown
const char *grad_format_name(GradFormat f);
const char *scaling_name(ScalingKind s);
const char *schedule_name(ScheduleKind s);
const char *linear_precision_name(LinearPrecision p);
const char *device_name(DeviceKind d);

#ifdef __cplusplus
}
#endif
#endif  // CONFIG_H
