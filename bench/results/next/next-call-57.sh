#!/usr/bin/env bash
# Run 57 (written 2026-12-06, seventh session; any card; ~4 minutes fresh): next-call-56 cut to what
# 390 s of device time allow (run 56's machine was taken back mid-call): the fold kernel's GPU test,
# the engine test of the folded way in the graphs, maskbench's default row (the global attention timed
# per batch size, its table in bench.err) at vit_b / vit_h bs1 and bs32, profiled, then the seed's
# quick set if time is left.
#   mkdir -p $OUT && OUT=$OUT CALL_LIMIT=250 timeout 265 bash bench/results/next/next-call-57.sh
set -uo pipefail
cd "$(dirname "$0")/../../.."
export BUILD_TARGETS=${BUILD_TARGETS:-"maskbench model_gpu_test kernels_fusion_gpu_test"}
source scripts/gpu-host/call-prelude.sh
left() { echo $(( ${CALL_LIMIT:-250} - ($(date +%s) - S) )); }
timeout 40 "$B/tests/kernels_fusion_gpu_test" --gtest_filter='*Fold*:*RelPos*' > "$out/tests.log" 2>&1
echo "kernels_fusion_gpu_test rc=$?" >> "$out/perf.log"
timeout 50 "$B/tests/model_gpu_test" --gtest_filter='*GlobalAttention*' >> "$out/tests.log" 2>&1
echo "model_gpu_test rc=$?" >> "$out/perf.log"
grep -E "^\[  (PASSED|FAILED) |^\[ +FAILED |Failure|Expected|Which is|rel L2" "$out/tests.log" | cut -c1-240 >> "$out/perf.log"
t tests
mkdir -p "$out/prof"
timeout $(( $(left) > 140 ? 100 : $(left) - 30 )) "$B/load_tests/maskbench" --arch vit_b,vit_h --batch 1,32 --fp32-batch 1 \
  --no-latency --rows "global attention" --profile "$out/prof" --profile-rows "global attention" \
  --json "$out/bench.json" > "$out/bench.log" 2> "$out/bench.err"
echo "maskbench rc=$?" >> "$out/perf.log"
grep -E "^vit|^peak" "$out/bench.log" | cut -c1-200 >> "$out/perf.log"
grep -E "global attention per block" "$out/bench.err" | cut -c1-400 >> "$out/perf.log"
grep -hE "^===|kernel total|^attention  |^copy  |FoldRelPos|cudnn" "$out/prof/profiles.txt" | cut -c1-150 >> "$out/perf.log"
t bench
if [ "$(left)" -gt 55 ]; then
  timeout $(( $(left) - 8 )) bash .carry/anchors/run.sh "$out/anchors" quick > /dev/null 2>&1
  grep -h RESULT "$out"/anchors/RESULTS.txt 2>/dev/null | head -8 | cut -c1-300 >> "$out/perf.log"
  t seed-quick
fi
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv >> "$out/perf.log" 2>&1
rm -f "$out"/prof/trace-*.json
cp "$out/prof/profiles.txt" "$out/profiles-encoder.txt" 2>/dev/null
pack prof anchors bench.json bench.err tests.log misc.tar.gz
ls "$out"
