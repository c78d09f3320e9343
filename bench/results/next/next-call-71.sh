#!/usr/bin/env bash
# Run 71 (written in the fourteenth session; the device time ran out before a machine started for
# it), any card, ~5 minutes. After the on-keys and pipelined update kernels' removal (05f2a07; run 70
# measured both slower; checked without a GPU: every remaining decoder_fusion kernel's SASS identical
# to the tested build's): kernels_fusion_gpu_test whole and model_fast_decoder_gpu_test on the build
# without them, then the served click at 1 and 16 clients (#13's c1 p99 3 ms was last measured in
# run 64: 4.12 ms, outside the server's stages; c16 in run 67), then the seed's quick set.
#   mkdir -p $OUT && OUT=$OUT CALL_LIMIT=330 timeout 345 bash bench/results/next/next-call-71.sh
set -uo pipefail
cd "$(dirname "$0")/../../.."
export BUILD_TARGETS=${BUILD_TARGETS:-"maskd maskload maskctl kernels_fusion_gpu_test model_fast_decoder_gpu_test"}
source scripts/gpu-host/call-prelude.sh
export CALL_LIMIT=${CALL_LIMIT:-330}
{ timeout 60 "$B/tests/kernels_fusion_gpu_test"
  timeout 45 "$B/tests/model_fast_decoder_gpu_test"; } > "$out/tests.log" 2>&1
echo "tests rc=$?" >> "$out/perf.log"
grep -E "^\[  (PASSED|FAILED) |^\[ +FAILED |Failure|Expected|Which is|rel L2 vs fp32" "$out/tests.log" \
  | cut -c1-240 | head -40 >> "$out/perf.log"
t tests
[ "$(left)" -gt 150 ] && served levels 1 16
served_stages
finish
