-- store_v6.sql — migration 6 of the store. Refusals are cheap: past its
-- first refusals in a round a site is refused at the header, before its
-- upload is read, and no row is written for it; the round counts those
-- refusals here instead (rows kept per site and round: [limits]
-- refusals_per_round).
ALTER TABLE rounds ADD COLUMN refusals_unrecorded INTEGER NOT NULL DEFAULT 0
  CHECK (refusals_unrecorded >= 0);
