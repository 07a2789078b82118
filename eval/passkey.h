// passkey.h: passkey retrieval, RULER-style: a number hidden in real text, asked for at the end.
//
// A passkey sequence of L tokens:
//
//   filler[0, a) | KEY | filler[a, a + distance) | QUESTION | ANSWER
//   KEY      = "\nThe pass key is" DIGITS ". Remember it.\n"
//   QUESTION = "\nWhat is the pass key? The pass key is"
//   ANSWER   = DIGITS
//
// DIGITS is a number of 5 to 7 digits (the first not 0) written one digit per token (" 7", one
// GPT-2 token each), so the answer is the last n_digits tokens of the sequence: fixed final
// positions. distance = the filler tokens between the key sentence's end and the question's start;
// filler is real text (token shards), cut where the layout needs it. The pieces are encoded one by
// one with the GPT-2 tokenizer and their ids concatenated, so training mix and evaluation see the
// same ids whatever the filler around them.
//
// Exact match is decided by greedy decoding of the answer, computed from one teacher-forced
// forward: greedy decoding reproduces the answer iff at every answer position the argmax of the
// teacher-forced logits (over the real vocabulary, the first of equal maxima) is the answer's
// token (by induction: while the earlier digits matched, greedy's context is the teacher-forced
// one). The teacher-forced probability of the answer is exp(-sum of the answer tokens' losses).
#ifndef PASSKEY_H
#define PASSKEY_H

#include <stdint.h>  // uint32_t, int32_t
#include <stdio.h>   // FILE

#include "core/common.h"          // ErrBuf
#include "tokenizer/tokenizer.h"  // Tokenizer

