#!/usr/bin/env python3
"""NVIDIA's CUDA component wheels for a build without NVIDIA's apt repository (deploy/Dockerfile's
CPU variant; scripts/setup.sh does the same for a developer machine without a toolkit).

  cuda_wheels.py spec   the pip requirement: torch's own cuda-toolkit[...]==VERSION pin plus the
                        compiler and headers a build needs (nvcc, crt, nvvm, cccl, cudart)
  cuda_wheels.py root   after installing it: the toolkit-like prefix (site-packages/nvidia/cu13) that
                        holds bin/nvcc, with the unversioned .so names CMake's find_library wants
                        (the wheels ship only libcublas.so.13 etc.) created beside the versioned ones,
                        and lib64 -> lib (nvcc.profile links from lib64: CMake's CUDA compiler check
                        fails on -lcudadevrt / -lcudart_static without it)
"""
import importlib.metadata as md
import os
import re
import sys


def spec():
    for req in md.requires("torch") or []:
        m = re.match(r"\s*cuda-toolkit\s*\[([^\]]*)\]\s*==\s*([^\s;]+)", req)
        if m:
            extras = [e.strip() for e in m.group(1).split(",") if e.strip()]
            extras += [e for e in ("nvcc", "crt", "nvvm", "cccl", "cudart") if e not in extras]
            return f"cuda-toolkit[{','.join(extras)}]=={m.group(2)}"
    sys.exit("torch's metadata has no cuda-toolkit[...]==VERSION requirement (not a CUDA 13 wheel?)")


def root():
    nvcc = next((f.locate() for f in md.files("nvidia-cuda-nvcc") or [] if str(f).endswith("bin/nvcc")),
                None)
    if nvcc is None or not os.access(nvcc, os.X_OK):
        sys.exit("nvidia-cuda-nvcc is not installed or has no bin/nvcc")
    prefix = os.path.dirname(os.path.dirname(os.path.realpath(nvcc)))
    lib = os.path.join(prefix, "lib")
    for name in sorted(os.listdir(lib)) if os.path.isdir(lib) else []:
        m = re.match(r"(lib.+?\.so)\.[0-9.]+$", name)
        if m and not os.path.lexists(os.path.join(lib, m.group(1))):
            os.symlink(name, os.path.join(lib, m.group(1)))
    if os.path.isdir(lib) and not os.path.lexists(os.path.join(prefix, "lib64")):
        os.symlink("lib", os.path.join(prefix, "lib64"))
    return prefix


if __name__ == "__main__":
    what = sys.argv[1] if len(sys.argv) > 1 else ""
    if what not in ("spec", "root"):
        sys.exit(__doc__)
    print(spec() if what == "spec" else root())
