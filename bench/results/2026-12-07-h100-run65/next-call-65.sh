#!/usr/bin/env bash
# Run 65 (twelfth session): the served decoder at 16 and 256 clients.
# Run 64 showed c256 batches of ~61 prompts over ~61 images (one click per client, each its own
# image) taking 2.95 ms of decoder compute against 1.7-2.2 ms offline for 64 prompts over 1-16
# images, the decoder ~85 % busy; c16's ~6-prompt batches 0.99 ms against 0.46 for a click.
#   1. model_fast_decoder_gpu_test: several images' first-block biases now added by the kernels that
#      read the projection (no AddRowsBroadcast pass when a decoder pass has more than one image)
#   2. maskbench's decode cases with one prompt per image (8/8, 16/16, 32/32) beside 8/1, 32/1, with
#      the change and with MASKD_DECODER_GROUP_BIAS=rows (the pass as before)
#   3. served c256, A-B-A-B of the same knob; then --decoder-max-prompts 128 (two passes of 64 per
#      batch back to back, fewer host gaps between batches)
#   4. served c16 at --decoder-queue-delay-us 200 (the script's default) and 0
#   5. the seed's quick set
#   mkdir -p $OUT && OUT=$OUT CALL_LIMIT=480 timeout 500 bash bench/results/next/next-call-65.sh
set -uo pipefail
cd "$(dirname "$0")/../../.."
export BUILD_TARGETS=${BUILD_TARGETS:-"maskd maskload maskctl maskbench model_fast_decoder_gpu_test"}
source scripts/gpu-host/call-prelude.sh
left() { echo $(( ${CALL_LIMIT:-480} - ($(date +%s) - S) )); }
timeout 90 "$B/tests/model_fast_decoder_gpu_test" > "$out/tests.log" 2>&1
echo "model_fast_decoder_gpu_test rc=$?" >> "$out/perf.log"
grep -E "^\[  (PASSED|FAILED) |^\[ +FAILED |Failure|Expected|Which is|worst" "$out/tests.log" | cut -c1-240 | head -40 >> "$out/perf.log"
t tests
cases() {  # cases TAG [VAR=VALUE]
  local d="$out/cases-$1"; mkdir -p "$d"
  env ${2:-MASKD_NONE=0} timeout 70 "$B/load_tests/maskbench" --arch vit_b --batch 1 --fp32-batch 1 --rows "global attention" \
    --decode-cases 8/1,8/8,16/16,32/1,32/32 > "$d/bench.log" 2>&1
  echo "--- decode cases $1 (${2:-}): rc=$?" >> "$out/perf.log"
  grep -E "decoder shared-image" "$d/bench.log" | cut -c1-200 >> "$out/perf.log"
  t "cases $1"
}
cases kernel-a
cases rows-a MASKD_DECODER_GROUP_BIAS=rows
served() {  # served TAG EXTRA LEVEL [VAR=VALUE]: vit_b clicks, 10 s
  local tag=$1 extra=$2 c=$3 var=${4:-MASKD_NONE=0}
  env $var DECODER_DELAY_US=${DELAY:-200} OUT=$out/served SERVED_TAG=$tag SERVED_DURATION=10 timeout 150 \
    bash scripts/gpu-host/served-bench.sh "vit_b:bf16:$extra:interactive:$c" >> "$out/served.log" 2>&1
  echo "--- served $tag ($extra $var, delay ${DELAY:-200})" >> "$out/perf.log"
  grep -- "-$tag rc=" "$out/served.log" | cut -c1-230 >> "$out/perf.log"
  t "served $tag"
}
[ "$(left)" -gt 100 ] && served kernel-a "" 256
[ "$(left)" -gt 100 ] && served rows-a "" 256 MASKD_DECODER_GROUP_BIAS=rows
[ "$(left)" -gt 100 ] && served kernel-b "" 256
[ "$(left)" -gt 100 ] && served rows-b "" 256 MASKD_DECODER_GROUP_BIAS=rows
[ "$(left)" -gt 110 ] && served mp128 "--decoder-max-prompts=128" 256
[ "$(left)" -gt 100 ] && served d200 "" 16
[ "$(left)" -gt 90 ] && DELAY=0 served d0 "" 16
grep -h -B1 -A2 "server per call" "$out"/served/maskload-*.log 2>/dev/null | cut -c1-200 >> "$out/perf.log"
if [ "$(left)" -gt 65 ]; then
  timeout $(( $(left) > 90 ? 80 : $(left) - 10 )) bash .carry/anchors/run.sh "$out/anchors" quick > /dev/null 2>&1
  t seed-quick
fi
grep -h RESULT "$out"/anchors/RESULTS.txt 2>/dev/null | head -8 | cut -c1-300 >> "$out/perf.log"
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv >> "$out/perf.log" 2>&1
pack cases-kernel-a cases-rows-a anchors served served.log tests.log misc.tar.gz
ls "$out"
