/*
 * util.h — the whole API of util/: logging, errors, atomic file writes, time,
 * JSON output, INI configuration and the progress bar.
 *
 * Two error regimes (STYLE.md):
 *  - inside a training step or a kernel, fail fast with file:line
 *    (mallocCheck, fopenCheck below);
 *  - everywhere that faces a user, a file or a peer, a function returns 0 on
 *    success or -1 on failure and writes one line into a caller-owned
 *    `char err[ERR_LEN]` that says what went wrong and what to do, like
 *    Redis's anetSetError.
 *
 * util/ depends on libc, jansson, inih and protobuf-c (TensorBoard's records) only.
 */
#ifndef STRAIT_UTIL_H
#define STRAIT_UTIL_H

#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <time.h>

#include <jansson.h>

#if defined(__GNUC__)
#define PRINTF_LIKE(fmt, args) __attribute__((format(printf, fmt, args)))
#define NORETURN               __attribute__((noreturn))
#else
#define PRINTF_LIKE(fmt, args)
#define NORETURN
#endif

/* ---- errors ------------------------------------------------------------ */

#define ERR_LEN 512

/* Writes a formatted one-line message into err (ERR_LEN bytes); err may be
 * NULL. Always returns -1 so a caller can `return err_set(err, ...)`. */
int err_set(char *err, const char *fmt, ...) PRINTF_LIKE(2, 3);
/* The same, with ": strerror(errno)" appended (errno read on entry). */
int err_set_errno(char *err, const char *fmt, ...) PRINTF_LIKE(2, 3);

/* Fail-fast helpers for code that cannot continue (llm.c's mallocCheck). */
NORETURN void die_at(const char *file, int line, const char *fmt, ...) PRINTF_LIKE(3, 4);
void *malloc_check(size_t size, const char *file, int line);
void *calloc_check(size_t n, size_t size, const char *file, int line);
FILE *fopen_check(const char *path, const char *mode, const char *file, int line);
#define mallocCheck(size)      malloc_check((size), __FILE__, __LINE__)
#define callocCheck(n, size)   calloc_check((n), (size), __FILE__, __LINE__)
#define fopenCheck(path, mode) fopen_check((path), (mode), __FILE__, __LINE__)
#define DIE(...)               die_at(__FILE__, __LINE__, __VA_ARGS__)

/* ---- addresses (addr.c) ------------------------------------------------ */

/* "HOST:PORT" (an IPv6 literal in brackets) into host and port, both
 * NUL-terminated; -1 when it is not that or does not fit. */
int hostport_split(const char *hostport, char *host, size_t host_len, char *port, size_t port_len);

/* ---- logging ----------------------------------------------------------- */

typedef enum LogLevel { LOG_DEBUG = 0, LOG_INFO, LOG_WARN, LOG_ERROR, LOG_OFF } LogLevel;

/* Lines go to stderr as "2026-11-29T17:44:10.123Z W [module] message".
 * The level starts at LOG_INFO, or what STRAIT_LOG (debug, info, warn,
 * error, off) says; tests set it to error. Thread-safe. */
void log_set_level(LogLevel level);
LogLevel log_get_level(void);
/* Parses "debug", "info", "warn", "error" or "off"; -1 if none of them. */
int log_level_parse(const char *name, LogLevel *out);
void log_set_stream(FILE *f); /* default stderr; for tests */
void log_msg(LogLevel level, const char *module, const char *fmt, ...) PRINTF_LIKE(3, 4);
void log_vmsg(LogLevel level, const char *module, const char *fmt, va_list ap) PRINTF_LIKE(3, 0);
#define log_debug(mod, ...) log_msg(LOG_DEBUG, (mod), __VA_ARGS__)
#define log_info(mod, ...)  log_msg(LOG_INFO, (mod), __VA_ARGS__)
#define log_warn(mod, ...)  log_msg(LOG_WARN, (mod), __VA_ARGS__)
#define log_error(mod, ...) log_msg(LOG_ERROR, (mod), __VA_ARGS__)

/* ---- time -------------------------------------------------------------- */

uint64_t time_monotonic_ns(void); /* CLOCK_MONOTONIC, for durations */
int64_t time_wall_ms(void);       /* CLOCK_REALTIME, ms since the epoch */
/* The time `ms` from now on `clock` (CLOCK_REALTIME or CLOCK_MONOTONIC), as
 * pthread_cond_timedwait takes it. */
