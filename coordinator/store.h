/*
 * store.h — the coordinator's memory: one SQLite file (WAL) holding the
 * sites, enrollment tokens, certificates, rounds, updates, checkpoints and
 * the audit log (schema/store.sql). Every query is a prepared statement with
 * bound parameters.
 *
 * Commit protocol of a round (docs/design.md §5):
 *   1. the caller writes the checkpoint file through util's AtomicFile
 *      (temporary, fsync, rename, fsync folder) under HOME/checkpoints/;
 *   2. store_round_commit then, in one transaction with synchronous=FULL,
 *      inserts the checkpoint row, turns the round's received updates
 *      'accepted', derives the round's totals from them and marks it
 *      committed.
 * A crash before 2 leaves a checkpoint file without a row, which
 * store_recover removes; a crash during 2 leaves nothing of it. On restart
 * store_resume_point verifies the last committed checkpoint's size and
 * SHA-256 and refuses to resume from one that does not match.
 *
 * Return values: 0 ok, STORE_NOT_FOUND where a lookup found nothing, -1 with
 * a one-line message in err. Times are ms since the epoch.
 * Threading: a Store is one connection; use it from one thread at a time.
 * Other processes may open the same file; readers never block the writer.
 */
#ifndef STRAIT_COORDINATOR_STORE_H
#define STRAIT_COORDINATOR_STORE_H

#include <stddef.h>
#include <stdint.h>

#include "privacy/privacy.h"

#define STORE_SCHEMA_VERSION 12
#define STORE_NOT_FOUND      1
#define STORE_PRUNED         2 /* store_hold: the round's checkpoint was pruned on purpose */
#define STORE_DB_FILE        "strait.db"   /* inside the federation folder */
#define STORE_CHECKPOINT_DIR "checkpoints" /* inside the federation folder */

typedef struct Store Store;

typedef enum StoreMode {
    STORE_READWRITE, /* creates and migrates the file as needed */
    STORE_READONLY,  /* monitoring: never writes, never blocks the writer */
} StoreMode;

Store *store_open(const char *path, StoreMode mode, char *err);
void store_close(Store *s);
/* The file's PRAGMA user_version. */
int store_schema_version(Store *s);

/* ---- sites, tokens and certificates ----------------------------------- */

typedef struct StoreSite {
    int64_t id;
    char name[65];
    char state[8]; /* "active" or "revoked" */
    int64_t enrolled_at;
    int64_t last_seen; /* 0: never */
    char cert_serial[80];
    char cert_sha256[65];
} StoreSite;

typedef struct StoreCert {
    char serial[80]; /* hex */
    char sha256[65]; /* fingerprint of the DER certificate, hex */
    int64_t not_before;
    int64_t not_after;
    int64_t revoked_at; /* 0: not revoked; a renewal's replaced certificate: valid until then */
} StoreCert;

int store_site_add(Store *s, const char *name, int64_t now, int64_t *site_id, char *err);
int store_site_get(Store *s, const char *name, StoreSite *out, char *err);
/* All sites by name; *out is malloc'd, the caller frees it. */
int store_site_list(Store *s, StoreSite **out, size_t *n, char *err);
int store_site_touch(Store *s, int64_t site_id, int64_t now, char *err);
/* Marks the site and all its certificates revoked and logs an event. */
int store_site_revoke(Store *s, const char *name, const char *actor, int64_t now, char *err);

int store_token_add(Store *s, const uint8_t hash[32], const char *site_name, int64_t created_at,
                    int64_t expires_at, char *err);

typedef enum StoreTokenResult {
    STORE_TOKEN_OK = 0,
    STORE_TOKEN_UNKNOWN,
    STORE_TOKEN_USED,
    STORE_TOKEN_EXPIRED,
    STORE_TOKEN_WRONG_SITE,
    STORE_TOKEN_ERROR, /* the database failed; see err */
} StoreTokenResult;

/* Consumes a one-time token for site_name in one IMMEDIATE transaction: of
 * two processes racing for a token exactly one gets STORE_TOKEN_OK. With a
 * certificate, the same transaction creates (or re-activates) the site and
 * records the certificate as its current one. */
