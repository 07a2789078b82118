// run_dir.h: what keeps a run directory whole while processes write into it.
//
// The lock: one writer per run directory. <dir>/train_gpt.lock is held with flock(2) for the
// life of the process that writes there (training, --resume) and holds the text "pid P on host
// H since TIME" of its holder. The kernel drops a flock when its holder dies, however it dies,
// so a lock file left by a killed run is stale when flock succeeds; its text then says whose it
// was and the lock is reclaimed with a note. A live holder is refused with a message naming it.
// On a file system without flock(2) the text alone decides: a holder on this host is alive
// when its PID is. A lock of another host that flock cannot rule out is refused: only the user
// knows whether that run is gone (the message says which file to delete then).
//
// Temporary files: write_file_atomic writes <name>.tmp.<pid> and renames it into place; a writer
// killed between the two leaves the temporary file behind (at paper scale tens of GB). Only the
// lock holder writes into a run directory, so once it holds the lock every such file of another
// PID belongs to a writer that is gone, and run_dir_remove_temp_files removes it.
#ifndef RUN_DIR_H
#define RUN_DIR_H

#include <stddef.h>  // size_t

#include "core/common.h"  // ErrBuf

#ifdef __cplusplus
extern "C" {
#endif

#define RUN_LOCK_NAME "train_gpt.lock"

typedef struct {
    int fd;               // the open lock file, locked; -1: not held
    char dir[2048];
    char created[2048];   // the outermost directory run_lock_acquire made ("" when dir existed)
    char path[2100];      // <dir>/train_gpt.lock
} RunLock;

// Takes the lock of dir, creating dir (and its parents) when missing. 0 on success, with a
// one-line note in note (note_len > 0) when a stale lock was reclaimed ("" otherwise); -1 with
// e naming the holder (or the file system problem).
int run_lock_acquire(RunLock *l, const char *dir, char *note, size_t note_len, ErrBuf *e);

// Gives the lock up: deletes the lock file, and the directories run_lock_acquire created as long
// as nothing else was written there. Safe to call twice, or on a lock never taken.
void run_lock_release(RunLock *l);

// Whether a process of this PID runs on this host (1), does not (0).
int run_dir_pid_alive(long pid);

// Removes the files of dir named <name>.tmp.<digits> whose digits are not this process's PID
// (call it holding dir's lock). Returns how many were removed; their total size in *bytes and,
// when note_len > 0, a one-line note naming them (at most a few) in note ("" when none).
int run_dir_remove_temp_files(const char *dir, long long *bytes, char *note, size_t note_len);

#ifdef __cplusplus
}
#endif
#endif  // RUN_DIR_H
