#!/usr/bin/env bash
# Run 51 (written 2026-12-06, sixth session; for an H200, ideally the warm machine of runs 49/50):
# issue #13's figures on an H200 beside the seed's click and 64-prompt rows. Run 45's set (H100)
# plus vit_h's served batch (the issue's "≥ 0.9 of offline for vit_b and vit_h") and, if time is
# left, vit_h's offline bs32 row of the same call to divide it by. ~4-5 minutes warm.
#   1. build (incremental when warm); the decoder's GPU tests
#   2. served vit_b interactive c1, c16, c256, c256 with --decoder-max-prompts=256 (run 45: decoder
#      batches always at the cap of 64, 3.38 ms of compute each, ~85 % of the run busy), batch c64
#      (8 s each); vit_h batch c32 (8 s) and interactive c1 (5 s, its start-up lines)
#   3. maskbench vit_b bs1 with the decoder latency rows (64 prompts, 256 over 32 images)
#   4. the seed: run.sh quick; then maskbench vit_h bs32 (offline, for the served batch ratio)
#   mkdir -p $OUT && OUT=$OUT CALL_LIMIT=440 timeout 460 bash bench/results/next/next-call-51.sh
set -uo pipefail
cd "$(dirname "$0")/../../.."
export BUILD_TARGETS=${BUILD_TARGETS:-"maskd maskload maskbench model_fast_decoder_gpu_test"}
source scripts/gpu-host/call-prelude.sh
left() { echo $(( ${CALL_LIMIT:-440} - ($(date +%s) - S) )); }
timeout 100 "$B/tests/model_fast_decoder_gpu_test" > "$out/tests.log" 2>&1
grep -E "^\[  (PASSED|FAILED) |^\[ +FAILED |Failure" "$out/tests.log" | cut -c1-240 >> "$out/perf.log"
t tests
OUT=$out/served SERVED_DURATION=8 timeout 215 bash scripts/gpu-host/served-bench.sh \
  vit_b:bf16::interactive:1 vit_b:bf16::interactive:16 vit_b:bf16::interactive:256 vit_b:bf16:--decoder-max-prompts=256:interactive:256 \
  vit_b:bf16::batch:64 vit_h:bf16::batch:32 > "$out/served.log" 2>&1
OUT=$out/served SERVED_DURATION=5 timeout 60 bash scripts/gpu-host/served-bench.sh vit_h:bf16::interactive:1 \
  >> "$out/served.log" 2>&1
grep -E "rc=" "$out/served.log" | cut -c1-300 >> "$out/perf.log"
grep -h -B1 -A2 "server per call" "$out"/served/maskload-*.log | cut -c1-200 >> "$out/perf.log"
grep -h "startup\|GEMM algorithms\|encoder batch costs\|fatal\|terminate" "$out"/served/maskd-vit_h-*.log | cut -c1-300 >> "$out/perf.log"
grep -h "fatal\|terminate\|AcceleratorError" "$out"/served/maskd-vit_b-*.log | cut -c1-2000 >> "$out/perf.log"
t served
timeout 80 "$B/load_tests/maskbench" --arch vit_b --batch 1 --fp32-batch 1 --rows "GEMM epilogues" \
  --json "$out/bench-bs1.json" > "$out/bench.log" 2>&1
grep -E "^vit|prompt" "$out/bench.log" | cut -c1-200 >> "$out/perf.log"
t bench
timeout 110 bash .carry/anchors/run.sh "$out/anchors" quick > /dev/null 2>&1
grep -h RESULT "$out"/anchors/RESULTS.txt 2>/dev/null | head -8 | cut -c1-300 >> "$out/perf.log"
t seed
if [ "$(left)" -gt 45 ]; then
  timeout $(( $(left) - 10 )) "$B/load_tests/maskbench" --arch vit_h --batch 32 --fp32-batch 1 --no-latency \
    --rows "GEMM epilogues" --json "$out/bench-vit_h.json" > "$out/bench-vit_h.log" 2>&1
  grep -E "^vit" "$out/bench-vit_h.log" | cut -c1-200 >> "$out/perf.log"
  t bench-vit_h
fi
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv >> "$out/perf.log" 2>&1
pack served anchors bench-bs1.json bench-vit_h.json misc.tar.gz
ls "$out"
