/*
 * store_retain.c — checkpoint retention: which committed rounds keep their
 * files (StoreRetention), the prune in its crash-safe order, the hold a
 * reader in another process takes on a checkpoint (strait export), and the
 * disk the kept files take beside what is free.
 *
 * Order (docs/design.md §5): a file is removed only after the store has
 * committed its mark, so the store never names as kept a file that is
 * gone; a marked file a crash left is removed by the next prune or start
 * (store_prune_finish, which store_recover runs too).
 * Holds: a reader takes a shared flock on the checkpoint, then reads its row
 * again; the prune takes an exclusive one without waiting, skips a file
 * that is held, and keeps its lock until the file is gone, so a reader
 * whose lock comes after the prune's finds the row marked and says so.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include "store_internal.h"
#include "util/util.h"

int store_retention_keeps(const StoreRetention *p, int64_t newest, int64_t n) {
    if (n >= newest) return 1;
    int64_t last = p->keep_last > 1 ? p->keep_last : 1; /* the newest, always */
    int64_t window = last - 1 > p->keep_back ? last - 1 : p->keep_back;
    if (newest - n <= window) return 1;
    return p->keep_every > 0 && n % p->keep_every == 0;
}

/* ---- what a committed row says of a file in the checkpoints folder ---- */

/* "round-000042.safetensors" → 42; -1 if the name is not a round file. */
long long store_round_of_file(const char *name) {
    if (strncmp(name, "round-", 6) != 0) return -1;
    char *end;
    long long n = strtoll(name + 6, &end, 10);
    if (end == name + 6 || *end != '.' || n < 0) return -1;
    return n;
}

static const char *base_name(const char *path) {
    const char *slash = strrchr(path, '/');
    return slash ? slash + 1 : path;
}

int store_file_fate(Store *s, const char *name, StoreFileFate *fate, char *err) {
    static const char sql[] =
        "SELECT c.path, coalesce(c.state_path, ''), c.pruned_at IS NOT NULL, "
        "c.state_pruned_at IS NOT NULL FROM rounds r JOIN checkpoints c ON c.id = r.checkpoint_id "
        "WHERE r.number = ?1 AND r.state = 'committed'";
    long long number = store_round_of_file(name);
    *fate = STORE_FILE_OTHER;
    if (number < 0) return 0;
    /* a temporary of an interrupted atomic write is never committed */
    if (strstr(name, ".tmp.") != NULL) {
        *fate = STORE_FILE_ORPHAN;
        return 0;
    }
    sqlite3_stmt *st = store_stmt(s, sql, err);
    if (st == NULL) return -1;
    sqlite3_bind_int64(st, 1, number);
    int rc = sqlite3_step(st);
    if (rc == SQLITE_DONE) {
        *fate = STORE_FILE_ORPHAN;
    } else if (rc == SQLITE_ROW) {
        const char *path = (const char *)sqlite3_column_text(st, 0);
        const char *state = (const char *)sqlite3_column_text(st, 1);
        int model_pruned = sqlite3_column_int(st, 2), state_pruned = sqlite3_column_int(st, 3);
        *fate = STORE_FILE_KEPT; /* a committed round's other files are left alone */
        if (path && strcmp(base_name(path), name) == 0 && model_pruned) *fate = STORE_FILE_PRUNED;
        if (state && state[0] && strcmp(base_name(state), name) == 0 && state_pruned)
            *fate = STORE_FILE_PRUNED;
    }
    sqlite3_reset(st);
    return rc == SQLITE_ROW || rc == SQLITE_DONE ? 0
                                                 : store_db_error(s, err, "cannot check a round");
}

int store_prune_finish(Store *s, const char *home, int orphans_too, StoreRecovery *rep, char *err) {
    char dir[1024];
    snprintf(dir, sizeof dir, "%s/%s", home, STORE_CHECKPOINT_DIR);
    DIR *d = opendir(dir);
    if (d == NULL) return 0; /* nothing written yet */
    struct dirent *e;
    int result = 0, removed = 0;
    while ((e = readdir(d)) != NULL) {
        StoreFileFate fate;
        if (store_file_fate(s, e->d_name, &fate, err) != 0) {
            result = -1;
            break;
        }
        if (fate != STORE_FILE_PRUNED && !(orphans_too && fate == STORE_FILE_ORPHAN)) continue;
        char path[1400];
        snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
        if (unlink(path) != 0) {
            if (errno == ENOENT) continue;
            result = err_set_errno(err, "cannot remove %s", path);
            break;
        }
        removed++;
        if (fate == STORE_FILE_ORPHAN) {
            log_info("store", "removed %s: no committed round owns it", path);
            if (rep) rep->orphans_removed++;
        } else {
            if (rep) rep->prunes_finished++;
        }
    }
    closedir(d);
    if (result == 0 && removed > 0) result = file_fsync_dir(dir, err);
    return result;
}

