#!/usr/bin/env bash
# Run 23: second samples of the served clicks at 16 and 256 clients and 1 client (run 21's c16 ran
# beside a noisy neighbour: the seed's own click p99 doubled in that call), with the seed.
set -uo pipefail
cd "$(dirname "$0")/../.."
source scripts/gpu-host/call-prelude.sh
OUT=$out/served SERVED_DURATION=8 timeout 90 bash scripts/gpu-host/served-bench.sh \
  vit_b:bf16::interactive:16 vit_b:bf16::interactive:256 vit_b:bf16::interactive:1 > "$out/served.log" 2>&1
tail -4 "$out/served.log" | cut -c1-300 >> "$out/perf.log"
grep -h -B1 -A2 "server per call" "$out"/served/maskload-*.log | cut -c1-200 >> "$out/perf.log"
t served
left=$(( ${CALL_LIMIT:-330} - ($(date +%s) - S) ))
timeout $left bash .carry/anchors/run.sh "$out/anchors" quick > /dev/null 2>&1
grep -h RESULT "$out"/anchors/*.txt 2>/dev/null | head -8 | cut -c1-300 >> "$out/perf.log"
t anchors
(cd "$out" && tar czf /tmp/all.tgz served anchors misc.tar.gz 2>/dev/null && rm -rf served anchors misc.tar.gz && mv /tmp/all.tgz .)
