/*
 * transfer.c — payloads over streams: a StreamFrame with the TransferHeader,
 * then StreamFrames with Chunks (schema/strait.proto).
 *
 * Receivers check the header against their limits before they allocate or
 * spool anything, require contiguous offsets, and accept a payload only
 * when its length and SHA-256 match the header. Uploads are spooled to disk
 * by upload id, so a sender that died resumes where the receiver's file
 * ends (QueryUpload); downloads go to memory, bounded by the limit.
 *
 * Chunk frames are written and read by hand — the exact protobuf encoding
 * of StreamFrame{chunk: Chunk{offset, data}} — so 1 MiB of data is never
 * copied into or out of a protobuf-c struct; any protobuf reader can read
 * them, and frames laid out differently fall back to protoc-c.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <openssl/evp.h>

#include "net_internal.h"
#include "schema/strait.pb-c.h"
#include "security/security.h"
#include "util/util.h"

/* ---- frames ---------------------------------------------------------------- */

static size_t put_varint(uint8_t *p, uint64_t v) {
    size_t n = 0;
    while (v >= 0x80) {
        p[n++] = (uint8_t)(v | 0x80);
        v >>= 7;
    }
    p[n++] = (uint8_t)v;
    return n;
}

static size_t varint_len(uint64_t v) {
    size_t n = 1;
    while (v >= 0x80) v >>= 7, n++;
    return n;
}

/* The bytes before the data of a chunk frame; returns their count (<= 32). */
static size_t chunk_prefix(uint8_t *p, uint64_t offset, size_t len) {
    size_t inner = 1 + varint_len(offset) + 1 + varint_len(len) + len, n = 0;
    p[n++] = 0x12; /* StreamFrame.chunk, length-delimited */
    n += put_varint(p + n, inner);
    p[n++] = 0x08; /* Chunk.offset, varint */
    n += put_varint(p + n, offset);
    p[n++] = 0x12; /* Chunk.data, length-delimited */
    n += put_varint(p + n, len);
    return n;
}

static int get_varint(const uint8_t **p, const uint8_t *end, uint64_t *v) {
    uint64_t x = 0;
    for (int shift = 0; shift < 64 && *p < end; shift += 7) {
        uint8_t b = *(*p)++;
        x |= (uint64_t)(b & 0x7f) << shift;
        if (!(b & 0x80)) {
            *v = x;
            return 0;
        }
    }
    return -1;
}

typedef struct Frame {
    int is_chunk;
    uint64_t offset;     /* chunk */
    const uint8_t *data; /* chunk: points into the message or into pb */
    size_t len;
    Strait__StreamFrame *pb; /* when decoded by protoc-c; owned */
} Frame;

static void frame_free(Frame *f) {
    if (f->pb) strait__stream_frame__free_unpacked(f->pb, NULL);
    f->pb = NULL;
}

/* 0, or -1 if the bytes are not a StreamFrame. */
static int frame_parse(const NetBuf *m, Frame *f) {
    memset(f, 0, sizeof *f);
    const uint8_t *p = m->data, *end = m->data + m->len;
    uint64_t inner, tag_off, len;
    /* the fast path: exactly what chunk_prefix writes */
    if (m->len > 0 && p[0] == 0x12) {
        const uint8_t *q = p + 1;
        if (get_varint(&q, end, &inner) == 0 && inner == (uint64_t)(end - q) && q < end &&
            *q == 0x08) {
            q++;
            if (get_varint(&q, end, &tag_off) == 0 && q < end && *q == 0x12) {
                q++;
                if (get_varint(&q, end, &len) == 0 && len == (uint64_t)(end - q)) {
                    f->is_chunk = 1;
                    f->offset = tag_off;
                    f->data = q;
                    f->len = len;
                    return 0;
                }
            }
        }
    }
    f->pb = strait__stream_frame__unpack(NULL, m->len, m->data);
    if (f->pb == NULL) return -1;
    if (f->pb->frame_case == STRAIT__STREAM_FRAME__FRAME_CHUNK && f->pb->chunk) {
        f->is_chunk = 1;
        f->offset = f->pb->chunk->offset;
        f->data = f->pb->chunk->data.data;
        f->len = f->pb->chunk->data.len;
    } else if (f->pb->frame_case != STRAIT__STREAM_FRAME__FRAME_HEADER || !f->pb->header) {
        frame_free(f);
        return -1;
    }
    return 0;
}

