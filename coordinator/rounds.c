/*
 * rounds.c — the coordinator's round state machine (docs/design.md §1): a round
 * opens; the sites' updates (round_calls.c) fill its streaming weighted
 * sum; when every active site has reported — or min_sites have and the
 * deadline has passed — it closes, its successor is built and committed
 * outside the lock (publish.c), and the next round opens. The calls go on
 * being answered while a round commits: GetModel serves θ_r, WaitRound
 * waits, an update for the closing round is refused as stale.
 *
 * A round without quorum at its deadline is extended up to max_extensions
 * times, then failed (with its reason in the store) and reopened as the next
 * attempt. A coordinator that restarts resumes from the last committed
 * round's checkpoint (verified by the store) and the outer optimizer's state
 * saved beside it.
 *
 * A site is authenticated, never trusted (docs/design.md §6): its uploads live
 * in its own spool folder, its weight (tokens) is bounded by what a round
 * lets it train, its update must be in the federation's codec and pass the
 * gates from the first one on, and it is recorded in the store before it
 * touches the sum. A commit is all or nothing: the outer step is computed
 * into new buffers and published only once the store has committed.
 * WaitRound parks its call instead of holding a worker.
 *
 * The round's states (RoundState), and every move between them; each move
 * goes through round_state_set, which asserts it is one of these:
 *
 *                 start (all rounds done)
 *      NONE ───────────────────────────────────────────────┐
 *        │ open_round                                       │
 *        ▼          fail_round (no quorum, a revoked        │
 *   ┌─► OPEN ◄──┐   site, the next attempt)                 │
 *   │    │ │ └──┘                                           │
 *   │    │ └── fail_round, the privacy budget spent ────┐   │
 *   │    │ rounds_close        (distributed DP)         │   │
 *   │    ▼                                              ▼   ▼
 *   │ COMMITTING ─────── the last round committed ───► FINISHED
 *   │    │ the next round opened, or the commit failed
 *   └────┤ and the round reopened
 *        │
 *        ▼  open_round could not write the store (from NONE, OPEN or
 *   UNOPENED    COMMITTING): no update taken; the ticker retries every
 *    │  ▲ │     second, and a retry that fails again stays UNOPENED
 *    │  └─┘
 *    └────────► OPEN once the store takes it
 *
 * What each state implies is asserted at every move and whenever a handler
 * takes rounds.lock (rounds_assert_state, as SQLite's assert_pager_state):
 * OPEN has a store row and an allocated sum; COMMITTING's sum has moved
 * to the commit; FINISHED has run every round (or every round the privacy
 * budget allows: its total is lowered to them). What keeps a round from
 * opening is UNOPENED's alone: an optimizer state a failed commit lost
 * (state_lost) and a failed attempt the store has not recorded
 * (unrecorded) are set in no other state.
 *
 * Threading: handlers run on net/'s workers; everything in Rounds is under
 * rounds.lock, the store under store_lock (taken after rounds.lock), but for
 * what a commit reads outside the lock (publish.c says what and why). One
 * commit runs at a time: ROUND_COMMITTING. Parked calls are answered
 * outside rounds.lock.
 */
#include <assert.h>
#include <malloc.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "coordinator_internal.h"
#include "privacy/privacy.h"
#include "schema/strait.pb-c.h"
#include "security/security.h"
#include "util/util.h"

int rounds_move_legal(RoundState from, RoundState to) {
    switch (to) {
    case ROUND_OPEN:
        return from == ROUND_NONE || from == ROUND_OPEN || from == ROUND_COMMITTING ||
               from == ROUND_UNOPENED;
    case ROUND_COMMITTING:
        return from == ROUND_OPEN;
    case ROUND_UNOPENED:
        return from != ROUND_FINISHED;
    case ROUND_FINISHED: /* from OPEN: a privacy budget spent by failed attempts */
        return from == ROUND_NONE || from == ROUND_COMMITTING || from == ROUND_OPEN;
    case ROUND_NONE:
        break;
    }
    return 0;
}

void rounds_assert_state(const Rounds *r) {
    assert(r->n_kept >= 0 && r->n_kept <= r->n_reported && r->n_reported <= r->cap_reports);
    /* what keeps a round from opening is UNOPENED's alone */
    assert(r->state == ROUND_UNOPENED || (!r->state_lost && r->unrecorded.id == 0));
    switch (r->state) {
    case ROUND_NONE:
        assert(r->n_reported == 0);
        break;
    case ROUND_OPEN:
        assert(r->round_id > 0 && r->number < r->set.total);
        assert(r->sum.sum != NULL && r->sum.n == r->model.n_params);
        break;
    case ROUND_COMMITTING:
        assert(r->round_id > 0 && r->sum.sum == NULL && r->sum.stage == NULL);
        break;
    case ROUND_UNOPENED:
        assert(r->reopen_at_ms > 0);
        break;
    case ROUND_FINISHED:
        assert(r->number >= r->set.total);
        break;
    }
    (void)r;
}

void rounds_lock(Rounds *r) {
    pthread_mutex_lock(&r->lock);
    rounds_assert_state(r);
}

/* Every move of the round's state; under r->lock. */
static void round_state_set(Rounds *r, RoundState to) {
    assert(rounds_move_legal(r->state, to));
    r->state = to;
    rounds_assert_state(r);
}

void round_updates_free(RoundUpdate *u, int n) {
    for (int i = 0; i < n; i++) {
        if (u[i].mapped)
            munmap(u[i].data, u[i].mapped);
        else
            free(u[i].data);
        u[i].data = NULL, u[i].mapped = 0;
    }
}

/* The refusals of the open round that got no row, added to its record.
 * Under r->lock. */
static void flush_refusals(Coordinator *co) {
    Rounds *r = &co->rounds;
    if (r->refusals_unrecorded == 0 || r->round_id <= 0) return;
    pthread_mutex_lock(&co->store_lock);
    if (store_round_refusals_unrecorded(co->store, r->round_id, r->refusals_unrecorded, NULL) == 0)
        r->refusals_unrecorded = 0;
    pthread_mutex_unlock(&co->store_lock);
}

