/*
 * test_deadline.c — the adaptive deadline's arithmetic (coordinator/ledger.c):
 * the pace is the quorum's usual arrival, the median site's 90th
 * percentile once it has three rounds, learnt from first attempts after
 * round 0 only, and each site's last round that took an update kept
 * whatever the attempt; the adaptive deadline is twice the pace, 1 s at
 * least; a site is late past the pace and a quarter again, or sooner past
 * its own 90th percentile and half again; and whom a round with its quorum
 * in stops waiting for (away or late).
 */
#include <stdlib.h>
#include <string.h>

#include <criterion/criterion.h>

#include "coordinator/coordinator_internal.h"

/* What open_round does: the round's pace, from the rounds before. */
static void round_opens(Rounds *r, int64_t number) {
    r->number = number;
    r->pace_ms = rounds_pace(r);
}

Test(deadline, learns_from_first_attempts_after_round_0) {
    Rounds r;
    memset(&r, 0, sizeof r);
    rounds_arrival(&r, 7, 0, 1, 60000); /* round 0: every site's start-up */
    rounds_arrival(&r, 7, 1, 1, 3000);
    rounds_arrival(&r, 7, 2, 2, 90000); /* reopened after a restart */
    rounds_arrival(&r, 7, 2, 3, 40000);
    rounds_arrival(&r, 7, 3, 1, 3200);
    round_opens(&r, 4);
    cr_assert_eq(rounds_adaptive_deadline(&r), 0, "two rounds counted are too few to say");
    cr_assert_eq(r.arrivals[0].last_round, 3);
    rounds_arrival(&r, 7, 4, 1, 2800);
    round_opens(&r, 5);
    cr_assert_eq(r.pace_ms, 3200, "the 90th percentile of three");
    cr_assert_eq(rounds_adaptive_deadline(&r), 6400, "twice 3.2 s");
    /* a slower site counts once it has three rounds of its own */
    rounds_arrival(&r, 9, 2, 1, 5000);
    rounds_arrival(&r, 9, 3, 1, 5000);
    round_opens(&r, 5);
    cr_assert_eq(rounds_adaptive_deadline(&r), 6400);
    rounds_arrival(&r, 9, 4, 1, 5000);
    round_opens(&r, 5);
    cr_assert_eq(rounds_adaptive_deadline(&r), 10000, "of two, the upper middle one: 5 s");
    free(r.arrivals);
}

Test(deadline, is_a_second_at_least) {
    Rounds r;
    memset(&r, 0, sizeof r);
    for (int64_t n = 1; n <= 3; n++) rounds_arrival(&r, 1, n, 1, 100);
    round_opens(&r, 4);
    cr_assert_eq(rounds_adaptive_deadline(&r), 1000);
    free(r.arrivals);
}

/* The pace is the median site's usual arrival: sites 1 and 2 arrive at
 * 4 s, site 3 at 10 s every round. A minority of sites, however late,
 * cannot move it: the round's pace stays the honest sites' 4 s, and so
 * does its adaptive deadline (8 s, not twice site 3's 10 s). A site that
 * has sent nothing for ARRIVAL_HISTORY rounds no longer counts. */
Test(deadline, the_pace_is_the_median_sites_and_a_minority_cannot_move_it) {
    Rounds r;
    memset(&r, 0, sizeof r);
    for (int64_t n = 1; n <= 3; n++) {
        rounds_arrival(&r, 1, n, 1, 4000);
        rounds_arrival(&r, 2, n, 1, 3900);
        rounds_arrival(&r, 3, n, 1, 10000);
    }
    round_opens(&r, 4);
    cr_assert_eq(r.pace_ms, 4000);
    cr_assert_eq(rounds_adaptive_deadline(&r), 8000);
    /* a fourth site, as late: two of four are not a minority, and the
     * pace is the upper middle one's */
    for (int64_t n = 1; n <= 3; n++) rounds_arrival(&r, 4, n, 1, 12000);
    round_opens(&r, 4);
    cr_assert_eq(r.pace_ms, 10000);
    /* and one fast site more: the late two are a minority again */
    for (int64_t n = 1; n <= 3; n++) rounds_arrival(&r, 5, n, 1, 1000);
    round_opens(&r, 4);
    cr_assert_eq(r.pace_ms, 4000);
    /* sites 4 and 5 send nothing for ARRIVAL_HISTORY rounds: gone from it */
    for (int64_t n = 4; n <= 3 + ARRIVAL_HISTORY; n++)
        for (int64_t s = 1; s <= 3; s++) rounds_arrival(&r, s, n, 1, s == 3 ? 10000 : 4000);
    round_opens(&r, 4 + ARRIVAL_HISTORY);
    cr_assert_eq(r.pace_ms, 4000, "sites 1 to 3 alone");
    free(r.arrivals);
}

