/*
 * secagg_round.c — a round attempt's secure aggregation ([privacy]
 * secure_aggregation = on; docs/privacy.md): the SecAgg call's phases
 * over privacy/secagg_proto.c. KEYS: sites advertise their keys, parked
 * until the cohort is fixed (every active site in, or the quorum at the
 * round's deadline), then answered with the cohort; SHARES: each sends its
 * sealed envelopes, parked until every cohort site has (or the phase
 * timeout, with enough), then answered with those sealed to it; the masked
 * updates come through PushUpdate (secagg_round_push) until every site
 * that shared has sent (or the timeout); SURVIVORS: parked until then,
 * answered with whose updates are summed; REVEAL: each survivor's shares,
 * taken at once, and once every secret has its t the sum is unmasked into
 * the round's sum as the mean, and the round closes as any other. A phase
 * short of what it needs at its timeout fails the attempt; a new attempt
 * answers every parked call "attempt over" and starts again at KEYS, with
 * new keys. Everything here runs under rounds.lock; parked calls are
 * answered after it (SaOut).
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "coordinator_internal.h"
#include "privacy/privacy.h"
#include "schema/strait.pb-c.h"

enum { SA_KEYS = 1, SA_SHARES = 2, SA_SURVIVORS = 3, SA_REVEAL = 4 };
enum { PH_KEYS, PH_SHARES, PH_MASKED, PH_REVEAL, PH_DONE };
#define ADVERT_LEN (3 * SECAGG_KEY)

typedef struct Parked {
    NetCall *call;
    int phase; /* SA_KEYS, SA_SHARES or SA_SURVIVORS */
    int index; /* the site's in the cohort (KEYS: its advert's) */
} Parked;

struct SecaggRound {
    int64_t attempt;  /* the round_id these phases are of */
    int phase;        /* PH_* */
    int64_t phase_ms; /* when the phase began */
    int64_t first_ms; /* the phase's first arrival (keys, masked updates); 0: none */
    /* the adverts as they come, then the cohort: n of them */
    int n, cap;
    char (*name)[65];
    SecaggAdvert *ad;
    SecaggParams p;
    uint8_t *shared, *survived; /* n */
    SecaggEnvelope *env;        /* every envelope of the sites that shared */
    int n_env, cap_env, n_shared, n_masked;
    uint8_t *revealed;                /* n: the survivors whose reveals were taken */
    int n_revealed, n_revealed_tried; /* and how many; at the last unmasking tried */
    /* distributed DP: the noise of the sum it accounted (0: none yet),
     * each masked update's share of mu / noise_sites */
    double mu_summed;
    SecaggServer *srv;
    Parked *parked;
    int n_parked, cap_parked;
};

/* ---- answers, sent outside the lock ----------------------------------------------- */

static void out_add(SaOut *o, NetCall *c, uint8_t *data, size_t len, NetStatus code,
                    const char *details) {
    if (o->n == o->cap) {
        int cap = o->cap ? 2 * o->cap : 16;
        SaAnswer *grown = realloc(o->a, (size_t)cap * sizeof *grown);
        if (grown == NULL) { /* the call is answered now, under the lock: better than never */
            net_parked_answer(c, NULL, 0, NET_RESOURCE_EXHAUSTED, "out of memory");
            free(data);
            return;
        }
        o->a = grown, o->cap = cap;
    }
    SaAnswer *a = &o->a[o->n++];
    a->call = c, a->data = data, a->len = len, a->code = code;
    snprintf(a->details, sizeof a->details, "%s", details ? details : "");
}

void secagg_round_flush(Rounds *r) {
    pthread_mutex_lock(&r->lock);
    SaOut o = r->sa_out;
    memset(&r->sa_out, 0, sizeof r->sa_out);
    pthread_mutex_unlock(&r->lock);
    for (int i = 0; i < o.n; i++) {
        SaAnswer *a = &o.a[i];
        net_parked_answer(a->call, a->data, a->len, a->code, a->details);
        free(a->data);
    }
    free(o.a);
}

/* A response packed on the heap, for out_add. */
static uint8_t *pack(const Strait__SecAggResponse *m, size_t *len) {
    *len = strait__sec_agg_response__get_packed_size(m);
    uint8_t *b = malloc(*len ? *len : 1);
    if (b) strait__sec_agg_response__pack(m, b);
    return b;
}

