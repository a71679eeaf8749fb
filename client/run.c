/*
 * run.c — the site agent (docs/design.md §1): Hello → GetModel → H inner
 * AdamW steps on local data → Δ = θ_global − θ_local with error feedback →
 * encode with the federation's codec → PushUpdate (resumable) → WaitRound →
 * … until the federation reports it is finished. This file sets the
 * session up once (the model, the data, the trainer, the saved state) and
 * runs the synchronous round loop; overlap.c runs the loop that trains the
 * next round while the update and the next model are in flight.
 *
 * Failures are routine: every call is retried with capped exponential
 * backoff and jitter on transient statuses (site.c), an interrupted upload
 * resumes from what the coordinator holds, and a site that finds the round
 * moved on starts over with the new model. The inner optimizer's moments
 * live in the model across rounds, as in DiLoCo.
 *
 * A site of several ranks (mpirun or srun; docs/sites.md): rank 0 is the
 * site — it holds the certificate, talks to the coordinator, encodes,
 * uploads and saves the state — and broadcasts the federation's answer to
 * Hello, each round's θ and, step by step, whether to go on. Every rank
 * reads the same data in the same order: each step takes a global batch of
 * size × B sequences, rank r the r-th B of them, and the gradients are
 * averaged over the ranks (trainer_create_ranks), so every rank holds the
 * same θ after each step (checked each round) and the site trains as one
 * process with size × B would. Only rank 0 needs the site folder; every
 * rank needs the data. A rank that fails ends the job (MPI_Abort; a rank
 * that dies, the launcher ends it), and the site restarted resumes from
 * rank 0's saved state.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "client_internal.h"
#include "security/security.h"

/* What rank 0 tells the others at the start of each round. */
typedef struct RoundOrder {
    uint64_t round;
    int64_t finished;
} RoundOrder;

/* ---- the rounds ------------------------------------------------------------------- */

/* Asynchronous rounds ([rounds] mode = async): the update trained from
 * round v's model joins whichever round is open when it arrives (up to
 * `staleness` rounds later), one update per site and round. A site whose
 * last update is still in the open round (it was trained from an older
 * model, and this one from the model after it) waits for that round to
 * merge before it sends this one, which then joins the next. */
static int async_wait_turn(Session *ss, uint64_t round, char *err) {
    int reported = 0;
    uint64_t current = site_heartbeat(&ss->s, round, &reported);
    if (current == 0 || !reported) return 0; /* unanswered: the upload's retries take over */
    int finished = 0, resend = 0;
    log_info("site", "round %llu holds this site's last update; sending this one to the next",
             (unsigned long long)current);
    return site_wait_round(&ss->s, current, 0, &current, &finished, &resend, err);
}

/* A round's update under secure aggregation: x through the phases, the
 * state saved, the wait for the round to move (again through the phases
 * when it reopened without this site's update). */
static int secagg_round_loop(Session *ss, uint64_t round, const RoundTrained *t, RoundTimes *times,
                             uint64_t *next, int *finished, char *err) {
    uint8_t meta[192];
    size_t mlen;
    float *x = malloc(ss->m.n_params * sizeof *x);
    if (x == NULL) return err_set(err, "out of memory for the update");
    session_secagg_update(ss, ss->theta, ss->theta_sha, t, times, x, meta, &mlen);
    log_info("site", "round %llu: loss %.4f, eval %.4f", (unsigned long long)round, t->train_loss,
             t->eval);
    int rc = 0, resend = 1;
    while (rc == 0 && resend) {
        rc = site_secagg_send(ss, round, x, meta, mlen, err);
        if (rc == 0)
            rc = site_state_save(&ss->s, &ss->m, &ss->ef, round, ss->tl.pos,
                                 ss->opt_staged[0] ? ss->opt_staged : NULL, err);
        if (rc == 0) rc = site_wait_round(&ss->s, round, 1, next, finished, &resend, err);
        if (rc == 0 && resend)
            log_warn("site", "round %llu was reopened without this site's update; sending it again",
                     (unsigned long long)round);
    }
    free(x);
    return rc;
}

/* Round after round: the model (when this site does not hold the round's),
 * the inner steps, the update, the wait for the round to move. With async
 * rounds the wait ends at once when the round has moved past the model the
 * update was trained from (a slow site does not wait for the fast ones),
 * and the site trains from the newest model. */

