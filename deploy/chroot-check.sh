#!/usr/bin/env bash
# Runs the CPU variant of deploy/Dockerfile without a container engine: two Debian 12 chroots made
# with debootstrap stand in for the builder and runtime stages, each stage's own RUN/ENV/ARG/WORKDIR/
# COPY steps are rendered from the Dockerfile by deploy/dockerfile_steps.py and run in them, then the
# built maskd is started in the runtime root as the image's user on the demo model (--device cpu)
# and health-checked with the HEALTHCHECK's command, and GetInfo is read.
#
#   deploy/chroot-check.sh [WORKDIR]      (default /var/tmp/maskd-chroot; needs root and ~25 GB)
#
# Environment: MASKD_CHROOT_MIRROR (default http://deb.debian.org/debian), MASKD_CHROOT_JOBS (build
# jobs, default 2), MASKD_CHROOT_KEEP=1 (keep WORKDIR afterwards; the default removes the roots),
# MASKD_CHROOT_REUSE=1 (reuse roots a previous run debootstrapped; their RUN steps run again).
# The CPU variant: --build-arg CUDA_APT_PACKAGES= --build-arg MASKD_WITH_CUDA=OFF (no NVIDIA
# repository; CUDA component wheels from PyPI for Torch's CMake config; no maskd CUDA kernels).
# Not run in CI: it downloads ~4 GB (torch and the CUDA wheels) and builds maskd from scratch, about
# an hour on 2 cores. Each step prints its duration; the last lines are a summary of them.
set -euo pipefail

