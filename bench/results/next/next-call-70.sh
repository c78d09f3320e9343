#!/usr/bin/env bash
# Run 70 (thirteenth session), any card, ~6 minutes. Run 69 (H200) passed the on-keys kernel's tests
# (ImageToTokenUpdateOnKeys against fp32 and the update on q; the decoder with the knob) but its
# kernel took 0.237 ms against the update on q's 0.180 + the q GEMM's 0.053: no GPU time saved. The
# kernel now makes the positional share of the scores while the residual tile arrives (the copy had
# been waited on first) and keeps no keys in registers across the k-steps. (Written in the thirteenth
# session; no machine started for it after run 69. Its ImageSideKeys test also covers the kernel's
# output pointer hoisted out of its two layout branches.)
# Also new and never run: MASKD_UPDATE_PIPELINED=1, the update on q (both blocks' calls in the shipped
# decoder) by a kernel of two 8-warp halves an SM, each with two residual tiles in flight.
#   1. tests: kernels_fusion_gpu_test's ImageToTokenUpdate tests (on keys against fp32; the pipelined
#      kernel's bits against the tile kernel's) and ImageSideKeys test (the mixed-layout cases, whose
#      ASSERT was fixed again after run 69), model_fast_decoder_gpu_test
#   2. maskbench's decode cases, same binary, profiled, twice: default, MASKD_IMAGE_TO_TOKEN_ON_KEYS=1,
#      MASKD_UPDATE_PIPELINED=1 (the 1-prompt rows take none of them: the drift between runs)
#   3. served vit_b clicks at 256 clients: default, pipelined, on keys; run 69's MASKD_RLE_IN_PLACE pair
#      again if time is left
#   4. the seed's quick set
#   mkdir -p $OUT && OUT=$OUT CALL_LIMIT=480 timeout 500 bash bench/results/next/next-call-70.sh
# (~470 s on an H100 for everything; with less, items drop in this order: the RLE pair, the served
# rows, the second decode round; 280 s keeps the tests, one decode round and the seed)
set -uo pipefail
cd "$(dirname "$0")/../../.."
export BUILD_TARGETS=${BUILD_TARGETS:-"maskd maskload maskctl maskbench kernels_fusion_gpu_test model_fast_decoder_gpu_test"}
source scripts/gpu-host/call-prelude.sh
left() { echo $(( ${CALL_LIMIT:-480} - ($(date +%s) - S) )); }
{ timeout 90 "$B/tests/kernels_fusion_gpu_test" --gtest_filter='*ImageSideKeys*:*ImageToTokenUpdate*'
  timeout 60 "$B/tests/model_fast_decoder_gpu_test"; } > "$out/tests.log" 2>&1
echo "tests rc=$?" >> "$out/perf.log"
grep -E "^\[  (PASSED|FAILED) |^\[ +FAILED |Failure|Expected|Which is|on keys|rel L2 vs fp32" "$out/tests.log" \
  | cut -c1-240 | head -60 >> "$out/perf.log"
t tests
cases() {  # cases TAG [VAR=VALUE]: the vit_b decode cases, profiled
  local d="$out/cases-$1"; mkdir -p "$d"
  env ${2:-MASKD_NONE=0} timeout 70 "$B/load_tests/maskbench" --arch vit_b --batch 1 --fp32-batch 1 --rows "global attention" \
    --decode-cases 256/32,64/16 --profile "$d" --profile-rows "global attention" > "$d/bench.log" 2>&1
  echo "--- decode cases $1 (${2:-default}): rc=$?" >> "$out/perf.log"
  grep -E "decoder shared-image" "$d/bench.log" | cut -c1-200 >> "$out/perf.log"
  grep -hE "^===.*shared-image|ImageToToken|TNN|kernel total" "$d/profiles.txt" 2>/dev/null | grep -v "encoder, batch" \
    | cut -c1-150 >> "$out/perf.log"
  rm -f "$d"/trace-*.json
  t "cases $1"
}
cases off-a
cases on-a MASKD_IMAGE_TO_TOKEN_ON_KEYS=1
cases pipe-a MASKD_UPDATE_PIPELINED=1
[ "$(left)" -gt 130 ] && cases off-b
[ "$(left)" -gt 115 ] && cases on-b MASKD_IMAGE_TO_TOKEN_ON_KEYS=1
[ "$(left)" -gt 100 ] && cases pipe-b MASKD_UPDATE_PIPELINED=1
served() {  # served TAG LEVEL (VARS: env assignments for maskd, space-separated)
  env ${VARS:-MASKD_NONE=0} OUT=$out/served SERVED_TAG=$1 SERVED_DURATION=10 timeout 60 \
    bash scripts/gpu-host/served-bench.sh "vit_b:bf16::interactive:$2" >> "$out/served.log" 2>&1
  echo "--- served $1 (${VARS:-default})" >> "$out/perf.log"
  grep -- "-$1 rc=" "$out/served.log" | cut -c1-230 >> "$out/perf.log"
  t "served $1"
}
[ "$(left)" -gt 150 ] && served off 256
[ "$(left)" -gt 125 ] && VARS="MASKD_UPDATE_PIPELINED=1" served pipelined 256
[ "$(left)" -gt 100 ] && VARS="MASKD_IMAGE_TO_TOKEN_ON_KEYS=1" served on-keys 256
[ "$(left)" -gt 150 ] && served copy-b 256
[ "$(left)" -gt 120 ] && VARS="MASKD_RLE_IN_PLACE=1" served inplace-b 256
grep -h -B1 -A2 "server per call" "$out"/served/maskload-*.log 2>/dev/null | cut -c1-200 >> "$out/perf.log"
if [ "$(left)" -gt 60 ]; then
  timeout $(( $(left) > 90 ? 85 : $(left) - 5 )) bash .carry/anchors/run.sh "$out/anchors" quick > /dev/null 2>&1
  t seed-quick
fi
grep -h RESULT "$out"/anchors/RESULTS.txt 2>/dev/null | head -8 | cut -c1-300 >> "$out/perf.log"
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv >> "$out/perf.log" 2>&1
pack cases-off-a cases-on-a cases-pipe-a cases-off-b cases-on-b cases-pipe-b anchors served served.log tests.log misc.tar.gz
ls "$out"
