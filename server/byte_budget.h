// A byte budget on accepted-but-unfinished work: every bounded queue bounds a count, not memory, and
// 400 concurrent Embeds of large images held GBs of encoded, decoded and resized pixels at once.
// A request reserves the bytes it arrived with when it is accepted, and the image that decoding
// makes (from the size its header declares) and the prepared copy before it is decoded; it gives
// them back once its image is encoded or found cached, and when it finishes. What does not fit is
// refused at once (RESOURCE_EXHAUSTED).
#pragma once

#include <cstdint>
#include <mutex>
#include <string>

#include "model/api/status.h"

namespace maskd::server {

class ByteBudget {
 public:
  // `flag` names the setting in refusals.
  ByteBudget(uint64_t capacity, std::string flag) : capacity_(capacity), flag_(std::move(flag)) {}

  // OK: `bytes` are held until Release. A budget that holds nothing but the caller's own
  // `held_by_caller` bytes admits it whatever its size, so that a request larger than the whole
  // budget is slow to get in rather than never served.
  Status TryReserve(uint64_t bytes, uint64_t held_by_caller = 0) {
    std::lock_guard<std::mutex> lock(mu_);
    if (used_ > held_by_caller && (bytes > capacity_ || used_ > capacity_ - bytes)) {
      ++refused_;
      return ResourceExhausted("the server holds " + std::to_string(used_) + " of " +
                               std::to_string(capacity_) + " bytes (" + flag_ +
                               ") for requests in flight, and this one needs " +
                               std::to_string(bytes) + ": retry with backoff");
    }
    used_ += bytes;
    return Status::Ok();
  }
  void Release(uint64_t bytes) {
    std::lock_guard<std::mutex> lock(mu_);
    used_ = bytes > used_ ? 0 : used_ - bytes;
  }
  uint64_t used() const {
    std::lock_guard<std::mutex> lock(mu_);
    return used_;
  }
  uint64_t refused() const {
    std::lock_guard<std::mutex> lock(mu_);
    return refused_;
  }
  uint64_t capacity() const { return capacity_; }

 private:
  const uint64_t capacity_;
  const std::string flag_;
  // Guards used_ and refused_.
  mutable std::mutex mu_;
  uint64_t used_ = 0, refused_ = 0;
};

}  // namespace maskd::server
