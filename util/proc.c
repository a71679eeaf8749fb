/*
 * proc.c — running other programs: to completion with stdout and stderr
 * captured (read with poll, so neither pipe can fill and block the child),
 * in the background with their streams to a log, a pipe or a network
 * namespace (proc_start), a line from a child's pipe within a time, and a
 * stop that escalates from SIGTERM to SIGKILL. The one place Strait starts
 * a program: for `strait demo`, the tests, the WAN bed and the benchmarks.
 * Also what the machine has left: its available memory; and the vector
 * state a library left dirty, cleared.
 */
#include <errno.h>
#include <fcntl.h>
#include <sched.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include "util.h"

static int status_of(int st) {
    return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}

static int append(char **buf, size_t *len, const char *data, size_t n) {
    char *grown = realloc(*buf, *len + n + 1);
    if (grown == NULL) return -1;
    *buf = grown;
    memcpy(*buf + *len, data, n);
    *len += n;
    (*buf)[*len] = '\0';
    return 0;
}

ProcResult proc_run(char *const argv[]) {
    ProcResult r = {-1, NULL, NULL};
    size_t olen = 0, elen = 0;
    int out = -1, err = -1, pid = -1;
    if (append(&r.out, &olen, "", 0) == 0 && append(&r.err, &elen, "", 0) == 0)
        pid = proc_start(argv, &(ProcIo){.out_fd = &out, .err_fd = &err});
    if (pid < 0) return r;
    struct pollfd fds[2] = {{out, POLLIN, 0}, {err, POLLIN, 0}};
    for (int open_fds = 2; open_fds > 0;) {
        if (poll(fds, 2, -1) < 0) continue;
        for (int i = 0; i < 2; i++) {
            if (fds[i].fd < 0 || !(fds[i].revents & (POLLIN | POLLHUP | POLLERR))) continue;
            char chunk[4096];
            ssize_t n = read(fds[i].fd, chunk, sizeof chunk);
            if (n <= 0) {
                close(fds[i].fd);
                fds[i].fd = -1;
                open_fds--;
            } else {
                append(i == 0 ? &r.out : &r.err, i == 0 ? &olen : &elen, chunk, (size_t)n);
            }
        }
    }
    r.status = proc_wait(pid);
    return r;
}

void proc_result_free(ProcResult *r) {
    free(r->out);
    free(r->err);
    r->out = r->err = NULL;
}

int proc_read_line(int fd, char *buf, size_t size, int timeout_ms) {
    size_t n = 0;
    while (n + 1 < size) {
        struct pollfd p = {fd, POLLIN, 0};
        if (poll(&p, 1, timeout_ms) <= 0) return -1;
        ssize_t r = read(fd, buf + n, 1);
        if (r <= 0) return -1;
        if (buf[n] == '\n') break;
        n++;
    }
    buf[n] = '\0';
    return (int)n;
}

int proc_stop(int pid, int grace_ms) {
    kill(pid, SIGTERM);
    int st;
    for (int waited = 0; waited < grace_ms; waited += 10) {
        if (waitpid(pid, &st, WNOHANG) == pid) return status_of(st);
        usleep(10000);
    }
    kill(pid, SIGKILL);
    waitpid(pid, &st, 0);
    return 128 + SIGKILL;
}

int proc_wait(int pid) {
    int st;
    while (waitpid(pid, &st, 0) != pid)
        if (errno != EINTR) return -1;
    return status_of(st);
}

int proc_ended(int pid, int *status) {
    int st;
    pid_t r = waitpid(pid, &st, WNOHANG);
    if (r == 0) return 0;
    if (r != pid) return -1;
    *status = status_of(st);
    return 1;
}

/* In the child, before exec: only async-signal-safe calls. p: the pipes
 * for stdin, stdout and stderr, those io asks for. */
static void child(char *const argv[], const ProcIo *io, int p[3][2]) {
    sigset_t none;
    sigemptyset(&none);
    sigprocmask(SIG_SETMASK, &none, NULL);
    if (io->netns) {
        int nsfd = open(io->netns, O_RDONLY | O_CLOEXEC);
        if (nsfd < 0 || setns(nsfd, CLONE_NEWNET) != 0) _exit(126);
    }
    int null = open("/dev/null", O_RDONLY);
    int log = io->log ? open(io->log, O_WRONLY | O_CREAT | O_APPEND, 0600) : -1;
    if (null < 0 || (io->log && log < 0)) _exit(126);
    dup2(io->in_fd ? p[0][0] : null, 0);
    if (io->out_fd || log >= 0) dup2(io->out_fd ? p[1][1] : log, 1);
    if (io->err_fd || log >= 0) dup2(io->err_fd ? p[2][1] : log, 2);
    execv(argv[0], argv);
    static const char msg[] = "exec failed: ";
    ssize_t ignored =
        write(2, msg, sizeof msg - 1) + write(2, argv[0], strlen(argv[0])) + write(2, "\n", 1);
    (void)ignored;
    _exit(127);
}

int proc_start(char *const argv[], const ProcIo *io) {
    static const ProcIo none;
    if (io == NULL) io = &none;
    int p[3][2] = {{-1, -1}, {-1, -1}, {-1, -1}};
    int *want[3] = {io->in_fd, io->out_fd, io->err_fd};
    for (int i = 0; i < 3; i++)
        if (want[i] && pipe2(p[i], O_CLOEXEC) != 0) goto fail;
    pid_t pid = fork();
    if (pid < 0) goto fail;
    if (pid == 0) child(argv, io, p);
    /* the parent keeps stdin's write end and the others' read ends */
    for (int i = 0; i < 3; i++)
        if (want[i]) close(p[i][i == 0 ? 0 : 1]), *want[i] = p[i][i == 0 ? 1 : 0];
    return pid;
fail:
    for (int i = 0; i < 3; i++)
        for (int k = 0; k < 2; k++)
            if (p[i][k] >= 0) close(p[i][k]);
    return -1;
}

double mem_available(void) {
    FILE *f = fopen("/proc/meminfo", "r");
    char line[256];
    double kb = 0;
    while (f && fgets(line, sizeof line, f))
        if (sscanf(line, "MemAvailable: %lf kB", &kb) == 1) break;
    if (f) fclose(f);
    if (kb > 0) return kb * 1024;
    long pages = sysconf(_SC_AVPHYS_PAGES), page = sysconf(_SC_PAGESIZE);
    return pages > 0 && page > 0 ? (double)pages * page : 0;
}

void mem_prefer_huge_pages(void *p, size_t bytes) {
    const uintptr_t huge = (uintptr_t)2 << 20;
    uintptr_t lo = ((uintptr_t)p + huge - 1) & ~(huge - 1),
              hi = ((uintptr_t)p + bytes) & ~(huge - 1);
    if (p != NULL && hi > lo) (void)madvise((void *)lo, hi - lo, MADV_HUGEPAGE);
}

#if defined(__x86_64__)
#include <immintrin.h>
__attribute__((target("avx"))) static void upper_clear_avx(void) {
    _mm256_zeroupper();
}
#endif

void cpu_upper_clear(void) {
#if defined(__x86_64__)
    if (__builtin_cpu_supports("avx")) upper_clear_avx();
#endif
}