static void base_response(const Rounds *r, const SecaggRound *s, int index,
                          Strait__SecAggResponse *m) {
    strait__sec_agg_response__init(m);
    m->round = (uint64_t)r->number, m->attempt = (uint64_t)s->attempt;
    m->index = (uint32_t)index, m->sites = (uint32_t)s->n;
    m->bits = (uint32_t)s->p.bits, m->range = s->p.range;
    m->context = (char *)s->p.context;
    m->clip = s->p.clip, m->noise_multiplier = s->p.noise,
    m->noise_sites = (uint32_t)s->p.noise_sites;
}

/* ---- the attempt's state ---------------------------------------------------------- */

static void state_free(SecaggRound *s) {
    secagg_server_free(s->srv);
    free(s->name), free(s->ad), free(s->shared), free(s->survived), free(s->env), free(s->revealed);
    free(s->parked);
    memset(s, 0, sizeof *s);
}

void secagg_round_reset(Rounds *r, const char *why) {
    SecaggRound *s = r->sa;
    if (s == NULL) return;
    for (int i = 0; i < s->n_parked; i++)
        out_add(&r->sa_out, s->parked[i].call, NULL, 0, NET_FAILED_PRECONDITION, why);
    state_free(s);
    s->attempt = r->round_id;
    s->phase = PH_KEYS;
}

int secagg_round_init(Rounds *r, char *err) {
    if (!r->set.secagg) return 0;
    if ((r->sa = calloc(1, sizeof *r->sa)) == NULL) return err_set(err, "out of memory");
    r->sa->attempt = r->round_id;
    return 0;
}

void secagg_round_free(Rounds *r) {
    if (r->sa == NULL) return;
    state_free(r->sa);
    free(r->sa);
    r->sa = NULL;
}

int secagg_round_parked(const Rounds *r) {
    return r->sa ? r->sa->n_parked : 0;
}

static int find(const SecaggRound *s, const char *site) {
    for (int i = 0; i < s->n; i++)
        if (strcmp(s->name[i], site) == 0) return i;
    return -1;
}

static int park(SecaggRound *s, NetCall *c, int phase, int index) {
    if (s->n_parked == s->cap_parked) {
        int cap = s->cap_parked ? 2 * s->cap_parked : 16;
        Parked *grown = realloc(s->parked, (size_t)cap * sizeof *grown);
        if (grown == NULL) return -1;
        s->parked = grown, s->cap_parked = cap;
    }
    if (net_call_park(c) != 0) return -1;
    s->parked[s->n_parked++] = (Parked){c, phase, index};
    return 0;
}

/* The answer of phase to cohort site `index`, packed (NULL: out of
 * memory; never a partial one): KEYS the cohort, SHARES the envelopes
 * sealed to it, SURVIVORS the survivors, REVEAL nothing more. */
static uint8_t *answer_of(const Rounds *r, int phase, int index, size_t *len) {
    const SecaggRound *s = r->sa;
    Strait__SecAggResponse m;
    base_response(r, s, index, &m);
    ProtobufCBinaryData *ads = NULL;
    Strait__SecAggEnvelope *envs = NULL, **envp = NULL;
    int ok = 1;
    if (phase == SA_KEYS) { /* its own and its neighbours' adverts; the others empty */
        ok = (ads = calloc((size_t)s->n, sizeof *ads)) != NULL;
        for (int j = 0; ok && j < s->n; j++)
            if (j == index || secagg_neighbours(index, j, s->n, s->p.k))
                ads[j].data = (uint8_t *)&s->ad[j], ads[j].len = ADVERT_LEN;
        m.n_adverts = (size_t)s->n, m.adverts = ads;
    } else if (phase == SA_SHARES) {
        int k = 0;
        for (int e = 0; e < s->n_env; e++) k += s->env[e].to == index;
        envs = calloc((size_t)(k ? k : 1), sizeof *envs);
        envp = calloc((size_t)(k ? k : 1), sizeof *envp);
        ok = envs && envp;
        k = 0;
        for (int e = 0; ok && e < s->n_env; e++) {
            if (s->env[e].to != index) continue;
            strait__sec_agg_envelope__init(&envs[k]);
            envs[k].from = (uint32_t)s->env[e].from, envs[k].to = (uint32_t)s->env[e].to;
            envs[k].box.data = (uint8_t *)s->env[e].box, envs[k].box.len = SECAGG_BOX;
            envp[k] = &envs[k];
            k++;
        }
        m.n_envelopes = (size_t)k, m.envelopes = envp;
    } else if (phase == SA_SURVIVORS) {
        m.survived.data = s->survived, m.survived.len = (size_t)s->n;
    }
    uint8_t *b = ok ? pack(&m, len) : NULL;
    free(ads), free(envs), free(envp);
    return b;
}

