/*
 * net.h — the API of net/: the one wrapper over gRPC core. No other folder
 * includes a gRPC header.
 *
 * Server: a gRPC server with TLS that requests and verifies a client
 * certificate (methods say whether they require one), registered methods
 * (unary, server-streaming, client-streaming) whose handlers run on a
 * bounded pool of worker threads — when every worker is busy a new call is
 * answered RESOURCE_EXHAUSTED at once — plus UNIMPLEMENTED for unknown
 * methods. Handlers are plain blocking code: receive, send, set a status.
 *
 * Client: a channel to HOST:PORT with TLS (server-authenticated only when no
 * client certificate is given, as for Join; mutual otherwise), and calls with
 * deadlines and cancellation.
 *
 * Transfers (net/transfer.c): payloads streamed as a TransferHeader and 1 MiB
 * chunks, checked against limits before anything is allocated, verified by
 * length and SHA-256, and resumable: the receiver spools partial uploads to
 * disk by upload id.
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

typedef struct NetServerConfig {
    const char *listen; /* "127.0.0.1:0" picks a free port */
    NetTls tls;         /* ca_pem verifies client certificates */
    int workers;        /* handler threads; a call beyond gets RESOURCE_EXHAUSTED */
    size_t max_message; /* bytes, both directions (default 8 MiB) */
    int keepalive_ms;   /* ping idle clients this often (default 30 s) */
} NetServerConfig;

NetServer *net_server_create(const NetServerConfig *cfg, char *err);
/* path "/strait.Federation/Hello"; require_cert: refuse callers without a
 * verified client certificate with UNAUTHENTICATED before the handler runs. */
int net_server_add_method(NetServer *s, const char *path, NetMethodKind kind, int require_cert,
                          NetHandler handler, void *user, char *err);
/* Binds, starts the dispatcher and the workers; *port gets the bound port. */
int net_server_start(NetServer *s, int *port, char *err);
/* Stops taking calls, lets running ones finish for grace_ms, cancels the
 * rest, joins every thread and frees the server. */
void net_server_stop(NetServer *s, int grace_ms);

typedef enum NetRecv { NET_RECV_BROKEN = -1, NET_RECV_END = 0, NET_RECV_MESSAGE = 1 } NetRecv;

/* The next client message: MESSAGE (msg filled), END (the client finished
 * sending) or BROKEN (cancelled, deadline passed, peer gone). For unary and
 * server-streaming calls the request is the first message. */
NetRecv net_call_recv(NetCall *c, NetBuf *msg);
/* Sends a response message; data must stay valid until it returns. */
int net_call_send(NetCall *c, const void *data, size_t len);
/* The status the call ends with (printf-style message). */
void net_call_status(NetCall *c, NetStatus code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

typedef struct NetPeer {
    int has_cert;  /* a client certificate verified against the CA */
    char name[65]; /* its subject CN */
    char serial_hex[80];
    char sha256_hex[65]; /* fingerprint of the DER certificate */
    int64_t not_after;   /* ms since the epoch */
} NetPeer;

const NetPeer *net_call_peer(NetCall *c);
const char *net_call_method(NetCall *c);
/* Milliseconds left before the caller's deadline (INT64_MAX: none). */
int64_t net_call_deadline_ms(NetCall *c);
/* Whether the call was cancelled or its deadline passed; waits up to
 * wait_ms for the news. */
int net_call_cancelled(NetCall *c, int wait_ms);

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

/* What a receiver accepts. */
typedef struct NetLimits {
    uint64_t max_total; /* bytes of one payload */
} NetLimits;

/* The receiver's disk for partial uploads: one file per upload id, bounded
 * in total bytes, files untouched for expiry_ms removed. Thread-safe. */
typedef struct NetSpool NetSpool;
NetSpool *net_spool_open(const char *dir, uint64_t max_bytes, int64_t expiry_ms, char *err);
void net_spool_close(NetSpool *sp);
/* Bytes held for an upload id (0 if none). */
uint64_t net_spool_committed(NetSpool *sp, const char *upload_id);
/* Removes an upload's file (after the caller has used a complete one). */
void net_spool_release(NetSpool *sp, const char *upload_id);

typedef struct NetReceived {
    char upload_id[NET_UPLOAD_ID_MAX + 1];
    char purpose[32];
    uint64_t round;
    uint64_t length;
    char path[1024]; /* the complete payload, in the spool */
    uint8_t *meta;   /* owned; free with net_received_free */
    size_t meta_len;
} NetReceived;
void net_received_free(NetReceived *r);

/* Server side of an upload (a client-streaming handler): reads the header,
 * checks it against limits and the spool, appends chunks at contiguous
 * offsets, and on the end of the stream verifies length and SHA-256. On
 * success the payload is complete in out->path and 0 is returned; the
 * handler answers with net_upload_answer. On failure returns the status to
 * answer with (message in err); a broken stream keeps what was received
 * for a resume, a wrong hash keeps nothing. */
NetStatus net_upload_receive(NetCall *c, NetSpool *sp, const NetLimits *lim, NetReceived *out,
                             char *err);
/* Sends an UploadStatus (the answer of an upload or of a resume query). */
int net_upload_answer(NetCall *c, const char *upload_id, uint64_t committed, int complete);
/* The query handler's body: reads an UploadQuery, answers its committed
 * offset from the spool. */
void net_upload_query_handle(NetCall *c, NetSpool *sp);

/* Client side: asks the receiver how much of upload_id it holds
 * (query_method), then streams the rest (upload_method). *committed_out
 * (may be NULL) gets where the stream started. */
NetStatus net_upload(NetChannel *ch, const char *upload_method, const char *query_method,
                     const NetTransferSpec *spec, const uint8_t *data, size_t len,
                     int64_t timeout_ms, uint64_t *resumed_from, char *details, size_t details_len);

/* Server side of a download (a server-streaming handler). */
int net_download_send(NetCall *c, const NetTransferSpec *spec, const uint8_t *data, size_t len,
                      char *err);
/* Client side: sends the request, receives and verifies the payload into a
 * malloc'd buffer (header checked against lim before allocating). */
NetStatus net_download(NetChannel *ch, const char *method, const void *req, size_t req_len,
                       const NetLimits *lim, int64_t timeout_ms, NetBuf *payload, char *details,
                       size_t details_len);

#endif /* STRAIT_NET_H */
