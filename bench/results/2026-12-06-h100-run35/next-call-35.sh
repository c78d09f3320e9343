#!/usr/bin/env bash
# Run 35 (2026-12-06, second session): two uncommitted kernel changes, each against a same-binary knob.
#   a) FewQueryHeadsKernel (git apply bench/results/next/fewquery-heads.patch): one block over all 8
#      heads of 8+ prompts; MASKD_FEWQUERY_PER_HEAD=1 runs the per-head kernel.
#   b) the rel-pos tables staged in shared memory by the 4-warp (windowed) attention CTAs;
#      MASKD_RELPOS_TABLES_FROM_L2=1 reads them from global memory as before.
# No golden data and no seed (carry .gpu-debs and a small .carry): only same-call before/after.
#   1. build; FewQuery + RelPos kernel tests, the decoder against the original, the fused encoder
#   2. maskbench vit_b,vit_h bs32 (profile), with the tables knob, again without (A B A)
#   3. maskbench vit_b bs1 latency rows (profile), with the FewQuery knob
set -uo pipefail
cd "$(dirname "$0")/../../.."
source scripts/gpu-host/call-prelude.sh
left() { echo $(( ${CALL_LIMIT:-380} - ($(date +%s) - S) )); }
{
  timeout 40 "$B/tests/kernels_fusion_gpu_test" --gtest_filter='*FewQuery*:*RelPos*'
  timeout 40 "$B/tests/kernels_gpu_test" --gtest_filter='*RelPos*'
  timeout 60 "$B/tests/model_fast_decoder_gpu_test"
  timeout 60 "$B/tests/model_fusion_gpu_test"
} > "$out/tests.log" 2>&1
grep -E "^\[  (PASSED|FAILED) |^\[ +FAILED |Failure|Expected|Which is" "$out/tests.log" | cut -c1-240 >> "$out/perf.log"
t tests
mkdir -p "$out/prof" "$out/prof1"
bs32() {
  timeout 70 "$B/load_tests/maskbench" --arch vit_b,vit_h --batch 32 --fp32-batch 1 --no-latency \
    --rows "windows made" "$@"
}
bs32 --profile "$out/prof" --profile-rows "windows made" > "$out/bench.log" 2>&1
t bench-a
MASKD_RELPOS_TABLES_FROM_L2=1 bs32 > "$out/bench-l2.log" 2>&1
t bench-b
bs32 > "$out/bench-a2.log" 2>&1
t bench-a2
grep -E "^vit" "$out/bench.log" | cut -c1-200 >> "$out/perf.log"
grep -E "^vit" "$out/bench-l2.log" | cut -c1-200 | sed 's/^/tables from L2: /' >> "$out/perf.log"
grep -E "^vit" "$out/bench-a2.log" | cut -c1-200 | sed 's/^/again: /' >> "$out/perf.log"
grep -hE "^===|kernel total|RelPosAttention" "$out/prof/profiles.txt" | cut -c1-200 >> "$out/perf.log"
timeout 50 "$B/load_tests/maskbench" --arch vit_b --batch 1 --fp32-batch 1 \
  --rows "windows made" --profile "$out/prof1" --profile-rows "windows made" > "$out/bench-bs1.log" 2>&1
grep -E "click|prompt" "$out/bench-bs1.log" | cut -c1-200 >> "$out/perf.log"
grep -hE "^===|kernel total|FewQuery" "$out/prof1/profiles.txt" | cut -c1-200 >> "$out/perf.log"
t bench-bs1
if [ "$(left)" -gt 25 ]; then
  MASKD_FEWQUERY_PER_HEAD=1 timeout $(( $(left) - 5 )) "$B/load_tests/maskbench" --arch vit_b --batch 1 \
    --fp32-batch 1 --rows "windows made" > "$out/bench-per-head.log" 2>&1
  grep -E "click|prompt" "$out/bench-per-head.log" | cut -c1-200 | sed 's/^/per-head: /' >> "$out/perf.log"
  t bench-per-head
fi
cp "$out/prof/profiles.txt" "$out/profiles-encoder.txt"; cp "$out/prof1/profiles.txt" "$out/profiles-bs1.txt"
pack prof prof1 bench-l2.log bench-a2.log bench-per-head.log misc.tar.gz
ls "$out"
