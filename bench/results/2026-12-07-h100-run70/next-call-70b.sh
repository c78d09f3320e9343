#!/usr/bin/env bash
# Runs 70 and 71 in one call (fourteenth session: five starts failed before it, so one call must do
# both), ~9 minutes. From next-call-70: the update kernels' GPU tests after a76c9e2 / d1cdef7 (which
# touched the shipped kernel without a GPU) and the first run of MASKD_UPDATE_PIPELINED=1; the decode
# A-B of default / on keys / pipelined. From next-call-71: #12's fp8 row beside bf16 on today's
# encoder, profiled, vit_b and vit_h at bs32. Then served rows if time is left, and the seed.
#   mkdir -p $OUT && OUT=$OUT CALL_LIMIT=560 timeout 580 bash bench/results/next/next-call-70b.sh
set -uo pipefail
cd "$(dirname "$0")/../../.."
export BUILD_TARGETS=${BUILD_TARGETS:-"maskd maskload maskctl maskbench kernels_fusion_gpu_test model_fast_decoder_gpu_test"}
source scripts/gpu-host/call-prelude.sh
export CALL_LIMIT=${CALL_LIMIT:-560}
h200() { nvidia-smi --query-gpu=name --format=csv,noheader | grep -q H200; }
{ timeout 90 "$B/tests/kernels_fusion_gpu_test" --gtest_filter='*ImageSideKeys*:*ImageToTokenUpdate*'
  timeout 60 "$B/tests/model_fast_decoder_gpu_test"; } > "$out/tests.log" 2>&1
echo "tests rc=$?" >> "$out/perf.log"
grep -E "^\[  (PASSED|FAILED) |^\[ +FAILED |Failure|Expected|Which is|on keys|rel L2 vs fp32" "$out/tests.log" \
  | cut -c1-240 | head -60 >> "$out/perf.log"
t tests
export PROFILE_LINES="^===.*shared-image|ImageToToken|TNN|kernel total"
decode_cases off-a 256/32,64/16
decode_cases on-a 256/32,64/16 MASKD_IMAGE_TO_TOKEN_ON_KEYS=1
decode_cases pipe-a 256/32,64/16 MASKD_UPDATE_PIPELINED=1
if [ "$(left)" -gt 250 ]; then
  d="$out/prof-fp8"; mkdir -p "$d"
  timeout $(( $(left) - 110 )) "$B/load_tests/maskbench" --arch vit_b,vit_h --batch 32 --fp32-batch 1 --no-latency \
    --rows "global attention,fp8" --profile "$d" --profile-rows "global attention,fp8" --json "$d/bench.json" \
    > "$d/bench.log" 2> "$d/bench.err"
  echo "--- bf16 and fp8: maskbench rc=$?" >> "$out/perf.log"
  grep -E "^vit|^peak" "$d/bench.log" | cut -c1-220 >> "$out/perf.log"
  grep -hE "^===|kernel total" "$d/profiles.txt" | cut -c1-150 >> "$out/perf.log"
  rm -f "$d"/trace-*.json
  t fp8
fi
[ "$(left)" -gt 130 ] && decode_cases off-b 256/32,64/16
[ "$(left)" -gt 115 ] && decode_cases pipe-b 256/32,64/16 MASKD_UPDATE_PIPELINED=1
[ "$(left)" -gt 130 ] && served off 256
[ "$(left)" -gt 105 ] && VARS="MASKD_UPDATE_PIPELINED=1" served pipelined 256
served_stages
finish cases-off-a cases-on-a cases-pipe-a cases-off-b cases-pipe-b prof-fp8
