-- store_v5.sql — migration 5 of the store. Communication counted both
-- ways and apart (docs/communication.md): rounds.bytes_up is now the bytes
-- of updates that were not refused (it held refused ones too), refused
-- bytes go to bytes_rejected, and dense_bytes is what dense data-parallel
-- training would have moved for the round's accepted training: one fp32
-- gradient up and one down per inner step of each accepted update, whose
-- steps updates.steps records. Rounds of older schemas keep dense_bytes 0
-- (their steps were never sent): not measured.
ALTER TABLE updates ADD COLUMN steps INTEGER NOT NULL DEFAULT 0 CHECK (steps >= 0);
ALTER TABLE rounds ADD COLUMN bytes_rejected INTEGER NOT NULL DEFAULT 0
  CHECK (bytes_rejected >= 0);
ALTER TABLE rounds ADD COLUMN dense_bytes INTEGER NOT NULL DEFAULT 0 CHECK (dense_bytes >= 0);
UPDATE rounds SET
  bytes_rejected = (SELECT coalesce(sum(wire_bytes), 0) FROM updates u
                    WHERE u.round_id = rounds.id AND u.state = 'rejected'),
  bytes_up = (SELECT coalesce(sum(wire_bytes), 0) FROM updates u
              WHERE u.round_id = rounds.id AND u.state <> 'rejected')
  WHERE state IN ('committed', 'failed');
