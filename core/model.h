// model.h: the GPT definition shared by both backends: shapes, the parameter table, the
// parameter count and the per-GPU memory plan.
//
// Architecture (pre-norm, no biases):
//   x = wte[tokens]                                               // (B, T, C)
//   per layer l:  h = RMSNorm(x) * attn_norm                      // (B, T, C)
//                 qkv = h @ qkv_w^T                               // (B, T, 3C): [q | k | v]
//                 q, k = QK-RMSNorm per head (optional, gains q_norm, k_norm of size hd)
//                 q, k = RoPE(q, k) (theta from config) or unchanged (NoPE)
//                 a = causal_attention(q, k, v)                   // (B, T, C), heads (H, hd)
//                 x = x + a @ attn_proj_w^T
//                 h = RMSNorm(x) * mlp_norm
//                 u = h @ mlp_fc_w^T                              // (B, T, 2F): [gate | up]
//                 x = x + (silu(gate) * up) @ mlp_proj_w^T        // (B, T, C)
//   logits = RMSNorm(x) * final_norm @ lm_head^T                  // (B, T, Vp); wte if tied
//   loss = mean cross-entropy over the real vocabulary columns (< vocab_size)
#ifndef MODEL_H
#define MODEL_H

#include <stddef.h>  // size_t
#include <stdio.h>   // FILE for the printers

#include "core/config.h"  // ModelConfig

#ifdef __cplusplus
extern "C" {
#endif

typedef enum {
    INIT_NORMAL = 0,     // N(0, init_std)
    INIT_NORMAL_RESID,   // N(0, init_std / sqrt(2 * n_layer)): outputs added to the residual
    INIT_ONES,           // RMSNorm gains
} InitKind;

// What a tensor is, so code never depends on its index in the table.
typedef enum {
    P_WTE = 0,      // (Vp, C) token embedding
    P_ATTN_NORM,    // (C)
    P_QKV,          // (3C, C)
    P_Q_NORM,       // (hd)      only with qk_norm
    P_K_NORM,       // (hd)      only with qk_norm
    P_ATTN_PROJ,    // (C, C)
    P_MLP_NORM,     // (C)
    P_MLP_FC,       // (2F, C)   rows [0, F) gate, [F, 2F) up
    P_MLP_PROJ,     // (C, F)
    P_FINAL_NORM,   // (C)
    P_LM_HEAD,      // (Vp, C)   absent when tied (wte is used)
    P_N_KINDS
} ParamKind;

typedef struct {
    char name[64];       // e.g. "layers.3.attn.qkv.weight"
    ParamKind kind;
    int layer;           // -1 for tensors outside the blocks
    int ndim;            // 1 or 2
    long rows, cols;     // shape (rows, cols); 1-D tensors have cols == 1
    size_t numel;
    size_t offset;       // element offset of the tensor in the flat parameter buffer
    InitKind init;
    int weight_decay;    // 1 for every matrix (ndim == 2, embeddings included), 0 for gains
} ParamDesc;

typedef struct {
    int n;                         // number of tensors
    ParamDesc *p;                  // (n) descriptors in a fixed order
    size_t total;                  // total elements
    int index[P_N_KINDS][1024];    // index[kind][layer or 0] into p, -1 if absent (n_layer <= 1024)
} ParamTable;

// Builds the table for a (validated) model config. Caller frees with param_table_free.
void param_table_build(ParamTable *t, const ModelConfig *m);
void param_table_free(ParamTable *t);
// Descriptor of a tensor by kind and layer (layer ignored for non-block tensors); NULL if absent.
const ParamDesc *param_find(const ParamTable *t, ParamKind kind, int layer);

// Initialises a flat FP32 parameter buffer from the table with a seeded generator
// (deterministic for a given seed, independent of the backend).
void params_init(const ParamTable *t, const ModelConfig *m, unsigned long long seed, float *params);

// Per-GPU memory plan in bytes (GPU backend: BF16 weights, FP32 master weights and AdamW state
// sharded when zero1, FP32 gradients, activations for one micro-batch, workspace).
typedef struct {
    size_t weights, master, optimizer, grads, activations, workspace, total;
} MemoryPlan;
void memory_plan(const Config *c, int world_size, int zero1, int micro_batch, MemoryPlan *out);
void memory_plan_print(FILE *f, const MemoryPlan *mp);

// Which BF16 activations of a block the GPU model keeps from the forward for the backward; the
// others live in the forward's scratch from their producer to their last reader (model.c says
// why, buffer by buffer; memory_plan and model_gpu.cu's carve both follow these):
//   h1, h2, sw (the inputs of the qkv, MLP-in, MLP-out linears) of block `layer`;
int gpu_keeps_linear_inputs(const Config *c, int layer);
//   qkv (every block alike);
int gpu_keeps_qkv(const Config *c);
//   the attention output o of block `layer`.
int gpu_keeps_attn_out(const Config *c, int layer);
// Whether the attention backward in precision p reads the BF16 q, k, v (codes_kept: it gets the
// forward's kept Q, K, V codes), and whether it reads the BF16 O.
int attn_backward_reads_qkv(AttnPrecision p, int codes_kept);
int attn_backward_reads_o(AttnPrecision p);

// Matmul FLOPs per token of a training step (6 * matmul params + attention), for MFU.
double model_flops_per_token(const ModelConfig *m);

// Prints the shapes, counts and memory plan (`train_gpt --config X --dry-run`).
void model_print_summary(FILE *f, const Config *c, const ParamTable *t, int world_size, int zero1);

#ifdef __cplusplus
}
#endif
#endif  // MODEL_H
