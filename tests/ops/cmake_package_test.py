#!/usr/bin/env python3
"""find_package(maskd_client) from an install prefix: installs the maskd_client_dev component of
BUILD_DIR into a temporary prefix, configures and builds a tiny consumer project (a copy of
cmake_consumer/, outside the checkout) against it alone, and runs it against a real CPU maskd.

usage: cmake_package_test.py BUILD_DIR MASKD_BINARY"""
import os
import shutil
import subprocess
import sys
import tempfile

from maskd_run import HERE, REPO, Maskd


def run(cmd, **kw):
    print("+", " ".join(cmd), flush=True)
    return subprocess.run(cmd, check=True, **kw)


def main():
    build_dir, binary = sys.argv[1], sys.argv[2]
    with tempfile.TemporaryDirectory(prefix="maskd-cmake-") as tmp:
        prefix = os.path.join(tmp, "prefix")
        run(["cmake", "--install", build_dir, "--prefix", prefix, "--component", "maskd_client_dev"])
        src = os.path.join(tmp, "consumer")
        shutil.copytree(os.path.join(HERE, "cmake_consumer"), src)
        out = os.path.join(tmp, "build")
        configure = ["cmake", "-S", src, "-B", out, f"-DCMAKE_PREFIX_PATH={prefix}"]
        if shutil.which("ninja"):
            configure += ["-G", "Ninja"]
        if shutil.which("ccache"):
            configure += ["-DCMAKE_CXX_COMPILER_LAUNCHER=ccache"]
        run(configure)
        run(["cmake", "--build", out, "-j2"])
        # Everything maskd came from the prefix: no path into the checkout or its build folder.
        leaks = []
        for root, _, files in os.walk(out):
            for name in files:
                if name in ("build.ninja", "CMakeCache.txt") or name.endswith(".make"):
                    text = open(os.path.join(root, name), errors="replace").read()
                    for p in (os.path.realpath(REPO), os.path.realpath(build_dir)):
                        if p + os.sep in text:
                            leaks.append(f"{name} mentions {p}")
        if leaks:
            print("FAIL the consumer build reached into the maskd tree:", leaks)
            return 1
        print("ok   the consumer was built against the install prefix only")
        with Maskd(binary) as m:
            r = subprocess.run([os.path.join(out, "consumer"), m.target], capture_output=True,
                               text=True, timeout=120)
            print(r.stdout + r.stderr)
            if r.returncode != 0 or "arch=tiny serving=1 not_found=1" not in r.stdout:
                print(f"FAIL the consumer against maskd: exit {r.returncode}")
                return 1
        print("ok   the consumer talked to maskd (health, GetInfo, NOT_FOUND)")
    print("all checks passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
