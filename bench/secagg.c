/*
 * secagg.c — secure aggregation's cost in one round, beside plain int8 and
 * beside Flower 1.42's own SecAgg+ (bench/flower_secagg.py: its functions,
 * called in the order SecAggPlusWorkflow and secaggplus_mod call them) at
 * the same sites and sizes in the same run. One JSON line per (sites,
 * values):
 *   - site_cpu_s: one site's CPU for the round's update — SecAgg: its keys,
 *     its seeds' shares sealed to its neighbours, opening theirs, the
 *     quantized and masked update and its bytes; int8: error feedback and
 *     encoding (ef_encode, every core: CPU time summed over threads);
 *   - coordinator_cpu_s: SecAgg: the masked sum of every site's update,
 *     the reveals and the unmasking; int8: checking and adding every
 *     update into the round's sum (the streaming mean);
 *   - bytes_up, bytes_down: a site's, as protobuf frames them (the SecAgg
 *     calls' messages and the masked update; int8: its update blob; the
 *     model's download is the same either way and left out).
 * Each of Strait's costs is the median of three rounds in this process;
 * Flower's, one round in its own. Every site's update is the same
 * synthetic pseudo-gradient (N(0, 0.01²),
 * bench.h), range 0.05 (five sigma), bits 9 + ⌈log2 sites⌉; the
 * coordinator's cost is measured over real masked bytes of every site (the
 * masked update of site 0, its header's index set to each), with every
 * site's real reveals, so its unmasking runs in full. ratio_flower is
 * Flower's CPU over Strait's (above 1: Strait is cheaper).
 * strait_secagg_dp is the same round under distributed DP: each site
 * clipped at the update's own norm and adding its share of Skellam noise
 * at noise multiplier 1, the quorum's n / 2 + 1 shares making the sum's;
 * dp_bits is the modulus that takes.
 *
 *   build/bench/secagg [--full]   (842,496 values; --full adds GPT-2 124M's
 *                                   124,439,808, at 4 and 16 sites)
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <jansson.h>

#include "bench/bench.h"
#include "compress/compress.h"
#include "coordinator/coordinator.h"
#include "privacy/privacy.h"
#include "schema/strait.pb-c.h"
#include "util/util.h"

static double cpu_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return ts.tv_sec + ts.tv_nsec / 1e9;
}

static void die(const char *what, const char *err) {
    fprintf(stderr, "bench/secagg: %s: %s\n", what, err);
    exit(1);
}

/* Flower's SecAgg+ at n sites and len values, its JSON line parsed; NULL
 * with why when it cannot run. */
static json_t *flower(int n, uint64_t len, char *why, size_t why_len) {
    const char *py = getenv("STRAIT_BENCH_PYTHON"), *src = getenv("STRAIT_SRC");
    if (py == NULL || src == NULL) {
        snprintf(why, why_len,
                 "no Flower baseline: STRAIT_BENCH_PYTHON unset (make bench sets it)");
        return NULL;
    }
    char cmd[2400];
    snprintf(cmd, sizeof cmd, "%s %s/bench/flower_secagg.py %d %llu 2>&1", py, src, n,
             (unsigned long long)len);
    FILE *p = popen(cmd, "r");
    if (p == NULL) {
        snprintf(why, why_len, "no Flower baseline: cannot run %s", py);
        return NULL;
    }
    char line[8192], last[8192] = "";
    while (fgets(line, sizeof line, p)) snprintf(last, sizeof last, "%s", line);
    int st = pclose(p);
    json_t *o = json_loads(last, 0, NULL);
    if (st != 0 || o == NULL) {
        snprintf(why, why_len, "no Flower baseline (exit %d): %.300s", st, last);
        json_decref(o);
        return NULL;
    }
    return o;
}

typedef struct Cost {
    double site_cpu, coord_cpu;
    uint64_t up, down;
} Cost;

