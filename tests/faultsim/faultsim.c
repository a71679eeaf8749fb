/*
 * faultsim.c — the k-th allocation, file call or SQLite I/O made to fail,
 * for test builds only (faultsim.h says how it is linked and driven).
 * Each wrapper counts the call when its thread is in scope and the armed
 * kind is its own, fails it when the count is the armed one (or past it,
 * persistent), and otherwise calls the real function.
 */
#include "faultsim.h"

#include <errno.h>
#include <signal.h>
#include <execinfo.h>
#include <fcntl.h>
#include <openssl/crypto.h>
#include <sqlite3.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include "net/net.h"

/* ---- the armed fault ---------------------------------------------------------- */

int __real_open(const char *path, int flags, ...);
int __real_mkostemp(char *tmpl, int flags);
FILE *__real_fopen(const char *path, const char *mode);
ssize_t __real_write(int fd, const void *buf, size_t n);
ssize_t __real_pwrite(int fd, const void *buf, size_t n, off_t off);
int __real_fsync(int fd);
int __real_rename(const char *from, const char *to);
int __real_renameat2(int fd1, const char *from, int fd2, const char *to, unsigned flags);
int __real_unlink(const char *path);
int __real_statvfs(const char *path, struct statvfs *buf);

static _Atomic int armed_kind;
static _Atomic int64_t armed_nth, counted, fired;
static int armed_err, armed_persist;
static _Thread_local int in_scope;
/* set at exit: what runs after main (gcov's counters written in a
 * coverage build, which allocate) is not the program's to fail */
static _Atomic int exiting;

static int ssl_hooked, sqlmem_hooked;

void faultsim_arm(FaultKind kind, int64_t nth, int err, int persist) {
    if ((kind == FAULT_SSL && !ssl_hooked) || (kind == FAULT_SQLMEM && !sqlmem_hooked)) {
        static const char msg[] =
            "faultsim: OpenSSL or SQLite allocated before its hooks went in\n";
        ssize_t ignored = __real_write(2, msg, sizeof msg - 1);
        (void)ignored;
        abort();
    }
    atomic_store(&armed_kind, 0);
    armed_err = err, armed_persist = persist;
    atomic_store(&armed_nth, nth);
    atomic_store(&counted, 0);
    atomic_store(&fired, 0);
    in_scope = 1;
    atomic_store(&armed_kind, (int)kind);
}

int64_t faultsim_disarm(int64_t *n_fired) {
    atomic_store(&armed_kind, 0);
    in_scope = 0;
    if (n_fired) *n_fired = atomic_load(&fired);
    return atomic_load(&counted);
}

static const char *err_name(FaultKind kind, int err) {
    if (err == FAULTSIM_SHORT) return "a short write";
    if (kind == FAULT_SQL) return sqlite3_errstr(err);
    if (kind == FAULT_SSL || kind == FAULT_SQLMEM) return "ENOMEM";
    return strerrorname_np(err) ? strerrorname_np(err) : "an error";
}

/* A line on stderr (in build/strait-test: a unit test's faults are its
 * own to report), and at the end of STRAIT_FAULT_LOG when that is set (a
 * test reads it there: the processes it starts write stderr nowhere).
 * Formatted on the stack: nothing here allocates. */
static int to_stderr;
__attribute__((format(printf, 1, 2))) static void say(const char *fmt, ...) {
    char line[256];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(line, sizeof line, fmt, ap);
    va_end(ap);
    if (n < 0) return;
    size_t len = (size_t)n < sizeof line ? (size_t)n : sizeof line - 1;
    ssize_t ignored = to_stderr ? __real_write(2, line, len) : 0;
    const char *log = getenv("STRAIT_FAULT_LOG");
    int fd = log && *log ? __real_open(log, O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0600) : -1;
    if (fd >= 0 && getenv("STRAIT_FAULT_TRACE")) { /* where, for finding what swallowed it */
        void *frames[24];
        backtrace_symbols_fd(frames, backtrace(frames, 24), fd);
    }
    if (fd >= 0) ignored = __real_write(fd, line, len), close(fd);
    (void)ignored;
}

