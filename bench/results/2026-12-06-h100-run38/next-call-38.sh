#!/usr/bin/env bash
# Run 38 (2026-12-06): main 9c587b2 (the window-mode tables) beside the seed, the encoder rows only:
# the last ~5 minutes of this session's device time. build; maskbench vit_b,vit_h bs32; the seed's
# vit_h bs32 then vit_b bs32 (anchors.py directly; each includes torch.compile's warm-up).
set -uo pipefail
cd "$(dirname "$0")/../../.."
source scripts/gpu-host/call-prelude.sh
timeout 60 "$B/load_tests/maskbench" --arch vit_b,vit_h --batch 32 --fp32-batch 1 --no-latency \
  --rows "windows made" --json "$out/bench.json" > "$out/bench.log" 2>&1
grep -E "^vit" "$out/bench.log" | cut -c1-200 >> "$out/perf.log"
t bench
w=$(mktemp -d)
tar -xf .carry/anchors/vendor/segment-anything-fast-*.tar -C "$w"
python3 -m zipfile -e .carry/anchors/vendor/segment_anything-1.0-py3-none-any.whl "$w/sam" > /dev/null
mkdir -p "$out/anchors"
for m in vit_h vit_b; do
  PYTHONPATH="$w/segment-anything-fast:$w/sam" SEGMENT_ANYTHING_FAST_USE_FLASH_4=0 TORCHINDUCTOR_CACHE_DIR="$w/ind" \
    timeout 100 python3 .carry/anchors/anchors.py offline --impl fast --model $m --batch 32 \
    > "$out/anchors/fast_${m}_bs32.log" 2>&1
  grep '^RESULT ' "$out/anchors/fast_${m}_bs32.log" | sed "s/^RESULT /RESULT fast_${m}_bs32 /" | cut -c1-300 >> "$out/perf.log"
  t "seed-$m"
done
pack anchors bench.json misc.tar.gz
ls "$out"
