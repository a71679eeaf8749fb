/*
 * guard.c — what a peer may hold of the coordinator's connections before
 * it has shown a certificate. A connection is *pending* from its accept
 * until a call with a verified certificate comes on it (then *vouched*):
 * at most per_addr pending from one address and total − reserve pending in
 * all, so the reserve is kept for connections that presented a
 * certificate, whatever address they came from; and at most
 * trusted_per_addr connections of any kind from one address (a NAT of
 * sites). A connection over a cap makes room by resetting the oldest
 * pending connection of its own address (of the address with the most
 * pending, for the caps in all) that has had EVICT_MIN_MS to finish its
 * handshake, or is closed the moment it is accepted, before TLS costs
 * anything. So a neighbour holding an address's pending slots delays a
 * site's reconnect by a reset, never for as long as it keeps them: its
 * own connections are the ones that give way. Refusals, resets and
 * evictions are logged, once per LOG_EVERY_MS with their counts.
 *
 * gRPC core 1.51 owns its listening socket and has no such limit, and on
 * EMFILE its listener gives up for good ("Failed accept4: Too many open
 * files", and no connection is accepted again). So this file defines
 * accept4 itself: the program's definition is the one libgrpc binds to
 * (the executable comes first in symbol lookup), and it calls the kernel
 * directly. Out of descriptors, it frees a spare one, accepts and closes
 * the connection it cannot serve, and takes the spare back, so gRPC never
 * sees EMFILE and the listener keeps listening. Without net_guard_set,
 * accept4 is the kernel's, counted but never refused.
 *
 * A connection must earn its keep: until a call with a verified
 * certificate arrives on it, the bytes its peer sends are counted (the
 * reads gRPC makes through recvmsg, which this file also defines), and
 * past unauth_bytes on one connection, or unauth_total on all of them
 * together, the connection is reset — at once when its address is not
 * trusted, and UNVOUCHED_MS after it went over when it is (a site whose
 * first call on a new connection is an upload: the dispatcher vouches for
 * the connection as soon as the call's headers are in, while its data
 * keeps coming; a watchdog thread resets the ones that stay unvouched).
 * gRPC core 1.51 applies its limit of
 * streams per connection only once the peer has acknowledged the SETTINGS
 * that carry it, so a peer that never does opens as many streams as it
 * sends HEADERS (about 11 KB of the server's memory for 80 bytes of its
 * own); a Join, the only call without a certificate, sends a few KB.
 *
 * Connections are counted by descriptor: one accepted is recorded with its
 * inode, and a sweep (whenever a cap would refuse one, and at most every
 * 100 ms while near a cap) lets go of descriptors that were closed or now
 * name something else. Thread-safe (one mutex; accept4 runs on gRPC's
 * poller threads).
 */

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "net_internal.h"
#include "util/util.h"

#define GUARD_ADDRS   4096 /* addresses with connections at once */
#define GUARD_TRUSTED 1024 /* addresses trusted at once */
#define TRUST_MS      (3600 * 1000LL)
/* how long a trusted address's connection over its budget waits for a call */
#define UNVOUCHED_MS 100
/* a pending connection younger than this is never evicted: a TLS handshake
 * and the first call take a few round trips */
#define EVICT_MIN_MS 1000
#define LOG_EVERY_MS 10000

typedef struct Addr {
    uint8_t ip[16]; /* IPv4 as ::ffff:a.b.c.d */
    int used;
} Addr;

typedef struct Conn { /* per descriptor */
    ino_t ino;
    int addr;      /* index into counts + 1; 0: not tracked */
    int port;      /* the peer's */
    int vouched;   /* a call with a verified certificate came on it: no byte budget */
    int denied;    /* its certificate was refused for good: budgeted as an untrusted address's */
    uint64_t cert; /* the certificate a call came on it with: its fingerprint's first 64 bits */
    int64_t accepted_ms;
    int64_t received; /* bytes read from it while not vouched for */
    int64_t over_ms;  /* when it went over its budget (a trusted address's); 0: not */
    int64_t in_total; /* of received, what counts in unauth_received (an untrusted address's) */
} Conn;

