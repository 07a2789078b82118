// config_names.h: private to config.c and config_validate.c: the names of every enum value as
// they appear in JSON (NULL-terminated, in enum order) and two helpers over such lists.
#ifndef CONFIG_NAMES_H
#define CONFIG_NAMES_H

#include <stddef.h>  // size_t

extern const char *const DEVICE_NAMES[];
extern const char *const POSITION_NAMES[];
extern const char *const SCHEDULE_NAMES[];
extern const char *const ATTN_NAMES[];
extern const char *const GRADFMT_NAMES[];
extern const char *const SCALING_NAMES[];
extern const char *const CENTER_KEYS_NAMES[];
extern const char *const LINEAR_NAMES[];
extern const char *const WGRAD_BLOCKS_NAMES[];
extern const char *const LINEAR_SCALING_NAMES[];
extern const char *const FAST_ACCUM_NAMES[];
extern const char *const RECIPE_NAMES[];
extern const char *const DATA_ORDER_NAMES[];
extern const char *const DIAG_REFERENCE_NAMES[];  // the diagnostics' reference: fp32 or bf16

// JSON numbers are doubles: integers beyond 2^53 would silently lose digits.
#define MAX_EXACT_INT 9007199254740992.0

int count_names(const char *const *names);                         // entries before the NULL
void join_quoted(const char *const *names, char *out, size_t cap);  // "a", "b", "c"

#endif  // CONFIG_NAMES_H