#ifdef __cplusplus
extern "C" {
#endif

#define PASSKEY_MIN_DIGITS 5
#define PASSKEY_MAX_DIGITS 7
#define PASSKEY_MAX_DISTANCES 16
#define PASSKEY_MAX_PIECE 32  // tokens of one template piece at most

// The token ids of the template's pieces.
typedef struct PasskeyTemplate {
    uint32_t digit[10];                            // " 0" .. " 9"
    uint32_t key_prefix[PASSKEY_MAX_PIECE];        // "\nThe pass key is"
    uint32_t key_suffix[PASSKEY_MAX_PIECE];        // ". Remember it.\n"
    uint32_t question[PASSKEY_MAX_PIECE];          // "\nWhat is the pass key? The pass key is"
    int n_key_prefix, n_key_suffix, n_question;
    uint32_t max_id;                               // the largest id of any piece
} PasskeyTemplate;

// Where things are in one built sequence.
typedef struct {
    int length;        // L
    int distance;      // filler tokens between the key sentence and the question
    int n_digits;      // 5..7
    char digits[PASSKEY_MAX_DIGITS + 1];
    int key_pos;       // first token of the key sentence
    int question_pos;  // first token of the question
    int answer_pos;    // first answer token: L - n_digits
} PasskeyItem;

// Encodes the pieces with tok. -1 with e when a digit is not one token (another tokenizer).
int passkey_template_init(PasskeyTemplate *t, Tokenizer *tok, ErrBuf *e);

// Template tokens of a sequence with n_digits digits (everything but the filler).
int passkey_overhead(const PasskeyTemplate *t, int n_digits);
// The largest distance a sequence of L tokens holds (the key at position 0); < 0: none fits.
int passkey_max_distance(const PasskeyTemplate *t, int L, int n_digits);

// Builds the sequence out (L) from filler (at least L tokens; only its first L - overhead are
// used, in order) with the key at the given distance (0 <= distance <= passkey_max_distance) and
// the number digits ("0".."9", 5..7 of them). Fills item. FATAL on arguments out of range.
void passkey_build(const PasskeyTemplate *t, const uint32_t *filler, int L, int distance, const char *digits,
                   uint32_t *out, PasskeyItem *item);

// A random number of min..max digits, the first not 0, into digits (NUL-terminated), from the
// generator state *rng (core/rng.h's splitmix64).
void passkey_random_digits(uint64_t *rng, int min_digits, int max_digits, char *digits);

// Distances: min_distance, 2 x, 4 x ... while they fit a sequence of L tokens with 7 digits, then
// the largest that fits (the key at the start), unless it is already the last. Returns how many
// (<= cap); 0 when not even min_distance fits.
int passkey_distances(const PasskeyTemplate *t, int L, int min_distance, int *out, int cap);

// ---------------------------------------------------------------------------------------------
// An evaluation set: samples sequences of L tokens per distance, filler from the shards of
// pattern (rows of L tokens in a seeded order, one row per sequence), numbers from the seed.
typedef struct {
    int n, L;              // sequences, tokens each
    uint32_t *tokens;      // (n, L)
    PasskeyItem *items;    // (n)
    int n_distances;
    int distance[PASSKEY_MAX_DISTANCES];
} PasskeySet;

int passkey_set_make(PasskeySet *s, const PasskeyTemplate *t, const char *pattern, int vocab_size, int L,
                     const int *distances, int n_distances, int samples, unsigned long long seed, ErrBuf *e);
void passkey_set_free(PasskeySet *s);

// One forward of B sequences of T tokens (inputs, targets (B, T); targets < 0 ignored): the
// per-token losses (B*T) and the logits (n_rows, Vp) of the listed rows (indices into B*T).
// Returns the mean loss. backend_eval_detail is one; tests plug in others.
typedef float (*PasskeyForwardFn)(void *ctx, const int32_t *inputs, const int32_t *targets, float *losses,
                                  int n_rows, const int *rows, float *row_logits);

// The PasskeyForwardFn of a model backend (ctx: the Backend): backend_eval_detail.
float passkey_backend_forward(void *backend, const int32_t *inputs, const int32_t *targets, float *losses, int n_rows,
                              const int *rows, float *row_logits);

// Per distance: exact-match accuracy (greedy decode, see above) with its binomial standard error,
// the fraction of answer digits right, the teacher-forced answer probability (mean over sequences,
// with its standard error), the mean log-probability, and chance (the mean of 10^-n_digits: the
// probability of a model that knows only that digits come).
typedef struct {
    int n_distances;
    int distance[PASSKEY_MAX_DISTANCES];
    int n[PASSKEY_MAX_DISTANCES];
    double accuracy[PASSKEY_MAX_DISTANCES], accuracy_se[PASSKEY_MAX_DISTANCES];
    double digit_accuracy[PASSKEY_MAX_DISTANCES];
    double p_answer[PASSKEY_MAX_DISTANCES], p_answer_se[PASSKEY_MAX_DISTANCES];
    double logp_answer[PASSKEY_MAX_DISTANCES];
    double chance[PASSKEY_MAX_DISTANCES];
} PasskeyReport;

// Runs the set through fwd, B sequences at a time, T = s->L; V, Vp: the real and padded vocabulary.
void passkey_evaluate(const PasskeySet *s, PasskeyForwardFn fwd, void *ctx, int B, int V, int Vp,
                      PasskeyReport *out);

// The score of one sequence from its forward: losses (L) of its positions, logits (n_digits, Vp)
// of the rows answer_pos - 1 .. L - 2. Sets *correct (all digits), *digits_right, *logp.
void passkey_score(const PasskeyItem *it, const uint32_t *tokens, const float *losses, const float *logits, int V,
                   int Vp, int *correct, int *digits_right, double *logp);

// The report as a JSON object {"distance": [...], "n": [...], "accuracy": [...], ...} (no newline).
void passkey_report_json(FILE *f, const PasskeyReport *r);
// A table, one line per distance.
void passkey_report_print(FILE *f, const PasskeyReport *r, const char *indent);

// `train_gpt passkey generate|eval ...` (argv[0] is "passkey"). Returns the exit status.
int cmd_passkey(int argc, char **argv);

#ifdef __cplusplus
}
#endif
#endif  // PASSKEY_H
