/*
 * rounds.c — the coordinator's round loop (DESIGN.md §1): serve the current
 * model (GetModel), take the sites' compressed pseudo-gradients (PushUpdate)
 * into one streaming weighted sum, and when every active site has reported
 * — or min_sites have and the deadline has passed — take the outer step,
 * write the checkpoint, commit the round in the store, and open the next.
 * WaitRound long-polls for that.
 *
 * A round without quorum at its deadline is extended up to max_extensions
 * times, then failed (with its reason in the store) and reopened as the next
 * attempt. A coordinator that restarts resumes from the last committed
 * round's checkpoint (verified by the store) and the outer optimizer's state
 * saved beside it.
 *
 * A site is authenticated, never trusted (DESIGN.md §6): its uploads live
 * in its own spool folder, its weight (tokens) is bounded by what a round
 * lets it train, its update must be in the federation's codec and pass the
 * gates from the first one on, and it is recorded in the store before it
 * touches the sum. A commit is all or nothing: the outer step is computed
 * into new buffers and published only once the store has committed.
 * WaitRound parks its call instead of holding a worker.
 *
 * Threading: handlers run on net/'s workers; everything in Rounds is under
 * rounds.lock, the store under store_lock (taken after rounds.lock).
 * Parked calls are answered outside rounds.lock.
 */
#include <assert.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include "coordinator_internal.h"
#include "schema/strait.pb-c.h"
#include "security/security.h"
#include "util/util.h"

#define WAIT_POLL_MS 20000

/* ---- the current model's checkpoint -------------------------------------------- */

