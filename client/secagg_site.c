/*
 * secagg_site.c — a site's round under secure aggregation ([privacy]
 * secure_aggregation = on; docs/privacy.md): its update x = β e + Δ (error
 * feedback, no codec) goes through the SecAgg phases (privacy/
 * secagg_proto.c over the SecAgg call; coordinator/secagg_round.c) — its
 * keys, its seeds' shares sealed to its neighbours, its masked update
 * through PushUpdate, the survivors, its reveals — and e becomes what the
 * sum did not take of x. An attempt that fails starts again with new keys;
 * a round that moves on ends it (x stays in e for the next round).
 */
#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "client_internal.h"
#include "privacy/privacy.h"
#include "security/security.h"

enum { SA_KEYS = 1, SA_SHARES = 2, SA_SURVIVORS = 3, SA_REVEAL = 4 };
#define PHASE_TIMEOUT_MS (30 * 60 * 1000) /* a parked phase waits on others' training */

/* One SecAgg call, retried while transient. NET_OK with *out, or the
 * coordinator's status with details. */
static NetStatus call(Session *ss, const Strait__SecAggRequest *q, Strait__SecAggResponse **out,
                      char *details) {
    size_t n = strait__sec_agg_request__get_packed_size(q);
    uint8_t *buf = malloc(n ? n : 1);
    if (buf == NULL) {
        snprintf(details, 256, "out of memory");
        return NET_RESOURCE_EXHAUSTED;
    }
    strait__sec_agg_request__pack(q, buf);
    NetStatus st;
    for (int attempt = 0;; attempt++) {
        NetBuf resp;
        st = net_unary(ss->s.ch, "/strait.Federation/SecAgg", buf, n, &resp, PHASE_TIMEOUT_MS,
                       details, 256);
        if (st == NET_OK) {
            *out = strait__sec_agg_response__unpack(NULL, resp.len, resp.data);
            net_buf_free(&resp);
            if (*out == NULL) {
                snprintf(details, 256, "malformed SecAgg answer");
                st = NET_INTERNAL;
            }
            break;
        }
        if (!site_transient(st) || q->phase == SA_KEYS) break; /* KEYS: again with new keys */
        log_warn("site", "SecAgg phase %u: %s (%s); retrying", q->phase, net_status_name(st),
                 details);
        site_retry_wait(&ss->s, attempt);
    }
    free(buf);
    return st;
}

/* What a peer or the coordinator sent that this site cannot take: said,
 * and the attempt is over (1), never the site. */
