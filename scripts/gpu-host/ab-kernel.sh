#!/usr/bin/env bash
# A kernel change against HEAD's version in one device call, A-B-A: the working tree's files (new)
# and HEAD's copies carried in .carry/base/ (base), swapped in and maskbench rebuilt within the call.
# Before the call: `git show HEAD:FILE > .carry/base/$(basename FILE)` for each of AB_FILES.
#   OUT=$OUT CALL_LIMIT=400 AB_FILES="kernels/x.cu kernels/x.cc" AB_TESTS="kernels_gpu_test:*X* ..." \
#     bash scripts/gpu-host/ab-kernel.sh
# AB_TESTS: BINARY:GTEST_FILTER items run on the new build first; AB_ROWS: maskbench rows (default
# main's, "GEMM epilogues"); AB_ARCH (vit_b,vit_h), AB_BATCH (32). perf.log gets the test verdicts,
# maskbench's rows as new / base / new again and the attention/GEMM/norm lines of both profiles.
set -uo pipefail
cd "$(dirname "$0")/../.."
: "${AB_FILES:?AB_FILES: the files to compare}"
for f in $AB_FILES; do
  [ -f ".carry/base/$(basename "$f")" ] || { echo "ab-kernel.sh: no .carry/base/$(basename "$f")" >&2; exit 2; }
done
source scripts/gpu-host/call-prelude.sh
left() { echo $(( ${CALL_LIMIT:-400} - ($(date +%s) - S) )); }
rows=${AB_ROWS:-GEMM epilogues}
set -f  # the filters' * are gtest's, not the shell's
for item in ${AB_TESTS:-}; do
  timeout 90 "$B/tests/${item%%:*}" --gtest_filter="${item#*:}"
done > "$out/tests.log" 2>&1
set +f
grep -E "^\[  (PASSED|FAILED) |^\[ +FAILED |Failure|Expected|Which is|Value of|Actual" "$out/tests.log" | cut -c1-240 >> "$out/perf.log"
t tests
bench() {
  timeout 90 "$B/load_tests/maskbench" --arch "${AB_ARCH:-vit_b,vit_h}" --batch "${AB_BATCH:-32}" --fp32-batch 1 \
    --no-latency --rows "$rows" "$@"
}
swap() {  # from-folder: copies AB_FILES' basenames from it into the tree, rebuilds maskbench
  for f in $AB_FILES; do cp "$1/$(basename "$f")" "$f"; done
  timeout 150 cmake --build "$B" --target maskbench > "$out/misc-rebuild-$2.log" 2>&1
  echo "rebuild $2 rc=$?" >> "$out/perf.log"
}
mkdir -p "$out/prof" "$out/prof-base" /tmp/ab-new
for f in $AB_FILES; do cp "$f" /tmp/ab-new/; done
bench --profile "$out/prof" --profile-rows "$rows" > "$out/bench.log" 2>&1
t bench-new
swap .carry/base base
bench --profile "$out/prof-base" --profile-rows "$rows" > "$out/bench-base.log" 2>&1
t bench-base
swap /tmp/ab-new new
if [ "$(left)" -gt 60 ]; then
  bench > "$out/bench-new2.log" 2>&1
  t bench-new2
fi
grep -E "^vit" "$out/bench.log" | cut -c1-200 >> "$out/perf.log"
grep -E "^vit" "$out/bench-base.log" | cut -c1-200 | sed 's/^/base: /' >> "$out/perf.log"
grep -E "^vit" "$out/bench-new2.log" 2>/dev/null | cut -c1-200 | sed 's/^/new again: /' >> "$out/perf.log"
grep -hE "^===|kernel total|^attention|^gemm  |^norm  " "$out/prof/profiles.txt" | cut -c1-160 >> "$out/perf.log"
grep -hE "^===|kernel total|^attention" "$out/prof-base/profiles.txt" | cut -c1-160 | sed 's/^/base: /' >> "$out/perf.log"
cp "$out/prof/profiles.txt" "$out/profiles-encoder.txt"; cp "$out/prof-base/profiles.txt" "$out/profiles-encoder-base.txt"
pack prof prof-base bench-new2.log misc-rebuild-base.log misc-rebuild-new.log misc.tar.gz
ls "$out"
