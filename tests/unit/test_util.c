/*
 * test_util.c — util/: errors, logging, time and durations, atomic writes
 * (with real crashes injected by SIGKILL), file helpers, JSON lines, INI
 * configuration, the progress bar (on a pipe and on a pseudo-terminal) and
 * starting processes (their streams, signal mask and exit statuses).
 */
#include <errno.h>
#include <fcntl.h>
#include <pty.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <criterion/criterion.h>
#include <criterion/redirect.h>

#include "tests/harness.h"
#include "util/util.h"

/* ---- errors ------------------------------------------------------------ */

Test(err, set_formats_and_returns_minus_one) {
    char err[ERR_LEN];
    cr_assert_eq(err_set(err, "bad %s %d", "thing", 7), -1);
    cr_assert_str_eq(err, "bad thing 7");
    cr_assert_eq(err_set(NULL, "ignored"), -1);
}

Test(err, set_errno_appends_strerror) {
    char err[ERR_LEN];
    errno = ENOENT;
    cr_assert_eq(err_set_errno(err, "cannot open %s", "x"), -1);
    cr_assert_str_eq(err, "cannot open x: No such file or directory");
}

Test(err, long_messages_are_truncated_not_overflowed) {
    char err[ERR_LEN + 16];
    memset(err, 'z', sizeof err);
    char big[2 * ERR_LEN];
    memset(big, 'a', sizeof big - 1);
    big[sizeof big - 1] = '\0';
    err_set(err, "%s", big);
    cr_assert_eq(strlen(err), ERR_LEN - 1);
    cr_assert_eq(err[ERR_LEN], 'z');
}

Test(err, die_aborts_with_file_and_line, .signal = SIGABRT, .init = cr_redirect_stderr) {
    DIE("boom %d", 1);
}

/* ---- logging ----------------------------------------------------------- */

static char *log_capture(LogLevel level, void (*emit)(void)) {
    char *buf = NULL;
    size_t len = 0;
    FILE *mem = open_memstream(&buf, &len);
    cr_assert_not_null(mem);
    LogLevel saved = log_get_level();
    log_set_stream(mem);
    log_set_level(level);
    emit();
    log_set_stream(NULL);
    log_set_level(saved);
    fclose(mem);
    return buf;
}

static void emit_all_levels(void) {
    log_debug("t", "d%d", 1);
    log_info("t", "i%d", 2);
    log_warn("t", "w%d", 3);
    log_error("t", "e%d", 4);
}

Test(log, level_filters_lower_levels) {
    char *out = log_capture(LOG_WARN, emit_all_levels);
    cr_assert_eq(harness_count_lines(out), 2, "got: %s", out);
    cr_assert_null(strstr(out, "i2"));
    cr_assert_not_null(strstr(out, " W [t] w3\n"));
    cr_assert_not_null(strstr(out, " E [t] e4\n"));
    free(out);
}

Test(log, off_prints_nothing_and_debug_everything) {
    char *out = log_capture(LOG_OFF, emit_all_levels);
    cr_assert_str_eq(out, "");
    free(out);
    out = log_capture(LOG_DEBUG, emit_all_levels);
    cr_assert_eq(harness_count_lines(out), 4);
    free(out);
}

static void emit_newline(void) {
    log_error("t", "line one\nforged line");
}

Test(log, a_message_stays_on_one_line) {
    char *out = log_capture(LOG_INFO, emit_newline);
    cr_assert_eq(harness_count_lines(out), 1, "got: %s", out);
    cr_assert_not_null(strstr(out, "line one forged line"));
    free(out);
}

Test(log, lines_start_with_an_iso8601_timestamp) {
    char *out = log_capture(LOG_INFO, emit_all_levels);
    /* 2026-11-29T17:44:10.123Z */
    cr_assert_geq(strlen(out), 24);
    cr_assert_eq(out[4], '-');
    cr_assert_eq(out[10], 'T');
    cr_assert_eq(out[19], '.');
    cr_assert_eq(out[23], 'Z');
    free(out);
}

Test(log, level_names_parse) {
    LogLevel l;
    cr_assert_eq(log_level_parse("warn", &l), 0);
    cr_assert_eq(l, LOG_WARN);
    cr_assert_eq(log_level_parse("loud", &l), -1);
}

/* ---- time -------------------------------------------------------------- */

