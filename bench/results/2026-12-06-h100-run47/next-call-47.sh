#!/usr/bin/env bash
# Run 47 (written 2026-12-06, NOT RUN YET; any H100/H200, ideally warm after run 45; ~6-7 minutes):
# the served click's two thread hand-over changes, each against HEAD in the same call.
# 1. 53f4ecf: a Segment by image_id resolves on the gRPC thread instead of a hop through the decode
#    pool (run 40 at 1 client: decode_queue p50 0.034 ms, mean 0.053). A = HEAD's maskd; B = HEAD
#    with inline-resolve.patch (beside this file) reversed, a second binary built in this call.
# 2. --spin-wait-us=50 (S): the pools and batchers poll 50 us after finishing work before they
#    sleep (decoder_queue and postprocess_queue were p50 0.033 / 0.040 ms at 1 client in run 40).
# 3. --malloc-tuning (on by default in maskd and maskload since 08938c1): M turns it off in both, as
#    before (on the CI host a 165 KB loopback round trip went from 312-338 to 232-237 us p50).
# vit_b interactive c1 and c16 (8 s runs, 3 s measured, as run 40) for A, B, S, M, A again; c256 for
# S, M and A (throughput: does spinning take CPU from gRPC's threads?).
#   OUT=$OUT CALL_LIMIT=480 bash bench/results/next/next-call-47.sh
# Expect: A's decode_queue ~0 and its p50 below B's by about that stage's mean; S's decoder_queue and
# postprocess_queue below A's. --spin-wait-us becomes a default only if S is faster at c1 and c16
# and not slower at c256.
set -uo pipefail
cd "$(dirname "$0")/../../.."
export BUILD_TARGETS=${BUILD_TARGETS:-"maskd maskload maskctl"}  # a fresh machine builds only these
source scripts/gpu-host/call-prelude.sh
p=bench/results/2026-12-06-h100-run47/inline-resolve.patch
apply() { if command -v patch > /dev/null; then patch "$@" -p1 < "$p"; else git apply "$@" "$p"; fi; }
rebuild() { timeout 150 cmake --build "$B" --target maskd >> "$out/perf.log" 2>&1; }
apply -R >> "$out/perf.log" 2>&1 && rebuild && cp "$B/server/maskd" /tmp/maskd-before
apply >> "$out/perf.log" 2>&1 && rebuild
t "build B"
[ -x /tmp/maskd-before ] || { echo "no B binary" >> "$out/perf.log"; exit 1; }
serve() {  # TAG BINARY RUN...
  local tag=$1 bin=$2; shift 2
  OUT=$out/served SERVED_DURATION=8 SERVED_MASKD=$bin SERVED_TAG=$tag timeout 100 \
    bash scripts/gpu-host/served-bench.sh "$@" >> "$out/served.log" 2>&1
  t "served $tag"
}
click=(vit_b:bf16::interactive:1 vit_b:bf16::interactive:16)
spin=(vit_b:bf16:--spin-wait-us=50:interactive:1 vit_b:bf16:--spin-wait-us=50:interactive:16)
serve A1 "$B/server/maskd" "${click[@]}"
serve B /tmp/maskd-before "${click[@]}"
serve S "$B/server/maskd" "${spin[@]}" vit_b:bf16:--spin-wait-us=50:interactive:256
serve M "$B/server/maskd" vit_b:bf16:--malloc-tuning=false:interactive:{1,16,256}:--no-malloc-tuning
serve A2 "$B/server/maskd" "${click[@]}" vit_b:bf16::interactive:256
grep -E "rc=" "$out/served.log" | cut -c1-300 >> "$out/perf.log"
for f in "$out"/served/served-*.json; do
  python3 - "$f" >> "$out/perf.log" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
st = {s["stage"]: s for s in r["server_after"]["stages"]}
q = " ".join("%s %.3f/%.3f" % (k, st[k]["mean_ms"], st[k]["p50_ms"])
             for k in ("decode_queue", "decoder_queue", "postprocess_queue") if k in st)
print(sys.argv[1].rsplit("/", 1)[1], q, "total mean %.3f" % st["total"]["mean_ms"],
      "client p50 %.3f p99 %.3f" % (r["summary"]["latency"]["p50_ms"], r["summary"]["latency"]["p99_ms"]),
      "prompts/s %.0f" % r["summary"]["prompts_per_s"], "client cpu us/call %.0f" % r.get("client_cpu_us_per_call", 0))
PY
done
pack served misc.tar.gz
ls "$out"