static int valid_upload_id(const char *id) {
    size_t n = strlen(id);
    if (n == 0 || n > NET_UPLOAD_ID_MAX || id[0] == '.') return 0;
    for (size_t i = 0; i < n; i++) {
        char ch = id[i];
        if (!((ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || (ch >= '0' && ch <= '9') ||
              ch == '.' || ch == '_' || ch == '-'))
            return 0;
    }
    return 1;
}

/* Packs the header frame into a malloc'd buffer. */
static uint8_t *header_frame(const NetTransferSpec *spec, uint64_t total, const uint8_t sha[32],
                             uint32_t chunk, uint64_t offset, size_t *len) {
    Strait__TransferHeader h = STRAIT__TRANSFER_HEADER__INIT;
    h.purpose = (char *)(spec->purpose ? spec->purpose : "");
    h.round = spec->round;
    h.upload_id = (char *)(spec->upload_id ? spec->upload_id : "");
    h.total_length = total;
    h.sha256.data = (uint8_t *)sha;
    h.sha256.len = 32;
    h.chunk_size = chunk;
    h.offset = offset;
    h.meta.data = (uint8_t *)spec->meta;
    h.meta.len = spec->meta ? spec->meta_len : 0;
    Strait__StreamFrame fr = STRAIT__STREAM_FRAME__INIT;
    fr.frame_case = STRAIT__STREAM_FRAME__FRAME_HEADER;
    fr.header = &h;
    *len = strait__stream_frame__get_packed_size(&fr);
    uint8_t *buf = malloc(*len ? *len : 1);
    if (buf) strait__stream_frame__pack(&fr, buf);
    return buf;
}

/* ---- spool ----------------------------------------------------------------- */

struct NetSpool {
    char dir[900];
    uint64_t max_bytes;
    int64_t expiry_ms;
    pthread_mutex_t lock;
};

static void spool_path(const NetSpool *sp, const char *id, char *path, size_t size) {
    snprintf(path, size, "%s/%s.part", sp->dir, id);
}

NetSpool *net_spool_open(const char *dir, uint64_t max_bytes, int64_t expiry_ms, char *err) {
    if (file_mkdir_p(dir, 0700, err) != 0) return NULL;
    NetSpool *sp = calloc(1, sizeof *sp);
    if (sp == NULL) {
        err_set(err, "out of memory");
        return NULL;
    }
    snprintf(sp->dir, sizeof sp->dir, "%s", dir);
    sp->max_bytes = max_bytes;
    sp->expiry_ms = expiry_ms;
    pthread_mutex_init(&sp->lock, NULL);
    return sp;
}

void net_spool_close(NetSpool *sp) {
    if (sp == NULL) return;
    pthread_mutex_destroy(&sp->lock);
    free(sp);
}

uint64_t net_spool_committed(NetSpool *sp, const char *id) {
    if (!valid_upload_id(id)) return 0;
    char path[1024];
    spool_path(sp, id, path, sizeof path);
    struct stat st;
    return stat(path, &st) == 0 ? (uint64_t)st.st_size : 0;
}

void net_spool_release(NetSpool *sp, const char *id) {
    if (!valid_upload_id(id)) return;
    char path[1024];
    spool_path(sp, id, path, sizeof path);
    unlink(path);
}

/* Removes expired uploads and returns the bytes the rest hold. */
static uint64_t spool_sweep(NetSpool *sp, const char *keep) {
    DIR *d = opendir(sp->dir);
    if (d == NULL) return 0;
    uint64_t used = 0;
    int64_t now = time_wall_ms();
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        size_t n = strlen(e->d_name);
        if (n < 6 || strcmp(e->d_name + n - 5, ".part") != 0) continue;
        char path[1400];
        snprintf(path, sizeof path, "%s/%s", sp->dir, e->d_name);
        struct stat st;
        if (stat(path, &st) != 0) continue;
        int64_t age = now - (int64_t)st.st_mtime * 1000;
        int is_keep = keep && strncmp(e->d_name, keep, n - 5) == 0 && strlen(keep) == n - 5;
        if (!is_keep && sp->expiry_ms > 0 && age > sp->expiry_ms) {
            unlink(path);
            log_info("net", "spool: removed %s, untouched for %lld s", e->d_name,
                     (long long)(age / 1000));
            continue;
        }
        if (!is_keep) used += (uint64_t)st.st_size;
    }
    closedir(d);
    return used;
}

