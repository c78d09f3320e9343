#!/usr/bin/env bash
# Run 43 (2026-12-06, ~4 minutes of device time left): main 2dbcfb9's reordered fused-encoder GPU test
# (its residual check failed in run 42 only because earlier calls had tuned the shapes), the linear
# layer's GPU test, and maskbench bs32 on main. Builds only those three binaries.
#   OUT=$OUT CALL_LIMIT=190 bash bench/results/next/next-call-43.sh
set -uo pipefail
cd "$(dirname "$0")/../../.."
export BUILD_TARGETS="model_fusion_gpu_test kernels_gpu_test maskbench"
source scripts/gpu-host/call-prelude.sh
{
  timeout 40 "$B/tests/model_fusion_gpu_test"
  timeout 40 "$B/tests/kernels_gpu_test" --gtest_filter='*TunedLinear*'
} > "$out/tests.log" 2>&1
grep -E "^\[  (PASSED|FAILED) |^\[ +FAILED |Failure|Expected|Which is|Value of|Actual|rel L2" "$out/tests.log" | cut -c1-240 >> "$out/perf.log"
t tests
left=$(( ${CALL_LIMIT:-190} - ($(date +%s) - S) ))
if [ "$left" -gt 35 ]; then
  timeout $(( left - 5 )) "$B/load_tests/maskbench" --arch vit_b,vit_h --batch 32 --fp32-batch 1 --no-latency \
    --rows "GEMM epilogues" > "$out/bench.log" 2>&1
  grep -E "^vit" "$out/bench.log" | cut -c1-200 >> "$out/perf.log"
  t bench
fi
pack misc.tar.gz
ls "$out"
