#!/usr/bin/env bash
# Differential test against the original Python SAM (tests/oracle_tests.cmake): generates a golden
# folder with a random encoder configuration, weights, images and prompts (make_golden.py, seeded),
# then checks this build with `maskctl verify-golden` on CPU fp32 at the golden README's tolerances.
#
#   run_oracle_test.sh PYTHON MASKCTL SEED OUT_DIR
#
# Without segment_anything in PYTHON: skip (exit 77), but fail under CI=true. The generated folder is
# removed after a pass (about 100 MB) and kept after a failure, for a look; MASKD_ORACLE_KEEP=1 keeps
# it always.
set -u
python=$1 maskctl=$2 seed=$3 out=$4
here=$(cd "$(dirname "$0")" && pwd)

if ! probe=$("$python" -c 'import segment_anything, torch, torchvision, PIL' 2>&1); then
  msg="the original segment_anything (with torch, torchvision, Pillow) is not importable by $python: ${probe##*$'\n'}"
  if [[ "${CI:-}" == "true" ]]; then
    echo "FAIL: $msg; required under CI=true" >&2
    exit 1
  fi
  echo "*** SKIP: $msg ***" >&2
  exit 77
fi

dir="$out/seed$seed"
rm -rf "$dir"
mkdir -p "$out"
if ! "$python" "$here/make_golden.py" --seed "$seed" --out "$dir"; then
  echo "FAIL: make_golden.py --seed $seed did not complete" >&2
  exit 1
fi
"$maskctl" verify-golden "$dir" --device cpu --dtype fp32 --json "$dir/verify.json"
rc=$?
if [[ $rc -eq 0 && "${MASKD_ORACLE_KEEP:-}" != "1" ]]; then
  rm -rf "$dir"
elif [[ $rc -ne 0 ]]; then
  echo "FAIL: verify-golden exited $rc on seed $seed; the folder is kept at $dir" \
       "(regenerate it with: $python $here/make_golden.py --seed $seed --out DIR)" >&2
fi
exit $rc
