#!/usr/bin/env bash
# maskctl starts without LibTorch (client/CMakeLists.txt, client/model_commands.h): the binary links
# neither the engine nor LibTorch/CUDA, an RPC command loads none of them at run time, and the model
# subcommands load libmaskctl_model.so only when they run: from the build tree, from an install layout
# (bin/maskctl + lib/), through MASKCTL_MODEL_MODULE, and with a clear error when it is not there.
#
#   maskctl_lazy_model_test.sh MASKCTL MODULE LIBMASKD_MODEL WORK_DIR
set -u
maskctl=$1 module=$2 libmodel=$3 work=$4
rm -rf "$work"
mkdir -p "$work"
failures=0
fail() { echo "FAIL: $*" >&2; failures=$((failures + 1)); }
# Engine-side libraries that a torch-free maskctl must neither link nor load.
torchy='libtorch|libc10|libmaskd_model|libmaskctl_model|libcudart|libcublas|libcudnn|libnvrtc|libnccl'

# 1. DT_NEEDED of the binary. The gRPC entry makes sure the list was read at all.
needed=$(readelf -d "$maskctl" | sed -n 's/.*(NEEDED).*\[\(.*\)\]/\1/p')
echo "maskctl NEEDED: $(echo $needed)"
echo "$needed" | grep -q 'libgrpc++' || fail "readelf -d found no libgrpc++ in maskctl's NEEDED: '$needed'"
if bad=$(echo "$needed" | grep -E "$torchy"); then
  fail "maskctl links engine/LibTorch libraries directly: $(echo $bad)"
fi
# ... and the module is where the engine went.
readelf -d "$module" | grep -q 'NEEDED.*\[libmaskd_model\.so\]' || fail "$module does not link libmaskd_model.so"

# 2. At run time: an RPC command (health against a closed port: exit 1) and --help load no engine
# library, not even indirectly. LD_DEBUG=libs logs every library the loader opens.
for args in "--server 127.0.0.1:1 --timeout 2 --connect-timeout 0.5 health" "--help"; do
  LD_DEBUG=libs "$maskctl" $args > "$work/out.txt" 2> "$work/ld.txt"
  rc=$?
  grep -q 'calling init: .*libgrpc++' "$work/ld.txt" || fail "LD_DEBUG=libs logged no gRPC load for 'maskctl $args'"
  if loaded=$(grep -E "calling init: .*($torchy)" "$work/ld.txt"); then
    fail "'maskctl $args' loaded engine libraries: $(echo "$loaded" | head -3)"
  fi
  case "$args" in
    *health) [[ $rc == 1 ]] || fail "maskctl health against a closed port exited $rc, expected 1" ;;
    *) [[ $rc == 0 ]] || fail "maskctl --help exited $rc"
       for sub in verify-golden make-checkpoint inspect-checkpoint; do
         grep -q "^  $sub" "$work/out.txt" || fail "maskctl --help does not list $sub"
       done ;;
  esac
done

# 3. The model subcommands from the build tree (the module beside maskctl).
ckpt="$work/tiny.pth"
if out=$("$maskctl" make-checkpoint --arch tiny --seed 3 "$ckpt" 2>&1); then
  [[ "$out" == "wrote $ckpt (tiny, seed 3)" ]] || fail "make-checkpoint printed '$out'"
  [[ -s "$ckpt" ]] || fail "make-checkpoint wrote no $ckpt"
else
  fail "make-checkpoint from the build tree failed: $out"
fi
out=$("$maskctl" inspect-checkpoint "$ckpt" 2>&1) || fail "inspect-checkpoint failed: $out"
grep -qx 'arch tiny' <<< "$out" || fail "inspect-checkpoint printed no 'arch tiny': $out"

# 4. An install layout: PREFIX/bin/maskctl finds PREFIX/lib/libmaskctl_model.so, also when run
# through a symlink in another folder (as deploy/haproxy does).
mkdir -p "$work/prefix/bin" "$work/prefix/lib" "$work/elsewhere"
cp "$maskctl" "$work/prefix/bin/maskctl"
cp "$module" "$work/prefix/lib/"
ln -s "$work/prefix/bin/maskctl" "$work/elsewhere/maskctl"
for exe in "$work/prefix/bin/maskctl" "$work/elsewhere/maskctl"; do
  out=$("$exe" inspect-checkpoint "$ckpt" 2>&1) || fail "$exe inspect-checkpoint (module in ../lib) failed: $out"
  grep -qx 'arch tiny' <<< "$out" || fail "$exe inspect-checkpoint printed no 'arch tiny': $out"
