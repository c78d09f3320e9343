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
{ timeout 90 "$B/tests/kernels_fusion_gpu_test" --gtest_filter='*ImageSideKeys*:*ImageToTokenUpdate*'
  timeout 60 "$B/tests/model_fast_decoder_gpu_test"; } > "$out/tests.log" 2>&1
echo "tests rc=$?" >> "$out/perf.log"
grep -E "^\[  (PASSED|FAILED) |^\[ +FAILED |Failure|Expected|Which is|on keys|rel L2 vs fp32" "$out/tests.log" \
  | cut -c1-240 | head -60 >> "$out/perf.log"
t tests
export CALL_LIMIT=${CALL_LIMIT:-480}
export PROFILE_LINES="^===.*shared-image|ImageToToken|TNN|kernel total"
decode_cases off-a 256/32,64/16
decode_cases on-a 256/32,64/16 MASKD_IMAGE_TO_TOKEN_ON_KEYS=1
decode_cases pipe-a 256/32,64/16 MASKD_UPDATE_PIPELINED=1
[ "$(left)" -gt 130 ] && decode_cases off-b 256/32,64/16
[ "$(left)" -gt 115 ] && decode_cases on-b 256/32,64/16 MASKD_IMAGE_TO_TOKEN_ON_KEYS=1
[ "$(left)" -gt 100 ] && decode_cases pipe-b 256/32,64/16 MASKD_UPDATE_PIPELINED=1
[ "$(left)" -gt 150 ] && served off 256
[ "$(left)" -gt 125 ] && VARS="MASKD_UPDATE_PIPELINED=1" served pipelined 256
[ "$(left)" -gt 100 ] && VARS="MASKD_IMAGE_TO_TOKEN_ON_KEYS=1" served on-keys 256
[ "$(left)" -gt 150 ] && served copy-b 256
[ "$(left)" -gt 120 ] && VARS="MASKD_RLE_IN_PLACE=1" served inplace-b 256
served_stages
finish cases-off-a cases-on-a cases-pipe-a cases-off-b cases-on-b cases-pipe-b
