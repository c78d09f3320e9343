# Sourced (from the repository root) by a device call's script (runs 17-19: bench/results/*/next-call*.sh):
# $out and the step timer t (lines in $out/perf.log), the build through encoder-perf.sh's build step,
# then $B (the build) and the environment to run it (the unpacked .debs, LibTorch's libraries).
out=${OUT:-gpu-out}
S=$(date +%s)
t() { echo "$1 at $(( $(date +%s) - S )) s" >> "$out/perf.log"; }
STEPS="build" OUT=$out bash scripts/gpu-host/encoder-perf.sh > "$out/perf.log" 2>&1
t build
B=${MASKD_GPU_BUILD:-/tmp/maskd-build}
source scripts/gpu-host/unpack.sh .gpu-debs /tmp/gpu-prefix > /dev/null
export LD_LIBRARY_PATH="$(python3 -c 'import os,torch;print(os.path.dirname(torch.__file__))')/lib:$LD_LIBRARY_PATH"
# pack NAME...: the named files/folders under $out that exist go into $out/all.tgz and are removed (the
# device returns at most 8 files; a missing name must not stop the packing, as it did in run 33).
pack() {
  local keep=() f
  for f in "$@"; do [ -e "$out/$f" ] && keep+=("$f"); done
  [ ${#keep[@]} -gt 0 ] || return 0
  (cd "$out" && tar czf /tmp/all.tgz "${keep[@]}" && rm -rf "${keep[@]}" && mv /tmp/all.tgz .)
}
# The steps the call scripts share (left, decode_cases, served, served_stages, finish).
source scripts/gpu-host/call-steps.sh
