#!/usr/bin/env bash
# Run 47 (written 2026-12-06, NOT RUN YET; any H100/H200, ideally warm after run 45; ~4 minutes):
# A-B-A of 53f4ecf (a Segment by image_id resolves on the gRPC thread instead of a hop through the
# decode pool; run 40 at 1 client: decode_queue p50 0.034 ms, mean 0.053) on the served click.
# A = HEAD's maskd; B = HEAD with inline-resolve.patch (beside this file) reversed, built as a second
# binary in the same call. vit_b interactive c1 and c16, 6 s windows, A, B, A.
#   OUT=$OUT CALL_LIMIT=300 bash bench/results/next/next-call-47.sh
# Expect: A's decode_queue stage ~0 and its client p50 lower than B's by about that stage's mean.
set -uo pipefail
cd "$(dirname "$0")/../../.."
source scripts/gpu-host/call-prelude.sh
p=bench/results/next/inline-resolve.patch
apply() { if command -v patch > /dev/null; then patch "$@" -p1 < "$p"; else git apply "$@" "$p"; fi; }
apply -R >> "$out/perf.log" 2>&1 && ninja -C "$B" maskd >> "$out/perf.log" 2>&1 && cp "$B/server/maskd" /tmp/maskd-before
apply >> "$out/perf.log" 2>&1 && ninja -C "$B" maskd >> "$out/perf.log" 2>&1
t "build B"
[ -x /tmp/maskd-before ] || { echo "no B binary" >> "$out/perf.log"; exit 1; }
runs=(vit_b:bf16::interactive:1 vit_b:bf16::interactive:16)
for tag in A1 B A2; do
  bin=$B/server/maskd; [ "$tag" = B ] && bin=/tmp/maskd-before
  OUT=$out/served SERVED_DURATION=6 SERVED_MASKD=$bin SERVED_TAG=$tag timeout 80 \
    bash scripts/gpu-host/served-bench.sh "${runs[@]}" >> "$out/served.log" 2>&1
  t "served $tag"
done
grep -E "rc=" "$out/served.log" | cut -c1-300 >> "$out/perf.log"
for f in "$out"/served/served-*.json; do
  python3 - "$f" >> "$out/perf.log" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
st = {s["stage"]: s for s in r["server_after"]["stages"]}
print(sys.argv[1].rsplit("/", 1)[1], "decode_queue mean %.3f p50 %.3f" % (st["decode_queue"]["mean_ms"], st["decode_queue"]["p50_ms"]),
      "total mean %.3f" % st["total"]["mean_ms"], "client p50 %.3f" % r["summary"]["latency"]["p50_ms"])
PY
done
pack served misc.tar.gz
ls "$out"
