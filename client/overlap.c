/*
 * overlap.c — the site's rounds with communication overlapped
 * ([rounds] overlap = on; docs/communication.md): while one round's update
 * uploads and the next model downloads, the site already trains the
 * round after, from the newest model it holds. Its updates are then
 * trained from the model of the round before the one they are for, and the
 * coordinator applies them one round late (the one-step-delayed outer step
 * of eager updates, arXiv 2502.12996; DiLoCoX, arXiv 2506.21263): it takes
 * round r's updates from θ_r or θ_{r−1}.
 *
 * Iteration k trains the update for round t_k = c + k (c: the round of the
 * first model) from B_k: θ_c for k = 0 and 1, then θ_{t_k − 1}. At its end
 * the site joins the update in flight before it (which has uploaded the
 * update for t_{k−1}, waited for that round to close and downloaded
 * θ_{t_k}), encodes its own update against B_k, makes θ_{t_k} its next
 * base, and sends the update in a thread of its own. The only wait is for
 * round t_{k−1} to close. A site that finds its round closed without it
 * (a cut link, a slow site) drops the update it was training and starts
 * again from the current model. Every copy of θ stays the coordinator's,
 * bit for bit: each one is the chain's, named by its SHA-256, and a delta
 * is only ever applied onto the model it was made from.
 *
 * Look-ahead (Hello's lookahead = c > 0: [rounds] lookahead times the
 * outer optimizer's step for one mean update): θ_{t_k} still lacks the
 * outer step of round t_k, the one the site has just trained for, and the
 * site's own Δ for it is the freshest estimate of that round's mean. It
 * trains the update for t_k + 1 from S = θ_{t_k} − c·Δ and encodes it
 * against S, still naming θ_{t_k} as its base. Where a round's
 * steps nearly reach a minimum whatever their start (long rounds), an
 * update trained from θ alone aims a round behind, and applied to the
 * model after it overshoots: at 200 inner steps the held-out loss
 * oscillated. (In a quadratic model where the steps forget their start,
 * c at the whole step gives synchronous rounds' dynamics exactly, the
 * sites' data alike or not; real sites then drift toward their own data,
 * hence a fraction: docs/communication.md.) The copies of θ stay the
 * coordinator's; S is the site's own starting point.
 *
 * One rank only: a site of several ranks runs the rounds synchronously.
 */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "client_internal.h"
#include "security/security.h"

/* An update on its way, then the model after its round. */
typedef struct Inflight {
    Session *ss;
    uint64_t round; /* the round the update is for */
    Blob blob;      /* owned: moved from the session */
    uint8_t blob_sha[32], meta[192];
    size_t mlen;
    const float *base; /* θ of base_round, the delta's base: read only while it runs */
    uint8_t base_sha[32];
    int64_t base_round;
    float *next; /* out: the model after the round (n_params), its SHA-256 and round */
    uint8_t next_sha[32];
    uint64_t next_round;
    int finished, failed;
    RoundTimes times; /* the next model's download and decode */
    char err[ERR_LEN];
} Inflight;

static void *inflight_main(void *arg) {
    Inflight *f = arg;
    Site *s = &f->ss->s;
    int resend = 1, refused = 0;
    uint64_t current = f->round;
    while (resend) {
        site_upload(s, f->round, &f->blob, f->meta, f->mlen, f->blob_sha, &refused);
        if (site_wait_round(s, f->round, !refused, &current, &f->finished, &resend, f->err) != 0) {
            f->failed = 1;
            return NULL;
        }
        if (resend)
            log_warn("site", "round %llu was reopened without this site's update; sending it again",
                     (unsigned long long)f->round);
    }
    if (f->finished) return NULL;
    /* the model after the round, decoded into next: a view of the model
     * whose parameters are that buffer (the trainer has the model itself) */
    Model view = f->ss->m;
    view.params = f->next;
    uint64_t served = current;
    if (site_get_model(s, &view, f->base, f->base_sha, f->base_round, &served, &f->times, f->err) !=
        0) {
        f->failed = 1;
        return NULL;
    }
    f->next_round = served;
    security_sha256(f->next, view.n_params * 4, f->next_sha);
    return NULL;
}

/* The model the thread brought becomes the base (its buffer and theta's
 * trade places: the old base is the next thread's output). */
static void adopt_next(Session *ss, Inflight *f) {
    float *old = ss->theta;
    ss->theta = f->next, f->next = old;
    memcpy(ss->theta_sha, f->next_sha, 32);
    ss->have_round = (int64_t)f->next_round;
    session_log_model(ss, f->next_round);
}

/* The current model into ss->theta (synchronously): at the start, and
 * when the site lost its rounds. */
