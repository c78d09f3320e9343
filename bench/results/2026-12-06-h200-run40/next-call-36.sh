#!/usr/bin/env bash
# NOT RUN YET. For an H200 (no H200 was granted on 2026-12-06; every figure of runs 33-34 is an H100
# one): run 30's c256 crash (RELIABILITY.md) and the H200 figures of issues #12 / #13 on main, beside
# the seed. ~8 minutes. Carry .gpu-debs and .carry (golden/tiny, anchors; REVISION).
#   1. build; the decoder's GPU tests
#   2. served vit_b interactive c256 three times (a crash prints "maskd: fatal:" with c10's message),
#      c1, c16, batch c64
#   3. maskbench vit_b + vit_h bs32 (--profile, --memory-account); vit_b bs1 latency rows (64 prompts)
#   4. the seed: quick set + its vit_h bs32 row
#   5. with the time left: c256 once more with CUDA_LAUNCH_BLOCKING=1 (the error at its launch)
set -uo pipefail
cd "$(dirname "$0")/../../.."
source scripts/gpu-host/call-prelude.sh
[ -d .carry/golden/tiny-one ] || cp -r .carry/golden/tiny .carry/golden/tiny-one
export MASKD_GOLDEN_DIR=$PWD/.carry/golden
left() { echo $(( ${CALL_LIMIT:-585} - ($(date +%s) - S) )); }
timeout 100 "$B/tests/model_fast_decoder_gpu_test" > "$out/tests.log" 2>&1
grep -E "^\[  (PASSED|FAILED) |^\[ +FAILED |Failure" "$out/tests.log" | cut -c1-240 >> "$out/perf.log"
t tests
OUT=$out/served SERVED_DURATION=8 timeout 160 bash scripts/gpu-host/served-bench.sh \
  vit_b:bf16::interactive:256 vit_b:bf16::interactive:256 vit_b:bf16::interactive:256 \
  vit_b:bf16::interactive:1 vit_b:bf16::interactive:16 vit_b:bf16::batch:64 > "$out/served.log" 2>&1
tail -7 "$out/served.log" | cut -c1-300 >> "$out/perf.log"
grep -h -B1 -A2 "server per call" "$out"/served/maskload-*.log | cut -c1-200 >> "$out/perf.log"
grep -h "fatal\|terminate\|AcceleratorError" "$out"/served/maskd-*.log | cut -c1-2000 >> "$out/perf.log"
t served
mkdir -p "$out/prof" "$out/prof1"
timeout 120 "$B/load_tests/maskbench" --arch vit_b,vit_h --batch 32 --fp32-batch 1 --no-latency \
  --rows "windows made" --memory-account --profile "$out/prof" --profile-rows "windows made" \
  --json "$out/bench.json" > "$out/bench.log" 2>&1
timeout 60 "$B/load_tests/maskbench" --arch vit_b --batch 1 --fp32-batch 1 --rows "windows made" \
  --profile "$out/prof1" --profile-rows "windows made" --json "$out/bench-bs1.json" >> "$out/bench.log" 2>&1
grep -E "^vit|^peak|click|prompt" "$out/bench.log" | cut -c1-200 >> "$out/perf.log"
grep -hE "^===|kernel total" "$out/prof/profiles.txt" "$out/prof1/profiles.txt" >> "$out/perf.log"
cp "$out/prof/profiles.txt" "$out/profiles-encoder.txt"; cp "$out/prof1/profiles.txt" "$out/profiles-bs1.txt"
t bench
timeout 110 bash .carry/anchors/run.sh "$out/anchors" quick > /dev/null 2>&1
w=$(mktemp -d)
tar -xf .carry/anchors/vendor/segment-anything-fast-*.tar -C "$w"
python3 -m zipfile -e .carry/anchors/vendor/segment_anything-1.0-py3-none-any.whl "$w/sam" > /dev/null
PYTHONPATH="$w/segment-anything-fast:$w/sam" SEGMENT_ANYTHING_FAST_USE_FLASH_4=0 TORCHINDUCTOR_CACHE_DIR="$w/ind" \
  timeout $(( $(left) > 110 ? 100 : $(left) - 10 )) python3 .carry/anchors/anchors.py offline --impl fast \
  --model vit_h --batch 32 > "$out/anchors/fast_vit_h_bs32.log" 2>&1
grep '^RESULT ' "$out/anchors/fast_vit_h_bs32.log" | sed 's/^RESULT /RESULT fast_vit_h_bs32 /' >> "$out/anchors/RESULTS.txt"
grep -h RESULT "$out"/anchors/RESULTS.txt 2>/dev/null | head -8 | cut -c1-300 >> "$out/perf.log"
t anchors
if [ "$(left)" -gt 40 ]; then
  CUDA_LAUNCH_BLOCKING=1 OUT=$out/served-blocking SERVED_DURATION=8 timeout $(( $(left) - 10 )) \
    bash scripts/gpu-host/served-bench.sh vit_b:bf16::interactive:256 > "$out/served-blocking.log" 2>&1
  tail -2 "$out/served-blocking.log" | cut -c1-300 | sed 's/^/blocking: /' >> "$out/perf.log"
  grep -h "fatal\|terminate\|AcceleratorError" "$out"/served-blocking/maskd-*.log | cut -c1-2000 >> "$out/perf.log"
  t served-blocking
fi
pack served served-blocking served-blocking.log anchors prof prof1 bench.json bench-bs1.json misc.tar.gz
ls "$out"
