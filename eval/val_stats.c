// val_stats.c: per-position-bucket and per-source sums of a validation pass (val_stats.h).
#include "eval/val_stats.h"

#include <math.h>    // NAN
#include <string.h>  // memset

#include "core/common.h"  // xcalloc, FATAL

void val_stats_init(ValStats *v, int T, int n_sources) {
    memset(v, 0, sizeof *v);
    if (T < 1 || n_sources < 1) FATAL("val_stats_init: T %d, %d sources", T, n_sources);
    v->T = T;
    v->n_sources = n_sources;
    int first = T >= 256 ? 64 : (T / 8 > 1 ? T / 8 : 1);
    v->bucket_start[0] = 0;
    for (long long end = first; v->n_buckets < VAL_MAX_BUCKETS; end *= 2) {
        if (end >= T || v->n_buckets == VAL_MAX_BUCKETS - 1) end = T;
        v->bucket_start[++v->n_buckets] = (int)end;
        if (end == T) break;
    }
    v->acc = xcalloc(2 * (size_t)val_stats_len(v), sizeof(double));
}

void val_stats_free(ValStats *v) {
    free(v->acc);
    memset(v, 0, sizeof *v);
}

int val_stats_len(const ValStats *v) { return 1 + v->n_buckets + v->n_sources; }

void val_stats_reset(ValStats *v) { memset(v->acc, 0, 2 * (size_t)val_stats_len(v) * sizeof(double)); }

void val_stats_add(ValStats *v, const float *losses, const int32_t *targets, int B, const int *row_source) {
    const int T = v->T, n = val_stats_len(v);
    double *sum = v->acc, *count = v->acc + n;
    for (int b = 0; b < B; b++) {
        const int s = row_source ? row_source[b] : 0;
        if (s < 0 || s >= v->n_sources) FATAL("val_stats_add: source %d of %d", s, v->n_sources);
        double row_sum = 0.0, row_count = 0.0;
        for (int k = 0; k < v->n_buckets; k++) {
            double bs = 0.0, bc = 0.0;
            for (int t = v->bucket_start[k]; t < v->bucket_start[k + 1]; t++) {
                const long i = (long)b * T + t;
                if (targets[i] < 0) continue;
                bs += losses[i];
                bc += 1.0;
            }
            sum[1 + k] += bs;
            count[1 + k] += bc;
            row_sum += bs;
            row_count += bc;
        }
        sum[0] += row_sum;
        count[0] += row_count;
        sum[1 + v->n_buckets + s] += row_sum;
        count[1 + v->n_buckets + s] += row_count;
    }
}

static double mean_at(const ValStats *v, int i, double *tokens) {
    const double c = v->acc[val_stats_len(v) + i];
    if (tokens) *tokens = c;
    return c > 0 ? v->acc[i] / c : NAN;
}

double val_stats_mean(const ValStats *v, double *tokens) { return mean_at(v, 0, tokens); }
double val_stats_bucket(const ValStats *v, int b, double *tokens) { return mean_at(v, 1 + b, tokens); }
double val_stats_source(const ValStats *v, int s, double *tokens) { return mean_at(v, 1 + v->n_buckets + s, tokens); }
