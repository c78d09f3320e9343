// EngineImpl's image encoder runner: a batch of prepared images is split into passes of the
// prepared batch sizes (the cheapest cover by the cost table, model/batch_plan.h), each pass replays
// the CUDA graph captured for its size (one graph per size, sharing one memory pool) or runs eagerly.
#include "model/engine_impl.h"

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <string>

#include "model/batch_plan.h"
#include "model/image_encoder.h"
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

Status EngineImpl::ChooseGlobalAttention() {
  // PrepareFastPath has cleared every block's folded_batches.
  auto& blocks = sam_->image_encoder->block_list;
  auto first = std::find_if(blocks.begin(), blocks.end(), [](const EncoderBlock& b) { return b->window_size == 0; });
  if (first == blocks.end() || (*first)->attn->impl != AttentionImpl::kFused) return Status::Ok();
  RelPosAttentionImpl& attn = *(*first)->attn;
  torch::NoGradGuard no_grad;
  const int64_t n = attn.grid * attn.grid, c = attn.num_heads * attn.head_dim;
  std::vector<int64_t> folded;
  std::string table;
  // A benchmarking and testing knob: MASKD_GLOBAL_ATTENTION=fused|folded takes that way at every
  // size without timing (A/B runs in one binary; the GPU test of the folded way under the graphs).
  const char* env = std::getenv("MASKD_GLOBAL_ATTENTION");
  const std::string forced = env ? env : "";
  if (!forced.empty()) {
    if (forced != "fused" && forced != "folded")
      return InvalidArgument("MASKD_GLOBAL_ATTENTION=" + forced + ": expected fused or folded");
    if (forced == "folded")
      folded.assign(options_.encoder_batch_sizes.begin(), options_.encoder_batch_sizes.end());
    table = "MASKD_GLOBAL_ATTENTION=" + forced + " at every size, not timed";
  }
  for (int bs : forced.empty() ? options_.encoder_batch_sizes : std::vector<int>{}) {
    CallStream cs(device_);
    // q, k, v as the block makes them: strided views of qkv's [B, N, 3 C] output.
    const at::Tensor qkv = at::randn({bs, n, 3 * c}, at::TensorOptions().dtype(dtype_).device(device_));
    const at::Tensor parts = qkv.view({bs, n, 3, attn.num_heads, attn.head_dim}).permute({2, 0, 3, 1, 4});
    // Both ways back to back, twice each untimed (cuDNN builds its plan at the first call of a shape),
    // then the mean of `reps` calls queued together (the device's time, not the host's launches).
    const int reps = bs >= 8 ? 3 : 10;
    double ms[2] = {0, 0};
    const AttentionImpl ways[2] = {AttentionImpl::kFused, AttentionImpl::kSdpaFolded};
    for (int w = 0; w < 2; ++w) {
      try {
        for (int i = 0; i < 2; ++i) attn.Attend(parts[0], parts[1], parts[2], ways[w]).reshape({bs, n, c});
        cs.Sync();
        const auto t0 = std::chrono::steady_clock::now();
        for (int i = 0; i < reps; ++i) attn.Attend(parts[0], parts[1], parts[2], ways[w]).reshape({bs, n, c});
        cs.Sync();
        ms[w] = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count() / reps;
      } catch (const c10::Error& e) {
        // The fused kernel is what runs without the timing: its failure is the engine's error. The
        // folded way failing (no cuDNN attention for the shape, or no memory for its workspace)
        // only takes it out of the choice.
        if (w == 0) throw;
        ms[w] = 0;
        ReleaseCachedDeviceMemory();
        Log(LogLevel::kWarning, "global attention at encoder batch " + std::to_string(bs) +
                                    ": cuDNN's attention with the rel-pos terms folded failed, the fused kernel "
                                    "stays: " + e.what_without_backtrace());
      }
    }
    const bool use_folded = PreferFolded(ms[0], ms[1]);
    if (use_folded) folded.push_back(bs);
    char line[160];
    std::snprintf(line, sizeof(line), "%s%d: fused %.3f, folded %.3f ms -> %s", table.empty() ? "" : "; ", bs,
                  ms[0], ms[1], use_folded ? "folded" : "fused");
    table += line;
  }
  for (auto& b : blocks)
    if (b->window_size == 0) b->attn->folded_batches = folded;
  // The timing's inputs and workspaces go back to the device, not into the graphs' peak.
  ReleaseCachedDeviceMemory();
  Log(LogLevel::kInfo, "global attention per block by encoder batch size (" + std::to_string(attn.num_heads) +
                           " heads of " + std::to_string(attn.head_dim) + ", " + std::to_string(n) +
                           " tokens): " + table);
  if (!folded.empty()) {
    std::string sizes;
    for (int64_t b : folded) sizes += (sizes.empty() ? "" : ",") + std::to_string(b);
    optimisations_.push_back("global-attention-folded@" + sizes);
  }
  return Status::Ok();
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
