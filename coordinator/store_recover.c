/*
 * store_recover.c — the other half of the commit protocol: what the
 * coordinator does at start (fail rounds a dead process left live, remove
 * checkpoint files that no committed row names and files a prune recorded
 * and a crash left), verifying checkpoints against their rows, and the full
 * check behind `strait db check`.
 */
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "security/security.h"
#include "store_internal.h"
#include "util/util.h"

int store_recover(Store *s, const char *home, int64_t now, StoreRecovery *rep, char *err) {
    memset(rep, 0, sizeof *rep);
    StoreRound live;
    int rc;
    while ((rc = store_round_live(s, &live, err)) == 0) {
        if (store_round_fail(s, live.id, "coordinator restarted", 0, now, err) != 0) return -1;
        log_warn("store",
                 "round %lld (attempt %lld) was left open by a previous coordinator; "
                 "marked failed, it will be reopened",
                 (long long)live.number, (long long)live.attempt);
        rep->rounds_failed++;
    }
    if (rc < 0) return -1;

    /* orphans of commits a crash cut short, and prunes it cut short */
    return store_prune_finish(s, home, 1, rep, err);
}

static int verify_file(const char *home, int64_t round, const char *what, const char *rel,
                       int64_t want_bytes, const char *want_sha, char *err) {
    char path[1100], hex[SHA256_HEX_LEN], why[ERR_LEN];
    snprintf(path, sizeof path, "%s/%s", home, rel);
    int64_t bytes;
    if (security_sha256_file(path, hex, &bytes, why) != 0)
        return err_set(err, "round %lld: %s %s is unreadable: %s", (long long)round, what, rel,
                       why);
    if (bytes != want_bytes)
        return err_set(err, "round %lld: %s %s has %lld bytes, the store recorded %lld",
                       (long long)round, what, rel, (long long)bytes, (long long)want_bytes);
    if (strcmp(hex, want_sha) != 0)
        return err_set(err, "round %lld: %s %s has SHA-256 %.16s…, the store recorded %.16s…",
                       (long long)round, what, rel, hex, want_sha);
    return 0;
}

int store_checkpoint_verify(const char *home, const StoreRound *r, char *err) {
    if (r->pruned_at)
        return err_set(err,
                       "round %lld: checkpoint %s was pruned on purpose ([store] keep_last, "
                       "keep_every)",
                       (long long)r->number, r->checkpoint_path);
    if (verify_file(home, r->number, "checkpoint", r->checkpoint_path, r->checkpoint_bytes,
                    r->checkpoint_sha256, err) != 0)
        return -1;
    if (r->state_path[0] && !r->state_pruned_at &&
        verify_file(home, r->number, "outer optimizer state", r->state_path, r->state_bytes,
                    r->state_sha256, err) != 0)
        return -1;
    return 0;
}

int store_resume_point(Store *s, const char *home, StoreRound *out, char *err) {
    int rc = store_round_last_committed(s, out, err);
    if (rc != 0) return rc;
    char why[ERR_LEN];
    if (store_checkpoint_verify(home, out, why) != 0) {
        err_set(err,
                "refusing to resume: %s; restore the file from a backup, or run "
                "'strait db check' to see every checkpoint",
                why);
        log_error("store", "%s", err ? err : why);
        return -1;
    }
    return 0;
}

/* A file recorded pruned that a crash left: the next start removes it. */
static int still_present(const char *home, const char *rel) {
    char path[1100];
    snprintf(path, sizeof path, "%s/%s", home, rel);
    return access(path, F_OK) == 0;
}

int store_check(Store *s, const char *home, StoreCheck *out,
                void (*on_bad)(const StoreRound *r, const char *why, void *ctx), void *ctx,
                char *err) {
    memset(out, 0, sizeof *out);
    out->schema_version = store_schema_version(s);
    sqlite3_stmt *st;
    if (sqlite3_prepare_v2(s->db, "PRAGMA integrity_check", -1, &st, NULL) != SQLITE_OK)
        return store_db_error(s, err, "cannot run integrity_check");
    int rc = sqlite3_step(st);
    const unsigned char *first = rc == SQLITE_ROW ? sqlite3_column_text(st, 0) : NULL;
    snprintf(out->integrity, sizeof out->integrity, "%s",
             first ? (const char *)first : sqlite3_errmsg(s->db));
    out->integrity_ok = first != NULL && strcmp((const char *)first, "ok") == 0;
    sqlite3_finalize(st);
    if (!out->integrity_ok) return 0; /* the rest would read a damaged file */

    if (store_counts(s, out, err) != 0) return -1;
    static const char sql[] = "SELECT number FROM rounds WHERE state = 'committed' "
                              "ORDER BY number";
    /* collect the numbers first: store_round_get reuses the cache while we
     * would still be stepping this statement */
    int64_t *numbers = NULL;
    size_t n = 0, cap = 0;
    st = store_stmt(s, sql, err);
    if (st == NULL) return -1;
    while ((rc = sqlite3_step(st)) == SQLITE_ROW) {
        if (n == cap) {
            cap = cap ? cap * 2 : 64;
            int64_t *grown = realloc(numbers, cap * sizeof *numbers);
            if (grown == NULL) break;
            numbers = grown;
        }
        numbers[n++] = sqlite3_column_int64(st, 0);
    }
    sqlite3_reset(st);
    if (rc != SQLITE_DONE) {
        free(numbers);
        return store_db_error(s, err, "cannot list committed rounds");
    }
    for (size_t i = 0; i < n; i++) {
        StoreRound r;
        char why[ERR_LEN];
        if (store_round_get(s, numbers[i], &r, err) != 0) {
            free(numbers);
            return -1;
        }
        int newest = i == n - 1, ok;
        if (r.pruned_at && !newest) { /* on purpose: not verified, and not bad */
            out->checkpoints_pruned++;
            out->prunes_pending += still_present(home, r.checkpoint_path);
            ok = 1;
        } else {
            ok = store_checkpoint_verify(home, &r, why) == 0;
            StoreRound now;
            if (!ok && !newest && store_round_get(s, numbers[i], &now, err) == 0 &&
                (now.pruned_at != r.pruned_at || now.state_pruned_at != r.state_pruned_at)) {
                /* a running coordinator pruned it since the row was read (its
                 * marks commit before its files go): judged on the row now */
                r = now;
                ok = r.pruned_at || store_checkpoint_verify(home, &r, why) == 0;
                if (r.pruned_at) {
                    out->checkpoints_pruned++;
                    out->prunes_pending += still_present(home, r.checkpoint_path);
                }
            }
            out->checkpoints_ok += ok && !r.pruned_at;
        }
        if (r.state_pruned_at) {
            out->states_pruned++;
            out->prunes_pending += still_present(home, r.state_path);
            if (newest && ok) { /* a resume reads it: it must never be pruned */
                err_set(why,
                        "round %lld: the newest round's outer state %s is recorded pruned; the "
                        "coordinator cannot resume from it",
                        (long long)r.number, r.state_path);
                ok = 0;
            }
        }
        if (!ok) {
            out->checkpoints_bad++;
            if (on_bad) on_bad(&r, why, ctx);
        }
    }
    free(numbers);
    return 0;
}
