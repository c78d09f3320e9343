// EngineImpl: the real Engine, SAM in LibTorch with the fast path on CUDA. One class (its state is
// shared: the model, the device, the graph caches), its methods in one file per job:
//
//   engine.cc             lifecycle: construction, Init, Reconfigure, warm-up, identity, cache-tier
//                         moves (ToHost/ToDevice), mask-logit uploads, memory stats
//   fast_path.cc          the fast-path policy: which attention, fused encoder ops and the GELU
//                         epilogue, precision paths, fp8 linears, the shared-image decoder, graphs
//   image_preparation.cc  Prepare/PrepareResized: longest-side resize, normalisation, padding
//   encoder_runner.cc     Encode: batch planning by measured cost, the encoder graph cache per batch size
//   decoder_runner.cc     DecodeEach: the jagged decode, token-count buckets, prompts grouped by
//                         image for the shared-image decoder, the decoder graph cache per prompt
//                         bucket, pinned non-blocking uploads, a status per item
//   mask_postprocess.cc   Postprocess: upscale, crop, threshold, stats, RLE/bitmask
//   engine_create.cc      Engine::Create: device parsing, checkpoint loading, the weight hash
//
// Internal to libmaskd_model (sees torch); nothing outside model/ includes it.
#pragma once

#include <ATen/ATen.h>
#include <torch/types.h>

#include <cstdio>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "kernels/kernels.h"
#include "model/api/engine.h"
#include "model/batch_plan.h"
#include "model/engine_handles.h"
#include "model/fast_decoder.h"
#include "model/sam.h"
#include "model/sam_config.h"

#ifdef MASKD_WITH_CUDA
#include <ATen/core/CachingHostAllocator.h>
#include <ATen/cuda/CUDAGraph.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <cuda_runtime_api.h>
#endif

