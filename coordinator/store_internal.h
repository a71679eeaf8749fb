/*
 * store_internal.h — what store.c and store_recover.c share. Nothing outside
 * coordinator/ includes this but the store's own tests; the API is store.h.
 */
#ifndef STRAIT_COORDINATOR_STORE_INTERNAL_H
#define STRAIT_COORDINATOR_STORE_INTERNAL_H

#include <sqlite3.h>

#include "store.h"

#define STORE_STMT_CACHE 64

struct Store {
    sqlite3 *db; /* owned */
    char path[512];
    int readonly;
    int durable; /* the open transaction runs with synchronous=FULL */
    struct {
        const char *sql;    /* a static string: the cache key is its address */
        sqlite3_stmt *stmt; /* owned */
    } cache[STORE_STMT_CACHE];
};

int store_db_error(Store *s, char *err, const char *what);
sqlite3_stmt *store_stmt(Store *s, const char *sql, char *err);
int store_exec(Store *s, const char *sql, char *err);
/* BEGIN IMMEDIATE; durable: with synchronous=FULL until commit/rollback. */
int store_begin(Store *s, int durable, char *err);
int store_commit(Store *s, char *err);
int store_rollback(Store *s); /* always returns -1 */
int store_counts(Store *s, StoreCheck *c, char *err);
/* A text column into a fixed buffer ("" for NULL), truncated to fit. */
void store_copy_text(char *dst, size_t size, sqlite3_stmt *st, int col);
/* Steps a bound statement to the end, each row read by read_row into a
 * zeroed element of `size` bytes of a growing array: *rows (malloc'd) and
 * *n. On failure nothing is kept and err says "cannot read <what>". */
int store_read_rows(Store *s, sqlite3_stmt *st, size_t size,
                    void (*read_row)(sqlite3_stmt *st, void *row), void **rows, size_t *n,
                    const char *what, char *err);
/* What the store says of a file in HOME/checkpoints (store_retain.c):
 * another file (not a round's), a file of no committed round (or a
 * temporary), one its committed row keeps, or one its row records pruned. */
typedef enum StoreFileFate {
    STORE_FILE_OTHER,
    STORE_FILE_ORPHAN,
    STORE_FILE_KEPT,
    STORE_FILE_PRUNED,
} StoreFileFate;
/* "round-000042.safetensors" → 42; -1 if the name is not a round file. */
long long store_round_of_file(const char *name);
int store_file_fate(Store *s, const char *name, StoreFileFate *fate, char *err);
/* Removes the files of HOME/checkpoints whose rows record them pruned, and
 * with orphans_too the files of no committed round (only at start: a
 * running commit writes its files before its row), then syncs the folder;
 * counts into rep (may be NULL). */
int store_prune_finish(Store *s, const char *home, int orphans_too, StoreRecovery *rep, char *err);
/* Applies steps[from..n_steps) and sets user_version = n_steps, in one
 * transaction; exposed for the migration tests. */
int store_migrate_from(Store *s, int from, const char *const *steps, int n_steps, char *err);

#endif
