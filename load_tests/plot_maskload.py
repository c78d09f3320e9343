#!/usr/bin/env python3
"""Plot a maskload run: throughput and latency percentiles per second.

Usage: plot_maskload.py RUN.timeline.csv RUN.json OUT.png
       plot_maskload.py --sweep RUN.sweep.json OUT.png

maskload runs this itself after a run with --out (unless --no-plot), and with --sweep after a
concurrency sweep (-c 1,4,16,...): throughput against the latency percentiles, one point per level;
it can also be run by hand on the files of an earlier run. Needs matplotlib
(client/python/requirements.txt).
"""
import csv
import json
import sys

import matplotlib

matplotlib.use("Agg")  # files only, no display
import matplotlib.pyplot as plt  # noqa: E402


def plot_sweep(sweep_path, out_path):
    with open(sweep_path) as f:
        sweep = json.load(f)
    levels = sweep.get("levels", [])
    if not levels:
        print(f"{sweep_path}: no levels to plot", file=sys.stderr)
        return 1
    batch = sweep["config"]["workload"] == "batch"
    rate_key = "images_per_s" if batch else "calls_per_s"
    xs = [float(lv["summary"][rate_key]) for lv in levels]
    fig, ax = plt.subplots(figsize=(9, 6))
    for key, colour in (("p50_ms", "tab:green"), ("p90_ms", "tab:olive"), ("p99_ms", "tab:red")):
        # A level with no completed call has no latency: a gap, not a point at zero.
        ys = [float(lv["summary"]["latency"][key]) if int(lv["summary"]["ok"]) > 0 else float("nan")
              for lv in levels]
        ax.plot(xs, ys, "o-", markersize=4, label=key.replace("_ms", ""), color=colour)
    for lv, x in zip(levels, xs):
        y = float(lv["summary"]["latency"]["p99_ms"])
        level = f"{lv['rate']:g}/s" if sweep.get("sweep") == "rate" else f"c{lv['concurrency']}"
        label = level + ("" if lv.get("stable") else " (not stable)")
        ax.annotate(label, (x, y), textcoords="offset points", xytext=(4, 4), fontsize=8)
    ax.set_xlabel("images/s" if batch else "calls/s")
    ax.set_ylabel("latency (ms)")
    ax.grid(True, alpha=0.3)
    ax.legend(loc="upper left")
    cfg = sweep["config"]
    kind = "open-loop rate" if sweep.get("sweep") == "rate" else "concurrency"
    ax.set_title(f"maskload {cfg['workload']} {kind} sweep: throughput against latency", fontsize=9)
    fig.tight_layout()
    fig.savefig(out_path, dpi=110)
    return 0


def main(argv):
    if len(argv) == 4 and argv[1] == "--sweep":
        return plot_sweep(argv[2], argv[3])
    if len(argv) != 4:
        print(__doc__, file=sys.stderr)
        return 2
    timeline_path, report_path, out_path = argv[1:]
    with open(timeline_path, newline="") as f:
        rows = list(csv.DictReader(f))
    with open(report_path) as f:
        report = json.load(f)
    if not rows:
        print(f"{timeline_path}: no rows to plot", file=sys.stderr)
        return 1

    t = [float(r["start_s"]) for r in rows]
    cfg = report["config"]
    batch = cfg["workload"] == "batch"

    fig, (ax_rate, ax_lat) = plt.subplots(2, 1, figsize=(10, 7), sharex=True)
    if batch:
        ax_rate.plot(t, [float(r["images_per_s"]) for r in rows], ".-", label="images/s", color="tab:blue")
    else:
        ax_rate.plot(t, [float(r["calls_per_s"]) for r in rows], ".-", label="calls/s", color="tab:blue")
    ax_prompts = ax_rate.twinx()
    ax_prompts.plot(t, [float(r["prompts_per_s"]) for r in rows], label="prompts/s", color="tab:orange",
                    alpha=0.8)
    ax_prompts.set_ylabel("prompts/s")
    errors = [int(r["errors"]) for r in rows]
    if any(errors):
        ax_rate.bar(t, errors, width=0.8, align="edge", color="tab:red", alpha=0.4, label="errors")
    ax_rate.set_ylabel("images/s" if batch else "calls/s")
    lines = ax_rate.get_legend_handles_labels()
    lines2 = ax_prompts.get_legend_handles_labels()
    ax_rate.legend(lines[0] + lines2[0], lines[1] + lines2[1], loc="lower right")

    for key, colour in (("p50_ms", "tab:green"), ("p90_ms", "tab:olive"), ("p99_ms", "tab:red"),
                        ("max_ms", "tab:gray")):
        # Seconds with no completed call have no latency: leave a gap rather than draw a zero.
        ys = [float(r[key]) if int(r["calls"]) - int(r["errors"]) > 0 else float("nan") for r in rows]
        ax_lat.plot(t, ys, ".-", markersize=4, label=key.replace("_ms", ""), color=colour)
    ax_lat.set_ylabel("latency (ms)")
    ax_lat.set_xlabel("time since start (s)")
    ax_lat.legend(loc="upper right")

    warmup_end = float(report.get("warmup_end_s", 0))
    for ax in (ax_rate, ax_lat):
        if warmup_end > 0:
            ax.axvspan(0, warmup_end, color="0.9", zorder=0)
        for w in report.get("windows", []):
            ax.axvline(float(w["start_s"]), color="0.75", linewidth=0.8, zorder=0)
        ax.grid(True, alpha=0.3)

    s = report["summary"]
    mode = (f"{cfg['rate']:g} calls/s open loop" if cfg["mode"] == "open-loop"
            else f"{cfg['concurrency']} clients")
    server = report.get("server_after", {})
    model = server.get("model", {}).get("arch", "?")
    title = (f"maskload {cfg['workload']}, {mode}, model {model} — "
             f"{s['images_per_s']:.2f} img/s, {s['prompts_per_s']:.1f} prompts/s, "
             f"p50 {s['latency']['p50_ms']:.1f} / p99 {s['latency']['p99_ms']:.1f} ms "
             f"({'stable' if report['stable'] else 'not stable'}; grey = warm-up)")
    fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    fig.savefig(out_path, dpi=110)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
