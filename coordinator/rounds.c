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
 * Threading: handlers run on net/'s workers; everything in Rounds is under
 * rounds.lock, the store under store_lock (taken after rounds.lock).
 */
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

static int outer_save(Coordinator *co, const char *rel, char *rel_out, size_t rel_len, char sha[65],
                      int64_t *bytes, char *err) {
    Rounds *r = &co->rounds;
    rel_out[0] = '\0';
    if (r->outer.b == NULL) return 0; /* FedAvg has no state */
    char path[1700];
    outer_rel(rel, rel_out, rel_len);
    snprintf(path, sizeof path, "%s/%s", co->dir, rel_out);
    const float *bases[2] = {r->outer.b, r->outer.v};
    const char *prefixes[2] = {"outer_b.", "outer_v."};
    if (gpt_save_state(&r->model, path, bases, prefixes, r->outer.v ? 2 : 1, r->outer.step, err) !=
        0)
        return -1;
    return security_sha256_file(path, sha, bytes, err);
}

/* The state of the round resumed from: the pinned file (verified with the
 * checkpoint by store_resume_point), or for rounds committed before states
 * were pinned, the file beside the checkpoint if there is one. 1 restored,
 * 0 none, -1 error. */
static int outer_load(Coordinator *co, const StoreRound *last, char *err) {
    Rounds *r = &co->rounds;
    if (r->outer.b == NULL) return 0;
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
    if (gpt_load_state(&r->model, path, dsts, prefixes, r->outer.v ? 2 : 1, err) != 0) return -1;
    r->outer.step = (int)r->number;
    return 1;
}

static void drop_kept(Coordinator *co) {
    Rounds *r = &co->rounds;
    for (int i = 0; i < r->n_kept; i++) {
        char path[1200];
        snprintf(path, sizeof path, "%s/spool/%s", co->dir, r->kept[i]);
        unlink(path);
    }
    r->n_kept = 0;
}

