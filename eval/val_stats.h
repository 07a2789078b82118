// val_stats.h: what a validation pass adds up besides its mean loss: the mean loss per position
// bucket (where in the T-token context a token is predicted) and per data source.
//
// Buckets are log-spaced: positions 0-63, 64-127, 128-255, ... doubling up to T (the last ends
// at T); for T < 256 the first bucket is T/8 wide (at least 1), so short test contexts still get
// several. A source is the folder of the shard a row came from (dataloader.h's source_names).
// Every sum is a double, so the buckets' token-weighted mean is the overall mean up to rounding.
#ifndef VAL_STATS_H
#define VAL_STATS_H

#include <stdint.h>  // int32_t

#ifdef __cplusplus
extern "C" {
#endif

#define VAL_MAX_BUCKETS 32

typedef struct {
    int T, n_buckets, n_sources;
    int bucket_start[VAL_MAX_BUCKETS + 1];  // bucket b holds positions [start[b], start[b + 1])
    // One flat array so that data-parallel ranks add theirs with one all-reduce: the loss sums
    // of [all, bucket 0 .. n_buckets-1, source 0 .. n_sources-1], then their token counts.
    double *acc;  // (2 * val_stats_len)
} ValStats;

void val_stats_init(ValStats *v, int T, int n_sources);
void val_stats_free(ValStats *v);
void val_stats_reset(ValStats *v);
// Entries of one half of acc: 1 + n_buckets + n_sources (acc holds twice as many).
int val_stats_len(const ValStats *v);

// Adds one micro-batch: losses and targets (B, T) (targets < 0 are not counted), row_source (B)
// the source of each row (NULL: all source 0).
void val_stats_add(ValStats *v, const float *losses, const int32_t *targets, int B, const int *row_source);

// Mean loss and tokens of everything, of bucket b, of source s (NAN with no tokens).
double val_stats_mean(const ValStats *v, double *tokens);
double val_stats_bucket(const ValStats *v, int b, double *tokens);
double val_stats_source(const ValStats *v, int s, double *tokens);

#ifdef __cplusplus
}
#endif
#endif  // VAL_STATS_H