static struct {
    pthread_mutex_t lock;
    int on;
    NetGuardLimits lim;
    Conn *conns;
    int n_conns_cap; /* conns has this many slots (the descriptor limit) */
    int max_fd;      /* highest tracked descriptor */
    Addr addrs[GUARD_ADDRS];
    int count[GUARD_ADDRS];           /* connections from the address */
    int pending[GUARD_ADDRS];         /* of which not vouched for */
    int64_t unauth_addr[GUARD_ADDRS]; /* what its untrusted connections count in unauth_received */
    int total, n_pending;
    int64_t unauth_received; /* of every connection open and not vouched for */
    struct {
        uint8_t ip[16];
        int64_t until_ms;
    } trusted[GUARD_TRUSTED];
    int spare; /* a descriptor kept for accepting while out of them */
    int64_t last_sweep_ms, last_log_ms;
    NetGuardStats st, logged; /* logged: the counts the last log line covered */
    int64_t last_guard_log_ms;
    uint8_t last_ip[16]; /* the address of the latest refusal, reset or eviction */
} G = {.lock = PTHREAD_MUTEX_INITIALIZER, .spare = -1};

static int64_t now_ms(void) {
    return (int64_t)(time_monotonic_ns() / 1000000);
}

static void to_ip16(const struct sockaddr *sa, uint8_t ip[16]) {
    memset(ip, 0, 16);
    if (sa->sa_family == AF_INET) {
        ip[10] = ip[11] = 0xff;
        memcpy(ip + 12, &((const struct sockaddr_in *)sa)->sin_addr, 4);
    } else if (sa->sa_family == AF_INET6) {
        memcpy(ip, &((const struct sockaddr_in6 *)sa)->sin6_addr, 16);
    }
}

static int ip_from_text(const char *text, uint8_t ip[16]) {
    struct in_addr a4;
    struct in6_addr a6;
    memset(ip, 0, 16);
    if (inet_pton(AF_INET, text, &a4) == 1) {
        ip[10] = ip[11] = 0xff;
        memcpy(ip + 12, &a4, 4);
        return 0;
    }
    if (inet_pton(AF_INET6, text, &a6) == 1) {
        memcpy(ip, &a6, 16);
        return 0;
    }
    return -1;
}

/* The slot of ip in the table, made when make; -1 when absent (or full).
 * A plain scan: the table is small and this runs once per connection. */
static int addr_slot(const uint8_t ip[16], int make) {
    int free_slot = -1;
    for (int i = 0; i < GUARD_ADDRS; i++) {
        if (G.addrs[i].used && memcmp(G.addrs[i].ip, ip, 16) == 0) return i;
        if (!G.addrs[i].used && free_slot < 0) free_slot = i;
    }
    if (!make || free_slot < 0) return -1;
    memcpy(G.addrs[free_slot].ip, ip, 16);
    G.addrs[free_slot].used = 1;
    G.count[free_slot] = G.pending[free_slot] = 0;
    G.unauth_addr[free_slot] = 0;
    return free_slot;
}

static int is_trusted(const uint8_t ip[16], int64_t now) {
    for (int i = 0; i < GUARD_TRUSTED; i++)
        if (G.trusted[i].until_ms > now && memcmp(G.trusted[i].ip, ip, 16) == 0) return 1;
    return 0;
}

static void untrack(int fd) {
    Conn *c = &G.conns[fd];
    if (c->addr == 0) return;
    int i = c->addr - 1;
    G.unauth_received -= c->in_total;
    G.unauth_addr[i] -= c->in_total;
    G.count[i]--;
    G.total--;
    if (!c->vouched) G.pending[i]--, G.n_pending--;
    if (G.count[i] == 0) G.addrs[i].used = 0;
    c->addr = 0;
    c->vouched = 0, c->denied = 0, c->cert = 0, c->received = 0, c->port = 0, c->over_ms = 0,
    c->in_total = 0;
}

/* Whether tracked descriptor fd is still the connection recorded there;
 * one closed (or reused for something else) since is let go. */
static int conn_live(int fd) {
    struct stat sb;
    if (fstat(fd, &sb) == 0 && S_ISSOCK(sb.st_mode) && sb.st_ino == G.conns[fd].ino) return 1;
    untrack(fd);
    return 0;
}

