// The one place where maskd::Status becomes grpc::Status. Codes are numerically equal (status.h
// picks gRPC's numbers); this function exists so that no other code builds a grpc::Status by hand.
#pragma once

#include <grpcpp/support/status.h>

#include "model/api/status.h"

namespace maskd::server {

grpc::Status ToGrpcStatus(const Status& status);

}  // namespace maskd::server
