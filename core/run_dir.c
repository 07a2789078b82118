// run_dir.c: the run directory's lock and the removal of interrupted writers' temporary files
// (run_dir.h says why each exists).
#include "core/run_dir.h"

#include <dirent.h>    // opendir/readdir for the temporary files
#include <errno.h>     // errno for messages and the flock outcome
#include <fcntl.h>     // open
#include <signal.h>    // kill(pid, 0): is a process alive
#include <stdio.h>     // snprintf, sscanf
#include <string.h>    // strcmp, strerror, strrchr
#include <sys/file.h>  // flock
#include <sys/stat.h>  // stat, fstat: the lock file is still the one at the path
#include <time.h>      // the holder's start time in the lock text
#include <unistd.h>    // getpid, gethostname, ftruncate, pwrite, unlink, rmdir, usleep

static void host_name(char *out, size_t n) {
    if (gethostname(out, n) != 0 || !out[0]) snprintf(out, n, "unknown-host");
    out[n - 1] = '\0';
}

int run_dir_pid_alive(long pid) {
    if (pid <= 0) return 0;
    return kill((pid_t)pid, 0) == 0 || errno == EPERM;  // EPERM: alive, another user's
}

// The holder's text, "pid P on host H since TIME"; holder->pid 0 when the file holds none.
typedef struct {
    long pid;
    char host[256], since[64];
} Holder;

static void read_holder(int fd, Holder *h) {
    char text[512];
    memset(h, 0, sizeof *h);
    ssize_t n = pread(fd, text, sizeof text - 1, 0);
    if (n <= 0) return;
    text[n] = '\0';
    if (sscanf(text, "pid %ld on host %255s since %63[^\n]", &h->pid, h->host, h->since) < 2) h->pid = 0;
}

// "process P on host H (since TIME)" for messages.
static void describe(const Holder *h, char *out, size_t n) {
    snprintf(out, n, "process %ld on host %s%s%s%s", h->pid, h->host, h->since[0] ? " (since " : "", h->since,
             h->since[0] ? ")" : "");
}

int run_lock_acquire(RunLock *l, const char *dir, char *note, size_t note_len, ErrBuf *e) {
    memset(l, 0, sizeof *l);
    l->fd = -1;
    if (note_len > 0) note[0] = '\0';
    snprintf(l->dir, sizeof l->dir, "%s", dir);
    snprintf(l->path, sizeof l->path, "%s/%s", dir, RUN_LOCK_NAME);
    // The outermost missing directory of the path, so that release removes what was made here.
    char prefix[2048];
    for (size_t i = 1, n = strlen(l->dir); i <= n && !l->created[0]; i++) {
        if (l->dir[i] != '/' && l->dir[i] != '\0') continue;
        snprintf(prefix, sizeof prefix, "%.*s", (int)i, l->dir);
        struct stat st;
        if (stat(prefix, &st) != 0) snprintf(l->created, sizeof l->created, "%s", prefix);
    }
    if (make_dirs(dir, e) != 0) return -1;
    char me[256];
    host_name(me, sizeof me);
    // A holder that is giving the lock up deletes the file while it still holds it; whoever locked
    // the deleted file then sees that the path names another file, and tries again.
    for (int attempt = 0; attempt < 8; attempt++) {
        int fd = open(l->path, O_RDWR | O_CREAT | O_CLOEXEC, 0644);
        if (fd < 0) return errf(e, "%s: cannot open the run directory's lock file: %s", l->path, strerror(errno));
        int locked = flock(fd, LOCK_EX | LOCK_NB) == 0;
        int busy = !locked && (errno == EWOULDBLOCK || errno == EAGAIN);
        Holder h;
        read_holder(fd, &h);
        // the holder writes its name right after it takes the lock: give it a moment to be named
        for (int wait = 0; busy && !h.pid && wait < 50; wait++) {
            usleep(10000);
            read_holder(fd, &h);
        }
        char who[512];
        describe(&h, who, sizeof who);
        if (busy) {
            close(fd);
            if (!h.pid) snprintf(who, sizeof who, "another process (its lock file names none yet)");
            return errf(e, "run dir %s is in use by %s (lock %s): wait for that run to end or stop it (a stopped "
                           "run continues with --resume), or choose another log.dir via --set log.dir=...",
                        dir, who, l->path);
        }
        struct stat by_fd, by_path;
        if (locked && (fstat(fd, &by_fd) != 0 || stat(l->path, &by_path) != 0 || by_fd.st_ino != by_path.st_ino ||
                       by_fd.st_dev != by_path.st_dev)) {
            close(fd);  // the file was deleted by its last holder: lock the one at the path now
            continue;
        }
        // Here flock either succeeded (nobody holds the lock on this host) or is not supported by
        // the file system (the text alone decides).
        if (h.pid && h.pid != (long)getpid()) {
            int same_host = strcmp(h.host, me) == 0;
            if (!same_host) {
                close(fd);
                return errf(e, "run dir %s holds the lock of %s, which cannot be checked from %s (lock %s): if no "
                               "train_gpt runs in this directory there any more, delete %s and start again",
                            dir, who, me, l->path, l->path);
            }
            int alive = run_dir_pid_alive(h.pid);
            if (!locked && alive) {
                close(fd);
                return errf(e, "run dir %s is in use by %s (lock %s): wait for that run to end or stop it, or "
                               "choose another log.dir via --set log.dir=...", dir, who, l->path);
            }
            if (note_len > 0)
                snprintf(note, note_len, "note: reclaimed the stale lock %s of %s: %s", l->path, who,
                         alive ? "that PID now belongs to a process that does not hold the lock"
                               : "that process no longer runs");
        }
        char text[512];
        time_t now = time(NULL);
        struct tm tm;
        char since[64] = "?";
        if (localtime_r(&now, &tm)) strftime(since, sizeof since, "%Y-%m-%dT%H:%M:%S", &tm);
        int n = snprintf(text, sizeof text, "pid %ld on host %s since %s\n", (long)getpid(), me, since);
        if (ftruncate(fd, 0) != 0 || pwrite(fd, text, (size_t)n, 0) != n) {
            int err = errno;
            close(fd);
            return errf(e, "%s: cannot write the run directory's lock file: %s", l->path, strerror(err));
        }
        fsync(fd);
        l->fd = fd;
        return 0;
    }
    return errf(e, "%s: the lock file kept changing while it was being taken (another run starting at the same "
                   "moment?): try again", l->path);
}

