/*
 * transfer.c — payloads over streams: a StreamFrame with the TransferHeader,
 * then StreamFrames with Chunks (schema/strait.proto).
 *
 * Receivers check the header against their limits before they allocate or
 * spool anything, require contiguous offsets, and accept a payload only
 * when its length and SHA-256 match the header. Uploads are spooled to disk
 * by owner (the authenticated sender) and upload id, one live stream per
 * upload, so a sender that died resumes where its file ends (QueryUpload)
 * and no sender reaches another's files. Chunks are hashed as they arrive
 * and the payload handed on is a read-only map of that spool file, so the
 * bytes handed on are the bytes verified, written once and never on the
 * heap. Downloads go to memory, bounded by the limit, hashed as they arrive.
 *
 * Chunk frames are written and read by hand — the exact protobuf encoding
 * of StreamFrame{chunk: Chunk{offset, data}} — so 1 MiB of data is never
 * copied into or out of a protobuf-c struct; any protobuf reader can read
 * them, and frames laid out differently fall back to protoc-c.
 */
#include <assert.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
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

static int write_all(int fd, const uint8_t *p, size_t n);

/* An upload in flight: its (owner, id) is taken, and its declared size is
 * reserved against the quotas until the stream ends. */
typedef struct SpoolLive {
    char owner[NET_UPLOAD_ID_MAX + 1];
    char id[NET_UPLOAD_ID_MAX + 1];
    uint64_t reserved;
} SpoolLive;

struct NetSpool {
    char dir[900];
    uint64_t max_bytes, max_owner_bytes;
    int64_t expiry_ms;
    pthread_mutex_t lock; /* guards live and every file operation that counts */
    SpoolLive *live;
    int n_live, cap_live;
};

static void spool_owner_dir(const NetSpool *sp, const char *owner, char *path, size_t size) {
    snprintf(path, size, "%s/%.64s", sp->dir, owner);
}

static void spool_path(const NetSpool *sp, const char *owner, const char *id, char *path,
                       size_t size) {
    snprintf(path, size, "%s/%.64s/%.64s.part", sp->dir, owner, id);
}

NetSpool *net_spool_open(const char *dir, uint64_t max_bytes, uint64_t max_owner_bytes,
                         int64_t expiry_ms, char *err) {
    if (file_mkdir_p(dir, 0700, err) != 0) return NULL;
    NetSpool *sp = calloc(1, sizeof *sp);
    if (sp == NULL) {
        err_set(err, "out of memory");
        return NULL;
    }
    snprintf(sp->dir, sizeof sp->dir, "%s", dir);
    sp->max_bytes = max_bytes;
    sp->max_owner_bytes = max_owner_bytes ? max_owner_bytes : max_bytes;
    sp->expiry_ms = expiry_ms;
    pthread_mutex_init(&sp->lock, NULL);
    return sp;
}

void net_spool_close(NetSpool *sp) {
    if (sp == NULL) return;
    assert(sp->n_live == 0);
    pthread_mutex_destroy(&sp->lock);
    free(sp->live);
    free(sp);
}

uint64_t net_spool_committed(NetSpool *sp, const char *owner, const char *id) {
    if (!valid_upload_id(owner) || !valid_upload_id(id)) return 0;
    char path[1200];
    spool_path(sp, owner, id, path, sizeof path);
    struct stat st;
    return stat(path, &st) == 0 ? (uint64_t)st.st_size : 0;
}

static int live_find(const NetSpool *sp, const char *owner, const char *id) {
    for (int i = 0; i < sp->n_live; i++)
        if (strcmp(sp->live[i].owner, owner) == 0 && strcmp(sp->live[i].id, id) == 0) return i;
    return -1;
}

/* Walks one owner's folder: removes expired partials that no stream holds,
 * and returns the bytes of the rest, live partials left out (their
 * reservation counts instead). Under sp->lock. */