/* The absolute norm bound of the next round: max_update_ratio × ‖θ‖ at the
 * start (not the current ‖θ‖, which an attack that got through would have
 * grown), and once a round with a quorum has committed, norm_bound × the
 * median of recent rounds' median accepted norms, whichever is lower. */
static double norm_bound(const Rounds *r) {
    double bound = r->set.max_update_ratio > 0 ? r->set.max_update_ratio * r->theta0_norm : 0;
    if (r->set.norm_bound > 0 && r->n_history > 0) {
        double h = r->set.norm_bound * round_median(r->norm_history, r->n_history, 0);
        if (h > 0 && (bound == 0 || h < bound)) bound = h;
    }
    return bound;
}

/* The arrivals of the last ARRIVAL_HISTORY committed rounds, from the
 * store (an accepted update's receipt after its round attempt opened, as
 * rounds_arrival took it live): a restarted coordinator keeps its adaptive
 * deadline rather than wait out the configured one for a site cut off just
 * after the restart, and knows who was in the round before. */
static void arrivals_restore(Coordinator *co) {
    StoreRound *rs = NULL;
    size_t n = 0;
    char err[ERR_LEN];
    if (store_rounds_list(co->store, 4 * ARRIVAL_HISTORY, 0, &rs, &n, err) != 0) {
        log_warn("rounds", "the adaptive deadline starts without the rounds before: %s", err);
        return;
    }
    size_t pick[ARRIVAL_HISTORY];
    int k = 0;
    for (size_t i = 0; i < n && k < ARRIVAL_HISTORY; i++) /* newest first */
        if (strcmp(rs[i].state, "committed") == 0) pick[k++] = i;
    for (int j = k - 1; j >= 0; j--) { /* oldest first, as they came */
        const StoreRound *sr = &rs[pick[j]];
        StoreUpdate *u = NULL;
        size_t m = 0;
        if (store_updates_list(co->store, sr->id, &u, &m, err) != 0) {
            log_warn("rounds", "the adaptive deadline starts without round %lld: %s",
                     (long long)sr->number, err);
            continue;
        }
        for (size_t i = 0; i < m; i++)
            if (strcmp(u[i].state, "accepted") == 0)
                rounds_arrival(&co->rounds, u[i].site_id, sr->number, sr->attempt,
                               u[i].received_at - sr->opened_at);
        free(u);
    }
    free(rs);
}

int64_t rounds_quorum(Coordinator *co) {
    return co->rounds.set.min_sites > 0 ? co->rounds.set.min_sites
                                        : rounds_quorum_of(&co->rounds, rounds_active_sites(co));
}

/* Opens round r->number (its store row, an empty sum); r->bytes_down goes
 * on counting from what the last record left of it. An attempt whose
 * failure the store has not taken yet is recorded first. When the store
 * cannot (busy, full, failing), the round stays closed and unopened: no
 * update is taken, and the ticker tries again every second. Under r->lock. */
static int open_round(Coordinator *co, char *err) {
    Rounds *r = &co->rounds;
    /* a round stepped from an optimizer state a failed commit left would
     * not be the round it claims to be */
    if (r->state_lost) {
        if (round_state_restore(co, err) != 0) { /* unopened, and retried, as below */
            r->reopen_at_ms = time_wall_ms() + 1000;
            round_state_set(r, ROUND_UNOPENED);
            return -1;
        }
        r->state_lost = 0;
        log_info("rounds",
                 "the outer optimizer's state is read back from the last committed round");
    }
    RoundSum sum;
    int64_t now = time_wall_ms();
    /* under differential privacy no site's update is judged against the
     * others' (the fixed clip bounds each) */
    int rc =
        round_sum_init(&sum, r->model.n_params, r->model.table_hash, r->set.dp ? 0 : 10.0, err);
    flush_refusals(co); /* the attempt that ends: its own */
    if (rc == 0) {
        pthread_mutex_lock(&co->store_lock);
        if (r->unrecorded.id > 0 &&
            (rc = store_round_fail(co->store, r->unrecorded.id, r->unrecorded.reason,
                                   r->unrecorded.bytes_down, now, err)) == 0)
            r->unrecorded.id = 0;
        if (rc == 0) rc = store_round_open(co->store, r->number, now, &r->round_id, err);
        StoreRound opened; /* which attempt it is; unknown: not the first */
        r->attempt = rc == 0 && store_round_get(co->store, r->number, &opened, NULL) == 0
                         ? opened.attempt
                         : 2;
        pthread_mutex_unlock(&co->store_lock);
        if (rc != 0) round_sum_free(&sum);
    }
    if (rc != 0) {
        r->reopen_at_ms = now + 1000;
        round_state_set(r, ROUND_UNOPENED);
        return -1;
    }
    r->opened_ms = time_wall_ms();
    r->quorum_ms = 0;
    r->extensions = 0;
    /* from the rounds before: fixed for the round (its own arrivals count
     * from the next one on) */
    r->pace_ms = rounds_pace(r);
    r->adaptive_ms = r->set.adaptive_deadline ? rounds_adaptive_deadline(r) : 0;
    round_drop_kept(r, r->number, r->kept_owner, r->n_kept);
    r->n_kept = 0;
    round_updates_free(r->upd, r->n_reported);
    r->n_reported = 0;
    r->n_counts = 0;
    r->refusals_unrecorded = 0;
    round_sum_free(&r->sum);
    r->sum = sum;
    r->sum.stage = r->spare_stage, r->spare_stage = NULL;
    /* under DP the fixed clip bounds every update: a refusal for its norm
     * would say something of a site's data */
    r->sum.max_norm = r->set.dp ? 0 : norm_bound(r);
    round_state_set(r, ROUND_OPEN);
    char why[160]; /* a new attempt: secure aggregation's phases start again, with new keys */
    snprintf(why, sizeof why, "attempt over: round %lld opened again", (long long)r->number);
    secagg_round_reset(r, why);
    log_info("rounds", "round %lld open", (long long)r->number);
    return 0;
}

