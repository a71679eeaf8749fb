/*
 * test_faults.c — every fault point of the durable writes, in-process
 * (tests/faultsim/faultsim.h: the unit tests are linked with it): an
 * atomic file replace and a site's state save, with the k-th allocation or
 * file call failing for k = 1, 2, … until a save injects nothing. A save
 * its fault failed says why and leaves what was there before, whole; one
 * that succeeded leaves the new; nothing else is left beside them. And
 * security/'s calls with OpenSSL's k-th allocation failing.
 */
#include <dirent.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <criterion/criterion.h>

#include "client/client_internal.h"
#include "compress/compress.h"
#include "kernels/formats.h"
#include "kernels/model.h"
#include "security/security.h"
#include "tests/faultsim/faultsim.h"
#include "tests/harness.h"
#include "util/util.h"

static const struct {
    FaultKind kind;
    int err;
    const char *name;
} kinds[] = {{FAULT_ALLOC, ENOMEM, "alloc"},
             {FAULT_IO, ENOSPC, "io:enospc"},
             {FAULT_IO, EIO, "io:eio"},
             /* at renameat2: a file system without RENAME_EXCHANGE (NFS) */
             {FAULT_IO, EINVAL, "io:einval"}};
#define N_KINDS (sizeof kinds / sizeof kinds[0])

/* Whether err is the sync of folder dir failing (the one failure an
 * atomic write has after its rename: the new content is in place). */
static int dir_sync_failed(const char *err, const char *dir) {
    char a[700], b[700];
    snprintf(a, sizeof a, "sync folder %s:", dir);
    snprintf(b, sizeof b, "open folder %s to sync it", dir);
    return strstr(err, a) != NULL || strstr(err, b) != NULL;
}

/* How many names in dir (not starting with '.') hold `holding`. */
static int count_entries(const char *dir, const char *holding) {
    DIR *d = opendir(dir);
    cr_assert_not_null(d, "%s", dir);
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d)) != NULL)
        n += e->d_name[0] != '.' && (holding == NULL || strstr(e->d_name, holding) != NULL);
    closedir(d);
    return n;
}

Test(faults, an_atomic_replace_leaves_the_old_file_or_the_new) {
    char *dir = harness_tmpdir("faults-file"), path[600], err[ERR_LEN];
    snprintf(path, sizeof path, "%s/f.bin", dir);
    static const char old_text[] = "the old content\n", new_text[] = "the new content, longer\n";
    for (size_t i = 0; i < N_KINDS; i++) {
        int failed = 0;
        for (int k = 1; k < 1000; k++) {
            cr_assert_eq(file_write_atomic(path, old_text, sizeof old_text, 0600, err), 0, "%s",
                         err);
            err[0] = '\0';
            faultsim_arm(kinds[i].kind, k, kinds[i].err, 0);
            int rc = file_write_atomic(path, new_text, sizeof new_text, 0600, err);
            int64_t fired;
            faultsim_disarm(&fired);
            char *got = NULL;
            size_t len;
            cr_assert_eq(file_read_all(path, 1 << 20, &got, &len, err), 0, "%s", err);
            if (rc != 0) {
                failed++;
                cr_assert_eq(fired, 1);
                cr_assert_neq(err[0], '\0', "%s at call %d: failed without a reason", kinds[i].name,
                              k);
                /* failed after its rename, only the folder's sync: the new is in place */
                int is_new = len == sizeof new_text && memcmp(got, new_text, len) == 0;
                int is_old = len == sizeof old_text && memcmp(got, old_text, len) == 0;
                cr_assert(is_old || (is_new && dir_sync_failed(err, dir)),
                          "%s at call %d: a failed replace left neither file whole (%s)",
                          kinds[i].name, k, err);
            } else {
                cr_assert(len == sizeof new_text && memcmp(got, new_text, len) == 0);
            }
            free(got);
            cr_assert_eq(count_entries(dir, ".tmp."), 0, "%s at call %d left a temporary",
                         kinds[i].name, k);
            if (fired == 0) break;
        }
        cr_assert_gt(failed, 0, "%s: nothing was made to fail", kinds[i].name);
    }
    harness_rmtree(dir);
    free(dir);
}

