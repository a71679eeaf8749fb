/*
 * test_round_state.c — the round's state machine (coordinator/rounds.c):
 * every move between two states is legal exactly when the diagram in
 * rounds.c draws it, and what a state implies is asserted (a round open
 * without its sum, or committing with its sum still in place, aborts).
 */
#include <signal.h>
#include <string.h>

#include <criterion/criterion.h>

#include "coordinator/coordinator_internal.h"

static const char *const NAME[] = {"none", "open", "committing", "unopened", "finished"};

/* the diagram's arrows, as drawn */
static const RoundState DRAWN[][2] = {
    {ROUND_NONE, ROUND_OPEN},           {ROUND_NONE, ROUND_FINISHED},
    {ROUND_NONE, ROUND_UNOPENED},       {ROUND_OPEN, ROUND_OPEN},
    {ROUND_OPEN, ROUND_COMMITTING},     {ROUND_OPEN, ROUND_UNOPENED},
    {ROUND_COMMITTING, ROUND_OPEN},     {ROUND_COMMITTING, ROUND_FINISHED},
    {ROUND_COMMITTING, ROUND_UNOPENED}, {ROUND_UNOPENED, ROUND_OPEN},
    {ROUND_UNOPENED, ROUND_UNOPENED},   {ROUND_OPEN, ROUND_FINISHED},
};

Test(round_state, every_move_is_legal_exactly_when_the_diagram_draws_it) {
    int legal = 0;
    for (int from = ROUND_NONE; from <= ROUND_FINISHED; from++)
        for (int to = ROUND_NONE; to <= ROUND_FINISHED; to++) {
            int drawn = 0;
            for (size_t i = 0; i < sizeof DRAWN / sizeof DRAWN[0]; i++)
                drawn |= DRAWN[i][0] == (RoundState)from && DRAWN[i][1] == (RoundState)to;
            cr_expect_eq(rounds_move_legal((RoundState)from, (RoundState)to), drawn,
                         "%s -> %s: the code says %s, the diagram %s", NAME[from], NAME[to],
                         drawn ? "illegal" : "legal", drawn ? "draws it" : "does not");
            legal += drawn;
        }
    cr_assert_eq(legal, 12);
    for (int s = ROUND_NONE; s <= ROUND_FINISHED; s++) /* nothing leaves finished */
        cr_assert_eq(rounds_move_legal(ROUND_FINISHED, (RoundState)s), 0);
}

/* a round as open_round leaves it */
static void open_round_of(Rounds *r, float *sum) {
    memset(r, 0, sizeof *r);
    r->state = ROUND_OPEN;
    r->round_id = 3, r->number = 2, r->set.total = 10;
    r->model.n_params = 4;
    r->sum.sum = sum, r->sum.n = 4;
}

Test(round_state, what_each_state_implies_holds_where_the_code_leaves_it) {
    float sum[4] = {0};
    Rounds r;
    open_round_of(&r, sum);
    rounds_assert_state(&r);
    r.state = ROUND_COMMITTING, r.sum.sum = NULL; /* rounds_close moved the sum */
    rounds_assert_state(&r);
    r.state = ROUND_UNOPENED, r.reopen_at_ms = 1;
    rounds_assert_state(&r);
    r.state_lost = 1, r.unrecorded.id = 7; /* what keeps it from opening */
    rounds_assert_state(&r);
    r.state_lost = 0, r.unrecorded.id = 0;
    r.state = ROUND_FINISHED, r.number = 10;
    rounds_assert_state(&r);
}

Test(round_state, an_open_round_without_its_sum_aborts, .signal = SIGABRT) {
    float sum[4] = {0};
    Rounds r;
    open_round_of(&r, sum);
    r.sum.sum = NULL;
    rounds_assert_state(&r);
}

Test(round_state, an_open_round_with_lost_optimizer_state_aborts, .signal = SIGABRT) {
    float sum[4] = {0};
    Rounds r;
    open_round_of(&r, sum);
    r.state_lost = 1;
    rounds_assert_state(&r);
}

Test(round_state, an_open_round_with_a_failed_attempt_not_recorded_aborts, .signal = SIGABRT) {
    float sum[4] = {0};
    Rounds r;
    open_round_of(&r, sum);
    r.unrecorded.id = 3; /* recorded before an attempt opens */
    rounds_assert_state(&r);
}

Test(round_state, a_finished_federation_with_lost_optimizer_state_aborts, .signal = SIGABRT) {
    float sum[4] = {0};
    Rounds r;
    open_round_of(&r, sum);
    r.state = ROUND_FINISHED, r.number = r.set.total, r.sum.sum = NULL;
    r.state_lost = 1;
    rounds_assert_state(&r);
}

Test(round_state, a_committing_round_with_its_sum_in_place_aborts, .signal = SIGABRT) {
    float sum[4] = {0};
    Rounds r;
    open_round_of(&r, sum);
    r.state = ROUND_COMMITTING;
    rounds_assert_state(&r);
}
