// The name of a gRPC status code ("INVALID_ARGUMENT"), as grpc's own C core spells it: the one
// mapping the client library (error messages) and the server's HTTP front (error bodies) share.
#pragma once

#include <grpcpp/support/status_code_enum.h>

namespace maskd {

// "UNRECOGNISED_CODE" for a value outside gRPC's 17 codes (a cast integer).
const char* GrpcCodeName(grpc::StatusCode code);

}  // namespace maskd