static Cost strait_secagg(int n, uint64_t len, const float *x, int dp, int *bits_out) {
    char err[ERR_LEN];
    int bits = 9, noise_sites = n / 2 + 1;
    while ((1 << (bits - 9)) < n && bits < 32) bits++;
    double clip = 0;
    if (dp) { /* clipped at its own norm: the noise, not the clip, is what costs */
        for (uint64_t i = 0; i < len; i++) clip += (double)x[i] * x[i];
        clip = sqrt(clip);
        bits = secagg_dp_bits(n, 0.05, clip, 1.0, noise_sites, len, bits);
    }
    *bits_out = bits;
    SecaggParams p;
    if (secagg_params(n, bits, 0.05, "bench/round-0/attempt-1", &p, err) != 0) die("params", err);
    if (dp && secagg_params_dp(&p, clip, 1.0, noise_sites, len, err) != 0) die("dp", err);
    SecaggSite **site = calloc((size_t)n, sizeof *site);
    SecaggAdvert *ad = calloc((size_t)n, sizeof *ad);
    SecaggEnvelope(*env)[SECAGG_MAX_DEGREE] = calloc((size_t)n, sizeof *env);
    int *n_env = calloc((size_t)n, sizeof *n_env);
    Cost c = {0};
    double t0 = cpu_now();
    for (int i = 0; i < n; i++)
        if ((site[i] = secagg_site_new(&ad[i], err)) == NULL) die("keys", err);
    for (int i = 0; i < n; i++)
        if (secagg_site_share(site[i], &p, i, ad, env[i], &n_env[i], err) != 0) die("shares", err);
    double keys_shares = (cpu_now() - t0) / n; /* a site's share of them */
    /* the envelopes routed to each site; every site but 0 masks one value
     * (what it holds of its neighbours is what the unmasking needs) */
    SecaggEnvelope in[SECAGG_MAX_DEGREE];
    uint32_t *y = malloc(len * sizeof *y), y1;
    float one = 0;
    double mask_cpu = 0;
    for (int i = 0; i < n; i++) {
        int m = 0;
        for (int j = 0; j < n; j++)
            for (int e = 0; e < n_env[j]; e++)
                if (env[j][e].to == i) in[m++] = env[j][e];
        double t = cpu_now();
        if (i == 0 ? secagg_site_mask(site[i], ad, in, m, x, len, y, NULL, err)
                   : secagg_site_mask(site[i], ad, in, m, &one, 1, &y1, NULL, err))
            die("mask", err);
        if (i == 0) mask_cpu = cpu_now() - t;
    }
    size_t blen = secagg_masked_len(len, bits);
    uint8_t *blob = malloc(blen);
    double t = cpu_now();
    secagg_masked_pack(y, len, bits, 0, 1, blob);
    c.site_cpu = keys_shares + mask_cpu + (cpu_now() - t);
    free(y);
    /* a site's bytes, as protobuf frames them */
    Strait__SecAggRequest q = STRAIT__SEC_AGG_REQUEST__INIT;
    q.round = 1, q.attempt = 1, q.phase = 1;
    q.advert.data = (uint8_t *)&ad[0], q.advert.len = sizeof ad[0];
    c.up += strait__sec_agg_request__get_packed_size(&q);
    Strait__SecAggEnvelope pe[SECAGG_MAX_DEGREE], *pp[SECAGG_MAX_DEGREE];
    for (int e = 0; e < n_env[0]; e++) {
        strait__sec_agg_envelope__init(&pe[e]);
        pe[e].from = (uint32_t)env[0][e].from, pe[e].to = (uint32_t)env[0][e].to;
        pe[e].box.data = env[0][e].box, pe[e].box.len = SECAGG_BOX;
        pp[e] = &pe[e];
    }
    q.phase = 2, q.advert.len = 0, q.n_envelopes = (size_t)n_env[0], q.envelopes = pp;
    c.up += strait__sec_agg_request__get_packed_size(&q) + blen;
    Strait__SecAggResponse r = STRAIT__SEC_AGG_RESPONSE__INIT;
    r.round = 1, r.attempt = 1, r.sites = (uint32_t)n, r.bits = (uint32_t)bits, r.range = 0.05;
    r.context = p.context;
    ProtobufCBinaryData *ads = calloc((size_t)n, sizeof *ads); /* its own and its neighbours' */
    for (int j = 0; j < n; j++)
        if (j == 0 || secagg_neighbours(0, j, n, p.k))
            ads[j].data = (uint8_t *)&ad[j], ads[j].len = sizeof ad[j];
    r.n_adverts = (size_t)n, r.adverts = ads;
    c.down += strait__sec_agg_response__get_packed_size(&r); /* KEYS */
    r.n_adverts = 0, r.n_envelopes = (size_t)n_env[0], r.envelopes = pp;
    c.down += strait__sec_agg_response__get_packed_size(&r); /* SHARES (as many in) */
    r.n_envelopes = 0;
    uint8_t *alive = malloc((size_t)n);
    memset(alive, 1, (size_t)n);
    r.survived.data = alive, r.survived.len = (size_t)n;
    c.down += strait__sec_agg_response__get_packed_size(&r); /* SURVIVORS */
    r.survived.len = 0;
    c.down += strait__sec_agg_response__get_packed_size(&r); /* REVEAL's answer */
    free(ads);
    /* the coordinator: every site's masked bytes, the reveals, the unmasking */
    uint8_t *shared = malloc((size_t)n);
    memset(shared, 1, (size_t)n);
    float *out = malloc(len * sizeof *out);
    t = cpu_now();
    SecaggServer *v = secagg_server_new(&p, ad, shared, len, err);
    if (v == NULL) die("server", err);
    for (int i = 0; i < n; i++) {
        for (int b = 0; b < 4; b++) blob[8 + b] = (uint8_t)((uint32_t)i >> (8 * b));
        if (secagg_server_add(v, i, blob, blen, err) != 0) die("add", err);
    }
    if (secagg_server_close(v, alive, err) != 0) die("close", err);
    SecaggReveal rv[SECAGG_MAX_DEGREE + 1], rv0[SECAGG_MAX_DEGREE + 1];
    int m, m0 = 0, summed;
    for (int i = 0; i < n; i++) {
        if (secagg_site_reveal(site[i], alive, rv, &m, err) != 0) die("reveal", err);
        if (secagg_server_reveal(v, i, rv, m, err) != 0) die("reveal", err);
        if (i == 0) memcpy(rv0, rv, sizeof rv), m0 = m;
    }
    if (secagg_server_unmask(v, out, &summed, err) != 0) die("unmask", err);
    c.coord_cpu = cpu_now() - t;
    /* the SURVIVORS and REVEAL requests, as protobuf frames them */
    q.phase = 3, q.n_envelopes = 0, q.envelopes = NULL;
    c.up += strait__sec_agg_request__get_packed_size(&q);
    Strait__SecAggReveal pr[SECAGG_MAX_DEGREE + 1], *prp[SECAGG_MAX_DEGREE + 1];
    for (int e = 0; e < m0; e++) {
        strait__sec_agg_reveal__init(&pr[e]);
        pr[e].owner = (uint32_t)rv0[e].owner, pr[e].key = rv0[e].key;
        pr[e].share.data = rv0[e].share, pr[e].share.len = SECAGG_SHARE;
        prp[e] = &pr[e];
    }
    q.phase = 4, q.n_reveals = (size_t)m0, q.reveals = prp;
    c.up += strait__sec_agg_request__get_packed_size(&q);
    secagg_server_free(v);
    for (int i = 0; i < n; i++) secagg_site_free(site[i]);
    free(site), free(ad), free(env), free(n_env), free(blob), free(alive), free(shared), free(out);
    return c;
}

