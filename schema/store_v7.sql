-- store_v7.sql — migration 7 of the store. Where a site's round went: what
-- it says it spent downloading and decoding the model, scoring it on its
-- held-out split, and encoding its update (train_ms beside them; the upload
-- and the wait for the round the coordinator measures itself). Claims,
-- bounded when recorded; compute utilization and goodput are derived from
-- them and the round's wall time (docs/operations.md).
ALTER TABLE updates ADD COLUMN download_ms INTEGER NOT NULL DEFAULT 0 CHECK (download_ms >= 0);
ALTER TABLE updates ADD COLUMN decode_ms INTEGER NOT NULL DEFAULT 0 CHECK (decode_ms >= 0);
ALTER TABLE updates ADD COLUMN eval_ms INTEGER NOT NULL DEFAULT 0 CHECK (eval_ms >= 0);
ALTER TABLE updates ADD COLUMN encode_ms INTEGER NOT NULL DEFAULT 0 CHECK (encode_ms >= 0);
