#!/usr/bin/env bash
# Run 41 (2026-12-06): the encoder's linear layers through cuBLASLt with the algorithm chosen by
# timing (kernels/tuned_linear.cc) against LibTorch's choice (the heuristic's first), one binary:
# MASKD_GEMM_TUNING=0 is the baseline. Run 40's profile: fc1 with the GELU epilogue ~600 TFLOP/s,
# fc2/proj ~750, qkv ~710 (H200).
#   1. build; the linear layer's and the fused encoder's GPU tests
#   2. maskbench vit_b,vit_h bs32 (+ vit_b bs1) tuned, with the profile and the tuning log
#   3. the same with MASKD_GEMM_TUNING=0 (base), then tuned again (A B A)
#   4. the seed: run.sh quick (vit_b) and its vit_h bs32 row (ratios need the seed of the same call)
#   OUT=$OUT CALL_LIMIT=480 bash bench/results/next/next-call-41.sh
set -uo pipefail
cd "$(dirname "$0")/../../.."
source scripts/gpu-host/call-prelude.sh
left() { echo $(( ${CALL_LIMIT:-480} - ($(date +%s) - S) )); }
{
  timeout 90 "$B/tests/kernels_gpu_test" --gtest_filter='*TunedLinear*:*Fp8Linear*'
  timeout 60 "$B/tests/kernels_fusion_gpu_test"
  timeout 90 "$B/tests/model_fusion_gpu_test"
} > "$out/tests.log" 2>&1
grep -E "^\[  (PASSED|FAILED) |^\[ +FAILED |Failure|Expected|Which is|Value of|Actual" "$out/tests.log" | cut -c1-240 >> "$out/perf.log"
t tests
mkdir -p "$out/prof" "$out/prof-base"
bench() {
  timeout 90 "$B/load_tests/maskbench" --arch vit_b,vit_h --batch 32 --fp32-batch 1 --no-latency \
    --rows "windows made" "$@"
}
bs1() { timeout 40 "$B/load_tests/maskbench" --arch vit_b --batch 1 --fp32-batch 1 --no-latency --rows "windows made"; }
MASKD_GEMM_TUNING_LOG=1 bench --profile "$out/prof" --profile-rows "windows made" > "$out/bench.log" 2>&1
MASKD_GEMM_TUNING_LOG=1 bs1 >> "$out/bench.log" 2>&1
t bench-tuned
MASKD_GEMM_TUNING=0 bench --profile "$out/prof-base" --profile-rows "windows made" > "$out/bench-base.log" 2>&1
MASKD_GEMM_TUNING=0 bs1 >> "$out/bench-base.log" 2>&1
t bench-base
bench > "$out/bench-new2.log" 2>&1
bs1 >> "$out/bench-new2.log" 2>&1
t bench-tuned2
grep -E "^vit" "$out/bench.log" | cut -c1-200 >> "$out/perf.log"
grep -E "^vit" "$out/bench-base.log" | cut -c1-200 | sed 's/^/base: /' >> "$out/perf.log"
grep -E "^vit" "$out/bench-new2.log" | cut -c1-200 | sed 's/^/tuned again: /' >> "$out/perf.log"
grep -E "^maskd: linear" "$out/bench.log" | sort | uniq | head -40 >> "$out/perf.log"
grep -hE "^===|kernel total|^gemm  |^attention  |^norm  " "$out/prof/profiles.txt" | cut -c1-150 >> "$out/perf.log"
grep -hE "^===|kernel total|^gemm  " "$out/prof-base/profiles.txt" | cut -c1-150 | sed 's/^/base: /' >> "$out/perf.log"
cp "$out/prof/profiles.txt" "$out/profiles-encoder.txt"; cp "$out/prof-base/profiles.txt" "$out/profiles-encoder-base.txt"
timeout 110 bash .carry/anchors/run.sh "$out/anchors" quick > /dev/null 2>&1
t seed-quick
w=$(mktemp -d)
tar -xf .carry/anchors/vendor/segment-anything-fast-*.tar -C "$w"
python3 -m zipfile -e .carry/anchors/vendor/segment_anything-1.0-py3-none-any.whl "$w/sam" > /dev/null
if [ "$(left)" -gt 60 ]; then
  PYTHONPATH="$w/segment-anything-fast:$w/sam" SEGMENT_ANYTHING_FAST_USE_FLASH_4=0 TORCHINDUCTOR_CACHE_DIR="$w/ind" \
    timeout $(( $(left) > 110 ? 100 : $(left) - 10 )) python3 .carry/anchors/anchors.py offline --impl fast \
    --model vit_h --batch 32 > "$out/anchors/fast_vit_h_bs32.log" 2>&1
  grep '^RESULT ' "$out/anchors/fast_vit_h_bs32.log" | sed 's/^RESULT /RESULT fast_vit_h_bs32 /' >> "$out/anchors/RESULTS.txt"
  t seed-vit_h
fi
grep -h RESULT "$out"/anchors/RESULTS.txt 2>/dev/null | head -8 | cut -c1-300 >> "$out/perf.log"
pack prof prof-base bench-new2.log anchors misc.tar.gz
ls "$out"
