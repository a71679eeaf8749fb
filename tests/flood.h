/*
 * flood.h — an unauthenticated network peer, for the flood tests
 * (tests/integration/test_flood.c): raw TCP connections it never speaks
 * on, TLS connections without a certificate that open HTTP/2 streams it
 * never finishes, and calls whose answers it never reads. Each connection
 * comes from a loopback address of the caller's choice (127.0.0.2 and up:
 * another address than the honest sites'), so that what the coordinator
 * holds per address can be seen. Hand-made frames (RFC 9113, HPACK literals
 * only), as any peer could send them; nothing here is a Strait client.
 */
#ifndef STRAIT_TESTS_FLOOD_H
#define STRAIT_TESTS_FLOOD_H

#include <stddef.h>

/* A TCP connection to addr ("127.0.0.1:PORT") from src ("127.0.0.9"), or
 * -1. The descriptor is the caller's. */
int flood_connect(const char *addr, const char *src);
/* Of n descriptors, how many the other end has closed (EOF or reset)
 * within wait_ms. */
int flood_count_closed(const int *fds, int n, int wait_ms);

/* A TCP connection that starts a TLS handshake it never finishes: a
 * ClientHello longer than what it sends, `bytes` of it, then silence (bytes
 * a server holds before any certificate); the descriptor, or -1. */
int flood_hello_stall(const char *addr, const char *src, size_t bytes);

typedef struct FloodTls FloodTls;
/* TLS without a client certificate (the server's is not verified: this
 * peer is anyone), ALPN h2, then the HTTP/2 preface and an empty SETTINGS;
 * NULL when the server refused the connection. */
FloodTls *flood_tls_open(const char *addr, const char *src);
/* The same presenting a client certificate (PEM files). */
FloodTls *flood_tls_open_as(const char *addr, const char *src, const char *cert_file,
                            const char *key_file);
/* TLS to the enrollment port (its ALPN), then `bytes` of a request of the
 * largest length it takes (16 KiB), never finished; NULL when refused. */
FloodTls *flood_join_hold(const char *addr, const char *src, size_t bytes);
/* Opens n streams on it: HEADERS of a gRPC call to path, without its
 * request (no DATA, no END_STREAM) when with_body is 0, or with a 5-byte
 * empty gRPC message and END_STREAM when 1; the stream ids go on from the
 * last call. Nothing is read. Returns the streams sent before the
 * connection failed. */
int flood_tls_streams(FloodTls *t, const char *path, int n, int with_body);
/* Bytes the server has sent that are waiting, unread, in this end's socket. */
int flood_tls_unread(FloodTls *t);
/* Whether the server has closed the connection (read until EOF, at most
 * wait_ms). */
int flood_tls_closed(FloodTls *t, int wait_ms);
void flood_tls_close(FloodTls *t);

/* The resident set of a process, in bytes (0 if unknown). */
long flood_rss(int pid);

#endif
