#!/usr/bin/env bash
# Run 50 (written 2026-12-06, fifth session; for an H200 — on an H100 it repeats run 48 without the
# A-B; ~6 minutes on a fresh machine): issue #12's figures on main beside the seed in one call.
#   1. build maskbench and the encoder's GPU tests; run the tests
#   2. maskbench vit_b,vit_h at bs1 and bs32, main's row, profiled
#   3. the seed: run.sh quick (vit_b bs32, click, 64 prompts) and its vit_h bs32 row
#   OUT=$OUT CALL_LIMIT=540 bash bench/results/next/next-call-50.sh   (carry .gpu-debs and .carry with anchors)
set -uo pipefail
cd "$(dirname "$0")/../../.."
export BUILD_TARGETS=${BUILD_TARGETS:-"maskbench kernels_gpu_test kernels_fusion_gpu_test model_fusion_gpu_test"}
source scripts/gpu-host/call-prelude.sh
left() { echo $(( ${CALL_LIMIT:-540} - ($(date +%s) - S) )); }
for t in kernels_gpu_test kernels_fusion_gpu_test model_fusion_gpu_test; do timeout 90 "$B/tests/$t"; done > "$out/tests.log" 2>&1
grep -E "^\[  (PASSED|FAILED) |^\[ +FAILED |Failure|Expected|Which is" "$out/tests.log" | cut -c1-240 >> "$out/perf.log"
t tests
mkdir -p "$out/prof"
timeout 120 "$B/load_tests/maskbench" --arch vit_b,vit_h --batch 1,32 --fp32-batch 1 --no-latency --rows "GEMM epilogues" \
  --memory-account --profile "$out/prof" --profile-rows "GEMM epilogues" --json "$out/bench.json" > "$out/bench.log" 2>&1
grep -E "^vit|^peak" "$out/bench.log" | cut -c1-200 >> "$out/perf.log"
grep -hE "^===|kernel total|^gemm  |^attention  |^norm  " "$out/prof/profiles.txt" | cut -c1-150 >> "$out/perf.log"
cp "$out/prof/profiles.txt" "$out/profiles-encoder.txt"
t bench
timeout 110 bash .carry/anchors/run.sh "$out/anchors" quick > /dev/null 2>&1
t seed-quick
if [ "$(left)" -gt 80 ]; then
  bash scripts/gpu-host/seed-row.sh "$out/anchors" fast_vit_h_bs32 $(( $(left) > 110 ? 100 : $(left) - 10 )) \
    offline --impl fast --model vit_h --batch 32
  t seed-vit_h
fi
grep -h RESULT "$out"/anchors/RESULTS.txt 2>/dev/null | head -8 | cut -c1-300 >> "$out/perf.log"
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv >> "$out/perf.log" 2>&1
pack prof anchors bench.json misc.tar.gz
ls "$out"
