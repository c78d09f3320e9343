#!/usr/bin/env bash
# Sets up maskd on a fresh Debian 12 x86_64 machine, builds it, and then runs what was asked:
#
#   scripts/setup.sh run [maskd flags...]   build, then start the server (demo model without a checkpoint)
#   scripts/setup.sh test                   build, then run the test suite (ctest)
#   scripts/setup.sh build                  only install and build
#
# No CUDA toolkit needs to be installed: the PyPI torch wheel is a CUDA build whose CMake config needs
# nvcc and the CUDA headers/libraries, so when no system toolkit is found, NVIDIA's CUDA component
# wheels (nvcc, runtime, CCCL, the math libraries; the versions torch's own metadata pins) go into the
# virtual environment and CMake is pointed at them. No GPU is needed to build.
#
# Idempotent: installed packages, the virtual environment and the build are reused.
# Environment:
#   MASKD_BUILD_DIR      build directory (default build)
#   MASKD_VENV           Python virtual environment (default .venv)
#   MASKD_CUDA           auto (default): the system toolkit if nvcc is on PATH or in $CUDA_HOME/bin
#                        (CUDA_HOME defaults to /usr/local/cuda), else the wheels; system: require it;
#                        wheels: always the wheels, even if a system toolkit exists
#   CUDA_HOME            where the system toolkit is (default /usr/local/cuda)
#   MASKD_BUILD_TARGETS  build only these CMake targets (space-separated; default: all)
#   MASKD_TEST_REGEX     `test` runs only the ctest tests matching it (ctest -R; gtest names, e.g.
#                        'KernelsCpu|ServerConfig'); at least one must match
#   MASKD_JOBS           build jobs (default: nproc); MASKD_TEST_JOBS ctest jobs (default 2)
#   MASKD_SKIP_APT=1     skip apt-get (the Debian packages are already present)
set -euo pipefail

usage() { sed -n '2,/^set -euo pipefail/p' "$0" | sed '$d; s/^# \{0,1\}//'; }

here=$(cd "$(dirname "$0")/.." && pwd)
cd "$here"
mode=${1:-build}
[ $# -gt 0 ] && shift
case "$mode" in
  build | run | test) ;;
  -h | --help | help) usage; exit 0 ;;
  *) usage >&2; exit 2 ;;
