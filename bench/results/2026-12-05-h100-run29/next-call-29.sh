#!/usr/bin/env bash
# Run 29: three decoder changes (first written on branch night-i2t-mma, which was lost with its
# checkout, and rewritten): ImageToTokenUpdate's P u on the tensor cores, the positional terms added
# on load (FewQueryAttentionBiased, q_bias), ImageSideKeys for the shared-prompt graph's input. Their
# GPU tests, the decoder tests, golden; vit_b bs1 latency table + profiles; the seed.
set -uo pipefail
cd "$(dirname "$0")/../.."
source scripts/gpu-host/call-prelude.sh
[ -d .carry/golden/tiny-one ] || cp -r .carry/golden/tiny .carry/golden/tiny-one
export MASKD_GOLDEN_DIR=$PWD/.carry/golden
{
  timeout 90 "$B/tests/kernels_fusion_gpu_test" --gtest_filter='*FewQuery*:*ImageToToken*:*ImageSideKeys*'
  timeout 150 "$B/tests/model_fast_decoder_gpu_test"
  timeout 120 "$B/tests/model_gpu_test" --gtest_filter='EngineCuda.Golden*:EngineCuda.GpuPostprocess*'
} > "$out/tests.log" 2>&1
grep -E "^\[  (PASSED|FAILED) |^\[ +FAILED |Failure|Expected|Which is|rel L2" "$out/tests.log" | cut -c1-240 >> "$out/perf.log"
t tests
mkdir -p "$out/prof"
timeout 150 "$B/load_tests/maskbench" --arch vit_b --batch 1 --fp32-batch 1 --rows "windows made" \
  --profile "$out/prof" --profile-rows "windows made" --json "$out/bench.json" > "$out/bench.log" 2>&1
grep -E "^vit|click|prompt" "$out/bench.log" | cut -c1-200 >> "$out/perf.log"
grep -E "^===|kernel total" "$out/prof/profiles.txt" >> "$out/perf.log"
t bench
left=$(( ${CALL_LIMIT:-560} - ($(date +%s) - S) ))
timeout $left bash .carry/anchors/run.sh "$out/anchors" quick > /dev/null 2>&1
grep -h RESULT "$out"/anchors/*.txt 2>/dev/null | head -8 | cut -c1-300 >> "$out/perf.log"
t anchors
cp "$out/prof/profiles.txt" "$out/profiles.txt"
(cd "$out" && tar czf /tmp/all.tgz anchors prof bench.json misc.tar.gz 2>/dev/null &&
  rm -rf anchors prof bench.json misc.tar.gz && mv /tmp/all.tgz .)
ls "$out"
