// maskload's engine: drives a maskd server with a closed loop (N clients, each sending its next
// call when the previous one completes) or an open loop (Poisson arrivals at a target rate), on the
// gRPC callback API so that a few client threads sustain thousands of calls per second.
//
// A run is a warm-up, then measurement windows until the last `stable_windows` agree within
// `stability` (perf_analyzer's rule, see latency_stats.h), bounded by max_duration_s and
// max_requests. Latency is measured from the intended send time (open loop: the scheduled arrival,
// so a slow server cannot hide queueing by slowing the client down).
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "client/client.h"
#include "load_tests/latency_stats.h"
#include "maskd/v1/maskd.pb.h"
#include "model/api/status.h"

namespace maskd::load {

enum class Workload { kBatch, kInteractive, kMixed };
const char* WorkloadName(Workload w);
StatusOr<Workload> ParseWorkload(const std::string& name);

// Sample::kind values.
enum class CallKind : uint32_t { kBatch = 0, kInteractive = 1 };
const char* CallKindName(uint32_t kind);

struct LoadConfig {
  std::string target = "localhost:50051";
  // TLS and token of every channel (maskload's --tls-ca/--tls-cert/--tls-key/--token flags).
  client::ClientSecurity security;
  Workload workload = Workload::kBatch;
  // Closed loop: concurrent clients. Ignored when rate > 0.
  int concurrency = 8;
  // Open loop: target calls per second (Poisson arrivals); 0 = closed loop.
  double rate = 0;
  // Open loop: calls in flight beyond this are not sent and count as CLIENT_BACKLOG errors.
  int max_inflight = 10000;
  // gRPC channels (TCP connections) the calls are spread over.
  int channels = 4;

  double warmup_s = 5;
  double window_s = 5;
  int stable_windows = 3;
  double stability = 0.10;
  double max_duration_s = 120;
  uint64_t max_requests = 1000000;
  double request_timeout_s = 60;
  // How long to wait for the server at the start.
  double connect_timeout_s = 10;

  // Batch prompts: P ~ U{min_prompts..max_prompts} single foreground points per image.
  int min_prompts = 1;
  int max_prompts = 14;
  bool multimask = true;
  v1::OutputFormat format = v1::OUTPUT_FORMAT_COCO_RLE;
  // Batch: give every call's JPEG a unique comment so that each one runs the encoder (the server's
  // cache is content-addressed). Off: the image pool cycles and repeats hit the cache.
  bool unique_images = true;
  // Interactive: consecutive clicks of one client on the same image before it moves on.
  int clicks_per_image = 20;
  // Mixed: probability that a call is a batch image (else an interactive click).
  double batch_fraction = 0.2;
  // Send x-maskd-image-id (maskd_client's affinity header) with every call, as maskd_client does, so
  // that a run through Envoy (deploy/envoy/envoy.yaml) keeps each image on one replica. Batch calls
  // hash their JPEG on the client for it (SHA-256, counted in the client CPU per call).
  bool affinity_header = true;

  // Background "segment everything": this many extra clients loop GenerateMasks (32 x 32 grid by
  // default, the original generator's other defaults) on an image of the pool embedded beforehand,
  // for the whole run, as a labelling pipeline beside interactive users would. Their calls are not
  // samples of the measured workload; LoadResult::background reports them on their own.
  int background_generate = 0;
  int generate_points_per_side = 32;

  uint64_t seed = 1;
};

// The background generation loop's calls over the measured part of the run (after the warm-up).
struct BackgroundStats {
  uint64_t ok = 0, errors = 0;
  uint64_t masks = 0;  // over the ok calls
  LatencySummary latency;  // of the ok calls, as the measured workload's (nearest rank)
  // The server's CallTiming.total_us of the ok calls, mean.
  double server_total_ms = 0;
  std::string first_error;
};

// One image of the pool: encoded bytes as sent (JPEG for the generated ones) and its size.
struct ImageAsset {
  std::string name;
  std::string encoded;
  int width = 0, height = 0;
  bool is_jpeg = false;
};

struct MemoryPoint {
  double t_s = 0;
  uint64_t allocated_bytes = 0, peak_allocated_bytes = 0;
};

struct LoadResult {
  std::vector<WindowStats> windows;  // measurement windows, in order
  bool stable = false;
  std::string stop_reason;           // stable | max-duration | max-requests | error
  // Over the stable windows (the last `stable_windows`), or every measurement window when the run
  // stopped before it was stable.
  WindowStats summary;
  int summary_windows = 0;
  // Every call of the run, warm-up included.
  WindowStats whole_run;
  std::vector<WindowStats> timeline;  // per second
  double warmup_end_s = 0;
  double wall_s = 0;
  uint64_t sent = 0;
  // Client process CPU time over the measured part, and per completed call.
  double client_cpu_s = 0;
  double client_cpu_us_per_call = 0;
  std::optional<v1::GetInfoResponse> info_before, info_after;
  std::vector<MemoryPoint> memory;  // GetInfo at each window boundary
  std::optional<BackgroundStats> background;  // with LoadConfig::background_generate > 0
};

using ProgressFn = std::function<void(const std::string& line, bool final_line)>;

class LoadRunner {
 public:
  LoadRunner(LoadConfig config, std::vector<ImageAsset> images, ProgressFn progress = {});
  // Runs to completion (blocks). Fails only when the server cannot be reached or the interactive
  // set-up (one Embed per image) fails; errors during the run are counted, not returned.
  StatusOr<LoadResult> Run();

 private:
  LoadConfig config_;
  std::vector<ImageAsset> images_;
  ProgressFn progress_;
};

}  // namespace maskd::load
