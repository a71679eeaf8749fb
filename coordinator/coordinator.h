/*
 * coordinator.h — the API of coordinator/: the federation's home folder
 * (what `strait init` creates), enrollment of sites, and the coordinator
 * service. The store has its own header, store.h.
 *
 * The home folder DIR:
 *   federation.ini        settings (documented in the file itself)
 *   ca.crt, ca.key        the federation CA (key 0600)
 *   server.crt, .key      the coordinator's TLS certificate chain and key
 *   admin.crt, .key       the administrator's client certificate and key
 *   strait.db             the store; checkpoints/ and spool/ beside it
 */
#ifndef STRAIT_COORDINATOR_H
#define STRAIT_COORDINATOR_H

#include <stddef.h>
#include <stdint.h>

#include "compress/compress.h"
#include "kernels/model.h"
#include "store.h"

#define COORD_PROTOCOL_VERSION 1
/* the sites' protocol that runs secure aggregation's phases as this
 * coordinator does (3: KEYS answers with the neighbours' keys alone, and
 * distributed DP's parameters) */
#define COORD_PROTOCOL_SECAGG 3
#define COORD_ADMIN_NAME      "strait-admin"
/* the pretrained initial model in a home (strait init --init-from) */
#define COORD_INIT_MODEL "model/initial.safetensors"

typedef struct CoordInitOptions {
    const char *name;      /* federation name; default the folder's name */
    const char *listen;    /* default 0.0.0.0:7700 */
    const char *advertise; /* HOST:PORT sites use; default the listen address */
    const char *model;     /* model preset, default "small" */
    const char *init_from; /* a Hugging Face folder or a GGUF file round 0 starts from, or NULL */
    AdapterConfig lora;    /* rank 0: the whole model trains; else adapters over it, frozen */
    int force;             /* replace an existing federation */
    /* round settings written to federation.ini; 0 or NULL: the defaults */
    int rounds, min_sites, inner_steps;
    const char *recipe;            /* [recipe] name; NULL: diloco */
    const char *uplink, *deadline; /* uplink NULL: the recipe's */
} CoordInitOptions;

/* Creates the home folder. Refuses an existing federation unless force.
 * ca_sha256 gets the CA's fingerprint (what sites pin). */
int coordinator_init_home(const char *dir, const CoordInitOptions *o, char ca_sha256[65],
                          char *err);

/* The CA fingerprint and advertised address of a home. */
int coordinator_home_info(const char *dir, char ca_sha256[65], char *advertise, size_t adv_len,
                          char *err);

/* The enrollment listener's address a site joins at: [federation]
 * join_advertise, else the advertised host with join_listen's port, else
 * the advertised address's next port; a port of 0 is the running
 * coordinator's (DIR/join.addr). */
int coordinator_join_address(const char *dir, char *out, size_t len, char *err);

/* Valid site names: 1-64 of letters, digits, '-', '_', '.', starting with a
 * letter or a digit. */
int coordinator_valid_site_name(const char *name);
/* "host:port" with a port of 0 (any free one) to 65535; -1 with a reason. */
int coordinator_check_listen(const char *hostport, char *err);

/* The federation's token lifetime: [security] token_ttl (default 24h). */
int coordinator_token_ttl(const char *dir, int64_t *ttl_ms, char *err);

/* Records a one-time token for a site (only its SHA-256 is kept). */
int coordinator_enroll(const char *dir, const char *site, int64_t ttl_ms, char token[65],
                       char *err);

/* Revokes a site and its certificates; effective on the next call. */
int coordinator_revoke(const char *dir, const char *site, const char *actor, char *err);

/* Runs the coordinator until SIGINT or SIGTERM. listening(port, ctx) is
 * called once the port is bound (may be NULL). */
int coordinator_run(const char *dir, void (*listening)(int port, void *ctx), void *ctx, char *err);

/* ---- administration (admin.c serves it, admin_client.c calls it) ---------- */

/* An active site counts as online when it called within this long; a site
 * waiting for a round polls every 20 s. */
#define ADMIN_ONLINE_MS 60000
/* The coordinator warns while its folder's free space holds fewer commits
 * than this (docs/operations.md: the disk a federation needs). */
#define DISK_ROUNDS_WARN 5

