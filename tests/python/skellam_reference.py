"""References for the accountant's Skellam rounds (tests/unit/test_privacy.c).
Each line of stdin is one question; each line out its answer:

  div MU DELTA ALPHA   the Rényi divergence of order ALPHA between the
                       Skellam distribution of variance MU (two Poissons of
                       mean MU / 2, scipy.stats.skellam) shifted by the
                       integer DELTA and the same unshifted: the exact RDP
                       of the one-dimensional mechanism, summed over its
                       support in log space
  eps DELTA R1,R2,...  dp-accounting's compute_epsilon at the orders
                       2, 3, ..., 63, 128, 256, 512, 1024 (the integer
                       orders of its defaults) for those RDP values
"""
import math
import sys

import numpy as np
from dp_accounting.rdp import rdp_privacy_accountant as rdp
from scipy.special import logsumexp
from scipy.stats import skellam

ORDERS = list(range(2, 64)) + [128, 256, 512, 1024]

for line in sys.stdin:
    f = line.split()
    if f[0] == "div":
        mu, delta, alpha = float(f[1]), int(f[2]), int(f[3])
        half = int(60 * math.sqrt(mu) + 4 * alpha * delta + 100)
        k = np.arange(-half, half + 1)
        lp = skellam.logpmf(k - delta, mu / 2, mu / 2)
        lq = skellam.logpmf(k, mu / 2, mu / 2)
        ok = np.isfinite(lp) & np.isfinite(lq)
        terms = alpha * lp[ok] + (1 - alpha) * lq[ok]
        print(repr(float(logsumexp(terms) / (alpha - 1))))
    elif f[0] == "eps":
        r = [float(v) for v in f[2].split(",")]
        eps, _ = rdp.compute_epsilon(ORDERS, r, float(f[1]))
        print(repr(float(eps)))
    else:
        sys.exit("unknown question: " + line)
