/*
 * store.c — the SQLite store: opening and migrations, and the typed queries
 * of store.h. The commit protocol and recovery are in store_recover.c.
 *
 * Durability: the connection runs synchronous=NORMAL (in WAL mode a crash
 * cannot corrupt the file, it can only lose the newest transactions), and
 * the transactions that must survive a power cut — token consumption,
 * revocation, round commit and fail — run with synchronous=FULL.
 *
 * Statements are prepared once per connection and cached by their SQL
 * text's address (each query is a static string in one function).
 */
#include <assert.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include <sqlite3.h>

#include "store_internal.h"
#include "util/util.h"

extern const char schema_store_sql[], schema_store_v2_sql[], schema_store_v3_sql[],
    schema_store_v4_sql[], schema_store_v5_sql[], schema_store_v6_sql[], schema_store_v7_sql[],
    schema_store_v8_sql[], schema_store_v9_sql[], schema_store_v10_sql[], schema_store_v11_sql[],
    schema_store_v12_sql[];

/* Migration i brings user_version from i to i + 1. Append, never edit. */
static const char *const migrations[] = {
    schema_store_sql,    schema_store_v2_sql,  schema_store_v3_sql,  schema_store_v4_sql,
    schema_store_v5_sql, schema_store_v6_sql,  schema_store_v7_sql,  schema_store_v8_sql,
    schema_store_v9_sql, schema_store_v10_sql, schema_store_v11_sql, schema_store_v12_sql};
#define N_MIGRATIONS ((int)(sizeof migrations / sizeof migrations[0]))
_Static_assert(sizeof migrations / sizeof migrations[0] == STORE_SCHEMA_VERSION,
               "one migration per schema version");

/* ---- plumbing ---------------------------------------------------------- */

int store_db_error(Store *s, char *err, const char *what) {
    return err_set(err, "store %s: %s (%s)", s->path, what, sqlite3_errmsg(s->db));
}

sqlite3_stmt *store_stmt(Store *s, const char *sql, char *err) {
    int free_slot = -1;
    for (int i = 0; i < STORE_STMT_CACHE; i++) {
        if (s->cache[i].sql == sql) {
            sqlite3_reset(s->cache[i].stmt);
            sqlite3_clear_bindings(s->cache[i].stmt);
            return s->cache[i].stmt;
        }
        if (s->cache[i].sql == NULL && free_slot < 0) free_slot = i;
    }
    sqlite3_stmt *st = NULL;
    if (sqlite3_prepare_v3(s->db, sql, -1, SQLITE_PREPARE_PERSISTENT, &st, NULL) != SQLITE_OK) {
        store_db_error(s, err, "cannot prepare a query");
        return NULL;
    }
    if (free_slot < 0) DIE("store statement cache is full; raise STORE_STMT_CACHE");
    s->cache[free_slot].sql = sql;
    s->cache[free_slot].stmt = st;
    return st;
}

int store_exec(Store *s, const char *sql, char *err) {
    char *msg = NULL;
    if (sqlite3_exec(s->db, sql, NULL, NULL, &msg) != SQLITE_OK) {
        err_set(err, "store %s: %s", s->path, msg ? msg : sqlite3_errmsg(s->db));
        sqlite3_free(msg);
        return -1;
    }
    return 0;
}

int store_begin(Store *s, int durable, char *err) {
    if (durable && store_exec(s, "PRAGMA synchronous=FULL", err) != 0) return -1;
    s->durable = durable;
    return store_exec(s, "BEGIN IMMEDIATE", err);
}

int store_commit(Store *s, char *err) {
    int rc = store_exec(s, "COMMIT", err);
    if (rc != 0) store_exec(s, "ROLLBACK", NULL);
    if (s->durable) store_exec(s, "PRAGMA synchronous=NORMAL", NULL);
    s->durable = 0;
    return rc;
}

int store_rollback(Store *s) {
    store_exec(s, "ROLLBACK", NULL);
    if (s->durable) store_exec(s, "PRAGMA synchronous=NORMAL", NULL);
    s->durable = 0;
    return -1;
}

/* Steps a statement that returns no rows. */
static int step_done(Store *s, sqlite3_stmt *st, char *err, const char *what) {
    int rc = sqlite3_step(st);
    sqlite3_reset(st);
    if (rc != SQLITE_DONE) return store_db_error(s, err, what);
    return 0;
}

void store_copy_text(char *dst, size_t size, sqlite3_stmt *st, int col) {
    const unsigned char *t = sqlite3_column_text(st, col);
    snprintf(dst, size, "%s", t ? (const char *)t : "");
}

static double column_real_or_nan(sqlite3_stmt *st, int col) {
    return sqlite3_column_type(st, col) == SQLITE_NULL ? NAN : sqlite3_column_double(st, col);
}

static void bind_real_or_null(sqlite3_stmt *st, int idx, double v) {
    if (isnan(v))
        sqlite3_bind_null(st, idx);
    else
        sqlite3_bind_double(st, idx, v);
}

int store_read_rows(Store *s, sqlite3_stmt *st, size_t size,
                    void (*read_row)(sqlite3_stmt *st, void *row), void **rows, size_t *n,
                    const char *what, char *err) {
    unsigned char *all = NULL;
    size_t count = 0, cap = 0;
    int rc;
    while ((rc = sqlite3_step(st)) == SQLITE_ROW) {
        if (count == cap) {
            cap = cap ? cap * 2 : 16;
            unsigned char *grown = realloc(all, cap * size);
            if (grown == NULL) break;
            all = grown;
        }
        unsigned char *row = all + count++ * size;
        memset(row, 0, size);
        read_row(st, row);
    }
    sqlite3_reset(st);
    *rows = NULL;
    *n = 0;
    if (rc != SQLITE_DONE) {
        free(all);
        if (rc == SQLITE_ROW) return err_set(err, "out of memory reading %s", what);
        char doing[96];
        snprintf(doing, sizeof doing, "cannot read %s", what);
        return store_db_error(s, err, doing);
    }
    *rows = all;
    *n = count;
    return 0;
}

static int query_int(Store *s, const char *sql, int64_t *out, char *err) {
    sqlite3_stmt *st = store_stmt(s, sql, err);
    if (st == NULL) return -1;
    int rc = sqlite3_step(st);
    if (rc == SQLITE_ROW) *out = sqlite3_column_int64(st, 0);
    sqlite3_reset(st);
    return rc == SQLITE_ROW ? 0 : store_db_error(s, err, "query failed");
}

/* ---- open, migrate, close ---------------------------------------------- */

