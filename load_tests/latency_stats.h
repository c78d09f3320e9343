// Latency percentiles and the measurement-window rule of maskload.
//
// Percentiles are nearest-rank over all samples of a window (no histogram buckets, so p99 of 200
// samples is the 198th smallest, exactly): maskload keeps every sample, which at the rates a single
// server reaches is a few MiB per minute.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace maskd::load {

struct LatencySummary {
  uint64_t count = 0;
  double mean_us = 0;
  uint64_t min_us = 0, p50_us = 0, p90_us = 0, p99_us = 0, max_us = 0;
};

// Nearest-rank percentile (p in [0, 100]) of `sorted` (ascending, non-empty): the smallest value
// with at least p % of the samples at or below it.
uint64_t NearestRank(const std::vector<uint64_t>& sorted, double p);
// Sorts a copy; all zero for no samples.
LatencySummary Summarize(std::vector<uint64_t> samples_us);

// What one completed call contributes.
struct Sample {
  uint64_t done_us = 0;     // completion time since the run started
  uint64_t latency_us = 0;  // from the intended send time to completion
  uint32_t images = 0;      // images completed (1 for a batch image with all its masks, else 0)
  uint32_t prompts = 0;     // prompts answered
  uint32_t masks = 0;       // masks received
  uint32_t kind = 0;        // index into the workload's kinds (batch, interactive, embed)
  int32_t code = 0;         // gRPC status code; 0 = OK. Negative: client-side (see load_client.h)
  uint64_t response_bytes = 0;
  uint64_t rle_bytes = 0;   // sum of the COCO RLE counts strings
  // The server's CallTiming of the call (0 when it failed).
  uint64_t server_total_us = 0, decode_us = 0, encoder_queue_us = 0, encoder_compute_us = 0,
           decoder_queue_us = 0, decoder_compute_us = 0, postprocess_us = 0;
};

// Aggregate of the samples completed in [start_us, end_us).
struct WindowStats {
  double start_s = 0, duration_s = 0;
  uint64_t requests = 0, ok = 0, errors = 0;
  uint64_t images = 0, prompts = 0, masks = 0;
  uint64_t response_bytes = 0, rle_bytes = 0;
  std::map<std::string, uint64_t> errors_by_code;
  LatencySummary latency;                         // OK calls only
  std::map<uint32_t, LatencySummary> latency_by_kind;
  // Means over OK calls of the server's CallTiming.
  double server_total_us = 0, decode_us = 0, encoder_queue_us = 0, encoder_compute_us = 0,
         decoder_queue_us = 0, decoder_compute_us = 0, postprocess_us = 0;

  double requests_per_s() const { return duration_s > 0 ? ok / duration_s : 0; }
  double images_per_s() const { return duration_s > 0 ? images / duration_s : 0; }
  double prompts_per_s() const { return duration_s > 0 ? prompts / duration_s : 0; }
};

// Name of a status code: the gRPC names, and maskload's own negative codes.
std::string CodeName(int32_t code);

// Aggregates the samples with done_us in [start_us, end_us); samples in any order.
WindowStats Aggregate(const Sample* begin, const Sample* end, uint64_t start_us, uint64_t end_us);
inline WindowStats Aggregate(const std::vector<Sample>& samples, uint64_t start_us, uint64_t end_us) {
  return Aggregate(samples.data(), samples.data() + samples.size(), start_us, end_us);
}

// perf_analyzer's rule: the last `count` windows are stable when each one's rate and p50 latency lie
// within `tolerance` (0.10 = 10 %) of those windows' mean. `rate` picks the unit that the workload
// counts (images/s for batch, requests/s otherwise). Windows with no OK call are never stable.
enum class RateUnit { kImages, kRequests };
double Rate(const WindowStats& w, RateUnit unit);
bool IsStable(const std::vector<WindowStats>& windows, int count, double tolerance, RateUnit unit);
// Why IsStable is false for these windows, in words naming the window, the figure and how far off it
// is (for --fail-unstable); empty when IsStable is true.
std::string WhyNotStable(const std::vector<WindowStats>& windows, int count, double tolerance, RateUnit unit);

}  // namespace maskd::load