/* A site's state (its AdamW moments, its error-feedback residual, the
 * round and data position) saved over an earlier one: a save that failed
 * leaves the earlier state whole, moments, residual and round together. */
Test(faults, a_site_state_save_is_whole_or_not_at_all) {
    char *dir = harness_tmpdir("faults-state"), err[ERR_LEN];
    Model m;
    ModelConfig cfg;
    model_config_preset("tiny", &cfg);
    cr_assert_eq(model_build(&m, &cfg, 1, err), 0, "%s", err);
    size_t n = m.n_params;
    m.m = calloc(n, 4), m.v = calloc(n, 4);
    ErrorFeedback ef, back;
    cr_assert_eq(ef_init(&ef, n, m.table_hash, 1.0f, err), 0, "%s", err);
    cr_assert_eq(ef_init(&back, n, m.table_hash, 1.0f, err), 0, "%s", err);
    Site s;
    memset(&s, 0, sizeof s);
    s.o.site_dir = dir;
    /* the state of round r: every moment and residual r */
#define FILL(r)                                                                                    \
    for (size_t j = 0; j < n; j++) m.m[j] = m.v[j] = ef.e[j] = (float)(r);                         \
    m.step = (r)
    for (size_t i = 0; i < N_KINDS; i++) {
        int failed = 0, went_on = 0;
        for (int k = 1; k < 1000; k++) {
            FILL(1);
            cr_assert_eq(site_state_save(&s, &m, &ef, 1, 100, NULL, err), 0, "%s", err);
            FILL(2);
            err[0] = '\0';
            faultsim_arm(kinds[i].kind, k, kinds[i].err, 0);
            int rc = site_state_save(&s, &m, &ef, 2, 200, NULL, err);
            int64_t fired;
            faultsim_disarm(&fired);
            if (rc != 0) {
                failed++;
                cr_assert_neq(err[0], '\0', "%s at call %d: failed without a reason", kinds[i].name,
                              k);
            }
            went_on += rc == 0 && fired > 0;
            /* failed after its exchange, only the folder's sync: the new is in place */
            int want = rc == 0 || dir_sync_failed(err, dir) ? 2 : 1;
            /* what a restarted site reads back */
            FILL(0);
            uint64_t round = 0;
            size_t pos = 0;
            cr_assert_eq(site_state_load(&s, &m, &back, &round, &pos, err), 1, "%s", err);
            cr_assert_eq(round, (uint64_t)want, "%s at call %d (%s): round %llu", kinds[i].name, k,
                         rc ? err : "saved", (unsigned long long)round);
            cr_assert_eq(pos, (size_t)want * 100);
            size_t bad = 0;
            for (size_t j = 0; j < n; j++)
                bad += m.m[j] != (float)want || m.v[j] != (float)want || back.e[j] != (float)want;
            cr_assert_eq(bad, 0, "%s at call %d: %zu values not of round %d's state", kinds[i].name,
                         k, bad, want);
            cr_assert_eq(count_entries(dir, "state.new") + count_entries(dir, "state.old"), 0,
                         "%s at call %d left state.new or state.old", kinds[i].name, k);
            if (fired == 0) break;
        }
        cr_assert_gt(failed, 0, "%s: nothing was made to fail", kinds[i].name);
        /* without the exchange, the two renames save it all the same */
        if (kinds[i].err == EINVAL)
            cr_assert_gt(went_on, 0, "no save went on without the exchange");
    }
    /* a crash between those two renames leaves state.old alone: it is read */
    FILL(3);
    cr_assert_eq(site_state_save(&s, &m, &ef, 3, 300, NULL, err), 0, "%s", err);
    char from[700], to[700];
    snprintf(from, sizeof from, "%s/state", dir), snprintf(to, sizeof to, "%s/state.old", dir);
    cr_assert_eq(rename(from, to), 0);
    uint64_t round = 0;
    size_t pos = 0;
    cr_assert_eq(site_state_load(&s, &m, &back, &round, &pos, err), 1, "%s", err);
    cr_assert(round == 3 && pos == 300 && back.e[0] == 3.0f, "state.old was not read back");
    ef_free(&ef), ef_free(&back);
    model_free(&m);
    harness_rmtree(dir);
    free(dir);
}

