// Everything one device runs: its engine, encoder and decoder batchers, its embedding cache tier(s)
// and its result store. A server drives one DeviceWorker per device of --device; the Router decides
// which worker serves a request.
#pragma once

#include <atomic>
#include <memory>
#include <string>

#include "model/api/engine.h"
#include "server/batch_queue.h"
#include "server/decoder_batcher.h"
#include "server/embedding_cache.h"
#include "server/encoder_batcher.h"
#include "server/gpu_turns.h"
#include "server/metrics.h"
#include "server/result_store.h"
#include "server/stage_stats.h"

namespace maskd::server {

struct WorkerOptions {
  BatchQueueOptions encoder;  // weights are images
  BatchQueueOptions decoder;  // weights are prompts
  uint64_t cache_device_bytes = uint64_t{2} << 30;
  // Ignored (0) for CPU engines, whose "device" memory is host memory already.
  uint64_t cache_host_bytes = uint64_t{8} << 30;
  uint64_t result_store_bytes = uint64_t{512} << 20;
  // Told batch sizes and stage times, labelled with this worker's device; may be null. Must
  // outlive the worker.
  Metrics* metrics = nullptr;
  // Encoder and decoder batches take turns on the device (server/gpu_turns.h; --gpu-turns).
  bool gpu_turns = false;
};

class DeviceWorker {
 public:
  // `label` names the device in logs and GetInfo ("cpu", "cpu:1", "cuda:0"...).
  DeviceWorker(int index, std::string label, std::unique_ptr<Engine> engine,
               const WorkerOptions& options);
  ~DeviceWorker();

  int index() const { return index_; }
  const std::string& label() const { return label_; }
  bool is_cpu() const { return is_cpu_; }
  Engine& engine() { return *engine_; }
  const Engine& engine() const { return *engine_; }
  EmbeddingCache& cache() { return *cache_; }
  const EmbeddingCache& cache() const { return *cache_; }
  ResultStore& results() { return *results_; }
  const ResultStore& results() const { return *results_; }
  EncoderBatcher& encoder() { return *encoder_; }
  const EncoderBatcher& encoder() const { return *encoder_; }
  DecoderBatcher& decoder() { return *decoder_; }
  const DecoderBatcher& decoder() const { return *decoder_; }
  StageSet& stages() { return stages_; }
  const StageSet& stages() const { return stages_; }

  // Calls routed here and not finished: the router's load measure.
  int load() const { return load_.load(std::memory_order_relaxed); }
  void AddLoad(int delta) { load_.fetch_add(delta, std::memory_order_relaxed); }

  // Stops both batchers (queued work fails with UNAVAILABLE). Idempotent.
  void Stop();

 private:
  const int index_;
  const std::string label_;
  std::unique_ptr<Engine> engine_;
  const bool is_cpu_;
  StageSet stages_;
  std::unique_ptr<GpuTurns> turns_;  // with WorkerOptions::gpu_turns
  std::unique_ptr<ResultStore> results_;
  std::unique_ptr<EmbeddingCache> cache_;
  std::unique_ptr<EncoderBatcher> encoder_;
  std::unique_ptr<DecoderBatcher> decoder_;
  std::atomic<int> load_{0};
};

}  // namespace maskd::server
