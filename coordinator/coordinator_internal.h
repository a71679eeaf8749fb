/*
 * coordinator_internal.h — the running coordinator's state, shared by
 * service.c (identity, Join, Hello, Admin) and the round loop (rounds.c,
 * round_calls.c, publish.c).
 * Nothing outside coordinator/ includes it.
 */
#ifndef STRAIT_COORDINATOR_INTERNAL_H
#define STRAIT_COORDINATOR_INTERNAL_H

#include <pthread.h>

#include "compress/compress.h"
#include "coordinator.h"
#include "kernels/formats.h"
#include "kernels/model.h"
#include "net/net.h"
#include "privacy/privacy.h"
#include "store.h"
#include "util/util.h"

#define MAX_WAITERS 4096

/* federation.ini's [rounds], [codec], [optimizer], [model] and the upload
 * limits of [limits], read and checked whole before anything changes. */
typedef struct RoundsSettings {
    /* min_sites 0: a quorum, more than half of the active sites (rounds_quorum) */
    int64_t total, min_sites, deadline_ms, inner_steps, max_extensions;
    int64_t budget_ms; /* training time per round at a site; 0: H steps, however long */
    int64_t seed;
    /* the most a site may train per inner step (all its GPUs together):
     * batch sequences of seq tokens; with inner_steps, the token bound */
    int64_t batch, seq;
    double outer_lr, momentum, trim;
    double adam_eps; /* [optimizer] eps: FedAdam's adaptivity τ */
    double
        max_update_ratio; /* ‖Δ‖ ≤ ratio × ‖θ_0‖ (θ at the start) from the first update (0: off) */
    /* after a round with a quorum: ‖Δ‖ ≤ norm_bound × the median of recent
     * rounds' median accepted norms (0: off) */
    double norm_bound;
    double clip; /* mean: an update is scaled down to clip × the round's median norm (0: off) */
    double weight_cap; /* a weight counts at most weight_cap × the round's median claim (0: off) */
    /* [rounds] robust_start: a mean round before the federation has norms
     * of its own (RoundClosing.no_history) takes the coordinate-wise median
     * of three updates or more, and caps weights and norms at 1 × the
     * round's median below three */
    int robust_start;
    AggregateRule rule; /* [rounds] aggregate */
    /* [rounds] adaptive_deadline: a round with its quorum closes at twice
     * the slowest site's 90th-percentile arrival of recent rounds, when
     * that is sooner than the deadline (never later) */
    int adaptive_deadline;
    /* [rounds] overlap: round r also takes updates trained from θ_{r−1}
     * (the one-step-delayed outer step), so sites train while they send */
    int overlap;
    /* [rounds] lookahead (with overlap), 0 to 1: each site trains from
     * the model it holds moved by this fraction of the outer step its own
     * last Δ would make (rounds_lookahead); 0: from the model it holds */
    double lookahead;
    /* [rounds] mode = async: a round merges once its quorum is in and a
     * grace window (grace × the time the quorum took) has passed, and takes
     * updates trained from a model up to `staleness` rounds old, each
     * weighted by tokens / sqrt(1 + its staleness) (FedBuff); older ones are
     * refused as `stale`. sync: a round takes its own model's updates. */
    int async;
    int64_t staleness; /* async only; 0 in sync */
    double grace;
    int keeps_updates; /* the rule keeps updates whole (aggregate_rule_keeps_updates) */
    char recipe[16];   /* [recipe] name: the defaults below came from it */
    CodecParams uplink;
    CodecParams downlink;  /* the outer update sent down, with error feedback here */
    int downlink_lossless; /* instead: the exact model delta (zstd over XORed byte planes) */
    double ef_decay;       /* the sites' error feedback decay */
    OuterKind outer;
    int64_t spool_bytes, spool_site_bytes; /* 0 per site: three updates' worth */
    int64_t upload_header_ms, upload_idle_ms, upload_life_ms;
    int64_t upload_min_rate, upload_grace_ms; /* bytes/s an upload keeps up after its grace */
    int64_t
        refusals; /* refused updates a site may send a round before it is refused at the header */
    int64_t downloads; /* GetModel calls a site may make a round */
    /* [store] keep_last and keep_every; keep_back: the models before the
     * newest a restart reads back (the round before's for the delta it
     * serves; async rounds' `staleness`) */
    StoreRetention retain;
    /* [privacy] dp = central (docs/privacy.md): each update clipped to
     * dp_clip (L2) and weighed alike, the mean given Gaussian noise of
     * dp_noise × dp_clip / n (n: the round's updates), ε at dp_delta
     * accounted, and no round past dp_budget (0: none); dp 0: off */
    int dp;
    /* dp = distributed: no clip nor noise here; each site clips and adds
     * its share of Skellam noise under secure aggregation (secagg_round.c) */
    int dp_distributed;
    double dp_clip, dp_noise, dp_delta, dp_budget;
    /* [privacy] secure_aggregation: each round's updates summed masked
     * (privacy/secagg_proto.c), every value clipped to ±secagg_range at its
     * site and quantized in secagg_bits (0: 9 + log2 of the cohort), each
     * phase waited on for secagg_timeout_ms past its first arrival */
    int secagg;
    double secagg_range;
    int64_t secagg_bits, secagg_timeout_ms;
} RoundsSettings;

