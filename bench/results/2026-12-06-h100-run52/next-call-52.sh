#!/usr/bin/env bash
# Run 52 (written 2026-12-06, sixth session; any card, an H200 wanted; ~7 minutes fresh): after 70fb8cd
# (runs 49 and 51 segfaulted in every random-weight CUDA engine: the digest task read parameters whose
# storage Init was swapping), the GPU tests that crashed, then #12's figures and #13's in-process rows
# beside the seed in one call.
#   1. build; model_gpu_test (all), model_fast_decoder_gpu_test, the encoder kernels' GPU tests
#   2. maskbench vit_b,vit_h at bs1 and bs32, profiled (#12), then vit_b bs1 with the decoder rows (#13)
#   3. the seed: run.sh quick and its vit_h bs32 row
#   mkdir -p $OUT && OUT=$OUT CALL_LIMIT=560 timeout 580 bash bench/results/next/next-call-52.sh
set -uo pipefail
cd "$(dirname "$0")/../../.."
export BUILD_TARGETS=${BUILD_TARGETS:-"maskbench model_gpu_test model_fast_decoder_gpu_test kernels_gpu_test kernels_fusion_gpu_test model_fusion_gpu_test"}
source scripts/gpu-host/call-prelude.sh
left() { echo $(( ${CALL_LIMIT:-560} - ($(date +%s) - S) )); }
timeout 150 "$B/tests/model_gpu_test" > "$out/tests.log" 2>&1; echo "model_gpu_test rc=$?" >> "$out/perf.log"
for t in model_fast_decoder_gpu_test kernels_gpu_test kernels_fusion_gpu_test model_fusion_gpu_test; do
  timeout 90 "$B/tests/$t" >> "$out/tests.log" 2>&1; echo "$t rc=$?" >> "$out/perf.log"
done
grep -E "^\[  (PASSED|FAILED) |^\[ +FAILED |Failure|Expected|Which is" "$out/tests.log" | cut -c1-240 >> "$out/perf.log"
t tests
mkdir -p "$out/prof"
timeout 120 "$B/load_tests/maskbench" --arch vit_b,vit_h --batch 1,32 --fp32-batch 1 --no-latency --rows "GEMM epilogues" \
  --memory-account --profile "$out/prof" --profile-rows "GEMM epilogues" --json "$out/bench.json" > "$out/bench.log" 2>&1
echo "maskbench rc=$?" >> "$out/perf.log"
grep -E "^vit|^peak" "$out/bench.log" | cut -c1-200 >> "$out/perf.log"
grep -hE "^===|kernel total|^gemm  |^attention  |^norm  " "$out/prof/profiles.txt" | cut -c1-150 >> "$out/perf.log"
cp "$out/prof/profiles.txt" "$out/profiles-encoder.txt"
t bench
timeout 80 "$B/load_tests/maskbench" --arch vit_b --batch 1 --fp32-batch 1 --rows "GEMM epilogues" \
  --json "$out/bench-bs1.json" > "$out/bench-bs1.log" 2>&1
grep -E "prompt" "$out/bench-bs1.log" | cut -c1-200 >> "$out/perf.log"
t bench-decoder
timeout 110 bash .carry/anchors/run.sh "$out/anchors" quick > /dev/null 2>&1
t seed-quick
if [ "$(left)" -gt 80 ]; then
  bash scripts/gpu-host/seed-row.sh "$out/anchors" fast_vit_h_bs32 $(( $(left) > 110 ? 100 : $(left) - 10 )) \
    offline --impl fast --model vit_h --batch 32
  t seed-vit_h
fi
grep -h RESULT "$out"/anchors/RESULTS.txt 2>/dev/null | head -8 | cut -c1-300 >> "$out/perf.log"
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv >> "$out/perf.log" 2>&1
pack prof anchors bench.json bench-bs1.json misc.tar.gz
ls "$out"
