// Cold-start milestones (issue #13): process start -> main -> listening -> checkpoint read ->
// weights ready -> warmed up -> SERVING -> first mask. Each is recorded once, logged once at INFO,
// reported in GetInfo (v1::StartupTimes) and on /metrics (maskd_startup_seconds{phase}).
#pragma once

#include <array>
#include <atomic>
#include <chrono>
#include <cstdint>

#include "maskd/v1/maskd.pb.h"

namespace maskd::server {

enum class Milestone { kMain, kListening, kCheckpointRead, kWeightsReady, kWarmedUp, kServing, kFirstMask };
inline constexpr int kNumMilestones = 7;
// "main", "listening", "checkpoint_read", ... (the metric's phase label).
const char* MilestoneName(Milestone m);

// Called first thing in main(): the kMain milestone of every StartupTimes made after it.
void MarkProcessMain();

// Thread-safe; every method may be called from any thread.
class StartupTimes {
 public:
  using Clock = std::chrono::steady_clock;
  // The origin is the process's start time (/proc/self/stat), else the construction time.
  StartupTimes();

  // Records `m` at `at` (default: now) unless it is recorded already; the first record logs one
  // INFO line. Returns whether this call recorded it.
  bool Mark(Milestone m, Clock::time_point at = Clock::now());
  // Milliseconds since the origin; 0 = not reached.
  double Ms(Milestone m) const;
  bool Reached(Milestone m) const { return us_[static_cast<int>(m)].load(std::memory_order_acquire) > 0; }
  void Fill(v1::StartupTimes* out) const;
  Clock::time_point origin() const { return origin_; }

 private:
  Clock::time_point origin_;
  // Microseconds since origin_, at least 1 once reached; 0 = not reached.
  std::array<std::atomic<int64_t>, kNumMilestones> us_{};
};

}  // namespace maskd::server
