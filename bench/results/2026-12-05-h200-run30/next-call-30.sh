#!/usr/bin/env bash
# Run 30: the patch embedding as a GEMM (encoder, fused path) on top of run 29's decoder. GPU tests
# of the encoder (golden bf16, the fused encoder against its reference, graphs); the vit_b bs32 and
# bs1 rows with a bs32 kernel table (issue #12); served clicks at 1 / 16 / 256 clients and served
# batch at 64 clients (issue #13); the seed (quick set).
set -uo pipefail
cd "$(dirname "$0")/../.."
source scripts/gpu-host/call-prelude.sh
[ -d .carry/golden/tiny-one ] || cp -r .carry/golden/tiny .carry/golden/tiny-one
export MASKD_GOLDEN_DIR=$PWD/.carry/golden
{
  timeout 120 "$B/tests/model_gpu_test" --gtest_filter='EngineCuda.Golden*:EngineCuda.CudaGraphs*:EngineCuda.Attention*'
  timeout 90 "$B/tests/model_fusion_gpu_test"
} > "$out/tests.log" 2>&1
grep -E "^\[  (PASSED|FAILED) |^\[ +FAILED |Failure|Expected|Which is|rel L2" "$out/tests.log" | cut -c1-240 >> "$out/perf.log"
t tests
mkdir -p "$out/prof"
timeout 150 "$B/load_tests/maskbench" --arch vit_b --batch 32 --fp32-batch 1 --no-latency \
  --rows "windows made" --memory-account --profile "$out/prof" --profile-rows "windows made" \
  --json "$out/bench.json" > "$out/bench.log" 2>&1
timeout 60 "$B/load_tests/maskbench" --arch vit_b --batch 1 --fp32-batch 1 --no-latency \
  --rows "windows made" --json "$out/bench1.json" >> "$out/bench.log" 2>&1
grep -E "^vit|^peak" "$out/bench.log" | cut -c1-200 >> "$out/perf.log"
grep -E "^===|kernel total" "$out/prof/profiles.txt" >> "$out/perf.log"
t bench
OUT=$out/served SERVED_DURATION=8 timeout 200 bash scripts/gpu-host/served-bench.sh \
  vit_b:bf16::interactive:1 vit_b:bf16::interactive:16 vit_b:bf16::interactive:256 vit_b:bf16::batch:64 \
  > "$out/served.log" 2>&1
tail -5 "$out/served.log" | cut -c1-300 >> "$out/perf.log"
grep -h -B1 -A2 "server per call" "$out"/served/maskload-*.log | cut -c1-200 >> "$out/perf.log"
t served
left=$(( ${CALL_LIMIT:-575} - ($(date +%s) - S) ))
timeout $left bash .carry/anchors/run.sh "$out/anchors" quick > /dev/null 2>&1
grep -h RESULT "$out"/anchors/*.txt 2>/dev/null | head -8 | cut -c1-300 >> "$out/perf.log"
t anchors
cp "$out/prof/profiles.txt" "$out/profiles.txt"
(cd "$out" && tar czf /tmp/all.tgz served anchors prof bench.json bench1.json misc.tar.gz 2>/dev/null &&
  rm -rf served anchors prof bench.json bench1.json misc.tar.gz && mv /tmp/all.tgz .)
ls "$out"