static int read_user_version(Store *s, int *out, char *err) {
    sqlite3_stmt *st;
    if (sqlite3_prepare_v2(s->db, "PRAGMA user_version", -1, &st, NULL) != SQLITE_OK)
        return store_db_error(s, err, "cannot read the schema version");
    int rc = sqlite3_step(st);
    *out = rc == SQLITE_ROW ? sqlite3_column_int(st, 0) : -1;
    sqlite3_finalize(st);
    if (rc != SQLITE_ROW) return store_db_error(s, err, "cannot read the schema version");
    return 0;
}

int store_migrate_from(Store *s, int from, const char *const *steps, int n_steps, char *err) {
    if (from >= n_steps) return 0;
    if (store_begin(s, 1, err) != 0) return -1;
    for (int v = from; v < n_steps; v++) {
        char why[ERR_LEN];
        if (store_exec(s, steps[v], why) != 0) {
            err_set(err, "migration of %s to schema version %d failed: %s", s->path, v + 1, why);
            return store_rollback(s);
        }
    }
    char pragma[64];
    snprintf(pragma, sizeof pragma, "PRAGMA user_version=%d", n_steps);
    if (store_exec(s, pragma, err) != 0) return store_rollback(s);
    return store_commit(s, err);
}

Store *store_open(const char *path, StoreMode mode, char *err) {
    Store *s = calloc(1, sizeof *s);
    if (s == NULL) {
        err_set(err, "out of memory");
        return NULL;
    }
    snprintf(s->path, sizeof s->path, "%s", path);
    s->readonly = mode == STORE_READONLY;
    int flags = s->readonly ? SQLITE_OPEN_READONLY : SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE;
    if (sqlite3_open_v2(path, &s->db, flags | SQLITE_OPEN_NOMUTEX, NULL) != SQLITE_OK) {
        err_set(err, "cannot open store %s: %s", path,
                s->db ? sqlite3_errmsg(s->db) : "out of memory");
        goto fail;
    }
    sqlite3_extended_result_codes(s->db, 1);
    sqlite3_busy_timeout(s->db, 10000);

    /* Read the version before anything writes: a newer file stays untouched. */
    int version;
    if (read_user_version(s, &version, err) != 0) goto fail;
    if (version > STORE_SCHEMA_VERSION) {
        err_set(err,
                "store %s has schema version %d, newer than this strait (%d); "
                "upgrade strait, the file was not changed",
                path, version, STORE_SCHEMA_VERSION);
        goto fail;
    }
    if (s->readonly) {
        if (version < STORE_SCHEMA_VERSION) {
            err_set(err,
                    "store %s has schema version %d, older than this strait (%d); start "
                    "the coordinator once to migrate it",
                    path, version, STORE_SCHEMA_VERSION);
            goto fail;
        }
        if (store_exec(s, "PRAGMA query_only=ON", err) != 0) goto fail;
        return s;
    }
    if (store_exec(s, "PRAGMA journal_mode=WAL", err) != 0 ||
        store_exec(s, "PRAGMA synchronous=NORMAL", err) != 0 ||
        store_exec(s, "PRAGMA foreign_keys=ON", err) != 0)
        goto fail;
    if (store_migrate_from(s, version, migrations, N_MIGRATIONS, err) != 0) goto fail;
    return s;
fail:
    store_close(s);
    return NULL;
}

void store_close(Store *s) {
    if (s == NULL) return;
    for (int i = 0; i < STORE_STMT_CACHE; i++)
        if (s->cache[i].stmt) sqlite3_finalize(s->cache[i].stmt);
    sqlite3_close(s->db);
    free(s);
}

int store_schema_version(Store *s) {
    int v = -1;
    read_user_version(s, &v, NULL);
    return v;
}

/* ---- sites ------------------------------------------------------------- */

#define SITE_COLUMNS                                                                               \
    "id, name, state, enrolled_at, coalesce(last_seen, 0), "                                       \
    "coalesce(cert_serial, ''), coalesce(cert_sha256, '')"

static void read_site(sqlite3_stmt *st, int col, StoreSite *o) {
    memset(o, 0, sizeof *o);
    o->id = sqlite3_column_int64(st, col);
    store_copy_text(o->name, sizeof o->name, st, col + 1);
    store_copy_text(o->state, sizeof o->state, st, col + 2);
    o->enrolled_at = sqlite3_column_int64(st, col + 3);
    o->last_seen = sqlite3_column_int64(st, col + 4);
    store_copy_text(o->cert_serial, sizeof o->cert_serial, st, col + 5);
    store_copy_text(o->cert_sha256, sizeof o->cert_sha256, st, col + 6);
}

int store_site_add(Store *s, const char *name, int64_t now, int64_t *site_id, char *err) {
    static const char sql[] = "INSERT INTO sites (name, enrolled_at) VALUES (?1, ?2)";
    sqlite3_stmt *st = store_stmt(s, sql, err);
    if (st == NULL) return -1;
    sqlite3_bind_text(st, 1, name, -1, SQLITE_STATIC);
    sqlite3_bind_int64(st, 2, now);
    int rc = sqlite3_step(st);
    sqlite3_reset(st);
    if (rc == SQLITE_CONSTRAINT_UNIQUE)
        return err_set(err, "a site named '%s' already exists", name);
    if (rc == SQLITE_CONSTRAINT_CHECK)
        return err_set(err, "bad site name '%s'; use 1-64 letters, digits, '-', '_' or '.'", name);
    if (rc != SQLITE_DONE) return store_db_error(s, err, "cannot add a site");
    if (site_id) *site_id = sqlite3_last_insert_rowid(s->db);
    return 0;
}

int store_site_get(Store *s, const char *name, StoreSite *out, char *err) {
    static const char sql[] = "SELECT " SITE_COLUMNS " FROM sites WHERE name = ?1";
    sqlite3_stmt *st = store_stmt(s, sql, err);
    if (st == NULL) return -1;
    sqlite3_bind_text(st, 1, name, -1, SQLITE_STATIC);
    int rc = sqlite3_step(st);
    if (rc == SQLITE_ROW) read_site(st, 0, out);
    sqlite3_reset(st);
    if (rc == SQLITE_ROW) return 0;
    if (rc == SQLITE_DONE) return STORE_NOT_FOUND;
    return store_db_error(s, err, "cannot read a site");
}

static void site_row(sqlite3_stmt *st, void *row) {
    read_site(st, 0, row);
}

int store_site_list(Store *s, StoreSite **out, size_t *n, char *err) {
    static const char sql[] = "SELECT " SITE_COLUMNS " FROM sites ORDER BY name";
    sqlite3_stmt *st = store_stmt(s, sql, err);
    if (st == NULL) return -1;
    void *rows;
    int rc = store_read_rows(s, st, sizeof **out, site_row, &rows, n, "sites", err);
    *out = rows;
    return rc;
}