Test(time, monotonic_advances) {
    uint64_t a = time_monotonic_ns();
    struct timespec ts = {0, 2000000};
    nanosleep(&ts, NULL);
    cr_assert_geq(time_monotonic_ns() - a, 2000000u);
}

Test(time, iso8601_of_known_instants) {
    char buf[32];
    cr_assert_str_eq(time_format_iso8601(0, buf, sizeof buf), "1970-01-01T00:00:00.000Z");
    cr_assert_str_eq(time_format_iso8601(1795974270123LL, buf, sizeof buf),
                     "2026-11-29T17:44:30.123Z");
    cr_assert_str_eq(time_format_iso8601(-1, buf, sizeof buf), "1969-12-31T23:59:59.999Z");
}

Test(time, durations_parse_with_units) {
    int64_t ms;
    char err[ERR_LEN];
    struct {
        const char *text;
        int64_t ms;
    } ok[] = {{"250ms", 250},    {"90s", 90000}, {"15m", 900000},  {"24h", 86400000},
              {"7d", 604800000}, {"30", 30000},  {"1.5h", 5400000}};
    for (size_t i = 0; i < sizeof ok / sizeof ok[0]; i++) {
        cr_assert_eq(time_parse_duration_ms(ok[i].text, &ms, err), 0, "%s: %s", ok[i].text, err);
        cr_assert_eq(ms, ok[i].ms, "%s gave %lld", ok[i].text, (long long)ms);
    }
    const char *bad[] = {"", "h", "10x", "-5s", "1e400s", "12 h"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
        cr_assert_eq(time_parse_duration_ms(bad[i], &ms, err), -1, "'%s' accepted", bad[i]);
}

/* A deadline from now, carried into the seconds when the milliseconds pass one. */
Test(time, a_deadline_is_now_and_the_milliseconds) {
    for (int64_t ms = 0; ms <= 2999; ms += 271) {
        struct timespec before, after;
        clock_gettime(CLOCK_MONOTONIC, &before);
        struct timespec t = time_after_ms(CLOCK_MONOTONIC, ms);
        clock_gettime(CLOCK_MONOTONIC, &after);
        cr_assert(t.tv_nsec >= 0 && t.tv_nsec < 1000000000L, "%ld ns", (long)t.tv_nsec);
        int64_t at = (int64_t)t.tv_sec * 1000000000LL + t.tv_nsec,
                lo = (int64_t)before.tv_sec * 1000000000LL + before.tv_nsec + ms * 1000000LL,
                hi = (int64_t)after.tv_sec * 1000000000LL + after.tv_nsec + ms * 1000000LL;
        cr_assert(at >= lo && at <= hi, "%lld ms: %lld not in [%lld, %lld]", (long long)ms,
                  (long long)at, (long long)lo, (long long)hi);
    }
}

/* ---- files ------------------------------------------------------------- */

static char *path_in(const char *dir, const char *name) {
    char *p;
    cr_assert_gt(asprintf(&p, "%s/%s", dir, name), 0);
    return p;
}

static char *slurp(const char *path) {
    char *data, err[ERR_LEN];
    cr_assert_eq(file_read_all(path, 1 << 30, &data, NULL, err), 0, "%s", err);
    return data;
}

Test(file, atomic_write_replaces_and_sets_mode) {
    char *dir = harness_tmpdir("atomic"), *p = path_in(dir, "f.txt"), err[ERR_LEN];
    cr_assert_eq(file_write_atomic(p, "old", 3, 0644, err), 0, "%s", err);
    cr_assert_eq(file_write_atomic(p, "new!", 4, 0600, err), 0, "%s", err);
    char *data = slurp(p);
    cr_assert_str_eq(data, "new!");
    struct stat st;
    cr_assert_eq(stat(p, &st), 0);
    cr_assert_eq(st.st_mode & 0777, 0600);
    free(data);
    harness_rmtree(dir);
    free(p);
    free(dir);
}

Test(file, abort_leaves_old_content_and_no_temporary) {
    char *dir = harness_tmpdir("abort"), *p = path_in(dir, "f"), err[ERR_LEN];
    cr_assert_eq(file_write_atomic(p, "keep", 4, 0644, err), 0);
    AtomicFile *af = file_atomic_open(p, 0644, err);
    cr_assert_not_null(af, "%s", err);
    cr_assert_eq(file_atomic_write(af, "lost", 4, err), 0);
    file_atomic_abort(af);
    char *data = slurp(p);
    cr_assert_str_eq(data, "keep");
    cr_assert_eq(file_atomic_cleanup(p), 0, "abort left a temporary behind");
    free(data);
    harness_rmtree(dir);
    free(p);
    free(dir);
}

/* A real crash between write and rename: the child writes the new content,
 * syncs nothing, and is killed by SIGKILL before commit. */
Test(file, crash_between_write_and_rename_keeps_old_content) {
    char *dir = harness_tmpdir("crash"), *p = path_in(dir, "state"), err[ERR_LEN];
    cr_assert_eq(file_write_atomic(p, "version 1", 9, 0644, err), 0);
    pid_t pid = fork();
    cr_assert_geq(pid, 0);
    if (pid == 0) {
        AtomicFile *af = file_atomic_open(p, 0644, err);
        if (af == NULL || file_atomic_write(af, "version 2, half", 15, err) != 0) _exit(3);
        raise(SIGKILL);
        _exit(4);
    }
    int st;
    cr_assert_eq(waitpid(pid, &st, 0), pid);
    cr_assert(WIFSIGNALED(st) && WTERMSIG(st) == SIGKILL, "child did not die by SIGKILL");
    char *data = slurp(p);
    cr_assert_str_eq(data, "version 1");
    cr_assert_eq(file_atomic_cleanup(p), 1, "the crashed writer's temporary should be found");
    cr_assert_eq(file_atomic_cleanup(p), 0);
    free(data);
    harness_rmtree(dir);
    free(p);
    free(dir);
}

/* A writer replacing a 1 MiB file in a loop, killed at random instants: every
 * time, the file is one whole generation (all bytes equal), never a mix. */
Test(file, random_kills_never_tear_a_file, .timeout = 120) {
    enum { SIZE = 1 << 20, KILLS = 25 };
    char *dir = harness_tmpdir("kills"), *p = path_in(dir, "blob"), err[ERR_LEN];
    char *buf = malloc(SIZE);
    memset(buf, 0, SIZE);
    cr_assert_eq(file_write_atomic(p, buf, SIZE, 0644, err), 0);
    srand(12345);
    int changed = 0;
    for (int k = 0; k < KILLS; k++) {
        pid_t pid = fork();
        cr_assert_geq(pid, 0);
        if (pid == 0) {
            for (unsigned gen = (unsigned)k * 1000 + 1;; gen++) {
                memset(buf, (int)(gen & 0xff) | 1, SIZE);
                AtomicFile *af = file_atomic_open(p, 0644, err);
                if (af == NULL) _exit(3);
                /* in pieces, so a kill can land between two writes */
                for (size_t off = 0; off < SIZE; off += SIZE / 8)
                    if (file_atomic_write(af, buf + off, SIZE / 8, err) != 0) _exit(3);
                if (file_atomic_commit(af, err) != 0) _exit(3);
            }
        }
        struct timespec ts = {0, (long)(rand() % 40 + 1) * 1000000L};
        nanosleep(&ts, NULL);
        kill(pid, SIGKILL);
        int st;
        waitpid(pid, &st, 0);
        cr_assert(WIFSIGNALED(st), "writer exited on its own (status %d)", st);
        char *data;
        size_t len;
        cr_assert_eq(file_read_all(p, SIZE * 2, &data, &len, err), 0, "%s", err);
        cr_assert_eq(len, SIZE, "torn file: %zu bytes", len);
        for (size_t i = 1; i < len; i++)
            cr_assert_eq(data[i], data[0], "torn file at byte %zu after kill %d", i, k);
        changed += data[0] != 0;
        free(data);
        file_atomic_cleanup(p);
    }
    cr_assert_gt(changed, 0, "the writer never committed; the test proved nothing");
    free(buf);
    harness_rmtree(dir);
    free(p);
    free(dir);
}

Test(file, read_all_refuses_files_over_the_limit) {
    char *dir = harness_tmpdir("read"), *p = path_in(dir, "f"), err[ERR_LEN], *data;
    cr_assert_eq(file_write_atomic(p, "0123456789", 10, 0644, err), 0);
    cr_assert_eq(file_read_all(p, 9, &data, NULL, err), -1);
    cr_assert_not_null(strstr(err, "more than the 9 allowed"), "%s", err);
    size_t len;
    cr_assert_eq(file_read_all(p, 10, &data, &len, err), 0);
    cr_assert_eq(len, 10);
    cr_assert_eq(data[10], '\0');
    free(data);
    cr_assert_eq(file_read_all("/nonexistent/x", 10, &data, NULL, err), -1);
    cr_assert_not_null(strstr(err, "No such file"), "%s", err);
    harness_rmtree(dir);
    free(p);
    free(dir);
}

Test(file, mkdir_p_creates_nested_folders) {
    char *dir = harness_tmpdir("mkdir"), *p = path_in(dir, "a/b/c"), err[ERR_LEN];
    cr_assert_eq(file_mkdir_p(p, 0700, err), 0, "%s", err);
    cr_assert_eq(file_mkdir_p(p, 0700, err), 0, "not idempotent: %s", err);
    struct stat st;
    cr_assert_eq(stat(p, &st), 0);
    cr_assert(S_ISDIR(st.st_mode));
    char *f = path_in(dir, "file");
    cr_assert_eq(file_write_atomic(f, "x", 1, 0644, err), 0);
    cr_assert_eq(file_mkdir_p(f, 0700, err), -1, "a file is not a folder");
    harness_rmtree(dir);
    free(f);
    free(p);
    free(dir);
}

/* ---- JSON -------------------------------------------------------------- */

Test(json, emit_line_is_one_compact_ordered_line) {
    char *buf = NULL;
    size_t len = 0;
    FILE *mem = open_memstream(&buf, &len);
    json_t *o = json_object();
    json_object_set_new(o, "bench", json_string("x"));
    json_object_set_new(o, "a", json_integer(1));
    json_object_set_new(o, "r", json_real(0.5));
    cr_assert_eq(json_emit_line(mem, o), 0);
    fclose(mem);
    cr_assert_str_eq(buf, "{\"bench\":\"x\",\"a\":1,\"r\":0.5}\n");
    free(buf);
}

/* ---- configuration ----------------------------------------------------- */

static const char *sample_ini = "; a federation\n"
                                "[federation]\n"
                                "name = demo\n"
                                "rounds = 40\n"
                                "deadline = 90s\n"
                                "outer_lr = 0.7\n"
                                "robust = yes\n"
                                "[site]\n"
                                "name = other\n";

Test(config, typed_getters_read_values_and_defaults) {
    char err[ERR_LEN];
    Config *cfg = config_parse_string(sample_ini, "federation.ini", err);
    cr_assert_not_null(cfg, "%s", err);
    cr_assert_str_eq(config_get_str(cfg, "federation", "name", "x"), "demo");
    cr_assert_str_eq(config_get_str(cfg, "site", "name", "x"), "other");
    cr_assert_str_eq(config_get_str(cfg, "federation", "absent", "dflt"), "dflt");
    int64_t i;
    cr_assert_eq(config_get_int(cfg, "federation", "rounds", 1, 1, 1000, &i, err), 0);
    cr_assert_eq(i, 40);
    cr_assert_eq(config_get_int(cfg, "federation", "min_sites", 2, 1, 1000, &i, err), 0);
    cr_assert_eq(i, 2);
    double d;
    cr_assert_eq(config_get_double(cfg, "federation", "outer_lr", 1.0, &d, err), 0);
    cr_assert_float_eq(d, 0.7, 1e-12);
    int b;
    cr_assert_eq(config_get_bool(cfg, "federation", "robust", 0, &b, err), 0);
    cr_assert_eq(b, 1);
    int64_t ms;
    cr_assert_eq(config_get_duration_ms(cfg, "federation", "deadline", 0, &ms, err), 0);
    cr_assert_eq(ms, 90000);
    config_free(cfg);
}

Test(config, malformed_values_name_file_section_and_key) {
    char err[ERR_LEN];
    Config *cfg = config_parse_string("[f]\nn = 12x\nr = 5000\nb = maybe\nd = 3 weeks\nx = nan\n",
                                      "f.ini", err);
    cr_assert_not_null(cfg, "%s", err);
    int64_t i;
    cr_assert_eq(config_get_int(cfg, "f", "n", 0, 0, 100, &i, err), -1);
    cr_assert_str_eq(err, "f.ini: [f] n = '12x' is not an integer");
    cr_assert_eq(config_get_int(cfg, "f", "r", 0, 0, 100, &i, err), -1);
    cr_assert_not_null(strstr(err, "out of range; use 0 to 100"), "%s", err);
    int b;
    cr_assert_eq(config_get_bool(cfg, "f", "b", 0, &b, err), -1);
    int64_t ms;
    cr_assert_eq(config_get_duration_ms(cfg, "f", "d", 0, &ms, err), -1);
    cr_assert_not_null(strstr(err, "f.ini: [f] d:"), "%s", err);
    double d;
    cr_assert_eq(config_get_double(cfg, "f", "x", 0, &d, err), -1);
    config_free(cfg);
}

Test(config, syntax_errors_and_duplicates_are_refused_with_line) {
    char err[ERR_LEN];
    cr_assert_null(config_parse_string("[a]\nk = 1\nthis is not ini\n", "x.ini", err));
    cr_assert_str_eq(err, "x.ini:3: not a valid INI line; expected 'key = value' or '[section]'");
    cr_assert_null(config_parse_string("[a]\nk = 1\nk = 2\n", "x.ini", err));
    cr_assert_not_null(strstr(err, "'k' appears twice in section [a]"), "%s", err);
    cr_assert_null(config_load("/nonexistent.ini", err));
    cr_assert_not_null(strstr(err, "cannot open /nonexistent.ini"), "%s", err);
}

Test(config, unknown_keys_are_reported) {
    char err[ERR_LEN];
    Config *cfg = config_parse_string("[f]\nrounds = 1\nrouns = 2\n", "f.ini", err);
    cr_assert_not_null(cfg);
    const char *known[] = {"rounds", "name", NULL};
    cr_assert_eq(config_check_keys(cfg, "f", known, err), -1);
    cr_assert_str_eq(err, "f.ini: unknown key 'rouns' in section [f]; check its spelling");
    const char *all[] = {"rounds", "rouns", NULL};
    cr_assert_eq(config_check_keys(cfg, "f", all, err), 0);
    config_free(cfg);
}

/* ---- progress bar ------------------------------------------------------ */

Test(progress, draws_nothing_when_not_a_terminal) {
    char *buf = NULL;
    size_t len = 0;
    FILE *mem = open_memstream(&buf, &len);
    ProgressBar pb;
    progress_init(&pb, mem, "train", 100);
    cr_assert_eq(pb.enabled, 0);
    progress_update(&pb, 50, "loss 2.1");
    progress_finish(&pb, 100, "done");
    fclose(mem);
    cr_assert_eq(len, 0, "drew on a non-terminal: '%s'", buf);
    free(buf);
}

Test(progress, draws_in_place_on_a_terminal) {
    int master, slave;
    cr_assert_eq(openpty(&master, &slave, NULL, NULL, NULL), 0);
    FILE *tty = fdopen(slave, "w");
    cr_assert_not_null(tty);
    ProgressBar pb;
    progress_init(&pb, tty, "train", 200);
    cr_assert_eq(pb.enabled, 1);
    progress_update(&pb, 50, "loss 2.1");
    progress_update(&pb, 60, "throttled away"); /* within 100 ms of the last draw */
    progress_finish(&pb, 200, "done");
    fclose(tty);
    char out[1024];
    ssize_t n = 0, r;
    while (n < (ssize_t)sizeof out - 1 &&
           (r = read(master, out + n, sizeof out - 1 - (size_t)n)) > 0)
        n += r;
    out[n > 0 ? n : 0] = '\0';
    close(master);
    cr_assert_not_null(strstr(out, "\rtrain ["), "got: %s", out);
    cr_assert_not_null(strstr(out, " 25% 50/200 loss 2.1"), "got: %s", out);
    cr_assert_null(strstr(out, "throttled away"), "redraw was not throttled: %s", out);
    cr_assert_not_null(strstr(out, "100% 200/200 done"), "got: %s", out);
}

/* ---- processes ---- */

Test(proc, start_sends_both_streams_to_the_log_and_appends) {
    char *dir = harness_tmpdir("proc");
    char log[512];
    snprintf(log, sizeof log, "%s/child.log", dir);
    char *argv[] = {"/bin/sh", "-c", "echo out; echo err >&2; read x; echo \"in:$x\"", NULL};
    for (int k = 0; k < 2; k++) {
        int pid = proc_start(argv, &(ProcIo){.log = log});
        cr_assert_gt(pid, 0);
        cr_assert_eq(proc_wait(pid), 0);
    }
    char *text = NULL;
    size_t n = 0;
    char err[ERR_LEN];
    cr_assert_eq(file_read_all(log, 1 << 20, &text, &n, err), 0, "%s", err);
    /* stdin was /dev/null (read fails, $x empty); two runs, appended */
    cr_assert_str_eq(text, "out\nerr\nin:\nout\nerr\nin:\n");
    free(text);
    harness_rmtree(dir);
    free(dir);
}

Test(proc, start_pipes_stdin_stdout_and_stderr) {
    char *argv[] = {"/bin/sh", "-c", "read x; echo \"got $x\"; echo \"err $x\" >&2", NULL};
    int in = -1, out = -1, err = -1;
    int pid = proc_start(argv, &(ProcIo){.out_fd = &out, .err_fd = &err, .in_fd = &in});
    cr_assert_gt(pid, 0);
    cr_assert(in >= 0 && out >= 0 && err >= 0);
    cr_assert_eq(write(in, "hello\n", 6), 6);
    char line[64];
    cr_assert_gt(proc_read_line(out, line, sizeof line, 10000), 0);
    cr_assert_str_eq(line, "got hello");
    cr_assert_gt(proc_read_line(err, line, sizeof line, 10000), 0);
    cr_assert_str_eq(line, "err hello", "stderr went elsewhere: '%s'", line);
    cr_assert_eq(fcntl(err, F_GETFD) & FD_CLOEXEC, FD_CLOEXEC);
    close(err);
    cr_assert_eq(proc_wait(pid), 0);
    /* the pipe ends handed back do not leak into later children */
    cr_assert_eq(fcntl(in, F_GETFD) & FD_CLOEXEC, FD_CLOEXEC);
    cr_assert_eq(fcntl(out, F_GETFD) & FD_CLOEXEC, FD_CLOEXEC);
    close(in), close(out);
}

Test(proc, children_take_signals_this_process_blocks) {
    sigset_t term, old;
    sigemptyset(&term);
    sigaddset(&term, SIGTERM);
    sigprocmask(SIG_BLOCK, &term, &old);
    char *argv[] = {"/bin/sleep", "30", NULL};
    int pid = proc_start(argv, NULL);
    cr_assert_gt(pid, 0);
    int st;
    cr_assert_eq(proc_ended(pid, &st), 0, "sleep ended at once");
    /* SIGTERM ends it within the grace: its mask was not ours */
    cr_assert_eq(proc_stop(pid, 10000), 128 + SIGTERM);
    sigprocmask(SIG_SETMASK, &old, NULL);
}

Test(proc, exit_statuses_and_a_program_that_cannot_start) {
    char *fails[] = {"/bin/sh", "-c", "exit 3", NULL};
    int pid = proc_start(fails, NULL), st = -1;
    cr_assert_gt(pid, 0);
    for (int i = 0; i < 1000 && proc_ended(pid, &st) == 0; i++) usleep(10000);
    cr_assert_eq(st, 3);
    cr_assert_eq(proc_ended(pid, &st), -1, "reaped twice");
    cr_assert_eq(proc_wait(pid), -1);
    char *missing[] = {"/nonexistent/strait", NULL};
    pid = proc_start(missing, NULL);
    cr_assert_gt(pid, 0);
    cr_assert_eq(proc_wait(pid), 127);
    char *nsless[] = {"/bin/true", NULL};
    pid = proc_start(nsless, &(ProcIo){.netns = "/nonexistent/netns"});
    cr_assert_eq(proc_wait(pid), 126, "a namespace it cannot enter stops the child first");
}

/* TFRecord's checksum is CRC-32C: the check value of "123456789" (RFC 3720's
 * and every CRC catalogue's) and of nothing. */
Test(util, crc32c_gives_the_catalogue_check_values) {
    cr_assert_eq(events_crc32c("123456789", 9), 0xe3069283u);
    cr_assert_eq(events_crc32c("", 0), 0);
    uint8_t zeros[32] = {0};
    cr_assert_eq(events_crc32c(zeros, 32), 0x8a9136aau); /* RFC 3720 B.4 */
}
