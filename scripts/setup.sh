#!/usr/bin/env bash
# Sets up maskd on a fresh Debian 12 machine (with the CUDA 13 toolkit installed, which the PyPI
# torch wheel's CMake config needs), builds it, and then runs what was asked:
#
#   scripts/setup.sh run [maskd flags...]   build, then start the server (demo model without a checkpoint)
#   scripts/setup.sh test                   build, then run the whole test suite (ctest)
#   scripts/setup.sh build                  only install and build
#
# Idempotent: installed packages, the virtual environment and the build are reused.
# Environment: MASKD_BUILD_DIR (default build), MASKD_VENV (default .venv), MASKD_SKIP_APT=1 to skip
# apt-get (packages already present), MASKD_JOBS (default: nproc), CUDA_HOME (default /usr/local/cuda).
set -euo pipefail

here=$(cd "$(dirname "$0")/.." && pwd)
cd "$here"
mode=${1:-build}
[ $# -gt 0 ] && shift
build_dir=${MASKD_BUILD_DIR:-build}
venv=${MASKD_VENV:-.venv}
jobs=${MASKD_JOBS:-$(nproc)}
TORCH_VERSION=2.11.0
TORCHVISION_VERSION=0.26.0

log() { printf '\n== %s\n' "$*" >&2; }

# --- Debian packages ------------------------------------------------------------------------------
APT_PACKAGES=(
  build-essential cmake ninja-build ccache pkg-config git
  python3 python3-venv python3-dev
  libgrpc++-dev libgrpc-dev protobuf-compiler-grpc libprotobuf-dev protobuf-compiler
  libspdlog-dev libfmt-dev libcli11-dev nlohmann-json3-dev libxxhash-dev
  libpng-dev libjpeg-dev libwebp-dev libexif-dev libssl-dev zlib1g-dev
  libgtest-dev libgmock-dev libbenchmark-dev
)
if [ "${MASKD_SKIP_APT:-0}" != 1 ]; then
  missing=()
  for p in "${APT_PACKAGES[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
  done
  if [ ${#missing[@]} -gt 0 ]; then
    log "installing ${#missing[@]} Debian packages: ${missing[*]}"
    sudo_cmd=()
    [ "$(id -u)" -ne 0 ] && sudo_cmd=(sudo)
    "${sudo_cmd[@]}" apt-get update -qq
    DEBIAN_FRONTEND=noninteractive "${sudo_cmd[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
  fi
fi

# --- CUDA toolkit (prerequisite) ------------------------------------------------------------------
cuda_home=${CUDA_HOME:-/usr/local/cuda}
if ! command -v nvcc >/dev/null 2>&1; then
  if [ -x "$cuda_home/bin/nvcc" ]; then
    export PATH="$cuda_home/bin:$PATH"
  else
    echo "setup.sh: the CUDA 13 toolkit (nvcc) is required: the PyPI torch wheel is a CUDA build and its" >&2
    echo "CMake config needs the toolkit (no GPU is needed to build). Install it from NVIDIA's Debian 12" >&2
    echo "repository (package cuda-toolkit-13-0) or set CUDA_HOME." >&2
    exit 1
  fi
fi

# --- Python: LibTorch (the torch wheel) and the Python tooling --------------------------------------
if [ ! -x "$venv/bin/python" ]; then
  log "creating the Python virtual environment $venv"
  python3 -m venv "$venv"
fi
py="$here/$venv/bin/python"
if ! "$py" -c "import torch, sys; sys.exit(0 if torch.__version__.split('+')[0] == '$TORCH_VERSION' else 1)" 2>/dev/null; then
  log "installing torch==$TORCH_VERSION (LibTorch comes from this wheel; several GB with its CUDA libraries)"
  "$py" -m pip install -q --upgrade pip
  "$py" -m pip install -q "torch==$TORCH_VERSION"
fi
if ! "$py" -c "import grpc_tools, pycocotools, segment_anything, torchvision, pytest, matplotlib" 2>/dev/null; then
  log "installing the Python client's and tests' packages"
  # torchvision only for the test oracle (the original segment_anything); Pillow 9.4 is what the golden
  # data was made with.
  "$py" -m pip install -q "torchvision==$TORCHVISION_VERSION" "pillow==9.4.0" segment-anything==1.0 \
    -r client/python/requirements.txt
fi
torch_prefix=$("$py" -c 'import torch; print(torch.utils.cmake_prefix_path)')

# --- Build ----------------------------------------------------------------------------------------
launcher=()
command -v ccache >/dev/null 2>&1 && launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache -DCMAKE_CUDA_COMPILER_LAUNCHER=ccache)
if [ ! -f "$build_dir/build.ninja" ]; then
  log "configuring $build_dir"
  cmake -S . -B "$build_dir" -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_PREFIX_PATH="$torch_prefix" \
    -DMASKD_PYTHON="$py" "${launcher[@]}"
fi
log "building ($jobs jobs)"
cmake --build "$build_dir" -j "$jobs"

case "$mode" in
  build) ;;
  run)
    log "starting maskd (Ctrl-C stops it): $build_dir/server/maskd $*"
    exec "$build_dir/server/maskd" "$@"
    ;;
  test)
    log "running the test suite"
    # The GPU-labelled tests skip cleanly on a machine without a device.
    ctest --test-dir "$build_dir" --output-on-failure --timeout 1200 -j "${MASKD_TEST_JOBS:-2}"
    ;;
  *)
    echo "usage: scripts/setup.sh run [maskd flags...] | test | build" >&2
    exit 2
    ;;
esac
