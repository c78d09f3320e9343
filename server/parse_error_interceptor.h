// Unary requests that do not parse: gRPC's callback API answers them with a bare UNIMPLEMENTED
// before any handler runs (so nothing is logged either). This server interceptor notices the
// missing request message and turns that answer into INVALID_ARGUMENT naming the method, with a
// log line.
#pragma once

#include <memory>

#include <grpcpp/support/server_interceptor.h>

namespace maskd::server {

std::unique_ptr<grpc::experimental::ServerInterceptorFactoryInterface>
MakeParseErrorInterceptorFactory();

}  // namespace maskd::server