int store_site_touch(Store *s, int64_t site_id, int64_t now, char *err) {
    static const char sql[] = "UPDATE sites SET last_seen = max(coalesce(last_seen, 0), ?2) "
                              "WHERE id = ?1";
    sqlite3_stmt *st = store_stmt(s, sql, err);
    if (st == NULL) return -1;
    sqlite3_bind_int64(st, 1, site_id);
    sqlite3_bind_int64(st, 2, now);
    return step_done(s, st, err, "cannot record when a site was seen");
}

int store_site_revoke(Store *s, const char *name, const char *actor, int64_t now, char *err) {
    static const char sql_site[] = "UPDATE sites SET state = 'revoked' WHERE name = ?1";
    static const char sql_certs[] =
        "UPDATE certificates SET revoked_at = ?2 WHERE (revoked_at IS NULL OR revoked_at > ?2) "
        "AND site_id = (SELECT id FROM sites WHERE name = ?1)";
    if (store_begin(s, 1, err) != 0) return -1;
    sqlite3_stmt *st = store_stmt(s, sql_site, err);
    if (st == NULL) return store_rollback(s);
    sqlite3_bind_text(st, 1, name, -1, SQLITE_STATIC);
    if (step_done(s, st, err, "cannot revoke a site") != 0) return store_rollback(s);
    if (sqlite3_changes(s->db) == 0) {
        store_rollback(s);
        return err_set(err, "no site named '%s'; 'strait site list' shows them", name);
    }
    st = store_stmt(s, sql_certs, err);
    if (st == NULL) return store_rollback(s);
    sqlite3_bind_text(st, 1, name, -1, SQLITE_STATIC);
    sqlite3_bind_int64(st, 2, now);
    if (step_done(s, st, err, "cannot revoke certificates") != 0) return store_rollback(s);
    if (store_event_add(s, actor, "site.revoke", name, now, err) != 0) return store_rollback(s);
    return store_commit(s, err);
}

/* ---- tokens and certificates ------------------------------------------ */

int store_token_add(Store *s, const uint8_t hash[32], const char *site_name, int64_t created_at,
                    int64_t expires_at, char *err) {
    static const char sql[] = "INSERT INTO enroll_tokens (token_hash, site_name, created_at, "
                              "expires_at) VALUES (?1, ?2, ?3, ?4)";
    sqlite3_stmt *st = store_stmt(s, sql, err);
    if (st == NULL) return -1;
    sqlite3_bind_blob(st, 1, hash, 32, SQLITE_STATIC);
    sqlite3_bind_text(st, 2, site_name, -1, SQLITE_STATIC);
    sqlite3_bind_int64(st, 3, created_at);
    sqlite3_bind_int64(st, 4, expires_at);
    int rc = sqlite3_step(st);
    sqlite3_reset(st);
    if (rc == SQLITE_CONSTRAINT_CHECK)
        return err_set(err, "a token must expire after it is created");
    if (rc != SQLITE_DONE) return store_db_error(s, err, "cannot record an enrollment token");
    return 0;
}

const char *store_token_result_str(StoreTokenResult r) {
    switch (r) {
    case STORE_TOKEN_OK:
        return "ok";
    case STORE_TOKEN_UNKNOWN:
        return "unknown token";
    case STORE_TOKEN_USED:
        return "token already used";
    case STORE_TOKEN_EXPIRED:
        return "token expired";
    case STORE_TOKEN_WRONG_SITE:
        return "token was issued for another site";
    default:
        return "store error";
    }
}

static int record_site_cert(Store *s, const char *name, int64_t now, const StoreCert *c,
                            int64_t *site_id, char *err) {
    static const char sql_site[] =
        "INSERT INTO sites (name, enrolled_at, cert_serial, cert_sha256) VALUES (?1, ?2, ?3, ?4) "
        "ON CONFLICT (name) DO UPDATE SET state = 'active', cert_serial = ?3, cert_sha256 = ?4 "
        "RETURNING id";
    static const char sql_cert[] = "INSERT INTO certificates (serial, site_id, sha256, "
                                   "not_before, not_after) VALUES (?1, ?2, ?3, ?4, ?5)";
    sqlite3_stmt *st = store_stmt(s, sql_site, err);
    if (st == NULL) return -1;
    sqlite3_bind_text(st, 1, name, -1, SQLITE_STATIC);
    sqlite3_bind_int64(st, 2, now);
    sqlite3_bind_text(st, 3, c->serial, -1, SQLITE_STATIC);
    sqlite3_bind_text(st, 4, c->sha256, -1, SQLITE_STATIC);
    int rc = sqlite3_step(st);
    int64_t id = rc == SQLITE_ROW ? sqlite3_column_int64(st, 0) : 0;
    sqlite3_reset(st);
    if (rc != SQLITE_ROW) return store_db_error(s, err, "cannot record the site");
    st = store_stmt(s, sql_cert, err);
    if (st == NULL) return -1;
    sqlite3_bind_text(st, 1, c->serial, -1, SQLITE_STATIC);
    sqlite3_bind_int64(st, 2, id);
    sqlite3_bind_text(st, 3, c->sha256, -1, SQLITE_STATIC);
    sqlite3_bind_int64(st, 4, c->not_before);
    sqlite3_bind_int64(st, 5, c->not_after);
    if (step_done(s, st, err, "cannot record the certificate") != 0) return -1;
    if (site_id) *site_id = id;
    return 0;
}

/* What the token row says for this site now; st has run sql_get. */
static StoreTokenResult token_classify(Store *s, sqlite3_stmt *st, const char *site_name,
                                       int64_t now, char *err) {
    int rc = sqlite3_step(st);
    if (rc == SQLITE_DONE) return STORE_TOKEN_UNKNOWN;
    if (rc != SQLITE_ROW) {
        store_db_error(s, err, "cannot read the token");
        return STORE_TOKEN_ERROR;
    }
    const char *bound = (const char *)sqlite3_column_text(st, 0);
    if (sqlite3_column_int(st, 2)) return STORE_TOKEN_USED;
    if (sqlite3_column_int64(st, 1) <= now) return STORE_TOKEN_EXPIRED;
    if (bound == NULL || strcmp(bound, site_name) != 0) return STORE_TOKEN_WRONG_SITE;
    return STORE_TOKEN_OK;
}

static const char sql_token_get[] =
    "SELECT site_name, expires_at, used_at IS NOT NULL FROM enroll_tokens "
    "WHERE token_hash = ?1";

StoreTokenResult store_token_check(Store *s, const uint8_t hash[32], const char *site_name,
                                   int64_t now, char *err) {
    sqlite3_stmt *st = store_stmt(s, sql_token_get, err);
    if (st == NULL) return STORE_TOKEN_ERROR;
    sqlite3_bind_blob(st, 1, hash, 32, SQLITE_STATIC);
    StoreTokenResult result = token_classify(s, st, site_name, now, err);
    sqlite3_reset(st);
    return result;
}

