/*
 * ledger.c — what the round remembers between calls, as plain data under
 * rounds.lock, calling nothing above it: the sites' arrivals and the
 * deadlines drawn from them (the quorum's pace, the adaptive deadline, when
 * a site is late or away), recent rounds' model hashes, the newest model
 * each site was served, the sites in the open round and their counts, and
 * the bases and weights a round takes. rounds.c (the state machine),
 * round_calls.c (the calls) and publish.c (the next model) read and write
 * it; it includes no file of theirs.
 */
#include <assert.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "coordinator_internal.h"

/* Grows *p (of *cap elements of size elem) to hold need; 0, or -1 (*p as
 * it was) when out of memory. */
static int grow(void **p, int *cap, int need, size_t elem) {
    if (need <= *cap) return 0;
    int want = *cap ? *cap : 16;
    while (want < need) want *= 2;
    void *q = realloc(*p, (size_t)want * elem);
    if (q == NULL) return -1;
    *p = q, *cap = want;
    return 0;
}

int rounds_reserve(Rounds *r, int need) {
    if (need <= r->cap_reports) return 0;
    int cap = r->cap_reports, c1 = cap, c2 = cap;
    void *a = r->reported, *b = r->upd, *k = r->kept_owner;
    int ok = grow(&a, &cap, need, sizeof r->reported[0]) == 0;
    r->reported = a; /* grown or not, still valid */
    ok = ok && grow(&b, &c1, need, sizeof r->upd[0]) == 0;
    r->upd = b;
    ok = ok && grow(&k, &c2, need, sizeof r->kept_owner[0]) == 0;
    r->kept_owner = k;
    if (!ok) return -1; /* cap_reports stays what all three hold */
    assert(cap == c1 && c1 == c2);
    r->cap_reports = cap;
    return 0;
}

void rounds_arrival(Rounds *r, int64_t site_id, int64_t round, int64_t attempt, int64_t ms) {
    SiteArrivals *a = NULL;
    for (int i = 0; i < r->n_arrivals && !a; i++)
        if (r->arrivals[i].site_id == site_id) a = &r->arrivals[i];
    if (a == NULL) {
        void *p = r->arrivals;
        int rc = grow(&p, &r->cap_arrivals, r->n_arrivals + 1, sizeof r->arrivals[0]);
        r->arrivals = p;
        if (rc != 0) return; /* out of memory: this one is not counted */
        a = &r->arrivals[r->n_arrivals++];
        memset(a, 0, sizeof *a);
        a->site_id = site_id;
        a->last_round = -1;
    }
    if (round > a->last_round) a->last_round = round;
    if (round == 0 || attempt != 1) return;
    a->ms[a->next] = ms < 0 ? 0 : ms;
    a->next = (a->next + 1) % ARRIVAL_HISTORY;
    if (a->n < ARRIVAL_HISTORY) a->n++;
}

static int cmp_i64(const void *x, const void *y) {
    int64_t a = *(const int64_t *)x, b = *(const int64_t *)y;
    return (a > b) - (a < b);
}

/* a's 90th-percentile arrival (rounded up), or -1 below three rounds */
static int64_t arrival_q90(const SiteArrivals *a) {
    if (a->n < 3) return -1; /* too few rounds to say */
    int64_t ms[ARRIVAL_HISTORY];
    memcpy(ms, a->ms, sizeof ms[0] * (size_t)a->n);
    qsort(ms, (size_t)a->n, sizeof ms[0], cmp_i64);
    return ms[(a->n * 9 + 9) / 10 - 1];
}

int64_t rounds_pace(const Rounds *r) {
    int64_t *q90 = malloc(sizeof *q90 * (size_t)(r->n_arrivals ? r->n_arrivals : 1));
    if (q90 == NULL) return 0; /* out of memory: as before any round said it */
    int n = 0;
    for (int i = 0; i < r->n_arrivals; i++) {
        const SiteArrivals *a = &r->arrivals[i];
        int64_t q = a->last_round >= r->number - ARRIVAL_HISTORY ? arrival_q90(a) : -1;
        if (q >= 0) q90[n++] = q;
    }
    qsort(q90, (size_t)n, sizeof q90[0], cmp_i64);
    /* the upper middle one; 1 ms at least, as 0 says none */
    int64_t pace = n == 0 ? 0 : q90[n / 2] > 0 ? q90[n / 2] : 1;
    free(q90);
    return pace;
}

