/*
 * store_report.c — what monitoring reads from the store: the audit log in
 * pages, totals over committed rounds, rejections by reason, and an online
 * backup (SQLite's backup API) that never blocks the coordinator for long.
 */
#include <fcntl.h>
#include <libgen.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "store_internal.h"
#include "util/util.h"

static void event_row(sqlite3_stmt *st, void *row) {
    StoreEvent *e = row;
    e->id = sqlite3_column_int64(st, 0);
    e->at = sqlite3_column_int64(st, 1);
    store_copy_text(e->actor, sizeof e->actor, st, 2);
    store_copy_text(e->action, sizeof e->action, st, 3);
    store_copy_text(e->detail, sizeof e->detail, st, 4);
}

static void reason_row(sqlite3_stmt *st, void *row) {
    StoreReasonCount *r = row;
    store_copy_text(r->reason, sizeof r->reason, st, 0);
    r->count = sqlite3_column_int64(st, 1);
}

int store_events_list(Store *s, int limit, int64_t before_id, StoreEvent **out, size_t *n,
                      char *err) {
    static const char sql[] = "SELECT id, at, actor, action, coalesce(detail, '') FROM events "
                              "WHERE ?2 <= 0 OR id < ?2 ORDER BY id DESC LIMIT ?1";
    sqlite3_stmt *st = store_stmt(s, sql, err);
    if (st == NULL) return -1;
    sqlite3_bind_int64(st, 1, limit);
    sqlite3_bind_int64(st, 2, before_id);
    void *rows;
    int rc = store_read_rows(s, st, sizeof **out, event_row, &rows, n, "events", err);
    *out = rows;
    return rc;
}

double store_dense_ratio(int64_t dense_bytes, int64_t bytes_up, int64_t bytes_down) {
    return dense_bytes > 0 && bytes_up + bytes_down > 0
               ? (double)dense_bytes / (double)(bytes_up + bytes_down)
               : 0;
}

int store_totals(Store *s, StoreTotals *out, char *err) {
    static const char q_rounds[] =
        "SELECT count(*) FILTER (WHERE state = 'committed'), "
        "count(*) FILTER (WHERE state = 'failed'), "
        "coalesce(sum(tokens) FILTER (WHERE state = 'committed'), 0), "
        "coalesce(sum(bytes_up), 0), coalesce(sum(bytes_down), 0), "
        "coalesce(sum(bytes_rejected), 0), "
        "coalesce(sum(dense_bytes) FILTER (WHERE state = 'committed'), 0) FROM rounds";
    static const char q_updates[] = "SELECT count(*) FILTER (WHERE state = 'accepted'), "
                                    "count(*) FILTER (WHERE state = 'rejected') FROM updates";
    memset(out, 0, sizeof *out);
    sqlite3_stmt *st = store_stmt(s, q_rounds, err);
    if (st == NULL) return -1;
    int rc = sqlite3_step(st);
    if (rc == SQLITE_ROW) {
        out->rounds_committed = sqlite3_column_int64(st, 0);
        out->rounds_failed = sqlite3_column_int64(st, 1);
        out->tokens = sqlite3_column_int64(st, 2);
        out->bytes_up = sqlite3_column_int64(st, 3);
        out->bytes_down = sqlite3_column_int64(st, 4);
        out->bytes_rejected = sqlite3_column_int64(st, 5);
        out->dense_bytes = sqlite3_column_int64(st, 6);
    }
    sqlite3_reset(st);
    if (rc != SQLITE_ROW) return store_db_error(s, err, "cannot total the rounds");
    if ((st = store_stmt(s, q_updates, err)) == NULL) return -1;
    rc = sqlite3_step(st);
    if (rc == SQLITE_ROW) {
        out->updates_accepted = sqlite3_column_int64(st, 0);
        out->updates_rejected = sqlite3_column_int64(st, 1);
    }
    sqlite3_reset(st);
    return rc == SQLITE_ROW ? 0 : store_db_error(s, err, "cannot count the updates");
}

