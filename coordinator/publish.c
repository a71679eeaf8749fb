/*
 * publish.c — publishing a round's model: θ_{r+1} built from the closed
 * round (its mean or robust aggregate, the outer step, the compressed
 * downlink), written as the checkpoint and the optimizer's state beside it
 * (each fsynced and renamed into place), committed in the store, and only
 * then installed as the model the coordinator serves (docs/design.md §5).
 *
 * Threading: the build runs outside rounds.lock, so the calls go on being
 * answered while files are written and hashed. It reads θ_r, the outer
 * optimizer and the downlink's residual, which only an install changes, and
 * one commit runs at a time (ROUND_COMMITTING). The install runs under
 * rounds.lock and cannot fail. A coordinator killed anywhere in between
 * restarts at the last round the store committed.
 */
#include <assert.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "coordinator_internal.h"
#include "privacy/privacy.h"
#include "security/security.h"
#include "util/util.h"

/* ---- the current model's checkpoint -------------------------------------------- */

/* Hashed with reads, then mapped: no page of the mapping is resident until
 * a download reads it (hashing through the mapping made the coordinator's
 * peak a second model's size). A checkpoint is replaced by rename, never
 * rewritten in place. */
Served *served_map_file(const char *path, char *err) {
    uint8_t sha[SHA256_LEN];
    int64_t hashed = -1;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        err_set_errno(err, "cannot open checkpoint %s", path);
        return NULL;
    }
    if (security_sha256_fd(fd, path, sha, &hashed, err) != 0) {
        close(fd);
        return NULL;
    }
    off_t len = lseek(fd, 0, SEEK_END);
    void *p = len > 0 && len == hashed ? mmap(NULL, (size_t)len, PROT_READ, MAP_PRIVATE, fd, 0)
                                       : MAP_FAILED;
    close(fd);
    Served *s = p != MAP_FAILED ? calloc(1, sizeof *s) : NULL;
    if (s == NULL) {
        if (p != MAP_FAILED) munmap(p, (size_t)len);
        err_set_errno(err, "cannot map checkpoint %s", path);
        return NULL;
    }
    s->refs = 1, s->data = p, s->len = s->mapped = (size_t)len;
    memcpy(s->sha, sha, SHA256_LEN);
    return s;
}

/* b's bytes in an unlinked file of dir, mapped: page cache the kernel may
 * write back and drop, not the heap; NULL (b untouched) when it cannot. */
static uint8_t *spill(const Blob *b, const char *dir) {
    char path[1200];
    snprintf(path, sizeof path, "%s/.served-XXXXXX", dir);
    int fd = mkostemp(path, O_CLOEXEC);
    if (fd < 0) return NULL;
    unlink(path); /* nothing of it outlives the process */
    size_t at = 0;
    while (at < b->len) {
        ssize_t w = write(fd, b->data + at, b->len - at);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) break;
        at += (size_t)w;
    }
    void *p = at == b->len ? mmap(NULL, b->len, PROT_READ, MAP_SHARED, fd, 0) : MAP_FAILED;
    close(fd);
    return p == MAP_FAILED ? NULL : p;
}

Served *served_from_blob(Blob *b, const char *dir) {
    Served *s = calloc(1, sizeof *s);
    if (s == NULL) return NULL;
    s->refs = 1, s->len = b->len;
    security_sha256(b->data, b->len, s->sha);
    uint8_t *mapped = dir && b->len > 0 ? spill(b, dir) : NULL;
    if (mapped) {
        s->data = mapped, s->mapped = b->len;
        blob_free(b);
    } else { /* on the heap, as it was built */
        s->data = b->data;
    }
    memset(b, 0, sizeof *b);
    return s;
}

void served_unref(Served *s) {
    if (s == NULL) return;
    assert(s->refs > 0); /* not already released to nothing */
    if (--s->refs > 0) return;
    if (s->mapped)
        munmap(s->data, s->mapped);
    else
        free(s->data);
    free(s);
}

int round_publish_model(Coordinator *co, const char *rel, char *err) {
    Rounds *r = &co->rounds;
    char path[1200];
    snprintf(path, sizeof path, "%s/%s", co->dir, rel);
    if (model_save(&r->model, path, (int)r->number, err) != 0) return -1;
    Served *s = served_map_file(path, err);
    if (s == NULL) return -1;
    served_unref(r->ckpt);
    r->ckpt = s;
    return 0;
}

