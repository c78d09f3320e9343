#!/usr/bin/env bash
# Run 59 (written 2026-12-07, ninth session, extended in the tenth; any card; ~7 minutes fresh on an
# H100, ~9 on an H200).
# Main now makes the fold's terms on the tensor cores by default (run 58) and groups a jagged bucket's
# passes by image. This call:
#   1. the fold kernels' and UpscaleHyper's GPU tests, and the folded way's module and engine tests
#      with the new default
#   2. UpscaleHyper's GELU table (MASKD_GELU_TABLE=1, opt-in) against the expression, A-B-A-B, each
#      with the decoder rows profiled: run 58 timed it once, unprofiled, at the end of the call, when
#      the post-processing (which it does not touch) had also slowed by 16 %, so it showed nothing
#   2b. the absorbed token->image attentions (MASKD_DECODER_ABSORB=1, opt-in, tenth session; never run
#      on a GPU before): AbsorbedAttention's kernel test and the decoder's bf16 test with it, then the
#      decoder rows in the same A-B order (base, GELU table, absorbed, twice)
#   3. maskbench's default rows (vit_b / vit_h, bs1 and bs32), profiled: the new default as shipped
#   4. on an H200 only, time allowing: the seed's quick set and its vit_h bs32 row (issue #12's vit_h
#      1.6x is an H200 target; no H200 has been lent since run 40)
#   5. time allowing: #13's served clicks, vit_b at 1, 16 and 256 clients (last measured in runs 51/53,
#      before the batched hypernetworks and this wave's decoder changes)
#   mkdir -p $OUT && OUT=$OUT CALL_LIMIT=540 timeout 560 bash bench/results/next/next-call-59.sh
set -uo pipefail
cd "$(dirname "$0")/../../.."
export BUILD_TARGETS=${BUILD_TARGETS:-"maskd maskload maskctl maskbench model_gpu_test kernels_fusion_gpu_test model_fusion_gpu_test model_fast_decoder_gpu_test"}
source scripts/gpu-host/call-prelude.sh
left() { echo $(( ${CALL_LIMIT:-540} - ($(date +%s) - S) )); }
timeout 60 "$B/tests/kernels_fusion_gpu_test" --gtest_filter='*Fold*:*UpscaleHyper*:*Absorbed*:*FewQuery*' > "$out/tests.log" 2>&1
echo "kernels_fusion_gpu_test (fold kernels, UpscaleHyper, AbsorbedAttention, FewQuery) rc=$?" >> "$out/perf.log"
timeout 60 "$B/tests/model_fast_decoder_gpu_test" --gtest_filter='*Bf16Error*' >> "$out/tests.log" 2>&1
echo "model_fast_decoder_gpu_test (bf16 error, with the absorbed attentions) rc=$?" >> "$out/perf.log"
timeout 40 "$B/tests/model_fusion_gpu_test" --gtest_filter='*Folded*' >> "$out/tests.log" 2>&1
echo "model_fusion_gpu_test (default fold kernel) rc=$?" >> "$out/perf.log"
timeout 40 "$B/tests/model_gpu_test" --gtest_filter='*GlobalAttention*' >> "$out/tests.log" 2>&1
echo "model_gpu_test (default fold kernel) rc=$?" >> "$out/perf.log"
grep -E "^\[  (PASSED|FAILED) |^\[ +FAILED |Failure|Expected|Which is|rel L2|absorbed|projected" "$out/tests.log" | cut -c1-240 | head -60 >> "$out/perf.log"
t tests
decoder() {  # decoder NAME TAG [VAR=VALUE]: the vit_b decoder rows with the variable set, profiled
  local d="$out/prof-$1-$2"; mkdir -p "$d"
  env ${3:-MASKD_NONE=0} timeout 60 "$B/load_tests/maskbench" --arch vit_b --batch 1 --fp32-batch 1 --rows "global attention" \
    --profile "$d" --profile-rows "global attention" > "$d/bench.log" 2>&1
  echo "--- $1 (${3:-defaults}, $2): rc=$?" >> "$out/perf.log"
  grep -E "decoder shared-image" "$d/bench.log" | cut -c1-250 >> "$out/perf.log"
  grep -hE "^===.*shared-image|UpscaleHyper|Absorbed|FewQuery|^gemm  |kernel total" "$d/profiles.txt" | grep -v "encoder, batch" | cut -c1-150 >> "$out/perf.log"
  rm -f "$d"/trace-*.json
  t "decoder $1 $2"
}
for tag in a b; do
  [ "$(left)" -gt 45 ] && decoder base $tag
  [ "$(left)" -gt 45 ] && decoder gelu $tag MASKD_GELU_TABLE=1
  [ "$(left)" -gt 45 ] && decoder absorb $tag MASKD_DECODER_ABSORB=1
