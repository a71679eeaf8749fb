-- store.sql — schema version 1 of the coordinator's SQLite store.
--
-- Applied by coordinator/store.c as migration 1, inside one transaction with
-- `PRAGMA user_version = 1`. A later change to the schema is a new file,
-- schema/store_v2.sql, appended to the migration list in store.c; this file
-- never changes once released, so a database made by any version migrates
-- forward step by step.
--
-- Times are integers: milliseconds since the Unix epoch, UTC.
-- Hashes (token, certificate fingerprint, checkpoint) are lowercase hex of
-- SHA-256, except token hashes, which are the raw 32 bytes.

-- A site of the federation, created when it enrolls.
CREATE TABLE sites (
  id           INTEGER PRIMARY KEY,
  name         TEXT    NOT NULL UNIQUE
               CHECK (length(name) BETWEEN 1 AND 64
                      AND name NOT GLOB '*[^A-Za-z0-9._-]*'),
  state        TEXT    NOT NULL DEFAULT 'active'
               CHECK (state IN ('active', 'revoked')),
  enrolled_at  INTEGER NOT NULL CHECK (enrolled_at >= 0),
  last_seen    INTEGER          CHECK (last_seen >= 0),
  cert_serial  TEXT,            -- the current certificate
  cert_sha256  TEXT    UNIQUE
);

-- One-time enrollment tokens; only SHA-256 of the token is kept.
CREATE TABLE enroll_tokens (
  token_hash  BLOB    PRIMARY KEY CHECK (length(token_hash) = 32),
  site_name   TEXT    NOT NULL,
  created_at  INTEGER NOT NULL CHECK (created_at >= 0),
  expires_at  INTEGER NOT NULL CHECK (expires_at > created_at),
  used_at     INTEGER          CHECK (used_at >= created_at)
);

-- Every certificate the federation CA signed for a site.
CREATE TABLE certificates (
  serial      TEXT    PRIMARY KEY,
  site_id     INTEGER NOT NULL REFERENCES sites (id),
  sha256      TEXT    NOT NULL UNIQUE CHECK (length(sha256) = 64),
  not_before  INTEGER NOT NULL,
  not_after   INTEGER NOT NULL CHECK (not_after > not_before),
  revoked_at  INTEGER
);
CREATE INDEX certificates_site ON certificates (site_id);

-- Checkpoints produced by committed rounds (the file is written, fsynced and
-- renamed into place before its row is committed).
CREATE TABLE checkpoints (
  id          INTEGER PRIMARY KEY,
  round       INTEGER NOT NULL UNIQUE CHECK (round >= 0),
  path        TEXT    NOT NULL,   -- relative to the federation folder
  bytes       INTEGER NOT NULL CHECK (bytes >= 0),
  sha256      TEXT    NOT NULL CHECK (length(sha256) = 64),
  created_at  INTEGER NOT NULL
);

-- One attempt at a round. A round that fails (no quorum, a restart) is
-- reopened as the next attempt of the same number; one attempt per number
-- can be committed, and one round at most is live at a time.
CREATE TABLE rounds (
  id             INTEGER PRIMARY KEY,
  number         INTEGER NOT NULL CHECK (number >= 0),
  attempt        INTEGER NOT NULL DEFAULT 1 CHECK (attempt >= 1),
  state          TEXT    NOT NULL DEFAULT 'open'
                 CHECK (state IN ('open', 'aggregating', 'committed', 'failed')),
  opened_at      INTEGER NOT NULL,
  closed_at      INTEGER,          -- committed or failed
  failed_reason  TEXT,
  participants   INTEGER NOT NULL DEFAULT 0 CHECK (participants >= 0),
  tokens         INTEGER NOT NULL DEFAULT 0 CHECK (tokens >= 0),
  train_loss     REAL,             -- token-weighted mean of the sites' losses
  eval_loss      REAL,
  bytes_up       INTEGER NOT NULL DEFAULT 0 CHECK (bytes_up >= 0),
  bytes_down     INTEGER NOT NULL DEFAULT 0 CHECK (bytes_down >= 0),
  checkpoint_id  INTEGER REFERENCES checkpoints (id),
  UNIQUE (number, attempt),
  CHECK (state <> 'committed' OR (checkpoint_id IS NOT NULL AND closed_at IS NOT NULL)),
  CHECK (state <> 'failed' OR (failed_reason IS NOT NULL AND closed_at IS NOT NULL))
);
CREATE UNIQUE INDEX rounds_one_committed ON rounds (number) WHERE state = 'committed';
CREATE UNIQUE INDEX rounds_one_live ON rounds (state IN ('open', 'aggregating'))
  WHERE state IN ('open', 'aggregating');
CREATE INDEX rounds_state ON rounds (state, number);

-- Every update a site sent, accepted or not. 'received' is an update that
-- passed the gates and is in the round's sum; the round's commit turns it
-- 'accepted', a failed round turns it 'discarded'.
CREATE TABLE updates (
  id           INTEGER PRIMARY KEY,
  round_id     INTEGER NOT NULL REFERENCES rounds (id),
  site_id      INTEGER NOT NULL REFERENCES sites (id),
  codec        TEXT    NOT NULL,
  raw_bytes    INTEGER NOT NULL CHECK (raw_bytes >= 0),
  wire_bytes   INTEGER NOT NULL CHECK (wire_bytes >= 0),
  tokens       INTEGER NOT NULL CHECK (tokens >= 0),
  train_loss   REAL,
  eval_loss    REAL,
  train_ms     INTEGER NOT NULL DEFAULT 0 CHECK (train_ms >= 0),
  upload_ms    INTEGER NOT NULL DEFAULT 0 CHECK (upload_ms >= 0),
  state        TEXT    NOT NULL
               CHECK (state IN ('received', 'accepted', 'rejected', 'discarded')),
  reason       TEXT,
  received_at  INTEGER NOT NULL,
  CHECK (state NOT IN ('rejected', 'discarded') OR reason IS NOT NULL)
);
-- A site has at most one update in a round that counts; refused duplicates
-- are still recorded, as 'rejected'.
CREATE UNIQUE INDEX updates_one_per_site ON updates (round_id, site_id)
  WHERE state IN ('received', 'accepted');
CREATE INDEX updates_round ON updates (round_id);
CREATE INDEX updates_site ON updates (site_id);

-- The audit log: every admin action and every security-relevant event.
CREATE TABLE events (
  id      INTEGER PRIMARY KEY,
  at      INTEGER NOT NULL,
  actor   TEXT    NOT NULL,
  action  TEXT    NOT NULL,
  detail  TEXT
);
CREATE INDEX events_at ON events (at);
