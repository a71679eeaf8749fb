/*
 * file.c — durable file writes and small file helpers.
 *
 * The atomic write protocol (STYLE.md "Data"): write to a temporary file in
 * the target's folder, fsync it, rename it over the target, fsync the folder.
 * rename(2) within one file system is atomic, so a reader or a restarted
 * process sees the old file or the new one, never a torn mix; the folder
 * fsync makes the rename itself survive a power cut.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <libgen.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "util.h"

struct AtomicFile {
    int fd;
    char *path; /* the target */
    char *tmp;  /* "<path>.tmp.XXXXXX", created by mkstemp */
    char *dir;  /* the target's folder, synced after the rename */
};

static char *dir_of(const char *path) {
    char *copy = strdup(path);
    if (copy == NULL) return NULL;
    char *d = strdup(dirname(copy));
    free(copy);
    return d;
}

int file_fsync_dir(const char *dir, char *err) {
    int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0) return err_set_errno(err, "cannot open folder %s to sync it", dir);
    int rc = fsync(fd);
    close(fd);
    if (rc != 0) return err_set_errno(err, "cannot sync folder %s", dir);
    return 0;
}

AtomicFile *file_atomic_open(const char *path, int mode, char *err) {
    AtomicFile *af = calloc(1, sizeof *af);
    if (af == NULL) goto oom;
    af->fd = -1;
    af->path = strdup(path);
    af->dir = dir_of(path); /* here: after the rename, nothing but the sync may fail */
    size_t n = strlen(path) + sizeof ".tmp.XXXXXX";
    af->tmp = malloc(n);
    if (af->path == NULL || af->dir == NULL || af->tmp == NULL) goto oom;
    snprintf(af->tmp, n, "%s.tmp.XXXXXX", path);
    af->fd = mkostemp(af->tmp, O_CLOEXEC);
    if (af->fd < 0) {
        err_set_errno(err, "cannot create a temporary file next to %s", path);
        goto fail;
    }
    if (fchmod(af->fd, (mode_t)mode) != 0) {
        err_set_errno(err, "cannot set mode %o on %s", (unsigned)mode, af->tmp);
        unlink(af->tmp);
        goto fail;
    }
    return af;
oom:
    err_set(err, "out of memory opening %s", path);
fail:
    if (af) {
        if (af->fd >= 0) close(af->fd);
        free(af->path);
        free(af->dir);
        free(af->tmp);
        free(af);
    }
    return NULL;
}

int file_atomic_write(AtomicFile *af, const void *data, size_t len, char *err) {
    const char *p = data;
    while (len > 0) {
        ssize_t w = write(af->fd, p, len);
        if (w < 0) {
            if (errno == EINTR) continue;
            return err_set_errno(err, "cannot write %s", af->tmp);
        }
        p += w;
        len -= (size_t)w;
    }
    return 0;
}

static void atomic_free(AtomicFile *af) {
    if (af->fd >= 0) close(af->fd);
    free(af->path);
    free(af->dir);
    free(af->tmp);
    free(af);
}

void file_atomic_abort(AtomicFile *af) {
    if (af == NULL) return;
    unlink(af->tmp);
    atomic_free(af);
}

int file_atomic_commit(AtomicFile *af, char *err) {
    int rc = -1;
    if (fsync(af->fd) != 0) {
        err_set_errno(err, "cannot sync %s", af->tmp);
        goto fail;
    }
    if (close(af->fd) != 0) {
        af->fd = -1;
        err_set_errno(err, "cannot close %s", af->tmp);
        goto fail;
    }
    af->fd = -1;
    if (rename(af->tmp, af->path) != 0) {
        err_set_errno(err, "cannot rename %s to %s", af->tmp, af->path);
        goto fail;
    }
    rc = file_fsync_dir(af->dir, err);
    atomic_free(af);
    return rc;
fail:
    unlink(af->tmp);
    atomic_free(af);
    return rc;
}

int file_write_atomic(const char *path, const void *data, size_t len, int mode, char *err) {
    AtomicFile *af = file_atomic_open(path, mode, err);
    if (af == NULL) return -1;
    if (file_atomic_write(af, data, len, err) != 0) {
        file_atomic_abort(af);
        return -1;
    }
    return file_atomic_commit(af, err);
}

int file_atomic_cleanup(const char *path) {
    char *dir = dir_of(path);
    char *copy = strdup(path);
    int removed = 0;
    if (dir == NULL || copy == NULL) goto out;
    const char *base = basename(copy);
    size_t blen = strlen(base);
    DIR *d = opendir(dir);
    if (d == NULL) goto out;
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        /* exactly "<base>.tmp." followed by mkstemp's six characters */
        if (strncmp(e->d_name, base, blen) != 0) continue;
        if (strncmp(e->d_name + blen, ".tmp.", 5) != 0) continue;
        if (strlen(e->d_name + blen + 5) != 6) continue;
        char full[4096];
        snprintf(full, sizeof full, "%s/%s", dir, e->d_name);
        if (unlink(full) == 0) removed++;
    }
    closedir(d);
out:
    free(dir);
    free(copy);
    return removed;
}

int file_read_all(const char *path, size_t max_len, char **out, size_t *out_len, char *err) {
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return err_set_errno(err, "cannot open %s", path);
    struct stat st;
    if (fstat(fd, &st) != 0) {
        close(fd);
        return err_set_errno(err, "cannot stat %s", path);
    }
    if ((uint64_t)st.st_size > max_len) {
        close(fd);
        return err_set(err, "%s is %lld bytes, more than the %zu allowed", path,
                       (long long)st.st_size, max_len);
    }
    size_t cap = (size_t)st.st_size, len = 0;
    char *buf = malloc(cap + 1);
    if (buf == NULL) {
        close(fd);
        return err_set(err, "out of memory reading %s", path);
    }
    for (;;) {
        if (len == cap) {
            /* the file grew since fstat: read on, within max_len */
            if (cap >= max_len) break;
            size_t ncap = cap * 2 + 4096 > max_len ? max_len : cap * 2 + 4096;
            char *nb = realloc(buf, ncap + 1);
            if (nb == NULL) {
                free(buf);
                close(fd);
                return err_set(err, "out of memory reading %s", path);
            }
            buf = nb;
            cap = ncap;
        }
        ssize_t r = read(fd, buf + len, cap - len);
        if (r < 0) {
            if (errno == EINTR) continue;
            free(buf);
            close(fd);
            return err_set_errno(err, "cannot read %s", path);
        }
        if (r == 0) break;
        len += (size_t)r;
    }
    close(fd);
    buf[len] = '\0';
    *out = buf;
    if (out_len) *out_len = len;
    return 0;
}

int file_mkdir_p(const char *path, int mode, char *err) {
    char buf[4096];
    size_t n = strlen(path);
    if (n == 0 || n >= sizeof buf) return err_set(err, "bad folder path '%s'", path);
    memcpy(buf, path, n + 1);
    for (char *p = buf + 1;; p++) {
        if (*p == '/' || *p == '\0') {
            char saved = *p;
            *p = '\0';
            if (mkdir(buf, (mode_t)mode) != 0 && errno != EEXIST)
                return err_set_errno(err, "cannot create folder %s", buf);
            *p = saved;
            if (saved == '\0') break;
        }
    }
    struct stat st;
    if (stat(path, &st) != 0 || !S_ISDIR(st.st_mode))
        return err_set(err, "%s exists and is not a folder", path);
    return 0;
}