here=$(cd "$(dirname "$0")/.." && pwd)
work=${1:-/var/tmp/maskd-chroot}
mirror=${MASKD_CHROOT_MIRROR:-http://deb.debian.org/debian}
jobs=${MASKD_CHROOT_JOBS:-2}
port=${MASKD_CHROOT_PORT:-50151}
summary=()
t_all=$(date +%s)

log() { printf '[chroot-check %s] %s\n' "$(date -u +%H:%M:%S)" "$*"; }
die() { log "FAIL: $*"; exit 1; }
[ "$(id -u)" = 0 ] || die "needs root (debootstrap, chroot, mount)"

mounted=()
cleanup() {
  local i
  [ -n "${server_pid:-}" ] && kill "$server_pid" 2>/dev/null && wait "$server_pid" 2>/dev/null || true
  for ((i = ${#mounted[@]} - 1; i >= 0; i--)); do umount -l "${mounted[$i]}" 2>/dev/null || true; done
  # Never rm -rf through a bind mount of the host's /dev, /proc or /sys.
  if [ "${MASKD_CHROOT_KEEP:-0}" != 1 ] && ! grep -q " $work/" /proc/mounts; then
    rm -rf "$work/builder" "$work/runtime"
  fi
}
trap cleanup EXIT

timed() {  # timed LABEL CMD...: runs CMD, records LABEL and its duration
  local label=$1 t0 rc=0; shift
  t0=$(date +%s)
  log "--> $label"
  "$@" || rc=$?
  summary+=("$(printf '%6ss  %s%s' $(($(date +%s) - t0)) "$label" "$([ $rc = 0 ] || echo "  (FAILED rc=$rc)")")")
  log "<-- $label: $(($(date +%s) - t0)) s, rc=$rc"
  return $rc
}

make_root() {  # make_root DIR: Debian 12 minbase + the host's DNS and CA certificates + /proc,/dev,/sys
  local dir=$1
  if [ "${MASKD_CHROOT_REUSE:-0}" = 1 ] && [ -x "$dir/usr/bin/apt-get" ]; then
    log "reusing $dir"
  else
    rm -rf "$dir"
    timed "debootstrap $(basename "$dir")" debootstrap --variant=minbase bookworm "$dir" "$mirror" >"$work/$(basename "$dir")-debootstrap.log" 2>&1 ||
      die "debootstrap failed: $work/$(basename "$dir")-debootstrap.log"
  fi
  cp /etc/resolv.conf "$dir/etc/resolv.conf"
  # pip inside the root verifies TLS against the host's CA bundle (the root has no ca-certificates
  # until a RUN step installs them, and the host may trust a local proxy's CA).
  mkdir -p "$dir/etc/ssl" "$dir/usr/local/share"
  cp -a /etc/ssl/certs "$dir/etc/ssl/"
  [ -d /usr/local/share/ca-certificates ] && cp -a /usr/local/share/ca-certificates "$dir/usr/local/share/"
  local m
  for m in proc sys dev dev/pts; do
    mkdir -p "$dir/$m"
    mount --bind "/$m" "$dir/$m"
    mounted+=("$dir/$m")
  done
}

# Functions the rendered stage scripts call.
run_step() {  # run_step LABEL COMMAND: one RUN, in the chroot, with the stage's environment
  local label=$1 cmd=$2 user=()
  timed "$label" chroot "$ROOT" /usr/bin/env -i /bin/bash -c '. /.stage-env; exec /bin/bash -o pipefail -c "$1"' _ "$cmd"
}
copy_context() {  # COPY . DEST: the context snapshot taken at the start
  local dest=$1
  mkdir -p "$ROOT$dest"
  tar -C "$ROOT$dest" -xf "$work/context.tar"
  log "copied the build context into $dest ($(du -sh "$ROOT$dest" | cut -f1))"
}
copy_from() {  # COPY --from=STAGE SRC DEST
  local stage=$1 src=$2 dest=$3
  cp -a "$work/$stage$src." "$ROOT$dest"
  log "copied $stage:$src to $dest ($(du -sh "$work/$stage$src" | cut -f1))"
}

mkdir -p "$work"
command -v debootstrap >/dev/null || timed "apt-get install debootstrap" apt-get install -y -qq debootstrap >/dev/null
# The build context: the committed revision (git archive HEAD), taken now, so that edits made while
# the build runs (or uncommitted work) do not leak into it. Without .git, `maskd --version` says
# revision "unknown".
git -C "$here" archive --format=tar -o "$work/context.tar" HEAD || die "could not snapshot the build context"
log "build context: $(git -C "$here" rev-parse --short=12 HEAD) (committed files only), $(du -h "$work/context.tar" | cut -f1)"
log "work dir $work, mirror $mirror, $jobs build jobs; $(nproc) cores"

# --- builder stage ------------------------------------------------------------------------------
make_root "$work/builder"
ROOT=$work/builder
python3 "$here/deploy/dockerfile_steps.py" "$here/deploy/Dockerfile" builder \
  CUDA_APT_PACKAGES= MASKD_WITH_CUDA=OFF "BUILD_JOBS=$jobs" >"$work/builder.sh"
# shellcheck disable=SC1091
. "$work/builder.sh"

# --- runtime stage ------------------------------------------------------------------------------
make_root "$work/runtime"
ROOT=$work/runtime
python3 "$here/deploy/dockerfile_steps.py" "$here/deploy/Dockerfile" runtime >"$work/runtime.sh"
# shellcheck disable=SC1091
. "$work/runtime.sh"

# --- start it as the image does (ENTRYPOINT maskd, USER 10001), on the CPU and the demo model ------
user=$(cat "$ROOT/.stage-user")
start_server() {
  chroot --userspec="$user" "$ROOT" /usr/bin/env -i /bin/bash -c \
    ". /.stage-env; exec maskd --device cpu --listen 127.0.0.1:$port" >"$work/maskd.log" 2>&1 &
  server_pid=$!
  local i
  for ((i = 0; i < 600; i++)); do
    kill -0 "$server_pid" 2>/dev/null || { cat "$work/maskd.log"; return 1; }
    # The HEALTHCHECK's own command, with MASKD_SERVER pointed at the port used here.
    if chroot --userspec="$user" "$ROOT" /usr/bin/env -i /bin/bash -c \
        ". /.stage-env; MASKD_SERVER=127.0.0.1:$port maskctl --timeout 5 --connect-timeout 5 health --service maskd.v1.MaskService" \
        >"$work/health.log" 2>&1; then
      log "health: $(tr '\n' ' ' <"$work/health.log")"
      return 0
    fi
    sleep 1
  done
  return 1
}
timed "maskd start to SERVING (health check passes)" start_server || die "maskd did not become SERVING: $work/maskd.log"
chroot --userspec="$user" "$ROOT" /usr/bin/env -i /bin/bash -c \
  ". /.stage-env; MASKD_SERVER=127.0.0.1:$port maskctl info" >"$work/info.log" 2>&1 || die "maskctl info failed: $(cat "$work/info.log")"
log "maskctl info:"; sed 's/^/    /' "$work/info.log"
kill "$server_pid"; wait "$server_pid" 2>/dev/null || true; server_pid=

log "PASS: the CPU variant built in a Debian 12 chroot and its runtime root served the demo model"
log "summary ($(($(date +%s) - t_all)) s in all):"
printf '  %s\n' "${summary[@]}"
