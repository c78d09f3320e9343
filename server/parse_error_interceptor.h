// Unary requests that do not parse: gRPC's callback API answers them with a bare UNIMPLEMENTED
// before any handler runs (so nothing is logged either). This server interceptor notices the
// missing request message and turns that answer into INVALID_ARGUMENT naming the method, with a
// log line. `on_unparsable` is called once per such call (MaskService counts it in GetInfo).
#pragma once

#include <functional>
#include <memory>

#include <grpcpp/support/server_interceptor.h>

namespace maskd::server {

std::unique_ptr<grpc::experimental::ServerInterceptorFactoryInterface>
MakeParseErrorInterceptorFactory(std::function<void()> on_unparsable = {});

}  // namespace maskd::server
