// sample.h: text generation from a model on either backend (backend.h; temperature, top-k,
// seeded RNG) shared by the `sample` command and the trainer's periodic samples.
#ifndef SAMPLE_H
#define SAMPLE_H

#include <stdint.h>  // int32_t tokens

#include "core/backend.h"         // Backend
#include "tokenizer/tokenizer.h"  // Tokenizer

#ifdef __cplusplus
extern "C" {
#endif

// The sampling generator (splitmix64): a 64-bit state that checkpoints store as is.
unsigned long long sample_rng_seed(unsigned long long seed);
// Uniform in [0, 1), 53 random bits; advances *state.
double sample_rng_uniform(unsigned long long *state);

// Picks one id in [0, vocab) from logits (only the first vocab entries are read).
// temperature <= 0: greedy (argmax). top_k > 0: only the k largest logits take part (ties at
// the k-th value included). scratch: (vocab) floats of workspace.
int sample_pick(const float *logits, int vocab, double temperature, int top_k, unsigned long long *rng,
                float *scratch);

// Appends n_new sampled ids to the n_prompt ids of tokens (capacity n_prompt + n_new); the
// model sees at most its last b->T tokens. Returns n_prompt + n_new.
int sample_generate(Backend *b, int32_t *tokens, int n_prompt, int n_new, double temperature, int top_k,
                    unsigned long long *rng);

// The first token of an unprompted sample: <|endoftext|> when the vocabulary has it, else 0.
int32_t sample_default_start(int vocab_size);

// The checkpoint file an argument names: a file as is; a run or checkpoint directory, or its
// `latest` pointer, gives its newest checkpoint (core/checkpoint.h, checkpoint_resolve). 0, or -1
// with e filled. (Also the passkey command's.)
int sample_resolve_checkpoint(const char *arg, char *out, size_t out_len, ErrBuf *e);

// `train_gpt sample --checkpoint C [--prompt TEXT] [--tokens N] [--temperature T] [--top-k K]
// [--seed S] [--device cpu|gpu|auto]`: prints generated text (auto: the GPU when there is one
// and the GPU backend runs the checkpoint's config, as for training). argv[0] is "sample". Returns the process exit status.
int cmd_sample(int argc, char **argv);

#ifdef __cplusplus
}
#endif
#endif  // SAMPLE_H
