#!/usr/bin/env bash
# Run 32: served clicks on the merged main (run 29's decoder, run 30's encoder, the terminate handler):
# c1, c16 and c256 twice (run 30's crash at c256: if it recurs, maskd's log now names the error);
# the seed (quick set), as far as the device time allows.
set -uo pipefail
cd "$(dirname "$0")/../.."
source scripts/gpu-host/call-prelude.sh
OUT=$out/served SERVED_DURATION=8 timeout 170 bash scripts/gpu-host/served-bench.sh \
  vit_b:bf16::interactive:256 vit_b:bf16::interactive:1 vit_b:bf16::interactive:16 vit_b:bf16::interactive:256 \
  > "$out/served.log" 2>&1
tail -5 "$out/served.log" | cut -c1-300 >> "$out/perf.log"
grep -h -B1 -A2 "server per call" "$out"/served/maskload-*.log | cut -c1-200 >> "$out/perf.log"
grep -h "fatal\|terminate" "$out"/served/maskd-*.log | cut -c1-2000 >> "$out/perf.log"
t served
left=$(( ${CALL_LIMIT:-360} - ($(date +%s) - S) ))
timeout $left bash .carry/anchors/run.sh "$out/anchors" quick > /dev/null 2>&1
grep -h RESULT "$out"/anchors/*.txt 2>/dev/null | head -8 | cut -c1-300 >> "$out/perf.log"
t anchors
(cd "$out" && tar czf /tmp/all.tgz served anchors misc.tar.gz 2>/dev/null && rm -rf served anchors misc.tar.gz &&
  mv /tmp/all.tgz .)
ls "$out"