/* A model as GetModel serves it: the checkpoint file mapped read-only (page
 * cache, resident only while read) or a delta blob on the heap, with its
 * SHA-256. Downloads in flight share it instead of copying it: refs, under
 * rounds.lock, and the last one frees it. */
typedef struct Served {
    int refs;
    uint8_t *data;
    size_t len, mapped; /* mapped: data is a map of that length; else on the heap */
    uint8_t sha[32];
} Served;

/* One delta of the chain a site that fell behind may take: the way from
 * round `from`'s model (whose SHA-256 is base_sha) to the next round's. */
#define DELTA_CHAIN 16 /* links at most */
typedef struct DeltaLink {
    Served *sv; /* a ref */
    int64_t from;
    uint8_t base_sha[32];
} DeltaLink;

/* A WaitRound parked until its round moves (or its poll expires). */
typedef struct Waiter {
    NetCall *call;
    int64_t after_round, expires_ms;
    char site[65];
} Waiter;

/* An accepted update as the round holds it until it closes: the claims it
 * is judged by there (the weight against the round's median claim, the
 * norm against the median norm), its reports, and for the mean its bytes —
 * the map of its spooled upload (unlinked; pages let go once it is added),
 * so that a close that must re-weigh or clip updates can add them again. */
typedef struct RoundUpdate {
    double weight, norm;            /* claimed tokens; ‖Δ‖ */
    double train, eval, start_eval; /* reported losses (NaN: none) */
    uint8_t *data;                  /* owned map; NULL for the robust rules (kept files) */
    size_t len, mapped;
} RoundUpdate;

/* What one site did in the open round beyond its update, keyed by site id. */
typedef struct RoundSiteCount {
    int64_t site_id;
    int refused;             /* updates refused */
    int downloads;           /* GetModel calls of the checkpoint or the delta */
    int got_ckpt, got_delta; /* bytes_down counts each model once per site and round */
    struct {                 /* the same for each link of the chain, by the round it starts */
        int64_t from;
        int downloads, got;
    } links[DELTA_CHAIN];
    int n_links;
} RoundSiteCount;

#define NORM_HISTORY    5                   /* rounds whose median norms set the bound */
#define ARRIVAL_HISTORY 8                   /* rounds whose arrivals set the adaptive deadline */
#define MAX_STALENESS   16                  /* [rounds] staleness at most */
#define MODEL_HISTORY   (MAX_STALENESS + 1) /* the current model's hash and those before */

/* When a site's accepted updates arrived in recent rounds, in ms after
 * their round opened (a ring of the last ARRIVAL_HISTORY, round 0 left
 * out), and the last round that took one. */
typedef struct SiteArrivals {
    int64_t site_id;
    int64_t ms[ARRIVAL_HISTORY];
    int n, next;
    int64_t last_round;
} SiteArrivals;

/* The round's state (rounds.c draws the machine and asserts each move).
 * `stop` is apart: the coordinator shutting down, in any state. */
