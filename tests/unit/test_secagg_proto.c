/*
 * test_secagg_proto.c — SecAgg+'s protocol (privacy/secagg_proto.c) with
 * its sites and coordinator in one process, the bytes each phase moves
 * passed by hand: the unmasked sum is the plain sum of the updates to
 * their quantization (a step a site; a mask left in is a fraction of
 * 2^bits) for 2 to 16 sites, with sites dropping before sharing,
 * after sharing and after masking; below the threshold the round fails
 * with its reason; and what a lying or careless peer sends — a tampered
 * or misaddressed envelope, a share of the wrong secret or x, a wrong
 * share, a coordinator that calls a live site dropped — is refused or
 * caught (stepped around while the honest shares number t). The masked
 * update's bytes round-trip at every width. Under distributed DP the
 * parameters bound a site's sensitivity and fit the modulus, and the sum
 * carries each survivor's share of the noise.
 */
#include <criterion/criterion.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "privacy/privacy.h"
#include "tests/harness.h"
#include "util/util.h"

enum { N_MAX = 16, LEN = 3000, BITS = 24 };
#define RANGE 0.5

/* What happens to a site: it takes part, or drops before sharing, after
 * sharing (before its masked update), or after its masked update. */
enum { LIVE, BEFORE_SHARING, BEFORE_MASKING, AFTER_MASKING };

typedef struct Fed {
    int n;
    SecaggParams p;
    SecaggSite *site[N_MAX];
    SecaggAdvert ad[N_MAX];
    SecaggEnvelope env[N_MAX][SECAGG_MAX_DEGREE];
    int n_env[N_MAX];
    uint8_t shared[N_MAX], survived[N_MAX];
    float x[N_MAX][LEN], sent[N_MAX][LEN]; /* each update, and as its site quantized it */
    SecaggServer *srv;
} Fed;

static void draw(Fed *f, int i) {
    for (int v = 0; v < LEN; v++) f->x[i][v] = (float)(sin(0.37 * v + 1.3 * i) * 0.9 * RANGE);
}

static void fed_start(Fed *f, int n) {
    char err[ERR_LEN];
    memset(f, 0, sizeof *f);
    f->n = n;
    cr_assert_eq(secagg_params(n, BITS, RANGE, "fed/round-3/attempt-2", &f->p, err), 0, "%s", err);
    for (int i = 0; i < n; i++) {
        f->site[i] = secagg_site_new(&f->ad[i], err);
        cr_assert_not_null(f->site[i], "%s", err);
        draw(f, i);
    }
}

static void fed_free(Fed *f) {
    for (int i = 0; i < f->n; i++) secagg_site_free(f->site[i]);
    secagg_server_free(f->srv);
}

/* Phase 2 at the sites that take part, and the coordinator's U2. */
static void share(Fed *f, const int *fate) {
    char err[ERR_LEN];
    for (int i = 0; i < f->n; i++) {
        if (fate[i] == BEFORE_SHARING) continue;
        cr_assert_eq(secagg_site_share(f->site[i], &f->p, i, f->ad, f->env[i], &f->n_env[i], err),
                     0, "%s", err);
        f->shared[i] = 1;
    }
    f->srv = secagg_server_new(&f->p, f->ad, f->shared, LEN, err);
    cr_assert_not_null(f->srv, "%s", err);
}

/* The envelopes the coordinator routes to site i: every one sealed to it. */
static int routed(Fed *f, int i, SecaggEnvelope *in) {
    int m = 0;
    for (int j = 0; j < f->n; j++)
        for (int e = 0; e < f->n_env[j]; e++)
            if (f->env[j][e].to == i) in[m++] = f->env[j][e];
    return m;
}

static void mask_and_send(Fed *f, const int *fate) {
    char err[ERR_LEN];
    static uint32_t y[LEN];
    static uint8_t blob[LEN * 4 + 64];
    for (int i = 0; i < f->n; i++) {
        if (!f->shared[i] || fate[i] == BEFORE_MASKING) continue;
        SecaggEnvelope in[N_MAX];
        int m = routed(f, i, in);
        cr_assert_eq(secagg_site_mask(f->site[i], f->ad, in, m, f->x[i], LEN, y, f->sent[i], err),
                     0, "%s", err);
        if (fate[i] == AFTER_MASKING) continue; /* masked, never sent */
        secagg_masked_pack(y, LEN, BITS, (uint32_t)i, 2, blob);
        cr_assert_eq(secagg_server_add(f->srv, i, blob, secagg_masked_len(LEN, BITS), err), 0, "%s",
                     err);
    }
}

