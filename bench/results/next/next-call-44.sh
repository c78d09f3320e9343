#!/usr/bin/env bash
# Run 44 (written 2026-12-06, NOT RUN YET; for an H200): issue #12's figures on main beside the seed
# in one call, after the GEMM changes of runs 41-42 (measured only on H100s so far). ~8 minutes.
#   1. build; the GPU tests of the encoder (kernels_gpu_test, kernels_fusion_gpu_test,
#      model_fusion_gpu_test)
#   2. maskbench bs32 vit_b,vit_h: rows "windows made" (LibTorch's GEMM choice), "GEMM algorithms
#      chosen by timing", "residual adds in the GEMM epilogues" (main's default), the last profiled;
#      vit_b bs1 (the encoder-only kernel time of the bs1 target) profiled
#   3. the seed: run.sh quick (vit_b bs32, click, 64 prompts) and its vit_h bs32 row
#   OUT=$OUT CALL_LIMIT=570 bash bench/results/next/next-call-44.sh   (carry .gpu-debs and .carry with anchors)
set -uo pipefail
cd "$(dirname "$0")/../../.."
source scripts/gpu-host/call-prelude.sh
left() { echo $(( ${CALL_LIMIT:-570} - ($(date +%s) - S) )); }
{
  timeout 120 "$B/tests/kernels_gpu_test"
  timeout 60 "$B/tests/kernels_fusion_gpu_test"
  timeout 60 "$B/tests/model_fusion_gpu_test"
} > "$out/tests.log" 2>&1
grep -E "^\[  (PASSED|FAILED) |^\[ +FAILED |Failure|Expected|Which is|Value of|Actual|rel L2" "$out/tests.log" | cut -c1-240 >> "$out/perf.log"
t tests
mkdir -p "$out/prof" "$out/prof1"
MASKD_GEMM_TUNING_LOG=1 timeout 150 "$B/load_tests/maskbench" --arch vit_b,vit_h --batch 32 --fp32-batch 1 --no-latency \
  --rows "windows made,GEMM algorithms,GEMM epilogues" --memory-account --profile "$out/prof" \
  --profile-rows "GEMM epilogues" --json "$out/bench.json" > "$out/bench.log" 2>&1
t bench32
timeout 60 "$B/load_tests/maskbench" --arch vit_b --batch 1 --fp32-batch 1 --no-latency --rows "GEMM epilogues" \
  --profile "$out/prof1" --profile-rows "GEMM epilogues" --json "$out/bench-bs1.json" >> "$out/bench.log" 2>&1
t bench1
grep -E "^vit|^peak" "$out/bench.log" | cut -c1-200 >> "$out/perf.log"
grep -hE "^===|kernel total|^gemm  |^attention  |^norm  " "$out/prof/profiles.txt" "$out/prof1/profiles.txt" | cut -c1-150 >> "$out/perf.log"
cp "$out/prof/profiles.txt" "$out/profiles-encoder.txt"; cp "$out/prof1/profiles.txt" "$out/profiles-bs1.txt"
timeout 110 bash .carry/anchors/run.sh "$out/anchors" quick > /dev/null 2>&1
t seed-quick
if [ "$(left)" -gt 80 ]; then
  bash scripts/gpu-host/seed-row.sh "$out/anchors" fast_vit_h_bs32 $(( $(left) > 110 ? 100 : $(left) - 10 )) \
    offline --impl fast --model vit_h --batch 32
  t seed-vit_h
fi
grep -h RESULT "$out"/anchors/RESULTS.txt 2>/dev/null | head -8 | cut -c1-300 >> "$out/perf.log"
pack prof prof1 anchors bench.json bench-bs1.json misc.tar.gz
ls "$out"