/* Answers the parked calls of phase (answer_of). */
static void answer_parked(Rounds *r, int phase, SaOut *out) {
    SecaggRound *s = r->sa;
    for (int i = 0; i < s->n_parked;) {
        Parked *pk = &s->parked[i];
        if (pk->phase != phase) {
            i++;
            continue;
        }
        if (pk->index < 0) { /* a retried call took its place */
            out_add(out, pk->call, NULL, 0, NET_FAILED_PRECONDITION,
                    "a later SecAgg call of this site took this one's place");
        } else {
            size_t len = 0;
            uint8_t *b = answer_of(r, phase, pk->index, &len);
            out_add(out, pk->call, b, len, b ? NET_OK : NET_RESOURCE_EXHAUSTED,
                    b ? NULL : "out of memory");
        }
        *pk = s->parked[--s->n_parked]; /* swapped with the last: look at i again */
    }
}

/* ---- phases ------------------------------------------------------------------------ */

/* The cohort is fixed: the attempt's parameters, and KEYS answered. */
static int fix_cohort(Coordinator *co, SaOut *out, char *why, size_t len) {
    Rounds *r = &co->rounds;
    SecaggRound *s = r->sa;
    /* distributed DP: each site's share of the noise is the quorum's part
     * of the sum's (a sum is unmasked only with that many in it) */
    int64_t quorum = rounds_quorum(co);
    int noise_sites = quorum < 2 ? 2 : quorum > s->n ? s->n : (int)quorum;
    int bits = (int)r->set.secagg_bits;
    if (bits == 0) { /* 255 levels a site over the range, and the sum of them all */
        bits = 9;
        while ((1 << (bits - 9)) < s->n && bits < 32) bits++;
        if (r->set.dp_distributed) /* and room for the noise, rounding adding at most 1% */
            bits = secagg_dp_bits(s->n, r->set.secagg_range, r->set.dp_clip, r->set.dp_noise,
                                  noise_sites, r->model.n_params, bits);
    }
    if (floor((ldexp(1, bits - 1) - 1) / s->n) < 1) {
        snprintf(why, len,
                 "secure aggregation: %d bits cannot hold the sum of %d sites; use [privacy] "
                 "bits = 0 (enough) or more",
                 bits, s->n);
        return -1;
    }
    char ctx[160], err[ERR_LEN];
    snprintf(ctx, sizeof ctx, "%.64s/round-%lld/attempt-%lld", co->name, (long long)r->number,
             (long long)s->attempt);
    if (secagg_params(s->n, bits, r->set.secagg_range, ctx, &s->p, err) != 0) {
        snprintf(why, len, "%s", err);
        return -1;
    }
    if (r->set.dp_distributed && secagg_params_dp(&s->p, r->set.dp_clip, r->set.dp_noise,
                                                  noise_sites, r->model.n_params, err) != 0) {
        snprintf(why, len, "%s", err);
        return -1;
    }
    /* places on the ring drawn at random (OpenSSL's DRBG): sites that came
     * in a chosen order cannot choose whose neighbours they are */
    int *place = malloc((size_t)s->n * sizeof *place);
    char(*name)[65] = malloc((size_t)s->n * sizeof *name);
    SecaggAdvert *ad = malloc((size_t)s->n * sizeof *ad);
    if (!place || !name || !ad) {
        free(place), free(name), free(ad);
        snprintf(why, len, "out of memory for secure aggregation's cohort");
        return -1;
    }
    secagg_permutation(place, s->n);
    for (int i = 0; i < s->n; i++) memcpy(name[place[i]], s->name[i], sizeof *name);
    for (int i = 0; i < s->n; i++) ad[place[i]] = s->ad[i];
    for (int k = 0; k < s->n_parked; k++)
        if (s->parked[k].index >= 0) s->parked[k].index = place[s->parked[k].index];
    memcpy(s->name, name, (size_t)s->n * sizeof *name);
    memcpy(s->ad, ad, (size_t)s->n * sizeof *ad);
    free(place), free(name), free(ad);
    s->shared = calloc((size_t)s->n, 1), s->survived = calloc((size_t)s->n, 1);
    s->revealed = calloc((size_t)s->n, 1);
    if (!s->shared || !s->survived || !s->revealed) {
        snprintf(why, len, "out of memory for secure aggregation's cohort");
        return -1;
    }
    log_info("secagg",
             "round %lld attempt %lld: a cohort of %d sites, each with %d neighbours; %d shares "
             "unmask a secret; %d bits a value",
             (long long)r->number, (long long)r->attempt, s->n, s->p.k, s->p.t, s->p.bits);
    if (r->set.dp_distributed)
        log_info("secagg",
                 "round %lld: each site clips to %g and adds Skellam noise of deviation %.3g "
                 "(the sum's %.3g with %d in it; sensitivity %.4g in steps of %.3g)",
                 (long long)r->number, s->p.clip, sqrt(s->p.mu / noise_sites) / s->p.scale,
                 sqrt(s->p.mu) / s->p.scale, noise_sites, s->p.l2, 1 / s->p.scale);
    s->phase = PH_SHARES, s->phase_ms = time_wall_ms(), s->first_ms = 0;
    answer_parked(r, SA_KEYS, out);
    return 0;
}

