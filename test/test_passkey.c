// test_passkey.c: passkey sequences and their evaluation (eval/passkey.h), and the validation
// statistics per position bucket and source (eval/val_stats.h).
//   - the generator: exactly L tokens, the answer at the last n_digits positions and equal to the
//     key's number, the distance between the key sentence and the question, filler taken from the
//     shard's text in order, the default distances, determinism by seed;
//   - the evaluator: a model given the answer (an oracle that reads the key in its context) scores
//     accuracy 1 and p(answer) ~ 1; one that is not (it knows only that a digit comes) scores
//     accuracy 0 and p(answer) = 10^-digits, chance, exactly; a guessing one stays near chance;
//   - the real CPU model through backend_eval_detail: per-token losses that average to the loss,
//     answer-row logits consistent with those losses and with next-token logits, and a passkey run;
//   - the validation buckets: edges, and bucket and source means that add up to the overall mean.
#include <math.h>    // exp, log, fabs
#include <string.h>  // memcmp, strlen

#include "core/backend.h"   // Backend, backend_eval_detail
#include "core/config.h"    // config_parse
#include "core/rng.h"       // splitmix64 for the guessing model
#include "dataloader.h"     // the shard the filler comes from
#include "eval/passkey.h"   // the module under test
#include "eval/val_stats.h" // the module under test
#include "test.h"           // CHECK, test_summary

static const char *VAL = "data/austen/val_000000.bin";

// The shard's tokens (the test reads the file itself, independently of the loader).
static uint32_t *read_shard(const char *path, long long *n) {
    FILE *f = fopen(path, "rb");
    if (!f) { printf("FAIL - setup: cannot open %s\n", path); exit(1); }
    int32_t header[256];
    if (fread(header, 4, 256, f) != 256 || header[0] != 20240520) { printf("FAIL - setup: %s header\n", path); exit(1); }
    *n = header[2];
    uint16_t *narrow = xmalloc((size_t)*n * 2);
    uint32_t *tok = xmalloc((size_t)*n * 4);
    if (fread(narrow, 2, (size_t)*n, f) != (size_t)*n) { printf("FAIL - setup: %s short\n", path); exit(1); }
    for (long long i = 0; i < *n; i++) tok[i] = narrow[i];
    free(narrow);
    fclose(f);
    return tok;
}

// Whether needle (n) occurs in hay (m) starting at a multiple of 1 (a plain substring search).
static long long find_run(const uint32_t *hay, long long m, const uint32_t *needle, int n) {
    for (long long i = 0; i + n <= m; i++)
        if (!memcmp(hay + i, needle, sizeof(uint32_t) * (size_t)n)) return i;
    return -1;
}

// ---------------------------------------------------------------------------------------------
// The generator.