/* Ends a tracked connection now: gRPC sees the reset and closes it. */
static void reset_conn(int fd) {
    memcpy(G.last_ip, G.addrs[G.conns[fd].addr - 1].ip, 16);
    untrack(fd);
    shutdown(fd, SHUT_RDWR);
}

/* The oldest pending connection of address slot `a` (-1: of the address
 * with the most pending) accepted before `before`; -1 if none. */
static int oldest_pending(int a, int64_t before) {
    if (a < 0) {
        for (int i = 0, most = 0; i < GUARD_ADDRS; i++)
            if (G.addrs[i].used && G.pending[i] > most) most = G.pending[i], a = i;
        if (a < 0) return -1;
    }
    int victim = -1;
    for (int fd = 0; fd <= G.max_fd && fd < G.n_conns_cap; fd++) {
        const Conn *c = &G.conns[fd];
        if (c->addr != a + 1 || c->vouched || c->accepted_ms > before) continue;
        if (!conn_live(fd)) continue; /* never a descriptor that is someone else's now */
        if (victim < 0 || c->accepted_ms < G.conns[victim].accepted_ms) victim = fd;
    }
    return victim;
}

/* Lets go of descriptors closed (or reused for something else) since. */
static void sweep(void) {
    struct stat sb;
    int top = -1;
    for (int fd = 0; fd <= G.max_fd && fd < G.n_conns_cap; fd++) {
        if (G.conns[fd].addr == 0) continue;
        if (fstat(fd, &sb) != 0 || !S_ISSOCK(sb.st_mode) || sb.st_ino != G.conns[fd].ino)
            untrack(fd);
        else
            top = fd;
    }
    G.max_fd = top;
    G.last_sweep_ms = now_ms();
}

/* Which cap a new connection from address slot `slot` is over; under
 * G.lock. 0: none; 1: its address's; 2: the caps in all. */
static int over_cap(int slot) {
    int here = slot >= 0 ? G.count[slot] : 0, pending = slot >= 0 ? G.pending[slot] : 0;
    if (here >= G.lim.trusted_per_addr || pending >= G.lim.per_addr) return 1;
    if (G.n_pending >= G.lim.total - G.lim.reserve || G.total >= G.lim.total) return 2;
    return 0;
}

static void grow_conns(int fd) {
    if (fd < G.n_conns_cap) return;
    int cap = G.n_conns_cap ? G.n_conns_cap : 1024;
    while (cap <= fd) cap *= 2;
    Conn *grown = realloc(G.conns, sizeof *grown * (size_t)cap);
    if (grown == NULL) return;
    memset(grown + G.n_conns_cap, 0, sizeof *grown * (size_t)(cap - G.n_conns_cap));
    G.conns = grown;
    G.n_conns_cap = cap;
}

/* Records (or refuses: 1) the connection fd from sa. Under G.lock. */
static int admit(int fd, const struct sockaddr *sa) {
    if (sa->sa_family != AF_INET && sa->sa_family != AF_INET6) return 0; /* unix: not counted */
    uint8_t ip[16];
    to_ip16(sa, ip);
    int64_t now = now_ms();
    grow_conns(fd);
    if (fd >= G.n_conns_cap) return 0; /* out of memory for the table: let it be */
    untrack(fd); /* the descriptor was closed and reused since the last sweep */
    int slot = addr_slot(ip, 0);
    if (G.on && over_cap(slot) && now - G.last_sweep_ms >= 20) {
        sweep();
        slot = addr_slot(ip, 0);
    }
    int over = G.on ? over_cap(slot) : 0;
    if (over) { /* room from the oldest pending connection that had its time */
        int victim = oldest_pending(over == 1 ? slot : -1, now - EVICT_MIN_MS);
        if (victim >= 0) {
            reset_conn(victim);
            G.st.evicted++;
        }
        over = over_cap(slot); /* the search let go of stale descriptors too */
    }
    if (over) {
        memcpy(G.last_ip, ip, 16);
        G.st.refused++;
        return 1;
    }
    slot = addr_slot(ip, 1);
    if (slot < 0) { /* every slot taken by another address: refuse rather than lose count */
        G.st.refused++;
        return G.on;
    }
    struct stat sb;
    G.conns[fd].ino = fstat(fd, &sb) == 0 ? sb.st_ino : 0;
    G.conns[fd].addr = slot + 1;
    G.conns[fd].port = sa->sa_family == AF_INET
                           ? ntohs(((const struct sockaddr_in *)sa)->sin_port)
                           : ntohs(((const struct sockaddr_in6 *)sa)->sin6_port);
    G.conns[fd].vouched = 0, G.conns[fd].received = 0, G.conns[fd].over_ms = 0;
    G.conns[fd].in_total = 0, G.conns[fd].denied = 0;
    G.conns[fd].accepted_ms = now;
    G.count[slot]++;
    G.pending[slot]++;
    G.total++;
    G.n_pending++;
    if (fd > G.max_fd) G.max_fd = fd;
    G.st.accepted++;
    return 0;
}

