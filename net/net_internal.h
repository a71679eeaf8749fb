/*
 * net_internal.h — what the files of net/ share; the only header besides
 * their .c files that includes gRPC. Nothing outside net/ includes it.
 */
#ifndef STRAIT_NET_INTERNAL_H
#define STRAIT_NET_INTERNAL_H

#include <grpc/byte_buffer.h>
#include <grpc/byte_buffer_reader.h>
#include <grpc/grpc.h>
#include <grpc/grpc_security.h>
#include <grpc/support/alloc.h>
#include <grpc/support/log.h>
#include <grpc/support/time.h>

#include "net.h"

#define NET_MAX_MESSAGE_DEFAULT      (8u << 20)
#define NET_KEEPALIVE_DEFAULT_MS     30000
#define NET_RECONNECT_BACKOFF_MAX_MS 4000
#define NET_CONNECT_TIMEOUT_MS       5000 /* SYNs at 0, 1 and 3 s, then a new attempt */
#define NET_COMMON_ARGS              7

/* TLS 1.3 as the minimum on SSL credentials just created (before use);
 * without the setter in this libgrpc (see net_tls13_only) they do nothing. */
void net_server_creds_tls13(grpc_server_credentials *creds);
void net_channel_creds_tls13(grpc_channel_credentials *creds);

/* The status details a wait of this call that times out cancels it with
 * (NULL: "the peer was too slow"); the peer sees them. */
void net_call_slow_reason(NetCall *c, const char *why);

/* Copies a received byte buffer into msg (malloc'd). */
int net_bb_read(grpc_byte_buffer *bb, NetBuf *msg);
/* Shuts a pluck queue down and drains it to GRPC_QUEUE_SHUTDOWN. */
void net_cq_drain_destroy(grpc_completion_queue *cq);
/* Message-size, keepalive and flow-control arguments for both sides;
 * fills args (NET_COMMON_ARGS entries) and returns how many. */
int net_common_args(grpc_arg *args, size_t max_message, int keepalive_ms);

/* A message sent as two pieces (a frame prefix and its data) without
 * copying either; both stay the caller's and valid until the call returns. */
int net_client_send2(NetClientCall *c, const void *a, size_t alen, const void *b, size_t blen);
int net_call_send2(NetCall *c, const void *a, size_t alen, const void *b, size_t blen);

/* guard.c: an address whose call carried a verified certificate may use
 * the connections' reserve for the next hour; connection caps on. */
void net_guard_trust(const char *addr, int port, const char *sha256_hex);
/* Every connection a call of this certificate has come on is pending
 * again, budgeted as an untrusted address's (it was refused for good). */
void net_guard_deny_cert(const char *sha256_hex);
/* The connection from addr:port is pending again (its certificate was
 * refused for good): under the byte budget, and evictable. */
void net_guard_unvouch(const char *addr, int port);
void net_guard_set(const NetGuardLimits *lim);

#endif
