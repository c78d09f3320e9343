#!/usr/bin/env python3
"""Server reflection of a running CPU maskd, as grpcurl uses it: every served service is listed
and describable (grpc.health.v1.Health included: gRPC's health service does not put its proto into
the descriptor pool, maskd compiles it in), and a client that knows only what reflection told it
can call grpc.health.v1.Health/Check and maskd.v1.MaskService/GetInfo.

usage: reflection_test.py MASKD_BINARY"""
import sys

import grpc
from google.protobuf import descriptor_pool, message_factory
from grpc_reflection.v1alpha.proto_reflection_descriptor_database import \
    ProtoReflectionDescriptorDatabase

from checks import Checks
from maskd_run import Maskd


def main():
    binary = sys.argv[1]
    check = Checks()

    with Maskd(binary) as m:
        channel = grpc.insecure_channel(m.target)
        db = ProtoReflectionDescriptorDatabase(channel)
        services = set(db.get_services())
        print("services:", sorted(services))
        for s in ("grpc.health.v1.Health", "maskd.v1.MaskService"):
            check(s in services, f"list: {s}")
        # A fresh pool over the reflection database only: no local copy of any proto is used.
        pool = descriptor_pool.DescriptorPool(db)
        for s in sorted(services):
            try:
                desc = pool.FindServiceByName(s)
                check(len(desc.methods) > 0, f"describe {s}: {[x.name for x in desc.methods]}")
            except KeyError as e:
                check(False, f"describe {s}: {e}")

        def call(service, method, fields):
            md = pool.FindServiceByName(service).methods_by_name[method]
            req_cls = message_factory.GetMessageClass(md.input_type)
            resp_cls = message_factory.GetMessageClass(md.output_type)
            rpc = channel.unary_unary(f"/{service}/{method}", request_serializer=req_cls.SerializeToString,
                                      response_deserializer=resp_cls.FromString)
            return rpc(req_cls(**fields), timeout=30), md

        try:
            health, md = call("grpc.health.v1.Health", "Check", {"service": "maskd.v1.MaskService"})
            status_enum = md.output_type.fields_by_name["status"].enum_type
            name = status_enum.values_by_number[health.status].name
            check(name == "SERVING", f"grpc.health.v1.Health/Check(maskd.v1.MaskService) = {name}")
            overall, _ = call("grpc.health.v1.Health", "Check", {"service": ""})
            check(status_enum.values_by_number[overall.status].name == "SERVING",
                  "grpc.health.v1.Health/Check('') = SERVING")
        except (grpc.RpcError, KeyError) as e:
            check(False, f"grpc.health.v1.Health/Check by reflection: {e}")
        try:
            info, _ = call("maskd.v1.MaskService", "GetInfo", {})
            check(info.model.arch == "tiny" and info.model.demo,
                  f"maskd.v1.MaskService/GetInfo by reflection: arch={info.model.arch}")
        except (grpc.RpcError, KeyError) as e:
            check(False, f"maskd.v1.MaskService/GetInfo by reflection: {e}")
        channel.close()
    return check.verdict()


if __name__ == "__main__":
    sys.exit(main())
