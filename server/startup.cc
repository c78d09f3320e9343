#include "server/startup.h"

#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <fstream>
#include <sstream>
#include <string>

#include <spdlog/spdlog.h>

namespace maskd::server {
namespace {

std::atomic<int64_t> g_main_steady_ns{0};

// When the process started, on the steady clock: /proc/self/stat's starttime (clock ticks after
// boot) against CLOCK_BOOTTIME now. Resolution: one clock tick (10 ms). `fallback` when /proc is
// not readable.
StartupTimes::Clock::time_point ProcessStart(StartupTimes::Clock::time_point fallback) {
  std::ifstream f("/proc/self/stat");
  std::string stat;
  if (!std::getline(f, stat)) return fallback;
  // Field 2 (comm) may hold spaces and parentheses: fields are counted after the last ')'.
  const size_t close = stat.rfind(')');
  if (close == std::string::npos) return fallback;
  std::istringstream rest(stat.substr(close + 1));
  std::string field;
  unsigned long long start_ticks = 0;
  for (int i = 3; i <= 22 && rest >> field; ++i) {
    if (i == 22) start_ticks = std::stoull(field);
  }
  const long hz = sysconf(_SC_CLK_TCK);
  timespec boot{};
  if (start_ticks == 0 || hz <= 0 || clock_gettime(CLOCK_BOOTTIME, &boot) != 0) return fallback;
  const auto steady_now = StartupTimes::Clock::now();
  const double since_boot_s = static_cast<double>(boot.tv_sec) + boot.tv_nsec * 1e-9;
  const double age_s = since_boot_s - static_cast<double>(start_ticks) / static_cast<double>(hz);
  if (age_s < 0) return fallback;
  return steady_now - std::chrono::duration_cast<StartupTimes::Clock::duration>(
                          std::chrono::duration<double>(age_s));
}

}  // namespace

const char* MilestoneName(Milestone m) {
  switch (m) {
    case Milestone::kMain: return "main";
    case Milestone::kListening: return "listening";
    case Milestone::kCheckpointRead: return "checkpoint_read";
    case Milestone::kWeightsReady: return "weights_ready";
    case Milestone::kWarmedUp: return "warmed_up";
    case Milestone::kServing: return "serving";
    case Milestone::kFirstMask: return "first_mask";
  }
  return "unknown";
}

void MarkProcessMain() {
  g_main_steady_ns.store(
      std::chrono::duration_cast<std::chrono::nanoseconds>(StartupTimes::Clock::now().time_since_epoch()).count());
}

StartupTimes::StartupTimes() : origin_(ProcessStart(Clock::now())) {
  const int64_t main_ns = g_main_steady_ns.load();
  if (main_ns != 0) {
    Mark(Milestone::kMain, Clock::time_point(std::chrono::duration_cast<Clock::duration>(
                               std::chrono::nanoseconds(main_ns))));
  }
}

bool StartupTimes::Mark(Milestone m, Clock::time_point at) {
  const int64_t us = std::max<int64_t>(
      1, std::chrono::duration_cast<std::chrono::microseconds>(at - origin_).count());
  int64_t expected = 0;
  if (!us_[static_cast<int>(m)].compare_exchange_strong(expected, us, std::memory_order_acq_rel)) {
    return false;
  }
  spdlog::info("startup: {} at {:.1f} ms after process start", MilestoneName(m), us / 1e3);
  return true;
}

double StartupTimes::Ms(Milestone m) const {
  return static_cast<double>(us_[static_cast<int>(m)].load(std::memory_order_acquire)) / 1e3;
}

void StartupTimes::Fill(v1::StartupTimes* out) const {
  out->set_main_ms(Ms(Milestone::kMain));
  out->set_listening_ms(Ms(Milestone::kListening));
  out->set_checkpoint_read_ms(Ms(Milestone::kCheckpointRead));
  out->set_weights_ready_ms(Ms(Milestone::kWeightsReady));
  out->set_warmed_up_ms(Ms(Milestone::kWarmedUp));
  out->set_serving_ms(Ms(Milestone::kServing));
  out->set_first_mask_ms(Ms(Milestone::kFirstMask));
}

}  // namespace maskd::server
