/*
 * wan_bed.c — the WAN test bed's namespaces, links and processes
 * (wan_bed.h says what it makes). The bed is made with iproute2 and tc
 * from Debian's packages, run as real processes; the links are wan_relay.
 * No test framework here: the tests (tests/wan/) and bench/wan both use it.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <sched.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "tests/wan_bed.h"
#include "util/util.h"

#define IP        "/usr/sbin/ip"
#define TC        "/usr/sbin/tc"
#define NSENTER   "/usr/bin/nsenter"
#define NETNS_DIR "/var/run/netns"

/* Runs a command line (words split on spaces, none quoted); its exit
 * status, with its stderr's first line in why when it fails. */
static int run_line(char *why, size_t len, const char *fmt, ...) {
    char line[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(line, sizeof line, fmt, ap);
    va_end(ap);
    char *argv[48];
    int n = 0;
    for (char *save = NULL, *w = strtok_r(line, " ", &save); w && n < 47;
         w = strtok_r(NULL, " ", &save))
        argv[n++] = w;
    argv[n] = NULL;
    ProcResult r = proc_run(argv);
    int st = r.status;
    if (st != 0 && why) {
        char *nl = strchr(r.err, '\n');
        if (nl) *nl = 0;
        snprintf(why, len, "%s: %s", argv[0], r.err[0] ? r.err : "failed");
    }
    proc_result_free(&r);
    return st;
}

/* Kills what runs in a namespace and removes it. */
static void ns_remove(const char *ns) {
    char *argv[] = {IP, "netns", "pids", (char *)ns, NULL};
    ProcResult r = proc_run(argv);
    for (char *p = r.out; *p;) {
        long pid = strtol(p, &p, 10);
        if (pid > 1) kill((pid_t)pid, SIGKILL);
        while (*p == '\n' || *p == ' ') p++;
        if (pid <= 0 && *p) p++;
    }
    proc_result_free(&r);
    run_line(NULL, 0, IP " netns del %s", ns);
}

/* The namespaces of beds whose test process is gone (killed past its
 * timeout, say): removed before a new bed is made. */
static void remove_stale(void) {
    DIR *d = opendir(NETNS_DIR);
    if (d == NULL) return;
    char names[64][256];
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d)) != NULL && n < 64) {
        int pid = 0;
        if (sscanf(e->d_name, "swb%d", &pid) == 1 && pid > 0 && kill(pid, 0) != 0 && errno == ESRCH)
            snprintf(names[n++], sizeof names[0], "%s", e->d_name);
    }
    closedir(d);
    for (int i = 0; i < n; i++) ns_remove(names[i]);
}

static const char *relay_bin(void) {
    static char path[600];
    const char *build = getenv("STRAIT_BUILD");
    snprintf(path, sizeof path, "%s/tests/wan_relay", build ? build : "build");
    return path;
}

/* tbf on dev in ns at mbit: a bucket of 10 ms at the rate (never under
 * 16 KB, over any MTU here) and a queue of 250 ms. */
static int tbf(const char *ns, const char *dev, double mbit, char *why, size_t len) {
    if (mbit <= 0) return 0;
    long rate_bytes = (long)(mbit * 1e6 / 8);
    long burst = rate_bytes / 100 > 16384 ? rate_bytes / 100 : 16384;
    long limit = rate_bytes / 4 > 65536 ? rate_bytes / 4 : 65536;
    return run_line(why, len,
                    IP " netns exec %s " TC " qdisc add dev %s root tbf rate %ldbit "
                       "burst %ld limit %ld",
                    ns, dev, (long)(mbit * 1e6), burst, limit + burst);
}

/* Writes value to /proc/sys/<key> inside namespace ns (a child that
 * enters it: /proc/sys/net is the reader's namespace's). */
static int ns_sysctl(const char *ns, const char *key, const char *value, char *why, size_t len) {
    char path[128];
    snprintf(path, sizeof path, NETNS_DIR "/%s", ns);
    pid_t pid = fork();
    if (pid == 0) {
        char file[128];
        snprintf(file, sizeof file, "/proc/sys/%s", key);
        int nsfd = open(path, O_RDONLY | O_CLOEXEC);
        if (nsfd < 0 || setns(nsfd, CLONE_NEWNET) != 0) _exit(126);
        int fd = open(file, O_WRONLY | O_CLOEXEC);
        size_t n = strlen(value);
        _exit(fd >= 0 && write(fd, value, n) == (ssize_t)n ? 0 : 1);
    }
    int st = -1;
    if (pid < 0 || waitpid(pid, &st, 0) != pid || !WIFEXITED(st) || WEXITSTATUS(st) != 0) {
        snprintf(why, len, "cannot set %s in namespace %s", key, ns);
        return -1;
    }
    return 0;
}

