#!/usr/bin/env bash
# Run 56 (written 2026-12-06, seventh session; any card; ~8 minutes fresh): the folded global attention
# with its operands made by one kernel (kernels::FoldRelPosQK). Run 55 (H100) measured cuDNN's attention
# at 0.18 ms a block (vit_b bs1) against the fused kernel's 0.32, but the LibTorch concatenations that
# made q' and k' cost ~0.12 ms a block, so the start-up timing chose folded only at vit_b bs1
# (0.319 vs 0.335) and the fused kernel elsewhere.
#   1. build; the fold kernel's GPU test, the folded attention's module and engine tests
#   2. maskbench vit_b,vit_h bs1 and bs32: the previous default ("GEMM epilogues") and the timed choice
#      ("global attention"), profiled, with the timing table
#   3. vit_b and vit_h bs1 + bs32 with MASKD_GLOBAL_ATTENTION=folded (profiled: cuDNN's kernel and the
#      fold kernel per block at bs32)
#   4. the seed's quick set and its vit_h bs32 row, as time allows
#   mkdir -p $OUT && OUT=$OUT CALL_LIMIT=540 timeout 560 bash bench/results/next/next-call-56.sh
set -uo pipefail
cd "$(dirname "$0")/../../.."
export BUILD_TARGETS=${BUILD_TARGETS:-"maskbench model_gpu_test kernels_fusion_gpu_test model_fusion_gpu_test"}
source scripts/gpu-host/call-prelude.sh
left() { echo $(( ${CALL_LIMIT:-540} - ($(date +%s) - S) )); }
timeout 60 "$B/tests/kernels_fusion_gpu_test" > "$out/tests.log" 2>&1; echo "kernels_fusion_gpu_test rc=$?" >> "$out/perf.log"
timeout 60 "$B/tests/model_fusion_gpu_test" >> "$out/tests.log" 2>&1; echo "model_fusion_gpu_test rc=$?" >> "$out/perf.log"
timeout 120 "$B/tests/model_gpu_test" --gtest_filter='*GlobalAttention*:*AttentionImplementations*' \
  >> "$out/tests.log" 2>&1; echo "model_gpu_test rc=$?" >> "$out/perf.log"
grep -E "^\[  (PASSED|FAILED) |^\[ +FAILED |Failure|Expected|Which is|rel L2" "$out/tests.log" | cut -c1-240 >> "$out/perf.log"
t tests
mkdir -p "$out/prof"
timeout 150 "$B/load_tests/maskbench" --arch vit_b,vit_h --batch 1,32 --fp32-batch 1 --no-latency \
  --rows "GEMM epilogues,global attention" --memory-account --profile "$out/prof" \
  --profile-rows "GEMM epilogues,global attention" --json "$out/bench.json" > "$out/bench.log" 2> "$out/bench.err"
echo "maskbench rc=$?" >> "$out/perf.log"
grep -E "^vit|^peak" "$out/bench.log" | cut -c1-200 >> "$out/perf.log"
grep -E "global attention per block" "$out/bench.err" | cut -c1-400 >> "$out/perf.log"
grep -hE "^===|kernel total|^gemm  |^attention  |^norm  |^copy  |^other  " "$out/prof/profiles.txt" | cut -c1-150 >> "$out/perf.log"
t bench
if [ "$(left)" -gt 150 ]; then
  d="$out/prof-folded"; mkdir -p "$d"
  MASKD_GLOBAL_ATTENTION=folded timeout 100 "$B/load_tests/maskbench" --arch vit_b,vit_h --batch 1,32 --fp32-batch 1 \
    --no-latency --rows "global attention" --profile "$d" --profile-rows "global attention" > "$d/bench.log" 2>&1
  echo "--- MASKD_GLOBAL_ATTENTION=folded" >> "$out/perf.log"
  grep -E "^vit" "$d/bench.log" | cut -c1-200 >> "$out/perf.log"
  grep -hE "^===|kernel total|^attention  |FoldRelPos|^copy  " "$d/profiles.txt" | cut -c1-150 >> "$out/perf.log"
  t folded
fi
if [ "$(left)" -gt 80 ]; then
  timeout $(( $(left) > 125 ? 110 : $(left) - 15 )) bash .carry/anchors/run.sh "$out/anchors" quick > /dev/null 2>&1
  t seed-quick
fi
if [ "$(left)" -gt 80 ]; then  # the seed's vit_h bs32 row: #12's vit_h ratio
  bash scripts/gpu-host/seed-row.sh "$out/anchors" fast_vit_h_bs32 $(( $(left) > 110 ? 100 : $(left) - 10 )) \
    offline --impl fast --model vit_h --batch 32
  t seed-vit_h
fi
grep -h RESULT "$out"/anchors/RESULTS.txt 2>/dev/null | head -8 | cut -c1-300 >> "$out/perf.log"
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv >> "$out/perf.log" 2>&1
for d in "$out"/prof*; do rm -f "$d"/trace-*.json; done
cp "$out/prof/profiles.txt" "$out/profiles-encoder.txt" 2>/dev/null
pack prof prof-folded anchors bench.json bench.err tests.log misc.tar.gz
ls "$out"
