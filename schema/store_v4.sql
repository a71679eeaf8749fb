-- store_v4.sql — migration 4 of the store. A rejected update's reason as a
-- code from a fixed list (coordinator/store.h, STORE_REASON_CODES), stored
-- beside its text, so that monitors count rejections by what happened and
-- a reworded message cannot move them. Rows of older schemas get the code
-- their text implies; what matches nothing is 'malformed'.
ALTER TABLE updates ADD COLUMN reason_code TEXT;
UPDATE updates SET reason_code = CASE
    WHEN reason LIKE '%finite%' THEN 'non_finite'
    WHEN reason LIKE '%parameter table%' OR reason LIKE '%this model has%' THEN 'wrong_model'
    WHEN reason LIKE '%update norm%' THEN 'norm_gate'
    WHEN reason LIKE '%duplicate%' THEN 'duplicate'
    WHEN reason LIKE '%update for round%' THEN 'stale_round'
    WHEN reason LIKE '%has finished%' THEN 'finished'
    WHEN reason LIKE '%metadata%' THEN 'no_metadata'
    WHEN reason LIKE '%weight%' THEN 'bad_weight'
    WHEN reason LIKE '%too many sites%' THEN 'too_many_sites'
    ELSE 'malformed' END
  WHERE state = 'rejected';