StoreTokenResult store_token_consume(Store *s, const uint8_t hash[32], const char *site_name,
                                     int64_t now, const StoreCert *cert, int64_t *site_id,
                                     char *err);
const char *store_token_result_str(StoreTokenResult r);
/* What consuming the token would say, read only: no write lock, no change
 * (Join checks a token before it signs anything). */
StoreTokenResult store_token_check(Store *s, const uint8_t hash[32], const char *site_name,
                                   int64_t now, char *err);

/* Records a further certificate of a site (a renewal) and makes it the
 * site's current one; the site's other certificates retire at retire_at
 * (revoked_at set to it: valid until then), and rows retired by now are
 * deleted, so the store holds a site's valid certificates only. */
int store_cert_add(Store *s, int64_t site_id, const StoreCert *cert, int64_t retire_at, int64_t now,
                   char *err);

/* When the last of a site's certificates that a renewal replaced stops
 * being valid, into *until (0: none is still valid). */
int store_cert_retiring(Store *s, int64_t site_id, int64_t now, int64_t *until, char *err);

/* The certificate with this fingerprint and its site. */
int store_cert_find(Store *s, const char *sha256, StoreSite *site, StoreCert *cert, char *err);

/* ---- rounds, updates and checkpoints ---------------------------------- */

typedef struct StoreRound {
    int64_t id;
    int64_t number;
    int64_t attempt;
    char state[12]; /* open, aggregating, committed, failed */
    int64_t opened_at, closed_at;
    char failed_reason[256];
    int64_t participants, tokens;
    double train_loss, eval_loss; /* NAN when unknown */
    /* the global model the round started from, as the sites scored it on
     * their held-out splits before training (eval_loss: their local models
     * after it); NAN when unknown */
    double start_eval_loss;
    /* communication (docs/communication.md): update bytes taken and
     * refused, model bytes served, and what dense data-parallel training
     * would have moved for the round's accepted training (0: not measured) */
    int64_t bytes_up, bytes_rejected, bytes_down, dense_bytes;
    int64_t refusals_unrecorded; /* refused at the header, past the rows kept per site */
    /* the sites it stopped waiting for as late, one a line: "NAME (past S s)" */
    char late[256];
    /* the checkpoint, for committed rounds */
    char checkpoint_path[512]; /* relative to the federation folder */
    int64_t checkpoint_bytes;
    char checkpoint_sha256[65];
    /* the outer optimizer's state file beside it; "" when none is pinned */
    char state_path[512];
    int64_t state_bytes;
    char state_sha256[65];
    /* retention (store_prune): when the checkpoint file, and the state
     * file, were recorded removed on purpose; 0: kept */
    int64_t pruned_at, state_pruned_at;
    /* differential privacy: the noise multiplier its mean was given and
     * the federation's ε after it, at δ dp_delta (NAN: no noise) */
    double dp_noise, dp_epsilon, dp_delta;
} StoreRound;

typedef struct StoreUpdate {
    int64_t id;
    int64_t round_id;
    int64_t site_id;
    char site_name[65]; /* filled by store_updates_list */
    char codec[24];
    int64_t raw_bytes, wire_bytes, tokens;
    int64_t steps;                /* inner steps it claims (0: not sent) */
    double train_loss, eval_loss; /* NAN when unknown */
    int64_t train_ms, upload_ms;
    /* where the rest of its round went, as the site claims (bounded when
     * recorded; 0: not sent) */
    int64_t download_ms, decode_ms, eval_ms, encode_ms;
    int64_t staleness;      /* rounds back its model was (async rounds; 0: the round's own) */
    double start_eval_loss; /* the received model's held-out loss before training;
                             * <= 0 or NAN: not measured */
    char state[12];         /* received, accepted, rejected, discarded */
    char reason[256];       /* why rejected or discarded */
    char reason_code[24];   /* rejected: one of STORE_REASON_CODES */
    int64_t received_at;
    /* derived by the admin reads, not stored: from its upload to the
     * round's close (-1: not closed), and train_ms over the round's wall
     * time (NAN: unknown) */
    int64_t wait_ms;
    double utilization;
} StoreUpdate;

