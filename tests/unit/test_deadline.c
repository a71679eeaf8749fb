/*
 * test_deadline.c — the adaptive deadline's arithmetic (coordinator/rounds.c):
 * twice the slowest site's 90th-percentile arrival once it has three
 * rounds, 1 s at least, learnt from first attempts after round 0 only, and
 * each site's last round that took an update kept whatever the attempt;
 * and when each site is late: its own 90th percentile and half again; and
 * whom a round with its quorum in stops waiting for (away or late).
 */
#include <stdlib.h>
#include <string.h>

#include <criterion/criterion.h>

#include "coordinator/coordinator_internal.h"

Test(deadline, learns_from_first_attempts_after_round_0) {
    Rounds r;
    memset(&r, 0, sizeof r);
    rounds_arrival(&r, 7, 0, 1, 60000); /* round 0: every site's start-up */
    rounds_arrival(&r, 7, 1, 1, 3000);
    rounds_arrival(&r, 7, 2, 2, 90000); /* reopened after a restart */
    rounds_arrival(&r, 7, 2, 3, 40000);
    rounds_arrival(&r, 7, 3, 1, 3200);
    cr_assert_eq(rounds_adaptive_deadline(&r), 0, "two rounds counted are too few to say");
    cr_assert_eq(r.arrivals[0].last_round, 3);
    rounds_arrival(&r, 7, 4, 1, 2800);
    cr_assert_eq(rounds_adaptive_deadline(&r), 6400, "twice 3.2 s, the 90th percentile of three");
    /* another site, slower, sets it once it has three rounds of its own */
    rounds_arrival(&r, 9, 2, 1, 5000);
    rounds_arrival(&r, 9, 3, 1, 5000);
    cr_assert_eq(rounds_adaptive_deadline(&r), 6400);
    rounds_arrival(&r, 9, 4, 1, 5000);
    cr_assert_eq(rounds_adaptive_deadline(&r), 10000);
    free(r.arrivals);
}

Test(deadline, is_a_second_at_least) {
    Rounds r;
    memset(&r, 0, sizeof r);
    for (int64_t n = 1; n <= 3; n++) rounds_arrival(&r, 1, n, 1, 100);
    cr_assert_eq(rounds_adaptive_deadline(&r), 1000);
    free(r.arrivals);
}

Test(deadline, a_site_is_late_past_its_own_usual_arrival_by_half_again) {
    Rounds r;
    memset(&r, 0, sizeof r);
    cr_assert_eq(rounds_site_due(&r, 7), 0, "a site never seen is never late");
    int64_t fast[] = {4000, 4400, 4200, 9000, 4100, 4300, 4000, 4200, 4100};
    for (int64_t n = 1; n <= 2; n++) rounds_arrival(&r, 7, n, 1, fast[n - 1]);
    cr_assert_eq(rounds_site_due(&r, 7), 0, "two rounds are too few to say");
    for (int64_t n = 3; n <= 9; n++) rounds_arrival(&r, 7, n, 1, fast[n - 1]);
    /* the last 8: 4400 4200 9000 4100 4300 4000 4200 4100; the 90th
     * percentile of 8 is the 8th sorted (9000, the round it was reset) */
    cr_assert_eq(rounds_site_due(&r, 7), 13500);
    for (int64_t n = 10; n <= 12; n++) rounds_arrival(&r, 7, n, 1, 4000);
    /* rounds 5 to 12 now: the reset one has left the window */
    cr_assert_eq(rounds_site_due(&r, 7), 4300 + 2150, "4.3 s and half again");
    /* a slow site's due is its own; the fast one's stays */
    for (int64_t n = 1; n <= 3; n++) rounds_arrival(&r, 9, n, 1, 20000);
    cr_assert_eq(rounds_site_due(&r, 9), 30000);
    cr_assert_eq(rounds_site_due(&r, 7), 6450);
    cr_assert_eq(rounds_adaptive_deadline(&r), 40000, "the round's: twice the slowest");
    /* a second at least over a quick site's usual arrival */
    for (int64_t n = 1; n <= 3; n++) rounds_arrival(&r, 11, n, 1, 300);
    cr_assert_eq(rounds_site_due(&r, 11), 1300);
    free(r.arrivals);
}

/* Whom a round with its quorum in stops waiting for: a site away (nothing
 * in the round before, no call since this one opened), or one late (past
 * its own due, in the first attempt only); anyone else is waited for. */
Test(deadline, a_round_stops_waiting_for_a_site_away_or_late) {
    Rounds r;
    memset(&r, 0, sizeof r);
    r.number = 5, r.opened_ms = 100000;
    for (int64_t n = 2; n <= 4; n++) rounds_arrival(&r, 7, n, 1, 4000); /* due by 6 s */
    StoreSite s;
    memset(&s, 0, sizeof s);
    s.id = 7, s.last_seen = 90000; /* in round 4, no call since round 5 opened */
    int64_t due;
    cr_assert_eq(rounds_site_wait(&r, &s, 100500, &due), SITE_WAITED, "it sent round 4's update");
    cr_assert_eq(due, 6000);
    cr_assert_eq(rounds_site_wait(&r, &s, 105999, &due), SITE_WAITED);
    cr_assert_eq(rounds_site_wait(&r, &s, 106000, &due), SITE_LATE, "past its own due");
    r.extensions = 1; /* an extended attempt waits as the deadline says */
    cr_assert_eq(rounds_site_wait(&r, &s, 106000, &due), SITE_WAITED);
    cr_assert_eq(due, 0);
    r.extensions = 0;
    r.number = 6, r.opened_ms = 200000; /* round 5 took nothing from it */
    cr_assert_eq(rounds_site_wait(&r, &s, 200100, &due), SITE_AWAY, "nothing in 5, no call since");
    s.last_seen = 200050; /* it called once round 6 opened: waited for until its due */
    cr_assert_eq(rounds_site_wait(&r, &s, 200100, &due), SITE_WAITED);
    cr_assert_eq(rounds_site_wait(&r, &s, 206000, &due), SITE_LATE);
    StoreSite fresh;
    memset(&fresh, 0, sizeof fresh);
    fresh.id = 9, fresh.last_seen = 200050; /* no arrivals yet: never late */
    cr_assert_eq(rounds_site_wait(&r, &fresh, 900000, &due), SITE_WAITED);
    cr_assert_eq(due, 0);
    free(r.arrivals);
}
