// Prometheus metrics of one maskd (prometheus-cpp): what the server records as it works (calls,
// batch sizes, stage times) and what is read when scraped (queues, caches, device memory, the
// model), rendered in the text exposition format.
//
// Self-contained on purpose: Serialize() is all an HTTP front needs to host GET /metrics itself;
// MetricsListener is the stand-alone one (cpp-httplib) behind --metrics-listen.
//
// Label sets are bounded: method is one of the service's methods, code one of gRPC's 17 codes,
// device one of --device's devices, stage one of StageName's, queue/tier a fixed pair. Request
// fields never become labels.
#pragma once

#include <functional>
#include <memory>
#include <string>

#include "model/api/status.h"
#include "server/stage_stats.h"

namespace maskd::v1 {
class GetInfoResponse;
}

namespace maskd::server {

class Metrics {
 public:
  // Fills what a scrape reports about queues, caches, memory and the model: GetInfo's response,
  // so that GetInfo and /metrics can never disagree. Called on the scraping thread.
  using InfoSource = std::function<void(v1::GetInfoResponse*)>;

  Metrics();
  ~Metrics();
  Metrics(const Metrics&) = delete;
  Metrics& operator=(const Metrics&) = delete;

  // May be set once, before the first scrape; until then only the recorded metrics are reported.
  void SetInfoSource(InfoSource source);

  // One finished call (or SegmentStream message): maskd_requests_total and
  // maskd_request_duration_seconds. `method` must be one of a fixed set (Embed, Segment, GetInfo,
  // SegmentStream, SegmentStreamMessage).
  void ObserveCall(const char* method, StatusCode code, double seconds);
  // One encoder pass of `images` images / decoder pass of `prompts` prompts on `device`.
  void ObserveEncoderBatch(const std::string& device, size_t images);
  void ObserveDecoderBatch(const std::string& device, size_t prompts);
  // One work item's time in a pipeline stage (queue stages are waiting time).
  void ObserveStage(const std::string& device, Stage stage, uint64_t micros);

  // Everything, in the Prometheus text exposition format (version 0.0.4).
  std::string Serialize() const;

  struct Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

// GET /metrics on its own port (cpp-httplib, two threads). `metrics` must outlive it; the
// destructor stops the listener and waits for a scrape in progress.
class MetricsListener {
 public:
  // `listen` is HOST:PORT (port 0: a free one); UNAVAILABLE when it cannot be bound.
  static StatusOr<std::unique_ptr<MetricsListener>> Start(const std::string& listen,
                                                          const Metrics& metrics);
  ~MetricsListener();
  int port() const { return port_; }

 private:
  struct Http;
  MetricsListener() = default;
  std::unique_ptr<Http> http_;
  int port_ = 0;
};

}  // namespace maskd::server
