/*
 * round_calls.c — the Federation calls of the round loop: GetModel (the
 * current model, whole or as the delta from the site's copy), PushUpdate
 * (a site's pseudo-gradient: inspected outside the round lock, then checked
 * against the round, recorded, and added to its sum), QueryUpload (where a
 * resumed upload stands), Heartbeat and WaitRound (a long poll, parked
 * without holding a worker).
 *
 * A site is authenticated, never trusted (docs/design.md §6): its uploads live
 * in its own spool folder, its weight (tokens) is bounded by what a round
 * lets it train, its update must be in the federation's codec and pass the
 * gates from the first one on, and it is recorded in the store before it
 * touches the sum.
 */
#include <assert.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "coordinator_internal.h"
#include "schema/strait.pb-c.h"
#include "util/util.h"

#define WAIT_POLL_MS 20000

/* ---- who is calling (also for service.c's Hello and Renew) ----------------- */

/* The site behind the call's certificate, or a refusal set on the call. */
int coordinator_authorize_site(Coordinator *co, NetCall *c, StoreSite *site) {
    const NetPeer *p = net_call_peer(c);
    if (!p->has_cert) {
        net_call_status(c, NET_UNAUTHENTICATED, "a site certificate is required");
        return -1;
    }
    if (strcmp(p->sha256_hex, co->admin_sha) == 0) {
        net_call_status(c, NET_PERMISSION_DENIED, "the admin certificate is not a site's");
        return -1;
    }
    StoreCert cert;
    char err[ERR_LEN];
    int64_t now = time_wall_ms();
    pthread_mutex_lock(&co->store_lock);
    int rc = store_cert_find(co->store, p->sha256_hex, site, &cert, err);
    int retired = rc == 0 && cert.revoked_at != 0 && cert.revoked_at <= now;
    if (rc == 0 && strcmp(site->state, "active") == 0 && !retired)
        store_site_touch(co->store, site->id, now, NULL);
    pthread_mutex_unlock(&co->store_lock);
    if (rc < 0) {
        log_error("coordinator", "%s", err);
        net_call_status(c, NET_INTERNAL, "the coordinator's store failed; retry later");
        return -1;
    }
    if (rc == STORE_NOT_FOUND) {
        net_call_status(c, NET_UNAUTHENTICATED,
                        "certificate %.16s… was not issued to a site of this federation",
                        p->sha256_hex);
        net_call_deny_peer(c);
        return -1;
    }
    if (strcmp(site->state, "active") != 0) {
        net_call_status(c, NET_PERMISSION_DENIED, "site %s is revoked", site->name);
        net_call_deny_peer(c);
        return -1;
    }
    if (retired) {
        net_call_status(c, NET_UNAUTHENTICATED,
                        "certificate %.16s… of site %s was replaced by a renewal; use the site's "
                        "newest (strait site run loads it when it starts)",
                        p->sha256_hex, site->name);
        net_call_deny_peer(c);
        return -1;
    }
    if (cert.not_after <= now) {
        net_call_status(c, NET_UNAUTHENTICATED,
                        "the certificate of site %s has expired; enroll the site again",
                        site->name);
        return -1;
    }
    return 0;
}

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
    rounds_lock(r);
    /* the delta when the site holds the model it applies to, a link of the
     * chain when it holds an older one the chain starts from, else the
     * whole checkpoint; a reference, not a copy: a round that commits
     * meanwhile installs another, and the last download of this one frees
     * it. A delta only onto exactly the model it was made from: the same
     * round number and the same bytes (after a restore from a backup, a
     * round number may name another history's model) */
    int held = req && req->has_model && req->have_sha256.len == 32;
    int delta = held && r->delta && (int64_t)req->have_round == r->delta_from &&
                memcmp(req->have_sha256.data, r->delta_base_sha, 32) == 0;
    const DeltaLink *link = NULL;
    for (int i = 0; held && r->delta && !delta && link == NULL && i < r->n_chain; i++)
        if ((int64_t)req->have_round == r->chain[i].from &&
            memcmp(req->have_sha256.data, r->chain[i].base_sha, 32) == 0)
            link = &r->chain[i];
    /* downloads per site and round are bounded for each payload (the
     * checkpoint or the delta together, each link of the chain on its own),
     * and bytes_down counts each once per site and round, however often it
     * is fetched */
    RoundSiteCount *sc = rounds_site_count(r, site.id);
    int *times = sc ? &sc->downloads : NULL, *counted = NULL;
    for (int i = 0; sc && link && i <= sc->n_links && i < DELTA_CHAIN; i++) {
        if (i == sc->n_links) { /* its first fetch this round */
            sc->links[i].from = link->from, sc->links[i].downloads = sc->links[i].got = 0;
            sc->n_links++;
        }
        if (sc->links[i].from == link->from) {
            times = &sc->links[i].downloads, counted = &sc->links[i].got;
            break;
        }
    }
    if (times && *times >= r->set.downloads) {
        int64_t number = r->number, had = *times;
        pthread_mutex_unlock(&r->lock);
        if (req) strait__get_model_request__free_unpacked(req, NULL);
        net_call_status(c, NET_RESOURCE_EXHAUSTED,
                        "site %s has downloaded the model %d times in round %lld, the limit "
                        "([limits] downloads_per_round); retry when the round moves",
                        site.name, (int)had, (long long)number);
        return;
    }
    if (times) (*times)++;
    Served *sv = link ? link->sv : delta ? r->delta : r->ckpt;
    assert(sv != NULL && sv->refs > 0); /* the served model is installed, not yet released */
    sv->refs++;
    /* the round whose model the site holds once it has applied this */
    uint64_t number = link ? (uint64_t)link->from + 1 : (uint64_t)r->number;
    /* and the round the federation is at: past `number` for a link, so the
     * site asks again from there instead of training a model rounds old */
    Strait__ModelMeta mm = STRAIT__MODEL_META__INIT;
    mm.current_round = (uint64_t)r->number;
    uint8_t meta[16];
    size_t meta_len = strait__model_meta__pack(&mm, meta);
    /* a download cut part-way goes on from what the site holds of it, when
     * that is still the payload to serve */
    uint64_t from = req && req->resume_sha256.len == 32 && req->resume_offset < sv->len &&
                            memcmp(req->resume_sha256.data, sv->sha, 32) == 0
                        ? req->resume_offset
                        : 0;
    if (sc && !link) counted = delta ? &sc->got_delta : &sc->got_ckpt;
    if (counted == NULL || !*counted) r->bytes_down += (int64_t)sv->len;
    if (counted) *counted = 1;
    pthread_mutex_unlock(&r->lock);
    if (req) strait__get_model_request__free_unpacked(req, NULL);
    NetTransferSpec spec = {
        link || delta ? "model-delta" : "model", number, "model", 0, meta, meta_len, sv->sha};
    char err[ERR_LEN];
    int sent = net_download_send_from(c, &spec, sv->data, sv->len, from, err) == 0;
    if (!sent) net_call_status(c, NET_UNAVAILABLE, "%s", err);
    rounds_lock(r);
    if (sent) rounds_served_set(r, site.id, (int64_t)number); /* it holds it only once whole */
    served_unref(sv);
    pthread_mutex_unlock(&r->lock);
}