StoreTokenResult store_token_consume(Store *s, const uint8_t hash[32], const char *site_name,
                                     int64_t now, const StoreCert *cert, int64_t *site_id,
                                     char *err) {
    static const char sql_use[] = "UPDATE enroll_tokens SET used_at = ?2 WHERE token_hash = ?1 "
                                  "AND used_at IS NULL";
    /* IMMEDIATE takes the write lock before the read, so two racers are
     * serialised and the second sees used_at set. */
    if (store_begin(s, 1, err) != 0) return STORE_TOKEN_ERROR;
    sqlite3_stmt *st = store_stmt(s, sql_token_get, err);
    if (st == NULL) goto fail;
    sqlite3_bind_blob(st, 1, hash, 32, SQLITE_STATIC);
    StoreTokenResult result = token_classify(s, st, site_name, now, err);
    sqlite3_reset(st);
    if (result != STORE_TOKEN_OK) {
        if (result != STORE_TOKEN_ERROR) err_set(err, "%s", store_token_result_str(result));
        store_rollback(s);
        return result;
    }
    st = store_stmt(s, sql_use, err);
    if (st == NULL) goto fail;
    sqlite3_bind_blob(st, 1, hash, 32, SQLITE_STATIC);
    sqlite3_bind_int64(st, 2, now);
    if (step_done(s, st, err, "cannot consume the token") != 0) goto fail;
    if (cert && record_site_cert(s, site_name, now, cert, site_id, err) != 0) goto fail;
    if (store_commit(s, err) != 0) return STORE_TOKEN_ERROR;
    return STORE_TOKEN_OK;
fail:
    store_rollback(s);
    return STORE_TOKEN_ERROR;
}

int store_cert_add(Store *s, int64_t site_id, const StoreCert *c, int64_t retire_at, int64_t now,
                   char *err) {
    static const char sql_cert[] = "INSERT INTO certificates (serial, site_id, sha256, "
                                   "not_before, not_after) VALUES (?1, ?2, ?3, ?4, ?5)";
    static const char sql_site[] = "UPDATE sites SET cert_serial = ?2, cert_sha256 = ?3 "
                                   "WHERE id = ?1 AND state = 'active'";
    /* the site's other certificates retire at retire_at (sooner if already
     * due), and those retired by now are gone: an active site holds its
     * current certificate and the one it replaced, nothing older */
    static const char sql_retire[] =
        "UPDATE certificates SET revoked_at = ?3 WHERE site_id = ?1 AND sha256 <> ?2 AND "
        "(revoked_at IS NULL OR revoked_at > ?3)";
    static const char sql_drop[] =
        "DELETE FROM certificates WHERE site_id = ?1 AND revoked_at IS NOT NULL AND "
        "revoked_at <= ?2";
    if (store_begin(s, 1, err) != 0) return -1;
    sqlite3_stmt *st = store_stmt(s, sql_drop, err);
    if (st == NULL) return store_rollback(s);
    sqlite3_bind_int64(st, 1, site_id);
    sqlite3_bind_int64(st, 2, now);
    if (step_done(s, st, err, "cannot drop retired certificates") != 0) return store_rollback(s);
    st = store_stmt(s, sql_cert, err);
    if (st == NULL) return store_rollback(s);
    sqlite3_bind_text(st, 1, c->serial, -1, SQLITE_STATIC);
    sqlite3_bind_int64(st, 2, site_id);
    sqlite3_bind_text(st, 3, c->sha256, -1, SQLITE_STATIC);
    sqlite3_bind_int64(st, 4, c->not_before);
    sqlite3_bind_int64(st, 5, c->not_after);
    if (step_done(s, st, err, "cannot record the certificate") != 0) return store_rollback(s);
    st = store_stmt(s, sql_site, err);
    if (st == NULL) return store_rollback(s);
    sqlite3_bind_int64(st, 1, site_id);
    sqlite3_bind_text(st, 2, c->serial, -1, SQLITE_STATIC);
    sqlite3_bind_text(st, 3, c->sha256, -1, SQLITE_STATIC);
    if (step_done(s, st, err, "cannot update the site's certificate") != 0)
        return store_rollback(s);
    if (sqlite3_changes(s->db) == 0) {
        store_rollback(s);
        return err_set(err, "site %lld is not active", (long long)site_id);
    }
    st = store_stmt(s, sql_retire, err);
    if (st == NULL) return store_rollback(s);
    sqlite3_bind_int64(st, 1, site_id);
    sqlite3_bind_text(st, 2, c->sha256, -1, SQLITE_STATIC);
    sqlite3_bind_int64(st, 3, retire_at);
    if (step_done(s, st, err, "cannot retire the replaced certificate") != 0)
        return store_rollback(s);
    return store_commit(s, err);
}

int store_cert_retiring(Store *s, int64_t site_id, int64_t now, int64_t *until, char *err) {
    static const char sql[] = "SELECT coalesce(max(revoked_at), 0) FROM certificates "
                              "WHERE site_id = ?1 AND revoked_at > ?2";
    sqlite3_stmt *st = store_stmt(s, sql, err);
    if (st == NULL) return -1;
    sqlite3_bind_int64(st, 1, site_id);
    sqlite3_bind_int64(st, 2, now);
    int rc = sqlite3_step(st);
    *until = rc == SQLITE_ROW ? sqlite3_column_int64(st, 0) : 0;
    sqlite3_reset(st);
    return rc == SQLITE_ROW ? 0 : store_db_error(s, err, "cannot look up a site's certificates");
}

int store_cert_find(Store *s, const char *sha256, StoreSite *site, StoreCert *cert, char *err) {
    static const char sql[] =
        "SELECT s.id, s.name, s.state, s.enrolled_at, coalesce(s.last_seen, 0), "
        "coalesce(s.cert_serial, ''), coalesce(s.cert_sha256, ''), "
        "c.serial, c.sha256, c.not_before, c.not_after, coalesce(c.revoked_at, 0) "
        "FROM certificates c JOIN sites s ON s.id = c.site_id WHERE c.sha256 = ?1";
    sqlite3_stmt *st = store_stmt(s, sql, err);
    if (st == NULL) return -1;
    sqlite3_bind_text(st, 1, sha256, -1, SQLITE_STATIC);
    int rc = sqlite3_step(st);
    if (rc == SQLITE_ROW) {
        if (site) read_site(st, 0, site);
        if (cert) {
            store_copy_text(cert->serial, sizeof cert->serial, st, 7);
            store_copy_text(cert->sha256, sizeof cert->sha256, st, 8);
            cert->not_before = sqlite3_column_int64(st, 9);
            cert->not_after = sqlite3_column_int64(st, 10);
            cert->revoked_at = sqlite3_column_int64(st, 11);
        }
    }
    sqlite3_reset(st);
    if (rc == SQLITE_ROW) return 0;
    if (rc == SQLITE_DONE) return STORE_NOT_FOUND;
    return store_db_error(s, err, "cannot look up a certificate");
}