/* ---- upload: receiver ----------------------------------------------------- */

void net_received_free(NetReceived *r) {
    free(r->meta);
    r->meta = NULL;
}

static int hash_prefix(EVP_MD_CTX *ctx, int fd, uint64_t len) {
    enum { PIECE = 1 << 20 };
    uint8_t *buf = malloc(PIECE);
    if (buf == NULL) return -1;
    uint64_t at = 0;
    while (at < len) {
        size_t want = len - at < PIECE ? (size_t)(len - at) : PIECE;
        ssize_t r = pread(fd, buf, want, (off_t)at);
        if (r <= 0) {
            free(buf);
            return -1;
        }
        EVP_DigestUpdate(ctx, buf, (size_t)r);
        at += (uint64_t)r;
    }
    free(buf);
    return 0;
}

static int write_all(int fd, const uint8_t *p, size_t n) {
    while (n > 0) {
        ssize_t w = write(fd, p, n);
        if (w < 0) {
            if (errno == EINTR) continue;
            return -1;
        }
        p += w;
        n -= (size_t)w;
    }
    return 0;
}

NetStatus net_upload_receive(NetCall *c, NetSpool *sp, const NetLimits *lim, NetReceived *out,
                             char *err) {
    memset(out, 0, sizeof *out);
    NetBuf m;
    NetRecv r = net_call_recv(c, &m);
    if (r != NET_RECV_MESSAGE) {
        err_set(err, "the stream ended before its header");
        return r == NET_RECV_BROKEN ? NET_CANCELLED : NET_INVALID_ARGUMENT;
    }
    Frame f;
    if (frame_parse(&m, &f) != 0 || f.is_chunk) {
        frame_free(&f);
        net_buf_free(&m);
        err_set(err, "a stream must start with its TransferHeader");
        return NET_INVALID_ARGUMENT;
    }
    const Strait__TransferHeader *h = f.pb->header;
    NetStatus st = NET_INVALID_ARGUMENT;
    int fd = -1;
    EVP_MD_CTX *ctx = NULL;
    uint8_t sha[32];
    uint64_t total = h->total_length, expected = h->offset;
    /* everything checked before a byte is spooled */
    if (!valid_upload_id(h->upload_id)) {
        err_set(err, "upload id '%.70s' must be 1-64 of [A-Za-z0-9._-]", h->upload_id);
        goto out;
    }
    if (total > lim->max_total) {
        err_set(err, "payload of %llu bytes is over this receiver's limit of %llu",
                (unsigned long long)total, (unsigned long long)lim->max_total);
        st = NET_RESOURCE_EXHAUSTED;
        goto out;
    }
    if (h->chunk_size < NET_CHUNK_MIN || h->chunk_size > NET_CHUNK_MAX || h->sha256.len != 32 ||
        strlen(h->purpose) >= sizeof out->purpose || h->meta.len > 65536 || h->offset > total) {
        err_set(err, "malformed transfer header (chunk size, hash, purpose, meta or offset)");
        goto out;
    }
    memcpy(sha, h->sha256.data, 32);
    pthread_mutex_lock(&sp->lock);
    uint64_t held = net_spool_committed(sp, h->upload_id);
    uint64_t others = spool_sweep(sp, h->upload_id);
    pthread_mutex_unlock(&sp->lock);
    if (h->offset > held) {
        err_set(err, "upload %s: this receiver holds %llu bytes; resume from there", h->upload_id,
                (unsigned long long)held);
        st = NET_FAILED_PRECONDITION;
        goto out;
    }
    if (others + total > sp->max_bytes) {
        err_set(err, "spool is full (%llu bytes held of %llu); retry later",
                (unsigned long long)others, (unsigned long long)sp->max_bytes);
        st = NET_RESOURCE_EXHAUSTED;
        goto out;
    }
    char path[1024];
    spool_path(sp, h->upload_id, path, sizeof path);
    fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0600);
    if (fd < 0 || ftruncate(fd, (off_t)h->offset) != 0 ||
        lseek(fd, (off_t)h->offset, SEEK_SET) < 0) {
        err_set_errno(err, "cannot spool upload %s", h->upload_id);
        st = NET_INTERNAL;
        goto out;
    }
    ctx = EVP_MD_CTX_new();
    if (ctx == NULL || EVP_DigestInit_ex(ctx, EVP_sha256(), NULL) != 1 ||
        hash_prefix(ctx, fd, h->offset) != 0) {
        err_set(err, "cannot hash the spooled part of upload %s", h->upload_id);
        st = NET_INTERNAL;
        goto out;
    }
    snprintf(out->upload_id, sizeof out->upload_id, "%s", h->upload_id);
    snprintf(out->purpose, sizeof out->purpose, "%s", h->purpose);
    out->round = h->round;
    if (h->meta.len) {
        out->meta = malloc(h->meta.len);
        if (out->meta) memcpy(out->meta, h->meta.data, h->meta.len), out->meta_len = h->meta.len;
    }
    uint32_t chunk_size = h->chunk_size;
    frame_free(&f);
    net_buf_free(&m);
    for (;;) {
        r = net_call_recv(c, &m);
        if (r == NET_RECV_BROKEN) {
            err_set(err, "upload %s broke off at %llu of %llu bytes; it can resume", out->upload_id,
                    (unsigned long long)expected, (unsigned long long)total);
            st = NET_CANCELLED;
            goto out;
        }
        if (r == NET_RECV_END) break;
        if (frame_parse(&m, &f) != 0 || !f.is_chunk) {
            err_set(err, "upload %s: expected a chunk", out->upload_id);
            goto out;
        }
        if (f.offset != expected || f.len == 0 || f.len > chunk_size || f.len > total - expected) {
            err_set(err, "upload %s: chunk of %zu bytes at %llu, expected one at %llu of %llu",
                    out->upload_id, f.len, (unsigned long long)f.offset,
                    (unsigned long long)expected, (unsigned long long)total);
            goto out;
        }
        if (write_all(fd, f.data, f.len) != 0) {
            err_set_errno(err, "cannot spool upload %s", out->upload_id);
            st = NET_INTERNAL;
            goto out;
        }
        EVP_DigestUpdate(ctx, f.data, f.len);
        expected += f.len;
        frame_free(&f);
        net_buf_free(&m);
    }
    if (expected != total) {
        err_set(err, "upload %s ended at %llu of %llu bytes; resume from there", out->upload_id,
                (unsigned long long)expected, (unsigned long long)total);
        st = NET_ABORTED;
        goto out;
    }
    uint8_t got[32];
    unsigned int n = 0;
    EVP_DigestFinal_ex(ctx, got, &n);
    if (memcmp(got, sha, 32) != 0) {
        close(fd);
        fd = -1;
        unlink(path); /* a wrong payload is kept by no one */
        err_set(err,
                "upload %s: SHA-256 of the %llu bytes does not match the header; "
                "nothing was kept",
                out->upload_id, (unsigned long long)total);
        st = NET_DATA_LOSS;
        goto out;
    }
    /* no fsync: an accepted upload is used at once (decoded into the round's
     * sum); a receiver that crashes loses that sum too, and the sender
     * pushes again. The hash, not the disk, vouches for the bytes. */
    out->length = total;
    snprintf(out->path, sizeof out->path, "%s", path);
    st = NET_OK;