/* FAULT_KILL: the armed thread's nth file call or SQLite write is not
 * made: the process is killed there, as a power cut or kill -9 would. */
static void kill_here(const char *fn) {
    if (!in_scope || atomic_load(&armed_kind) != FAULT_KILL || atomic_load(&exiting)) return;
    int64_t k = atomic_fetch_add(&counted, 1) + 1;
    if (k != atomic_load(&armed_nth)) return;
    say("faultsim: killed at call %lld (%s)\n", (long long)k, fn);
    raise(SIGKILL);
}

/* Whether this call of kind (named fn) is to fail; counts it. */
static int fault_here(FaultKind kind, const char *fn) {
    if (!in_scope || atomic_load(&armed_kind) != (int)kind || atomic_load(&exiting)) return 0;
    int64_t k = atomic_fetch_add(&counted, 1) + 1, nth = atomic_load(&armed_nth);
    if (k != nth && !(armed_persist && k > nth)) return 0;
    atomic_fetch_add(&fired, 1);
    const char *names[] = {"", "alloc", "io", "sql", "ssl", "sqlmem", "kill"};
    say("faultsim: %s call %lld (%s) failed with %s\n", names[kind], (long long)k, fn,
        err_name(kind, armed_err));
    return 1;
}

/* An I/O fault that is an error (a short write is not one). */
static int io_fails(const char *fn) {
    kill_here(fn);
    if (!in_scope || armed_err == FAULTSIM_SHORT || !fault_here(FAULT_IO, fn)) return 0;
    errno = armed_err;
    return 1;
}

/* ---- allocation --------------------------------------------------------------- */

void *__real_malloc(size_t n);
void *__real_calloc(size_t k, size_t n);
void *__real_realloc(void *p, size_t n);
char *__real_strdup(const char *s);
char *__real_strndup(const char *s, size_t n);

void *__wrap_malloc(size_t n) {
    if (fault_here(FAULT_ALLOC, "malloc")) return errno = ENOMEM, NULL;
    return __real_malloc(n);
}
void *__wrap_calloc(size_t k, size_t n) {
    if (fault_here(FAULT_ALLOC, "calloc")) return errno = ENOMEM, NULL;
    return __real_calloc(k, n);
}
void *__wrap_realloc(void *p, size_t n) {
    if (fault_here(FAULT_ALLOC, "realloc")) return errno = ENOMEM, NULL;
    return __real_realloc(p, n);
}
char *__wrap_strdup(const char *s) {
    if (fault_here(FAULT_ALLOC, "strdup")) return errno = ENOMEM, NULL;
    return __real_strdup(s);
}
char *__wrap_strndup(const char *s, size_t n) {
    if (fault_here(FAULT_ALLOC, "strndup")) return errno = ENOMEM, NULL;
    return __real_strndup(s, n);
}

/* ---- OpenSSL's allocations -------------------------------------------------- */

/* OpenSSL allocates through these once they are installed, which it allows
 * only before its first allocation: hence a constructor, run before main
 * and before any test. faultsim_arm(FAULT_SSL, ...) without them (some
 * library allocated first) stops the test: it would pass for nothing. */
static void *ssl_malloc(size_t n, const char *file, int line) {
    (void)file, (void)line;
    if (fault_here(FAULT_SSL, "CRYPTO_malloc")) return NULL;
    return __real_malloc(n);
}
static void *ssl_realloc(void *p, size_t n, const char *file, int line) {
    (void)file, (void)line;
    if (fault_here(FAULT_SSL, "CRYPTO_realloc")) return NULL;
    return __real_realloc(p, n);
}
static void ssl_free(void *p, const char *file, int line) {
    (void)file, (void)line;
    free(p);
}
__attribute__((constructor(101))) static void faultsim_ssl_install(void) {
    ssl_hooked = CRYPTO_set_mem_functions(ssl_malloc, ssl_realloc, ssl_free) == 1;
}

