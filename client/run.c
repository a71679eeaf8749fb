/*
 * run.c — the site agent's loop (docs/design.md §1): Hello → GetModel → H inner
 * AdamW steps on local data → Δ = θ_global − θ_local with error feedback →
 * encode with the federation's codec → PushUpdate (resumable) → WaitRound →
 * … until the federation reports it is finished.
 *
 * Failures are routine: every call is retried with capped exponential
 * backoff and jitter on transient statuses, an interrupted upload resumes
 * from what the coordinator holds, and a site that finds the round moved on
 * starts over with the new model. The inner optimizer's moments live in the
 * model across rounds, as in DiLoCo.
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
#include <assert.h>
#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <xxhash.h>

#include "client.h"
#include "compress/compress.h"
#include "kernels/device.h"
#include "kernels/model.h"
#include "kernels/formats.h"
#include "kernels/data.h"
#include "kernels/ranks.h"
#include "kernels/train.h"
#include "net/net.h"
#include "schema/strait.pb-c.h"
#include "security/security.h"
#include "util/util.h"

#define CALL_TIMEOUT_MS 60000
/* while training, a sign of life this often (monitors count a site online
 * for a minute after its last call) */
#define HEARTBEAT_MS   15000
#define BACKOFF_MAX_MS 10000

static int transient(NetStatus st) {
    return st == NET_UNAVAILABLE || st == NET_DEADLINE_EXCEEDED || st == NET_RESOURCE_EXHAUSTED ||
           st == NET_INTERNAL || st == NET_CANCELLED || st == NET_ABORTED || st == NET_UNKNOWN;
}

/* sleeps before retry `attempt` (0, 1, …): 250 ms doubling to 10 s, ± 25 % */
static void backoff(int attempt, uint64_t *rng) {
    int64_t ms = 250;
    for (int i = 0; i < attempt && ms < BACKOFF_MAX_MS; i++) ms *= 2;
    if (ms > BACKOFF_MAX_MS) ms = BACKOFF_MAX_MS;
    *rng ^= *rng << 13, *rng ^= *rng >> 7, *rng ^= *rng << 17;
    ms = ms * 3 / 4 + (int64_t)(*rng % (uint64_t)(ms / 2 + 1));
    usleep((useconds_t)ms * 1000);
}

typedef struct Site {
    SiteRunOptions o;
    char name[65], coordinator[256];
    char *key, *cert, *ca;
    NetChannel *ch;
    uint64_t rng;
    uint64_t bytes_down; /* model bytes downloaded, for the log */
} Site;

static int site_read(Site *s, char *err) {
    char path[1200];
    snprintf(path, sizeof path, "%s/site.ini", s->o.site_dir);
    Config *cfg = config_load(path, err);
    if (cfg == NULL) return -1;
    snprintf(s->name, sizeof s->name, "%s", config_get_str(cfg, "site", "name", ""));
    snprintf(s->coordinator, sizeof s->coordinator, "%s",
             config_get_str(cfg, "site", "coordinator", ""));
    config_free(cfg);
    const char *files[3] = {"site.key", "site.crt", "ca.crt"};
    char **out[3] = {&s->key, &s->cert, &s->ca};
    for (int i = 0; i < 3; i++) {
        snprintf(path, sizeof path, "%s/%s", s->o.site_dir, files[i]);
        if (file_read_all(path, 1 << 20, out[i], NULL, err) != 0) return -1;
    }
    char target[300];
    net_target(s->coordinator, target, sizeof target);
    NetChannelConfig cc = {target, {s->ca, s->cert, s->key}, NULL, 0, 0};
    s->ch = net_channel_create(&cc, err);
    return s->ch ? 0 : -1;
}

/* A unary call, retried while the failure is transient. */
static NetStatus call(Site *s, const char *method, const void *req, size_t len, NetBuf *resp,
                      char *details) {
    for (int attempt = 0;; attempt++) {
        NetStatus st = net_unary(s->ch, method, req, len, resp, CALL_TIMEOUT_MS, details, 256);
        if (st == NET_OK || !transient(st)) return st;
        log_warn("site", "%s: %s (%s); retrying", method, net_status_name(st), details);
        backoff(attempt, &s->rng);
    }
}

static Strait__HelloResponse *hello(Site *s, char *err) {
    Strait__HelloRequest req = STRAIT__HELLO_REQUEST__INIT;
    req.protocol_version = CLIENT_PROTOCOL_VERSION;
    req.strait_version = "strait";
    uint8_t buf[128];
    size_t n = strait__hello_request__pack(&req, buf);
    NetBuf resp;
    char details[256];
    NetStatus st = call(s, "/strait.Federation/Hello", buf, n, &resp, details);
    if (st != NET_OK) {
        err_set(err, "hello refused (%s): %s", net_status_name(st), details);
        return NULL;
    }
    Strait__HelloResponse *hr = strait__hello_response__unpack(NULL, resp.len, resp.data);
    net_buf_free(&resp);
    if (hr == NULL) err_set(err, "malformed Hello answer");
    return hr;
}

