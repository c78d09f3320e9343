#!/usr/bin/env bash
# On the offline GPU host (see ../shared/gpu-host/README.md): unpack the carried Debian packages,
# configure and build the tree, run the `gpu`-labelled tests, verify-golden on CUDA and the kernel
# benchmark. Every step's output goes to $OUT (or ./gpu-out) as its own log.
#
# Carried (ignored) paths: .gpu-debs (scripts in ../shared/gpu-host), .carry/golden/tiny (a copy of
# ../shared/golden/tiny-one).
#   scripts/gpu-host/build-and-test.sh [steps...]   steps: build tests golden kernels vit_h bench (default all)
set -uo pipefail
cd "$(dirname "$0")/../.."
out=${OUT:-gpu-out}
mkdir -p "$out"
steps=${*:-build tests golden kernels vit_h bench}
build=${MASKD_GPU_BUILD:-/tmp/maskd-build}

step() { printf '\n===== %s (%s)\n' "$1" "$(date +%T)"; }
has() { [[ " $steps " == *" $1 "* ]]; }

{
  step environment
  git rev-parse HEAD 2>/dev/null || echo "revision: $(cat .carry/REVISION 2>/dev/null || echo unknown)"
  nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.mem --format=csv
  nvcc --version | tail -1
  python3 -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda)'
  nproc
} > "$out/environment.txt" 2>&1

source scripts/gpu-host/unpack.sh .gpu-debs /tmp/gpu-prefix > /dev/null
export LD_LIBRARY_PATH="$(python3 -c 'import os,torch;print(os.path.dirname(torch.__file__))')/lib:$LD_LIBRARY_PATH"

if has build; then
  step build
  # No libwebp/libexif/OpenCV on the host: WebP input and EXIF orientation are built out.
  { time cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DMASKD_WITH_WEBP=OFF -DMASKD_WITH_EXIF=OFF \
      -DMASKD_GOLDEN_DIR="$PWD/.carry/golden" -DMASKD_PYTHON=python3 &&
    time cmake --build "$build" -j "$(nproc)"; } > "$out/build.log" 2>&1
  echo "build rc=$?"; tail -3 "$out/build.log"
fi
export MASKD_GOLDEN_DIR="$PWD/.carry/golden"

if has tests; then
  step "ctest -L gpu"
  timeout 300 ctest --test-dir "$build" -L gpu --output-on-failure -V > "$out/ctest-gpu.log" 2>&1
  echo "ctest rc=$?"; grep -E "tests passed|tests failed|Failed|\*\*\*|Skipped" "$out/ctest-gpu.log" | tail -15
fi

if has golden; then
  step verify-golden
  for args in "--dtype fp32" "--dtype fp32 --fast" "--dtype bf16 --fast" "--dtype fp16 --fast"; do
    echo "--- maskctl verify-golden .carry/golden/tiny --device cuda $args"
    timeout 120 "$build/client/maskctl" verify-golden .carry/golden/tiny --device cuda $args
    echo "rc=$?"
  done > "$out/verify-golden.log" 2>&1
  grep -E "^---|PASSED|FAILED|rc=" "$out/verify-golden.log"
fi

if has kernels; then
  step maskd_kernel_bench
  timeout 240 "$build/kernels/maskd_kernel_bench" > "$out/kernel-bench.log" 2>&1
  echo "kernel bench rc=$?"; tail -40 "$out/kernel-bench.log"
fi

if has vit_h; then
  step "vit_h random checkpoint: make, inspect, serve a few requests"
  {
    time "$build/client/maskctl" make-checkpoint --arch vit_h --seed 1 /tmp/vit_h.pth
    "$build/client/maskctl" inspect-checkpoint /tmp/vit_h.pth
    "$build/server/maskd" --checkpoint /tmp/vit_h.pth --device cuda --listen 127.0.0.1:50077 > "$out/maskd-vit_h.log" 2>&1 &
    pid=$!
    for i in $(seq 1 120); do "$build/client/maskctl" --server 127.0.0.1:50077 health > /dev/null 2>&1 && break; sleep 1; done
    "$build/client/maskctl" --server 127.0.0.1:50077 health
    img=.carry/golden/tiny/image0.png
    "$build/client/maskctl" --server 127.0.0.1:50077 embed "$img"
    "$build/client/maskctl" --server 127.0.0.1:50077 segment "$img" --point 320,240 --multimask --out-json /tmp/seg.json
    "$build/client/maskctl" --server 127.0.0.1:50077 segment "$img" --box 100,60,500,330 --format png
    "$build/client/maskctl" --server 127.0.0.1:50077 info
    kill -INT $pid; wait $pid; echo "maskd exit $?"
  } > "$out/vit_h.log" 2>&1
  tail -40 "$out/vit_h.log"
fi

if has bench; then
  step maskbench
  timeout ${MASKBENCH_TIMEOUT:-300} "$build/load_tests/maskbench" --arch vit_b,vit_h --batch 1,8,32 --fp32-batch 1 \
    --golden .carry/golden/tiny --json "$out/maskbench.json" ${MASKBENCH_ARGS:-} > "$out/maskbench.log" 2>&1
  echo "maskbench rc=$?"; cat "$out/maskbench.log"
fi