/* The outer optimizer's state beside a checkpoint: "<round file>.outer.safetensors"
 * (momentum for Nesterov, both moments for Adam), written before the round's
 * commit like the checkpoint itself, and pinned in the store by its size
 * and SHA-256 (rel_out, sha, bytes; rel_out "" for FedAvg, which has none). */
static void outer_rel(const char *rel, char *out, size_t len) {
    size_t n = strlen(rel);
    int cut = n > 12 && strcmp(rel + n - 12, ".safetensors") == 0 ? (int)(n - 12) : (int)n;
    snprintf(out, len, "%.*s.outer.safetensors", cut, rel);
}

/* The state of the round resumed from: the pinned file (verified with the
 * checkpoint by store_resume_point), or for rounds committed before states
 * were pinned, the file beside the checkpoint if there is one. The
 * optimizer's moments must be there; the downlink's residual may not be (a
 * federation that used another downlink): it then starts at zero. 1
 * restored, 0 none, -1 error. */
int round_outer_load(Coordinator *co, const StoreRound *last, char *err) {
    Rounds *r = &co->rounds;
    if (r->outer.b == NULL && r->down_ef.e == NULL) return 0;
    char rel[600], path[1700];
    if (last->state_path[0]) {
        snprintf(rel, sizeof rel, "%s", last->state_path);
    } else {
        outer_rel(last->checkpoint_path, rel, sizeof rel);
        snprintf(path, sizeof path, "%s/%s", co->dir, rel);
        if (access(path, F_OK) != 0) return 0;
        log_warn("rounds",
                 "round %lld's outer state %s is not pinned in the store (an older "
                 "schema); loading it unverified",
                 (long long)last->number, rel);
    }
    snprintf(path, sizeof path, "%s/%s", co->dir, rel);
    float *dsts[2] = {r->outer.b, r->outer.v};
    const char *prefixes[2] = {"outer_b.", "outer_v."};
    int n_opt = r->outer.v ? 2 : r->outer.b ? 1 : 0;
    if (n_opt && model_load_state(&r->model, path, dsts, prefixes, n_opt, err) != 0) return -1;
    r->outer.step = (int)r->number;
    if (r->down_ef.e) {
        const char *down[1] = {"down_e."};
        char why[ERR_LEN];
        if (model_load_state(&r->model, path, &r->down_ef.e, down, 1, why) != 0) {
            memset(r->down_ef.e, 0, sizeof(float) * r->down_ef.n);
            log_warn("rounds", "no downlink residual to resume (%s); it starts at zero", why);
        }
    }
    return 1;
}

void round_kept_name(int64_t round, char *out, size_t len) {
    snprintf(out, len, "kept-r%lld.blob", (long long)round);
}

void round_drop_kept(Rounds *r, int64_t round, char (*owners)[32], int n) {
    char name[64];
    round_kept_name(round, name, sizeof name);
    for (int i = 0; i < n; i++) net_spool_drop(r->spool, owners[i], name);
}

/* The robust mean of the kept updates, read through mmap block by block.
 * A kept file is written once, whole, from bytes already verified and
 * gated (net_spool_keep, O_EXCL); no site can write into it. */
static int robust_mean(Coordinator *co, const RoundClosing *c, float *mean, char *err) {
    Rounds *r = &co->rounds;
    size_t k = (size_t)(c->n_kept ? c->n_kept : 1);
    const uint8_t **blobs = malloc(k * sizeof *blobs);
    size_t *lens = malloc(k * sizeof *lens);
    int mapped = 0, rc = -1;
    if (blobs == NULL || lens == NULL) {
        err_set(err, "out of memory for %d kept updates", c->n_kept);
        goto out;
    }
    char name[64];
    round_kept_name(c->number, name, sizeof name);
    for (; mapped < c->n_kept; mapped++) {
        char path[1200];
        snprintf(path, sizeof path, "%s/spool/%s/%s", co->dir, c->kept_owner[mapped], name);
        int fd = open(path, O_RDONLY | O_CLOEXEC);
        off_t len = fd >= 0 ? lseek(fd, 0, SEEK_END) : -1;
        void *p = len > 0 ? mmap(NULL, (size_t)len, PROT_READ, MAP_PRIVATE, fd, 0) : MAP_FAILED;
        if (fd >= 0) close(fd);
        if (p == MAP_FAILED) {
            err_set_errno(err, "cannot map kept update %s", path);
            goto out;
        }
        blobs[mapped] = p, lens[mapped] = (size_t)len;
    }
    rc = robust_aggregate_maps(blobs, lens, c->n_kept, r->model.n_params, r->set.rule, r->set.trim,
                               mean, err);
out:
    for (int i = 0; i < mapped; i++) munmap((void *)blobs[i], lens[i]);
    free(blobs), free(lens);
    return rc;
}

