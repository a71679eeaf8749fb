"""ε from Google's dp-accounting (PyPI) for the accountant's tests: each
line of stdin is "z1,z2,... rounds delta" (every round draws each noise
multiplier once, full participation); each line out is ε from
RdpAccountant at its default orders."""
import sys

from dp_accounting import dp_event
from dp_accounting.rdp import rdp_privacy_accountant as rdp

for line in sys.stdin:
    zs, rounds, delta = line.split()
    acc = rdp.RdpAccountant()
    for z in zs.split(","):
        acc.compose(dp_event.GaussianDpEvent(float(z)), int(rounds))
    print(repr(float(acc.get_epsilon(float(delta)))))
