-- store_v12.sql — migration 12 of the store. Distributed differential
-- privacy ([privacy] dp = distributed): a committed round's Skellam noise,
-- its variance a value (dp_mu) and one site's L1 sensitivity (dp_l1), in
-- the integers' units; dp_noise is then √dp_mu over the L2 sensitivity.
-- NULL for central rounds, whose dp_noise alone is their account.
ALTER TABLE rounds ADD COLUMN dp_mu REAL;
ALTER TABLE rounds ADD COLUMN dp_l1 REAL;