static int close_shares(Coordinator *co, SaOut *out, char *why, size_t len) {
    Rounds *r = &co->rounds;
    SecaggRound *s = r->sa;
    char err[ERR_LEN];
    s->srv = secagg_server_new(&s->p, s->ad, s->shared, r->model.n_params, err);
    if (s->srv == NULL) {
        snprintf(why, len, "%s", err);
        return -1;
    }
    log_info("secagg", "round %lld: %d of %d sites shared their seeds", (long long)r->number,
             s->n_shared, s->n);
    s->phase = PH_MASKED, s->phase_ms = time_wall_ms(), s->first_ms = 0;
    answer_parked(r, SA_SHARES, out);
    return 0;
}

static int close_masked(Coordinator *co, SaOut *out, char *why, size_t len) {
    Rounds *r = &co->rounds;
    SecaggRound *s = r->sa;
    char err[ERR_LEN];
    if (secagg_server_close(s->srv, s->survived, err) != 0) {
        snprintf(why, len, "%s", err);
        return -1;
    }
    int64_t quorum = rounds_quorum(co); /* a round's quorum holds for what is summed too */
    if (s->n_masked < quorum) {
        snprintf(why, len, "secure aggregation: %d masked updates, fewer than the quorum of %lld",
                 s->n_masked, (long long)quorum);
        return -1;
    }
    log_info("secagg", "round %lld: %d masked updates in; unmasking", (long long)r->number,
             s->n_masked);
    s->phase = PH_REVEAL, s->phase_ms = time_wall_ms();
    answer_parked(r, SA_SURVIVORS, out);
    return 0;
}

/* Every secret has its shares: the mean into the round's sum. */
static int unmask(Coordinator *co, char *why, size_t len) {
    Rounds *r = &co->rounds;
    SecaggRound *s = r->sa;
    char err[ERR_LEN];
    int summed = 0;
    /* distributed DP: the sum is accounted (and stored) before it exists,
     * once an attempt, whether its round commits or not: a failed commit
     * does not take back what the coordinator saw */
    if (r->set.dp_distributed && s->mu_summed == 0) {
        double mu = s->p.mu * s->n_masked / s->p.noise_sites;
        PrivacyAccount after = r->dp_account;
        privacy_add_skellam(&after, mu, s->p.l1, s->p.l2);
        double eps = privacy_account_epsilon(&after, r->set.dp_delta, NULL);
        if (r->set.dp_budget > 0 && eps > r->set.dp_budget) {
            snprintf(why, len,
                     "[privacy] epsilon_budget %g would be passed by this sum (epsilon %.4g): it "
                     "is not unmasked, and the federation ends",
                     r->set.dp_budget, eps);
            r->dp_spent = 1;
            return -1;
        }
        pthread_mutex_lock(&co->store_lock);
        int rc = store_round_noise(co->store, r->round_id, sqrt(mu) / s->p.l2, mu, s->p.l1,
                                   r->set.dp_delta, err);
        pthread_mutex_unlock(&co->store_lock);
        if (rc != 0) {
            snprintf(why, len,
                     "distributed DP: the sum's noise cannot be recorded (%s); it is not "
                     "unmasked",
                     err);
            return -1;
        }
        r->dp_account = after, s->mu_summed = mu;
    }
    if (secagg_server_unmask(s->srv, r->sum.sum, &summed, err) != 0) {
        snprintf(why, len, "%s", err);
        return -1;
    }
    for (uint64_t i = 0; i < r->sum.n; i++) r->sum.sum[i] /= (float)summed;
    r->sum.touched = 1, r->sum.accepted = summed, r->sum.weight = 1;
    s->phase = PH_DONE;
    log_info("secagg", "round %lld: the sum of %d masked updates unmasked", (long long)r->number,
             summed);
    return 0;
}