/* Downloads the current model into the GPT. A site that holds the
 * previous round's model (theta, of round `have`, whose SHA-256 is
 * theta_sha) gets the way from it to the current one: the outer update in
 * the downlink codec, which it adds to theta exactly as the coordinator
 * added it to its own copy (so the two stay bit-identical), or the lossless
 * delta of a lossless downlink. Any other site gets the whole checkpoint
 * (through SITEDIR/model.safetensors). */
/* Where a site's round goes before its upload, for UpdateMeta (ms). */
typedef struct RoundTimes {
    uint64_t download, decode, eval, encode;
} RoundTimes;

static uint64_t ms_since(uint64_t t0) {
    return (time_monotonic_ns() - t0) / 1000000;
}

static int decode_model(Site *s, GPT *m, const float *theta, int64_t have, NetBuf *pl, char *err);

/* The current model into m (theta: the model of round `have` the site
 * holds, the base a delta applies to); *served gets the round the
 * coordinator says it is, which may be past the one the site asked in (a
 * download that outlived rounds: a cut link). */
static int get_model(Site *s, GPT *m, const float *theta, const uint8_t theta_sha[32], int64_t have,
                     uint64_t *served, RoundTimes *times, char *err) {
    uint64_t t0 = time_monotonic_ns();
    NetLimits lim = {.max_total = (uint64_t)m->n_params * 8 + (8u << 20)};
    Strait__GetModelRequest req = STRAIT__GET_MODEL_REQUEST__INIT;
    req.has_model = have >= 0;
    req.have_round = have >= 0 ? (uint64_t)have : 0;
    uint8_t buf[96];
    if (have >= 0) { /* the coordinator serves a delta only onto these very bytes */
        req.have_sha256.data = (uint8_t *)theta_sha;
        req.have_sha256.len = 32;
    }
    size_t n = strait__get_model_request__pack(&req, buf);
    NetBuf payload;
    char details[256];
    for (int attempt = 0;; attempt++) {
        NetStatus st = net_download(s->ch, "/strait.Federation/GetModel", buf, n, &lim,
                                    CALL_TIMEOUT_MS * 5, &payload, served, details, sizeof details);
        if (st == NET_OK) break;
        if (!transient(st) && st != NET_DATA_LOSS)
            return err_set(err, "model download refused (%s): %s", net_status_name(st), details);
        log_warn("site", "model download: %s (%s); retrying", net_status_name(st), details);
        backoff(attempt, &s->rng);
    }
    times->download = ms_since(t0);
    t0 = time_monotonic_ns();
    int rc = decode_model(s, m, theta, have, &payload, err);
    times->decode = ms_since(t0);
    return rc;
}

/* The payload of GetModel (freed here) into m: a delta onto theta, a
 * checkpoint, or a safetensors file. */
static int decode_model(Site *s, GPT *m, const float *theta, int64_t have, NetBuf *pl, char *err) {
    NetBuf payload = *pl;
    s->bytes_down += payload.len;
    BlobKind kind = compress_blob_kind(payload.data, payload.len);
    if (kind != BLOB_KIND_NONE && have < 0) {
        net_buf_free(&payload);
        return err_set(err, "a model delta came for a site without a model");
    }
    if (kind == BLOB_KIND_UPDATE) { /* θ_r = θ_{r-1} + decoded, float for float */
        /* checked and decoded in one pass: a failure ends the site */
        int rc = codec_inspect_decode(payload.data, payload.len, m->table_hash, m->n_params,
                                      m->params, NULL, err);
        net_buf_free(&payload);
        if (rc != 0) {
            char why[ERR_LEN];
            snprintf(why, sizeof why, "%s", err);
            return err_set(err, "the model update from the coordinator: %s", why);
        }
        /* θ + decoded at every index, as the coordinator adds it (θ + 0 where
         * a sparse update carries nothing: −0 becomes +0 on both sides) */
        for (size_t i = 0; i < m->n_params; i++) m->params[i] = theta[i] + m->params[i];
        return 0;
    }
    if (kind == BLOB_KIND_CHECKPOINT) { /* straight into the model: a failure ends the site */
        int rc = ckpt_decode_into(payload.data, payload.len, theta, m->n_params * 4, m->params,
                                  m->n_params * 4, err);
        net_buf_free(&payload);
        return rc;
    }
    char path[1200];
    snprintf(path, sizeof path, "%s/model.safetensors", s->o.site_dir);
    int rc = file_write_atomic(path, payload.data, payload.len, 0644, err);
    net_buf_free(&payload);
    if (rc != 0) return -1;
    return gpt_load(m, path, NULL, err);
}