typedef enum RoundState {
    ROUND_NONE,       /* not started */
    ROUND_OPEN,       /* taking updates */
    ROUND_COMMITTING, /* closed: its successor is being built and committed */
    ROUND_UNOPENED,   /* the store could not open it: no update is taken; retried */
    ROUND_FINISHED    /* every round has committed */
} RoundState;

/* Secure aggregation's answers to parked SecAgg calls, made under
 * rounds.lock and sent after it (secagg_round_flush). */
typedef struct SaAnswer {
    NetCall *call;
    uint8_t *data; /* owned; NULL with a status */
    size_t len;
    NetStatus code;
    char details[300];
} SaAnswer;
typedef struct SaOut {
    SaAnswer *a;
    int n, cap;
} SaOut;
typedef struct SecaggRound SecaggRound;

typedef struct Rounds {
    Model model;        /* θ of the current round in model.params; owned */
    OuterOpt outer;     /* owned */
    RoundSum sum;       /* owned */
    float *spare_stage; /* owned: a closed round's stage, for the next round's sum */
    RoundsSettings set; /* as read at start; never changes while serving */
    /* robust rounds: the updates kept whole, each a file in its site's
     * spool folder ("site-ID"), named kept-rN.blob; cap_reports long, owned */
    char (*kept_owner)[32];
    int n_kept;
    int64_t max_tokens;        /* inner_steps × batch × seq: an update's largest weight */
    uint64_t max_update_bytes; /* the largest blob the federation's codec makes */
    double theta_norm;         /* ‖θ_r‖, for the absolute norm bound */
    double last_commit_s;      /* how long the last commit took; NAN: none since the start */
    Waiter *waiters;           /* owned */
    int n_waiters, cap_waiters;
    int64_t revocation_check_ms;
    int64_t number, round_id, opened_ms;
    int64_t attempt;  /* the open attempt's, 1 for a round's first */
    RoundState state; /* round_state_set moves it */
    int extensions;
    /* the sites with an accepted update in the round, and beside each its
     * update: cap_reports long (rounds_reserve grows them), owned */
    char (*reported)[65];
    RoundUpdate *upd;
    int n_reported, cap_reports;
    SiteArrivals *arrivals; /* every site's that has reported; owned */
    int64_t pace_ms;        /* the open round's rounds_pace, from earlier rounds; 0: none */
    int64_t adaptive_ms;    /* the open round's adaptive deadline, from earlier rounds; 0: none */
    int64_t away_check_ms;  /* when the ticker next looks for sites away (rounds_rest_away) */
    int n_arrivals, cap_arrivals;
    RoundSiteCount *counts; /* this round's, reset when it opens; owned */
    int n_counts, cap_counts;
    struct Served1 { /* the newest model this process served each site: its round; owned */
        int64_t site_id, round;
    } * served;
    int n_served, cap_served;
    int64_t refusals_unrecorded; /* refusals of this round past the rows kept */
    double theta0_norm; /* ‖θ‖ when this coordinator started: max_update_ratio's base */
    double norm_history[NORM_HISTORY]; /* median accepted norms of recent rounds with a quorum */
    int n_history;
    Served *ckpt;          /* the current model's checkpoint, served by GetModel; a ref */
    uint8_t theta_sha[32]; /* SHA-256 of θ_r's parameters: an update's base must be it */
    /* the SHA-256 of recent rounds' models, a ring by round number (round
     * -1: that slot is empty, as after a restart that could not read the
     * checkpoint): with overlap an update may be trained from θ_{r−1},
     * with async rounds from up to `staleness` rounds before */
    uint8_t hist_sha[MODEL_HISTORY][32];
    int64_t hist_round[MODEL_HISTORY];
    int64_t quorum_ms; /* async: when the open round's quorum was in; 0: not yet */
    /* the way from the previous round's model to the current one, for sites
     * that hold the previous: the outer update in the downlink codec (an
     * update blob; θ_r = θ_{r-1} + decoded, here as at every site) or the
     * lossless delta (XOR byte planes, zstd); a ref, NULL: none */
    Served *delta;
    int64_t delta_from;         /* the round whose model the delta applies to; -1: none */
    uint8_t delta_base_sha[32]; /* SHA-256 of that model's parameters */
    /* the deltas before it, oldest first, each from round `from` to the
     * next: a site that fell behind takes the chain when it is smaller than
     * the checkpoint. Kept while all of them and `delta` add up to at most
     * the checkpoint's bytes, so that they never cost more memory than one
     * model's file */
    DeltaLink chain[DELTA_CHAIN];
    int n_chain;
    int64_t bytes_down; /* sent by GetModel this round */
    /* what one commit writes before retention removes anything
     * (round_commit_estimate), set at start */
    int64_t commit_bytes;
    ErrorFeedback down_ef; /* what the downlink codec has not yet sent of θ's moves */
    int state_lost;        /* a failed commit stepped outer and down_ef in place and they
                            * could not be read back: no round opens until they are, so
                            * it is set only while UNOPENED */
    NetSpool *spool;       /* owned */
    /* [privacy] dp: the committed rounds' account (from the store at
     * start, so a restart forgets no round) */
    PrivacyAccount dp_account;
    /* distributed DP: a sum was not unmasked because it would pass
     * epsilon_budget (secagg_round.c): the failed attempt ends the federation */
    int dp_spent;
    /* [privacy] secure_aggregation: the open attempt's phases
     * (secagg_round.c; NULL: off), and its answers to send */
    SecaggRound *sa;
    SaOut sa_out;
    pthread_mutex_t lock;   /* guards everything above */
    pthread_cond_t changed; /* a round committed or the federation finished */
    pthread_t ticker;
    int stop;
    /* ROUND_UNOPENED: the ticker tries again every second from reopen_at_ms */
    int64_t reopen_at_ms, reopen_logged_ms;
    /* A failed attempt the store did not record yet (id 0: none): recorded
     * before the next attempt opens, so it is set only while UNOPENED. */
    struct {
        int64_t id, bytes_down;
        char reason[300];
    } unrecorded;
    /* One update is read at a time, from its inspection to its apply: a read
     * uses every core already, and an update's pages (a map of its spool
     * file) are resident only while it is read, so memory does not grow with
     * the uploads in flight. Taken before lock. */
    pthread_mutex_t reading;
    CodecChecked *pool; /* owned, under reading: each inspection refills it */
} Rounds;