namespace maskd {

inline void DefaultLog(LogLevel level, std::string_view msg) {
  static const char* kNames[] = {"debug", "info", "warning", "error"};
  std::fprintf(stderr, "[maskd engine] [%s] %.*s\n", kNames[static_cast<int>(level)],
               static_cast<int>(msg.size()), msg.data());
}

inline at::ScalarType DtypeOf(Precision p) {
  switch (p) {
    case Precision::kFloat32: return at::kFloat;
    case Precision::kBFloat16: return at::kBFloat16;
    case Precision::kFloat16: return at::kHalf;
  }
  return at::kFloat;
}

// True when `e` says that device (or pinned host) memory ran out: the caching allocator's
// c10::OutOfMemoryError, a CUDA call that returned cudaErrorMemoryAllocation (AcceleratorError), or a
// library whose own allocation failed (cuBLAS/cuDNN/cuSPARSE *_ALLOC_FAILED), which LibTorch reports
// as plain c10::Errors that only the message tells apart.
inline bool IsOutOfMemory(const c10::Error& e) {
  if (dynamic_cast<const c10::OutOfMemoryError*>(&e) != nullptr) return true;
#ifdef MASKD_WITH_CUDA
  if (const auto* a = dynamic_cast<const c10::AcceleratorError*>(&e);
      a != nullptr && a->get_error_code() == static_cast<int32_t>(cudaErrorMemoryAllocation))
    return true;
#endif
  const std::string m = e.what_without_backtrace();
  return m.find("out of memory") != std::string::npos || m.find("_ALLOC_FAILED") != std::string::npos;
}

// After an out-of-memory error: hands the caching allocator's free blocks back to the driver, so
// that a retry (the batchers split the batch) and other users of the device start from what is
// really free. Blocks in use and CUDA graph pools are untouched.
// Held while a CUDA graph is captured and while cached blocks are released: emptyCache waits on the
// allocator's pending events, which must not happen against a stream in the middle of a capture.
inline std::mutex& CaptureMutex() {
  static std::mutex mu;
  return mu;
}

inline void ReleaseCachedDeviceMemory() {
#ifdef MASKD_WITH_CUDA
  try {
    std::lock_guard<std::mutex> lock(CaptureMutex());
    if (c10::cuda::device_count() > 0) c10::cuda::CUDACachingAllocator::emptyCache();
  } catch (const std::exception&) {
    // Best effort: the error being reported matters more than a failed clean-up.
  }
#endif
}

// Runs `fn`, turning LibTorch/CUDA exceptions into a Status that names the operation (`what`: what
// was being done, with the batch size). Running out of device memory is RESOURCE_EXHAUSTED, with the
// allocator's own message (what it tried to allocate, what is reserved, the limit), after the cached
// blocks went back to the driver: the engine stays usable and the caller may retry a smaller batch.
// Host memory exhaustion (std::bad_alloc) is RESOURCE_EXHAUSTED too; anything else is INTERNAL.
template <typename Fn>
auto Guarded(const std::string& what, Fn&& fn) -> decltype(fn()) {
  try {
    return fn();
  } catch (const c10::Error& e) {
    if (IsOutOfMemory(e)) {
      ReleaseCachedDeviceMemory();
      return ResourceExhausted("out of device memory while " + what + ": " + e.what_without_backtrace());
    }
    return Internal(what + ": " + e.what_without_backtrace());
  } catch (const std::bad_alloc& e) {
    return ResourceExhausted("out of host memory while " + what + ": " + e.what());
  } catch (const std::exception& e) {
    return Internal(what + ": " + e.what());
  }
}

// "16 images", "1 prompt": batch sizes in error messages.
inline std::string Count(size_t n, const char* one, const char* many) {
  return std::to_string(n) + " " + (n == 1 ? one : many);
}

inline std::string Hex(uint64_t hi, uint64_t lo) {
  char buf[33];
  std::snprintf(buf, sizeof buf, "%016llx%016llx", static_cast<unsigned long long>(hi),
                static_cast<unsigned long long>(lo));
  return buf;
}

#ifdef MASKD_WITH_CUDA
// Ends a capture that `fn` broke off with an exception, so that neither the thread's stream (it
// would stay in capture mode and fail every later call on it) nor the allocators (they would keep
// routing the stream's allocations to `pool`, and refuse the next capture into it) are left
// capturing. The partial graph is discarded with `graph`, which the caller drops.
inline void AbandonCapture(at::cuda::CUDAGraph& graph, c10::DeviceIndex device, c10::MempoolId_t pool) {
  try {
    graph.capture_end();  // the usual case: the capture is still valid, only incomplete
    return;
  } catch (const std::exception&) {
  }
  // capture_end threw: the capture was invalidated (CUDA ends it anyway) or instantiation failed.
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream(device).stream();
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  if (cudaStreamIsCapturing(stream, &status) == cudaSuccess && status != cudaStreamCaptureStatusNone) {
    cudaGraph_t partial = nullptr;
    if (cudaStreamEndCapture(stream, &partial) == cudaSuccess && partial != nullptr) cudaGraphDestroy(partial);
  }
  (void)cudaGetLastError();
  // "not recording to this pool" when capture_end got that far: nothing left to undo then.
  try {
    c10::cuda::CUDACachingAllocator::endAllocateToPool(device, pool);
  } catch (const std::exception&) {
  }
  try {
    at::getHostAllocator(at::kCUDA)->end_allocate_to_pool(pool);
  } catch (const std::exception&) {
  }
}

// Captures fn() into `graph` on the current stream (thread-local mode, allocations from `pool`) and
// returns what fn returned. An exception from fn (out of memory mid-capture, typically) ends the
// capture cleanly (AbandonCapture) before it propagates, so that the caller caches no broken graph
// and the stream works for the next call.
template <typename Fn>
auto CaptureGraph(at::cuda::CUDAGraph& graph, c10::MempoolId_t pool, Fn&& fn) -> decltype(fn()) {
  std::lock_guard<std::mutex> lock(CaptureMutex());
  const c10::DeviceIndex device = c10::cuda::current_device();
  graph.capture_begin(pool, cudaStreamCaptureModeThreadLocal);
  std::optional<decltype(fn())> out;
  try {
    out.emplace(fn());
  } catch (...) {
    AbandonCapture(graph, device, pool);
    throw;
  }
  graph.capture_end();
  return std::move(*out);
}
#endif

// Per-thread stream (CUDA): each Engine call runs on its calling thread's pool stream and
// synchronises it before returning, which is what makes every method synchronous and safe to call
// concurrently from several threads. One stream per thread, not one per call: the caching allocator
// keeps freed blocks per stream, so a fresh pool stream per call spread every call's temporaries
// over all 32 pool streams' caches (maskbench's decoder latency loop ended with 129 GiB reserved
// but unusable, and an out-of-memory error).
class CallStream {
 public:
  // high_priority: the stream of the latency-bound work (mask decoding, post-processing, generation
  // filters). The encoder's long batches run on normal-priority streams; with a high-priority stream
  // the GPU's block scheduler starts a waiting decoder kernel as soon as any SM frees up instead of
  // queueing it behind the rest of an encoder GEMM's blocks (issue #13: a click under batch load).
  explicit CallStream(const at::Device& device, bool high_priority = false) {
#ifdef MASKD_WITH_CUDA
    if (device.is_cuda()) {
      thread_local std::map<std::pair<int, bool>, c10::cuda::CUDAStream> per_device;
      const int index = device.has_index() ? device.index() : c10::cuda::current_device();
      auto it = per_device.find({index, high_priority});
      if (it == per_device.end())
        it = per_device
                 .emplace(std::make_pair(index, high_priority),
                          c10::cuda::getStreamFromPool(high_priority, static_cast<c10::DeviceIndex>(index)))
                 .first;
      stream_.emplace(it->second);
      guard_.emplace(*stream_);
    }
#else
    (void)high_priority;
#endif
  }
  void Sync() {
#ifdef MASKD_WITH_CUDA
    if (stream_) stream_->synchronize();
#endif
  }
  ~CallStream() = default;

