// passkey.c: passkey sequences (the template, the builder, an evaluation set from token shards)
// and their evaluation: exact match by greedy decoding and the teacher-forced answer probability,
// per distance. See passkey.h for the layout. The command is in passkey_cmd.c.
#include "eval/passkey.h"

#include <math.h>    // exp, sqrt, isfinite
#include <string.h>  // memcpy, strlen, memset

#include "core/backend.h"  // backend_eval_detail: the forward of a real model
#include "core/rng.h"      // splitmix64 for the numbers
#include "dataloader.h"    // rows of real text for the filler

static const char KEY_PREFIX[] = "\nThe pass key is";
static const char KEY_SUFFIX[] = ". Remember it.\n";
static const char QUESTION[] = "\nWhat is the pass key? The pass key is";

// Encodes text into out (at most PASSKEY_MAX_PIECE ids); returns the count or -1 with e.
static int encode_piece(Tokenizer *tok, const char *text, uint32_t *out, uint32_t *max_id, ErrBuf *e) {
    uint32_t *ids = NULL;
    size_t n = tokenizer_encode(tok, text, strlen(text), &ids);
    if (n == 0 || n > PASSKEY_MAX_PIECE) {
        free(ids);
        return errf(e, "passkey template: '%s' encodes to %zu tokens (expected 1..%d)", text, n, PASSKEY_MAX_PIECE);
    }
    for (size_t i = 0; i < n; i++) {
        out[i] = ids[i];
        if (ids[i] > *max_id) *max_id = ids[i];
    }
    free(ids);
    return (int)n;
}

int passkey_template_init(PasskeyTemplate *t, Tokenizer *tok, ErrBuf *e) {
    memset(t, 0, sizeof *t);
    for (int d = 0; d < 10; d++) {
        char text[3] = {' ', (char)('0' + d), '\0'};
        uint32_t id[PASSKEY_MAX_PIECE];
        int n = encode_piece(tok, text, id, &t->max_id, e);
        if (n < 0) return -1;
        if (n != 1) return errf(e, "passkey template: the digit '%s' is %d tokens, expected one (GPT-2's vocabulary)", text, n);
        t->digit[d] = id[0];
    }
    if ((t->n_key_prefix = encode_piece(tok, KEY_PREFIX, t->key_prefix, &t->max_id, e)) < 0 ||
        (t->n_key_suffix = encode_piece(tok, KEY_SUFFIX, t->key_suffix, &t->max_id, e)) < 0 ||
        (t->n_question = encode_piece(tok, QUESTION, t->question, &t->max_id, e)) < 0)
        return -1;
    return 0;
}

int passkey_overhead(const PasskeyTemplate *t, int n_digits) {
    return t->n_key_prefix + n_digits + t->n_key_suffix + t->n_question + n_digits;
}

int passkey_max_distance(const PasskeyTemplate *t, int L, int n_digits) { return L - passkey_overhead(t, n_digits); }

void passkey_build(const PasskeyTemplate *t, const uint32_t *filler, int L, int distance, const char *digits,
                   uint32_t *out, PasskeyItem *item) {
    const int n = (int)strlen(digits);
    if (n < 1 || n > PASSKEY_MAX_DIGITS) FATAL("passkey_build: %d digits, expected 1..%d", n, PASSKEY_MAX_DIGITS);
    for (int k = 0; k < n; k++)
        if (digits[k] < '0' || digits[k] > '9') FATAL("passkey_build: '%s' is not a number", digits);
    const int max = passkey_max_distance(t, L, n);
    if (distance < 0 || distance > max)
        FATAL("passkey_build: distance %d outside [0, %d] for a sequence of %d tokens", distance, max, L);
    const int a = max - distance;  // filler before the key sentence
    int pos = 0, used = 0;
    memcpy(out, filler, sizeof(uint32_t) * (size_t)a);
    pos = used = a;
    item->key_pos = pos;
    memcpy(out + pos, t->key_prefix, sizeof(uint32_t) * (size_t)t->n_key_prefix);
    pos += t->n_key_prefix;
    for (int k = 0; k < n; k++) out[pos++] = t->digit[digits[k] - '0'];
    memcpy(out + pos, t->key_suffix, sizeof(uint32_t) * (size_t)t->n_key_suffix);
    pos += t->n_key_suffix;
    memcpy(out + pos, filler + used, sizeof(uint32_t) * (size_t)distance);
    pos += distance;
    item->question_pos = pos;
    memcpy(out + pos, t->question, sizeof(uint32_t) * (size_t)t->n_question);
    pos += t->n_question;
    item->answer_pos = pos;
    for (int k = 0; k < n; k++) out[pos++] = t->digit[digits[k] - '0'];
    if (pos != L) FATAL("passkey_build: laid out %d tokens, expected %d", pos, L);
    item->length = L;
    item->distance = distance;
    item->n_digits = n;
    memcpy(item->digits, digits, (size_t)n + 1);
}

