/*
 * net.h — the API of net/: the one wrapper over gRPC core. No other folder
 * includes a gRPC header.
 *
 * Server: a gRPC server with TLS 1.3 that requires and verifies a client
 * certificate in the handshake (or, made anonymous, requests one and lets
 * methods say whether they require it), registered methods
 * (unary, server-streaming, client-streaming) whose handlers run on a
 * bounded pool of worker threads — when every worker is busy and the
 * backlog is full a new call is answered RESOURCE_EXHAUSTED at once — plus
 * UNIMPLEMENTED for unknown
 * methods. Handlers are plain blocking code: receive, send, set a status.
 * No peer can take the pool: a certificate (or an address, without one)
 * holds at most per_peer calls at once, some workers are reserved for
 * methods flagged NET_USE_RESERVE, a revoked peer's calls can be cancelled
 * in flight, and a long poll parks its call instead of holding a worker.
 *
 * Client: a channel to HOST:PORT with TLS (server-authenticated only when no
 * client certificate is given, as for Join; mutual otherwise), and calls with
 * deadlines and cancellation.
 *
 * Transfers (net/transfer.c): payloads streamed as a TransferHeader and 1 MiB
 * chunks, checked against limits before anything is allocated, verified by
 * length and SHA-256, and resumable: the receiver spools partial uploads to
 * disk by owner (the authenticated sender) and upload id, one live stream
 * per upload, within quotas per owner and in total reserved at the header.
 *
 * Messages are bytes; their protobuf encoding (schema/strait.proto) is the
 * caller's, through protoc-c. Return values: 0 ok, -1 with a one-line reason
 * in err, unless said otherwise.
 */
#ifndef STRAIT_NET_H
#define STRAIT_NET_H

#include <stddef.h>
#include <stdint.h>

/* gRPC status codes, by their numbers. */
typedef enum NetStatus {
    NET_OK = 0,
    NET_CANCELLED = 1,
    NET_UNKNOWN = 2,
    NET_INVALID_ARGUMENT = 3,
    NET_DEADLINE_EXCEEDED = 4,
    NET_NOT_FOUND = 5,
    NET_ALREADY_EXISTS = 6,
    NET_PERMISSION_DENIED = 7,
    NET_RESOURCE_EXHAUSTED = 8,
    NET_FAILED_PRECONDITION = 9,
    NET_ABORTED = 10,
    NET_OUT_OF_RANGE = 11,
    NET_UNIMPLEMENTED = 12,
    NET_INTERNAL = 13,
    NET_UNAVAILABLE = 14,
    NET_DATA_LOSS = 15,
    NET_UNAUTHENTICATED = 16,
} NetStatus;

const char *net_status_name(NetStatus s);

/* "host:port" → a gRPC target for a channel; IPv4 literals skip the DNS
 * resolver ("ipv4:host:port"), names go through it. */
void net_target(const char *hostport, char *out, size_t len);

/* 1 when this build refuses TLS below 1.3 on both ends, 0 when its libgrpc
 * cannot (the build warned; `strait version` says so). */
int net_tls13_only(void);

/* Blocks SIGINT, SIGTERM, SIGHUP and SIGPIPE in the calling thread (so
 * gRPC's threads inherit the mask and signals reach only net_wait_signal),
 * starts gRPC, and routes its log into util's. Call once, first thing. */
void net_global_init(void);
void net_global_shutdown(void);
/* net_global_shutdown, waiting at most timeout_ms: 0 once gRPC has freed
 * everything, 1 when it still holds connections (gRPC 1.51 waits 10 s for
 * a transport whose peer stopped answering: a link cut or reset mid-write).
 * On 1 the process must end with _exit, which frees them, rather than
 * returning from main while gRPC's clean-up runs. */
int net_global_shutdown_within(int timeout_ms);
/* Waits for one of the blocked signals (or timeout_ms; -1 forever) and
 * returns it, 0 on timeout. */