done
if [ "$(left)" -gt 80 ]; then
  d="$out/prof-default"; mkdir -p "$d"
  timeout $(( $(left) > 100 ? 90 : $(left) - 10 )) "$B/load_tests/maskbench" --arch vit_b,vit_h --batch 1,32 \
    --fp32-batch 1 --no-latency --rows "global attention" --profile "$d" --profile-rows "global attention" \
    --json "$d/bench.json" > "$d/bench.log" 2> "$d/bench.err"
  echo "--- default: maskbench rc=$?" >> "$out/perf.log"
  grep -E "^vit|^peak" "$d/bench.log" | cut -c1-200 >> "$out/perf.log"
  grep -E "global attention per block" "$d/bench.err" | cut -c1-400 >> "$out/perf.log"
  grep -hE "^===|kernel total|^attention  |^other  |^gemm  " "$d/profiles.txt" | cut -c1-150 >> "$out/perf.log"
  rm -f "$d"/trace-*.json
  t default
fi
if nvidia-smi --query-gpu=name --format=csv,noheader | grep -q H200; then
  if [ "$(left)" -gt 75 ]; then
    timeout $(( $(left) > 125 ? 110 : $(left) - 10 )) bash .carry/anchors/run.sh "$out/anchors" quick > /dev/null 2>&1
    t seed-quick
  fi
  if [ "$(left)" -gt 80 ]; then
    bash scripts/gpu-host/seed-row.sh "$out/anchors" fast_vit_h_bs32 $(( $(left) > 110 ? 100 : $(left) - 10 )) \
      offline --impl fast --model vit_h --batch 32
    t seed-vit_h
  fi
fi
if [ "$(left)" -gt 75 ]; then
  OUT=$out/served SERVED_DURATION=10 timeout $(( $(left) - 10 )) bash scripts/gpu-host/served-bench.sh \
    vit_b:bf16::interactive:1 vit_b:bf16::interactive:16 vit_b:bf16::interactive:256 > "$out/served.log" 2>&1
  grep -E "rc=" "$out/served.log" | cut -c1-300 >> "$out/perf.log"
  grep -h -B1 -A2 "server per call" "$out"/served/maskload-*.log 2>/dev/null | cut -c1-200 >> "$out/perf.log"
  t served
fi
if ! nvidia-smi --query-gpu=name --format=csv,noheader | grep -q H200 && [ "$(left)" -gt 75 ]; then
  # on an H100 the seed's quick set comes last, so the maskbench rows above have their same-call ratio
  timeout $(( $(left) > 125 ? 110 : $(left) - 10 )) bash .carry/anchors/run.sh "$out/anchors" quick > /dev/null 2>&1
  t seed-quick
fi
grep -h RESULT "$out"/anchors/RESULTS.txt 2>/dev/null | head -8 | cut -c1-300 >> "$out/perf.log"
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv >> "$out/perf.log" 2>&1
pack $(cd "$out" && ls -d prof-* 2>/dev/null) anchors served served.log tests.log misc.tar.gz
ls "$out"