static uint64_t spool_sweep_owner(NetSpool *sp, const char *owner, int64_t now) {
    char dir[1000];
    spool_owner_dir(sp, owner, dir, sizeof dir);
    DIR *d = opendir(dir);
    if (d == NULL) return 0;
    uint64_t used = 0;
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        if (e->d_name[0] == '.') continue;
        size_t n = strlen(e->d_name);
        char path[1400];
        snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
        struct stat st;
        if (stat(path, &st) != 0 || !S_ISREG(st.st_mode)) continue;
        int part = n > 5 && strcmp(e->d_name + n - 5, ".part") == 0;
        if (part) {
            char id[NET_UPLOAD_ID_MAX + 8];
            snprintf(id, sizeof id, "%.*s", (int)(n - 5 < sizeof id - 1 ? n - 5 : sizeof id - 1),
                     e->d_name);
            if (live_find(sp, owner, id) >= 0) continue;
            int64_t age = now - (int64_t)st.st_mtime * 1000;
            if (sp->expiry_ms > 0 && age > sp->expiry_ms) {
                unlink(path);
                log_info("net", "spool: removed %s/%s, untouched for %lld s", owner, e->d_name,
                         (long long)(age / 1000));
                continue;
            }
        }
        used += (uint64_t)st.st_size;
    }
    closedir(d);
    return used;
}

/* Bytes used by `owner` (*mine) and by all owners (*all), in one walk:
 * files plus the reservations of uploads in flight. Under sp->lock. */
static void spool_count(NetSpool *sp, const char *owner, uint64_t *mine, uint64_t *all) {
    int64_t now = time_wall_ms();
    *mine = *all = 0;
    for (int i = 0; i < sp->n_live; i++) {
        *all += sp->live[i].reserved;
        if (strcmp(sp->live[i].owner, owner) == 0) *mine += sp->live[i].reserved;
    }
    DIR *d = opendir(sp->dir);
    struct dirent *e;
    while (d && (e = readdir(d)) != NULL) {
        if (!valid_upload_id(e->d_name)) continue;
        uint64_t used = spool_sweep_owner(sp, e->d_name, now);
        *all += used;
        if (strcmp(e->d_name, owner) == 0) *mine += used;
    }
    if (d) closedir(d);
}

/* Takes (owner, id) for one stream and reserves `bytes`, or says why not. */
static NetStatus spool_claim(NetSpool *sp, const char *owner, const char *id, uint64_t bytes,
                             char *err) {
    NetStatus st = NET_OK;
    pthread_mutex_lock(&sp->lock);
    uint64_t mine = 0, all = 0;
    spool_count(sp, owner, &mine, &all);
    if (live_find(sp, owner, id) >= 0) {
        err_set(err, "upload %s is already being received on another stream; retry when it ends",
                id);
        st = NET_ABORTED;
    } else if (mine + bytes > sp->max_owner_bytes) {
        err_set(err,
                "this site's spool quota is full (%llu bytes held, %llu more asked, quota %llu); "
                "finish or abandon its other uploads",
                (unsigned long long)mine, (unsigned long long)bytes,
                (unsigned long long)sp->max_owner_bytes);
        st = NET_RESOURCE_EXHAUSTED;
    } else if (all + bytes > sp->max_bytes) {
        err_set(err, "the receiver's spool is full (%llu bytes held of %llu); retry later",
                (unsigned long long)all, (unsigned long long)sp->max_bytes);
        st = NET_RESOURCE_EXHAUSTED;
    } else if (sp->n_live == sp->cap_live) {
        int cap = sp->cap_live ? 2 * sp->cap_live : 16;
        SpoolLive *grown = realloc(sp->live, sizeof *grown * (size_t)cap);
        if (grown == NULL) {
            err_set(err, "out of memory");
            st = NET_RESOURCE_EXHAUSTED;
        } else {
            sp->live = grown, sp->cap_live = cap;
        }
    }
    if (st == NET_OK) {
        SpoolLive *l = &sp->live[sp->n_live++];
        snprintf(l->owner, sizeof l->owner, "%s", owner);
        snprintf(l->id, sizeof l->id, "%s", id);
        l->reserved = bytes;
    }
    pthread_mutex_unlock(&sp->lock);
    return st;
}

