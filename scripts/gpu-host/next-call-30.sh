#!/usr/bin/env bash
# Run 30: measurements only, on run 29's decoder (same commits + this script): the vit_b bs32
# encoder row (issue #12's figure, against the seed's bs32 of this call); served clicks at 1 / 16 /
# 256 clients and served batch at 64 clients (issue #13: served vs offline); the seed (quick set).
set -uo pipefail
cd "$(dirname "$0")/../.."
source scripts/gpu-host/call-prelude.sh
timeout 120 "$B/load_tests/maskbench" --arch vit_b --batch 32 --fp32-batch 1 --no-latency \
  --rows "windows made" --memory-account --json "$out/bench.json" > "$out/bench.log" 2>&1
grep -E "^vit|^peak" "$out/bench.log" | cut -c1-200 >> "$out/perf.log"
t bench
OUT=$out/served SERVED_DURATION=8 timeout 200 bash scripts/gpu-host/served-bench.sh \
  vit_b:bf16::interactive:1 vit_b:bf16::interactive:16 vit_b:bf16::interactive:256 vit_b:bf16::batch:64 \
  > "$out/served.log" 2>&1
tail -5 "$out/served.log" | cut -c1-300 >> "$out/perf.log"
grep -h -B1 -A2 "server per call" "$out"/served/maskload-*.log | cut -c1-200 >> "$out/perf.log"
t served
left=$(( ${CALL_LIMIT:-560} - ($(date +%s) - S) ))
timeout $left bash .carry/anchors/run.sh "$out/anchors" quick > /dev/null 2>&1
grep -h RESULT "$out"/anchors/*.txt 2>/dev/null | head -8 | cut -c1-300 >> "$out/perf.log"
t anchors
(cd "$out" && tar czf /tmp/all.tgz served anchors bench.json misc.tar.gz 2>/dev/null &&
  rm -rf served anchors bench.json misc.tar.gz && mv /tmp/all.tgz .)
ls "$out"