/* The survivors reveal; 0 and the sum when it unmasks, -1 otherwise. */
static int reveal_and_unmask(Fed *f, float *sum, int *summed, char *err) {
    if (secagg_server_close(f->srv, f->survived, err) != 0) return -1;
    for (int i = 0; i < f->n; i++) {
        if (!f->survived[i]) continue;
        SecaggReveal r[SECAGG_MAX_DEGREE + 1];
        int m;
        if (secagg_site_reveal(f->site[i], f->survived, r, &m, err) != 0) continue;
        cr_assert_eq(secagg_server_reveal(f->srv, i, r, m, err), 0, "%s", err);
    }
    return secagg_server_unmask(f->srv, sum, summed, err);
}

static int run(int n, const int *fate, int *summed, char *err) {
    Fed *f = calloc(1, sizeof *f);
    static float sum[LEN];
    fed_start(f, n);
    share(f, fate);
    mask_and_send(f, fate);
    int rc = reveal_and_unmask(f, sum, summed, err);
    if (rc == 0) {
        /* each survivor's update is off by under a step (stochastic
         * rounding); a mask left in would be off by a fraction of 2^bits;
         * and the sum is what the sites say they sent, to float rounding */
        double step = RANGE / floor((ldexp(1, BITS - 1) - 1) / n), far = 0, off = 0;
        for (int v = 0; v < LEN; v++) {
            double s = 0, q = 0;
            for (int i = 0; i < n; i++)
                if (f->survived[i]) s += f->x[i][v], q += f->sent[i][v];
            far = fmax(far, fabs(s - sum[v])), off = fmax(off, fabs(q - sum[v]));
        }
        cr_assert_leq(far, *summed * step * 1.001 + 1e-7,
                      "%d sites: %g from the plain sum (%d steps of %g)", n, far, *summed, step);
        cr_assert_leq(off, 1e-6, "%d sites: %g from what the sites sent", n, off);
    }
    fed_free(f);
    free(f);
    return rc;
}

Test(secagg_proto, the_unmasked_sum_is_the_plain_sum_with_sites_dropping_at_every_phase) {
    char err[ERR_LEN];
    for (int n = 2; n <= N_MAX; n++) {
        int fate[N_MAX] = {0}, summed = 0;
        cr_assert_eq(run(n, fate, &summed, err), 0, "%d sites: %s", n, err);
        cr_assert_eq(summed, n);
        if (n < 5) continue; /* neighbourhoods of 3 or 4 cannot lose one of their needed */
        fate[0] = BEFORE_SHARING, fate[n / 2] = AFTER_MASKING;
        cr_assert_eq(run(n, fate, &summed, err), 0, "%d sites, two dropped: %s", n, err);
        cr_assert_eq(summed, n - 2);
        if (n < 10) continue;
        memset(fate, 0, sizeof fate); /* apart: each neighbourhood loses one */
        fate[1] = BEFORE_MASKING, fate[n / 2] = AFTER_MASKING, fate[n - 2] = BEFORE_SHARING;
        cr_assert_eq(run(n, fate, &summed, err), 0, "%d sites, three dropped: %s", n, err);
        cr_assert_eq(summed, n - 3);
    }
}

/* Too few masked updates, or a dropped site with too few of its neighbours
 * left to give its key: the round fails, saying so; nothing is summed. */
Test(secagg_proto, below_the_threshold_the_round_fails_with_its_reason) {
    char err[ERR_LEN];
    int fate[N_MAX] = {0}, summed = -1;
    for (int i = 0; i < 8; i++) fate[i] = i < 3 ? LIVE : AFTER_MASKING; /* 3 of 8, t = 4 */
    cr_assert_eq(run(8, fate, &summed, err), -1);
    cr_assert(strstr(err, "fewer than the 4"), "%s", err);
    /* site 1's neighbours (6, 7, 0, 2, 3, 4) keep 3 of its key's shares */
    int near[N_MAX] = {0};
    near[2] = AFTER_MASKING, near[3] = near[4] = near[1] = AFTER_MASKING;
    cr_assert_eq(run(8, near, &summed, err), -1);
    cr_assert(strstr(err, "site 2") || strstr(err, "fewer than"), "%s", err);
    cr_assert_eq(summed, -1, "nothing was summed");
}

