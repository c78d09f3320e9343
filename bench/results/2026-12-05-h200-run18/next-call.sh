#!/usr/bin/env bash
# The device call planned after run 16 (written when the session's second call was refused): every
# change since run 16 on the GPU, then the measurements it was built for, in one call of < 10 min.
#   carry .gpu-debs and .carry (golden tiny-one as .carry/golden/tiny, ../shared/anchors as
#   .carry/anchors, the CPU oracle file as .carry/amg_oracle.json.gz: build/amg_oracle.json,
#   written by model_generate_test), then run:  bash scripts/gpu-host/next-call.sh
# Writes $OUT/perf.log, tests.log, gen.log, served.log and all.tgz (served/, anchors/, JSON).
#   1. build (~1.8 min)
#   2. the fixed or new GPU tests: ModelOomGpu (eager passes no longer padded), the generation parity
#      cases on CUDA (FilterMasks on the fused post-processing kernel), the server OOM suite (~1 min)
#   3. maskbench --generate-only vit_h with a Kineto table per case (the filter kernel with thresholds 0;
#      the decode pipelining)
#      and maskbench vit_b bs32 offline (the served/offline ratio's denominator) (~1.5 min)
#   4. anchors amg: the original generator, for the same-call ratio (~2.7 min)
#   5. served: vit_b batch c64 as is / --gpu-turns=1 / --decoder-max-prompts=64, then vit_h clicks
#      at 16 clients without and beside one GenerateMasks loop (~2.5 min)
set -uo pipefail
cd "$(dirname "$0")/../.."
source scripts/gpu-host/call-prelude.sh  # $out, t, the build, $B and its environment
# The tests look for the golden data as GOLDEN/tiny-one.
[ -d .carry/golden/tiny-one ] || cp -r .carry/golden/tiny .carry/golden/tiny-one
gunzip -kf .carry/amg_oracle.json.gz
export MASKD_GOLDEN_DIR=$PWD/.carry/golden MASKD_AMG_ORACLE_JSON=$PWD/.carry/amg_oracle.json
{
  timeout 60 "$B/tests/model_oom_gpu_test"
  timeout 120 "$B/tests/model_generate_gpu_test"
  timeout 60 "$B/tests/server_oom_gpu_test"
} > "$out/tests.log" 2>&1
grep -E "^\[  (PASSED|FAILED) |^\[oom\]|\[cuda\]" "$out/tests.log" >> "$out/perf.log"
t tests
mkdir -p /tmp/gen-prof
timeout 100 "$B/load_tests/maskbench" --arch vit_h --generate-only --generate 10 --profile /tmp/gen-prof \
  --json "$out/gen.json" > "$out/gen.log" 2>&1
cp /tmp/gen-prof/profiles.txt "$out/gen-profiles.txt" 2>/dev/null
timeout 90 "$B/load_tests/maskbench" --arch vit_b --batch 32 --rows "windows made" --no-latency --fp32-batch 1 \
  --json "$out/offline.json" >> "$out/gen.log" 2>&1
t bench
timeout 200 bash .carry/anchors/run.sh "$out/anchors" amg > /dev/null 2>&1
t anchors
left=$(( 575 - ($(date +%s) - S) ))
OUT=$out/served SERVED_DURATION=10 timeout $left bash scripts/gpu-host/served-bench.sh \
  vit_b:bf16::batch:64 vit_b:bf16:--gpu-turns=1:batch:64 vit_b:bf16:--decoder-max-prompts=64:batch:64 \
  vit_h:bf16::interactive:16 vit_h:bf16::interactive:16:--background-generate=1 > "$out/served.log" 2>&1
t served
(cd "$out" && tar czf /tmp/all.tgz served anchors gen.json gen-profiles.txt offline.json misc.tar.gz 2>/dev/null &&
  rm -rf served anchors gen.json gen-profiles.txt offline.json misc.tar.gz && mv /tmp/all.tgz .)
ls "$out"
