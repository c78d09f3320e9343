#!/usr/bin/env bash
# Run 48 (written 2026-12-06 in the fifth session, for an H200; replaces runs 44 and 46 when device
# machines are scarce: one call of ~8 minutes instead of two). global-rowpass.patch A-B against HEAD's
# kernel rebuilt in the call, and #12's figures beside the seed's in the same call:
#   1. build with the patch; ALL the encoder's GPU tests (kernels_gpu_test, kernels_fusion_gpu_test,
#      model_fusion_gpu_test: they cover 48af5a2's one block path and the patched kernel)
#   2. maskbench vit_b,vit_h at bs1 and bs32, row "GEMM epilogues" (main's default), profiled: patched,
#      then HEAD's kernel, then patched again if time is left (scripts/gpu-host/ab-kernel.sh)
#   3. the seed: run.sh quick (vit_b bs32, click, 64 prompts) and its vit_h bs32 row
# Before the call:
#   git apply bench/results/next/global-rowpass.patch && mkdir -p .carry/base
#   git show HEAD:kernels/rel_pos_attention.cu > .carry/base/rel_pos_attention.cu
#   OUT=$OUT bash bench/results/next/next-call-48.sh      (carry .gpu-debs and .carry with anchors, base)
set -uo pipefail
cd "$(dirname "$0")/../../.."
out=${OUT:-gpu-out}
S=$(date +%s)
AB_FILES="kernels/rel_pos_attention.cu" AB_BATCH=1,32 CALL_LIMIT=390 \
  AB_TESTS="kernels_gpu_test:* kernels_fusion_gpu_test:* model_fusion_gpu_test:*" \
  bash scripts/gpu-host/ab-kernel.sh
mv "$out/all.tgz" "$out/ab.tgz" 2>/dev/null
echo "ab done at $(( $(date +%s) - S )) s" >> "$out/perf.log"
timeout 110 bash .carry/anchors/run.sh "$out/anchors" quick > /dev/null 2>&1
echo "seed-quick at $(( $(date +%s) - S )) s" >> "$out/perf.log"
left=$(( 560 - ($(date +%s) - S) ))
if [ "$left" -gt 80 ]; then
  bash scripts/gpu-host/seed-row.sh "$out/anchors" fast_vit_h_bs32 $(( left > 110 ? 100 : left - 10 )) \
    offline --impl fast --model vit_h --batch 32
  echo "seed-vit_h at $(( $(date +%s) - S )) s" >> "$out/perf.log"
fi
grep -h RESULT "$out"/anchors/RESULTS.txt 2>/dev/null | head -8 | cut -c1-300 >> "$out/perf.log"
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv > "$out/gpu.txt" 2>&1
(cd "$out" && tar czf seed.tgz anchors && rm -rf anchors)
(cd "$out" && tar czf logs.tgz tests.log bench*.log && rm -f tests.log bench*.log)  # at most 8 files return
ls "$out"