void passkey_random_digits(uint64_t *rng, int min_digits, int max_digits, char *digits) {
    int n = min_digits + (int)(splitmix64_next(rng) % (uint64_t)(max_digits - min_digits + 1));
    digits[0] = (char)('1' + splitmix64_next(rng) % 9);
    for (int k = 1; k < n; k++) digits[k] = (char)('0' + splitmix64_next(rng) % 10);
    digits[n] = '\0';
}

int passkey_distances(const PasskeyTemplate *t, int L, int min_distance, int *out, int cap) {
    const int max = passkey_max_distance(t, L, PASSKEY_MAX_DIGITS);
    int n = 0;
    if (min_distance < 1 || min_distance > max) return 0;
    for (long long d = min_distance; d <= max && n < cap; d *= 2) out[n++] = (int)d;
    if (n < cap && out[n - 1] != max) out[n++] = max;
    return n;
}

// ---------------------------------------------------------------------------------------------
// The evaluation set.

int passkey_set_make(PasskeySet *s, const PasskeyTemplate *t, const char *pattern, int vocab_size, int L,
                     const int *distances, int n_distances, int samples, unsigned long long seed, ErrBuf *e) {
    memset(s, 0, sizeof *s);
    if (n_distances < 1 || n_distances > PASSKEY_MAX_DISTANCES)
        return errf(e, "passkey: %d distances (expected 1..%d)", n_distances, PASSKEY_MAX_DISTANCES);
    if (samples < 1) return errf(e, "passkey: %d sequences per distance (expected at least 1)", samples);
    if (t->max_id >= (uint32_t)vocab_size)
        return errf(e, "passkey: the template's token ids reach %u, beyond model.vocab_size %d (passkey retrieval "
                       "needs the GPT-2 vocabulary)", t->max_id, vocab_size);
    const int max = passkey_max_distance(t, L, PASSKEY_MAX_DIGITS);
    for (int d = 0; d < n_distances; d++)
        if (distances[d] < 0 || distances[d] > max)
            return errf(e, "passkey: distance %d does not fit a sequence of %d tokens (at most %d with %d digits)",
                        distances[d], L, max < 0 ? 0 : max, PASSKEY_MAX_DIGITS);
    DataLoader dl;  // rows of L tokens (T = L - 1 plus the last target) in a seeded order
    if (dataloader_open_mixed(&dl, pattern, 1, L - 1, 0, 1, 1, seed, vocab_size, e) != 0) return -1;
    s->L = L;
    s->n = samples * n_distances;
    s->n_distances = n_distances;
    memcpy(s->distance, distances, sizeof(int) * (size_t)n_distances);
    s->tokens = xmalloc(sizeof(uint32_t) * (size_t)s->n * (size_t)L);
    s->items = xcalloc((size_t)s->n, sizeof(PasskeyItem));
    int32_t *in = xmalloc(sizeof(int32_t) * (size_t)L), *tg = xmalloc(sizeof(int32_t) * (size_t)L);
    uint32_t *filler = xmalloc(sizeof(uint32_t) * (size_t)L);
    uint64_t rng = splitmix64_mix((uint64_t)seed ^ 0x7061737350617373ull);  // the numbers' own stream
    for (int i = 0; i < s->n; i++) {
        dataloader_next(&dl, in, tg);
        for (int j = 0; j < L - 1; j++) filler[j] = (uint32_t)in[j];
        filler[L - 1] = (uint32_t)tg[L - 2];
        char digits[PASSKEY_MAX_DIGITS + 1];
        passkey_random_digits(&rng, PASSKEY_MIN_DIGITS, PASSKEY_MAX_DIGITS, digits);
        passkey_build(t, filler, L, distances[i / samples], digits, s->tokens + (size_t)i * L, &s->items[i]);
    }
    free(in);
    free(tg);
    free(filler);
    dataloader_close(&dl);
    return 0;
}

