"""check_report.py REPORT.html ROUNDS.jsonl SCREENSHOT.png

Checks strait report's page against `strait rounds --json` (ROUNDS.jsonl):
every committed round's global, validation and training loss, bytes up,
down and dense and wall time are points of the page's curves with those values;
the page fetches nothing (no script, no URL). Values are compared to the
six digits the JSON prints. Then renders it in headless
Chromium (STRAIT_CHROMIUM, default chromium) to SCREENSHOT.png and counts
the pixels in the validation curve's colour and the pixels that are not
background, so an empty or broken page fails. Prints one JSON object and
exits 1 on any mismatch.
"""
import json
import os
import re
import subprocess
import sys
from html.parser import HTMLParser

from PIL import Image


class Points(HTMLParser):
    """Every circle's (data-x, data-y, tooltip) by section id and series."""

    def __init__(self):
        super().__init__()
        self.section = self.series = None
        self.points = {}
        self.colors = {}
        self.in_title = False
        self.last = None

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if tag == "section":
            self.section = a.get("id")
        elif tag == "g" and "data-series" in a:
            self.series = a["data-series"]
            self.colors[(self.section, self.series)] = a.get("stroke")
        elif tag == "circle" and self.series is not None:
            self.last = [float(a["data-x"]), float(a["data-y"]), ""]
            self.points.setdefault((self.section, self.series), []).append(self.last)
        elif tag == "title" and self.last is not None:
            self.in_title = True

    def handle_endtag(self, tag):
        if tag == "g":
            self.series = None
        elif tag == "title":
            self.in_title = False
        elif tag == "circle":
            self.last = None

    def handle_data(self, data):
        if self.in_title and self.last is not None:
            self.last[2] += data


def main():
    page_path, rounds_path, shot = sys.argv[1:4]
    page = open(page_path, encoding="utf-8").read()
    bad = []
    if re.search(r"<script|<link|<img|<iframe|https?://|src=", page, re.I):
        bad.append("the page refers to something outside it")
    p = Points()
    p.feed(page)
    rounds = [json.loads(l) for l in open(rounds_path) if l.strip()]
    committed = [r for r in rounds if r["state"] == "committed"]
    checks = [("loss", "global", "start_eval_loss", 1), ("loss", "validation", "eval_loss", 1),
              ("loss", "train", "train_loss", 1), ("bytes", "up", "bytes_up", 1),
              ("bytes", "down", "bytes_down", 1), ("bytes", "dense", "dense_bytes", 1),
              ("time", "wall time", "wall_ms", 1e-3)]
    compared = 0
    for section, series, key, scale in checks:
        got = {x: y for x, y, _ in p.points.get((section, series), [])}
        for r in committed:
            want = r.get(key)
            # unknown, or not on a logarithmic axis: no point
            if want is None or (key in ("start_eval_loss", "bytes_up", "bytes_down",
                                        "dense_bytes") and want <= 0):
                if r["round"] in got:
                    bad.append("%s/%s has a point at round %d for an unknown value"
                               % (section, series, r["round"]))
                continue
            y = got.get(float(r["round"]))
            # strait rounds --json prints six digits
            if y is None or abs(y - want * scale) > 1e-5 * max(1, abs(want * scale)):
                bad.append("%s/%s at round %d: %r, strait rounds says %r"
                           % (section, series, r["round"], y, want * scale))
            compared += 1
    marks = {name: [t for _, _, t in p.points.get(("events", name), [])]
             for name in ("round committed", "update refused", "site revoked")}
    if len(marks["round committed"]) != len(committed):
        bad.append("%d commits marked, %d committed" % (len(marks["round committed"]),
                                                        len(committed)))
    chromium = os.environ.get("STRAIT_CHROMIUM", "chromium")
    run = subprocess.run([chromium, "--headless", "--no-sandbox", "--disable-gpu",
                          "--hide-scrollbars", "--window-size=1000,2600",
                          "--screenshot=" + shot, "file://" + os.path.abspath(page_path)],
                         capture_output=True, text=True, timeout=120)
    if run.returncode != 0 or not os.path.exists(shot):
        bad.append("chromium did not render the page: " + run.stderr[-400:])
        ink = curve = 0
    else:
        img = Image.open(shot).convert("RGB")
        color = p.colors.get(("loss", "validation"), "#d62728").lstrip("#")
        want = tuple(int(color[i:i + 2], 16) for i in (0, 2, 4))
        ink = curve = 0
        for px in img.getdata():
            if min(px) < 200:
                ink += 1
            if all(abs(a - b) <= 24 for a, b in zip(px, want)):
                curve += 1
        if curve < 200:
            bad.append("the validation curve's colour covers %d pixels" % curve)
        if ink < 20000:
            bad.append("the page is nearly empty: %d pixels of ink" % ink)
    print(json.dumps({"compared": compared, "refused": marks["update refused"],
                      "revoked": marks["site revoked"], "ink": ink, "curve": curve,
                      "bad": bad}))
    sys.exit(1 if bad or compared == 0 else 0)


if __name__ == "__main__":
    main()