/* Fails the open (or closing) round with its reason and opens the next
 * attempt of the same round (the sites send their updates again). Under
 * r->lock. */
static void fail_round(Coordinator *co, const char *reason) {
    Rounds *r = &co->rounds;
    char err[ERR_LEN];
    pthread_mutex_lock(&co->store_lock);
    if (store_round_fail(co->store, r->round_id, reason, r->bytes_down, time_wall_ms(), err) != 0) {
        log_error("rounds", "cannot record round %lld as failed: %s (recorded before it reopens)",
                  (long long)r->number, err);
        r->unrecorded.id = r->round_id, r->unrecorded.bytes_down = r->bytes_down;
        snprintf(r->unrecorded.reason, sizeof r->unrecorded.reason, "%s", reason);
    }
    pthread_mutex_unlock(&co->store_lock);
    log_warn("rounds", "round %lld failed (%s); reopening", (long long)r->number, reason);
    r->bytes_down = 0; /* recorded with the failed attempt */
    /* its secure aggregation's calls told now, whether the next opens or not */
    secagg_round_reset(r, "attempt over: the attempt failed");
    if (r->dp_spent) { /* no sum of this round fits the privacy budget: the federation ends */
        round_sum_free(&r->sum);
        r->set.total = r->number;
        round_state_set(r, ROUND_FINISHED);
        log_warn("privacy",
                 "the federation finishes after %lld rounds: [privacy] epsilon_budget %g is "
                 "spent (failed attempts' sums counted)",
                 (long long)r->number, r->set.dp_budget);
        pthread_cond_broadcast(&r->changed);
        return;
    }
    if (open_round(co, err) != 0)
        log_error("rounds", "cannot reopen round %lld: %s; trying again every second",
                  (long long)r->number, err);
    pthread_cond_broadcast(&r->changed);
}

void rounds_fail(Coordinator *co, const char *reason) {
    fail_round(co, reason);
}

RoundClosing *rounds_close(Coordinator *co) {
    Rounds *r = &co->rounds;
    if (r->state != ROUND_OPEN) return NULL;
    size_t n = (size_t)(r->n_reported ? r->n_reported : 1);
    RoundClosing *c = calloc(1, sizeof *c);
    double *evals = malloc(2 * n * sizeof *evals), *norms = evals ? evals + n : NULL;
    if (c) {
        c->kept_owner = malloc(n * sizeof c->kept_owner[0]);
        c->upd = malloc(n * sizeof c->upd[0]);
        c->site = malloc(n * sizeof c->site[0]);
    }
    if (c == NULL || evals == NULL || !c->kept_owner || !c->upd || !c->site) {
        if (c) free(c->kept_owner), free(c->upd), free(c->site);
        free(c), free(evals);
        fail_round(co, "out of memory closing the round");
        return NULL;
    }
    c->number = r->number;
    c->round_id = r->round_id;
    c->sum = r->sum; /* moved: the round takes no update from here on */
    if (r->set.dp_distributed && secagg_round_noise(r, &c->dp_mu, &c->dp_l1, &c->dp_l2) != 0) {
        free(c->kept_owner), free(c->upd), free(c->site), free(c), free(evals);
        fail_round(co, "distributed DP: the round closed with no unmasked sum to account");
        return NULL;
    }
    free(r->spare_stage); /* its stage (pages mapped) goes to the next round */
    r->spare_stage = c->sum.stage, c->sum.stage = NULL;
    memset(&r->sum, 0, sizeof r->sum);
    assert(r->n_kept <= r->n_reported && r->n_reported <= r->cap_reports);
    memcpy(c->kept_owner, r->kept_owner, sizeof c->kept_owner[0] * (size_t)r->n_kept);
    c->n_kept = r->n_kept;
    r->n_kept = 0;
    c->n_reported = r->n_reported;
    /* reported losses are claims: the round shows their median */
    int n_evals = 0;
    for (int i = 0; i < r->n_reported; i++) {
        if (isfinite(r->upd[i].eval)) evals[n_evals++] = r->upd[i].eval;
        norms[i] = r->upd[i].norm;
    }
    c->eval = round_median(evals, n_evals, 0);
    c->median_norm = round_median(norms, r->n_reported, 1);
    free(evals);
    c->quorum = r->n_reported >= rounds_quorum(co);
    c->no_history = r->n_history == 0;
    memcpy(c->upd, r->upd, sizeof c->upd[0] * (size_t)r->n_reported); /* the maps move too */
    memcpy(c->site, r->reported, sizeof c->site[0] * (size_t)r->n_reported);
    /* the updates are the commit's now; the names stay for WaitRound's answers */
    memset(r->upd, 0, sizeof r->upd[0] * (size_t)c->n_reported);
    flush_refusals(co);
    round_state_set(r, ROUND_COMMITTING);
    return c;
}

/* Flags the reports far from the others': a site that says its update
 * made the model much better, or worse, than every other site saw. Only
 * with three reports or more (two cannot say which one is off). */
static void flag_disputed_losses(Coordinator *co, const RoundClosing *c) {
    if (!isfinite(c->eval)) return;
    int n = 0;
    for (int i = 0; i < c->n_reported; i++) n += isfinite(c->upd[i].eval);
    if (n < 3) return;
    double tol = fmax(0.5, 0.25 * c->eval);
    for (int i = 0; i < c->n_reported; i++) {
        double e = c->upd[i].eval;
        if (!isfinite(e) || fabs(e - c->eval) <= tol) continue;
        char detail[200];
        snprintf(detail, sizeof detail,
                 "round %lld: reported eval loss %.4f, the round's median %.4f",
                 (long long)c->number, e, c->eval);
        log_warn("rounds", "site %s's loss report disagrees with the others: %s", c->site[i],
                 detail);
        pthread_mutex_lock(&co->store_lock);
        store_event_add(co->store, c->site[i], "update.loss_disputed", detail, time_wall_ms(),
                        NULL);
        pthread_mutex_unlock(&co->store_lock);
    }
}

