#!/usr/bin/env bash
# Run 25: the profile of the jagged decode the server runs at 256 clients (64 prompts over 16 images,
# never profiled before), next to 64 prompts of one image and one click; vit_b bs1 latency table; seed.
set -uo pipefail
cd "$(dirname "$0")/../.."
source scripts/gpu-host/call-prelude.sh
mkdir -p "$out/prof"
timeout 150 "$B/load_tests/maskbench" --arch vit_b --batch 1 --fp32-batch 1 --rows "windows made" \
  --profile "$out/prof" --profile-rows "windows made" --json "$out/bench.json" > "$out/bench.log" 2>&1
grep -E "^vit|click|prompt" "$out/bench.log" | cut -c1-200 >> "$out/perf.log"
grep -E "^===|kernel total" "$out/prof/profiles.txt" >> "$out/perf.log"
t bench
left=$(( ${CALL_LIMIT:-560} - ($(date +%s) - S) ))
timeout $left bash .carry/anchors/run.sh "$out/anchors" quick > /dev/null 2>&1
grep -h RESULT "$out"/anchors/*.txt 2>/dev/null | head -8 | cut -c1-300 >> "$out/perf.log"
t anchors
cp "$out/prof/profiles.txt" "$out/profiles.txt"
(cd "$out" && tar czf /tmp/all.tgz anchors prof bench.json misc.tar.gz 2>/dev/null &&
  rm -rf anchors prof bench.json misc.tar.gz && mv /tmp/all.tgz .)
ls "$out"
