/*
 * hash.c — SHA-256 through OpenSSL's EVP interface, of memory and of files
 * (read in 1 MiB pieces, so a multi-GiB checkpoint needs no more memory).
 */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#include <openssl/evp.h>

#include "security.h"
#include "util/util.h"

void security_sha256(const void *data, size_t len, uint8_t out[SHA256_LEN]) {
    unsigned int n = 0;
    if (EVP_Digest(data, len, out, &n, EVP_sha256(), NULL) != 1 || n != SHA256_LEN)
        DIE("EVP_Digest(SHA-256) failed");
}

char *security_hex(const uint8_t *bytes, size_t len, char *hex) {
    static const char digits[] = "0123456789abcdef";
    for (size_t i = 0; i < len; i++) {
        hex[2 * i] = digits[bytes[i] >> 4];
        hex[2 * i + 1] = digits[bytes[i] & 15];
    }
    hex[2 * len] = '\0';
    return hex;
}

int security_sha256_fd(int fd, const char *name, uint8_t out[SHA256_LEN], int64_t *bytes,
                       char *err) {
    enum { PIECE = 1 << 20 };
    int rc = -1;
    EVP_MD_CTX *ctx = EVP_MD_CTX_new();
    unsigned char *buf = malloc(PIECE);
    int64_t total = 0;
    if (ctx == NULL || buf == NULL || EVP_DigestInit_ex(ctx, EVP_sha256(), NULL) != 1) {
        err_set(err, "cannot start SHA-256 of %s", name);
        goto out;
    }
    for (;;) {
        ssize_t r = pread(fd, buf, PIECE, (off_t)total);
        if (r < 0) {
            if (errno == EINTR) continue;
            err_set_errno(err, "cannot read %s", name);
            goto out;
        }
        if (r == 0) break;
        EVP_DigestUpdate(ctx, buf, (size_t)r);
        total += r;
    }
    unsigned int n = 0;
    if (EVP_DigestFinal_ex(ctx, out, &n) != 1 || n != SHA256_LEN) {
        err_set(err, "SHA-256 of %s failed", name);
        goto out;
    }
    if (bytes) *bytes = total;
    rc = 0;
out:
    free(buf);
    EVP_MD_CTX_free(ctx);
    return rc;
}

int security_sha256_file(const char *path, char hex[SHA256_HEX_LEN], int64_t *bytes, char *err) {
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return err_set_errno(err, "cannot open %s", path);
    uint8_t md[SHA256_LEN];
    int rc = security_sha256_fd(fd, path, md, bytes, err);
    if (rc == 0) security_hex(md, SHA256_LEN, hex);
    close(fd);
    return rc;
}
