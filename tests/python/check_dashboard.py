"""check_dashboard.py URL DASHBOARD.json

Checks Grafana's dashboard against a running coordinator: every PromQL
query of every panel names only metrics the endpoint at URL declares (its
HELP/TYPE families and its samples, parsed by prometheus_client's reference
parser), and every panel reads the data source the dashboard asks for at
import. Prints one JSON object {"panels", "queries", "metrics", "missing",
"bad_datasource"} and exits 1 when anything is missing or wrong.
"""
import json
import re
import sys
import urllib.request

from prometheus_client.parser import text_string_to_metric_families

# PromQL's words that are not metric names
PROMQL = {
    "sum", "min", "max", "avg", "count", "stddev", "stdvar", "topk", "bottomk", "quantile",
    "count_values", "group", "by", "without", "on", "ignoring", "group_left", "group_right",
    "bool", "and", "or", "unless", "offset", "rate", "irate", "increase", "delta", "idelta",
    "deriv", "time", "vector", "scalar", "abs", "clamp_min", "clamp_max", "avg_over_time",
    "max_over_time", "min_over_time", "sum_over_time", "last_over_time", "changes", "resets",
    "histogram_quantile", "label_replace", "timestamp", "absent", "inf", "nan",
}


def names_in(expr):
    """The metric names a query reads: its identifiers, less label
    matchers ({...}), ranges ([...]), variables ($x), strings and PromQL's
    own words."""
    e = re.sub(r'"(?:[^"\\]|\\.)*"', " ", expr)
    e = re.sub(r"\{[^}]*\}", " ", e)
    e = re.sub(r"\[[^\]]*\]", " ", e)
    e = re.sub(r"\$\{?\w+\}?", " ", e)
    e = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", " ", e)
    words = re.findall(r"[A-Za-z_:][A-Za-z0-9_:]*", e)
    return {w for w in words if w.lower() not in PROMQL}


def main():
    url, path = sys.argv[1], sys.argv[2]
    with urllib.request.urlopen(url, timeout=10) as resp:
        body = resp.read().decode("utf-8")
    declared = set()
    for family in text_string_to_metric_families(body):
        declared.add(family.name)
        declared.update(s.name for s in family.samples)
    # a counter's family drops _total in some parsers: its TYPE line names it
    declared.update(re.findall(r"^# TYPE (\S+)", body, re.M))
    dash = json.load(open(path))
    ds = [i["name"] for i in dash.get("__inputs", []) if i.get("pluginId") == "prometheus"]
    want_uid = "${%s}" % ds[0] if ds else None
    queries, used, missing, bad_ds = 0, set(), set(), []
    for p in dash["panels"]:
        if p.get("datasource", {}).get("uid") != want_uid:
            bad_ds.append(p["title"])
        for t in p.get("targets", []):
            if t.get("datasource", {}).get("uid") != want_uid:
                bad_ds.append(p["title"] + " / " + t.get("refId", "?"))
            queries += 1
            names = names_in(t["expr"])
            if not names:
                missing.add("(no metric in %r)" % t["expr"])
            used |= names
            missing |= {n for n in names if n not in declared}
    out = {"panels": len(dash["panels"]), "queries": queries, "metrics": sorted(used),
           "missing": sorted(missing), "bad_datasource": bad_ds}
    print(json.dumps(out))
    sys.exit(1 if missing or bad_ds or not queries or want_uid is None else 0)


if __name__ == "__main__":
    main()