typedef struct Coordinator Coordinator; /* below */

/* rounds.c: whether the round's state may move from `from` to `to` (the
 * diagram in rounds.c); what the current state implies, asserted; and
 * rounds.lock taken with that assertion, what every handler enters by. */
int rounds_move_legal(RoundState from, RoundState to);
void rounds_assert_state(const Rounds *r);
void rounds_lock(Rounds *r);

/* ---- secagg_round.c: a round attempt's secure aggregation -------------------------- */

/* At start (none when off); at the end. */
int secagg_round_init(Rounds *r, char *err);
void secagg_round_free(Rounds *r);
/* Under rounds.lock: a new attempt (its parked calls told why). */
void secagg_round_reset(Rounds *r, const char *why);
/* Under rounds.lock, from the ticker: the phases' deadlines. 1: the sum is
 * unmasked into the round's sum as the mean (close the round); 0: waiting;
 * -1: fail the attempt, why says why. */
int secagg_round_tick(Coordinator *co, int64_t now, char *why, size_t len);
/* Under rounds.lock: why a masked update ("SAGM") of site is refused (a
 * refusal code, and why), or NULL; then, once its row is recorded, it is
 * summed (secagg_round_add: NULL, or why not). */
const char *secagg_round_check(Coordinator *co, const char *site, const uint8_t *blob, size_t len,
                               char *why, size_t why_len);
const char *secagg_round_add(Coordinator *co, const char *site, const uint8_t *blob, size_t len,
                             char *why, size_t why_len);
/* Under rounds.lock, after a masked update is taken: as secagg_round_tick. */
int secagg_round_after_push(Coordinator *co, char *why, size_t len);
/* No lock: the answers made under it sent. */
void secagg_round_flush(Rounds *r);
/* dp = distributed, once the attempt is unmasked: the sum's Skellam noise
 * (variance a value: each summed site's share) and one site's sensitivity
 * (L1, L2), in the integers' units. -1 when no sum is unmasked. */
int secagg_round_noise(const Rounds *r, double *mu, double *l1, double *l2);
int secagg_round_parked(const Rounds *r);
/* The SecAgg call. */
void h_secagg(NetCall *c, void *user);

