#!/usr/bin/env bash
# Served benchmarks on the GPU host: maskd on a random-weight checkpoint (WORKLOAD.md), driven by
# maskload over loopback gRPC. Expects a build in $MASKD_GPU_BUILD (build-and-test.sh build).
#   scripts/gpu-host/served-bench.sh RUN...   RUN = ARCH:PRECISION:EXTRA:WORKLOAD:CONCURRENCY[:LOAD_EXTRA]
#   e.g.  vit_b:bf16::batch:64   vit_h:bf16:--int8=1:batch:32   vit_b:bf16::interactive:16
#         vit_h:bf16::interactive:16:--background-generate=1   (EXTRA: maskd flags, LOAD_EXTRA: maskload's)
# Each run writes $OUT/served-<name>.{json,csv,png} and the server's log; a table is printed last.
# SERVED_MASKD: another maskd binary to serve with (an A/B against an older build); SERVED_TAG: a
# suffix for the run names (so that the A and B runs of one call keep apart).
set -uo pipefail
cd "$(dirname "$0")/../.."
out=${OUT:-gpu-out}
mkdir -p "$out"
build=${MASKD_GPU_BUILD:-/tmp/maskd-build}
duration=${SERVED_DURATION:-35}
maskd_bin=${SERVED_MASKD:-$build/server/maskd}
device=${SERVED_DEVICE:-cuda}
if [ "${SERVED_SKIP_UNPACK:-0}" != 1 ]; then  # 1: a machine with the packages (e.g. a CPU dry run here)
  source scripts/gpu-host/unpack.sh .gpu-debs /tmp/gpu-prefix > /dev/null
  export LD_LIBRARY_PATH="$(python3 -c 'import os,torch;print(os.path.dirname(torch.__file__))')/lib:$LD_LIBRARY_PATH"
fi
[ -x "$maskd_bin" ] && [ -x "$build/load_tests/maskload" ] ||
  { echo "served-bench.sh: no maskd/maskload in $build (did the build step fail?)" >&2; exit 1; }
port=50090
summary=()
for run in "$@"; do
  IFS=: read -r arch precision extra workload conc load_extra <<< "$run"
  ckpt=/tmp/$arch.pth
  [ -f "$ckpt" ] || "$build/client/maskctl" make-checkpoint --arch "$arch" --seed 1 "$ckpt" > /dev/null
  name="$arch-$precision${extra:+-$(echo "$extra" | tr -dc 'a-z0-9')}-$workload-c$conc${load_extra:+-$(echo "$load_extra" | tr -dc 'a-z0-9')}${SERVED_TAG:+-$SERVED_TAG}"
  port=$((port + 1))
  # Interactive clicks want no decoder queue delay; batch images want full encoder batches.
  flags=(--checkpoint "$ckpt" --device "$device" --precision "$precision" --listen 127.0.0.1:$port
         --access-log=0 --encoder-max-batch "${ENCODER_MAX_BATCH:-32}")
  [ "$workload" = interactive ] && flags+=(--decoder-queue-delay-us "${DECODER_DELAY_US:-200}")
  # shellcheck disable=SC2206
  [ -n "$extra" ] && flags+=($extra)
  "$maskd_bin" "${flags[@]}" > "$out/maskd-$name.log" 2>&1 &
  pid=$!
  for i in $(seq 1 180); do
    "$build/client/maskctl" --server 127.0.0.1:$port health > /dev/null 2>&1 && break
    kill -0 $pid 2>/dev/null || { echo "served-bench.sh: maskd exited during start-up, see $out/maskd-$name.log" >&2; break; }
    sleep 1
  done
  "$build/load_tests/maskload" --server 127.0.0.1:$port --workload "$workload" -c "$conc" --warmup 5 --window 5 \
    --max-duration "$duration" --channels 8 --out "$out/served-$name" --no-plot -q ${load_extra:+$load_extra} \
    > "$out/maskload-$name.log" 2>&1
  rc=$?
  kill -INT $pid; wait $pid
  line=$(python3 - "$out/served-$name.json" <<'EOF'
import json, sys
try:
    r = json.load(open(sys.argv[1]))
except Exception as e:
    print("no report:", e); sys.exit()
s, m = r["summary"], r.get("server_memory", {})
l = s["latency"]
print(f"img/s {s['images_per_s']:.1f} prompts/s {s['prompts_per_s']:.0f} calls/s {s['calls_per_s']:.0f} "
      f"p50 {l['p50_ms']:.2f} p90 {l['p90_ms']:.2f} p99 {l['p99_ms']:.2f} max {l['max_ms']:.1f} ms "
      f"errors {s['errors']} {s['errors_by_code']} resp {s['response_bytes_per_call']/1024:.0f} KiB/call "
      f"stable {r['stable']} gpu {json.dumps(m)[:160]}")
g = r.get("background_generate")
if g:
    print(f"    background GenerateMasks x{g['clients']}: {g['ok']} ok {g['errors']} errors p50 {g['p50_ms']:.1f} "
          f"p99 {g['p99_ms']:.1f} ms server {g['server_total_ms']:.1f} ms masks/call "
          f"{g['masks'] / max(1, g['ok']):.1f} {g['first_error'][:120]}")
EOF
)
  summary+=("$name rc=$rc $line")
done
printf '\n===== served summary\n'
printf '%s\n' "${summary[@]}"
