/*
 * store_fixture.c — see store_fixture.h.
 */
#include <dirent.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <criterion/criterion.h>

#include "kernels/formats.h"
#include "tests/harness.h"
#include "tests/store_fixture.h"
#include "util/util.h"

void store_fixture_init(StoreFixture *fx, const char *tag) {
    memset(fx, 0, sizeof *fx);
    fx->home = harness_tmpdir(tag);
    snprintf(fx->db_path, sizeof fx->db_path, "%s/%s", fx->home, STORE_DB_FILE);
    char err[ERR_LEN], dir[700];
    snprintf(dir, sizeof dir, "%s/%s", fx->home, STORE_CHECKPOINT_DIR);
    cr_assert_eq(file_mkdir_p(dir, 0700, err), 0, "%s", err);
    fx->store = store_open(fx->db_path, STORE_READWRITE, err);
    cr_assert_not_null(fx->store, "%s", err);
}

void store_fixture_fini(StoreFixture *fx) {
    store_close(fx->store);
    fx->store = NULL;
    harness_rmtree(fx->home);
    free(fx->home);
}

void store_fixture_checkpoint_bytes(int64_t round, unsigned char *buf) {
    uint64_t x = 0x9E3779B97F4A7C15ull ^ (uint64_t)(round + 1) * 0xD1B54A32D192ED03ull;
    for (size_t i = 0; i < FIXTURE_CKPT_BYTES; i++) {
        x ^= x << 13, x ^= x >> 7, x ^= x << 17;
        buf[i] = (unsigned char)(x >> 24);
    }
}

void store_fixture_write_checkpoint(StoreFixture *fx, int64_t round, char sha[SHA256_HEX_LEN],
                                    StoreCheckpoint *ck) {
    unsigned char *buf = malloc(FIXTURE_CKPT_BYTES);
    store_fixture_checkpoint_bytes(round, buf);
    int slot = (int)(round % 16);
    snprintf(fx->paths[slot], sizeof fx->paths[slot], "%s/round-%06lld.safetensors",
             STORE_CHECKPOINT_DIR, (long long)round);
    char full[800], err[ERR_LEN];
    snprintf(full, sizeof full, "%s/%s", fx->home, fx->paths[slot]);
    cr_assert_eq(file_write_atomic(full, buf, FIXTURE_CKPT_BYTES, 0644, err), 0, "%s", err);
    uint8_t md[SHA256_LEN];
    security_sha256(buf, FIXTURE_CKPT_BYTES, md);
    security_hex(md, SHA256_LEN, fx->shas[slot]);
    if (sha) memcpy(sha, fx->shas[slot], SHA256_HEX_LEN);
    ck->path = fx->paths[slot];
    ck->bytes = FIXTURE_CKPT_BYTES;
    ck->sha256 = fx->shas[slot];
    ck->state_path = NULL, ck->state_bytes = 0, ck->state_sha256 = NULL;
    ck->dp_noise = 0, ck->dp_epsilon = 0, ck->dp_delta = 0;
    free(buf);
}

void store_fixture_commit_rounds(StoreFixture *fx, int64_t from, int64_t to, int with_state) {
    char err[ERR_LEN];
    unsigned char *buf = malloc(FIXTURE_CKPT_BYTES);
    for (int64_t n = from; n < to; n++) {
        int64_t rid;
        cr_assert_eq(store_round_open(fx->store, n, 1000 + n, &rid, err), 0, "%s", err);
        StoreCheckpoint ck;
        store_fixture_write_checkpoint(fx, n, NULL, &ck);
        char rel[128], full[800], sha[SHA256_HEX_LEN];
        if (with_state) {
            store_fixture_checkpoint_bytes(n, buf);
            for (size_t i = 0; i < FIXTURE_CKPT_BYTES / 2; i++) {
                unsigned char t = buf[i];
                buf[i] = buf[FIXTURE_CKPT_BYTES - 1 - i], buf[FIXTURE_CKPT_BYTES - 1 - i] = t;
            }
            snprintf(rel, sizeof rel, "%s/round-%06lld.outer.safetensors", STORE_CHECKPOINT_DIR,
                     (long long)n);
            snprintf(full, sizeof full, "%s/%s", fx->home, rel);
            cr_assert_eq(file_write_atomic(full, buf, FIXTURE_CKPT_BYTES, 0644, err), 0, "%s", err);
            uint8_t md[SHA256_LEN];
            security_sha256(buf, FIXTURE_CKPT_BYTES, md);
            security_hex(md, SHA256_LEN, sha);
            ck.state_path = rel, ck.state_bytes = FIXTURE_CKPT_BYTES, ck.state_sha256 = sha;
        }
        cr_assert_eq(store_round_commit(fx->store, rid, &ck, 1.0, 0, 2000 + n, err), 0, "%s", err);
    }
    free(buf);
}

