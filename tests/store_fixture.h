/*
 * store_fixture.h — a scratch federation folder with a fresh store, and
 * checkpoint files with deterministic content, for the store's tests and
 * its benchmark-like crash tests.
 */
#ifndef STRAIT_TESTS_STORE_FIXTURE_H
#define STRAIT_TESTS_STORE_FIXTURE_H

#include "coordinator/store.h"
#include "kernels/model.h"
#include "security/security.h"

#define FIXTURE_CKPT_BYTES (48 * 1024 + 7)

typedef struct StoreFixture {
    char *home; /* owned, removed by fini */
    char db_path[600];
    Store *store;        /* owned */
    char paths[16][128]; /* checkpoint paths by round % 16 */
    char shas[16][SHA256_HEX_LEN];
} StoreFixture;

void store_fixture_init(StoreFixture *fx, const char *tag);
void store_fixture_fini(StoreFixture *fx);
/* The content of round n's checkpoint: FIXTURE_CKPT_BYTES bytes from a
 * generator seeded by n. */
void store_fixture_checkpoint_bytes(int64_t round, unsigned char *buf);
/* Writes round n's checkpoint atomically under HOME/checkpoints and fills ck
 * (whose strings live in fx until the same round % 16 is written again). */
void store_fixture_write_checkpoint(StoreFixture *fx, int64_t round, char sha[SHA256_HEX_LEN],
                                    StoreCheckpoint *ck);
/* Commits rounds from..to-1 (each opened, committed without updates),
 * each with its checkpoint and, with_state, an outer state file beside it
 * ("round-N.outer.safetensors", round n's bytes reversed) pinned in its row. */
void store_fixture_commit_rounds(StoreFixture *fx, int64_t from, int64_t to, int with_state);
/* Which round files are in HOME/checkpoints, as a set of bits by round:
 * models (round-N.safetensors) and outer states (round-N.outer.*). */
void store_fixture_files(const char *home, uint64_t *models, uint64_t *states);
/* Whether the file at HOME/rel holds exactly round n's content. */
int store_fixture_checkpoint_matches(const char *home, const char *rel, int64_t round);
void store_fixture_touch(StoreFixture *fx, const char *rel);
int store_fixture_exists(StoreFixture *fx, const char *rel);
void store_fixture_remove(StoreFixture *fx, const char *rel);
void store_fixture_flip_byte(StoreFixture *fx, const char *rel, long offset);
/* Waits until round n of the federation in home (a running coordinator's)
 * is committed and returns its row; fails the test after timeout_s. */
StoreRound store_fixture_wait_committed(const char *home, int64_t n, int timeout_s);
/* The same, failing at once when process pid (a coordinator this test
 * started; 0: none) has ended: a coordinator killed for memory is not
 * waited for until the timeout. */
StoreRound store_fixture_wait_committed_by(const char *home, int64_t n, int timeout_s, int pid);
/* m (built here) holds the `tiny` checkpoint at HOME/rel: a federation's
 * round, or its current model. */
void store_fixture_load_tiny(const char *home, const char *rel, Model *m);

#endif
