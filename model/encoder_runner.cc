// EngineImpl's image encoder runner: a batch of prepared images is split into passes of the
// prepared batch sizes (the cheapest cover by the cost table, model/batch_plan.h), each pass replays
// the CUDA graph captured for its size (one graph per size, sharing one memory pool) or runs eagerly.
#include "model/engine_impl.h"

#include <algorithm>
#include <chrono>

#include "model/batch_plan.h"
#include "model/memory_scope.h"

namespace maskd {

Status EngineImpl::CaptureEncoderGraphs() {
#ifdef MASKD_WITH_CUDA
  const auto pool = at::cuda::graph_pool_handle();
  for (int bs : options_.encoder_batch_sizes) {
    CallStream cs(device_);
    EncoderGraph g;
    g.input = at::randn({bs, 3, config_.img_size, config_.img_size},
                        at::TensorOptions().dtype(dtype_).device(device_));
    // Warm up outside the capture: cuBLAS/cuDNN handles and workspaces, kernel selection and cuDNN's
    // attention plans are made by the first pass for a shape, so one pass is enough (it was two:
    // ~0.8 s of vit_h's start-up on an H100, run 16).
    sam_->image_encoder->forward(g.input);
    cs.Sync();
    g.graph = std::make_unique<at::cuda::CUDAGraph>();
    // An error here (out of memory for this batch size, typically) ends the capture first; Init
    // then fails with it and names the size.
    try {
      g.output = CaptureGraph(*g.graph, pool, [&] { return sam_->image_encoder->forward(g.input); });
    } catch (const c10::Error& e) {
      if (!IsOutOfMemory(e)) throw;
      ReleaseCachedDeviceMemory();
      return ResourceExhausted("out of device memory while capturing the encoder graph for batch size " +
                               std::to_string(bs) + " (lower --encoder-max-batch or raise the memory "
                               "limit): " + e.what_without_backtrace());
    }
    // Upload now, so that the first replay (the cost table's timed one) launches without it.
    C10_CUDA_CHECK(cudaGraphUpload(g.graph->raw_cuda_graph_exec(), c10::cuda::getCurrentCUDAStream().stream()));
    cs.Sync();
    graphs_.emplace(bs, std::move(g));
  }
  return Status::Ok();
#else
  return InvalidArgument("CUDA graphs need a CUDA build");
#endif
}


at::Tensor EngineImpl::RunEncoder(const at::Tensor& batch, int64_t pass_size) {
#ifdef MASKD_WITH_CUDA
  {
    std::lock_guard<std::mutex> lock(graph_mu_);
    auto it = graphs_.find(static_cast<int>(pass_size));
    if (it != graphs_.end()) {
      // Rows past the batch are zeros (the graph's static shape); their outputs are not returned.
      const int64_t n = batch.size(0);
      it->second.input.slice(0, 0, n).copy_(batch);
      if (n < pass_size) it->second.input.slice(0, n).zero_();
      it->second.graph->replay();
      return it->second.output.slice(0, 0, n).clone();
    }
  }
#endif
  // Eager passes run the images there are: padding them to the planned size cost the compute of
  // empty rows and, under a memory cap, made a batch of 2 need the memory of 16 (run 16's
  // ModelOomGpu failure).
  return sam_->image_encoder->forward(batch);
}


StatusOr<std::vector<std::shared_ptr<const Embedding>>> EngineImpl::Encode(
    const std::vector<PreparedImage>& images) {
  if (images.empty()) return std::vector<std::shared_ptr<const Embedding>>{};
  return Guarded("running the image encoder on " + Count(images.size(), "image", "images"),
                 [&]() -> StatusOr<std::vector<std::shared_ptr<const Embedding>>> {
    MemoryScope scope("Encode");
    torch::NoGradGuard no_grad;
    CallStream cs(device_);
    std::vector<std::shared_ptr<const Embedding>> out;
    // The cheapest cover of the batch by the prepared sizes, largest passes first.
    const std::vector<int> plan = PlanEncoderBatches(static_cast<int>(images.size()), encoder_costs_);
    size_t start = 0;
    for (const int bs : plan) {
      const size_t left = images.size() - start;
      const size_t n = std::min<size_t>(left, bs);
      std::vector<at::Tensor> inputs;
      for (size_t i = 0; i < n; ++i) inputs.push_back(PayloadOf(images[start + i]).input);
      const at::Tensor emb = RunEncoder(at::stack(inputs), bs);
      for (size_t i = 0; i < n; ++i) {
        out.push_back(WrapEmbedding(images[start + i].geometry(), emb[static_cast<int64_t>(i)].clone()));
      }
      start += n;
      if (start == images.size()) break;
    }
    cs.Sync();
    return out;
  });
}

std::vector<EncoderBatchCost> EngineImpl::encoder_batch_costs() const { return encoder_costs_; }

Status EngineImpl::ResetEncoderCosts() {
  const auto& sizes = options_.encoder_batch_sizes;
  const auto& seconds = options_.encoder_batch_seconds;
  if (!seconds.empty() && seconds.size() != sizes.size())
    return InvalidArgument("encoder_batch_seconds has " + std::to_string(seconds.size()) +
                           " entries for " + std::to_string(sizes.size()) +
                           " encoder_batch_sizes (expected one per size)");
  encoder_costs_.clear();
  for (size_t i = 0; i < sizes.size(); ++i)
    encoder_costs_.push_back({sizes[i], seconds.empty() ? 0.0 : seconds[i]});
  return Status::Ok();
}

Status EngineImpl::MeasureEncoderCosts() {
  // Only where the choice matters and the numbers are stable: replays of captured graphs. Eager
  // CPU passes are neither padded nor planned beyond "fewest passes".
  if (!options_.encoder_batch_seconds.empty() || !device_.is_cuda() || !options_.fast.cuda_graphs)
    return Status::Ok();
  torch::NoGradGuard no_grad;
  // Ascending sizes (encoder_batch_sizes is sorted), stopping once the cost per image is flat; the
  // larger sizes are then extrapolated (model/batch_plan.h).
  size_t measured = 0;
  while (measured < encoder_costs_.size()) {
    EncoderBatchCost& c = encoder_costs_[measured];
    CallStream cs(device_);
    const at::Tensor batch = at::zeros({c.batch_size, 3, config_.img_size, config_.img_size},
                                       at::TensorOptions().dtype(dtype_).device(device_));
    // One timed replay: the graph was uploaded at capture and a replay's duration barely varies.
    // It was the median of three, then the second of two: each extra replay of every size cost
    // ~0.8 s of vit_h's start-up (a bs32 replay is 0.41 s on an H100, run 16).
    const auto t0 = std::chrono::steady_clock::now();
    RunEncoder(batch, c.batch_size);
    cs.Sync();
    c.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    c.extrapolated = false;
    Log(LogLevel::kInfo, "encoder batch " + std::to_string(c.batch_size) + ": " +
                             std::to_string(c.seconds * 1e3) + " ms per pass");
    ++measured;
    if (measured >= 2 && PerImageCostFlat(encoder_costs_[measured - 2], c)) break;
  }
  if (measured < encoder_costs_.size()) {
    ExtrapolateFlatEncoderCosts(encoder_costs_, measured);
    Log(LogLevel::kInfo, "encoder batch sizes from " + std::to_string(encoder_costs_[measured].batch_size) +
                             " up: costs extrapolated from batch " +
                             std::to_string(encoder_costs_[measured - 1].batch_size) +
                             "'s per-image cost (flat from batch " +
                             std::to_string(encoder_costs_[measured - 2].batch_size) + ")");
  }
  return Status::Ok();
}

}  // namespace maskd