/* Moves the attempt's phases on as far as they go now. 1: unmasked (the
 * round's sum holds the mean: close it); 0: waiting; -1: the attempt
 * fails, why says so. */
static int advance(Coordinator *co, int64_t now, SaOut *out, char *why, size_t len) {
    Rounds *r = &co->rounds;
    SecaggRound *s = r->sa;
    int64_t timeout = r->set.secagg_timeout_ms;
    if (s->phase == PH_KEYS && s->n > 0) {
        /* every active site's keys, or the quorum's by the round's deadline
         * (or a phase timeout past the first keys, when they came later) */
        int64_t active = rounds_active_sites(co), quorum = rounds_quorum_of(r, active);
        int64_t due = r->opened_ms + r->set.deadline_ms;
        if (s->first_ms + timeout > due) due = s->first_ms + timeout;
        int all = s->n >= active, late = now >= due;
        if ((all || late) && s->n >= quorum && s->n >= 2) {
            if (fix_cohort(co, out, why, len) != 0) return -1;
        } else if (late) {
            snprintf(why, len,
                     "secure aggregation: %d sites sent keys by the deadline, fewer than the "
                     "quorum of %lld",
                     s->n, (long long)(quorum > 2 ? quorum : 2));
            return -1;
        }
    }
    if (s->phase == PH_SHARES) {
        int all = s->n_shared == s->n, late = now >= s->phase_ms + timeout;
        if (all || (late && s->n_shared >= s->p.t)) {
            if (close_shares(co, out, why, len) != 0) return -1;
        } else if (late) {
            snprintf(why, len,
                     "secure aggregation: %d of the cohort's %d sites shared their seeds in "
                     "time, fewer than %d",
                     s->n_shared, s->n, s->p.t);
            return -1;
        }
    }
    if (s->phase == PH_MASKED) {
        /* the stragglers' timeout runs from the first masked update (its
         * upload's time is the others' too), the round's deadline past the
         * shares when none came */
        int all = s->n_masked == s->n_shared;
        int late =
            s->first_ms ? now >= s->first_ms + timeout : now >= s->phase_ms + r->set.deadline_ms;
        if (all || late)
            if (close_masked(co, out, why, len) != 0) return -1;
    }
    if (s->phase == PH_REVEAL) {
        /* tried once every secret has t shares; when shares lie, again with
         * each survivor's reveal that comes, until they all have */
        int all = 1;
        for (int i = 0; i < s->n; i++) all &= !s->survived[i] || s->revealed[i];
        if (secagg_server_ready(s->srv) && s->n_revealed_tried != s->n_revealed) {
            s->n_revealed_tried = s->n_revealed;
            if (unmask(co, why, len) == 0) return 1;
            if (all) return -1;
            log_warn("secagg", "round %lld: %s; waiting for the other survivors' shares",
                     (long long)r->number, why);
        }
        if (now >= s->phase_ms + timeout) {
            snprintf(why, len,
                     "secure aggregation: too few survivors revealed their shares in "
                     "time to unmask the sum");
            return -1;
        }
    }
    return 0;
}

int secagg_round_tick(Coordinator *co, int64_t now, char *why, size_t len) {
    Rounds *r = &co->rounds;
    SaOut *out = &r->sa_out;
    if (r->sa == NULL || r->state != ROUND_OPEN || r->sa->phase == PH_DONE) return 0;
    /* parked calls whose site has gone are let go */
    SecaggRound *s = r->sa;
    for (int i = 0; i < s->n_parked;) {
        if (net_call_cancelled(s->parked[i].call, 0)) {
            out_add(out, s->parked[i].call, NULL, 0, NET_CANCELLED, "cancelled");
            s->parked[i] = s->parked[--s->n_parked];
        } else {
            i++;
        }
    }
    return advance(co, now, out, why, len);
}