/* ---- the round loop: rounds.c (the state machine), round_calls.c (the
 * Federation calls), publish.c (building and installing the next model),
 * ledger.c (what they remember: arrivals and deadlines, model hashes,
 * what was served; it calls none of them). Calls go one way: rounds.c and
 * round_calls.c call publish.c, and all three call ledger.c. */

/* A round on its way to commit: what closing it took from Rounds (under
 * rounds.lock), for a commit that runs outside the lock. */
typedef struct RoundClosing {
    int64_t number, round_id;
    RoundSum sum; /* owned: moved out of Rounds */
    /* copies of Rounds' (the maps of the updates move), n_kept and
     * n_reported long; owned */
    char (*kept_owner)[32];
    int n_kept, n_reported;
    RoundUpdate *upd;
    char (*site)[65];
    double eval;        /* the median of the eval losses reported, NaN if none */
    double median_norm; /* of the accepted updates */
    int quorum;         /* the round had its quorum when it closed */
    /* no round with a quorum had committed before it (since the coordinator
     * started): no history of norms bounded its updates, only ‖θ₀‖ did */
    int no_history;
    /* dp = distributed: the sum's Skellam noise (variance a value) and
     * one site's sensitivity, L1 and L2, in the integers' units */
    double dp_mu, dp_l1, dp_l2;
} RoundClosing;

/* What a commit makes and an install puts in place; owned. */
typedef struct RoundNext {
    float *theta; /* θ_{r+1} */
    Served *ckpt; /* the checkpoint, as it will be served */
    uint8_t theta_sha[32];
    Blob delta;           /* the way from θ_r, as it is built (empty: none) */
    Served *delta_served; /* and as it will be served (NULL: none) */
    double theta_norm;
    int64_t bytes_down;        /* served in the round, as recorded by the commit */
    int state_lost;            /* failed, and the optimizer's state could not be read back */
    PrivacyAccount dp_account; /* [privacy] dp: the account with this round in it */
} RoundNext;

/* Takes the open round for its commit (under rounds.lock): NULL when it is
 * not open. Updates for it are refused from here on. */
RoundClosing *rounds_close(Coordinator *co);
/* Fails the open attempt with its reason and opens the next (rounds.c's
 * fail_round). Under rounds.lock. */
void rounds_fail(Coordinator *co, const char *reason);
/* Commits a closed round outside rounds.lock (the calls go on meanwhile),
 * installs its successor or fails it, opens the next round, answers the
 * waiters; frees c. */
void rounds_commit(Coordinator *co, RoundClosing *c);
/* After each commit and once at start (retain.c): removes the checkpoints
 * and outer states the retention policy no longer keeps (store_prune), then
 * compares the free space of the folder with what the next rounds write and
 * warns, in one line, while there is room for fewer than DISK_ROUNDS_WARN.
 * Never fails a round: a prune that failed is taken up again by the next. */
int round_retain(Coordinator *co);
/* The checkpoint, the outer state's arrays and the downlink delta: each a
 * model's fp32 size at most (docs/operations.md). */
int64_t round_commit_estimate(const Rounds *r);
int64_t rounds_active_sites(Coordinator *co);
/* The sites a round needs: min_sites, or more than half of the active ones
 * (rounds_quorum_of: of a count of active sites the caller has). */
int64_t rounds_quorum(Coordinator *co);
int64_t rounds_quorum_of(const Rounds *r, int64_t active);
/* Under rounds.lock: the open round's counts for a site (made on first use;
 * NULL when out of memory). */
RoundSiteCount *rounds_site_count(Rounds *r, int64_t site_id);
/* Under rounds.lock: a site was served the model of `round` (the one it
 * holds once it has applied the payload); the newest such round, -1 when
 * this process has served it none (a coordinator restarted since). */
void rounds_served_set(Rounds *r, int64_t site_id, int64_t round);
int64_t rounds_served(const Rounds *r, int64_t site_id);
/* Under rounds.lock: room for `need` accepted updates in the open round; -1
 * when out of memory. */
