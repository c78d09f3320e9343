// The fast-path policy of EngineImpl, one function: which attention the encoder uses (the fused
// kernel where it applies: CUDA, bf16/fp16 and the head widths it was written for; SDPA with rel-pos
// folded elsewhere on CUDA; the original's arithmetic on CPU and in fp32, where parity matters more
// than speed), the fused encoder element-wise kernels, the fc1 GELU epilogue (CUDA only; the
// epilogue never in fp32), the residual adds in the GEMM epilogues and the GEMM algorithm timing,
// the global blocks' attention chosen per batch size by timing, the decoder's SDPA in reduced
// precision, the shared-image decoder, fp8 linears (CUDA only, opt-in, they trade accuracy),
// GPU pre/post-processing, the encoder batch sizes and their CUDA graphs.
#include "model/engine_impl.h"

#include <algorithm>
#include <cstdio>
#include <vector>

#include "kernels/kernels.h"
#include "model/fast_linear.h"

namespace maskd {

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
  const bool rel_in_kernel = cuda && f.fuse_encoder_ops && f.rel_pos_in_kernel && attn == AttentionImpl::kFused;
  const bool windows_in_kernel = rel_in_kernel && f.windows_in_kernel;
  const bool residual_in_gemm = cuda && f.fuse_encoder_ops && f.residual_in_gemm;
  sam_->image_encoder->SetFusion(cuda && f.fuse_encoder_ops, gelu, rel_in_kernel, windows_in_kernel,
                                 residual_in_gemm);
  if (cuda && f.fuse_encoder_ops) optimisations_.push_back("fused-encoder-ops");
  if (gelu) optimisations_.push_back("gelu-epilogue");
  if (rel_in_kernel) optimisations_.push_back("rel-pos-in-kernel");
  if (windows_in_kernel) optimisations_.push_back("windows-in-kernel");
  if (residual_in_gemm) optimisations_.push_back("residual-in-gemm-epilogue");
  if (cuda) {
    kernels::SetGemmTuning(f.gemm_tuning);
    if (f.gemm_tuning) optimisations_.push_back("gemm-algorithms-timed");
  }
  for (auto& b : sam_->image_encoder->block_list) {
    b->attn->fold_pad_v = !cuda;
    b->attn->folded_batches.clear();
  }
  if (attn != AttentionImpl::kMath) optimisations_.push_back(AttentionImplName(attn));
  // Run 17 (H200, vit_b): a click 0.69 -> 0.60 ms (masks thresholded), 0.93 -> 0.87 ms with RLE;
  // 64 prompts 3.43 -> 3.38 ms.
  const bool few_query = cuda && f.decoder_attention_kernel && options_.precision != Precision::kFloat32;
  sam_->mask_decoder->transformer->SetFewQueryKernel(few_query);
  if (few_query) optimisations_.push_back("decoder-few-query-attention");
  if (cuda && options_.precision != Precision::kFloat32) {
    sam_->mask_decoder->transformer->SetSdpa(true);
    sam_->mask_decoder->matmul_upscaling = true;
    // Static shapes (per batch and bucket): let cuDNN pick its fastest kernels once per shape.
    at::globalContext().setBenchmarkCuDNN(true);
  }
  if (f.fp8 && !cuda) {
    Log(LogLevel::kWarning, "fp8 linears are CUDA-only; ignored on " + device_.str());
  } else if (f.fp8) {
    if (options_.precision != Precision::kBFloat16)
      return InvalidArgument(std::string("fp8 linears need precision bf16 (their GEMM writes bf16), not ") +
                             PrecisionName(options_.precision));
    for (auto& b : sam_->image_encoder->block_list) {
      b->attn->qkv_fast = MakeFp8Linear(b->attn->qkv);
      b->attn->proj_fast = MakeFp8Linear(b->attn->proj);
      b->mlp->lin1_fast = MakeFp8Linear(b->mlp->lin1);
      b->mlp->lin2_fast = MakeFp8Linear(b->mlp->lin2);
    }
    optimisations_.push_back("fp8-e4m3-linears");
  }
  shared_dec_.reset();
  if (f.shared_image_decoder) {
    shared_dec_ = std::make_unique<SharedImageDecoder>(*sam_->mask_decoder, dense_pe_);
    optimisations_.push_back("shared-image-decoder");
  }
  gpu_pre_ = cuda && f.gpu_preprocess;
  gpu_post_ = cuda && f.gpu_postprocess;
  gpu_rle_string_ = gpu_post_ && f.gpu_rle_string;
  if (gpu_pre_) optimisations_.push_back("gpu-preprocess");
  if (gpu_post_) optimisations_.push_back("gpu-postprocess-rle");
  if (gpu_rle_string_) optimisations_.push_back("gpu-rle-string");
  decoder_priority_ = cuda && f.decoder_priority;
  if (decoder_priority_) optimisations_.push_back("decoder-priority");
  auto& sizes = options_.encoder_batch_sizes;
  if (sizes.empty()) sizes = {1};
  std::sort(sizes.begin(), sizes.end());
  sizes.erase(std::unique(sizes.begin(), sizes.end()), sizes.end());
  if (sizes.front() < 1) return InvalidArgument("encoder batch sizes must be >= 1");
  if (cuda && f.attention_timing && attn == AttentionImpl::kFused) {
    // Before the graphs: each size's capture records the way chosen for it.
    MASKD_RETURN_IF_ERROR(ChooseGlobalAttention());
    optimisations_.push_back("global-attention-timed");
  }
  if (cuda && f.cuda_graphs) {
    const size_t tuned_before = kernels::GemmTunings().size();
    MASKD_RETURN_IF_ERROR(CaptureEncoderGraphs());
    optimisations_.push_back("cuda-graphs");
    // The GEMM timing is part of the graphs' warm-up passes: say what it cost and what it chose.
    const std::vector<kernels::GemmTuning> tuned = kernels::GemmTunings();
    if (tuned.size() > tuned_before) {
      double wall_ms = 0, first_ms = 0, chosen_ms = 0;
      int moved = 0;
      for (size_t i = tuned_before; i < tuned.size(); ++i) {
        wall_ms += tuned[i].tuning_ms;
        first_ms += tuned[i].first_ms;
        chosen_ms += tuned[i].chosen_ms;
        moved += tuned[i].chosen != 0;
      }
      char line[256];
      std::snprintf(line, sizeof(line),
                    "GEMM algorithms timed for %zu encoder shapes in %.0f ms: %d differ from the heuristic's "
                    "first, one pass of them %.2f ms instead of %.2f",
                    tuned.size() - tuned_before, wall_ms, moved, chosen_ms, first_ms);
      Log(LogLevel::kInfo, line);
    }
  }
  return Status::Ok();
}

}  // namespace maskd
