"""check_metrics.py URL

Fetches a Prometheus endpoint over HTTP and parses the body with the
reference parser of the `prometheus_client` package (PyPI). Prints one JSON
object: {"content_type": ..., "samples": {"name{label=value,...}": value}},
and exits 0; a body that does not parse raises and exits 1.
"""
import json
import sys
import urllib.request

from prometheus_client.parser import text_string_to_metric_families


def main():
    with urllib.request.urlopen(sys.argv[1], timeout=10) as resp:
        ctype = resp.headers.get("Content-Type", "")
        body = resp.read().decode("utf-8")
    samples = {}
    for family in text_string_to_metric_families(body):
        if not family.documentation:
            raise SystemExit("metric %s has no HELP" % family.name)
        for s in family.samples:
            labels = ",".join("%s=%s" % kv for kv in sorted(s.labels.items()))
            samples["%s{%s}" % (s.name, labels)] = s.value
    print(json.dumps({"content_type": ctype, "samples": samples}))


if __name__ == "__main__":
    main()