esac
abspath() { case "$1" in /*) printf '%s\n' "$1" ;; *) printf '%s\n' "$here/$1" ;; esac; }
build_dir=$(abspath "${MASKD_BUILD_DIR:-build}")
venv=$(abspath "${MASKD_VENV:-.venv}")
jobs=${MASKD_JOBS:-$(nproc)}
cuda_mode=${MASKD_CUDA:-auto}
TORCH_VERSION=2.11.0
TORCHVISION_VERSION=0.26.0

log() { printf '\n== %s\n' "$*" >&2; }
die() { printf 'setup.sh: %s\n' "$*" >&2; exit 1; }

case "$cuda_mode" in
  auto | system | wheels) ;;
  *) die "MASKD_CUDA=$cuda_mode: expected auto, system or wheels" ;;
esac

# --- Debian packages ------------------------------------------------------------------------------
APT_PACKAGES=(
  build-essential cmake ninja-build ccache pkg-config git
  python3 python3-venv python3-dev
  libgrpc++-dev libgrpc-dev protobuf-compiler-grpc libprotobuf-dev protobuf-compiler
  libspdlog-dev libfmt-dev libcli11-dev nlohmann-json3-dev libxxhash-dev
  libpng-dev libjpeg-dev libwebp-dev libexif-dev libssl-dev zlib1g-dev
  libgtest-dev libgmock-dev libbenchmark-dev
  libcpp-httplib-dev chromium chromium-driver prometheus-cpp-dev haproxy
  openssl
  clang libclang-rt-14-dev  # libFuzzer and the sanitizer runtimes for .ci/run's fuzz build
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

# --- CUDA: a system toolkit, or NVIDIA's wheels in the venv -------------------------------------------
# The torch wheel's CMake config (FindCUDA + FindCUDAToolkit) needs nvcc, the runtime headers and the
# libraries torch links; our kernels also need CCCL. Decided before any download so that
# MASKD_CUDA=system fails at once.
cuda_home=${CUDA_HOME:-/usr/local/cuda}
system_nvcc=
if [ "$cuda_mode" != wheels ]; then
  if command -v nvcc >/dev/null 2>&1; then
    system_nvcc=$(command -v nvcc)
  elif [ -x "$cuda_home/bin/nvcc" ]; then
    system_nvcc=$cuda_home/bin/nvcc
  fi
fi
if [ -n "$system_nvcc" ]; then
  cuda_mode=system
  export PATH="$(dirname "$system_nvcc"):$PATH"
  log "CUDA: the system toolkit ($system_nvcc)"
elif [ "$cuda_mode" = system ]; then
  die "MASKD_CUDA=system but no CUDA toolkit: nvcc is not on PATH nor in $cuda_home/bin (set CUDA_HOME, or MASKD_CUDA=auto to use NVIDIA's wheels from PyPI)"
elif [ "$cuda_mode" = wheels ]; then
  log "CUDA: MASKD_CUDA=wheels: NVIDIA's CUDA wheels in $venv"
else
  cuda_mode=wheels
  log "CUDA: no system toolkit (nvcc not on PATH nor in $cuda_home/bin): NVIDIA's CUDA wheels in $venv"
fi

# --- Python: LibTorch (the torch wheel) and the Python tooling --------------------------------------
if [ ! -x "$venv/bin/python" ]; then
  log "creating the Python virtual environment $venv"
  python3 -m venv "$venv"
fi
py="$venv/bin/python"
if ! "$py" -c "import torch, sys; sys.exit(0 if torch.__version__.split('+')[0] == '$TORCH_VERSION' else 1)" 2>/dev/null; then
  log "installing torch==$TORCH_VERSION (LibTorch comes from this wheel; several GB with its CUDA libraries)"
  "$py" -m pip install -q --upgrade pip
  "$py" -m pip install -q "torch==$TORCH_VERSION"
fi
if ! "$py" -c "import grpc_tools, pycocotools, segment_anything, torchvision, pytest, matplotlib, selenium, prometheus_client, grpc_reflection, grpc_health, setuptools.command.bdist_wheel, cv2" 2>/dev/null; then
  log "installing the Python client's and tests' packages"
  # torchvision only for the test oracle (the original segment_anything); Pillow 9.4 is what the golden
  # data was made with.
  # selenium drives Debian's chromium in the web page's browser test (tests/web/web_page_test.py).
  # opencv-python-headless: the original generator's min_mask_region_area (remove_small_regions)
  # imports cv2; the generation parity test (tests/oracle/amg_oracle.py) needs it for that case.
  "$py" -m pip install -q "torchvision==$TORCHVISION_VERSION" "pillow==9.4.0" segment-anything==1.0 \
    selenium opencv-python-headless -r client/python/requirements.txt
fi
torch_prefix=$("$py" -c 'import torch; print(torch.utils.cmake_prefix_path)')

# NVIDIA's CUDA component wheels, pinned by torch's own requirement (torch 2.11.0:
# cuda-toolkit[cublas,cudart,...]==13.0.2), plus the compiler and headers a build needs: nvcc, crt
# (host/device headers split from nvcc since CUDA 13), nvvm (cicc, libdevice) and cccl (CUB/Thrust/
# libcu++). They share one prefix (site-packages/nvidia/cu13) laid out like a toolkit.
cuda_cmake_args=()
if [ "$cuda_mode" = wheels ]; then
  cuda_spec=$("$py" - <<'PY'
import importlib.metadata as md, re, sys
for req in md.requires("torch") or []:
    m = re.match(r"\s*cuda-toolkit\s*\[([^\]]*)\]\s*==\s*([^\s;]+)", req)
    if m:
        extras = [e.strip() for e in m.group(1).split(",") if e.strip()]
        extras += [e for e in ("nvcc", "crt", "nvvm", "cccl", "cudart") if e not in extras]
        print(f"cuda-toolkit[{','.join(extras)}]=={m.group(2)}")
        break
else:
    sys.exit("torch's metadata has no cuda-toolkit[...]==VERSION requirement (not a CUDA 13 wheel?): "
             "install the CUDA toolkit matching torch.version.cuda and use MASKD_CUDA=system")
PY
  )
  stamp="$venv/.maskd-cuda-wheels"
  find_nvcc() {
    "$py" -c 'import importlib.metadata as md
print(next(f.locate() for f in md.files("nvidia-cuda-nvcc") if str(f).endswith("bin/nvcc")))' 2>/dev/null
  }
  if [ "$(cat "$stamp" 2>/dev/null)" != "$cuda_spec" ] || ! nvcc_path=$(find_nvcc) || [ ! -x "$nvcc_path" ]; then
    log "installing $cuda_spec (nvcc, headers and libraries matching torch.version.cuda)"
    "$py" -m pip install -q "$cuda_spec"
    nvcc_path=$(find_nvcc) || die "nvidia-cuda-nvcc installed no bin/nvcc"
    printf '%s\n' "$cuda_spec" >"$stamp"
  fi
  cuda_root=$(cd "$(dirname "$nvcc_path")/.." && pwd)
  # The wheels ship only the versioned sonames (libcublas.so.13); CMake's find_library and the linker
  # look for the unversioned development names.
  for so in "$cuda_root"/lib/lib*.so.*; do
    dev=${so%%.so.*}.so
    [ -e "$dev" ] || ln -s "$(basename "$so")" "$dev"
  done
  export CUDA_HOME="$cuda_root" CUDA_PATH="$cuda_root" PATH="$cuda_root/bin:$PATH"
  cuda_cmake_args=(-DCMAKE_CUDA_COMPILER="$cuda_root/bin/nvcc" -DCUDAToolkit_ROOT="$cuda_root"
                   -DCUDA_TOOLKIT_ROOT_DIR="$cuda_root")
  log "CUDA: $("$cuda_root/bin/nvcc" --version | tail -1) in $cuda_root"
fi

# --- Build ----------------------------------------------------------------------------------------
launcher=()
command -v ccache >/dev/null 2>&1 && launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache -DCMAKE_CUDA_COMPILER_LAUNCHER=ccache)
cache="$build_dir/CMakeCache.txt"
if [ -f "$build_dir/build.ninja" ]; then
  # CMake cannot switch the CUDA compiler of a configured tree: say so instead of mixing toolkits.
  cached_nvcc=$(sed -n 's/^CMAKE_CUDA_COMPILER:[A-Z]*=//p' "$cache")
  stale=0
  if [ "$cuda_mode" = wheels ]; then
    [ "$cached_nvcc" = "$cuda_root/bin/nvcc" ] || stale=1
  elif [[ "$cached_nvcc" == */site-packages/nvidia/* ]]; then
    stale=1
  fi
  if [ "$stale" = 1 ]; then
    die "$build_dir was configured with nvcc '$cached_nvcc', not the $cuda_mode toolkit: use another MASKD_BUILD_DIR or remove it"
  fi
else
  log "configuring $build_dir"
  cmake -S . -B "$build_dir" -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_PREFIX_PATH="$torch_prefix" \
    -DMASKD_PYTHON="$py" "${cuda_cmake_args[@]}" "${launcher[@]}"
  # CMakeLists.txt builds without the kernels when nvcc does not work; set-up promises them.
  grep -q '^CMAKE_CUDA_COMPILER:[A-Z]*=.*nvcc$' "$cache" ||
    die "CMake found no working nvcc (CUDA kernels would be left out): see $build_dir/CMakeFiles/CMakeConfigureLog.yaml"
fi
targets=()
if [ -n "${MASKD_BUILD_TARGETS:-}" ]; then
  read -r -a targets <<<"$MASKD_BUILD_TARGETS"
  if [ "$mode" = run ]; then targets+=(maskd); fi
  log "building ${targets[*]} ($jobs jobs)"
  targets=(--target "${targets[@]}")
else
  log "building ($jobs jobs)"
fi
cmake --build "$build_dir" -j "$jobs" "${targets[@]}"

case "$mode" in
  build) ;;
  run)
    log "starting maskd (Ctrl-C stops it): $build_dir/server/maskd $*"
    exec "$build_dir/server/maskd" "$@"
    ;;
  test)
    ctest_args=(--test-dir "$build_dir" --output-on-failure --timeout 1200 -j "${MASKD_TEST_JOBS:-2}")
    if [ -n "${MASKD_TEST_REGEX:-}" ]; then
      log "running the tests matching '$MASKD_TEST_REGEX'"
      ctest_args+=(-R "$MASKD_TEST_REGEX" --no-tests=error)
    else
      log "running the test suite"
    fi
    # The GPU-labelled tests skip cleanly on a machine without a device.
    ctest "${ctest_args[@]}"
    ;;
esac