int64_t rounds_adaptive_deadline(const Rounds *r) {
    if (r->pace_ms == 0) return 0;
    return 2 * r->pace_ms > 1000 ? 2 * r->pace_ms : 1000;
}

static const SiteArrivals *site_arrivals(const Rounds *r, int64_t site_id) {
    for (int i = 0; i < r->n_arrivals; i++)
        if (r->arrivals[i].site_id == site_id) return &r->arrivals[i];
    return NULL;
}

/* a's 90th percentile and half again, a second at least; 0 below three rounds */
static int64_t arrival_due(const SiteArrivals *a) {
    int64_t q90 = a ? arrival_q90(a) : -1;
    if (q90 < 0) return 0;
    return q90 + (q90 / 2 > 1000 ? q90 / 2 : 1000);
}

/* the quorum's usual arrival and a quarter again, a second at least; 0: no pace yet */
int64_t rounds_pace_due(const Rounds *r) {
    if (r->pace_ms == 0) return 0;
    return r->pace_ms + (r->pace_ms / 4 > 1000 ? r->pace_ms / 4 : 1000);
}

int64_t rounds_site_due(const Rounds *r, int64_t site_id) {
    int64_t own = arrival_due(site_arrivals(r, site_id)), quorum = rounds_pace_due(r);
    return own > 0 && (quorum == 0 || own < quorum) ? own : quorum;
}

SiteWait rounds_site_wait(const Rounds *r, const StoreSite *site, int64_t now, int64_t *due) {
    const SiteArrivals *a = site_arrivals(r, site->id);
    *due = r->extensions == 0 ? rounds_site_due(r, site->id) : 0;
    if (!(a && a->last_round == r->number - 1) && site->last_seen < r->opened_ms) return SITE_AWAY;
    return *due > 0 && now >= r->opened_ms + *due ? SITE_LATE : SITE_WAITED;
}

void rounds_history_add(Rounds *r, int64_t round, const uint8_t sha[32]) {
    if (round < 0) return;
    int slot = (int)(round % MODEL_HISTORY);
    memcpy(r->hist_sha[slot], sha, 32);
    r->hist_round[slot] = round;
}

const uint8_t *rounds_history_sha(const Rounds *r, int64_t round) {
    if (round < 0) return NULL;
    int slot = (int)(round % MODEL_HISTORY);
    return r->hist_round[slot] == round ? r->hist_sha[slot] : NULL;
}

int rounds_reported(const Rounds *r, const char *site) {
    for (int i = 0; i < r->n_reported; i++)
        if (strcmp(r->reported[i], site) == 0) return 1;
    return 0;
}

int rounds_takes_base(const Rounds *r, uint64_t round) {
    if (!r->set.async) return round == (uint64_t)r->number;
    return round <= (uint64_t)r->number && r->number - (int64_t)round <= r->set.staleness;
}

double rounds_staleness_weight(int64_t staleness) {
    return staleness <= 0 ? 1.0 : 1.0 / sqrt(1.0 + (double)staleness);
}

RoundSiteCount *rounds_site_count(Rounds *r, int64_t site_id) {
    for (int i = 0; i < r->n_counts; i++)
        if (r->counts[i].site_id == site_id) return &r->counts[i];
    void *p = r->counts;
    int rc = grow(&p, &r->cap_counts, r->n_counts + 1, sizeof r->counts[0]);
    r->counts = p;
    if (rc != 0) return NULL;
    RoundSiteCount *c = &r->counts[r->n_counts++];
    memset(c, 0, sizeof *c);
    c->site_id = site_id;
    return c;
}

void rounds_served_set(Rounds *r, int64_t site_id, int64_t round) {
    for (int i = 0; i < r->n_served; i++)
        if (r->served[i].site_id == site_id) {
            if (round > r->served[i].round) r->served[i].round = round;
            return;
        }
    void *p = r->served;
    int rc = grow(&p, &r->cap_served, r->n_served + 1, sizeof r->served[0]);
    r->served = p;
    if (rc != 0) return; /* out of memory: the site's claim stands, as after a restart */
    r->served[r->n_served].site_id = site_id;
    r->served[r->n_served++].round = round;
}

int64_t rounds_served(const Rounds *r, int64_t site_id) {
    for (int i = 0; i < r->n_served; i++)
        if (r->served[i].site_id == site_id) return r->served[i].round;
    return -1;
}

int64_t rounds_quorum_of(const Rounds *r, int64_t active) {
    return r->set.min_sites > 0 ? r->set.min_sites : active / 2 + 1;
}
