#include "server/call_control.h"

namespace maskd::server {

Clock::time_point SteadyDeadline(std::chrono::system_clock::time_point deadline) {
  // Deadlines beyond a year are "none": converting them would overflow the steady clock.
  const auto now_sys = std::chrono::system_clock::now();
  if (deadline >= now_sys + std::chrono::hours(24 * 365)) return Clock::time_point::max();
  return Clock::now() + std::chrono::duration_cast<Clock::duration>(deadline - now_sys);
}

}  // namespace maskd::server
