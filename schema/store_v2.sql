-- store_v2.sql — migration 2 of the store (schema/store.sql is migration 1).
-- The outer optimizer's state file beside a round's checkpoint (Nesterov's
-- momentum, Adam's moments) is pinned like the checkpoint itself: its path,
-- size and SHA-256 go into the same committing transaction, so a resume
-- refuses a state file that was lost or altered instead of silently
-- restarting the momentum from zero. NULL: the round has no state file
-- (FedAvg) or was committed before this migration.
ALTER TABLE checkpoints ADD COLUMN state_path TEXT;
ALTER TABLE checkpoints ADD COLUMN state_bytes INTEGER
  CHECK (state_bytes IS NULL OR state_bytes >= 0);
ALTER TABLE checkpoints ADD COLUMN state_sha256 TEXT
  CHECK (state_sha256 IS NULL OR length(state_sha256) = 64);
