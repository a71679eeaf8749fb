/*
 * wan_relay.c — the WAN test bed's link (tests/wan.c): a packet relay
 * between two network namespaces, through a TUN device in each, that adds
 * what tc's netem would (this kernel has no netem): a one-way delay with
 * jitter (packets leave in order of their release time, so jitter reorders
 * them as netem's does), random loss, and faults on command. Bandwidth is
 * not the relay's: the bed puts tc tbf on the TUN devices' egress.
 *
 *   wan_relay NS_A DEV_A NS_B DEV_B [--delay MS] [--jitter MS] [--loss P]
 *             [--seed N]
 *
 * It makes DEV_A in NS_A and DEV_B in NS_B (IFF_TUN, no packet info; the
 * bed gives them addresses), prints "ready", and carries IP packets between
 * them until its standard input closes or it is signalled; the devices go
 * with it. Commands on standard input, one a line:
 *
 *   cut MS              drop every packet both ways for MS ms (0: until heal)
 *   blackhole a|b MS    drop the packets that side sends (a half-open path:
 *                       its peer still hears nothing of it, it hears all)
 *   reset               reset every TCP connection it carries: the next
 *                       packet of each, either way, is replaced by an RST to
 *                       its receiver (with that packet's sequence number, the
 *                       one the receiver expects, so it is taken)
 *   after BYTES CMD     runs CMD once BYTES more TCP payload bytes went a → b
 *                       (mid-upload, when a is a site): one armed at a time
 *   after-b BYTES CMD   the same, counting b → a (mid-download)
 *   delay MS | jitter MS | loss P
 *   heal                end every fault
 *   stats               print "stats ab=PKTS ba=PKTS dropped=PKTS resets=N"
 *
 * Every wait is bounded: the queue holds at most QUEUE_MAX packets a way
 * (more are dropped, as a router's buffer would), and a command's fault ends
 * by its own clock.
 */
#include <errno.h>
#include <fcntl.h>
#include <linux/if.h>
#include <linux/if_tun.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <time.h>
#include <unistd.h>

#define PKT_MAX   9216  /* a jumbo frame: links of 9000 bytes (the bed's mtu) */
#define QUEUE_MAX 32768 /* packets a way: 1 Gbit/s × 100 ms is about 8,300 of 1500 bytes */
#define FLOWS_MAX 256

typedef struct Packet {
    int64_t release_us;
    uint64_t order; /* ties leave in arrival order */
    uint16_t len;
    uint8_t data[PKT_MAX];
} Packet;

/* a min-heap of packets by release time, one a way */
typedef struct Queue {
    Packet **heap;
    int n;
} Queue;

typedef struct Flow { /* a TCP connection, by its 4-tuple as a → b sees it */
    uint32_t a_addr, b_addr;
    uint16_t a_port, b_port;
    int reset_to_a, reset_to_b; /* an RST is owed that way */
} Flow;

static struct {
    int fd[2];  /* 0: side a, 1: side b */
    Queue q[2]; /* q[0]: a → b, q[1]: b → a */
    int64_t delay_us, jitter_us;
    double loss;
    uint64_t rng, order;
    int64_t cut_until_us;          /* -1: until heal; 0: none */
    int64_t blackhole_until_us[2]; /* from side a / b */
    int64_t after_budget;          /* -1: no `after` armed */
    int after_from;                /* the side whose bytes it counts */
    char after_cmd[200];
    Flow flows[FLOWS_MAX];
    int n_flows;
    uint64_t passed[2], dropped, resets;
} R = {.after_budget = -1};

static int64_t now_us(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000 + ts.tv_nsec / 1000;
}

static double uniform(void) {
    R.rng ^= R.rng << 13, R.rng ^= R.rng >> 7, R.rng ^= R.rng << 17;
    return (double)(R.rng >> 11) / (double)(1ull << 53);
}

static int before(const Packet *x, const Packet *y) {
    return x->release_us < y->release_us || (x->release_us == y->release_us && x->order < y->order);
}

static void heap_push(Queue *q, Packet *p) {
    int i = q->n++;
    q->heap[i] = p;
    while (i > 0 && before(q->heap[i], q->heap[(i - 1) / 2])) {
        Packet *t = q->heap[i];
        q->heap[i] = q->heap[(i - 1) / 2], q->heap[(i - 1) / 2] = t;
        i = (i - 1) / 2;
    }
}