 private:
#ifdef MASKD_WITH_CUDA
  std::optional<c10::cuda::CUDAStream> stream_;
  std::optional<c10::cuda::CUDAStreamGuard> guard_;
#endif
};

class EngineImpl final : public Engine {
 public:
  // The identity (description().identity) is set by SetWeightsDigest, after Init.
  EngineImpl(EngineOptions options, SamConfig config, Sam model, at::Device device, uint64_t params)
      : options_(std::move(options)), config_(std::move(config)), sam_(std::move(model)),
        device_(device), dtype_(DtypeOf(options_.precision)) {
    if (!options_.log) options_.log = DefaultLog;
    desc_.arch = config_.arch;
    desc_.checkpoint = !options_.checkpoint.empty()         ? options_.checkpoint
                       : options_.random_arch == "tiny" ? std::string("builtin-demo")
                                                        : "builtin-random-" + options_.random_arch;
    desc_.demo = options_.checkpoint.empty();
    desc_.embed_dim = config_.embed_dim;
    desc_.depth = config_.depth;
    desc_.num_heads = config_.num_heads;
    desc_.patch_size = config_.patch_size;
    desc_.window_size = config_.window_size;
    desc_.image_size = config_.img_size;
    desc_.mlp_dim = config_.mlp_dim;
    desc_.out_chans = config_.out_chans;
    desc_.global_attn_indexes = config_.global_attn_indexes;
    desc_.parameter_count = params;
  }

  Status Init();
  // The weights' digest (engine_create.cc's WeightsDigest), and with it the identity: after Init,
  // which sets the numerics (the GELU epilogue) that the identity also names.
  void SetWeightsDigest(std::string digest) {
    weights_digest_ = std::move(digest);
    desc_.identity = Identity();
  }

  const ModelDescription& description() const override { return desc_; }
  const EngineOptions& options() const override { return options_; }
  std::string device() const override { return device_.str(); }
  std::string device_name() const override;
  std::vector<std::string> optimisations() const override { return optimisations_; }
  int max_encoder_batch() const override { return options_.encoder_batch_sizes.back(); }
  Status Reconfigure(const FastPathOptions& fast) override;

