/*
 * faultsim.h — fault injection for test builds (SQLite's faultsim, done at
 * link time): build/strait-test and the unit tests are linked with
 * -Wl,--wrap for Strait's own calls of malloc, calloc, realloc, strdup, strndup,
 * open, mkostemp, fopen, write, pwrite, fsync, rename and unlink (a point
 * FAULT_KILL lands on, never made to fail), and statvfs (below), with a SQLite
 * VFS over the default one, and OpenSSL and SQLite allocate through
 * faultsim's functions (CRYPTO_set_mem_functions, SQLITE_CONFIG_MALLOC), so
 * the k-th of those calls can be made to fail.
 * The production binary, build/strait, is linked without any of it: no test
 * hook is in it.
 *
 * Only calls made on a thread in scope are counted: in a unit test, the
 * thread that armed; in build/strait-test, the thread of the scope named by
 * STRAIT_FAULT (below).
 *
 * build/strait-test reads, at start:
 *   STRAIT_FAULT=SCOPE:KIND:ERR[:K]
 *     SCOPE  main    the process's main thread, from start; the K-th call
 *                    fails (a command such as init, enroll or join)
 *            commit  each commit of a round (round_next_build): attempt a
 *                    fails at its a-th call, so successive attempts walk
 *                    every fault point of a commit until one has fewer
 *                    calls than its number and commits
 *            prune   each retention pass after a commit, and the one at
 *                    start (round_retain: the prune and the disk's measure),
 *                    attempt by attempt as a commit's
 *            upload  each upload's receipt (net_upload_receive: its chunks
 *                    spooled, synced and hashed), attempt by attempt as
 *                    a commit's
 *            admin   each call of the admin API (Status, Rounds, Sites, …),
 *                    attempt by attempt
 *            serve   each GetModel (a model served to a site), attempt by
 *                    attempt
 *     KIND   alloc (ERR: enomem), io (enospc, eio, short: every write
 *            and pwrite carries at most half of what was asked, and none
 *            fails), sql (full, ioerr, busy), ssl (enomem: OpenSSL's
 *            own allocations), sqlmem (enomem: SQLite's), kill (sigkill:
 *            FAULT_KILL; in a scope each attempt at its K-th call, so the
 *            first attempt with K calls ends the process)
 *   STRAIT_TEST_DISK_FREE=BYTES   statvfs says every file system has BYTES
 *            free (the coordinator's disk check without a full disk)
 *   STRAIT_TEST_COMMIT_HOLD=PATH   every commit waits at its start (the
 *            round closed, nothing built or written) while PATH exists
 * Each injected fault writes one line to stderr, and to the end of the file
 * STRAIT_FAULT_LOG when that is set: "faultsim: KIND call N (FUNCTION)
 * failed with ERR"; each attempt of a scope ends with "faultsim: SCOPE
 * attempt A: C calls, F failed, built|failed". STRAIT_FAULT_TRACE=1 puts
 * the stack of each fault in the log (to find what went on past one).
 */
#ifndef STRAIT_TESTS_FAULTSIM_H
#define STRAIT_TESTS_FAULTSIM_H

#include <stdint.h>

typedef enum FaultKind {
    FAULT_ALLOC = 1,
    FAULT_IO,
    FAULT_SQL,
    FAULT_SSL,
    FAULT_SQLMEM,
    /* not a failure: the process is killed (SIGKILL) at the armed thread's
     * nth file call (open, write, pwrite, fsync, rename, renameat2,
     * mkostemp, fopen, unlink) or SQLite write, sync or truncate, before it
     * is made — a crash at every point of what runs (ERR unused) */
    FAULT_KILL,
} FaultKind;

/* What a fault does: an errno for FAULT_ALLOC and FAULT_IO (ENOMEM, ENOSPC,
 * EIO), FAULTSIM_SHORT for short writes, or a SQLite result code for
 * FAULT_SQL (SQLITE_FULL, SQLITE_IOERR, SQLITE_BUSY). */
#define FAULTSIM_SHORT (-1)

/* The calling thread's nth call of that kind fails (1-based); with persist,
 * every call from the nth on. Replaces whatever was armed. */
void faultsim_arm(FaultKind kind, int64_t nth, int err, int persist);
/* Stops injecting; returns how many calls were counted since the arm, and
 * sets *fired (may be NULL) to how many of them were made to fail. */
int64_t faultsim_disarm(int64_t *fired);

#endif