/* ---- SQLite's own allocations ------------------------------------------------ */

/* SQLite allocates through these (SQLITE_CONFIG_MALLOC, set before it
 * initializes: the VFS's constructor below runs after this one). Each
 * block carries its size in front, which SQLite asks for. */
static void *sq_malloc(int n) {
    if (fault_here(FAULT_SQLMEM, "sqlite3_malloc")) return NULL;
    int64_t *p = __real_malloc((size_t)n + 8);
    if (p == NULL) return NULL;
    p[0] = n;
    return p + 1;
}
static void sq_free(void *p) {
    if (p) free((int64_t *)p - 1);
}
static void *sq_realloc(void *p, int n) {
    if (fault_here(FAULT_SQLMEM, "sqlite3_realloc")) return NULL;
    int64_t *q = __real_realloc(p ? (int64_t *)p - 1 : NULL, (size_t)n + 8);
    if (q == NULL) return NULL;
    q[0] = n;
    return q + 1;
}
static int sq_size(void *p) {
    return p ? (int)((int64_t *)p)[-1] : 0;
}
static int sq_roundup(int n) {
    return (n + 7) & ~7;
}
static int sq_init(void *app) {
    (void)app;
    return SQLITE_OK;
}
static void sq_shutdown(void *app) {
    (void)app;
}
__attribute__((constructor(102))) static void faultsim_sqlmem_install(void) {
    static const sqlite3_mem_methods m = {sq_malloc,  sq_free, sq_realloc,  sq_size,
                                          sq_roundup, sq_init, sq_shutdown, NULL};
    sqlmem_hooked = sqlite3_config(SQLITE_CONFIG_MALLOC, &m) == SQLITE_OK;
}

/* ---- files -------------------------------------------------------------------- */

int __wrap_open(const char *path, int flags, ...) {
    mode_t mode = 0;
    if (flags & (O_CREAT | O_TMPFILE)) {
        va_list ap;
        va_start(ap, flags);
        mode = (mode_t)va_arg(ap, int);
        va_end(ap);
    }
    if (io_fails("open")) return -1;
    return __real_open(path, flags, mode);
}
int __wrap_mkostemp(char *tmpl, int flags) {
    if (io_fails("mkostemp")) return -1;
    return __real_mkostemp(tmpl, flags);
}
FILE *__wrap_fopen(const char *path, const char *mode) {
    if (io_fails("fopen")) return NULL;
    return __real_fopen(path, mode);
}
/* a short write carries at most half (at least one byte) */
static size_t short_len(size_t n, const char *fn) {
    if (!in_scope || armed_err != FAULTSIM_SHORT || n < 2 || !fault_here(FAULT_IO, fn)) return n;
    return n / 2;
}
ssize_t __wrap_write(int fd, const void *buf, size_t n) {
    if (io_fails("write")) return -1;
    return __real_write(fd, buf, short_len(n, "write"));
}
ssize_t __wrap_pwrite(int fd, const void *buf, size_t n, off_t off) {
    if (io_fails("pwrite")) return -1;
    return __real_pwrite(fd, buf, short_len(n, "pwrite"), off);
}
int __wrap_fsync(int fd) {
    if (io_fails("fsync")) return -1;
    return __real_fsync(fd);
}
int __wrap_rename(const char *from, const char *to) {
    if (io_fails("rename")) return -1;
    return __real_rename(from, to);
}
int __wrap_renameat2(int fd1, const char *from, int fd2, const char *to, unsigned flags) {
    if (io_fails("renameat2")) return -1;
    return __real_renameat2(fd1, from, fd2, to, flags);
}
/* unlink is a point a kill may land on, never a call made to fail: the
 * removals that clean up after a failure are not theirs to fail */
int __wrap_unlink(const char *path) {
    kill_here("unlink");
    return __real_unlink(path);
}

