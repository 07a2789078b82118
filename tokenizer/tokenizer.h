// tokenizer.h: GPT-2's byte-level BPE (encode for data preparation, decode for samples) and the
// `encode`, `decode` and `tokenize` commands of train_gpt.
//
// The vocabulary comes from OpenAI's original encoder.json (50,257 entries) and vocab.bpe
// (50,000 merges); see data/gpt2/README.md for where they come from.
#ifndef TOKENIZER_H
#define TOKENIZER_H

#include <stddef.h>  // size_t
#include <stdint.h>  // uint32_t

#include "core/common.h"  // ErrBuf

#ifdef __cplusplus
extern "C" {
#endif

#define GPT2_EOT 50256  // <|endoftext|>

typedef struct Tokenizer Tokenizer;  // opaque

// Loads encoder.json + vocab.bpe from dir (NULL: the default location, see tokenizer.c).
// Returns NULL with a message naming the file on failure.
Tokenizer *tokenizer_load(const char *dir, ErrBuf *e);
void tokenizer_free(Tokenizer *t);

// Encodes len bytes of text (any bytes; invalid UTF-8 is handled as GPT-2 does) into ids.
// Returns the number of ids; *ids is a heap array the caller frees.
// Threads may encode with one shared Tokenizer at once (each thread has its own word cache).
size_t tokenizer_encode(Tokenizer *t, const char *text, size_t len, uint32_t **ids);

// Bytes of one token (not NUL-terminated); *len receives the length. NULL for an id out of range.
const char *tokenizer_token_bytes(const Tokenizer *t, uint32_t id, size_t *len);

// Decodes ids into a heap buffer (NUL-terminated); *len receives the byte length.
// Returns NULL (and *len = 0) if any id is out of range (check with tokenizer_token_bytes).
char *tokenizer_decode(const Tokenizer *t, const uint32_t *ids, size_t n, size_t *len);

// Vocabulary facts (50257 tokens and 50000 merges for GPT-2), for tests and tools.
uint32_t tokenizer_vocab_size(const Tokenizer *t);
uint32_t tokenizer_merge_count(const Tokenizer *t);
// Merge number rank of vocab.bpe: the ids it joins and the id it produces. -1 if out of range.
int tokenizer_merge(const Tokenizer *t, uint32_t rank, uint32_t *left, uint32_t *right,
                    uint32_t *merged);

// Commands (argv[0] is the command name). Return the process exit status.
int cmd_encode(int argc, char **argv);
int cmd_decode(int argc, char **argv);
int cmd_tokenize(int argc, char **argv);

#ifdef __cplusplus
}
#endif
#endif  // TOKENIZER_H