static Cost int8_round(int n, uint64_t len, const float *x) {
    char err[ERR_LEN];
    Cost c = {0};
    CodecParams cp = codec_params_default(CODEC_INT8);
    CodecLayout L = {1, len, NULL, 0};
    ErrorFeedback ef;
    Blob b = {0};
    if (ef_init(&ef, len, 1, 1.0f, err) != 0) die("ef", err);
    double t = cpu_now();
    if (ef_encode(&ef, &cp, &L, x, NULL, NULL, &b, err) != 0) die("int8", err);
    c.site_cpu = cpu_now() - t;
    c.up = b.len;
    RoundSum rs;
    float *mean = malloc(len * sizeof *mean);
    t = cpu_now();
    if (round_sum_init(&rs, len, 1, 0, err) != 0) die("sum", err);
    for (int i = 0; i < n; i++)
        if (round_sum_add(&rs, b.data, b.len, 1.0, err) != 0) die("add", err);
    if (round_sum_mean(&rs, mean, err) != 0) die("mean", err);
    c.coord_cpu = cpu_now() - t;
    round_sum_free(&rs);
    ef_free(&ef);
    blob_free(&b);
    free(mean);
    return c;
}

static Cost strait_secagg_b(int n, uint64_t len, const float *x, int *bits) {
    return strait_secagg(n, len, x, 0, bits);
}

