#include "model/mask_decoder.h"

#include <ATen/ATen.h>
#include <torch/nn/modules/activation.h>
#include <torch/nn/modules/conv.h>

#include <cmath>

#include "kernels/kernels.h"

namespace maskd {

DecoderAttentionImpl::DecoderAttentionImpl(int64_t dim, int64_t heads, int64_t downsample)
    : num_heads(heads) {
  const int64_t internal = dim / downsample;
  TORCH_CHECK(internal % heads == 0, "num_heads must divide the internal attention width");
  q_proj = register_module("q_proj", torch::nn::Linear(dim, internal));
  k_proj = register_module("k_proj", torch::nn::Linear(dim, internal));
  v_proj = register_module("v_proj", torch::nn::Linear(dim, internal));
  out_proj = register_module("out_proj", torch::nn::Linear(internal, dim));
}

at::Tensor DecoderAttentionImpl::forward(const at::Tensor& q_in, const at::Tensor& k_in,
                                         const at::Tensor& v_in) {
  auto separate = [this](const at::Tensor& x) {
    return x.reshape({x.size(0), x.size(1), num_heads, x.size(2) / num_heads}).transpose(1, 2);
  };
  const at::Tensor q = separate(q_proj->forward(q_in));
  const at::Tensor k = separate(k_proj->forward(k_in));
  const at::Tensor v = separate(v_proj->forward(v_in));
  return out_proj->forward(Attend(q, k, v));
}

at::Tensor DecoderAttentionImpl::Attend(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v) const {
  const int64_t n = q.size(0), l = q.size(2), internal = q.size(1) * q.size(3);
  const double root = std::sqrt(static_cast<double>(q.size(3)));
  if (few_query_kernel && kernels::FewQueryAttentionFits(q, k, v)) {
    // [N, L, H, C]: out_proj's input layout without the transpose.
    return kernels::FewQueryAttention(q, k, v, 1.0 / root).view({n, l, internal});
  }
  at::Tensor out;
  if (use_sdpa) {
    out = at::scaled_dot_product_attention(q, k, v);
  } else {
    // Divided, as the original: the fp32 golden parity is bit-for-bit where it can be.
    const at::Tensor attn = at::matmul(q, k.transpose(2, 3)) / root;
    out = at::matmul(at::softmax(attn, -1), v);
  }
  return out.transpose(1, 2).reshape({n, l, internal});
}

DecoderMlpImpl::DecoderMlpImpl(int64_t in, int64_t hidden, int64_t out, int64_t num_layers) {
  layers = register_module("layers", torch::nn::ModuleList());
  for (int64_t i = 0; i < num_layers; ++i) {
    torch::nn::Linear l(i == 0 ? in : hidden, i + 1 == num_layers ? out : hidden);
    layers->push_back(l);
    layer_list.push_back(l);
  }
}

at::Tensor DecoderMlpImpl::forward(const at::Tensor& x0) {
  at::Tensor x = x0;
  for (size_t i = 0; i < layer_list.size(); ++i) {
    x = layer_list[i]->forward(x);
    if (i + 1 < layer_list.size()) x = at::relu(x);
  }
  return x;
}

TransformerMlpImpl::TransformerMlpImpl(int64_t dim, int64_t hidden) {
  lin1 = register_module("lin1", torch::nn::Linear(dim, hidden));
  lin2 = register_module("lin2", torch::nn::Linear(hidden, dim));
}

at::Tensor TransformerMlpImpl::forward(const at::Tensor& x) { return lin2->forward(at::relu(lin1->forward(x))); }

TwoWayAttentionBlockImpl::TwoWayAttentionBlockImpl(int64_t dim, int64_t heads, int64_t mlp_dim,
                                                   bool skip_pe)
    : skip_first_layer_pe(skip_pe) {
  self_attn = register_module("self_attn", DecoderAttention(dim, heads));
  norm1 = register_module("norm1", torch::nn::LayerNorm(torch::nn::LayerNormOptions({dim})));
  cross_attn_token_to_image = register_module("cross_attn_token_to_image", DecoderAttention(dim, heads, 2));
  norm2 = register_module("norm2", torch::nn::LayerNorm(torch::nn::LayerNormOptions({dim})));
  mlp = register_module("mlp", TransformerMlp(dim, mlp_dim));
  norm3 = register_module("norm3", torch::nn::LayerNorm(torch::nn::LayerNormOptions({dim})));
  norm4 = register_module("norm4", torch::nn::LayerNorm(torch::nn::LayerNormOptions({dim})));
  cross_attn_image_to_token = register_module("cross_attn_image_to_token", DecoderAttention(dim, heads, 2));
}

void TwoWayAttentionBlockImpl::forward(at::Tensor& queries, at::Tensor& keys,
                                       const at::Tensor& query_pe, const at::Tensor& key_pe) {
  if (skip_first_layer_pe) {
    queries = self_attn->forward(queries, queries, queries);
  } else {
    const at::Tensor q = queries + query_pe;
    queries = queries + self_attn->forward(q, q, queries);
  }
  queries = norm1->forward(queries);
  at::Tensor q = queries + query_pe;
  at::Tensor k = keys + key_pe;
  queries = norm2->forward(queries + cross_attn_token_to_image->forward(q, k, keys));
  queries = norm3->forward(queries + mlp->forward(queries));
  q = queries + query_pe;
  k = keys + key_pe;
  keys = norm4->forward(keys + cross_attn_image_to_token->forward(k, q, queries));
}

TwoWayTransformerImpl::TwoWayTransformerImpl(int64_t depth, int64_t dim, int64_t heads, int64_t mlp_dim) {
  layers = register_module("layers", torch::nn::ModuleList());
  for (int64_t i = 0; i < depth; ++i) {
    TwoWayAttentionBlock b(dim, heads, mlp_dim, i == 0);
    layers->push_back(b);
    layer_list.push_back(b);
  }
  final_attn_token_to_image = register_module("final_attn_token_to_image", DecoderAttention(dim, heads, 2));
  norm_final_attn = register_module("norm_final_attn", torch::nn::LayerNorm(torch::nn::LayerNormOptions({dim})));
}

void TwoWayTransformerImpl::SetSdpa(bool on) {
  for (auto& l : layer_list) {
    l->self_attn->use_sdpa = on;
    l->cross_attn_token_to_image->use_sdpa = on;
    l->cross_attn_image_to_token->use_sdpa = on;
  }
  final_attn_token_to_image->use_sdpa = on;
}

void TwoWayTransformerImpl::SetFewQueryKernel(bool on) {
  for (auto& l : layer_list) {
    l->self_attn->few_query_kernel = on;
    l->cross_attn_token_to_image->few_query_kernel = on;
  }
  final_attn_token_to_image->few_query_kernel = on;
}

TwoWayTransformerImpl::Output TwoWayTransformerImpl::forward(const at::Tensor& image_embedding,
                                                             const at::Tensor& image_pe,
                                                             const at::Tensor& point_embedding) {
  at::Tensor keys = image_embedding.flatten(2).permute({0, 2, 1});
  const at::Tensor key_pe = image_pe.flatten(2).permute({0, 2, 1});
  at::Tensor queries = point_embedding;
  for (auto& l : layer_list) l->forward(queries, keys, point_embedding, key_pe);
  const at::Tensor q = queries + point_embedding;
  const at::Tensor k = keys + key_pe;
  queries = norm_final_attn->forward(queries + final_attn_token_to_image->forward(q, k, keys));
  return {queries, keys};
}

MaskDecoderImpl::MaskDecoderImpl(const SamConfig& c) : num_mask_tokens(c.num_multimask_outputs + 1) {
  const int64_t d = c.prompt_embed_dim;
  transformer = register_module(
      "transformer", TwoWayTransformer(c.transformer_depth, d, c.transformer_heads, c.transformer_mlp_dim));
  iou_token = register_module("iou_token", torch::nn::Embedding(1, d));
  mask_tokens = register_module("mask_tokens", torch::nn::Embedding(num_mask_tokens, d));
  output_upscaling = register_module(
      "output_upscaling",
      torch::nn::Sequential(
          torch::nn::ConvTranspose2d(torch::nn::ConvTranspose2dOptions(d, d / 4, 2).stride(2)),
          LayerNorm2d(d / 4), torch::nn::GELU(),
          torch::nn::ConvTranspose2d(torch::nn::ConvTranspose2dOptions(d / 4, d / 8, 2).stride(2)),
          torch::nn::GELU()));
  output_hypernetworks_mlps = register_module("output_hypernetworks_mlps", torch::nn::ModuleList());
  for (int64_t i = 0; i < num_mask_tokens; ++i) {
    DecoderMlp m(d, d, d / 8, 3);
    output_hypernetworks_mlps->push_back(m);
    hypernetwork_list.push_back(m);
  }
  iou_prediction_head = register_module(
      "iou_prediction_head", DecoderMlp(d, c.iou_head_hidden_dim, num_mask_tokens, c.iou_head_depth));
}

MaskDecoderImpl::Output MaskDecoderImpl::forward(const at::Tensor& src, const at::Tensor& pos_src,
                                                 const at::Tensor& sparse) {
  const int64_t B = sparse.size(0);
  const at::Tensor output_tokens = at::cat({iou_token->weight, mask_tokens->weight}, 0);
  const at::Tensor tokens =
      at::cat({output_tokens.unsqueeze(0).expand({B, -1, -1}), sparse.to(output_tokens.scalar_type())}, 1);
  const int64_t b = src.size(0), c = src.size(1), h = src.size(2), w = src.size(3);
  auto out = transformer->forward(src, pos_src, tokens);
  const at::Tensor iou_token_out = out.queries.select(1, 0);
  const at::Tensor mask_tokens_out = out.queries.slice(1, 1, 1 + num_mask_tokens);
  const at::Tensor keys_nhwc = out.keys.reshape({b, h, w, c});
  std::vector<at::Tensor> hyper;
  for (int64_t i = 0; i < num_mask_tokens; ++i)
    hyper.push_back(hypernetwork_list[i]->forward(mask_tokens_out.select(1, i)));
  const at::Tensor hyper_in = at::stack(hyper, 1);
  return {UpscaledMasks(keys_nhwc, hyper_in), iou_prediction_head->forward(iou_token_out)};
}

at::Tensor MaskDecoderImpl::UpscaledMasks(const at::Tensor& keys_nhwc, const at::Tensor& hyper_in) {
  const int64_t b = keys_nhwc.size(0);
  if (!matmul_upscaling) {
    // The original: NCHW transposed convolutions.
    const at::Tensor upscaled = output_upscaling->forward(keys_nhwc.permute({0, 3, 1, 2}).contiguous());
    const int64_t uc = upscaled.size(1), uh = upscaled.size(2), uw = upscaled.size(3);
    return at::matmul(hyper_in, upscaled.view({b, uc, uh * uw})).view({b, -1, uh, uw});
  }
  auto conv_t = [](const at::Tensor& x_nhwc, const torch::nn::ConvTranspose2dImpl& conv) {
    // x [B, H, W, Cin] -> [B, 2H, 2W, Cout]: out[b, 2y+dy, 2x+dx, o] = bias[o] + x[b, y, x, :] . W[:, o, dy, dx]
    const at::Tensor& w = conv.weight;  // [Cin, Cout, 2, 2]
    const int64_t B = x_nhwc.size(0), H = x_nhwc.size(1), W = x_nhwc.size(2), cin = w.size(0), cout = w.size(1);
    const at::Tensor wm = w.permute({0, 2, 3, 1}).reshape({cin, 4 * cout});  // columns (dy, dx, o)
    const at::Tensor bias = conv.bias.repeat({4});
    const at::Tensor y = at::addmm(bias, x_nhwc.reshape({-1, cin}), wm);  // [B*H*W, (dy, dx, o)]
    return y.view({B, H, W, 2, 2, cout}).permute({0, 1, 3, 2, 4, 5}).reshape({B, 2 * H, 2 * W, cout});
  };
  const auto conv1 = output_upscaling->ptr<torch::nn::ConvTranspose2dImpl>(0);
  const auto norm = output_upscaling->ptr<LayerNorm2dImpl>(1);
  const auto conv2 = output_upscaling->ptr<torch::nn::ConvTranspose2dImpl>(3);
  TORCH_CHECK(conv1 && norm && conv2, "unexpected output_upscaling layout");
  at::Tensor x = conv_t(keys_nhwc, *conv1);
  x = at::gelu(at::layer_norm(x, {x.size(3)}, norm->weight, norm->bias, norm->eps));
  x = at::gelu(conv_t(x, *conv2));
  const int64_t uh = x.size(1), uw = x.size(2), uc = x.size(3);
  // [B, HW, C] @ [B, C, masks] -> [B, HW, masks] -> [B, masks, H, W]
  return at::matmul(x.view({b, uh * uw, uc}), hyper_in.transpose(1, 2)).transpose(1, 2).reshape({b, -1, uh, uw});
}

}  // namespace maskd