/* Writes θ as checkpoint `rel` (under the home), reads it back to serve. */
static int publish_model(Coordinator *co, const char *rel, char sha_hex[65], int64_t *bytes,
                         char *err) {
    Rounds *r = &co->rounds;
    char path[1200];
    snprintf(path, sizeof path, "%s/%s", co->dir, rel);
    if (gpt_save(&r->model, path, (int)r->number, err) != 0) return -1;
    uint8_t *data;
    size_t len;
    if (file_read_all(path, (size_t)1 << 34, (char **)&data, &len, err) != 0) return -1;
    free(r->ckpt);
    r->ckpt = data;
    r->ckpt_len = len;
    security_sha256(data, len, r->ckpt_sha);
    if (sha_hex) security_hex(r->ckpt_sha, 32, sha_hex);
    if (bytes) *bytes = (int64_t)len;
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
static int outer_load(Coordinator *co, const StoreRound *last, char *err) {
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
    if (n_opt && gpt_load_state(&r->model, path, dsts, prefixes, n_opt, err) != 0) return -1;
    r->outer.step = (int)r->number;
    if (r->down_ef.e) {
        const char *down[1] = {"down_e."};
        char why[ERR_LEN];
        if (gpt_load_state(&r->model, path, &r->down_ef.e, down, 1, why) != 0) {
            memset(r->down_ef.e, 0, sizeof(float) * r->down_ef.n);
            log_warn("rounds", "no downlink residual to resume (%s); it starts at zero", why);
        }
    }
    return 1;
}

static void kept_name(int64_t round, char *out, size_t len) {
    snprintf(out, len, "kept-r%lld.blob", (long long)round);
}

static void drop_kept(Coordinator *co) {
    Rounds *r = &co->rounds;
    char name[64];
    kept_name(r->number, name, sizeof name);
    for (int i = 0; i < r->n_kept; i++) net_spool_drop(r->spool, r->kept_owner[i], name);
    r->n_kept = 0;
}

/* The robust mean of the kept updates, read through mmap block by block.
 * A kept file is written once, whole, from bytes already verified and
 * gated (net_spool_keep, O_EXCL); no site can write into it. */
static int robust_mean(Coordinator *co, float *mean, char *err) {
    Rounds *r = &co->rounds;
    const uint8_t *blobs[MAX_REPORTS];
    size_t lens[MAX_REPORTS];
    int mapped = 0, rc = -1;
    char name[64];
    kept_name(r->number, name, sizeof name);
    for (; mapped < r->n_kept; mapped++) {
        char path[1200];
        snprintf(path, sizeof path, "%s/spool/%s/%s", co->dir, r->kept_owner[mapped], name);
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
    rc = robust_aggregate(blobs, lens, r->n_kept, r->model.n_params, r->set.rule, r->set.trim, mean,
                          err);
out:
    for (int i = 0; i < mapped; i++) munmap((void *)blobs[i], lens[i]);
    return rc;
}

static double l2_norm(const float *x, size_t n) {
    double s = 0;
    for (size_t i = 0; i < n; i++) s += (double)x[i] * x[i];
    return sqrt(s);
}

static int open_round(Coordinator *co, char *err) {
    Rounds *r = &co->rounds;
    pthread_mutex_lock(&co->store_lock);
    int rc = store_round_open(co->store, r->number, time_wall_ms(), &r->round_id, err);
    pthread_mutex_unlock(&co->store_lock);
    if (rc != 0) return -1;
    r->opened_ms = time_wall_ms();
    r->extensions = 0;
    drop_kept(co);
    r->n_reported = 0;
    r->eval_sum = r->eval_weight = 0;
    r->bytes_down = 0;
    round_sum_free(&r->sum);
    if (round_sum_init(&r->sum, r->model.n_params, r->model.table_hash, 10.0, err) != 0) return -1;
    r->sum.max_norm = r->set.max_update_ratio * r->theta_norm;
    log_info("rounds", "round %lld open", (long long)r->number);
    return 0;
}

/* Fails the open round with its reason and opens the next attempt of the
 * same round (the sites send their updates again). */
static void fail_round(Coordinator *co, const char *reason) {
    Rounds *r = &co->rounds;
    char err[ERR_LEN];
    pthread_mutex_lock(&co->store_lock);
    if (store_round_fail(co->store, r->round_id, reason, r->bytes_down, time_wall_ms(), err) != 0)
        log_error("rounds", "cannot record round %lld as failed: %s", (long long)r->number, err);
    pthread_mutex_unlock(&co->store_lock);
    log_warn("rounds", "round %lld failed (%s); reopening", (long long)r->number, reason);
    if (open_round(co, err) != 0) log_error("rounds", "cannot reopen: %s", err);
    pthread_cond_broadcast(&r->changed);
}

/* Aggregate, outer step, checkpoint, commit, next round — all or nothing.
 * θ_{r+1} and the optimizer's next state are computed into new buffers and
 * written as files; only when the store has committed are they published
 * (the model served, the round number advanced). On any failure the files
 * are removed, the round fails with its reason and its next attempt opens:
 * θ, the state and the round number stay what they were. Under r->lock. */
static int commit_round(Coordinator *co, char *err) {
    Rounds *r = &co->rounds;
    size_t n = r->model.n_params;
    float *mean = malloc(sizeof(float) * n), *theta = malloc(sizeof(float) * n);
    OuterOpt next = {0};
    ErrorFeedback next_ef = r->down_ef;
    next_ef.e = NULL;
    uint8_t *ckpt = NULL;
    size_t ckpt_len = 0;
    Blob d = {0};
    char rel[128], path[1300], sha[65], state_rel[160] = "", state_path[1400] = "", state_sha[65];
    int64_t state_bytes = 0;
    int rc = -1;
    uint8_t ckpt_sha[32];
    snprintf(rel, sizeof rel, "%s/round-%06lld.safetensors", STORE_CHECKPOINT_DIR,
             (long long)r->number);
    snprintf(path, sizeof path, "%s/%s", co->dir, rel);
    if (mean == NULL || theta == NULL) {
        err_set(err, "out of memory for the outer step");
        goto out;
    }
    if ((r->set.keeps_updates ? robust_mean(co, mean, err) : round_sum_mean(&r->sum, mean, err)) !=
            0 ||
        outer_clone(&r->outer, &next, err) != 0)
        goto out;
    memcpy(theta, r->model.params, sizeof(float) * n);
    outer_step(&next, theta, mean);
    if (r->down_ef.e) {
        /* the downlink: the outer update θ' − θ_r, compressed with the
         * error feedback kept here; θ_{r+1} = θ_r + decoded, the very floats
         * every site adds to its copy, so every copy stays identical */
        float *u = mean; /* the mean is spent */
        for (size_t i = 0; i < n; i++) u[i] = theta[i] - r->model.params[i];
        CodecLayout L = {r->model.table_hash, n, NULL, 0};
        next_ef.e = malloc(sizeof(float) * n);
        if (next_ef.e == NULL) {
            err_set(err, "out of memory for the downlink's error feedback");
            goto out;
        }
        memcpy(next_ef.e, r->down_ef.e, sizeof(float) * n);
        if (ef_encode(&next_ef, &r->set.downlink, &L, u, &d, err) != 0 ||
            codec_decode(d.data, d.len, u, n, err) != 0)
            goto out;
        for (size_t i = 0; i < n; i++) theta[i] = r->model.params[i] + u[i];
    }
    for (size_t i = 0; i < n; i++)
        if (!isfinite(theta[i])) {
            err_set(err, "the outer step made parameter %zu non-finite", i);
            goto out;
        }
    /* the checkpoint holds the model the next round starts from */
    GPT view = r->model;
    view.params = theta;
    if (gpt_save(&view, path, (int)r->number + 1, err) != 0 ||
        file_read_all(path, (size_t)1 << 34, (char **)&ckpt, &ckpt_len, err) != 0)
        goto out;
    security_sha256(ckpt, ckpt_len, ckpt_sha);
    security_hex(ckpt_sha, 32, sha);
    /* the optimizer's state and the downlink's residual beside it */
    const float *bases[3];
    const char *prefixes[3];
    int n_bases = 0;
    if (next.b) bases[n_bases] = next.b, prefixes[n_bases++] = "outer_b.";
    if (next.v) bases[n_bases] = next.v, prefixes[n_bases++] = "outer_v.";
    if (next_ef.e) bases[n_bases] = next_ef.e, prefixes[n_bases++] = "down_e.";
    if (n_bases > 0) {
        outer_rel(rel, state_rel, sizeof state_rel);
        snprintf(state_path, sizeof state_path, "%s/%s", co->dir, state_rel);
        if (gpt_save_state(&view, state_path, bases, prefixes, n_bases, next.step, err) != 0 ||
            security_sha256_file(state_path, state_sha, &state_bytes, err) != 0)
            goto out;
    }
    /* for the lossless downlink, the exact delta θ_r → θ_{r+1} for sites
     * that hold θ_r (best effort: without it they take the checkpoint) */
    char derr[ERR_LEN];
    if (r->down_ef.e == NULL && ckpt_encode(theta, n * 4, 4, r->model.params, 1, &d, derr) != 0)
        blob_free(&d);
    StoreCheckpoint ck = {rel,         (int64_t)ckpt_len, sha, state_rel[0] ? state_rel : NULL,
                          state_bytes, state_sha};
    double eval = r->eval_weight > 0 ? r->eval_sum / r->eval_weight : NAN;
    pthread_mutex_lock(&co->store_lock);
    int stored =
        store_round_commit(co->store, r->round_id, &ck, eval, r->bytes_down, time_wall_ms(), err);
    pthread_mutex_unlock(&co->store_lock);
    if (stored != 0) goto out;
    /* committed: publish, nothing below can fail */
    memcpy(r->delta_base_sha, r->theta_sha, 32);
    memcpy(r->model.params, theta, sizeof(float) * n);
    security_sha256(r->model.params, n * 4, r->theta_sha);
    outer_free(&r->outer);
    r->outer = next;
    memset(&next, 0, sizeof next);
    if (next_ef.e) {
        free(r->down_ef.e);
        r->down_ef.e = next_ef.e;
        next_ef.e = NULL;
    }
    free(r->ckpt);
    r->ckpt = ckpt, r->ckpt_len = ckpt_len;
    memcpy(r->ckpt_sha, ckpt_sha, 32);
    ckpt = NULL;
    free(r->delta);
    r->delta = d.data, r->delta_len = d.len, r->delta_from = d.data ? r->number : -1;
    if (d.data) security_sha256(d.data, d.len, r->delta_sha);
    d.data = NULL;
    r->theta_norm = l2_norm(r->model.params, n);
    log_info("rounds", "round %lld committed: %d sites, eval loss %.4f", (long long)r->number,
             r->n_reported, eval);
    drop_kept(co);
    r->number++;
    if (r->number >= r->set.total) {
        r->finished = 1;
        log_info("rounds", "federation finished after %lld rounds", (long long)r->set.total);
    } else if (open_round(co, err) != 0) {
        log_error("rounds", "cannot open round %lld: %s", (long long)r->number, err);
    }
    pthread_cond_broadcast(&r->changed);
    rc = 0;
out:
    if (rc != 0) { /* nothing of a failed commit stays: the round fails, θ is unchanged */
        unlink(path);
        if (state_path[0]) unlink(state_path);
        char reason[ERR_LEN + 32];
        snprintf(reason, sizeof reason, "commit failed: %s", err);
        fail_round(co, reason);
    }
    free(mean), free(theta), free(ckpt), free(next_ef.e);
    outer_free(&next);
    blob_free(&d);
    return rc;
}

static int64_t active_sites(Coordinator *co) {
    StoreSite *sites;
    size_t n = 0;
    int64_t active = 0;
    pthread_mutex_lock(&co->store_lock);
    if (store_site_list(co->store, &sites, &n, NULL) == 0) {
        for (size_t i = 0; i < n; i++) active += strcmp(sites[i].state, "active") == 0;
        free(sites);
    }
    pthread_mutex_unlock(&co->store_lock);
    return active;
}

/* Answers the parked WaitRounds whose round has moved, whose poll has
 * expired, or (all) every one; outside r->lock. */
static void answer_waiters(Coordinator *co, int all) {
    Rounds *r = &co->rounds;
    pthread_mutex_lock(&r->lock);
    if (r->n_waiters == 0) { /* the ticker's usual case: nothing to allocate */
        pthread_mutex_unlock(&r->lock);
        return;
    }
    int64_t now = time_wall_ms();
    int n = 0;
    Waiter *ready = malloc(sizeof *ready * (size_t)r->n_waiters);
    uint8_t(*resp)[64] = malloc(64 * (size_t)r->n_waiters);
    size_t *lens = malloc(sizeof *lens * (size_t)r->n_waiters);
    for (int i = 0; ready && resp && lens && i < r->n_waiters;) {
        Waiter *w = &r->waiters[i];
        /* a cancelled call (its client gone, its site revoked) leaves at once:
         * parked calls count against their certificate's limit */
        if (!(all || r->finished || r->stop || r->number > w->after_round || now >= w->expires_ms ||
              net_call_cancelled(w->call, 0))) {
            i++;
            continue;
        }
        Strait__WaitRoundResponse wr = STRAIT__WAIT_ROUND_RESPONSE__INIT;
        wr.current_round = (uint64_t)r->number;
        wr.finished = r->finished;
        for (int k = 0; k < r->n_reported; k++) wr.reported |= strcmp(r->reported[k], w->site) == 0;
        lens[n] = strait__wait_round_response__pack(&wr, resp[n]);
        ready[n++] = *w;
        r->waiters[i] = r->waiters[--r->n_waiters];
    }
    pthread_mutex_unlock(&r->lock);
    for (int i = 0; i < n; i++) net_parked_answer(ready[i].call, resp[i], lens[i], NET_OK, NULL);
    free(ready), free(resp), free(lens);
}

void rounds_release_waiters(Coordinator *co) {
    Rounds *r = &co->rounds;
    pthread_mutex_lock(&r->lock);
    r->stop = 1; /* no new parking; the ticker ends too */
    pthread_cond_broadcast(&r->changed);
    pthread_mutex_unlock(&r->lock);
    if (r->ticker) pthread_join(r->ticker, NULL); /* it uses the server: done before it stops */
    r->ticker = 0;
    answer_waiters(co, 1);
}

/* Calls in flight of certificates revoked since (by the Admin API or by
 * `strait site revoke` on the store) are cancelled within a second. */
static void cancel_revoked(Coordinator *co) {
    pthread_mutex_lock(&co->rounds.lock);
    NetServer *srv = co->server;
    pthread_mutex_unlock(&co->rounds.lock);
    if (srv == NULL) return;
    char(*peers)[65];
    int n = net_server_live_peers(srv, &peers);
    for (int i = 0; i < n; i++) {
        StoreSite site;
        StoreCert cert;
        pthread_mutex_lock(&co->store_lock);
        int rc = store_cert_find(co->store, peers[i], &site, &cert, NULL);
        pthread_mutex_unlock(&co->store_lock);
        if (rc == 0 && (strcmp(site.state, "active") != 0 || cert.revoked_at != 0)) {
            int k = net_server_cancel_peer(srv, peers[i], "this site has been revoked");
            log_warn("rounds", "site %s is revoked: %d call%s in flight cancelled", site.name, k,
                     k == 1 ? "" : "s");
        }
    }
    free(peers); /* NULL when n is -1 */
}

/* The deadline: every 200 ms, close, extend or fail the open round; answer
 * the WaitRounds that can be; once a second, end a revoked site's calls. */
static void *ticker_main(void *arg) {
    Coordinator *co = arg;
    Rounds *r = &co->rounds;
    for (;;) {
        usleep(200000);
        pthread_mutex_lock(&r->lock);
        if (r->stop) {
            pthread_mutex_unlock(&r->lock);
            return NULL;
        }
        int64_t now = time_wall_ms();
        if (!r->finished && now >= r->opened_ms + r->set.deadline_ms * (r->extensions + 1)) {
            char err[ERR_LEN];
            if (r->n_reported >= r->set.min_sites && r->sum.accepted > 0) {
                if (commit_round(co, err) != 0) log_error("rounds", "commit failed: %s", err);
            } else if (r->extensions < r->set.max_extensions) {
                r->extensions++;
                log_warn("rounds",
                         "round %lld: %d of %lld sites by the deadline; extended (%d/%lld)",
                         (long long)r->number, r->n_reported, (long long)r->set.min_sites,
                         r->extensions, (long long)r->set.max_extensions);
            } else {
                char reason[160];
                snprintf(reason, sizeof reason, "no quorum: %d of %lld sites after %d extensions",
                         r->n_reported, (long long)r->set.min_sites, r->extensions);
                fail_round(co, reason);
            }
        }
        int check = now >= r->revocation_check_ms;
        if (check) r->revocation_check_ms = now + 1000;
        pthread_mutex_unlock(&r->lock);
        answer_waiters(co, 0);
        if (check) cancel_revoked(co);
    }
}

/* ---- handlers ------------------------------------------------------------------ */

static void h_get_model(NetCall *c, void *user) {
    Coordinator *co = user;
    StoreSite site;
    if (coordinator_authorize_site(co, c, &site) != 0) return;
    NetBuf m;
    Strait__GetModelRequest *req = NULL;
    if (net_call_recv(c, &m) == NET_RECV_MESSAGE) {
        req = strait__get_model_request__unpack(NULL, m.len, m.data);
        net_buf_free(&m);
    }
    Rounds *r = &co->rounds;
    pthread_mutex_lock(&r->lock);
    /* the delta when the site holds the model it applies to, else the whole
     * checkpoint; a private copy, as the round may commit meanwhile */
    /* a delta only onto exactly the model it was made from: the same round
     * number and the same bytes (after a restore from a backup, a round
     * number may name another history's model) */
    int delta = req && req->has_model && r->delta && (int64_t)req->have_round == r->delta_from &&
                req->have_sha256.len == 32 &&
                memcmp(req->have_sha256.data, r->delta_base_sha, 32) == 0;
    const uint8_t *src = delta ? r->delta : r->ckpt;
    size_t len = delta ? r->delta_len : r->ckpt_len;
    uint8_t *copy = malloc(len ? len : 1), sha[32];
    if (copy) memcpy(copy, src, len);
    memcpy(sha, delta ? r->delta_sha : r->ckpt_sha, 32);
    uint64_t number = (uint64_t)r->number;
    if (copy) r->bytes_down += (int64_t)len;
    pthread_mutex_unlock(&r->lock);
    if (req) strait__get_model_request__free_unpacked(req, NULL);
    if (copy == NULL) {
        net_call_status(c, NET_RESOURCE_EXHAUSTED, "out of memory");
        return;
    }
    NetTransferSpec spec = {delta ? "model-delta" : "model", number, "model", 0, NULL, 0, sha};
    char err[ERR_LEN];
    if (net_download_send(c, &spec, copy, len, err) != 0)
        net_call_status(c, NET_UNAVAILABLE, "%s", err);
    free(copy);
}

/* The update's row in the ledger; -1 (err set) when the store refused it. */
static int record_update(Coordinator *co, int64_t round_id, int64_t site_id, const char *codec,
                         const Strait__UpdateMeta *meta, int64_t wire, int64_t upload_ms,
                         const char *code, const char *reason, int64_t *update_id, char *err) {
    StoreUpdate u;
    memset(&u, 0, sizeof u);
    u.round_id = round_id, u.site_id = site_id;
    snprintf(u.codec, sizeof u.codec, "%s", codec);
    u.raw_bytes = 4 * (int64_t)co->rounds.model.n_params;
    u.wire_bytes = wire;
    /* claims, bounded before they reach the ledger: a refused update may
     * carry any; one past its bound is recorded as 0 */
    u.tokens = meta && meta->tokens <= (uint64_t)co->rounds.max_tokens ? (int64_t)meta->tokens : 0;
    u.train_loss = meta ? meta->train_loss : NAN;
    u.eval_loss = meta ? meta->eval_loss : NAN;
    u.steps =
        meta && meta->steps <= (uint64_t)co->rounds.set.inner_steps ? (int64_t)meta->steps : 0;
    u.train_ms = meta && meta->train_ms <= (uint64_t)INT32_MAX * 1000 ? (int64_t)meta->train_ms : 0;
    u.upload_ms = upload_ms;
    u.start_eval_loss = meta ? meta->start_eval_loss : NAN;
    snprintf(u.state, sizeof u.state, "%s", code ? "rejected" : "received");
    snprintf(u.reason, sizeof u.reason, "%.255s", reason ? reason : "");
    snprintf(u.reason_code, sizeof u.reason_code, "%s", code ? code : "");
    u.received_at = time_wall_ms();
    pthread_mutex_lock(&co->store_lock);
    int rc = store_update_record(co->store, &u, update_id, err);
    pthread_mutex_unlock(&co->store_lock);
    return rc;
}

/* A loss a site reports: a finite, non-negative number of plausible size,
 * or not measured. */
static double claimed_loss(double x) {
    return isfinite(x) && x >= 0 && x < 1e4 ? x : NAN;
}

/* Why an update from `site` is refused before the gates (code and text), or
 * NULL. Under r->lock. */
static const char *precheck(Rounds *r, const char *site, const NetReceived *got,
                            const Strait__UpdateMeta *meta, char *why, size_t why_len) {
    int dup = 0;
    for (int i = 0; i < r->n_reported; i++) dup |= strcmp(r->reported[i], site) == 0;
    const uint8_t *b = got->data;
    if (r->finished) {
        snprintf(why, why_len, "the federation has finished");
        return "finished";
    }
    if (meta == NULL || meta->tokens == 0) {
        snprintf(why, why_len, "update without its metadata (tokens trained)");
        return "no_metadata";
    }
    if (meta->tokens > (uint64_t)r->max_tokens) {
        snprintf(why, why_len,
                 "update weight of %llu tokens is over what a round lets a site train: %lld "
                 "(inner_steps %lld x batch %lld x seq %lld in federation.ini)",
                 (unsigned long long)meta->tokens, (long long)r->max_tokens,
                 (long long)r->set.inner_steps, (long long)r->set.batch, (long long)r->set.seq);
        return "bad_weight";
    }
    if (meta->train_ms > (uint64_t)INT32_MAX * 1000) {
        snprintf(why, why_len, "update metadata claims %llu ms of training",
                 (unsigned long long)meta->train_ms);
        return "malformed";
    }
    if (got->round != (uint64_t)r->number) {
        snprintf(why, why_len, "update for round %llu; the federation is at round %lld",
                 (unsigned long long)got->round, (long long)r->number);
        return "stale_round";
    }
    /* the model it trained from must be this round's, to the bit: what
     * keeps every copy of the model identical (an older site sends none) */
    if (meta->base_sha256.len != 0 &&
        (meta->base_sha256.len != 32 || memcmp(meta->base_sha256.data, r->theta_sha, 32) != 0)) {
        snprintf(why, why_len,
                 "update trained from another model than round %lld's (its SHA-256 differs); "
                 "the site must download the model again",
                 (long long)r->number);
        return "wrong_base";
    }
    if (meta->steps > (uint64_t)r->set.inner_steps) {
        snprintf(why, why_len, "update claims %llu inner steps; a round has %lld",
                 (unsigned long long)meta->steps, (long long)r->set.inner_steps);
        return "malformed";
    }
    if (dup) {
        snprintf(why, why_len, "duplicate update: site %s already reported round %lld", site,
                 (long long)r->number);
        return "duplicate";
    }
    if (r->n_reported == MAX_REPORTS) {
        snprintf(why, why_len, "too many sites in one round");
        return "too_many_sites";
    }
    /* the federation's codec and its parameters, nothing else: the size
     * bound and the robust rules assume them */
    CodecParams params;
    char reason[ERR_LEN];
    if (codec_blob_params(b, got->length, &params, reason) != 0) {
        snprintf(why, why_len, "%s", reason);
        return "malformed";
    }
    const CodecParams *want = &r->set.uplink, *have = &params;
    if (have->id != want->id || have->block != want->block || have->chunk != want->chunk ||
        have->value_bits != want->value_bits || fabs(have->density - want->density) > 1e-6) {
        snprintf(why, why_len,
                 "update in codec %s (block %u, chunk %u, density %g); this federation takes %s "
                 "(block %u, chunk %u, density %g: [codec] in federation.ini, sent in Hello)",
                 codec_params_name(have) ? codec_params_name(have) : "?", have->block, have->chunk,
                 have->density, codec_params_name(want), want->block, want->chunk, want->density);
        return "wrong_codec";
    }
    return NULL;
}

static void h_push_update(NetCall *c, void *user) {
    Coordinator *co = user;
    Rounds *r = &co->rounds;
    StoreSite site;
    if (coordinator_authorize_site(co, c, &site) != 0) return;
    char owner[32], err[ERR_LEN];
    snprintf(owner, sizeof owner, "site-%lld", (long long)site.id);
    /* fixed at start: read without the lock */
    NetLimits lim = {.max_total = r->max_update_bytes,
                     .purpose = "update",
                     .header_ms = r->set.upload_header_ms,
                     .idle_ms = r->set.upload_idle_ms,
                     .life_ms = r->set.upload_life_ms};
    NetReceived got;
    uint64_t t0 = time_monotonic_ns();
    NetStatus st = net_upload_receive(c, r->spool, owner, &lim, &got, err);
    /* the last stream's time: a resumed upload's earlier streams are not counted */
    int64_t upload_ms = (int64_t)((time_monotonic_ns() - t0) / 1000000);
    if (st != NET_OK) {
        log_info("rounds", "upload from %s ended (%s): %s", site.name, net_status_name(st), err);
        net_call_status(c, st, "%s", err);
        return;
    }
    /* revoked while it uploaded: refused like any call of a revoked site */
    if (coordinator_authorize_site(co, c, &site) != 0) {
        net_received_free(&got);
        return;
    }
    Strait__UpdateMeta *meta = strait__update_meta__unpack(NULL, got.meta_len, got.meta);
    if (meta) {
        meta->train_loss = claimed_loss(meta->train_loss);
        meta->eval_loss = claimed_loss(meta->eval_loss);
        meta->start_eval_loss = claimed_loss(meta->start_eval_loss);
    }
    const uint8_t *blob = got.data;
    size_t len = got.length;
    pthread_mutex_lock(&r->lock);
    int64_t round_id = r->round_id, update_id = 0;
    char why[ERR_LEN] = "";
    CodecParams sent;
    const char *codec =
        codec_blob_params(blob, len, &sent, NULL) == 0 ? codec_params_name(&sent) : "?";
    const char *code = precheck(r, site.name, &got, meta, why, sizeof why);
    RoundGate g = {0};
    double weight = meta ? (double)meta->tokens : 0;
    if (code == NULL && round_sum_gate(&r->sum, blob, len, weight, &g) != 0) {
        code = g.code;
        snprintf(why, sizeof why, "%s", g.why);
    }
    char kept[64];
    kept_name(r->number, kept, sizeof kept);
    if (code == NULL && r->set.keeps_updates &&
        net_spool_keep(r->spool, owner, kept, blob, len, NULL, 0, err) != 0) {
        code = "internal";
        snprintf(why, sizeof why, "cannot keep the update for robust aggregation: %.200s", err);
    }
    /* the ledger first: an update the store cannot record is not applied */
    if (record_update(co, round_id, site.id, codec, meta, (int64_t)len, upload_ms, code,
                      code ? why : NULL, &update_id, err) != 0) {
        log_error("rounds", "cannot record the update of %s: %s", site.name, err);
        if (code == NULL) {
            if (r->set.keeps_updates) net_spool_drop(r->spool, owner, kept);
            code = "internal";
            snprintf(why, sizeof why, "the coordinator could not record the update; send it again");
        }
    } else if (code == NULL &&
               round_sum_apply(&r->sum, &g, weight, !r->set.keeps_updates, err) != 0) {
        /* a gated update fails to apply only for want of memory, before any change */
        code = "internal";
        snprintf(why, sizeof why, "the coordinator could not apply the update: %.200s", err);
        if (r->set.keeps_updates) net_spool_drop(r->spool, owner, kept);
        pthread_mutex_lock(&co->store_lock);
        store_update_reject(co->store, update_id, code, why, NULL);
        pthread_mutex_unlock(&co->store_lock);
    }
    int accepted = code == NULL, committed = 0;
    if (accepted) {
        if (r->set.keeps_updates)
            snprintf(r->kept_owner[r->n_kept++], sizeof r->kept_owner[0], "%s", owner);
        snprintf(r->reported[r->n_reported++], 65, "%s", site.name);
        if (isfinite(meta->eval_loss)) {
            r->eval_sum += meta->eval_loss * (double)meta->tokens;
            r->eval_weight += (double)meta->tokens;
        }
    }
    /* early close: every active site is in, and never below quorum (a site
     * that reports before the others have joined must not make a round) */
    if (accepted && r->n_reported >= active_sites(co) && r->n_reported >= r->set.min_sites) {
        char cerr[ERR_LEN];
        if (commit_round(co, cerr) != 0) log_error("rounds", "commit failed: %s", cerr);
        committed = 1;
    }
    pthread_mutex_unlock(&r->lock);
    if (committed) answer_waiters(co, 0);
    if (accepted) {
        log_info("rounds", "round %llu: update from %s accepted (%zu bytes)",
                 (unsigned long long)got.round, site.name, len);
        net_upload_answer(c, got.upload_id, got.length, 1);
    } else {
        log_warn("rounds", "update from %s refused (%s): %s", site.name, code, why);
        net_call_status(c,
                        strcmp(code, "internal") == 0 ? NET_UNAVAILABLE : NET_FAILED_PRECONDITION,
                        "%s", why);
    }
    round_gate_free(&g);
    if (meta) strait__update_meta__free_unpacked(meta, NULL);
    net_received_free(&got);
}

static void h_query_upload(NetCall *c, void *user) {
    Coordinator *co = user;
    StoreSite site;
    if (coordinator_authorize_site(co, c, &site) != 0) return;
    char owner[32];
    snprintf(owner, sizeof owner, "site-%lld", (long long)site.id);
    net_upload_query_handle(c, co->rounds.spool, owner);
}

/* A site's sign of life while it trains (its last_seen moves with the
 * call), answered with where the federation is, so a site whose round has
 * closed without it stops training for nothing. */
static void h_heartbeat(NetCall *c, void *user) {
    Coordinator *co = user;
    Rounds *r = &co->rounds;
    StoreSite site;
    if (coordinator_authorize_site(co, c, &site) != 0) return;
    Strait__HeartbeatRequest *req;
    READ_REQUEST(c, HeartbeatRequest, strait__heartbeat_request, req);
    log_debug("rounds", "heartbeat from %s: round %llu, %s", site.name,
              (unsigned long long)req->round, req->state);
    strait__heartbeat_request__free_unpacked(req, NULL);
    Strait__HeartbeatResponse resp = STRAIT__HEARTBEAT_RESPONSE__INIT;
    pthread_mutex_lock(&r->lock);
    resp.current_round = (uint64_t)r->number;
    resp.finished = r->finished;
    pthread_mutex_unlock(&r->lock);
    SEND_RESPONSE(c, strait__heartbeat_response, resp);
}

/* Long-polls for the round after req.after_round. The call is parked (no
 * worker is held) until the round moves or WAIT_POLL_MS pass; when parking
 * is refused (too many parked) it waits on its worker as before. */
static void h_wait_round(NetCall *c, void *user) {
    Coordinator *co = user;
    Rounds *r = &co->rounds;
    StoreSite site;
    if (coordinator_authorize_site(co, c, &site) != 0) return;
    NetBuf m;
    if (net_call_recv(c, &m) != NET_RECV_MESSAGE) return;
    Strait__WaitRoundRequest *req = strait__wait_round_request__unpack(NULL, m.len, m.data);
    net_buf_free(&m);
    if (req == NULL) {
        net_call_status(c, NET_INVALID_ARGUMENT, "malformed WaitRoundRequest");
        return;
    }
    int64_t after = req->after_round > (uint64_t)INT64_MAX ? INT64_MAX : (int64_t)req->after_round;
    strait__wait_round_request__free_unpacked(req, NULL);
    int64_t left = net_call_deadline_ms(c);
    int64_t wait = left < WAIT_POLL_MS ? left - 500 : WAIT_POLL_MS;
    pthread_mutex_lock(&r->lock);
    int reported = 0;
    for (int i = 0; i < r->n_reported; i++) reported |= strcmp(r->reported[i], site.name) == 0;
    /* a round reopened (a restart, no quorum) without this site's update
     * answers at once, so the site sends it again */
    int must_wait = (reported || r->number != after) && !r->finished && !r->stop &&
                    r->number <= after && wait > 0;
    if (must_wait && r->n_waiters < MAX_WAITERS) {
        if (r->n_waiters == r->cap_waiters) {
            int cap = r->cap_waiters ? 2 * r->cap_waiters : 64;
            Waiter *grown = realloc(r->waiters, sizeof *grown * (size_t)cap);
            if (grown) r->waiters = grown, r->cap_waiters = cap;
        }
        if (r->n_waiters < r->cap_waiters && net_call_park(c) == 0) {
            Waiter *w = &r->waiters[r->n_waiters++];
            w->call = c;
            w->after_round = after;
            w->expires_ms = time_wall_ms() + wait;
            snprintf(w->site, sizeof w->site, "%s", site.name);
            pthread_mutex_unlock(&r->lock); /* answered by answer_waiters */
            return;
        }
    }
    if (must_wait) { /* not parked: wait here */
        struct timespec until;
        clock_gettime(CLOCK_REALTIME, &until);
        until.tv_sec += wait / 1000;
        until.tv_nsec += (wait % 1000) * 1000000L;
        if (until.tv_nsec >= 1000000000L) until.tv_sec++, until.tv_nsec -= 1000000000L;
        while (!r->finished && !r->stop && r->number <= after)
            if (pthread_cond_timedwait(&r->changed, &r->lock, &until) != 0) break;
    }
    Strait__WaitRoundResponse resp = STRAIT__WAIT_ROUND_RESPONSE__INIT;
    resp.current_round = (uint64_t)r->number;
    resp.finished = r->finished;
    resp.reported = 0;
    for (int i = 0; i < r->n_reported; i++) resp.reported |= strcmp(r->reported[i], site.name) == 0;
    pthread_mutex_unlock(&r->lock);
    uint8_t buf[64];
    size_t n = strait__wait_round_response__pack(&resp, buf);
    net_call_send(c, buf, n);
}

/* ---- lifecycle ------------------------------------------------------------------- */

void rounds_describe(Coordinator *co, Strait__HelloResponse *hr, uint8_t model_sha[32]) {
    Rounds *r = &co->rounds;
    pthread_mutex_lock(&r->lock);
    hr->current_round = (uint64_t)r->number;
    hr->total_rounds = (uint64_t)r->set.total;
    hr->table_hash = r->model.table_hash;
    hr->inner_steps = (uint32_t)r->set.inner_steps;
    hr->round_budget_ms = (uint64_t)r->set.budget_ms;
    hr->finished = r->finished;
    /* static strings: the settings never change while serving */
    hr->uplink_codec = (char *)codec_params_name(&r->set.uplink);
    hr->downlink_codec =
        (char *)(r->set.downlink_lossless ? "lossless" : codec_params_name(&r->set.downlink));
    hr->ef_decay = (float)r->set.ef_decay;
    hr->uplink_density = r->set.uplink.id == CODEC_TOPK ? r->set.uplink.density : 0;
    hr->model_seed = (uint64_t)r->set.seed;
    memcpy(model_sha, r->theta_sha, 32); /* a copy: θ's hash moves when a round commits */
    hr->model_sha256.data = model_sha;
    hr->model_sha256.len = 32;
    pthread_mutex_unlock(&r->lock);
}

static int start(Coordinator *co, const RoundsSettings *set, char *err) {
    Rounds *r = &co->rounds;
    pthread_mutex_init(&r->lock, NULL);
    pthread_cond_init(&r->changed, NULL);
    r->delta_from = -1;
    r->set = *set;
    r->max_tokens = set->inner_steps * set->batch * set->seq;
    if (gpt_build(&r->model, &co->model_cfg, (uint64_t)set->seed, err) != 0) return -1;
    /* a pretrained start replaces the seeded draw (a resume replaces both) */
    if (co->model_init[0] && gpt_load(&r->model, co->model_init, NULL, err) != 0) return -1;
    if (outer_init(&r->outer, set->outer, r->model.n_params, (float)set->outer_lr,
                   (float)set->momentum, err) != 0)
        return -1;
    r->outer.eps = (float)set->adam_eps;
    if (!set->downlink_lossless &&
        ef_init(&r->down_ef, r->model.n_params, r->model.table_hash, 1.0f, err) != 0)
        return -1;
    CodecLayout layout = {r->model.table_hash, r->model.n_params, NULL, 0};
    r->max_update_bytes = codec_blob_max_len(&r->set.uplink, &layout);
    if (r->max_update_bytes == 0) return err_set(err, "cannot size the federation's updates");
    uint64_t per_site =
        set->spool_site_bytes > 0 ? (uint64_t)set->spool_site_bytes : 3 * r->max_update_bytes;
    char dir[1200];
    snprintf(dir, sizeof dir, "%s/spool", co->dir);
    r->spool = net_spool_open(dir, (uint64_t)set->spool_bytes, per_site, 24LL * 3600 * 1000, err);
    if (r->spool == NULL) return -1;
    net_spool_drop_all_kept(r->spool); /* a round's kept updates do not outlive the process */
    /* resume from the last committed round, or start from the seeded model */
    StoreRound last;
    int rc = store_resume_point(co->store, co->dir, &last, err);
    if (rc < 0) return -1;
    if (rc == 0) {
        char path[1600];
        snprintf(path, sizeof path, "%s/%s", co->dir, last.checkpoint_path);
        if (gpt_load(&r->model, path, NULL, err) != 0) return -1;
        r->number = last.number + 1;
        int outer = outer_load(co, &last, err);
        if (outer < 0) return -1;
        log_info("rounds", "resuming after round %lld (checkpoint %s verified%s)",
                 (long long)last.number, last.checkpoint_path,
                 outer ? ", outer optimizer state restored" : "");
    }
    char initial[64];
    snprintf(initial, sizeof initial, "%s/current.safetensors", STORE_CHECKPOINT_DIR);
    if (publish_model(co, initial, NULL, NULL, err) != 0) return -1;
    r->theta_norm = l2_norm(r->model.params, r->model.n_params);
    security_sha256(r->model.params, r->model.n_params * 4, r->theta_sha);
    if (r->number >= r->set.total) {
        r->finished = 1;
    } else if (open_round(co, err) != 0) {
        return -1;
    }
    pthread_create(&r->ticker, NULL, ticker_main, co);
    return 0;
}

int rounds_start(Coordinator *co, const RoundsSettings *set, char *err) {
    memset(&co->rounds, 0, sizeof co->rounds);
    if (start(co, set, err) == 0) return 0;
    rounds_stop(co); /* frees what a start that failed half-way had made */
    return -1;
}

void rounds_stop(Coordinator *co) {
    Rounds *r = &co->rounds;
    pthread_mutex_lock(&r->lock);
    r->stop = 1;
    pthread_cond_broadcast(&r->changed);
    pthread_mutex_unlock(&r->lock);
    if (r->ticker) pthread_join(r->ticker, NULL);
    assert(r->n_waiters == 0); /* rounds_release_waiters answered them */
    free(r->waiters);
    if (r->spool) drop_kept(co);
    round_sum_free(&r->sum);
    outer_free(&r->outer);
    ef_free(&r->down_ef);
    gpt_free(&r->model);
    net_spool_close(r->spool);
    free(r->ckpt);
    free(r->delta);
    pthread_mutex_destroy(&r->lock);
    pthread_cond_destroy(&r->changed);
}

int rounds_add_methods(Coordinator *co, NetServer *srv, char *err) {
    return net_server_add_method(srv, "/strait.Federation/GetModel", NET_SERVER_STREAM, 1,
                                 h_get_model, co, err) ||
                   net_server_add_method(srv, "/strait.Federation/PushUpdate", NET_CLIENT_STREAM, 1,
                                         h_push_update, co, err) ||
                   net_server_add_method(srv, "/strait.Federation/QueryUpload", NET_UNARY, 1,
                                         h_query_upload, co, err) ||
                   net_server_add_method(srv, "/strait.Federation/WaitRound", NET_UNARY, 1,
                                         h_wait_round, co, err) ||
                   net_server_add_method(srv, "/strait.Federation/Heartbeat", NET_UNARY, 1,
                                         h_heartbeat, co, err)
               ? -1
               : 0;
}
