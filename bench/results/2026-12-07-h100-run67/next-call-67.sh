#!/usr/bin/env bash
# Run 67 (twelfth session), any card, a short call (~280 s). Run 66's traces showed the decoder's
# image side (kernels::ImageSideKeys) taking ATen's path, an add and a transposing copy per image
# (~20 us of host time an image), because the encoder's embeddings are position-major ([h, w, C] in
# memory: the neck's LayerNorm2d runs over channels-last rows) and the kernel took only contiguous
# ones. Now it takes both.
#   1. kernels_fusion_gpu_test's ImageSideKeys test (both layouts, mixed), model_fast_decoder_gpu_test
#   2. maskbench's decode cases (32/1, 32/32, 64/16 and the default rows), same binary, with the kernel
#      and with MASKD_IMAGE_SIDE_KEYS=aten (the path before)
#   3. served vit_b clicks at 256 and 16 clients; the seed's quick set if time is left
#   mkdir -p $OUT && OUT=$OUT CALL_LIMIT=285 timeout 300 bash bench/results/next/next-call-67.sh
set -uo pipefail
cd "$(dirname "$0")/../../.."
export BUILD_TARGETS=${BUILD_TARGETS:-"maskd maskload maskctl maskbench kernels_fusion_gpu_test model_fast_decoder_gpu_test"}
source scripts/gpu-host/call-prelude.sh
left() { echo $(( ${CALL_LIMIT:-285} - ($(date +%s) - S) )); }
{ timeout 40 "$B/tests/kernels_fusion_gpu_test" --gtest_filter='*ImageSideKeys*'
  timeout 60 "$B/tests/model_fast_decoder_gpu_test"; } > "$out/tests.log" 2>&1
echo "tests rc=$?" >> "$out/perf.log"
grep -E "^\[  (PASSED|FAILED) |^\[ +FAILED |Failure|Expected|Which is|worst" "$out/tests.log" | cut -c1-240 | head -40 >> "$out/perf.log"
t tests
cases() {  # cases TAG [VAR=VALUE]
  local d="$out/cases-$1"; mkdir -p "$d"
  env ${2:-MASKD_NONE=0} timeout 50 "$B/load_tests/maskbench" --arch vit_b --batch 1 --fp32-batch 1 --rows "global attention" \
    --decode-cases 32/1,32/32,64/16 > "$d/bench.log" 2>&1
  echo "--- decode cases $1 (${2:-}): rc=$?" >> "$out/perf.log"
  grep -E "decoder shared-image" "$d/bench.log" | cut -c1-200 >> "$out/perf.log"
  t "cases $1"
}
cases kernel-a
cases aten-a MASKD_IMAGE_SIDE_KEYS=aten
served() {  # served TAG LEVEL [VAR=VALUE]: vit_b clicks, 10 s
  local tag=$1 c=$2 var=${3:-MASKD_NONE=0}
  env $var OUT=$out/served SERVED_TAG=$tag SERVED_DURATION=10 timeout 60 \
    bash scripts/gpu-host/served-bench.sh "vit_b:bf16::interactive:$c" >> "$out/served.log" 2>&1
  echo "--- served $tag ($var)" >> "$out/perf.log"
  grep -- "-$tag rc=" "$out/served.log" | cut -c1-230 >> "$out/perf.log"
  t "served $tag"
}
[ "$(left)" -gt 35 ] && served kernel 256
[ "$(left)" -gt 35 ] && served kernel 16
[ "$(left)" -gt 35 ] && served aten 256 MASKD_IMAGE_SIDE_KEYS=aten
grep -h -B1 -A2 "server per call" "$out"/served/maskload-*.log 2>/dev/null | cut -c1-200 >> "$out/perf.log"
if [ "$(left)" -gt 70 ]; then
  timeout $(( $(left) - 5 )) bash .carry/anchors/run.sh "$out/anchors" quick > /dev/null 2>&1
  t seed-quick
fi
grep -h RESULT "$out"/anchors/RESULTS.txt 2>/dev/null | head -8 | cut -c1-300 >> "$out/perf.log"
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv >> "$out/perf.log" 2>&1
pack cases-kernel-a cases-aten-a anchors served served.log tests.log misc.tar.gz
ls "$out"