/* The site's held-out score of the model in m: the same 4 batches from the
 * start of its validation split every time, so rounds compare. */
#define HELD_OUT_BATCHES 4

/* One Heartbeat, never retried: the federation's current round, or 0 when
 * the coordinator did not answer (no news is not a reason to stop). */
static uint64_t heartbeat(Site *s, uint64_t round) {
    Strait__HeartbeatRequest req = STRAIT__HEARTBEAT_REQUEST__INIT;
    req.round = round;
    req.state = "training";
    uint8_t buf[64];
    size_t n = strait__heartbeat_request__pack(&req, buf);
    NetBuf resp;
    char details[256];
    if (net_unary(s->ch, "/strait.Federation/Heartbeat", buf, n, &resp, 5000, details,
                  sizeof details) != NET_OK)
        return 0;
    Strait__HeartbeatResponse *hr = strait__heartbeat_response__unpack(NULL, resp.len, resp.data);
    net_buf_free(&resp);
    uint64_t current = hr ? hr->current_round : 0;
    if (hr) strait__heartbeat_response__free_unpacked(hr, NULL);
    return current;
}

/* Waits for the round after `after`; *resend is set when the coordinator is
 * still at `after` without this site's update (it restarted, or the round
 * was reopened), and the update must go again. */
static int wait_round(Site *s, uint64_t after, int allow_resend, uint64_t *round, int *finished,
                      int *resend, char *err) {
    Strait__WaitRoundRequest req = STRAIT__WAIT_ROUND_REQUEST__INIT;
    req.after_round = after;
    uint8_t buf[32];
    size_t n = strait__wait_round_request__pack(&req, buf);
    for (;;) {
        NetBuf resp;
        char details[256];
        NetStatus st = call(s, "/strait.Federation/WaitRound", buf, n, &resp, details);
        if (st != NET_OK)
            return err_set(err, "wait refused (%s): %s", net_status_name(st), details);
        Strait__WaitRoundResponse *wr =
            strait__wait_round_response__unpack(NULL, resp.len, resp.data);
        net_buf_free(&resp);
        if (wr == NULL) return err_set(err, "malformed WaitRound answer");
        *round = wr->current_round;
        *finished = wr->finished;
        *resend = !wr->finished && wr->current_round == after && !wr->reported;
        strait__wait_round_response__free_unpacked(wr, NULL);
        if (*finished || *round > after || (*resend && allow_resend)) return 0;
        if (*resend) usleep(1000000); /* refused this round: wait for the next one */
    }
}

/* The memory the site may take: --max-memory, or what the machine has
 * available now (MemAvailable). */
static double memory_available(const SiteRunOptions *o) {
    if (o->max_memory) return (double)o->max_memory;
    return kernels_mem_available();
}

/* Refuses a model this site cannot hold: its training state, the round's
 * copy of θ, the error-feedback residual, a download and the update. */
static int check_memory(const SiteRunOptions *o, const GPTConfig *cfg, char *err) {
    int B = o->batch > 0 ? o->batch : 8, T = o->seq > 0 ? o->seq : (cfg->T < 128 ? cfg->T : 128);
    double n = gpt_config_params(cfg);
    double need = gpt_train_bytes(cfg, B, T, o->moments_bf16) + 4.0 * n * 4;
    double have = memory_available(o);
    if (have <= 0 || need <= have) return 0;
    return err_set(err,
                   "the federation's model (%.3g billion parameters) needs about %.1f GB here "
                   "and this site has %.1f GB%s; run the site on a larger machine, with a "
                   "smaller --batch, or with --moments bf16",
                   n / 1e9, need / 1e9, have / 1e9,
                   o->max_memory ? " (--max-memory)" : " available");
}

/* ---- the site's state, written atomically after each round ---------------------- */

/* SITEDIR/state/: inner.opt.safetensors (AdamW's moments, kept across
 * rounds as in DiLoCo), ef.bin (the error-feedback residual) and state.ini
 * (the round it belongs to and the data position). Not θ_local: a resumed
 * site starts from the federation's model of its round, so the trained
 * parameters would be a model's size written and synced each round for
 * nothing (earlier versions wrote them to inner.safetensors; it is
 * removed). */