/* ---- OpenSSL's own allocations failing in security/ ---- */

/* One security/ call with OpenSSL's k-th allocation failing, for k = 1, 2,
 * … until a call injects nothing. Each call either fails with a reason in
 * one line, its outputs NULL, or succeeds past the fault (OpenSSL tolerates
 * some: its error queue, a cache it fills later), and then check, run with
 * nothing armed, sees its result whole and right. Under ASan nothing a
 * failed call made is left behind. */
typedef struct SslWalk {
    const char *name;
    /* the call: 0 or -1; *out its PEM or text (malloc'd), NULL if none */
    int (*run)(void *ctx, char **out, char *err);
    void (*check)(void *ctx, const char *out);
    void *ctx;
} SslWalk;

static int ssl_walk(const SslWalk *w) {
    int failed = 0, tolerated = 0;
    for (int k = 1; k <= 20000; k++) {
        char err[ERR_LEN] = "", *out = NULL;
        faultsim_arm(FAULT_SSL, k, ENOMEM, 0);
        int rc = w->run(w->ctx, &out, err);
        int64_t fired;
        int64_t calls = faultsim_disarm(&fired);
        if (rc == 0) {
            w->check(w->ctx, out);
            free(out);
            if (fired == 0) {
                cr_assert_gt(calls, 0, "%s: OpenSSL allocated nothing, so nothing was walked",
                             w->name);
                cr_log_info("%s: %lld OpenSSL allocations, %d failed the call, %d gone past",
                            w->name, (long long)calls, failed, tolerated);
                return failed;
            }
            tolerated++;
            continue;
        }
        failed++;
        cr_assert_eq(fired, 1, "%s failed with no fault injected: %s", w->name, err);
        cr_assert_null(out, "%s at allocation %d: failed and left its output", w->name, k);
        cr_assert_neq(err[0], '\0', "%s at allocation %d: failed without a reason", w->name, k);
        cr_assert_null(strchr(err, '\n'), "%s: '%s' is more than one line", w->name, err);
    }
    cr_assert_fail("%s: still failing after 20000 allocations", w->name);
    return failed;
}

typedef struct Pki {
    char *ca, *ca_key, *csr, *abc;
} Pki;

/* a certificate's PEM whose CN is want */
static void is_cert_for(const char *pem, const char *want) {
    char err[ERR_LEN];
    SecurityIdentity id;
    cr_assert_eq(security_cert_identity(pem, &id, err), 0, "made past a fault: %s", err);
    cr_assert_str_eq(id.name, want, "made past a fault for the wrong name");
    cr_assert_eq(strlen(id.serial_hex), 32, "a 128-bit serial, not '%s'", id.serial_hex);
    cr_assert_gt(id.not_after, time_wall_ms(), "already expired");
}

/* both outputs in one string, the key after the certificate */
static int cert_and_key(int rc, char *cert, char *key, char **out) {
    if (rc != 0) cr_assert(cert == NULL && key == NULL, "a failed call left its outputs");
    if (rc == 0 && cert && key) cr_assert_gt(asprintf(out, "%s%s", cert, key), 0);
    if (rc == 0) cr_assert_not_null(*out, "a call that succeeded gave no output");
    free(cert), free(key);
    return rc;
}

static int make_ca(void *ctx, char **out, char *err) {
    (void)ctx;
    SecurityCertSpec spec = {"Walk CA", NULL, 1, 0, 0, 86400};
    char *cert = NULL, *key = NULL;
    int rc = security_cert_create(&spec, NULL, NULL, &cert, &key, err);
    return cert_and_key(rc, cert, key, out);
}
static void check_ca(void *ctx, const char *out) {
    (void)ctx;
    is_cert_for(out, "Walk CA");
    cr_assert_not_null(strstr(out, "PRIVATE KEY"));
}

static int make_server_cert(void *ctx, char **out, char *err) {
    const Pki *p = ctx;
    SecurityCertSpec spec = {"coordinator", "DNS:localhost,IP:127.0.0.1", 0, 1, -60, 86400};
    char *cert = NULL, *key = NULL;
    int rc = security_cert_create(&spec, p->ca, p->ca_key, &cert, &key, err);
    return cert_and_key(rc, cert, key, out);
}
static void check_server_cert(void *ctx, const char *out) {
    (void)ctx;
    is_cert_for(out, "coordinator");
}

