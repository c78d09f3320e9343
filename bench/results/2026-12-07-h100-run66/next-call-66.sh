#!/usr/bin/env bash
# Run 66 (twelfth session), any card.
# On an H200: #12's encoder rows (vit_b / vit_h, bs1 and bs32) beside the seed's vit_h bs32 row and
# quick set (vit_h's 1.6x is an H200 target, not measured on one since run 40).
# On an H100 (or time left after the above): where a decoder pass's time goes per image. Runs 63-65
# timed 32 prompts over 32 images at 1.68 ms of decode against 1.06 over one image (~20 us an extra
# image), while run 64's kernel totals differed by only 0.19 ms between 64 prompts over 16 images and
# over one: the profiled decodes with their Chrome traces kept (host-side gaps), and the cases again.
#   mkdir -p $OUT && OUT=$OUT CALL_LIMIT=400 timeout 420 bash bench/results/next/next-call-66.sh
set -uo pipefail
cd "$(dirname "$0")/../../.."
export BUILD_TARGETS=${BUILD_TARGETS:-"maskd maskload maskctl maskbench"}
source scripts/gpu-host/call-prelude.sh
left() { echo $(( ${CALL_LIMIT:-400} - ($(date +%s) - S) )); }
h200() { nvidia-smi --query-gpu=name --format=csv,noheader | grep -q H200; }
if h200 && [ "$(left)" -gt 250 ]; then
  d="$out/prof-default"; mkdir -p "$d"
  timeout 110 "$B/load_tests/maskbench" --arch vit_b,vit_h --batch 1,32 --fp32-batch 1 --no-latency \
    --rows "global attention" --profile "$d" --profile-rows "global attention" --json "$d/bench.json" \
    > "$d/bench.log" 2> "$d/bench.err"
  echo "--- default: maskbench rc=$?" >> "$out/perf.log"
  grep -E "^vit|^peak" "$d/bench.log" | cut -c1-220 >> "$out/perf.log"
  grep -hE "^===|kernel total" "$d/profiles.txt" | cut -c1-150 >> "$out/perf.log"
  rm -f "$d"/trace-*.json
  t default
  [ "$(left)" -gt 150 ] && { bash scripts/gpu-host/seed-row.sh "$out/anchors-vit_h" fast_vit_h_bs32 100 offline --impl fast --model vit_h --batch 32; t seed-vit_h; }
fi
if [ "$(left)" -gt 150 ]; then
  d="$out/prof-cases"; mkdir -p "$d"
  timeout 70 "$B/load_tests/maskbench" --arch vit_b --batch 1 --fp32-batch 1 --rows "global attention" \
    --decode-cases 32/1,32/32,64/16 --profile "$d" --profile-rows "global attention" > "$d/bench.log" 2>&1
  echo "--- decode cases, profiled: rc=$?" >> "$out/perf.log"
  grep -E "decoder shared-image" "$d/bench.log" | cut -c1-200 >> "$out/perf.log"
  grep -hE "^===.*shared-image|kernel total" "$d/profiles.txt" | grep -v "encoder, batch" | cut -c1-150 >> "$out/perf.log"
  rm -f "$d"/trace-*encoder*.json "$d"/trace-*original*.json
  ls "$d" >> "$out/perf.log"
  t cases
fi
if [ "$(left)" -gt 65 ]; then
  timeout $(( $(left) > 90 ? 80 : $(left) - 10 )) bash .carry/anchors/run.sh "$out/anchors" quick > /dev/null 2>&1
  t seed-quick
fi
grep -h RESULT "$out"/anchors/RESULTS.txt "$out"/anchors-vit_h/RESULTS.txt 2>/dev/null | head -8 | cut -c1-300 >> "$out/perf.log"
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv >> "$out/perf.log" 2>&1
pack prof-default prof-cases anchors anchors-vit_h misc.tar.gz
ls "$out"
