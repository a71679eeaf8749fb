/*
 * events.c — TensorBoard event files: TensorFlow's Event messages
 * (schema/tensorboard.proto, packed by protobuf-c) in TFRecord framing —
 * each record its length (u64, little-endian), the length's masked
 * CRC-32C, the bytes, their masked CRC-32C. Appended record by record and
 * synced at most once a second (a trainer writes a record a step), when
 * the writer says (events_sync: a round's end) and at the close; nothing
 * written is ever rewritten, and a record cut by a crash is one
 * TensorBoard's reader stops at. Each open is a file of its own
 * (events.out.tfevents.SECONDS.HOST.PID), which TensorBoard reads as one
 * run with the others in the folder.
 */
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "schema/tensorboard.pb-c.h"
#include "util.h"

struct EventFile {
    int fd;
    int broken;           /* a record could neither be written nor taken back: no more */
    int unsynced;         /* records written since the last sync */
    uint64_t synced_ns;   /* when the last sync was (monotonic) */
    pthread_mutex_t lock; /* commits of two rounds may write at once */
    char path[1200];
};

/* ---- CRC-32C (Castagnoli), as TFRecord masks it --------------------------------- */

static uint32_t crc_table[256];
static pthread_once_t crc_once = PTHREAD_ONCE_INIT;

static void crc_init(void) {
    for (uint32_t i = 0; i < 256; i++) {
        uint32_t c = i;
        for (int k = 0; k < 8; k++) c = c & 1 ? (c >> 1) ^ 0x82f63b78u : c >> 1;
        crc_table[i] = c;
    }
}

uint32_t events_crc32c(const void *data, size_t len) {
    pthread_once(&crc_once, crc_init);
    const uint8_t *p = data;
    uint32_t c = 0xffffffffu;
    for (size_t i = 0; i < len; i++) c = crc_table[(c ^ p[i]) & 0xff] ^ (c >> 8);
    return c ^ 0xffffffffu;
}

static uint32_t masked(uint32_t crc) {
    return ((crc >> 15) | (crc << 17)) + 0xa282ead8u;
}

static void put32(uint8_t *p, uint32_t v) {
    for (int i = 0; i < 4; i++) p[i] = (uint8_t)(v >> (8 * i));
}

/* One record, whole (synced when the last sync is a second old): a crash
 * leaves it whole or cut. A write
 * that fails is taken back (the file cut to where the record began): a cut
 * record would stop TensorBoard's reader there for good. */
static int put_record(EventFile *f, const Tensorboard__Event *ev, char *err) {
    if (f->broken) return err_set(err, "%s: an earlier record could not be taken back", f->path);
    size_t len = tensorboard__event__get_packed_size(ev);
    uint8_t *buf = malloc(len + 16);
    if (buf == NULL) return err_set(err, "out of memory for a TensorBoard record");
    for (int i = 0; i < 8; i++) buf[i] = (uint8_t)((uint64_t)len >> (8 * i));
    put32(buf + 8, masked(events_crc32c(buf, 8)));
    tensorboard__event__pack(ev, buf + 12);
    put32(buf + 12 + len, masked(events_crc32c(buf + 12, len)));
    off_t start = lseek(f->fd, 0, SEEK_END);
    size_t done = 0;
    int rc = start < 0 ? err_set_errno(err, "cannot seek %s", f->path) : 0;
    while (rc == 0 && done < len + 16) {
        ssize_t w = write(f->fd, buf + done, len + 16 - done);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0)
            rc = err_set_errno(err, "cannot write %s", f->path);
        else
            done += (size_t)w;
    }
    if (rc == 0) f->unsynced++;
    uint64_t now = time_monotonic_ns();
    if (rc == 0 && now - f->synced_ns >= 1000000000ull) {
        if (fdatasync(f->fd) != 0) rc = err_set_errno(err, "cannot sync %s", f->path);
        f->unsynced = 0, f->synced_ns = now;
    }
    free(buf);
    if (rc != 0 && start >= 0 && (ftruncate(f->fd, start) != 0 || fdatasync(f->fd) != 0))
        f->broken = 1;
    return rc;
}

