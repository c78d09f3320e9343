#!/usr/bin/env bash
# Run 71 (written in the fourteenth session; the device time ran out before a machine started for
# it), any card (an H200 gives #13's figures on the card its targets name), ~9 minutes: every #13
# figure the served path owes, in one call beside the seed, so that the issue can be closed on them.
#   1. tests: kernels_fusion_gpu_test whole and model_fast_decoder_gpu_test, on the build without the
#      on-keys and pipelined update kernels (05f2a07; run 70 measured both slower; checked without a
#      GPU: every remaining decoder_fusion kernel's SASS identical to the tested build's)
#   2. served vit_b clicks at 1 and 16 clients (c1 p99 3 ms: last measured in run 64, 4.12 ms, outside
#      the server's stages; c16 in run 67) and at 256 (20k prompts/s)
#   3. served batch mode, vit_b c64 and vit_h c32, and the offline maskbench rows of both at bs32 in
#      the same call (>= 0.9 of offline: last measured in runs 51-52, before the encoder's later gains)
#   4. if time is left, c256 with --postprocess-threads=12; the seed's quick set (and its vit_h row on
#      an H200)
#   mkdir -p $OUT && OUT=$OUT CALL_LIMIT=540 timeout 560 bash bench/results/next/next-call-71.sh
set -uo pipefail
cd "$(dirname "$0")/../../.."
export BUILD_TARGETS=${BUILD_TARGETS:-"maskd maskload maskctl maskbench kernels_fusion_gpu_test model_fast_decoder_gpu_test"}
source scripts/gpu-host/call-prelude.sh
export CALL_LIMIT=${CALL_LIMIT:-540}
gpu_tests kernels_fusion_gpu_test model_fast_decoder_gpu_test
[ "$(left)" -gt 300 ] && served levels 1 16
[ "$(left)" -gt 260 ] && served c256 256
if [ "$(left)" -gt 220 ]; then
  WORKLOAD=batch DURATION=15 served batch-b 64
  ARCH=vit_h WORKLOAD=batch DURATION=15 served batch-h 32
fi
[ "$(left)" -gt 150 ] && encoder_rows offline vit_b,vit_h 32 "global attention"
# If time is left: 256 clients with 12 post-processing threads instead of half the cores (8 on the
# 16-core host; run 69's c256 calls waited 1.36 ms for one, while a drain holds its thread through
# the batch's 3.6 ms of mask evaluation and copies).
[ "$(left)" -gt 130 ] && MASKD_FLAGS="--postprocess-threads=12" served pt12 256
served_stages
h200 && [ "$(left)" -gt 170 ] && {
  bash scripts/gpu-host/seed-row.sh "$out/anchors-vit_h" fast_vit_h_bs32 100 offline --impl fast --model vit_h --batch 32
  t seed-vit_h; }
finish offline