/* A sealed envelope is bound to its pair and direction: changed, sent to
 * another site, or from a site that is not a neighbour, it is refused. */
Test(secagg_proto, a_tampered_or_misrouted_envelope_is_refused) {
    char err[ERR_LEN];
    Fed *f = calloc(1, sizeof *f);
    int fate[N_MAX] = {0};
    static uint32_t y[LEN];
    fed_start(f, 8);
    share(f, fate);
    SecaggEnvelope in[N_MAX];
    int m = routed(f, 0, in);
    cr_assert_eq(m, 6, "site 0 of 8 has 6 neighbours");
    SecaggEnvelope bad[N_MAX];
    memcpy(bad, in, sizeof in);
    bad[2].box[5] ^= 1;
    cr_assert_eq(secagg_site_mask(f->site[0], f->ad, bad, m, f->x[0], LEN, y, NULL, err), -1);
    cr_assert(strstr(err, "do not open"), "%s", err);
    memcpy(bad, in, sizeof in);
    bad[1].from = bad[2].from; /* the box says otherwise */
    cr_assert_eq(secagg_site_mask(f->site[0], f->ad, bad, m, f->x[0], LEN, y, NULL, err), -1);
    SecaggEnvelope other[N_MAX];
    int m4 = routed(f, 4, other); /* site 4 is not site 0's neighbour */
    cr_assert_eq(secagg_site_mask(f->site[0], f->ad, other, m4, f->x[0], LEN, y, NULL, err), -1);
    cr_assert(strstr(err, "not this site's"), "%s", err);
    /* whole, the envelopes open */
    cr_assert_eq(secagg_site_mask(f->site[0], f->ad, in, m, f->x[0], LEN, y, NULL, err), 0, "%s",
                 err);
    fed_free(f);
    free(f);
}

/* What a survivor reveals is checked whole: a share of a survivor's mask
 * key (with its self seed it would unmask its update alone), the wrong x,
 * one twice, or a non-neighbour's take nothing; a coordinator that calls a
 * live site dropped gets nothing from it; a share that lies is caught by
 * the commitment or the public key. */