static Packet *heap_pop(Queue *q) {
    Packet *top = q->heap[0];
    q->heap[0] = q->heap[--q->n];
    for (int i = 0;;) {
        int l = 2 * i + 1, r = l + 1, m = i;
        if (l < q->n && before(q->heap[l], q->heap[m])) m = l;
        if (r < q->n && before(q->heap[r], q->heap[m])) m = r;
        if (m == i) break;
        Packet *t = q->heap[i];
        q->heap[i] = q->heap[m], q->heap[m] = t;
        i = m;
    }
    return top;
}

static int tun_open(const char *ns, const char *dev) {
    char path[256];
    snprintf(path, sizeof path, "/var/run/netns/%s", ns);
    int nsfd = open(path, O_RDONLY | O_CLOEXEC);
    if (nsfd < 0 || setns(nsfd, CLONE_NEWNET) != 0) {
        fprintf(stderr, "wan_relay: cannot enter namespace %s: %s\n", ns, strerror(errno));
        exit(2);
    }
    close(nsfd);
    int fd = open("/dev/net/tun", O_RDWR | O_CLOEXEC | O_NONBLOCK);
    struct ifreq ifr;
    memset(&ifr, 0, sizeof ifr);
    ifr.ifr_flags = IFF_TUN | IFF_NO_PI;
    snprintf(ifr.ifr_name, sizeof ifr.ifr_name, "%s", dev);
    if (fd < 0 || ioctl(fd, TUNSETIFF, &ifr) != 0) {
        fprintf(stderr, "wan_relay: cannot make TUN device %s in %s: %s\n", dev, ns,
                strerror(errno));
        exit(2);
    }
    return fd;
}

static uint16_t get16(const uint8_t *p) {
    return (uint16_t)(p[0] << 8 | p[1]);
}
static uint32_t get32(const uint8_t *p) {
    return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | p[3];
}
static void put16(uint8_t *p, uint16_t v) {
    p[0] = (uint8_t)(v >> 8), p[1] = (uint8_t)v;
}
static void put32(uint8_t *p, uint32_t v) {
    p[0] = (uint8_t)(v >> 24), p[1] = (uint8_t)(v >> 16), p[2] = (uint8_t)(v >> 8),
    p[3] = (uint8_t)v;
}

static uint32_t sum16(const uint8_t *p, size_t n, uint32_t s) {
    for (size_t i = 0; i + 1 < n; i += 2) s += get16(p + i);
    if (n & 1) s += (uint32_t)p[n - 1] << 8;
    return s;
}
static uint16_t fold(uint32_t s) {
    while (s >> 16) s = (s & 0xffff) + (s >> 16);
    return (uint16_t)~s;
}

/* A TCP segment of IPv4 without options past the IP header: its header
 * offset and payload length; -1 when the packet is anything else. */
static int tcp_of(const uint8_t *p, size_t len, size_t *payload) {
    if (len < 20 || (p[0] >> 4) != 4 || p[9] != 6) return -1;
    size_t ihl = (size_t)(p[0] & 15) * 4, tot = get16(p + 2);
    if (ihl < 20 || tot > len || tot < ihl + 20) return -1;
    size_t doff = (size_t)(p[ihl + 12] >> 4) * 4;
    if (doff < 20 || ihl + doff > tot) return -1;
    *payload = tot - ihl - doff;
    return (int)ihl;
}

static Flow *flow_of(const uint8_t *p, int ihl, int from_b) {
    uint32_t src = get32(p + 12), dst = get32(p + 16);
    uint16_t sport = get16(p + ihl), dport = get16(p + ihl + 2);
    uint32_t a = from_b ? dst : src, b = from_b ? src : dst;
    uint16_t ap = from_b ? dport : sport, bp = from_b ? sport : dport;
    for (int i = 0; i < R.n_flows; i++) {
        Flow *f = &R.flows[i];
        if (f->a_addr == a && f->b_addr == b && f->a_port == ap && f->b_port == bp) return f;
    }
    Flow *f = &R.flows[R.n_flows < FLOWS_MAX ? R.n_flows++ : (int)(uniform() * FLOWS_MAX)];
    memset(f, 0, sizeof *f);
    f->a_addr = a, f->b_addr = b, f->a_port = ap, f->b_port = bp;
    return f;
}

/* Turns the TCP segment p (to its receiver) into a bare RST with its own
 * sequence number: the receiver's next expected byte when p is in order. */