/* ---- rounds ------------------------------------------------------------ */

#define ROUND_COLUMNS                                                                              \
    "r.id, r.number, r.attempt, r.state, r.opened_at, coalesce(r.closed_at, 0), "                  \
    "coalesce(r.failed_reason, ''), r.participants, r.tokens, r.train_loss, r.eval_loss, "         \
    "r.bytes_up, r.bytes_down, coalesce(c.path, ''), coalesce(c.bytes, 0), "                       \
    "coalesce(c.sha256, ''), coalesce(c.state_path, ''), coalesce(c.state_bytes, 0), "             \
    "coalesce(c.state_sha256, ''), r.start_eval_loss, r.bytes_rejected, r.dense_bytes, "           \
    "r.refusals_unrecorded, r.late, coalesce(c.pruned_at, 0), coalesce(c.state_pruned_at, 0), "    \
    "r.dp_noise, r.dp_epsilon, r.dp_delta "                                                        \
    "FROM rounds r LEFT JOIN checkpoints c ON c.id = r.checkpoint_id "

static void read_round(sqlite3_stmt *st, StoreRound *o) {
    memset(o, 0, sizeof *o);
    o->id = sqlite3_column_int64(st, 0);
    o->number = sqlite3_column_int64(st, 1);
    o->attempt = sqlite3_column_int64(st, 2);
    store_copy_text(o->state, sizeof o->state, st, 3);
    o->opened_at = sqlite3_column_int64(st, 4);
    o->closed_at = sqlite3_column_int64(st, 5);
    store_copy_text(o->failed_reason, sizeof o->failed_reason, st, 6);
    o->participants = sqlite3_column_int64(st, 7);
    o->tokens = sqlite3_column_int64(st, 8);
    o->train_loss = column_real_or_nan(st, 9);
    o->eval_loss = column_real_or_nan(st, 10);
    o->bytes_up = sqlite3_column_int64(st, 11);
    o->bytes_down = sqlite3_column_int64(st, 12);
    store_copy_text(o->checkpoint_path, sizeof o->checkpoint_path, st, 13);
    o->checkpoint_bytes = sqlite3_column_int64(st, 14);
    store_copy_text(o->checkpoint_sha256, sizeof o->checkpoint_sha256, st, 15);
    store_copy_text(o->state_path, sizeof o->state_path, st, 16);
    o->state_bytes = sqlite3_column_int64(st, 17);
    store_copy_text(o->state_sha256, sizeof o->state_sha256, st, 18);
    o->start_eval_loss = column_real_or_nan(st, 19);
    o->bytes_rejected = sqlite3_column_int64(st, 20);
    o->dense_bytes = sqlite3_column_int64(st, 21);
    o->refusals_unrecorded = sqlite3_column_int64(st, 22);
    store_copy_text(o->late, sizeof o->late, st, 23);
    o->pruned_at = sqlite3_column_int64(st, 24);
    o->state_pruned_at = sqlite3_column_int64(st, 25);
    o->dp_noise = column_real_or_nan(st, 26);
    o->dp_epsilon = column_real_or_nan(st, 27);
    o->dp_delta = column_real_or_nan(st, 28);
}

static int round_one(Store *s, const char *sql, int64_t arg, StoreRound *out, char *err) {
    sqlite3_stmt *st = store_stmt(s, sql, err);
    if (st == NULL) return -1;
    sqlite3_bind_int64(st, 1, arg);
    int rc = sqlite3_step(st);
    if (rc == SQLITE_ROW) read_round(st, out);
    sqlite3_reset(st);
    if (rc == SQLITE_ROW) return 0;
    if (rc == SQLITE_DONE) return STORE_NOT_FOUND;
    return store_db_error(s, err, "cannot read a round");
}

int store_round_open(Store *s, int64_t number, int64_t now, int64_t *round_id, char *err) {
    static const char sql[] =
        "INSERT INTO rounds (number, attempt, opened_at) SELECT ?1, next, ?2 FROM "
        "(SELECT coalesce(max(attempt), 0) + 1 AS next FROM rounds WHERE number = ?1) "
        "WHERE NOT EXISTS (SELECT 1 FROM rounds WHERE number = ?1 AND state = 'committed')";
    sqlite3_stmt *st = store_stmt(s, sql, err);
    if (st == NULL) return -1;
    sqlite3_bind_int64(st, 1, number);
    sqlite3_bind_int64(st, 2, now);
    int rc = sqlite3_step(st);
    sqlite3_reset(st);
    if (rc == SQLITE_CONSTRAINT_UNIQUE)
        return err_set(err, "cannot open round %lld: another round is still open",
                       (long long)number);
    if (rc != SQLITE_DONE) return store_db_error(s, err, "cannot open a round");
    if (sqlite3_changes(s->db) == 0)
        return err_set(err, "cannot open round %lld: it is already committed", (long long)number);
    if (round_id) *round_id = sqlite3_last_insert_rowid(s->db);
    return 0;
}

int store_round_aggregating(Store *s, int64_t round_id, char *err) {
    static const char sql[] = "UPDATE rounds SET state = 'aggregating' WHERE id = ?1 AND "
                              "state = 'open'";
    sqlite3_stmt *st = store_stmt(s, sql, err);
    if (st == NULL) return -1;
    sqlite3_bind_int64(st, 1, round_id);
    if (step_done(s, st, err, "cannot close a round for aggregation") != 0) return -1;
    if (sqlite3_changes(s->db) == 0)
        return err_set(err, "round attempt %lld is not open", (long long)round_id);
    return 0;
}