Test(secagg_proto, a_reveal_that_would_give_away_a_secret_or_lie_is_refused_or_caught) {
    char err[ERR_LEN];
    Fed *f = calloc(1, sizeof *f);
    int fate[N_MAX] = {0};
    fate[3] = AFTER_MASKING;
    fed_start(f, 8);
    share(f, fate);
    mask_and_send(f, fate);
    cr_assert_eq(secagg_server_close(f->srv, f->survived, err), 0, "%s", err);
    cr_assert(!f->survived[3] && f->survived[2]);
    /* a live site told it dropped */
    uint8_t lie[N_MAX];
    memcpy(lie, f->survived, sizeof lie);
    lie[0] = 0;
    SecaggReveal r[SECAGG_MAX_DEGREE + 1];
    int m;
    cr_assert_eq(secagg_site_reveal(f->site[0], lie, r, &m, err), -1);
    cr_assert(strstr(err, "nothing is revealed"), "%s", err);
    cr_assert_eq(secagg_site_reveal(f->site[0], f->survived, r, &m, err), 0, "%s", err);
    SecaggReveal bad[SECAGG_MAX_DEGREE + 1];
    int k = -1;
    for (int e = 0; e < m; e++)
        if (r[e].owner == 2) k = e;
    cr_assert_geq(k, 0);
    memcpy(bad, r, sizeof r);
    bad[k].key = 1; /* site 2's mask key: it survived */
    cr_assert_eq(secagg_server_reveal(f->srv, 0, bad, m, err), -1);
    cr_assert(strstr(err, "does not take"), "%s", err);
    memcpy(bad, r, sizeof r);
    bad[k].share[0] ^= 3;
    cr_assert_eq(secagg_server_reveal(f->srv, 0, bad, m, err), -1);
    cr_assert(strstr(err, "wrong x"), "%s", err);
    memcpy(bad, r, sizeof r);
    bad[k + (k ? -1 : 1)].owner = 2;
    cr_assert_eq(secagg_server_reveal(f->srv, 0, bad, m, err), -1);
    memcpy(bad, r, sizeof r);
    bad[k].owner = 4;
    cr_assert_eq(secagg_server_reveal(f->srv, 0, bad, m, err), -1);
    cr_assert(strstr(err, "not its neighbour"), "%s", err);
    /* whole: taken, and not twice */
    cr_assert_eq(secagg_server_reveal(f->srv, 0, r, m, err), 0, "%s", err);
    cr_assert_eq(secagg_server_reveal(f->srv, 0, r, m, err), -1);
    /* a lying share of the right x, from a survivor: the unmasking steps
     * around it (six shares of site 2's seed, four needed) */
    for (int i = 1; i < 8; i++) {
        if (!f->survived[i]) continue;
        cr_assert_eq(secagg_site_reveal(f->site[i], f->survived, r, &m, err), 0, "%s", err);
        if (i == 1)
            for (int e = 0; e < m; e++)
                if (r[e].owner == 2) r[e].share[7] ^= 0x40;
        cr_assert_eq(secagg_server_reveal(f->srv, i, r, m, err), 0, "%s", err);
    }
    cr_assert(secagg_server_ready(f->srv));
    static float sum[LEN];
    int summed;
    cr_assert_eq(secagg_server_unmask(f->srv, sum, &summed, err), 0, "%s", err);
    cr_assert_eq(summed, 7);
    fed_free(f);
    free(f);
}

/* Too many shares that lie (three of the six of site 2's seed, four
 * needed): no four make the committed seed; the unmasking says whose, and
 * leaves the sum as it was, so more shares could still unmask it. */
Test(secagg_proto, shares_that_lie_past_the_threshold_are_caught_and_the_sum_is_untouched) {
    char err[ERR_LEN];
    Fed *f = calloc(1, sizeof *f);
    int fate[N_MAX] = {0};
    fate[3] = AFTER_MASKING;
    fed_start(f, 8);
    share(f, fate);
    mask_and_send(f, fate);
    cr_assert_eq(secagg_server_close(f->srv, f->survived, err), 0, "%s", err);
    int lied = 0;
    for (int i = 0; i < 8; i++) {
        if (!f->survived[i]) continue;
        SecaggReveal r[SECAGG_MAX_DEGREE + 1];
        int m;
        cr_assert_eq(secagg_site_reveal(f->site[i], f->survived, r, &m, err), 0, "%s", err);
        for (int e = 0; e < m && lied < 3; e++) {
            if (r[e].owner != 2 || i == 2) continue;
            /* each liar its own bytes: equal changes to two shares can
             * cancel in an interpolation */
            uint8_t noise[SECAGG_KEY];
            harness_fill(noise, sizeof noise, 100 + (uint64_t)lied++);
            for (int b = 0; b < SECAGG_KEY; b++) r[e].share[1 + b] ^= noise[b] | 1;
        }
        cr_assert_eq(secagg_server_reveal(f->srv, i, r, m, err), 0, "%s", err);
    }
    cr_assert_eq(lied, 3);
    static float sum[LEN];
    int summed = -1;
    cr_assert_eq(secagg_server_unmask(f->srv, sum, &summed, err), -1);
    cr_assert(strstr(err, "site 2's self seed") && strstr(err, "committed"), "%s", err);
    cr_assert_eq(summed, -1);
    fed_free(f);
    free(f);
}

/* The masked update's bytes: packed at any width from 8 to 32 bits and
 * added back exactly; a wrong length, width or padding is refused. */
