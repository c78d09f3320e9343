#!/usr/bin/env bash
# Run 49 (written 2026-12-06, fifth session; any H100/H200; ~4-5 minutes on a fresh machine): the
# start-up after 56514b3 (the weights' digest beside Init, the identity set after Init) and the cost
# table measured only until the cost per image is flat (the larger sizes extrapolated).
#   1. build maskd, maskctl, model_gpu_test only; EngineCuda.IdentityNamesTheStartupNumerics, the
#      fp8 identity test, EngineCuda.EncoderCostTableIsMeasuredUntilFlat
#   2. scripts/gpu-host/cold-start.sh vit_b vit_h: start -> SERVING, the first click, the phases
#      (run 45, H100, before: vit_h SERVING at 5256 ms, digest 0.42 s serial, six sizes replayed
#      for the cost table 0.75 s; expected ~4.2 s)
#   3. the seed's run.sh quick if time is left
#   OUT=$OUT CALL_LIMIT=290 bash bench/results/next/next-call-49.sh   (carry .gpu-debs and .carry with anchors)
set -uo pipefail
cd "$(dirname "$0")/../../.."
export BUILD_TARGETS=${BUILD_TARGETS:-"maskd maskctl model_gpu_test"}
source scripts/gpu-host/call-prelude.sh
left() { echo $(( ${CALL_LIMIT:-290} - ($(date +%s) - S) )); }
timeout 90 "$B/tests/model_gpu_test" --gtest_filter='EngineCuda.Identity*:EngineCuda.Fp8*:EngineCuda.EncoderCostTable*' > "$out/tests.log" 2>&1
grep -E "^\[  (PASSED|FAILED) |^\[ +FAILED |Failure|Expected|Which is" "$out/tests.log" | cut -c1-240 >> "$out/perf.log"
t tests
OUT=$out timeout 110 bash scripts/gpu-host/cold-start.sh vit_b vit_h >> "$out/perf.log" 2>&1
t cold-start
if [ "$(left)" -gt 75 ]; then
  timeout $(( $(left) - 10 )) bash .carry/anchors/run.sh "$out/anchors" quick > /dev/null 2>&1
  grep -h RESULT "$out"/anchors/RESULTS.txt 2>/dev/null | head -8 | cut -c1-300 >> "$out/perf.log"
  t seed
fi
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv >> "$out/perf.log" 2>&1
pack anchors misc.tar.gz
ls "$out"