static void test_generator(const PasskeyTemplate *t) {
    long long n_shard;
    uint32_t *shard = read_shard(VAL, &n_shard);
    const int L = 512, samples = 6;
    int dist[PASSKEY_MAX_DISTANCES];
    int nd = passkey_distances(t, L, 64, dist, PASSKEY_MAX_DISTANCES);
    const int max7 = passkey_max_distance(t, L, 7);
    CHECK(nd == 4 && dist[0] == 64 && dist[1] == 128 && dist[2] == 256 && dist[3] == max7,
          "default distances: doubling from the minimum, then the largest that fits",
          "%d distances: %d %d %d %d (max %d)", nd, dist[0], dist[1], dist[2], dist[3], max7);
    int big[PASSKEY_MAX_DISTANCES];
    int nb = passkey_distances(t, 4096, 512, big, PASSKEY_MAX_DISTANCES);
    CHECK(nb == 4 && big[0] == 512 && big[1] == 1024 && big[2] == 2048 && big[3] == passkey_max_distance(t, 4096, 7) &&
              big[3] < 4096,
          "T = 4096: distances 512, 1K, 2K and the largest below T", "%d: %d %d %d %d", nb, big[0], big[1], big[2],
          big[3]);
    CHECK(passkey_distances(t, 32, 512, big, PASSKEY_MAX_DISTANCES) == 0, "no distance fits a too-short sequence",
          "got some");

    PasskeySet s, s2, s3;
    ErrBuf e;
    int rc = passkey_set_make(&s, t, VAL, 50257, L, dist, nd, samples, 7, &e);
    CHECK(rc == 0 && s.n == nd * samples && s.L == L, "set: samples x distances sequences", "rc %d n %d: %s", rc, s.n,
          e.msg);
    if (rc) exit(1);
    int layout_ok = 1, answer_ok = 1, key_ok = 1, dist_ok = 1, filler_ok = 1, digits_ok = 1;
    for (int i = 0; i < s.n; i++) {
        const PasskeyItem *it = &s.items[i];
        const uint32_t *tok = s.tokens + (size_t)i * L;
        const int n = it->n_digits;
        if (it->length != L || it->answer_pos != L - n || n < PASSKEY_MIN_DIGITS || n > PASSKEY_MAX_DIGITS ||
            (int)strlen(it->digits) != n || it->digits[0] == '0')
            layout_ok = 0, digits_ok = 0;
        for (int k = 0; k < n; k++) {
            if (tok[it->answer_pos + k] != t->digit[it->digits[k] - '0']) answer_ok = 0;
            if (tok[it->key_pos + t->n_key_prefix + k] != t->digit[it->digits[k] - '0']) key_ok = 0;
        }
        if (memcmp(tok + it->key_pos, t->key_prefix, sizeof(uint32_t) * (size_t)t->n_key_prefix) ||
            memcmp(tok + it->question_pos, t->question, sizeof(uint32_t) * (size_t)t->n_question))
            key_ok = 0;
        const int key_end = it->key_pos + t->n_key_prefix + n + t->n_key_suffix;
        if (it->question_pos - key_end != it->distance || it->distance != dist[i / samples]) dist_ok = 0;
        // The filler before and after the key is one run of the shard's text, in order.
        uint32_t *filler = xmalloc(sizeof(uint32_t) * (size_t)L);
        int nf = 0;
        for (int j = 0; j < it->key_pos; j++) filler[nf++] = tok[j];
        for (int j = key_end; j < it->question_pos; j++) filler[nf++] = tok[j];
        if (nf != L - passkey_overhead(t, n) || (nf > 0 && find_run(shard, n_shard, filler, nf) < 0)) filler_ok = 0;
        free(filler);
    }
    CHECK(layout_ok, "every sequence is exactly L tokens with the answer at its last positions", "a layout differs");
    CHECK(digits_ok, "numbers of 5-7 digits, the first not 0", "a number is off");
    CHECK(answer_ok, "answer tokens are the number's digit tokens", "an answer differs");
    CHECK(key_ok, "key sentence and question in place, the key holding the same number", "a key differs");
    CHECK(dist_ok, "distance = filler tokens between the key sentence and the question", "a distance differs");
    CHECK(filler_ok, "filler is a run of the shard's text, in order", "a filler is not in the shard");

    rc = passkey_set_make(&s2, t, VAL, 50257, L, dist, nd, samples, 7, &e);
    int same = rc == 0 && !memcmp(s.tokens, s2.tokens, sizeof(uint32_t) * (size_t)s.n * L) &&
               !memcmp(s.items, s2.items, sizeof(PasskeyItem) * (size_t)s.n);
    CHECK(same, "same seed: the same sequences", "rc %d or differing", rc);
    rc = passkey_set_make(&s3, t, VAL, 50257, L, dist, nd, samples, 8, &e);
    int digits_differ = 0, filler_differs = 0;
    for (int i = 0; rc == 0 && i < s.n; i++) {
        digits_differ += strcmp(s.items[i].digits, s3.items[i].digits) != 0;
        filler_differs += memcmp(s.tokens + (size_t)i * L, s3.tokens + (size_t)i * L, 16) != 0;
    }
    CHECK(rc == 0 && digits_differ > s.n / 2 && filler_differs > s.n / 2, "another seed: other numbers and filler",
          "%d of %d numbers, %d fillers differ", digits_differ, s.n, filler_differs);
    passkey_set_free(&s2);
    passkey_set_free(&s3);

    int too_far[1] = {max7 + 1};
    rc = passkey_set_make(&s2, t, VAL, 50257, L, too_far, 1, 2, 7, &e);
    CHECK(rc == -1 && strstr(e.msg, "does not fit"), "a distance that does not fit is refused", "rc %d: %s", rc,
          e.msg);
    rc = passkey_set_make(&s2, t, VAL, 512, L, dist, 1, 2, 7, &e);
    CHECK(rc == -1 && strstr(e.msg, "vocab_size"), "a vocabulary without the template's ids is refused", "rc %d: %s",
          rc, e.msg);
    rc = passkey_set_make(&s2, t, "/nonexistent/passkey_*.bin", 50257, L, dist, 1, 2, 7, &e);
    CHECK(rc == -1 && strstr(e.msg, "no data shards"), "missing filler shards are refused", "rc %d: %s", rc, e.msg);
    passkey_set_free(&s);
    free(shard);
}