EventFile *events_open(const char *dir, char *err) {
    if (file_mkdir_p(dir, 0755, err) != 0) return NULL;
    EventFile *f = calloc(1, sizeof *f);
    if (f == NULL) {
        err_set(err, "out of memory");
        return NULL;
    }
    pthread_mutex_init(&f->lock, NULL);
    char host[256] = "localhost";
    gethostname(host, sizeof host - 1);
    double now = time_wall_ms() / 1000.0;
    /* a restart in the same second with the same pid (pid 1 in a
     * container) takes the next free suffix */
    f->fd = -1;
    for (int k = 0; k < 100 && f->fd < 0; k++) {
        int len = snprintf(f->path, sizeof f->path, "%s/events.out.tfevents.%lld.%s.%d%s%.0d", dir,
                           (long long)now, host, (int)getpid(), k ? "." : "", k);
        if (len < 0 || (size_t)len >= sizeof f->path) {
            err_set(err, "the TensorBoard folder's path is too long: %.200s", dir);
            events_close(f);
            return NULL;
        }
        f->fd = open(f->path, O_WRONLY | O_CREAT | O_EXCL | O_APPEND | O_CLOEXEC, 0644);
        if (f->fd < 0 && errno != EEXIST) break;
    }
    if (f->fd < 0) {
        err_set_errno(err, "cannot create %s", f->path);
        events_close(f);
        return NULL;
    }
    Tensorboard__Event ev = TENSORBOARD__EVENT__INIT;
    ev.wall_time = now;
    ev.what_case = TENSORBOARD__EVENT__WHAT_FILE_VERSION;
    ev.file_version = "brain.Event:2";
    if (put_record(f, &ev, err) != 0 || file_fsync_dir(dir, err) != 0) {
        events_close(f);
        return NULL;
    }
    return f;
}

int events_sync(EventFile *f, char *err) {
    pthread_mutex_lock(&f->lock);
    int rc = 0;
    if (f->unsynced && fdatasync(f->fd) != 0)
        rc = err_set_errno(err, "cannot sync %s", f->path);
    else
        f->unsynced = 0, f->synced_ns = time_monotonic_ns();
    pthread_mutex_unlock(&f->lock);
    return rc;
}

const char *events_path(const EventFile *f) {
    return f->path;
}

int events_scalars(EventFile *f, int64_t step, double wall_time, const char *const *tags,
                   const double *values, int n, char *err) {
    Tensorboard__Summary__Value *vals = calloc((size_t)(n ? n : 1), sizeof *vals);
    Tensorboard__Summary__Value **ptrs = calloc((size_t)(n ? n : 1), sizeof *ptrs);
    if (vals == NULL || ptrs == NULL) {
        free(vals), free(ptrs);
        return err_set(err, "out of memory for a TensorBoard record");
    }
    int k = 0;
    for (int i = 0; i < n; i++) {
        if (!isfinite(values[i])) continue; /* unknown: no point, not a NaN one */
        tensorboard__summary__value__init(&vals[k]);
        vals[k].tag = (char *)tags[i];
        vals[k].value_case = TENSORBOARD__SUMMARY__VALUE__VALUE_SIMPLE_VALUE;
        vals[k].simple_value = (float)values[i];
        ptrs[k] = &vals[k];
        k++;
    }
    Tensorboard__Summary sum = TENSORBOARD__SUMMARY__INIT;
    sum.n_value = (size_t)k, sum.value = ptrs;
    Tensorboard__Event ev = TENSORBOARD__EVENT__INIT;
    ev.wall_time = wall_time, ev.step = step;
    ev.what_case = TENSORBOARD__EVENT__WHAT_SUMMARY;
    ev.summary = &sum;
    pthread_mutex_lock(&f->lock);
    int rc = k ? put_record(f, &ev, err) : 0;
    pthread_mutex_unlock(&f->lock);
    free(vals), free(ptrs);
    return rc;
}

void events_close(EventFile *f) {
    if (f == NULL) return;
    if (f->fd >= 0) {
        if (f->unsynced && fdatasync(f->fd) != 0)
            log_warn("events", "cannot sync %s: %s", f->path, strerror(errno));
        close(f->fd);
    }
    pthread_mutex_destroy(&f->lock);
    free(f);
}
