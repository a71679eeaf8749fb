/*
 * site.c — a site's link to its coordinator: every call retried with
 * capped exponential backoff and jitter on transient statuses, the model's
 * download (the delta onto the model the site holds, or the whole model),
 * the upload resumed from what the coordinator holds, and the state saved
 * after each round (docs/sites.md).
 */
#include <assert.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "client_internal.h"
#include "kernels/device.h"
#include "kernels/formats.h"
#include "security/security.h"

int site_transient(NetStatus st) {
    return st == NET_UNAVAILABLE || st == NET_DEADLINE_EXCEEDED || st == NET_RESOURCE_EXHAUSTED ||
           st == NET_INTERNAL || st == NET_CANCELLED || st == NET_ABORTED || st == NET_UNKNOWN;
}

void site_retry_wait(Site *s, int attempt) {
    int64_t ms = 250;
    for (int i = 0; i < attempt && ms < BACKOFF_MAX_MS; i++) ms *= 2;
    if (ms > BACKOFF_MAX_MS) ms = BACKOFF_MAX_MS;
    s->rng ^= s->rng << 13, s->rng ^= s->rng >> 7, s->rng ^= s->rng << 17;
    ms = ms * 3 / 4 + (int64_t)(s->rng % (uint64_t)(ms / 2 + 1));
    /* the floor keeps a server that drops every connection it takes from
     * being called in a loop */
    int64_t floor = ms / 8;
    int lost = !net_channel_wait_ready(s->ch, 0); /* connected: a full wait */
    usleep((useconds_t)floor * 1000);
    uint64_t t0 = time_monotonic_ns();
    if (lost && net_channel_wait_ready(s->ch, ms - floor)) return;
    int64_t left = ms - floor - (int64_t)((time_monotonic_ns() - t0) / 1000000);
    if (left > 0) usleep((useconds_t)left * 1000);
}