// ---------------------------------------------------------------------------------------------
// The evaluator with models whose answers are known.

enum { MODEL_ORACLE, MODEL_DIGITS_ONLY, MODEL_GUESS };
typedef struct {
    int kind, T, V, Vp;
    const PasskeyTemplate *t;
    uint64_t rng;
} FakeModel;

// Logits of one position: the digit tokens at `digit_logit` (the chosen one at 30), the rest -30.
static void fake_row(const FakeModel *m, float *row, int chosen) {
    for (int j = 0; j < m->Vp; j++) row[j] = -30.0f;
    for (int d = 0; d < 10; d++) row[m->t->digit[d]] = chosen >= 0 ? (d == chosen ? 30.0f : 0.0f) : 0.0f;
}

static double log_softmax_at(const float *row, int V, int target) {
    double mx = row[0], sum = 0;
    for (int j = 1; j < V; j++) mx = row[j] > mx ? row[j] : mx;
    for (int j = 0; j < V; j++) sum += exp(row[j] - mx);
    return row[target] - mx - log(sum);
}

// The digit a model that reads its context predicts at position p: the key's digit at the same
// offset from the answer's start (found by the question's position in the context).
static int oracle_digit(const FakeModel *m, const int32_t *in, int p) {
    const PasskeyTemplate *t = m->t;
    int q = -1;  // the question's last token before p
    for (int i = p; i >= t->n_question - 1 && q < 0; i--) {
        int match = 1;
        for (int k = 0; k < t->n_question && match; k++) match = in[i - t->n_question + 1 + k] == (int32_t)t->question[k];
        if (match) q = i;
    }
    if (q < 0) return -1;
    const int k = p - q;  // answer digit number k
    for (int i = 0; i + t->n_key_prefix < q; i++) {
        int match = 1;
        for (int j = 0; j < t->n_key_prefix && match; j++) match = in[i + j] == (int32_t)t->key_prefix[j];
        if (match) {
            int32_t tok = in[i + t->n_key_prefix + k];
            for (int d = 0; d < 10; d++)
                if (tok == (int32_t)t->digit[d]) return d;
        }
    }
    return -1;
}

static float fake_forward(void *ctx, const int32_t *inputs, const int32_t *targets, float *losses, int n_rows,
                          const int *rows, float *row_logits) {
    FakeModel *m = ctx;
    float *row = xmalloc(sizeof(float) * (size_t)m->Vp);
    double sum = 0;
    int counted = 0;
    int B = 0;
    for (int r = 0; r < n_rows; r++) B = rows[r] / m->T + 1 > B ? rows[r] / m->T + 1 : B;
    for (int i = 0; i < B * m->T; i++) losses[i] = 0.0f;
    for (int r = 0; r < n_rows; r++) {
        const int b = rows[r] / m->T, p = rows[r] % m->T;
        int chosen = -1;
        if (m->kind == MODEL_ORACLE) chosen = oracle_digit(m, inputs + (size_t)b * m->T, p);
        else if (m->kind == MODEL_GUESS) chosen = (int)(splitmix64_next(&m->rng) % 10);
        fake_row(m, row, chosen);
        memcpy(row_logits + (size_t)r * m->Vp, row, sizeof(float) * (size_t)m->Vp);
        if (targets[rows[r]] >= 0) {
            losses[rows[r]] = (float)-log_softmax_at(row, m->V, targets[rows[r]]);
            sum += losses[rows[r]];
            counted++;
        }
    }
    free(row);
    return counted ? (float)(sum / counted) : 0.0f;
}