Test(secagg_proto, masked_updates_round_trip_at_every_width_and_bad_bytes_are_refused) {
    char err[ERR_LEN];
    enum { M = 1001 };
    static uint32_t y[M], sum[M];
    static uint8_t blob[M * 4 + 64];
    for (int bits = 8; bits <= 32; bits++) {
        uint32_t mod = bits == 32 ? 0xffffffffu : (1u << bits) - 1;
        harness_fill((uint8_t *)y, sizeof y, (uint64_t)bits);
        for (int i = 0; i < M; i++) y[i] &= mod, sum[i] = 1;
        size_t len = secagg_masked_len(M, bits);
        secagg_masked_pack(y, M, bits, 7, 9, blob);
        SecaggMasked h;
        cr_assert_eq(secagg_masked_parse(blob, len, &h, err), 0, "%d bits: %s", bits, err);
        cr_assert(h.bits == bits && h.index == 7 && h.attempt == 9 && h.n == M);
        secagg_masked_add(sum, blob);
        for (int i = 0; i < M; i++)
            cr_assert_eq(sum[i], (y[i] + 1) & mod, "%d bits, value %d", bits, i);
        cr_assert_eq(secagg_masked_parse(blob, len - 1, &h, err), -1);
        cr_assert_eq(secagg_masked_parse(blob, len + 1, &h, err), -1);
        if ((M * bits) % 8) { /* padding bits must be zero */
            blob[len - 1] |= 0x80;
            cr_assert_eq(secagg_masked_parse(blob, len, &h, err), -1, "%d bits", bits);
        }
    }
    secagg_masked_pack(y, M, 16, 0, 0, blob);
    blob[4] = 7;
    SecaggMasked h;
    cr_assert_eq(secagg_masked_parse(blob, secagg_masked_len(M, 16), &h, err), -1);
    cr_assert_eq(secagg_masked_parse((const uint8_t *)"SAGX", 4, &h, err), -1);
}

/* What the coordinator holds of one site, over twenty round attempts of the
 * same update (six sites, all live): its masked values — as unpacked from
 * the bytes it stores — are uniform modulo 2^bits (a chi-square over 64
 * bins of all of them) and carry nothing of the update (their correlation
 * with it, pooled, within four standard errors of 0); and with the site's
 * self seed rebuilt from the shares its neighbours reveal (all a curious
 * coordinator learns of it), what is left is as uniform and as
 * uncorrelated: the pair masks hide the one update, and only the sum
 * cancels them. */
Test(secagg_proto, no_single_update_shows_in_what_the_coordinator_holds) {
    enum { R = 20, BINS = 64 };
    char err[ERR_LEN];
    static uint32_t y[LEN], q[LEN];
    static uint8_t blob[LEN * 4 + 64];
    double bins[2][BINS] = {{0}}, sxy[2] = {0}, sx = 0, sy[2] = {0}, sxx = 0, syy[2] = {0};
    int fate[6] = {LIVE, LIVE, LIVE, LIVE, LIVE, LIVE};
    for (int r = 0; r < R; r++) {
        Fed *f = calloc(1, sizeof *f);
        fed_start(f, 6);
        share(f, fate);
        for (int i = 0; i < 6; i++) {
            SecaggEnvelope in[N_MAX];
            int m = routed(f, i, in);
            cr_assert_eq(
                secagg_site_mask(f->site[i], f->ad, in, m, f->x[i], LEN, y, f->sent[i], err), 0,
                "%s", err);
            secagg_masked_pack(y, LEN, BITS, (uint32_t)i, 2, blob);
            cr_assert_eq(secagg_server_add(f->srv, i, blob, secagg_masked_len(LEN, BITS), err), 0,
                         "%s", err);
            if (i == 0) { /* the coordinator's copy, from its bytes */
                memset(q, 0, sizeof q);
                secagg_masked_add(q, blob);
            }
        }
        cr_assert_eq(secagg_server_close(f->srv, f->survived, err), 0, "%s", err);
        uint8_t shares[SECAGG_MAX_DEGREE][SECAGG_SHARE];
        int k = 0;
        for (int i = 1; i < 6; i++) {
            SecaggReveal rv[SECAGG_MAX_DEGREE + 1];
            int m;
            cr_assert_eq(secagg_site_reveal(f->site[i], f->survived, rv, &m, err), 0, "%s", err);
            for (int e = 0; e < m; e++)
                if (rv[e].owner == 0 && rv[e].key == 0)
                    memcpy(shares[k++], rv[e].share, SECAGG_SHARE);
        }
        cr_assert_geq(k, f->p.t, "site 0's self seed has %d shares revealed", k);
        uint8_t seed[SECAGG_KEY];
        cr_assert_eq(shamir_combine((const uint8_t(*)[SECAGG_SHARE])shares, k, seed, err), 0, "%s",
                     err);
        static uint32_t unself[LEN];
        memcpy(unself, q, sizeof q);
        cr_assert_eq(secagg_mask(unself, LEN, BITS, seed, -1, err), 0, "%s", err);
        for (int v = 0; v < LEN; v++) {
            double xv = f->sent[0][v];
            sx += xv, sxx += xv * xv;
            uint32_t held[2] = {q[v], unself[v]};
            for (int h = 0; h < 2; h++) {
                double yv = held[h] * 0x1p-24;
                bins[h][held[h] >> (BITS - 6)]++;
                sy[h] += yv, syy[h] += yv * yv, sxy[h] += xv * yv;
            }
        }
        fed_free(f);
        free(f);
    }
    double n = (double)R * LEN, want = n / BINS;
    for (int h = 0; h < 2; h++) {
        double chi = 0;
        for (int b = 0; b < BINS; b++) chi += (bins[h][b] - want) * (bins[h][b] - want) / want;
        /* 63 degrees of freedom: mean 63, sd 11.2; 120 is past 5 sd */
        cr_assert_lt(chi, 120, "%s: chi-square %g over %d bins",
                     h ? "less its self mask" : "masked", chi, BINS);
        double cov = sxy[h] / n - sx / n * sy[h] / n;
        double corr =
            cov / sqrt((sxx / n - sx / n * sx / n) * (syy[h] / n - sy[h] / n * sy[h] / n));
        cr_assert_lt(fabs(corr), 4 / sqrt(n), "%s: correlation with the update %g",
                     h ? "less its self mask" : "masked", corr);
    }
}