out:
    if (fd >= 0) close(fd);
    EVP_MD_CTX_free(ctx);
    frame_free(&f);
    net_buf_free(&m);
    if (st != NET_OK) net_received_free(out);
    return st;
}

int net_upload_answer(NetCall *c, const char *upload_id, uint64_t committed, int complete) {
    Strait__UploadStatus us = STRAIT__UPLOAD_STATUS__INIT;
    us.upload_id = (char *)upload_id;
    us.committed = committed;
    us.complete = complete;
    uint8_t buf[128];
    size_t n = strait__upload_status__get_packed_size(&us);
    if (n > sizeof buf) return -1;
    strait__upload_status__pack(&us, buf);
    return net_call_send(c, buf, n);
}

void net_upload_query_handle(NetCall *c, NetSpool *sp) {
    NetBuf m;
    if (net_call_recv(c, &m) != NET_RECV_MESSAGE) return;
    Strait__UploadQuery *q = strait__upload_query__unpack(NULL, m.len, m.data);
    net_buf_free(&m);
    if (q == NULL || !valid_upload_id(q->upload_id)) {
        net_call_status(c, NET_INVALID_ARGUMENT, "malformed upload query");
    } else {
        net_upload_answer(c, q->upload_id, net_spool_committed(sp, q->upload_id), 0);
    }
    if (q) strait__upload_query__free_unpacked(q, NULL);
}

