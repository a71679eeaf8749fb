/*
 * store.c — benchmark of the coordinator's store: recording updates and
 * committing rounds (open, 10 updates, aggregating, commit with checkpoint
 * row, synchronous=FULL), beside bare SQLite inserts into a one-table file
 * with the same journal and sync settings, measured in the same run.
 *
 *   build/bench/store [--full]     1 000 rounds x 10 updates (10x with --full)
 */
#include <math.h>
#include <sqlite3.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "coordinator/store.h"
#include "util/util.h"

static double secs(uint64_t t0) {
    return (double)(time_monotonic_ns() - t0) / 1e9;
}

#define CHECK(cond, ...)                                                                           \
    do {                                                                                           \
        if (!(cond)) DIE(__VA_ARGS__);                                                             \
    } while (0)

/* Bare SQLite: n single-row insert transactions with the given sync mode. */
static double raw_inserts_per_s(const char *dir, int n, const char *sync) {
    char path[512];
    snprintf(path, sizeof path, "%s/raw-%s.db", dir, sync);
    sqlite3 *db;
    CHECK(sqlite3_open(path, &db) == SQLITE_OK, "open %s", path);
    char pragmas[128];
    snprintf(pragmas, sizeof pragmas, "PRAGMA journal_mode=WAL; PRAGMA synchronous=%s;", sync);
    CHECK(sqlite3_exec(db, pragmas, NULL, NULL, NULL) == SQLITE_OK, "pragmas");
    CHECK(sqlite3_exec(db, "CREATE TABLE t (a INTEGER, b INTEGER, c TEXT, d REAL)", NULL, NULL,
                       NULL) == SQLITE_OK,
          "create");
    sqlite3_stmt *st;
    CHECK(sqlite3_prepare_v2(db, "INSERT INTO t VALUES (?1, ?2, ?3, ?4)", -1, &st, NULL) ==
              SQLITE_OK,
          "prepare");
    uint64_t t0 = time_monotonic_ns();
    for (int i = 0; i < n; i++) {
        sqlite3_bind_int(st, 1, i);
        sqlite3_bind_int(st, 2, i * 7);
        sqlite3_bind_text(st, 3, "int8", -1, SQLITE_STATIC);
        sqlite3_bind_double(st, 4, 2.5);
        CHECK(sqlite3_step(st) == SQLITE_DONE, "insert");
        sqlite3_reset(st);
    }
    double rate = n / secs(t0);
    sqlite3_finalize(st);
    sqlite3_close(db);
    return rate;
}

static void emit(const char *bench_case, int n, const char *figure, double rate,
                 const char *baseline, double base_rate) {
    json_t *o = json_object();
    json_object_set_new(o, "bench", json_string("store"));
    json_object_set_new(o, "case", json_string(bench_case));
    json_object_set_new(o, "n", json_integer(n));
    json_object_set_new(o, figure, json_real(rate));
    json_object_set_new(o, "baseline", json_string(baseline));
    json_object_set_new(o, "baseline_per_s", json_real(base_rate));
    json_object_set_new(o, "ratio", json_real(rate / base_rate));
    json_emit_line(stdout, o);
}

int main(int argc, char **argv) {
    int full = argc > 1 && strcmp(argv[1], "--full") == 0;
    int rounds = full ? 10000 : 1000, per_round = 10, sites = per_round;
    log_set_level(LOG_ERROR);
    char dir[] = "/tmp/strait-bench-store-XXXXXX", err[ERR_LEN], path[600];
    CHECK(mkdtemp(dir) != NULL, "mkdtemp");
    snprintf(path, sizeof path, "%s/%s", dir, STORE_DB_FILE);
    Store *s = store_open(path, STORE_READWRITE, err);
    CHECK(s != NULL, "%s", err);
    for (int i = 0; i < sites; i++) {
        char name[16];
        snprintf(name, sizeof name, "site%02d", i);
        CHECK(store_site_add(s, name, 1, NULL, err) == 0, "%s", err);
    }
    double update_s = 0, commit_s = 0;
    for (int r = 0; r < rounds; r++) {
        int64_t rid;
        CHECK(store_round_open(s, r, time_wall_ms(), &rid, err) == 0, "%s", err);
        uint64_t t0 = time_monotonic_ns();
        for (int i = 0; i < per_round; i++) {
            StoreUpdate u;
            memset(&u, 0, sizeof u);
            u.round_id = rid, u.site_id = i + 1, u.tokens = 4096, u.raw_bytes = 100 << 20;
            u.wire_bytes = 25 << 20, u.train_loss = 2.5, u.eval_loss = NAN;
            u.train_ms = 60000, u.upload_ms = 900, u.received_at = time_wall_ms();
            strcpy(u.codec, "int8");
            strcpy(u.state, "received");
            CHECK(store_update_record(s, &u, NULL, err) == 0, "%s", err);
        }
        update_s += secs(t0);
        t0 = time_monotonic_ns();
        char rel[64];
        snprintf(rel, sizeof rel, "checkpoints/round-%06d.safetensors", r);
        StoreCheckpoint ck = {
            rel,  100 << 20, "00112233445566778899aabbccddeeff00112233445566778899aabbccddeeff",
            NULL, 0,         NULL,
            0,    0,         0,
            0,    0};
        CHECK(store_round_aggregating(s, rid, err) == 0, "%s", err);
        CHECK(store_round_commit(s, rid, &ck, 2.4, 25 << 20, time_wall_ms(), err) == 0, "%s", err);
        commit_s += secs(t0);
    }
    store_close(s);
    int n_updates = rounds * per_round;
    emit("record_update", n_updates, "updates_per_s", n_updates / update_s,
         "bare sqlite INSERT, WAL, synchronous=NORMAL",
         raw_inserts_per_s(dir, n_updates, "NORMAL"));
    emit("round_commit", rounds, "commits_per_s", rounds / commit_s,
         "bare sqlite INSERT txn, WAL, synchronous=FULL", raw_inserts_per_s(dir, rounds, "FULL"));
    char cmd[700];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    return system(cmd) == 0 ? 0 : 1;
}