struct timespec time_after_ms(int clock, int64_t ms);
/* "2026-11-29T17:44:10.123Z" into buf (at least 32 bytes); returns buf. */
char *time_format_iso8601(int64_t wall_ms, char *buf, size_t size);
/* Durations like "250ms", "90s", "15m", "24h", "7d", or a bare number of
 * seconds. Returns 0, or -1 with a message in err. */
int time_parse_duration_ms(const char *text, int64_t *out_ms, char *err);

/* ---- files ------------------------------------------------------------- */

/* Durable replace of a file: bytes go to a temporary file beside the target
 * (same folder, so rename is atomic), which is fsynced, renamed over the
 * target, and the folder fsynced. A crash at any instant leaves either the old
 * content or the new, never a mix; a crash before commit may leave a
 * "<path>.tmp.XXXXXX" file behind, which file_atomic_cleanup removes.
 * Ownership: the AtomicFile owns its fd and its path strings. */
typedef struct AtomicFile AtomicFile;

AtomicFile *file_atomic_open(const char *path, int mode, char *err);
int file_atomic_write(AtomicFile *af, const void *data, size_t len, char *err);
/* fsync, rename into place, fsync the folder; frees af in every case. A
 * failure before the rename leaves the target as it was; the only failure
 * after it is the folder's sync (the new content in place, its rename not
 * yet durable), which a caller whose file marks completion undoes. */
int file_atomic_commit(AtomicFile *af, char *err);
/* Unlinks the temporary file and frees af. */
void file_atomic_abort(AtomicFile *af);
/* One-shot: the whole content at once. */
int file_write_atomic(const char *path, const void *data, size_t len, int mode, char *err);
/* Removes temporaries left next to path by writers that crashed before
 * commit; returns how many were removed. */
int file_atomic_cleanup(const char *path);

/* Reads a whole file (at most max_len bytes, else an error) into a malloc'd
 * buffer with a NUL after the end; the caller frees it. */
int file_read_all(const char *path, size_t max_len, char **out, size_t *out_len, char *err);
/* fsync a folder so a rename or creation inside it is durable. */
int file_fsync_dir(const char *dir, char *err);
/* mkdir -p with the given mode for created folders. */
int file_mkdir_p(const char *path, int mode, char *err);

/* ---- JSON output ------------------------------------------------------- */

/* Writes obj as one compact line (keys in insertion order) and a newline,
 * then flushes, so scripts reading a pipe see whole records. Steals the
 * reference to obj. Returns 0, or -1 if the stream failed. */
int json_emit_line(FILE *f, json_t *obj);
/* The shortest decimal that reads back as the float v ("0.05", not
 * "0.0500000007"), into buf; and that decimal as a double, for json_real:
 * a setting written as text or JSON comes back as the same float. */
void float_text(char *buf, size_t len, float v);
double float_decimal(float v);

/* ---- configuration (INI through inih) ---------------------------------- */

/* An INI file read whole into memory: sections, keys and values as given.
 * Typed getters return the default when a key is absent, and -1 with a
 * message naming the file, section and key when a value is malformed.
 * Ownership: the Config owns every string it holds. */
typedef struct Config Config;

Config *config_load(const char *path, char *err);
Config *config_parse_string(const char *text, const char *origin, char *err);
void config_free(Config *cfg);
/* NULL if absent. The string belongs to cfg. */
const char *config_get(const Config *cfg, const char *section, const char *key);
const char *config_get_str(const Config *cfg, const char *section, const char *key,
                           const char *def);
int config_get_int(const Config *cfg, const char *section, const char *key, int64_t def,
                   int64_t min, int64_t max, int64_t *out, char *err);
int config_get_double(const Config *cfg, const char *section, const char *key, double def,
                      double *out, char *err);
int config_get_bool(const Config *cfg, const char *section, const char *key, int def, int *out,
                    char *err);
int config_get_duration_ms(const Config *cfg, const char *section, const char *key, int64_t def_ms,
                           int64_t *out_ms, char *err);
/* Sets key = value in [section] of the INI file at path, in place (a line
 * "key = ..." of that section is replaced, else the section and key are
 * appended), written atomically; comments and the rest are kept. */
int config_file_set(const char *path, const char *section, const char *key, const char *value,
                    char *err);
/* Reports, as an error, the first key of `section` that is not in `known`
 * (a NULL-terminated list), so a misspelt option is not silently ignored. */
int config_check_keys(const Config *cfg, const char *section, const char *const *known, char *err);
/* The same for sections: one that is not in known (NULL-terminated) is an
 * error naming it. */
int config_check_sections(const Config *cfg, const char *const *known, char *err);