/* The round's mean, in the round's sum (the sum is spent: a model's size
 * of memory the commit does not take again), with no update weighing more
 * than weight_cap × the round's (lower) median claim, nor reaching further
 * than clip × its median norm: a site inside every bound of its own cannot
 * take the mean over. A round with no history of norms under robust_start
 * caps both at 1 ×: no site counts for more than the median one. When no
 * update is beyond either, the sum streamed as the updates came is the
 * mean (the same bits); else the updates are added again from their maps,
 * over the sum, with their weights capped and their norms clipped. */
static int weighed_mean_of(Coordinator *co, RoundClosing *c, double *claimed, double *norms,
                           double *weight, double *scale, char *err);
static int weighed_mean(Coordinator *co, RoundClosing *c, char *err) {
    int n = c->n_reported;
    double *claimed = malloc(4 * (size_t)(n ? n : 1) * sizeof *claimed);
    if (claimed == NULL) return err_set(err, "out of memory weighing %d updates", n);
    double *norms = claimed + n, *weight = norms + n, *scale = weight + n;
    int rc = weighed_mean_of(co, c, claimed, norms, weight, scale, err);
    free(claimed);
    return rc;
}

/* weighed_mean with its scratch: four arrays of n_reported doubles. */
static int weighed_mean_of(Coordinator *co, RoundClosing *c, double *claimed, double *norms,
                           double *weight, double *scale, char *err) {
    Rounds *r = &co->rounds;
    int n = c->n_reported;
    for (int i = 0; i < n; i++) claimed[i] = c->upd[i].weight, norms[i] = c->upd[i].norm;
    int tight = c->no_history && r->set.robust_start;
    double weight_cap = tight ? 1 : r->set.weight_cap, clip = tight ? 1 : r->set.clip;
    double wcap = weight_cap > 0 ? weight_cap * round_median(claimed, n, 1) : INFINITY;
    double ncap = clip > 0 ? clip * round_median(norms, n, 1) : INFINITY;
    int changed = 0;
    for (int i = 0; i < n; i++) {
        weight[i] = claimed[i] > wcap ? wcap : claimed[i];
        scale[i] = norms[i] > ncap && norms[i] > 0 ? ncap / norms[i] : 1.0;
        if (weight[i] == claimed[i] && scale[i] == 1.0) continue;
        changed = 1;
        log_warn("rounds",
                 "round %lld: the update of %s counts %.0f of its %.0f tokens and %.3g of its norm "
                 "%.4g (caps: %g x the round's median claim, %g x its median norm)",
                 (long long)c->number, c->site[i], weight[i], claimed[i], scale[i], norms[i],
                 weight_cap, clip);
    }
    RoundSum *rs = &c->sum;
    if (!changed) return round_sum_mean(rs, rs->sum, err);
    round_sum_restart(rs);
    double total = 0;
    char why[ERR_LEN];
    for (int i = 0; i < n; i++) {
        if (c->upd[i].data == NULL ||
            round_sum_add(rs, c->upd[i].data, c->upd[i].len, weight[i] * scale[i], why) != 0)
            return err_set(err, "cannot add the update of %s again: %s", c->site[i],
                           c->upd[i].data ? why : "its bytes were not kept");
        /* its pages go again, as when it was first added */
        if (c->upd[i].mapped) madvise(c->upd[i].data, c->upd[i].mapped, MADV_DONTNEED);
        total += weight[i];
    }
    rs->weight = total; /* clipped updates weigh their weight: the clip shortens them */
    return round_sum_mean(rs, rs->sum, err);
}

/* The mean under differential privacy (docs/privacy.md): every update
 * clipped to [privacy] clip and weighed alike, whatever tokens it claims
 * or however stale it is, so that no site moves the sum by more than clip;
 * then Gaussian noise of noise_multiplier × clip over the n updates (n is
 * not hidden: who sent an update is the round's record). */