int rounds_reserve(Rounds *r, int need);
/* Under rounds.lock: records that attempt `attempt` of round `round` took
 * site's update, ms after the attempt opened. The adaptive deadline learns
 * from first attempts after round 0: round 0's arrivals hold every site's
 * start-up and a whole model's download, a reopened attempt's the sites'
 * reconnection after a restart or a failed commit, which other rounds do
 * not. rounds_pace: the quorum's usual arrival, what a round is judged
 * against: of the sites with an update in the last ARRIVAL_HISTORY rounds
 * and three rounds to say it, the median one's 90th-percentile arrival
 * (the upper middle: by then more than half of them are usually in), so
 * a minority of sites, however late, cannot move it past an honest site's;
 * 0 when no site can say yet. open_round keeps it in pace_ms for the
 * round, and the two below read it. rounds_adaptive_deadline: twice the
 * pace (ms after the round opened, a second at least), or 0 without one.
 * rounds_site_due: when site_id is late (ms after the round opened): the
 * pace and a quarter again (a second at least), or sooner, its own
 * 90th-percentile arrival and half as long again (a second at least) when
 * it has reported in three rounds: a fast site is not held to the others'
 * pace, and a slow one is not waited for at its own; 0 without either. */
void rounds_arrival(Rounds *r, int64_t site_id, int64_t round, int64_t attempt, int64_t ms);
int64_t rounds_pace(const Rounds *r);
int64_t rounds_adaptive_deadline(const Rounds *r);
int64_t rounds_site_due(const Rounds *r, int64_t site_id);
/* the quorum's pace and a quarter again, a second at least; 0: no pace yet */
int64_t rounds_pace_due(const Rounds *r);
/* Under rounds.lock: whether the open round, its quorum in, still waits for
 * a site that has not reported. Away: the round before took no update from
 * it and it has not called since this round opened (a cut link, a stopped
 * site); it does not hold this round's model, so its update would need a
 * download first. Late: past rounds_site_due (*due, 0 when none), whatever
 * it did before (a link cut while the round ran), in the attempt the
 * arrivals are learnt from only (no extension yet). Any other site is
 * waited for. */
typedef enum SiteWait { SITE_WAITED, SITE_AWAY, SITE_LATE } SiteWait;
SiteWait rounds_site_wait(const Rounds *r, const StoreSite *site, int64_t now, int64_t *due);
/* Under rounds.lock: the model of `round` has parameters of SHA-256 sha
 * (kept while within MODEL_HISTORY rounds of the newest). */
void rounds_history_add(Rounds *r, int64_t round, const uint8_t sha[32]);
/* Under rounds.lock: the SHA-256 of round's model, or NULL when it is not
 * known here (never was, or too old). */
const uint8_t *rounds_history_sha(const Rounds *r, int64_t round);
/* Under rounds.lock: whether site has an accepted update in the open round. */
int rounds_reported(const Rounds *r, const char *site);
/* Under rounds.lock: whether the open round takes an update trained from
 * round's model (sync: its own; async: up to `staleness` rounds back). */
int rounds_takes_base(const Rounds *r, uint64_t round);
/* How much an update trained `staleness` rounds back counts per token:
 * 1 / sqrt(1 + staleness) (FedBuff's polynomial discount, a = 0.5). */
double rounds_staleness_weight(int64_t staleness);
/* The most sites a round takes updates from ([rounds] min_sites' bound). */
#define ROUNDS_MAX_SITES 1000000
/* Under rounds.lock: fails the open round when a site that reported in it
 * has been revoked since, so that it reopens without that site's update;
 * 1 when it did. */
int rounds_drop_revoked(Coordinator *co);
/* Frees what a round's accepted updates hold. */
void round_updates_free(RoundUpdate *u, int n);
/* Answers the parked WaitRounds whose round has moved, whose poll has
 * expired, or (all) every one; outside rounds.lock. */
void rounds_answer_waiters(Coordinator *co, int all);

/* Builds c's successor — aggregate, outer step, downlink, checkpoint and
 * state files, their hashes — and commits it in the store, outside
 * rounds.lock; 0, or -1 with every file it wrote removed. */
int round_next_build(Coordinator *co, RoundClosing *c, RoundNext *next, char *err);
/* The outer optimizer's state and the downlink's residual as the last
 * committed round's state file holds them (round 0's zeros when none is
 * committed): after a commit that stepped them and failed. */