static Cost strait_secagg_dp_b(int n, uint64_t len, const float *x, int *bits) {
    return strait_secagg(n, len, x, 1, bits);
}

static Cost int8_round_b(int n, uint64_t len, const float *x, int *bits) {
    (void)bits;
    return int8_round(n, len, x);
}

#define REPS 3
static int by_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* REPS runs of one side; each cost the median of them. */
static Cost median_of(int n, uint64_t len, const float *x, int *bits,
                      Cost (*run)(int, uint64_t, const float *, int *)) {
    double site[REPS], coord[REPS];
    Cost c = {0};
    for (int r = 0; r < REPS; r++) {
        c = run(n, len, x, bits);
        site[r] = c.site_cpu, coord[r] = c.coord_cpu;
    }
    qsort(site, REPS, sizeof *site, by_double), qsort(coord, REPS, sizeof *coord, by_double);
    c.site_cpu = site[REPS / 2], c.coord_cpu = coord[REPS / 2];
    return c;
}

static json_t *cost_json(const Cost *c) {
    json_t *o = json_object();
    json_object_set_new(o, "site_cpu_s", json_real(c->site_cpu));
    json_object_set_new(o, "coordinator_cpu_s", json_real(c->coord_cpu));
    json_object_set_new(o, "bytes_up", json_integer((json_int_t)c->up));
    json_object_set_new(o, "bytes_down", json_integer((json_int_t)c->down));
    return o;
}

int main(int argc, char **argv) {
    int full = argc > 1 && strcmp(argv[1], "--full") == 0;
    struct {
        uint64_t len;
        int sites[3], n_sites;
        const char *model;
    } cases[] = {{842496, {4, 16, 64}, 3, "small"}, {124439808, {4, 16, 0}, 2, "gpt2-124m"}};
    for (size_t k = 0; k < (full ? 2u : 1u); k++) {
        uint64_t len = cases[k].len;
        float *x = malloc(len * sizeof *x);
        bench_pseudo_gradient(x, len);
        for (int s = 0; s < cases[k].n_sites; s++) {
            int n = cases[k].sites[s], bits, dp_bits;
            /* warm: REPS rounds each, the median's costs reported (the
             * first pays the pages and caches a running site has warm) */
            Cost sa = median_of(n, len, x, &bits, strait_secagg_b),
                 i8 = median_of(n, len, x, &bits, int8_round_b),
                 dp = median_of(n, len, x, &dp_bits, strait_secagg_dp_b);
            json_t *o = json_object();
            json_object_set_new(o, "bench", json_string("secagg"));
            json_object_set_new(o, "model", json_string(cases[k].model));
            json_object_set_new(o, "values", json_integer((json_int_t)len));
            json_object_set_new(o, "sites", json_integer(n));
            json_object_set_new(o, "bits", json_integer(bits));
            json_object_set_new(o, "strait_secagg", cost_json(&sa));
            json_object_set_new(o, "strait_int8", cost_json(&i8));
            json_object_set_new(o, "dp_bits", json_integer(dp_bits));
            json_object_set_new(o, "strait_secagg_dp", cost_json(&dp));
            json_object_set_new(o, "vs_int8_bytes_up", json_real((double)sa.up / (double)i8.up));
            json_object_set_new(o, "vs_int8_coordinator_cpu",
                                json_real(sa.coord_cpu / i8.coord_cpu));
            char why[600];
            json_t *fl = flower(n, len, why, sizeof why);
            if (fl) {
                double fs = json_number_value(json_object_get(fl, "client_cpu_s"));
                double fc = json_number_value(json_object_get(fl, "server_cpu_s"));
                json_object_set_new(o, "flower_secaggplus", fl);
                json_object_set_new(o, "ratio_flower_site_cpu", json_real(fs / sa.site_cpu));
                json_object_set_new(o, "ratio_flower_coordinator_cpu",
                                    json_real(fc / sa.coord_cpu));
            } else {
                json_object_set_new(o, "flower_secaggplus", json_string(why));
            }
            json_emit_line(stdout, o);
            fflush(stdout);
        }
        free(x);
    }
    return 0;
}
