// SAM's prompt encoder (prompt_encoder.*): random Fourier positional encoding of points and box
// corners, learned point/corner/"not a point" embeddings, and the dense mask embedding.
//
// Prompts arrive flattened for jagged batching: every sparse token of every prompt in one list, with
// its coordinates (already transformed to the model's input frame) and a label:
//   -1 "not a point" padding (the one token the original appends to a point-only prompt),
//    0 background point, 1 foreground point, 2 box top-left corner, 3 box bottom-right corner.
// Each token's embedding depends only on itself, so the flat computation equals the original's
// per-prompt one.
#pragma once

#include <torch/nn/module.h>
#include <torch/nn/modules/container/modulelist.h>
#include <torch/nn/modules/container/sequential.h>
#include <torch/nn/modules/embedding.h>

#include "model/image_encoder.h"
#include "model/sam_config.h"

namespace maskd {

struct PositionEmbeddingRandomImpl : torch::nn::Module {
  explicit PositionEmbeddingRandomImpl(int64_t num_pos_feats);
  // coords in [0, 1]^2, [..., 2] -> [..., 2 * num_pos_feats] (fp32)
  at::Tensor Encode(const at::Tensor& coords) const;
  // The dense positional encoding of a (h, w) grid: [2 * num_pos_feats, h, w].
  at::Tensor Grid(int64_t h, int64_t w) const;
  // Coordinates in input pixels (x, y), normalised by the input image size (w, h).
  at::Tensor ForwardWithCoords(const at::Tensor& coords, int64_t input_h, int64_t input_w) const;
  at::Tensor positional_encoding_gaussian_matrix;
};
TORCH_MODULE(PositionEmbeddingRandom);

struct PromptEncoderImpl : torch::nn::Module {
  explicit PromptEncoderImpl(const SamConfig& c);

  // coords [K, 2] float32 in input-frame pixels (the original's +0.5 pixel-centre shift is applied
  // here), labels [K] int64 in {-1, 0, 1, 2, 3} -> token embeddings [K, embed_dim] (fp32).
  at::Tensor EmbedTokens(const at::Tensor& coords, const at::Tensor& labels) const;
  // masks [M, 1, 4*grid, 4*grid] -> [M, embed_dim, grid, grid]
  at::Tensor EmbedMasks(const at::Tensor& masks);
  // The "no mask" dense embedding, [1, embed_dim, 1, 1].
  at::Tensor NoMaskDense() const;
  // [1, embed_dim, grid, grid] (fp32), cached by the caller.
  at::Tensor DensePe() const;

  PositionEmbeddingRandom pe_layer{nullptr};
  torch::nn::ModuleList point_embeddings{nullptr};
  torch::nn::Embedding not_a_point_embed{nullptr};
  torch::nn::Sequential mask_downscaling{nullptr};
  torch::nn::Embedding no_mask_embed{nullptr};
  int64_t embed_dim, grid, input_size;
  std::vector<torch::nn::Embedding> point_embedding_list;
};
TORCH_MODULE(PromptEncoder);

}  // namespace maskd