/* The update's row in the ledger; -1 (err set) when the store refused it. */
static int record_update(Coordinator *co, int64_t round_id, int64_t site_id, const char *codec,
                         const Strait__UpdateMeta *meta, int64_t wire, int64_t upload_ms,
                         int64_t staleness, const char *code, const char *reason,
                         int64_t *update_id, char *err) {
    StoreUpdate u;
    memset(&u, 0, sizeof u);
    u.staleness = staleness;
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
    /* where the rest of its round went: a week at most, else 0 (not sent) */
    const uint64_t week = 7 * 24 * 3600 * 1000ull;
    u.download_ms = meta && meta->download_ms <= week ? (int64_t)meta->download_ms : 0;
    u.decode_ms = meta && meta->decode_ms <= week ? (int64_t)meta->decode_ms : 0;
    u.eval_ms = meta && meta->eval_ms <= week ? (int64_t)meta->eval_ms : 0;
    u.encode_ms = meta && meta->encode_ms <= week ? (int64_t)meta->encode_ms : 0;
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
 * NULL; *staleness gets how many rounds old the model it trained from is
 * (async; else 0). Under r->lock. */
static const char *precheck(Rounds *r, const StoreSite *from, const NetReceived *got,
                            const Strait__UpdateMeta *meta, int64_t *staleness, char *why,
                            size_t why_len) {
    const char *site = from->name;
    int dup = rounds_reported(r, site);
    const uint8_t *b = got->data;
    if (r->state == ROUND_FINISHED) {
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
    if (r->state == ROUND_UNOPENED) { /* a store that failed to open it: the site sends it again */
        snprintf(why, why_len,
                 "round %lld is not open yet (the coordinator's store failed to open it); "
                 "send it again",
                 (long long)r->number);
        return "internal";
    }
    if (r->state == ROUND_COMMITTING) {
        snprintf(why, why_len, "round %lld has closed and is being committed; train the next",
                 (long long)r->number);
        return "stale_round";
    }
    /* the model it trained from must be one this round takes, to the bit:
     * what keeps every copy of the model identical */
    const uint8_t *base = NULL;
    *staleness = 0;
    if (r->set.async) { /* async: the round it names, up to `staleness` rounds back */
        if (got->round > (uint64_t)r->number) {
            snprintf(why, why_len,
                     "update trained from round %llu's model; the federation is at round %lld",
                     (unsigned long long)got->round, (long long)r->number);
            return "wrong_base";
        }
        /* its weight follows its staleness, so the base it names is checked
         * against what it was served: never a model newer than that */
        int64_t served = rounds_served(r, from->id);
        if (served >= 0 && (int64_t)got->round > served) {
            snprintf(why, why_len,
                     "update trained from round %llu's model; this coordinator served site %s "
                     "round %lld's at the newest",
                     (unsigned long long)got->round, site, (long long)served);
            return "wrong_base";
        }
        *staleness = r->number - (int64_t)got->round;
        base = rounds_history_sha(r, (int64_t)got->round);
        if (!rounds_takes_base(r, got->round) || base == NULL) {
            snprintf(why, why_len,
                     "update trained from round %llu's model, %lld rounds old; this federation "
                     "takes updates up to %lld rounds old ([rounds] staleness)%s: download the "
                     "current model",
                     (unsigned long long)got->round, (long long)*staleness,
                     (long long)r->set.staleness,
                     base == NULL && *staleness <= r->set.staleness
                         ? ", and that model is no longer known here"
                         : "");
            return "stale";
        }
    } else if (!rounds_takes_base(r, got->round)) {
        snprintf(why, why_len, "update for round %llu; the federation is at round %lld",
                 (unsigned long long)got->round, (long long)r->number);
        return "stale_round";
    }
    /* sync: this round's model (an older site sends none); with overlap the
     * round before's too (the one-step-delayed outer step: applied to θ_r,
     * trained from θ_{r−1}) */
    const uint8_t *prev = r->set.overlap ? rounds_history_sha(r, r->number - 1) : NULL;
    int base_ok = base
                      ? meta->base_sha256.len == 32 && memcmp(meta->base_sha256.data, base, 32) == 0
                      : meta->base_sha256.len == 0 ||
                            (meta->base_sha256.len == 32 &&
                             (memcmp(meta->base_sha256.data, r->theta_sha, 32) == 0 ||
                              (prev && memcmp(meta->base_sha256.data, prev, 32) == 0)));
    if (!base_ok) {
        snprintf(why, why_len,
                 "update trained from another model than round %llu's%s (its SHA-256 %s); "
                 "the site must download the model again",
                 (unsigned long long)got->round, r->set.overlap ? " or the round before's" : "",
                 meta->base_sha256.len == 32 ? "differs" : "is missing");
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
    if (r->n_reported >= ROUNDS_MAX_SITES || rounds_reserve(r, r->n_reported + 1) != 0) {
        snprintf(why, why_len, "too many sites in one round (or no memory for another update)");
        return "too_many_sites";
    }
    if (r->set.secagg) return NULL; /* a masked update: secagg_round_check's */
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

/* One PushUpdate on its way through its phases, each named by what it
 * holds: push_admit (rounds.lock), push_receive (nothing: the upload),
 * push_wait_commit (rounds.lock, async rounds), then, holding `reading`,
 * push_keep (rounds.lock for a moment) and push_decide (rounds.lock: the
 * checks, the store's row, the sum, maybe the close), and push_answer
 * (nothing). */
typedef struct Push {
    StoreSite site;
    char owner[32];
    NetReceived got;
    Strait__UpdateMeta *meta; /* the site's claims, NULL if they do not parse */
    int64_t upload_ms;        /* the last stream's: a resumed upload's earlier ones not counted */
    int64_t staleness;
    double weight;
    RoundGate g;
    char kept[64]; /* a robust round's copy of the update, in the site's spool */
    int kept_here;
    char keep_err[ERR_LEN];
    const char *code; /* refused: why, for the store and the site; NULL: accepted */
    char why[ERR_LEN];
    RoundClosing *closing; /* the round this update closed, for the caller to commit */
} Push;

/* rounds.lock: a site refused often in this round is refused at the header
 * (its stream is not read and no row is written, only counted). 0: go on. */
static int push_admit(Coordinator *co, NetCall *c, Push *p) {
    Rounds *r = &co->rounds;
    rounds_lock(r);
    RoundSiteCount *sc = rounds_site_count(r, p->site.id);
    int refused = sc ? sc->refused : 0;
    int64_t open_number = r->number;
    if (refused >= r->set.refusals) r->refusals_unrecorded++;
    pthread_mutex_unlock(&r->lock);
    if (refused < r->set.refusals) return 0;
    net_call_status(c, NET_FAILED_PRECONDITION,
                    "site %s had %d updates refused in round %lld; it is refused until the "
                    "round moves ([limits] refusals_per_round)",
                    p->site.name, refused, (long long)open_number);
    return -1;
}

/* No lock: the upload into the site's spool folder, then its claims. 0: go
 * on; -1: the call has been answered. */
static int push_receive(Coordinator *co, NetCall *c, Push *p) {
    Rounds *r = &co->rounds;
    char err[ERR_LEN];
    /* fixed at start: read without the lock */
    NetLimits lim = {.max_total = r->max_update_bytes,
                     .purpose = "update",
                     .header_ms = r->set.upload_header_ms,
                     .idle_ms = r->set.upload_idle_ms,
                     .life_ms = r->set.upload_life_ms,
                     .min_rate = (uint64_t)r->set.upload_min_rate,
                     .grace_ms = r->set.upload_grace_ms};
    uint64_t t0 = time_monotonic_ns();
    NetStatus st = net_upload_receive(c, r->spool, p->owner, &lim, &p->got, err);
    p->upload_ms = (int64_t)((time_monotonic_ns() - t0) / 1000000);
    if (st != NET_OK) {
        log_info("rounds", "upload from %s ended (%s): %s", p->site.name, net_status_name(st), err);
        net_call_status(c, st, "%s", err);
        return -1;
    }
    /* revoked while it uploaded: refused like any call of a revoked site */
    if (coordinator_authorize_site(co, c, &p->site) != 0) {
        net_received_free(&p->got);
        return -1;
    }
    p->meta = strait__update_meta__unpack(NULL, p->got.meta_len, p->got.meta);
    if (p->meta) {
        p->meta->train_loss = claimed_loss(p->meta->train_loss);
        p->meta->eval_loss = claimed_loss(p->meta->eval_loss);
        p->meta->start_eval_loss = claimed_loss(p->meta->start_eval_loss);
    }
    p->weight = p->meta ? (double)p->meta->tokens : 0;
    return 0;
}

/* rounds.lock: with async rounds, an update that arrives while a round
 * commits joins the next one (it would be refused as late in a sync
 * federation): it waits out the commit, a minute at most. */
static void push_wait_commit(Rounds *r) {
    struct timespec until;
    clock_gettime(CLOCK_REALTIME, &until);
    until.tv_sec += 60;
    rounds_lock(r);
    while (r->state == ROUND_COMMITTING && !r->stop)
        if (pthread_cond_timedwait(&r->changed, &r->lock, &until) != 0) break;
    pthread_mutex_unlock(&r->lock);
}

/* `reading` held; rounds.lock for a moment. A robust round's update alone,
 * outside rounds.lock: its structure, checksums, finite values, model and
 * norm (the model's table never changes), and kept whole: written now and
 * dropped if the round refuses it (O_EXCL: a second update of the same site
 * and round is not written over the first). Only an update for the open
 * round is written: the round it claims is checked first. A mean's update
 * is read once, in push_decide, checked and added to the sum's stage in the
 * same pass. */
static void push_keep(Rounds *r, Push *p) {
    snprintf(p->keep_err, sizeof p->keep_err,
             "the round moved while the update was read; send it again");
    if (!r->set.keeps_updates) return;
    round_gate_inspect(r->model.n_params, r->model.table_hash, p->got.data, p->got.length, r->pool,
                       &p->g);
    if (p->g.code != NULL) return;
    rounds_lock(r);
    int64_t open = r->state == ROUND_OPEN && rounds_takes_base(r, p->got.round) ? r->number : -1;
    pthread_mutex_unlock(&r->lock);
    round_kept_name(open, p->kept, sizeof p->kept);
    if (open >= 0)
        p->kept_here = net_spool_keep(r->spool, p->owner, p->kept, p->got.data, p->got.length, NULL,
                                      0, p->keep_err) == 0;
}

/* push_decide for a masked update (secure aggregation): checked, recorded,
 * then summed; the round closes when its phases say (secagg_round.c). */
static void push_decide_masked(Coordinator *co, Push *p, const char *codec) {
    Rounds *r = &co->rounds;
    char err[ERR_LEN];
    const uint8_t *blob = p->got.data;
    size_t len = p->got.length;
    int64_t update_id = 0;
    if (p->code == NULL)
        p->code = secagg_round_check(co, p->site.name, blob, len, p->why, sizeof p->why);
    if (record_update(co, r->round_id, p->site.id, codec, p->meta, (int64_t)len, p->upload_ms, 0,
                      p->code, p->code ? p->why : NULL, &update_id, err) != 0) {
        log_error("rounds", "cannot record the update of %s: %s", p->site.name, err);
        if (p->code == NULL) {
            p->code = "internal";
            snprintf(p->why, sizeof p->why,
                     "the coordinator could not record the update; send it again");
        }
    } else if (p->code == NULL &&
               (p->code = secagg_round_add(co, p->site.name, blob, len, p->why, sizeof p->why))) {
        pthread_mutex_lock(&co->store_lock);
        store_update_reject(co->store, update_id, p->code, p->why, NULL);
        pthread_mutex_unlock(&co->store_lock);
    }
    if (p->code != NULL) {
        if (strcmp(p->code, "internal") != 0) {
            RoundSiteCount *now = rounds_site_count(r, p->site.id);
            if (now) now->refused++;
        }
        return;
    }
    RoundUpdate *u = &r->upd[r->n_reported];
    memset(u, 0, sizeof *u);
    u->weight = 1, u->norm = NAN; /* nothing of it is seen */
    u->train = p->meta->train_loss, u->eval = p->meta->eval_loss;
    u->start_eval = p->meta->start_eval_loss;
    snprintf(r->reported[r->n_reported++], 65, "%s", p->site.name);
    rounds_arrival(r, p->site.id, r->number, r->attempt, time_wall_ms() - r->opened_ms);
    char why[ERR_LEN];
    int moved = secagg_round_after_push(co, why, sizeof why);
    if (moved == 1) p->closing = rounds_close(co);
    if (moved < 0) rounds_fail(co, why);
}

/* `reading` and rounds.lock held: the round's decision. The checks, then
 * the store's row (an update the store cannot record is not applied), then
 * the sum; an accepted update joins the round's reports, a refused one
 * counts against its site; an update that makes every active site in
 * closes the round into p->closing. */
static void push_decide(Coordinator *co, Push *p) {
    Rounds *r = &co->rounds;
    char err[ERR_LEN];
    const uint8_t *blob = p->got.data;
    size_t len = p->got.length;
    int64_t round_id = r->round_id, update_id = 0;
    CodecParams sent;
    const char *codec = r->set.secagg                                    ? "secagg"
                        : codec_blob_params(blob, len, &sent, NULL) == 0 ? codec_params_name(&sent)
                                                                         : "?";
    p->code = precheck(r, &p->site, &p->got, p->meta, &p->staleness, p->why, sizeof p->why);
    if (r->set.secagg) {
        push_decide_masked(co, p, codec);
        return;
    }
    p->weight *= rounds_staleness_weight(p->staleness); /* an older update counts for less */
    if (r->set.dp) p->weight = 1; /* under DP every update counts alike (docs/privacy.md) */
    if (p->code == NULL && !r->set.keeps_updates)
        round_sum_inspect_add(&r->sum, blob, len, p->weight, r->pool, &p->g);
    if (p->code == NULL && round_sum_judge(&r->sum, p->weight, &p->g) != 0) {
        p->code = p->g.code;
        snprintf(p->why, sizeof p->why, "%s", p->g.why);
    }
    if (p->code == NULL && r->set.keeps_updates && !p->kept_here) {
        p->code = "internal";
        snprintf(p->why, sizeof p->why, "cannot keep the update for robust aggregation: %.200s",
                 p->keep_err);
    }
    if (record_update(co, round_id, p->site.id, codec, p->meta, (int64_t)len, p->upload_ms,
                      p->staleness, p->code, p->code ? p->why : NULL, &update_id, err) != 0) {
        log_error("rounds", "cannot record the update of %s: %s", p->site.name, err);
        if (p->code == NULL) {
            p->code = "internal";
            snprintf(p->why, sizeof p->why,
                     "the coordinator could not record the update; send it again");
        }
    } else if (p->code == NULL &&
               round_sum_apply(&r->sum, &p->g, p->weight, !r->set.keeps_updates, err) != 0) {
        /* a gated update fails to apply only for want of memory, before any change */
        p->code = "internal";
        snprintf(p->why, sizeof p->why, "the coordinator could not apply the update: %.200s", err);
        pthread_mutex_lock(&co->store_lock);
        store_update_reject(co->store, update_id, p->code, p->why, NULL);
        pthread_mutex_unlock(&co->store_lock);
    }
    if (p->code == NULL) {
        if (r->set.keeps_updates)
            snprintf(r->kept_owner[r->n_kept++], sizeof r->kept_owner[0], "%s", p->owner);
        RoundUpdate *u = &r->upd[r->n_reported];
        memset(u, 0, sizeof *u);
        u->weight = p->weight, u->norm = p->g.norm;
        u->train = p->meta->train_loss, u->eval = p->meta->eval_loss;
        u->start_eval = p->meta->start_eval_loss;
        if (!r->set.keeps_updates) {
            /* the mean keeps the update's map (its unlinked spool file) for a
             * close that must weigh or clip it again; the pages it read go */
            u->data = p->got.data, u->len = p->got.length, u->mapped = p->got.mapped;
            p->got.data = NULL, p->got.mapped = 0;
            if (u->mapped) madvise(u->data, u->mapped, MADV_DONTNEED);
        }
        snprintf(r->reported[r->n_reported++], 65, "%s", p->site.name);
        rounds_arrival(r, p->site.id, r->number, r->attempt, time_wall_ms() - r->opened_ms);
    } else if (strcmp(p->code, "internal") !=
               0) { /* the coordinator's failures are not the site's */
        RoundSiteCount *now = rounds_site_count(r, p->site.id);
        if (now) now->refused++;
    }
    /* early close: every active site is in, and never below quorum (a site
     * that reports before the others have joined must not make a round),
     * and none of them revoked since */
    if (p->code != NULL) return;
    int64_t active = rounds_active_sites(co); /* one read of the sites */
    if (r->quorum_ms == 0 && r->n_reported >= rounds_quorum_of(r, active))
        r->quorum_ms = time_wall_ms(); /* async rounds merge a grace window after it */
    if (r->n_reported >= active && r->n_reported >= rounds_quorum_of(r, active) &&
        !rounds_drop_revoked(co))
        p->closing = rounds_close(co);
}

/* No lock: the site hears, before the commit its update may have started. */
static void push_answer(NetCall *c, const Push *p) {
    size_t len = p->got.length;
    if (p->code == NULL) {
        if (p->staleness > 0)
            log_info("rounds",
                     "round %lld: update from %s accepted (%zu bytes; trained from round %llu's "
                     "model, weight x %.3f)",
                     (long long)(int64_t)(p->got.round + (uint64_t)p->staleness), p->site.name, len,
                     (unsigned long long)p->got.round, rounds_staleness_weight(p->staleness));
        else
            log_info("rounds", "round %llu: update from %s accepted (%zu bytes)",
                     (unsigned long long)p->got.round, p->site.name, len);
        net_upload_answer(c, p->got.upload_id, p->got.length, 1);
    } else {
        log_warn("rounds", "update from %s refused (%s): %s", p->site.name, p->code, p->why);
        net_call_status(
            c, strcmp(p->code, "internal") == 0 ? NET_UNAVAILABLE : NET_FAILED_PRECONDITION, "%s",
            p->why);
    }
}

static void h_push_update(NetCall *c, void *user) {
    Coordinator *co = user;
    Rounds *r = &co->rounds;
    Push push, *p = &push;
    memset(p, 0, sizeof *p);
    if (coordinator_authorize_site(co, c, &p->site) != 0) return;
    snprintf(p->owner, sizeof p->owner, "site-%lld", (long long)p->site.id);
    if (push_admit(co, c, p) != 0 || push_receive(co, c, p) != 0) return;
    if (r->set.async) push_wait_commit(r); /* the settings are fixed at start */
    pthread_mutex_lock(&r->reading);
    push_keep(r, p);
    rounds_lock(r);
    push_decide(co, p);
    pthread_mutex_unlock(&r->lock);
    if (p->kept_here && p->code != NULL) net_spool_drop(r->spool, p->owner, p->kept);
    round_gate_free(&p->g);
    net_received_drop_data(&p->got); /* read: its pages go, the fields push_answer reads stay */
    pthread_mutex_unlock(&r->reading);
    secagg_round_flush(r); /* answers a closed phase made */
    push_answer(c, p);
    if (p->meta) strait__update_meta__free_unpacked(p->meta, NULL);
    net_received_free(&p->got);
    if (p->closing) { /* the commit (files, hashes, the store) on this worker, outside the lock */
        net_call_end(c);
        rounds_commit(co, p->closing);
    }
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
    rounds_lock(r);
    resp.current_round = (uint64_t)r->number;
    resp.finished = r->state == ROUND_FINISHED;
    resp.reported = rounds_reported(r, site.name);
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
    rounds_lock(r);
    int reported = rounds_reported(r, site.name);
    /* a round reopened (a restart, no quorum) without this site's update
     * answers at once, so the site sends it again */
    int must_wait = (reported || r->number != after) && r->state != ROUND_FINISHED && !r->stop &&
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
            pthread_mutex_unlock(&r->lock); /* answered by rounds_answer_waiters */
            return;
        }
    }
    if (must_wait) { /* not parked: wait here */
        struct timespec until = time_after_ms(CLOCK_REALTIME, wait);
        while (r->state != ROUND_FINISHED && !r->stop && r->number <= after)
            if (pthread_cond_timedwait(&r->changed, &r->lock, &until) != 0) break;
    }
    Strait__WaitRoundResponse resp = STRAIT__WAIT_ROUND_RESPONSE__INIT;
    resp.current_round = (uint64_t)r->number;
    resp.finished = r->state == ROUND_FINISHED;
    resp.reported = rounds_reported(r, site.name);
    pthread_mutex_unlock(&r->lock);
    uint8_t buf[64];
    size_t n = strait__wait_round_response__pack(&resp, buf);
    net_call_send(c, buf, n);
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
                                         h_heartbeat, co, err) ||
                   net_server_add_method(srv, "/strait.Federation/SecAgg", NET_UNARY, 1, h_secagg,
                                         co, err)
               ? -1
               : 0;
}
