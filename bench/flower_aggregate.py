"""flower_aggregate.py — Flower's own aggregation, timed for bench/aggregate.

    python flower_aggregate.py VALUES SITES REPS

Builds SITES clients' results of one fp32 array of VALUES values each (four
distinct arrays taken in turn, small and sign-mixed like a pseudo-gradient,
weights 1, 2, 3 in turn, as bench/aggregate gives Strait) the way a Flower
server receives them, then times, each REPS times in this process:

  FedAvg.aggregate_train   flwr.serverapp's current path: reply Messages
                           whose RecordDict holds an ArrayRecord and the
                           "num-examples" MetricRecord
  aggregate_inplace        the legacy FedAvg's: (ClientProxy, FitRes) pairs
                           whose Parameters are serialized ndarrays
  aggregate_median         FedMedian's, over the deserialized ndarrays
  aggregate_trimmed_avg    FedTrimmedAvg's (proportiontocut 0.1), likewise

One JSON line each: the first repetition's seconds apart, the median of the
others, and the process's peak RSS (inputs_rss_mb: before any ran).
"""

import json
import resource
import statistics
import sys
import time

import numpy as np
from flwr.app import ArrayRecord, Message, MetricRecord, RecordDict
from flwr.common import Code, FitRes, Status, ndarrays_to_parameters
from flwr.server.strategy.aggregate import (aggregate_inplace, aggregate_median,
                                            aggregate_trimmed_avg)
from flwr.serverapp.strategy import FedAvg
from flwr.supercore.task_identity import TaskIdentity


def rss_mb():
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def main():
    n, sites, reps = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
    rng = np.random.default_rng(1)
    distinct = [rng.uniform(-0.01, 0.01, n).astype(np.float32) for _ in range(4)]
    weights = [1 + i % 3 for i in range(sites)]
    # what the server holds once the replies are in: one per distinct
    # array, referenced by every site that sends it (as bench/aggregate's
    # blobs are)
    records = [RecordDict({"arrays": ArrayRecord([x]),
                           "metrics": MetricRecord({"num-examples": 1})}) for x in distinct]
    # the identity a ServerApp's process is given when Flower starts it
    TaskIdentity.run_id, TaskIdentity.task_id, TaskIdentity.node_id = 1, 1, 0
    replies = []
    for i in range(sites):
        content = RecordDict({"arrays": records[i % 4]["arrays"],
                              "metrics": MetricRecord({"num-examples": weights[i]})})
        request = Message(content=RecordDict(), dst_node_id=i + 1, message_type="train")
        replies.append(Message(content, reply_to=request))
    params = [ndarrays_to_parameters([x]) for x in distinct]
    fit = [(None, FitRes(Status(Code.OK, ""), params[i % 4], weights[i], {}))
           for i in range(sites)]
    nd = [([distinct[i % 4]], weights[i]) for i in range(sites)]
    inputs = rss_mb()
    strategy = FedAvg()
    cases = [
        ("flwr FedAvg.aggregate_train", lambda: strategy.aggregate_train(1, replies)),
        ("flwr aggregate_inplace", lambda: aggregate_inplace(fit)),
        ("flwr aggregate_median", lambda: aggregate_median(nd)),
        ("flwr aggregate_trimmed_avg", lambda: aggregate_trimmed_avg(nd, 0.1)),
    ]
    for name, fn in cases:
        times = []
        for _ in range(reps):
            t = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t)
        rest = times[1:] or times
        print(json.dumps({"fn": name, "first_s": times[0], "median_s": statistics.median(rest),
                          "reps": reps, "peak_rss_mb": rss_mb(), "inputs_rss_mb": inputs}),
              flush=True)


if __name__ == "__main__":
    import logging
    logging.disable(logging.INFO)  # aggregate_train logs each call
    main()
