#include "server/encoder_batcher.h"

#include "server/logging.h"

namespace maskd::server {

EncoderBatcher::EncoderBatcher(std::string name, Engine* engine, BatchQueueOptions options,
                               StageSet* stages, BatchObserver on_batch)
    : engine_(engine),
      stages_(stages),
      on_batch_(std::move(on_batch)),
      queue_(std::move(name), options,
             [this](std::vector<Item>& batch, Clock::time_point formed) { Run(batch, formed); }) {}

Status EncoderBatcher::Submit(Request request) {
  return queue_.Submit(Item{std::move(request), {}});
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
  const Clock::time_point t0 = Clock::now();
  StatusOr<std::vector<std::shared_ptr<const Embedding>>> result =
      Internal("Engine::Encode did not return");
  try {
    result = engine_->Encode(images);
  } catch (const std::exception& e) {
    result = Internal(std::string("Engine::Encode threw: ") + e.what());
  } catch (...) {
    result = Internal("Engine::Encode threw a non-standard exception");
  }
  const uint64_t compute_us = MicrosSince(t0);
  if (on_batch_) on_batch_(images.size());
  spdlog::debug("encoder batch of {} image(s): {} us, {}", images.size(), compute_us,
                result.ok() ? std::string("ok") : result.status().ToString());
  if (result.ok() && result->size() != batch.size()) {
    result = Internal("Engine::Encode returned " + std::to_string(result->size()) +
                      " embeddings for " + std::to_string(batch.size()) + " images");
  }
  for (size_t i = 0; i < batch.size(); ++i) {
    EncodeTiming timing{MicrosSince(batch[i].arrival, formed), compute_us, batch.size()};
    if (stages_) {
      (*stages_)[Stage::kEncoderQueue].Add(timing.queue_us);
      (*stages_)[Stage::kEncoderCompute].Add(timing.compute_us);
    }
    if (result.ok()) {
      batch[i].request.done((*result)[i], timing);
    } else {
      batch[i].request.done(result.status(), timing);
    }
  }
}

}  // namespace maskd::server
