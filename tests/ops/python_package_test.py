#!/usr/bin/env python3
"""The Python client as a user installs it: `pip install client/python` into a fresh virtual
environment, and a wheel built from it, hold the generated gRPC stubs and the .proto; the installed
package (not the source tree) talks to a running CPU maskd and raises typed errors carrying the
status code and the request id.

Offline (--no-index): the fresh venv sees the test python's packages (pip, grpcio, grpcio-tools,
setuptools, numpy, ...) through a .pth file placed after its own site-packages, so what it imports
as maskd_client is only what pip installed there.

usage: python_package_test.py MASKD_BINARY"""
import os
import shutil
import subprocess
import sys
import sysconfig
import tempfile
import textwrap
import zipfile

from maskd_run import REPO, Maskd

CHECK_SCRIPT = textwrap.dedent('''
    import sys
    import grpc
    import maskd_client
    from maskd_client import errors
    target, venv = sys.argv[1], sys.argv[2]
    assert maskd_client.__file__.startswith(venv), f"imported {maskd_client.__file__}, not from {venv}"
    import os
    proto = os.path.join(maskd_client.proto_dir(), "maskd", "v1", "maskd.proto")
    assert os.path.isfile(proto), proto
    assert "service MaskService" in open(proto).read()
    with maskd_client.MaskdClient(target, timeout=60) as c:
        assert c.health() == "SERVING"
        info = c.info()
        assert info.model.arch == "tiny", info.model
        try:
            c.segment("0" * 64, points=[(1, 1, 1)])
            raise AssertionError("an unknown image_id was accepted")
        except maskd_client.NotFound as e:
            assert e.code() == grpc.StatusCode.NOT_FOUND and e.status_code == grpc.StatusCode.NOT_FOUND
            assert isinstance(e, grpc.RpcError) and isinstance(e, errors.MaskdError)
            assert e.details() and e.request_id, (e.details(), e.request_id)
            print("NotFound:", e)
        try:
            c.segment_prompts(b"not an image", [])
            raise AssertionError("a request without prompts was accepted")
        except maskd_client.InvalidArgument as e:
            assert e.code() == grpc.StatusCode.INVALID_ARGUMENT, e.code()
            print("InvalidArgument:", e)
    print("installed package OK")
''')


def run(cmd, **kw):
    print("+", " ".join(cmd), flush=True)
    return subprocess.run(cmd, check=True, **kw)


def main():
    binary = sys.argv[1]
    with tempfile.TemporaryDirectory(prefix="maskd-pkg-") as tmp:
        # A copy of the client and the proto with the repository's layout, so that the in-tree
        # build (build/, *.egg-info) stays out of the checkout; no generated stubs in it.
        src = os.path.join(tmp, "src")
        shutil.copytree(os.path.join(REPO, "client", "python"), os.path.join(src, "client", "python"),
                        ignore=shutil.ignore_patterns("__pycache__", "*_pb2*.py", "build", "*.egg-info"))
        shutil.copytree(os.path.join(REPO, "proto", "maskd"), os.path.join(src, "proto", "maskd"))
        pkg = os.path.join(src, "client", "python")

        # 1. A wheel built from the folder: stubs and proto inside.
        wheels = os.path.join(tmp, "wheels")
        run([sys.executable, "-m", "pip", "wheel", "-q", "--no-index", "--no-deps",
             "--no-build-isolation", pkg, "-w", wheels])
        [wheel] = [os.path.join(wheels, w) for w in os.listdir(wheels) if w.endswith(".whl")]
        names = set(zipfile.ZipFile(wheel).namelist())
        for want in ("maskd_client/v1/maskd_pb2.py", "maskd_client/v1/maskd_pb2_grpc.py",
                     "maskd_client/proto/maskd/v1/maskd.proto", "maskd_client/errors.py"):
            if want not in names:
                print(f"FAIL the wheel lacks {want}: {sorted(names)}")
                return 1
        print("ok   the wheel holds the stubs, the errors and the .proto")

        # 2. `pip install DIR` and the wheel, each into a fresh venv, each against a real maskd.
        with Maskd(binary) as m:
            for how, what in (("pip install DIR", pkg), ("pip install WHEEL", wheel)):
                venv = os.path.join(tmp, "venv-" + ("dir" if what == pkg else "wheel"))
                # --without-pip: the venv's own bundled pip/setuptools would shadow the test python's
                # (an older setuptools without bdist_wheel); pip itself comes through the .pth.
                run([sys.executable, "-m", "venv", "--without-pip", venv])
                vpy = os.path.join(venv, "bin", "python")
                site = subprocess.run([vpy, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                                      check=True, capture_output=True, text=True).stdout.strip()
                with open(os.path.join(site, "zz_maskd_test_deps.pth"), "w") as f:
                    f.write(sysconfig.get_paths()["purelib"] + "\n")
                run([vpy, "-m", "pip", "install", "-q", "--no-index", "--no-deps", "--no-build-isolation",
                     what])
                # From the temp folder: the checkout's client/python must not be importable.
                r = subprocess.run([vpy, "-c", CHECK_SCRIPT, m.target, venv], cwd=tmp,
                                   capture_output=True, text=True, timeout=300)
                print(r.stdout + r.stderr)
                if r.returncode != 0:
                    print(f"FAIL {how}: the installed package did not work")
                    return 1
                print(f"ok   {how}: stubs, proto, calls and typed errors")
    print("all checks passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
