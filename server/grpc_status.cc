#include "server/grpc_status.h"

namespace maskd::server {

grpc::Status ToGrpcStatus(const Status& status) {
  switch (status.code()) {
    case StatusCode::kOk: return grpc::Status::OK;
    case StatusCode::kCancelled: return {grpc::StatusCode::CANCELLED, status.message()};
    case StatusCode::kInvalidArgument: return {grpc::StatusCode::INVALID_ARGUMENT, status.message()};
    case StatusCode::kDeadlineExceeded: return {grpc::StatusCode::DEADLINE_EXCEEDED, status.message()};
    case StatusCode::kNotFound: return {grpc::StatusCode::NOT_FOUND, status.message()};
    case StatusCode::kResourceExhausted:
      return {grpc::StatusCode::RESOURCE_EXHAUSTED, status.message()};
    case StatusCode::kFailedPrecondition:
      return {grpc::StatusCode::FAILED_PRECONDITION, status.message()};
    case StatusCode::kInternal: return {grpc::StatusCode::INTERNAL, status.message()};
    case StatusCode::kUnavailable: return {grpc::StatusCode::UNAVAILABLE, status.message()};
    case StatusCode::kUnauthenticated: return {grpc::StatusCode::UNAUTHENTICATED, status.message()};
  }
  return {grpc::StatusCode::INTERNAL,
          "unmapped maskd status code " + std::to_string(static_cast<int>(status.code())) + ": " +
              status.message()};
}

}  // namespace maskd::server
