#!/usr/bin/env python3
"""Compare the machine code (SASS) of the kernels in two CUDA object files, function by function.

    scripts/sass-diff.py OLD.o NEW.o [--rename OLD_SUBSTRING=NEW_SUBSTRING ...]

A refactor of a kernel that ran on the GPU host can be checked here, without a GPU: if every kernel's
instruction sequence is the same, the tested code is what ships. Each function's instructions are
compared with the address and encoding comments dropped and the anonymous-namespace hash in mangled
names (which changes with the file's contents) normalised; --rename maps a mangled-name change that
is expected (a removed template argument, e.g. --rename Lb0EEEv=EEv). Also compares each kernel's
registers, stack and local memory (cuobjdump -res-usage).

cuobjdump is not in the CUDA toolkit's compiler package this machine has; the script takes it from
$CUOBJDUMP, the PATH, /usr/local/cuda/bin, or else downloads PyPI's nvidia-cuda-cuobjdump and
nvidia-cuda-nvdisasm wheels (cuobjdump runs nvdisasm) into ~/.cache/maskd-cuobjdump with pip. Exit status: 0 when every function common to both is identical and
none was added or removed, 1 otherwise, 2 on a usage or tool error.
"""
import argparse
import glob
import os
import re
import shutil
import subprocess
import sys

HASH = re.compile(r"_GLOBAL__N__[0-9a-f]{8}_\d+_\w+?_[0-9a-f]{8}")
INSN = re.compile(r"^\s*/\*[0-9a-f]{4,}\*/\s*(.*?)\s*;")
FUNC = re.compile(r"^\s*Function : (\S+)")
ARCH = re.compile(r"^\s*arch = (\S+)")


def find_cuobjdump():
    for c in (os.environ.get("CUOBJDUMP"), shutil.which("cuobjdump"), "/usr/local/cuda/bin/cuobjdump"):
        if c and os.access(c, os.X_OK):
            return c
    cache = os.path.expanduser("~/.cache/maskd-cuobjdump")
    found = glob.glob(os.path.join(cache, "**", "bin", "cuobjdump"), recursive=True)
    if not found:
        print(f"sass-diff: no cuobjdump; installing PyPI's nvidia-cuda-cuobjdump into {cache}", file=sys.stderr)
        r = subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--target", cache, "nvidia-cuda-cuobjdump",
                            "nvidia-cuda-nvdisasm"])
        if r.returncode != 0:
            sys.exit("sass-diff: pip could not install nvidia-cuda-cuobjdump and nvidia-cuda-nvdisasm; set CUOBJDUMP "
                     "to a cuobjdump binary (with nvdisasm beside it or on NVDISASM_PATH)")
        found = glob.glob(os.path.join(cache, "**", "bin", "cuobjdump"), recursive=True)
    if not found:
        sys.exit("sass-diff: the nvidia-cuda-cuobjdump wheel has no bin/cuobjdump; set CUOBJDUMP")
    bin_dir = os.path.dirname(found[0])
    for tool in ("cuobjdump", "nvdisasm"):
        if os.path.exists(os.path.join(bin_dir, tool)):
            os.chmod(os.path.join(bin_dir, tool), 0o755)
    os.environ.setdefault("NVDISASM_PATH", bin_dir)  # cuobjdump -sass runs nvdisasm
    return found[0]


def run(tool, *args):
    r = subprocess.run([tool, *args], capture_output=True, text=True)
    if r.returncode != 0:
        sys.exit(f"sass-diff: {' '.join([tool, *args])} failed: {r.stderr.strip()}")
    return r.stdout


def normalise(name, renames):
    name = HASH.sub("_GLOBAL__N_", name)
    for old, new in renames:
        name = name.replace(old, new)
    return name


def functions(tool, obj, renames):
    """{(arch, name): [instruction, ...]} from cuobjdump -sass."""
    out, key, arch = {}, None, None
    for line in run(tool, "-sass", obj).splitlines():
        if m := ARCH.match(line):
            arch = m.group(1)
        elif m := FUNC.match(line):
            key = (arch, normalise(m.group(1), renames))
            out[key] = []
        elif key is not None and (m := INSN.match(line)):
            out[key].append(re.sub(r"\s+", " ", HASH.sub("_GLOBAL__N_", m.group(1))))
    return out


def resources(tool, obj, renames):
    """{name: 'REG:n STACK:n LOCAL:n'} from cuobjdump -res-usage."""
    out, name = {}, None
    for line in run(tool, "-res-usage", obj).splitlines():
        if m := re.match(r"\s*Function (\S+):", line):
            name = normalise(m.group(1), renames)
        elif name and "REG:" in line:
            out[name] = " ".join(re.findall(r"(?:REG|STACK|LOCAL):\d+", line))
            name = None
    return out


def short(name):
    return re.sub(r".*_GLOBAL__N_", "", name)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("old")
    p.add_argument("new")
    p.add_argument("--rename", action="append", default=[], metavar="OLD=NEW",
                   help="an expected change of a mangled-name substring (repeatable)")
    a = p.parse_args()
    renames = []
    for r in a.rename:
        if "=" not in r:
            p.error(f"--rename {r!r}: expected OLD=NEW")
        renames.append(tuple(r.split("=", 1)))
    for f in (a.old, a.new):
        if not os.path.isfile(f):
            p.error(f"{f}: no such file")
    tool = find_cuobjdump()
    old, new = functions(tool, a.old, renames), functions(tool, a.new, renames)
    old_res, new_res = resources(tool, a.old, renames), resources(tool, a.new, renames)
    differ = 0
    for key in sorted(set(old) | set(new)):
        arch, name = key
        if key not in new:
            print(f"REMOVED   {arch} {short(name)}")
            differ += 1
        elif key not in old:
            print(f"ADDED     {arch} {short(name)}")
            differ += 1
        elif old[key] != new[key]:
            x, y = old[key], new[key]
            i = next((i for i, (u, v) in enumerate(zip(x, y)) if u != v), min(len(x), len(y)))
            print(f"DIFFERENT {arch} {short(name)}: {len(x)} vs {len(y)} instructions; first at {i}: "
                  f"{x[i] if i < len(x) else '(end)'} | {y[i] if i < len(y) else '(end)'}")
            differ += 1
        else:
            res = f"; {new_res.get(name, '?')}" + ("" if old_res.get(name) == new_res.get(name)
                                                   else f" (was {old_res.get(name, '?')})")
            print(f"IDENTICAL {arch} {short(name)}: {len(new[key])} instructions{res}")
    if not old and not new:
        print("sass-diff: neither object has device code", file=sys.stderr)
        return 2
    return 1 if differ else 0


if __name__ == "__main__":
    sys.exit(main())