static int dp_mean(Coordinator *co, RoundClosing *c, char *err) {
    const RoundsSettings *set = &co->rounds.set;
    RoundSum *rs = &c->sum;
    int n = c->n_reported, clipped = 0;
    double *norms = malloc(sizeof(double) * (size_t)(n ? n : 1));
    if (norms == NULL) return err_set(err, "out of memory weighing %d updates", n);
    for (int i = 0; i < n; i++) norms[i] = c->upd[i].norm;
    double median = round_median(norms, n, 0);
    free(norms);
    for (int i = 0; i < n; i++) clipped += c->upd[i].norm > set->dp_clip;
    /* the sum streamed with every weight 1 (round_calls.c) is the clipped
     * sum when none was longer; else the updates are added again */
    if (clipped) round_sum_restart(rs);
    char why[ERR_LEN];
    for (int i = 0; i < n && clipped; i++) {
        double norm = c->upd[i].norm, scale = norm > set->dp_clip ? set->dp_clip / norm : 1.0;
        if (c->upd[i].data == NULL ||
            round_sum_add(rs, c->upd[i].data, c->upd[i].len, scale, why) != 0)
            return err_set(err, "cannot add the update of %s clipped: %s", c->site[i],
                           c->upd[i].data ? why : "its bytes were not kept");
        if (c->upd[i].mapped) madvise(c->upd[i].data, c->upd[i].mapped, MADV_DONTNEED);
    }
    rs->weight = n; /* each counts one; a clipped one is only shorter */
    if (round_sum_mean(rs, rs->sum, err) != 0) return -1;
    double std = set->dp_noise * set->dp_clip / n;
    if (privacy_gaussian_add(rs->sum, rs->n, std, err) != 0) return -1;
    /* (the median norm is for the operator choosing clip: the coordinator,
     * which central DP trusts, sees every update anyway) */
    log_info("rounds",
             "round %lld: %d updates (median norm %.4g) clipped to %g (%d were longer), the mean "
             "given noise of deviation %.3g",
             (long long)c->number, n, median, set->dp_clip, clipped, std);
    return 0;
}

/* The coordinate-wise median of a mean round's updates, from the maps the
 * round kept, into mean. */
static int median_of_maps(Coordinator *co, const RoundClosing *c, float *mean, char *err) {
    int n = c->n_reported;
    const uint8_t **blobs = malloc((size_t)n * sizeof *blobs);
    size_t *lens = malloc((size_t)n * sizeof *lens);
    int rc = -1;
    if (blobs == NULL || lens == NULL) {
        err_set(err, "out of memory for the median of %d updates", n);
        goto out;
    }
    int maps = 1; /* an empty upload is on the heap */
    for (int i = 0; i < n; i++) {
        if (c->upd[i].data == NULL) {
            err_set(err, "cannot take the median: the bytes of %s's update were not kept",
                    c->site[i]);
            goto out;
        }
        blobs[i] = c->upd[i].data, lens[i] = c->upd[i].len;
        maps &= c->upd[i].mapped == c->upd[i].len;
    }
    uint64_t n_params = co->rounds.model.n_params;
    rc = maps ? robust_aggregate_maps(blobs, lens, n, n_params, AGG_MEDIAN, 0, mean, err)
              : robust_aggregate(blobs, lens, n, n_params, AGG_MEDIAN, 0, mean, err);
out:
    free(blobs), free(lens);
    return rc;
}

/* What the round's updates make, into the round's sum: the robust rule
 * over the kept files, or the mean. Until a round with a quorum has
 * committed, only max_update_ratio × ‖θ₀‖ bounded the updates, and that
 * is far more than an honest site sends (docs/security.md, "A malicious
 * site"): under robust_start such a round takes the coordinate-wise
 * median of three updates or more (a minority stays inside the others'
 * range), and the mean below three with every weight and norm capped at
 * the median one's (weighed_mean), so no site moves θ further than an
 * honest one does. */