void store_fixture_files(const char *home, uint64_t *models, uint64_t *states) {
    char dir[700];
    snprintf(dir, sizeof dir, "%s/%s", home, STORE_CHECKPOINT_DIR);
    *models = *states = 0;
    DIR *d = opendir(dir);
    cr_assert_not_null(d, "no folder %s", dir);
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        long long n;
        char rest[64];
        if (sscanf(e->d_name, "round-%6lld.%63s", &n, rest) != 2 || n < 0 || n >= 64) continue;
        if (strcmp(rest, "safetensors") == 0) *models |= 1ull << n;
        if (strncmp(rest, "outer.", 6) == 0) *states |= 1ull << n;
    }
    closedir(d);
}

int store_fixture_checkpoint_matches(const char *home, const char *rel, int64_t round) {
    char full[800], err[ERR_LEN], *data;
    size_t len;
    snprintf(full, sizeof full, "%s/%s", home, rel);
    if (file_read_all(full, 1 << 24, &data, &len, err) != 0) return 0;
    unsigned char *want = malloc(FIXTURE_CKPT_BYTES);
    store_fixture_checkpoint_bytes(round, want);
    int same = len == FIXTURE_CKPT_BYTES && memcmp(data, want, len) == 0;
    free(want);
    free(data);
    return same;
}

void store_fixture_touch(StoreFixture *fx, const char *rel) {
    char full[800], err[ERR_LEN];
    snprintf(full, sizeof full, "%s/%s", fx->home, rel);
    cr_assert_eq(file_write_atomic(full, "x", 1, 0644, err), 0, "%s", err);
}

int store_fixture_exists(StoreFixture *fx, const char *rel) {
    char full[800];
    snprintf(full, sizeof full, "%s/%s", fx->home, rel);
    return access(full, F_OK) == 0;
}

void store_fixture_remove(StoreFixture *fx, const char *rel) {
    char full[800];
    snprintf(full, sizeof full, "%s/%s", fx->home, rel);
    cr_assert_eq(unlink(full), 0);
}

void store_fixture_flip_byte(StoreFixture *fx, const char *rel, long offset) {
    char full[800];
    snprintf(full, sizeof full, "%s/%s", fx->home, rel);
    int fd = open(full, O_RDWR);
    cr_assert_geq(fd, 0);
    unsigned char b;
    cr_assert_eq(pread(fd, &b, 1, offset), 1);
    b ^= 0x5a;
    cr_assert_eq(pwrite(fd, &b, 1, offset), 1);
    close(fd);
}

StoreRound store_fixture_wait_committed(const char *home, int64_t n, int timeout_s) {
    return store_fixture_wait_committed_by(home, n, timeout_s, 0);
}

StoreRound store_fixture_wait_committed_by(const char *home, int64_t n, int timeout_s, int pid) {
    char db[800], err[ERR_LEN];
    snprintf(db, sizeof db, "%s/%s", home, STORE_DB_FILE);
    StoreRound r;
    for (int i = 0; i < timeout_s * 10; i++) {
        int status = 0;
        if (pid > 0 && i % 10 == 0 && proc_ended(pid, &status) == 1)
            cr_assert_fail("the coordinator ended (status %d) before round %lld committed", status,
                           (long long)n);
        Store *s = store_open(db, STORE_READONLY, err);
        if (s) {
            int rc = store_round_get(s, n, &r, err);
            store_close(s);
            if (rc == 0 && strcmp(r.state, "committed") == 0) return r;
        }
        usleep(100000);
    }
    /* the attempts that failed say why (a full disk, a store error) */
    char failed[400] = "";
    Store *s = store_open(db, STORE_READONLY, err);
    StoreRound *rs = NULL;
    size_t nr = 0;
    if (s && store_rounds_list(s, 64, 0, &rs, &nr, err) == 0)
        for (size_t i = 0; i < nr && !failed[0]; i++)
            if (rs[i].number == n && strcmp(rs[i].state, "failed") == 0)
                snprintf(failed, sizeof failed, "; attempt %lld failed: %s",
                         (long long)rs[i].attempt, rs[i].failed_reason);
    free(rs);
    if (s) store_close(s);
    cr_assert_fail("round %lld was not committed within %d s%s", (long long)n, timeout_s, failed);
    return r;
}

void store_fixture_load_tiny(const char *home, const char *rel, Model *m) {
    char path[1200], err[ERR_LEN];
    snprintf(path, sizeof path, "%s/%s", home, rel);
    ModelConfig cfg;
    model_config_preset("tiny", &cfg);
    cr_assert_eq(model_build(m, &cfg, 0, err), 0, "%s", err);
    cr_assert_eq(model_load(m, path, NULL, err), 0, "%s", err);
}
