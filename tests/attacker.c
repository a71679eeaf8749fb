/*
 * attacker.c — the malicious site of attacker.h: real frames, chosen
 * fields. Frames are packed with protoc-c, as any gRPC client could.
 */
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <criterion/criterion.h>

#include "client/client.h"
#include "coordinator/coordinator.h"
#include "schema/strait.pb-c.h"
#include "security/security.h"
#include "tests/attacker.h"
#include "util/util.h"

#define UPLOAD "/strait.Federation/PushUpdate"
#define QUERY  "/strait.Federation/QueryUpload"
#define CHUNK  (64u << 10)

void attacker_enroll(const char *fed, const char *addr, const char *name, const char *site_dir) {
    char token[65], fp[65], err[ERR_LEN];
    cr_assert_eq(coordinator_enroll(fed, name, 3600000, token, err), 0, "%s", err);
    cr_assert_eq(coordinator_home_info(fed, fp, NULL, 0, err), 0, "%s", err);
    char join[300];
    cr_assert_eq(coordinator_join_address(fed, join, sizeof join, err), 0, "%s", err);
    SiteJoinOptions o = {site_dir, name, addr, token, fp, join};
    cr_assert_eq(client_join(&o, err), 0, "join of %s: %s", name, err);
}

NetChannel *attacker_channel(const char *site_dir, const char *addr) {
    char *ca, *cert, *key, err[ERR_LEN], path[800], target[80];
    snprintf(path, sizeof path, "%s/ca.crt", site_dir);
    cr_assert_eq(file_read_all(path, 1 << 20, &ca, NULL, err), 0, "%s", err);
    snprintf(path, sizeof path, "%s/site.crt", site_dir);
    cr_assert_eq(file_read_all(path, 1 << 20, &cert, NULL, err), 0, "%s", err);
    snprintf(path, sizeof path, "%s/site.key", site_dir);
    cr_assert_eq(file_read_all(path, 1 << 20, &key, NULL, err), 0, "%s", err);
    snprintf(target, sizeof target, "ipv4:%s", addr);
    NetChannelConfig cc = {target, {ca, cert, key}, NULL, 0, 0};
    NetChannel *ch = net_channel_create(&cc, err);
    cr_assert_not_null(ch, "%s", err);
    free(ca), free(cert), free(key);
    return ch;
}

static size_t pack_meta(const AttackClaim *a, const AttackMore *more, uint8_t *buf) {
    static const AttackMore none;
    if (more == NULL) more = &none;
    Strait__UpdateMeta meta = STRAIT__UPDATE_META__INIT;
    meta.tokens = a->tokens;
    meta.train_loss = more->train_loss != 0 ? more->train_loss : 3.0;
    meta.eval_loss = a->eval_loss != 0 ? a->eval_loss : 3.0;
    meta.steps = a->steps;
    meta.train_ms = a->train_ms;
    meta.download_ms = a->download_ms;
    meta.decode_ms = more->decode_ms;
    meta.eval_ms = more->eval_ms;
    meta.encode_ms = more->encode_ms;
    meta.start_eval_loss = more->start_eval_loss;
    if (a->base) meta.base_sha256.data = (uint8_t *)a->base, meta.base_sha256.len = 32;
    return strait__update_meta__pack(&meta, buf);
}

NetStatus attacker_push(NetChannel *ch, const AttackClaim *a, const Blob *b, char *details,
                        size_t details_len) {
    return attacker_push_more(ch, a, NULL, b, details, details_len);
}

NetStatus attacker_push_more(NetChannel *ch, const AttackClaim *a, const AttackMore *more,
                             const Blob *b, char *details, size_t details_len) {
    uint8_t mbuf[192];
    size_t mlen = pack_meta(a, more, mbuf);
    NetTransferSpec spec = {
        a->purpose ? a->purpose : "update", a->round, a->upload_id, 0, mbuf, mlen, NULL};
    /* 30 s, and a second more for every 4 MB past that (a GPT-2 large update
     * shares loopback with five others) */
    int deadline_ms = 30000 + (int)(b->len / 4000);
    return net_upload(ch, UPLOAD, QUERY, &spec, b->data, b->len, deadline_ms, NULL, details,
                      details_len);
}

/* A StreamFrame packed into a malloc'd buffer. */
static uint8_t *pack_frame(const Strait__StreamFrame *fr, size_t *len) {
    *len = strait__stream_frame__get_packed_size(fr);
    uint8_t *buf = malloc(*len);
    cr_assert_not_null(buf);
    strait__stream_frame__pack(fr, buf);
    return buf;
}

/* One chunk of b, n bytes at offset at, on an opened upload. */
static int send_chunk(NetClientCall *c, const Blob *b, uint64_t at, size_t n) {
    Strait__Chunk ck = STRAIT__CHUNK__INIT;
    ck.offset = at;
    ck.data.data = b->data + at, ck.data.len = n;
    Strait__StreamFrame fr = STRAIT__STREAM_FRAME__INIT;
    fr.frame_case = STRAIT__STREAM_FRAME__FRAME_CHUNK;
    fr.chunk = &ck;
    size_t len;
    uint8_t *buf = pack_frame(&fr, &len);
    int rc = net_client_send(c, buf, len);
    free(buf);
    return rc;
}

