#!/usr/bin/env python3
"""Writes the descriptor of grpc.health.v1 (from PyPI's grpcio-health-checking, which ships the
compiled proto but not its .proto text) as a FileDescriptorSet, for protoc --descriptor_set_in.

maskd serves gRPC's built-in health service, whose C++ implementation does not put its proto into
the protobuf descriptor pool, so server reflection cannot describe it (grpcurl `describe
grpc.health.v1.Health` fails). Compiling this descriptor into maskd_proto registers it.

usage: health_descriptor.py OUT.desc   (prints the proto's file name)"""
import sys

from google.protobuf import descriptor_pb2
from grpc_health.v1 import health_pb2

fds = descriptor_pb2.FileDescriptorSet()
fds.file.add().ParseFromString(health_pb2.DESCRIPTOR.serialized_pb)
with open(sys.argv[1], "wb") as f:
    f.write(fds.SerializeToString())
print(fds.file[0].name, end="")
