#!/usr/bin/env bash
# CPU time per thread group of a running process over an interval, from /proc/<pid>/task/*/{comm,stat}
# (the GPU host has no perf): which pool of a loaded maskd (or maskload) is busy.
#   scripts/gpu-host/thread-cpu.sh PID SECONDS
# A group is a thread name without its "/N" or trailing digits ("postprocess/3" -> "postprocess");
# the table gives each group's threads, CPU seconds in the interval and cores (CPU s / interval).
set -euo pipefail
pid=$1 secs=$2
snap() { for t in /proc/"$pid"/task/*; do
  printf '%s\t%s\t%s\n' "${t##*/}" "$(cat "$t/comm" 2>/dev/null)" "$(cut -d' ' -f14,15 "$t/stat" 2>/dev/null)"
done; }
a=$(snap); sleep "$secs"; b=$(snap)
python3 - "$secs" "$(getconf CLK_TCK)" <<PY
import re, sys
secs, hz = float(sys.argv[1]), float(sys.argv[2])
def parse(text):
    out = {}
    for line in text.splitlines():
        tid, comm, ticks = (line.split("\t") + ["", ""])[:3]
        if ticks.strip():
            u, s = ticks.split()
            out[tid] = (comm, int(u) + int(s))
    return out
a, b = parse("""$a"""), parse("""$b""")
groups = {}
for tid, (comm, t1) in b.items():
    t0 = a.get(tid, (comm, 0))[1]
    g = re.sub(r"(/\d+|\d+)$", "", comm) or comm
    n, cpu = groups.get(g, (0, 0.0))
    groups[g] = (n + 1, cpu + (t1 - t0) / hz)
total = sum(c for _, c in groups.values())
print(f"thread CPU of pid $pid over {secs:.0f} s: {total:.2f} CPU s = {total / secs:.2f} cores")
for g, (n, cpu) in sorted(groups.items(), key=lambda kv: -kv[1][1]):
    if cpu > 0: print(f"  {g:<18} {n:>3} threads {cpu:7.2f} CPU s  {cpu / secs:5.2f} cores")
PY
