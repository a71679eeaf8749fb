/*
 * test_store_retain.c — checkpoint retention in the store: which rounds the
 * policy keeps; a prune that keeps exactly those files (and the newest
 * round's outer state alone), records the rest, and leaves `strait db
 * check`'s verdict sound; a checkpoint a reader holds kept until it lets go,
 * and a pruned round refused to a reader with the rounds that are kept;
 * store_recover finishing a prune whose files a crash left, and leaving
 * kept files alone; what the disk report says. The prune under faults and
 * kills is walked in test_store_faults.c and test_store_crash.c.
 */
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include <criterion/criterion.h>

#include "coordinator/store.h"
#include "tests/store_fixture.h"
#include "util/util.h"

#define BIT(n) (1ull << (n))

Test(store_retain, the_policy_keeps_the_last_every_mth_and_what_a_restart_reads) {
    StoreRetention p = {.keep_last = 2, .keep_every = 5, .keep_back = 1};
    uint64_t kept = 0;
    for (int n = 0; n <= 14; n++) kept |= (uint64_t)store_retention_keeps(&p, 14, n) << n;
    cr_assert_eq(kept, BIT(0) | BIT(5) | BIT(10) | BIT(13) | BIT(14), "kept %#llx",
                 (unsigned long long)kept);
    /* keep_last = 1 still keeps the round before: the delta a restart serves */
    StoreRetention one = {.keep_last = 1, .keep_every = 0, .keep_back = 1};
    cr_assert(store_retention_keeps(&one, 9, 8));
    cr_assert_not(store_retention_keeps(&one, 9, 7));
    /* async rounds: the `staleness` models before the newest */
    StoreRetention async = {.keep_last = 2, .keep_every = 0, .keep_back = 4};
    for (int n = 5; n <= 9; n++) cr_assert(store_retention_keeps(&async, 9, n), "round %d", n);
    cr_assert_not(store_retention_keeps(&async, 9, 4));
}

/* How many of the commits left the free space holds: each needs its whole
 * write at once; without milestones retention keeps the disk level, so
 * every one fits once one does; with them the disk grows a checkpoint
 * every keep_every rounds. */
Test(store_retain, the_disk_holds_the_commits_left_that_fit_as_retention_prunes) {
    const int64_t GB = 1000000000;
    cr_assert_eq(store_disk_rounds_left(-1, 4 * GB, GB, 0, 100), -1, "free space unknown");
    cr_assert_eq(store_disk_rounds_left(10 * GB, 0, 0, 0, 100), -1, "no commit measured");
    cr_assert_eq(store_disk_rounds_left(3 * GB, 4 * GB, GB, 0, 100), 0, "not one commit fits");
    cr_assert_eq(store_disk_rounds_left(5 * GB, 4 * GB, GB, 0, 100), 100, "level: all of them");
    /* a milestone of 1 GB every 10 rounds: 0.1 GB a round beyond the first commit's 4 */
    cr_assert_eq(store_disk_rounds_left(5 * GB, 4 * GB, GB, 10, 100), 11);
    cr_assert_eq(store_disk_rounds_left(50 * GB, 4 * GB, GB, 10, 100), 100, "bounded by the run");
    cr_assert_eq(store_disk_rounds_left(5 * GB, 4 * GB, GB, 0, -3), 0, "a finished run");
}

