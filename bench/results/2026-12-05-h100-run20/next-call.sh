#!/usr/bin/env bash
# Run 20 (first call of the 2026-12-05 evening session): measure what landed unmeasured, profile the
# decoder's RLE path.
#   carry .gpu-debs and .carry, then run:  bash scripts/gpu-host/next-call.sh
#   1. build (~1.7 min)
#   2. GPU tests: the fp8 identity test (never run), the few-query kernels, the fast decoder (~40 s)
#   3. maskbench vit_b bs1, last dense row: latency table (click, 64 prompts, 256 over 32 images, RLE
#      and threshold-only) with --profile: per-kernel tables + traces of the 64-prompt and click calls
#   4. served: vit_b interactive c1 / c16 / c256 (batched post-processing, never measured), vit_h
#      batch c32 (not measured since run 14)
#   5. cold start vit_h (server's share of the first click), anchors quick
set -uo pipefail
cd "$(dirname "$0")/../.."
source scripts/gpu-host/call-prelude.sh
{
  timeout 60 "$B/tests/model_gpu_test" --gtest_filter='EngineCuda.Fp8*'
  timeout 60 "$B/tests/kernels_fusion_gpu_test"
  timeout 60 "$B/tests/model_fast_decoder_gpu_test"
} > "$out/tests.log" 2>&1
grep -E "^\[  (PASSED|FAILED) |rel L2|mask IoU|few-query|Failure|Expected|Which is" "$out/tests.log" | cut -c1-240 >> "$out/perf.log"
t tests
mkdir -p "$out/prof"
timeout 120 "$B/load_tests/maskbench" --arch vit_b --batch 1 --fp32-batch 1 --rows "windows made" \
  --profile "$out/prof" --profile-rows "windows made" --json "$out/bench.json" > "$out/bench.log" 2>&1
grep -E "^vit|click|prompt" "$out/bench.log" | cut -c1-200 >> "$out/perf.log"
grep -E "^===|kernel total" "$out/prof/profiles.txt" >> "$out/perf.log"
t bench
OUT=$out/served SERVED_DURATION=8 timeout 150 bash scripts/gpu-host/served-bench.sh \
  vit_b:bf16::interactive:1 vit_b:bf16::interactive:16 vit_b:bf16::interactive:256 vit_h:bf16::batch:32 \
  > "$out/served.log" 2>&1
tail -5 "$out/served.log" | cut -c1-300 >> "$out/perf.log"
grep -h -B1 -A3 "server per call" "$out"/served/maskload-*.log | cut -c1-200 >> "$out/perf.log"
t served
OUT=$out timeout 60 bash scripts/gpu-host/cold-start.sh vit_h >> "$out/perf.log" 2>&1
t cold
timeout 100 bash .carry/anchors/run.sh "$out/anchors" quick > /dev/null 2>&1
grep -h RESULT "$out"/anchors/*.txt 2>/dev/null | head -8 | cut -c1-300 >> "$out/perf.log"
t anchors
(cd "$out" && tar czf /tmp/all.tgz served anchors prof bench.json cold-*.log misc.tar.gz 2>/dev/null &&
  rm -rf served anchors prof bench.json cold-*.log misc.tar.gz && mv /tmp/all.tgz .)
ls "$out"
