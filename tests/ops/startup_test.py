#!/usr/bin/env python3
"""Cold-start milestones (issue #13) of a real CPU maskd on the demo model: GetInfo.startup is
0 for the first mask before any Segment and set after it, every milestone is reached once and they
are non-decreasing in order, each is logged once at INFO, /metrics has maskd_startup_seconds{phase}
with the same values, and `maskctl info` prints them.

usage: startup_test.py MASKD_BINARY MASKCTL_BINARY"""
import os
import re
import subprocess
import sys
import time
import urllib.request

from prometheus_client.parser import text_string_to_metric_families

from checks import Checks
from maskd_run import Maskd, test_png

ORDER = ["main_ms", "listening_ms", "checkpoint_read_ms", "weights_ready_ms", "warmed_up_ms",
         "serving_ms", "first_mask_ms"]
PHASES = ["main", "listening", "checkpoint_read", "weights_ready", "warmed_up", "serving", "first_mask"]


def scrape(port):
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=30) as r:
        text = r.read().decode("utf-8")
    out = {}
    for family in text_string_to_metric_families(text):
        if family.name == "maskd_startup_seconds":
            assert family.type == "gauge", family.type
            for s in family.samples:
                out[s.labels["phase"]] = s.value
    return out


def main():
    maskd, maskctl = sys.argv[1], sys.argv[2]
    check = Checks()

    t_launch = time.time()
    with Maskd(maskd, ["--metrics-listen", "127.0.0.1:0"], want_metrics=True) as m:
        wall_to_serving_ms = (time.time() - t_launch) * 1e3
        before = m.client.info().startup
        vals = [getattr(before, f) for f in ORDER]
        print("before the first Segment:", dict(zip(ORDER, vals)))
        check(before.first_mask_ms == 0, "first_mask_ms is 0 before any Segment")
        check(all(v > 0 for v in vals[:-1]), "every milestone up to SERVING is reached (> 0)")
        check(all(a <= b for a, b in zip(vals[:-1], vals[1:-1])),
              "milestones up to SERVING are non-decreasing in order")
        # The origin is the process's start: SERVING cannot be later than what we saw from outside
        # (plus the 10 ms resolution of the kernel's start time), and is not implausibly early.
        check(before.serving_ms <= wall_to_serving_ms + 20,
              f"serving_ms {before.serving_ms:.1f} <= the launcher's {wall_to_serving_ms:.1f} ms")
        scraped = scrape(m.metrics_port)
        check("first_mask" not in scraped, "no first_mask gauge before the first Segment")
        check(set(scraped) == set(PHASES[:-1]), f"gauges for the reached phases: {sorted(scraped)}")

        time.sleep(0.05)
        r = m.client.segment(test_png(), points=[(40, 30, 1)])
        check(len(r.prompts) == 1, "Segment answered")
        after = m.client.info().startup
        vals2 = [getattr(after, f) for f in ORDER]
        print("after the first Segment:", dict(zip(ORDER, vals2)))
        check(after.first_mask_ms > after.serving_ms, "first_mask_ms > serving_ms after a Segment")
        check(after.first_mask_ms >= before.serving_ms + 50 - 15,
              "first_mask_ms came after our 50 ms pause (not stamped at SERVING)")
        check(vals2[:-1] == vals[:-1], "earlier milestones did not move")
        check(all(a <= b for a, b in zip(vals2, vals2[1:])), "all milestones non-decreasing")

        m.client.segment(test_png(seed=3), points=[(40, 30, 1)])
        check(m.client.info().startup.first_mask_ms == after.first_mask_ms,
              "a second Segment does not move first_mask_ms")
        scraped = scrape(m.metrics_port)
        check(set(scraped) == set(PHASES), f"all phases scraped: {sorted(scraped)}")
        check(all(abs(scraped[p] - getattr(after, f) / 1e3) < 1e-6 for p, f in zip(PHASES, ORDER)),
              "gauge values are GetInfo's milliseconds in seconds")

        env = dict(os.environ, MASKD_SERVER=m.target)
        out = subprocess.run([maskctl, "info"], env=env, capture_output=True, text=True, timeout=60)
        line = next((l for l in out.stdout.splitlines() if l.startswith("startup")), "")
        print("maskctl:", line)
        check(out.returncode == 0 and f"first mask {after.first_mask_ms:.1f}" in line
              and f"SERVING {after.serving_ms:.1f}" in line, "maskctl info prints the milestones")
        code = m.stop()
        check(code == 0, f"maskd exited 0 (got {code})")
        log = "".join(m.log())
    for p in PHASES:
        n = len(re.findall(rf"startup: {p} at [0-9.]+ ms after process start", log))
        check(n == 1, f"'startup: {p}' logged once (got {n})")
    return check.verdict()


if __name__ == "__main__":
    sys.exit(main())