typedef struct AdminStatus {
    int running; /* 0: read from the store of a stopped coordinator */
    char federation[128], address[256], model[32];
    int64_t model_params;
    int64_t started_at, uptime_ms, rss_bytes; /* the coordinator process */
    int64_t current_round, total_rounds;
    char round_state[16]; /* open, aggregating, finished, stopped */
    int64_t round_opened_at, sites_reported;
    int64_t sites_total, sites_online, sites_offline, sites_revoked;
    int64_t last_commit_round, last_commit_at; /* -1, 0: none yet */
    double last_eval_loss;                     /* NAN: unknown */
    double dp_epsilon, dp_delta; /* after the last committed round (NAN: it had no noise) */
    double last_commit_s;        /* the last commit's duration in this process; NAN: none yet */
    StoreTotals totals;
    /* compute utilization and goodput over the last utilization_rounds
     * committed rounds (AdminRound says how; NAN: none) */
    double utilization, goodput;
    int64_t utilization_rounds;
    /* the disk (store_disk): the kept checkpoints and outer states, what
     * one commit writes, the free space; rounds_left: the commits it holds
     * (-1: unknown), short below DISK_ROUNDS_WARN */
    StoreDisk disk;
    int64_t disk_rounds_left;
    int64_t keep_every; /* [store] keep_every, which the disk's growth follows (an input) */
} AdminStatus;

/* Whether the free space holds fewer than DISK_ROUNDS_WARN of the commits
 * the federation has left (and not all of them). */
int admin_disk_short(const AdminStatus *st);

/* A round attempt as a monitor shows it. missed and rejected hold one
 * entry per line ("site" and "site: reason"); while the round is live,
 * missed are the sites it still waits for. */
typedef struct AdminRound {
    StoreRound r;
    int64_t expected;  /* active sites enrolled before the round closed */
    int64_t raw_bytes; /* the counted updates' dense fp32 size */
    /* A committed round's wall time: from the previous round's commit (the
     * first round: its first opening) to its own, failed attempts and all;
     * a site's wall time is the part of it after its enrollment.
     * utilization: the training time the sites with an update claim, each
     * at most its wall time, over theirs; goodput: the accepted tokens over
     * what every expected site could have trained in its wall time at its
     * claimed rate (tokens over training time; a site without an update at
     * the round's median rate). Both NAN when unknown (not committed, no claims). They
     * rest on claims, and weigh nothing: a site can only misstate its own. */
    int64_t wall_ms;
    double utilization, goodput;
    /* the sums behind them, for figures over several rounds */
    double train_ms_sum, site_wall_ms_sum, tokens_accepted, tokens_possible;
    char missed[1024];
    char rejected[2048];
} AdminRound;

typedef struct AdminSite {
    StoreSite s;
    int64_t cert_not_after; /* 0: no certificate yet */
    int online;
} AdminSite;

/* A connection for administration. DIR is a federation folder (the
 * coordinator on this machine, found through DIR/coordinator.addr, which the
 * running coordinator writes) or an admin kit from admin_export (a remote
 * coordinator). Every read goes through the Admin API with the admin
 * certificate; only for a federation folder whose coordinator is not
 * running are reads answered from its store, by the same code the service
 * runs (admin_running tells which). */
typedef struct Admin Admin;

Admin *admin_open(const char *dir, char *err);
/* Whether dir is an admin kit (admin.ini) rather than a federation folder. */
int admin_is_kit(const char *dir);
void admin_close(Admin *a);
/* 1: a coordinator answers; 0: reading a stopped federation's store. */
int admin_running(const Admin *a);
/* "127.0.0.1:7700", or the store's path. */
const char *admin_where(const Admin *a);
/* Reading the store although the folder's coordinator is running (its port
 * takes connections) because it did not answer: why; NULL otherwise. */
const char *admin_unreachable(const Admin *a);

int admin_status(Admin *a, AdminStatus *out, char *err);
/* Newest first, ids below before (0: from the newest); *out malloc'd. */
int admin_rounds(Admin *a, int limit, int64_t before, AdminRound **out, size_t *n, char *err);
/* Round `number` (its committed attempt, else the latest) and its updates;
 * STORE_NOT_FOUND when there is no such round. */
int admin_round_updates(Admin *a, int64_t number, AdminRound *round, StoreUpdate **ups, size_t *n,
                        char *err);
int admin_sites(Admin *a, AdminSite **out, size_t *n, char *err);
int admin_events(Admin *a, int limit, int64_t before, StoreEvent **out, size_t *n, char *err);
/* A one-time token; join_cmd gets the command the site runs. */
int admin_enroll(Admin *a, const char *site, int64_t ttl_ms, char token[65], char *join_cmd,
                 size_t join_len, char *err);
int admin_revoke(Admin *a, const char *site, char *err);

