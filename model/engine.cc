// EngineImpl's lifecycle (see model/engine_impl.h for the other jobs): construction and Init,
// Reconfigure, warm-up, the identity, cache-tier moves, mask-logit uploads and memory stats.
#include "model/engine_impl.h"

#include <chrono>
#include <cstdio>
#include <sstream>

#include <xxhash.h>

#include "kernels/kernels.h"

namespace maskd {

std::string EngineImpl::Identity() const {
  // Cache keys depend on the weights and on everything that changes the embedding's numerics.
  std::ostringstream os;
  // "int8=0|sparse=0|pruned-dense=0" stand for the retired int8 and 2:4 options (always off now):
  // kept so the identities of the remaining configurations, and the embeddings exported under them,
  // stay what they were.
  os << weights_digest_ << "|" << PrecisionName(options_.precision) << "|int8=0|sparse=0|pruned-dense=0"
     << "|fp8=" << options_.fast.fp8 << "|gelu-epilogue=" << sam_->image_encoder->gelu_epilogue;
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
      decoder_graph_inputs_.clear();
      // The pool goes with its last graph; a new capture needs a new handle.
      decoder_pool_.reset();
    }
#endif
    MASKD_RETURN_IF_ERROR(PrepareFastPath());
    MASKD_RETURN_IF_ERROR(ResetEncoderCosts());
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
    const auto t0 = std::chrono::steady_clock::now();
    auto since = [](std::chrono::steady_clock::time_point t) {
      char buf[32];
      std::snprintf(buf, sizeof buf, "%.2f s",
                    std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count());
      return std::string(buf);
    };
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
    const std::string placed = since(t0);
    const auto t1 = std::chrono::steady_clock::now();
    sam_->image_encoder->Prepare();
    MASKD_RETURN_IF_ERROR(PrepareFastPath());
    Log(LogLevel::kInfo, "weights placed on " + device_.str() + " in " + PrecisionName(options_.precision) +
                             " in " + placed + ", tables and fast path prepared in " + since(t1));
    MASKD_RETURN_IF_ERROR(ResetEncoderCosts());
    if (options_.on_startup_phase) options_.on_startup_phase(StartupPhase::kWeightsReady);
    if (options_.warmup) MASKD_RETURN_IF_ERROR(Warmup());
    if (options_.on_startup_phase) options_.on_startup_phase(StartupPhase::kWarmedUp);
    return Status::Ok();
  });
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
  MASKD_RETURN_IF_ERROR(MeasureEncoderCosts());
  Log(LogLevel::kInfo, "warm-up done on " + device_.str());
  return Status::Ok();
}


StatusOr<std::shared_ptr<const Embedding>> EngineImpl::ToHost(const Embedding& e) {
  return Guarded("moving an embedding to host memory", [&]() -> StatusOr<std::shared_ptr<const Embedding>> {
    const TorchEmbedding& src = PayloadOf(e);
    if (src.tensor.is_cpu()) return WrapEmbedding(e.geometry(), src.tensor, src.host_tier);
    CallStream cs(device_);
    at::Tensor host = at::empty(src.tensor.sizes(),
                                src.tensor.options().device(at::kCPU).pinned_memory(device_.is_cuda()));
    host.copy_(src.tensor);
    cs.Sync();
    return WrapEmbedding(e.geometry(), host, /*host_tier=*/true);
  });
}

StatusOr<std::shared_ptr<const Embedding>> EngineImpl::ToDevice(const Embedding& e) {
  return Guarded("moving an embedding to the device", [&]() -> StatusOr<std::shared_ptr<const Embedding>> {
    at::Tensor tensor = PayloadOf(e).tensor;
    if (tensor.device() != device_) {
      CallStream cs(device_);
      tensor = tensor.to(device_);
      cs.Sync();
    }
    return WrapEmbedding(e.geometry(), tensor);
  });
}

// The wire layout is little-endian; a host tensor's bytes are the host's order.
static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "ExportEmbedding copies host-order bytes");

StatusOr<ExportedEmbedding> EngineImpl::ExportEmbedding(const Embedding& e, Precision dtype) {
  return Guarded("exporting an embedding as " + std::string(PrecisionName(dtype)), [&]() -> StatusOr<ExportedEmbedding> {
    const TorchEmbedding& src = PayloadOf(e);
    CallStream cs(src.tensor.is_cuda() ? src.tensor.device() : device_);
    // Converted where it lives (a 16-bit export moves half the bytes over PCIe). bf16 <-> fp16 goes
    // through fp32 so that both 16-bit results are the rounding of the fp32 value.
    at::Tensor t = src.tensor;
    const at::ScalarType want = DtypeOf(dtype);
    if (t.scalar_type() != want && t.scalar_type() != at::kFloat && want != at::kFloat) {
      t = t.to(at::kFloat);
    }
    t = t.to(want).contiguous();
    ExportedEmbedding out;
    out.dtype = dtype;
    out.shape = t.sizes().vec();
    out.shape.insert(out.shape.begin(), 1);  // [1, C, h, w], SamPredictor.features
    out.data.resize(t.nbytes());
    at::Tensor host = at::from_blob(out.data.data(), t.sizes(), t.options().device(at::kCPU));
    host.copy_(t);  // one device-to-host copy (synchronous from pageable memory)
    cs.Sync();
    return out;
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
    // copy=true: on a CPU fp32 engine .to() would otherwise return the caller's buffer itself.
    at::Tensor tensor = at::from_blob(const_cast<float*>(v), {1, h, w}, at::kFloat)
                            .to(device_, dtype_, /*non_blocking=*/false, /*copy=*/true);
    cs.Sync();
    return WrapMaskLogits(tensor);
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

}  // namespace maskd