int round_state_restore(Coordinator *co, char *err);
/* Under rounds.lock, after a build: the successor becomes the served model. */
void round_next_install(Coordinator *co, RoundNext *next);
void round_next_free(RoundNext *next);
/* Writes θ as the checkpoint `rel` (under the home) and reads it back to
 * serve: at start. */
int round_publish_model(Coordinator *co, const char *rel, char *err);
/* The outer optimizer's state of the round resumed from: 1 restored, 0
 * none, -1 error. */
int round_outer_load(Coordinator *co, const StoreRound *last, char *err);
/* A kept update's name in its site's spool folder, and their removal. */
void round_kept_name(int64_t round, char *out, size_t len);
void round_drop_kept(Rounds *r, int64_t round, char (*owners)[32], int n);
double round_l2_norm(const float *x, size_t n);
/* A checkpoint file as served (mapped, hashed, its pages let go); NULL with
 * err set. A delta blob as served (takes b's bytes): from an unlinked file
 * in dir, mapped, so the current delta and the chain before it cost page
 * cache rather than the heap (dir NULL, or a file that cannot be written:
 * on the heap). */
Served *served_map_file(const char *path, char *err);
Served *served_from_blob(Blob *b, const char *dir);
/* At a resume: the lossless delta from round `from`'s model (base, its
 * parameters' SHA-256 base_sha) to the current one (XOR byte planes, zstd:
 * exact whatever the downlink codec, whose own delta, the encoded outer
 * update, is not kept across a restart), so that sites holding that model
 * take it rather than the whole checkpoint; kept only when smaller. Best
 * effort: without it they take the checkpoint. */
void round_delta_restore(Coordinator *co, const float *base, const uint8_t base_sha[32],
                         int64_t from);
/* Under rounds.lock (or before anyone else can see s). NULL is fine. */
void served_unref(Served *s);

typedef struct Coordinator {
    char dir[1024];
    char name[128];
    char model[32];                                /* the preset's name, or "pretrained" */
    ModelConfig model_cfg;                         /* the model's shape */
    char model_init[1200];                         /* the pretrained initial model's file, or "" */
    char *ca, *ca_key, *server_chain, *server_key; /* owned PEM */
    char admin_sha[65];
    EventFile *events;      /* [metrics] tensorboard's event file; NULL: none; owned */
    char address[256];      /* where it is bound: host:port */
    char join_address[256]; /* where its enrollment listener is bound */
    long site_cert_days;
    int64_t renew_overlap_ms; /* the certificate a renewal replaces stays valid this long */
    Store *store;             /* owned, guarded by store_lock */
    pthread_mutex_t store_lock;
    int64_t started_ms;
    NetServer *server; /* set under rounds.lock once serving: revocation cancels calls */
    Rounds rounds;
    /* Join: failures per peer address in the current minute, under join_lock */
    pthread_mutex_t join_lock;
    int64_t join_limit; /* failed joins per address per minute before refusing it */
    struct JoinFailures {
        char addr[64];
        int64_t since; /* ms: the first failure of the address's current minute */
        int count;
    } join_failures[256];
} Coordinator;