static void test_evaluator(const PasskeyTemplate *t) {
    const int L = 256;
    int dist[PASSKEY_MAX_DISTANCES];
    int nd = passkey_distances(t, L, 32, dist, PASSKEY_MAX_DISTANCES);
    PasskeySet s;
    ErrBuf e;
    if (passkey_set_make(&s, t, VAL, 50257, L, dist, nd, 40, 3, &e)) { printf("FAIL - set: %s\n", e.msg); exit(1); }
    FakeModel m = {MODEL_ORACLE, L, 50257, 50304, t, 99};
    PasskeyReport r;
    passkey_evaluate(&s, fake_forward, &m, 3, m.V, m.Vp, &r);  // 3 does not divide the set: a short batch
    int acc1 = r.n_distances == nd, p1 = 1, counts = 1;
    for (int d = 0; d < r.n_distances; d++) {
        acc1 &= r.accuracy[d] == 1.0 && r.digit_accuracy[d] == 1.0 && r.accuracy_se[d] == 0.0;
        p1 &= fabs(r.p_answer[d] - 1.0) < 1e-6 && r.logp_answer[d] > -1e-5;
        counts &= r.n[d] == 40 && r.distance[d] == dist[d];
    }
    CHECK(counts, "report: every distance, 40 sequences each", "n[0] %d", r.n[0]);
    CHECK(acc1, "a model given the answer: accuracy 1 at every distance", "accuracy %.3f %.3f", r.accuracy[0],
          r.accuracy[nd - 1]);
    CHECK(p1, "a model given the answer: p(answer) = 1", "p %.6f", r.p_answer[0]);

    m.kind = MODEL_DIGITS_ONLY;  // every digit equally likely: chance
    passkey_evaluate(&s, fake_forward, &m, 4, m.V, m.Vp, &r);
    int acc0 = 1, chance = 1, digits = 1;
    for (int d = 0; d < r.n_distances; d++) {
        acc0 &= r.accuracy[d] == 0.0;
        chance &= fabs(r.p_answer[d] - r.chance[d]) < 1e-6 * r.chance[d] && r.chance[d] >= 1e-7 && r.chance[d] <= 1e-5;
        // ties go to the lowest id: the model always says the digit with the smallest token id
        digits &= r.digit_accuracy[d] > 0.02 && r.digit_accuracy[d] < 0.25;
    }
    CHECK(acc0, "a model not given the answer: accuracy 0", "accuracy %.3f", r.accuracy[0]);
    CHECK(chance, "a model not given the answer: p(answer) = 10^-digits (chance)", "p %.3g vs chance %.3g",
          r.p_answer[0], r.chance[0]);
    CHECK(digits, "a model not given the answer: about one digit in ten right", "digit accuracy %.3f",
          r.digit_accuracy[0]);

    m.kind = MODEL_GUESS;  // a confident guess per digit
    passkey_evaluate(&s, fake_forward, &m, 4, m.V, m.Vp, &r);
    double da = 0;
    int acc_g = 1;
    for (int d = 0; d < r.n_distances; d++) da += r.digit_accuracy[d] / r.n_distances, acc_g &= r.accuracy[d] == 0.0;
    CHECK(acc_g && da > 0.04 && da < 0.2, "a guessing model: no exact match, ~10% of digits",
          "accuracy %.3f, digits %.3f", r.accuracy[0], da);

    FILE *mem = tmpfile();
    passkey_report_json(mem, &r);
    rewind(mem);
    char buf[4096] = "";
    size_t got = fread(buf, 1, sizeof buf - 1, mem);
    buf[got] = '\0';
    fclose(mem);
    CHECK(strstr(buf, "\"distance\": [32, 64, 128") && strstr(buf, "\"accuracy\": [0, 0") && strstr(buf, "\"chance\""),
          "report JSON", "%s", buf);
    passkey_set_free(&s);
}