static void spool_unclaim(NetSpool *sp, const char *owner, const char *id) {
    pthread_mutex_lock(&sp->lock);
    int i = live_find(sp, owner, id);
    assert(i >= 0);
    if (i >= 0) sp->live[i] = sp->live[--sp->n_live];
    pthread_mutex_unlock(&sp->lock);
}

int net_spool_keep(NetSpool *sp, const char *owner, const char *name, const uint8_t *data,
                   size_t len, char *path, size_t path_len, char *err) {
    if (!valid_upload_id(owner) || !valid_upload_id(name))
        return err_set(err, "bad spool owner or file name");
    char dir[1000], full[1200];
    spool_owner_dir(sp, owner, dir, sizeof dir);
    snprintf(full, sizeof full, "%s/%s", dir, name);
    pthread_mutex_lock(&sp->lock);
    uint64_t mine, all;
    spool_count(sp, owner, &mine, &all);
    int rc = -1, fd = -1;
    if (mine + len > sp->max_owner_bytes || all + len > sp->max_bytes) {
        err_set(err, "the spool quota is full (%llu bytes held by this site, %llu in all)",
                (unsigned long long)mine, (unsigned long long)all);
    } else if (file_mkdir_p(dir, 0700, err) != 0) {
    } else if ((fd = open(full, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600)) < 0) {
        err_set_errno(err, "cannot keep %s/%s", owner, name);
    } else if (write_all(fd, data, len) != 0) {
        err_set_errno(err, "cannot write %s/%s", owner, name);
        unlink(full);
    } else {
        rc = 0;
        if (path) snprintf(path, path_len, "%s", full);
    }
    if (fd >= 0) close(fd);
    pthread_mutex_unlock(&sp->lock);
    return rc;
}

void net_spool_drop(NetSpool *sp, const char *owner, const char *name) {
    if (!valid_upload_id(owner) || !valid_upload_id(name)) return;
    char path[1200];
    snprintf(path, sizeof path, "%s/%s/%s", sp->dir, owner, name);
    pthread_mutex_lock(&sp->lock);
    unlink(path);
    pthread_mutex_unlock(&sp->lock);
}

void net_spool_drop_all_kept(NetSpool *sp) {
    pthread_mutex_lock(&sp->lock);
    DIR *d = opendir(sp->dir);
    struct dirent *e;
    while (d && (e = readdir(d)) != NULL) {
        if (!valid_upload_id(e->d_name)) continue;
        char dir[1000];
        spool_owner_dir(sp, e->d_name, dir, sizeof dir);
        DIR *o = opendir(dir);
        struct dirent *f;
        while (o && (f = readdir(o)) != NULL) {
            size_t n = strlen(f->d_name);
            if (f->d_name[0] == '.' || (n > 5 && strcmp(f->d_name + n - 5, ".part") == 0)) continue;
            char path[1400];
            snprintf(path, sizeof path, "%s/%s", dir, f->d_name);
            unlink(path);
        }
        if (o) closedir(o);
    }
    if (d) closedir(d);
    pthread_mutex_unlock(&sp->lock);
}

/* ---- upload: receiver ----------------------------------------------------- */

void net_received_drop_data(NetReceived *r) {
    if (r->mapped)
        munmap(r->data, r->mapped);
    else
        free(r->data);
    r->data = NULL;
    r->mapped = 0;
}