/* STRAIT_TEST_DISK_FREE=BYTES: every file system says it has that many
 * bytes free (a coordinator's disk check, without filling a disk). */
int __wrap_statvfs(const char *path, struct statvfs *buf) {
    int rc = __real_statvfs(path, buf);
    const char *fake = getenv("STRAIT_TEST_DISK_FREE");
    if (rc == 0 && fake && *fake) {
        buf->f_frsize = 1;
        buf->f_bavail = buf->f_bfree = (fsblkcnt_t)strtoull(fake, NULL, 10);
    }
    return rc;
}

/* ---- SQLite: a VFS over the default one -------------------------------------- */

typedef struct FsFile {
    sqlite3_file base;
    sqlite3_file *real; /* follows this struct in the same allocation */
} FsFile;

static sqlite3_vfs *real_vfs;

/* An I/O fault of SQLite's: full and ioerr fail writes, syncs, truncates
 * and opens; busy fails locks. */
static int sql_fault(int is_lock, const char *fn, int ioerr_code) {
    if (!is_lock) kill_here(fn);
    /* in scope first: the armed error is the armed thread's to read */
    if (!in_scope || atomic_load(&armed_kind) != FAULT_SQL || (armed_err == SQLITE_BUSY) != is_lock)
        return 0;
    if (!fault_here(FAULT_SQL, fn)) return 0;
    if (armed_err == SQLITE_BUSY) return SQLITE_BUSY;
    return armed_err == SQLITE_FULL && ioerr_code == SQLITE_IOERR_WRITE ? SQLITE_FULL : ioerr_code;
}

#define REAL(f) (((FsFile *)(f))->real)
static int fs_close(sqlite3_file *f) {
    return REAL(f)->pMethods->xClose(REAL(f));
}
static int fs_read(sqlite3_file *f, void *b, int n, sqlite3_int64 off) {
    return REAL(f)->pMethods->xRead(REAL(f), b, n, off);
}
static int fs_write(sqlite3_file *f, const void *b, int n, sqlite3_int64 off) {
    int rc = sql_fault(0, "xWrite", SQLITE_IOERR_WRITE);
    return rc ? rc : REAL(f)->pMethods->xWrite(REAL(f), b, n, off);
}
static int fs_truncate(sqlite3_file *f, sqlite3_int64 size) {
    int rc = sql_fault(0, "xTruncate", SQLITE_IOERR_TRUNCATE);
    return rc ? rc : REAL(f)->pMethods->xTruncate(REAL(f), size);
}
static int fs_sync(sqlite3_file *f, int flags) {
    int rc = sql_fault(0, "xSync", SQLITE_IOERR_FSYNC);
    return rc ? rc : REAL(f)->pMethods->xSync(REAL(f), flags);
}
static int fs_size(sqlite3_file *f, sqlite3_int64 *size) {
    return REAL(f)->pMethods->xFileSize(REAL(f), size);
}
static int fs_lock(sqlite3_file *f, int lock) {
    int rc = sql_fault(1, "xLock", SQLITE_BUSY);
    return rc ? rc : REAL(f)->pMethods->xLock(REAL(f), lock);
}
static int fs_unlock(sqlite3_file *f, int lock) {
    return REAL(f)->pMethods->xUnlock(REAL(f), lock);
}
static int fs_check_lock(sqlite3_file *f, int *out) {
    return REAL(f)->pMethods->xCheckReservedLock(REAL(f), out);
}
static int fs_control(sqlite3_file *f, int op, void *arg) {
    return REAL(f)->pMethods->xFileControl(REAL(f), op, arg);
}
static int fs_sector(sqlite3_file *f) {
    return REAL(f)->pMethods->xSectorSize(REAL(f));
}
static int fs_device(sqlite3_file *f) {
    return REAL(f)->pMethods->xDeviceCharacteristics(REAL(f));
}
static int fs_shm_map(sqlite3_file *f, int pg, int pgsz, int extend, void volatile **p) {
    return REAL(f)->pMethods->xShmMap(REAL(f), pg, pgsz, extend, p);
}
static int fs_shm_lock(sqlite3_file *f, int off, int n, int flags) {
    /* WAL's write lock: the lock a second writer would hold */
    int want = (flags & SQLITE_SHM_LOCK) && (flags & SQLITE_SHM_EXCLUSIVE);
    int rc = want ? sql_fault(1, "xShmLock", SQLITE_BUSY) : 0;
    return rc ? rc : REAL(f)->pMethods->xShmLock(REAL(f), off, n, flags);
}
static void fs_shm_barrier(sqlite3_file *f) {
    REAL(f)->pMethods->xShmBarrier(REAL(f));
}
static int fs_shm_unmap(sqlite3_file *f, int del) {
    return REAL(f)->pMethods->xShmUnmap(REAL(f), del);
}
static int fs_fetch(sqlite3_file *f, sqlite3_int64 off, int n, void **p) {
    return REAL(f)->pMethods->xFetch(REAL(f), off, n, p);
}
static int fs_unfetch(sqlite3_file *f, sqlite3_int64 off, void *p) {
    return REAL(f)->pMethods->xUnfetch(REAL(f), off, p);
}