int rounds_drop_revoked(Coordinator *co) {
    Rounds *r = &co->rounds;
    if (r->state != ROUND_OPEN || r->n_reported == 0) return 0;
    const char *gone = NULL;
    pthread_mutex_lock(&co->store_lock);
    for (int i = 0; i < r->n_reported && !gone; i++) {
        StoreSite s;
        if (store_site_get(co->store, r->reported[i], &s, NULL) == 0 &&
            strcmp(s.state, "active") != 0)
            gone = r->reported[i];
    }
    pthread_mutex_unlock(&co->store_lock);
    if (gone == NULL) return 0;
    char reason[200];
    snprintf(reason, sizeof reason,
             "site %s was revoked with an update in the round; it reopens without it", gone);
    fail_round(co, reason); /* the others send theirs again: the same bytes */
    return 1;
}

void rounds_commit(Coordinator *co, RoundClosing *c) {
    Rounds *r = &co->rounds;
    RoundNext nx;
    char err[ERR_LEN];
    /* the inspections' buffers go before the commit, not after it: the
     * last update's decoded sections are a model's size of fp32 (an idle
     * coordinator holds none; the next round's first update pays them
     * again) */
    pthread_mutex_lock(&r->reading);
    CodecChecked *fresh = codec_checked_new();
    if (fresh) codec_checked_free(r->pool), r->pool = fresh;
    pthread_mutex_unlock(&r->reading);
    uint64_t t0 = time_monotonic_ns();
    int rc = round_next_build(co, c, &nx, err);
    double took = (double)(time_monotonic_ns() - t0) / 1e9;
    rounds_lock(r);
    if (rc == 0) { /* committed: publish, nothing below can fail */
        round_next_install(co, &nx);
        if (c->quorum && c->median_norm > 0) { /* the bound follows the honest rounds */
            if (r->n_history == NORM_HISTORY)
                memmove(r->norm_history, r->norm_history + 1,
                        sizeof r->norm_history[0] * (NORM_HISTORY - 1)),
                    r->n_history--;
            r->norm_history[r->n_history++] = c->median_norm;
        }
        r->last_commit_s = took;
        log_info("rounds", "round %lld committed in %.2f s: %d sites, eval loss %.4f",
                 (long long)c->number, took, c->n_reported, c->eval);
        if (r->set.dp)
            log_info("privacy", "round %lld: epsilon %.4g at delta %g", (long long)c->number,
                     privacy_account_epsilon(&r->dp_account, r->set.dp_delta, NULL),
                     r->set.dp_delta);
        r->number++;
        if (r->number >= r->set.total) {
            round_state_set(r, ROUND_FINISHED);
            log_info("rounds", "federation finished after %lld rounds", (long long)r->set.total);
        } else if (open_round(co, err) != 0) { /* the install left what the commit did not record */
            log_error("rounds", "cannot open round %lld: %s; trying again every second",
                      (long long)r->number, err);
        }
        pthread_cond_broadcast(&r->changed);
    } else { /* the round fails, θ and the state are what they were */
        log_error("rounds", "commit failed: %s", err);
        r->state_lost = nx.state_lost; /* no round opens until it is read back */
        char reason[ERR_LEN + 32];
        snprintf(reason, sizeof reason, "commit failed: %s", err);
        fail_round(co, reason);
    }
    pthread_mutex_unlock(&r->lock);
    round_next_free(&nx);
    if (rc == 0) flag_disputed_losses(co, c);
    if (rc == 0) round_retain(co); /* the files the policy no longer keeps, and the disk */
    round_drop_kept(r, c->number, c->kept_owner, c->n_kept);
    round_updates_free(c->upd, c->n_reported);
    round_sum_free(&c->sum);
    int64_t number = c->number;
    free(c->kept_owner), free(c->upd), free(c->site);
    free(c);
    secagg_round_flush(r); /* a new attempt's resets */
    rounds_answer_waiters(co, 0);
    /* after the waiters: the record's sync is nobody's wait */
    if (rc == 0 && co->events) metrics_tensorboard(co, number);
}

int64_t rounds_active_sites(Coordinator *co) {
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
void rounds_answer_waiters(Coordinator *co, int all) {
    Rounds *r = &co->rounds;
    rounds_lock(r);
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
        if (!(all || r->state == ROUND_FINISHED || r->stop || r->number > w->after_round ||
              now >= w->expires_ms || net_call_cancelled(w->call, 0))) {
            i++;
            continue;
        }
        Strait__WaitRoundResponse wr = STRAIT__WAIT_ROUND_RESPONSE__INIT;
        wr.current_round = (uint64_t)r->number;
        wr.finished = r->state == ROUND_FINISHED;
        wr.reported = rounds_reported(r, w->site);
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
    rounds_lock(r);
    r->stop = 1; /* no new parking; the ticker ends too */
    pthread_cond_broadcast(&r->changed);
    pthread_mutex_unlock(&r->lock);
    if (r->ticker) pthread_join(r->ticker, NULL); /* it uses the server: done before it stops */
    r->ticker = 0;
    rounds_answer_waiters(co, 1);
    rounds_lock(r);
    secagg_round_reset(r, "the coordinator is stopping; try again when it is back");
    pthread_mutex_unlock(&r->lock);
    secagg_round_flush(r);
}

/* Calls in flight of certificates revoked since (by the Admin API or by
 * `strait site revoke` on the store) are cancelled within a second. */
static void cancel_revoked(Coordinator *co) {
    rounds_lock(&co->rounds);
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
        int retired = rc == 0 && cert.revoked_at != 0 && cert.revoked_at <= time_wall_ms();
        if (rc == 0 && (strcmp(site.state, "active") != 0 || retired)) {
            /* the reason its later calls are refused with, too */
            char why[200];
            if (strcmp(site.state, "active") != 0)
                snprintf(why, sizeof why, "site %s is revoked", site.name);
            else
                snprintf(why, sizeof why,
                         "certificate %.16s… of site %s was replaced by a renewal; use the "
                         "site's newest (strait site run loads it when it starts)",
                         peers[i], site.name);
            int k = net_server_cancel_peer(srv, peers[i], why);
            log_warn("rounds", "site %s is revoked: %d call%s in flight cancelled", site.name, k,
                     k == 1 ? "" : "s");
        }
    }
    free(peers); /* NULL when n is -1 */
}

