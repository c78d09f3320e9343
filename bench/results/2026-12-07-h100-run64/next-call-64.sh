#!/usr/bin/env bash
# Run 64 (written in the eleventh session, not run there: no machine could be started for the
# session's last ~400 s; any card, ~6 minutes on an H100, ~9 on an H200; with CALL_LIMIT=330 the
# served steps and the seed's quick set fit, the rest not).
#   1. kernels_gpu_test's MaskPostprocess tests after the ballot layout's removal (3611ae8)
#   2. served vit_b clicks at 256 clients, A-B-A-B with the post-processing fan-out (49e401a, the
#      default) against MASKD_POST_FANOUT=0 (a batch's responses built in turn on one thread, as
#      before), 10 s a level; then 1 and 16 clients if time is left
#   2b. the vit_b decoder rows with masks post-processed to 1920 x 1080 (maskbench --post-original:
#      the mask evaluation's general path, a real second resize; only the identity one has been timed)
#   3. on an H200: maskbench's encoder rows (vit_b / vit_h, bs1 and bs32) and the seed's vit_h bs32
#      row (#12's vit_h 1.6x is an H200 target; none lent since run 40)
#   4. the seed's quick set
#   mkdir -p $OUT && OUT=$OUT CALL_LIMIT=540 timeout 560 bash bench/results/next/next-call-64.sh
set -uo pipefail
cd "$(dirname "$0")/../../.."
export BUILD_TARGETS=${BUILD_TARGETS:-"maskd maskload maskctl maskbench kernels_gpu_test"}
source scripts/gpu-host/call-prelude.sh
left() { echo $(( ${CALL_LIMIT:-540} - ($(date +%s) - S) )); }
h200() { nvidia-smi --query-gpu=name --format=csv,noheader | grep -q H200; }
timeout 90 "$B/tests/kernels_gpu_test" --gtest_filter='*MaskPostprocess*' > "$out/tests.log" 2>&1
echo "kernels_gpu_test (MaskPostprocess*) rc=$?" >> "$out/perf.log"
grep -E "^\[  (PASSED|FAILED) |^\[ +FAILED |Failure|Expected|Which is" "$out/tests.log" | cut -c1-240 | head -40 >> "$out/perf.log"
t tests
served() {  # served TAG [VAR=VALUE] LEVEL...: vit_b clicks at the given client counts, 10 s each
  local tag=$1 var=$2; shift 2
  local specs=() c
  for c in "$@"; do specs+=("vit_b:bf16::interactive:$c"); done
  env $var OUT=$out/served SERVED_TAG=$tag SERVED_DURATION=10 timeout 150 bash scripts/gpu-host/served-bench.sh \
    "${specs[@]}" >> "$out/served.log" 2>&1
  echo "--- served $tag ($var)" >> "$out/perf.log"
  grep -- "-$tag rc=" "$out/served.log" | cut -c1-300 >> "$out/perf.log"
  t "served $tag"
}
# Each 256-client level takes ~20 s; the seed's quick set needs ~70 (run first after one pair when
# the call is short: CALL_LIMIT below 300).
[ "$(left)" -gt 110 ] && served fanout-a MASKD_NONE=0 256
[ "$(left)" -gt 90 ] && served serial-a MASKD_POST_FANOUT=0 256
if [ "${CALL_LIMIT:-540}" -lt 300 ] && [ "$(left)" -gt 65 ]; then
  timeout $(( $(left) > 90 ? 80 : $(left) - 10 )) bash .carry/anchors/run.sh "$out/anchors" quick > /dev/null 2>&1
  t seed-quick
fi
[ "$(left)" -gt 120 ] && served fanout-b MASKD_NONE=0 256
[ "$(left)" -gt 100 ] && served serial-b MASKD_POST_FANOUT=0 256
[ "$(left)" -gt 130 ] && served fanout-c MASKD_NONE=0 1 16
grep -h -B1 -A2 "server per call" "$out"/served/maskload-*.log 2>/dev/null | cut -c1-200 >> "$out/perf.log"
if [ "$(left)" -gt 150 ]; then
  d="$out/prof-photo"; mkdir -p "$d"
  timeout 60 "$B/load_tests/maskbench" --arch vit_b --batch 1 --fp32-batch 1 --rows "global attention" \
    --decode-cases 64/16 --post-original 1920x1080 --profile "$d" --profile-rows "global attention" > "$d/bench.log" 2>&1
  echo "--- decoder rows, masks at 1920x1080: rc=$?" >> "$out/perf.log"
  grep -E "decoder shared-image" "$d/bench.log" | cut -c1-260 >> "$out/perf.log"
  grep -hE "^===.*shared-image|MaskEval|kernel total" "$d/profiles.txt" | grep -v "encoder, batch" | cut -c1-150 >> "$out/perf.log"
  rm -f "$d"/trace-*.json
  t photo
fi
if h200 && [ "$(left)" -gt 280 ]; then
  d="$out/prof-default"; mkdir -p "$d"
  timeout 100 "$B/load_tests/maskbench" --arch vit_b,vit_h --batch 1,32 --fp32-batch 1 --no-latency \
    --rows "global attention" --profile "$d" --profile-rows "global attention" --json "$d/bench.json" \
    > "$d/bench.log" 2> "$d/bench.err"
  echo "--- default: maskbench rc=$?" >> "$out/perf.log"
  grep -E "^vit|^peak" "$d/bench.log" | cut -c1-220 >> "$out/perf.log"
  grep -hE "^===|kernel total" "$d/profiles.txt" | cut -c1-150 >> "$out/perf.log"
  rm -f "$d"/trace-*.json
  t default
fi
if h200 && [ "$(left)" -gt 180 ]; then
  bash scripts/gpu-host/seed-row.sh "$out/anchors-vit_h" fast_vit_h_bs32 100 offline --impl fast --model vit_h --batch 32
  t seed-vit_h
fi
if [ ! -s "$out/anchors/RESULTS.txt" ] && [ "$(left)" -gt 65 ]; then
  timeout $(( $(left) > 120 ? 110 : $(left) - 10 )) bash .carry/anchors/run.sh "$out/anchors" quick > /dev/null 2>&1
  t seed-quick
fi
grep -h RESULT "$out"/anchors/RESULTS.txt "$out"/anchors-vit_h/RESULTS.txt 2>/dev/null | head -8 | cut -c1-300 >> "$out/perf.log"
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv >> "$out/perf.log" 2>&1
pack prof-default prof-photo anchors anchors-vit_h served served.log tests.log misc.tar.gz
ls "$out"