/* ---- progress bar ------------------------------------------------------ */

/* Draws "label [#####.....]  42% 420/1000 suffix" in place with \r, at most
 * ten times a second, and only when the stream is a terminal: piped or
 * redirected output stays clean. Not thread-safe; one bar per stream. */
typedef struct ProgressBar {
    FILE *out;   /* not owned */
    int enabled; /* isatty(out) at init, or forced by the caller */
    char label[48];
    uint64_t total; /* 0: unknown, the bar shows a count only */
    uint64_t last_draw_ns;
    int drawn; /* something is on the line and needs a newline */
} ProgressBar;

void progress_init(ProgressBar *pb, FILE *out, const char *label, uint64_t total);
void progress_update(ProgressBar *pb, uint64_t done, const char *suffix);
/* Draws the final state (unthrottled) and ends the line. */
void progress_finish(ProgressBar *pb, uint64_t done, const char *suffix);

/* ---- processes (proc.c) ------------------------------------------------ */

typedef struct ProcResult {
    int status; /* exit status, 128 + signal if killed, -1 if it could not start */
    char *out;  /* stdout, NUL-terminated, owned */
    char *err;  /* stderr, NUL-terminated, owned */
} ProcResult;

/* Runs argv (argv[0] a path) to completion with stdin from /dev/null. */
ProcResult proc_run(char *const argv[]);
void proc_result_free(ProcResult *r);
/* Reads one line from fd into buf (without the newline) within timeout_ms;
 * its length, or -1. */
int proc_read_line(int fd, char *buf, size_t size, int timeout_ms);
/* SIGTERM, then SIGKILL after grace_ms; the exit status as proc_run's. */
int proc_stop(int pid, int grace_ms);

/* Where a started process's streams go. Zeroed: stdin from /dev/null,
 * stdout and stderr this process's own. */
typedef struct ProcIo {
    const char *log;   /* stdout and stderr appended to this file (created 0600) */
    int *out_fd;       /* stdout to a pipe instead; its read end lands here */
    int *err_fd;       /* stderr to a pipe instead; its read end lands here */
    int *in_fd;        /* stdin from a pipe; its write end lands here */
    const char *netns; /* a network namespace's file (/run/netns/NAME) to enter */
} ProcIo;

/* Starts argv (argv[0] a path) in the background with io's streams and no
 * blocked signals (whatever mask this process runs with); the pipe ends it
 * hands back are close-on-exec. Its pid, or -1 with nothing left open. */
int proc_start(char *const argv[], const ProcIo *io);
/* Waits for pid to end: its exit status as proc_run's, -1 if not ours. */
int proc_wait(int pid);
/* Whether pid has ended, without waiting: 1 with *status as proc_run's,
 * 0 while it runs, -1 if not ours. */
int proc_ended(int pid, int *status);
/* Bytes of memory the machine can still give without swapping
 * (/proc/meminfo's MemAvailable; free pages where it has none). */
double mem_available(void);
/* Clears the vector registers' upper halves (vzeroupper, on x86-64 chips
 * with AVX; nothing elsewhere). OpenSSL 3.0's ChaCha20-Poly1305 returns
 * with them dirty, and every SSE instruction the thread runs after it
 * pays a transition until something clears them (scalar math ran 33x
 * slower on this Xeon): called after it. */
void cpu_upper_clear(void);
/* Asks the kernel to back the 2 MiB-aligned part of [p, p + bytes) with
 * huge pages (transparent huge pages in madvise mode): a model-sized array
 * then takes its first touch in a few hundred faults, not a few hundred
 * thousand. Only a hint: nothing changes where the kernel declines. */
void mem_prefer_huge_pages(void *p, size_t bytes);

/* ---- TensorBoard event files (events.c) ---------------------------------------- */

typedef struct EventFile EventFile;
/* A new event file in dir (made if missing), its first record the file
 * version; NULL with err. */
EventFile *events_open(const char *dir, char *err);
/* One Event of scalars at step (values not finite are left out), appended
 * (synced at most once a second, and at the close). */
int events_scalars(EventFile *f, int64_t step, double wall_time, const char *const *tags,
                   const double *values, int n, char *err);
/* Syncs what was written since the last sync (a round's end). */
int events_sync(EventFile *f, char *err);
const char *events_path(const EventFile *f);
void events_close(EventFile *f);
/* CRC-32C (Castagnoli), as TFRecord frames its records. */
uint32_t events_crc32c(const void *data, size_t len);

#endif /* STRAIT_UTIL_H */