/* Why an update was refused, as codes with few values (metrics label by
 * them; the text beside says the particulars). */
#define STORE_REASON_CODES                                                                         \
    "non_finite", "wrong_model", "norm_gate", "duplicate", "stale_round", "finished",              \
        "no_metadata", "bad_weight", "too_many_sites", "wrong_codec", "malformed", "revoked",      \
        "internal", "wrong_base", "stale"
extern const char *const store_reason_codes[]; /* NULL-terminated */
int store_reason_code_valid(const char *code);

typedef struct StoreCheckpoint {
    const char *path; /* relative to the federation folder */
    int64_t bytes;
    const char *sha256; /* hex */
    /* the outer optimizer's state file, written before the commit like the
     * checkpoint; state_path NULL: none */
    const char *state_path;
    int64_t state_bytes;
    const char *state_sha256;
    /* the noise multiplier the round's mean was given, and ε after it at
     * dp_delta (dp_noise 0: none, all three stored NULL) */
    double dp_noise, dp_epsilon, dp_delta;
    /* distributed DP (0: a central round, stored NULL): the sum's Skellam
     * variance and one site's L1 sensitivity, in integers (dp_noise is
     * then √dp_mu over the L2 sensitivity) */
    double dp_mu, dp_l1;
} StoreCheckpoint;

/* Adds n to the refusals of round attempt round_id that were refused
 * without a row (a site past its refusals of the round). */
int store_round_refusals_unrecorded(Store *s, int64_t round_id, int64_t n, char *err);
/* Names the sites round attempt round_id stopped waiting for as late (one
 * a line, each with when it was due), in place of any named before. */
int store_round_late(Store *s, int64_t round_id, const char *late, char *err);

/* Opens the next attempt of round `number`. Fails if a round is live or
 * `number` is already committed. */
int store_round_open(Store *s, int64_t number, int64_t now, int64_t *round_id, char *err);
int store_round_aggregating(Store *s, int64_t round_id, char *err);
/* Records an update; u->state is "received" (it is in the round's sum) or
 * "rejected" with u->reason and u->reason_code. A second counting update of
 * one site in one round is refused with an error naming the duplicate. */
int store_update_record(Store *s, const StoreUpdate *u, int64_t *update_id, char *err);
/* A received update that could not be applied after all becomes rejected. */
int store_update_reject(Store *s, int64_t update_id, const char *code, const char *reason,
                        char *err);
/* The commit of the protocol above. Totals (participants, tokens, token-
 * weighted train loss, bytes up) are derived from the received updates. */
int store_round_commit(Store *s, int64_t round_id, const StoreCheckpoint *ckpt, double eval_loss,
                       int64_t bytes_down, int64_t now, char *err);
/* Distributed DP: the noise of the sum a live round attempt unmasks (as
 * StoreCheckpoint's fields), recorded before the sum is: it counts in the
 * privacy account whether the attempt commits or fails. */
int store_round_noise(Store *s, int64_t round_id, double dp_noise, double dp_mu, double dp_l1,
                      double dp_delta, char *err);
/* Fails a live round: its received updates become 'discarded'. */
int store_round_fail(Store *s, int64_t round_id, const char *reason, int64_t bytes_down,
                     int64_t now, char *err);

/* The committed attempt of `number`, else its latest attempt. */
int store_round_get(Store *s, int64_t number, StoreRound *out, char *err);
/* The privacy account: each committed round given noise and each attempt
 * whose noisy sum was unmasked (store_round_noise) added to acc (Gaussian,
 * or Skellam where dp_mu is kept), and how many committed rounds were
 * given none. */
int store_privacy_spent(Store *s, PrivacyAccount *acc, int64_t *plain, char *err);
int store_round_last_committed(Store *s, StoreRound *out, char *err);
/* The round now open or aggregating. */
int store_round_live(Store *s, StoreRound *out, char *err);
/* Up to `limit` attempts, newest first, with ids below before_id (0: from
 * the newest) — pages for a monitor; *out is malloc'd. */