void net_received_free(NetReceived *r) {
    free(r->meta);
    r->meta = NULL;
    net_received_drop_data(r);
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

/* The receiver's hash on a thread of its own: it follows the chunks
 * through the spool file's map (written, so in the page cache) while the
 * receiving thread goes on reading the stream, so the hash takes a core
 * other than the receiving one. Without the thread (it could not start),
 * the receiving thread hashes each chunk itself. */
typedef struct Hasher {
    pthread_t thread;
    int running, failed, stop;
    int drop_pages; /* map is the spool file's: let its pages go once hashed */
    pthread_mutex_t mu;
    pthread_cond_t moved;
    EVP_MD_CTX *md;
    const uint8_t *map;
    uint64_t done, ready; /* hashed; written and ready to hash */
} Hasher;

static void *hasher_main(void *arg) {
    Hasher *hs = arg;
    pthread_mutex_lock(&hs->mu);
    for (;;) {
        while (hs->done == hs->ready && !hs->stop) pthread_cond_wait(&hs->moved, &hs->mu);
        if (hs->done == hs->ready) break; /* stopped, and nothing left */
        uint64_t from = hs->done, to = hs->ready;
        pthread_mutex_unlock(&hs->mu);
        int ok = EVP_DigestUpdate(hs->md, hs->map + from, to - from) == 1;
        if (hs->drop_pages) { /* the whole pages hashed leave this process's memory (they stay in
                               * the page cache): a receiver holds no upload's pages meanwhile */
            uintptr_t page = (uintptr_t)sysconf(_SC_PAGESIZE),
                      lo = ((uintptr_t)hs->map + from + page - 1) & ~(page - 1),
                      hi = ((uintptr_t)hs->map + to) & ~(page - 1);
            if (hi > lo) (void)madvise((void *)lo, hi - lo, MADV_DONTNEED);
        }
        pthread_mutex_lock(&hs->mu);
        hs->failed |= !ok;
        hs->done = to;
    }
    pthread_mutex_unlock(&hs->mu);
    return NULL;
}

/* Starts the hasher from byte `from` of map (what came before is hashed);
 * drop_pages: map is a file's, whose pages may leave once hashed. */
static void hasher_start(Hasher *hs, EVP_MD_CTX *md, const uint8_t *map, uint64_t from,
                         int drop_pages) {
    memset(hs, 0, sizeof *hs);
    hs->md = md, hs->map = map, hs->done = hs->ready = from, hs->drop_pages = drop_pages;
    pthread_mutex_init(&hs->mu, NULL);
    pthread_cond_init(&hs->moved, NULL);
    hs->running = map != NULL && pthread_create(&hs->thread, NULL, hasher_main, hs) == 0;
}

/* Bytes up to `to` are written: hashed by the thread, or here. */
static int hasher_feed(Hasher *hs, const uint8_t *chunk, size_t len, uint64_t to) {
    if (!hs->running) return EVP_DigestUpdate(hs->md, chunk, len) == 1 ? 0 : -1;
    pthread_mutex_lock(&hs->mu);
    hs->ready = to;
    pthread_cond_signal(&hs->moved);
    pthread_mutex_unlock(&hs->mu);
    return 0;
}

/* Waits for the thread to hash what it was given and end; -1 if a digest
 * update failed. Safe to call when it never started, and twice. */
static int hasher_finish(Hasher *hs) {
    if (hs->running) {
        pthread_mutex_lock(&hs->mu);
        hs->stop = 1;
        pthread_cond_signal(&hs->moved);
        pthread_mutex_unlock(&hs->mu);
        pthread_join(hs->thread, NULL);
        hs->running = 0;
    }
    if (hs->md != NULL) {
        pthread_mutex_destroy(&hs->mu);
        pthread_cond_destroy(&hs->moved);
        hs->md = NULL;
    }
    return hs->failed ? -1 : 0;
}

NetStatus net_upload_receive(NetCall *c, NetSpool *sp, const char *owner, const NetLimits *lim,
                             NetReceived *out, char *err) {
    memset(out, 0, sizeof *out);
    int64_t header_ms = lim->header_ms > 0 ? lim->header_ms : 30000;
    int64_t idle_ms = lim->idle_ms > 0 ? lim->idle_ms : 60000;
    int64_t life_ms = lim->life_ms > 0 ? lim->life_ms : 3600000;
    uint64_t t0 = time_monotonic_ns();
    if (!valid_upload_id(owner)) {
        err_set(err, "bad spool owner");
        return NET_INTERNAL;
    }
    NetBuf m;
    NetRecv r = net_call_recv_within(c, &m, header_ms);
    if (r != NET_RECV_MESSAGE) {
        err_set(err,
                r == NET_RECV_TIMEOUT ? "no transfer header within %lld ms"
                                      : "the stream ended before its header (%lld ms)",
                (long long)header_ms);
        return r == NET_RECV_TIMEOUT  ? NET_DEADLINE_EXCEEDED
               : r == NET_RECV_BROKEN ? NET_CANCELLED
                                      : NET_INVALID_ARGUMENT;
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
    int fd = -1, claimed = 0;
    char claimed_id[NET_UPLOAD_ID_MAX + 1] = "";
    uint8_t *map = NULL; /* the spool file, read-only, `total` bytes long */
    EVP_MD_CTX *md = NULL;
    Hasher hs = {0};
    uint8_t sha[32];
    uint64_t total = h->total_length, expected = h->offset;
    char path[1200] = "";
    /* everything checked before a byte is spooled */
    if (!valid_upload_id(h->upload_id)) {
        err_set(err, "upload id '%.70s' must be 1-64 of [A-Za-z0-9._-]", h->upload_id);
        goto out;
    }
    if (lim->purpose && strcmp(h->purpose, lim->purpose) != 0) {
        err_set(err, "a transfer of purpose '%.31s' where '%s' is expected", h->purpose,
                lim->purpose);
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
    st = spool_claim(sp, owner, h->upload_id, total, err);
    if (st != NET_OK) goto out;
    claimed = 1;
    snprintf(claimed_id, sizeof claimed_id, "%s", h->upload_id);
    st = NET_INVALID_ARGUMENT;
    uint64_t held = net_spool_committed(sp, owner, h->upload_id);
    if (h->offset > held) {
        err_set(err, "upload %s: this receiver holds %llu bytes; resume from there", h->upload_id,
                (unsigned long long)held);
        st = NET_FAILED_PRECONDITION;
        goto out;
    }
    char dir[1000];
    spool_owner_dir(sp, owner, dir, sizeof dir);
    spool_path(sp, owner, h->upload_id, path, sizeof path);
    if (file_mkdir_p(dir, 0700, err) != 0) {
        st = NET_INTERNAL;
        goto out;
    }
    /* from the start: a new file, never one truncated to 0 (ext4 flushes a
     * file truncated to 0 when it is closed, and the upload's release then
     * waits on that write-back: 0.1 s of a 256 MiB upload's 0.5 s);
     * resumed: cut to what is kept */
    struct stat sb;
    if (h->offset == 0) (void)unlink(path); /* what it held is refused below if it stays */
    fd =
        open(path, O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW | (h->offset == 0 ? O_EXCL : 0), 0600);
    if (fd < 0 || fstat(fd, &sb) != 0 ||
        (sb.st_size != (off_t)h->offset && ftruncate(fd, (off_t)h->offset) != 0) ||
        lseek(fd, (off_t)h->offset, SEEK_SET) < 0) {
        err_set_errno(err, "cannot spool upload %s", h->upload_id);
        st = NET_INTERNAL;
        goto out;
    }
    /* the payload is the spool file itself, mapped for reading: chunks are
     * written once (into the page cache) and hashed from the frame, and
     * the map is what is handed on; it reserves addresses for the declared
     * total (itself under the limit), never memory */
    if (total > 0) {
        map = mmap(NULL, total, PROT_READ, MAP_SHARED, fd, 0);
        if (map == MAP_FAILED) {
            map = NULL;
            err_set_errno(err, "cannot map upload %s", h->upload_id);
            st = NET_INTERNAL;
            goto out;
        }
    }
    /* what this sender spooled before (its own, under its own id) comes first */
    md = EVP_MD_CTX_new();
    if (md == NULL || EVP_DigestInit_ex(md, EVP_sha256(), NULL) != 1 ||
        (h->offset > 0 && EVP_DigestUpdate(md, map, h->offset) != 1)) {
        err_set(err, "cannot hash the %llu bytes held of upload %s", (unsigned long long)h->offset,
                h->upload_id);
        st = NET_INTERNAL;
        goto out;
    }
    hasher_start(&hs, md, map, h->offset, 1);
    snprintf(out->upload_id, sizeof out->upload_id, "%s", h->upload_id);
    snprintf(out->purpose, sizeof out->purpose, "%s", h->purpose);
    out->round = h->round;
    if (h->meta.len) {
        out->meta = malloc(h->meta.len);
        if (out->meta == NULL) { /* not an update without its claims: one that failed here */
            err_set(err, "out of memory for the metadata of upload %s", h->upload_id);
            st = NET_RESOURCE_EXHAUSTED;
            goto out;
        }
        memcpy(out->meta, h->meta.data, h->meta.len), out->meta_len = h->meta.len;
    }
    uint32_t chunk_size = h->chunk_size;
    uint64_t from = h->offset; /* where this stream started: its rate counts from there */
    frame_free(&f);            /* h goes with it */
    net_buf_free(&m);
    int64_t grace_ms = lim->grace_ms > 0 ? lim->grace_ms : 10000;
    for (;;) {
        int64_t lived = (int64_t)((time_monotonic_ns() - t0) / 1000000);
        int64_t wait = life_ms - lived < idle_ms ? life_ms - lived : idle_ms;
        int slow = 0;
        if (lim->min_rate > 0) {
            /* the next chunk (or what is left) must be in by the time this
             * stream's average would fall under the minimum */
            uint64_t next = total - expected < chunk_size ? total - expected : chunk_size;
            int64_t due = grace_ms + (int64_t)((expected - from + next) * 1000 / lim->min_rate);
            if (due - lived < wait) {
                wait = due - lived;
                slow = 1;
            }
        }
        char why[300];
        if (slow)
            snprintf(why, sizeof why,
                     "upload %s cut at %llu of %llu bytes: slower than this receiver's minimum of "
                     "%llu bytes/s after %lld ms; it can resume",
                     out->upload_id, (unsigned long long)expected, (unsigned long long)total,
                     (unsigned long long)lim->min_rate, (long long)grace_ms);
        else
            snprintf(why, sizeof why, "upload %s stalled at %llu of %llu bytes (%s); it can resume",
                     out->upload_id, (unsigned long long)expected, (unsigned long long)total,
                     wait > 0 ? "no chunk in time" : "the stream lived too long");
        net_call_slow_reason(c, why);
        r = wait > 0 ? net_call_recv_within(c, &m, wait) : NET_RECV_TIMEOUT;
        if (r == NET_RECV_BROKEN || r == NET_RECV_TIMEOUT) {
            if (r == NET_RECV_TIMEOUT)
                err_set(err, "%s", why);
            else
                err_set(err, "upload %s broke off at %llu of %llu bytes; it can resume",
                        out->upload_id, (unsigned long long)expected, (unsigned long long)total);
            st = r == NET_RECV_TIMEOUT ? NET_DEADLINE_EXCEEDED : NET_CANCELLED;
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
        if (hasher_feed(&hs, f.data, f.len, expected + f.len) != 0) {
            err_set(err, "cannot hash upload %s", out->upload_id);
            st = NET_INTERNAL;
            goto out;
        }
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
    unsigned int glen = 0;
    if (hasher_finish(&hs) != 0) {
        err_set(err, "cannot hash upload %s", out->upload_id);
        st = NET_INTERNAL;
        goto out;
    }
    EVP_DigestFinal_ex(md, got, &glen);
    close(fd);
    fd = -1;
    unlink(path); /* used or wrong: in either case kept by no one */
    if (memcmp(got, sha, 32) != 0) {
        err_set(err,
                "upload %s: SHA-256 of the %llu bytes does not match the header; "
                "nothing was kept",
                out->upload_id, (unsigned long long)total);
        st = NET_DATA_LOSS;
        goto out;
    }
    out->length = total;
    if (map != NULL) {
        out->data = map, out->mapped = total, map = NULL;
    } else if ((out->data = malloc(1)) == NULL) { /* never NULL on success */
        err_set(err, "out of memory");
        st = NET_RESOURCE_EXHAUSTED;
        goto out;
    }
    st = NET_OK;
out:
    hasher_finish(&hs); /* before the map goes: it reads from it */
    if (map != NULL) munmap(map, total);
    EVP_MD_CTX_free(md);
    if (fd >= 0) close(fd);
    if (claimed) spool_unclaim(sp, owner, claimed_id);
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

void net_upload_query_handle(NetCall *c, NetSpool *sp, const char *owner) {
    NetBuf m;
    if (net_call_recv(c, &m) != NET_RECV_MESSAGE) return;
    Strait__UploadQuery *q = strait__upload_query__unpack(NULL, m.len, m.data);
    net_buf_free(&m);
    if (q == NULL || !valid_upload_id(q->upload_id)) {
        net_call_status(c, NET_INVALID_ARGUMENT, "malformed upload query");
    } else {
        net_upload_answer(c, q->upload_id, net_spool_committed(sp, owner, q->upload_id), 0);
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
    return net_download_send_from(c, spec, data, len, 0, err);
}

int net_download_send_from(NetCall *c, const NetTransferSpec *spec, const uint8_t *data, size_t len,
                           uint64_t from, char *err) {
    if (from > len) from = 0;
    uint32_t chunk = spec->chunk_size ? spec->chunk_size : NET_CHUNK_DEFAULT;
    if (chunk < NET_CHUNK_MIN || chunk > NET_CHUNK_MAX) return err_set(err, "bad chunk size");
    uint8_t sha[32];
    if (spec->sha256)
        memcpy(sha, spec->sha256, 32);
    else
        security_sha256(data, len, sha);
    size_t hlen;
    uint8_t *hdr = header_frame(spec, len, sha, chunk, from, &hlen);
    if (hdr == NULL) return err_set(err, "out of memory");
    int rc = net_call_send(c, hdr, hlen);
    free(hdr);
    for (uint64_t at = from; rc == 0 && at < len; at += chunk) {
        size_t n = len - at < chunk ? (size_t)(len - at) : chunk;
        uint8_t prefix[32];
        size_t pl = chunk_prefix(prefix, at, n);
        rc = net_call_send2(c, prefix, pl, data + at, n);
    }
    if (rc != 0) return err_set(err, "the receiver went away during the download");
    return 0;
}

void net_download_held_free(NetDownloadHeld *h) {
    free(h->data);
    memset(h, 0, sizeof *h);
}

NetStatus net_download(NetChannel *ch, const char *method, const void *req, size_t req_len,
                       const NetLimits *lim, int64_t timeout_ms, NetBuf *payload,
                       NetDownloadHead *head, NetDownloadHeld *held, char *details,
                       size_t details_len) {
    payload->data = NULL;
    payload->len = 0;
    if (head) memset(head, 0, sizeof *head);
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
    Hasher hs = {0}; /* the hash follows the payload on a thread of its own */
    EVP_MD_CTX *md = EVP_MD_CTX_new();
    if (md == NULL || EVP_DigestInit_ex(md, EVP_sha256(), NULL) != 1) {
        bad = NET_RESOURCE_EXHAUSTED;
        err_set(err, "out of memory for a hash");
    }
    NetRecv r = bad == NET_OK ? net_client_recv(c, &m) : NET_RECV_BROKEN;
    if (r == NET_RECV_MESSAGE) {
        if (frame_parse(&m, &f) != 0 || f.is_chunk) {
            bad = NET_INTERNAL;
            err_set(err, "the download did not start with its header");
        } else {
            const Strait__TransferHeader *h = f.pb->header;
            total = h->total_length;
            chunk = h->chunk_size;
            if (head && h->meta.len <= sizeof head->meta) {
                head->round = h->round;
                if (h->meta.len) memcpy(head->meta, h->meta.data, h->meta.len);
                head->meta_len = h->meta.len;
            }
            if (total > lim->max_total) {
                bad = NET_RESOURCE_EXHAUSTED;
                err_set(err, "download of %llu bytes is over the limit of %llu",
                        (unsigned long long)total, (unsigned long long)lim->max_total);
            } else if (h->sha256.len != 32 || chunk < NET_CHUNK_MIN || chunk > NET_CHUNK_MAX ||
                       h->meta.len > NET_DOWNLOAD_META_MAX ||
                       (h->offset != 0 &&
                        (held == NULL || h->offset != held->have || total != held->total ||
                         memcmp(h->sha256.data, held->sha, 32) != 0))) {
                bad = NET_INTERNAL; /* a resume point is only ever the one asked for */
                err_set(err, "malformed download header");
            } else if (h->offset != 0) { /* the rest of what is held: its bytes hashed again */
                memcpy(sha, h->sha256.data, 32);
                payload->data = held->data;
                at = held->have;
                memset(held, 0, sizeof *held); /* moved: a failure from here keeps anew */
                EVP_DigestUpdate(md, payload->data, at);
            } else {
                memcpy(sha, h->sha256.data, 32);
                if (held) net_download_held_free(held); /* another payload: from the start */
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
        if (bad == NET_OK) hasher_start(&hs, md, payload->data, at, 0);
        while (bad == NET_OK && (r = net_client_recv(c, &m)) == NET_RECV_MESSAGE) {
            if (frame_parse(&m, &f) != 0 || !f.is_chunk || f.offset != at || f.len == 0 ||
                f.len > chunk || f.len > total - at) {
                bad = NET_INTERNAL;
                err_set(err, "download chunk out of order or out of bounds at %llu",
                        (unsigned long long)at);
            } else { /* hashed as it arrives: no pass over the whole after the stream */
                memcpy(payload->data + at, f.data, f.len);
                if (hasher_feed(&hs, payload->data + at, f.len, at + f.len) != 0) {
                    bad = NET_INTERNAL;
                    err_set(err, "cannot hash the download");
                }
                at += f.len;
            }
            frame_free(&f);
            net_buf_free(&m);
        }
    }
    if (hasher_finish(&hs) != 0 && bad == NET_OK) {
        bad = NET_INTERNAL;
        err_set(err, "cannot hash the download");
    }
    if (bad != NET_OK) net_client_cancel(c);
    NetStatus st = net_client_finish(c, details, details_len);
    if (bad != NET_OK) {
        st = bad;
        if (details) snprintf(details, details_len, "%s", err);
    } else if (st == NET_OK) {
        uint8_t got[32] = {0};
        unsigned int glen = 0;
        if (payload->data) EVP_DigestFinal_ex(md, got, &glen);
        if (payload->data == NULL || at != total || memcmp(got, sha, 32) != 0) {
            st = NET_DATA_LOSS;
            if (details)
                snprintf(details, details_len,
                         "download of %llu bytes failed its length or SHA-256 check",
                         (unsigned long long)total);
        }
    }
    EVP_MD_CTX_free(md);
    if (held && st != NET_OK && st != NET_DATA_LOSS && bad == NET_OK && payload->data && at > 0 &&
        at < total) { /* cut part-way: what came is kept for a resume */
        net_download_held_free(held);
        held->data = payload->data, payload->data = NULL;
        held->have = at, held->total = total;
        memcpy(held->sha, sha, 32);
    } else if (held && st == NET_OK) {
        net_download_held_free(held);
    }
    if (st != NET_OK)
        net_buf_free(payload);
    else
        payload->len = total;
    return st;
}