/* Reads one protobuf request; sets INVALID_ARGUMENT when it does not parse. */
#define READ_REQUEST(c, type, fn, out)                                                             \
    do {                                                                                           \
        NetBuf m_;                                                                                 \
        if (net_call_recv((c), &m_) != NET_RECV_MESSAGE) return;                                   \
        (out) = fn##__unpack(NULL, m_.len, m_.data);                                               \
        net_buf_free(&m_);                                                                         \
        if ((out) == NULL) {                                                                       \
            net_call_status((c), NET_INVALID_ARGUMENT, "malformed " #type);                        \
            return;                                                                                \
        }                                                                                          \
    } while (0)

#define SEND_RESPONSE(c, fn, msg)                                                                  \
    do {                                                                                           \
        size_t n_ = fn##__get_packed_size(&(msg));                                                 \
        uint8_t *b_ = malloc(n_ ? n_ : 1);                                                         \
        if (b_ == NULL) {                                                                          \
            net_call_status((c), NET_RESOURCE_EXHAUSTED, "out of memory");                         \
            break;                                                                                 \
        }                                                                                          \
        fn##__pack(&(msg), b_);                                                                    \
        net_call_send((c), b_, n_);                                                                \
        free(b_);                                                                                  \
    } while (0)

/* The site behind the call's certificate, or a refusal set on the call. */
int coordinator_authorize_site(Coordinator *co, NetCall *c, StoreSite *site);

/* settings.c */
const char *rounds_recipe_names(void); /* for messages: "diloco, sparseloco, …" */
int rounds_recipe_known(const char *name);
/* [model]: a preset (and the seed its initial model is drawn from) or, after
 * strait init --init-from, the initial model's file in the home, checked
 * against the SHA-256 init recorded. Fills co's model, model_cfg and
 * model_init. */
int model_settings_read(const Config *cfg, Coordinator *co, char *err);
int rounds_settings_read(const Config *cfg, const ModelConfig *model, RoundsSettings *out,
                         char *err);
/* What Hello sends as lookahead: with overlap, [rounds] lookahead times the
 * outer optimizer's step for one mean update Δ̄ with no momentum behind it,
 * θ ← θ − step·Δ̄ (nesterov η(1+μ), avg η); 0 without overlap and for
 * adam, whose step is no multiple of Δ̄. */
double rounds_lookahead(const RoundsSettings *s);
int rounds_start(Coordinator *co, const RoundsSettings *set, char *err);
/* Answers every parked WaitRound (before the server stops). */
void rounds_release_waiters(Coordinator *co);
void rounds_stop(Coordinator *co);
int rounds_add_methods(Coordinator *co, NetServer *srv, char *err);
/* what Hello tells a site about the federation: its round, model table and
 * seed, the current model's SHA-256 (into model_sha, which hr points to),
 * schedule, codecs both ways and error feedback */
struct Strait__HelloResponse;
void rounds_describe(Coordinator *co, struct Strait__HelloResponse *hr, uint8_t model_sha[32]);

/* admin.c: the Admin service, and the reads it answers from a store, which
 * admin_client.c also runs on the store of a stopped coordinator */
int admin_add_methods(Coordinator *co, NetServer *srv, char *err);
/* The whole status of this running coordinator (what Status answers and
 * the metrics endpoint shows). */
int admin_live_status(Coordinator *co, AdminStatus *st, char *err);
/* home.c: enrollment on an open store; actor goes into the audit log. */
int coordinator_enroll_store(Store *s, const char *site, int64_t ttl_ms, const char *actor,
                             char token[65], char *err);
int admin_query_rounds(Store *s, int limit, int64_t before, int64_t now, AdminRound **out,
                       size_t *n, char *err);
int admin_query_round(Store *s, int64_t number, int64_t now, AdminRound *round, StoreUpdate **ups,
                      size_t *n, char *err);
int admin_query_sites(Store *s, int64_t now, AdminSite **out, size_t *n, char *err);
/* The store's part of a status: sites, last commit, totals. */
int admin_query_status(Store *s, int64_t now, AdminStatus *st, char *err);
/* metrics.c: the Prometheus text endpoint ([metrics] listen), plain HTTP
 * GET /metrics through libmicrohttpd; NULL (err set) when it cannot bind. */
typedef struct Metrics Metrics;
Metrics *metrics_start(Coordinator *co, const char *listen, char *err);
void metrics_stop(Metrics *m); /* NULL is fine */
/* "host:port" as bound; written to DIR/METRICS_ADDR_FILE while it runs */
const char *metrics_address(const Metrics *m);
/* [metrics] tensorboard: the committed round's scalars (the global model's
 * and the sites' losses, tokens, bytes, compression, time, utilization,
 * goodput, refusals, ε) into co->events, at step = the round's number.
 * Never fails the round: a write that fails is said in one line. */
void metrics_tensorboard(Coordinator *co, int64_t number);
#define METRICS_ADDR_FILE "metrics.addr"
/* The file a running coordinator writes in its folder with the address it
 * is bound to, and removes when it stops. */
#define COORD_ADDR_FILE "coordinator.addr"
/* The same for the enrollment listener (net/enroll.c) */
#define JOIN_ADDR_FILE "join.addr"

#endif