int store_rounds_list(Store *s, int limit, int64_t before_id, StoreRound **out, size_t *n,
                      char *err);
/* The updates of one round attempt, in arrival order; *out is malloc'd. */
int store_updates_list(Store *s, int64_t round_id, StoreUpdate **out, size_t *n, char *err);

int store_event_add(Store *s, const char *actor, const char *action, const char *detail,
                    int64_t now, char *err);

/* ---- reports for monitoring (store_report.c) -------------------------- */

typedef struct StoreEvent {
    int64_t id, at;
    char actor[80];
    char action[48];
    char detail[256];
} StoreEvent;

/* Up to `limit` events, newest first, with ids below before_id (0: from the
 * newest); *out is malloc'd. */
int store_events_list(Store *s, int limit, int64_t before_id, StoreEvent **out, size_t *n,
                      char *err);

typedef struct StoreTotals {
    int64_t rounds_committed, rounds_failed;
    int64_t tokens, dense_bytes; /* over committed rounds */
    /* over every round, failed ones too: what crossed the wire */
    int64_t bytes_up, bytes_rejected, bytes_down;
    int64_t updates_accepted, updates_rejected;
} StoreTotals;

int store_totals(Store *s, StoreTotals *out, char *err);

/* How many times fewer bytes than dense data-parallel training the
 * federation moved: dense / (up + down), refused bytes apart
 * (docs/communication.md); 0 when not measured. The one place it is
 * computed. */
double store_dense_ratio(int64_t dense_bytes, int64_t bytes_up, int64_t bytes_down);

/* Rejected updates counted by their reason code, most frequent first; *out
 * is malloc'd. */
typedef struct StoreReasonCount {
    char reason[256]; /* the code */
    int64_t count;
} StoreReasonCount;
int store_rejections(Store *s, StoreReasonCount **out, size_t *n, char *err);

/* A consistent copy of the whole database into path, made with SQLite's
 * online backup API while the coordinator keeps writing: the copy goes to a
 * temporary beside path, is checked with integrity_check, then renamed into
 * place, so path is either absent or a whole, sound database. */
int store_backup(Store *s, const char *path, char *err);

/* ---- retention and the disk (store_retain.c) ---------------------------- */

/* Which committed rounds keep their checkpoint file, with L the newest
 * committed round: the newest keep_last (L - keep_last < n), every round
 * numbered a multiple of keep_every (0: none), and the keep_back rounds
 * before L whose models a restarted coordinator reads back (the round
 * before's, for the delta it serves; async rounds' `staleness` models).
 * The outer optimizer's state is kept for L alone: only a resume reads it,
 * and a failed commit reads back the newest committed round's. A file
 * another process holds a shared flock on (strait export: store_hold)
 * is kept while it is held, and pruned at a later call. */
typedef struct StoreRetention {
    int64_t keep_last;  /* >= 1 */
    int64_t keep_every; /* >= 0 */
    int64_t keep_back;  /* >= 0 */
} StoreRetention;

/* 1 when round n's checkpoint is kept under p with L the newest committed. */
int store_retention_keeps(const StoreRetention *p, int64_t newest, int64_t n);

typedef struct StorePruneReport {
    int checkpoints, states; /* files recorded pruned and removed by this call */
    int64_t bytes;           /* their recorded sizes */
    int held;                /* checkpoints outside the policy kept: another process holds them */
} StorePruneReport;

/* Prunes what p no longer keeps, in the order that keeps the store true
 * whenever it is killed: the files are locked (LOCK_EX, not waiting: one
 * held is skipped), their marks committed in one durable transaction, and
 * only then are they removed and the folder synced. A crash after the
 * transaction leaves files that store_recover removes; before it, nothing
 * changed. Returns 0 (rep says what was done) or -1 with err: a failure
 * before the transaction changed nothing; after it, the files left are
 * removed by the next call or the next start. */
int store_prune(Store *s, const char *home, const StoreRetention *p, int64_t now,
                StorePruneReport *rep, char *err);