static size_t make_rst(uint8_t *p, int ihl) {
    uint8_t *t = p + ihl;
    uint32_t seq = get32(t + 4);
    p[0] = 0x45; /* no IP options */
    t = p + 20;
    memmove(t, p + ihl, 20);
    put32(t + 4, seq);
    put32(t + 8, 0);
    t[12] = 5 << 4; /* no TCP options */
    t[13] = 0x04;   /* RST */
    put16(t + 14, 0), put16(t + 16, 0), put16(t + 18, 0);
    put16(p + 2, 40);
    put16(p + 10, 0);
    put16(p + 10, fold(sum16(p, 20, 0)));
    uint8_t pseudo[12];
    memcpy(pseudo, p + 12, 8);
    pseudo[8] = 0, pseudo[9] = 6;
    put16(pseudo + 10, 20);
    put16(t + 16, fold(sum16(t, 20, sum16(pseudo, 12, 0))));
    return 40;
}

static int command(char *line);

/* whether a fault drops what side `from` sends now */
static int blocked(int from, int64_t now) {
    int64_t cut = R.cut_until_us, hole = R.blackhole_until_us[from];
    return cut == -1 || cut > now || hole == -1 || hole > now;
}

static void arrive(int from) { /* from 0: side a, 1: side b */
    for (int burst = 0; burst < 64; burst++) {
        uint8_t buf[PKT_MAX];
        ssize_t n = read(R.fd[from], buf, sizeof buf);
        if (n <= 0) return;
        int64_t now = now_us();
        Queue *q = &R.q[from];
        if (blocked(from, now) || uniform() < R.loss || q->n == QUEUE_MAX) {
            R.dropped++;
            continue;
        }
        size_t payload;
        int ihl = tcp_of(buf, (size_t)n, &payload);
        if (ihl > 0) flow_of(buf, ihl, from); /* known before a reset is asked for */
        if (ihl > 0 && from == R.after_from && R.after_budget >= 0) {
            R.after_budget -= (int64_t)payload;
            if (R.after_budget < 0) {
                R.after_budget = -1;
                command(R.after_cmd);
                if (blocked(from, now)) { /* this packet too */
                    R.dropped++;
                    continue;
                }
            }
        }
        Packet *p = malloc(sizeof *p);
        if (p == NULL) return;
        double j = R.jitter_us ? (2 * uniform() - 1) * (double)R.jitter_us : 0;
        p->release_us = now + R.delay_us + (int64_t)j;
        p->order = R.order++;
        p->len = (uint16_t)n;
        memcpy(p->data, buf, (size_t)n);
        heap_push(q, p);
    }
}

static void deliver(int64_t now) {
    for (int way = 0; way < 2; way++) {
        Queue *q = &R.q[way];
        while (q->n > 0 && q->heap[0]->release_us <= now) {
            Packet *p = heap_pop(q);
            size_t payload, len = p->len;
            int ihl = tcp_of(p->data, len, &payload);
            if (ihl > 0) {
                Flow *f = flow_of(p->data, ihl, way);
                int *owed = way == 0 ? &f->reset_to_b : &f->reset_to_a;
                if (*owed && !(p->data[ihl + 13] & 0x04)) {
                    len = make_rst(p->data, ihl);
                    *owed = 0;
                    R.resets++;
                }
            }
            if (write(R.fd[1 - way], p->data, len) == (ssize_t)len)
                R.passed[way]++;
            else
                R.dropped++;
            free(p);
        }
    }
}

static int64_t next_release(void) {
    int64_t t = -1;
    for (int way = 0; way < 2; way++)
        if (R.q[way].n > 0 && (t < 0 || R.q[way].heap[0]->release_us < t))
            t = R.q[way].heap[0]->release_us;
    return t;
}

static int64_t until(int64_t now, long ms) {
    return ms == 0 ? -1 : now + ms * 1000;
}