static int state_save(const Site *s, const GPT *m, const ErrorFeedback *ef, uint64_t round,
                      size_t pos, char *err) {
    char dir[1200], path[1300];
    snprintf(dir, sizeof dir, "%s/state", s->o.site_dir);
    if (file_mkdir_p(dir, 0700, err) != 0) return -1;
    snprintf(path, sizeof path, "%s/inner.safetensors", dir);
    if (unlink(path) != 0 && errno != ENOENT)
        return err_set(err, "cannot remove %s: %s", path, strerror(errno));
    snprintf(path, sizeof path, "%s/inner.opt.safetensors", dir);
    if (gpt_save_optimizer(m, path, err) != 0) return -1;
    snprintf(path, sizeof path, "%s/ef.bin", dir);
    if (ef_save(ef, path, 0600, err) != 0) return -1;
    char ini[256];
    snprintf(ini, sizeof ini, "[state]\nround = %llu\ndata_pos = %zu\n", (unsigned long long)round,
             pos);
    snprintf(path, sizeof path, "%s/state.ini", dir);
    return file_write_atomic(path, ini, strlen(ini), 0600, err); /* last: marks a whole state */
}

/* 1 when a saved state was loaded, 0 when there is none, -1 on a damaged one. */
static int state_load(const Site *s, GPT *m, ErrorFeedback *ef, uint64_t *round, size_t *pos,
                      char *err) {
    char path[1300];
    snprintf(path, sizeof path, "%s/state/state.ini", s->o.site_dir);
    if (access(path, F_OK) != 0) return 0;
    Config *cfg = config_load(path, err);
    if (cfg == NULL) return -1;
    int64_t r, p;
    int bad = config_get_int(cfg, "state", "round", 0, 0, INT64_MAX, &r, err) ||
              config_get_int(cfg, "state", "data_pos", 0, 0, INT64_MAX, &p, err);
    config_free(cfg);
    if (bad) return -1;
    snprintf(path, sizeof path, "%s/state/inner.opt.safetensors", s->o.site_dir);
    if (access(path, F_OK) == 0 && gpt_load_optimizer(m, path, err) != 0) return -1;
    snprintf(path, sizeof path, "%s/state/ef.bin", s->o.site_dir);
    char *data;
    size_t len;
    if (file_read_all(path, (size_t)1 << 36, &data, &len, err) != 0) return -1;
    ErrorFeedback loaded;
    int rc = ef_deserialize(&loaded, (const uint8_t *)data, len, err);
    free(data);
    if (rc != 0) return -1;
    if (loaded.n != ef->n || loaded.table_hash != ef->table_hash) {
        ef_free(&loaded);
        return err_set(err, "saved state is for another model; remove %s/state", s->o.site_dir);
    }
    ef_free(ef);
    *ef = loaded;
    *round = (uint64_t)r;
    *pos = (size_t)p;
    return 1;
}

/* SIGINT and SIGTERM end the site: net_global_init blocks them in every
 * thread, so this one waits for them. What a round had trained is lost;
 * the state saved after each upload is where the site resumes. */
static void *signal_watch(void *arg) {
    (void)arg;
    for (;;) {
        int sig = net_wait_signal(-1);
        if (sig == SIGINT || sig == SIGTERM) {
            log_warn("site",
                     "signal %d: stopping (the next start resumes from the last saved "
                     "round)",
                     sig);
            _exit(128 + sig);
        }
    }
    return NULL;
}

/* ---- a site of several ranks ------------------------------------------------------ */

/* What rank 0 tells the others at the start of each round. */
typedef struct RoundOrder {
    uint64_t round;
    int64_t finished;
} RoundOrder;

/* The HelloResponse, packed by rank 0 and unpacked by every other rank. */
static Strait__HelloResponse *share_hello(const Ranks *rk, Strait__HelloResponse *hr, char *err) {
    if (rk->size == 1) return hr;
    uint64_t len = rk->rank == 0 ? strait__hello_response__get_packed_size(hr) : 0;
    ranks_bcast(&len, sizeof len);
    uint8_t *buf = mallocCheck(len ? len : 1);
    if (rk->rank == 0) strait__hello_response__pack(hr, buf);
    ranks_bcast(buf, len);
    if (rk->rank != 0) hr = strait__hello_response__unpack(NULL, len, buf);
    free(buf);
    if (hr == NULL)
        err_set(err, "rank %d: the federation's answer from rank 0 does not parse", rk->rank);
    return hr;
}

