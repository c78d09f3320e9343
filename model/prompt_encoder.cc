#include "model/prompt_encoder.h"

#include <torch/nn/modules/activation.h>
#include <torch/nn/modules/conv.h>

#include <cmath>

namespace maskd {

PositionEmbeddingRandomImpl::PositionEmbeddingRandomImpl(int64_t num_pos_feats) {
  positional_encoding_gaussian_matrix =
      register_buffer("positional_encoding_gaussian_matrix", torch::randn({2, num_pos_feats}));
}

at::Tensor PositionEmbeddingRandomImpl::Encode(const at::Tensor& coords_in) const {
  const at::Tensor g = positional_encoding_gaussian_matrix.to(at::kFloat);
  at::Tensor coords = 2 * coords_in - 1;
  coords = at::matmul(coords, g);
  coords = 2 * M_PI * coords;
  return at::cat({at::sin(coords), at::cos(coords)}, -1);
}

at::Tensor PositionEmbeddingRandomImpl::Grid(int64_t h, int64_t w) const {
  const auto opts = at::TensorOptions().dtype(at::kFloat).device(positional_encoding_gaussian_matrix.device());
  const at::Tensor grid = at::ones({h, w}, opts);
  at::Tensor y_embed = grid.cumsum(0) - 0.5;
  at::Tensor x_embed = grid.cumsum(1) - 0.5;
  y_embed = y_embed / h;
  x_embed = x_embed / w;
  return Encode(at::stack({x_embed, y_embed}, -1)).permute({2, 0, 1});
}

at::Tensor PositionEmbeddingRandomImpl::ForwardWithCoords(const at::Tensor& coords_input,
                                                          int64_t input_h, int64_t input_w) const {
  at::Tensor coords = coords_input.clone();
  coords.select(-1, 0).div_(input_w);
  coords.select(-1, 1).div_(input_h);
  return Encode(coords.to(at::kFloat));
}

PromptEncoderImpl::PromptEncoderImpl(const SamConfig& c)
    : embed_dim(c.prompt_embed_dim), grid(c.grid_size()), input_size(c.img_size) {
  pe_layer = register_module("pe_layer", PositionEmbeddingRandom(embed_dim / 2));
  point_embeddings = register_module("point_embeddings", torch::nn::ModuleList());
  for (int i = 0; i < 4; ++i) {  // pos/neg point + 2 box corners
    torch::nn::Embedding e(1, embed_dim);
    point_embeddings->push_back(e);
    point_embedding_list.push_back(e);
  }
  not_a_point_embed = register_module("not_a_point_embed", torch::nn::Embedding(1, embed_dim));
  const int64_t mc = c.mask_in_chans;
  mask_downscaling = register_module(
      "mask_downscaling",
      torch::nn::Sequential(
          torch::nn::Conv2d(torch::nn::Conv2dOptions(1, mc / 4, 2).stride(2)), LayerNorm2d(mc / 4),
          torch::nn::GELU(), torch::nn::Conv2d(torch::nn::Conv2dOptions(mc / 4, mc, 2).stride(2)),
          LayerNorm2d(mc), torch::nn::GELU(), torch::nn::Conv2d(torch::nn::Conv2dOptions(mc, embed_dim, 1))));
  no_mask_embed = register_module("no_mask_embed", torch::nn::Embedding(1, embed_dim));
}

at::Tensor PromptEncoderImpl::EmbedTokens(const at::Tensor& coords, const at::Tensor& labels) const {
  const at::Tensor shifted = coords + 0.5;  // to the pixel centre
  at::Tensor pe = pe_layer->ForwardWithCoords(shifted, input_size, input_size);
  // Label embeddings, one row per label 0..3, plus "not a point" for -1 (whose PE is zeroed).
  std::vector<at::Tensor> rows;
  for (const auto& e : point_embedding_list) rows.push_back(e->weight.to(at::kFloat));
  const at::Tensor table = at::cat(rows, 0);  // [4, D]
  const at::Tensor is_pad = labels.eq(-1).unsqueeze(-1);
  const at::Tensor label_emb = at::embedding(table, labels.clamp_min(0));
  const at::Tensor pad_emb = not_a_point_embed->weight.to(at::kFloat).expand_as(pe);
  // Points: PE + label embedding; padding: 0 + not_a_point (the original zeroes, then adds).
  return at::where(is_pad, pad_emb, pe + label_emb);
}

at::Tensor PromptEncoderImpl::EmbedMasks(const at::Tensor& masks) { return mask_downscaling->forward(masks); }

at::Tensor PromptEncoderImpl::NoMaskDense() const { return no_mask_embed->weight.reshape({1, -1, 1, 1}); }

at::Tensor PromptEncoderImpl::DensePe() const { return pe_layer->Grid(grid, grid).unsqueeze(0); }

}  // namespace maskd