int store_update_record(Store *s, const StoreUpdate *u, int64_t *update_id, char *err) {
    static const char sql[] =
        "INSERT INTO updates (round_id, site_id, codec, raw_bytes, wire_bytes, tokens, "
        "train_loss, eval_loss, train_ms, upload_ms, state, reason, received_at, "
        "start_eval_loss, reason_code, steps, download_ms, decode_ms, eval_ms, encode_ms, "
        "staleness) "
        "VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, nullif(?12, ''), ?13, ?14, "
        "nullif(?15, ''), ?16, ?17, ?18, ?19, ?20, ?21)";
    sqlite3_stmt *st = store_stmt(s, sql, err);
    if (st == NULL) return -1;
    sqlite3_bind_int64(st, 1, u->round_id);
    sqlite3_bind_int64(st, 2, u->site_id);
    sqlite3_bind_text(st, 3, u->codec, -1, SQLITE_STATIC);
    sqlite3_bind_int64(st, 4, u->raw_bytes);
    sqlite3_bind_int64(st, 5, u->wire_bytes);
    sqlite3_bind_int64(st, 6, u->tokens);
    bind_real_or_null(st, 7, u->train_loss);
    bind_real_or_null(st, 8, u->eval_loss);
    sqlite3_bind_int64(st, 9, u->train_ms);
    sqlite3_bind_int64(st, 10, u->upload_ms);
    sqlite3_bind_text(st, 11, u->state, -1, SQLITE_STATIC);
    sqlite3_bind_text(st, 12, u->reason, -1, SQLITE_STATIC);
    sqlite3_bind_int64(st, 13, u->received_at);
    /* a loss is positive: 0 (a zeroed struct, an older site) is "not measured" */
    bind_real_or_null(st, 14, u->start_eval_loss > 0 ? u->start_eval_loss : NAN);
    if (strcmp(u->state, "rejected") == 0 && !store_reason_code_valid(u->reason_code)) {
        sqlite3_reset(st);
        return err_set(err, "a rejected update needs a reason code, not '%.24s'", u->reason_code);
    }
    sqlite3_bind_text(st, 15, strcmp(u->state, "rejected") == 0 ? u->reason_code : "", -1,
                      SQLITE_STATIC);
    sqlite3_bind_int64(st, 16, u->steps);
    sqlite3_bind_int64(st, 17, u->download_ms);
    sqlite3_bind_int64(st, 18, u->decode_ms);
    sqlite3_bind_int64(st, 19, u->eval_ms);
    sqlite3_bind_int64(st, 20, u->encode_ms);
    sqlite3_bind_int64(st, 21, u->staleness);
    int rc = sqlite3_step(st);
    sqlite3_reset(st);
    switch (rc) {
    case SQLITE_DONE:
        break;
    case SQLITE_CONSTRAINT_UNIQUE:
        return err_set(err, "duplicate update: site %lld already has one in round attempt %lld",
                       (long long)u->site_id, (long long)u->round_id);
    case SQLITE_CONSTRAINT_FOREIGNKEY:
        return err_set(err, "update names an unknown round attempt %lld or site %lld",
                       (long long)u->round_id, (long long)u->site_id);
    case SQLITE_CONSTRAINT_CHECK:
        return err_set(err,
                       "update refused by the schema: bad state '%s', a negative count, "
                       "or a rejection without a reason",
                       u->state);
    default:
        return store_db_error(s, err, "cannot record an update");
    }
    if (update_id) *update_id = sqlite3_last_insert_rowid(s->db);
    return 0;
}

int store_privacy_spent(Store *s, PrivacyAccount *acc, int64_t *plain, char *err) {
    static const char sql[] = "SELECT dp_noise, dp_mu, dp_l1 FROM rounds "
                              "WHERE state = 'committed' OR dp_mu IS NOT NULL";
    sqlite3_stmt *st = store_stmt(s, sql, err);
    if (st == NULL) return -1;
    memset(acc, 0, sizeof *acc);
    *plain = 0;
    int rc;
    while ((rc = sqlite3_step(st)) == SQLITE_ROW) {
        double z = sqlite3_column_double(st, 0), mu = sqlite3_column_double(st, 1);
        if (sqlite3_column_type(st, 0) == SQLITE_NULL)
            ++*plain;
        else if (sqlite3_column_type(st, 1) == SQLITE_NULL) /* central: Gaussian */
            privacy_add_gaussian(acc, z);
        else /* distributed: Skellam, its L2 sensitivity √mu / z */
            privacy_add_skellam(acc, mu, sqlite3_column_double(st, 2), sqrt(mu) / z);
    }
    sqlite3_reset(st);
    return rc == SQLITE_DONE ? 0 : store_db_error(s, err, "cannot read the privacy account");
}

int store_round_noise(Store *s, int64_t round_id, double dp_noise, double dp_mu, double dp_l1,
                      double dp_delta, char *err) {
    static const char sql[] = "UPDATE rounds SET dp_noise = ?2, dp_mu = ?3, dp_l1 = ?4, "
                              "dp_delta = ?5 WHERE id = ?1 AND state IN ('open', 'aggregating')";
    sqlite3_stmt *st = store_stmt(s, sql, err);
    if (st == NULL) return -1;
    sqlite3_bind_int64(st, 1, round_id);
    sqlite3_bind_double(st, 2, dp_noise), sqlite3_bind_double(st, 3, dp_mu);
    sqlite3_bind_double(st, 4, dp_l1), sqlite3_bind_double(st, 5, dp_delta);
    if (step_done(s, st, err, "cannot record the sum's noise") != 0) return -1;
    if (sqlite3_changes(s->db) == 0)
        return err_set(err, "cannot record round attempt %lld's noise: it is not live",
                       (long long)round_id);
    return 0;
}

int store_round_get(Store *s, int64_t number, StoreRound *out, char *err) {
    static const char sql[] = "SELECT " ROUND_COLUMNS "WHERE r.number = ?1 "
                              "ORDER BY r.state = 'committed' DESC, r.attempt DESC LIMIT 1";
    return round_one(s, sql, number, out, err);
}

int store_round_last_committed(Store *s, StoreRound *out, char *err) {
    static const char sql[] = "SELECT " ROUND_COLUMNS "WHERE r.state = 'committed' AND ?1 "
                              "ORDER BY r.number DESC LIMIT 1";
    return round_one(s, sql, 1, out, err);
}

int store_round_live(Store *s, StoreRound *out, char *err) {
    static const char sql[] = "SELECT " ROUND_COLUMNS "WHERE r.state IN ('open', 'aggregating') "
                              "AND ?1 LIMIT 1";
    return round_one(s, sql, 1, out, err);
}

static void round_row(sqlite3_stmt *st, void *row) {
    read_round(st, row);
}

int store_rounds_list(Store *s, int limit, int64_t before_id, StoreRound **out, size_t *n,
                      char *err) {
    static const char sql[] = "SELECT " ROUND_COLUMNS "WHERE ?2 <= 0 OR r.id < ?2 "
                              "ORDER BY r.id DESC LIMIT ?1";
    sqlite3_stmt *st = store_stmt(s, sql, err);
    if (st == NULL) return -1;
    sqlite3_bind_int64(st, 1, limit);
    sqlite3_bind_int64(st, 2, before_id);
    void *rows;
    int rc = store_read_rows(s, st, sizeof **out, round_row, &rows, n, "rounds", err);
    *out = rows;
    return rc;
}

