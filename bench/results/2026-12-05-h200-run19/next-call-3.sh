#!/usr/bin/env bash
# Run 19: what runs 17-18 led to, in the ~5 min of device time left this session.
#   carry .gpu-debs and .carry, then run:  bash scripts/gpu-host/next-call-3.sh
#   1. build (~1.7 min)
#   2. ModelOomGpu with room for 5 images (the 2-image pass ran out beside the failed 16's cached
#      blocks in runs 17-18), the decoder parity tests without the MASKD_DECODER_* knobs, with
#      DecodeEach's passes of at most 64 prompts (~30 s)
#   3. maskbench vit_b and vit_h bs32, last dense row, --memory-account: the peak with decoder passes
#      of <= 64 prompts (run 17: 2.3 GiB of 3.1 / 4.2 GiB was one 233-prompt decoder pass) (~45 s)
#   4. served vit_b batch c64 with the new default --decoder-max-prompts 64, interactive c256 (~50 s)
#   5. anchors quick, if time is left
set -uo pipefail
cd "$(dirname "$0")/../.."
source scripts/gpu-host/call-prelude.sh
[ -d .carry/golden/tiny-one ] || cp -r .carry/golden/tiny .carry/golden/tiny-one
export MASKD_GOLDEN_DIR=$PWD/.carry/golden
{
  timeout 40 "$B/tests/model_oom_gpu_test" --gtest_filter='*EncoderBatchOverTheCap*'
  timeout 60 "$B/tests/model_fast_decoder_gpu_test"
} > "$out/tests.log" 2>&1
grep -E "^\[  (PASSED|FAILED) |^\[oom\] (vit|Encode)|rel L2|few-query|Failure" "$out/tests.log" | cut -c1-220 >> "$out/perf.log"
t tests
timeout 90 "$B/load_tests/maskbench" --arch vit_b,vit_h --batch 32 --fp32-batch 1 --no-latency \
  --rows "windows made" --memory-account --json "$out/bench.json" > "$out/bench.log" 2>&1
grep -E "^vit|^peak|^ +[0-9.]+ +[0-9]+ +[0-9.]+ +[A-Za-z]" "$out/bench.log" >> "$out/perf.log"
t bench
OUT=$out/served SERVED_DURATION=8 timeout 70 bash scripts/gpu-host/served-bench.sh \
  vit_b:bf16::batch:64 vit_b:bf16::interactive:256 > "$out/served.log" 2>&1
tail -3 "$out/served.log" | cut -c1-300 >> "$out/perf.log"
grep -h "server per call" "$out"/served/maskload-*.log >> "$out/perf.log"
t served
timeout 80 bash .carry/anchors/run.sh "$out/anchors" quick > /dev/null 2>&1
grep -h RESULT "$out"/anchors/*.txt 2>/dev/null | head -5 | cut -c1-300 >> "$out/perf.log"
t anchors
(cd "$out" && tar czf /tmp/all.tgz served anchors bench.json misc.tar.gz 2>/dev/null &&
  rm -rf served anchors bench.json misc.tar.gz && mv /tmp/all.tgz .)