/* With a quorum in, a round does not wait for a site that is away or late
 * (rounds_site_wait). 1 when the quorum is in and every active site not in
 * is away or late (the first few in `names`, each with why; the late ones
 * in `late`, one a line, for the store), 0 otherwise. *next: when the
 * first site still waited for falls due (0: none), for the ticker to look
 * again then rather than up to a second after. One read of the sites;
 * under r->lock. */
static int rest_away(Coordinator *co, int64_t now, char *names, size_t cap, char *late,
                     size_t late_cap, int64_t *next) {
    Rounds *r = &co->rounds;
    StoreSite *sites;
    size_t n = 0;
    *next = 0;
    pthread_mutex_lock(&co->store_lock);
    int rc = store_site_list(co->store, &sites, &n, NULL);
    pthread_mutex_unlock(&co->store_lock);
    if (rc != 0) return 0;
    int64_t active = 0;
    int away = 0, waiting = 0;
    size_t len = 0, late_len = 0;
    names[0] = late[0] = '\0';
    for (size_t i = 0; i < n; i++) {
        if (strcmp(sites[i].state, "active") != 0) continue;
        active++;
        if (rounds_reported(r, sites[i].name)) continue;
        int64_t due;
        SiteWait w = rounds_site_wait(r, &sites[i], now, &due);
        if (w == SITE_WAITED) {
            waiting = 1;
            if (due > 0 && (*next == 0 || r->opened_ms + due < *next)) *next = r->opened_ms + due;
            continue;
        }
        if (w == SITE_LATE && late_len + 100 < late_cap)
            late_len += (size_t)snprintf(late + late_len, late_cap - late_len, "%s%s (past %.1f s)",
                                         late_len ? "\n" : "", sites[i].name, due / 1e3);
        if (away++ < 4 && len + 130 < cap) {
            int paced = due == rounds_pace_due(r); /* by the quorum's arrival, not its own */
            if (w == SITE_LATE)
                len +=
                    (size_t)snprintf(names + len, cap - len,
                                     "%s%s late (past %.1f s: %s usual arrival and %s again)",
                                     away > 1 ? "; " : "", sites[i].name, due / 1e3,
                                     paced ? "the quorum's" : "its", paced ? "a quarter" : "half");
            else
                len +=
                    (size_t)snprintf(names + len, cap - len,
                                     "%s%s away (no update in round %lld, no call since this "
                                     "round opened)",
                                     away > 1 ? "; " : "", sites[i].name, (long long)r->number - 1);
        }
    }
    free(sites);
    return !waiting && away > 0 && r->n_reported >= rounds_quorum_of(r, active);
}

/* The deadline: every 200 ms, close, extend or fail the open round; answer
 * the WaitRounds that can be; once a second, end a revoked site's calls. */
