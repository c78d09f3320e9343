#!/usr/bin/env bash
# Run 22: cold start with maskctl no longer loading LibTorch (its first click is the server's and the
# network's time), the served batch against the offline encoder in the same call, one more served
# click sample, the seed.
#   carry .gpu-debs and .carry, then run:  bash scripts/gpu-host/next-call-3.sh
set -uo pipefail
cd "$(dirname "$0")/../.."
source scripts/gpu-host/call-prelude.sh
OUT=$out timeout 90 bash scripts/gpu-host/cold-start.sh vit_b vit_h >> "$out/perf.log" 2>&1
t cold
timeout 90 "$B/load_tests/maskbench" --arch vit_b --batch 32 --fp32-batch 1 --rows "windows made" --no-latency \
  --json "$out/bench.json" > "$out/bench.log" 2>&1
grep -E "^vit" "$out/bench.log" | cut -c1-200 >> "$out/perf.log"
t bench
OUT=$out/served SERVED_DURATION=8 timeout 100 bash scripts/gpu-host/served-bench.sh \
  vit_b:bf16::batch:64 vit_b:bf16::interactive:1 > "$out/served.log" 2>&1
tail -3 "$out/served.log" | cut -c1-300 >> "$out/perf.log"
grep -h -B1 -A2 "server per call" "$out"/served/maskload-*.log | cut -c1-200 >> "$out/perf.log"
t served
left=$(( 560 - ($(date +%s) - S) ))
timeout $left bash .carry/anchors/run.sh "$out/anchors" quick > /dev/null 2>&1
grep -h RESULT "$out"/anchors/*.txt 2>/dev/null | head -8 | cut -c1-300 >> "$out/perf.log"
t anchors
(cd "$out" && tar czf /tmp/all.tgz served anchors bench.json cold-*.log misc.tar.gz 2>/dev/null &&
  rm -rf served anchors bench.json cold-*.log misc.tar.gz && mv /tmp/all.tgz .)
ls "$out"
