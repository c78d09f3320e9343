// Per-stage latency over a sliding window of recent work items (GetInfo's StageTiming), so that a
// slow number can be explained as queueing or compute.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

namespace maskd::server {

struct StageSummary {
  std::string stage;
  uint64_t count = 0;  // items since start
  double mean_us = 0, p50_us = 0, p99_us = 0;  // over the window
};

class StageWindow {
 public:
  explicit StageWindow(std::string stage, size_t window = 2048);
  void Add(uint64_t micros);
  // Also told every Add (the Prometheus stage histograms). Set before the first Add: it is read
  // without the lock.
  void SetObserver(std::function<void(uint64_t micros)> observer) { observer_ = std::move(observer); }
  StageSummary Summary() const;
  // The samples currently in the window (to merge windows of several devices).
  std::vector<uint64_t> Samples() const;
  const std::string& stage() const { return stage_; }

  static StageSummary Summarize(std::string stage, uint64_t count, std::vector<uint64_t> samples);

 private:
  const std::string stage_;
  const size_t window_;
  std::function<void(uint64_t)> observer_;
  // Guards everything below.
  mutable std::mutex mu_;
  std::vector<uint64_t> ring_;
  size_t next_ = 0;
  uint64_t count_ = 0;
};

// The pipeline's stages, in order. Queue stages are waiting time, the others work.
enum class Stage {
  kDecodeQueue,
  kDecode,
  kEncoderQueue,
  kEncoderCompute,
  kDecoderQueue,
  kDecoderCompute,
  kPostprocessQueue,
  kPostprocess,
  // The two parts of kPostprocess: the engine's mask pass (upscale, threshold, RLE runs on the
  // device, and the copies to the host) and the encoding on the CPU (COCO RLE strings, PNG,
  // polygons, the result store).
  kPostprocessMasks,
  kPostprocessEncode,
  kTotal,
};
inline constexpr int kNumStages = 11;
const char* StageName(Stage s);  // "decode_queue", ..., "total"

// One StageWindow per Stage.
class StageSet {
 public:
  StageSet();
  StageWindow& operator[](Stage s) { return *windows_[static_cast<int>(s)]; }
  const StageWindow& operator[](Stage s) const { return *windows_[static_cast<int>(s)]; }

 private:
  std::vector<std::unique_ptr<StageWindow>> windows_;
};

}  // namespace maskd::server
