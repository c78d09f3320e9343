#include "server/stage_stats.h"

#include <algorithm>

namespace maskd::server {

StageWindow::StageWindow(std::string stage, size_t window)
    : stage_(std::move(stage)), window_(window < 1 ? 1 : window) {
  ring_.reserve(window_);
}

void StageWindow::Add(uint64_t micros) {
  if (observer_) observer_(micros);
  std::lock_guard<std::mutex> lock(mu_);
  ++count_;
  if (ring_.size() < window_) {
    ring_.push_back(micros);
  } else {
    ring_[next_] = micros;
    next_ = (next_ + 1) % window_;
  }
}

std::vector<uint64_t> StageWindow::Samples() const {
  std::lock_guard<std::mutex> lock(mu_);
  return ring_;
}

StageSummary StageWindow::Summary() const {
  uint64_t count;
  std::vector<uint64_t> samples;
  {
    std::lock_guard<std::mutex> lock(mu_);
    count = count_;
    samples = ring_;
  }
  return Summarize(stage_, count, std::move(samples));
}

StageSummary StageWindow::Summarize(std::string stage, uint64_t count, std::vector<uint64_t> s) {
  StageSummary out;
  out.stage = std::move(stage);
  out.count = count;
  if (s.empty()) return out;
  std::sort(s.begin(), s.end());
  double sum = 0;
  for (uint64_t v : s) sum += static_cast<double>(v);
  out.mean_us = sum / static_cast<double>(s.size());
  // Nearest-rank percentiles.
  auto rank = [&](double p) {
    size_t r = static_cast<size_t>(p * static_cast<double>(s.size()) + 0.999999);
    r = std::clamp<size_t>(r, 1, s.size());
    return static_cast<double>(s[r - 1]);
  };
  out.p50_us = rank(0.50);
  out.p99_us = rank(0.99);
  return out;
}

const char* StageName(Stage s) {
  switch (s) {
    case Stage::kDecodeQueue: return "decode_queue";
    case Stage::kDecode: return "decode";
    case Stage::kEncoderQueue: return "encoder_queue";
    case Stage::kEncoderCompute: return "encoder_compute";
    case Stage::kDecoderQueue: return "decoder_queue";
    case Stage::kDecoderCompute: return "decoder_compute";
    case Stage::kPostprocessQueue: return "postprocess_queue";
    case Stage::kPostprocess: return "postprocess";
    case Stage::kPostprocessMasks: return "postprocess_masks";
    case Stage::kPostprocessEncode: return "postprocess_encode";
    case Stage::kTotal: return "total";
  }
  return "unknown";
}

StageSet::StageSet() {
  for (int i = 0; i < kNumStages; ++i) {
    windows_.push_back(std::make_unique<StageWindow>(StageName(static_cast<Stage>(i))));
  }
}

}  // namespace maskd::server