  StatusOr<PreparedImage> Prepare(const ImageRGB8& image) override;
  StatusOr<PreparedImage> PrepareResized(const ImageRGB8& resized, int ow, int oh) override;
  StatusOr<std::vector<std::shared_ptr<const Embedding>>> Encode(
      const std::vector<PreparedImage>& images) override;
  StatusOr<std::vector<StatusOr<DecodedPrompt>>> DecodeEach(const std::vector<DecodeItem>& items) override;
  std::vector<EncoderBatchCost> encoder_batch_costs() const override;
  StatusOr<std::vector<std::vector<MaskData>>> Postprocess(
      const std::vector<PostprocessItem>& items) override;
  StatusOr<std::vector<MaskCandidate>> FilterMasks(const MaskFilterRequest& request) override;
  StatusOr<std::vector<int>> BoxNms(const std::vector<std::array<float, 4>>& boxes,
                                    const std::vector<float>& scores, float iou_threshold) override;
  StatusOr<std::shared_ptr<const Embedding>> ToHost(const Embedding& e) override;
  StatusOr<std::shared_ptr<const Embedding>> ToDevice(const Embedding& e) override;
  StatusOr<std::shared_ptr<const MaskLogits>> MakeMaskLogits(const float* v, int h, int w) override;
  StatusOr<ExportedEmbedding> ExportEmbedding(const Embedding& e, Precision dtype) override;
  DeviceMemoryStats memory() const override;
  void ResetPeakMemory() override;

 private:
  void Log(LogLevel l, const std::string& m) const { options_.log(l, m); }
  at::Tensor Normalize(const at::Tensor& hwc_u8, int h, int w) const;
  // A host tensor on the engine's device without a host synchronisation: a plain .to(cuda) of
  // pageable memory waits for the stream, which in the decoder stalled the launches of every pass.
  at::Tensor Upload(const at::Tensor& host) const;
  // One encoder pass of `batch` (its rows <= pass_size): the graph captured for pass_size when
  // there is one, else eagerly at the batch's own size.
  at::Tensor RunEncoder(const at::Tensor& batch, int64_t pass_size);
  // SAM's postprocess_masks + threshold + stats (+ RLE / bitmask) of low-res logits [M, 256, 256]:
  // the fused kernel with gpu_postprocess (it reads bf16/fp16 itself; with want_rle and
  // want_rle_string also the COCO strings when gpu_rle_string is on), else its LibTorch reference
  // in float32 on the engine's device. Without rle_counts_with_string, the counts stay on the device
  // (rle_counts undefined) whenever the strings are made.
  kernels::MaskPostprocessOutput PostprocessLogits(const at::Tensor& logits, const at::Tensor& geometry,
                                                   bool want_rle, bool want_bitmask, bool want_rle_string,
                                                   bool rle_counts_with_string = true) const;
  MaskDecoderImpl::Output RunDecoder(const at::Tensor& src, const at::Tensor& sparse);
  // The shared-image decoder on group keys [G, HW, D] and, when G > 1, each prompt's group (graph
  // replay for both).
  MaskDecoderImpl::Output RunSharedDecoder(const at::Tensor& keys, const at::Tensor& group_of,
                                           const at::Tensor& sparse);
  // run(image_side, group_of, sparse): one decoder pass on the graph's static inputs.
  using DecoderPassFn =
      std::function<MaskDecoderImpl::Output(const at::Tensor&, const at::Tensor&, const at::Tensor&)>;
  // Replays the decoder graph for `sparse`'s prompt count (padded to a bucket), token count and, with
  // group_of defined (prompts of several images in the shared-image decoder), image count (padded to
  // a bucket), capturing it on first use; image_side and group_of are copied into the graph's static
  // inputs (image_side padded to the prompt bucket when per_prompt). nullopt: no graph for this
  // shape (run eagerly).
  std::optional<MaskDecoderImpl::Output> ReplayDecoderGraph(const at::Tensor& image_side, bool per_prompt,
                                                            const at::Tensor& sparse, const at::Tensor& group_of,
                                                            const DecoderPassFn& run);
  // The shared-image decoder's whole pass for prompts without mask inputs in one graph: the raw
  // embeddings (one per image), the prompts' points as packed host values (for each prompt, T
  // x/y pairs in the input frame, T labels and its image's row, all as float) go in, and the
  // graph adds the no-mask embedding, lays out the keys, encodes the prompts and decodes, so a
  // click pays two copies in and a replay instead of ~20 eager launches. nullopt: no graph for
  // this shape.
  std::optional<MaskDecoderImpl::Output> ReplaySharedPromptGraph(const std::vector<at::Tensor>& images,
                                                                 const std::vector<float>& packed, int64_t G,
                                                                 int64_t T);
  Status PrepareFastPath();
  Status CaptureEncoderGraphs();
  // FastPathOptions::attention_timing: times the global blocks' attention at each encoder batch
  // size, fused against folded, and sets each global block's folded_batches.
  Status ChooseGlobalAttention();
  std::string Identity() const;
  Status Warmup();
  // encoder_costs_ from EngineOptions::encoder_batch_seconds, else unknown (0) per size.
  Status ResetEncoderCosts();
  // Times each prepared batch size (median of a few passes) when costs are not given (CUDA graphs).
  Status MeasureEncoderCosts();
  // Why `item` cannot be decoded, or OK (index names it in the message).
  Status CheckDecodeItem(const DecodeItem& item, size_t index) const;