/* The run as one self-contained HTML page at out (report.c): loss curves,
 * bytes against dense, round time, each site's utilization, refusals and
 * revocations in time, the configuration (fed_dir's federation.ini; NULL
 * or "" for an admin kit). The last `last` round attempts (0: all);
 * written beside and renamed. version: the strait that wrote it. */
int report_write(Admin *a, const char *fed_dir, const char *out, const char *version, int last,
                 char *err);

/* Writes an admin kit into out_dir (created 0700, refused when it holds
 * files): ca.crt, admin.crt, admin.key (0600) and admin.ini with the
 * coordinator's address (address, or the federation's advertised one). */
int admin_export(const char *home, const char *out_dir, const char *address, char *err);

/* ---- aggregation (coordinator/aggregate.c) -------------------------------- */

/* The round's weighted sum of site updates, built one update at a time
 * (streaming: memory is O(model) whatever the number of sites). An update is
 * inspected whole — table, size, finite values, its norm against the gate —
 * before anything is added, so a refused one is never half-applied. */
typedef struct RoundSum {
    uint64_t n, table_hash;
    float *sum;    /* owned, n floats: Σ w_i Δ_i */
    int touched;   /* sum has been written (calloc's pages untouched until then) */
    double weight; /* Σ w_i */
    int accepted;
    double *norms; /* owned: the accepted updates' norms, for the gate */
    int norms_cap;
    double norm_gate;   /* refuse norms above gate × median of the accepted (0: off) */
    int gate_min;       /* the gate applies once this many updates are in */
    double max_norm;    /* refuse norms above this, from the first update on (0: off) */
    CodecChecked *pool; /* owned: round_sum_gate's inspections, refilled */
    /* One pass per update: an update is checked and added into stage
     * (stage = sum + w Δ) together, and a gated update's apply swaps stage
     * and sum; a refused one leaves sum as it was. n floats more, taken on
     * the first add when the machine has eight times that free (otherwise each
     * update is read twice: checked, then added). */
    float *stage; /* owned, n floats; NULL: not (yet) taken */
    uint64_t gen; /* changes whenever sum does: a stage is for one gen */
} RoundSum;

/* What the gates made of an update: its norm, or why it is refused (code:
 * one of store.h's STORE_REASON_CODES), and what its inspection checked,
 * so that an apply neither decompresses nor checksums it again. */
typedef struct RoundGate {
    double norm;
    const char *code; /* NULL: passed */
    char why[256];
    CodecChecked *checked; /* what was checked; the blob must outlive it */
    int owns_checked;      /* round_gate_free frees it (it was not a caller's pool) */
    int staged;            /* the sum's stage holds sum + staged_weight x update */
    uint64_t staged_gen;   /* the sum's gen it was added to */
    double staged_weight;
} RoundGate;

int round_sum_init(RoundSum *rs, uint64_t n, uint64_t table_hash, double norm_gate, char *err);
/* The median of v (NaN when n is 0); of an even count, the mean of the
 * middle two, or with lower the smaller: a bound taken from it then
 * follows the lesser of two sites, not the one that claims more. */
double round_median(const double *v, int n, int lower);
void round_sum_free(RoundSum *rs);
/* The update's own checks, needing nothing of a round (so no lock): header,
 * sections, checksums, finite values, the model it is for (n values of
 * table_hash); its norm. What was checked goes into pool (refilled update
 * after update by one caller at a time; NULL: a new one). 0 passed
 * (g->norm, g->checked set), 1 refused. */
int round_gate_inspect(uint64_t n, uint64_t table_hash, const uint8_t *blob, size_t len,
                       CodecChecked *pool, RoundGate *g);
/* round_gate_inspect and, in the same pass, the update added with weight
 * into the sum's stage (round_sum_apply then swaps it in rather than
 * reading the update again); without room for a stage, only the
 * inspection. What was checked goes into pool (NULL: the sum's own; a
 * coordinator passes the pool it empties before each commit). Changes
 * nothing of the sum. */
int round_sum_inspect_add(RoundSum *rs, const uint8_t *blob, size_t len, double weight,
                          CodecChecked *pool, RoundGate *g);
/* The round's gates on an inspected update: its weight, the absolute norm
 * bound, the norm against the median of those accepted. 0 passed, 1 refused
 * (g->code set; also when the inspection refused it). */
int round_sum_judge(const RoundSum *rs, double weight, RoundGate *g);
/* Both, changing nothing: 0 passed, 1 refused. */
int round_sum_gate(const RoundSum *rs, const uint8_t *blob, size_t len, double weight,
                   RoundGate *g);
void round_gate_free(RoundGate *g);
/* Counts a gated update (its norm joins the relative gate's median) and,
 * when accumulate, adds weight × update to the sum: the stage swapped in
 * when it holds this update at this weight on this sum, else from what its
 * inspection kept. -1: out of memory. */