int accept4(int sockfd, struct sockaddr *addr, socklen_t *addrlen, int flags) {
    struct sockaddr_storage own;
    socklen_t own_len = sizeof own;
    for (;;) {
        struct sockaddr *sa = addr ? addr : (struct sockaddr *)&own;
        socklen_t *sl = addr ? addrlen : &own_len;
        socklen_t given = addr ? *addrlen : own_len;
        long fd = syscall(SYS_accept4, sockfd, sa, sl, flags);
        if (fd < 0 && (errno == EMFILE || errno == ENFILE)) {
            int e = errno;
            pthread_mutex_lock(&G.lock);
            int spare = G.spare;
            G.spare = -1;
            pthread_mutex_unlock(&G.lock);
            if (spare < 0) { /* no spare to free: report it as nothing to accept */
                errno = EAGAIN;
                return -1;
            }
            close(spare);
            long drop = syscall(SYS_accept4, sockfd, NULL, NULL, SOCK_CLOEXEC);
            if (drop >= 0) close((int)drop);
            int again = open("/dev/null", O_RDONLY | O_CLOEXEC);
            pthread_mutex_lock(&G.lock);
            G.spare = again;
            G.st.emfile++;
            int64_t now = now_ms();
            int log = now - G.last_log_ms > 10000;
            if (log) G.last_log_ms = now;
            pthread_mutex_unlock(&G.lock);
            if (log)
                log_warn("net",
                         "out of descriptors (%s): a connection was accepted and closed; "
                         "raise the limit (LimitNOFILE) or lower [limits] connections",
                         strerror(e));
            if (drop < 0) {
                errno = EAGAIN;
                return -1;
            }
            continue; /* drain the backlog while out of them */
        }
        if (fd < 0) return -1;
        if (given == 0) return (int)fd;
        pthread_mutex_lock(&G.lock);
        int refuse = admit((int)fd, sa);
        pthread_mutex_unlock(&G.lock);
        if (!refuse) return (int)fd;
        close((int)fd);
        if (addr) *addrlen = given;
    }
}

ssize_t recvmsg(int fd, struct msghdr *msg, int flags) {
    long n = syscall(SYS_recvmsg, fd, msg, flags);
    if (n <= 0 || !G.on) return (ssize_t)n;
    pthread_mutex_lock(&G.lock);
    int cut = 0;
    if (fd < G.n_conns_cap && G.conns[fd].addr && !G.conns[fd].vouched) {
        Conn *c = &G.conns[fd];
        int64_t now = now_ms();
        c->received += n;
        int over = c->received > G.lim.unauth_bytes;
        int a = c->addr - 1;
        if (c->denied || !is_trusted(G.addrs[a].ip, now)) {
            /* an address's share of the total is its own: one address never takes it all */
            c->in_total += n;
            G.unauth_received += n;
            G.unauth_addr[a] += n;
            cut = over || G.unauth_addr[a] > G.lim.unauth_per_addr ||
                  G.unauth_received > G.lim.unauth_total;
        } else if (over && c->over_ms == 0)
            c->over_ms = now; /* a call may be on its way: the watchdog decides */
        else
            cut = over && now - c->over_ms > UNVOUCHED_MS;
        if (cut) {
            G.st.cut++;
            memcpy(G.last_ip, G.addrs[a].ip, 16);
            untrack(fd); /* its bytes leave the total now */
        }
    }
    pthread_mutex_unlock(&G.lock);
    if (!cut) return (ssize_t)n;
    shutdown(fd, SHUT_RDWR);
    errno = ECONNRESET;
    return -1;
}

