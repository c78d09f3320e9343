// The Engine implementation: SAM in LibTorch with the fast path on CUDA.
#include "model/engine.h"

#include <ATen/ATen.h>
#include <torch/cuda.h>
#include <torch/types.h>
#include <xxhash.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <functional>
#include <map>
#include <mutex>
#include <optional>
#include <sstream>

#include "kernels/kernels.h"
#include "model/checkpoint.h"
#include "model/fast_decoder.h"
#include "model/fast_linear.h"
#include "model/pil_resize.h"
#include "model/sam.h"
#include "model/sam_config.h"

#ifdef MASKD_WITH_CUDA
#include <ATen/cuda/CUDAGraph.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <cuda_runtime_api.h>
#endif

namespace maskd {

// ---------------------------------------------------------------------------------------------------
// Opaque handles

struct PreparedImage::Impl {
  at::Tensor input;  // [3, S, S] normalised and padded, engine dtype, engine device
  int original_width, original_height, input_width, input_height;
};
int PreparedImage::original_width() const { return impl_->original_width; }
int PreparedImage::original_height() const { return impl_->original_height; }
int PreparedImage::input_width() const { return impl_->input_width; }
int PreparedImage::input_height() const { return impl_->input_height; }

struct Embedding::Impl {
  at::Tensor tensor;  // [C, h, w]
  bool host_tier = false;  // moved off a CUDA device by ToHost
  int original_width, original_height, input_width, input_height;
};
int Embedding::original_width() const { return impl_->original_width; }
int Embedding::original_height() const { return impl_->original_height; }
int Embedding::input_width() const { return impl_->input_width; }
int Embedding::input_height() const { return impl_->input_height; }
size_t Embedding::bytes() const { return impl_->tensor.nbytes(); }
bool Embedding::on_host() const { return impl_->host_tier; }
std::vector<int64_t> Embedding::shape() const { return impl_->tensor.sizes().vec(); }
std::vector<float> Embedding::ToFloat() const {
  at::Tensor t = impl_->tensor.to(at::kCPU, at::kFloat).contiguous();
  return std::vector<float>(t.data_ptr<float>(), t.data_ptr<float>() + t.numel());
}

struct MaskLogits::Impl {
  at::Tensor tensor;  // [N, 256, 256], possibly a view into a decoded batch
};
int MaskLogits::num_masks() const { return static_cast<int>(impl_->tensor.size(0)); }
int MaskLogits::height() const { return static_cast<int>(impl_->tensor.size(1)); }
int MaskLogits::width() const { return static_cast<int>(impl_->tensor.size(2)); }
size_t MaskLogits::bytes() const { return impl_->tensor.nbytes(); }
std::vector<float> MaskLogits::ToFloat() const {
  at::Tensor t = impl_->tensor.to(at::kCPU, at::kFloat).contiguous();
  return std::vector<float>(t.data_ptr<float>(), t.data_ptr<float>() + t.numel());
}

// ---------------------------------------------------------------------------------------------------
// Names

const char* PrecisionName(Precision p) {
  switch (p) {
    case Precision::kFloat32: return "fp32";
    case Precision::kBFloat16: return "bf16";
    case Precision::kFloat16: return "fp16";
  }
  return "?";
}

StatusOr<Precision> ParsePrecision(std::string_view name) {
  if (name == "fp32" || name == "float32") return Precision::kFloat32;
  if (name == "bf16" || name == "bfloat16") return Precision::kBFloat16;
  if (name == "fp16" || name == "float16") return Precision::kFloat16;
  return InvalidArgument("precision '" + std::string(name) + "' is not one of fp32, bf16, fp16");
}

const char* AttentionImplName(AttentionImpl a) {
  switch (a) {
    case AttentionImpl::kAuto: return "auto";
    case AttentionImpl::kMath: return "math";
    case AttentionImpl::kSdpa: return "sdpa";
    case AttentionImpl::kSdpaFolded: return "sdpa-folded";
    case AttentionImpl::kFused: return "fused";
  }
  return "?";
}

StatusOr<AttentionImpl> ParseAttentionImpl(std::string_view name) {
  for (auto a : {AttentionImpl::kAuto, AttentionImpl::kMath, AttentionImpl::kSdpa,
                 AttentionImpl::kSdpaFolded, AttentionImpl::kFused})
    if (name == AttentionImplName(a)) return a;
  return InvalidArgument("attention '" + std::string(name) +
                         "' is not one of auto, math, sdpa, sdpa-folded, fused");
}

FastPathOptions FastPathOptions::Fast() {
  FastPathOptions f;
  f.attention = AttentionImpl::kAuto;
  f.cuda_graphs = true;
  f.gpu_preprocess = true;
  f.gpu_postprocess = true;
  f.fuse_encoder_ops = true;
  f.gelu_epilogue = true;
  f.shared_image_decoder = true;
  return f;
}

int CudaDeviceCount() {
  try {
    return torch::cuda::is_available() ? static_cast<int>(torch::cuda::device_count()) : 0;
  } catch (const std::exception&) {
    return 0;
  }
}

std::pair<int, int> ResizedSize(int width, int height, int target) {
  // SAM's ResizeLongestSide.get_preprocess_shape: scale in double, round half up. One deviation:
  // a side is never below 1 pixel. The original rounds the short side of e.g. a 1 x 4000 or
  // 1 x 2049 image to 0, an empty image no mask can be cropped from; any other shape is unchanged.
  const double scale = target * 1.0 / std::max(width, height);
  const int w = std::max(1, static_cast<int>(width * scale + 0.5));
  const int h = std::max(1, static_cast<int>(height * scale + 0.5));
  return {w, h};
}

namespace {
// Coordinates in messages as a person writes them: 700.5, not 700.500000.
std::string Num(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%g", v);
  return buf;
}
}  // namespace

Status ValidatePrompt(const PromptSpec& p, int w, int h, std::string_view prefix) {
  const std::string f(prefix);
  auto bad = [&](const std::string& m) { return InvalidArgument(m); };
  if (p.points.empty() && !p.box)
    return bad(f + " has no points and no box; at least one point or a box is required");
  for (size_t i = 0; i < p.points.size(); ++i) {
    const auto& pt = p.points[i];
    const std::string n = f + ".points[" + std::to_string(i) + "]";
    if (!std::isfinite(pt.x) || !std::isfinite(pt.y))
      return bad(n + " has a non-finite coordinate");
    if (pt.x < 0 || pt.x > w)
      return bad(n + ".x = " + Num(pt.x) + " is outside the image width [0, " +
                 std::to_string(w) + "]");
    if (pt.y < 0 || pt.y > h)
      return bad(n + ".y = " + Num(pt.y) + " is outside the image height [0, " +
                 std::to_string(h) + "]");
    if (pt.label != 0 && pt.label != 1)
      return bad(n + ".label = " + std::to_string(pt.label) + " must be 0 (background) or 1 (foreground)");
  }
  if (p.box) {
    const Box& b = *p.box;
    const std::string n = f + ".box";
    if (!std::isfinite(b.x0) || !std::isfinite(b.y0) || !std::isfinite(b.x1) || !std::isfinite(b.y1))
      return bad(n + " has a non-finite coordinate");
    if (b.x0 > b.x1 || b.y0 > b.y1)
      return bad(n + " = (" + Num(b.x0) + ", " + Num(b.y0) + ", " +
                 Num(b.x1) + ", " + Num(b.y1) +
                 ") must have x0 <= x1 and y0 <= y1");
    if (b.x0 < 0 || b.y0 < 0 || b.x1 > w || b.y1 > h)
      return bad(n + " = (" + Num(b.x0) + ", " + Num(b.y0) + ", " +
                 Num(b.x1) + ", " + Num(b.y1) + ") is outside the image " +
                 std::to_string(w) + "x" + std::to_string(h));
  }
  if (p.mask_input) {
    if (p.mask_input_index < 0 || p.mask_input_index >= p.mask_input->num_masks())
      return bad(f + ".mask_input index " + std::to_string(p.mask_input_index) + " is outside its " +
                 std::to_string(p.mask_input->num_masks()) + " masks");
  }
  return Status::Ok();
}

namespace {

void DefaultLog(LogLevel level, std::string_view msg) {
  static const char* kNames[] = {"debug", "info", "warning", "error"};
  std::fprintf(stderr, "[maskd engine] [%s] %.*s\n", kNames[static_cast<int>(level)],
               static_cast<int>(msg.size()), msg.data());
}

at::ScalarType DtypeOf(Precision p) {
  switch (p) {
    case Precision::kFloat32: return at::kFloat;
    case Precision::kBFloat16: return at::kBFloat16;
    case Precision::kFloat16: return at::kHalf;
  }
  return at::kFloat;
}

// Runs `fn`, turning LibTorch/CUDA exceptions into a Status that names the operation.
template <typename Fn>
auto Guarded(const char* what, Fn&& fn) -> decltype(fn()) {
  try {
    return fn();
  } catch (const c10::Error& e) {
    return Internal(std::string(what) + ": " + e.what_without_backtrace());
  } catch (const std::exception& e) {
    return Internal(std::string(what) + ": " + e.what());
  }
}

std::string Hex(uint64_t hi, uint64_t lo) {
  char buf[33];
  std::snprintf(buf, sizeof buf, "%016llx%016llx", static_cast<unsigned long long>(hi),
                static_cast<unsigned long long>(lo));
  return buf;
}

// Per-thread stream (CUDA): each Engine call runs on its calling thread's pool stream and
// synchronises it before returning, which is what makes every method synchronous and safe to call
// concurrently from several threads. One stream per thread, not one per call: the caching allocator
// keeps freed blocks per stream, so a fresh pool stream per call spread every call's temporaries
// over all 32 pool streams' caches (maskbench's decoder latency loop ended with 129 GiB reserved
// but unusable, and an out-of-memory error).
class CallStream {
 public:
  explicit CallStream(const at::Device& device) {
#ifdef MASKD_WITH_CUDA
    if (device.is_cuda()) {
      thread_local std::map<int, c10::cuda::CUDAStream> per_device;
      const int index = device.has_index() ? device.index() : c10::cuda::current_device();
      auto it = per_device.find(index);
      if (it == per_device.end())
        it = per_device.emplace(index, c10::cuda::getStreamFromPool(false, static_cast<c10::DeviceIndex>(index))).first;
      stream_.emplace(it->second);
      guard_.emplace(*stream_);
    }
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

// ---------------------------------------------------------------------------------------------------

class EngineImpl final : public Engine {
 public:
  EngineImpl(EngineOptions options, SamConfig config, Sam model, at::Device device, std::string weights_digest,
             uint64_t params)
      : options_(std::move(options)), config_(std::move(config)), sam_(std::move(model)),
        device_(device), dtype_(DtypeOf(options_.precision)), weights_digest_(std::move(weights_digest)) {
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
    desc_.identity = Identity();
  }

  Status Init();

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
  StatusOr<std::vector<DecodedPrompt>> Decode(const std::vector<DecodeItem>& items) override;
  StatusOr<std::vector<std::vector<MaskData>>> Postprocess(
      const std::vector<PostprocessItem>& items) override;
  StatusOr<std::shared_ptr<const Embedding>> ToHost(const Embedding& e) override;
  StatusOr<std::shared_ptr<const Embedding>> ToDevice(const Embedding& e) override;
  StatusOr<std::shared_ptr<const MaskLogits>> MakeMaskLogits(const float* v, int h, int w) override;
  DeviceMemoryStats memory() const override;
  void ResetPeakMemory() override;

 private:
  void Log(LogLevel l, const std::string& m) const { options_.log(l, m); }
  at::Tensor Normalize(const at::Tensor& hwc_u8, int h, int w) const;
  // A host tensor on the engine's device without a host synchronisation: a plain .to(cuda) of
  // pageable memory waits for the stream, which in the decoder stalled the launches of every pass.
  at::Tensor Upload(const at::Tensor& host) const;
  at::Tensor RunEncoder(const at::Tensor& batch);
  MaskDecoderImpl::Output RunDecoder(const at::Tensor& src, const at::Tensor& sparse);
  // The shared-image decoder on group keys [G, HW, D] (graph replay when G == 1).
  MaskDecoderImpl::Output RunSharedDecoder(const at::Tensor& keys, const at::Tensor& group_of,
                                           const at::Tensor& sparse);
  // Replays the decoder graph for `sparse`'s prompt count (padded to a bucket) and token count,
  // capturing it on first use; image_side is copied into the graph's static input (padded to the
  // bucket too when per_prompt). nullopt: no graph for this shape (run eagerly).
  std::optional<MaskDecoderImpl::Output> ReplayDecoderGraph(
      const at::Tensor& image_side, bool per_prompt, const at::Tensor& sparse,
      const std::function<MaskDecoderImpl::Output(const at::Tensor&, const at::Tensor&)>& run);
  Status PrepareFastPath();
  Status CaptureEncoderGraphs();
  std::string Identity() const;
  Status Warmup();

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
  bool gpu_pre_ = false, gpu_post_ = false;
  // Set by PrepareFastPath with FastPathOptions::shared_image_decoder (it holds tables derived from
  // the decoder's weights on their final device and dtype).
  std::unique_ptr<SharedImageDecoder> shared_dec_;

#ifdef MASKD_WITH_CUDA
  // Encoder CUDA graphs by batch size, sharing one memory pool. Replays reuse static buffers, so
  // they are serialised: graph_mu_ guards graphs_ and the static tensors while a graph runs.
  struct EncoderGraph {
    std::unique_ptr<at::cuda::CUDAGraph> graph;
    at::Tensor input, output;
  };
  std::mutex graph_mu_;
  std::map<int, EncoderGraph> graphs_;
  // Decoder graphs by (padded prompt count, token count), captured on first use into a pool of
  // their own (the encoder's replays run concurrently on another thread). decoder_graph_mu_ guards
  // them and their static buffers from copy-in to clone-out.
  struct DecoderGraph {
    std::unique_ptr<at::cuda::CUDAGraph> graph;
    // src: the per-prompt image side [bucket, D, h, w], or with the shared-image decoder the one
    // image's group keys [1, HW, D] (a configuration uses one kind: Reconfigure clears the graphs).
    at::Tensor src, sparse, masks, iou;
  };
  std::mutex decoder_graph_mu_;
  std::map<std::pair<int64_t, int64_t>, DecoderGraph> decoder_graphs_;
  std::optional<c10::MempoolId_t> decoder_pool_;
#endif
};

std::string EngineImpl::Identity() const {
  // Cache keys depend on the weights and on everything that changes the embedding's numerics.
  std::ostringstream os;
  os << weights_digest_ << "|" << PrecisionName(options_.precision) << "|int8=" << options_.fast.int8
     << "|sparse=" << options_.fast.sparse24 << "|gelu-epilogue=" << sam_->image_encoder->gelu_epilogue;
  const std::string s = os.str();
  const XXH128_hash_t h = XXH3_128bits(s.data(), s.size());
  return Hex(h.high64, h.low64).substr(0, 16);
}

Status EngineImpl::Reconfigure(const FastPathOptions& fast) {
  return Guarded("reconfiguring the fast path", [&]() -> Status {
    torch::NoGradGuard no_grad;
    options_.fast = fast;
    optimisations_.clear();
    for (auto& b : sam_->image_encoder->block_list) {
      b->attn->qkv_fast.reset();
      b->attn->proj_fast.reset();
      b->mlp->lin1_fast.reset();
      b->mlp->lin2_fast.reset();
    }
#ifdef MASKD_WITH_CUDA
    {
      std::lock_guard<std::mutex> lock(graph_mu_);
      graphs_.clear();
    }
    {
      std::lock_guard<std::mutex> lock(decoder_graph_mu_);
      decoder_graphs_.clear();
      // The pool goes with its last graph; a new capture needs a new handle.
      decoder_pool_.reset();
    }
#endif
    MASKD_RETURN_IF_ERROR(PrepareFastPath());
    desc_.identity = Identity();
    if (options_.warmup) MASKD_RETURN_IF_ERROR(Warmup());
    return Status::Ok();
  });
}

std::string EngineImpl::device_name() const {
#ifdef MASKD_WITH_CUDA
  if (device_.is_cuda()) {
    cudaDeviceProp prop;
    if (cudaGetDeviceProperties(&prop, device_.index()) == cudaSuccess) return prop.name;
  }
#endif
  return "cpu";
}

Status EngineImpl::Init() {
  return Guarded("preparing the model", [&]() -> Status {
    torch::NoGradGuard no_grad;
    sam_->eval();
    // Positional encodings stay fp32 until they are added (they are precomputed once here).
    dense_pe_ = sam_->prompt_encoder->DensePe().to(device_);
    sam_->to(device_, dtype_);
    dense_pe_ = dense_pe_.to(dtype_);
    no_mask_ = sam_->prompt_encoder->NoMaskDense();
    const auto fopts = at::TensorOptions().dtype(at::kFloat).device(device_);
    pixel_mean_ = at::tensor(kPixelMean, fopts).view({3, 1, 1});
    pixel_std_ = at::tensor(kPixelStd, fopts).view({3, 1, 1});
    if (device_.is_cuda() && options_.precision == Precision::kFloat32 && options_.strict_fp32) {
      // fp32 means fp32: the golden parity tolerances assume no TF32.
      at::globalContext().setAllowTF32CuBLAS(false);
      at::globalContext().setAllowTF32CuDNN(false);
    }
    // The derived tables first: captured graphs hold their addresses, so they must not be
    // recomputed after a capture.
    sam_->image_encoder->Prepare();
    MASKD_RETURN_IF_ERROR(PrepareFastPath());
    if (options_.warmup) MASKD_RETURN_IF_ERROR(Warmup());
    return Status::Ok();
  });
}

Status EngineImpl::PrepareFastPath() {
  const bool cuda = device_.is_cuda();
  const FastPathOptions& f = options_.fast;
  AttentionImpl attn = f.attention;
  if (attn == AttentionImpl::kAuto) {
    if (!cuda || options_.precision == Precision::kFloat32) {
      attn = AttentionImpl::kMath;
    } else {
      const int hd = config_.embed_dim / config_.num_heads;
      attn = (kernels::BuiltWithCuda() && (hd == 64 || hd == 80)) ? AttentionImpl::kFused
                                                                   : AttentionImpl::kSdpaFolded;
    }
  }
  if (attn == AttentionImpl::kFused && (!cuda || !kernels::BuiltWithCuda()))
    return InvalidArgument("attention 'fused' needs a CUDA device and a CUDA build");
  if (attn == AttentionImpl::kFused && options_.precision == Precision::kFloat32)
    return InvalidArgument("attention 'fused' runs in bf16 or fp16, not fp32");
  sam_->image_encoder->SetAttention(attn);
  // Both CUDA-only in effect (on CPU the fused kernels would run their LibTorch references).
  // The GELU epilogue is an approximation: never in fp32, which promises the original's arithmetic.
  const bool gelu = cuda && f.fuse_encoder_ops && f.gelu_epilogue && options_.precision != Precision::kFloat32;
  sam_->image_encoder->SetFusion(cuda && f.fuse_encoder_ops, gelu);
  if (cuda && f.fuse_encoder_ops) optimisations_.push_back("fused-encoder-ops");
  if (gelu) optimisations_.push_back("gelu-epilogue");
  for (auto& b : sam_->image_encoder->block_list) b->attn->fold_pad_v = !cuda;
  if (attn != AttentionImpl::kMath) optimisations_.push_back(AttentionImplName(attn));
  if (cuda && options_.precision != Precision::kFloat32) {
    sam_->mask_decoder->transformer->SetSdpa(true);
    sam_->mask_decoder->matmul_upscaling = true;
    // Static shapes (per batch and bucket): let cuDNN pick its fastest kernels once per shape.
    at::globalContext().setBenchmarkCuDNN(true);
  }
  if ((f.int8 || f.sparse24) && !cuda) {
    Log(LogLevel::kWarning, "int8 and 2:4 sparsity are CUDA-only; ignored on " + device_.str());
  } else if (f.int8 || f.sparse24) {
    if (f.int8 && f.sparse24) return InvalidArgument("choose int8 or 2:4 sparsity, not both");
    for (auto& b : sam_->image_encoder->block_list) {
      auto make = [&](const torch::nn::Linear& l) {
        return f.int8 ? MakeInt8Linear(l) : MakeSparse24Linear(l);
      };
      b->attn->qkv_fast = make(b->attn->qkv);
      b->attn->proj_fast = make(b->attn->proj);
      b->mlp->lin1_fast = make(b->mlp->lin1);
      b->mlp->lin2_fast = make(b->mlp->lin2);
    }
    optimisations_.push_back(f.int8 ? "int8-dynamic-quant" : "sparse-2:4");
  }
  shared_dec_.reset();
  if (f.shared_image_decoder) {
    shared_dec_ = std::make_unique<SharedImageDecoder>(*sam_->mask_decoder, dense_pe_);
    optimisations_.push_back("shared-image-decoder");
  }
  gpu_pre_ = cuda && f.gpu_preprocess;
  gpu_post_ = cuda && f.gpu_postprocess;
  if (gpu_pre_) optimisations_.push_back("gpu-preprocess");
  if (gpu_post_) optimisations_.push_back("gpu-postprocess-rle");
  auto& sizes = options_.encoder_batch_sizes;
  if (sizes.empty()) sizes = {1};
  std::sort(sizes.begin(), sizes.end());
  sizes.erase(std::unique(sizes.begin(), sizes.end()), sizes.end());
  if (sizes.front() < 1) return InvalidArgument("encoder batch sizes must be >= 1");
  if (cuda && f.cuda_graphs) {
    MASKD_RETURN_IF_ERROR(CaptureEncoderGraphs());
    optimisations_.push_back("cuda-graphs");
  }
  return Status::Ok();
}

Status EngineImpl::CaptureEncoderGraphs() {
#ifdef MASKD_WITH_CUDA
  const auto pool = at::cuda::graph_pool_handle();
  for (int bs : options_.encoder_batch_sizes) {
    CallStream cs(device_);
    EncoderGraph g;
    g.input = at::randn({bs, 3, config_.img_size, config_.img_size},
                        at::TensorOptions().dtype(dtype_).device(device_));
    // Warm up outside the capture: cuBLAS/cuDNN handles and workspaces, kernel selection.
    for (int i = 0; i < 2; ++i) sam_->image_encoder->forward(g.input);
    cs.Sync();
    g.graph = std::make_unique<at::cuda::CUDAGraph>();
    g.graph->capture_begin(pool, cudaStreamCaptureModeThreadLocal);
    g.output = sam_->image_encoder->forward(g.input);
    g.graph->capture_end();
    cs.Sync();
    graphs_.emplace(bs, std::move(g));
  }
  return Status::Ok();
#else
  return InvalidArgument("CUDA graphs need a CUDA build");
#endif
}

Status EngineImpl::Warmup() {
  // One image through every stage, so that lazy initialisation stays out of the first request.
  ImageRGB8 img;
  img.width = 64, img.height = 48;
  img.pixels.assign(static_cast<size_t>(img.width) * img.height * 3, 127);
  auto prep = Prepare(img);
  if (!prep.ok()) return prep.status();
  auto emb = Encode({*prep});
  if (!emb.ok()) return emb.status();
  PromptSpec p;
  p.points = {{10, 10, 1}};
  auto dec = Decode({{(*emb)[0], p}});
  if (!dec.ok()) return dec.status();
  PostprocessItem item{(*dec)[0].logits, img.width, img.height, (*emb)[0]->input_width(),
                       (*emb)[0]->input_height(), MaskEncoding::kRle};
  auto post = Postprocess({item});
  if (!post.ok()) return post.status();
  Log(LogLevel::kInfo, "warm-up done on " + device_.str());
  return Status::Ok();
}

at::Tensor EngineImpl::Normalize(const at::Tensor& hwc_u8, int h, int w) const {
  // The original: (uint8 - mean) / std in float32, then zero padding at the right and bottom.
  const int64_t S = config_.img_size;
  at::Tensor x = hwc_u8.permute({2, 0, 1});
  x = (x - pixel_mean_) / pixel_std_;
  x = at::constant_pad_nd(x, {0, S - w, 0, S - h});
  return x.to(dtype_).contiguous();
}

at::Tensor EngineImpl::Upload(const at::Tensor& host) const {
  if (!device_.is_cuda()) return host.to(device_);
  // pin_memory() copies into a block of the caching host allocator, which keeps it until the
  // non-blocking copy recorded on the stream has run.
  return host.pin_memory().to(device_, /*non_blocking=*/true);
}

StatusOr<PreparedImage> EngineImpl::Prepare(const ImageRGB8& image) {
  if (image.width <= 0 || image.height <= 0 ||
      image.pixels.size() != static_cast<size_t>(image.width) * image.height * 3)
    return InvalidArgument("image of " + std::to_string(image.width) + "x" +
                           std::to_string(image.height) + " with " +
                           std::to_string(image.pixels.size()) + " bytes (expected width*height*3)");
  const auto [rw, rh] = ResizedSize(image.width, image.height, config_.img_size);
  return Guarded("preparing the image", [&]() -> StatusOr<PreparedImage> {
    torch::NoGradGuard no_grad;
    auto impl = std::make_shared<PreparedImage::Impl>();
    impl->original_width = image.width;
    impl->original_height = image.height;
    impl->input_width = rw;
    impl->input_height = rh;
    if (gpu_pre_) {
      CallStream cs(device_);
      const at::Tensor host = at::from_blob(const_cast<uint8_t*>(image.pixels.data()),
                                            {image.height, image.width, 3}, at::kByte);
      const at::Tensor dev = host.to(device_);
      impl->input = kernels::ResizeNormalizePad(dev, rh, rw, config_.img_size, kPixelMean, kPixelStd, dtype_);
      cs.Sync();
    } else {
      const ImageRGB8 resized = PilResizeBilinear(image, rw, rh);
      CallStream cs(device_);
      const at::Tensor host = at::from_blob(const_cast<uint8_t*>(resized.pixels.data()), {rh, rw, 3}, at::kByte);
      impl->input = Normalize(host.to(device_), rh, rw);
      cs.Sync();
    }
    return PreparedImage(impl);
  });
}

StatusOr<PreparedImage> EngineImpl::PrepareResized(const ImageRGB8& resized, int ow, int oh) {
  const auto [rw, rh] = ResizedSize(ow, oh, config_.img_size);
  if (resized.width != rw || resized.height != rh)
    return InvalidArgument("resized image is " + std::to_string(resized.width) + "x" +
                           std::to_string(resized.height) + " but " + std::to_string(ow) + "x" +
                           std::to_string(oh) + " resizes to " + std::to_string(rw) + "x" +
                           std::to_string(rh));
  if (resized.pixels.size() != static_cast<size_t>(rw) * rh * 3)
    return InvalidArgument("resized image has the wrong number of bytes");
  return Guarded("preparing the image", [&]() -> StatusOr<PreparedImage> {
    torch::NoGradGuard no_grad;
    CallStream cs(device_);
    auto impl = std::make_shared<PreparedImage::Impl>();
    impl->original_width = ow;
    impl->original_height = oh;
    impl->input_width = rw;
    impl->input_height = rh;
    const at::Tensor host = at::from_blob(const_cast<uint8_t*>(resized.pixels.data()), {rh, rw, 3}, at::kByte);
    impl->input = Normalize(host.to(device_), rh, rw);
    cs.Sync();
    return PreparedImage(impl);
  });
}

at::Tensor EngineImpl::RunEncoder(const at::Tensor& batch) {
#ifdef MASKD_WITH_CUDA
  {
    std::lock_guard<std::mutex> lock(graph_mu_);
    auto it = graphs_.find(static_cast<int>(batch.size(0)));
    if (it != graphs_.end()) {
      it->second.input.copy_(batch);
      it->second.graph->replay();
      return it->second.output.clone();
    }
  }
#endif
  return sam_->image_encoder->forward(batch);
}

StatusOr<std::vector<std::shared_ptr<const Embedding>>> EngineImpl::Encode(
    const std::vector<PreparedImage>& images) {
  if (images.empty()) return std::vector<std::shared_ptr<const Embedding>>{};
  return Guarded("running the image encoder",
                 [&]() -> StatusOr<std::vector<std::shared_ptr<const Embedding>>> {
    torch::NoGradGuard no_grad;
    CallStream cs(device_);
    std::vector<std::shared_ptr<const Embedding>> out;
    const auto& sizes = options_.encoder_batch_sizes;
    size_t start = 0;
    while (start < images.size()) {
      const size_t left = images.size() - start;
      // The smallest prepared size that holds what is left, else the largest (and loop).
      int bs = sizes.back();
      for (int s : sizes)
        if (static_cast<size_t>(s) >= left) {
          bs = s;
          break;
        }
      const size_t n = std::min<size_t>(left, bs);
      std::vector<at::Tensor> inputs;
      for (size_t i = 0; i < n; ++i) inputs.push_back(images[start + i].impl()->input);
      at::Tensor batch = at::stack(inputs);
      if (static_cast<int>(n) < bs && device_.is_cuda()) {
        // Pad to the static batch size (graph shapes); padded rows are discarded.
        batch = at::cat({batch, at::zeros({bs - static_cast<int64_t>(n), batch.size(1), batch.size(2),
                                           batch.size(3)}, batch.options())});
      }
      const at::Tensor emb = RunEncoder(batch);
      for (size_t i = 0; i < n; ++i) {
        const auto& src = *images[start + i].impl();
        auto impl = std::make_shared<Embedding::Impl>();
        impl->tensor = emb[static_cast<int64_t>(i)].clone();
        impl->original_width = src.original_width;
        impl->original_height = src.original_height;
        impl->input_width = src.input_width;
        impl->input_height = src.input_height;
        out.push_back(std::make_shared<const Embedding>(impl));
      }
      start += n;
    }
    cs.Sync();
    return out;
  });
}

// Prompt counts a decoder graph is captured for; larger batches run eagerly (launch overhead is
// amortised there anyway). Token counts above kMaxGraphTokens run eagerly too.
constexpr int64_t kDecoderGraphBuckets[] = {1, 2, 4, 8, 16, 32, 64};
constexpr int64_t kMaxGraphTokens = 16;
constexpr size_t kMaxDecoderGraphs = 64;

std::optional<MaskDecoderImpl::Output> EngineImpl::ReplayDecoderGraph(
    const at::Tensor& image_side, bool per_prompt, const at::Tensor& sparse,
    const std::function<MaskDecoderImpl::Output(const at::Tensor&, const at::Tensor&)>& run) {
#ifdef MASKD_WITH_CUDA
  const int64_t G = sparse.size(0), T = sparse.size(1);
  if (!device_.is_cuda() || !options_.fast.cuda_graphs || T > kMaxGraphTokens) return std::nullopt;
  int64_t bucket = 0;
  for (int64_t b : kDecoderGraphBuckets)
    if (b >= G) {
      bucket = b;
      break;
    }
  if (bucket == 0) return std::nullopt;
  std::lock_guard<std::mutex> lock(decoder_graph_mu_);
  auto it = decoder_graphs_.find({bucket, T});
  if (it == decoder_graphs_.end() && decoder_graphs_.size() < kMaxDecoderGraphs) {
    DecoderGraph g;
    std::vector<int64_t> shape = image_side.sizes().vec();
    if (per_prompt) shape[0] = bucket;
    g.src = at::zeros(shape, image_side.options());
    g.sparse = at::zeros({bucket, T, sparse.size(2)}, sparse.options());
    run(g.src, g.sparse);  // warm-up outside the capture
    c10::cuda::getCurrentCUDAStream().synchronize();
    if (!decoder_pool_) decoder_pool_ = at::cuda::graph_pool_handle();
    g.graph = std::make_unique<at::cuda::CUDAGraph>();
    g.graph->capture_begin(*decoder_pool_, cudaStreamCaptureModeThreadLocal);
    auto out = run(g.src, g.sparse);
    g.graph->capture_end();
    g.masks = out.masks;
    g.iou = out.iou_predictions;
    it = decoder_graphs_.emplace(std::make_pair(bucket, T), std::move(g)).first;
  }
  if (it == decoder_graphs_.end()) return std::nullopt;
  DecoderGraph& g = it->second;
  // Rows past G keep whatever they held: every decoder operation is per prompt row.
  if (per_prompt) g.src.narrow(0, 0, G).copy_(image_side);
  else g.src.copy_(image_side);
  g.sparse.narrow(0, 0, G).copy_(sparse);
  g.graph->replay();
  return MaskDecoderImpl::Output{g.masks.narrow(0, 0, G).clone(), g.iou.narrow(0, 0, G).clone()};
#else
  (void)image_side, (void)per_prompt, (void)sparse, (void)run;
  return std::nullopt;
#endif
}

MaskDecoderImpl::Output EngineImpl::RunDecoder(const at::Tensor& src, const at::Tensor& sparse) {
  auto run = [this](const at::Tensor& s, const at::Tensor& sp) { return sam_->mask_decoder->forward(s, dense_pe_, sp); };
  if (auto out = ReplayDecoderGraph(src, /*per_prompt=*/true, sparse, run)) return std::move(*out);
  return run(src, sparse);
}

MaskDecoderImpl::Output EngineImpl::RunSharedDecoder(const at::Tensor& keys, const at::Tensor& group_of,
                                                     const at::Tensor& sparse) {
  if (keys.size(0) == 1) {
    auto run = [this](const at::Tensor& k, const at::Tensor& sp) { return shared_dec_->ForwardKeys(k, {}, sp); };
    if (auto out = ReplayDecoderGraph(keys, /*per_prompt=*/false, sparse, run)) return std::move(*out);
  }
  return shared_dec_->ForwardKeys(keys, group_of, sparse);
}

StatusOr<std::vector<DecodedPrompt>> EngineImpl::Decode(const std::vector<DecodeItem>& items) {
  for (size_t i = 0; i < items.size(); ++i) {
    if (!items[i].embedding) return InvalidArgument("decode item " + std::to_string(i) + " has no embedding");
    const Embedding& e = *items[i].embedding;
    MASKD_RETURN_IF_ERROR(ValidatePrompt(items[i].prompt, e.original_width(), e.original_height(),
                                         "prompts[" + std::to_string(i) + "]"));
    if (e.on_host()) return FailedPrecondition("decode item " + std::to_string(i) +
                                               " has a host-tier embedding; move it with ToDevice first");
  }
  return Guarded("running the mask decoder", [&]() -> StatusOr<std::vector<DecodedPrompt>> {
    torch::NoGradGuard no_grad;
    CallStream cs(device_);
    std::vector<DecodedPrompt> out(items.size());
    // Bucket by sparse token count: the decoder attends over every token without a mask, so only
    // prompts with equal counts can share a pass (the original's padding token is part of a
    // point-only prompt's own count).
    std::map<int64_t, std::vector<size_t>> buckets;
    for (size_t i = 0; i < items.size(); ++i) {
      const auto& p = items[i].prompt;
      const int64_t t = static_cast<int64_t>(p.points.size()) + (p.box ? 2 : 1);
      buckets[t].push_back(i);
    }
    struct Pending {
      at::Tensor scores;  // [G, 4] on device
      at::Tensor masks;   // [G, 4, 256, 256]
      std::vector<size_t> idx;
    };
    std::vector<Pending> pending;
    for (auto& [T, idx] : buckets) {
      const int64_t G = static_cast<int64_t>(idx.size());
      // Flat prompt tensors in the model's input frame: the original transforms coordinates in
      // float64 (numpy) and then uses them as float32.
      std::vector<float> coords(static_cast<size_t>(G * T * 2), 0.f);
      std::vector<int64_t> labels(static_cast<size_t>(G * T), -1);
      std::vector<at::Tensor> embs;
      std::vector<int64_t> mask_rows;
      std::vector<at::Tensor> mask_inputs;
      for (int64_t g = 0; g < G; ++g) {
        const auto& item = items[idx[g]];
        const Embedding& e = *item.embedding;
        const double sx = static_cast<double>(e.input_width()) / e.original_width();
        const double sy = static_cast<double>(e.input_height()) / e.original_height();
        int64_t t = 0;
        auto put = [&](double x, double y, int64_t label) {
          const size_t k = static_cast<size_t>(g * T + t);
          coords[2 * k] = static_cast<float>(x * sx);
          coords[2 * k + 1] = static_cast<float>(y * sy);
          labels[k] = label;
          ++t;
        };
        for (const auto& pt : item.prompt.points) put(pt.x, pt.y, pt.label);
        if (item.prompt.box) {
          put(item.prompt.box->x0, item.prompt.box->y0, 2);
          put(item.prompt.box->x1, item.prompt.box->y1, 3);
        } else {
          ++t;  // the "not a point" token: coordinates (0, 0), label -1
        }
        embs.push_back(e.impl()->tensor);
        if (item.prompt.mask_input) {
          mask_rows.push_back(g);
          mask_inputs.push_back(item.prompt.mask_input->impl()->tensor[item.prompt.mask_input_index]);
        }
      }
      const at::Tensor c = Upload(at::from_blob(coords.data(), {G, T, 2}, at::kFloat));
      const at::Tensor l = Upload(at::from_blob(labels.data(), {G, T}, at::kLong));
      const at::Tensor sparse = sam_->prompt_encoder->EmbedTokens(c, l).to(dtype_);
      if (shared_dec_) {
        // Groups of prompts with one image side: the prompts of one embedding without a mask input;
        // a prompt with a mask input is a group of its own (its dense embedding is its own).
        std::vector<at::Tensor> group_src, group_masks;
        std::vector<int64_t> group_of(static_cast<size_t>(G)), mask_groups;
        std::map<const void*, int64_t> by_embedding;
        size_t next_mask = 0;
        for (int64_t g = 0; g < G; ++g) {
          const auto& item = items[idx[g]];
          const at::Tensor& e = item.embedding->impl()->tensor;
          if (item.prompt.mask_input) {
            mask_groups.push_back(static_cast<int64_t>(group_src.size()));
            group_masks.push_back(mask_inputs[next_mask++]);
            group_of[g] = static_cast<int64_t>(group_src.size());
            group_src.push_back(e);
            continue;
          }
          auto [it, fresh] = by_embedding.emplace(e.data_ptr(), static_cast<int64_t>(group_src.size()));
          if (fresh) group_src.push_back(e);
          group_of[g] = it->second;
        }
        const int64_t ng = static_cast<int64_t>(group_src.size());
        at::Tensor src = at::stack(group_src);
        if (mask_groups.empty()) {
          src = src + no_mask_;
        } else {
          const at::Tensor dense_m = sam_->prompt_encoder->EmbedMasks(at::stack(group_masks).unsqueeze(1).to(dtype_));
          at::Tensor dense = no_mask_.expand({ng, -1, src.size(2), src.size(3)}).clone();
          dense.index_copy_(0, Upload(at::tensor(mask_groups, at::TensorOptions().dtype(at::kLong))), dense_m);
          src = src + dense;
        }
        const at::Tensor group_index =
            ng > 1 ? Upload(at::tensor(group_of, at::TensorOptions().dtype(at::kLong))) : at::Tensor();
        auto dec = RunSharedDecoder(SharedImageDecoder::GroupKeys(src), group_index, sparse);
        pending.push_back({dec.iou_predictions, dec.masks, idx});
        continue;
      }
      at::Tensor src = at::stack(embs);
      if (mask_rows.empty()) {
        src = src + no_mask_;
      } else {
        const at::Tensor m = at::stack(mask_inputs).unsqueeze(1).to(dtype_);
        const at::Tensor dense_m = sam_->prompt_encoder->EmbedMasks(m);
        at::Tensor dense = no_mask_.expand({G, -1, src.size(2), src.size(3)}).clone();
        const at::Tensor rows = Upload(at::tensor(mask_rows, at::TensorOptions().dtype(at::kLong)));
        dense.index_copy_(0, rows, dense_m);
        src = src + dense;
      }
      auto dec = RunDecoder(src, sparse);
      pending.push_back({dec.iou_predictions, dec.masks, idx});
    }
    // Every pass's mask copies are queued before the first score download synchronises, so the
    // host waits once, for work that is already all on the stream.
    std::vector<std::vector<at::Tensor>> logits(pending.size());
    for (size_t k = 0; k < pending.size(); ++k) {
      const Pending& p = pending[k];
      const int64_t nt = p.scores.size(1);
      std::vector<int64_t> row, first, count;
      for (size_t g = 0; g < p.idx.size(); ++g) {
        const bool multi = items[p.idx[g]].prompt.multimask;
        row.push_back(static_cast<int64_t>(g));
        first.push_back(multi ? 1 : 0);
        count.push_back(multi ? nt - 1 : 1);
      }
      // A copy of its own per prompt (one launch for all): a view would keep the whole batch's
      // [G, 4, 256, 256] alive for as long as any one result is stored, and bytes() would
      // under-count it.
      logits[k] = kernels::CopySlices(p.masks, row, first, count);
    }
    for (size_t k = 0; k < pending.size(); ++k) {
      const Pending& p = pending[k];
      const at::Tensor scores = p.scores.to(at::kCPU, at::kFloat).contiguous();
      const float* s = scores.data_ptr<float>();
      const int64_t nt = scores.size(1);
      for (size_t g = 0; g < p.idx.size(); ++g) {
        const bool multi = items[p.idx[g]].prompt.multimask;
        const int64_t first = multi ? 1 : 0, count = multi ? nt - 1 : 1;
        DecodedPrompt d;
        d.scores.assign(s + g * nt + first, s + g * nt + first + count);
        auto impl = std::make_shared<MaskLogits::Impl>();
        impl->tensor = std::move(logits[k][g]);
        d.logits = std::make_shared<const MaskLogits>(impl);
        out[p.idx[g]] = std::move(d);
      }
    }
    cs.Sync();
    return out;
  });
}

StatusOr<std::vector<std::vector<MaskData>>> EngineImpl::Postprocess(
    const std::vector<PostprocessItem>& items) {
  for (size_t i = 0; i < items.size(); ++i) {
    const auto& it = items[i];
    if (!it.logits) return InvalidArgument("postprocess item " + std::to_string(i) + " has no logits");
    if (it.original_width <= 0 || it.original_height <= 0 || it.input_width <= 0 ||
        it.input_height <= 0 || it.input_width > config_.img_size || it.input_height > config_.img_size)
      return InvalidArgument("postprocess item " + std::to_string(i) + " has an invalid geometry");
  }
  return Guarded("post-processing masks", [&]() -> StatusOr<std::vector<std::vector<MaskData>>> {
    torch::NoGradGuard no_grad;
    CallStream cs(device_);
    std::vector<std::vector<MaskData>> out(items.size());
    // One pass per encoding kind over all masks of all items.
    for (MaskEncoding enc : {MaskEncoding::kNone, MaskEncoding::kRle, MaskEncoding::kBitmask}) {
      std::vector<at::Tensor> logits;
      std::vector<int32_t> geometry;
      std::vector<std::pair<size_t, int>> owners;
      for (size_t i = 0; i < items.size(); ++i) {
        const auto& it = items[i];
        if (it.encoding != enc) continue;
        const at::Tensor& t = it.logits->impl()->tensor;
        logits.push_back(t);
        for (int64_t m = 0; m < t.size(0); ++m) {
          geometry.insert(geometry.end(), {it.input_height, it.input_width, it.original_height, it.original_width});
          owners.emplace_back(i, static_cast<int>(m));
        }
      }
      if (logits.empty()) continue;
      const int64_t M = static_cast<int64_t>(owners.size());
      at::Tensor all = at::cat(logits, 0);
      at::Tensor geom = at::from_blob(geometry.data(), {M, 4}, at::kInt).clone();
      kernels::MaskPostprocessOutput r;
      if (gpu_post_) {
        // The kernel reads bf16/fp16 logits itself (widening is exact): no float copy of the batch.
        r = kernels::MaskPostprocess(all.contiguous(), geom, config_.img_size,
                                     enc == MaskEncoding::kRle, enc == MaskEncoding::kBitmask);
      } else {
        // The original's float32 arithmetic in plain LibTorch, on the engine's device.
        r = kernels::MaskPostprocessReference(all.to(at::kFloat).contiguous(), geom, config_.img_size,
                                              enc == MaskEncoding::kRle, enc == MaskEncoding::kBitmask);
      }
      const at::Tensor area = r.area.to(at::kCPU).contiguous();
      const at::Tensor bbox = r.bbox.to(at::kCPU).contiguous();
      const at::Tensor stab = r.stability.to(at::kCPU, at::kFloat).contiguous();
      for (int64_t m = 0; m < M; ++m) {
        MaskData d;
        d.area = static_cast<uint64_t>(area.data_ptr<int64_t>()[m]);
        for (int k = 0; k < 4; ++k) d.bbox[k] = static_cast<uint32_t>(bbox.data_ptr<int32_t>()[m * 4 + k]);
        d.stability_score = stab.data_ptr<float>()[m];
        if (enc == MaskEncoding::kRle) {
          const int64_t* off = r.rle_offsets.data_ptr<int64_t>();
          const int32_t* cnt = r.rle_counts.data_ptr<int32_t>();
          d.rle_counts.assign(cnt + off[m], cnt + off[m + 1]);
        } else if (enc == MaskEncoding::kBitmask) {
          const int64_t* off = r.bitmask_offsets.data_ptr<int64_t>();
          const uint8_t* bm = r.bitmask.data_ptr<uint8_t>();
          d.bitmask.assign(bm + off[m], bm + off[m + 1]);
        }
        out[owners[m].first].push_back(std::move(d));
      }
    }
    cs.Sync();
    return out;
  });
}

StatusOr<std::shared_ptr<const Embedding>> EngineImpl::ToHost(const Embedding& e) {
  return Guarded("moving an embedding to host memory", [&]() -> StatusOr<std::shared_ptr<const Embedding>> {
    auto impl = std::make_shared<Embedding::Impl>(*e.impl());
    if (!impl->tensor.is_cpu()) {
      impl->host_tier = true;
      CallStream cs(device_);
      at::Tensor host = at::empty(impl->tensor.sizes(),
                                  impl->tensor.options().device(at::kCPU).pinned_memory(device_.is_cuda()));
      host.copy_(impl->tensor);
      cs.Sync();
      impl->tensor = host;
    }
    return std::make_shared<const Embedding>(impl);
  });
}

StatusOr<std::shared_ptr<const Embedding>> EngineImpl::ToDevice(const Embedding& e) {
  return Guarded("moving an embedding to the device", [&]() -> StatusOr<std::shared_ptr<const Embedding>> {
    auto impl = std::make_shared<Embedding::Impl>(*e.impl());
    impl->host_tier = false;
    if (impl->tensor.device() != device_) {
      CallStream cs(device_);
      impl->tensor = impl->tensor.to(device_);
      cs.Sync();
    }
    return std::make_shared<const Embedding>(impl);
  });
}

StatusOr<std::shared_ptr<const MaskLogits>> EngineImpl::MakeMaskLogits(const float* v, int h, int w) {
  const int want = config_.low_res_size();
  if (h != want || w != want)
    return InvalidArgument("mask input is " + std::to_string(w) + "x" + std::to_string(h) +
                           ", expected " + std::to_string(want) + "x" + std::to_string(want) +
                           " low-res logits");
  return Guarded("uploading mask logits", [&]() -> StatusOr<std::shared_ptr<const MaskLogits>> {
    CallStream cs(device_);
    auto impl = std::make_shared<MaskLogits::Impl>();
    // copy=true: on a CPU fp32 engine .to() would otherwise return the caller's buffer itself.
    impl->tensor = at::from_blob(const_cast<float*>(v), {1, h, w}, at::kFloat)
                       .to(device_, dtype_, /*non_blocking=*/false, /*copy=*/true);
    cs.Sync();
    return std::make_shared<const MaskLogits>(impl);
  });
}

DeviceMemoryStats EngineImpl::memory() const {
  DeviceMemoryStats s;
#ifdef MASKD_WITH_CUDA
  if (device_.is_cuda()) {
    const auto st = c10::cuda::CUDACachingAllocator::getDeviceStats(device_.index());
    s.allocated = static_cast<uint64_t>(st.allocated_bytes[0].current);
    s.peak_allocated = static_cast<uint64_t>(st.allocated_bytes[0].peak);
    s.reserved = static_cast<uint64_t>(st.reserved_bytes[0].current);
    size_t free_b = 0, total_b = 0;
    c10::cuda::CUDAGuard g(device_.index());
    if (cudaMemGetInfo(&free_b, &total_b) == cudaSuccess) s.total = total_b;
  }
#endif
  return s;
}

void EngineImpl::ResetPeakMemory() {
#ifdef MASKD_WITH_CUDA
  if (device_.is_cuda()) c10::cuda::CUDACachingAllocator::resetPeakStats(device_.index());
#endif
}

StatusOr<at::Device> ParseDevice(const std::string& name) {
  if (name == "cpu" || name.rfind("cpu:", 0) == 0) return at::Device(at::kCPU);
  if (name == "cuda" || name.rfind("cuda:", 0) == 0) {
    int index = 0;
    if (name.size() > 5) {
      try {
        index = std::stoi(name.substr(5));
      } catch (...) {
        return InvalidArgument("device '" + name + "' is not cpu, cuda or cuda:N");
      }
    }
    if (!torch::cuda::is_available())
      return InvalidArgument("device '" + name + "' requested but no CUDA device is available");
    if (index < 0 || index >= static_cast<int>(torch::cuda::device_count()))
      return InvalidArgument("device '" + name + "': only " + std::to_string(torch::cuda::device_count()) +
                             " CUDA device(s) visible");
    return at::Device(at::kCUDA, static_cast<c10::DeviceIndex>(index));
  }
  return InvalidArgument("device '" + name + "' is not cpu, cuda or cuda:N");
}

std::string WeightsDigest(const StateDict& sd) {
  // Over the tensors in name order, each framed with its name, dtype and shape: the same weights
  // give the same identity (and image_ids) whatever the container (.pth keeps file order,
  // safetensors does not) and however they are ordered in it.
  std::vector<const std::pair<std::string, at::Tensor>*> sorted;
  for (const auto& kv : sd) sorted.push_back(&kv);
  std::sort(sorted.begin(), sorted.end(),
            [](const auto* a, const auto* b) { return a->first < b->first; });
  XXH3_state_t* st = XXH3_createState();
  XXH3_128bits_reset(st);
  auto framed = [st](const void* p, uint64_t n) {
    XXH3_128bits_update(st, &n, sizeof n);
    XXH3_128bits_update(st, p, n);
  };
  for (const auto* kv : sorted) {
    const at::Tensor c = kv->second.contiguous();
    framed(kv->first.data(), kv->first.size());
    const std::string dtype = c10::toString(c.scalar_type());
    framed(dtype.data(), dtype.size());
    const std::vector<int64_t> shape = c.sizes().vec();
    framed(shape.data(), shape.size() * sizeof(int64_t));
    framed(c.data_ptr(), c.nbytes());
  }
  const XXH128_hash_t h = XXH3_128bits_digest(st);
  XXH3_freeState(st);
  return Hex(h.high64, h.low64);
}

}  // namespace

StatusOr<std::unique_ptr<Engine>> Engine::Create(const EngineOptions& options_in) {
  EngineOptions options = options_in;
  if (!options.log) options.log = DefaultLog;
  auto device = ParseDevice(options.device);
  if (!device.ok()) return device.status();
  return Guarded("creating the engine", [&]() -> StatusOr<std::unique_ptr<Engine>> {
    SamConfig config;
    StateDict sd;
    std::optional<Sam> model;
    if (options.checkpoint.empty()) {
      auto preset = SamPreset(options.random_arch);
      if (!preset.ok()) return preset.status();
      config = *preset;
      model.emplace(config);
      RandomizeWeights(**model, options.demo_seed);
      sd = ModelStateDict(**model);
      options.log(LogLevel::kWarning,
                  "NO CHECKPOINT GIVEN: serving " +
                      (options.random_arch == "tiny" ? std::string("the built-in demo model (small encoder, ")
                                                     : "a " + options.random_arch + " model (") +
                      "random weights, "
                  "seed " + std::to_string(options.demo_seed) + "). ITS MASKS ARE MEANINGLESS. Download an "
                  "official SAM checkpoint (vit_b: sam_vit_b_01ec64.pth, vit_l: sam_vit_l_0b3195.pth, "
                  "vit_h: sam_vit_h_4b8939.pth from "
                  "https://github.com/facebookresearch/segment-anything#model-checkpoints) and pass it with "
                  "--checkpoint, $MASKD_CHECKPOINT, or put it in ./models/.");
    } else {
      auto read = ReadStateDict(options.checkpoint);
      if (!read.ok()) return read.status();
      sd = std::move(*read);
      auto cfg = InferSamConfig(sd, options.checkpoint);
      if (!cfg.ok()) return cfg.status();
      config = *cfg;
      model.emplace(config);
      MASKD_RETURN_IF_ERROR(LoadStateDict(**model, sd, options.checkpoint));
    }
    uint64_t params = 0;
    for (const auto& p : (*model)->parameters()) params += static_cast<uint64_t>(p.numel());
    const std::string digest = WeightsDigest(sd);
    sd.clear();
    std::ostringstream os;
    os << "SAM " << config.arch << " (embed " << config.embed_dim << ", depth " << config.depth << ", heads "
       << config.num_heads << ", " << params << " parameters) from "
       << (options.checkpoint.empty() ? "random weights" : options.checkpoint) << " on "
       << device->str() << " in " << PrecisionName(options.precision);
    options.log(LogLevel::kInfo, os.str());
    auto engine = std::make_unique<EngineImpl>(options, config, *model, *device, digest, params);
    MASKD_RETURN_IF_ERROR(engine->Init());
    return std::unique_ptr<Engine>(std::move(engine));
  });
}

Status MakeRandomCheckpoint(const CheckpointSpec& spec, const std::string& path) {
  auto config = SamPreset(spec.arch);
  if (!config.ok()) return config.status();
  return Guarded("making a checkpoint", [&]() -> Status {
    torch::NoGradGuard no_grad;
    Sam model(*config);
    RandomizeWeights(*model, spec.seed);
    return WriteStateDict(ModelStateDict(*model), path);
  });
}

}  // namespace maskd
