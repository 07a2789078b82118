// common.c: error reporting, checked allocation, whole-file reads and atomic writes.
#include "core/common.h"

#include <errno.h>     // errno for messages
#include <fcntl.h>     // open flags for fsync of a directory
#include <string.h>    // strerror, strlen
#include <sys/stat.h>  // mkdir, stat
#include <time.h>      // clock_gettime
#include <unistd.h>    // fsync, getpid, close

void fatal_at(const char *file, int line, const char *fmt, ...) {
    fprintf(stderr, "train_gpt: internal error at %s:%d: ", file, line);
    va_list ap;
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fprintf(stderr, "\n");
    exit(1);
}

void *xmalloc_at(size_t n, const char *file, int line) {
    void *p = malloc(n ? n : 1);
    if (!p) fatal_at(file, line, "malloc of %zu bytes failed (hint: the host is out of memory; reduce the model or batch)", n);
    return p;
}

void *xcalloc_at(size_t count, size_t size, const char *file, int line) {
    void *p = calloc(count ? count : 1, size ? size : 1);
    if (!p) fatal_at(file, line, "calloc of %zu x %zu bytes failed (hint: the host is out of memory)", count, size);
    return p;
}

void *xrealloc_at(void *old, size_t n, const char *file, int line) {
    void *p = realloc(old, n ? n : 1);
    if (!p) fatal_at(file, line, "realloc to %zu bytes failed (hint: the host is out of memory)", n);
    return p;
}

char *xstrdup(const char *s) {
    size_t n = strlen(s) + 1;
    char *p = xmalloc(n);
    memcpy(p, s, n);
    return p;
}

int errf(ErrBuf *e, const char *fmt, ...) {
    if (e) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(e->msg, sizeof e->msg, fmt, ap);
        va_end(ap);
    }
    return -1;
}

void die_user(const ErrBuf *e) {
    fprintf(stderr, "train_gpt: error: %s\n", e->msg);
    exit(1);
}

char *read_file_text(const char *path, size_t *len_out, ErrBuf *e) {
    struct stat st;
    if (stat(path, &st) == 0 && !S_ISREG(st.st_mode)) {
        errf(e, "%s: is %s, not a regular file", path, S_ISDIR(st.st_mode) ? "a directory" : "not a file");
        return NULL;
    }
    FILE *f = fopen(path, "rb");
    if (!f) { errf(e, "%s: cannot open: %s", path, strerror(errno)); return NULL; }
    if (fseek(f, 0, SEEK_END) != 0) { fclose(f); errf(e, "%s: cannot seek (is it a regular file?)", path); return NULL; }
    long n = ftell(f);
    if (n < 0) { fclose(f); errf(e, "%s: cannot tell its size (is it a regular file?)", path); return NULL; }
    rewind(f);
    char *buf = xmalloc((size_t)n + 1);
    size_t got = fread(buf, 1, (size_t)n, f);
    fclose(f);
    if (got != (size_t)n) { free(buf); errf(e, "%s: short read (%zu of %ld bytes)", path, got, n); return NULL; }
    buf[n] = '\0';
    if (len_out) *len_out = (size_t)n;
    return buf;
}

// fsync the directory holding path so that a rename survives a crash.
static void sync_parent_dir(const char *path) {
    char dir[4096];
    snprintf(dir, sizeof dir, "%s", path);
    char *slash = strrchr(dir, '/');
    if (slash) *slash = '\0'; else snprintf(dir, sizeof dir, ".");
    int fd = open(dir, O_RDONLY);
    if (fd >= 0) { fsync(fd); close(fd); }
}

int write_file_atomic(const char *path, const void *data, size_t len, ErrBuf *e) {
    char tmp[4096];
    snprintf(tmp, sizeof tmp, "%s.tmp.%d", path, (int)getpid());
    FILE *f = fopen(tmp, "wb");
    if (!f) return errf(e, "%s: cannot create: %s", tmp, strerror(errno));
    int ok = fwrite(data, 1, len, f) == len;
    ok = ok && fflush(f) == 0;
    ok = ok && fsync(fileno(f)) == 0;
    ok = (fclose(f) == 0) && ok;
    if (!ok) {
        int err = errno;
        unlink(tmp);
        return errf(e, "%s: write failed: %s (%s)", tmp, strerror(err),
                    err == EFBIG ? "the file size limit, ulimit -f, is too low for it" : "is the disk full?");
    }
    if (rename(tmp, path) != 0) { unlink(tmp); return errf(e, "%s: cannot rename into place: %s", path, strerror(errno)); }
    sync_parent_dir(path);
    return 0;
}

int make_dirs(const char *path, ErrBuf *e) {
    char buf[4096];
    size_t n = strlen(path);
    if (n == 0 || n >= sizeof buf) return errf(e, "directory path '%s' is empty or too long", path);
    memcpy(buf, path, n + 1);
    for (size_t i = 1; i <= n; i++) {
        if (buf[i] == '/' || buf[i] == '\0') {
            char c = buf[i];
            buf[i] = '\0';
            if (mkdir(buf, 0777) != 0 && errno != EEXIST)
                return errf(e, "%s: cannot create directory: %s", buf, strerror(errno));
            struct stat st;
            if (stat(buf, &st) != 0 || !S_ISDIR(st.st_mode))
                return errf(e, "%s: exists and is not a directory", buf);
            buf[i] = c;
        }
    }
    return 0;
}

int file_exists(const char *path) {
    struct stat st;
    return stat(path, &st) == 0;
}

double now_seconds(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}
