#!/usr/bin/env bash
# One GPU-host call for the encoder/decoder performance work: build, the gpu-labelled tests,
# verify-golden (bf16 fast path), maskbench (selected rows, with Kineto per-kernel profiles) and the
# reference systems (../shared/anchors/run.sh, carried as .carry/anchors) in the same call.
# At most 8 files come back from $OUT: the logs below plus misc.tar.gz (build log, environment, traces).
#
# Carried (ignored) paths: .gpu-debs, .carry/golden/tiny (../shared/golden/tiny-one), .carry/anchors.
#   scripts/gpu-host/encoder-perf.sh
# Environment: STEPS (default "build tests golden bench anchors"; also "kbench" (KBENCH_WARPS),
# "warps" (WARPS_LIST, WARPS_ROWS)), MASKBENCH_ROWS (row
# name substrings, comma-separated), MASKBENCH_BATCHES (1,8,32), PROFILE_ROWS (rows to profile; none
# by default), MASKBENCH_ARGS (more flags), ANCHORS_SET (quick|all|amg|none), BUILD_TARGETS (build
# only these targets, space-separated: a short call that needs a few binaries; default everything).
set -uo pipefail
cd "$(dirname "$0")/../.."
out=${OUT:-gpu-out}
mkdir -p "$out" "$out/misc" "$out/misc/traces"
build=${MASKD_GPU_BUILD:-/tmp/maskd-build}
steps=${STEPS:-build tests golden bench anchors}
has() { [[ " $steps " == *" $1 "* ]]; }
step() { printf '\n===== %s (%s)\n' "$1" "$(date +%T)"; }

{
  echo "revision: $(git rev-parse HEAD 2>/dev/null || cat .carry/REVISION 2>/dev/null || echo unknown)"
  git status --short 2>/dev/null | head -20
  nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.mem --format=csv
  nvcc --version | tail -1
  python3 -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda)'
  nproc
} > "$out/misc/environment.txt" 2>&1

source scripts/gpu-host/unpack.sh .gpu-debs /tmp/gpu-prefix > /dev/null
export LD_LIBRARY_PATH="$(python3 -c 'import os,torch;print(os.path.dirname(torch.__file__))')/lib:$LD_LIBRARY_PATH"
export MASKD_GOLDEN_DIR="$PWD/.carry/golden"

if has build; then
  step build
  { time cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DMASKD_WITH_WEBP=OFF -DMASKD_WITH_EXIF=OFF \
      -DMASKD_GOLDEN_DIR="$PWD/.carry/golden" -DMASKD_PYTHON=python3 &&
    time cmake --build "$build" -j "$(nproc)" ${BUILD_TARGETS:+--target $BUILD_TARGETS}; } > "$out/misc/build.log" 2>&1
  rc=$?
  echo "build rc=$rc"; grep -E "error|FAILED" "$out/misc/build.log" | head -20; tail -3 "$out/misc/build.log"
  # Nothing after this is worth device time without binaries (the anchors alone compare nothing).
  [ $rc -eq 0 ] || { echo "build failed: skipping the other steps"; steps=""; build_failed=1; }
fi

if has tests; then
  step "ctest -L gpu"
  timeout 300 ctest --test-dir "$build" -L gpu --output-on-failure -V > "$out/ctest-gpu.log" 2>&1
  echo "ctest rc=$?"; grep -E "tests passed|tests failed|Failed  |\*\*\*Failed|rel L2|GELU epilogue" "$out/ctest-gpu.log" | tail -25
fi

if has golden; then
  step verify-golden
  for args in "--dtype fp32" "--dtype bf16 --fast" "--dtype fp16 --fast"; do
    echo "--- maskctl verify-golden .carry/golden/tiny --device cuda $args"
    timeout 120 "$build/client/maskctl" verify-golden .carry/golden/tiny --device cuda $args
    echo "rc=$?"
  done > "$out/verify-golden.log" 2>&1
  grep -E "^---|PASSED|FAILED|rc=" "$out/verify-golden.log"
fi

if has kbench; then
  # The fused attention kernel's variants at batch 32 (terms read / via RelPosTables / in the
  # kernel), with 4 and 8 warps per CTA for the windowed blocks.
  step "maskd_kernel_bench attention --fused-only"
  for w in ${KBENCH_WARPS:-4 8}; do
    echo "--- MASKD_RELPOS_WINDOW_WARPS=$w"
    MASKD_RELPOS_WINDOW_WARPS=$w timeout 120 "$build/kernels/maskd_kernel_bench" attention --fused-only
    echo "rc=$?"
  done > "$out/kernel-bench.log" 2>&1
  grep -E "^---|^  vit|fused|RelPosTables|rc=" "$out/kernel-bench.log"
fi

if has bench; then
  step maskbench
  rows=()
  [ -n "${MASKBENCH_ROWS:-}" ] && rows=(--rows "$MASKBENCH_ROWS")
  prof=()
  [ -n "${PROFILE_ROWS:-}" ] && prof=(--profile "$out/misc/traces" --profile-rows "$PROFILE_ROWS")
  timeout ${MASKBENCH_TIMEOUT:-330} "$build/load_tests/maskbench" --arch vit_b,vit_h --batch ${MASKBENCH_BATCHES:-1,8,32} \
    --fp32-batch 1 --json "$out/maskbench.json" "${rows[@]}" "${prof[@]}" ${MASKBENCH_ARGS:-} > "$out/maskbench.log" 2>&1
  echo "maskbench rc=$?"; cat "$out/maskbench.log"
  mv "$out/misc/traces/profiles.txt" "$out/profiles.txt" 2>/dev/null
  grep -E "^===|^by kind|^gemm|^attention|^norm|^elementwise|^copy|^other|^kernel total" "$out/profiles.txt" 2>/dev/null | head -120
fi

if has anchors && [ "${ANCHORS_SET:-quick}" != none ]; then
  step "anchors (${ANCHORS_SET:-quick})"
  # Written straight into $OUT so that a call cut at its time limit still returns what ran.
  timeout ${ANCHORS_TIMEOUT:-480} bash .carry/anchors/run.sh "$out/anchors" "${ANCHORS_SET:-quick}"
fi

if has warps; then
  # maskbench with each MASKD_RELPOS_WINDOW_WARPS of WARPS_LIST (default "4 8") for the windowed
  # blocks, on WARPS_ROWS (default: the default fast path's row), batch 32, encoder throughput only.
  for w in ${WARPS_LIST:-4 8}; do
    step "maskbench: windowed attention with $w warps per CTA (MASKD_RELPOS_WINDOW_WARPS=$w)"
    MASKD_RELPOS_WINDOW_WARPS=$w timeout 200 "$build/load_tests/maskbench" --arch vit_b,vit_h --batch 32 --fp32-batch 1 \
      --rows "${WARPS_ROWS:-windows made}" --no-latency --json "$out/misc/maskbench-warps$w.json" > "$out/maskbench-warps$w.log" 2>&1
    echo "rc=$?"; grep -E "^vit" "$out/maskbench-warps$w.log"
  done
fi

tar -C "$out" -czf "$out/misc.tar.gz" misc && rm -rf "$out/misc"
ls -la "$out"
exit ${build_failed:-0}
