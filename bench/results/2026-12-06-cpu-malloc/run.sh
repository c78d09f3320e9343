#!/usr/bin/env bash
# The 2026-12-06 loopback experiment (CI host, no GPU): what a 165 KB response costs over gRPC, with
# gRPC's channel arguments and with glibc malloc's settings (server/malloc_tuning.h). From the
# repository root, after a build in build/:  bash bench/results/2026-12-06-cpu-malloc/run.sh
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
bin=/tmp/loopback_roundtrip
g++ -O2 -std=c++17 "$here/loopback_roundtrip.cc" -Ibuild/proto/gen build/proto/libmaskd_proto.a \
  $(pkg-config --cflags --libs grpc++ protobuf) -o "$bin"
echo "# $(date -u +%FT%TZ) $(git rev-parse --short HEAD) $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2)"
echo "# payload size"
for mb in 100 17000 55000 170000; do printf "%-8s " "$mb"; "$bin" "$mb" 3000; done
echo "# channel arguments, 3 x 55000-byte masks"
F="c:grpc.http2.max_frame_size=1048576 s:grpc.http2.max_frame_size=1048576"
L="c:grpc.http2.lookahead_bytes=8388608 s:grpc.http2.lookahead_bytes=8388608"
for rep in 1 2; do
  printf "%-22s " default; "$bin" 55000 3000
  printf "%-22s " max_frame_size; "$bin" 55000 3000 $F
  printf "%-22s " lookahead_bytes; "$bin" 55000 3000 $L
done
echo "# glibc malloc (GLIBC_TUNABLES, as mallopt sets them in maskd --malloc-tuning)"
for rep in 1 2 3; do
  for T in "" glibc.malloc.trim_threshold=268435456 glibc.malloc.mmap_threshold=33554432 \
           glibc.malloc.trim_threshold=268435456:glibc.malloc.mmap_threshold=33554432; do
    printf "%-75s " "[$T]"; GLIBC_TUNABLES=$T "$bin" 55000 3000
  done
done
