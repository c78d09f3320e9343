#include "load_tests/latency_stats.h"

#include <algorithm>
#include <cmath>
#include <cstdio>

namespace maskd::load {

uint64_t NearestRank(const std::vector<uint64_t>& sorted, double p) {
  const size_t n = sorted.size();
  size_t rank = static_cast<size_t>(std::ceil(p / 100.0 * static_cast<double>(n)));
  rank = std::clamp<size_t>(rank, 1, n);
  return sorted[rank - 1];
}

LatencySummary Summarize(std::vector<uint64_t> samples_us) {
  LatencySummary s;
  if (samples_us.empty()) return s;
  std::sort(samples_us.begin(), samples_us.end());
  s.count = samples_us.size();
  double sum = 0;
  for (uint64_t v : samples_us) sum += static_cast<double>(v);
  s.mean_us = sum / static_cast<double>(s.count);
  s.min_us = samples_us.front();
  s.max_us = samples_us.back();
  s.p50_us = NearestRank(samples_us, 50);
  s.p90_us = NearestRank(samples_us, 90);
  s.p99_us = NearestRank(samples_us, 99);
  return s;
}

std::string CodeName(int32_t code) {
  static const char* const kNames[] = {
      "OK", "CANCELLED", "UNKNOWN", "INVALID_ARGUMENT", "DEADLINE_EXCEEDED", "NOT_FOUND",
      "ALREADY_EXISTS", "PERMISSION_DENIED", "RESOURCE_EXHAUSTED", "FAILED_PRECONDITION", "ABORTED",
      "OUT_OF_RANGE", "UNIMPLEMENTED", "INTERNAL", "UNAVAILABLE", "DATA_LOSS", "UNAUTHENTICATED"};
  if (code >= 0 && code <= 16) return kNames[code];
  if (code == -1) return "CLIENT_BACKLOG";        // open loop: too many calls in flight, not sent
  if (code == -2) return "CLIENT_BAD_RESPONSE";   // OK status but the wrong number of results
  return "CODE_" + std::to_string(code);
}

WindowStats Aggregate(const Sample* begin, const Sample* end, uint64_t start_us, uint64_t end_us) {
  WindowStats w;
  w.start_s = start_us / 1e6;
  w.duration_s = (end_us - start_us) / 1e6;
  std::vector<uint64_t> latencies;
  std::map<uint32_t, std::vector<uint64_t>> by_kind;
  for (const Sample* it = begin; it != end; ++it) {
    const Sample& s = *it;
    if (s.done_us < start_us || s.done_us >= end_us) continue;
    ++w.requests;
    if (s.code != 0) {
      ++w.errors;
      ++w.errors_by_code[CodeName(s.code)];
      continue;
    }
    ++w.ok;
    w.images += s.images;
    w.prompts += s.prompts;
    w.masks += s.masks;
    w.response_bytes += s.response_bytes;
    w.rle_bytes += s.rle_bytes;
    latencies.push_back(s.latency_us);
    by_kind[s.kind].push_back(s.latency_us);
    w.server_total_us += s.server_total_us;
    w.decode_us += s.decode_us;
    w.encoder_queue_us += s.encoder_queue_us;
    w.encoder_compute_us += s.encoder_compute_us;
    w.decoder_queue_us += s.decoder_queue_us;
    w.decoder_compute_us += s.decoder_compute_us;
    w.postprocess_us += s.postprocess_us;
  }
  if (w.ok > 0) {
    const double n = static_cast<double>(w.ok);
    for (double* v : {&w.server_total_us, &w.decode_us, &w.encoder_queue_us, &w.encoder_compute_us,
                      &w.decoder_queue_us, &w.decoder_compute_us, &w.postprocess_us}) {
      *v /= n;
    }
  }
  w.latency = Summarize(std::move(latencies));
  for (auto& [kind, v] : by_kind) w.latency_by_kind[kind] = Summarize(std::move(v));
  return w;
}

double Rate(const WindowStats& w, RateUnit unit) {
  return unit == RateUnit::kImages ? w.images_per_s() : w.requests_per_s();
}

bool IsStable(const std::vector<WindowStats>& windows, int count, double tolerance, RateUnit unit) {
  if (count <= 0 || windows.size() < static_cast<size_t>(count)) return false;
  const auto first = windows.end() - count;
  double mean_rate = 0, mean_p50 = 0;
  for (auto it = first; it != windows.end(); ++it) {
    if (it->ok == 0) return false;
    mean_rate += Rate(*it, unit);
    mean_p50 += static_cast<double>(it->latency.p50_us);
  }
  mean_rate /= count;
  mean_p50 /= count;
  if (mean_rate <= 0) return false;
  for (auto it = first; it != windows.end(); ++it) {
    if (std::abs(Rate(*it, unit) - mean_rate) > tolerance * mean_rate) return false;
    if (std::abs(static_cast<double>(it->latency.p50_us) - mean_p50) > tolerance * mean_p50) return false;
  }
  return true;
}

std::string WhyNotStable(const std::vector<WindowStats>& windows, int count, double tolerance,
                         RateUnit unit) {
  if (IsStable(windows, count, tolerance, unit)) return "";
  char buf[256];
  if (count <= 0 || windows.size() < static_cast<size_t>(count)) {
    std::snprintf(buf, sizeof buf, "%zu measurement window(s), fewer than the %d that must agree",
                  windows.size(), count);
    return buf;
  }
  const size_t first = windows.size() - static_cast<size_t>(count);
  double mean_rate = 0, mean_p50 = 0;
  for (size_t i = first; i < windows.size(); ++i) {
    if (windows[i].ok == 0) {
      std::snprintf(buf, sizeof buf, "window %zu completed no call", i);
      return buf;
    }
    mean_rate += Rate(windows[i], unit);
    mean_p50 += static_cast<double>(windows[i].latency.p50_us);
  }
  mean_rate /= count;
  mean_p50 /= count;
  const char* unit_name = unit == RateUnit::kImages ? "img/s" : "calls/s";
  if (mean_rate <= 0) {
    std::snprintf(buf, sizeof buf, "the last %d windows have no throughput in %s", count, unit_name);
    return buf;
  }
  // The window furthest off, by throughput first (what a sweep row reports), then p50.
  size_t worst = first;
  double worst_dev = -1;
  bool worst_is_rate = true;
  for (size_t i = first; i < windows.size(); ++i) {
    const double dev = std::abs(Rate(windows[i], unit) - mean_rate) / mean_rate;
    if (dev > tolerance && dev > worst_dev) worst = i, worst_dev = dev, worst_is_rate = true;
  }
  if (worst_dev < 0) {
    for (size_t i = first; i < windows.size(); ++i) {
      const double dev = mean_p50 > 0
                             ? std::abs(static_cast<double>(windows[i].latency.p50_us) - mean_p50) / mean_p50
                             : 0;
      if (dev > tolerance && dev > worst_dev) worst = i, worst_dev = dev, worst_is_rate = false;
    }
  }
  if (worst_is_rate) {
    std::snprintf(buf, sizeof buf,
                  "window %zu ran at %.2f %s, %.0f %% from the last %d windows' mean %.2f (allowed %.0f %%)",
                  worst, Rate(windows[worst], unit), unit_name, 100 * worst_dev, count, mean_rate,
                  100 * tolerance);
  } else {
    std::snprintf(buf, sizeof buf,
                  "window %zu had p50 %.2f ms, %.0f %% from the last %d windows' mean %.2f ms (allowed %.0f %%)",
                  worst, windows[worst].latency.p50_us / 1e3, 100 * worst_dev, count, mean_p50 / 1e3,
                  100 * tolerance);
  }
  return buf;
}

}  // namespace maskd::load
