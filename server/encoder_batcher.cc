#include "server/encoder_batcher.h"

#include "server/logging.h"

namespace maskd::server {

EncoderBatcher::EncoderBatcher(std::string name, Engine* engine, BatchQueueOptions options,
                               StageSet* stages, BatchObserver on_batch, GpuTurns* turns)
    : engine_(engine),
      turns_(turns),
      stages_(stages),
      on_batch_(std::move(on_batch)),
      queue_(std::move(name), options,
             [this](std::vector<Item>& batch, Clock::time_point formed) { Run(batch, formed); }) {}

Status EncoderBatcher::Submit(Request request) {
  return queue_.Submit(Item{std::move(request), {}});
}

QueueCounters EncoderBatcher::counters() const {
  QueueCounters c = queue_.counters();
  c.oom_splits = oom_.splits.load(std::memory_order_relaxed);
  c.oom_failures = oom_.failures.load(std::memory_order_relaxed);
  return c;
}

StatusOr<std::vector<std::shared_ptr<const Embedding>>> EncoderBatcher::Encode(
    const std::vector<PreparedImage>& images) {
  StatusOr<std::vector<std::shared_ptr<const Embedding>>> result = Internal("Engine::Encode did not return");
  try {
    result = engine_->Encode(images);
  } catch (const std::exception& e) {
    result = Internal(std::string("Engine::Encode threw: ") + e.what());
  } catch (...) {
    result = Internal("Engine::Encode threw a non-standard exception");
  }
  if (on_batch_) on_batch_(images.size());
  if (result.ok() && result->size() != images.size()) {
    result = Internal("Engine::Encode returned " + std::to_string(result->size()) +
                      " embeddings for " + std::to_string(images.size()) + " images");
  }
  return result;
}

void EncoderBatcher::Run(std::vector<Item>& batch, Clock::time_point formed) {
  std::vector<PreparedImage> images;
  images.reserve(batch.size());
  std::vector<std::string> ids;
  for (const auto& item : batch) {
    images.push_back(item.request.image);
    ids.push_back(item.request.request_id);
  }
  // Whatever the engine logs during this pass belongs to these requests.
  ScopedRequestIds scope(std::move(ids));
  std::vector<Result> results(batch.size(), Result(Internal("image was not encoded")));
  Clock::time_point t0;
  uint64_t compute_us = 0;
  {
    // With --gpu-turns the wait for the decoder's batch in progress counts as queueing.
    GpuTurns::Turn turn(turns_);
    t0 = Clock::now();
    RunSplittingOnOom(images, 0, images.size(), results, [this](const auto& part) { return Encode(part); }, oom_,
                      "encoder", "images");
    compute_us = MicrosSince(t0);
  }
  size_t failed = 0;
  for (const Result& r : results) failed += r.ok() ? 0 : 1;
  spdlog::debug("encoder batch of {} image(s): {} us, {}", images.size(), compute_us,
                failed == 0 ? std::string("ok") : std::to_string(failed) + " failed");
  for (size_t i = 0; i < batch.size(); ++i) {
    EncodeTiming timing{MicrosSince(batch[i].arrival, turns_ ? t0 : formed), compute_us, batch.size()};
    if (stages_) {
      (*stages_)[Stage::kEncoderQueue].Add(timing.queue_us);
      (*stages_)[Stage::kEncoderCompute].Add(timing.compute_us);
    }
    batch[i].request.done(std::move(results[i]), timing);
  }
}

}  // namespace maskd::server