/* One line for what the caps did since the last, at most every
 * LOG_EVERY_MS, so an operator sees an attack; written into line (empty:
 * nothing to say) under G.lock, logged by the caller after it. */
static void log_caps(int64_t now, char *line, size_t len) {
    line[0] = '\0';
    if (now - G.last_guard_log_ms < LOG_EVERY_MS) return;
    int64_t refused = G.st.refused - G.logged.refused, cut = G.st.cut - G.logged.cut,
            evicted = G.st.evicted - G.logged.evicted;
    if (refused + cut + evicted == 0) return;
    char ip[INET6_ADDRSTRLEN];
    static const uint8_t v4[12] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff};
    if (memcmp(G.last_ip, v4, 12) == 0)
        inet_ntop(AF_INET, G.last_ip + 12, ip, sizeof ip);
    else
        inet_ntop(AF_INET6, G.last_ip, ip, sizeof ip);
    snprintf(line, len,
             "connections before a certificate, in the last %d s: %lld closed over a cap, %lld "
             "reset for sending too much, %lld reset to make room (the latest from %s); "
             "%d pending now",
             LOG_EVERY_MS / 1000, (long long)refused, (long long)cut, (long long)evicted, ip,
             G.n_pending);
    G.logged = G.st;
    G.last_guard_log_ms = now;
}

/* Resets the connections of trusted addresses that went over their budget
 * and have had no call with a certificate since (a connection whose sender
 * waits on flow control reads nothing more, so recvmsg alone would not),
 * and says what the caps did. */
static void *watchdog_main(void *arg) {
    (void)arg;
    for (;;) {
        struct timespec ts = {0, 25 * 1000000L};
        nanosleep(&ts, NULL);
        int64_t now = now_ms();
        pthread_mutex_lock(&G.lock);
        for (int fd = 0; fd <= G.max_fd && fd < G.n_conns_cap; fd++) {
            Conn *c = &G.conns[fd];
            if (c->addr == 0 || c->vouched || c->over_ms == 0 || now - c->over_ms <= UNVOUCHED_MS)
                continue;
            if (!conn_live(fd)) continue;
            G.st.cut++;
            reset_conn(fd);
        }
        char line[400];
        log_caps(now, line, sizeof line);
        pthread_mutex_unlock(&G.lock);
        if (line[0]) log_warn("net", "%s", line); /* a slow log never holds accept4 and recvmsg */
    }
    return NULL;
}

void net_guard_set(const NetGuardLimits *lim) {
    pthread_mutex_lock(&G.lock);
    G.lim = *lim;
    if (G.lim.total <= 0) G.lim.total = 4096;
    if (G.lim.per_addr <= 0) G.lim.per_addr = 128;
    if (G.lim.trusted_per_addr <= 0) G.lim.trusted_per_addr = 512;
    if (G.lim.reserve < 0 || G.lim.reserve >= G.lim.total) G.lim.reserve = G.lim.total / 4;
    if (G.lim.unauth_bytes <= 0) G.lim.unauth_bytes = 64 << 10;
    if (G.lim.unauth_total <= 0) G.lim.unauth_total = 4 << 20;
    if (G.lim.unauth_per_addr <= 0) G.lim.unauth_per_addr = G.lim.unauth_total / 8;
    if (G.lim.trusted_per_addr < G.lim.per_addr) G.lim.trusted_per_addr = G.lim.per_addr;
    if (!G.on) {
        pthread_t t;
        if (pthread_create(&t, NULL, watchdog_main, NULL) == 0) pthread_detach(t);
    }
    G.on = 1;
    if (G.spare < 0) G.spare = open("/dev/null", O_RDONLY | O_CLOEXEC);
    pthread_mutex_unlock(&G.lock);
}

/* A fingerprint's first 64 bits, never 0 (0: none). */
static uint64_t cert_id(const char *sha256_hex) {
    char head[17];
    snprintf(head, sizeof head, "%.16s", sha256_hex);
    uint64_t id = strtoull(head, NULL, 16);
    return id ? id : 1;
}

