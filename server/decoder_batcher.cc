#include "server/decoder_batcher.h"

#include "server/logging.h"

namespace maskd::server {

DecoderBatcher::DecoderBatcher(std::string name, Engine* engine, BatchQueueOptions options,
                               StageSet* stages, BatchObserver on_batch, GpuTurns* turns)
    : engine_(engine),
      turns_(turns),
      stages_(stages),
      on_batch_(std::move(on_batch)),
      queue_(std::move(name), options,
             [this](std::vector<Item>& batch, Clock::time_point formed) { Run(batch, formed); }) {}

Status DecoderBatcher::Submit(Request request) {
  if (request.prompts.empty()) return Internal("decoder request without prompts");
  return queue_.Submit(Item{std::move(request), {}});
}

QueueCounters DecoderBatcher::counters() const {
  QueueCounters c = queue_.counters();
  c.oom_splits = oom_.splits.load(std::memory_order_relaxed);
  c.oom_failures = oom_.failures.load(std::memory_order_relaxed);
  return c;
}

StatusOr<std::vector<StatusOr<DecodedPrompt>>> DecoderBatcher::Decode(const std::vector<DecodeItem>& items) {
  StatusOr<std::vector<StatusOr<DecodedPrompt>>> result = Internal("Engine::DecodeEach did not return");
  try {
    result = engine_->DecodeEach(items);
  } catch (const std::exception& e) {
    result = Internal(std::string("Engine::DecodeEach threw: ") + e.what());
  } catch (...) {
    result = Internal("Engine::DecodeEach threw a non-standard exception");
  }
  if (on_batch_) on_batch_(items.size());
  if (result.ok() && result->size() != items.size()) {
    return Internal("Engine::DecodeEach returned " + std::to_string(result->size()) + " results for " +
                    std::to_string(items.size()) + " prompts");
  }
  return result;
}

void DecoderBatcher::Run(std::vector<Item>& batch, Clock::time_point formed) {
  std::vector<DecodeItem> all;
  std::vector<std::string> ids;
  for (const auto& item : batch) {
    all.insert(all.end(), item.request.prompts.begin(), item.request.prompts.end());
    // A request split into several chunks (more prompts than a batch) is listed once: its
    // chunks are submitted one after another, so they sit next to each other here.
    if (ids.empty() || ids.back() != item.request.request_id) ids.push_back(item.request.request_id);
  }
  // Whatever the engine logs during this pass belongs to these requests.
  ScopedRequestIds scope(std::move(ids));
  std::vector<StatusOr<DecodedPrompt>> results(all.size(),
                                               StatusOr<DecodedPrompt>(Internal("prompt was not decoded")));
  Clock::time_point t0;
  uint64_t compute_us = 0;
  {
    // With --gpu-turns the wait for the encoder's batch in progress counts as queueing.
    GpuTurns::Turn turn(turns_);
    t0 = Clock::now();
    RunSplittingOnOom(all, 0, all.size(), results, [this](const auto& part) { return Decode(part); }, oom_,
                      "decoder", "prompts");
    compute_us = MicrosSince(t0);
  }
  size_t failed = 0;
  for (const auto& r : results) failed += r.ok() ? 0 : 1;
  spdlog::debug("decoder batch of {} prompt(s) from {} request(s): {} us, {}", all.size(),
                batch.size(), compute_us, failed == 0 ? std::string("ok") : std::to_string(failed) + " failed");
  // The engine answers per prompt, so one bad prompt (or one that runs out of memory alone) fails
  // its own request only.
  size_t offset = 0;
  for (auto& item : batch) {
    const size_t n = item.request.prompts.size();
    const DecodeTiming timing{MicrosSince(item.arrival, turns_ ? t0 : formed), compute_us, all.size()};
    StatusOr<std::vector<DecodedPrompt>> mine = Internal("unset");
    std::vector<DecodedPrompt> prompts;
    prompts.reserve(n);
    Status first_error;
    for (size_t k = offset; k < offset + n; ++k) {
      StatusOr<DecodedPrompt>& r = results[k];
      if (!r.ok()) {
        first_error = r.status();
        break;
      }
      prompts.push_back(std::move(*r));
    }
    if (first_error.ok()) {
      mine = std::move(prompts);
    } else {
      mine = first_error;
    }
    offset += n;
    if (stages_) {
      (*stages_)[Stage::kDecoderQueue].Add(timing.queue_us);
      (*stages_)[Stage::kDecoderCompute].Add(timing.compute_us);
    }
    item.request.done(std::move(mine), timing);
  }
}

}  // namespace maskd::server