/* TCP as on a host tuned for long fat links: buffers to 64 MiB each way,
 * bandwidth × RTT to 2.5 Gbit/s at 100 ms (a fresh namespace's send buffer
 * stops at 4 MiB: 208 Mbit/s of raw TCP at 100 ms, measured), and no
 * return to slow start after an idle spell (a site's connection idles
 * while it trains). */
static int tune_tcp(const char *ns, char *why, size_t len) {
    return ns_sysctl(ns, "net/ipv4/tcp_wmem", "4096 16384 67108864", why, len) ||
           ns_sysctl(ns, "net/ipv4/tcp_rmem", "4096 131072 67108864", why, len) ||
           ns_sysctl(ns, "net/ipv4/tcp_slow_start_after_idle", "0", why, len);
}

static int start_relay(Bed *b, int i, const BedLink *l, char *why, size_t len) {
    char dev[16], delay[32], jitter[32], loss[32], seed[16];
    snprintf(dev, sizeof dev, "sc%d", i);
    snprintf(delay, sizeof delay, "%d", l->delay_ms);
    snprintf(jitter, sizeof jitter, "%d", l->jitter_ms);
    snprintf(loss, sizeof loss, "%g", l->loss);
    snprintf(seed, sizeof seed, "%d", i + 1);
    char *argv[] = {
        (char *)relay_bin(), b->site_ns[i], "wan0",   b->coord_ns, dev,      "--delay", delay,
        "--jitter",          jitter,        "--loss", loss,        "--seed", seed,      NULL};
    int in = -1, out = -1;
    int pid = proc_start(argv, &(ProcIo){.out_fd = &out, .in_fd = &in});
    b->relay_pid[i] = pid, b->relay_in[i] = in, b->relay_out[i] = out;
    char line[64];
    if (pid < 0 || proc_read_line(out, line, sizeof line, 10000) <= 0 ||
        strcmp(line, "ready") != 0) {
        snprintf(why, len, "wan_relay for site %d did not start (TUN devices need /dev/net/tun)",
                 i);
        return -1;
    }
    return 0;
}

static int make_link(Bed *b, int i, const BedLink *l, char *why, size_t len) {
    if (start_relay(b, i, l, why, len) != 0) return -1;
    int x = i + 1;
    const char *s = b->site_ns[i], *c = b->coord_ns;
    if (run_line(why, len, IP " -n %s addr add 10.79.%d.2 peer 10.79.%d.1 dev wan0", s, x, x) ||
        run_line(why, len, IP " -n %s link set wan0 up", s) ||
        run_line(why, len, IP " -n %s route add " BED_COORD_HOST "/32 dev wan0 src 10.79.%d.2", s,
                 x) ||
        run_line(why, len, IP " -n %s addr add 10.79.%d.1 peer 10.79.%d.2 dev sc%d", c, x, x, i) ||
        run_line(why, len, IP " -n %s link set sc%d up", c, i))
        return -1;
    char dev[16];
    snprintf(dev, sizeof dev, "sc%d", i);
    int mtu = l->mtu > 0 ? l->mtu : 1500;
    if (mtu < 576 || mtu > 9000) {
        snprintf(why, len, "a link's mtu is 576 to 9000, not %d", mtu);
        return -1;
    }
    if (run_line(why, len, IP " -n %s link set wan0 mtu %d", s, mtu) ||
        run_line(why, len, IP " -n %s link set %s mtu %d", c, dev, mtu))
        return -1;
    if (tbf(s, "wan0", l->up_mbit, why, len) || tbf(c, dev, l->down_mbit, why, len)) return -1;
    return 0;
}

