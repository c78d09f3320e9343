#!/usr/bin/env bash
# Run 46 (written 2026-12-06, NOT RUN YET; any H100/H200, ~6 minutes): global-rowpass.patch beside
# this file against HEAD's kernel rebuilt in the same call (A-B-A). The patch gives the global
# (non-window) attention the window mode's K/V loads: each thread one fixed 16-byte column of rows
# r0, r0 + kRowsPerPass, ..., the source a pointer stepped by a constant number of rows, instead of a
# runtime loop over chunk indices (a division by the chunks per row and a 64-bit product per copy).
# SASS per key tile per thread (cuobjdump, sm_90a): vit_h <bf16, 80, 8> 978 static + a 137-instruction
# loop run 2-3 times -> 777 straight-line; vit_b <bf16, 64, 8> 916 + 141 x 2-3 -> 706; register spills
# 4/8 B (was 8/16) and 0 (was 4/4). The kernel is issue-bound (80 HMMA a tile): expect the global
# blocks (vit_h 1.94, vit_b 1.15 ms/img at bs32 on an H100, run 42) to gain most of that.
# Before the call:
#   git apply bench/results/next/global-rowpass.patch && mkdir -p .carry/base
#   git show HEAD:kernels/rel_pos_attention.cu > .carry/base/rel_pos_attention.cu
# Then:
#   OUT=$OUT CALL_LIMIT=420 bash bench/results/next/next-call-46.sh
# Merge only if the tests pass and the new kernel is faster in the call.
set -uo pipefail
cd "$(dirname "$0")/../../.."
AB_FILES="kernels/rel_pos_attention.cu" AB_BATCH=1,32 \
  AB_TESTS="kernels_gpu_test:*RelPos* kernels_fusion_gpu_test:*RelPos*:*Window* model_fusion_gpu_test:*" \
  exec bash scripts/gpu-host/ab-kernel.sh