static int peer_fault(uint64_t round, char *err, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static int peer_fault(uint64_t round, char *err, const char *fmt, ...) {
    char what[ERR_LEN];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(what, sizeof what, fmt, ap);
    va_end(ap);
    log_warn("site", "round %llu: %s; this attempt is over for this site",
             (unsigned long long)round, what);
    err[0] = '\0';
    return 1;
}

/* What one attempt needs, freed whatever happens. */
typedef struct Attempt {
    SecaggSite *me;
    SecaggAdvert *cohort;
    SecaggEnvelope out[SECAGG_MAX_DEGREE], *in;
    uint32_t *y;
    float *sent;
    Blob blob;
    Strait__SecAggResponse *keys, *shares, *survivors;
} Attempt;

static void attempt_free(Attempt *a) {
    secagg_site_free(a->me);
    free(a->cohort), free(a->in), free(a->y), free(a->sent);
    blob_free(&a->blob);
    if (a->keys) strait__sec_agg_response__free_unpacked(a->keys, NULL);
    if (a->shares) strait__sec_agg_response__free_unpacked(a->shares, NULL);
    if (a->survivors) strait__sec_agg_response__free_unpacked(a->survivors, NULL);
    memset(a, 0, sizeof *a);
}

/* One attempt of the phases. 0: the update is in the sum and the shares
 * revealed; 1: start again (the attempt is over, or refused the update);
 * 2: the round is no longer open; -1: a local failure (err). */
static int attempt_once(Session *ss, uint64_t round, const float *x, const uint8_t *meta,
                        size_t mlen, Attempt *a, char *err) {
    uint64_t n = ss->m.n_params;
    char details[256];
    SecaggAdvert ad;
    if ((a->me = secagg_site_new(&ad, err)) == NULL) return -1;
    /* KEYS: parked until the cohort is fixed */
    Strait__SecAggRequest q = STRAIT__SEC_AGG_REQUEST__INIT;
    q.round = round, q.phase = SA_KEYS;
    q.advert.data = (uint8_t *)&ad, q.advert.len = sizeof ad;
    NetStatus st = call(ss, &q, &a->keys, details);
    if (st != NET_OK) {
        log_warn("site", "round %llu: SecAgg keys: %s (%s)", (unsigned long long)round,
                 net_status_name(st), details);
        return strstr(details, "attempt over") ? 1 : st == NET_FAILED_PRECONDITION ? 2 : 1;
    }
    Strait__SecAggResponse *k = a->keys;
    SecaggParams p;
    if (k->sites < 2 || k->n_adverts != k->sites || k->index >= k->sites ||
        secagg_params((int)k->sites, (int)k->bits, k->range, k->context, &p, err) != 0)
        return err_set(err,
                       "the coordinator's SecAgg cohort does not hold together (%u sites, "
                       "%zu adverts, index %u)",
                       k->sites, k->n_adverts, k->index);
    /* distributed DP: this site clips and adds its share of the noise */
    if ((k->clip != 0 || k->noise_multiplier != 0) &&
        secagg_params_dp(&p, k->clip, k->noise_multiplier, (int)k->noise_sites, n, err) != 0)
        return peer_fault(round, err, "%s", err);
    if (ss->min_noise > 0 && !(p.clip > 0 && p.noise >= ss->min_noise))
        return err_set(err,
                       "the coordinator asks for %s, under this site's floor of noise multiplier "
                       "%g (--min-noise): nothing is sent",
                       p.clip > 0 ? "less noise" : "no differential privacy", ss->min_noise);
    /* and its losses stay here: they are what the noise hides */
    uint8_t quiet[192];
    if (p.clip > 0) {
        Strait__UpdateMeta *um = strait__update_meta__unpack(NULL, mlen, meta);
        if (um == NULL) return err_set(err, "this site's update claims do not unpack");
        um->train_loss = um->eval_loss = um->start_eval_loss = NAN;
        size_t ql = strait__update_meta__get_packed_size(um);
        if (ql <= sizeof quiet) strait__update_meta__pack(um, quiet);
        strait__update_meta__free_unpacked(um, NULL);
        if (ql > sizeof quiet) return err_set(err, "this site's update claims are %zu bytes", ql);
        meta = quiet, mlen = ql;
    }
    a->cohort = calloc(k->sites, sizeof *a->cohort);
    if (a->cohort == NULL) return err_set(err, "out of memory");
    for (uint32_t i = 0; i < k->sites; i++) { /* its own and its neighbours'; others empty */
        int needed = i == k->index || secagg_neighbours((int)k->index, (int)i, p.n, p.k);
        if (!needed && k->adverts[i].len == 0) continue; /* calloc'd: zeros, never read */
        if (k->adverts[i].len != sizeof *a->cohort)
            return peer_fault(round, err, "the coordinator's SecAgg advert %u is %zu bytes", i,
                              k->adverts[i].len);
        memcpy(&a->cohort[i], k->adverts[i].data, sizeof *a->cohort);
    }
    int me = (int)k->index, n_out = 0;
    if (secagg_site_share(a->me, &p, me, a->cohort, a->out, &n_out, err) != 0)
        return peer_fault(round, err, "%s", err); /* a neighbour's key, or not its own */
    /* SHARES: parked until the shares are in */
    Strait__SecAggEnvelope env[SECAGG_MAX_DEGREE], *envp[SECAGG_MAX_DEGREE];
    for (int e = 0; e < n_out; e++) {
        strait__sec_agg_envelope__init(&env[e]);
        env[e].from = (uint32_t)a->out[e].from, env[e].to = (uint32_t)a->out[e].to;
        env[e].box.data = a->out[e].box, env[e].box.len = SECAGG_BOX;
        envp[e] = &env[e];
    }
    q.phase = SA_SHARES, q.attempt = k->attempt;
    q.advert.data = NULL, q.advert.len = 0;
    q.n_envelopes = (size_t)n_out, q.envelopes = envp;
    st = call(ss, &q, &a->shares, details);
    q.n_envelopes = 0, q.envelopes = NULL;
    if (st != NET_OK) {
        log_warn("site", "round %llu: SecAgg shares: %s (%s)", (unsigned long long)round,
                 net_status_name(st), details);
        return 1;
    }
    Strait__SecAggResponse *sh = a->shares;
    if (sh->n_envelopes > SECAGG_MAX_DEGREE)
        return peer_fault(round, err, "the coordinator routed %zu envelopes to this site",
                          sh->n_envelopes);
    a->in = calloc(sh->n_envelopes ? sh->n_envelopes : 1, sizeof *a->in);
    a->y = malloc(n * sizeof *a->y), a->sent = malloc(n * sizeof *a->sent);
    if (!a->in || !a->y || !a->sent) return err_set(err, "out of memory");
    for (size_t e = 0; e < sh->n_envelopes; e++) {
        if (sh->envelopes[e]->box.len != SECAGG_BOX)
            return peer_fault(round, err, "the coordinator routed an envelope of %zu bytes",
                              sh->envelopes[e]->box.len);
        a->in[e].from = (int)sh->envelopes[e]->from, a->in[e].to = (int)sh->envelopes[e]->to;
        memcpy(a->in[e].box, sh->envelopes[e]->box.data, SECAGG_BOX);
    }
    if (secagg_site_mask(a->me, a->cohort, a->in, (int)sh->n_envelopes, x, n, a->y, a->sent, err) !=
        0)
        return -1;
    /* the masked update, through PushUpdate as any update */
    a->blob.len = secagg_masked_len(n, p.bits);
    if ((a->blob.data = malloc(a->blob.len)) == NULL) return err_set(err, "out of memory");
    secagg_masked_pack(a->y, n, p.bits, (uint32_t)me, k->attempt, a->blob.data);
    uint8_t sha[32];
    security_sha256(a->blob.data, a->blob.len, sha);
    int refused = 0;
    site_upload_as(&ss->s, round, k->attempt, &a->blob, meta, mlen, sha, &refused);
    if (refused) return 1;
    /* taken: the sum holds what it sent if the attempt goes through (its
     * neighbours' shares unmask it, whatever becomes of this site). Under
     * distributed DP what the clip took is dropped, not kept: a site whose
     * updates pass the clip would otherwise carry a residual that grows
     * each round; only what rounding and the range took is kept */
    float *e = ss->ef.e;
    float f = (float)secagg_clip_factor(&p, x, n);
    for (uint64_t i = 0; i < n; i++) e[i] = f * x[i] - a->sent[i];
    /* SURVIVORS, then REVEAL */
    q.phase = SA_SURVIVORS;
    st = call(ss, &q, &a->survivors, details);
    if (st != NET_OK) {
        log_warn("site", "round %llu: SecAgg survivors: %s (%s)", (unsigned long long)round,
                 net_status_name(st), details);
        return 1;
    }
    if (a->survivors->survived.len != k->sites)
        return peer_fault(round, err, "the coordinator's survivors are %zu bytes for %u sites",
                          a->survivors->survived.len, k->sites);
    SecaggReveal rv[SECAGG_MAX_DEGREE + 1];
    int n_rv = 0;
    if (secagg_site_reveal(a->me, a->survivors->survived.data, rv, &n_rv, err) != 0) {
        log_warn("site", "round %llu: %s", (unsigned long long)round, err);
        return 1;
    }
    Strait__SecAggReveal r[SECAGG_MAX_DEGREE + 1], *rp[SECAGG_MAX_DEGREE + 1];
    for (int e = 0; e < n_rv; e++) {
        strait__sec_agg_reveal__init(&r[e]);
        r[e].owner = (uint32_t)rv[e].owner, r[e].key = rv[e].key;
        r[e].share.data = rv[e].share, r[e].share.len = SECAGG_SHARE;
        rp[e] = &r[e];
    }
    q.phase = SA_REVEAL, q.n_reveals = (size_t)n_rv, q.reveals = rp;
    Strait__SecAggResponse *done = NULL;
    st = call(ss, &q, &done, details);
    if (done) strait__sec_agg_response__free_unpacked(done, NULL);
    if (st != NET_OK) {
        log_warn("site", "round %llu: SecAgg reveal: %s (%s)", (unsigned long long)round,
                 net_status_name(st), details);
        return 1;
    }
    log_info("site", "round %llu: masked update summed (attempt %llu, site %d of %u)",
             (unsigned long long)round, (unsigned long long)k->attempt, me, k->sites);
    return 0;
}

int site_secagg_send(Session *ss, uint64_t round, const float *x, const uint8_t *meta, size_t mlen,
                     char *err) {
    for (uint64_t i = 0; i < ss->m.n_params; i++)
        if (!isfinite(x[i]))
            return err_set(err, "value %llu of this site's update is not finite; nothing is sent",
                           (unsigned long long)i);
    memcpy(ss->ef.e, x, ss->m.n_params * sizeof *x); /* nothing of it taken yet */
    for (int tries = 0;; tries++) {
        Attempt a;
        memset(&a, 0, sizeof a);
        int rc = attempt_once(ss, round, x, meta, mlen, &a, err);
        attempt_free(&a);
        if (rc == 0) return 0;
        if (rc == 2) { /* not open (between attempts, committing, moved): WaitRound says which */
            usleep(1000000);
            return 0;
        }
        if (rc < 0) return -1;
        log_info("site", "round %llu: secure aggregation's attempt is over; starting again",
                 (unsigned long long)round);
        site_retry_wait(&ss->s, tries < 3 ? 0 : tries);
    }
}