void passkey_set_free(PasskeySet *s) {
    free(s->tokens);
    free(s->items);
    memset(s, 0, sizeof *s);
}

// ---------------------------------------------------------------------------------------------
// Scoring.

void passkey_score(const PasskeyItem *it, const uint32_t *tokens, const float *losses, const float *logits, int V,
                   int Vp, int *correct, int *digits_right, double *logp) {
    double lp = 0.0;
    int right = 0;
    for (int k = 0; k < it->n_digits; k++) {
        const int row = it->answer_pos - 1 + k;  // predicts token answer_pos + k
        lp -= losses[row];
        const float *l = logits + (size_t)k * Vp;
        int best = 0;
        for (int j = 1; j < V; j++)
            if (l[j] > l[best]) best = j;
        right += (uint32_t)best == tokens[it->answer_pos + k];
    }
    *logp = lp;
    *digits_right = right;
    *correct = right == it->n_digits;
}

float passkey_backend_forward(void *backend, const int32_t *inputs, const int32_t *targets, float *losses, int n_rows,
                              const int *rows, float *row_logits) {
    return backend_eval_detail((Backend *)backend, inputs, targets, losses, n_rows, rows, row_logits);
}

static int distance_index(const PasskeySet *s, int distance) {
    for (int d = 0; d < s->n_distances; d++)
        if (s->distance[d] == distance) return d;
    FATAL("passkey: an item's distance %d is not among the set's", distance);
}

void passkey_evaluate(const PasskeySet *s, PasskeyForwardFn fwd, void *ctx, int B, int V, int Vp,
                      PasskeyReport *out) {
    const int T = s->L;
    memset(out, 0, sizeof *out);
    out->n_distances = s->n_distances;
    memcpy(out->distance, s->distance, sizeof(int) * (size_t)s->n_distances);
    double p_sum[PASSKEY_MAX_DISTANCES] = {0}, p_sq[PASSKEY_MAX_DISTANCES] = {0};
    double digits_total[PASSKEY_MAX_DISTANCES] = {0};
    int32_t *inputs = xmalloc(sizeof(int32_t) * (size_t)B * T), *targets = xmalloc(sizeof(int32_t) * (size_t)B * T);
    float *losses = xmalloc(sizeof(float) * (size_t)B * T);
    int *rows = xmalloc(sizeof(int) * (size_t)B * PASSKEY_MAX_DIGITS);
    float *logits = xmalloc(sizeof(float) * (size_t)B * PASSKEY_MAX_DIGITS * Vp);
    for (int s0 = 0; s0 < s->n; s0 += B) {
        int n_rows = 0;
        for (int b = 0; b < B; b++) {
            const int i = s0 + b < s->n ? s0 + b : s0;  // a short last batch repeats its first sequence
            const uint32_t *tok = s->tokens + (size_t)i * T;
            for (int t = 0; t < T; t++) {
                inputs[b * T + t] = (int32_t)tok[t];
                targets[b * T + t] = t + 1 < T ? (int32_t)tok[t + 1] : -1;  // the last has none
            }
            if (s0 + b < s->n)
                for (int k = 0; k < s->items[i].n_digits; k++) rows[n_rows++] = b * T + s->items[i].answer_pos - 1 + k;
        }
        fwd(ctx, inputs, targets, losses, n_rows, rows, logits);
        const float *row_logits = logits;
        for (int b = 0; b < B && s0 + b < s->n; b++) {
            const PasskeyItem *it = &s->items[s0 + b];
            int correct, right;
            double lp;
            passkey_score(it, s->tokens + (size_t)(s0 + b) * T, losses + (size_t)b * T, row_logits, V, Vp, &correct,
                          &right, &lp);
            row_logits += (size_t)it->n_digits * Vp;
            const int d = distance_index(s, it->distance);
            const double p = exp(lp);
            out->n[d]++;
            out->accuracy[d] += correct;
            out->digit_accuracy[d] += right;
            digits_total[d] += it->n_digits;
            p_sum[d] += p;
            p_sq[d] += p * p;
            out->logp_answer[d] += lp;
            out->chance[d] += pow(10.0, -it->n_digits);
        }
    }
    for (int d = 0; d < s->n_distances; d++) {
        const double n = out->n[d];
        if (n == 0) continue;
        const double acc = out->accuracy[d] / n, p = p_sum[d] / n;
        out->accuracy[d] = acc;
        out->accuracy_se[d] = sqrt(acc * (1.0 - acc) / n);
        out->digit_accuracy[d] /= digits_total[d];
        out->p_answer[d] = p;
        const double var = n > 1 ? (p_sq[d] - n * p * p) / (n - 1) : 0.0;
        out->p_answer_se[d] = sqrt(var > 0 ? var : 0.0) / sqrt(n);
        out->logp_answer[d] /= n;
        out->chance[d] /= n;
    }
    free(inputs);
    free(targets);
    free(losses);
    free(rows);
    free(logits);
}

