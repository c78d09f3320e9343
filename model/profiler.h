// A per-kernel profile of whatever runs between Start and Stop, through LibTorch's Kineto profiler
// (CUPTI underneath; kernels replayed from CUDA graphs are recorded too). Torch-free header so that
// maskbench (which sees CLI11/nlohmann-json) can use it.
//
// One profiling session per process at a time; Start while one is active fails. Device work must be
// complete before Stop (every Engine method is synchronous, so calling Stop after them is enough).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "model/api/status.h"

namespace maskd {

struct KernelStat {
  std::string name;    // the kernel's (demangled) name as CUPTI reports it
  std::string kind;    // KernelKind(name): gemm, attention, norm, elementwise, copy, other
  int64_t calls = 0;
  double total_ms = 0;  // summed kernel durations
};

struct KernelProfile {
  std::vector<KernelStat> kernels;  // by total_ms, largest first
  double total_ms = 0;              // sum over kernels (device busy time, without gaps)
  double wall_ms = 0;               // host time from Start to Stop
};

// The class of a kernel by its name, for the tables of BENCHMARKS.md: "gemm" (cuBLAS/cuBLASLt/
// CUTLASS matrix products and convolutions), "attention" (maskd's fused kernel, flash/cuDNN/SDPA),
// "norm" (layer norms, maskd's fused norm/partition kernels), "copy" (memcpy/memset, cat, copies),
// "elementwise" (ATen's element-wise and reduction kernels) or "other".
std::string KernelKind(const std::string& name);

class KernelProfiler {
 public:
  // Starts recording CPU and CUDA activity.
  static Status Start();
  // Stops, aggregates the CUDA kernels by name and, when trace_path is not empty, writes a Chrome
  // trace (chrome://tracing, Perfetto) there.
  static StatusOr<KernelProfile> Stop(const std::string& trace_path = "");
};

// The profile as a fixed-width table: name, calls, total ms, % of kernel time, ms per `unit_count`
// units (e.g. images), then one line per kind.
std::string FormatKernelProfile(const KernelProfile& p, int unit_count, const std::string& unit,
                                size_t max_rows = 40);

}  // namespace maskd