static int make_csr(void *ctx, char **out, char *err) {
    (void)ctx;
    char *csr = NULL, *key = NULL;
    int rc = security_csr_create("site-a", &csr, &key, err);
    return cert_and_key(rc, csr, key, out);
}
static void check_csr(void *ctx, const char *out) {
    const Pki *p = ctx;
    char *cert = NULL, err[ERR_LEN];
    cr_assert_eq(security_csr_sign(p->ca, p->ca_key, (const uint8_t *)out, strlen(out), "site-a",
                                   30, &cert, err),
                 0, "a CSR made past a fault does not sign: %s", err);
    is_cert_for(cert, "site-a");
    free(cert);
}

static int sign_csr(void *ctx, char **out, char *err) {
    const Pki *p = ctx;
    return security_csr_sign(p->ca, p->ca_key, (const uint8_t *)p->csr, strlen(p->csr), "site-a",
                             30, out, err);
}
static void check_signed(void *ctx, const char *out) {
    (void)ctx;
    is_cert_for(out, "site-a");
}

static int identity(void *ctx, char **out, char *err) {
    const Pki *p = ctx;
    SecurityIdentity id;
    int rc = security_cert_identity(p->ca, &id, err);
    if (rc == 0)
        cr_assert_gt(asprintf(out, "%s %s %lld", id.name, id.serial_hex, (long long)id.not_after),
                     0);
    return rc;
}
static void check_identity(void *ctx, const char *out) {
    const Pki *p = ctx;
    SecurityIdentity id;
    char err[ERR_LEN], want[256];
    cr_assert_eq(security_cert_identity(p->ca, &id, err), 0, "%s", err);
    snprintf(want, sizeof want, "%s %s %lld", id.name, id.serial_hex, (long long)id.not_after);
    cr_assert_str_eq(out, want, "an identity read past a fault differs");
}

static int hash_file(void *ctx, char **out, char *err) {
    const Pki *p = ctx;
    char hex[SHA256_HEX_LEN];
    int rc = security_sha256_file(p->abc, hex, NULL, err);
    if (rc == 0) *out = strdup(hex);
    return rc;
}
static void check_hash(void *ctx, const char *out) {
    (void)ctx; /* SHA-256 of "abc" */
    cr_assert_str_eq(out, "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
}

Test(faults, security_calls_fail_whole_when_openssl_cannot_allocate, .timeout = 600) {
    char err[ERR_LEN], *dir = harness_tmpdir("faults-ssl"), path[600], *key = NULL;
    Pki p = {NULL, NULL, NULL, path};
    SecurityCertSpec spec = {"Walk CA", NULL, 1, 0, 0, 86400};
    cr_assert_eq(security_cert_create(&spec, NULL, NULL, &p.ca, &p.ca_key, err), 0, "%s", err);
    cr_assert_eq(security_csr_create("site-a", &p.csr, &key, err), 0, "%s", err);
    free(key);
    snprintf(path, sizeof path, "%s/abc", dir);
    cr_assert_eq(file_write_atomic(path, "abc", 3, 0600, err), 0, "%s", err);
    const SslWalk walks[] = {{"a CA", make_ca, check_ca, &p},
                             {"a server certificate", make_server_cert, check_server_cert, &p},
                             {"a site's key and CSR", make_csr, check_csr, &p},
                             {"signing a CSR", sign_csr, check_signed, &p},
                             {"a certificate's identity", identity, check_identity, &p},
                             {"SHA-256 of a file", hash_file, check_hash, &p}};
    /* (an enrollment token's RAND_bytes allocates nothing once the CA
     * above has started OpenSSL's generator) */
    int total = 0;
    for (size_t i = 0; i < sizeof walks / sizeof walks[0]; i++) total += ssl_walk(&walks[i]);
    cr_assert_gt(total, 20, "only %d calls failed: is OpenSSL allocating through faultsim?", total);
    free(p.ca), free(p.ca_key), free(p.csr);
    harness_rmtree(dir);
    free(dir);
}
