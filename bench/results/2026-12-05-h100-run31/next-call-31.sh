#!/usr/bin/env bash
# Run 31: why maskd died at 256 interactive clients in run 30 ("terminate called after throwing an
# instance of 'c10::AcceleratorError'"): the decoder over up to 64 images per pass against eager
# (new test), then the served c256 run with CUDA_LAUNCH_BLOCKING=1 so that the failing launch is
# named in the server's log.
set -uo pipefail
cd "$(dirname "$0")/../.."
source scripts/gpu-host/call-prelude.sh
timeout 200 "$B/tests/model_fast_decoder_gpu_test" > "$out/tests.log" 2>&1
grep -E "^\[  (PASSED|FAILED) |^\[ +FAILED |Failure|Expected|Which is|rel L2|error|Error" "$out/tests.log" | cut -c1-300 >> "$out/perf.log"
t tests
export CUDA_LAUNCH_BLOCKING=1
OUT=$out/served SERVED_DURATION=8 timeout 120 bash scripts/gpu-host/served-bench.sh vit_b:bf16::interactive:256 \
  > "$out/served.log" 2>&1
tail -3 "$out/served.log" | cut -c1-300 >> "$out/perf.log"
grep -v " I " "$out"/served/maskd-*.log | head -30 | cut -c1-600 >> "$out/perf.log"
grep -iE "error|threw|fail" "$out"/served/maskd-*.log | head -20 | cut -c1-600 >> "$out/perf.log"
t served
(cd "$out" && tar czf /tmp/all.tgz served misc.tar.gz 2>/dev/null && rm -rf served misc.tar.gz && mv /tmp/all.tgz .)
ls "$out"