static int round_aggregate(Coordinator *co, RoundClosing *c, char *err) {
    Rounds *r = &co->rounds;
    if (r->set.dp && !r->set.dp_distributed) return dp_mean(co, c, err);
    if (r->set.secagg) return 0; /* unmasked: the sum holds the mean (secagg_round.c) */
    if (r->set.keeps_updates) return robust_mean(co, c, c->sum.sum, err);
    if (!(c->no_history && r->set.robust_start && c->n_reported >= 3))
        return weighed_mean(co, c, err);
    log_info("rounds",
             "round %lld: no round has bounded norms yet; the coordinate-wise median of its %d "
             "updates (robust_start)",
             (long long)c->number, c->n_reported);
    return median_of_maps(co, c, c->sum.sum, err);
}

double round_l2_norm(const float *x, size_t n) {
    double s = 0;
    for (size_t i = 0; i < n; i++) s += (double)x[i] * x[i];
    return sqrt(s);
}

/* ---- the next round's model ----------------------------------------------------- */

void round_next_free(RoundNext *nx) {
    free(nx->theta);
    served_unref(nx->ckpt); /* not installed: no one else holds them */
    served_unref(nx->delta_served);
    blob_free(&nx->delta);
    memset(nx, 0, sizeof *nx);
}

int round_state_restore(Coordinator *co, char *err) {
    Rounds *r = &co->rounds;
    StoreRound last;
    char why[ERR_LEN];
    pthread_mutex_lock(&co->store_lock);
    int rc = store_round_last_committed(co->store, &last, why);
    pthread_mutex_unlock(&co->store_lock);
    if (rc == STORE_NOT_FOUND) { /* round 0's: zeros */
        size_t bytes = sizeof(float) * r->model.n_params;
        if (r->outer.b) memset(r->outer.b, 0, bytes);
        if (r->outer.v) memset(r->outer.v, 0, bytes);
        if (r->down_ef.e) memset(r->down_ef.e, 0, bytes);
        r->outer.step = 0;
        return 0;
    }
    rc = rc == 0 ? round_outer_load(co, &last, why) : -1; /* 1 restored, 0 no file */
    if (rc == 1 || (rc == 0 && r->outer.b == NULL && r->down_ef.e == NULL)) return 0;
    if (rc == 0) snprintf(why, sizeof why, "round %lld has none", (long long)last.number);
    return err_set(err,
                   "a commit that failed had stepped the outer optimizer, and its state cannot be "
                   "read back from the last committed round's state file (%s); free the disk or "
                   "mend the file, or restart the coordinator",
                   why);
}

/* Aggregate, outer step, downlink, checkpoint and state files, store
 * commit — all or nothing: on any failure the files are removed and θ,
 * the round and the served models are what they were. The optimizer's
 * state and the downlink's residual are stepped in place (copies would be
 * two more model-sized arrays beside the five a commit holds: θ, the
 * next θ, the round's sum as its mean, the momentum and the residual); a
 * failed commit reads them back from the last committed round's state
 * file, and until that succeeds (nx->state_lost) no round opens. */
