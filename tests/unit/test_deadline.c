/*
 * test_deadline.c — the adaptive deadline's arithmetic (coordinator/rounds.c):
 * twice the slowest site's 90th-percentile arrival once it has three
 * rounds, 1 s at least, learnt from first attempts after round 0 only, and
 * each site's last round that took an update kept whatever the attempt.
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