done
out=$(MASKCTL_MODEL_MODULE="$module" "$work/elsewhere/maskctl" inspect-checkpoint "$ckpt" 2>&1) \
  || fail "MASKCTL_MODEL_MODULE=$module inspect-checkpoint failed: $out"

# 5. No module: a clear message naming the path and the loader's reason, the command's error exit
# code (not a crash), nothing written.
missing="$work/nonexistent/libmaskctl_model.so"
for cmd in "make-checkpoint --arch tiny $work/never.pth:1" "inspect-checkpoint $ckpt:1" "verify-golden $work:2"; do
  args=${cmd%:*} want=${cmd##*:}
  MASKCTL_MODEL_MODULE="$missing" "$maskctl" $args > "$work/out.txt" 2> "$work/err.txt"
  rc=$?
  err=$(cat "$work/err.txt")
  [[ $rc == "$want" ]] || fail "'maskctl $args' without its module exited $rc, expected $want: $err"
  grep -qF "cannot load the model module libmaskctl_model.so" <<< "$err" || fail "no 'cannot load' message: $err"
  grep -qF "$missing: " <<< "$err" || fail "the message does not name $missing: $err"
  grep -qF "cannot open shared object file" <<< "$err" || fail "the message lacks dlerror()'s reason: $err"
  grep -qF "MASKCTL_MODEL_MODULE" <<< "$err" || fail "the message does not name MASKCTL_MODEL_MODULE: $err"
  [[ ! -s "$work/out.txt" ]] || fail "'maskctl $args' without its module printed to stdout: $(cat "$work/out.txt")"
done
[[ ! -e "$work/never.pth" ]] || fail "make-checkpoint without its module wrote a file"
# The install layout without the module: every default place is named.
rm "$work/prefix/lib/libmaskctl_model.so"
err=$("$work/prefix/bin/maskctl" inspect-checkpoint "$ckpt" 2>&1)
rc=$?
[[ $rc == 1 ]] || fail "install layout without the module: exit $rc, expected 1: $err"
for p in "$work/prefix/bin/libmaskctl_model.so" "$work/prefix/bin/../lib/libmaskctl_model.so"; do
  grep -qF "$p: " <<< "$err" || fail "the message does not name $p: $err"
done
# A shared library that is not the module (the engine itself): refused by name, not called.
err=$(MASKCTL_MODEL_MODULE="$libmodel" "$maskctl" inspect-checkpoint "$ckpt" 2>&1)
rc=$?
[[ $rc == 1 ]] && grep -qF "$libmodel: not a maskctl model module" <<< "$err" \
  || fail "MASKCTL_MODEL_MODULE=$libmodel: exit $rc, $err"

# 6. Usage errors stay CLI11's (exit 105/106), before and without any module.
MASKCTL_MODEL_MODULE="$missing" "$maskctl" verify-golden "$work" --dtype fp64 > /dev/null 2> "$work/err.txt"
rc=$?
[[ $rc == 105 ]] && grep -q -- "--dtype" "$work/err.txt" && ! grep -q "model module" "$work/err.txt" \
  || fail "verify-golden --dtype fp64: exit $rc, $(cat "$work/err.txt")"
MASKCTL_MODEL_MODULE="$missing" "$maskctl" make-checkpoint --arch vit_x "$work/never.pth" > /dev/null 2> "$work/err.txt"
rc=$?
[[ $rc == 105 ]] && grep -q -- "--arch" "$work/err.txt" || fail "make-checkpoint --arch vit_x: exit $rc, $(cat "$work/err.txt")"
MASKCTL_MODEL_MODULE="$missing" "$maskctl" make-checkpoint --arch tiny > /dev/null 2> "$work/err.txt"
rc=$?
[[ $rc == 106 ]] || fail "make-checkpoint without OUT: exit $rc, $(cat "$work/err.txt")"

if [[ $failures -ne 0 ]]; then
  echo "$failures check(s) failed; files in $work" >&2
  exit 1
fi
rm -rf "$work"
echo "PASS"