// ---------------------------------------------------------------------------------------------
// The real model on the CPU.

static void test_backend(const PasskeyTemplate *t) {
    const char *json = "{\"model\": {\"d_model\": 64, \"n_layer\": 1, \"n_head\": 1, \"ffn_hidden\": 128, "
                       "\"seq_len\": 128}, \"train\": {\"micro_batch\": 2}}";
    Config c;
    ErrBuf e;
    if (config_parse(json, "test_passkey", NULL, 0, &c, &e)) { printf("FAIL - config: %s\n", e.msg); exit(1); }
    const int B = 2, T = 128, V = c.model.vocab_size, Vp = c.model.padded_vocab_size;
    Backend be;
    if (backend_init(&be, &c, DEVICE_CPU, B, T, 5, 1, NULL, &e)) { printf("FAIL - backend: %s\n", e.msg); exit(1); }
    long long n_shard;
    uint32_t *shard = read_shard(VAL, &n_shard);
    int32_t in[2 * 128], tg[2 * 128];
    for (int i = 0; i < B * T; i++) in[i] = (int32_t)shard[1000 + i], tg[i] = (int32_t)shard[1001 + i];
    tg[5] = -1;  // an ignored target
    float losses[2 * 128];
    int rows[3] = {7, 130, 255};
    float *logits = xmalloc(sizeof(float) * 3 * (size_t)Vp), *next = xmalloc(sizeof(float) * (size_t)Vp);
    float mean = backend_eval_detail(&be, in, tg, losses, 3, rows, logits);
    float plain = backend_eval_loss(&be, in, tg);
    double sum = 0;
    for (int i = 0; i < B * T; i++) sum += losses[i];
    CHECK(mean == plain && fabs(sum / (B * T - 1) - mean) < 1e-5 && losses[5] == 0.0f,
          "per-token losses average to the loss (ignored target: 0)", "mean %.7f plain %.7f sum/n %.7f", mean, plain,
          sum / (B * T - 1));
    double worst = 0, worst_next = 0;
    for (int r = 0; r < 3; r++) {
        worst = fmax(worst, fabs(-log_softmax_at(logits + (size_t)r * Vp, V, tg[rows[r]]) - losses[rows[r]]));
        const int b = rows[r] / T, p = rows[r] % T;
        backend_next_logits(&be, in + b * T, p + 1, next);
        for (int j = 0; j < V; j++) worst_next = fmax(worst_next, fabs(next[j] - logits[(size_t)r * Vp + j]));
    }
    CHECK(worst < 1e-4, "answer-row logits give the row's loss", "max |diff| %.3g", worst);
    CHECK(worst_next < 1e-3, "answer-row logits equal the next-token logits of the prefix", "max |diff| %.3g",
          worst_next);

    int dist[PASSKEY_MAX_DISTANCES];
    int nd = passkey_distances(t, T, 16, dist, PASSKEY_MAX_DISTANCES);
    PasskeySet s;
    if (passkey_set_make(&s, t, VAL, V, T, dist, nd, 6, 1, &e)) { printf("FAIL - set: %s\n", e.msg); exit(1); }
    PasskeyReport r;
    passkey_evaluate(&s, passkey_backend_forward, &be, B, V, Vp, &r);
    int untrained = 1;
    for (int d = 0; d < r.n_distances; d++)
        untrained &= r.n[d] == 6 && r.accuracy[d] == 0.0 && r.p_answer[d] < 1e-12 && r.logp_answer[d] < -40;
    CHECK(untrained, "an untrained model: accuracy 0, p(answer) ~ (1/V)^digits", "accuracy %.3f, log p %.2f",
          r.accuracy[0], r.logp_answer[0]);
    passkey_set_free(&s);
    free(logits);
    free(next);
    free(shard);
    backend_free(&be);
}

