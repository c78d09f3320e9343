#!/usr/bin/env bash
# On a machine that reaches Debian's archive: download every Debian package the offline GPU host
# needs into OUTDIR (default .gpu-debs): ../shared/gpu-host/debs.txt (gRPC and the small libraries)
# and scripts/gpu-host/extra-debs.txt (prometheus-cpp and what its CMake config looks for). Nothing
# is installed. Carry OUTDIR to the GPU host; scripts/gpu-host/unpack.sh unpacks it there.
#   scripts/gpu-host/bundle-debs.sh [OUTDIR]
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
out=${1:-.gpu-debs}
shared=${MASKD_SHARED_GPU_HOST:-$here/../../../shared/gpu-host}
[ -x "$shared/bundle-debs.sh" ] || { echo "bundle-debs.sh: $shared/bundle-debs.sh not found (set MASKD_SHARED_GPU_HOST)" >&2; exit 1; }
"$shared/bundle-debs.sh" "$out"
cd "$out"
grep -v -E '^\s*(#|$)' "$here/extra-debs.txt" | while read -r pkg; do
  ls "${pkg}"_*.deb >/dev/null 2>&1 || apt-get download -q "$pkg" >/dev/null 2>&1 ||
    { echo "bundle-debs.sh: cannot download $pkg" >&2; exit 1; }
done
echo "$(ls ./*.deb | wc -l) packages, $(du -sh . | cut -f1) in $out"