/* ---- distributed DP ------------------------------------------------------------------ */

/* The parameters the round's sites and coordinator share: at the bits
 * secagg_dp_bits picks, rounding adds at most 1% to the sensitivity; the
 * sensitivity bounds what a site's clipped and rounded update can be
 * (an update of any length is clipped to the bound, and stochastic
 * rounding of a value at the bound's corner moves it by under a step);
 * n sites at ±range and the noise's 8 deviations fit the modulus; and
 * too few bits are refused with the bits that would do. */
Test(secagg_proto, distributed_dp_bounds_the_sensitivity_and_fits_the_modulus) {
    enum { D = 50000 };
    char err[ERR_LEN];
    double clip = 1, z = 0.7, range = 0.02, root = sqrt((double)D);
    int n = 5, bits = secagg_dp_bits(n, range, clip, z, 3, D, 12);
    SecaggParams p;
    cr_assert_eq(secagg_params(n, bits, range, "ctx", &p, err), 0, "%s", err);
    cr_assert_eq(secagg_params_dp(&p, clip, z, 3, D, err), 0, "%s", err);
    cr_assert_leq(root / (p.scale * clip), 0.01, "%d bits: rounding adds %g", bits,
                  root / (p.scale * clip));
    cr_assert_float_eq(p.l2, p.scale * clip + root, 1e-9 * p.l2);
    cr_assert_float_eq(p.mu, (z * p.l2) * (z * p.l2), 1e-9 * p.mu);
    /* the noise of all five shares (three make mu) */
    cr_assert_leq(n * (range * p.scale + 1) + 8 * z * p.l2 * sqrt(5.0 / 3),
                  (ldexp(1, bits - 1) - 1) * (1 + 1e-12), "the modulus wraps");
    /* a long update (clipped by its norm) and one at the bound whose values
     * all sit at the range's corner */
    float *x = malloc(D * sizeof *x);
    uint32_t *q = malloc(D * sizeof *q);
    for (int shape = 0; shape < 2; shape++) {
        for (int v = 0; v < D; v++)
            x[v] = shape ? (float)(clip / root) : (float)(3 * sin(0.01 * v));
        double norm = 0;
        for (int v = 0; v < D; v++) norm += (double)x[v] * x[v];
        double factor = sqrt(norm) > clip ? clip / sqrt(norm) : 1;
        cr_assert_eq(secagg_quantize(x, D, factor, p.range, p.scale, p.bits, q, err), 0, "%s", err);
        double l2 = 0, l1 = 0, half = ldexp(1, bits - 1), full = ldexp(1, bits);
        for (int v = 0; v < D; v++) {
            double c = q[v] >= half ? q[v] - full : q[v];
            l2 += c * c, l1 += fabs(c);
        }
        cr_assert_leq(sqrt(l2), p.l2, "shape %d: L2 %g over the sensitivity %g", shape, sqrt(l2),
                      p.l2);
        cr_assert_leq(l1, p.l1, "shape %d: L1 %g over %g", shape, l1, p.l1);
    }
    SecaggParams few;
    cr_assert_eq(secagg_params(n, 12, range, "ctx", &few, err), 0, "%s", err);
    cr_assert_eq(secagg_params_dp(&few, clip, z, 3, D, err), -1, "12 bits taken");
    char want[64];
    snprintf(want, sizeof want, "use bits = %d or more",
             secagg_dp_bits(n, range, clip, z, 3, D, 12));
    cr_assert_not_null(strstr(err, want), "%s", err);
    cr_assert_eq(secagg_params_dp(&few, clip, z, 9, D, err), -1, "noise over more than the cohort");
    cr_assert_eq(secagg_params_dp(&few, clip, 0, 3, D, err), -1, "no noise");
    free(x), free(q);
}