Test(store_retain, a_prune_keeps_exactly_what_the_policy_names) {
    StoreFixture fx;
    store_fixture_init(&fx, "retain");
    store_fixture_commit_rounds(&fx, 0, 15, 1);
    char err[ERR_LEN];
    StoreRetention p = {.keep_last = 2, .keep_every = 5, .keep_back = 1};
    StorePruneReport rep;
    cr_assert_eq(store_prune(fx.store, fx.home, &p, 5000, &rep, err), 0, "%s", err);
    cr_assert_eq(rep.checkpoints, 10);
    cr_assert_eq(rep.states, 14, "every outer state but the newest's");
    cr_assert_eq(rep.bytes, 24LL * FIXTURE_CKPT_BYTES);
    uint64_t models, states;
    store_fixture_files(fx.home, &models, &states);
    cr_assert_eq(models, BIT(0) | BIT(5) | BIT(10) | BIT(13) | BIT(14), "models %#llx",
                 (unsigned long long)models);
    cr_assert_eq(states, BIT(14), "states %#llx", (unsigned long long)states);
    /* the rows stay, the pruned ones marked */
    StoreRound r;
    cr_assert_eq(store_round_get(fx.store, 3, &r, err), 0);
    cr_assert_eq(r.pruned_at, 5000);
    cr_assert_eq(r.state_pruned_at, 5000);
    cr_assert_eq(store_round_get(fx.store, 5, &r, err), 0);
    cr_assert_eq(r.pruned_at, 0);
    cr_assert_eq(r.state_pruned_at, 5000);
    StoreCheck chk;
    cr_assert_eq(store_check(fx.store, fx.home, &chk, NULL, NULL, err), 0, "%s", err);
    cr_assert_eq(chk.checkpoints_ok, 5);
    cr_assert_eq(chk.checkpoints_bad, 0);
    cr_assert_eq(chk.checkpoints_pruned, 10);
    cr_assert_eq(chk.states_pruned, 14);
    cr_assert_eq(chk.prunes_pending, 0);
    StoreDisk d;
    cr_assert_eq(store_disk(fx.store, &d, err), 0, "%s", err);
    cr_assert_eq(d.kept, 5);
    cr_assert_eq(d.pruned, 10);
    cr_assert_eq(d.used, 6LL * FIXTURE_CKPT_BYTES);
    cr_assert_eq(d.round_bytes, 3LL * FIXTURE_CKPT_BYTES);
    cr_assert_gt(d.free, 0);
    /* a second prune has nothing to do; the next round moves the window */
    cr_assert_eq(store_prune(fx.store, fx.home, &p, 6000, &rep, err), 0, "%s", err);
    cr_assert_eq(rep.checkpoints + rep.states, 0);
    store_fixture_commit_rounds(&fx, 15, 16, 1);
    cr_assert_eq(store_prune(fx.store, fx.home, &p, 7000, &rep, err), 0, "%s", err);
    cr_assert_eq(rep.checkpoints, 1);
    cr_assert_eq(rep.states, 1);
    store_fixture_files(fx.home, &models, &states);
    cr_assert_eq(models, BIT(0) | BIT(5) | BIT(10) | BIT(14) | BIT(15));
    cr_assert_eq(states, BIT(15));
    /* a resume point is whole: the newest round verifies with its state */
    cr_assert_eq(store_resume_point(fx.store, fx.home, &r, err), 0, "%s", err);
    cr_assert_eq(r.number, 15);
    store_fixture_fini(&fx);
}

Test(store_retain, a_held_checkpoint_is_kept_until_its_reader_lets_go) {
    StoreFixture fx;
    store_fixture_init(&fx, "retain-hold");
    store_fixture_commit_rounds(&fx, 0, 6, 0);
    char err[ERR_LEN], path[800];
    snprintf(path, sizeof path, "%s/%s/round-000001.safetensors", fx.home, STORE_CHECKPOINT_DIR);
    int fd;
    int64_t round;
    cr_assert_eq(store_hold(fx.store, fx.home, path, &fd, &round, err), 0, "%s", err);
    cr_assert_eq(round, 1);
    StoreRetention p = {.keep_last = 2, .keep_every = 0, .keep_back = 1};
    StorePruneReport rep;
    cr_assert_eq(store_prune(fx.store, fx.home, &p, 5000, &rep, err), 0, "%s", err);
    cr_assert_eq(rep.held, 1);
    cr_assert_eq(rep.checkpoints, 3, "rounds 0, 2 and 3");
    uint64_t models, states;
    store_fixture_files(fx.home, &models, &states);
    cr_assert_eq(models, BIT(1) | BIT(4) | BIT(5));
    close(fd);
    cr_assert_eq(store_prune(fx.store, fx.home, &p, 6000, &rep, err), 0, "%s", err);
    cr_assert_eq(rep.checkpoints, 1);
    store_fixture_files(fx.home, &models, &states);
    cr_assert_eq(models, BIT(4) | BIT(5));
    /* a pruned round: refused, in one line, with the rounds kept */
    cr_assert_eq(store_hold(fx.store, fx.home, path, &fd, &round, err), STORE_PRUNED);
    cr_assert_eq(fd, -1);
    cr_assert_not_null(strstr(err, "round 1's checkpoint was pruned"), "%s", err);
    cr_assert_not_null(strstr(err, "the rounds kept are 4, 5"), "%s", err);
    cr_assert_null(strchr(err, '\n'));
    /* a file no row names is not the store's to hold */
    cr_assert_eq(store_hold(fx.store, fx.home, "elsewhere/model.safetensors", &fd, &round, err),
                 STORE_NOT_FOUND);
    store_fixture_fini(&fx);
}

