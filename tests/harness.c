/*
 * harness.c — the strait binary under test, background processes and
 * scratch folders for the tests (running a process to completion:
 * util/proc.c).
 */
#include <arpa/inet.h>
#include <fcntl.h>
#include <ftw.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include <criterion/criterion.h>
#include <jansson.h>

#include "harness.h"
#include "coordinator/coordinator.h"
#include "util/util.h"

int proc_spawn(char *const argv[], int *out_fd) {
    const char *log = getenv("STRAIT_TEST_VERBOSE") ? NULL : "/dev/null";
    int pid = proc_start(argv, &(ProcIo){.log = log, .out_fd = out_fd});
    cr_assert_gt(pid, 0, "cannot start %s", argv[0]);
    return pid;
}

ProcResult proc_run_strait(const char *first, ...) {
    char *argv[32] = {(char *)harness_strait_bin()};
    int n = 1;
    va_list ap;
    va_start(ap, first);
    for (const char *a = first; a && n < 31; a = va_arg(ap, const char *)) argv[n++] = (char *)a;
    va_end(ap);
    argv[n] = NULL;
    return proc_run(argv);
}

const char *harness_strait_bin(void) {
    const char *b = getenv("STRAIT_BIN");
    return b ? b : "build/strait";
}

const char *harness_strait_test_bin(void) {
    const char *b = getenv("STRAIT_TEST_BIN");
    cr_assert_not_null(b, "STRAIT_TEST_BIN (build/strait-test) is not set: run make test");
    return b;
}

void harness_use_test_build(int on) {
    static char saved[1024];
    static int using;
    if (on && !using) {
        const char *test_bin = harness_strait_test_bin();
        snprintf(saved, sizeof saved, "%s", harness_strait_bin());
        setenv("STRAIT_BIN", test_bin, 1);
        using = 1;
    } else if (!on && using) {
        setenv("STRAIT_BIN", saved, 1);
        using = 0;
    }
}

char *harness_tmpdir(const char *tag) {
    char *path = NULL;
    cr_assert_gt(asprintf(&path, "/tmp/strait-test-%s-XXXXXX", tag), 0);
    cr_assert_not_null(mkdtemp(path), "mkdtemp %s", path);
    return path;
}

static int rm_one(const char *p, const struct stat *sb, int flag, struct FTW *ftw) {
    (void)sb, (void)flag, (void)ftw;
    return remove(p);
}

void harness_rmtree(const char *path) {
    nftw(path, rm_one, 16, FTW_DEPTH | FTW_PHYS);
}

int harness_count_lines(const char *s) {
    int n = 0;
    for (; *s; s++) n += *s == '\n';
    return n;
}

int harness_start_coordinator(const char *fed, char *addr) {
    char *argv[] = {(char *)harness_strait_bin(), "coordinator", "start", (char *)fed, NULL};
    /* its stderr beside its folder, for the reason when it does not start */
    char log[1100];
    snprintf(log, sizeof log, "%s.stderr", fed);
    int fd;
    int pid = proc_start(
        argv, &(ProcIo){.log = getenv("STRAIT_TEST_VERBOSE") ? NULL : log, .out_fd = &fd});
    cr_assert_gt(pid, 0, "cannot start %s", argv[0]);
    char line[256];
    /* a large model (gpt2-large: 3 GB) takes most of a minute to load and
     * hash before the coordinator listens; one that fails ends the line */
    int got = proc_read_line(fd, line, sizeof line, 300000);
    close(fd);
    const char *p = got > 0 ? strstr(line, "port ") : NULL;
    if (p == NULL) {
        proc_stop(pid, 5000);
        char last[512] = "";
        FILE *f = fopen(log, "r");
        for (char buf[512]; f && fgets(buf, sizeof buf, f);)
            if (buf[0] != '\n') snprintf(last, sizeof last, "%s", buf);
        if (f) fclose(f);
        last[strcspn(last, "\n")] = 0;
        fprintf(stderr, "coordinator %s did not start: %s\n", fed,
                last[0]                         ? last
                : getenv("STRAIT_TEST_VERBOSE") ? "(its stderr is above)"
                                                : "(it wrote nothing to stderr)");
        return -1;
    }
    snprintf(addr, 64, "127.0.0.1:%d", atoi(p + 5));
    return pid;
}