int store_rejections(Store *s, StoreReasonCount **out, size_t *n, char *err) {
    static const char sql[] = "SELECT coalesce(reason_code, 'malformed'), count(*) FROM updates "
                              "WHERE state = 'rejected' GROUP BY 1 ORDER BY count(*) DESC, 1";
    sqlite3_stmt *st = store_stmt(s, sql, err);
    if (st == NULL) return -1;
    void *rows;
    int rc = store_read_rows(s, st, sizeof **out, reason_row, &rows, n, "rejections", err);
    *out = rows;
    return rc;
}

/* Copies in steps of this many pages, releasing the source between them,
 * so a coordinator writing meanwhile waits at most one step. */
#define BACKUP_PAGES_PER_STEP 256

static int backup_into(Store *s, sqlite3 *dst, char *err) {
    sqlite3_backup *b = sqlite3_backup_init(dst, "main", s->db, "main");
    if (b == NULL) return err_set(err, "cannot start the backup: %s", sqlite3_errmsg(dst));
    int rc;
    do {
        rc = sqlite3_backup_step(b, BACKUP_PAGES_PER_STEP);
        if (rc == SQLITE_BUSY || rc == SQLITE_LOCKED) usleep(20000);
    } while (rc == SQLITE_OK || rc == SQLITE_BUSY || rc == SQLITE_LOCKED);
    sqlite3_backup_finish(b);
    if (rc != SQLITE_DONE) return err_set(err, "backup failed: %s", sqlite3_errstr(rc));
    char bad[256] = ""; /* on the stack: a verdict lost for memory is never an "ok" */
    sqlite3_stmt *st = NULL;
    if (sqlite3_prepare_v2(dst, "PRAGMA integrity_check", -1, &st, NULL) != SQLITE_OK)
        return err_set(err, "cannot check the backup: %s", sqlite3_errmsg(dst));
    if (sqlite3_step(st) == SQLITE_ROW) {
        const char *verdict = (const char *)sqlite3_column_text(st, 0);
        if (verdict == NULL || strcmp(verdict, "ok") != 0)
            snprintf(bad, sizeof bad, "%s", verdict ? verdict : "no verdict");
    } else {
        snprintf(bad, sizeof bad, "%s", sqlite3_errmsg(dst));
    }
    sqlite3_finalize(st);
    if (bad[0]) {
        for (char *p = bad; *p; p++) /* SQLite's verdict spans lines; the message is one */
            if (*p == '\n') *p = ' ';
        return err_set(err, "the backup copy fails integrity_check: %.200s", bad);
    }
    /* a single file that needs no -wal beside it */
    if (sqlite3_exec(dst, "PRAGMA journal_mode = DELETE", NULL, NULL, NULL) != SQLITE_OK)
        return err_set(err, "cannot finish the backup: %s", sqlite3_errmsg(dst));
    return 0;
}

int store_backup(Store *s, const char *path, char *err) {
    if (access(path, F_OK) == 0)
        return err_set(err, "%s exists; give a new file name (a backup never overwrites)", path);
    char tmp[1100];
    snprintf(tmp, sizeof tmp, "%s.tmp.%d", path, (int)getpid());
    sqlite3 *dst = NULL;
    int rc = sqlite3_open_v2(tmp, &dst, SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE, NULL);
    if (rc != SQLITE_OK) {
        err_set(err, "cannot create %s: %s", tmp, dst ? sqlite3_errmsg(dst) : sqlite3_errstr(rc));
        sqlite3_close(dst);
        unlink(tmp); /* an open that failed part-way may have made the file */
        return -1;
    }
    rc = backup_into(s, dst, err);
    if (sqlite3_close(dst) != SQLITE_OK && rc == 0) rc = err_set(err, "cannot close %s", tmp);
    if (rc == 0) {
        int fd = open(tmp, O_RDONLY);
        if (fd < 0 || fsync(fd) != 0) rc = err_set(err, "cannot sync %s", tmp);
        if (fd >= 0) close(fd);
    }
    if (rc == 0 && rename(tmp, path) != 0)
        rc = err_set(err, "cannot rename the backup to %s", path);
    if (rc != 0) {
        unlink(tmp);
        return -1;
    }
    char dir[1100];
    snprintf(dir, sizeof dir, "%s", path);
    return file_fsync_dir(dirname(dir), err);
}