int round_next_build(Coordinator *co, RoundClosing *c, RoundNext *nx, char *err) {
    Rounds *r = &co->rounds;
    size_t n = r->model.n_params;
    memset(nx, 0, sizeof *nx);
    assert(c->sum.sum != NULL && c->sum.n == n);
    int stepped = 0;
    nx->theta = malloc(sizeof(float) * n);
    char rel[128], path[1300], sha[65], state_rel[160] = "", state_path[1400] = "", state_sha[65];
    int64_t state_bytes = 0;
    int rc = -1;
    snprintf(rel, sizeof rel, "%s/round-%06lld.safetensors", STORE_CHECKPOINT_DIR,
             (long long)c->number);
    snprintf(path, sizeof path, "%s/%s", co->dir, rel);
    if (nx->theta == NULL) {
        err_set(err, "out of memory for the outer step");
        goto out;
    }
    if (round_aggregate(co, c, err) != 0) goto out;
    /* the sum becomes the mean, spent with the round (a mean weighed again
     * was summed again: into the other buffer) */
    float *mean = c->sum.sum;
    float *theta = nx->theta;
    memcpy(theta, r->model.params, sizeof(float) * n);
    outer_step(&r->outer, theta, mean);
    stepped = 1;
    if (r->down_ef.e) {
        /* the downlink: the outer update θ' − θ_r, compressed with the
         * error feedback kept here; θ_{r+1} = θ_r + decoded, the very floats
         * every site adds to its copy, so every copy stays identical */
        float *u = mean; /* the mean is spent: the decoded update goes there */
        CodecLayout L = {r->model.table_hash, n, NULL, 0};
        if (ef_encode(&r->down_ef, &r->set.downlink, &L, theta, r->model.params, u, &nx->delta,
                      err) != 0)
            goto out;
        for (size_t i = 0; i < n; i++) theta[i] = r->model.params[i] + u[i];
    }
    for (size_t i = 0; i < n; i++)
        if (!isfinite(theta[i])) {
            err_set(err, "the outer step made parameter %zu non-finite", i);
            goto out;
        }
    Model view = r->model;
    view.params = theta;
    /* the optimizer's state and the downlink's residual beside the checkpoint */
    const float *bases[3];
    const char *prefixes[3];
    int n_bases = 0;
    if (r->outer.b) bases[n_bases] = r->outer.b, prefixes[n_bases++] = "outer_b.";
    if (r->outer.v) bases[n_bases] = r->outer.v, prefixes[n_bases++] = "outer_v.";
    if (r->down_ef.e) bases[n_bases] = r->down_ef.e, prefixes[n_bases++] = "down_e.";
    if (n_bases > 0) {
        outer_rel(rel, state_rel, sizeof state_rel);
        snprintf(state_path, sizeof state_path, "%s/%s", co->dir, state_rel);
    }
    /* Four pieces of work that share only their inputs, side by side on the
     * cores (each written and fsynced file, or hash, is a model's size): */
    char ck_err[ERR_LEN] = "", state_err[ERR_LEN] = "";
    int ck_failed = 0, state_failed = 0;
#pragma omp parallel sections
    {
#pragma omp section
        /* the checkpoint: the model the next round starts from */
        ck_failed = model_save(&view, path, (int)c->number + 1, ck_err) != 0 ||
                    (nx->ckpt = served_map_file(path, ck_err)) == NULL;
#pragma omp section
        state_failed = n_bases > 0 &&
                       (model_save_state(&view, state_path, bases, prefixes, n_bases, r->outer.step,
                                         state_err) != 0 ||
                        security_sha256_file(state_path, state_sha, &state_bytes, state_err) != 0);
#pragma omp section
        { /* for the lossless downlink, the exact delta θ_r → θ_{r+1} for sites
           * that hold θ_r, hashed (best effort: without it they take the
           * checkpoint) */
            char derr[ERR_LEN];
            if (r->down_ef.e == NULL &&
                ckpt_encode(theta, n * 4, 4, r->model.params, 1, &nx->delta, derr) != 0)
                blob_free(&nx->delta);
            char dir[1100];
            snprintf(dir, sizeof dir, "%s/%s", co->dir, STORE_CHECKPOINT_DIR);
            if (nx->delta.data) nx->delta_served = served_from_blob(&nx->delta, dir);
        }
#pragma omp section
        { /* what updates name as their base, and the norm that bounds theirs */
            security_sha256(theta, n * 4, nx->theta_sha);
            nx->theta_norm = round_l2_norm(theta, n);
        }
    }
    if (ck_failed || state_failed) {
        err_set(err, "%s", ck_failed ? ck_err : state_err);
        goto out;
    }
    security_hex(nx->ckpt->sha, 32, sha);
    StoreCheckpoint ck = {rel,
                          (int64_t)nx->ckpt->len,
                          sha,
                          state_rel[0] ? state_rel : NULL,
                          state_bytes,
                          state_sha,
                          0,
                          0,
                          0,
                          0,
                          0};
    if (r->set.dp) { /* the account with this round in it */
        nx->dp_account = r->dp_account;
        if (r->set.dp_distributed) { /* accounted when its sum was unmasked (secagg_round.c) */
            ck.dp_noise = sqrt(c->dp_mu) / c->dp_l2, ck.dp_mu = c->dp_mu, ck.dp_l1 = c->dp_l1;
        } else {
            privacy_add_gaussian(&nx->dp_account, r->set.dp_noise);
            ck.dp_noise = r->set.dp_noise;
        }
        ck.dp_delta = r->set.dp_delta;
        ck.dp_epsilon = privacy_account_epsilon(&nx->dp_account, r->set.dp_delta, NULL);
    }
    /* the bytes served so far: those served from here to the install count
     * toward the next round */
    pthread_mutex_lock(&r->lock);
    nx->bytes_down = r->bytes_down;
    pthread_mutex_unlock(&r->lock);
    pthread_mutex_lock(&co->store_lock);
    int stored = store_round_commit(co->store, c->round_id, &ck, c->eval, nx->bytes_down,
                                    time_wall_ms(), err);
    pthread_mutex_unlock(&co->store_lock);
    if (stored == 0) rc = 0;
out:
    if (rc != 0) { /* nothing of a failed commit stays */
        unlink(path);
        if (state_path[0]) unlink(state_path);
        round_next_free(nx);
        char why[ERR_LEN];
        if (stepped && round_state_restore(co, why) != 0) {
            log_error("rounds", "%s", why);
            nx->state_lost = 1;
        }
    }
    return rc;
}