int net_wait_signal(int timeout_ms);

/* TLS material, PEM strings (not owned). */
typedef struct NetTls {
    const char *ca_pem;   /* the federation CA: verifies the peer */
    const char *cert_pem; /* our certificate chain; NULL on a client: no client cert */
    const char *key_pem;
} NetTls;

/* A received message; data is owned (free with net_buf_free) and followed
 * by a NUL byte that len does not count. */
typedef struct NetBuf {
    uint8_t *data;
    size_t len;
} NetBuf;
void net_buf_free(NetBuf *b);

/* ---- server ------------------------------------------------------------ */

typedef struct NetServer NetServer;
typedef struct NetCall NetCall;

typedef enum NetMethodKind {
    NET_UNARY,         /* one request, one response */
    NET_SERVER_STREAM, /* one request, responses streamed */
    NET_CLIENT_STREAM, /* requests streamed, one response */
} NetMethodKind;

/* Runs on a worker thread. Reads with net_call_recv, answers with
 * net_call_send and net_call_status; a handler that sets no status answers
 * OK. */
typedef void (*NetHandler)(NetCall *call, void *user);

#define NET_PER_PEER_DEFAULT         4
#define NET_MAX_PARKED_DEFAULT       4096
#define NET_STREAM_WINDOW_AUTO       0u           /* stream_window: sized from the link */
#define NET_TRANSPORT_MEMORY_DEFAULT (256u << 20) /* bytes: 10 Gbit/s in at 100 ms, twice over */

/* What peers may hold of the server's connections (net/guard.c). A
 * connection is pending until a call with a verified certificate comes on
 * it: per_addr pending at once from an address, total − reserve pending in
 * all, trusted_per_addr connections of any kind from an address, total in
 * all. A connection beyond makes room by resetting the oldest pending
 * connection of its address (of the address with the most pending, for the
 * caps in all) that is a second old, or is closed as it is accepted.
 * 0: the defaults (4096, 128, 512, a quarter of total). */
typedef struct NetGuardLimits {
    int total, per_addr, trusted_per_addr, reserve;
    /* bytes a connection may send while pending (0: 64 KiB), all pending
     * connections from addresses no certificate came from within the hour
     * together (0: 4 MiB), and those of one such address (0: an eighth of
     * that); past any of them it is reset */
    int64_t unauth_bytes, unauth_total, unauth_per_addr;
} NetGuardLimits;

typedef struct NetGuardStats {
    int64_t connections;       /* TCP connections held now */
    int64_t pending;           /* of which no call with a certificate has come on yet */
    int64_t accepted, refused; /* since the start; refused: closed as accepted, over a cap */
    int64_t evicted;           /* pending connections reset to make room for a newer one */
    int64_t emfile;            /* connections closed for want of descriptors */
    int64_t cut;               /* reset for sending too much before a certificate */
} NetGuardStats;
void net_guard_stats(NetGuardStats *out);
/* Raises the soft descriptor limit to the hard one; the limit now, or -1. */
int net_raise_nofile(char *err);