/* One command line; 0, or -1 when it is not one (said on stderr). */
static int command(char *line) {
    int64_t now = now_us();
    char side;
    long v;
    int at = 0;
    double d;
    if (sscanf(line, "cut %ld", &v) == 1 && v >= 0)
        R.cut_until_us = until(now, v);
    else if (sscanf(line, "blackhole %c %ld", &side, &v) == 2 && (side == 'a' || side == 'b') &&
             v >= 0)
        R.blackhole_until_us[side == 'b'] = until(now, v);
    else if (strcmp(line, "reset") == 0)
        for (int i = 0; i < R.n_flows; i++) R.flows[i].reset_to_a = R.flows[i].reset_to_b = 1;
    else if (sscanf(line, "after %ld %n", &v, &at) == 1 && v >= 0 && at > 0 && line[at])
        R.after_budget = v, R.after_from = 0,
        snprintf(R.after_cmd, sizeof R.after_cmd, "%s", line + at);
    else if (sscanf(line, "after-b %ld %n", &v, &at) == 1 && v >= 0 && at > 0 && line[at])
        R.after_budget = v, R.after_from = 1,
        snprintf(R.after_cmd, sizeof R.after_cmd, "%s", line + at);
    else if (sscanf(line, "delay %ld", &v) == 1 && v >= 0)
        R.delay_us = v * 1000;
    else if (sscanf(line, "jitter %ld", &v) == 1 && v >= 0)
        R.jitter_us = v * 1000;
    else if (sscanf(line, "loss %lf", &d) == 1 && d >= 0 && d <= 1)
        R.loss = d;
    else if (strncmp(line, "heal", 4) == 0)
        R.cut_until_us = R.blackhole_until_us[0] = R.blackhole_until_us[1] = 0, R.after_budget = -1;
    else if (strncmp(line, "stats", 5) == 0) {
        printf("stats ab=%llu ba=%llu dropped=%llu resets=%llu\n", (unsigned long long)R.passed[0],
               (unsigned long long)R.passed[1], (unsigned long long)R.dropped,
               (unsigned long long)R.resets);
        fflush(stdout);
    } else {
        fprintf(stderr, "wan_relay: unknown command: %s\n", line);
        return -1;
    }
    return 0;
}

static void usage(void) {
    fprintf(stderr, "usage: wan_relay NS_A DEV_A NS_B DEV_B [--delay MS] [--jitter MS] "
                    "[--loss P] [--seed N]\n");
    exit(2);
}

int main(int argc, char **argv) {
    if (argc < 5) usage();
    R.rng = 0x9E3779B97F4A7C15ull;
    for (int i = 5; i < argc; i++) {
        if (i + 1 == argc) usage();
        char *end;
        double v = strtod(argv[i + 1], &end);
        if (*end || v < 0) usage();
        if (strcmp(argv[i], "--delay") == 0)
            R.delay_us = (int64_t)(v * 1000);
        else if (strcmp(argv[i], "--jitter") == 0)
            R.jitter_us = (int64_t)(v * 1000);
        else if (strcmp(argv[i], "--loss") == 0 && v <= 1)
            R.loss = v;
        else if (strcmp(argv[i], "--seed") == 0)
            R.rng ^= (uint64_t)v * 0xBF58476D1CE4E5B9ull | 1;
        else
            usage();
        i++;
    }
    signal(SIGPIPE, SIG_IGN);
    R.fd[0] = tun_open(argv[1], argv[2]);
    R.fd[1] = tun_open(argv[3], argv[4]);
    for (int w = 0; w < 2; w++) R.q[w].heap = calloc(QUEUE_MAX, sizeof(Packet *));
    if (R.q[0].heap == NULL || R.q[1].heap == NULL) return 1;
    printf("ready\n");
    fflush(stdout);
    char line[256];
    size_t have = 0;
    for (;;) {
        int64_t now = now_us(), next = next_release();
        int timeout = next < 0 ? 1000 : next <= now ? 0 : (int)((next - now + 999) / 1000);
        if (timeout > 1000) timeout = 1000;
        struct pollfd pf[3] = {{R.fd[0], POLLIN, 0}, {R.fd[1], POLLIN, 0}, {0, POLLIN, 0}};
        if (poll(pf, 3, timeout) < 0 && errno != EINTR) return 1;
        if (pf[0].revents & POLLIN) arrive(0);
        if (pf[1].revents & POLLIN) arrive(1);
        if (pf[2].revents & (POLLIN | POLLHUP)) {
            ssize_t n = read(0, line + have, sizeof line - 1 - have);
            if (n <= 0) break; /* the bed closed its end: the link goes */
            have += (size_t)n;
            line[have] = 0;
            char *nl;
            while ((nl = strchr(line, '\n')) != NULL) {
                *nl = 0;
                command(line);
                have -= (size_t)(nl + 1 - line);
                memmove(line, nl + 1, have + 1);
            }
            if (have == sizeof line - 1) have = 0; /* a line too long: dropped */
        }
        deliver(now_us());
    }
    return 0;
}
