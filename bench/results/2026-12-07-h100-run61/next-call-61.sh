#!/usr/bin/env bash
# Run 61 (tenth session; any card; ~5 minutes fresh on an H100). The absorbed token->image attentions
# are now the default from 8 prompts a pass (run 60's crossover). This call:
#   1. the decoder's GPU tests with the new default, CUDA graphs included (model_fast_decoder_gpu_test,
#      model_gpu_test's engine tests, the absorbed kernel's test)
#   2. the decoder rows as shipped (maskbench, + 8 / 16 prompts), unprofiled
#   3. #13's served clicks (vit_b, 1 / 16 / 256 clients, 10 s a level)
#   4. the seed's quick set (the same-call comparison)
#   mkdir -p $OUT && OUT=$OUT CALL_LIMIT=480 timeout 500 bash bench/results/next/next-call-61.sh
set -uo pipefail
cd "$(dirname "$0")/../../.."
export BUILD_TARGETS=${BUILD_TARGETS:-"maskd maskload maskctl maskbench model_fast_decoder_gpu_test model_gpu_test kernels_fusion_gpu_test"}
source scripts/gpu-host/call-prelude.sh
left() { echo $(( ${CALL_LIMIT:-480} - ($(date +%s) - S) )); }
timeout 120 "$B/tests/model_fast_decoder_gpu_test" > "$out/tests.log" 2>&1
echo "model_fast_decoder_gpu_test (all) rc=$?" >> "$out/perf.log"
timeout 40 "$B/tests/kernels_fusion_gpu_test" --gtest_filter='*Absorbed*' >> "$out/tests.log" 2>&1
echo "kernels_fusion_gpu_test (AbsorbedAttention) rc=$?" >> "$out/perf.log"
timeout $(( $(left) > 200 ? 120 : 60 )) "$B/tests/model_gpu_test" --gtest_filter='EngineCuda.*' >> "$out/tests.log" 2>&1
echo "model_gpu_test (EngineCuda.*) rc=$?" >> "$out/perf.log"
grep -E "^\[  (PASSED|FAILED) |^\[ +FAILED |Failure|Expected|Which is|rel L2|absorbed" "$out/tests.log" | cut -c1-240 | head -60 >> "$out/perf.log"
t tests
if [ "$(left)" -gt 60 ]; then
  timeout 60 "$B/load_tests/maskbench" --arch vit_b --batch 1 --fp32-batch 1 --rows "global attention" \
    --decode-cases 8/1,16/1 > "$out/bench-decoder.log" 2>&1
  echo "--- decoder rows (defaults): rc=$?" >> "$out/perf.log"
  grep -E "decoder shared-image" "$out/bench-decoder.log" | cut -c1-250 >> "$out/perf.log"
  t decoder
fi
if [ "$(left)" -gt 70 ]; then
  OUT=$out/served SERVED_DURATION=10 timeout $(( $(left) - 10 )) bash scripts/gpu-host/served-bench.sh \
    vit_b:bf16::interactive:1 vit_b:bf16::interactive:16 vit_b:bf16::interactive:256 > "$out/served.log" 2>&1
  grep -E "rc=" "$out/served.log" | cut -c1-300 >> "$out/perf.log"
  grep -h -B1 -A2 "server per call" "$out"/served/maskload-*.log 2>/dev/null | cut -c1-200 >> "$out/perf.log"
  t served
fi
if [ "$(left)" -gt 65 ]; then
  timeout $(( $(left) > 120 ? 110 : $(left) - 10 )) bash .carry/anchors/run.sh "$out/anchors" quick > /dev/null 2>&1
  t seed-quick
fi
grep -h RESULT "$out"/anchors/RESULTS.txt 2>/dev/null | head -8 | cut -c1-300 >> "$out/perf.log"
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv >> "$out/perf.log" 2>&1
pack bench-decoder.log anchors served served.log tests.log misc.tar.gz
ls "$out"