/* the methods, by the real file's version (1: no shared memory, 3: mmap) */
static sqlite3_io_methods fs_methods[4];

static int fs_open(sqlite3_vfs *vfs, const char *name, sqlite3_file *f, int flags, int *out) {
    (void)vfs;
    FsFile *ff = (FsFile *)f;
    ff->real = (sqlite3_file *)(ff + 1);
    ff->real->pMethods = NULL;
    int rc = sql_fault(0, "xOpen", SQLITE_CANTOPEN);
    if (rc == 0) rc = real_vfs->xOpen(real_vfs, name, ff->real, flags, out);
    const sqlite3_io_methods *m = ff->real->pMethods;
    f->pMethods = rc == SQLITE_OK && m ? &fs_methods[m->iVersion > 3 ? 3 : m->iVersion] : NULL;
    if (rc != SQLITE_OK && m) m->xClose(ff->real); /* SQLite closes only what opened */
    return rc;
}

static sqlite3_vfs fs_vfs;

__attribute__((constructor)) static void faultsim_vfs_install(void) {
    real_vfs = sqlite3_vfs_find(NULL);
    if (real_vfs == NULL) return;
    for (int v = 1; v <= 3; v++)
        fs_methods[v] = (sqlite3_io_methods){v,
                                             fs_close,
                                             fs_read,
                                             fs_write,
                                             fs_truncate,
                                             fs_sync,
                                             fs_size,
                                             fs_lock,
                                             fs_unlock,
                                             fs_check_lock,
                                             fs_control,
                                             fs_sector,
                                             fs_device,
                                             v >= 2 ? fs_shm_map : NULL,
                                             v >= 2 ? fs_shm_lock : NULL,
                                             v >= 2 ? fs_shm_barrier : NULL,
                                             v >= 2 ? fs_shm_unmap : NULL,
                                             v >= 3 ? fs_fetch : NULL,
                                             v >= 3 ? fs_unfetch : NULL};
    fs_vfs = *real_vfs;
    fs_vfs.zName = "faultsim";
    fs_vfs.szOsFile = (int)sizeof(FsFile) + real_vfs->szOsFile;
    fs_vfs.xOpen = fs_open;
    fs_vfs.pNext = NULL;
    sqlite3_vfs_register(&fs_vfs, 1);
}

/* ---- build/strait-test: STRAIT_FAULT and the scopes -------------------------- */

typedef struct Coordinator Coordinator;
typedef struct RoundClosing RoundClosing;
typedef struct RoundNext RoundNext;

enum { SCOPE_NONE, SCOPE_MAIN, SCOPE_COMMIT, SCOPE_PRUNE, SCOPE_UPLOAD, SCOPE_ADMIN, SCOPE_SERVE };
static FaultKind env_kind;
static int env_err, env_scope;
static int64_t env_nth;
static _Atomic int64_t scope_attempts;

