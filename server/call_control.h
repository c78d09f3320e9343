// Whether a call is still worth working for: its deadline and cancellation, checked by every stage
// before it spends engine time on the call (batchers drop dead items before any device work).
#pragma once

#include <chrono>
#include <functional>
#include <memory>
#include <mutex>
#include <string>

#include "model/api/status.h"

namespace maskd::server {

using Clock = std::chrono::steady_clock;

class CallControl {
 public:
  static constexpr std::chrono::milliseconds kDeadlineSlack{50};

  // `is_cancelled` is called under this object's lock and never after MarkFinished(), so it may
  // point into a gRPC context that dies when the call finishes.
  // `scope`: whose cached embeddings and stored results the call may see (server/security.h,
  // CallScope); "" is the one shared scope.
  CallControl(std::string request_id, Clock::time_point deadline, std::function<bool()> is_cancelled,
              std::string scope = {})
      : request_id_(std::move(request_id)),
        deadline_(deadline),
        scope_(std::move(scope)),
        is_cancelled_(std::move(is_cancelled)) {}

  const std::string& request_id() const { return request_id_; }
  const std::string& scope() const { return scope_; }
  Clock::time_point deadline() const { return deadline_; }

  // OK while the call is alive; DEADLINE_EXCEEDED or CANCELLED once it is not.
  Status Check() const {
    if (Clock::now() >= deadline_) {
      return DeadlineExceeded("the call's deadline passed before its work was done");
    }
    std::lock_guard<std::mutex> lock(mu_);
    if (finished_) return Cancelled("the call already finished");
    if (is_cancelled_ && is_cancelled_()) {
      // gRPC cancels a call when its deadline passes, by clocks a little apart from ours: a call
      // cancelled that close to its deadline expired, whoever noticed first.
      if (Clock::now() + kDeadlineSlack >= deadline_) {
        return DeadlineExceeded("the call's deadline passed before its work was done");
      }
      return Cancelled("the client cancelled the call");
    }
    return Status::Ok();
  }
  bool Alive() const { return Check().ok(); }

  // After this, Check() never calls is_cancelled again.
  void MarkFinished() {
    std::lock_guard<std::mutex> lock(mu_);
    finished_ = true;
  }

 private:
  const std::string request_id_;
  const Clock::time_point deadline_;
  const std::string scope_;
  // Guards finished_ and the calls of is_cancelled_ (see the constructor).
  mutable std::mutex mu_;
  bool finished_ = false;
  std::function<bool()> is_cancelled_;
};

using CallControlPtr = std::shared_ptr<CallControl>;

// Deadline from a gRPC context's system_clock deadline (max() = none).
Clock::time_point SteadyDeadline(std::chrono::system_clock::time_point deadline);

inline uint64_t MicrosSince(Clock::time_point t0, Clock::time_point t1 = Clock::now()) {
  return t1 > t0 ? static_cast<uint64_t>(
                       std::chrono::duration_cast<std::chrono::microseconds>(t1 - t0).count())
                 : 0;
}

}  // namespace maskd::server