typedef struct NetServerConfig {
    const char *listen; /* "127.0.0.1:0" picks a free port */
    NetTls tls;         /* ca_pem verifies client certificates */
    int workers;        /* handler threads; a call beyond gets RESOURCE_EXHAUSTED */
    size_t max_message; /* bytes, both directions (default 8 MiB) */
    int keepalive_ms;   /* ping idle clients this often (default 30 s) */
    int per_peer;       /* calls one certificate (or address) may hold at once, parked ones
                         * included; beyond: RESOURCE_EXHAUSTED (0: NET_PER_PEER_DEFAULT) */
    int reserve;        /* workers only NET_USE_RESERVE methods may take (0: none) */
    int max_parked;     /* parked calls at most (0: NET_MAX_PARKED_DEFAULT) */
    int backlog;        /* calls that may wait for a worker (0: 4 x workers, -1: none); beyond,
                         * and with every worker busy: RESOURCE_EXHAUSTED */
    /* bytes a stream may have in flight towards the server. AUTO (0):
     * gRPC's bandwidth probe sizes each connection's window from its
     * bandwidth × RTT (a 1 Gbit/s, 100 ms link: 0.93–0.99 of it on the bed, warm), and
     * transport_memory bounds what all of them hold. A number: that window,
     * fixed, no probe (what an upload holds is then that at most, but a
     * link gets about one message per RTT: 4 MiB at 100 ms, 54 Mbit/s) */
    uint32_t stream_window;
    /* what gRPC's transport may hold for all connections together (its
     * resource quota): past 80% of it the windows shrink, then idle
     * connections close, then streams are cancelled, which an upload
     * resumes from (0: NET_TRANSPORT_MEMORY_DEFAULT) */
    size_t transport_memory;
    NetGuardLimits connections; /* capped below the descriptor limit less 256 */
    int max_streams;            /* HTTP/2 streams open at once per connection (0: 32) */
    int handshake_ms;           /* TLS and the HTTP/2 preface must be done within (0: 10 s) */
    int send_ms;      /* the longest a response message may wait for its peer to read (0: 60 s);
                       * past it the call is cancelled, not waited on */
    int idle_conn_ms; /* a connection with no call for this long is closed (0: 10 min) */
    int anonymous;    /* 1: a peer without a client certificate completes TLS and calls the
                       * methods without NET_REQUIRE_CERT; 0: the TLS handshake requires one
                       * (the coordinator: enrollment has its own listener, net/enroll.c) */
} NetServerConfig;

/* net_server_add_method flags */
#define NET_REQUIRE_CERT 1 /* refuse callers without a verified client certificate */
#define NET_USE_RESERVE  2 /* may take the reserved workers (the admin's methods) */

NetServer *net_server_create(const NetServerConfig *cfg, char *err);
/* path "/strait.Federation/Hello"; flags: NET_REQUIRE_CERT (callers
 * without a verified client certificate get UNAUTHENTICATED before the
 * handler runs), NET_USE_RESERVE. */
int net_server_add_method(NetServer *s, const char *path, NetMethodKind kind, int flags,
                          NetHandler handler, void *user, char *err);
/* Binds, starts the dispatcher and the workers; *port gets the bound port. */
int net_server_start(NetServer *s, int *port, char *err);
/* Stops taking calls, lets running ones finish for grace_ms, cancels the
 * rest, joins every thread and frees the server. Every parked call must
 * have been answered before. */
void net_server_stop(NetServer *s, int grace_ms);
/* Cancels (PERMISSION_DENIED, why) every live call of the certificate with
 * this SHA-256 fingerprint, parked ones included (they still wait for
 * their owner's answer, which then goes nowhere), and refuses it for good
 * as net_call_deny_peer does; returns how many. */
int net_server_cancel_peer(NetServer *s, const char *sha256_hex, const char *why);
/* The fingerprints of every certificate with live calls or a connection a
 * call of it has come on (not refused for good since), in *out (malloc'd);
 * their count, -1 when out of memory. */
int net_server_live_peers(NetServer *s, char (**out)[65]);

typedef enum NetRecv {
    NET_RECV_TIMEOUT = -2,
    NET_RECV_BROKEN = -1,
    NET_RECV_END = 0,
    NET_RECV_MESSAGE = 1
} NetRecv;

/* The next client message: MESSAGE (msg filled), END (the client finished
 * sending) or BROKEN (cancelled, deadline passed, peer gone). For unary and
 * server-streaming calls the request is the first message. */
NetRecv net_call_recv(NetCall *c, NetBuf *msg);
/* The same, waiting at most wait_ms (-1: no limit): a client that sends
 * nothing for that long gets TIMEOUT and its call is cancelled
 * (DEADLINE_EXCEEDED). */
