#!/usr/bin/env python3
"""bench/flower_secagg.py — one round of Flower's own SecAgg+, timed (bench/secagg.c's baseline).

    python bench/flower_secagg.py CLIENTS VALUES [--num-shares K] [--threshold T]
                                [--timed-clients M] [--max-weight W] [--seed S]

What runs is Flower's code, not a re-implementation: the server is
flwr.server.workflow.SecAggPlusWorkflow (its four stages: setup, share_keys,
collect_masked_vectors, unmask) called on a LegacyContext with the legacy
FedAvg, and every client is flwr.client.mod.secaggplus_mod wrapping a
"training" function that returns a prepared update. Between them sits an
in-process grid (this file's InProcessGrid: Flower's workflow only calls
grid.send_and_receive) that hands each message to the client's mod in this
process, with no Ray, no SuperLink and no gRPC.

Timing (time.process_time: this process's CPU, every thread):
  client_cpu_s   the mod's CPU for one client over the four stages (mean over
                 clients); the update's own serialization (np.save inside
                 ndarrays_to_parameters, the "training" result) is outside it.
  server_cpu_s   the workflow's CPU less the clients', less this grid's own
                 copying and byte counting, less the strategy's aggregate_fit.
  server_strategy_cpu_s  FedAvg.aggregate_fit as SecAggPlusWorkflow calls it
                 at the end (it hands every result the one unmasked aggregate,
                 so FedAvg deserializes and averages n copies of it): Flower's
                 real cost on this path, reported apart.
Bytes (per client, mean over clients): each message's RecordDict as protobuf
frames it (flwr.common.serde.recorddict_to_proto(...).ByteSize()), or, where
that is missing, the records' payload (bytes and str lengths, 8 per number,
key names). Message metadata, gRPC/HTTP2 framing and Flower's object-store
ids are not counted. bytes_down leaves out the model that the
collect_masked_vectors message carries as FitIns (model_down_bytes_per_client).

--timed-clients M (default: all, or 1 where n full masked vectors would pass
4 GiB): only the first M clients mask the full
update; the others run every stage for real but mask a 1-value update, and
the server is handed, in its place, the full masked bytes of timed client
(i mod M). The server's work is then the same as with n full clients (it adds
n full vectors, regenerates n self masks over the full shape and FedAvg
averages n copies), but the unmasked result is wrong, so it is not checked.
Use it at 124M values: n full masked vectors are n GB held at once.

Prints one JSON line last.
"""

import os

os.environ.setdefault("FLWR_TELEMETRY_ENABLED", "0")

import argparse  # noqa: E402
import importlib  # noqa: E402
import json  # noqa: E402
import logging  # noqa: E402
import random  # noqa: E402
import resource  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402

import numpy as np  # noqa: E402


def _first(*cands, required=True):
    """The first importable 'module:attr' of cands (Flower moves things)."""
    errs = []
    for c in cands:
        mod, _, attr = c.partition(":")
        try:
            m = importlib.import_module(mod)
            return getattr(m, attr) if attr else m
        except (ImportError, AttributeError) as e:
            errs.append(f"{c}: {e}")
    if required:
        raise ImportError("none of: " + "; ".join(errs))
    return None


secaggplus_mod = _first("flwr.client.mod:secaggplus_mod", "flwr.clientapp.mod:secaggplus_mod")
SecAggPlusWorkflow = _first("flwr.server.workflow:SecAggPlusWorkflow")
_sac = "flwr.common.secure_aggregation.secaggplus_constants"
RECORD_KEY_CONFIGS = _first(f"{_sac}:RECORD_KEY_CONFIGS")
SAKey = _first(f"{_sac}:Key")
Stage = _first(f"{_sac}:Stage")
MAIN_CONFIGS_RECORD = _first("flwr.server.workflow.constant:MAIN_CONFIGS_RECORD")
MAIN_PARAMS_RECORD = _first("flwr.server.workflow.constant:MAIN_PARAMS_RECORD")
WorkflowKey = _first("flwr.server.workflow.constant:Key")
LegacyContext = _first("flwr.server.compat.legacy_context:LegacyContext", "flwr.server:LegacyContext")
SimpleClientManager = _first("flwr.server.client_manager:SimpleClientManager")
ClientProxy = _first("flwr.server.client_proxy:ClientProxy")
FedAvg = _first("flwr.server.strategy:FedAvg")
Context = _first("flwr.app:Context", "flwr.common:Context")
Message = _first("flwr.app:Message", "flwr.common:Message")
RecordDict = _first("flwr.app:RecordDict", "flwr.common:RecordDict")
ConfigRecord = _first("flwr.app:ConfigRecord", "flwr.common:ConfigRecord")
Code = _first("flwr.common:Code")
FitRes = _first("flwr.common:FitRes")
Status = _first("flwr.common:Status")
ndarrays_to_parameters = _first("flwr.common:ndarrays_to_parameters")
parameters_to_ndarrays = _first("flwr.common:parameters_to_ndarrays")
compat = _first("flwr.compat.common.recorddict_compat", "flwr.common.recorddict_compat")
recorddict_to_proto = _first("flwr.common.serde:recorddict_to_proto", required=False)
TaskIdentity = _first("flwr.supercore.task_identity:TaskIdentity", required=False)


