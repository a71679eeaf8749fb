/*
 * cmd_db.c — `strait db check DIR`: is the federation's store sound? Runs
 * SQLite's integrity_check and verifies every committed checkpoint's size
 * and SHA-256 against its row (those retention pruned are counted, not
 * verified). `strait db backup DIR FILE`: an online copy.
 * Both read only: safe beside a running coordinator.
 */
#include <stdio.h>
#include <unistd.h>

#include "cli.h"
#include "coordinator/store.h"
#include "util/util.h"

typedef struct BadList {
    json_t *json; /* array, when --json */
    int as_json;
} BadList;

static void on_bad(const StoreRound *r, const char *why, void *ctx) {
    BadList *bad = ctx;
    if (bad->as_json) {
        json_t *o = json_object();
        json_object_set_new(o, "round", json_integer(r->number));
        json_object_set_new(o, "path", json_string(r->checkpoint_path));
        json_object_set_new(o, "error", json_string(why));
        json_array_append_new(bad->json, o);
    } else {
        fprintf(stderr, "strait db check: %s\n", why);
    }
}

int cmd_db_check(const Command *cmd, int argc, char **argv) {
    int as_json = cli_json_flag(cmd, argc, argv);
    if (as_json < 0) return EXIT_USAGE;
    if (optind != argc - 1) return cli_usage_error(cmd, "expected one federation folder DIR");
    const char *home = argv[optind];
    char db_path[4096], err[ERR_LEN];
    snprintf(db_path, sizeof db_path, "%s/%s", home, STORE_DB_FILE);
    if (access(db_path, F_OK) != 0)
        return cli_fail(cmd, "no store at %s; is %s a federation folder made by 'strait init'?",
                        db_path, home);
    Store *s = store_open(db_path, STORE_READONLY, err);
    if (s == NULL) return cli_fail(cmd, "%s", err);
    StoreCheck chk;
    BadList bad = {json_array(), as_json};
    int rc = store_check(s, home, &chk, on_bad, &bad, err);
    store_close(s);
    if (rc != 0) {
        json_decref(bad.json);
        return cli_fail(cmd, "%s", err);
    }
    int healthy = chk.integrity_ok && chk.checkpoints_bad == 0;
    if (as_json) {
        json_t *o = json_object();
        json_object_set_new(o, "store", json_string(db_path));
        json_object_set_new(o, "ok", json_boolean(healthy));
        json_object_set_new(o, "schema_version", json_integer(chk.schema_version));
        json_object_set_new(o, "integrity", json_string(chk.integrity));
        json_object_set_new(o, "sites", json_integer(chk.sites));
        json_object_set_new(o, "rounds_committed", json_integer(chk.rounds_committed));
        json_object_set_new(o, "rounds_failed", json_integer(chk.rounds_failed));
        json_object_set_new(o, "last_committed", json_integer(chk.last_committed));
        json_object_set_new(o, "updates", json_integer(chk.updates));
        json_object_set_new(o, "events", json_integer(chk.events));
        json_object_set_new(o, "checkpoints_ok", json_integer(chk.checkpoints_ok));
        json_object_set_new(o, "checkpoints_bad", json_integer(chk.checkpoints_bad));
        json_object_set_new(o, "checkpoints_pruned", json_integer(chk.checkpoints_pruned));
        json_object_set_new(o, "states_pruned", json_integer(chk.states_pruned));
        json_object_set_new(o, "prunes_pending", json_integer(chk.prunes_pending));
        json_object_set_new(o, "bad", bad.json);
        if (json_emit_line(stdout, o) != 0) return EXIT_FAILED;
        return healthy ? EXIT_OK : EXIT_FAILED;
    }
    json_decref(bad.json);
    printf("store        %s (schema %d)\n", db_path, chk.schema_version);
    printf("integrity    %s\n", chk.integrity);
    if (chk.integrity_ok) {
        printf("sites        %lld\n", (long long)chk.sites);
        if (chk.last_committed >= 0)
            printf("rounds       %lld committed (last %lld), %lld failed attempts\n",
                   (long long)chk.rounds_committed, (long long)chk.last_committed,
                   (long long)chk.rounds_failed);
        else
            printf("rounds       none committed, %lld failed attempts\n",
                   (long long)chk.rounds_failed);
        printf("updates      %lld\n", (long long)chk.updates);
        printf("events       %lld\n", (long long)chk.events);
        printf("checkpoints  %lld verified, %lld bad", (long long)chk.checkpoints_ok,
               (long long)chk.checkpoints_bad);
        if (chk.checkpoints_pruned + chk.states_pruned > 0)
            printf(", %lld pruned on purpose and %lld outer states ([store] keep_last, "
                   "keep_every)",
                   (long long)chk.checkpoints_pruned, (long long)chk.states_pruned);
        if (chk.prunes_pending > 0)
            printf("; %lld pruned file%s a crash left, removed at the next start",
                   (long long)chk.prunes_pending, chk.prunes_pending == 1 ? "" : "s");
        printf("\n");
    }
    printf("verdict      %s\n", healthy ? "ok" : "DAMAGED");
    if (!healthy)
        fprintf(stderr, "strait db check: %s; restore from a backup before resuming\n",
                chk.integrity_ok ? "committed checkpoints do not match the store"
                                 : "the database file is damaged");
    return healthy ? EXIT_OK : EXIT_FAILED;
}

int cmd_db_backup(const Command *cmd, int argc, char **argv) {
    if (cli_json_flag(cmd, argc, argv) < 0) return EXIT_USAGE;
    if (optind != argc - 2)
        return cli_usage_error(cmd, "expected the federation folder DIR and the backup FILE");
    const char *home = argv[optind], *dest = argv[optind + 1];
    char db_path[4096], err[ERR_LEN];
    snprintf(db_path, sizeof db_path, "%s/%s", home, STORE_DB_FILE);
    if (access(db_path, F_OK) != 0)
        return cli_fail(cmd, "no store at %s; is %s a federation folder made by 'strait init'?",
                        db_path, home);
    Store *s = store_open(db_path, STORE_READONLY, err);
    if (s == NULL) return cli_fail(cmd, "%s", err);
    int rc = store_backup(s, dest, err);
    store_close(s);
    if (rc != 0) return cli_fail(cmd, "%s", err);
    /* what the copy holds, read from the copy */
    StoreTotals t;
    Store *copy = store_open(dest, STORE_READONLY, err);
    if (copy == NULL || store_totals(copy, &t, err) != 0) {
        if (copy) store_close(copy);
        return cli_fail(cmd, "the backup %s cannot be read back: %s", dest, err);
    }
    store_close(copy);
    printf("backed up %s to %s: integrity ok, %lld rounds committed\n", db_path, dest,
           (long long)t.rounds_committed);
    return EXIT_OK;
}
