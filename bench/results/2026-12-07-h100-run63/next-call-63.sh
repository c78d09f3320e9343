#!/usr/bin/env bash
# Run 63 (written in the tenth session; any card, ~6 minutes fresh on an H100, ~8 on an H200).
#   1. the kernels' tests and the decoder's GPU tests: 5665deb moved the few-query and absorbed
#      kernels' online-softmax step into mma_sync.cuh and eb29c86 their ldmatrix lane offsets, with
#      UpscaleHyper's, the image->token update's and the fold kernel's (same float / mma instruction
#      counts and registers; not yet run on a GPU), and UpscaleHyper without the GELU table (removed)
#   1b. the mask evaluation with a lane per column (MaskEvalColumnsKernel, eleventh session; not yet run
#      on a GPU): kernels_gpu_test's MaskPostprocess tests, then the vit_b decoder rows A-B-A-B against
#      the previous layout (MASKD_MASK_EVAL=rows), profiled; and once with decoder passes of up to 256
#      prompts (maskbench --decoder-pass-prompts 256; eager) for the jagged 256-over-32 row
#   2. maskbench's default rows (vit_b / vit_h, bs1 and bs32) and the decoder rows, profiled
#   3. on an H200: the seed's vit_h bs32 row (#12's vit_h 1.6x is an H200 target; none lent since run 40)
#   4. #13's served clicks, vit_b at 1, 16 and 256 clients, then the seed's quick set
# If an H200 comes, this is the call to make first; on an H100 it repeats run 59-61's figures.
#   mkdir -p $OUT && OUT=$OUT CALL_LIMIT=540 timeout 560 bash bench/results/next/next-call-63.sh
set -uo pipefail
cd "$(dirname "$0")/../../.."
export BUILD_TARGETS=${BUILD_TARGETS:-"maskd maskload maskctl maskbench kernels_fusion_gpu_test model_fast_decoder_gpu_test kernels_gpu_test"}
source scripts/gpu-host/call-prelude.sh
left() { echo $(( ${CALL_LIMIT:-540} - ($(date +%s) - S) )); }
h200() { nvidia-smi --query-gpu=name --format=csv,noheader | grep -q H200; }
timeout 90 "$B/tests/kernels_fusion_gpu_test" --gtest_filter='*FewQuery*:*Absorbed*:*UpscaleHyper*:*ImageToToken*:*Fold*' > "$out/tests.log" 2>&1
echo "kernels_fusion_gpu_test (FewQuery, AbsorbedAttention, UpscaleHyper, ImageToToken, Fold) rc=$?" >> "$out/perf.log"
timeout 120 "$B/tests/model_fast_decoder_gpu_test" >> "$out/tests.log" 2>&1
echo "model_fast_decoder_gpu_test (all) rc=$?" >> "$out/perf.log"
timeout 90 "$B/tests/kernels_gpu_test" --gtest_filter='*MaskPostprocess*' >> "$out/tests.log" 2>&1
echo "kernels_gpu_test (MaskPostprocess*) rc=$?" >> "$out/perf.log"
grep -E "^\[  (PASSED|FAILED) |^\[ +FAILED |Failure|Expected|Which is|rel L2|attentions|MaskEval layouts" "$out/tests.log" | cut -c1-240 | head -60 >> "$out/perf.log"
t tests
decoder() {  # decoder NAME TAG [VAR=VALUE]: the vit_b decoder rows with the variable set, profiled
  local d="$out/prof-$1-$2"; mkdir -p "$d"
  env ${3:-MASKD_NONE=0} timeout 60 "$B/load_tests/maskbench" --arch vit_b --batch 1 --fp32-batch 1 --rows "global attention" \
    --decode-cases 64/16 --profile "$d" --profile-rows "global attention" ${4:-} > "$d/bench.log" 2>&1
  echo "--- $1 (${3:-defaults}, $2): rc=$?" >> "$out/perf.log"
  grep -E "decoder shared-image" "$d/bench.log" | cut -c1-250 >> "$out/perf.log"
  grep -hE "^===.*shared-image|MaskEval|kernel total" "$d/profiles.txt" | grep -v "encoder, batch" | cut -c1-150 >> "$out/perf.log"
  rm -f "$d"/trace-*.json
  t "decoder $1 $2"
}
# On an H200 one pair (the encoder's and the seed's vit_h rows need the time), on an H100 two.
for tag in a $(h200 || echo b); do
  [ "$(left)" -gt 300 ] && decoder columns $tag
  [ "$(left)" -gt 300 ] && decoder rows $tag MASKD_MASK_EVAL=rows
  # Decoder passes of up to 256 prompts (eager: no graph above 64) against 64 a pass, for the 256/32 row.
  [ "$tag" = a ] && [ "$(left)" -gt 300 ] && decoder pass256 $tag MASKD_NONE=0 --decoder-pass-prompts=256
done
# The encoder rows only on an H200 (#12's card; nothing on the encoder's path changed since run 59's H100 rows).
if h200 && [ "$(left)" -gt 250 ]; then
  d="$out/prof-default"; mkdir -p "$d"
  timeout 110 "$B/load_tests/maskbench" --arch vit_b,vit_h --batch 1,32 --fp32-batch 1 --rows "global attention" --decode-cases 64/16 \
    --profile "$d" --profile-rows "global attention" --json "$d/bench.json" > "$d/bench.log" 2> "$d/bench.err"
  echo "--- default: maskbench rc=$?" >> "$out/perf.log"
  grep -E "^vit|^peak|decoder shared-image" "$d/bench.log" | cut -c1-220 >> "$out/perf.log"
  grep -E "global attention per block" "$d/bench.err" | cut -c1-400 >> "$out/perf.log"
  grep -hE "^===|kernel total" "$d/profiles.txt" | cut -c1-150 >> "$out/perf.log"
  rm -f "$d"/trace-*.json
  t default
fi
if h200 && [ "$(left)" -gt 200 ]; then
  bash scripts/gpu-host/seed-row.sh "$out/anchors-vit_h" fast_vit_h_bs32 $(( $(left) > 110 ? 100 : $(left) - 10 )) \
    offline --impl fast --model vit_h --batch 32
  t seed-vit_h
fi
if [ "$(left)" -gt 150 ]; then
  OUT=$out/served SERVED_DURATION=10 timeout $(( $(left) - 70 )) bash scripts/gpu-host/served-bench.sh \
    vit_b:bf16::interactive:1 vit_b:bf16::interactive:16 vit_b:bf16::interactive:256 > "$out/served.log" 2>&1
  grep -E "rc=" "$out/served.log" | cut -c1-300 >> "$out/perf.log"
  grep -h -B1 -A2 "server per call" "$out"/served/maskload-*.log 2>/dev/null | cut -c1-200 >> "$out/perf.log"
  t served
fi
if [ "$(left)" -gt 65 ]; then
  timeout $(( $(left) > 120 ? 110 : $(left) - 10 )) bash .carry/anchors/run.sh "$out/anchors" quick > /dev/null 2>&1
  t seed-quick
fi
grep -h RESULT "$out"/anchors/RESULTS.txt "$out"/anchors-vit_h/RESULTS.txt 2>/dev/null | head -8 | cut -c1-300 >> "$out/perf.log"
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv >> "$out/perf.log" 2>&1
pack prof-default prof-columns-a prof-rows-a prof-pass256-a prof-columns-b prof-rows-b anchors anchors-vit_h served served.log tests.log misc.tar.gz
ls "$out"
