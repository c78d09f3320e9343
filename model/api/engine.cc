#include "model/api/engine.h"

namespace maskd {

FastPathOptions FastPathOptions::Fast() {
  FastPathOptions f;
  f.attention = AttentionImpl::kAuto;
  f.cuda_graphs = true;
  f.gpu_preprocess = true;
  f.gpu_postprocess = true;
  f.gpu_rle_string = true;
  f.fuse_encoder_ops = true;
  f.gelu_epilogue = true;
  f.shared_image_decoder = true;
  f.decoder_attention_kernel = true;
  f.rel_pos_in_kernel = true;
  f.windows_in_kernel = true;
  f.residual_in_gemm = true;
  f.gemm_tuning = true;
  f.attention_timing = true;
  return f;
}

StatusOr<std::vector<DecodedPrompt>> Engine::Decode(const std::vector<DecodeItem>& items) {
  StatusOr<std::vector<StatusOr<DecodedPrompt>>> each = DecodeEach(items);
  if (!each.ok()) return each.status();
  std::vector<DecodedPrompt> out;
  out.reserve(each->size());
  for (auto& r : *each) {
    if (!r.ok()) return r.status();
    out.push_back(std::move(*r));
  }
  return out;
}

}  // namespace maskd
