#!/usr/bin/env python3
"""Generates maskd_client/v1/maskd_pb2.py and maskd_pb2_grpc.py from proto/maskd/v1/maskd.proto.

Run with the python that has grpcio-tools (the project venv): `python client/python/generate.py`.
The generated files are git-ignored; CMake's maskd_python_client target and the pytest conftest
run this when they are missing or older than the .proto, and setup.py's build step (pip install,
a wheel) calls generate() into the build folder.
"""
import os
import re
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.abspath(os.path.join(HERE, "..", ".."))
PROTO_ROOT = os.path.join(REPO, "proto")
PROTO = os.path.join(PROTO_ROOT, "maskd", "v1", "maskd.proto")
OUT = os.path.join(HERE, "maskd_client", "v1")


def up_to_date():
    targets = [os.path.join(OUT, n) for n in ("maskd_pb2.py", "maskd_pb2_grpc.py")]
    return all(os.path.exists(t) and os.path.getmtime(t) >= os.path.getmtime(PROTO) for t in targets)


def generate(proto_root=PROTO_ROOT, out=OUT):
    """protoc with grpcio-tools: PROTO_ROOT/maskd/v1/maskd.proto -> OUT/maskd_pb2.py, maskd_pb2_grpc.py."""
    from grpc_tools import protoc  # grpcio-tools
    import grpc_tools

    proto = os.path.join(proto_root, "maskd", "v1", "maskd.proto")

    well_known = os.path.join(os.path.dirname(grpc_tools.__file__), "_proto")
    with tempfile.TemporaryDirectory() as tmp:
        # Generated under the proto's own path (maskd/v1/...), so the descriptor keeps its canonical
        # name "maskd/v1/maskd.proto"; then moved into this package with a relative import.
        rc = protoc.main(["grpc_tools.protoc", f"-I{proto_root}", f"-I{well_known}",
                          f"--python_out={tmp}", f"--grpc_python_out={tmp}", proto])
        if rc != 0:
            raise SystemExit(f"protoc failed with exit code {rc} on {proto}")
        src = os.path.join(tmp, "maskd", "v1")
        os.makedirs(out, exist_ok=True)
        for name in ("maskd_pb2.py", "maskd_pb2_grpc.py"):
            with open(os.path.join(src, name)) as f:
                text = f.read()
            text = re.sub(r"^from maskd\.v1 import maskd_pb2 as", "from . import maskd_pb2 as", text,
                          flags=re.M)
            with open(os.path.join(out, name) + ".tmp", "w") as f:
                f.write(text)
            os.replace(os.path.join(out, name) + ".tmp", os.path.join(out, name))


def main():
    if "--if-needed" in sys.argv and up_to_date():
        return 0
    generate()
    print(f"generated {OUT}/maskd_pb2.py, maskd_pb2_grpc.py")
    return 0


if __name__ == "__main__":
    sys.exit(main())
