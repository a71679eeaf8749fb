/*
 * session.c — a site's session (docs/design.md §1), what both round loops
 * (run.c's synchronous one, overlap.c's) stand on and never call back
 * from: set up once per run (Hello and its checks, the model — built, or
 * from a pretrained file the site holds, or downloaded —, the data and
 * its held-out split, the trainer, the codec and error feedback, the saved
 * state, rank 0's heartbeat thread) and the steps each round takes (the
 * inner steps from θ, then Δ = θ − θ_local with error feedback, encoded
 * with its UpdateMeta). A site of several ranks shares Hello and θ from
 * rank 0 and checks every rank holds the same model (run.c says how).
 */
#include <assert.h>
#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <xxhash.h>

#include "client_internal.h"
#include "kernels/device.h"
#include "kernels/formats.h"
#include "kernels/gguf.h"
#include "kernels/ops.h"
#include "security/security.h"

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

/* The inner optimizer's state and the data position, rank 0's to all
 * (sharded: the moments go to their owners as the trainer starts). */
static void share_state(const Ranks *rk, Model *m, size_t *pos, int sharded) {
    if (rk->size == 1) return;
    int64_t head[3] = {m->m != NULL || m->mh != NULL, m->step, (int64_t)*pos};
    ranks_bcast(head, sizeof head);
    if (head[0] && !sharded &&
        m->moments_bf16) { /* every rank keeps them as rank 0 does (--moments) */
        if (m->mh == NULL) {
            m->mh = callocCheck(m->n_params, sizeof(uint16_t));
            m->vh = callocCheck(m->n_params, sizeof(uint16_t));
        }
        ranks_bcast(m->mh, m->n_params * sizeof(uint16_t));
        ranks_bcast(m->vh, m->n_params * sizeof(uint16_t));
    } else if (head[0] && !sharded) {
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
static int check_same_model(const Ranks *rk, const Model *m, char *err) {
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

/* ---- the session --------------------------------------------------------------- */

/* Adapters over a frozen base: the base from --init-from (every rank reads
 * it), or, without it, the one the seed drew; either way the one whose
 * fingerprint the federation's configuration names, else nothing trains.
 * The adapters themselves are the round's download. */
static int session_base(Session *ss, const ModelConfig *cfg, const SiteRunOptions *o, char *err) {
    uint64_t hash = ss->m.table_hash;
    if (o->init_from) {
        model_free(&ss->m);
        if (model_import_base(&ss->m, cfg, o->init_from, err) != 0) return -1;
        ss->m.moments_bf16 = o->moments_bf16;
        ss->m.blocks_off = o->blocks_off;
        if (ss->m.table_hash != hash)
            return err_set(err, "--init-from %s: its adapters' table is not the federation's",
                           o->init_from);
        return 0;
    }
    if (model_base_fingerprint(&ss->m) != cfg->lora.base)
        return err_set(err,
                       "the federation fine-tunes adapters over a pretrained base: give this "
                       "site the same base with --init-from (the file or folder the federation "
                       "was initialised from, or a copy)");
    return 0;
}

/* The model the coordinator describes, built from its seed (and from
 * --init-from when given), checked against this machine's memory. */
static int session_model(Session *ss, const SiteRunOptions *o, char *err) {
    Strait__HelloResponse *hr = ss->hr;
    ModelConfig cfg;
    const Strait__ModelShape *sh = hr->model_shape;
    char why[ERR_LEN];
    if (sh && sh->config && sh->config[0]) { /* the whole description: any architecture */
        if (model_config_parse(sh->config, strlen(sh->config), &cfg, why) != 0)
            return err_set(err, "the coordinator sent a model this strait cannot build: %s", why);
    } else if (sh && sh->layers > 0) { /* an older coordinator's GPT-2 shape */
        if (model_config_shape(&cfg, hr->model, sh->layers, sh->channels, sh->heads, sh->context,
                               sh->vocab, why) != 0)
            return err_set(err, "the coordinator sent a model shape this strait cannot build: %s",
                           why);
    } else if (model_config_preset(hr->model, &cfg) != 0) {
        return err_set(err, "the federation trains model '%s', unknown to this strait; upgrade",
                       hr->model);
    }
    /* what the coordinator's shape would take here, before any of it is
     * allocated: a shape is the coordinator's claim, and this machine's
     * memory the site's own */
    if (site_check_memory(o, &cfg, err) != 0) return -1;
    /* the federation's initial model, drawn from its seed as the
     * coordinator drew it: when it is the current model, no download */
    if (model_build(&ss->m, &cfg, hr->model_seed, err) != 0) return -1;
    ss->m.moments_bf16 = o->moments_bf16;
    if (ss->m.table_hash != hr->table_hash)
        return err_set(err, "the federation's parameter table differs from this strait's; upgrade");
    if (cfg.lora.rank > 0) /* adapters: over the base the federation names */
        return session_base(ss, &cfg, o, err);
    if (o->init_from && ss->rk.rank == 0) { /* the pretrained start: maybe no round-0 download */
        Model pre;
        if (model_import(&pre, o->init_from, err) != 0) return -1;
        int same = pre.table_hash == ss->m.table_hash;
        if (same) memcpy(ss->m.params, pre.params, ss->m.n_params * sizeof(float));
        model_free(&pre);
        if (!same)
            return err_set(err, "--init-from %s: its shape is not the federation's model's",
                           o->init_from);
    }
    return 0;
}

/* ---- the heartbeat thread ------------------------------------------------ */

static void *beat_main(void *arg) {
    Session *ss = arg;
    pthread_mutex_lock(&ss->beat_lock);
    while (!ss->beat_stop) {
        int64_t round = ss->beat_round;
        if (round < 0) {
            pthread_cond_wait(&ss->beat_cond, &ss->beat_lock);
            continue;
        }
        struct timespec until = time_after_ms(CLOCK_MONOTONIC, HEARTBEAT_MS);
        int rc = 0;
        while (!ss->beat_stop && ss->beat_round == round && rc != ETIMEDOUT)
            rc = pthread_cond_timedwait(&ss->beat_cond, &ss->beat_lock, &until);
        if (ss->beat_stop || ss->beat_round != round) continue; /* stopped, or another round */
        pthread_mutex_unlock(&ss->beat_lock);
        uint64_t current = site_heartbeat(&ss->s, (uint64_t)round, NULL);
        pthread_mutex_lock(&ss->beat_lock);
        if (current && ss->beat_round == round) ss->beat_current = current;
    }
    pthread_mutex_unlock(&ss->beat_lock);
    return NULL;
}

static int beat_start(Session *ss, char *err) {
    pthread_condattr_t ca;
    pthread_mutex_init(&ss->beat_lock, NULL);
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&ss->beat_cond, &ca);
    pthread_condattr_destroy(&ca);
    ss->beat_round = -1;
    if (pthread_create(&ss->beat, NULL, beat_main, ss) != 0)
        return err_set(err, "cannot start the heartbeat's thread");
    ss->beat_started = 1;
    return 0;
}

/* Which round the thread beats for (-1: none; training ended). */
static void beat_set(Session *ss, int64_t round) {
    pthread_mutex_lock(&ss->beat_lock);
    ss->beat_round = round;
    ss->beat_current = 0;
    pthread_cond_signal(&ss->beat_cond);
    pthread_mutex_unlock(&ss->beat_lock);
}

/* The federation's round the last heartbeat of this round said; 0: none. */
static uint64_t beat_current(Session *ss) {
    pthread_mutex_lock(&ss->beat_lock);
    uint64_t current = ss->beat_current;
    pthread_mutex_unlock(&ss->beat_lock);
    return current;
}

/* Ends the thread: after at most the heartbeat in flight (5 s at most). */
static void beat_stop(Session *ss) {
    if (!ss->beat_started) return;
    pthread_mutex_lock(&ss->beat_lock);
    ss->beat_stop = 1;
    pthread_cond_signal(&ss->beat_cond);
    pthread_mutex_unlock(&ss->beat_lock);
    pthread_join(ss->beat, NULL);
    pthread_cond_destroy(&ss->beat_cond);
    pthread_mutex_destroy(&ss->beat_lock);
    ss->beat_started = 0;
}

/* Everything a run sets up once: the site's link and the federation's
 * answer, the model, the codec, the data, the saved state, the trainer. */
int session_open(Session *ss, const SiteRunOptions *o, char *err) {
    Ranks *rk = &ss->rk;
    ss->s.o = *o;
    ss->s.rng = (uint64_t)time_wall_ms() | 1;
    ss->have_round = -1;
    ss->first_round = 1;
    if (rk->rank == 0) { /* the other ranks never touch the network */
        net_global_init();
        pthread_t watcher;
        if (pthread_create(&watcher, NULL, site_signal_watch, NULL) == 0) pthread_detach(watcher);
    }
    if (rk->size > 1) log_info("site", "rank %d of %d (pid %d)", rk->rank, rk->size, (int)getpid());
    if (rk->rank == 0 && site_read(&ss->s, err) != 0) return -1;
    if (rk->rank == 0 && (ss->hr = site_hello(&ss->s, err)) == NULL) return -1;
    if (rk->rank == 0 && beat_start(ss, err) != 0) return -1;
    ss->min_noise = o->min_noise;
    if (rk->rank == 0 && o->min_noise > 0 && (!ss->hr->secure_aggregation || ss->hr->overlap))
        return err_set(err,
                       "this site sends updates only under distributed DP (--min-noise %g), and "
                       "its coordinator runs without secure aggregation (or says it overlaps "
                       "rounds); nothing is sent (ask for [privacy] secure_aggregation = on and "
                       "dp = distributed, or drop --min-noise)",
                       o->min_noise);
    if (rk->rank == 0 && o->tensorboard) {
        if ((ss->events = events_open(o->tensorboard, err)) == NULL) return -1;
        log_info("site", "TensorBoard's events in %s", events_path(ss->events));
    }
    if ((ss->hr = share_hello(rk, ss->hr, err)) == NULL) return -1;
    Strait__HelloResponse *hr = ss->hr;
    if (session_model(ss, o, err) != 0) return -1;
    Model *m = &ss->m;
    if (codec_params_parse(hr->uplink_codec, &ss->codec, err) != 0) return -1;
    if (ss->codec.id == CODEC_TOPK && hr->uplink_density > 0)
        ss->codec.density = hr->uplink_density;
    if (codec_params_check(&ss->codec, err) != 0) return -1;
    ModelConfig cfg = m->cfg;
    ss->H = (int)hr->inner_steps, ss->B = o->batch > 0 ? o->batch : 8;
    ss->T = o->seq > 0 ? o->seq : (cfg.T < 128 ? cfg.T : 128);
    int B = ss->B, T = ss->T;
    if (tokens_load(&ss->ts, o->data, o->n_data, err) != 0) return -1;
    if (ss->ts.vocab > cfg.V)
        return err_set(err,
                       "the site's data holds token ids up to %d; the federation's model has a "
                       "vocabulary of %d: tokenize with the federation's tokenizer",
                       ss->ts.vocab - 1, cfg.V);
    TokenView train;
    tokens_split(&ss->ts, 0.1, &train, &ss->val);
    ss->have_val = rk->rank == 0 && ss->val.n > (size_t)B * T; /* a batch at least; rank 0 scores */
    uint64_t seed = o->seed ? o->seed : (uint64_t)time_wall_ms();
    ranks_bcast(&seed, sizeof seed); /* one data order for every rank */
    /* each step reads one global batch: B for every GPU (or the CPU) of every
     * rank; rank r trains on the r-th share */
    int per_rank = o->cuda ? (o->gpus > 0 ? o->gpus : 1) : 1;
    if (loader_init(&ss->tl, train, B * rk->size * per_rank, T, 0, 1, seed, err) != 0) return -1;
    /* the federation's error feedback decay (an older coordinator sends none: 1) */
    float decay = hr->ef_decay > 0 && hr->ef_decay <= 1 ? hr->ef_decay : 1.0f;
    if (ef_init(&ss->ef, m->n_params, m->table_hash, decay, err) != 0) return -1;
    uint64_t saved_round = 0;
    size_t saved_pos = 0;
    int resumed =
        rk->rank == 0 ? site_state_load(&ss->s, m, &ss->ef, &saved_round, &saved_pos, err) : 0;
    if (resumed < 0) return -1;
    int gpus = o->cuda ? (o->gpus > 0 ? o->gpus : 1) : 0;
    /* ZeRO-1 across CPU ranks, as the trainer will decide it */
    int zero = trainer_will_shard(m->n_params, rk->size, gpus, !o->unsharded);
    share_state(rk, m, &saved_pos, zero);
    ranks_bcast(&resumed, sizeof resumed);
    ss->ef.beta = decay; /* the federation's, whatever the saved state had */
    if (resumed) ss->tl.pos = saved_pos < ss->tl.data.n ? saved_pos : 0;
    if (resumed && rk->rank == 0)
        log_info("site",
                 "%s resumed its saved state (after round %llu: error feedback, "
                 "optimizer moments, data position)",
                 ss->s.name, (unsigned long long)saved_round);
    ss->lr = o->lr > 0 ? o->lr : 3e-3f;
    TrainConfig tc = train_defaults(ss->lr, ss->H);
    /* the dropout masks': the data seed's, each rank's own (they take other batches) */
    tc.tf32 = o->tf32, tc.seed = seed + (uint64_t)rk->rank * 0x9E3779B97F4A7C15ull;
    tc.zero = !o->unsharded; /* CPU ranks shard when `zero` says; a process's GPUs too */
    if (o->precision_bf16) { /* bf16 products, fp32 sums: whole-model training alone */
        const char *no = trainer_precision_refusal(gpus, m->cfg.lora.rank > 0);
        if (no) return err_set(err, "%s", no);
        m->precision_bf16 = 1;
    }
    m->recompute = o->recompute;
    if ((ss->trainer = trainer_create_ranks(m, &tc, gpus, B, T, rk, err)) == NULL) return -1;
    if (trainer_sharded(ss->trainer) && rk->rank == 0)
        snprintf(ss->opt_staged, sizeof ss->opt_staged, "%s/state.opt.safetensors",
                 ss->s.o.site_dir);
    if (trainer_sharded(ss->trainer))
        log_info("site",
                 "rank %d of %d keeps AdamW's moments of %zu of the %zu parameters (ZeRO-1)",
                 rk->rank, rk->size, m->moments_hi - m->moments_lo, m->n_params);
    ss->replicas = trainer_replicas(ss->trainer); /* batches a step takes, on this rank */
    assert(ss->replicas == per_rank);
    ss->share = (size_t)rk->rank * ss->replicas * B * T; /* this rank's in a global batch */
    /* A GPU site makes its Δ and error feedback on its GPU: of the model only
     * the moments and the residual, for the state, and the payloads come to
     * the host. (With several ranks, each compares its host model with rank
     * 0's, so they bring θ_local to the host and encode there.) */
    ss->on_gpu = gpus > 0 && rk->size == 1 && trainer_keep_base(ss->trainer) == 0;
    if (ss->on_gpu && rk->rank == 0)
        log_info("site", "the update's error feedback and codec run on the GPU");
    ss->theta = mallocCheck(sizeof(float) * m->n_params);
    size_t batch = (size_t)B * T * ss->replicas * rk->size;
    ss->in = mallocCheck(sizeof(int) * batch);
    ss->tg = mallocCheck(sizeof(int) * batch);
    kernels_set_threads(o->threads);
    char slow[300];
    if (!ss->on_gpu && kernels_blas_check(err) != 0) return -1; /* wrong products train nothing */
    if (!ss->on_gpu && rk->rank == 0 && kernels_blas_below_chip(slow, sizeof slow))
        log_warn("site", "%s", slow);
    if (rk->rank == 0)
        log_info("site",
                 "%s joined federation %s at round %llu (%s, H=%d, %s uplink, %s downlink%s%s%s)",
                 ss->s.name, hr->federation, (unsigned long long)hr->current_round, hr->model,
                 ss->H, hr->uplink_codec, hr->downlink_codec[0] ? hr->downlink_codec : "lossless",
                 rk->size > 1 ? ", several ranks" : "", hr->overlap ? ", overlapped" : "",
                 hr->staleness ? ", async rounds" : "");
    if (rk->rank == 0 && m->cfg.lora.rank > 0)
        log_info("site", "adapters of rank %d (%s) over a frozen base, its matrices %s, dropout %g",
                 m->cfg.lora.rank, model_lora_rule_name(m->cfg.lora.rule),
                 m->cfg.lora.base_bf16 && gpus == 0 ? "held and multiplied in bf16 (sums in fp32)"
                 : gpus > 0                         ? "in fp32 on the GPU"
                                                    : "in fp32",
                 (double)m->cfg.lora.dropout);
    /* a fresh site whose seeded model is the current one (round 0) skips the
     * download; a resumed one holds its trained model, not the round's */
    if (!resumed && hr->model_sha256.len == 32) {
        security_sha256(m->params, m->n_params * 4, ss->theta_sha);
        if (memcmp(ss->theta_sha, hr->model_sha256.data, 32) == 0) {
            memcpy(ss->theta, m->params, sizeof(float) * m->n_params);
            ss->have_round = (int64_t)hr->current_round;
            if (rk->rank == 0)
                log_info("site",
                         "round %llu: the model is the federation's %s; built here, not "
                         "downloaded",
                         (unsigned long long)hr->current_round,
                         o->init_from ? "pretrained one" : "seeded one");
        } else if (o->init_from) {
            log_warn("site",
                     "--init-from %s is not the federation's current model (another "
                     "checkpoint, or rounds have passed): downloading it",
                     o->init_from);
        }
    }
    return 0;
}

void session_close(Session *ss) {
    beat_stop(ss); /* before the channel it calls on goes */
    trainer_free(ss->trainer);
    events_close(ss->events);
    if (ss->hr) strait__hello_response__free_unpacked(ss->hr, NULL);
    net_channel_destroy(ss->s.ch);
    free(ss->s.key), free(ss->s.cert), free(ss->s.ca);
    free(ss->theta), free(ss->in), free(ss->tg);
    blob_free(&ss->blob);
    ef_free(&ss->ef);
    tokens_free(&ss->ts);
    model_free(&ss->m);
}

/* Logs the SHA-256 of the model of `round` in theta: what the coordinator
 * checks each update against, and what a reader compares with its
 * checkpoint of the round before. */
void session_log_model(const Session *ss, uint64_t round) {
    char hex[65];
    security_hex(ss->theta_sha, 32, hex);
    log_info("site", "round %llu: model sha256 %s (%llu bytes down so far)",
             (unsigned long long)round, hex, (unsigned long long)ss->s.bytes_down);
}

/* TensorBoard's scalars (--tensorboard, rank 0): a step's under the names
 * Hugging Face's Trainer gives them, at the site's step count (the
 * schedule's); a round's at its number. A file that cannot be written is
 * said once and closed: the rounds go on. */
static void put_events(Session *ss, int64_t step, const char *const *tags, const double *v, int n) {
    char err[ERR_LEN];
    if (events_scalars(ss->events, step, time_wall_ms() / 1000.0, tags, v, n, err) == 0) return;
    log_warn("site", "%s; TensorBoard's file is not written from here on", err);
    events_close(ss->events);
    ss->events = NULL;
}

static void step_events(Session *ss, int64_t step, const double v[4]) {
    static const char *const tags[] = {"train/loss", "train/learning_rate", "train/grad_norm",
                                       "train/tokens_per_second"};
    put_events(ss, step, tags, v, 4);
}

static void round_events(Session *ss, int64_t round, const double v[4]) {
    static const char *const tags[] = {"round/eval_loss_before", "round/eval_loss_after",
                                       "round/train_loss", "round/steps"};
    put_events(ss, round, tags, v, 4);
    char err[ERR_LEN]; /* the round's records on disk before its update goes */
    if (ss->events && events_sync(ss->events, err) != 0) log_warn("site", "%s", err);
}

int session_train(Session *ss, uint64_t round, RoundTimes *times, RoundTrained *out, char *err) {
    const Ranks *rk = &ss->rk;
    Strait__HelloResponse *hr = ss->hr;
    int H = ss->H;
    memset(out, 0, sizeof *out);
    /* on GPUs: the round's θ; AdamW's moments only at the first round (a
     * resumed state's, or zeros): from then on the GPUs hold their own,
     * as a CPU trainer holds its own in m. (At ranks other than 0 the
     * host's moments are never brought back, so taking them each round
     * would reset those ranks' moments and split the ranks apart.) */
    trainer_from_host(ss->trainer, TRAINER_PARAMS | (ss->first_round ? TRAINER_MOMENTS : 0));
    ss->first_round = 0;
    /* the global model as received, before this site's steps move it;
     * scored where it trains (a GPU site's forward runs on its GPU) */
    uint64_t te = time_monotonic_ns();
    out->start_eval =
        ss->have_val ? trainer_eval_tokens(ss->trainer, ss->val, HELD_OUT_BATCHES) : NAN;
    times->eval = ms_since(te);
    uint64_t t0 = time_monotonic_ns();
    double loss_sum = 0;
    if (rk->rank == 0) beat_set(ss, (int64_t)round);
    int total_steps = (int)(hr->total_rounds ? hr->total_rounds : round + 1) * H;
    /* the schedule runs over every inner step of the federation, as the
     * centralized trainer schedules its steps */
    TrainConfig tc = train_defaults(ss->lr, total_steps);
    for (int step = 0; step < H; step++) {
        uint64_t now = time_monotonic_ns();
        int go = 1;
        /* the federation's time budget: a slow site sends fewer steps */
        if (rk->rank == 0 && step > 0 && hr->round_budget_ms &&
            (now - t0) / 1000000 >= hr->round_budget_ms)
            go = 0;
        if (rk->rank == 0 && go) {
            /* async rounds take an update up to `staleness` rounds late */
            if (beat_current(ss) > round + hr->staleness) {
                log_warn("site", "round %llu closed without this site; stopping its training",
                         (unsigned long long)round);
                go = 0;
            }
        }
        ranks_bcast(&go, sizeof go); /* the other ranks step when rank 0 does */
        if (!go) break;
        loader_next(&ss->tl, ss->in, ss->tg); /* the global batch: every rank's, every GPU's */
        out->steps++;
        float lr = train_lr(&tc, (int)round * H + step), norm = NAN;
        float loss = trainer_step(ss->trainer, ss->in + ss->share, ss->tg + ss->share, lr, &norm);
        loss_sum += loss;
        if (ss->events) {
            double tps = (double)ss->B * ss->T * ss->replicas * rk->size /
                         ((double)(time_monotonic_ns() - now) / 1e9);
            double v[] = {loss, lr, norm, tps};
            step_events(ss, (int64_t)round * H + step + 1, v);
        }
    }
    if (rk->rank == 0) beat_set(ss, -1);
    out->train_ms = (time_monotonic_ns() - t0) / 1000000; /* the steps alone */
    out->train_loss = out->steps ? loss_sum / out->steps : NAN;
    te = time_monotonic_ns();
    out->eval = ss->have_val ? trainer_eval_tokens(ss->trainer, ss->val, HELD_OUT_BATCHES) : NAN;
    times->eval += ms_since(te);
    if (ss->events) {
        double v[] = {out->start_eval, out->eval, out->train_loss, out->steps};
        round_events(ss, (int64_t)round, v);
    }
    /* θ_local for Δ, unless the GPU makes it, and at rank 0 the moments
     * for the state */
    /* (secure aggregation makes Δ on the host) */
    trainer_to_host(ss->trainer, (ss->on_gpu && !hr->secure_aggregation ? 0 : TRAINER_PARAMS) |
                                     (rk->rank == 0 ? TRAINER_MOMENTS : 0));
    /* sharded: every rank's share to rank 0's writer, for the state */
    if (trainer_sharded(ss->trainer))
        if (trainer_save_moments(ss->trainer, rk->rank == 0 ? ss->opt_staged : NULL, err) != 0)
            return -1;
    return check_same_model(rk, &ss->m, err);
}

/* The update's claims, packed into meta (192 bytes). */
static void pack_meta(const Session *ss, const uint8_t base_sha[32], const RoundTrained *t,
                      const RoundTimes *times, uint8_t *meta, size_t *mlen) {
    Strait__UpdateMeta um = STRAIT__UPDATE_META__INIT;
    um.tokens = (uint64_t)t->steps * ss->B * ss->T * ss->replicas * ss->rk.size; /* every rank's */
    um.train_loss = t->train_loss;
    um.eval_loss = t->eval;
    um.start_eval_loss = t->start_eval;
    um.train_ms = t->train_ms;
    um.steps = (uint64_t)t->steps;
    um.base_sha256.data = (uint8_t *)base_sha;
    um.base_sha256.len = 32;
    um.download_ms = times->download;
    um.decode_ms = times->decode;
    um.eval_ms = times->eval;
    um.encode_ms = times->encode;
    assert(strait__update_meta__get_packed_size(&um) <= 192);
    *mlen = strait__update_meta__pack(&um, meta);
}

int session_encode(Session *ss, const float *base, const uint8_t base_sha[32],
                   const RoundTrained *t, RoundTimes *times, uint8_t blob_sha[32], uint8_t *meta,
                   size_t *mlen, char *err) {
    Model *m = &ss->m;
    CodecLayout L = {m->table_hash, m->n_params, NULL, 0};
    uint64_t t0 = time_monotonic_ns();
    if (ss->on_gpu) {
        const float *d_local, *d_base;
        if (trainer_device_params(ss->trainer, &d_local, &d_base) != 0)
            return err_set(err, "the GPU trainer kept no copy of the round's model");
        if (ef_encode_cuda(&ss->ef, &ss->codec, &L, d_base, d_local, &ss->blob, err) != 0)
            return -1;
        ef_to_host(&ss->ef); /* the residual, for the state */
    } else if (ef_encode(&ss->ef, &ss->codec, &L, base, m->params, NULL, &ss->blob, err) != 0) {
        return -1; /* Δ = θ − θ_local, made as error feedback adds it */
    }
    /* hashed once: a retried or resumed upload does not hash it again */
    security_sha256(ss->blob.data, ss->blob.len, blob_sha);
    times->encode = ms_since(t0);
    pack_meta(ss, base_sha, t, times, meta, mlen);
    return 0;
}

int session_secagg_update(Session *ss, const float *base, const uint8_t base_sha[32],
                          const RoundTrained *t, RoundTimes *times, float *x, uint8_t *meta,
                          size_t *mlen) {
    const Model *m = &ss->m;
    uint64_t t0 = time_monotonic_ns();
    float *e = ss->ef.e, beta = ss->ef.beta;
    /* x = β e + Δ, and e holds all of it until the sum takes its part */
    for (uint64_t i = 0; i < m->n_params; i++) x[i] = e[i] = beta * e[i] + (base[i] - m->params[i]);
    times->encode = ms_since(t0);
    pack_meta(ss, base_sha, t, times, meta, mlen);
    return 0;
}