int secagg_round_noise(const Rounds *r, double *mu, double *l1, double *l2) {
    const SecaggRound *s = r->sa;
    if (s == NULL || s->phase != PH_DONE || s->p.clip <= 0) return -1;
    *mu = s->mu_summed, *l1 = s->p.l1, *l2 = s->p.l2; /* as unmask accounted it */
    return 0;
}

/* ---- a masked update ---------------------------------------------------------------- */

const char *secagg_round_check(Coordinator *co, const char *site, const uint8_t *blob, size_t len,
                               char *why, size_t why_len) {
    Rounds *r = &co->rounds;
    SecaggRound *s = r->sa;
    SecaggMasked h;
    char err[ERR_LEN];
    if (secagg_masked_parse(blob, len, &h, err) != 0) {
        snprintf(why, why_len, "%s", err);
        return "malformed";
    }
    int i = find(s, site);
    if (h.attempt != (uint64_t)s->attempt || s->phase != PH_MASKED || i < 0 || !s->shared[i]) {
        snprintf(why, why_len,
                 "a masked update for attempt %llu; attempt %lld is %s%s: start the round's "
                 "phases again",
                 (unsigned long long)h.attempt, (long long)s->attempt,
                 s->phase == PH_MASKED ? "taking masked updates" : "not taking masked updates",
                 i < 0 || (s->shared && !s->shared[i]) ? ", and not from this site" : "");
        return "stale_round";
    }
    if (h.index != (uint32_t)i || h.bits != s->p.bits || h.n != r->model.n_params) {
        snprintf(why, why_len,
                 "a masked update of site %u, %d bits, %llu values; this attempt takes site "
                 "%d's, %d bits, %llu values",
                 h.index, h.bits, (unsigned long long)h.n, i, s->p.bits,
                 (unsigned long long)r->model.n_params);
        return "malformed";
    }
    return NULL;
}

const char *secagg_round_add(Coordinator *co, const char *site, const uint8_t *blob, size_t len,
                             char *why, size_t why_len) {
    SecaggRound *s = co->rounds.sa;
    char err[ERR_LEN];
    if (secagg_server_add(s->srv, find(s, site), blob, len, err) != 0) {
        snprintf(why, why_len, "%s", err);
        return "duplicate";
    }
    if (s->n_masked++ == 0) s->first_ms = time_wall_ms();
    return NULL;
}

int secagg_round_after_push(Coordinator *co, char *why, size_t len) {
    if (co->rounds.sa == NULL) return 0;
    return advance(co, time_wall_ms(), &co->rounds.sa_out, why, len);
}

/* ---- the SecAgg call ---------------------------------------------------------------- */

/* Checks and takes a request under rounds.lock. NET_OK with *parked: the
 * call waits; NET_OK without: *now (packed, len) answers it at once; else
 * refused with details. A retried SHARES, SURVIVORS or REVEAL (its answer
 * lost) gets the answer the first one got. */
