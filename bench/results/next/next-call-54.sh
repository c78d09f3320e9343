#!/usr/bin/env bash
# Run 54 (written 2026-12-06, sixth session; any card; ~4 minutes fresh): the global attention blocks
# with 4 / 6 / 7 / 8 warps per CTA (MASKD_RELPOS_GLOBAL_WARPS, default 8) for issue #12's bs1 figure.
# Run 52 (H100): vit_b's encoder-only kernels at bs1 3.055 ms (target 3), of which the global blocks
# 1.278: 384 CTAs at 2 per SM, 1.45 waves on 132 SMs. 7 warps: 444 CTAs; 6 warps: 516 (145 registers
# instead of 128, no spill); 4 warps: 768 at 3 per SM. The existing kernels' SASS is unchanged (743c484+).
#   1. build; kernels_gpu_test under each setting (the global cases: vit_b b1/b2, vit_h b2)
#   2. maskbench vit_b,vit_h bs1 and bs32, profiled, under each setting, in the order 8, 7, 6, 4, 8
#   3. the seed's quick set if time is left (ratios only against it)
#   mkdir -p $OUT && OUT=$OUT CALL_LIMIT=360 timeout 375 bash bench/results/next/next-call-54.sh
set -uo pipefail
cd "$(dirname "$0")/../../.."
export BUILD_TARGETS=${BUILD_TARGETS:-"maskbench kernels_gpu_test"}
source scripts/gpu-host/call-prelude.sh
left() { echo $(( ${CALL_LIMIT:-360} - ($(date +%s) - S) )); }
for w in 8 7 6 4; do
  MASKD_RELPOS_GLOBAL_WARPS=$w timeout 60 "$B/tests/kernels_gpu_test" --gtest_filter='*RelPos*' > "$out/tests-$w.log" 2>&1
  echo "kernels_gpu_test global warps $w rc=$?: $(grep -E '^\[  (PASSED|FAILED) ' "$out/tests-$w.log" | tr '\n' ' ')" >> "$out/perf.log"
done
t tests
k=0
for w in 8 7 6 4 8; do
  k=$((k + 1)); mkdir -p "$out/prof-$k-w$w"
  MASKD_RELPOS_GLOBAL_WARPS=$w timeout 60 "$B/load_tests/maskbench" --arch vit_b,vit_h --batch 1,32 --fp32-batch 1 \
    --no-latency --rows "GEMM epilogues" --profile "$out/prof-$k-w$w" --profile-rows "GEMM epilogues" \
    > "$out/bench-$k-w$w.log" 2>&1
  echo "--- global warps $w (pass $k)" >> "$out/perf.log"
  grep -E "^vit" "$out/bench-$k-w$w.log" | cut -c1-200 >> "$out/perf.log"
  grep -hE "^===|kernel total|RelPosAttentionKernel<__nv_bfloat16, (64|80), [4678], true" "$out/prof-$k-w$w/profiles.txt" \
    | cut -c1-150 >> "$out/perf.log"
  t bench-w$w
done
if [ "$(left)" -gt 70 ]; then
  timeout $(( $(left) - 10 )) bash .carry/anchors/run.sh "$out/anchors" quick > /dev/null 2>&1
  grep -h RESULT "$out"/anchors/RESULTS.txt 2>/dev/null | head -8 | cut -c1-300 >> "$out/perf.log"
  t seed
fi
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv >> "$out/perf.log" 2>&1
for d in "$out"/prof-*; do rm -f "$d"/trace-*.json; done  # the tables are enough; traces are large
pack prof-1-w8 prof-2-w7 prof-3-w6 prof-4-w4 prof-5-w8 anchors misc.tar.gz
ls "$out"