/* Holds round checkpoint file `path` (under HOME/checkpoints/, as its row
 * names it, or the absolute path to it) against pruning for as long as *fd
 * stays open: opened, a shared flock taken, and its row read again after the
 * lock. STORE_NOT_FOUND when no row names the file (not a federation's);
 * STORE_PRUNED (err says which rounds are kept) when retention pruned its
 * round; -1 with a one-line err when it cannot be held.
 * *round gets the round number. */
int store_hold(Store *s, const char *home, const char *path, int *fd, int64_t *round, char *err);

typedef struct StoreDisk {
    int64_t used;          /* the kept checkpoints and outer states, as recorded */
    int64_t kept, pruned;  /* checkpoints */
    int64_t states_pruned; /* outer state files */
    int64_t round_bytes;   /* what one commit writes beside what is kept: the newest round's
                            * checkpoint and state, and its downlink delta (a checkpoint's
                            * size at most); 0: no round committed */
    int64_t free;          /* bytes free to this process in the store's folder; -1: unknown */
    int64_t ckpt_bytes;    /* the newest checkpoint's bytes; 0: none */
    int64_t newest;        /* the newest committed round's number; -1: none */
} StoreDisk;

/* What the federation's checkpoints hold and what is free beside them. */
int store_disk(Store *s, StoreDisk *out, char *err);
/* How many of the to_go commits left free bytes holds: each needs
 * round_bytes at once while it is written, and under retention what stays
 * grows by a milestone's checkpoint every keep_every rounds (0: does not
 * grow); -1: unknown. */
int64_t store_disk_rounds_left(int64_t free_bytes, int64_t round_bytes, int64_t ckpt_bytes,
                               int64_t keep_every, int64_t to_go);

/* ---- recovery and checks ---------------------------------------------- */

typedef struct StoreRecovery {
    int rounds_failed;   /* live rounds of a previous process, now failed */
    int orphans_removed; /* checkpoint files without a committed row */
    int prunes_finished; /* files a prune had recorded removed and a crash left */
} StoreRecovery;

/* Run once by the coordinator at start: fails rounds left live by a process
 * that died, and removes HOME/checkpoints/round-NNNNNN.* files of rounds
 * that are not committed, temporaries of interrupted writes, and the files
 * of committed rounds that their row records pruned (a prune a crash
 * interrupted after its transaction). A file a committed row keeps, and
 * other files in that folder, are left alone. */
int store_recover(Store *s, const char *home, int64_t now, StoreRecovery *rep, char *err);

/* Checks one committed round's checkpoint file — and its outer state file
 * when one is pinned and not pruned: present, the recorded size, the
 * recorded SHA-256. A checkpoint recorded pruned fails, saying so. */
int store_checkpoint_verify(const char *home, const StoreRound *r, char *err);

/* The last committed round, its checkpoint verified; STORE_NOT_FOUND when
 * none is committed; -1 (and a loud message) when its checkpoint is missing
 * or does not match: the coordinator must not resume from it. */
int store_resume_point(Store *s, const char *home, StoreRound *out, char *err);

typedef struct StoreCheck {
    int integrity_ok;
    char integrity[256]; /* "ok" or SQLite's first complaint */
    int schema_version;
    int64_t sites, rounds_committed, rounds_failed, updates, events;
    int64_t checkpoints_ok, checkpoints_bad;
    /* pruned on purpose (retention), not verified; of them, files still
     * present that the next start removes (a prune a crash interrupted) */
    int64_t checkpoints_pruned, states_pruned, prunes_pending;
    int64_t last_committed; /* -1: none */
} StoreCheck;

/* PRAGMA integrity_check, then every committed checkpoint the store keeps
 * verified (the newest must be kept, with its state); each bad one is
 * passed to on_bad (may be NULL) with its reason. Returns 0 when the check
 * ran (look at out for the verdict), -1 when it could not run. */
int store_check(Store *s, const char *home, StoreCheck *out,
                void (*on_bad)(const StoreRound *r, const char *why, void *ctx), void *ctx,
                char *err);

#endif /* STRAIT_COORDINATOR_STORE_H */