static void update_row(sqlite3_stmt *st, void *row) {
    StoreUpdate *u = row;
    u->id = sqlite3_column_int64(st, 0);
    u->round_id = sqlite3_column_int64(st, 1);
    u->site_id = sqlite3_column_int64(st, 2);
    store_copy_text(u->site_name, sizeof u->site_name, st, 3);
    store_copy_text(u->codec, sizeof u->codec, st, 4);
    u->raw_bytes = sqlite3_column_int64(st, 5);
    u->wire_bytes = sqlite3_column_int64(st, 6);
    u->tokens = sqlite3_column_int64(st, 7);
    u->train_loss = column_real_or_nan(st, 8);
    u->eval_loss = column_real_or_nan(st, 9);
    u->train_ms = sqlite3_column_int64(st, 10);
    u->upload_ms = sqlite3_column_int64(st, 11);
    store_copy_text(u->state, sizeof u->state, st, 12);
    store_copy_text(u->reason, sizeof u->reason, st, 13);
    u->received_at = sqlite3_column_int64(st, 14);
    u->start_eval_loss = column_real_or_nan(st, 15);
    store_copy_text(u->reason_code, sizeof u->reason_code, st, 16);
    u->steps = sqlite3_column_int64(st, 17);
    u->download_ms = sqlite3_column_int64(st, 18);
    u->decode_ms = sqlite3_column_int64(st, 19);
    u->eval_ms = sqlite3_column_int64(st, 20);
    u->encode_ms = sqlite3_column_int64(st, 21);
    u->staleness = sqlite3_column_int64(st, 22);
}

const char *const store_reason_codes[] = {STORE_REASON_CODES, NULL};

int store_reason_code_valid(const char *code) {
    for (int i = 0; code && store_reason_codes[i]; i++)
        if (strcmp(store_reason_codes[i], code) == 0) return 1;
    return 0;
}

int store_update_reject(Store *s, int64_t update_id, const char *code, const char *reason,
                        char *err) {
    static const char sql[] = "UPDATE updates SET state = 'rejected', reason = ?2, "
                              "reason_code = ?3 WHERE id = ?1 AND state = 'received'";
    assert(store_reason_code_valid(code));
    sqlite3_stmt *st = store_stmt(s, sql, err);
    if (st == NULL) return -1;
    sqlite3_bind_int64(st, 1, update_id);
    sqlite3_bind_text(st, 2, reason, -1, SQLITE_STATIC);
    sqlite3_bind_text(st, 3, code, -1, SQLITE_STATIC);
    return step_done(s, st, err, "cannot mark an update rejected");
}

int store_updates_list(Store *s, int64_t round_id, StoreUpdate **out, size_t *n, char *err) {
    static const char sql[] =
        "SELECT u.id, u.round_id, u.site_id, s.name, u.codec, u.raw_bytes, u.wire_bytes, "
        "u.tokens, u.train_loss, u.eval_loss, u.train_ms, u.upload_ms, u.state, "
        "coalesce(u.reason, ''), u.received_at, u.start_eval_loss, coalesce(u.reason_code, ''), "
        "u.steps, u.download_ms, u.decode_ms, u.eval_ms, u.encode_ms, u.staleness "
        "FROM updates u JOIN sites s ON s.id = u.site_id "
        "WHERE u.round_id = ?1 ORDER BY u.id";
    sqlite3_stmt *st = store_stmt(s, sql, err);
    if (st == NULL) return -1;
    sqlite3_bind_int64(st, 1, round_id);
    void *rows;
    int rc = store_read_rows(s, st, sizeof **out, update_row, &rows, n, "updates", err);
    *out = rows;
    return rc;
}

/* A closing round's update bytes, taken and refused (?1 the round), and
 * the model bytes served in it (?5 on commit, ?4 on failure). */
#define ROUND_BYTES                                                                                \
    "bytes_up = (SELECT coalesce(sum(wire_bytes), 0) FROM updates WHERE round_id = ?1 "            \
    "            AND state <> 'rejected'), "                                                       \
    "bytes_rejected = (SELECT coalesce(sum(wire_bytes), 0) FROM updates WHERE round_id = ?1 "      \
    "                  AND state = 'rejected'), "

/* The median of a loss the round's accepted updates reported (they are
 * reports, not facts: one site's claim cannot move a median far): the
 * middle one, or the mean of the middle two. */
#define MEDIAN_OF(col)                                                                             \
    "(SELECT avg(x) FROM (SELECT " col " AS x FROM updates WHERE round_id = ?1 AND "               \
    "state = 'accepted' AND " col " IS NOT NULL ORDER BY x LIMIT 2 - (SELECT count(*) FROM "       \
    "updates WHERE round_id = ?1 AND state = 'accepted' AND " col " IS NOT NULL) % 2 OFFSET "      \
    "(SELECT (count(*) - 1) / 2 FROM updates WHERE round_id = ?1 AND state = 'accepted' AND " col  \
    " IS NOT NULL)))"

int store_round_refusals_unrecorded(Store *s, int64_t round_id, int64_t n, char *err) {
    static const char sql[] = "UPDATE rounds SET refusals_unrecorded = refusals_unrecorded + ?2 "
                              "WHERE id = ?1";
    if (n <= 0) return 0;
    sqlite3_stmt *st = store_stmt(s, sql, err);
    if (st == NULL) return -1;
    sqlite3_bind_int64(st, 1, round_id);
    sqlite3_bind_int64(st, 2, n);
    return step_done(s, st, err, "cannot count the round's refusals");
}

int store_round_late(Store *s, int64_t round_id, const char *late, char *err) {
    static const char sql[] = "UPDATE rounds SET late = ?2 WHERE id = ?1";
    sqlite3_stmt *st = store_stmt(s, sql, err);
    if (st == NULL) return -1;
    sqlite3_bind_int64(st, 1, round_id);
    sqlite3_bind_text(st, 2, late, -1, SQLITE_STATIC);
    return step_done(s, st, err, "cannot name the round's late sites");
}