int round_sum_apply(RoundSum *rs, const RoundGate *g, double weight, int accumulate, char *err);
/* Gate then apply; 0 added, 1 refused (reason in why, nothing added), -1 on
 * an internal failure. */
int round_sum_add(RoundSum *rs, const uint8_t *blob, size_t len, double weight, char *why);
/* The same gates without adding: for robust rounds, whose updates are kept
 * whole until the round closes. 0 passed (counted), 1 refused, -1 failure. */
int round_sum_check(RoundSum *rs, const uint8_t *blob, size_t len, double weight, char *why);
/* mean (n) = Σ w_i Δ_i / Σ w_i; -1 when nothing was accepted. */
int round_sum_mean(const RoundSum *rs, float *mean, char *err);
/* Forgets what was added and lifts the gates, keeping the buffer (the next
 * add writes over it): a close that adds the round's updates again, with
 * their weights capped, where they were summed. */
void round_sum_restart(RoundSum *rs);

/* How a round's updates combine ([rounds] aggregate): one table in
 * aggregate.c (RULES) names each rule, says how it runs and holds its
 * column function; the names and messages come from it. The mean streams (each
 * update decode-accumulated as it arrives, then dropped); the robust rules
 * keep the updates whole until the round closes and combine them
 * coordinate-wise (robust_aggregate). */
typedef enum AggregateRule { AGG_MEAN, AGG_MEDIAN, AGG_TRIMMED_MEAN } AggregateRule;
/* -1 for an unknown name */
int aggregate_rule_parse(const char *name, AggregateRule *out);
const char *aggregate_rule_name(AggregateRule rule);
/* "mean, median or trimmed_mean", for messages */
const char *aggregate_rule_names(void);
/* How many updates trimmed_mean drops from each end of n: floor(trim × n),
 * and at least 1 when trim > 0 and n ≥ 3. */
int aggregate_trim_count(double trim, int n_updates);
/* 1 when the rule keeps the updates whole until the round closes */
int aggregate_rule_keeps_updates(AggregateRule rule);
/* 1 when [rounds] trim applies to the rule */
int aggregate_rule_trims(AggregateRule rule);

/* Coordinate-wise robust aggregation over spooled updates (untrusted silos),
 * block by block through one CodecCursor per update, so each update is
 * read once and memory stays O((block + section) × updates): AGG_MEDIAN, or
 * AGG_TRIMMED_MEAN (the mean after dropping the trim fraction from each
 * end). AGG_MEAN streams instead (RoundSum) and is refused here. */
int robust_aggregate(const uint8_t *const *blobs, const size_t *lens, int n_updates, uint64_t n,
                     AggregateRule rule, double trim, float *out, char *err);
/* The same over read-only maps of files (each blob the start of its map):
 * the pages each update's cursor has read past are let go after every
 * block (MADV_DONTNEED: read from the file again if ever touched), so a
 * round of many updates holds about a section of each resident, not all
 * of them. */
int robust_aggregate_maps(const uint8_t *const *blobs, const size_t *lens, int n_updates,
                          uint64_t n, AggregateRule rule, double trim, float *out, char *err);

/* The outer optimizer applied to θ with the round's mean pseudo-gradient Δ̄
 * (docs/design.md §1): Nesterov SGD (DiLoCo: b ← μb + Δ̄; θ ← θ − η(Δ̄ + μb)),
 * plain averaging (FedAvg: θ ← θ − Δ̄), or Adam (FedAdam). Owns its state. */
typedef enum OuterKind { OUTER_NESTEROV, OUTER_AVG, OUTER_ADAM } OuterKind;
typedef struct OuterOpt {
    OuterKind kind;
    float lr, momentum, beta1, beta2, eps;
    uint64_t n;
    int step;
    float *b, *v; /* owned: momentum (Nesterov) or first moment (Adam); second moment */
} OuterOpt;

int outer_init(OuterOpt *o, OuterKind kind, uint64_t n, float lr, float momentum, char *err);
void outer_free(OuterOpt *o);
void outer_step(OuterOpt *o, float *theta, const float *delta_mean);
/* "nesterov", "avg", "adam" → kind; -1 if unknown */
int outer_kind_parse(const char *name, OuterKind *out);

/* The recipes (federation.ini [recipe] name), "diloco, sparseloco, fedavg
 * or fedadam" from the table the settings are read by: for help and
 * messages. */
const char *coordinator_recipe_names(void);

#endif /* STRAIT_COORDINATOR_H */