/* A round under distributed DP: each site clips its update to the bound
 * and adds its share of Skellam noise, so the unmasked sum is what the
 * survivors sent plus noise of variance mu × survivors / noise_sites a
 * value (in the integers: the sites' shares summed); its mean is 0. Six
 * sites, noise shared among three, one dropping after masking: five
 * shares. With fewer survivors than the noise is shared among, the sum is
 * refused before anything is revealed. */
Test(secagg_proto, distributed_dp_sums_each_survivors_share_of_noise) {
    char err[ERR_LEN];
    Fed *f = calloc(1, sizeof *f);
    int fate[6] = {LIVE, LIVE, AFTER_MASKING, LIVE, LIVE, LIVE}, summed = 0;
    fed_start(f, 6);
    cr_assert_eq(secagg_params_dp(&f->p, 1.0, 0.5, 3, LEN, err), 0, "%s", err);
    share(f, fate);
    mask_and_send(f, fate);
    static float sum[LEN];
    cr_assert_eq(reveal_and_unmask(f, sum, &summed, err), 0, "%s", err);
    cr_assert_eq(summed, 5);
    double s = 0, s2 = 0, norm = 0;
    for (int v = 0; v < LEN; v++) {
        double q = 0;
        for (int i = 0; i < 6; i++)
            if (f->survived[i]) q += f->sent[i][v];
        double e = (sum[v] - q) * f->p.scale; /* the noise, in the integers */
        s += e, s2 += e * e, norm += (double)f->sent[0][v] * f->sent[0][v];
    }
    double mean = s / LEN, var = s2 / LEN - mean * mean, want = f->p.mu * 5 / 3;
    cr_assert_leq(sqrt(norm), 1.0 + sqrt((double)LEN) / f->p.scale, "site 0 sent %g", sqrt(norm));
    cr_assert_lt(fabs(mean), 6 * sqrt(want / LEN), "the noise's mean %g", mean);
    /* six standard errors of the variance (√(2/LEN) of it): 16%; one share
     * too many or too few is 20% off, the whole noise at each site 100% */
    cr_assert_lt(fabs(var / want - 1), 6 * sqrt(2.0 / LEN), "the noise's variance is %g of %g",
                 var / want, 1.0);
    fed_free(f);
    memset(f, 0, sizeof *f);
    int four[6] = {LIVE, AFTER_MASKING, LIVE, AFTER_MASKING, LIVE, LIVE};
    fed_start(f, 6);
    cr_assert_eq(secagg_params_dp(&f->p, 1.0, 0.5, 5, LEN, err), 0, "%s", err);
    share(f, four);
    mask_and_send(f, four);
    cr_assert_eq(reveal_and_unmask(f, sum, &summed, err), -1, "4 survivors, noise among 5");
    cr_assert_not_null(strstr(err, "the noise is shared among"), "%s", err);
    fed_free(f);
    free(f);
}