static NetStatus take(Coordinator *co, NetCall *c, const char *site, const Strait__SecAggRequest *q,
                      int *parked, uint8_t **now, size_t *now_len, char *details, size_t len) {
    Rounds *r = &co->rounds;
    SecaggRound *s = r->sa;
    char err[ERR_LEN];
    *parked = 0, *now = NULL;
    if (s == NULL) {
        snprintf(details, len, "secure aggregation is off in this federation");
        return NET_FAILED_PRECONDITION;
    }
    if (r->stop) {
        snprintf(details, len, "the coordinator is stopping; try again when it is back");
        return NET_UNAVAILABLE;
    }
    if (r->state != ROUND_OPEN || q->round != (uint64_t)r->number) {
        snprintf(details, len, "round %llu is not open (the federation is at round %lld, %s)",
                 (unsigned long long)q->round, (long long)r->number,
                 r->state == ROUND_FINISHED ? "finished" : "between attempts or rounds");
        return NET_FAILED_PRECONDITION;
    }
    if (q->phase != SA_KEYS && q->attempt != (uint64_t)s->attempt) {
        snprintf(details, len, "attempt over: round %lld is at another attempt",
                 (long long)r->number);
        return NET_FAILED_PRECONDITION;
    }
    int i = find(s, site);
    int answer_now = -1; /* the phase whose answer goes at once */
    switch (q->phase) {
    case SA_KEYS: {
        if (s->phase != PH_KEYS) {
            snprintf(details, len, "attempt over: this attempt's cohort is fixed without site %s",
                     site);
            return NET_FAILED_PRECONDITION;
        }
        if (q->advert.len != ADVERT_LEN) {
            snprintf(details, len, "a SecAgg advert of %zu bytes, not %d", q->advert.len,
                     ADVERT_LEN);
            return NET_INVALID_ARGUMENT;
        }
        SecaggAdvert ad;
        memcpy(&ad, q->advert.data, ADVERT_LEN);
        /* keys no one can agree with are refused here, not in every site */
        SecaggKeys probe;
        uint8_t seed[SECAGG_KEY];
        if (secagg_keygen(&probe, err) != 0 ||
            secagg_agree(&probe, ad.c_pub, "probe", seed, err) != 0 ||
            secagg_agree(&probe, ad.s_pub, "probe", seed, err) != 0) {
            snprintf(details, len, "%s", err);
            return NET_INVALID_ARGUMENT;
        }
        if (i < 0) {
            if (s->n == s->cap) {
                int cap = s->cap ? 2 * s->cap : 16;
                char(*nn)[65] = realloc(s->name, (size_t)cap * sizeof *nn);
                if (nn) s->name = nn;
                SecaggAdvert *na = realloc(s->ad, (size_t)cap * sizeof *na);
                if (na) s->ad = na;
                if (!nn || !na) {
                    snprintf(details, len, "out of memory");
                    return NET_RESOURCE_EXHAUSTED;
                }
                s->cap = cap;
            }
            i = s->n++;
            snprintf(s->name[i], sizeof s->name[i], "%s", site);
            if (s->first_ms == 0) s->first_ms = time_wall_ms();
        } else { /* a retried call: its new keys; the old call is let go */
            for (int k = 0; k < s->n_parked; k++)
                if (s->parked[k].index == i) s->parked[k].index = -1;
        }
        s->ad[i] = ad;
        break;
    }
    case SA_SHARES: {
        if (i < 0 || s->phase < PH_SHARES) {
            snprintf(details, len, "attempt over: site %s is not in this attempt's cohort", site);
            return NET_FAILED_PRECONDITION;
        }
        if (s->shared[i]) { /* a retry: what the first call gets */
            if (s->phase > PH_SHARES) answer_now = SA_SHARES;
            for (int k = 0; k < s->n_parked; k++)
                if (s->parked[k].index == i && s->parked[k].phase == SA_SHARES)
                    s->parked[k].index = -1;
            break;
        }
        if (s->phase != PH_SHARES) {
            snprintf(details, len, "attempt over: the shares of this attempt are closed");
            return NET_FAILED_PRECONDITION;
        }
        /* exactly one envelope to each neighbour: a site that shares with
         * some alone would leave the others' pair masks in the sum */
        int want = 0;
        for (int j = 0; j < s->n; j++) want += secagg_neighbours(i, j, s->n, s->p.k);
        if ((int)q->n_envelopes != want) {
            snprintf(details, len, "%zu envelopes; site %d has %d neighbours, one each",
                     q->n_envelopes, i, want);
            return NET_INVALID_ARGUMENT;
        }
        for (size_t e = 0; e < q->n_envelopes; e++) {
            const Strait__SecAggEnvelope *v = q->envelopes[e];
            if (v->from != (uint32_t)i || v->to >= (uint32_t)s->n || v->box.len != SECAGG_BOX ||
                !secagg_neighbours(i, (int)v->to, s->n, s->p.k)) {
                snprintf(details, len,
                         "envelope %zu is not from site %d to one of its neighbours, or not %d "
                         "bytes",
                         e, i, SECAGG_BOX);
                return NET_INVALID_ARGUMENT;
            }
            for (size_t f = 0; f < e; f++)
                if (q->envelopes[f]->to == v->to) {
                    snprintf(details, len, "two envelopes to site %u", v->to);
                    return NET_INVALID_ARGUMENT;
                }
        }
        if (s->n_env + (int)q->n_envelopes > s->cap_env) {
            int cap = s->n_env + (int)q->n_envelopes + 64;
            SecaggEnvelope *grown = realloc(s->env, (size_t)cap * sizeof *grown);
            if (grown == NULL) {
                snprintf(details, len, "out of memory");
                return NET_RESOURCE_EXHAUSTED;
            }
            s->env = grown, s->cap_env = cap;
        }
        for (size_t e = 0; e < q->n_envelopes; e++) {
            SecaggEnvelope *d = &s->env[s->n_env++];
            d->from = i, d->to = (int)q->envelopes[e]->to;
            memcpy(d->box, q->envelopes[e]->box.data, SECAGG_BOX);
        }
        s->shared[i] = 1, s->n_shared++;
        break;
    }
    case SA_SURVIVORS:
        if (i < 0 || !s->shared || !s->shared[i] ||
            (s->phase != PH_MASKED && s->phase != PH_REVEAL)) {
            snprintf(details, len, "attempt over: no masked update of site %s is awaited", site);
            return NET_FAILED_PRECONDITION;
        }
        if (s->phase == PH_REVEAL) answer_now = SA_SURVIVORS; /* closed already */
        break;
    case SA_REVEAL: {
        if (s->phase != PH_REVEAL || i < 0) {
            snprintf(details, len, "attempt over: the sum is not being unmasked");
            return NET_FAILED_PRECONDITION;
        }
        if (s->revealed[i]) { /* a retry whose first answer was lost */
            answer_now = SA_REVEAL;
            break;
        }
        int n = (int)q->n_reveals;
        if (n > SECAGG_MAX_DEGREE + 1) {
            snprintf(details, len, "%d reveals; a site has at most %d", n, SECAGG_MAX_DEGREE + 1);
            return NET_INVALID_ARGUMENT;
        }
        SecaggReveal rv[SECAGG_MAX_DEGREE + 1];
        for (int e = 0; e < n; e++) {
            const Strait__SecAggReveal *v = q->reveals[e];
            if (v->owner >= (uint32_t)s->n || v->share.len != SECAGG_SHARE) {
                snprintf(details, len, "reveal %d: site %u, %zu bytes", e, v->owner, v->share.len);
                return NET_INVALID_ARGUMENT;
            }
            rv[e].owner = (int)v->owner, rv[e].key = v->key;
            memcpy(rv[e].share, v->share.data, SECAGG_SHARE);
        }
        if (secagg_server_reveal(s->srv, i, rv, n, err) != 0) {
            snprintf(details, len, "%s", err);
            return NET_INVALID_ARGUMENT;
        }
        s->revealed[i] = 1, s->n_revealed++;
        answer_now = SA_REVEAL;
        break;
    }
    default:
        snprintf(details, len, "SecAgg phase %u; use 1 to 4", q->phase);
        return NET_INVALID_ARGUMENT;
    }
    if (answer_now >= 0) {
        if ((*now = answer_of(r, answer_now, i, now_len)) == NULL) {
            snprintf(details, len, "out of memory");
            return NET_RESOURCE_EXHAUSTED;
        }
        return NET_OK;
    }
    if (park(s, c, (int)q->phase, i) != 0) {
        snprintf(details, len, "cannot hold the call (too many waiting); call again");
        return NET_UNAVAILABLE;
    }
    *parked = 1;
    return NET_OK;
}

