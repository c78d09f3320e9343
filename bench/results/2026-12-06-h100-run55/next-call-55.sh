#!/usr/bin/env bash
# Run 55 (written 2026-12-06, seventh session; any card, an H200 wanted; ~7 minutes fresh): the global
# blocks' attention chosen per encoder batch size by timing (the fused kernel against cuDNN's attention
# with the rel-pos terms folded into q/k; issue #12 item 3's "measured table"), and next-call-54's
# warp-count knob, beside the seed.
#   1. build; the new GPU tests (EncoderFusionCuda.FoldedGlobalAttentionMatchesTheFusedKernel,
#      EngineCuda.GlobalAttentionChoiceRunsInTheGraphs, the attention implementations' agreement) and
#      kernels_gpu_test's RelPos cases under MASKD_RELPOS_GLOBAL_WARPS 8 / 6 / 4
#   2. maskbench vit_b,vit_h bs1 and bs32: the previous default row ("GEMM epilogues") and the timed
#      choice ("global attention"), profiled; stderr keeps the timing table
#   3. vit_b bs1 under MASKD_GLOBAL_ATTENTION=fused|folded and the warp knob 6 / 4 (profiled)
#   4. vit_b's in-process decoder rows (the hypernetwork MLPs as batched GEMMs)
#   5. the seed's quick set and its vit_h bs32 row, as time allows
#   mkdir -p $OUT && OUT=$OUT CALL_LIMIT=540 timeout 560 bash bench/results/next/next-call-55.sh
set -uo pipefail
cd "$(dirname "$0")/../../.."
export BUILD_TARGETS=${BUILD_TARGETS:-"maskbench model_gpu_test kernels_gpu_test model_fusion_gpu_test model_fast_decoder_gpu_test"}
source scripts/gpu-host/call-prelude.sh
left() { echo $(( ${CALL_LIMIT:-540} - ($(date +%s) - S) )); }
timeout 60 "$B/tests/model_fusion_gpu_test" > "$out/tests.log" 2>&1; echo "model_fusion_gpu_test rc=$?" >> "$out/perf.log"
timeout 120 "$B/tests/model_gpu_test" --gtest_filter='*GlobalAttention*:*AttentionImplementations*:*CudaGraphsAndGpu*' \
  >> "$out/tests.log" 2>&1; echo "model_gpu_test rc=$?" >> "$out/perf.log"
timeout 60 "$B/tests/model_fast_decoder_gpu_test" >> "$out/tests.log" 2>&1; echo "model_fast_decoder_gpu_test rc=$?" >> "$out/perf.log"
for w in 8 6 4; do
  MASKD_RELPOS_GLOBAL_WARPS=$w timeout 60 "$B/tests/kernels_gpu_test" --gtest_filter='*RelPos*' >> "$out/tests.log" 2>&1
  echo "kernels_gpu_test RelPos global warps $w rc=$?" >> "$out/perf.log"
done
grep -E "^\[  (PASSED|FAILED) |^\[ +FAILED |Failure|Expected|Which is|rel L2" "$out/tests.log" | cut -c1-240 >> "$out/perf.log"
t tests
mkdir -p "$out/prof"
timeout 150 "$B/load_tests/maskbench" --arch vit_b,vit_h --batch 1,32 --fp32-batch 1 --no-latency \
  --rows "GEMM epilogues,global attention" --memory-account --profile "$out/prof" \
  --profile-rows "GEMM epilogues,global attention" --json "$out/bench.json" > "$out/bench.log" 2> "$out/bench.err"
echo "maskbench rc=$?" >> "$out/perf.log"
grep -E "^vit|^peak" "$out/bench.log" | cut -c1-200 >> "$out/perf.log"
grep -E "global attention per block" "$out/bench.err" | cut -c1-400 >> "$out/perf.log"
grep -hE "^===|kernel total|^gemm  |^attention  |^norm  " "$out/prof/profiles.txt" | cut -c1-150 >> "$out/perf.log"
t bench
for v in "MASKD_GLOBAL_ATTENTION=fused" "MASKD_GLOBAL_ATTENTION=folded" "MASKD_GLOBAL_ATTENTION=fused MASKD_RELPOS_GLOBAL_WARPS=6" \
         "MASKD_GLOBAL_ATTENTION=fused MASKD_RELPOS_GLOBAL_WARPS=4"; do
  [ "$(left)" -gt 120 ] || break
  d="$out/prof-$(echo "$v" | tr ' =' '__')"; mkdir -p "$d"
  env $v timeout 60 "$B/load_tests/maskbench" --arch vit_b --batch 1 --fp32-batch 1 --no-latency --rows "global attention" \
    --profile "$d" --profile-rows "global attention" > "$d/bench.log" 2>&1
  echo "--- $v" >> "$out/perf.log"
  grep -E "^vit" "$d/bench.log" | cut -c1-200 >> "$out/perf.log"
  grep -hE "^===|kernel total|^attention  " "$d/profiles.txt" | cut -c1-150 >> "$out/perf.log"
  rm -f "$d"/trace-*.json
done
t variants
if [ "$(left)" -gt 150 ]; then  # #13's in-process decoder rows (the hypernetwork MLPs batched)
  timeout 80 "$B/load_tests/maskbench" --arch vit_b --batch 1 --fp32-batch 1 --rows "global attention" \
    --json "$out/bench-bs1.json" > "$out/bench-bs1.log" 2>&1
  grep -E "decoder shared-image" "$out/bench-bs1.log" | cut -c1-220 >> "$out/perf.log"
  t decoder
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
pack prof bench-bs1.json bench-bs1.log $(cd "$out" && ls -d prof-* 2>/dev/null) anchors bench.json bench.err tests.log misc.tar.gz
ls "$out"