/* The inner optimizer's state and the data position, rank 0's to all. */
static void share_state(const Ranks *rk, GPT *m, size_t *pos) {
    if (rk->size == 1) return;
    int64_t head[3] = {m->m != NULL || m->mh != NULL, m->step, (int64_t)*pos};
    ranks_bcast(head, sizeof head);
    if (head[0] && m->moments_bf16) { /* every rank keeps them as rank 0 does (--moments) */
        if (m->mh == NULL) {
            m->mh = callocCheck(m->n_params, sizeof(uint16_t));
            m->vh = callocCheck(m->n_params, sizeof(uint16_t));
        }
        ranks_bcast(m->mh, m->n_params * sizeof(uint16_t));
        ranks_bcast(m->vh, m->n_params * sizeof(uint16_t));
    } else if (head[0]) {
        if (m->m == NULL) {
            m->m = callocCheck(m->n_params, sizeof(float));
            m->v = callocCheck(m->n_params, sizeof(float));
        }
        ranks_bcast(m->m, m->n_params * sizeof(float));
        ranks_bcast(m->v, m->n_params * sizeof(float));
    }
    m->step = (int)head[1];
    *pos = (size_t)head[2];
}

/* Every rank must hold rank 0's θ after a round's steps: the mean gradient
 * and rank 0's clip factor make it so; this checks it did. */
static int check_same_model(const Ranks *rk, const GPT *m, char *err) {
    if (rk->size == 1) return 0;
    uint64_t mine = XXH64(m->params, m->n_params * sizeof(float), 0), root = mine;
    ranks_bcast(&root, sizeof root);
    int differs = mine != root;
    float any = (float)differs;
    ranks_mean(&any, 1);
    if (any > 0)
        return err_set(err,
                       "the ranks' models differ after the round's steps (rank %d %s): the ranks "
                       "must run the same strait with the same options",
                       rk->rank, differs ? "differs from rank 0" : "agrees");
    return 0;
}

