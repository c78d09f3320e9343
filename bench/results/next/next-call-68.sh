#!/usr/bin/env bash
# Run 68 (written in the twelfth session, not run there: its device time was spent), any card,
# ~8 minutes on an H100, ~10 on an H200.
#   1. the tests of the twelfth session's untested parts: kernels_fusion_gpu_test's ImageSideKeys
#      (the mixed-layout cases, which run 67 did not reach), model_fast_decoder_gpu_test (the engine's
#      embeddings take the launch), model_gpu_test's GpuPostprocessMatchesCpuMasks (rle_in_place)
#   2. served vit_b clicks at 256 clients, A-B-A-B of MASKD_RLE_IN_PLACE=1 against the default; then
#      1 and 16 clients with it (glibc's heap is already kept: maskd's --malloc-tuning, on by default)
#   3. on an H200: #12's encoder rows and the seed's vit_h bs32 row
#   4. the seed's quick set
#   mkdir -p $OUT && OUT=$OUT CALL_LIMIT=540 timeout 560 bash bench/results/next/next-call-68.sh
set -uo pipefail
cd "$(dirname "$0")/../../.."
export BUILD_TARGETS=${BUILD_TARGETS:-"maskd maskload maskctl maskbench kernels_fusion_gpu_test model_fast_decoder_gpu_test model_gpu_test"}
source scripts/gpu-host/call-prelude.sh
left() { echo $(( ${CALL_LIMIT:-540} - ($(date +%s) - S) )); }
h200() { nvidia-smi --query-gpu=name --format=csv,noheader | grep -q H200; }
{ timeout 40 "$B/tests/kernels_fusion_gpu_test" --gtest_filter='*ImageSideKeys*'
  timeout 60 "$B/tests/model_fast_decoder_gpu_test"
  timeout 60 "$B/tests/model_gpu_test" --gtest_filter='*GpuPostprocessMatchesCpuMasks*'; } > "$out/tests.log" 2>&1
echo "tests rc=$?" >> "$out/perf.log"
grep -E "^\[  (PASSED|FAILED) |^\[ +FAILED |Failure|Expected|Which is|worst" "$out/tests.log" | cut -c1-240 | head -40 >> "$out/perf.log"
t tests
served() {  # served TAG LEVELS... (VARS: env assignments for maskd, space-separated)
  local tag=$1; shift
  local specs=() c
  for c in "$@"; do specs+=("vit_b:bf16::interactive:$c"); done
  env ${VARS:-MASKD_NONE=0} OUT=$out/served SERVED_TAG=$tag SERVED_DURATION=10 timeout 150 \
    bash scripts/gpu-host/served-bench.sh "${specs[@]}" >> "$out/served.log" 2>&1
  echo "--- served $tag (${VARS:-default})" >> "$out/perf.log"
  grep -- "-$tag rc=" "$out/served.log" | cut -c1-230 >> "$out/perf.log"
  t "served $tag"
}
[ "$(left)" -gt 110 ] && served copy-a 256
[ "$(left)" -gt 110 ] && VARS="MASKD_RLE_IN_PLACE=1" served inplace-a 256
[ "$(left)" -gt 110 ] && served copy-b 256
[ "$(left)" -gt 110 ] && VARS="MASKD_RLE_IN_PLACE=1" served inplace-b 256
[ "$(left)" -gt 120 ] && served levels 1 16
[ "$(left)" -gt 120 ] && VARS="MASKD_RLE_IN_PLACE=1" served levels-inplace 1 16
grep -h -B1 -A2 "server per call" "$out"/served/maskload-*.log 2>/dev/null | cut -c1-200 >> "$out/perf.log"
if h200 && [ "$(left)" -gt 260 ]; then
  d="$out/prof-default"; mkdir -p "$d"
  timeout 110 "$B/load_tests/maskbench" --arch vit_b,vit_h --batch 1,32 --fp32-batch 1 --no-latency \
    --rows "global attention" --profile "$d" --profile-rows "global attention" --json "$d/bench.json" \
    > "$d/bench.log" 2> "$d/bench.err"
  echo "--- default: maskbench rc=$?" >> "$out/perf.log"
  grep -E "^vit|^peak" "$d/bench.log" | cut -c1-220 >> "$out/perf.log"
  grep -hE "^===|kernel total" "$d/profiles.txt" | cut -c1-150 >> "$out/perf.log"
  rm -f "$d"/trace-*.json
  t default
  [ "$(left)" -gt 160 ] && { bash scripts/gpu-host/seed-row.sh "$out/anchors-vit_h" fast_vit_h_bs32 100 offline --impl fast --model vit_h --batch 32; t seed-vit_h; }
fi
if [ "$(left)" -gt 70 ]; then
  timeout $(( $(left) > 95 ? 85 : $(left) - 5 )) bash .carry/anchors/run.sh "$out/anchors" quick > /dev/null 2>&1
  t seed-quick
fi
grep -h RESULT "$out"/anchors/RESULTS.txt "$out"/anchors-vit_h/RESULTS.txt 2>/dev/null | head -8 | cut -c1-300 >> "$out/perf.log"
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv >> "$out/perf.log" 2>&1
pack prof-default anchors anchors-vit_h served served.log tests.log misc.tar.gz
ls "$out"