static void *ticker_main(void *arg) {
    Coordinator *co = arg;
    Rounds *r = &co->rounds;
    for (;;) {
        usleep(200000);
        rounds_lock(r);
        if (r->stop) {
            pthread_mutex_unlock(&r->lock);
            return NULL;
        }
        int64_t now = time_wall_ms();
        RoundClosing *closing = NULL;
        if (r->state == ROUND_UNOPENED && now >= r->reopen_at_ms) {
            char err[ERR_LEN];
            if (open_round(co, err) == 0) {
                log_info("rounds", "round %lld opened after the store came back",
                         (long long)r->number);
                pthread_cond_broadcast(&r->changed);
            } else if (now >= r->reopen_logged_ms) {
                log_error("rounds", "round %lld still cannot open: %s", (long long)r->number, err);
                r->reopen_logged_ms = now + 30000; /* a line every 30 s while it lasts */
            }
        }
        int check = now >= r->revocation_check_ms;
        if (check) { /* a revoked site's update leaves the open round */
            if (now / 10000 != r->revocation_check_ms / 10000)
                malloc_trim(0); /* what a flood of connections freed goes back, every 10 s */
            r->revocation_check_ms = now + 1000;
            rounds_drop_revoked(co);
            flush_refusals(co);
        }
        /* the adaptive deadline: with a quorum in, once twice the quorum's
         * usual arrival has passed (never later than the deadline) */
        int64_t due = r->opened_ms + r->set.deadline_ms * (r->extensions + 1);
        int64_t adaptive = r->extensions == 0 && r->n_reported > 0 ? r->adaptive_ms : 0;
        /* under secure aggregation its phases close the round, or fail it */
        int sa = r->sa != NULL && r->state == ROUND_OPEN;
        if (sa) {
            char why[ERR_LEN];
            int moved = secagg_round_tick(co, now, why, sizeof why);
            if (moved == 1) closing = rounds_close(co);
            if (moved < 0) fail_round(co, why);
        }
        int early = !sa && adaptive > 0 && r->opened_ms + adaptive < due &&
                    now >= r->opened_ms + adaptive && r->state == ROUND_OPEN &&
                    r->sum.accepted > 0 && r->n_reported >= rounds_quorum(co);
        if (early)
            log_info(
                "rounds",
                "round %lld: closing with %d updates at the adaptive deadline of %.1f s (twice "
                "the quorum's usual arrival; [rounds] deadline %.1f s)",
                (long long)r->number, r->n_reported, adaptive / 1e3, r->set.deadline_ms / 1e3);
        /* async: once the quorum is in, a grace window of `grace` × the
         * time it took, for the updates a moment behind it */
        int merge = 0;
        if (!sa && r->set.async && r->state == ROUND_OPEN && r->sum.accepted > 0 &&
            r->quorum_ms > 0) {
            int64_t took = r->quorum_ms - r->opened_ms;
            merge = now >= r->quorum_ms + (int64_t)(r->set.grace * (double)(took > 0 ? took : 0));
            /* the quorum may have grown since (more active sites): wait for
             * it again rather than extend the round at every tick */
            if (merge && r->n_reported < rounds_quorum(co)) merge = 0, r->quorum_ms = 0;
            if (merge && !early && now < due)
                log_info("rounds",
                         "round %lld: merging %d updates, %.1f s after its quorum was in "
                         "(async; grace %g x %.1f s)",
                         (long long)r->number, r->n_reported, (now - r->quorum_ms) / 1e3,
                         r->set.grace, took / 1e3);
        }
        /* sites away or late: looked for once a second with a quorum in,
         * from round 1 on (round 0 waits for every site's start-up) */
        int away = 0;
        if (!sa && r->set.adaptive_deadline && r->state == ROUND_OPEN && !early && !merge &&
            now < due && r->number > 0 && r->sum.accepted > 0 && now >= r->away_check_ms) {
            char names[700], late[sizeof((StoreRound *)0)->late];
            int64_t next;
            away = rest_away(co, now, names, sizeof names, late, sizeof late, &next);
            r->away_check_ms = next > now && next < now + 1000 ? next : now + 1000;
            if (away)
                log_info("rounds", "round %lld: closing with %d updates; %s", (long long)r->number,
                         r->n_reported, names);
            if (away && late[0]) { /* named in `strait rounds` */
                char err[ERR_LEN];
                pthread_mutex_lock(&co->store_lock);
                if (store_round_late(co->store, r->round_id, late, err) != 0)
                    log_warn("rounds", "round %lld: %s", (long long)r->number, err);
                pthread_mutex_unlock(&co->store_lock);
            }
        }
        if (!sa && r->state == ROUND_OPEN && (early || merge || away || now >= due)) {
            int64_t quorum = rounds_quorum(co);
            if (r->n_reported >= quorum && r->sum.accepted > 0) {
                if (!rounds_drop_revoked(co)) closing = rounds_close(co);
            } else if (r->extensions < r->set.max_extensions) {
                r->extensions++;
                log_warn("rounds",
                         "round %lld: %d of %lld sites by the deadline; extended (%d/%lld)",
                         (long long)r->number, r->n_reported, (long long)quorum, r->extensions,
                         (long long)r->set.max_extensions);
            } else {
                char reason[160];
                snprintf(reason, sizeof reason, "no quorum: %d of %lld sites after %d extensions",
                         r->n_reported, (long long)quorum, r->extensions);
                fail_round(co, reason);
            }
        }
        pthread_mutex_unlock(&r->lock);
        secagg_round_flush(r);
        if (closing) rounds_commit(co, closing); /* answers the waiters it can */
        rounds_answer_waiters(co, 0);
        if (check) cancel_revoked(co);
    }
}

/* ---- lifecycle ------------------------------------------------------------------- */