static int site_loop_sync(Session *ss, char *err) {
    const Ranks *rk = &ss->rk;
    Model *m = &ss->m;
    uint64_t round = ss->hr->current_round;
    int finished = ss->hr->finished;
    for (;;) {
        /* rank 0's order for the round: which, and whether the federation is over */
        RoundOrder order = {round, finished};
        ranks_bcast(&order, sizeof order);
        if (order.finished) break;
        round = order.round;
        RoundTimes times = {0, 0, 0, 0};
        if (rk->rank == 0) {
            if (ss->have_round != (int64_t)round) { /* not the model built at the start */
                uint64_t served = round;
                if (site_get_model(&ss->s, m, ss->theta, ss->theta_sha, ss->have_round, &served,
                                   &times, err) != 0)
                    return -1;
                if (served > round) {
                    log_warn("site",
                             "round %llu closed while its model was downloading; this is "
                             "round %llu's",
                             (unsigned long long)round, (unsigned long long)served);
                    round = served;
                }
                memcpy(ss->theta, m->params, sizeof(float) * m->n_params);
                security_sha256(ss->theta, m->n_params * 4, ss->theta_sha);
                ss->have_round = (int64_t)round;
            } else {
                memcpy(m->params, ss->theta, sizeof(float) * m->n_params);
            }
            session_log_model(ss, round);
        }
        ranks_bcast(m->params, m->n_params * sizeof(float)); /* θ from rank 0 */
        ranks_bcast(&round, sizeof round);                   /* and its round */
        RoundTrained t;
        if (session_train(ss, round, &times, &t, err) != 0) return -1;
        if (rk->rank != 0) continue; /* rank 0 sends the update */
        uint8_t blob_sha[32], meta[192];
        size_t mlen;
        if (ss->hr->secure_aggregation) {
            if (secagg_round_loop(ss, round, &t, &times, &round, &finished, err) != 0) return -1;
            continue;
        }
        if (session_encode(ss, ss->theta, ss->theta_sha, &t, &times, blob_sha, meta, &mlen, err) !=
            0)
            return -1;
        log_info("site", "round %llu: loss %.4f, eval %.4f", (unsigned long long)round,
                 t.train_loss, t.eval);
        if (ss->hr->staleness > 0 && async_wait_turn(ss, round, err) != 0) return -1;
        int resend = 1, refused = 0;
        while (resend) {
            site_upload(&ss->s, round, &ss->blob, meta, mlen, blob_sha, &refused);
            uint64_t at = round;
            if (site_state_save(&ss->s, m, &ss->ef, at, ss->tl.pos,
                                ss->opt_staged[0] ? ss->opt_staged : NULL, err) != 0)
                return -1;
            if (site_wait_round(&ss->s, at, !refused, &round, &finished, &resend, err) != 0)
                return -1;
            if (resend)
                log_warn("site",
                         "round %llu was reopened without this site's update; sending it again",
                         (unsigned long long)at);
        }
    }
    return 0;
}

int client_run(const SiteRunOptions *o, char *err) {
    Session *ss = callocCheck(1, sizeof *ss);
    int rc = -1;
    if (ranks_init(&ss->rk, err) != 0) {
        free(ss);
        return -1;
    }
    if (session_open(ss, o, err) == 0) {
        /* secure aggregation's rounds are the synchronous loop's, whatever
         * a Hello that claims both says */
        if (ss->hr->overlap && ss->rk.size == 1 && !ss->hr->secure_aggregation)
            rc = site_loop_overlap(ss, err);
        else {
            if (ss->hr->overlap)
                log_warn("site", "a site of several ranks runs the rounds without overlap");
            rc = site_loop_sync(ss, err);
        }
    }
    if (rc == 0 && ss->rk.rank == 0)
        log_info("site", "%s: the federation has finished", ss->s.name);
    if (rc != 0 && ss->rk.size > 1) { /* the other ranks wait on this one: end them all */
        fprintf(stderr, "strait site run: rank %d of %d: %s\n", ss->rk.rank, ss->rk.size, err);
        ranks_abort(1);
    }
    ranks_finalize();
    session_close(ss);
    free(ss);
    return rc;
}
