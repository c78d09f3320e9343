#!/usr/bin/env bash
# Run 53 (written 2026-12-06, sixth session; any card; ~2.5 minutes fresh): where the CPU goes at c256.
# Run 51 (H100): vit_b c256 ~17k prompts/s in steady seconds (14.7k over its 3 s window), decoder
# batches 3.24 ms for 62.6 prompts with ~24 % of the run idle between them, post-processing 4.95 ms
# a call of which the GPU pass is 2.03. The threads are named now (pools "postprocess/N", batchers
# "decoder[cuda:0]"), so /proc shows which pool is busy: scripts/gpu-host/thread-cpu.sh samples maskd
# and maskload over 6 s of the measured run.
#   mkdir -p $OUT && OUT=$OUT CALL_LIMIT=200 timeout 215 bash bench/results/next/next-call-53.sh
set -uo pipefail
cd "$(dirname "$0")/../../.."
export BUILD_TARGETS=${BUILD_TARGETS:-"maskd maskload maskctl"}
source scripts/gpu-host/call-prelude.sh
sample() {  # $1: tag; waits for the run's maskd and maskload, then samples both over 6 s
  local d l
  for _ in $(seq 1 60); do d=$(pgrep -n -x maskd) && l=$(pgrep -n -x maskload) && break; sleep 0.5; done
  sleep 9  # server start-up and maskload's 5 s warm-up
  bash scripts/gpu-host/thread-cpu.sh "$d" 6 > "$out/threads-$1-maskd.txt" 2>&1 &
  bash scripts/gpu-host/thread-cpu.sh "$l" 6 > "$out/threads-$1-maskload.txt" 2>&1
  wait
}
for conc in 256 16; do
  sample c$conc &
  OUT=$out/served SERVED_DURATION=16 timeout 60 bash scripts/gpu-host/served-bench.sh vit_b:bf16::interactive:$conc \
    >> "$out/served.log" 2>&1
  wait
  grep -E "rc=" "$out/served.log" | tail -1 | cut -c1-300 >> "$out/perf.log"
  grep -h -B1 -A1 "server per call" "$out"/served/maskload-vit_b-bf16-interactive-c$conc.log | cut -c1-200 >> "$out/perf.log"
  cat "$out/threads-c$conc-maskd.txt" "$out/threads-c$conc-maskload.txt" >> "$out/perf.log"
  t served-c$conc
done
nproc >> "$out/perf.log"
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv >> "$out/perf.log" 2>&1
pack served misc.tar.gz
ls "$out"