NetClientCall *attacker_open(NetChannel *ch, const AttackClaim *a, const Blob *b) {
    uint8_t mbuf[128], sha[32];
    size_t mlen = pack_meta(a, NULL, mbuf);
    security_sha256(b->data, b->len, sha);
    Strait__TransferHeader h = STRAIT__TRANSFER_HEADER__INIT;
    h.purpose = (char *)(a->purpose ? a->purpose : "update");
    h.round = a->round;
    h.upload_id = (char *)a->upload_id;
    h.total_length = b->len;
    h.sha256.data = sha, h.sha256.len = 32;
    h.chunk_size = CHUNK;
    h.meta.data = mbuf, h.meta.len = mlen;
    Strait__StreamFrame fr = STRAIT__STREAM_FRAME__INIT;
    fr.frame_case = STRAIT__STREAM_FRAME__FRAME_HEADER;
    fr.header = &h;
    size_t n;
    uint8_t *buf = pack_frame(&fr, &n);
    char err[ERR_LEN];
    NetClientCall *c = net_client_start(ch, UPLOAD, 60000, err);
    cr_assert_not_null(c, "%s", err);
    net_client_send(c, buf, n); /* may fail: the server refused the call at once */
    free(buf);
    return c;
}

NetStatus attacker_stream_rest(NetClientCall *c, const Blob *b, uint64_t from, char *details,
                               size_t details_len) {
    int ok = 1;
    for (uint64_t at = from; ok && at < b->len; at += CHUNK)
        ok = send_chunk(c, b, at, b->len - at < CHUNK ? (size_t)(b->len - at) : CHUNK) == 0;
    if (ok) net_client_close_send(c);
    NetBuf resp = {NULL, 0};
    net_client_recv(c, &resp);
    net_buf_free(&resp);
    return net_client_finish(c, details, details_len);
}

NetStatus attacker_trickle(NetClientCall *c, const Blob *b, size_t step, int interval_ms, int sends,
                           uint64_t *sent, char *details, size_t details_len) {
    uint64_t at = 0;
    for (int i = 0; i < sends && at < b->len; i++) {
        size_t n = b->len - at < step ? (size_t)(b->len - at) : step;
        if (send_chunk(c, b, at, n) != 0) break;
        at += n;
        usleep((useconds_t)interval_ms * 1000);
    }
    if (sent) *sent = at;
    NetBuf resp = {NULL, 0};
    net_client_recv(c, &resp);
    net_buf_free(&resp);
    return net_client_finish(c, details, details_len);
}

uint64_t attacker_query(NetChannel *ch, const char *upload_id) {
    Strait__UploadQuery q = STRAIT__UPLOAD_QUERY__INIT;
    q.upload_id = (char *)upload_id;
    uint8_t buf[128];
    size_t n = strait__upload_query__pack(&q, buf);
    NetBuf resp;
    char details[256];
    NetStatus st = net_unary(ch, QUERY, buf, n, &resp, 10000, details, sizeof details);
    cr_assert_eq(st, NET_OK, "QueryUpload: %s", details);
    Strait__UploadStatus *us = strait__upload_status__unpack(NULL, resp.len, resp.data);
    net_buf_free(&resp);
    cr_assert_not_null(us);
    uint64_t committed = us->committed;
    strait__upload_status__free_unpacked(us, NULL);
    return committed;
}

Blob attacker_encode(const char *codec, uint64_t table_hash, const float *x, uint64_t n) {
    CodecParams p;
    char err[ERR_LEN];
    cr_assert_eq(codec_params_parse(codec, &p, err), 0, "%s", err);
    CodecLayout L = {table_hash, n, NULL, 0};
    Blob b = {0};
    cr_assert_eq(codec_encode(&p, &L, x, &b, err), 0, "%s", err);
    return b;
}

Blob attacker_update(const char *codec, uint64_t table_hash, uint64_t n, float v, float scale) {
    float *x = malloc(n * sizeof(float));
    for (uint64_t i = 0; i < n; i++) x[i] = v != 0 ? v : scale * (float)((int)(i % 7) - 3);
    Blob b = attacker_encode(codec, table_hash, x, n);
    free(x);
    return b;
}

NetStatus attacker_heartbeat(NetChannel *ch, uint64_t round, int64_t timeout_ms, AttackBeat *out,
                             char *details, size_t details_len) {
    Strait__HeartbeatRequest req = STRAIT__HEARTBEAT_REQUEST__INIT;
    req.round = round;
    req.state = "training";
    uint8_t buf[64];
    size_t n = strait__heartbeat_request__pack(&req, buf);
    NetBuf resp;
    NetStatus st = net_unary(ch, "/strait.Federation/Heartbeat", buf, n, &resp, timeout_ms, details,
                             details_len);
    if (st != NET_OK) return st;
    Strait__HeartbeatResponse *hr = strait__heartbeat_response__unpack(NULL, resp.len, resp.data);
    net_buf_free(&resp);
    cr_assert_not_null(hr, "a Heartbeat answer that does not parse");
    if (out) {
        out->current_round = hr->current_round;
        out->finished = hr->finished, out->reported = hr->reported;
    }
    strait__heartbeat_response__free_unpacked(hr, NULL);
    return NET_OK;
}