/* ---- the prune ------------------------------------------------------------ */

typedef struct Candidate {
    int64_t round;
    int model, state; /* which of its files go */
    int64_t bytes, state_bytes;
    char path[512];
    int fd; /* the checkpoint's, locked exclusively; -1: none */
} Candidate;

static void candidate_row(sqlite3_stmt *st, void *row) {
    Candidate *c = row;
    c->round = sqlite3_column_int64(st, 0);
    store_copy_text(c->path, sizeof c->path, st, 1);
    c->bytes = sqlite3_column_int64(st, 2);
    c->state_bytes = sqlite3_column_int64(st, 3);
    c->model = sqlite3_column_int(st, 4);
    c->state = sqlite3_column_int(st, 5);
    c->fd = -1;
}

/* The rounds before the newest with a file not yet pruned; *newest (-1:
 * none committed). */
static int candidates(Store *s, Candidate **out, size_t *n, int64_t *newest, char *err) {
    static const char sql_newest[] = "SELECT coalesce(max(round), -1) FROM checkpoints";
    static const char sql[] =
        "SELECT round, path, bytes, coalesce(state_bytes, 0), pruned_at IS NULL, "
        "state_path IS NOT NULL AND state_pruned_at IS NULL FROM checkpoints "
        "WHERE round < ?1 AND (pruned_at IS NULL OR (state_path IS NOT NULL AND "
        "state_pruned_at IS NULL)) ORDER BY round";
    *out = NULL, *n = 0;
    sqlite3_stmt *st = store_stmt(s, sql_newest, err);
    if (st == NULL) return -1;
    int rc = sqlite3_step(st);
    *newest = rc == SQLITE_ROW ? sqlite3_column_int64(st, 0) : -1;
    sqlite3_reset(st);
    if (rc != SQLITE_ROW) return store_db_error(s, err, "cannot read the newest checkpoint");
    if (*newest < 0) return 0;
    if ((st = store_stmt(s, sql, err)) == NULL) return -1;
    sqlite3_bind_int64(st, 1, *newest);
    void *rows;
    rc = store_read_rows(s, st, sizeof **out, candidate_row, &rows, n, "checkpoints", err);
    *out = rows;
    return rc;
}

/* The exclusive lock that says no reader holds the file; 0 locked, 1 held
 * by a reader, 2 missing (left as the store has it: `strait db check`
 * reports a checkpoint that went without being pruned), -1 error. Opened
 * for writing where it may be: NFS takes an exclusive flock only on such
 * a descriptor. */
static int lock_for_prune(const char *home, Candidate *c, char *err) {
    char path[1100];
    snprintf(path, sizeof path, "%s/%s", home, c->path);
    c->fd = open(path, O_RDWR | O_CLOEXEC);
    if (c->fd < 0 && errno == EACCES) c->fd = open(path, O_RDONLY | O_CLOEXEC);
    if (c->fd < 0) return errno == ENOENT ? 2 : err_set_errno(err, "cannot open %s", path);
    if (flock(c->fd, LOCK_EX | LOCK_NB) == 0) return 0;
    int held = errno == EWOULDBLOCK;
    if (!held) err_set_errno(err, "cannot lock %s", path);
    close(c->fd);
    c->fd = -1;
    return held ? 1 : -1;
}

