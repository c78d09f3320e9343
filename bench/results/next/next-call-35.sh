#!/usr/bin/env bash
# NOT RUN YET (2026-12-06: the session's device time ran out before it could start). For the next
# session's first call: FewQueryHeadsKernel (fewquery-heads.patch beside this file, made on main
# 65ac977: one block over all 8 heads of 8+ prompts, whole 256-byte k / v rows staged; the per-head
# kernels refactored around one warp-step helper; new GPU test cases). Apply it first:
#   git apply bench/results/next/fewquery-heads.patch
# then run this script (OUT=$OUT bash bench/results/next/next-call-35.sh); it needs no golden data
# or seed, so .carry can hold only what the build needs (a call carries at most 64 MiB). If the tests
# pass and the all-heads kernel is faster than MASKD_FEWQUERY_PER_HEAD=1 in the same call, commit the
# patch; else drop it and record why.
#   1. build; FewQuery GPU tests (both kernels: the per-head one for 1-5 prompts, the all-heads one
#      for 8+), the decoder against the original (model_fast_decoder_gpu_test)
#   2. maskbench vit_b bs1 latency rows with --profile, then again with MASKD_FEWQUERY_PER_HEAD=1
#      (the per-head kernel, same binary): the before/after in one call
# No seed in this call (no time for it): only the same-call before/after is reported from it.
set -uo pipefail
cd "$(dirname "$0")/../../.."
source scripts/gpu-host/call-prelude.sh
[ -d .carry/golden/tiny-one ] || cp -r .carry/golden/tiny .carry/golden/tiny-one
export MASKD_GOLDEN_DIR=$PWD/.carry/golden
left() { echo $(( ${CALL_LIMIT:-270} - ($(date +%s) - S) )); }
{
  timeout 40 "$B/tests/kernels_fusion_gpu_test" --gtest_filter='*FewQuery*'
  timeout 60 "$B/tests/model_fast_decoder_gpu_test"
} > "$out/tests.log" 2>&1
grep -E "^\[  (PASSED|FAILED) |^\[ +FAILED |Failure|Expected|Which is" "$out/tests.log" | cut -c1-240 >> "$out/perf.log"
t tests
mkdir -p "$out/prof"
timeout $(( $(left) > 60 ? 50 : 30 )) "$B/load_tests/maskbench" --arch vit_b --batch 1 --fp32-batch 1 \
  --rows "windows made" --profile "$out/prof" --profile-rows "windows made" > "$out/bench.log" 2>&1
grep -E "click|prompt" "$out/bench.log" | cut -c1-200 >> "$out/perf.log"
grep -hE "^===|kernel total|FewQuery" "$out/prof/profiles.txt" | cut -c1-200 >> "$out/perf.log"
cp "$out/prof/profiles.txt" "$out/profiles-bs1.txt"
t bench
if [ "$(left)" -gt 25 ]; then
  MASKD_FEWQUERY_PER_HEAD=1 timeout $(( $(left) - 5 )) "$B/load_tests/maskbench" --arch vit_b --batch 1 \
    --fp32-batch 1 --rows "windows made" > "$out/bench-per-head.log" 2>&1
  grep -E "click|prompt" "$out/bench-per-head.log" | cut -c1-200 | sed 's/^/per-head: /' >> "$out/perf.log"
  t bench-per-head
fi
pack prof bench-per-head.log misc.tar.gz
ls "$out"
