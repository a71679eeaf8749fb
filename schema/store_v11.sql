-- store_v11.sql — migration 11 of the store. Differential privacy ([privacy]
-- dp = central): the noise multiplier a committed round's mean was given
-- (NULL: none) and the federation's ε after it, at the δ beside it. A
-- restart sums the rounds' 1/z² for the account, so ε never forgets a
-- round, whatever the settings are changed to.
ALTER TABLE rounds ADD COLUMN dp_noise REAL;
ALTER TABLE rounds ADD COLUMN dp_epsilon REAL;
ALTER TABLE rounds ADD COLUMN dp_delta REAL;
