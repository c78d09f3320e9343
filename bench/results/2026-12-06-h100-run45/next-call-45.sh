#!/usr/bin/env bash
# Run 45 (written 2026-12-06, NOT RUN YET; for an H200, ideally the machine of run 44 while warm):
# issue #13's figures on main beside the seed's click and 64-prompt rows, and vit_h's cold start with
# the GEMM timing in its warm-up. ~7 minutes (a rebuild if /tmp/maskd-build is gone).
#   1. build (incremental when warm); the decoder's GPU tests
#   2. served vit_b interactive c1, c16, c256, batch c64 (8 s each); vit_h interactive c1 (5 s) for the
#      start-up lines ("startup: ...", "GEMM algorithms timed ...") of its server log
#   3. maskbench vit_b bs1 with the decoder latency rows (64 prompts, 256 over 32 images)
#   4. the seed: run.sh quick
#   OUT=$OUT CALL_LIMIT=560 bash bench/results/next/next-call-45.sh
set -uo pipefail
cd "$(dirname "$0")/../../.."
source scripts/gpu-host/call-prelude.sh
timeout 100 "$B/tests/model_fast_decoder_gpu_test" > "$out/tests.log" 2>&1
grep -E "^\[  (PASSED|FAILED) |^\[ +FAILED |Failure" "$out/tests.log" | cut -c1-240 >> "$out/perf.log"
t tests
OUT=$out/served SERVED_DURATION=8 timeout 150 bash scripts/gpu-host/served-bench.sh \
  vit_b:bf16::interactive:1 vit_b:bf16::interactive:16 vit_b:bf16::interactive:256 vit_b:bf16::batch:64 \
  > "$out/served.log" 2>&1
OUT=$out/served SERVED_DURATION=5 timeout 90 bash scripts/gpu-host/served-bench.sh vit_h:bf16::interactive:1 \
  >> "$out/served.log" 2>&1
grep -E "rc=" "$out/served.log" | cut -c1-300 >> "$out/perf.log"
grep -h -B1 -A2 "server per call" "$out"/served/maskload-*.log | cut -c1-200 >> "$out/perf.log"
grep -h "startup\|GEMM algorithms\|fatal\|terminate" "$out"/served/maskd-vit_h-*.log | cut -c1-300 >> "$out/perf.log"
grep -h "fatal\|terminate\|AcceleratorError" "$out"/served/maskd-vit_b-*.log | cut -c1-2000 >> "$out/perf.log"
t served
timeout 80 "$B/load_tests/maskbench" --arch vit_b --batch 1 --fp32-batch 1 --rows "GEMM epilogues" \
  --json "$out/bench-bs1.json" > "$out/bench.log" 2>&1
grep -E "^vit|prompt" "$out/bench.log" | cut -c1-200 >> "$out/perf.log"
t bench
timeout 110 bash .carry/anchors/run.sh "$out/anchors" quick > /dev/null 2>&1
grep -h RESULT "$out"/anchors/RESULTS.txt 2>/dev/null | head -8 | cut -c1-300 >> "$out/perf.log"
t seed
pack served anchors bench-bs1.json misc.tar.gz
ls "$out"
