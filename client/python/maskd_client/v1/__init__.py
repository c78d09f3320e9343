"""Generated maskd v1 protobuf and gRPC modules (run client/python/generate.py to create them)."""
try:
    from . import maskd_pb2, maskd_pb2_grpc  # noqa: F401
except ImportError as e:  # pragma: no cover - only without generated files
    raise ImportError(
        "maskd_client.v1: generated modules missing; run `python client/python/generate.py` "
        f"(needs grpcio-tools): {e}") from e