/* ---- upload: sender --------------------------------------------------------- */

static uint64_t query_committed(NetChannel *ch, const char *method, const char *id,
                                int64_t timeout_ms) {
    Strait__UploadQuery q = STRAIT__UPLOAD_QUERY__INIT;
    q.upload_id = (char *)id;
    uint8_t buf[128];
    size_t n = strait__upload_query__get_packed_size(&q);
    if (n > sizeof buf) return 0;
    strait__upload_query__pack(&q, buf);
    NetBuf resp;
    if (net_unary(ch, method, buf, n, &resp, timeout_ms, NULL, 0) != NET_OK) return 0;
    Strait__UploadStatus *us = strait__upload_status__unpack(NULL, resp.len, resp.data);
    net_buf_free(&resp);
    uint64_t committed = us ? us->committed : 0;
    if (us) strait__upload_status__free_unpacked(us, NULL);
    return committed;
}

NetStatus net_upload(NetChannel *ch, const char *upload_method, const char *query_method,
                     const NetTransferSpec *spec, const uint8_t *data, size_t len,
                     int64_t timeout_ms, uint64_t *resumed_from, char *details,
                     size_t details_len) {
    uint32_t chunk = spec->chunk_size ? spec->chunk_size : NET_CHUNK_DEFAULT;
    if (!valid_upload_id(spec->upload_id ? spec->upload_id : "") || chunk < NET_CHUNK_MIN ||
        chunk > NET_CHUNK_MAX) {
        if (details) snprintf(details, details_len, "bad upload id or chunk size");
        return NET_INVALID_ARGUMENT;
    }
    uint64_t from =
        query_method ? query_committed(ch, query_method, spec->upload_id, timeout_ms) : 0;
    if (from > len) from = 0; /* the receiver holds something else: start over */
    if (resumed_from) *resumed_from = from;
    uint8_t sha[32];
    if (spec->sha256)
        memcpy(sha, spec->sha256, 32);
    else
        security_sha256(data, len, sha);
    size_t hlen;
    uint8_t *hdr = header_frame(spec, len, sha, chunk, from, &hlen);
    char err[ERR_LEN];
    NetClientCall *c = hdr ? net_client_start(ch, upload_method, timeout_ms, err) : NULL;
    if (c == NULL) {
        free(hdr);
        if (details) snprintf(details, details_len, "%s", hdr ? err : "out of memory");
        return NET_INTERNAL;
    }
    int ok = net_client_send(c, hdr, hlen) == 0;
    free(hdr);
    for (uint64_t at = from; ok && at < len; at += chunk) {
        size_t n = len - at < chunk ? (size_t)(len - at) : chunk;
        uint8_t prefix[32];
        size_t pl = chunk_prefix(prefix, at, n);
        ok = net_client_send2(c, prefix, pl, data + at, n) == 0;
    }
    if (ok) net_client_close_send(c);
    NetBuf resp = {NULL, 0};
    NetRecv r = net_client_recv(c, &resp);
    NetStatus st = net_client_finish(c, details, details_len);
    if (st == NET_OK) {
        Strait__UploadStatus *us =
            r == NET_RECV_MESSAGE ? strait__upload_status__unpack(NULL, resp.len, resp.data) : NULL;
        if (us == NULL || !us->complete || us->committed != len) {
            st = NET_DATA_LOSS;
            if (details) snprintf(details, details_len, "the receiver did not confirm the upload");
        }
        if (us) strait__upload_status__free_unpacked(us, NULL);
    }
    net_buf_free(&resp);
    return st;
}

/* ---- download ---------------------------------------------------------------- */