int client_run(const SiteRunOptions *o, char *err) {
    Ranks rk;
    if (ranks_init(&rk, err) != 0) return -1;
    Site s;
    memset(&s, 0, sizeof s);
    s.o = *o;
    s.rng = (uint64_t)time_wall_ms() | 1;
    if (rk.rank == 0) { /* the other ranks never touch the network */
        net_global_init();
        pthread_t watcher;
        if (pthread_create(&watcher, NULL, signal_watch, NULL) == 0) pthread_detach(watcher);
    }
    if (rk.size > 1) log_info("site", "rank %d of %d (pid %d)", rk.rank, rk.size, (int)getpid());
    GPT m;
    memset(&m, 0, sizeof m);
    TokenSet ts = {0};
    ErrorFeedback ef = {0};
    Blob blob = {0};
    float *theta = NULL;
    int *in = NULL, *tg = NULL, rc = -1;
    Strait__HelloResponse *hr = NULL;
    Trainer *trainer = NULL;
    if (rk.rank == 0 && site_read(&s, err) != 0) goto out;
    if (rk.rank == 0 && (hr = hello(&s, err)) == NULL) goto out;
    if ((hr = share_hello(&rk, hr, err)) == NULL) goto out;
    GPTConfig cfg;
    const Strait__ModelShape *sh = hr->model_shape;
    if (sh && sh->config && sh->config[0]) { /* the whole description: any architecture */
        char why[ERR_LEN];
        if (model_config_parse(sh->config, strlen(sh->config), &cfg, why) != 0) {
            err_set(err, "the coordinator sent a model this strait cannot build: %s", why);
            goto out;
        }
    } else if (sh && sh->layers > 0) { /* an older coordinator's GPT-2 shape */
        char why[ERR_LEN];
        if (gpt_config_shape(&cfg, hr->model, sh->layers, sh->channels, sh->heads, sh->context,
                             sh->vocab, why) != 0) {
            err_set(err, "the coordinator sent a model shape this strait cannot build: %s", why);
            goto out;
        }
    } else if (gpt_config_preset(hr->model, &cfg) != 0) {
        err_set(err, "the federation trains model '%s', unknown to this strait; upgrade",
                hr->model);
        goto out;
    }
    /* what the coordinator's shape would take here, before any of it is
     * allocated: a shape is the coordinator's claim, and this machine's
     * memory the site's own */
    if (check_memory(o, &cfg, err) != 0) goto out;
    /* the federation's initial model, drawn from its seed as the
     * coordinator drew it: when it is the current model, no download */
    if (gpt_build(&m, &cfg, hr->model_seed, err) != 0) goto out;
    m.moments_bf16 = o->moments_bf16;
    if (m.table_hash != hr->table_hash) {
        err_set(err, "the federation's parameter table differs from this strait's; upgrade");
        goto out;
    }
    if (o->init_from &&
        rk.rank == 0) { /* the pretrained start, held here: maybe no round-0 download */
        GPT pre;
        if (gpt_import_hf(&pre, o->init_from, err) != 0) goto out;
        int same = pre.table_hash == m.table_hash;
        if (same) memcpy(m.params, pre.params, m.n_params * sizeof(float));
        gpt_free(&pre);
        if (!same) {
            err_set(err, "--init-from %s: its shape is not the federation's model's", o->init_from);
            goto out;
        }
    }
    CodecParams codec;
    if (codec_params_parse(hr->uplink_codec, &codec, err) != 0) goto out;
    if (codec.id == CODEC_TOPK && hr->uplink_density > 0) codec.density = hr->uplink_density;
    if (codec_params_check(&codec, err) != 0) goto out;
    int H = (int)hr->inner_steps, B = o->batch > 0 ? o->batch : 8;
    int T = o->seq > 0 ? o->seq : (cfg.T < 128 ? cfg.T : 128);
    if (tokens_load(&ts, o->data, o->n_data, err) != 0) goto out;
    if (ts.vocab > cfg.V) {
        err_set(err,
                "the site's data holds token ids up to %d; the federation's model has a "
                "vocabulary of %d: tokenize with the federation's tokenizer",
                ts.vocab - 1, cfg.V);
        goto out;
    }
    TokenView train, val;
    tokens_split(&ts, 0.1, &train, &val);
    Loader tl;
    int have_val = rk.rank == 0 && val.n > (size_t)B * T; /* at least one batch; rank 0 scores */
    uint64_t seed = o->seed ? o->seed : (uint64_t)time_wall_ms();
    ranks_bcast(&seed, sizeof seed); /* one data order for every rank */
    /* each step reads one global batch: B for every GPU (or the CPU) of every
     * rank; rank r trains on the r-th share */
    int per_rank = o->cuda ? (o->gpus > 0 ? o->gpus : 1) : 1;
    if (loader_init(&tl, train, B * rk.size * per_rank, T, 0, 1, seed, err) != 0) goto out;
    /* the federation's error feedback decay (an older coordinator sends none: 1) */
    float decay = hr->ef_decay > 0 && hr->ef_decay <= 1 ? hr->ef_decay : 1.0f;
    if (ef_init(&ef, m.n_params, m.table_hash, decay, err) != 0) goto out;
    uint64_t saved_round = 0;
    size_t saved_pos = 0;
    int resumed = rk.rank == 0 ? state_load(&s, &m, &ef, &saved_round, &saved_pos, err) : 0;
    if (resumed < 0) goto out;
    share_state(&rk, &m, &saved_pos);
    ranks_bcast(&resumed, sizeof resumed);
    ef.beta = decay; /* the federation's, whatever the saved state had */
    if (resumed) tl.pos = saved_pos < tl.data.n ? saved_pos : 0;
    if (resumed && rk.rank == 0) {
        log_info("site",
                 "%s resumed its saved state (after round %llu: error feedback, "
                 "optimizer moments, data position)",
                 s.name, (unsigned long long)saved_round);
    }
    float lr = o->lr > 0 ? o->lr : 3e-3f;
    /* the schedule runs over every inner step of the federation, as the
     * centralized trainer schedules its steps (set each round: an open-ended
     * federation's length grows) */
    TrainConfig tc = train_defaults(lr, H);
    int gpus = o->cuda ? (o->gpus > 0 ? o->gpus : 1) : 0;
    if ((trainer = trainer_create_ranks(&m, &tc, gpus, B, T, &rk, err)) == NULL) goto out;
    int replicas = trainer_replicas(trainer); /* batches a step takes, on this rank */
    assert(replicas == per_rank);
    size_t share = (size_t)rk.rank * replicas * B * T; /* this rank's in a global batch */
    /* A GPU site makes its Δ and error feedback on its GPU: of the model only
     * the moments and the residual, for the state, and the payloads come to
     * the host. (With several ranks, each compares its host model with rank
     * 0's, so they bring θ_local to the host and encode there.) */
    int on_gpu = gpus > 0 && rk.size == 1 && trainer_keep_base(trainer) == 0;
    if (on_gpu && rk.rank == 0)
        log_info("site", "the update's error feedback and codec run on the GPU (never run on one "
                         "before this build: report what you see)");
    theta = mallocCheck(sizeof(float) * m.n_params);
    in = mallocCheck(sizeof(int) * (size_t)B * T * replicas * rk.size);
    tg = mallocCheck(sizeof(int) * (size_t)B * T * replicas * rk.size);
    kernels_set_threads(o->threads);
    uint64_t round = hr->current_round;
    int finished = hr->finished;
    int64_t have_round = -1; /* the round of the model in theta; -1: none yet */
    if (rk.rank == 0)
        log_info("site",
                 "%s joined federation %s at round %llu (%s, H=%d, %s uplink, %s downlink%s)",
                 s.name, hr->federation, (unsigned long long)round, hr->model, H, hr->uplink_codec,
                 hr->downlink_codec[0] ? hr->downlink_codec : "lossless",
                 rk.size > 1 ? ", several ranks" : "");
    /* a fresh site whose seeded model is the current one (round 0) skips the
     * download; a resumed one holds its trained model, not the round's */
    int seeded = 0;
    uint8_t theta_sha[32]; /* of the model in theta: what GetModel and updates name */
    if (!resumed && hr->model_sha256.len == 32) {
        security_sha256(m.params, m.n_params * 4, theta_sha);
        seeded = memcmp(theta_sha, hr->model_sha256.data, 32) == 0;
        if (!seeded && o->init_from)
            log_warn("site",
                     "--init-from %s is not the federation's current model (another "
                     "checkpoint, or rounds have passed): downloading it",
                     o->init_from);
    }
    int first_round = 1; /* of this process: the GPUs take the moments then */
    for (;;) {
        /* rank 0's order for the round: which, and whether the federation is over */
        RoundOrder order = {round, finished};
        ranks_bcast(&order, sizeof order);
        if (order.finished) break;
        round = order.round;
        int built_here = 0;
        RoundTimes times = {0, 0, 0, 0};
        if (rk.rank == 0) {
            built_here = seeded && round == hr->current_round; /* theta_sha is its hash */
            if (built_here)
                log_info("site",
                         "round %llu: the model is the federation's %s; built here, not downloaded",
                         (unsigned long long)round, o->init_from ? "pretrained one" : "seeded one");
            else {
                uint64_t served = round;
                if (get_model(&s, &m, theta, theta_sha, have_round, &served, &times, err) != 0)
                    goto out;
                if (served > round) {
                    log_warn("site",
                             "round %llu closed while its model was downloading; this is "
                             "round %llu's",
                             (unsigned long long)round, (unsigned long long)served);
                    round = served;
                }
            }
        }
        ranks_bcast(m.params, m.n_params * sizeof(float)); /* θ from rank 0 */
        ranks_bcast(&round, sizeof round);                 /* and its round */
        if (rk.rank == 0) {
            seeded = 0;
            memcpy(theta, m.params, sizeof(float) * m.n_params);
            have_round = (int64_t)round;
            /* what the coordinator checks each update against, and what a
             * reader compares with its checkpoint of the round before */
            char theta_hex[65];
            if (!built_here) security_sha256(theta, m.n_params * 4, theta_sha);
            security_hex(theta_sha, 32, theta_hex);
            log_info("site", "round %llu: model sha256 %s (%llu bytes down so far)",
                     (unsigned long long)round, theta_hex, (unsigned long long)s.bytes_down);
        }
        /* on GPUs: the round's θ; AdamW's moments only at the first round (a
         * resumed state's, or zeros): from then on the GPUs hold their own,
         * as a CPU trainer holds its own in m. (At ranks other than 0 the
         * host's moments are never brought back, so taking them each round
         * would reset those ranks' moments and split the ranks apart.) */
        trainer_from_host(trainer, TRAINER_PARAMS | (first_round ? TRAINER_MOMENTS : 0));
        first_round = 0;
        /* the global model as received, before this site's steps move it;
         * scored where it trains (a GPU site's forward runs on its GPU) */
        uint64_t te = time_monotonic_ns();
        double start_eval = have_val ? trainer_eval_tokens(trainer, val, HELD_OUT_BATCHES) : NAN;
        times.eval = ms_since(te);
        uint64_t t0 = time_monotonic_ns(), last_beat = t0;
        double loss_sum = 0;
        int steps_done = 0;
        int total_steps = (int)(hr->total_rounds ? hr->total_rounds : round + 1) * H;
        tc = train_defaults(lr, total_steps);
        for (int step = 0; step < H; step++) {
            uint64_t now = time_monotonic_ns();
            int go = 1;
            /* the federation's time budget: a slow site sends fewer steps */
            if (rk.rank == 0 && step > 0 && hr->round_budget_ms &&
                (now - t0) / 1000000 >= hr->round_budget_ms)
                go = 0;
            if (rk.rank == 0 && go && (now - last_beat) / 1000000 >= HEARTBEAT_MS) {
                last_beat = now;
                if (heartbeat(&s, round) > round) {
                    log_warn("site", "round %llu closed without this site; stopping its training",
                             (unsigned long long)round);
                    go = 0;
                }
            }
            ranks_bcast(&go, sizeof go); /* the other ranks step when rank 0 does */
            if (!go) break;
            loader_next(&tl, in, tg); /* the global batch: every rank's, every GPU's */
            steps_done++;
            loss_sum += trainer_step(trainer, in + share, tg + share,
                                     train_lr(&tc, (int)round * H + step), NULL);
        }
        uint64_t train_ms = (time_monotonic_ns() - t0) / 1000000; /* the steps alone */
        te = time_monotonic_ns();
        double eval = have_val ? trainer_eval_tokens(trainer, val, HELD_OUT_BATCHES) : NAN;
        times.eval += ms_since(te);
        /* θ_local for Δ, unless the GPU makes it, and at rank 0 the moments
         * for the state */
        trainer_to_host(trainer,
                        (on_gpu ? 0 : TRAINER_PARAMS) | (rk.rank == 0 ? TRAINER_MOMENTS : 0));
        if (check_same_model(&rk, &m, err) != 0) goto out;
        if (rk.rank != 0) continue; /* rank 0 sends the update */
        double train_loss = loss_sum / steps_done;
        CodecLayout L = {m.table_hash, m.n_params, NULL, 0};
        uint64_t tc0 = time_monotonic_ns();
        if (on_gpu) {
            const float *d_local, *d_base;
            if (trainer_device_params(trainer, &d_local, &d_base) != 0) {
                err_set(err, "the GPU trainer kept no copy of the round's model");
                goto out;
            }
            if (ef_encode_cuda(&ef, &codec, &L, d_base, d_local, &blob, err) != 0) goto out;
            ef_to_host(&ef); /* the residual, for the state */
        } else {
            /* Δ = θ − θ_local, made as error feedback adds it */
            if (ef_encode(&ef, &codec, &L, theta, m.params, NULL, &blob, err) != 0) goto out;
        }
        uint8_t blob_sha[32]; /* once: a retried or resumed upload does not hash it again */
        security_sha256(blob.data, blob.len, blob_sha);
        times.encode = ms_since(tc0);
        Strait__UpdateMeta meta = STRAIT__UPDATE_META__INIT;
        meta.tokens = (uint64_t)steps_done * B * T * replicas * rk.size; /* every rank's */
        meta.train_loss = train_loss;
        meta.eval_loss = eval;
        meta.start_eval_loss = start_eval;
        meta.train_ms = train_ms;
        meta.steps = (uint64_t)steps_done;
        meta.base_sha256.data = theta_sha;
        meta.base_sha256.len = 32;
        meta.download_ms = times.download;
        meta.decode_ms = times.decode;
        meta.eval_ms = times.eval;
        meta.encode_ms = times.encode;
        uint8_t mbuf[192];
        assert(strait__update_meta__get_packed_size(&meta) <= sizeof mbuf);
        size_t mlen = strait__update_meta__pack(&meta, mbuf);
        char id[96], details[256];
        snprintf(id, sizeof id, "%s-r%llu", s.name, (unsigned long long)round);
        NetTransferSpec spec = {"update", round, id, 0, mbuf, mlen, blob_sha};
        int resend = 1, refused = 0;
        while (resend) {
            for (int attempt = 0;; attempt++) {
                uint64_t from = 0;
                NetStatus st = net_upload(
                    s.ch, "/strait.Federation/PushUpdate", "/strait.Federation/QueryUpload", &spec,
                    blob.data, blob.len, CALL_TIMEOUT_MS * 5, &from, details, sizeof details);
                if (st == NET_OK) {
                    log_info("site", "round %llu: loss %.4f, eval %.4f, sent %zu bytes%s",
                             (unsigned long long)round, train_loss, eval, blob.len,
                             from ? " (resumed)" : "");
                    break;
                }
                if (!transient(st) && st != NET_DATA_LOSS) {
                    log_warn("site", "round %llu: update refused (%s): %s",
                             (unsigned long long)round, net_status_name(st), details);
                    refused = 1;
                    break;
                }
                log_warn("site", "upload: %s (%s); retrying", net_status_name(st), details);
                backoff(attempt, &s.rng);
            }
            uint64_t at = round;
            if (state_save(&s, &m, &ef, at, tl.pos, err) != 0) goto out;
            if (wait_round(&s, at, !refused, &round, &finished, &resend, err) != 0) goto out;
            if (resend)
                log_warn("site",
                         "round %llu was reopened without this site's update; sending it again",
                         (unsigned long long)at);
        }
    }
    if (rk.rank == 0) log_info("site", "%s: the federation has finished", s.name);
    rc = 0;
out:
    if (rc != 0 && rk.size > 1) { /* the other ranks wait on this one: end them all */
        fprintf(stderr, "strait site run: rank %d of %d: %s\n", rk.rank, rk.size, err);
        ranks_abort(1);
    }
    ranks_finalize();
    trainer_free(trainer);
    if (hr) strait__hello_response__free_unpacked(hr, NULL);
    net_channel_destroy(s.ch);
    free(s.key), free(s.cert), free(s.ca);
    free(theta), free(in), free(tg);
    blob_free(&blob);
    ef_free(&ef);
    tokens_free(&ts);
    gpt_free(&m);
    return rc;
}
