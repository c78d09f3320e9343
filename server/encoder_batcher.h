// The image-encoder stage of one device: prepared images from many requests are batched (up to
// max_batch images or max_queue_delay) into one Engine::Encode call on this batcher's thread.
// A batch that runs out of device memory (RESOURCE_EXHAUSTED from the engine) is split in halves and
// each half retried, down to single images; only an image that fails alone gets RESOURCE_EXHAUSTED.
#pragma once

#include <atomic>
#include <functional>
#include <memory>
#include <vector>

#include "model/api/engine.h"
#include "server/batch_queue.h"
#include "server/gpu_turns.h"
#include "server/oom_split.h"
#include "server/stage_stats.h"

namespace maskd::server {

struct EncodeTiming {
  uint64_t queue_us = 0;
  uint64_t compute_us = 0;
  size_t batch_size = 0;
};

class EncoderBatcher {
 public:
  struct Request {
    PreparedImage image;
    // OK while someone still wants the embedding (see EmbeddingCache::FlightAlive).
    std::function<Status()> alive;
    // Called exactly once (from the batcher's thread), unless Submit refused the request.
    std::function<void(StatusOr<std::shared_ptr<const Embedding>>, const EncodeTiming&)> done;
    // The request the image is encoded for (the single-flight leader's): the batch's log lines,
    // the engine's included, carry it.
    std::string request_id;
  };

  // `stages` may be null; `engine` must outlive the batcher.
  // Told the size (images) of every Engine::Encode call (a split batch's halves included), on the
  // batcher's thread (may be empty).
  using BatchObserver = std::function<void(size_t images)>;

  // `turns`: when set, each batch runs in its turn (see gpu_turns.h); must outlive the batcher.
  EncoderBatcher(std::string name, Engine* engine, BatchQueueOptions options, StageSet* stages,
                 BatchObserver on_batch = {}, GpuTurns* turns = nullptr);

  Status Submit(Request request);
  bool HasRoom() const { return queue_.HasRoom(1); }
  void Stop() { queue_.Stop(); }
  QueueCounters counters() const;

 private:
  struct Item {
    Request request;
    Clock::time_point arrival;
    size_t weight() const { return 1; }
    const void* group() const { return nullptr; }
    Status Alive() const { return request.alive ? request.alive() : Status::Ok(); }
    void Fail(const Status& s) { request.done(s, EncodeTiming{MicrosSince(arrival), 0, 0}); }
  };
  using Result = StatusOr<std::shared_ptr<const Embedding>>;
  void Run(std::vector<Item>& batch, Clock::time_point formed);
  StatusOr<std::vector<std::shared_ptr<const Embedding>>> Encode(const std::vector<PreparedImage>& images);

  Engine* const engine_;
  GpuTurns* const turns_;
  StageSet* const stages_;
  const BatchObserver on_batch_;
  OomSplitCounters oom_;
  BatchQueue<Item> queue_;  // last: its thread uses the members above
};

}  // namespace maskd::server