/* Pending again, and budgeted as an untrusted address's connection
 * whatever trust its address has earned (a revoked site behind a NAT of
 * honest ones); under G.lock. */
static void unvouch(int fd) {
    Conn *c = &G.conns[fd];
    c->denied = 1;
    if (!c->vouched) return;
    int a = c->addr - 1;
    c->vouched = 0;
    c->received = c->in_total = c->over_ms = 0;
    c->accepted_ms = now_ms();
    G.pending[a]++, G.n_pending++;
}

void net_guard_deny_cert(const char *sha256_hex) {
    uint64_t id = cert_id(sha256_hex);
    pthread_mutex_lock(&G.lock);
    for (int fd = 0; fd <= G.max_fd && fd < G.n_conns_cap; fd++)
        if (G.conns[fd].addr && G.conns[fd].cert == id) unvouch(fd);
    pthread_mutex_unlock(&G.lock);
}

void net_guard_trust(const char *addr, int port, const char *sha256_hex) {
    uint8_t ip[16];
    if (ip_from_text(addr, ip) != 0) return;
    int64_t now = now_ms();
    pthread_mutex_lock(&G.lock);
    /* the connection the call came on: its bytes no longer count */
    int a = addr_slot(ip, 0);
    for (int fd = 0; a >= 0 && port > 0 && fd <= G.max_fd && fd < G.n_conns_cap; fd++) {
        Conn *c = &G.conns[fd];
        if (c->addr != a + 1 || c->port != port) continue;
        c->cert = cert_id(sha256_hex); /* a revocation finds it by this */
        if (c->vouched) break;
        c->vouched = 1;
        G.pending[a]--, G.n_pending--;
        G.unauth_received -= c->in_total;
        G.unauth_addr[a] -= c->in_total;
        c->received = c->in_total = c->over_ms = 0;
        break;
    }
    int slot = -1, oldest = 0;
    for (int i = 0; i < GUARD_TRUSTED && slot < 0; i++) {
        if (memcmp(G.trusted[i].ip, ip, 16) == 0) slot = i;
        if (G.trusted[i].until_ms < G.trusted[oldest].until_ms) oldest = i;
    }
    if (slot < 0) slot = oldest;
    memcpy(G.trusted[slot].ip, ip, 16);
    G.trusted[slot].until_ms = now + TRUST_MS;
    pthread_mutex_unlock(&G.lock);
}

void net_guard_unvouch(const char *addr, int port) {
    uint8_t ip[16];
    if (ip_from_text(addr, ip) != 0 || port <= 0) return;
    pthread_mutex_lock(&G.lock);
    int a = addr_slot(ip, 0);
    for (int fd = 0; a >= 0 && fd <= G.max_fd && fd < G.n_conns_cap; fd++) {
        Conn *c = &G.conns[fd];
        if (c->addr != a + 1 || c->port != port) continue;
        unvouch(fd);
        break;
    }
    pthread_mutex_unlock(&G.lock);
}

void net_guard_stats(NetGuardStats *out) {
    pthread_mutex_lock(&G.lock);
    if (G.on && now_ms() - G.last_sweep_ms >= 100) sweep();
    *out = G.st;
    out->connections = G.total;
    out->pending = G.n_pending;
    pthread_mutex_unlock(&G.lock);
}

int net_raise_nofile(char *err) {
    struct rlimit rl;
    if (getrlimit(RLIMIT_NOFILE, &rl) != 0) {
        err_set_errno(err, "cannot read the descriptor limit");
        return -1;
    }
    if (rl.rlim_cur < rl.rlim_max) {
        rlim_t was = rl.rlim_cur;
        rl.rlim_cur = rl.rlim_max;
        if (setrlimit(RLIMIT_NOFILE, &rl) != 0) {
            err_set_errno(err, "cannot raise the descriptor limit from %llu to %llu",
                          (unsigned long long)was, (unsigned long long)rl.rlim_max);
            return -1;
        }
    }
    return rl.rlim_cur > INT32_MAX ? INT32_MAX : (int)rl.rlim_cur;
}