NetRecv net_call_recv_within(NetCall *c, NetBuf *msg, int64_t wait_ms);
/* Sends a response message; data must stay valid until it returns. */
int net_call_send(NetCall *c, const void *data, size_t len);
/* The status the call ends with (printf-style message). */
void net_call_status(NetCall *c, NetStatus code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
/* Ends the call now with its status (OK unless one was set): the client has
 * its answer while the handler goes on with work of its own (a commit). The
 * handler sends nothing on the call after this; it still holds its worker
 * and its certificate's call slot until it returns. */
void net_call_end(NetCall *c);

typedef struct NetPeer {
    char addr[64]; /* the peer's IP address, without the port */
    int has_cert;  /* a client certificate verified against the CA */
    char name[65]; /* its subject CN */
    char serial_hex[80];
    char sha256_hex[65]; /* fingerprint of the DER certificate */
    int64_t not_after;   /* ms since the epoch */
} NetPeer;

const NetPeer *net_call_peer(NetCall *c);
/* The service refuses this call's certificate for good (revoked, retired,
 * never issued): its later calls are refused as they arrive
 * (PERMISSION_DENIED, no worker), and the connection it came on is pending
 * again, under the byte budget of connections before a certificate (TLS
 * does not consult revocations: such a peer still completes it). The last
 * NET_DENIED_MAX certificates are remembered. */
#define NET_DENIED_MAX 1024
void net_call_deny_peer(NetCall *c);
const char *net_call_method(NetCall *c);
/* Milliseconds left before the caller's deadline (INT64_MAX: none). */
int64_t net_call_deadline_ms(NetCall *c);
/* Whether the call was cancelled or its deadline passed; waits up to
 * wait_ms for the news. */
int net_call_cancelled(NetCall *c, int wait_ms);

/* Parks a unary call: when its handler returns, the worker is free and the
 * call stays open until net_parked_answer. The handler must not touch the
 * call after handing it to whoever answers it. -1: not parked (too many
 * parked, or the server is stopping); the handler answers as usual. */
int net_call_park(NetCall *c);
/* Answers a parked call from any thread, once: the response message (when
 * code is OK) and the status; the call is freed. */
void net_parked_answer(NetCall *c, const void *data, size_t len, NetStatus code,
                       const char *details);

/* ---- the enrollment listener (net/enroll.c) ----------------------------------
 *
 * The one call a peer makes before it has a certificate (Join) is served
 * apart from gRPC, on a port of its own: TLS 1.3 with ALPN "strait-join/1",
 * one framed request, one framed answer, then the connection closes. Its
 * worst case is total connections, each a thread and a TLS session for at
 * most deadline_ms, reading at most max_request bytes. */

#define NET_ENROLL_TOTAL_DEFAULT    32
#define NET_ENROLL_PER_ADDR_DEFAULT 4
#define NET_ENROLL_DEADLINE_DEFAULT 10000       /* ms: TLS, the request and the answer */
#define NET_ENROLL_REQUEST_DEFAULT  (16u << 10) /* bytes: a CSR, a token and a name */
#define NET_ENROLL_ANSWER_MAX       (64u << 10)

typedef struct NetEnrollServer NetEnrollServer;
typedef struct NetEnrollCall NetEnrollCall;

typedef struct NetEnrollConfig {
    const char *listen; /* "HOST:PORT"; port 0 picks a free one */
    NetTls tls;         /* the server's chain and key (no client certificate is asked for) */
    int total;          /* connections at once (0: NET_ENROLL_TOTAL_DEFAULT) */
    int per_addr;       /* from one address (0: NET_ENROLL_PER_ADDR_DEFAULT) */
    int deadline_ms;    /* a connection's whole life (0: NET_ENROLL_DEADLINE_DEFAULT) */
    size_t max_request; /* bytes of a request's body (0: NET_ENROLL_REQUEST_DEFAULT) */
} NetEnrollConfig;

typedef struct NetEnrollStats {
    int64_t accepted, refused; /* connections taken, closed over a cap */
    int64_t evicted;           /* ended without their request for a newer one, over the cap */
    int64_t served, failed;    /* answered; ended without an answer (TLS, malformed, deadline) */
    int64_t held;              /* connections open now */
} NetEnrollStats;

/* Runs on the connection's own thread with the request; answers with
 * net_enroll_call_answer (OK) or net_enroll_call_status. */
typedef void (*NetEnrollHandler)(NetEnrollCall *call, void *user);

/* Binds, starts the acceptor; *port gets the bound port. */
NetEnrollServer *net_enroll_start(const NetEnrollConfig *cfg, NetEnrollHandler handler, void *user,
                                  int *port, char *err);
/* Stops accepting, ends the connections in flight, joins every thread. */
void net_enroll_stop(NetEnrollServer *s);
void net_enroll_stats(NetEnrollServer *s, NetEnrollStats *out);

const char *net_enroll_call_addr(const NetEnrollCall *c); /* the peer's IP address */
const uint8_t *net_enroll_call_request(const NetEnrollCall *c, size_t *len);
void net_enroll_call_answer(NetEnrollCall *c, const void *data, size_t len);
void net_enroll_call_status(NetEnrollCall *c, NetStatus code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* The frames' decoders (the listener's and its client's; fuzzed): 1 with a
 * whole frame in buf (*body_len, and *status, set), 0 when more is needed,
 * -1 when the bytes cannot be one (wrong magic, a length out of bounds,
 * bytes after the frame). The body follows the 8-byte request head and the
 * 9-byte answer head. */
int net_enroll_request_parse(const uint8_t *buf, size_t have, size_t max_request, size_t *body_len);
int net_enroll_answer_parse(const uint8_t *buf, size_t have, NetStatus *status, size_t *body_len);

/* The enrollment address that goes with a service address when none is
 * configured: the same host, the next port (port 0 stays 0: a free one).
 * -1 when service is not HOST:PORT. */
int net_enroll_default_address(const char *service, char *out, size_t len);

/* Client: one exchange with the listener at HOST:PORT, verifying its
 * certificate against ca_pem and for HOST; resp gets an OK answer's body,
 * details a refusal's reason. Returns the answer's status. */
NetStatus net_enroll_call(const char *hostport, const char *ca_pem, const void *req, size_t len,
                          NetBuf *resp, int64_t timeout_ms, char *details, size_t details_len);

/* ---- client ------------------------------------------------------------ */

typedef struct NetChannel NetChannel;
typedef struct NetClientCall NetClientCall;

typedef struct NetChannelConfig {
    const char *target;      /* "127.0.0.1:7700", "ipv4:…", "dns:…" */
    NetTls tls;              /* cert_pem NULL: server-authenticated only */
    const char *server_name; /* name to verify instead of the target's host */
    size_t max_message;      /* default 8 MiB */
    int keepalive_ms;        /* default 30 s */
} NetChannelConfig;

NetChannel *net_channel_create(const NetChannelConfig *cfg, char *err);
void net_channel_destroy(NetChannel *ch);
/* Waits up to timeout_ms for the channel to be connected, asking it to
 * connect: 1 once it is, 0 at the deadline. A retry after a lost
 * connection waits here, so it goes as soon as the link is back rather
 * than at the end of a fixed backoff; a channel between failed connection
 * attempts is told to try at once (the caller's backoff paces them, not
 * gRPC's). A timeout of 0 only asks. */
int net_channel_wait_ready(NetChannel *ch, int64_t timeout_ms);

/* One request, one response. *details (may be NULL) gets the status
 * message. Returns the call's status. */
NetStatus net_unary(NetChannel *ch, const char *method, const void *req, size_t req_len,
                    NetBuf *resp, int64_t timeout_ms, char *details, size_t details_len);

/* Streaming calls: start, then send (client streams) and/or recv (server
 * streams), then finish for the status. */
NetClientCall *net_client_start(NetChannel *ch, const char *method, int64_t timeout_ms, char *err);
int net_client_send(NetClientCall *c, const void *data, size_t len);
int net_client_close_send(NetClientCall *c);
NetRecv net_client_recv(NetClientCall *c, NetBuf *msg);
/* Cancels the call (from any thread); the next operation fails. */
void net_client_cancel(NetClientCall *c);
/* Waits for the status, frees the call. */
NetStatus net_client_finish(NetClientCall *c, char *details, size_t details_len);

/* ---- transfers ----------------------------------------------------------- */

#define NET_CHUNK_DEFAULT (1u << 20)
#define NET_CHUNK_MIN     (4u << 10)
#define NET_CHUNK_MAX     (4u << 20)
#define NET_UPLOAD_ID_MAX 64

typedef struct NetTransferSpec {
    const char *purpose; /* "update", "model", … */
    uint64_t round;
    const char *upload_id; /* [A-Za-z0-9._-]{1,64}; the spool file's name */
    uint32_t chunk_size;   /* 0: NET_CHUNK_DEFAULT */
    const uint8_t *meta;   /* purpose-specific, may be NULL */
    size_t meta_len;
    const uint8_t *sha256; /* the payload's SHA-256 when the sender already has it
                            * (a model served to every site); NULL: computed */
} NetTransferSpec;

/* What a receiver accepts. Downloads use max_total only. */
typedef struct NetLimits {
    uint64_t max_total;  /* bytes of one payload */
    const char *purpose; /* the header's purpose must be this (NULL: any) */
    int64_t header_ms;   /* the header must come within this (0: 30 s) */
    int64_t idle_ms;     /* the longest wait for the next chunk (0: 60 s) */
    int64_t life_ms;     /* the longest one stream may last (0: 1 hour) */
    /* past grace_ms, a stream must have brought min_rate bytes a second on
     * average (one chunk in progress allowed): a trickle is cut, keeping
     * what came for a resume (0: no minimum; grace 0: 10 s) */
    uint64_t min_rate;
    int64_t grace_ms;
} NetLimits;

/* The receiver's disk for uploads: a folder per owner (the authenticated
 * sender; no owner sees another's files), one partial file per upload id
 * and the owner's kept files, bounded per owner and in total (partials,
 * uploads in flight at their declared size, and kept files all count);
 * partials untouched for expiry_ms are removed. Thread-safe. Owners and
 * upload ids are [A-Za-z0-9._-]{1,64}, not starting with '.'. */
typedef struct NetSpool NetSpool;
NetSpool *net_spool_open(const char *dir, uint64_t max_bytes, uint64_t max_owner_bytes,
                         int64_t expiry_ms, char *err);
void net_spool_close(NetSpool *sp);
/* Bytes held for an owner's upload id (0 if none). */
uint64_t net_spool_committed(NetSpool *sp, const char *owner, const char *upload_id);
/* Writes a new file `name` in the owner's folder (O_EXCL: never into an
 * existing one) within the owner's quota; path (may be NULL) gets where. */
int net_spool_keep(NetSpool *sp, const char *owner, const char *name, const uint8_t *data,
                   size_t len, char *path, size_t path_len, char *err);
/* Removes a kept file; every kept file of every owner (a coordinator
 * starting over: what it kept belonged to a round it no longer holds). */
void net_spool_drop(NetSpool *sp, const char *owner, const char *name);
void net_spool_drop_all_kept(NetSpool *sp);

typedef struct NetReceived {
    char upload_id[NET_UPLOAD_ID_MAX + 1];
    char purpose[32];
    uint64_t round;
    uint64_t length;
    /* the payload, exactly the bytes whose SHA-256 was verified: a read-only
     * map of the spooled file (unlinked, so no one else reaches it), so it
     * costs page cache, not the heap, and only as it is read; owned */
    uint8_t *data;
    uint8_t *meta; /* owned; free both with net_received_free */
    size_t meta_len;
    size_t mapped; /* data's mapping length (0: data is on the heap) */
} NetReceived;
void net_received_free(NetReceived *r);
/* Lets the payload go (its pages with it) and keeps the rest. */
void net_received_drop_data(NetReceived *r);

/* Server side of an upload (a client-streaming handler) for the
 * authenticated owner: reads the header (within lim->header_ms), checks it
 * against limits, the spool's quotas and the uploads in flight (one live
 * stream per upload), appends chunks at contiguous offsets to the spool
 * file (for a resume) and to memory, hashing them as they come, and at the
 * end of the stream verifies length and SHA-256. On success out->data holds
 * exactly the bytes hashed, the partial file is gone, and 0 is returned; the handler answers with
 * net_upload_answer. On failure returns the status to answer with (message in err); a broken or
 * stalled stream keeps what was received for a resume, a wrong hash keeps nothing. */
NetStatus net_upload_receive(NetCall *c, NetSpool *sp, const char *owner, const NetLimits *lim,
                             NetReceived *out, char *err);
/* Sends an UploadStatus (the answer of an upload or of a resume query). */
int net_upload_answer(NetCall *c, const char *upload_id, uint64_t committed, int complete);
/* The query handler's body: reads an UploadQuery, answers the committed
 * offset of the owner's upload of that id (another owner's is invisible). */
void net_upload_query_handle(NetCall *c, NetSpool *sp, const char *owner);

/* Client side: asks the receiver how much of upload_id it holds
 * (query_method), then streams the rest (upload_method). *committed_out
 * (may be NULL) gets where the stream started. */
NetStatus net_upload(NetChannel *ch, const char *upload_method, const char *query_method,
                     const NetTransferSpec *spec, const uint8_t *data, size_t len,
                     int64_t timeout_ms, uint64_t *resumed_from, char *details, size_t details_len);

/* Server side of a download (a server-streaming handler). */
int net_download_send(NetCall *c, const NetTransferSpec *spec, const uint8_t *data, size_t len,
                      char *err);
/* The same from byte `from` of the payload (a resume the receiver asked
 * for; past its end: from 0). */
int net_download_send_from(NetCall *c, const NetTransferSpec *spec, const uint8_t *data, size_t len,
                           uint64_t from, char *err);
/* A download cut part-way: the first `have` bytes of a payload of `total`
 * whose SHA-256 the sender's header gave; owned. */
typedef struct NetDownloadHeld {
    uint8_t *data;
    uint64_t have, total;
    uint8_t sha[32];
} NetDownloadHeld;
void net_download_held_free(NetDownloadHeld *h);
/* What a download's header said: its round (what the sender says it sent)
 * and its purpose-specific meta (a header with more is malformed). */
#define NET_DOWNLOAD_META_MAX 64
typedef struct NetDownloadHead {
    uint64_t round;
    uint8_t meta[NET_DOWNLOAD_META_MAX];
    size_t meta_len;
} NetDownloadHead;
/* Client side: sends the request, receives and verifies the payload into a
 * malloc'd buffer (header checked against lim before allocating); *head
 * (may be NULL) gets the header's round and meta.
 * With held (may be NULL): a download cut part-way leaves what came in it,
 * and the next call (whose request asks to resume at held->have, a
 * protocol's matter) takes a header at exactly that offset, of the same
 * payload, as the rest of it; a header at 0 starts over. */
NetStatus net_download(NetChannel *ch, const char *method, const void *req, size_t req_len,
                       const NetLimits *lim, int64_t timeout_ms, NetBuf *payload,
                       NetDownloadHead *head, NetDownloadHeld *held, char *details,
                       size_t details_len);

#endif /* STRAIT_NET_H */