int site_read(Site *s, char *err) {
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

/* A unary site_call, retried while the failure is transient. */
NetStatus site_call(Site *s, const char *method, const void *req, size_t len, NetBuf *resp,
                    char *details) {
    for (int attempt = 0;; attempt++) {
        NetStatus st = net_unary(s->ch, method, req, len, resp, CALL_TIMEOUT_MS, details, 256);
        if (st == NET_OK || !site_transient(st)) return st;
        log_warn("site", "%s: %s (%s); retrying", method, net_status_name(st), details);
        site_retry_wait(s, attempt);
    }
}

Strait__HelloResponse *site_hello(Site *s, char *err) {
    Strait__HelloRequest req = STRAIT__HELLO_REQUEST__INIT;
    req.protocol_version = CLIENT_PROTOCOL_VERSION;
    req.strait_version = "strait";
    uint8_t buf[128];
    size_t n = strait__hello_request__pack(&req, buf);
    NetBuf resp;
    char details[256];
    NetStatus st = site_call(s, "/strait.Federation/Hello", buf, n, &resp, details);
    if (st != NET_OK) {
        err_set(err, "hello refused (%s): %s", net_status_name(st), details);
        return NULL;
    }
    Strait__HelloResponse *hr = strait__hello_response__unpack(NULL, resp.len, resp.data);
    net_buf_free(&resp);
    if (hr == NULL) err_set(err, "malformed Hello answer");
    return hr;
}

/* Downloads the current model into the Model. A site that holds the
 * previous round's model (theta, of round `have`, whose SHA-256 is
 * theta_sha) gets the way from it to the current one: the outer update in
 * the downlink codec, which it adds to theta exactly as the coordinator
 * added it to its own copy (so the two stay bit-identical), or the lossless
 * delta of a lossless downlink. Any other site gets the whole checkpoint
 * (through SITEDIR/model.safetensors). */
static int decode_model(Site *s, Model *m, const float *theta, int64_t have, NetBuf *pl, char *err);

static int get_model_once(Site *s, Model *m, const float *theta, const uint8_t theta_sha[32],
                          int64_t have, uint64_t *served, uint64_t *current, int *was_delta,
                          RoundTimes *times, char *err);

/* the most pieces one catch-up takes (the coordinator's chain is shorter):
 * a coordinator that names ever later rounds cannot keep a site here */
#define CHAIN_PIECES_MAX 64

/* The model of round *served (or a later one) into m (theta: the model of
 * round `have` the site holds, the base a delta applies to); *served gets
 * the round the coordinator says it is, which may be past the one the site
 * asked for (a download that outlived rounds: a cut link). A site some
 * rounds behind may be served a chain of deltas, one round each, when they
 * add up to less than the checkpoint: each is applied onto the model the
 * last one gave, until the round asked for or, when the stream says the
 * federation is further on (a download that waited out a cut link), that
 * round: a site does not train a model rounds old only to be refused. */
int site_get_model(Site *s, Model *m, const float *theta, const uint8_t theta_sha[32], int64_t have,
                   uint64_t *served, RoundTimes *times, char *err) {
    uint64_t want = *served;
    const int64_t first = have;
    RoundTimes sum = {0, 0, 0, 0};
    float *step = NULL; /* the model a link gave, the base of the next */
    uint8_t step_sha[32];
    int links = 0;
    for (;;) {
        int was_delta = 0;
        RoundTimes t = {0, 0, 0, 0};
        uint64_t current = 0;
        int rc = get_model_once(s, m, step ? step : theta, step ? step_sha : theta_sha, have,
                                served, &current, &was_delta, &t, err);
        sum.download += t.download, sum.decode += t.decode;
        if (current > want) want = current;
        if (rc != 0 || !was_delta || have < 0 || *served >= want || *served <= (uint64_t)have ||
            links + 1 >= CHAIN_PIECES_MAX) {
            if (rc == 0 && links)
                log_info("site", "caught up from round %lld to %llu by a chain of %d deltas%s",
                         (long long)first, (unsigned long long)*served, links + was_delta,
                         was_delta ? "" : " and the checkpoint");
            times->download = sum.download, times->decode = sum.decode;
            free(step);
            return rc;
        }
        if (step == NULL && (step = malloc(sizeof(float) * m->n_params)) == NULL) {
            *served = want;
            times->download = sum.download, times->decode = sum.decode;
            return err_set(err, "out of memory for the model (%zu parameters)", m->n_params);
        }
        memcpy(step, m->params, sizeof(float) * m->n_params);
        security_sha256(step, m->n_params * 4, step_sha);
        have = (int64_t)*served, *served = want, links++;
    }
}

static int get_model_once(Site *s, Model *m, const float *theta, const uint8_t theta_sha[32],
                          int64_t have, uint64_t *served, uint64_t *current, int *was_delta,
                          RoundTimes *times, char *err) {
    uint64_t t0 = time_monotonic_ns();
    NetLimits lim = {.max_total = (uint64_t)m->n_params * 8 + (8u << 20)};
    Strait__GetModelRequest req = STRAIT__GET_MODEL_REQUEST__INIT;
    req.has_model = have >= 0;
    req.have_round = have >= 0 ? (uint64_t)have : 0;
    uint8_t buf[160];
    if (have >= 0) { /* the coordinator serves a delta only onto these very bytes */
        req.have_sha256.data = (uint8_t *)theta_sha;
        req.have_sha256.len = 32;
    }
    NetBuf payload;
    NetDownloadHeld held = {NULL, 0, 0, {0}}; /* what a cut download left, to resume from */
    char details[256];
    for (int attempt = 0;; attempt++) {
        req.resume_offset = held.have;
        req.resume_sha256.data = held.sha;
        req.resume_sha256.len = held.have ? 32 : 0;
        size_t n = strait__get_model_request__pack(&req, buf);
        uint64_t from = held.have;
        NetDownloadHead head;
        NetStatus st =
            net_download(s->ch, "/strait.Federation/GetModel", buf, n, &lim, CALL_TIMEOUT_MS * 5,
                         &payload, &head, &held, details, sizeof details);
        if (st == NET_OK) {
            *served = head.round;
            /* the federation's round, a claim the loop above bounds */
            Strait__ModelMeta *mm = strait__model_meta__unpack(NULL, head.meta_len, head.meta);
            *current = mm ? mm->current_round : 0;
            if (mm) strait__model_meta__free_unpacked(mm, NULL);
            if (from)
                log_info("site", "model download resumed at %llu of %zu bytes",
                         (unsigned long long)from, payload.len);
            break;
        }
        if (!site_transient(st) && st != NET_DATA_LOSS) {
            net_download_held_free(&held);
            return err_set(err, "model download refused (%s): %s", net_status_name(st), details);
        }
        log_warn("site", "model download: %s (%s); retrying%s", net_status_name(st), details,
                 held.have ? " from where it stopped" : "");
        site_retry_wait(s, attempt);
    }
    times->download = ms_since(t0);
    t0 = time_monotonic_ns();
    *was_delta = compress_blob_kind(payload.data, payload.len) != BLOB_KIND_NONE;
    int rc = decode_model(s, m, theta, have, &payload, err);
    times->decode = ms_since(t0);
    return rc;
}

/* The payload of GetModel (freed here) into m: a delta onto theta, a
 * checkpoint, or a safetensors file. */
static int decode_model(Site *s, Model *m, const float *theta, int64_t have, NetBuf *pl,
                        char *err) {
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
    return model_load(m, path, NULL, err);
}

/* One Heartbeat, never retried: the federation's current round, or 0 when
 * the coordinator did not answer (no news is not a reason to stop). */
uint64_t site_heartbeat(Site *s, uint64_t round, int *reported) {
    if (reported) *reported = 0;
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
    if (hr && reported) *reported = hr->reported;
    if (hr) strait__heartbeat_response__free_unpacked(hr, NULL);
    return current;
}

/* Waits for the round after `after`; *resend is set when the coordinator is
 * still at `after` without this site's update (it restarted, or the round
 * was reopened), and the update must go again. */
int site_wait_round(Site *s, uint64_t after, int allow_resend, uint64_t *round, int *finished,
                    int *resend, char *err) {
    Strait__WaitRoundRequest req = STRAIT__WAIT_ROUND_REQUEST__INIT;
    req.after_round = after;
    uint8_t buf[32];
    size_t n = strait__wait_round_request__pack(&req, buf);
    for (;;) {
        NetBuf resp;
        char details[256];
        NetStatus st = site_call(s, "/strait.Federation/WaitRound", buf, n, &resp, details);
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

/* Refuses a model this site cannot hold: its training state (with a
 * frozen base), and four copies of what travels (the round's θ, the
 * error-feedback residual, a download and the update: the adapters alone
 * with them). */
int site_check_memory(const SiteRunOptions *o, const ModelConfig *cfg, char *err) {
    int B = o->batch > 0 ? o->batch : 8, T = o->seq > 0 ? o->seq : (cfg->T < 128 ? cfg->T : 128);
    double n = model_config_params(cfg);
    double travels = cfg->lora.rank > 0 ? model_adapter_trained(cfg) : n;
    ModelConfig held = *cfg; /* without bf16 units, a bf16 base stays at fp32's size */
    if (!bf16_units()) held.lora.base_bf16 = 0;
    double need = model_train_bytes(&held, B, T, o->moments_bf16, o->recompute) + 4.0 * travels * 4;
    double have = memory_available(o);
    if (have <= 0 || need <= have) return 0;
    return err_set(err,
                   "the federation's model (%.3g billion parameters) needs about %.1f GB here "
                   "and this site has %.1f GB%s; run the site on a larger machine, with a "
                   "smaller --batch, with --recompute 2, or with --moments bf16",
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
/* Removes a folder of plain files (a state folder) and what it holds. */
static void remove_state_dir(const char *dir) {
    DIR *d = opendir(dir);
    if (d == NULL) return;
    struct dirent *e;
    char path[1400];
    while ((e = readdir(d)) != NULL) {
        if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0) continue;
        snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
        unlink(path);
    }
    closedir(d);
    rmdir(dir);
}

/* The state is a folder written whole: its files go to state.new, which
 * then takes the place of state in one exchange (renameat2), so a failure
 * or a crash anywhere leaves the last whole state, never one file of a
 * newer round beside another of an older one; the folder it replaced is
 * removed after. */
/* to, a new file with from's bytes: a hard link, or a copy where the file
 * system has none */
static int link_or_copy(const char *from, const char *to, char *err) {
    if (link(from, to) == 0) return 0;
    int in = open(from, O_RDONLY | O_CLOEXEC);
    if (in < 0) return err_set_errno(err, "cannot open %s", from);
    AtomicFile *af = file_atomic_open(to, 0600, err);
    enum { CHUNK = 1 << 20 };
    char *buf = mallocCheck(CHUNK);
    ssize_t got;
    int bad = af == NULL;
    while (!bad && (got = read(in, buf, CHUNK)) != 0) {
        if (got < 0 && errno == EINTR) continue;
        if (got < 0)
            bad = err_set_errno(err, "cannot read %s", from);
        else
            bad = file_atomic_write(af, buf, (size_t)got, err) != 0;
    }
    free(buf), close(in);
    if (bad && af) file_atomic_abort(af);
    return bad ? -1 : file_atomic_commit(af, err);
}

int site_state_save(const Site *s, const Model *m, const ErrorFeedback *ef, uint64_t round,
                    size_t pos, const char *opt_ready, char *err) {
    char dir[1200], fresh[1200], path[1300];
    snprintf(dir, sizeof dir, "%s/state", s->o.site_dir);
    snprintf(fresh, sizeof fresh, "%s/state.new", s->o.site_dir);
    remove_state_dir(fresh); /* a save that failed before this one */
    if (file_mkdir_p(fresh, 0700, err) != 0) return -1;
    char ini[256];
    snprintf(ini, sizeof ini, "[state]\nround = %llu\ndata_pos = %zu\n", (unsigned long long)round,
             pos);
    int bad = 0;
    snprintf(path, sizeof path, "%s/inner.opt.safetensors", fresh);
    bad = bad || (opt_ready ? link_or_copy(opt_ready, path, err)
                            : model_save_optimizer(m, path, err)) != 0;
    snprintf(path, sizeof path, "%s/ef.bin", fresh);
    bad = bad || ef_save(ef, path, 0600, err) != 0;
    snprintf(path, sizeof path, "%s/state.ini", fresh);
    bad = bad || file_write_atomic(path, ini, strlen(ini), 0600, err) != 0;
    char old[1200];
    snprintf(old, sizeof old, "%s/state.old", s->o.site_dir);
    int exists = !bad && access(dir, F_OK) == 0;
    int rc = bad      ? -1
             : exists ? renameat2(AT_FDCWD, fresh, AT_FDCWD, dir, RENAME_EXCHANGE)
                      : rename(fresh, dir);
    if (rc != 0 && exists && (errno == EINVAL || errno == ENOSYS || errno == EOPNOTSUPP)) {
        /* a file system without the exchange (NFS): two renames, and a
         * crash between them leaves state.old, which site_state_load reads */
        remove_state_dir(old);
        rc = rename(dir, old);
        if (rc == 0 && (rc = rename(fresh, dir)) != 0) {
            int e = errno;
            if (rename(old, dir) != 0) log_warn("site", "the last state is in %s", old);
            errno = e;
        }
        if (rc == 0) remove_state_dir(old);
    }
    if (!bad && rc != 0)
        bad = err_set_errno(err, "cannot put the saved state %s in place of %s", fresh, dir);
    if (bad) {
        remove_state_dir(fresh);
        return -1;
    }
    remove_state_dir(fresh); /* the state it replaced */
    return file_fsync_dir(s->o.site_dir, err);
}

/* 1 when a saved state was loaded, 0 when there is none, -1 on a damaged one. */
int site_state_load(const Site *s, Model *m, ErrorFeedback *ef, uint64_t *round, size_t *pos,
                    char *err) {
    char path[1300];
    /* state, or state.old when a save without the exchange stopped between
     * its two renames */
    const char *sub = "state";
    snprintf(path, sizeof path, "%s/state/state.ini", s->o.site_dir);
    if (access(path, F_OK) != 0) {
        sub = "state.old";
        snprintf(path, sizeof path, "%s/state.old/state.ini", s->o.site_dir);
        if (access(path, F_OK) != 0) return 0;
    }
    Config *cfg = config_load(path, err);
    if (cfg == NULL) return -1;
    int64_t r, p;
    int bad = config_get_int(cfg, "state", "round", 0, 0, INT64_MAX, &r, err) ||
              config_get_int(cfg, "state", "data_pos", 0, 0, INT64_MAX, &p, err);
    config_free(cfg);
    if (bad) return -1;
    snprintf(path, sizeof path, "%s/%s/inner.opt.safetensors", s->o.site_dir, sub);
    if (access(path, F_OK) == 0 && model_load_optimizer(m, path, err) != 0) return -1;
    snprintf(path, sizeof path, "%s/%s/ef.bin", s->o.site_dir, sub);
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
void *site_signal_watch(void *arg) {
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
int site_upload(Site *s, uint64_t round, const Blob *blob, const uint8_t *meta, size_t mlen,
                const uint8_t blob_sha[32], int *refused) {
    return site_upload_as(s, round, 0, blob, meta, mlen, blob_sha, refused);
}

int site_upload_as(Site *s, uint64_t round, uint64_t attempt, const Blob *blob, const uint8_t *meta,
                   size_t mlen, const uint8_t blob_sha[32], int *refused) {
    char id[96], details[256];
    if (attempt)
        snprintf(id, sizeof id, "%s-r%llu-a%llu", s->name, (unsigned long long)round,
                 (unsigned long long)attempt);
    else
        snprintf(id, sizeof id, "%s-r%llu", s->name, (unsigned long long)round);
    NetTransferSpec spec = {"update", round, id, 0, meta, mlen, blob_sha};
    *refused = 0;
    for (int attempt = 0;; attempt++) {
        uint64_t from = 0;
        NetStatus st = net_upload(s->ch, "/strait.Federation/PushUpdate",
                                  "/strait.Federation/QueryUpload", &spec, blob->data, blob->len,
                                  CALL_TIMEOUT_MS * 5, &from, details, sizeof details);
        if (st == NET_OK) {
            log_info("site", "round %llu: sent %zu bytes%s", (unsigned long long)round, blob->len,
                     from ? " (resumed)" : "");
            return 0;
        }
        if (!site_transient(st) && st != NET_DATA_LOSS) {
            log_warn("site", "round %llu: update refused (%s): %s", (unsigned long long)round,
                     net_status_name(st), details);
            *refused = 1;
            return 0;
        }
        log_warn("site", "upload: %s (%s); retrying", net_status_name(st), details);
        site_retry_wait(s, attempt);
    }
}
