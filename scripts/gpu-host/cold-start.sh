#!/usr/bin/env bash
# Cold start on the GPU host (issue #13: process start -> SERVING <= 5 s for vit_h, first mask
# <= 50 ms later): for each ARCH, start maskd on a random-weight checkpoint of that size, wait for
# SERVING with `maskctl health --wait` (10 ms polls), send one click at once, then print the server's
# own start-up phases (GetInfo's startup, ms after process start) and the first request's access log
# line (the server's share of the first click, without the client process's start).
#   scripts/gpu-host/cold-start.sh ARCH...      e.g. vit_b vit_h
# Expects a build in $MASKD_GPU_BUILD and the environment of call-prelude.sh. The checkpoint file is
# in the page cache (made or read just before): this measures the server, not the disk.
set -uo pipefail
cd "$(dirname "$0")/../.."
build=${MASKD_GPU_BUILD:-/tmp/maskd-build}
out=${OUT:-gpu-out}
mkdir -p "$out"
img=/tmp/cold-start.png
python3 - "$img" <<'PY'
import struct, sys, zlib
w, h = 1024, 768
rows = b"".join(b"\0" + bytes(((x * 7 + y * 3) & 255 for x in range(w) for _ in range(3))) for y in range(h))
def chunk(t, d): return struct.pack(">I", len(d)) + t + d + struct.pack(">I", zlib.crc32(t + d) & 0xffffffff)
open(sys.argv[1], "wb").write(b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", w, h, 8, 2, 0, 0, 0))
                              + chunk(b"IDAT", zlib.compress(rows, 1)) + chunk(b"IEND", b""))
PY
device=${COLD_DEVICE:-cuda}
port=50190
for arch in "$@"; do
  ckpt=/tmp/$arch.pth
  [ -f "$ckpt" ] || "$build/client/maskctl" make-checkpoint --arch "$arch" --seed 1 "$ckpt" > /dev/null
  cat "$ckpt" > /dev/null  # into the page cache
  port=$((port + 1))
  t0=$(date +%s%N)
  "$build/server/maskd" --checkpoint "$ckpt" --device "$device" --precision "${COLD_PRECISION:-bf16}" --listen 127.0.0.1:$port \
    > "$out/cold-$arch.log" 2>&1 &
  pid=$!
  "$build/client/maskctl" --server 127.0.0.1:$port health --wait 120 > /dev/null
  t1=$(date +%s%N)
  "$build/client/maskctl" --server 127.0.0.1:$port segment "$img" --point 512,384 > /dev/null
  t2=$(date +%s%N)
  echo "cold start $arch: SERVING seen by a client at $(( (t1 - t0) / 1000000 )) ms after launch, first click answered $(( (t2 - t1) / 1000000 )) ms later (a fresh maskctl process included; maskctl no longer loads LibTorch for RPC commands)"
  # The server's own time for that first request (its access log line).
  grep -m1 "access method=Segment" "$out/cold-$arch.log" | cut -c1-300
  "$build/client/maskctl" --server 127.0.0.1:$port info | grep -A8 "^startup"
  grep -E "read in|hashed in|placed on|encoder batch [0-9]+:|warm-up done" "$out/cold-$arch.log" | cut -c1-220
  kill -INT $pid; wait $pid
done
