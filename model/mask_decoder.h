// SAM's mask decoder (mask_decoder.*): a two-way transformer between prompt tokens and the image
// embedding, transposed-convolution upscaling, hypernetwork MLPs producing one mask per mask token,
// and the IoU prediction head. Every operation is per batch row, so a batch of prompts decodes to
// exactly the per-prompt results (the batch must share one token count: the decoder attends over
// all tokens with no mask).
#pragma once

#include <torch/nn/module.h>
#include <torch/nn/modules/container/modulelist.h>
#include <torch/nn/modules/container/sequential.h>
#include <torch/nn/modules/embedding.h>
#include <torch/nn/modules/linear.h>
#include <torch/nn/modules/normalization.h>

#include "model/image_encoder.h"
#include "model/sam_config.h"

namespace maskd {

// Attention with down-projection (SAM's decoder Attention): q/k/v projections to
// embedding_dim / downsample_rate, heads, out projection.
struct DecoderAttentionImpl : torch::nn::Module {
  DecoderAttentionImpl(int64_t embedding_dim, int64_t num_heads, int64_t downsample_rate = 1);
  at::Tensor forward(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v);
  // The heads' attention of projected q [N, H, L, C], k / v [N, H, S, C] (views allowed), as
  // out_proj's input [N, L, H * C], by the choice below (also SharedImageDecoder's).
  at::Tensor Attend(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v) const;
  torch::nn::Linear q_proj{nullptr}, k_proj{nullptr}, v_proj{nullptr}, out_proj{nullptr};
  int64_t num_heads;
  // The original's materialised softmax(q k^T / sqrt(d)) v, or SDPA.
  bool use_sdpa = false;
  // kernels::FewQueryAttention where it fits (CUDA, bf16/fp16, <= 16 queries: the token side's
  // attentions), else the above.
  bool few_query_kernel = false;
};
TORCH_MODULE(DecoderAttention);

// MLP with ReLU between layers (the transformer's MLPBlock uses lin1/lin2; the heads use layers.N).
struct DecoderMlpImpl : torch::nn::Module {
  DecoderMlpImpl(int64_t in, int64_t hidden, int64_t out, int64_t num_layers);
  at::Tensor forward(const at::Tensor& x);
  torch::nn::ModuleList layers{nullptr};
  std::vector<torch::nn::Linear> layer_list;
};
TORCH_MODULE(DecoderMlp);

struct TransformerMlpImpl : torch::nn::Module {
  TransformerMlpImpl(int64_t dim, int64_t hidden);
  at::Tensor forward(const at::Tensor& x);
  torch::nn::Linear lin1{nullptr}, lin2{nullptr};
};
TORCH_MODULE(TransformerMlp);

struct TwoWayAttentionBlockImpl : torch::nn::Module {
  TwoWayAttentionBlockImpl(int64_t dim, int64_t heads, int64_t mlp_dim, bool skip_first_layer_pe);
  // queries [B, T, D], keys [B, HW, D]; updates both.
  void forward(at::Tensor& queries, at::Tensor& keys, const at::Tensor& query_pe, const at::Tensor& key_pe);
  DecoderAttention self_attn{nullptr}, cross_attn_token_to_image{nullptr}, cross_attn_image_to_token{nullptr};
  torch::nn::LayerNorm norm1{nullptr}, norm2{nullptr}, norm3{nullptr}, norm4{nullptr};
  TransformerMlp mlp{nullptr};
  bool skip_first_layer_pe;
};
TORCH_MODULE(TwoWayAttentionBlock);

struct TwoWayTransformerImpl : torch::nn::Module {
  TwoWayTransformerImpl(int64_t depth, int64_t dim, int64_t heads, int64_t mlp_dim);
  struct Output {
    at::Tensor queries;  // [B, T, D]
    at::Tensor keys;     // [B, HW, D]
  };
  // image_embedding / image_pe [B, D, h, w], point_embedding [B, T, D]
  Output forward(const at::Tensor& image_embedding, const at::Tensor& image_pe,
                 const at::Tensor& point_embedding);
  void SetSdpa(bool on);
  // DecoderAttentionImpl::few_query_kernel of the attentions whose queries are the tokens.
  void SetFewQueryKernel(bool on);
  torch::nn::ModuleList layers{nullptr};
  std::vector<TwoWayAttentionBlock> layer_list;
  DecoderAttention final_attn_token_to_image{nullptr};
  torch::nn::LayerNorm norm_final_attn{nullptr};
};
TORCH_MODULE(TwoWayTransformer);

struct MaskDecoderImpl : torch::nn::Module {
  explicit MaskDecoderImpl(const SamConfig& c);
  struct Output {
    at::Tensor masks;            // [B, num_mask_tokens, 4h, 4w] low-res logits, all tokens
    at::Tensor iou_predictions;  // [B, num_mask_tokens]
  };
  // src: per-prompt image embedding + dense prompt embedding [B, D, h, w]; pos_src [B or 1, D, h, w];
  // sparse [B, T, D]. Returns all mask tokens; the caller selects (multimask: 1..3, else 0).
  Output forward(const at::Tensor& src, const at::Tensor& pos_src, const at::Tensor& sparse);

  TwoWayTransformer transformer{nullptr};
  torch::nn::Embedding iou_token{nullptr}, mask_tokens{nullptr};
  torch::nn::Sequential output_upscaling{nullptr};
  torch::nn::ModuleList output_hypernetworks_mlps{nullptr};
  std::vector<DecoderMlp> hypernetwork_list;
  DecoderMlp iou_prediction_head{nullptr};
  int64_t num_mask_tokens;
  // Compute the two 2x2-stride transposed convolutions of the upscaling as channels-last matmuls
  // (each output pixel of a k=2, s=2 transposed convolution is one input pixel times a weight slice),
  // with the hypernetwork product on the channels-last result: the same arithmetic as cuDNN's
  // transposed convolution up to summation order, without its slow kernels.
  bool matmul_upscaling = false;

 private:
  at::Tensor UpscaledMasks(const at::Tensor& keys_nhwc, const at::Tensor& hyper_in);
};
TORCH_MODULE(MaskDecoder);

}  // namespace maskd