Test(deadline, a_site_is_late_past_the_pace_or_sooner_past_its_own_usual_arrival) {
    Rounds r;
    memset(&r, 0, sizeof r);
    round_opens(&r, 1);
    cr_assert_eq(rounds_site_due(&r, 7), 0, "no site has said the pace yet: none is late");
    int64_t fast[] = {4000, 4400, 4200, 9000, 4100, 4300, 4000, 4200, 4100};
    for (int64_t n = 1; n <= 2; n++) rounds_arrival(&r, 7, n, 1, fast[n - 1]);
    round_opens(&r, 3);
    cr_assert_eq(rounds_site_due(&r, 7), 0, "two rounds are too few to say");
    for (int64_t n = 3; n <= 9; n++) rounds_arrival(&r, 7, n, 1, fast[n - 1]);
    /* the last 8: 4400 4200 9000 4100 4300 4000 4200 4100; the 90th
     * percentile of 8 is the 8th sorted (9000, the round it was reset),
     * the pace as it is the only site: due by the pace and a quarter */
    round_opens(&r, 10);
    cr_assert_eq(r.pace_ms, 9000);
    cr_assert_eq(rounds_site_due(&r, 7), 9000 + 2250);
    for (int64_t n = 10; n <= 12; n++) rounds_arrival(&r, 7, n, 1, 4000);
    /* rounds 5 to 12 now: the reset one has left the window */
    round_opens(&r, 13);
    cr_assert_eq(rounds_site_due(&r, 7), 4300 + 1075, "4.3 s and a quarter again");
    /* a site late every round is due by the pace, not by its own habit;
     * one never seen is due by the pace too */
    for (int64_t n = 10; n <= 12; n++) rounds_arrival(&r, 9, n, 1, 20000);
    for (int64_t n = 10; n <= 12; n++) rounds_arrival(&r, 8, n, 1, 4200);
    round_opens(&r, 13);
    cr_assert_eq(r.pace_ms, 4300, "the median of 4.2, 4.3 and 20 s");
    cr_assert_eq(rounds_site_due(&r, 9), 4300 + 1075, "not 20 s and half again");
    cr_assert_eq(rounds_site_due(&r, 42), 4300 + 1075);
    cr_assert_eq(rounds_adaptive_deadline(&r), 8600, "the round's: twice the pace");
    /* a fast site is not held to the others' pace: its own and half again */
    for (int64_t n = 10; n <= 12; n++) rounds_arrival(&r, 11, n, 1, 300);
    round_opens(&r, 13);
    cr_assert_eq(rounds_site_due(&r, 11), 1300, "a second at least over its usual arrival");
    cr_assert_eq(r.pace_ms, 4300, "of four, the upper middle one");
    /* a second at least over a quick pace */
    Rounds q;
    memset(&q, 0, sizeof q);
    for (int64_t n = 1; n <= 3; n++)
        rounds_arrival(&q, 1, n, 1, 2000), rounds_arrival(&q, 2, n, 1, 9000);
    round_opens(&q, 4);
    cr_assert_eq(q.pace_ms, 9000);
    for (int64_t n = 1; n <= 3; n++) rounds_arrival(&q, 3, n, 1, 2000);
    round_opens(&q, 4);
    cr_assert_eq(rounds_site_due(&q, 2), 3000, "2 s and a second");
    free(q.arrivals);
    free(r.arrivals);
}

/* Whom a round with its quorum in stops waiting for: a site away (nothing
 * in the round before, no call since this one opened), or one late (past
 * its due, in the first attempt only); anyone else is waited for. */
Test(deadline, a_round_stops_waiting_for_a_site_away_or_late) {
    Rounds r;
    memset(&r, 0, sizeof r);
    r.opened_ms = 100000;
    StoreSite fresh;
    memset(&fresh, 0, sizeof fresh);
    fresh.id = 9, fresh.last_seen = 100050; /* called in the round */
    int64_t due;
    round_opens(&r, 1);
    cr_assert_eq(rounds_site_wait(&r, &fresh, 900000, &due), SITE_WAITED, "no pace: never late");
    cr_assert_eq(due, 0);
    for (int64_t n = 2; n <= 4; n++) rounds_arrival(&r, 7, n, 1, 4000); /* the pace: 4 s */
    round_opens(&r, 5);
    StoreSite s;
    memset(&s, 0, sizeof s);
    s.id = 7, s.last_seen = 90000; /* in round 4, no call since round 5 opened */
    cr_assert_eq(rounds_site_wait(&r, &s, 100500, &due), SITE_WAITED, "it sent round 4's update");
    cr_assert_eq(due, 5000);
    cr_assert_eq(rounds_site_wait(&r, &s, 104999, &due), SITE_WAITED);
    cr_assert_eq(rounds_site_wait(&r, &s, 105000, &due), SITE_LATE, "past its due");
    r.extensions = 1; /* an extended attempt waits as the deadline says */
    cr_assert_eq(rounds_site_wait(&r, &s, 106000, &due), SITE_WAITED);
    cr_assert_eq(due, 0);
    r.extensions = 0;
    r.opened_ms = 200000; /* round 5 took nothing from it */
    round_opens(&r, 6);
    cr_assert_eq(rounds_site_wait(&r, &s, 200100, &due), SITE_AWAY, "nothing in 5, no call since");
    s.last_seen = 200050; /* it called once round 6 opened: waited for until its due */
    cr_assert_eq(rounds_site_wait(&r, &s, 200100, &due), SITE_WAITED);
    cr_assert_eq(rounds_site_wait(&r, &s, 205000, &due), SITE_LATE);
    /* no arrivals of its own: due by the pace all the same */
    fresh.last_seen = 200050;
    cr_assert_eq(rounds_site_wait(&r, &fresh, 204999, &due), SITE_WAITED);
    cr_assert_eq(rounds_site_wait(&r, &fresh, 205000, &due), SITE_LATE);
    cr_assert_eq(due, 5000);
    free(r.arrivals);
}