/* A prune a crash cut after its transaction: the marked files are there;
 * the check says they are pending, not bad; recovery removes them and
 * nothing the store keeps. */
Test(store_retain, recovery_finishes_a_prune_and_leaves_kept_files_alone) {
    StoreFixture fx;
    store_fixture_init(&fx, "retain-recover");
    store_fixture_commit_rounds(&fx, 0, 6, 1);
    char err[ERR_LEN], path[800];
    /* a copy of what the prune will remove, put back after it */
    uint64_t before, before_states;
    store_fixture_files(fx.home, &before, &before_states);
    snprintf(path, sizeof path, "%s/%s/round-000002.safetensors", fx.home, STORE_CHECKPOINT_DIR);
    char *bytes;
    size_t len;
    cr_assert_eq(file_read_all(path, 1 << 24, &bytes, &len, err), 0, "%s", err);
    StoreRetention p = {.keep_last = 2, .keep_every = 0, .keep_back = 1};
    StorePruneReport rep;
    cr_assert_eq(store_prune(fx.store, fx.home, &p, 5000, &rep, err), 0, "%s", err);
    cr_assert_eq(file_write_atomic(path, bytes, len, 0644, err), 0, "%s", err);
    free(bytes);
    store_fixture_touch(&fx, "checkpoints/round-000009.safetensors"); /* a commit cut short */
    StoreCheck chk;
    cr_assert_eq(store_check(fx.store, fx.home, &chk, NULL, NULL, err), 0, "%s", err);
    cr_assert_eq(chk.checkpoints_bad, 0);
    cr_assert_eq(chk.prunes_pending, 1);
    StoreRecovery rec;
    cr_assert_eq(store_recover(fx.store, fx.home, 6000, &rec, err), 0, "%s", err);
    cr_assert_eq(rec.prunes_finished, 1);
    cr_assert_eq(rec.orphans_removed, 1);
    uint64_t models, states;
    store_fixture_files(fx.home, &models, &states);
    cr_assert_eq(models, BIT(4) | BIT(5));
    cr_assert_eq(states, BIT(5));
    cr_assert_eq(store_check(fx.store, fx.home, &chk, NULL, NULL, err), 0, "%s", err);
    cr_assert_eq(chk.prunes_pending, 0);
    cr_assert_eq(chk.checkpoints_ok, 2);
    cr_assert_eq(store_recover(fx.store, fx.home, 7000, &rec, err), 0, "%s", err);
    cr_assert_eq(rec.prunes_finished + rec.orphans_removed, 0, "recovery is not idempotent");
    store_fixture_fini(&fx);
}

/* A kept file that is missing is damage, and a pruned one is not; the
 * newest round is never pruned. */
Test(store_retain, the_check_knows_pruned_on_purpose_from_missing) {
    StoreFixture fx;
    store_fixture_init(&fx, "retain-check");
    store_fixture_commit_rounds(&fx, 0, 5, 1);
    char err[ERR_LEN];
    StoreRetention p = {.keep_last = 2, .keep_every = 0, .keep_back = 1};
    StorePruneReport rep;
    cr_assert_eq(store_prune(fx.store, fx.home, &p, 5000, &rep, err), 0, "%s", err);
    store_fixture_remove(&fx, "checkpoints/round-000003.safetensors");
    StoreCheck chk;
    cr_assert_eq(store_check(fx.store, fx.home, &chk, NULL, NULL, err), 0, "%s", err);
    cr_assert_eq(chk.checkpoints_ok, 1);
    cr_assert_eq(chk.checkpoints_bad, 1, "a kept checkpoint that is gone is damage");
    cr_assert_eq(chk.checkpoints_pruned, 3);
    store_fixture_fini(&fx);
}
