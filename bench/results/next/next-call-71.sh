#!/usr/bin/env bash
# Run 71 (fourteenth session), an H200 for the issue's figures (an H100 still gives the profile), ~6
# minutes. #12's one target left is fp8 (vit_h >= 110 img/s, vit_b >= 420, mask IoU >= 0.98 vs fp32);
# its last figures are runs 13-17's (vit_h 85.8 img/s, IoU 0.9295), from before most of the encoder's
# bf16 work. This call measures fp8 on today's encoder beside bf16, profiled, in the same call as the
# seed:
#   1. maskbench vit_b and vit_h at bs32: the default bf16 row and "+ fp8 e4m3 linears", with the
#      per-kernel tables (--profile) and mask IoU vs fp32
#   2. the seed's vit_h bs32 row (H200) and its quick set
#   mkdir -p $OUT && OUT=$OUT CALL_LIMIT=470 timeout 490 bash bench/results/next/next-call-71.sh
set -uo pipefail
cd "$(dirname "$0")/../../.."
export BUILD_TARGETS=${BUILD_TARGETS:-"maskbench"}
source scripts/gpu-host/call-prelude.sh
export CALL_LIMIT=${CALL_LIMIT:-470}
h200() { nvidia-smi --query-gpu=name --format=csv,noheader | grep -q H200; }
d="$out/prof-fp8"; mkdir -p "$d"
timeout $(( $(left) - 100 )) "$B/load_tests/maskbench" --arch vit_b,vit_h --batch 32 --fp32-batch 1 --no-latency \
  --rows "global attention,fp8" --profile "$d" --profile-rows "global attention,fp8" --json "$d/bench.json" \
  > "$d/bench.log" 2> "$d/bench.err"
echo "--- bf16 and fp8: maskbench rc=$?" >> "$out/perf.log"
grep -E "^vit|^peak" "$d/bench.log" | cut -c1-220 >> "$out/perf.log"
grep -hE "^===|kernel total" "$d/profiles.txt" | cut -c1-150 >> "$out/perf.log"
rm -f "$d"/trace-*.json
t fp8
if h200 && [ "$(left)" -gt 170 ]; then
  bash scripts/gpu-host/seed-row.sh "$out/anchors-vit_h" fast_vit_h_bs32 100 offline --impl fast --model vit_h --batch 32
  t seed-vit_h
fi
finish prof-fp8