static int record_marks(Store *s, const Candidate *c, size_t n, int64_t now, char *err) {
    static const char sql_model[] = "UPDATE checkpoints SET pruned_at = ?2 WHERE round = ?1 "
                                    "AND pruned_at IS NULL";
    static const char sql_state[] = "UPDATE checkpoints SET state_pruned_at = ?2 WHERE round = ?1 "
                                    "AND state_pruned_at IS NULL";
    if (store_begin(s, 1, err) != 0) return -1;
    for (size_t i = 0; i < n; i++) {
        for (int k = 0; k < 2; k++) {
            if (!(k == 0 ? c[i].model : c[i].state)) continue;
            sqlite3_stmt *st = store_stmt(s, k == 0 ? sql_model : sql_state, err);
            if (st == NULL) return store_rollback(s);
            sqlite3_bind_int64(st, 1, c[i].round);
            sqlite3_bind_int64(st, 2, now);
            int rc = sqlite3_step(st);
            sqlite3_reset(st);
            if (rc != SQLITE_DONE) {
                store_db_error(s, err, "cannot record a pruned checkpoint");
                return store_rollback(s);
            }
        }
    }
    return store_commit(s, err);
}

int store_prune(Store *s, const char *home, const StoreRetention *p, int64_t now,
                StorePruneReport *rep, char *err) {
    memset(rep, 0, sizeof *rep);
    Candidate *c;
    size_t n, going = 0;
    int64_t newest;
    if (candidates(s, &c, &n, &newest, err) != 0) return -1;
    int rc = 0;
    for (size_t i = 0; i < n && rc == 0; i++) {
        c[i].model = c[i].model && !store_retention_keeps(p, newest, c[i].round);
        if (c[i].model) {
            int held = lock_for_prune(home, &c[i], err);
            if (held < 0) rc = -1;
            if (held > 0) c[i].model = 0;
            if (held == 1) rep->held++;
            if (held == 2)
                log_warn("store", "round %lld's checkpoint %s is missing; left for strait db check",
                         (long long)c[i].round, c[i].path);
        }
        if (c[i].model || c[i].state) {
            if (going != i) { /* moved down: its descriptor is closed once, from there */
                c[going] = c[i];
                c[i].fd = -1;
            }
            going++;
        }
    }
    if (rc == 0 && going > 0) rc = record_marks(s, c, going, now, err);
    if (rc == 0) { /* the marks are committed: now the files may go */
        for (size_t i = 0; i < going; i++) {
            rep->checkpoints += c[i].model, rep->states += c[i].state;
            rep->bytes += (c[i].model ? c[i].bytes : 0) + (c[i].state ? c[i].state_bytes : 0);
        }
        rc = store_prune_finish(s, home, 0, NULL, err);
    }
    for (size_t i = 0; i < n; i++)
        if (c[i].fd >= 0) close(c[i].fd); /* after the removal: a reader then finds the mark */
    free(c);
    return rc;
}

/* ---- a reader's hold -------------------------------------------------------- */

/* The row naming rel: its round and whether it was pruned. */
static int row_of(Store *s, const char *rel, int64_t *round, int64_t *pruned_at, char *err) {
    static const char sql[] = "SELECT round, coalesce(pruned_at, 0) FROM checkpoints "
                              "WHERE path = ?1";
    sqlite3_stmt *st = store_stmt(s, sql, err);
    if (st == NULL) return -1;
    sqlite3_bind_text(st, 1, rel, -1, SQLITE_STATIC);
    int rc = sqlite3_step(st);
    if (rc == SQLITE_ROW)
        *round = sqlite3_column_int64(st, 0), *pruned_at = sqlite3_column_int64(st, 1);
    sqlite3_reset(st);
    if (rc == SQLITE_ROW) return 0;
    if (rc == SQLITE_DONE) return STORE_NOT_FOUND;
    return store_db_error(s, err, "cannot read a checkpoint");
}

/* Up to 8 of the newest kept rounds, "0, 5, 10, 13, 14", for a message. */
static void kept_rounds(Store *s, char *out, size_t len) {
    static const char sql[] = "SELECT round FROM (SELECT round FROM checkpoints WHERE "
                              "pruned_at IS NULL ORDER BY round DESC LIMIT 8) ORDER BY round";
    out[0] = '\0';
    sqlite3_stmt *st = store_stmt(s, sql, NULL);
    if (st == NULL) return;
    size_t at = 0;
    while (sqlite3_step(st) == SQLITE_ROW && at + 24 < len)
        at += (size_t)snprintf(out + at, len - at, "%s%lld", at ? ", " : "",
                               (long long)sqlite3_column_int64(st, 0));
    sqlite3_reset(st);
}

