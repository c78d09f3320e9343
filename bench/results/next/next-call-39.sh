#!/usr/bin/env bash
# Run 39 (NOT RUN YET; written 2026-12-06, no device time left): window-rowpass.patch beside this
# file against HEAD's kernel rebuilt in the same call. Before the call:
#   git apply bench/results/next/window-rowpass.patch
#   mkdir -p .carry/base && git show HEAD:kernels/rel_pos_attention.cu > .carry/base/rel_pos_attention.cu
#   git show HEAD:kernels/rel_pos_attention.cc > .carry/base/rel_pos_attention.cc
# The patch: in window mode each thread keeps one 16-byte column of rows r0, r0 + 12, ... of a key
# tile (the column, its shared-memory offset and the table index step by constants) and a padded
# key's source is a byte offset from kb selected against the token's (no pointer select). SASS per
# key tile per thread (cuobjdump): vit_h 1122 -> 1042 (loads 291 -> 199), vit_b 967 -> 933 (loads
# 208 -> 135), and no register spills left in the window kernels (were 20-32 B).
#   1. build; RelPos + window-mode kernel tests, the fused encoder
#   2. maskbench vit_b,vit_h bs32 with the profile (new)
#   3. HEAD's kernel swapped in, rebuilt: the same (base)
#   4. new again (A B A), without the profile, if time is left
set -uo pipefail
cd "$(dirname "$0")/../../.."
source scripts/gpu-host/call-prelude.sh
left() { echo $(( ${CALL_LIMIT:-420} - ($(date +%s) - S) )); }
{
  timeout 60 "$B/tests/kernels_fusion_gpu_test" --gtest_filter='*RelPos*:*Window*'
  timeout 40 "$B/tests/kernels_gpu_test" --gtest_filter='*RelPos*'
  timeout 60 "$B/tests/model_fusion_gpu_test"
} > "$out/tests.log" 2>&1
grep -E "^\[  (PASSED|FAILED) |^\[ +FAILED |Failure|Expected|Which is|Value of|Actual" "$out/tests.log" | cut -c1-240 >> "$out/perf.log"
t tests
mkdir -p "$out/prof" "$out/prof-base"
bs32() {
  timeout 70 "$B/load_tests/maskbench" --arch vit_b,vit_h --batch 32 --fp32-batch 1 --no-latency \
    --rows "windows made" "$@"
}
bs32 --profile "$out/prof" --profile-rows "windows made" > "$out/bench.log" 2>&1
t bench-new
mkdir -p /tmp/new-src && cp kernels/rel_pos_attention.cu kernels/rel_pos_attention.cc /tmp/new-src/
cp .carry/base/rel_pos_attention.cu .carry/base/rel_pos_attention.cc kernels/
timeout 150 cmake --build "$B" --target maskbench > "$out/misc-rebuild-base.log" 2>&1; echo "rebuild base rc=$?" >> "$out/perf.log"
t rebuild-base
bs32 --profile "$out/prof-base" --profile-rows "windows made" > "$out/bench-base.log" 2>&1
t bench-base
cp /tmp/new-src/rel_pos_attention.cu /tmp/new-src/rel_pos_attention.cc kernels/
if [ "$(left)" -gt 110 ]; then
  timeout 150 cmake --build "$B" --target maskbench > "$out/misc-rebuild-new.log" 2>&1; echo "rebuild new rc=$?" >> "$out/perf.log"
  t rebuild-new
  bs32 > "$out/bench-new2.log" 2>&1
  t bench-new2
fi
grep -E "^vit" "$out/bench.log" | cut -c1-200 >> "$out/perf.log"
grep -E "^vit" "$out/bench-base.log" | cut -c1-200 | sed 's/^/base: /' >> "$out/perf.log"
grep -E "^vit" "$out/bench-new2.log" 2>/dev/null | cut -c1-200 | sed 's/^/new again: /' >> "$out/perf.log"
grep -hE "^===|kernel total|RelPosAttention|^attention|^gemm  |^norm" "$out/prof/profiles.txt" | cut -c1-160 >> "$out/perf.log"
grep -hE "^===|kernel total|RelPosAttention|^attention" "$out/prof-base/profiles.txt" | cut -c1-160 | sed 's/^/base: /' >> "$out/perf.log"
cp "$out/prof/profiles.txt" "$out/profiles-encoder.txt"; cp "$out/prof-base/profiles.txt" "$out/profiles-encoder-base.txt"
pack prof prof-base bench-new2.log misc-rebuild-base.log misc-rebuild-new.log misc.tar.gz
ls "$out"
