# Steps a device call's script repeats (sourced by call-prelude.sh, after $out, S, t, $B and pack).
# The per-call scripts under bench/results/ from run 69 back define their own copies; they stay as
# they ran.

# left: seconds left of CALL_LIMIT (default 540) since the prelude started.
left() { echo $(( ${CALL_LIMIT:-540} - ($(date +%s) - S) )); }

# h200: whether the call's card is an H200 (#12's and #13's targets are H200 figures).
h200() { nvidia-smi --query-gpu=name --format=csv,noheader | grep -q H200; }

# gpu_tests "BINARY [GTEST ARGS]"...: each test binary under $B/tests (60 s each at most) into
# tests.log, then the status and the result, failure and error-figure lines into perf.log.
gpu_tests() {
  local spec rc=0
  for spec in "$@"; do
    # shellcheck disable=SC2086
    timeout 60 "$B/tests/"$spec >> "$out/tests.log" 2>&1 || rc=$?
  done
  echo "tests rc=$rc" >> "$out/perf.log"
  grep -E "^\[  (PASSED|FAILED) |^\[ +FAILED |Failure|Expected|Which is|rel L2 vs fp32" "$out/tests.log" \
    | cut -c1-240 | head -60 >> "$out/perf.log"
  t tests
}

# decode_cases TAG CASES [VAR=VALUE]: maskbench's vit_b decoder rows with --decode-cases CASES (e.g.
# 256/32,64/16), profiled, with VAR set for maskbench; the rows and the profile's lines matching
# PROFILE_LINES (default: the decoder tables' titles and kernel totals) into perf.log.
decode_cases() {
  local d="$out/cases-$1"; mkdir -p "$d"
  env ${3:-MASKD_NONE=0} timeout 70 "$B/load_tests/maskbench" --arch vit_b --batch 1 --fp32-batch 1 \
    --rows "global attention" --decode-cases "$2" --profile "$d" --profile-rows "global attention" \
    > "$d/bench.log" 2>&1
  echo "--- decode cases $1 (${3:-default}): rc=$?" >> "$out/perf.log"
  grep -E "decoder shared-image" "$d/bench.log" | cut -c1-200 >> "$out/perf.log"
  grep -hE "${PROFILE_LINES:-^===.*shared-image|kernel total}" "$d/profiles.txt" 2>/dev/null \
    | grep -v "encoder, batch" | cut -c1-150 >> "$out/perf.log"
  rm -f "$d"/trace-*.json
  t "cases $1"
}

# served TAG LEVEL... : served clicks (WORKLOAD, default interactive) of ARCH (default vit_b) at each
# concurrency LEVEL, DURATION s a level (default 10), maskd run with MASKD_FLAGS (its command-line
# flags, space-separated) and VARS (space-separated environment assignments); each level's summary
# line into perf.log.
served() {
  local tag=$1; shift
  local specs=() c
  for c in "$@"; do specs+=("${ARCH:-vit_b}:bf16:${MASKD_FLAGS:-}:${WORKLOAD:-interactive}:$c"); done
  env ${VARS:-MASKD_NONE=0} OUT=$out/served SERVED_TAG=$tag SERVED_DURATION=${DURATION:-10} \
    timeout $(( 20 + (${DURATION:-10} + 30) * $# )) \
    bash scripts/gpu-host/served-bench.sh "${specs[@]}" >> "$out/served.log" 2>&1
  echo "--- served $tag (${ARCH:-vit_b} ${WORKLOAD:-interactive}${MASKD_FLAGS:+ $MASKD_FLAGS}${VARS:+ $VARS})" \
    >> "$out/perf.log"
  grep -- "-$tag rc=" "$out/served.log" | cut -c1-230 >> "$out/perf.log"
  t "served $tag"
}

# encoder_rows TAG ARCHS BATCHES ROWS [PROFILE_ROWS]: maskbench's encoder rows (the rows whose names
# contain one of ROWS, comma-separated) at BATCHES, within the time left less 60 s; profiled when
# PROFILE_ROWS is given; the rows (and the profile's titles and kernel totals) into perf.log.
encoder_rows() {
  local d="$out/$1"; mkdir -p "$d"
  local profile=()
  [ -n "${5:-}" ] && profile=(--profile "$d" --profile-rows "$5")
  timeout $(( $(left) - 60 )) "$B/load_tests/maskbench" --arch "$2" --batch "$3" --fp32-batch 1 --no-latency \
    --rows "$4" "${profile[@]}" --json "$d/bench.json" > "$d/bench.log" 2> "$d/bench.err"
  echo "--- encoder rows $1 ($4): maskbench rc=$?" >> "$out/perf.log"
  grep -E "^vit|^peak" "$d/bench.log" | cut -c1-220 >> "$out/perf.log"
  grep -hE "^===|kernel total" "$d/profiles.txt" 2>/dev/null | cut -c1-150 >> "$out/perf.log"
  rm -f "$d"/trace-*.json
  t "$1"
}

# served_stages: every served level's latency and server-stage lines into perf.log.
served_stages() {
  grep -h -B1 -A2 "server per call" "$out"/served/maskload-*.log 2>/dev/null | cut -c1-200 >> "$out/perf.log"
}

# finish NAME...: the seed's quick set if more than 60 s are left (at most 85 s), its RESULT lines
# (and a vit_h row's from anchors-vit_h), the card, then NAME... packed into all.tgz.
finish() {
  if [ "$(left)" -gt 60 ]; then
    timeout $(( $(left) > 90 ? 85 : $(left) - 5 )) bash .carry/anchors/run.sh "$out/anchors" quick > /dev/null 2>&1
    t seed-quick
  fi
  grep -h RESULT "$out"/anchors/RESULTS.txt "$out"/anchors-vit_h/RESULTS.txt 2>/dev/null | head -8 | cut -c1-300 \
    >> "$out/perf.log"
  nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv >> "$out/perf.log" 2>&1
  pack "$@" anchors anchors-vit_h served served.log tests.log misc.tar.gz
  ls "$out"
}