// ---------------------------------------------------------------------------------------------
// Output.

static void json_array(FILE *f, const char *key, const double *x, int n, const char *fmt, int first) {
    fprintf(f, "%s\"%s\": [", first ? "" : ", ", key);
    for (int i = 0; i < n; i++) {
        if (i) fprintf(f, ", ");
        if (isfinite(x[i])) fprintf(f, fmt, x[i]);
        else fprintf(f, "null");
    }
    fprintf(f, "]");
}

void passkey_report_json(FILE *f, const PasskeyReport *r) {
    double d[PASSKEY_MAX_DISTANCES], n[PASSKEY_MAX_DISTANCES];
    for (int i = 0; i < r->n_distances; i++) d[i] = r->distance[i], n[i] = r->n[i];
    fprintf(f, "{");
    json_array(f, "distance", d, r->n_distances, "%.0f", 1);
    json_array(f, "n", n, r->n_distances, "%.0f", 0);
    json_array(f, "accuracy", r->accuracy, r->n_distances, "%.6g", 0);
    json_array(f, "accuracy_se", r->accuracy_se, r->n_distances, "%.6g", 0);
    json_array(f, "digit_accuracy", r->digit_accuracy, r->n_distances, "%.6g", 0);
    json_array(f, "p_answer", r->p_answer, r->n_distances, "%.6g", 0);
    json_array(f, "p_answer_se", r->p_answer_se, r->n_distances, "%.6g", 0);
    json_array(f, "logp_answer", r->logp_answer, r->n_distances, "%.6g", 0);
    json_array(f, "chance", r->chance, r->n_distances, "%.6g", 0);
    fprintf(f, "}");
}

void passkey_report_print(FILE *f, const PasskeyReport *r, const char *indent) {
    fprintf(f, "%s%8s %5s %17s %7s %21s %9s %9s\n", indent, "distance", "n", "accuracy (se)", "digits",
            "p(answer) (se)", "log p", "chance");
    for (int d = 0; d < r->n_distances; d++)
        fprintf(f, "%s%8d %5d %8.3f (%6.3f) %7.3f %10.3g (%8.2g) %9.3f %9.2g\n", indent, r->distance[d], r->n[d],
                r->accuracy[d], r->accuracy_se[d], r->digit_accuracy[d], r->p_answer[d], r->p_answer_se[d],
                r->logp_answer[d], r->chance[d]);
}
