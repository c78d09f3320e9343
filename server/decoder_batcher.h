// The prompt-encoder + mask-decoder stage of one device, jagged: prompts of many requests and many
// images go into one Engine::DecodeEach call (the engine buckets by token count internally,
// guarantees the results equal one-at-a-time decoding, and answers each prompt on its own, so a bad
// prompt fails only its request). A batch holds at most max_prompts prompts
// and leaves after max_queue_delay; the queue is bounded in prompts. A pass that runs out of device
// memory (RESOURCE_EXHAUSTED from the engine) is split in halves of prompts and each half retried,
// down to single prompts; only a prompt that fails alone fails its request with RESOURCE_EXHAUSTED.
#pragma once

#include <algorithm>
#include <atomic>
#include <functional>
#include <vector>

#include "model/api/engine.h"
#include "server/batch_queue.h"
#include "server/gpu_turns.h"
#include "server/oom_split.h"
#include "server/stage_stats.h"

namespace maskd::server {

struct DecodeTiming {
  uint64_t queue_us = 0;
  uint64_t compute_us = 0;
  size_t batch_prompts = 0;
};

class DecoderBatcher {
 public:
  struct Request {
    std::vector<DecodeItem> prompts;  // at most max_part_prompts (callers split larger requests)
    // The parts of one request share it (BatchQueueOptions::max_group_weight); may be null.
    const void* group = nullptr;
    std::function<Status()> alive;
    // Called exactly once from the batcher's thread (unless Submit refused); one DecodedPrompt per
    // prompt, in order. Keep it short: post-processing belongs on another thread.
    std::function<void(StatusOr<std::vector<DecodedPrompt>>, const DecodeTiming&)> done;
    // The batch's log lines, the engine's included, carry it.
    std::string request_id;
  };

  // Told the size (prompts) of every Engine::DecodeEach call (a split batch's halves included), on
  // the batcher's thread (may be empty).
  using BatchObserver = std::function<void(size_t prompts)>;

  // `turns`: when set, each batch runs in its turn (see gpu_turns.h); must outlive the batcher.
  DecoderBatcher(std::string name, Engine* engine, BatchQueueOptions options, StageSet* stages,
                 BatchObserver on_batch = {}, GpuTurns* turns = nullptr);

  Status Submit(Request request);
  bool HasRoom(size_t prompts) const { return queue_.HasRoom(prompts); }
  size_t max_prompts() const { return queue_.options().max_batch_weight; }
  // The most prompts of one request in one batch: callers split requests into parts of this size.
  size_t max_part_prompts() const {
    const BatchQueueOptions& o = queue_.options();
    return o.max_group_weight > 0 ? std::min(o.max_group_weight, o.max_batch_weight)
                                  : o.max_batch_weight;
  }
  void Stop() { queue_.Stop(); }
  QueueCounters counters() const;

 private:
  struct Item {
    Request request;
    Clock::time_point arrival;
    size_t weight() const { return request.prompts.size(); }
    const void* group() const { return request.group; }
    Status Alive() const { return request.alive ? request.alive() : Status::Ok(); }
    void Fail(const Status& s) { request.done(s, DecodeTiming{MicrosSince(arrival), 0, 0}); }
  };
  void Run(std::vector<Item>& batch, Clock::time_point formed);
  StatusOr<std::vector<StatusOr<DecodedPrompt>>> Decode(const std::vector<DecodeItem>& items);

  Engine* const engine_;
  GpuTurns* const turns_;
  StageSet* const stages_;
  const BatchObserver on_batch_;
  OomSplitCounters oom_;
  BatchQueue<Item> queue_;  // last: its thread uses the members above
};

}  // namespace maskd::server
