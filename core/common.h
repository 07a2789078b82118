// common.h: error handling, checked allocation and file helpers shared by every host file.
//
// Two kinds of failure, two styles:
//  - internal/system failures (out of memory, a failed write, a CUDA call): FATAL() prints
//    file:line, what failed and a hint, then exits non-zero. Never used for user input.
//  - bad user input (config, data shards, checkpoints): functions return a non-zero status and
//    fill an ErrBuf with a message naming the input (file, field) and what was expected, so
//    that tests can check the message and main() decides how to exit.
#ifndef COMMON_H
#define COMMON_H

#include <stdarg.h>  // va_list for the message helpers
#include <stddef.h>  // size_t
#include <stdint.h>  // fixed-width integers in binary formats
#include <stdio.h>   // FILE, fprintf
#include <stdlib.h>  // exit, malloc

#ifdef __cplusplus
extern "C" {
#endif

// ---------------------------------------------------------------------------------------------
// Internal errors: print where, what and a hint, then exit(1).
void fatal_at(const char *file, int line, const char *fmt, ...)
    __attribute__((format(printf, 3, 4), noreturn));
#define FATAL(...) fatal_at(__FILE__, __LINE__, __VA_ARGS__)

// Checked allocation: a failure names the size and the call site.
void *xmalloc_at(size_t n, const char *file, int line);
void *xcalloc_at(size_t count, size_t size, const char *file, int line);
void *xrealloc_at(void *p, size_t n, const char *file, int line);
#define xmalloc(n) xmalloc_at((n), __FILE__, __LINE__)
#define xcalloc(c, s) xcalloc_at((c), (s), __FILE__, __LINE__)
#define xrealloc(p, n) xrealloc_at((p), (n), __FILE__, __LINE__)
char *xstrdup(const char *s);

// ---------------------------------------------------------------------------------------------
// User-input errors: a message buffer filled by the function that found the problem.
typedef struct {
    char msg[1024];
} ErrBuf;
// Formats into e (if e is non-NULL) and returns -1, so callers can write `return errf(e, ...)`.
int errf(ErrBuf *e, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

// Prints "train_gpt: error: <msg>" to stderr and exits with status 1 (used by main() only).
void die_user(const ErrBuf *e) __attribute__((noreturn));

// ---------------------------------------------------------------------------------------------
// Files.
// Reads a whole file into a NUL-terminated heap buffer; returns NULL and fills e on failure.
char *read_file_text(const char *path, size_t *len_out, ErrBuf *e);
// Atomic replace: writes data to path.tmp.<pid>, fsyncs it, renames it over path and fsyncs
// the directory. The old file is untouched if anything fails. Returns 0 or -1 with e filled.
int write_file_atomic(const char *path, const void *data, size_t len, ErrBuf *e);
// mkdir -p; returns 0 or -1 with e filled.
int make_dirs(const char *path, ErrBuf *e);
int file_exists(const char *path);

// Wall-clock seconds (monotonic).
double now_seconds(void);

#ifdef __cplusplus
}
#endif
#endif  // COMMON_H