void harness_enroll_join(const char *fed, const char *addr, const char *name, const char *dir) {
    ProcResult r = harness_strait("site", "enroll", fed, name);
    cr_assert_eq(r.status, 0, "enroll %s: %s", name, r.err);
    /* the token on the line after the first; the fingerprint after its flag */
    const char *nl = strchr(r.out, '\n'), *ca = strstr(r.out, "--ca-sha256 ");
    cr_assert(nl && strlen(nl + 1) >= 64 && ca && strlen(ca + 12) >= 64,
              "enroll %s printed no token and fingerprint: %s", name, r.out);
    char token[65], fp[65];
    memcpy(token, nl + 1, 64), token[64] = 0;
    memcpy(fp, ca + 12, 64), fp[64] = 0;
    proc_result_free(&r);
    char join[300], err[ERR_LEN];
    cr_assert_eq(coordinator_join_address(fed, join, sizeof join, err), 0, "%s", err);
    r = harness_strait("site", "join", dir, "--name", name, "--coordinator", addr, "--join", join,
                       "--token", token, "--ca-sha256", fp);
    cr_assert_eq(r.status, 0, "join %s: %s", name, r.err);
    proc_result_free(&r);
}

/* The low end of the kernel's ephemeral range (32768 where it says none). */
static int ephemeral_low(void) {
    int lo = 32768, hi;
    FILE *f = fopen("/proc/sys/net/ipv4/ip_local_port_range", "r");
    if (f) {
        if (fscanf(f, "%d %d", &lo, &hi) != 2) lo = 32768;
        fclose(f);
    }
    return lo;
}

int harness_free_port(void) {
    int lo = 10000, hi = ephemeral_low();
    cr_assert_gt(hi, lo + 1000, "ip_local_port_range starts at %d: no room below it", hi);
    /* each test process starts its walk at its own place */
    uint64_t x = (uint64_t)getpid() * 0x9E3779B97F4A7C15ull ^ time_monotonic_ns();
    for (int tries = 0; tries < 200; tries++) {
        x ^= x << 13, x ^= x >> 7, x ^= x << 17;
        int port = lo + (int)(x % (uint64_t)(hi - lo));
        int fd = socket(AF_INET, SOCK_STREAM, 0);
        cr_assert_geq(fd, 0);
        struct sockaddr_in a = {0};
        a.sin_family = AF_INET;
        a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
        a.sin_port = htons((uint16_t)port);
        int ok = bind(fd, (struct sockaddr *)&a, sizeof a) == 0;
        close(fd);
        if (ok) return port;
    }
    cr_assert_fail("no free port below %d on 127.0.0.1 in 200 tries", hi);
    return -1;
}

const char *harness_listen(void) {
    static char addr[64];
    snprintf(addr, sizeof addr, "127.0.0.1:%d", harness_free_port());
    return addr;
}

void harness_ini_set(const char *path, const char *section, const char *key, const char *value) {
    char err[ERR_LEN];
    cr_assert_eq(config_file_set(path, section, key, value, err), 0, "%s", err);
}

json_t *harness_tensorboard(const char *dir) {
    const char *py = getenv("STRAIT_PYTHON"), *src = getenv("STRAIT_SRC");
    cr_assert(py && src, "make test sets STRAIT_PYTHON and STRAIT_SRC");
    char script[700];
    snprintf(script, sizeof script, "%s/tests/python/check_tensorboard.py", src);
    ProcResult r = proc_run((char *[]){(char *)py, script, (char *)dir, NULL});
    cr_assert_eq(r.status, 0, "TensorBoard's reader: %s", r.err);
    json_error_t e;
    json_t *o = json_loads(r.out, 0, &e);
    cr_assert_not_null(o, "TensorBoard's reader printed no JSON (%s): %.200s", e.text, r.out);
    proc_result_free(&r);
    return o;
}

double harness_scalar(json_t *tb, const char *tag, int64_t step) {
    char key[24];
    snprintf(key, sizeof key, "%lld", (long long)step);
    json_t *v = json_object_get(json_object_get(tb, tag), key);
    cr_assert_not_null(v, "no %s at step %lld", tag, (long long)step);
    return json_number_value(v);
}
