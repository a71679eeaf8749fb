/*
 * retain.c — the coordinator's disk: after each commit (and once at start)
 * the checkpoints and outer states the retention policy ([store] keep_last,
 * keep_every) no longer keeps are pruned through the store, in its
 * crash-safe order (store_prune), and the free space of the federation's
 * folder is compared with what the next rounds write, so an operator hears
 * of a short disk rounds before the commit that would fail on it.
 *
 * Threading: runs on the committing thread after the install, outside
 * rounds.lock; the store is used under store_lock. Nothing here fails a
 * round: what a failed prune left is taken up by the next one, or by
 * store_recover at the next start.
 */
#include <string.h>

#include "coordinator_internal.h"
#include "util/util.h"

/* What one commit writes before anything is pruned: the checkpoint, the
 * outer state (momentum, Adam's second moment, the downlink's residual:
 * each a model's fp32 size) and the downlink delta spilled beside them (a
 * checkpoint's size at most). */
int64_t round_commit_estimate(const Rounds *r) {
    int64_t model = (int64_t)r->model.n_params * 4;
    int arrays = (r->outer.b != NULL) + (r->outer.v != NULL) + (r->down_ef.e != NULL);
    return model * (2 + arrays);
}

static void warn_if_short(const Coordinator *co, const StoreDisk *d, int64_t need, int64_t ckpt,
                          int64_t to_go) {
    const StoreRetention *p = &co->rounds.set.retain;
    int64_t left = store_disk_rounds_left(d->free, need, ckpt, p->keep_every, to_go);
    if (left < 0 || left >= DISK_ROUNDS_WARN || left >= to_go) return;
    log_warn("store",
             "disk: %.2f GB free in %s holds %lld of the %lld commits left (each %.2f GB while "
             "it is written, and a milestone's checkpoint every %lld rounds stays); free space, "
             "or raise [store] keep_every (0: no milestones), before a commit fails",
             d->free / 1e9, co->dir, (long long)left, (long long)to_go, need / 1e9,
             (long long)p->keep_every);
}

int round_retain(Coordinator *co) {
    Rounds *r = &co->rounds;
    StorePruneReport rep;
    StoreDisk disk;
    char err[ERR_LEN], why[ERR_LEN];
    pthread_mutex_lock(&co->store_lock);
    int pruned = store_prune(co->store, co->dir, &r->set.retain, time_wall_ms(), &rep, err);
    int measured = store_disk(co->store, &disk, why);
    pthread_mutex_unlock(&co->store_lock);
    if (pruned != 0)
        log_warn("store", "retention: %s; what is left goes at the next commit or start", err);
    else if (rep.checkpoints + rep.states > 0)
        log_info("store", "retention: pruned %d checkpoint%s and %d outer state%s (%.1f MB)",
                 rep.checkpoints, rep.checkpoints == 1 ? "" : "s", rep.states,
                 rep.states == 1 ? "" : "s", rep.bytes / 1e6);
    if (pruned == 0 && rep.held > 0)
        log_info("store",
                 "retention: %d checkpoint%s held by a reader (strait export) kept "
                 "for now",
                 rep.held, rep.held == 1 ? "" : "s");
    if (measured != 0) {
        log_warn("store", "cannot measure the disk: %s", why);
        return -1;
    }
    /* the newest commit's files say it exactly; before the first, the model */
    warn_if_short(co, &disk, disk.round_bytes > 0 ? disk.round_bytes : r->commit_bytes,
                  disk.ckpt_bytes > 0 ? disk.ckpt_bytes : (int64_t)r->model.n_params * 4,
                  r->set.total - (disk.newest + 1));
    return pruned;
}