// ---------------------------------------------------------------------------------------------
// Validation statistics.

static void test_val_stats(void) {
    ValStats v;
    val_stats_init(&v, 4096, 2);
    int edges_ok = v.n_buckets == 7;
    const int want[] = {0, 64, 128, 256, 512, 1024, 2048, 4096};
    for (int b = 0; b <= v.n_buckets && edges_ok; b++) edges_ok = v.bucket_start[b] == want[b];
    CHECK(edges_ok, "buckets for T = 4096: 0-63, 64-127, 128-255, ..., 2048-4095", "%d buckets", v.n_buckets);
    val_stats_free(&v);
    val_stats_init(&v, 100, 1);
    CHECK(v.n_buckets == 5 && v.bucket_start[1] == 12 && v.bucket_start[4] == 96 && v.bucket_start[5] == 100,
          "buckets for T = 100: T/8 wide at first, the last ends at T", "%d buckets, %d %d %d", v.n_buckets,
          v.bucket_start[1], v.bucket_start[4], v.bucket_start[5]);
    val_stats_free(&v);

    const int B = 3, T = 64;
    val_stats_init(&v, T, 2);
    uint64_t rng = 4;
    float losses[3 * 64];
    int32_t tg[3 * 64];
    int src[3] = {1, 0, 1};
    double sum = 0, count = 0, s1 = 0, c1 = 0;
    for (int batch = 0; batch < 2; batch++) {
        for (int i = 0; i < B * T; i++) {
            losses[i] = (float)(splitmix64_next(&rng) % 1000) / 100.0f;
            tg[i] = splitmix64_next(&rng) % 10 == 0 ? -1 : 1;
            if (tg[i] >= 0) {
                sum += losses[i], count++;
                if (src[i / T] == 1) s1 += losses[i], c1++;
            }
        }
        val_stats_add(&v, losses, tg, B, src);
    }
    double tokens, mean = val_stats_mean(&v, &tokens), wsum = 0, wcount = 0, ssum = 0, scount = 0;
    for (int b = 0; b < v.n_buckets; b++) {
        double bt, bm = val_stats_bucket(&v, b, &bt);
        wsum += bm * bt, wcount += bt;
    }
    for (int s = 0; s < 2; s++) {
        double st, sm = val_stats_source(&v, s, &st);
        ssum += sm * st, scount += st;
    }
    double st1, sm1 = val_stats_source(&v, 1, &st1);
    CHECK(tokens == count && fabs(mean - sum / count) < 1e-12, "overall mean over counted tokens", "%.9f vs %.9f",
          mean, sum / count);
    CHECK(wcount == count && fabs(wsum / wcount - mean) < 1e-12, "position buckets add up to the overall loss",
          "%.12f vs %.12f", wsum / wcount, mean);
    CHECK(scount == count && fabs(ssum / scount - mean) < 1e-12 && st1 == c1 && fabs(sm1 - s1 / c1) < 1e-12,
          "sources add up to the overall loss", "%.12f vs %.12f", ssum / scount, mean);
    val_stats_free(&v);
}

int main(void) {
    ErrBuf e;
    Tokenizer *tok = tokenizer_load(NULL, &e);
    if (!tok) { printf("FAIL - tokenizer: %s\n", e.msg); return 1; }
    PasskeyTemplate t;
    int rc = passkey_template_init(&t, tok, &e);
    CHECK(rc == 0 && t.n_key_prefix > 0 && t.n_question > 0 && t.max_id < 50257, "template encodes",
          "rc %d: %s", rc, e.msg);
    tokenizer_free(tok);
    test_generator(&t);
    test_evaluator(&t);
    test_backend(&t);
    test_val_stats();
    return test_summary("test_passkey");
}