int bed_open(Bed *b, int n_sites, const BedLink *links, char *why, size_t len) {
    memset(b, 0, sizeof *b);
    for (int i = 0; i < BED_SITES_MAX; i++) b->relay_in[i] = b->relay_out[i] = -1;
    if (n_sites < 1 || n_sites > BED_SITES_MAX) {
        snprintf(why, len, "a bed has 1 to %d sites, not %d", BED_SITES_MAX, n_sites);
        return -1;
    }
    if (access(IP, X_OK) != 0 || access(TC, X_OK) != 0 || access(NSENTER, X_OK) != 0) {
        snprintf(why, len, "the WAN bed needs ip and tc (iproute2) and nsenter (util-linux)");
        return -1;
    }
    remove_stale();
    snprintf(b->coord_ns, sizeof b->coord_ns, "swb%dc", (int)getpid());
    if (run_line(why, len, IP " netns add %s", b->coord_ns) != 0) {
        size_t n = strlen(why);
        snprintf(why + n, len - n, " (network namespaces need CAP_NET_ADMIN: run as root)");
        b->coord_ns[0] = 0;
        return -1;
    }
    if (run_line(why, len, IP " -n %s link set lo up", b->coord_ns) ||
        tune_tcp(b->coord_ns, why, len) ||
        run_line(why, len, IP " -n %s addr add " BED_COORD_HOST "/32 dev lo", b->coord_ns))
        goto fail;
    for (int i = 0; i < n_sites; i++) {
        snprintf(b->site_ns[i], sizeof b->site_ns[i], "swb%ds%d", (int)getpid(), i);
        if (run_line(why, len, IP " netns add %s", b->site_ns[i]) != 0) {
            b->site_ns[i][0] = 0;
            goto fail;
        }
        b->n_sites = i + 1;
        if (run_line(why, len, IP " -n %s link set lo up", b->site_ns[i]) ||
            tune_tcp(b->site_ns[i], why, len) || make_link(b, i, &links[i], why, len) != 0)
            goto fail;
    }
    return 0;
fail:
    bed_close(b);
    return -1;
}

void bed_close(Bed *b) {
    for (int i = 0; i < BED_SITES_MAX; i++) {
        if (b->relay_in[i] >= 0) close(b->relay_in[i]); /* the relay ends with its input */
        if (b->relay_out[i] >= 0) close(b->relay_out[i]);
        b->relay_in[i] = b->relay_out[i] = -1;
        if (b->relay_pid[i] > 0) proc_stop(b->relay_pid[i], 2000);
        b->relay_pid[i] = 0;
    }
    for (int i = 0; i < b->n_sites; i++)
        if (b->site_ns[i][0]) ns_remove(b->site_ns[i]), b->site_ns[i][0] = 0;
    if (b->coord_ns[0]) ns_remove(b->coord_ns), b->coord_ns[0] = 0;
    b->n_sites = 0;
}

int bed_command(const Bed *b, int site, const char *fmt, ...) {
    if (site < 0 || site >= b->n_sites || b->relay_in[site] < 0) return -1;
    char line[256];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(line, sizeof line - 1, fmt, ap);
    va_end(ap);
    if (n <= 0 || n >= (int)sizeof line - 1) return -1;
    line[n++] = '\n';
    return write(b->relay_in[site], line, (size_t)n) == n ? 0 : -1;
}

int bed_stats(const Bed *b, int site, char *out, size_t len) {
    if (bed_command(b, site, "stats") != 0) return -1;
    return proc_read_line(b->relay_out[site], out, len, 5000) > 0 ? 0 : -1;
}

static const char *ns_of(const Bed *b, int where) {
    return where < 0 ? b->coord_ns : b->site_ns[where];
}

int bed_spawn(const Bed *b, int where, char *const argv[], const char *log, int *out_fd) {
    char path[128];
    snprintf(path, sizeof path, NETNS_DIR "/%s", ns_of(b, where));
    if (where < -1 || where >= b->n_sites) return -1;
    return proc_start(argv, &(ProcIo){.log = log, .out_fd = out_fd, .netns = path});
}

ProcResult bed_run(const Bed *b, int where, char *const argv[]) {
    char net[128];
    snprintf(net, sizeof net, "--net=" NETNS_DIR "/%s", ns_of(b, where));
    char *full[64] = {NSENTER, net};
    int n = 2;
    for (int i = 0; argv[i] && n < 63; i++) full[n++] = argv[i];
    full[n] = NULL;
    return proc_run(full);
}
