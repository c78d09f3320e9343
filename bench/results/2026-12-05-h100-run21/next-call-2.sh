#!/usr/bin/env bash
# Run 21: the post-processing with one synchronisation for a click (bounded scratch, the COCO strings
# written by the device straight into pinned host memory), measured in-process and served.
#   carry .gpu-debs and .carry, then run:  bash scripts/gpu-host/next-call-2.sh
#   1. build (~2.5 min)
#   2. GPU tests: every MaskPostprocess kernel test (bounded and counted string paths), the engine's
#      GPU post-processing against the CPU masks, the golden tests (~40 s)
#   3. maskbench vit_b bs1 latency table (RLE rows now with the device's strings, as the server) with
#      --profile; vit_h bs32 offline (the served batch's reference) (~60 s)
#   4. served: vit_b interactive c1 / c16 / c256, vit_h batch c32 (~110 s)
#   5. anchors quick
set -uo pipefail
cd "$(dirname "$0")/../.."
source scripts/gpu-host/call-prelude.sh
[ -d .carry/golden/tiny-one ] || cp -r .carry/golden/tiny .carry/golden/tiny-one
export MASKD_GOLDEN_DIR=$PWD/.carry/golden
{
  timeout 90 "$B/tests/kernels_gpu_test" --gtest_filter='*MaskPostprocess*'
  timeout 120 "$B/tests/model_gpu_test" --gtest_filter='EngineCuda.GpuPostprocess*:EngineCuda.Golden*'
} > "$out/tests.log" 2>&1
grep -E "^\[  (PASSED|FAILED) |^\[ +(OK|FAILED) |Failure|Expected|Which is" "$out/tests.log" | cut -c1-240 >> "$out/perf.log"
t tests
mkdir -p "$out/prof"
timeout 120 "$B/load_tests/maskbench" --arch vit_b --batch 1 --fp32-batch 1 --rows "windows made" \
  --profile "$out/prof" --profile-rows "windows made" --json "$out/bench.json" > "$out/bench.log" 2>&1
timeout 90 "$B/load_tests/maskbench" --arch vit_h --batch 32 --fp32-batch 1 --rows "windows made" --no-latency \
  --json "$out/bench-vit_h.json" >> "$out/bench.log" 2>&1
grep -E "^vit|click|prompt" "$out/bench.log" | cut -c1-200 >> "$out/perf.log"
grep -E "^===|kernel total" "$out/prof/profiles.txt" >> "$out/perf.log"
t bench
OUT=$out/served SERVED_DURATION=8 timeout 170 bash scripts/gpu-host/served-bench.sh \
  vit_b:bf16::interactive:1 vit_b:bf16::interactive:16 vit_b:bf16::interactive:256 vit_h:bf16::batch:32 \
  > "$out/served.log" 2>&1
tail -5 "$out/served.log" | cut -c1-300 >> "$out/perf.log"
grep -h -B1 -A2 "server per call" "$out"/served/maskload-*.log | cut -c1-200 >> "$out/perf.log"
t served
left=$(( 590 - ($(date +%s) - S) ))
timeout $left bash .carry/anchors/run.sh "$out/anchors" quick > /dev/null 2>&1
grep -h RESULT "$out"/anchors/*.txt 2>/dev/null | head -8 | cut -c1-300 >> "$out/perf.log"
t anchors
(cd "$out" && tar czf /tmp/all.tgz served anchors prof bench.json bench-vit_h.json misc.tar.gz 2>/dev/null &&
  rm -rf served anchors prof bench.json bench-vit_h.json misc.tar.gz && mv /tmp/all.tgz .)
ls "$out"