/* The robust mean of the kept updates, read through mmap block by block. */
static int robust_mean(Coordinator *co, float *mean, char *err) {
    Rounds *r = &co->rounds;
    const uint8_t *blobs[MAX_REPORTS];
    size_t lens[MAX_REPORTS];
    int mapped = 0, rc = -1;
    for (; mapped < r->n_kept; mapped++) {
        char path[1200];
        snprintf(path, sizeof path, "%s/spool/%s", co->dir, r->kept[mapped]);
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
    rc = robust_aggregate(blobs, lens, r->n_kept, r->model.n_params,
                          r->robust == 1 ? ROBUST_MEDIAN : ROBUST_TRIMMED_MEAN, r->trim, mean, err);
out:
    for (int i = 0; i < mapped; i++) munmap((void *)blobs[i], lens[i]);
    return rc;
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
    log_info("rounds", "round %lld open", (long long)r->number);
    return 0;
}

/* Aggregate, outer step, checkpoint, commit, next round. Under r->lock. */
static int commit_round(Coordinator *co, char *err) {
    Rounds *r = &co->rounds;
    size_t n = r->model.n_params;
    float *mean = malloc(sizeof(float) * n);
    if (mean == NULL ||
        (r->robust ? robust_mean(co, mean, err) : round_sum_mean(&r->sum, mean, err)) != 0) {
        free(mean);
        return -1;
    }
    /* keep θ_r to make the next round's downlink a delta from it */
    float *prev = malloc(sizeof(float) * n);
    if (prev) memcpy(prev, r->model.params, sizeof(float) * n);
    outer_step(&r->outer, r->model.params, mean);
    free(mean);
    free(r->delta);
    r->delta = NULL;
    r->delta_from = -1;
    Blob d = {0};
    if (prev && ckpt_encode(r->model.params, n * 4, 4, prev, 1, &d, err) == 0) {
        r->delta = d.data, r->delta_len = d.len, r->delta_from = r->number;
        security_sha256(d.data, d.len, r->delta_sha);
        security_sha256(prev, n * 4, r->delta_base_sha);
    }
    free(prev);
    char rel[128], sha[65], state_rel[160], state_sha[65];
    int64_t bytes, state_bytes = 0;
    snprintf(rel, sizeof rel, "%s/round-%06lld.safetensors", STORE_CHECKPOINT_DIR,
             (long long)r->number);
    r->number++; /* the checkpoint holds the model the next round starts from */
    if (publish_model(co, rel, sha, &bytes, err) != 0 ||
        outer_save(co, rel, state_rel, sizeof state_rel, state_sha, &state_bytes, err) != 0) {
        r->number--;
        return -1;
    }
    StoreCheckpoint ck = {rel, bytes, sha, state_rel[0] ? state_rel : NULL, state_bytes, state_sha};
    double eval = r->eval_weight > 0 ? r->eval_sum / r->eval_weight : NAN;
    pthread_mutex_lock(&co->store_lock);
    int rc =
        store_round_commit(co->store, r->round_id, &ck, eval, r->bytes_down, time_wall_ms(), err);
    pthread_mutex_unlock(&co->store_lock);
    if (rc != 0) return -1;
    log_info("rounds", "round %lld committed: %d sites, eval loss %.4f", (long long)r->number - 1,
             r->n_reported, eval);
    if (r->number >= r->total) {
        r->finished = 1;
        log_info("rounds", "federation finished after %lld rounds", (long long)r->total);
    } else if (open_round(co, err) != 0) {
        return -1;
    }
    pthread_cond_broadcast(&r->changed);
    return 0;
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

/* The deadline: every 200 ms, close, extend or fail the open round. */
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
        if (!r->finished && now >= r->opened_ms + r->deadline_ms * (r->extensions + 1)) {
            char err[ERR_LEN];
            if (r->n_reported >= r->min_sites && r->sum.accepted > 0) {
                if (commit_round(co, err) != 0) log_error("rounds", "commit failed: %s", err);
            } else if (r->extensions < r->max_extensions) {
                r->extensions++;
                log_warn("rounds",
                         "round %lld: %d of %lld sites by the deadline; extended (%d/%lld)",
                         (long long)r->number, r->n_reported, (long long)r->min_sites,
                         r->extensions, (long long)r->max_extensions);
            } else {
                char reason[160];
                snprintf(reason, sizeof reason, "no quorum: %d of %lld sites after %d extensions",
                         r->n_reported, (long long)r->min_sites, r->extensions);
                pthread_mutex_lock(&co->store_lock);
                store_round_fail(co->store, r->round_id, reason, now, NULL);
                pthread_mutex_unlock(&co->store_lock);
                log_warn("rounds", "round %lld failed (%s); reopening", (long long)r->number,
                         reason);
                if (open_round(co, err) != 0) log_error("rounds", "cannot reopen: %s", err);
            }
        }
        pthread_mutex_unlock(&r->lock);
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

static void record_update(Coordinator *co, int64_t round_id, int64_t site_id, const char *codec,
                          const Strait__UpdateMeta *meta, int64_t wire, int64_t upload_ms,
                          const char *state, const char *reason) {
    StoreUpdate u;
    memset(&u, 0, sizeof u);
    u.round_id = round_id, u.site_id = site_id;
    snprintf(u.codec, sizeof u.codec, "%s", codec);
    u.raw_bytes = 4 * (int64_t)co->rounds.model.n_params;
    u.wire_bytes = wire;
    u.tokens = meta ? (int64_t)meta->tokens : 0;
    u.train_loss = meta ? meta->train_loss : NAN;
    u.eval_loss = meta ? meta->eval_loss : NAN;
    u.train_ms = meta ? (int64_t)meta->train_ms : 0;
    u.upload_ms = upload_ms;
    u.start_eval_loss = meta ? meta->start_eval_loss : NAN;
    snprintf(u.state, sizeof u.state, "%s", state);
    snprintf(u.reason, sizeof u.reason, "%.255s", reason ? reason : "");
    u.received_at = time_wall_ms();
    char err[ERR_LEN];
    pthread_mutex_lock(&co->store_lock);
    if (store_update_record(co->store, &u, NULL, err) != 0)
        log_warn("rounds", "cannot record an update: %s", err);
    pthread_mutex_unlock(&co->store_lock);
}

static void h_push_update(NetCall *c, void *user) {
    Coordinator *co = user;
    Rounds *r = &co->rounds;
    StoreSite site;
    if (coordinator_authorize_site(co, c, &site) != 0) return;
    NetLimits lim = {16 * (uint64_t)r->model.n_params + (1u << 20)};
    NetReceived got;
    char err[ERR_LEN];
    uint64_t t0 = time_monotonic_ns();
    NetStatus st = net_upload_receive(c, r->spool, &lim, &got, err);
    /* the last stream's time: a resumed upload's earlier streams are not counted */
    int64_t upload_ms = (int64_t)((time_monotonic_ns() - t0) / 1000000);
    if (st != NET_OK) {
        net_call_status(c, st, "%s", err);
        return;
    }
    Strait__UpdateMeta *meta = strait__update_meta__unpack(NULL, got.meta_len, got.meta);
    char *blob = NULL;
    size_t len = 0;
    if (file_read_all(got.path, lim.max_total, &blob, &len, err) != 0) {
        net_call_status(c, NET_INTERNAL, "%s", err);
        goto out;
    }
    pthread_mutex_lock(&r->lock);
    int64_t round_id = r->round_id;
    char why[ERR_LEN] = "";
    const char *codec =
        len > 6 && codec_name((CodecId)blob[6]) ? codec_name((CodecId)blob[6]) : "?";
    int dup = 0;
    for (int i = 0; i < r->n_reported; i++) dup |= strcmp(r->reported[i], site.name) == 0;
    if (r->finished) {
        snprintf(why, sizeof why, "the federation has finished");
    } else if (meta == NULL || meta->tokens == 0) {
        snprintf(why, sizeof why, "update without its metadata (tokens trained)");
    } else if (got.round != (uint64_t)r->number) {
        snprintf(why, sizeof why, "update for round %llu; the federation is at round %lld",
                 (unsigned long long)got.round, (long long)r->number);
    } else if (dup) {
        snprintf(why, sizeof why, "duplicate update: site %s already reported round %lld",
                 site.name, (long long)r->number);
    } else if (r->n_reported == MAX_REPORTS) {
        snprintf(why, sizeof why, "too many sites in one round");
    } else if ((r->robust ? round_sum_check : round_sum_add)(&r->sum, (const uint8_t *)blob, len,
                                                             (double)meta->tokens, why) == 0) {
        why[0] = '\0';
        if (r->robust) { /* keep the whole update until the round closes */
            char kept[1200];
            snprintf(r->kept[r->n_kept], sizeof r->kept[0], "kept-r%lld-%.40s.blob",
                     (long long)r->number, site.name);
            snprintf(kept, sizeof kept, "%s/spool/%s", co->dir, r->kept[r->n_kept]);
            if (rename(got.path, kept) == 0)
                r->n_kept++;
            else
                snprintf(why, sizeof why, "cannot keep the update for robust aggregation");
        }
    }
    int accepted = why[0] == '\0';
    if (accepted) {
        snprintf(r->reported[r->n_reported++], 65, "%s", site.name);
        if (isfinite(meta->eval_loss)) {
            r->eval_sum += meta->eval_loss * (double)meta->tokens;
            r->eval_weight += (double)meta->tokens;
        }
    }
    record_update(co, round_id, site.id, codec, meta, (int64_t)len, upload_ms,
                  accepted ? "received" : "rejected", accepted ? NULL : why);
    /* early close: every active site is in, and never below quorum (a site
     * that reports before the others have joined must not make a round) */
    if (accepted && r->n_reported >= active_sites(co) && r->n_reported >= r->min_sites) {
        char cerr[ERR_LEN];
        if (commit_round(co, cerr) != 0) log_error("rounds", "commit failed: %s", cerr);
    }
    pthread_mutex_unlock(&r->lock);
    if (accepted) {
        log_info("rounds", "round %llu: update from %s accepted (%zu bytes)",
                 (unsigned long long)got.round, site.name, len);
        net_upload_answer(c, got.upload_id, got.length, 1);
    } else {
        log_warn("rounds", "update from %s refused: %s", site.name, why);
        net_call_status(c, NET_FAILED_PRECONDITION, "%s", why);
    }
out:
    free(blob);
    if (meta) strait__update_meta__free_unpacked(meta, NULL);
    net_spool_release(r->spool, got.upload_id);
    net_received_free(&got);
}

static void h_query_upload(NetCall *c, void *user) {
    Coordinator *co = user;
    StoreSite site;
    if (coordinator_authorize_site(co, c, &site) != 0) return;
    net_upload_query_handle(c, co->rounds.spool);
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
    int64_t left = net_call_deadline_ms(c);
    int64_t wait = left < WAIT_POLL_MS ? left - 500 : WAIT_POLL_MS;
    struct timespec until;
    clock_gettime(CLOCK_REALTIME, &until);
    until.tv_sec += wait > 0 ? wait / 1000 : 0;
    until.tv_nsec += wait > 0 ? (wait % 1000) * 1000000L : 0;
    if (until.tv_nsec >= 1000000000L) until.tv_sec++, until.tv_nsec -= 1000000000L;
    pthread_mutex_lock(&r->lock);
    int reported = 0;
    for (int i = 0; i < r->n_reported; i++) reported |= strcmp(r->reported[i], site.name) == 0;
    /* a round reopened (a restart, no quorum) without this site's update
     * answers at once, so the site sends it again */
    if (reported || r->number != (int64_t)req->after_round)
        while (!r->finished && !r->stop && r->number <= (int64_t)req->after_round)
            if (pthread_cond_timedwait(&r->changed, &r->lock, &until) != 0) break;
    Strait__WaitRoundResponse resp = STRAIT__WAIT_ROUND_RESPONSE__INIT;
    resp.current_round = (uint64_t)r->number;
    resp.finished = r->finished;
    resp.reported = 0;
    for (int i = 0; i < r->n_reported; i++) resp.reported |= strcmp(r->reported[i], site.name) == 0;
    pthread_mutex_unlock(&r->lock);
    uint8_t buf[64];
    size_t n = strait__wait_round_response__pack(&resp, buf);
    net_call_send(c, buf, n);
    strait__wait_round_request__free_unpacked(req, NULL);
}

/* ---- lifecycle ------------------------------------------------------------------- */

void rounds_describe(Coordinator *co, uint64_t *round, uint64_t *total, uint64_t *table_hash,
                     uint32_t *inner_steps, uint64_t *budget_ms, int *finished,
                     const char **codec) {
    Rounds *r = &co->rounds;
    pthread_mutex_lock(&r->lock);
    *round = (uint64_t)r->number;
    *total = (uint64_t)r->total;
    *table_hash = r->model.table_hash;
    *inner_steps = (uint32_t)r->inner_steps;
    *budget_ms = (uint64_t)r->budget_ms;
    *finished = r->finished;
    *codec = r->uplink.id == CODEC_TOPK && r->uplink.value_bits == 2 ? "topk2"
                                                                     : codec_name(r->uplink.id);
    pthread_mutex_unlock(&r->lock);
}

static int start(Coordinator *co, const Config *cfg, char *err) {
    Rounds *r = &co->rounds;
    pthread_mutex_init(&r->lock, NULL);
    pthread_cond_init(&r->changed, NULL);
    r->delta_from = -1;
    int64_t seed;
    const char *codec = config_get_str(cfg, "codec", "uplink", "int8");
    const char *outer = config_get_str(cfg, "optimizer", "outer", "nesterov");
    const char *agg = config_get_str(cfg, "rounds", "aggregate", "mean");
    double outer_lr, momentum;
    if (config_get_int(cfg, "rounds", "total", 10, 1, 1000000, &r->total, err) ||
        config_get_int(cfg, "rounds", "min_sites", 1, 1, 100000, &r->min_sites, err) ||
        config_get_duration_ms(cfg, "rounds", "deadline", 600000, &r->deadline_ms, err) ||
        config_get_int(cfg, "rounds", "inner_steps", 50, 1, 1000000, &r->inner_steps, err) ||
        config_get_int(cfg, "rounds", "max_extensions", 3, 0, 1000, &r->max_extensions, err) ||
        config_get_duration_ms(cfg, "rounds", "time_budget", 0, &r->budget_ms, err) ||
        config_get_int(cfg, "model", "seed", 1, 0, INT64_MAX, &seed, err) ||
        config_get_double(cfg, "optimizer", "lr", 0.7, &outer_lr, err) ||
        config_get_double(cfg, "optimizer", "momentum", 0.9, &momentum, err) ||
        config_get_double(cfg, "rounds", "trim", 0.1, &r->trim, err))
        return -1;
    if (strcmp(agg, "mean") == 0)
        r->robust = 0;
    else if (strcmp(agg, "median") == 0)
        r->robust = 1;
    else if (strcmp(agg, "trimmed_mean") == 0)
        r->robust = 2;
    else
        return err_set(err,
                       "federation.ini: [rounds] aggregate = %s; use mean, median or "
                       "trimmed_mean",
                       agg);
    if (r->robust == 2 && !(r->trim >= 0 && r->trim < 0.5))
        return err_set(err, "federation.ini: [rounds] trim = %g; use 0 to 0.5", r->trim);
    if (codec_params_parse(codec, &r->uplink, err) != 0) return -1;
    OuterKind kind;
    if (outer_kind_parse(outer, &kind) != 0)
        return err_set(err, "federation.ini: [optimizer] outer = %s; use nesterov, avg or adam",
                       outer);
    GPTConfig gc;
    if (gpt_config_preset(co->model, &gc) != 0)
        return err_set(err, "federation.ini: unknown model preset %s", co->model);
    if (gpt_build(&r->model, &gc, (uint64_t)seed, err) != 0) return -1;
    if (outer_init(&r->outer, kind, r->model.n_params, (float)outer_lr, (float)momentum, err) != 0)
        return -1;
    char dir[1200];
    snprintf(dir, sizeof dir, "%s/spool", co->dir);
    r->spool = net_spool_open(dir, 64ull << 30, 24LL * 3600 * 1000, err);
    if (r->spool == NULL) return -1;
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
    if (r->number >= r->total) {
        r->finished = 1;
    } else if (open_round(co, err) != 0) {
        return -1;
    }
    pthread_create(&r->ticker, NULL, ticker_main, co);
    return 0;
}

int rounds_start(Coordinator *co, const Config *cfg, char *err) {
    memset(&co->rounds, 0, sizeof co->rounds);
    if (start(co, cfg, err) == 0) return 0;
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
    drop_kept(co);
    round_sum_free(&r->sum);
    outer_free(&r->outer);
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
