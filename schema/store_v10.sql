-- store_v10.sql — migration 10 of the store. Checkpoint retention ([store]
-- keep_last, keep_every): a committed round's checkpoint, or the outer
-- optimizer's state file beside it, removed on purpose. The row stays, so
-- the round's model is still named by its size and SHA-256; pruned_at and
-- state_pruned_at say when the file was recorded removed (NULL: kept). A
-- file is removed only after its mark is committed, so the store never
-- names as kept a file that is gone; a file whose mark is committed and that
-- a crash left behind is removed at the next start (store_recover).
ALTER TABLE checkpoints ADD COLUMN pruned_at INTEGER;
ALTER TABLE checkpoints ADD COLUMN state_pruned_at INTEGER;