int net_download_send(NetCall *c, const NetTransferSpec *spec, const uint8_t *data, size_t len,
                      char *err) {
    uint32_t chunk = spec->chunk_size ? spec->chunk_size : NET_CHUNK_DEFAULT;
    if (chunk < NET_CHUNK_MIN || chunk > NET_CHUNK_MAX) return err_set(err, "bad chunk size");
    uint8_t sha[32];
    if (spec->sha256)
        memcpy(sha, spec->sha256, 32);
    else
        security_sha256(data, len, sha);
    size_t hlen;
    uint8_t *hdr = header_frame(spec, len, sha, chunk, 0, &hlen);
    if (hdr == NULL) return err_set(err, "out of memory");
    int rc = net_call_send(c, hdr, hlen);
    free(hdr);
    for (uint64_t at = 0; rc == 0 && at < len; at += chunk) {
        size_t n = len - at < chunk ? (size_t)(len - at) : chunk;
        uint8_t prefix[32];
        size_t pl = chunk_prefix(prefix, at, n);
        rc = net_call_send2(c, prefix, pl, data + at, n);
    }
    if (rc != 0) return err_set(err, "the receiver went away during the download");
    return 0;
}

NetStatus net_download(NetChannel *ch, const char *method, const void *req, size_t req_len,
                       const NetLimits *lim, int64_t timeout_ms, NetBuf *payload, char *details,
                       size_t details_len) {
    payload->data = NULL;
    payload->len = 0;
    char err[ERR_LEN] = "";
    NetClientCall *c = net_client_start(ch, method, timeout_ms, err);
    if (c == NULL) {
        if (details) snprintf(details, details_len, "%s", err);
        return NET_INTERNAL;
    }
    NetStatus bad = NET_OK;
    if (net_client_send(c, req, req_len) == 0) net_client_close_send(c);
    NetBuf m;
    Frame f = {0};
    uint64_t total = 0, at = 0;
    uint32_t chunk = 0;
    uint8_t sha[32];
    NetRecv r = net_client_recv(c, &m);
    if (r == NET_RECV_MESSAGE) {
        if (frame_parse(&m, &f) != 0 || f.is_chunk) {
            bad = NET_INTERNAL;
            err_set(err, "the download did not start with its header");
        } else {
            const Strait__TransferHeader *h = f.pb->header;
            total = h->total_length;
            chunk = h->chunk_size;
            if (total > lim->max_total) {
                bad = NET_RESOURCE_EXHAUSTED;
                err_set(err, "download of %llu bytes is over the limit of %llu",
                        (unsigned long long)total, (unsigned long long)lim->max_total);
            } else if (h->sha256.len != 32 || chunk < NET_CHUNK_MIN || chunk > NET_CHUNK_MAX ||
                       h->offset != 0) {
                bad = NET_INTERNAL;
                err_set(err, "malformed download header");
            } else {
                memcpy(sha, h->sha256.data, 32);
                payload->data = malloc(total ? total : 1);
                if (payload->data == NULL) {
                    bad = NET_RESOURCE_EXHAUSTED;
                    err_set(err, "out of memory for a %llu-byte download",
                            (unsigned long long)total);
                }
            }
        }
        frame_free(&f);
        net_buf_free(&m);
        while (bad == NET_OK && (r = net_client_recv(c, &m)) == NET_RECV_MESSAGE) {
            if (frame_parse(&m, &f) != 0 || !f.is_chunk || f.offset != at || f.len == 0 ||
                f.len > chunk || f.len > total - at) {
                bad = NET_INTERNAL;
                err_set(err, "download chunk out of order or out of bounds at %llu",
                        (unsigned long long)at);
            } else {
                memcpy(payload->data + at, f.data, f.len);
                at += f.len;
            }
            frame_free(&f);
            net_buf_free(&m);
        }
    }
    if (bad != NET_OK) net_client_cancel(c);
    NetStatus st = net_client_finish(c, details, details_len);
    if (bad != NET_OK) {
        st = bad;
        if (details) snprintf(details, details_len, "%s", err);
    } else if (st == NET_OK) {
        uint8_t got[32] = {0};
        if (payload->data) security_sha256(payload->data, at, got);
        if (payload->data == NULL || at != total || memcmp(got, sha, 32) != 0) {
            st = NET_DATA_LOSS;
            if (details)
                snprintf(details, details_len,
                         "download of %llu bytes failed its length or SHA-256 check",
                         (unsigned long long)total);
        }
    }
    if (st != NET_OK)
        net_buf_free(payload);
    else
        payload->len = total;
    return st;
}
