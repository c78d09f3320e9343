"""Build hook of the maskd-client package (the metadata is in pyproject.toml).

The gRPC stubs are generated at build time, not committed: build_py runs grpcio-tools' protoc
(generate.py) on maskd.proto into the build folder, and ships the .proto next to them
(maskd_client/proto/maskd/v1/maskd.proto). From the repository the .proto is ../../proto (the one
the server is built from); an sdist carries its own copy.
"""
import os
import shutil
import sys

from setuptools import setup
from setuptools.command.build_py import build_py
from setuptools.command.sdist import sdist

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import generate  # noqa: E402  (this folder's generate.py)

REPO_PROTO_ROOT = os.path.join(HERE, "..", "..", "proto")
PACKAGED_PROTO_ROOT = os.path.join(HERE, "maskd_client", "proto")
PROTO = os.path.join("maskd", "v1", "maskd.proto")


def proto_root():
    for root in (REPO_PROTO_ROOT, PACKAGED_PROTO_ROOT):
        if os.path.isfile(os.path.join(root, PROTO)):
            return os.path.abspath(root)
    raise SystemExit(f"maskd.proto not found under {REPO_PROTO_ROOT} or {PACKAGED_PROTO_ROOT}")


def copy_proto(dest_root):
    dest = os.path.join(dest_root, PROTO)
    os.makedirs(os.path.dirname(dest), exist_ok=True)
    shutil.copyfile(os.path.join(proto_root(), PROTO), dest)


class BuildPyWithStubs(build_py):
    def run(self):
        super().run()
        package = os.path.join(self.build_lib, "maskd_client")
        root = proto_root()
        generate.generate(proto_root=root, out=os.path.join(package, "v1"))
        copy_proto(os.path.join(package, "proto"))


class SdistWithProto(sdist):
    def make_release_tree(self, base_dir, files):
        super().make_release_tree(base_dir, files)
        # An sdist leaves the repository: it takes the .proto along for its own build_py.
        copy_proto(os.path.join(base_dir, "maskd_client", "proto"))


setup(cmdclass={"build_py": BuildPyWithStubs, "sdist": SdistWithProto})
