// maskd's error type inside the engine and the server. Torch-free, gRPC-free: the server maps it to
// grpc::Status in exactly one place (server/grpc_status.h).
#pragma once

#include <cassert>
#include <cstdio>
#include <cstdlib>
#include <optional>
#include <string>
#include <utility>

namespace maskd {

// The subset of canonical status codes the engine and server produce. Numbers equal gRPC's.
enum class StatusCode : int {
  kOk = 0,
  kCancelled = 1,
  kInvalidArgument = 3,
  kDeadlineExceeded = 4,
  kNotFound = 5,
  kResourceExhausted = 8,
  kFailedPrecondition = 9,
  kInternal = 13,
  kUnavailable = 14,
  // --auth-tokens: a call without an accepted token (server/security.h). The server's message is
  // empty on purpose; the client library keeps the code instead of folding it into kInternal.
  kUnauthenticated = 16,
};

const char* StatusCodeName(StatusCode code);

class [[nodiscard]] Status {
 public:
  Status() = default;
  Status(StatusCode code, std::string message) : code_(code), message_(std::move(message)) {}

  static Status Ok() { return {}; }
  bool ok() const { return code_ == StatusCode::kOk; }
  StatusCode code() const { return code_; }
  const std::string& message() const { return message_; }
  // "INVALID_ARGUMENT: message"
  std::string ToString() const;

 private:
  StatusCode code_ = StatusCode::kOk;
  std::string message_;
};

inline Status InvalidArgument(std::string m) { return {StatusCode::kInvalidArgument, std::move(m)}; }
inline Status NotFound(std::string m) { return {StatusCode::kNotFound, std::move(m)}; }
inline Status ResourceExhausted(std::string m) { return {StatusCode::kResourceExhausted, std::move(m)}; }
inline Status FailedPrecondition(std::string m) { return {StatusCode::kFailedPrecondition, std::move(m)}; }
inline Status Internal(std::string m) { return {StatusCode::kInternal, std::move(m)}; }
inline Status Unavailable(std::string m) { return {StatusCode::kUnavailable, std::move(m)}; }
inline Status DeadlineExceeded(std::string m) { return {StatusCode::kDeadlineExceeded, std::move(m)}; }
inline Status Cancelled(std::string m) { return {StatusCode::kCancelled, std::move(m)}; }

// A value or the Status that explains why there is none.
template <typename T>
class [[nodiscard]] StatusOr {
 public:
  StatusOr(T value) : value_(std::move(value)) {}  // NOLINT: implicit by design, like absl::StatusOr
  StatusOr(Status status) : status_(std::move(status)) {  // NOLINT
    assert(!status_.ok() && "StatusOr constructed from an OK status without a value");
    if (status_.ok()) status_ = Internal("StatusOr constructed from an OK status without a value");
  }

  bool ok() const { return status_.ok(); }
  const Status& status() const { return status_; }
  // Accessing the value of an error is a programming mistake: it aborts with the status instead of
  // reading an empty optional.
  T& value() & { return Checked(); }
  const T& value() const& { return const_cast<StatusOr*>(this)->Checked(); }
  T&& value() && { return std::move(Checked()); }
  T* operator->() { return &Checked(); }
  const T* operator->() const { return &const_cast<StatusOr*>(this)->Checked(); }
  T& operator*() & { return Checked(); }
  const T& operator*() const& { return const_cast<StatusOr*>(this)->Checked(); }

 private:
  T& Checked() {
    if (!value_) {
      std::fprintf(stderr, "maskd: value of a failed StatusOr accessed: %s\n", status_.ToString().c_str());
      std::abort();
    }
    return *value_;
  }

  Status status_;
  std::optional<T> value_;
};

// A number in an error message as a person writes it (%g): 700.5, not 700.500000.
std::string FormatNumber(double v);

}  // namespace maskd

#define MASKD_RETURN_IF_ERROR(expr)          \
  do {                                       \
    ::maskd::Status maskd_status_ = (expr);  \
    if (!maskd_status_.ok()) return maskd_status_; \
  } while (0)
