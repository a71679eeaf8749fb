/*
 * err.c — the two error regimes of STYLE.md: one-line messages into a
 * caller's buffer for everything that faces a user, a file or a peer, and
 * fail-fast with file:line for code that cannot go on (allocation failure
 * inside a training step).
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "util.h"

int err_set(char *err, const char *fmt, ...) {
    if (err == NULL) return -1;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err, ERR_LEN, fmt, ap);
    va_end(ap);
    return -1;
}

int err_set_errno(char *err, const char *fmt, ...) {
    int saved = errno;
    if (err == NULL) return -1;
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(err, ERR_LEN, fmt, ap);
    va_end(ap);
    if (n >= 0 && n < ERR_LEN) snprintf(err + n, ERR_LEN - (size_t)n, ": %s", strerror(saved));
    errno = saved;
    return -1;
}

void die_at(const char *file, int line, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "fatal (%s:%d): ", file, line);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
    abort();
}

void *malloc_check(size_t size, const char *file, int line) {
    void *p = malloc(size == 0 ? 1 : size);
    if (p == NULL) die_at(file, line, "out of memory allocating %zu bytes", size);
    return p;
}

void *calloc_check(size_t n, size_t size, const char *file, int line) {
    void *p = calloc(n == 0 ? 1 : n, size == 0 ? 1 : size);
    if (p == NULL) die_at(file, line, "out of memory allocating %zu x %zu bytes", n, size);
    return p;
}

FILE *fopen_check(const char *path, const char *mode, const char *file, int line) {
    FILE *f = fopen(path, mode);
    if (f == NULL) die_at(file, line, "cannot open %s (mode %s): %s", path, mode, strerror(errno));
    return f;
}
