/*
 * client_internal.h — what the site agent's files share (nothing outside
 * client/ includes it): the site's link to its coordinator (site.c: calls
 * retried with backoff, the model's download, the upload, the saved state)
 * and the session a run sets up once with the steps of a round
 * (session.c), which the round loops use — the synchronous one (run.c) and
 * the overlapped one (overlap.c).
 */
#ifndef STRAIT_CLIENT_INTERNAL_H
#define STRAIT_CLIENT_INTERNAL_H

#include <pthread.h>
#include <stdint.h>

#include "client.h"
#include "compress/compress.h"
#include "kernels/data.h"
#include "kernels/model.h"
#include "kernels/ranks.h"
#include "kernels/train.h"
#include "net/net.h"
#include "schema/strait.pb-c.h"
#include "util/util.h"

#define CALL_TIMEOUT_MS 60000
/* while training, a sign of life this often, sent by a thread of its own so
 * that the steps never wait on the network (monitors count a site online
 * for a minute after its last call); its answer stops a site whose round
 * closed without it within that long */
#define HEARTBEAT_MS   5000
#define BACKOFF_MAX_MS 10000

typedef struct Site {
    SiteRunOptions o;
    char name[65], coordinator[256];
    char *key, *cert, *ca;
    NetChannel *ch;
    uint64_t rng;
    uint64_t bytes_down; /* model bytes downloaded, for the log */
} Site;

/* Where a site's round goes before its upload, for UpdateMeta (ms). */
typedef struct RoundTimes {
    uint64_t download, decode, eval, encode;
} RoundTimes;

static inline uint64_t ms_since(uint64_t t0) {
    return (time_monotonic_ns() - t0) / 1000000;
}

/* The site's held-out score of the model in m: the same 4 batches from the
 * start of its validation split every time, so rounds compare. */
#define HELD_OUT_BATCHES 4

/* ---- site.c: the site's calls ---- */

/* Whether a failed call is worth retrying. */
int site_transient(NetStatus st);
/* Waits before retry `attempt` (0, 1, …) of a call: 250 ms doubling to
 * 10 s, ± 25 %; when the channel had lost its connection, only until it has
 * it back (an eighth of the wait at least), so a site goes on within a
 * connection's set-up of its link or coordinator returning. */
void site_retry_wait(Site *s, int attempt);
/* Reads SITEDIR's name, coordinator, key and certificates; opens the channel. */
int site_read(Site *s, char *err);
/* A unary call, retried while the failure is transient. */
NetStatus site_call(Site *s, const char *method, const void *req, size_t len, NetBuf *resp,
                    char *details);
Strait__HelloResponse *site_hello(Site *s, char *err);
/* The current model into m: the way from theta (the model of round `have`,
 * SHA-256 theta_sha) when the coordinator has it, else the whole model;
 * *served gets the round the coordinator says it is (maybe past the one
 * asked in: a download that outlived rounds), times the download's and the
 * decode's milliseconds. */
int site_get_model(Site *s, Model *m, const float *theta, const uint8_t theta_sha[32], int64_t have,
                   uint64_t *served, RoundTimes *times, char *err);
/* One Heartbeat, never retried: the federation's current round, or 0 when
 * the coordinator did not answer; *reported (may be NULL) whether this
 * site has an update in that round. */
uint64_t site_heartbeat(Site *s, uint64_t round, int *reported);
/* Waits for the round after `after`; *resend is set when the coordinator is
 * still at `after` without this site's update (it restarted, or the round
 * was reopened), and the update must go again. */
int site_wait_round(Site *s, uint64_t after, int allow_resend, uint64_t *round, int *finished,
                    int *resend, char *err);
/* The update for `round`, resumed after a failure from what the coordinator
 * holds and retried while failures are transient: 0 sent (*refused 0), 0
 * refused for good (*refused 1, said in the log). */
int site_upload(Site *s, uint64_t round, const Blob *blob, const uint8_t *meta, size_t mlen,
                const uint8_t blob_sha[32], int *refused);
/* The same for attempt `attempt` of the round (its own upload id: another
 * attempt's bytes are never resumed from). */
int site_upload_as(Site *s, uint64_t round, uint64_t attempt, const Blob *blob, const uint8_t *meta,
                   size_t mlen, const uint8_t blob_sha[32], int *refused);
