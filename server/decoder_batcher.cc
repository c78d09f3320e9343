#include "server/decoder_batcher.h"

namespace maskd::server {

DecoderBatcher::DecoderBatcher(std::string name, Engine* engine, BatchQueueOptions options,
                               StageSet* stages)
    : engine_(engine),
      stages_(stages),
      queue_(std::move(name), options,
             [this](std::vector<Item>& batch, Clock::time_point formed) { Run(batch, formed); }) {}

Status DecoderBatcher::Submit(Request request) {
  if (request.prompts.empty()) return Internal("decoder request without prompts");
  return queue_.Submit(Item{std::move(request), {}});
}

StatusOr<std::vector<DecodedPrompt>> DecoderBatcher::Decode(const std::vector<DecodeItem>& items) {
  StatusOr<std::vector<DecodedPrompt>> result = Internal("Engine::Decode did not return");
  try {
    result = engine_->Decode(items);
  } catch (const std::exception& e) {
    return Internal(std::string("Engine::Decode threw: ") + e.what());
  } catch (...) {
    return Internal("Engine::Decode threw a non-standard exception");
  }
  if (result.ok() && result->size() != items.size()) {
    return Internal("Engine::Decode returned " + std::to_string(result->size()) + " results for " +
                    std::to_string(items.size()) + " prompts");
  }
  return result;
}

void DecoderBatcher::Run(std::vector<Item>& batch, Clock::time_point formed) {
  std::vector<DecodeItem> all;
  for (const auto& item : batch) {
    all.insert(all.end(), item.request.prompts.begin(), item.request.prompts.end());
  }
  const Clock::time_point t0 = Clock::now();
  StatusOr<std::vector<DecodedPrompt>> result = Decode(all);
  uint64_t compute_us = MicrosSince(t0);
  // One bad prompt must not fail the other requests of its batch: on INVALID_ARGUMENT, decode each
  // request alone so that only the offending one gets the error.
  const bool isolate = !result.ok() && result.status().code() == StatusCode::kInvalidArgument &&
                       batch.size() > 1;
  size_t offset = 0;
  for (auto& item : batch) {
    const size_t n = item.request.prompts.size();
    DecodeTiming timing{MicrosSince(item.arrival, formed), compute_us, all.size()};
    StatusOr<std::vector<DecodedPrompt>> mine = Internal("unset");
    if (isolate) {
      const Clock::time_point t1 = Clock::now();
      mine = Decode(item.request.prompts);
      timing.compute_us = MicrosSince(t1);
      timing.batch_prompts = n;
    } else if (result.ok()) {
      mine = std::vector<DecodedPrompt>(result->begin() + offset, result->begin() + offset + n);
    } else {
      mine = result.status();
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