def strait_like_shares(n):
    """Strait's SecAgg+ graph (privacy/secagg_proto.c): k = 2*ceil(log2 n)
    neighbours (even, at most n - 1), threshold a majority of the k + 1.
    Flower's num_shares counts the client itself: num_shares = k + 1."""
    k = 2
    while k < 64 and (1 << (k // 2)) < n:
        k += 2
    k = min(k, n - 1)
    nb = k + 1
    return nb, nb // 2 + 1


def rd_bytes(rd):
    """A RecordDict's size as protobuf frames it, else its records' payload."""
    if recorddict_to_proto is not None:
        return recorddict_to_proto(rd).ByteSize()
    n = 0
    for recs in (rd.config_records, rd.metric_records):
        for name, rec in recs.items():
            n += len(name)
            for k, v in rec.items():
                n += len(k)
                for x in v if isinstance(v, list) else [v]:
                    if isinstance(x, (bytes, str)):
                        n += len(x)
                    else:
                        n += 1 if isinstance(x, bool) else 8
    for name, rec in rd.array_records.items():
        n += len(name) + sum(len(k) + len(a.data) for k, a in rec.items())
    return n


class _Proxy(ClientProxy):
    """What the legacy FedAvg samples: only node_id is read by the workflow."""

    def __init__(self, node_id):
        super().__init__(str(node_id))
        self.node_id = node_id

    def get_properties(self, *a, **k):
        raise NotImplementedError

    def get_parameters(self, *a, **k):
        raise NotImplementedError

    def fit(self, *a, **k):
        raise NotImplementedError

    def evaluate(self, *a, **k):
        raise NotImplementedError

    def reconnect(self, *a, **k):
        raise NotImplementedError


class TimedFedAvg(FedAvg):
    """The legacy FedAvg, its aggregate_fit timed apart."""

    cpu = 0.0
    calls = 0

    def aggregate_fit(self, server_round, results, failures):
        TimedFedAvg.calls += 1
        t = time.process_time()
        try:
            return super().aggregate_fit(server_round, results, failures)
        finally:
            TimedFedAvg.cpu += time.process_time() - t


STAGES = ("setup", "share_keys", "collect_masked_vectors", "unmask")


class InProcessGrid:
    """The only Grid call SecAggPlusWorkflow makes is send_and_receive: each
    message goes to its client's secaggplus_mod in this process."""

    def __init__(self, node_ids, updates, num_examples, timed):
        self.node_ids = node_ids
        self.index = {nid: i for i, nid in enumerate(node_ids)}
        self.updates = updates  # i -> float32 ndarray (callable: built on demand)
        self.num_examples = num_examples
        self.timed = timed
        self.ctx = {nid: Context(run_id=1, node_id=nid, node_config={}, state=RecordDict(),
                                 run_config={}) for nid in node_ids}
        n = len(node_ids)
        self.client_cpu = {s: [0.0] * n for s in STAGES}
        self.up = {s: [0] * n for s in STAGES}
        self.down = {s: [0] * n for s in STAGES}
        self.model_down = 0
        self.overhead_cpu = 0.0  # this grid's copying and counting, not Flower's
        self.mod_cpu_all = 0.0  # every mod call, the untimed 1-value ones too
        self.masked_cache = {}

    def send_and_receive(self, messages, *, timeout=None):
        del timeout
        t_all = time.process_time()
        mod_cpu = 0.0
        replies = []
        self.masked_cache.clear()  # needed only within the collect stage's call
        # timed clients first, so their masked bytes are there to stand in
        for m in sorted(messages, key=lambda m: self.index[m.metadata.dst_node_id]):
            nid = m.metadata.dst_node_id
            i = self.index[nid]
            stage = m.content.config_records[RECORD_KEY_CONFIGS][SAKey.STAGE]
            # The transport: each client gets its own copy of the config
            # records (the workflow shares one record between messages and the
            # mod pops the stage from it); the FitIns model is not copied, only
            # counted (the mod does not read it).
            content = RecordDict()
            for name, rec in m.content.config_records.items():
                content.config_records[name] = ConfigRecord(dict(rec))
            self.down[stage][i] = rd_bytes(content)
            if m.content.array_records and not self.model_down:
                model = RecordDict()
                for name, rec in m.content.array_records.items():
                    model.array_records[name] = rec
                self.model_down = rd_bytes(model)
            req = Message(content=content, dst_node_id=nid, message_type=m.metadata.message_type,
                          group_id=m.metadata.group_id)
            train = None
            if stage == Stage.COLLECT_MASKED_VECTORS:
                upd = self.updates(i) if i < self.timed else np.zeros(1, np.float32)
                fitres = FitRes(status=Status(code=Code.OK, message="OK"),
                                parameters=ndarrays_to_parameters([upd]),
                                num_examples=self.num_examples, metrics={})
                reply_content = compat.fitres_to_recorddict(fitres, True)
                del upd, fitres

                def train(msg, _ctx, rc=reply_content):
                    return Message(rc, reply_to=msg)

            t = time.process_time()
            reply = secaggplus_mod(req, self.ctx[nid], train)
            dt = time.process_time() - t
            mod_cpu += dt
            if stage != Stage.COLLECT_MASKED_VECTORS or i < self.timed:
                self.client_cpu[stage][i] = dt
            if stage == Stage.COLLECT_MASKED_VECTORS:
                rec = reply.content.config_records[RECORD_KEY_CONFIGS]
                if i < self.timed < len(self.node_ids):
                    self.masked_cache[i] = rec[SAKey.MASKED_PARAMETERS]
                elif i >= self.timed:
                    rec[SAKey.MASKED_PARAMETERS] = self.masked_cache[i % self.timed]
            self.up[stage][i] = rd_bytes(reply.content)
            replies.append(reply)
        self.overhead_cpu += time.process_time() - t_all - mod_cpu
        self.mod_cpu_all += mod_cpu
        return replies


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("clients", type=int)
    ap.add_argument("values", type=int)
    ap.add_argument("--num-shares", type=int, default=None,
                    help="Flower's num_shares (the client and its neighbours); default as Strait's graph")
    ap.add_argument("--threshold", type=int, default=None, help="reconstruction_threshold")
    ap.add_argument("--timed-clients", type=int, default=None)
    ap.add_argument("--max-weight", type=float, default=1000.0)
    ap.add_argument("--seed", type=int, default=1)
    a = ap.parse_args()
    n, d = a.clients, a.values
    if n < 2:
        sys.exit("SecAggPlusWorkflow needs 2 clients at least")
    # default: every client, unless n full int64 masked vectors held at once
    # (as the workflow holds its replies) pass 4 GiB; then one, as
    # bench/secagg.c times its site 0
    auto = n if n * d * 8 <= 4 << 30 else 1
    timed = min(a.timed_clients or auto, n)
    nb, t = strait_like_shares(n)
    num_shares = a.num_shares or nb
    threshold = a.threshold or t
    if num_shares >= n:  # everyone is everyone's neighbour
        num_shares = n if n > 2 else 1.0  # an int num_shares must be > 2
    logging.getLogger("flwr").setLevel(logging.WARNING)
    random.seed(a.seed)  # the workflow's shuffle of the ring
    np.random.seed(a.seed)  # quantize's stochastic rounding
    if TaskIdentity is not None:  # newer Flower stamps every Message with it
        TaskIdentity.run_id, TaskIdentity.node_id, TaskIdentity.task_id = 1, 0, 1

    # Updates: one N(0, 0.01^2) draw scaled per client (distinct updates, one
    # base array in memory); every client weighs max_weight, so the
    # aggregate is their plain mean.
    base = np.random.default_rng(a.seed).normal(0.0, 0.01, d).astype(np.float32)
    scale = [np.float32(1.0 + 0.05 * (i % 20)) for i in range(n)]
    updates = lambda i: base * scale[i]  # noqa: E731

    rng = random.Random(a.seed + 1)
    node_ids = rng.sample(range(1, 1 << 62), n)
    manager = SimpleClientManager()
    for nid in node_ids:
        manager.register(_Proxy(nid))
    strategy = TimedFedAvg(fraction_fit=1.0, fraction_evaluate=0.0, min_fit_clients=n,
                           min_available_clients=n, accept_failures=False)
    base_ctx = Context(run_id=1, node_id=0, node_config={}, state=RecordDict(), run_config={})
    base_ctx.state.array_records[MAIN_PARAMS_RECORD] = compat.parameters_to_arrayrecord(
        ndarrays_to_parameters([np.zeros(d, np.float32)]), True)
    base_ctx.state.config_records[MAIN_CONFIGS_RECORD] = ConfigRecord({WorkflowKey.CURRENT_ROUND: 1})
    context = LegacyContext(base_ctx, strategy=strategy, client_manager=manager)
    grid = InProcessGrid(node_ids, updates, int(a.max_weight), timed)
    workflow = SecAggPlusWorkflow(num_shares, threshold, max_weight=a.max_weight,
                                  clipping_range=8.0, quantization_range=1 << 22,
                                  modulus_range=1 << 32)

    t0 = time.process_time()
    workflow(grid, context)
    total = time.process_time() - t0
    client_sum = sum(sum(v) for v in grid.client_cpu.values())
    collect_sum = sum(grid.client_cpu[Stage.COLLECT_MASKED_VECTORS])
    client_cpu = (client_sum - collect_sum) / n + collect_sum / timed
    # the workflow's CPU less every mod call (the untimed clients' 1-value
    # collect calls included), the grid's own work and the strategy's
    server_cpu = total - grid.mod_cpu_all - grid.overhead_cpu - TimedFedAvg.cpu
    agg_err = None
    if timed == n and MAIN_PARAMS_RECORD in context.state.array_records:
        got = parameters_to_ndarrays(compat.arrayrecord_to_parameters(
            context.state.array_records[MAIN_PARAMS_RECORD], True))
        want = base.astype(np.float64) * float(np.mean(np.array(scale, np.float64)))
        agg_err = float(np.max(np.abs(got[0].astype(np.float64) - want)))
    step = 2 * 8.0 / (1 << 22)
    out = {
        "clients": n,
        "values": d,
        "num_shares": num_shares,
        "threshold": threshold,
        "timed_clients": timed,
        "client_cpu_s": client_cpu,
        "client_cpu_by_stage_s": {
            s: (sum(grid.client_cpu[s]) / (timed if s == Stage.COLLECT_MASKED_VECTORS else n))
            for s in STAGES},
        "server_cpu_s": server_cpu,
        "server_strategy_cpu_s": TimedFedAvg.cpu,
        "bytes_up_per_client": round(sum(sum(v) for v in grid.up.values()) / n),
        "bytes_down_per_client": round(sum(sum(v) for v in grid.down.values()) / n),
        "bytes_up_by_stage": {s: round(sum(grid.up[s]) / n) for s in STAGES},
        "bytes_down_by_stage": {s: round(sum(grid.down[s]) / n) for s in STAGES},
        "model_down_bytes_per_client": grid.model_down,
        "bytes_measure": "protobuf RecordDict" if recorddict_to_proto else "record payload",
        "max_abs_err": agg_err,
        "quantization_step": step,
        # the workflow halts (returns) without raising when a stage fails
        "completed": TimedFedAvg.calls == 1,
        "ok": (TimedFedAvg.calls == 1) and (agg_err is None or bool(agg_err <= 2 * step)),
        "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0,
        "flwr": _flwr_version(),
    }
    print(json.dumps(out), flush=True)
    return 0 if out["ok"] else 1


def _flwr_version():
    try:
        from importlib.metadata import version
        return version("flwr")
    except Exception:  # pylint: disable=broad-except
        return None


if __name__ == "__main__":
    sys.exit(main())
