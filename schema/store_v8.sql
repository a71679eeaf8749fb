-- store_v8.sql — migration 8 of the store. Asynchronous rounds ([rounds]
-- mode = async) take updates trained from a model up to `staleness` rounds
-- before the round they join: how many rounds back each one was trained
-- (0: from the round's own model, as every update of a sync round is). An
-- update is weighted by tokens / sqrt(1 + staleness).
ALTER TABLE updates ADD COLUMN staleness INTEGER NOT NULL DEFAULT 0 CHECK (staleness >= 0);