static int parse_err(FaultKind kind, const char *s) {
    static const struct {
        FaultKind kind;
        const char *name;
        int err;
    } errs[] = {{FAULT_ALLOC, "enomem", ENOMEM},     {FAULT_SSL, "enomem", ENOMEM},
                {FAULT_IO, "enospc", ENOSPC},        {FAULT_IO, "eio", EIO},
                {FAULT_IO, "short", FAULTSIM_SHORT}, {FAULT_SQL, "full", SQLITE_FULL},
                {FAULT_SQL, "ioerr", SQLITE_IOERR},  {FAULT_SQL, "busy", SQLITE_BUSY},
                {FAULT_KILL, "sigkill", SIGKILL}};
    for (size_t i = 0; i < sizeof errs / sizeof errs[0]; i++)
        if (errs[i].kind == kind && strcmp(errs[i].name, s) == 0) return errs[i].err;
    return 0;
}

static void faultsim_exiting(void) {
    atomic_store(&exiting, 1);
}

/* STRAIT_FAULT, read before main: a wrong value stops the process, since a
 * test that meant a fault and got none would pass for the wrong reason.
 * The exit handler registered here runs before the destructors. */
__attribute__((constructor)) static void faultsim_env(void) {
    atexit(faultsim_exiting);
    const char *v = getenv("STRAIT_FAULT");
    if (v == NULL || *v == '\0') return;
    char scope[16] = "", kind[16] = "", err[16] = "";
    long long nth = 1;
    int n = sscanf(v, "%15[^:]:%15[^:]:%15[^:]:%lld", scope, kind, err, &nth);
    env_kind = strcmp(kind, "alloc") == 0    ? FAULT_ALLOC
               : strcmp(kind, "io") == 0     ? FAULT_IO
               : strcmp(kind, "sql") == 0    ? FAULT_SQL
               : strcmp(kind, "ssl") == 0    ? FAULT_SSL
               : strcmp(kind, "sqlmem") == 0 ? FAULT_SQLMEM
               : strcmp(kind, "kill") == 0   ? FAULT_KILL
                                             : 0;
    env_err = env_kind ? parse_err(env_kind, err) : 0;
    env_scope = strcmp(scope, "main") == 0     ? SCOPE_MAIN
                : strcmp(scope, "commit") == 0 ? SCOPE_COMMIT
                : strcmp(scope, "prune") == 0  ? SCOPE_PRUNE
                : strcmp(scope, "upload") == 0 ? SCOPE_UPLOAD
                : strcmp(scope, "admin") == 0  ? SCOPE_ADMIN
                : strcmp(scope, "serve") == 0  ? SCOPE_SERVE
                                               : SCOPE_NONE;
    if (n < 3 || env_kind == 0 || env_err == 0 || env_scope == SCOPE_NONE || nth < 1) {
        fprintf(
            stderr,
            "STRAIT_FAULT='%s' is not SCOPE:KIND:ERR[:K] (main|commit|prune|upload|admin|serve, "
            "alloc:enomem, "
            "io:enospc|eio|short, sql:full|ioerr|busy, ssl:enomem, sqlmem:enomem, "
            "kill:sigkill, K from 1)\n",
            v);
        _exit(2);
    }
    env_nth = nth;
    to_stderr = 1;
    if (env_scope == SCOPE_MAIN)
        faultsim_arm(env_kind, env_nth, env_err, env_err == FAULTSIM_SHORT);
}

/* An attempt of a scope: attempt a fails at its a-th call (short writes:
 * all of them; kill: the K-th), counted on this thread until scope_end. */
