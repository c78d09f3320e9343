// KernelProfiler over LibTorch's Kineto profiler (torch/csrc/autograd/profiler_kineto.h).
#include "model/profiler.h"

#include <torch/csrc/autograd/profiler_kineto.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <map>
#include <mutex>
#include <set>

namespace maskd {
namespace {

namespace prof = torch::autograd::profiler;
using torch::profiler::impl::ActivityType;
using torch::profiler::impl::ProfilerConfig;
using torch::profiler::impl::ProfilerState;

std::mutex g_mu;
bool g_active = false;  // guarded by g_mu
std::chrono::steady_clock::time_point g_start;

bool Contains(const std::string& s, const char* part) { return s.find(part) != std::string::npos; }

std::string Lower(std::string s) {
  std::transform(s.begin(), s.end(), s.begin(), [](unsigned char c) { return std::tolower(c); });
  return s;
}

}  // namespace

std::string KernelKind(const std::string& raw) {
  const std::string n = Lower(raw);
  // Order matters: cuDNN attention kernels mention "cudnn", convolutions "conv"/"implicit".
  if (Contains(n, "relposattention") || Contains(n, "flash") || Contains(n, "fmha") ||
      Contains(n, "attention") || Contains(n, "sdpa") || Contains(n, "cudnn_generated_fort_native_sdpa"))
    return "attention";
  if (Contains(n, "layernorm") || Contains(n, "layer_norm") || Contains(n, "addlayernorm") ||
      Contains(n, "welford"))
    return "norm";
  if (Contains(n, "gemm") || Contains(n, "nvjet") || Contains(n, "cutlass") || Contains(n, "xmma") ||
      Contains(n, "cublas") || Contains(n, "conv") || Contains(n, "implicit") || Contains(n, "wgrad") ||
      Contains(n, "dgrad") || Contains(n, "sm90_") || Contains(n, "sm80_"))
    return "gemm";
  if (Contains(n, "memcpy") || Contains(n, "memset") || Contains(n, "copy") || Contains(n, "cat") ||
      Contains(n, "index"))
    return "copy";
  if (Contains(n, "elementwise") || Contains(n, "vectorized") || Contains(n, "reduce") ||
      Contains(n, "gelu") || Contains(n, "softmax") || Contains(n, "unrolled"))
    return "elementwise";
  return "other";
}

Status KernelProfiler::Start() {
  std::lock_guard<std::mutex> lock(g_mu);
  if (g_active) return FailedPrecondition("a kernel profile is already being recorded");
  try {
    const ProfilerConfig config(ProfilerState::KINETO);
    const std::set<ActivityType> activities{ActivityType::CPU, ActivityType::CUDA};
    prof::prepareProfiler(config, activities);
    prof::enableProfiler(config, activities);
  } catch (const std::exception& e) {
    return Internal(std::string("starting the Kineto profiler: ") + e.what());
  }
  g_active = true;
  g_start = std::chrono::steady_clock::now();
  return Status::Ok();
}

StatusOr<KernelProfile> KernelProfiler::Stop(const std::string& trace_path) {
  std::lock_guard<std::mutex> lock(g_mu);
  if (!g_active) return FailedPrecondition("no kernel profile is being recorded");
  g_active = false;
  KernelProfile p;
  p.wall_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - g_start).count();
  try {
    std::unique_ptr<prof::ProfilerResult> result = prof::disableProfiler();
    if (!result) return Internal("the Kineto profiler returned no result");
    std::map<std::string, KernelStat> by_name;
    for (const auto& e : result->events()) {
      if (e.deviceType() != c10::DeviceType::CUDA) continue;
      const std::string name = e.name();
      KernelStat& s = by_name[name];
      s.name = name;
      s.calls += 1;
      s.total_ms += static_cast<double>(e.durationNs()) / 1e6;
    }
    for (auto& [name, s] : by_name) {
      s.kind = KernelKind(name);
      p.total_ms += s.total_ms;
      p.kernels.push_back(std::move(s));
    }
    std::sort(p.kernels.begin(), p.kernels.end(),
              [](const KernelStat& a, const KernelStat& b) { return a.total_ms > b.total_ms; });
    if (!trace_path.empty()) result->save(trace_path);
  } catch (const std::exception& e) {
    return Internal(std::string("collecting the Kineto profile: ") + e.what());
  }
  return p;
}

std::string FormatKernelProfile(const KernelProfile& p, int unit_count, const std::string& unit,
                                size_t max_rows) {
  const double per = unit_count > 0 ? 1.0 / unit_count : 1.0;
  std::string out;
  char line[512];
  std::snprintf(line, sizeof line, "%-11s %7s %10s %6s %10s  %s\n", "kind", "calls", "total ms", "%",
                ("ms/" + unit).c_str(), "kernel");
  out += line;
  std::map<std::string, std::pair<double, int64_t>> kinds;
  for (size_t i = 0; i < p.kernels.size(); ++i) {
    const KernelStat& k = p.kernels[i];
    kinds[k.kind].first += k.total_ms;
    kinds[k.kind].second += k.calls;
    if (i >= max_rows) continue;
    std::string name = k.name.size() > 150 ? k.name.substr(0, 147) + "..." : k.name;
    std::snprintf(line, sizeof line, "%-11s %7lld %10.3f %6.2f %10.4f  %s\n", k.kind.c_str(),
                  static_cast<long long>(k.calls), k.total_ms,
                  p.total_ms > 0 ? 100.0 * k.total_ms / p.total_ms : 0.0, k.total_ms * per, name.c_str());
    out += line;
  }
  if (p.kernels.size() > max_rows) {
    std::snprintf(line, sizeof line, "... %zu more kernels\n", p.kernels.size() - max_rows);
    out += line;
  }
  out += "by kind:\n";
  std::vector<std::pair<std::string, std::pair<double, int64_t>>> sorted(kinds.begin(), kinds.end());
  std::sort(sorted.begin(), sorted.end(), [](const auto& a, const auto& b) { return a.second.first > b.second.first; });
  for (const auto& [kind, v] : sorted) {
    std::snprintf(line, sizeof line, "%-11s %7lld %10.3f %6.2f %10.4f\n", kind.c_str(),
                  static_cast<long long>(v.second), v.first, p.total_ms > 0 ? 100.0 * v.first / p.total_ms : 0.0,
                  v.first * per);
    out += line;
  }
  std::snprintf(line, sizeof line, "kernel total %.3f ms (%.4f ms/%s), wall %.3f ms\n", p.total_ms,
                p.total_ms * per, unit.c_str(), p.wall_ms);
  out += line;
  return out;
}

}  // namespace maskd
