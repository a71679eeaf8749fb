-- store_v9.sql — migration 9 of the store. The sites a round attempt
-- stopped waiting for because they were late (past the quorum's usual
-- arrival and a quarter again, or sooner their own and half again), one a
-- line, each with the time it was due by: a site that sets the pace is
-- named in `strait rounds`, round after round.
ALTER TABLE rounds ADD COLUMN late TEXT NOT NULL DEFAULT '';
