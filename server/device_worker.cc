#include "server/device_worker.h"

namespace maskd::server {

DeviceWorker::DeviceWorker(int index, std::string label, std::unique_ptr<Engine> engine,
                           const WorkerOptions& options)
    : index_(index),
      label_(std::move(label)),
      engine_(std::move(engine)),
      is_cpu_(engine_->device().rfind("cpu", 0) == 0) {
  results_ = std::make_unique<ResultStore>(options.result_store_bytes);
  EmbeddingCache::Options cache_options;
  cache_options.device_capacity_bytes = options.cache_device_bytes;
  cache_options.host_capacity_bytes = is_cpu_ ? 0 : options.cache_host_bytes;
  Engine* engine_ptr = engine_.get();
  EmbeddingCache::MoveFn to_host, to_device;
  if (!is_cpu_) {
    to_host = [engine_ptr](const Embedding& e) { return engine_ptr->ToHost(e); };
    to_device = [engine_ptr](const Embedding& e) { return engine_ptr->ToDevice(e); };
  }
  ResultStore* results = results_.get();
  cache_ = std::make_unique<EmbeddingCache>(
      cache_options, std::move(to_host), std::move(to_device),
      [results](const std::string& image_id) { results->DropImage(image_id); });
  EncoderBatcher::BatchObserver on_encoder_batch;
  DecoderBatcher::BatchObserver on_decoder_batch;
  if (Metrics* m = options.metrics) {
    // Before the batchers exist: the observers are read without a lock (StageWindow::SetObserver).
    for (int i = 0; i < kNumStages; ++i) {
      const Stage s = static_cast<Stage>(i);
      stages_[s].SetObserver([m, s, label = label_](uint64_t us) { m->ObserveStage(label, s, us); });
    }
    on_encoder_batch = [m, label = label_](size_t n) { m->ObserveEncoderBatch(label, n); };
    on_decoder_batch = [m, label = label_](size_t n) { m->ObserveDecoderBatch(label, n); };
  }
  if (options.gpu_turns) turns_ = std::make_unique<GpuTurns>();
  encoder_ = std::make_unique<EncoderBatcher>("encoder[" + label_ + "]", engine_ptr, options.encoder, &stages_,
                                              std::move(on_encoder_batch), turns_.get());
  decoder_ = std::make_unique<DecoderBatcher>("decoder[" + label_ + "]", engine_ptr, options.decoder, &stages_,
                                              std::move(on_decoder_batch), turns_.get());
}

DeviceWorker::~DeviceWorker() { Stop(); }

void DeviceWorker::Stop() {
  if (encoder_) encoder_->Stop();
  if (decoder_) decoder_->Stop();
}

}  // namespace maskd::server