void run_lock_release(RunLock *l) {
    if (l->fd < 0) return;
    unlink(l->path);  // while still locked: see run_lock_acquire's retry
    close(l->fd);
    l->fd = -1;
    if (!l->created[0]) return;
    // From dir up to the outermost directory made here; rmdir fails, and ends this, at the first
    // one that holds anything.
    char p[2048];
    snprintf(p, sizeof p, "%s", l->dir);
    while (rmdir(p) == 0 && strcmp(p, l->created) != 0) {
        char *slash = strrchr(p, '/');
        if (!slash || slash == p) break;
        *slash = '\0';
    }
}

// "<name>.tmp.<digits>": the digits as a PID, or -1.
static long temp_file_pid(const char *name) {
    const char *tag = NULL;
    for (const char *p = strstr(name, ".tmp."); p; p = strstr(p + 1, ".tmp.")) tag = p;
    if (!tag || tag == name) return -1;
    const char *digits = tag + 5;
    if (!*digits) return -1;
    long pid = 0;
    for (const char *p = digits; *p; p++) {
        if (*p < '0' || *p > '9' || pid > 100000000L) return -1;
        pid = pid * 10 + (*p - '0');
    }
    return pid;
}

int run_dir_remove_temp_files(const char *dir, long long *bytes, char *note, size_t note_len) {
    *bytes = 0;
    if (note_len > 0) note[0] = '\0';
    DIR *d = opendir(dir);
    if (!d) return 0;
    int removed = 0;
    char names[512] = "";
    size_t names_len = 0;
    struct dirent *ent;
    while ((ent = readdir(d)) != NULL) {
        long pid = temp_file_pid(ent->d_name);
        if (pid < 0 || pid == (long)getpid()) continue;
        char path[4096];
        snprintf(path, sizeof path, "%s/%s", dir, ent->d_name);
        struct stat st;
        if (stat(path, &st) != 0 || !S_ISREG(st.st_mode)) continue;
        if (unlink(path) != 0) continue;
        *bytes += (long long)st.st_size;
        if (removed < 3 && names_len < sizeof names - 1)
            names_len += (size_t)snprintf(names + names_len, sizeof names - names_len, "%s%s", removed ? ", " : "",
                                          ent->d_name);
        removed++;
    }
    closedir(d);
    if (removed && note_len > 0) {
        char size[32];
        if (*bytes >= 1000000) snprintf(size, sizeof size, "%.1f MB", (double)*bytes / 1e6);
        else snprintf(size, sizeof size, "%lld bytes", *bytes);
        snprintf(note, note_len, "note: removed %d temporary file%s of interrupted writes from %s (%s): %s%s", removed,
                 removed == 1 ? "" : "s", dir, size, names, removed > 3 ? ", ..." : "");
    }
    return removed;
}
