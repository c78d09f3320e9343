#!/usr/bin/env bash
# Run 60 (tenth session; any card; ~6 minutes fresh on an H100). Run 59 ran the absorbed token->image
# attentions (MASKD_DECODER_ABSORB=1) for the first time: tests passed, 64 prompts' kernels 2.150 ->
# ~2.00 ms, but a click's 0.415 -> ~0.435 ms. This call finds the crossover and the served effect:
#   1. the decoder's thresholded rows at 1, 2, 4, 8, 16, 32 prompts of one image and 16 / 32 over
#      several images (maskbench --decode-cases), MASKD_DECODER_ABSORB=0 against =1, A-B-A-B
#   2. #13's served clicks (vit_b, 1 / 16 / 256 clients) with =0 and =1, then 16 / 256 again
#   3. the seed's quick set (the same-call comparison)
#   mkdir -p $OUT && OUT=$OUT CALL_LIMIT=540 timeout 560 bash bench/results/next/next-call-60.sh
set -uo pipefail
cd "$(dirname "$0")/../../.."
export BUILD_TARGETS=${BUILD_TARGETS:-"maskd maskload maskctl maskbench"}
source scripts/gpu-host/call-prelude.sh
left() { echo $(( ${CALL_LIMIT:-540} - ($(date +%s) - S) )); }
cases="2/1,4/1,8/1,16/1,32/1,16/16,32/8"
decoder() {  # decoder VALUE TAG: the vit_b decoder rows with MASKD_DECODER_ABSORB=VALUE
  MASKD_DECODER_ABSORB=$1 timeout 60 "$B/load_tests/maskbench" --arch vit_b --batch 1 --fp32-batch 1 \
    --rows "global attention" --decode-cases "$cases" > "$out/bench-absorb$1-$2.log" 2>&1
  echo "--- MASKD_DECODER_ABSORB=$1 ($2): rc=$?" >> "$out/perf.log"
  grep -E "decoder shared-image" "$out/bench-absorb$1-$2.log" | cut -c1-250 >> "$out/perf.log"
  t "decoder absorb=$1 $2"
}
for step in "0 a" "1 a" "0 b" "1 b"; do
  [ "$(left)" -gt 40 ] && decoder $step
done
served() {  # served VALUE TAG LEVELS...
  local v=$1 tag=$2; shift 2
  local runs=()
  for c in "$@"; do runs+=("vit_b:bf16::interactive:$c"); done
  MASKD_DECODER_ABSORB=$v SERVED_TAG="absorb$v$tag" OUT=$out/served SERVED_DURATION=10 \
    timeout $(( $(left) - 10 )) bash scripts/gpu-host/served-bench.sh "${runs[@]}" > "$out/served-absorb$v$tag.log" 2>&1
  grep -E "rc=" "$out/served-absorb$v$tag.log" | cut -c1-200 >> "$out/perf.log"
  t "served absorb=$v $tag"
}
[ "$(left)" -gt 70 ] && served 0 a 1 16 256
[ "$(left)" -gt 70 ] && served 1 a 1 16 256
[ "$(left)" -gt 100 ] && served 0 b 16 256
[ "$(left)" -gt 100 ] && served 1 b 16 256
grep -h -B1 -A2 "server per call" "$out"/served/maskload-*.log 2>/dev/null | cut -c1-200 >> "$out/perf.log"
if [ "$(left)" -gt 70 ]; then
  timeout $(( $(left) > 120 ? 110 : $(left) - 10 )) bash .carry/anchors/run.sh "$out/anchors" quick > /dev/null 2>&1
  t seed-quick
fi
grep -h RESULT "$out"/anchors/RESULTS.txt 2>/dev/null | head -8 | cut -c1-300 >> "$out/perf.log"
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv >> "$out/perf.log" 2>&1
pack $(cd "$out" && ls -d bench-absorb*.log served-absorb*.log 2>/dev/null) anchors served misc.tar.gz
ls "$out"
