/*
 * test_faults.c — every fault point of the durable writes, in-process
 * (tests/faultsim/faultsim.h: the unit tests are linked with it): an
 * atomic file replace and a site's state save, with the k-th allocation or
 * file call failing for k = 1, 2, … until a save injects nothing. A save
 * its fault failed says why and leaves what was there before, whole; one
 * that succeeded leaves the new; nothing else is left beside them.
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
    GPT m;
    GPTConfig cfg;
    gpt_config_preset("tiny", &cfg);
    cr_assert_eq(gpt_build(&m, &cfg, 1, err), 0, "%s", err);
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
            cr_assert_eq(site_state_save(&s, &m, &ef, 1, 100, err), 0, "%s", err);
            FILL(2);
            err[0] = '\0';
            faultsim_arm(kinds[i].kind, k, kinds[i].err, 0);
            int rc = site_state_save(&s, &m, &ef, 2, 200, err);
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
    cr_assert_eq(site_state_save(&s, &m, &ef, 3, 300, err), 0, "%s", err);
    char from[700], to[700];
    snprintf(from, sizeof from, "%s/state", dir), snprintf(to, sizeof to, "%s/state.old", dir);
    cr_assert_eq(rename(from, to), 0);
    uint64_t round = 0;
    size_t pos = 0;
    cr_assert_eq(site_state_load(&s, &m, &back, &round, &pos, err), 1, "%s", err);
    cr_assert(round == 3 && pos == 300 && back.e[0] == 3.0f, "state.old was not read back");
    ef_free(&ef), ef_free(&back);
    gpt_free(&m);
    harness_rmtree(dir);
    free(dir);
}
