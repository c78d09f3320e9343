#!/usr/bin/env bash
# One row of the seed (segment-anything-fast, carried as .carry/anchors) beyond run.sh's sets, with
# run.sh's settings: its RESULT line appended to OUT/RESULTS.txt under NAME, the full output in
# OUT/NAME.log. For a device call's script, after `run.sh OUT quick`, e.g.
#   bash scripts/gpu-host/seed-row.sh "$out/anchors" fast_vit_h_bs32 100 offline --impl fast --model vit_h --batch 32
# (NAME, a timeout in seconds, then anchors.py's arguments).
set -uo pipefail
[ $# -ge 4 ] || { echo "usage: seed-row.sh OUT NAME TIMEOUT_S ANCHORS_ARGS..." >&2; exit 2; }
out=$1 name=$2 limit=$3
shift 3
anchors=$(cd "$(dirname "$0")/../../.carry/anchors" && pwd) || { echo "seed-row.sh: no .carry/anchors" >&2; exit 1; }
mkdir -p "$out"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
tar -xf "$anchors"/vendor/segment-anything-fast-*.tar -C "$work"
python3 -m zipfile -e "$anchors"/vendor/segment_anything-1.0-py3-none-any.whl "$work/sam" > /dev/null
PYTHONPATH="$work/segment-anything-fast:$work/sam" SEGMENT_ANYTHING_FAST_USE_FLASH_4=0 \
  TORCHINDUCTOR_CACHE_DIR="$work/inductor" timeout "$limit" python3 "$anchors/anchors.py" "$@" > "$out/$name.log" 2>&1
grep '^RESULT ' "$out/$name.log" | sed "s/^RESULT /RESULT $name /" >> "$out/RESULTS.txt" ||
  { echo "seed-row.sh: $name gave no RESULT (see $out/$name.log)" >&2; exit 1; }
