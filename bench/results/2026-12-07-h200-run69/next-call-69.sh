#!/usr/bin/env bash
# Run 69 (thirteenth session; takes in next-call-68, which never got a machine), any card, ~9 minutes.
#   1. tests: kernels_fusion_gpu_test's ImageSideKeys (the mixed-layout cases, which run 67 did not
#      reach) and ImageToTokenUpdate tests (the new on-keys kernel against fp32 and the update on q),
#      model_fast_decoder_gpu_test (the engine's embeddings take the ImageSideKeys launch; the decoder
#      with MASKD_IMAGE_TO_TOKEN_ON_KEYS=1 against fp32), model_gpu_test's GpuPostprocessMatchesCpuMasks
#      (rle_in_place)
#   2. maskbench's decode cases, same binary, off / on MASKD_IMAGE_TO_TOKEN_ON_KEYS=1 (block 1's
#      image->token scores on the prompts' own keys: no q projection), profiled, twice
#   3. served vit_b clicks at 256 clients, A-B-A-B of MASKD_RLE_IN_PLACE=1 against the default; 1 and
#      16 clients with and without it
#   4. on an H200: #12's encoder rows and the seed's vit_h bs32 row; 5. the seed's quick set
#   mkdir -p $OUT && OUT=$OUT CALL_LIMIT=540 timeout 560 bash bench/results/next/next-call-69.sh
set -uo pipefail
cd "$(dirname "$0")/../../.."
export BUILD_TARGETS=${BUILD_TARGETS:-"maskd maskload maskctl maskbench kernels_fusion_gpu_test model_fast_decoder_gpu_test model_gpu_test"}
source scripts/gpu-host/call-prelude.sh
left() { echo $(( ${CALL_LIMIT:-540} - ($(date +%s) - S) )); }
h200() { nvidia-smi --query-gpu=name --format=csv,noheader | grep -q H200; }
{ timeout 60 "$B/tests/kernels_fusion_gpu_test" --gtest_filter='*ImageSideKeys*:*ImageToTokenUpdate*'
  timeout 60 "$B/tests/model_fast_decoder_gpu_test"
  timeout 60 "$B/tests/model_gpu_test" --gtest_filter='*GpuPostprocessMatchesCpuMasks*'; } > "$out/tests.log" 2>&1
echo "tests rc=$?" >> "$out/perf.log"
grep -E "^\[  (PASSED|FAILED) |^\[ +FAILED |Failure|Expected|Which is|worst|on keys|rel L2 vs fp32" "$out/tests.log" \
  | cut -c1-240 | head -60 >> "$out/perf.log"
t tests
cases() {  # cases TAG [VAR=VALUE]: the vit_b decode cases, profiled
  local d="$out/cases-$1"; mkdir -p "$d"
  env ${2:-MASKD_NONE=0} timeout 70 "$B/load_tests/maskbench" --arch vit_b --batch 1 --fp32-batch 1 --rows "global attention" \
    --decode-cases 256/32,64/16 --profile "$d" --profile-rows "global attention" > "$d/bench.log" 2>&1
  echo "--- decode cases $1 (${2:-default}): rc=$?" >> "$out/perf.log"
  grep -E "decoder shared-image" "$d/bench.log" | cut -c1-200 >> "$out/perf.log"
  grep -hE "^===.*shared-image|ImageToToken|kernel total" "$d/profiles.txt" 2>/dev/null | grep -v "encoder, batch" \
    | cut -c1-150 >> "$out/perf.log"
  rm -f "$d"/trace-*.json
  t "cases $1"
}
cases off-a
cases on-a MASKD_IMAGE_TO_TOKEN_ON_KEYS=1
# On an H200 one pair (its encoder and seed vit_h rows need the time), on an H100 two.
h200 || { [ "$(left)" -gt 330 ] && cases off-b; }
h200 || { [ "$(left)" -gt 310 ] && cases on-b MASKD_IMAGE_TO_TOKEN_ON_KEYS=1; }
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
if ! h200; then
  [ "$(left)" -gt 110 ] && served copy-b 256
  [ "$(left)" -gt 110 ] && VARS="MASKD_RLE_IN_PLACE=1" served inplace-b 256
  [ "$(left)" -gt 120 ] && served levels 1 16
  [ "$(left)" -gt 120 ] && VARS="MASKD_RLE_IN_PLACE=1" served levels-inplace 1 16
fi
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
pack cases-off-a cases-on-a cases-off-b cases-on-b prof-default anchors anchors-vit_h served served.log tests.log misc.tar.gz
ls "$out"