static int pruned_error(Store *s, int64_t round, char *err) {
    char kept[200];
    kept_rounds(s, kept, sizeof kept);
    return err_set(err,
                   "round %lld's checkpoint was pruned by the retention policy ([store] keep_last, "
                   "keep_every); the rounds kept are %s",
                   (long long)round, kept[0] ? kept : "none");
}

int store_hold(Store *s, const char *home, const char *path, int *fd, int64_t *round, char *err) {
    char rel[600];
    snprintf(rel, sizeof rel, "%s/%s", STORE_CHECKPOINT_DIR, base_name(path));
    int64_t pruned_at = 0;
    *fd = -1;
    int rc = row_of(s, rel, round, &pruned_at, err);
    if (rc != 0) return rc;
    if (pruned_at) return pruned_error(s, *round, err), STORE_PRUNED;
    char full[1300];
    snprintf(full, sizeof full, "%s/%s", home, rel);
    int f = open(full, O_RDONLY | O_CLOEXEC);
    if (f < 0) return err_set_errno(err, "round %lld's checkpoint %s", (long long)*round, full);
    if (flock(f, LOCK_SH) != 0) { /* waits out a prune that holds it */
        close(f);
        return err_set_errno(err, "cannot hold %s", full);
    }
    if ((rc = row_of(s, rel, round, &pruned_at, err)) != 0 || pruned_at) {
        close(f);
        return rc != 0 ? -1 : (pruned_error(s, *round, err), STORE_PRUNED);
    }
    *fd = f;
    return 0;
}

/* ---- the disk ------------------------------------------------------------ */

int store_disk(Store *s, StoreDisk *out, char *err) {
    static const char sql[] =
        "SELECT coalesce(sum(CASE WHEN pruned_at IS NULL THEN bytes ELSE 0 END), 0) + "
        "coalesce(sum(CASE WHEN state_pruned_at IS NULL THEN coalesce(state_bytes, 0) ELSE 0 "
        "END), 0), coalesce(sum(pruned_at IS NULL), 0), coalesce(sum(pruned_at IS NOT NULL), 0), "
        "coalesce(sum(state_pruned_at IS NOT NULL), 0), "
        "coalesce((SELECT 2 * bytes + coalesce(state_bytes, 0) FROM checkpoints "
        "ORDER BY round DESC LIMIT 1), 0), "
        "coalesce((SELECT bytes FROM checkpoints ORDER BY round DESC LIMIT 1), 0), "
        "coalesce(max(round), -1) FROM checkpoints";
    memset(out, 0, sizeof *out);
    sqlite3_stmt *st = store_stmt(s, sql, err);
    if (st == NULL) return -1;
    int rc = sqlite3_step(st);
    if (rc == SQLITE_ROW) {
        out->used = sqlite3_column_int64(st, 0);
        out->kept = sqlite3_column_int64(st, 1);
        out->pruned = sqlite3_column_int64(st, 2);
        out->states_pruned = sqlite3_column_int64(st, 3);
        out->round_bytes = sqlite3_column_int64(st, 4);
        out->ckpt_bytes = sqlite3_column_int64(st, 5);
        out->newest = sqlite3_column_int64(st, 6);
    }
    sqlite3_reset(st);
    if (rc != SQLITE_ROW) return store_db_error(s, err, "cannot sum the checkpoints");
    char dir[sizeof s->path];
    snprintf(dir, sizeof dir, "%s", s->path);
    char *slash = strrchr(dir, '/');
    if (slash) *slash = '\0';
    struct statvfs vfs;
    out->free =
        statvfs(slash ? dir : ".", &vfs) == 0 ? (int64_t)vfs.f_bavail * (int64_t)vfs.f_frsize : -1;
    return 0;
}

int64_t store_disk_rounds_left(int64_t free_bytes, int64_t round_bytes, int64_t ckpt_bytes,
                               int64_t keep_every, int64_t to_go) {
    if (free_bytes < 0 || round_bytes <= 0) return -1;
    if (to_go < 0) to_go = 0;
    if (free_bytes < round_bytes) return 0;
    int64_t growth = keep_every > 0 ? ckpt_bytes / keep_every : 0; /* a round's share */
    if (growth <= 0) return to_go; /* retention keeps the disk level: every commit fits */
    int64_t fit = 1 + (free_bytes - round_bytes) / growth;
    return fit < to_go ? fit : to_go;
}