/* Refuses a model this site cannot hold, before anything is allocated. */
int site_check_memory(const SiteRunOptions *o, const ModelConfig *cfg, char *err);
/* SITEDIR/state/: AdamW's moments, the error feedback, the round and the
 * data position; saved atomically, loaded at start (1 loaded, 0 none).
 * opt_ready: the moments' file already written (a sharded trainer's,
 * trainer_save_moments), linked into the state instead of written from m;
 * NULL: from m. */
int site_state_save(const Site *s, const Model *m, const ErrorFeedback *ef, uint64_t round,
                    size_t pos, const char *opt_ready, char *err);
int site_state_load(const Site *s, Model *m, ErrorFeedback *ef, uint64_t *round, size_t *pos,
                    char *err);
/* The thread that ends the site on SIGINT and SIGTERM. */
void *site_signal_watch(void *arg);

/* ---- session.c: the session, set up once per run, and the steps of a round ---- */

typedef struct Session {
    Site s;
    Ranks rk;
    Strait__HelloResponse *hr;
    Model m;      /* θ_local in m.params while training */
    float *theta; /* the global model the round trains from; n_params */
    uint8_t theta_sha[32];
    int64_t have_round; /* the round of the model in theta; -1: none yet */
    ErrorFeedback ef;
    CodecParams codec;
    TokenSet ts;
    TokenView val;
    Loader tl;
    int have_val; /* rank 0 scores the model on its held-out split */
    Trainer *trainer;
    int *in, *tg;
    int H, B, T, replicas, on_gpu, first_round;
    /* ZeRO-1: where rank 0's writer puts the moments after each round's
     * steps, for the state to link ("": the state writes them from m) */
    char opt_staged[1200];
    size_t share; /* this rank's place in a global batch */
    float lr;
    EventFile *events; /* rank 0, --tensorboard */
    double min_noise;  /* --min-noise: 0, or the least DP noise it sends under */
    Blob blob;         /* the update being sent */
    /* rank 0's heartbeat thread: it beats every HEARTBEAT_MS while a round
     * trains (beat_round >= 0) and keeps the federation's round its last
     * answer gave (beat_current; 0: none yet), which the steps read */
    pthread_t beat;
    pthread_mutex_t beat_lock;
    pthread_cond_t beat_cond;
    int beat_started, beat_stop;
    int64_t beat_round;
    uint64_t beat_current;
} Session;

/* What a round's inner steps made (every rank runs it). */
typedef struct RoundTrained {
    double train_loss, eval, start_eval;
    int steps;
    uint64_t train_ms;
} RoundTrained;

/* Sets the session up (rank 0: Hello, the heartbeat thread; every rank:
 * the model, the data, the trainer, the saved state); session_close
 * undoes what it did, whatever it got to. */
int session_open(Session *ss, const SiteRunOptions *o, char *err);
void session_close(Session *ss);

/* The inner steps of `round` from θ in ss->m.params (the trainer takes
 * it), then θ_local back to the host. */
int session_train(Session *ss, uint64_t round, RoundTimes *times, RoundTrained *out, char *err);
/* Δ = base − θ_local with error feedback, encoded into ss->blob, its
 * SHA-256 and its UpdateMeta packed into meta (192 bytes) of *mlen. */
int session_encode(Session *ss, const float *base, const uint8_t base_sha[32],
                   const RoundTrained *t, RoundTimes *times, uint8_t blob_sha[32], uint8_t *meta,
                   size_t *mlen, char *err);
/* Secure aggregation's update instead: x = β e + Δ into x (n floats; e
 * holds it all until the sum takes its part), and the claims into meta. */
int session_secagg_update(Session *ss, const float *base, const uint8_t base_sha[32],
                          const RoundTrained *t, RoundTimes *times, float *x, uint8_t *meta,
                          size_t *mlen);

/* ---- secagg_site.c ---- */

/* x through secure aggregation's phases for `round` (new keys each
 * attempt, until one takes it or the round moves on); e = x − what the sum
 * took. 0, or -1 with err on a local failure. */
int site_secagg_send(Session *ss, uint64_t round, const float *x, const uint8_t *meta, size_t mlen,
                     char *err);

/* Logs the SHA-256 of the model of `round` in theta: what the coordinator
 * checks each update against, and what a reader compares with its
 * checkpoint of the round before. */
void session_log_model(const Session *ss, uint64_t round);

/* ---- overlap.c ---- */

/* The round loop with communication overlapped ([rounds] overlap = on):
 * rank 0 of a site of one rank; 0 when the federation has finished. */
int site_loop_overlap(Session *ss, char *err);

#endif
