#!/usr/bin/env bash
# Runs the libFuzzer targets (tests/fuzz, built with MASKD_FUZZ=ON) one after another, each for a
# bounded time, starting from its committed seed corpus. New interesting inputs go to a work corpus
# outside the tree (the seeds stay as committed); a crash leaves its input in the artifacts folder
# and makes this script fail, after the remaining targets have run.
#
#   scripts/fuzz.sh BUILD_DIR SECONDS_PER_TARGET [TARGET...]   (default: every fuzz_* target built)
# Environment: MASKD_FUZZ_WORK (default BUILD_DIR/fuzz-work): work corpora, artifacts and logs.
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
[ $# -ge 2 ] || { sed -n '2,9p' "$0" | sed 's/^# \{0,1\}//' >&2; exit 2; }
build=$(cd "$1" && pwd)
seconds=$2
shift 2
targets=("$@")
if [ ${#targets[@]} -eq 0 ]; then
  for f in "$build"/tests/fuzz/fuzz_*; do [ -x "$f" ] && targets+=("$(basename "$f")"); done
fi
[ ${#targets[@]} -gt 0 ] || { echo "fuzz.sh: no fuzz_* targets in $build/tests/fuzz" >&2; exit 1; }
work=${MASKD_FUZZ_WORK:-$build/fuzz-work}
export LSAN_OPTIONS="suppressions=$here/tests/fuzz/lsan.supp:print_suppressions=0"
export UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1"
failed=()
total=0
for t in "${targets[@]}"; do
  corpus="$work/corpus/$t"
  mkdir -p "$corpus" "$work/artifacts"
  log="$work/$t.log"
  # -rss_limit_mb: a lying header must be refused, not allocated; 2 GB is far above any valid input's
  # cost at these targets' limits. -timeout: one input taking 10 s is a hang worth reporting.
  if "$build/tests/fuzz/$t" -max_total_time="$seconds" -rss_limit_mb=2048 -timeout=10 \
      -print_final_stats=1 -artifact_prefix="$work/artifacts/$t-" "$corpus" \
      "$here/tests/fuzz/corpus/$t" >"$log" 2>&1; then
    status=ok
  else
    status="FAILED (see $log)"
    failed+=("$t")
  fi
  runs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -1)
  total=$(( total + ${runs:-0} ))
  printf 'fuzz: %-20s %10s executions in %ss: %s\n' "$t" "${runs:-?}" "$seconds" "$status"
done
echo "fuzz: $total executions in total"
if [ ${#failed[@]} -gt 0 ]; then
  for t in "${failed[@]}"; do grep -m1 -B2 -A25 -E 'ERROR|FUZZ_CHECK|runtime error' "$work/$t.log" >&2 || tail -30 "$work/$t.log" >&2; done
  exit 1
fi