static void chain_drop_oldest(Rounds *r) {
    served_unref(r->chain[0].sv);
    memmove(r->chain, r->chain + 1, sizeof r->chain[0] * --r->n_chain);
}

/* The delta being replaced joins the chain, which keeps only links that
 * lead to the current model without a gap and, with the new delta, add up
 * to at most the new checkpoint's bytes (oldest dropped first). */
static void chain_push(Rounds *r, Served *next_delta, const Served *next_ckpt) {
    if (r->delta == NULL || next_delta == NULL) { /* a gap: nothing before it leads here */
        for (int i = 0; i < r->n_chain; i++) served_unref(r->chain[i].sv);
        r->n_chain = 0;
        served_unref(r->delta);
        return;
    }
    if (r->n_chain == DELTA_CHAIN) chain_drop_oldest(r);
    DeltaLink *l = &r->chain[r->n_chain++];
    l->sv = r->delta, l->from = r->delta_from;
    memcpy(l->base_sha, r->delta_base_sha, 32);
    size_t total = next_delta->len;
    for (int i = 0; i < r->n_chain; i++) total += r->chain[i].sv->len;
    while (r->n_chain > 0 && (next_ckpt == NULL || total > next_ckpt->len)) {
        total -= r->chain[0].sv->len;
        chain_drop_oldest(r);
    }
}

void round_delta_restore(Coordinator *co, const float *base, const uint8_t base_sha[32],
                         int64_t from) {
    Rounds *r = &co->rounds;
    if (r->delta != NULL || r->ckpt == NULL) return;
    Blob b = {0};
    char err[ERR_LEN], dir[1100];
    if (ckpt_encode(r->model.params, r->model.n_params * 4, 4, base, 1, &b, err) != 0) {
        blob_free(&b);
        log_warn("rounds", "no delta from round %lld's model (%s): sites take the checkpoint",
                 (long long)from, err);
        return;
    }
    if (b.len >= r->ckpt->len) { /* no smaller than the model itself */
        blob_free(&b);
        return;
    }
    snprintf(dir, sizeof dir, "%s/%s", co->dir, STORE_CHECKPOINT_DIR);
    if ((r->delta = served_from_blob(&b, dir)) == NULL) {
        blob_free(&b);
        return;
    }
    r->delta_from = from;
    memcpy(r->delta_base_sha, base_sha, 32);
    log_info("rounds", "the delta from round %lld's model is rebuilt: %zu bytes, the model %zu",
             (long long)from, r->delta->len, r->ckpt->len);
}

void round_next_install(Coordinator *co, RoundNext *nx) {
    Rounds *r = &co->rounds;
    chain_push(r, nx->delta_served, nx->ckpt); /* takes r->delta's ref */
    memcpy(r->delta_base_sha, r->theta_sha, 32);
    float *old = r->model.params; /* a swap, not a copy of the model under the lock */
    r->model.params = nx->theta;
    nx->theta = old; /* freed with nx */
    memcpy(r->theta_sha, nx->theta_sha, 32);
    if (r->set.dp) r->dp_account = nx->dp_account;
    rounds_history_add(r, r->number + 1, r->theta_sha); /* the round it opens */
    served_unref(r->ckpt);                              /* downloads in flight keep theirs */
    r->ckpt = nx->ckpt;
    nx->ckpt = NULL;
    r->delta = nx->delta_served;
    nx->delta_served = NULL;
    r->delta_from = r->delta ? r->number : -1;
    r->theta_norm = nx->theta_norm;
    r->bytes_down -= nx->bytes_down;
}