void h_secagg(NetCall *c, void *user) {
    Coordinator *co = user;
    Rounds *r = &co->rounds;
    StoreSite site;
    if (coordinator_authorize_site(co, c, &site) != 0) return;
    Strait__SecAggRequest *q;
    READ_REQUEST(c, SecAggRequest, strait__sec_agg_request, q);
    char details[ERR_LEN], why[ERR_LEN];
    int parked = 0;
    uint8_t *now = NULL;
    size_t len = 0;
    RoundClosing *closing = NULL;
    rounds_lock(r);
    NetStatus st = take(co, c, site.name, q, &parked, &now, &len, details, sizeof details);
    if (st == NET_OK) {
        int moved = advance(co, time_wall_ms(), &r->sa_out, why, sizeof why);
        if (moved == 1) closing = rounds_close(co);
        if (moved < 0) rounds_fail(co, why);
    }
    pthread_mutex_unlock(&r->lock);
    strait__sec_agg_request__free_unpacked(q, NULL);
    secagg_round_flush(r);
    if (st != NET_OK)
        net_call_status(c, st, "%s", details);
    else if (!parked)
        net_call_send(c, now, len);
    free(now);
    if (closing) { /* the commit on this worker, outside the lock */
        if (!parked) net_call_end(c);
        rounds_commit(co, closing);
    }
}