static int fetch_current(Session *ss, uint64_t *round, RoundTimes *times, char *err) {
    Model *m = &ss->m;
    uint64_t served = *round;
    if (site_get_model(&ss->s, m, ss->theta, ss->theta_sha, ss->have_round, &served, times, err) !=
        0)
        return -1;
    memcpy(ss->theta, m->params, sizeof(float) * m->n_params);
    security_sha256(ss->theta, m->n_params * 4, ss->theta_sha);
    ss->have_round = (int64_t)served;
    *round = served;
    session_log_model(ss, served);
    return 0;
}

int site_loop_overlap(Session *ss, char *err) {
    Model *m = &ss->m;
    const size_t bytes = sizeof(float) * m->n_params;
    uint64_t total = ss->hr->total_rounds;
    if (ss->hr->finished) return 0;
    RoundTimes times = {0, 0, 0, 0};
    uint64_t target = ss->hr->current_round;
    if (ss->have_round == (int64_t)target)
        session_log_model(ss, target);
    else if (fetch_current(ss, &target, &times, err) != 0)
        return -1;
    /* at most [rounds] lookahead 1 × [optimizer] lr 10 × (1 + momentum < 1) */
    float c = ss->hr->lookahead;
    if (!(c >= 0 && c <= 20))
        return err_set(err,
                       "the coordinator sent lookahead = %g, outside 0 to 20: run a site of the "
                       "coordinator's version",
                       (double)c);
    Inflight f;
    memset(&f, 0, sizeof f);
    f.next = mallocCheck(bytes); /* the other model buffer: the thread's output */
    /* the look-ahead start S of the next update; none yet (from theta) */
    float *start = c > 0 ? mallocCheck(bytes) : NULL;
    int have_start = 0;
    pthread_t th;
    int running = 0, rc = -1;
    for (;;) {
        if (total && target >= total) break; /* no round left to train for */
        /* iteration: the update for `target` from the base in theta */
        memcpy(m->params, have_start ? start : ss->theta, bytes);
        int64_t base_round = ss->have_round;
        RoundTrained t;
        if (session_train(ss, target, &times, &t, err) != 0) goto out;
        /* θ_local on the host for the look-ahead (a GPU trainer encodes
         * from its own copy) */
        if (start && ss->on_gpu) trainer_to_host(ss->trainer, TRAINER_PARAMS);
        log_info("site", "round %llu: loss %.4f, eval %.4f (trained from round %lld's model%s)",
                 (unsigned long long)target, t.train_loss, t.eval, (long long)base_round,
                 have_start ? ", looking ahead" : "");
        int have_next = 0;
        if (running) { /* the update before: sent, its round closed, the next model here */
            pthread_join(th, NULL);
            running = 0;
            blob_free(&f.blob);
            if (f.failed) {
                err_set(err, "%s", f.err);
                goto out;
            }
            if (f.finished) break;
            times.download = f.times.download, times.decode = f.times.decode;
            have_next = 1;
            if (f.next_round > target) { /* its round closed without this one: start again */
                log_warn("site",
                         "round %llu closed before this site's update for it was trained; "
                         "dropping it and training from round %llu's model",
                         (unsigned long long)target, (unsigned long long)f.next_round);
                adopt_next(ss, &f);
                target = f.next_round;
                have_start = 0; /* no update of this site's in the steps ahead */
                continue;
            }
        }
        if (session_encode(ss, have_start ? start : ss->theta, ss->theta_sha, &t, &times,
                           f.blob_sha, f.meta, &f.mlen, err) != 0)
            goto out;
        if (start) { /* S ← θ − c·Δ: θ the next base, Δ = this update's start − θ_local */
            const float *next = have_next ? f.next : ss->theta;
            const float *from = have_start ? start : ss->theta;
            for (uint64_t i = 0; i < m->n_params; i++)
                start[i] = next[i] - c * (from[i] - m->params[i]);
            have_start = 1;
        }
        if (have_next) adopt_next(ss, &f); /* the next base: the model after the round before */
        if (site_state_save(&ss->s, m, &ss->ef, target, ss->tl.pos, NULL, err) != 0) goto out;
        f.ss = ss;
        f.round = target;
        f.blob = ss->blob, memset(&ss->blob, 0, sizeof ss->blob); /* the thread's now */
        f.base = ss->theta;
        memcpy(f.base_sha, ss->theta_sha, 32);
        f.base_round = ss->have_round;
        f.finished = f.failed = 0;
        f.err[0] = 0;
        if (pthread_create(&th, NULL, inflight_main, &f) != 0) {
            err_set(err, "cannot start the upload's thread");
            goto out;
        }
        running = 1;
        memset(&times, 0, sizeof times);
        target++;
    }
    rc = 0;
out:
    if (running) {
        pthread_join(th, NULL);
        if (rc == 0 && f.failed) rc = err_set(err, "%s", f.err);
    }
    blob_free(&f.blob);
    free(f.next);
    free(start);
    return rc;
}