  EngineOptions options_;
  SamConfig config_;
  Sam sam_;
  at::Device device_;
  at::ScalarType dtype_;
  std::string weights_digest_;
  ModelDescription desc_;
  std::vector<std::string> optimisations_;
  at::Tensor dense_pe_;     // [1, D, g, g] engine dtype
  at::Tensor no_mask_;      // [1, D, 1, 1] engine dtype
  at::Tensor pixel_mean_, pixel_std_;  // [3, 1, 1] float32, engine device
  bool gpu_pre_ = false, gpu_post_ = false, gpu_rle_string_ = false;
  // FastPathOptions::decoder_priority on CUDA: decoder-side calls run on high-priority streams.
  bool decoder_priority_ = false;
  // Set by PrepareFastPath with FastPathOptions::shared_image_decoder (it holds tables derived from
  // the decoder's weights on their final device and dtype).
  std::unique_ptr<SharedImageDecoder> shared_dec_;
  // Encoder batch sizes with their cost per pass (encoder_runner.cc plans with it). Written by
  // Init/Reconfigure/Warmup only, which overlap no other call; read by Encode.
  std::vector<EncoderBatchCost> encoder_costs_;

#ifdef MASKD_WITH_CUDA
  // Encoder CUDA graphs by batch size, sharing one memory pool. Replays reuse static buffers, so
  // they are serialised: graph_mu_ guards graphs_ and the static tensors while a graph runs.
  struct EncoderGraph {
    std::unique_ptr<at::cuda::CUDAGraph> graph;
    at::Tensor input, output;
  };
  std::mutex graph_mu_;
  std::map<int, EncoderGraph> graphs_;
  // Decoder graphs by (padded prompt count, token count, padded image count or 0 for one image / the
  // per-prompt decoder), captured on first use into a pool of
  // their own (the encoder's replays run concurrently on another thread). decoder_graph_mu_ guards
  // them and their static buffers from copy-in to clone-out.
  struct DecoderGraph {
    std::unique_ptr<at::cuda::CUDAGraph> graph;
    // src: the per-prompt image side [bucket, D, h, w], or with the shared-image decoder the
    // images' group keys [image bucket or 1, HW, D] (a configuration uses one kind: Reconfigure
    // clears the graphs); group_of [bucket] (int64) with several images: each prompt's image row.
    at::Tensor src, sparse, group_of, masks, iou;
    // ReplaySharedPromptGraph's packed prompts [bucket, 3T + 1] (float, device).
    at::Tensor packed;
  };
  std::mutex decoder_graph_mu_;
  // (prompt bucket, token count, image bucket or 0, the graph encodes the prompts itself:
  // ReplaySharedPromptGraph).
  using DecoderGraphKey = std::tuple<int64_t, int64_t, int64_t, bool>;
  std::map<DecoderGraphKey, DecoderGraph> decoder_graphs_;
  // Warms run() up, captures it into g's graph in decoder_pool_ and caches g (with the outputs) under
  // key. end() when the capture ran out of memory (CaptureDecoderGraph: nothing cached, the caller
  // runs eagerly); after a failed capture of any kind the pool handle is dropped, so the next capture
  // starts a fresh pool. Caller holds decoder_graph_mu_.
  std::map<DecoderGraphKey, DecoderGraph>::iterator CaptureAndCacheDecoderGraph(
      const DecoderGraphKey& key, DecoderGraph g, const std::function<MaskDecoderImpl::Output()>& run);
  // The graphs' static image-side inputs by shape, shared by every graph of that shape.
  std::map<std::vector<int64_t>, at::Tensor> decoder_graph_inputs_;
  std::optional<c10::MempoolId_t> decoder_pool_;
#endif
};

}  // namespace maskd