void rounds_describe(Coordinator *co, Strait__HelloResponse *hr, uint8_t model_sha[32]) {
    Rounds *r = &co->rounds;
    rounds_lock(r);
    hr->current_round = (uint64_t)r->number;
    hr->total_rounds = (uint64_t)r->set.total;
    hr->table_hash = r->model.table_hash;
    hr->inner_steps = (uint32_t)r->set.inner_steps;
    hr->round_budget_ms = (uint64_t)r->set.budget_ms;
    hr->finished = r->state == ROUND_FINISHED;
    hr->overlap = r->set.overlap;
    hr->lookahead = (float)rounds_lookahead(&r->set);
    hr->staleness = (uint32_t)r->set.staleness;
    hr->secure_aggregation = r->set.secagg;
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

/* A robust rule that cannot protect at the round sizes configured says so
 * at start, in one line: two updates have no median but their mean, and a
 * trim of 0 removes nothing. */
static void warn_weak_rule(Coordinator *co) {
    Rounds *r = &co->rounds;
    if (!r->set.keeps_updates) return;
    int64_t n = rounds_quorum(co);
    const char *rule = aggregate_rule_name(r->set.rule);
    if (aggregate_rule_trims(r->set.rule) && aggregate_trim_count(r->set.trim, (int)n) == 0)
        log_warn("rounds",
                 "aggregate = %s with trim = %g removes no update from a round of %lld "
                 "(min_sites): such a round is a plain mean; raise min_sites to 3 or more",
                 rule, r->set.trim, (long long)n);
    else if (n < 3)
        log_warn("rounds",
                 "aggregate = %s over a round of %lld update%s (min_sites) is their mean; it "
                 "protects from one bad site with 3 or more: raise min_sites",
                 rule, (long long)n, n == 1 ? "" : "s");
}

static int earlier_model_sha(Coordinator *co, Model *scratch, int64_t round, uint8_t sha[32]);
static int privacy_start(Coordinator *co, char *err);

static int start(Coordinator *co, const RoundsSettings *set, char *err) {
    Rounds *r = &co->rounds;
    pthread_mutex_init(&r->lock, NULL);
    pthread_mutex_init(&r->reading, NULL);
    if ((r->pool = codec_checked_new()) == NULL) return err_set(err, "out of memory");
    pthread_cond_init(&r->changed, NULL);
    r->delta_from = -1;
    r->set = *set;
    r->max_tokens = set->inner_steps * set->batch * set->seq;
    if (model_build(&r->model, &co->model_cfg, (uint64_t)set->seed, err) != 0) return -1;
    /* a pretrained start replaces the seeded draw (a resume replaces both) */
    if (co->model_init[0] && model_load(&r->model, co->model_init, NULL, err) != 0) return -1;
    if (outer_init(&r->outer, set->outer, r->model.n_params, (float)set->outer_lr,
                   (float)set->momentum, err) != 0)
        return -1;
    r->outer.eps = (float)set->adam_eps;
    if (!set->downlink_lossless &&
        ef_init(&r->down_ef, r->model.n_params, r->model.table_hash, 1.0f, err) != 0)
        return -1;
    CodecLayout layout = {r->model.table_hash, r->model.n_params, NULL, 0};
    r->max_update_bytes = set->secagg ? secagg_masked_len(r->model.n_params, 32)
                                      : codec_blob_max_len(&r->set.uplink, &layout);
    if (r->max_update_bytes == 0) return err_set(err, "cannot size the federation's updates");
    if (secagg_round_init(r, err) != 0) return -1;
    uint64_t per_site =
        set->spool_site_bytes > 0 ? (uint64_t)set->spool_site_bytes : 3 * r->max_update_bytes;
    char dir[1200];
    snprintf(dir, sizeof dir, "%s/spool", co->dir);
    r->spool = net_spool_open(dir, (uint64_t)set->spool_bytes, per_site, 24LL * 3600 * 1000, err);
    if (r->spool == NULL) return -1;
    net_spool_drop_all_kept(r->spool); /* a round's kept updates do not outlive the process */
    /* θ_0 (seeded, or pretrained), before a resume replaces it: a base
     * that overlap and async rounds may still take */
    uint8_t theta0_sha[32];
    int64_t back = set->async ? set->staleness : set->overlap ? 1 : 0;
    if (back > 0) security_sha256(r->model.params, r->model.n_params * 4, theta0_sha);
    /* resume from the last committed round, or start from the seeded model */
    StoreRound last;
    int rc = store_resume_point(co->store, co->dir, &last, err);
    if (rc < 0) return -1;
    if (rc == 0) {
        char path[1600];
        snprintf(path, sizeof path, "%s/%s", co->dir, last.checkpoint_path);
        if (model_load(&r->model, path, NULL, err) != 0) return -1;
        r->number = last.number + 1;
        int outer = round_outer_load(co, &last, err);
        if (outer < 0) return -1;
        log_info("rounds", "resuming after round %lld (checkpoint %s verified%s)",
                 (long long)last.number, last.checkpoint_path,
                 outer ? ", outer optimizer state restored" : "");
        arrivals_restore(co);
    }
    if (privacy_start(co, err) != 0) return -1;
    char initial[64];
    snprintf(initial, sizeof initial, "%s/current.safetensors", STORE_CHECKPOINT_DIR);
    if (round_publish_model(co, initial, err) != 0) return -1;
    r->theta_norm = round_l2_norm(r->model.params, r->model.n_params);
    r->theta0_norm = r->theta_norm;
    r->last_commit_s = NAN;
    security_sha256(r->model.params, r->model.n_params * 4, r->theta_sha);
    for (int i = 0; i < MODEL_HISTORY; i++) r->hist_round[i] = -1;
    rounds_history_add(r, r->number, r->theta_sha);
    /* the models updates may still be trained from: the round before's
     * with overlap, `staleness` rounds back with async rounds */
    Model scratch = {0}; /* built once, for the checkpoints read back */
    /* a delta from the round before's model, rebuilt from its checkpoint:
     * the sites that hold it take that, not the whole model (round 0's
     * model is the seeded or pretrained one, not kept) */
    uint8_t prev_sha[32];
    int have_prev = 0;
    if (rc == 0 && r->number >= 2 &&
        earlier_model_sha(co, &scratch, r->number - 1, prev_sha) == 0) {
        round_delta_restore(co, scratch.params, prev_sha, r->number - 1);
        have_prev = 1;
    }
    for (int64_t k = 1; rc == 0 && k <= back && r->number - k >= 0; k++) {
        uint8_t sha[32];
        if (r->number - k == 0)
            memcpy(sha, theta0_sha, 32);
        else if (k == 1 && have_prev)
            memcpy(sha, prev_sha, 32);
        else if (earlier_model_sha(co, &scratch, r->number - k, sha) != 0)
            break;
        rounds_history_add(r, r->number - k, sha);
    }
    if (scratch.params) model_free(&scratch);
    /* the policy as it stands now (it may have been lowered), and the
     * disk's room, before the first round of this process */
    r->commit_bytes = round_commit_estimate(r);
    round_retain(co);
    if (r->number >= r->set.total) {
        round_state_set(r, ROUND_FINISHED);
    } else if (open_round(co, err) != 0) {
        return -1;
    }
    warn_weak_rule(co);
    pthread_create(&r->ticker, NULL, ticker_main, co);
    return 0;
}

/* SHA-256 of the parameters of round `round`'s model (round > 0), read
 * from the checkpoint of the round before into scratch (built on first
 * use): what updates trained before a restart name as their base; -1 when
 * it is not at hand (its checkpoint gone), said in one line. */
static int earlier_model_sha(Coordinator *co, Model *scratch, int64_t round, uint8_t sha[32]) {
    char err[ERR_LEN];
    StoreRound prev;
    pthread_mutex_lock(&co->store_lock);
    int rc = store_round_get(co->store, round - 1, &prev, err);
    pthread_mutex_unlock(&co->store_lock);
    if (rc == 0 && strcmp(prev.state, "committed") != 0)
        rc = err_set(err, "round %lld is not committed", (long long)round - 1);
    if (rc == 0 && scratch->params == NULL)
        rc = model_build(scratch, &co->model_cfg, (uint64_t)co->rounds.set.seed, err);
    if (rc == 0) {
        char path[1600];
        snprintf(path, sizeof path, "%s/%s", co->dir, prev.checkpoint_path);
        rc = model_load(scratch, path, NULL, err);
    }
    if (rc == 0)
        security_sha256(scratch->params, scratch->n_params * 4, sha);
    else
        log_warn("rounds",
                 "the model of round %lld is not at hand (%s); updates trained from it are "
                 "refused as stale",
                 (long long)round, err);
    return rc == 0 ? 0 : -1;
}

/* One round's ε above it gives little protection: said at start. */
#define DP_WEAK_EPSILON 10.0

/* [privacy] at start (docs/privacy.md): the account of the rounds committed
 * before, the rounds the budget leaves (the federation's total is lowered
 * to them), and a line on what one round costs. Rounds committed without
 * noise have no ε: dp cannot be turned on after them. A distributed round
 * is planned at its most: the sum's noise at least the quorum's shares
 * (secagg_round.c) and rounding at its largest (l2 = 11 √P,
 * secagg_params_dp's floor); what it spent is accounted at its commit. */
static int privacy_start(Coordinator *co, char *err) {
    Rounds *r = &co->rounds;
    RoundsSettings *s = &r->set;
    int64_t plain;
    pthread_mutex_lock(&co->store_lock);
    int rc = store_privacy_spent(co->store, &r->dp_account, &plain, err);
    pthread_mutex_unlock(&co->store_lock);
    if (rc != 0) return -1;
    double d = s->dp_delta, z = s->dp_noise;
    if (!s->dp) {
        if (r->dp_account.rdp[PRIVACY_ORDERS - 1] != 0) /* every round adds at order 1024 */
            log_warn("privacy",
                     "[privacy] dp = off after rounds committed with noise: the rounds from "
                     "here on have no differential privacy");
        return 0;
    }
    const char *mode = s->dp_distributed ? "distributed" : "central";
    if (plain > 0)
        return err_set(err,
                       "federation.ini: [privacy] dp = %s, but %lld committed rounds of this "
                       "federation had no noise and no epsilon covers them; start a new "
                       "federation with dp on from its first round",
                       mode, (long long)plain);
    PrivacyAccount one = {{0}}, ahead;
    if (s->dp_distributed) {
        double l2 = 11 * sqrt((double)r->model.n_params);
        privacy_add_skellam(&one, (z * l2) * (z * l2),
                            fmin(l2 * l2, sqrt((double)r->model.n_params) * l2), l2);
    } else {
        privacy_add_gaussian(&one, z);
    }
    double spent = privacy_account_epsilon(&r->dp_account, d, NULL);
    double first = privacy_account_epsilon(&one, d, NULL);
    if (first > DP_WEAK_EPSILON)
        log_warn("privacy",
                 "one round at noise_multiplier %g gives epsilon %.3g at delta %g: little "
                 "protection (over %g); raise [privacy] noise_multiplier",
                 z, first, d, DP_WEAK_EPSILON);
    if (s->dp_budget > 0) { /* the most rounds in all within it: ε grows with each */
        int64_t lo = r->number, hi = s->total;
        while (lo < hi) {
            int64_t mid = lo + (hi - lo + 1) / 2;
            ahead = r->dp_account;
            privacy_account_add(&ahead, &one, (double)(mid - r->number));
            if (privacy_account_epsilon(&ahead, d, NULL) <= s->dp_budget)
                lo = mid;
            else
                hi = mid - 1;
        }
        if (lo == r->number)
            return err_set(err,
                           "federation.ini: [privacy] epsilon_budget %g at delta %g is spent: "
                           "epsilon is %.4g after %lld rounds and one more would pass it; raise "
                           "the budget or the noise, or end the federation",
                           s->dp_budget, d, spent, (long long)r->number);
        if (lo < s->total) {
            log_warn("privacy",
                     "[privacy] epsilon_budget %g at delta %g allows %lld rounds in all of the "
                     "%lld configured: the federation finishes after them",
                     s->dp_budget, d, (long long)lo, (long long)s->total);
            s->total = lo;
        }
    }
    /* the noise's norm on the mean is z · clip · √P / n: the clip's own at
     * n = z √P sites; with fewer it outweighs every update */
    log_info("privacy",
             "the noise on the mean has the norm of one clipped update at about %.0f sites "
             "(noise_multiplier x sqrt of the %llu parameters); with fewer sites it outweighs "
             "the updates (docs/privacy.md)",
             ceil(z * sqrt((double)r->model.n_params)), (unsigned long long)r->model.n_params);
    ahead = r->dp_account;
    privacy_account_add(&ahead, &one, (double)(s->total - r->number));
    log_info("privacy",
             "%s differential privacy: updates clipped to %g%s, noise multiplier %g; epsilon "
             "%.4g at delta %g so far, %s%.4g after round %lld",
             mode, s->dp_clip, s->dp_distributed ? " at each site" : "", z, spent, d,
             s->dp_distributed ? "at most " : "", privacy_account_epsilon(&ahead, d, NULL),
             (long long)s->total - 1);
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
    rounds_lock(r);
    r->stop = 1;
    pthread_cond_broadcast(&r->changed);
    pthread_mutex_unlock(&r->lock);
    if (r->ticker) pthread_join(r->ticker, NULL);
    assert(r->n_waiters == 0); /* rounds_release_waiters answered them */
    assert(secagg_round_parked(r) == 0 && r->sa_out.n == 0);
    free(r->waiters);
    secagg_round_free(r);
    if (r->spool) round_drop_kept(r, r->number, r->kept_owner, r->n_kept);
    round_updates_free(r->upd, r->n_reported);
    free(r->upd), free(r->reported), free(r->kept_owner), free(r->counts), free(r->arrivals);
    free(r->served);
    round_sum_free(&r->sum);
    free(r->spare_stage);
    codec_checked_free(r->pool);
    outer_free(&r->outer);
    ef_free(&r->down_ef);
    model_free(&r->model);
    net_spool_close(r->spool);
    served_unref(r->ckpt);
    served_unref(r->delta);
    for (int i = 0; i < r->n_chain; i++) served_unref(r->chain[i].sv);
    pthread_mutex_destroy(&r->lock);
    pthread_mutex_destroy(&r->reading);
    pthread_cond_destroy(&r->changed);
}
