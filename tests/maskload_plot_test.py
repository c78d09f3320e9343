#!/usr/bin/env python3
"""plot_maskload.py on a run with empty seconds (and --sweep on a level with no OK call): the latency
lines must break there (NaN), not join the points on either side of the gap, and the plot must still
be written.

Run by ctest (maskload_plot_test) with MASKD_PYTHON; needs matplotlib (Agg backend, no display).
Usage: maskload_plot_test.py PLOT_SCRIPT
"""
import csv
import importlib.util
import json
import math
import os
import sys
import tempfile

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

HEADER = ("second,start_s,duration_s,calls,errors,images,prompts,images_per_s,prompts_per_s,calls_per_s,"
          "mean_ms,p50_ms,p90_ms,p99_ms,max_ms,response_bytes_per_call,rle_bytes_per_mask,phase").split(",")


def row(second, calls, errors=0, p50=0.0):
    ok = calls - errors
    return {"second": second, "start_s": float(second), "duration_s": 1.0, "calls": calls, "errors": errors,
            "images": 0, "prompts": ok, "images_per_s": 0.0, "prompts_per_s": float(ok),
            "calls_per_s": float(ok), "mean_ms": p50, "p50_ms": p50, "p90_ms": p50 * 1.5,
            "p99_ms": p50 * 2, "max_ms": p50 * 3, "response_bytes_per_call": 100.0 if ok else 0.0,
            "rle_bytes_per_mask": 10.0 if ok else 0.0, "phase": "warmup" if second < 1 else "measure"}


def check_sweep(script):
    """--sweep: one point per level on throughput against latency; a level with no OK call is a gap."""
    def level(c, ok, rate, p50):
        return {"concurrency": c, "stable": ok > 0, "summary": {
            "ok": ok, "calls_per_s": rate, "images_per_s": 0.0,
            "latency": {"p50_ms": p50, "p90_ms": p50 * 1.5, "p99_ms": p50 * 2}}}
    sweep = {"config": {"workload": "interactive"},
             "levels": [level(1, 100, 50.0, 2.0), level(4, 300, 150.0, 3.0), level(16, 0, 0.0, 0.0),
                        level(64, 500, 250.0, 9.0)]}
    failures = []
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "run.sweep.json")
        with open(path, "w") as f:
            json.dump(sweep, f)
        png = os.path.join(tmp, "run.sweep.png")
        spec = importlib.util.spec_from_file_location("plot_maskload_sweep", script)
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
        if mod.main(["plot_maskload.py", "--sweep", path, png]) != 0 or not os.path.getsize(png):
            return ["--sweep: no plot written"]
    ax = plt.figure(plt.get_fignums()[-1]).axes[0]
    lines = {ln.get_label(): ln for ln in ax.get_lines()}
    for name in ("p50", "p90", "p99"):
        if name not in lines:
            failures.append(f"--sweep: no {name} line")
            continue
        xs = [float(x) for x in lines[name].get_xdata()]
        ys = [float(y) for y in lines[name].get_ydata()]
        if xs != [50.0, 150.0, 0.0, 250.0]:
            failures.append(f"--sweep {name}: x is {xs}, expected each level's calls/s")
        if not (math.isnan(ys[2]) and all(not math.isnan(y) for y in ys[:2] + ys[3:])):
            failures.append(f"--sweep {name}: y is {ys}, expected a gap at the level with no OK call")
    return failures


def main(argv):
    script = argv[1]
    # Seconds 2 and 3 complete nothing (a stalled server), second 5 only fails: no latency there.
    rows = [row(0, 10, p50=5), row(1, 12, p50=6), row(2, 0), row(3, 0), row(4, 9, p50=40),
            row(5, 4, errors=4), row(6, 11, p50=7)]
    empty = {2, 3, 5}
    report = {"config": {"workload": "interactive", "mode": "closed-loop", "concurrency": 4, "rate": 0},
              "warmup_end_s": 1.0, "stable": False,
              "windows": [{"start_s": 1.0}, {"start_s": 4.0}],
              "summary": {"images_per_s": 0.0, "prompts_per_s": 10.0,
                          "latency": {"p50_ms": 6.0, "p99_ms": 80.0}}}
    with tempfile.TemporaryDirectory() as tmp:
        timeline = os.path.join(tmp, "run.timeline.csv")
        with open(timeline, "w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=HEADER)
            w.writeheader()
            for r in rows:
                w.writerow(r)
        report_path = os.path.join(tmp, "run.json")
        with open(report_path, "w") as f:
            json.dump(report, f)
        png = os.path.join(tmp, "run.png")

        spec = importlib.util.spec_from_file_location("plot_maskload", script)
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
        rc = mod.main(["plot_maskload.py", timeline, report_path, png])
        if rc != 0:
            print(f"FAIL: plot_maskload.py exited {rc}")
            return 1
        with open(png, "rb") as f:
            if f.read(4)[1:] != b"PNG":
                print("FAIL: no PNG written")
                return 1

    fig = plt.figure(plt.get_fignums()[-1])
    lat = [ax for ax in fig.axes if ax.get_ylabel() == "latency (ms)"]
    if len(lat) != 1:
        print(f"FAIL: expected one latency axis, found {[ax.get_ylabel() for ax in fig.axes]}")
        return 1
    lines = {ln.get_label(): ln for ln in lat[0].get_lines()}
    failures = []
    for name in ("p50", "p90", "p99", "max"):
        if name not in lines:
            failures.append(f"no {name} line (have {sorted(lines)})")
            continue
        xs = [float(x) for x in lines[name].get_xdata()]
        ys = [float(y) for y in lines[name].get_ydata()]
        by_x = dict(zip(xs, ys))
        for second, r in enumerate(rows):
            y = by_x.get(float(second))
            if second in empty:
                # A missing point (no x there) would let matplotlib join its neighbours; a NaN breaks it.
                if y is None or not math.isnan(y):
                    failures.append(f"{name}: second {second} has no completed call but plots {y!r}")
            elif y is None or math.isnan(y) or y <= 0:
                failures.append(f"{name}: second {second} should plot its latency, got {y!r}")
        # The drawn path really breaks: the segment from second 1 to second 4 is not one stroke.
        path = lines[name].get_path()
        segments = [s for s in path.cleaned(simplify=False).iter_segments()]
        moves = sum(1 for _, code in segments if code == path.MOVETO)
        if moves < 3:  # [0,1] | [4] | [6]
            failures.append(f"{name}: the line is drawn in {moves} piece(s), expected 3 (gaps at 2-3 and 5)")
    failures += check_sweep(script)
    for f in failures:
        print("FAIL:", f)
    if not failures:
        print("ok: latency lines break at the empty seconds and at a sweep level with no OK call")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