int store_round_commit(Store *s, int64_t round_id, const StoreCheckpoint *ckpt, double eval_loss,
                       int64_t bytes_down, int64_t now, char *err) {
    static const char sql_ckpt[] =
        "INSERT INTO checkpoints (round, path, bytes, sha256, created_at, state_path, "
        "state_bytes, state_sha256) "
        "SELECT number, ?2, ?3, ?4, ?5, ?6, ?7, ?8 FROM rounds WHERE id = ?1 "
        "AND state IN ('open', 'aggregating')";
    static const char sql_updates[] = "UPDATE updates SET state = 'accepted' WHERE round_id = ?1 "
                                      "AND state = 'received'";
    static const char sql_round[] =
        "UPDATE rounds SET state = 'committed', closed_at = ?2, checkpoint_id = ?3, "
        "eval_loss = ?4, bytes_down = ?5, dp_noise = ?6, dp_epsilon = ?7, "
        "dp_delta = ?8, dp_mu = ?9, dp_l1 = ?10, "
        "participants = (SELECT count(*) FROM updates WHERE round_id = ?1 AND state = 'accepted'), "
        "tokens = (SELECT coalesce(sum(tokens), 0) FROM updates WHERE round_id = ?1 "
        "          AND state = 'accepted'), "
        "train_loss = " MEDIAN_OF(
            "train_loss") ", "
                          "start_eval_loss = " MEDIAN_OF(
                              "start_eval_loss") ", " ROUND_BYTES
                                                 "dense_bytes = (SELECT coalesce(sum(2 * raw_bytes "
                                                 "* steps), 0) FROM updates "
                                                 "               WHERE round_id = ?1 AND state = "
                                                 "'accepted') "
                                                 "WHERE id = ?1";
    if (store_begin(s, 1, err) != 0) return -1;
    sqlite3_stmt *st = store_stmt(s, sql_ckpt, err);
    if (st == NULL) return store_rollback(s);
    sqlite3_bind_int64(st, 1, round_id);
    sqlite3_bind_text(st, 2, ckpt->path, -1, SQLITE_STATIC);
    sqlite3_bind_int64(st, 3, ckpt->bytes);
    sqlite3_bind_text(st, 4, ckpt->sha256, -1, SQLITE_STATIC);
    sqlite3_bind_int64(st, 5, now);
    if (ckpt->state_path) {
        sqlite3_bind_text(st, 6, ckpt->state_path, -1, SQLITE_STATIC);
        sqlite3_bind_int64(st, 7, ckpt->state_bytes);
        sqlite3_bind_text(st, 8, ckpt->state_sha256, -1, SQLITE_STATIC);
    } else {
        sqlite3_bind_null(st, 6), sqlite3_bind_null(st, 7), sqlite3_bind_null(st, 8);
    }
    if (step_done(s, st, err, "cannot record the checkpoint") != 0) return store_rollback(s);
    if (sqlite3_changes(s->db) == 0) {
        store_rollback(s);
        return err_set(err, "cannot commit round attempt %lld: it is not live",
                       (long long)round_id);
    }
    int64_t ckpt_id = sqlite3_last_insert_rowid(s->db);
    st = store_stmt(s, sql_updates, err);
    if (st == NULL) return store_rollback(s);
    sqlite3_bind_int64(st, 1, round_id);
    if (step_done(s, st, err, "cannot accept the round's updates") != 0) return store_rollback(s);
    st = store_stmt(s, sql_round, err);
    if (st == NULL) return store_rollback(s);
    sqlite3_bind_int64(st, 1, round_id);
    sqlite3_bind_int64(st, 2, now);
    sqlite3_bind_int64(st, 3, ckpt_id);
    bind_real_or_null(st, 4, eval_loss);
    sqlite3_bind_int64(st, 5, bytes_down);
    bind_real_or_null(st, 6, ckpt->dp_noise > 0 ? ckpt->dp_noise : NAN);
    bind_real_or_null(st, 7, ckpt->dp_noise > 0 ? ckpt->dp_epsilon : NAN);
    bind_real_or_null(st, 8, ckpt->dp_noise > 0 ? ckpt->dp_delta : NAN);
    bind_real_or_null(st, 9, ckpt->dp_noise > 0 && ckpt->dp_mu > 0 ? ckpt->dp_mu : NAN);
    bind_real_or_null(st, 10, ckpt->dp_noise > 0 && ckpt->dp_mu > 0 ? ckpt->dp_l1 : NAN);
    if (step_done(s, st, err, "cannot commit the round") != 0) return store_rollback(s);
    return store_commit(s, err);
}

int store_round_fail(Store *s, int64_t round_id, const char *reason, int64_t bytes_down,
                     int64_t now, char *err) {
    static const char sql_updates[] = "UPDATE updates SET state = 'discarded', reason = ?2 "
                                      "WHERE round_id = ?1 AND state = 'received'";
    static const char sql_round[] =
        "UPDATE rounds SET state = 'failed', failed_reason = ?2, closed_at = ?3, " ROUND_BYTES
        "bytes_down = ?4 WHERE id = ?1 AND state IN ('open', 'aggregating')";
    if (store_begin(s, 1, err) != 0) return -1;
    sqlite3_stmt *st = store_stmt(s, sql_round, err);
    if (st == NULL) return store_rollback(s);
    sqlite3_bind_int64(st, 1, round_id);
    sqlite3_bind_text(st, 2, reason, -1, SQLITE_STATIC);
    sqlite3_bind_int64(st, 3, now);
    sqlite3_bind_int64(st, 4, bytes_down);
    if (step_done(s, st, err, "cannot fail the round") != 0) return store_rollback(s);
    if (sqlite3_changes(s->db) == 0) {
        store_rollback(s);
        return err_set(err, "cannot fail round attempt %lld: it is not live", (long long)round_id);
    }
    st = store_stmt(s, sql_updates, err);
    if (st == NULL) return store_rollback(s);
    sqlite3_bind_int64(st, 1, round_id);
    sqlite3_bind_text(st, 2, reason, -1, SQLITE_STATIC);
    if (step_done(s, st, err, "cannot discard the round's updates") != 0) return store_rollback(s);
    return store_commit(s, err);
}

/* ---- events ------------------------------------------------------------ */

int store_event_add(Store *s, const char *actor, const char *action, const char *detail,
                    int64_t now, char *err) {
    static const char sql[] = "INSERT INTO events (at, actor, action, detail) "
                              "VALUES (?1, ?2, ?3, ?4)";
    sqlite3_stmt *st = store_stmt(s, sql, err);
    if (st == NULL) return -1;
    sqlite3_bind_int64(st, 1, now);
    sqlite3_bind_text(st, 2, actor, -1, SQLITE_STATIC);
    sqlite3_bind_text(st, 3, action, -1, SQLITE_STATIC);
    sqlite3_bind_text(st, 4, detail, -1, SQLITE_STATIC);
    return step_done(s, st, err, "cannot record an event");
}

/* ---- counts for store_check -------------------------------------------- */

int store_counts(Store *s, StoreCheck *c, char *err) {
    static const char q_sites[] = "SELECT count(*) FROM sites";
    static const char q_committed[] = "SELECT count(*) FROM rounds WHERE state = 'committed'";
    static const char q_failed[] = "SELECT count(*) FROM rounds WHERE state = 'failed'";
    static const char q_updates[] = "SELECT count(*) FROM updates";
    static const char q_events[] = "SELECT count(*) FROM events";
    static const char q_last[] = "SELECT coalesce(max(number), -1) FROM rounds "
                                 "WHERE state = 'committed'";
    if (query_int(s, q_sites, &c->sites, err) ||
        query_int(s, q_committed, &c->rounds_committed, err) ||
        query_int(s, q_failed, &c->rounds_failed, err) ||
        query_int(s, q_updates, &c->updates, err) || query_int(s, q_events, &c->events, err) ||
        query_int(s, q_last, &c->last_committed, err))
        return -1;
    return 0;
}