static int64_t scope_begin(void) {
    int64_t a = atomic_fetch_add(&scope_attempts, 1) + 1;
    /* a kill ends the process: each attempt is armed at the same K */
    faultsim_arm(env_kind, env_kind == FAULT_KILL ? env_nth : a, env_err,
                 env_err == FAULTSIM_SHORT);
    return a;
}
static void scope_end(const char *scope, int64_t a, const char *outcome) {
    int64_t n_fired, calls = faultsim_disarm(&n_fired);
    say("faultsim: %s attempt %lld: %lld calls, %lld failed, %s\n", scope, (long long)a,
        (long long)calls, (long long)n_fired, outcome);
}

/* STRAIT_TEST_COMMIT_HOLD holds each commit at its start, outside the
 * round's lock like the rest of it */
int __real_round_next_build(Coordinator *co, RoundClosing *c, RoundNext *nx, char *err);
int __wrap_round_next_build(Coordinator *co, RoundClosing *c, RoundNext *nx, char *err) {
    const char *hold = getenv("STRAIT_TEST_COMMIT_HOLD");
    while (hold && *hold && access(hold, F_OK) == 0) usleep(10000);
    if (env_scope != SCOPE_COMMIT) return __real_round_next_build(co, c, nx, err);
    int64_t a = scope_begin();
    int rc = __real_round_next_build(co, c, nx, err);
    scope_end("commit", a, rc == 0 ? "built" : "failed");
    return rc;
}

/* Retention after a commit (and once at start): the prune and the disk's
 * measure. */
int __real_round_retain(Coordinator *co);
int __wrap_round_retain(Coordinator *co) {
    if (env_scope != SCOPE_PRUNE) return __real_round_retain(co);
    int64_t a = scope_begin();
    int rc = __real_round_retain(co);
    scope_end("prune", a, rc == 0 ? "built" : "failed");
    return rc;
}

/* An upload's receipt: its chunks spooled, synced and hashed. */
NetStatus __real_net_upload_receive(NetCall *c, NetSpool *sp, const char *owner,
                                    const NetLimits *lim, NetReceived *out, char *err);
NetStatus __wrap_net_upload_receive(NetCall *c, NetSpool *sp, const char *owner,
                                    const NetLimits *lim, NetReceived *out, char *err) {
    if (env_scope != SCOPE_UPLOAD) return __real_net_upload_receive(c, sp, owner, lim, out, err);
    int64_t a = scope_begin();
    NetStatus st = __real_net_upload_receive(c, sp, owner, lim, out, err);
    scope_end("upload", a, st == NET_OK ? "built" : "failed");
    return st;
}

/* A call's handler as an attempt: every admin method (scope admin), or
 * GetModel, a model served (scope serve). The methods are registered once
 * at start, so a fixed table of them is enough. */
typedef struct Hooked {
    NetHandler fn;
    void *user;
    const char *scope;
} Hooked;
static Hooked hooked[32];
static _Atomic int n_hooked;

static void hooked_call(NetCall *c, void *user) {
    const Hooked *h = user;
    int64_t a = scope_begin();
    h->fn(c, h->user);
    scope_end(h->scope, a, "answered");
}

int __real_net_server_add_method(NetServer *s, const char *path, NetMethodKind kind, int flags,
                                 NetHandler handler, void *user, char *err);
int __wrap_net_server_add_method(NetServer *s, const char *path, NetMethodKind kind, int flags,
                                 NetHandler handler, void *user, char *err) {
    const char *scope =
        env_scope == SCOPE_ADMIN && strncmp(path, "/strait.Admin/", 14) == 0           ? "admin"
        : env_scope == SCOPE_SERVE && strcmp(path, "/strait.Federation/GetModel") == 0 ? "serve"
                                                                                       : NULL;
    int i = scope ? atomic_fetch_add(&n_hooked, 1) : -1;
    if (i < 0 || i >= (int)(sizeof hooked / sizeof hooked[0]))
        return __real_net_server_add_method(s, path, kind, flags, handler, user, err);
    hooked[i] = (Hooked){handler, user, scope};
    return __real_net_server_add_method(s, path, kind, flags, hooked_call, &hooked[i], err);
}
