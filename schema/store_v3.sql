-- store_v3.sql — migration 3 of the store. The loss of the global model a
-- round starts from, as the sites measure it on their held-out splits
-- before training (an update's start_eval_loss), and its token-weighted
-- mean per round, derived at commit like the other totals. The rounds'
-- eval_loss stays what it was: the sites' local models after their steps.
-- NULL: not measured (a site without a held-out split, or an older site).
ALTER TABLE updates ADD COLUMN start_eval_loss REAL;
ALTER TABLE rounds ADD COLUMN start_eval_loss REAL;
