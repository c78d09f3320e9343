// SAM's shape: the presets of the official release and inference from a checkpoint's tensors.
#pragma once

#include <string>
#include <vector>

#include "model/checkpoint.h"

namespace maskd {

struct SamConfig {
  std::string arch = "custom";  // vit_b | vit_l | vit_h | tiny | custom
  // Image encoder (ViT).
  int img_size = 1024;
  int patch_size = 16;
  int in_chans = 3;
  int embed_dim = 768;
  int depth = 12;
  int num_heads = 12;
  int mlp_dim = 3072;
  int out_chans = 256;
  int window_size = 14;
  std::vector<int> global_attn_indexes = {2, 5, 8, 11};
  bool use_rel_pos = true;
  // Prompt encoder / mask decoder (identical in every released SAM).
  int prompt_embed_dim = 256;
  int mask_in_chans = 16;
  int num_multimask_outputs = 3;
  int transformer_depth = 2;
  int transformer_mlp_dim = 2048;
  int transformer_heads = 8;
  int iou_head_depth = 3;
  int iou_head_hidden_dim = 256;

  int grid_size() const { return img_size / patch_size; }  // 64
  int low_res_size() const { return grid_size() * 4; }     // 256
};

// "vit_b", "vit_l", "vit_h", or "tiny" (the golden reference encoder: 96 wide, 4 deep, 2 heads,
// global attention at blocks 1 and 3).
StatusOr<SamConfig> SamPreset(const std::string& arch);

// Reads the shape from the tensors' shapes (depth, width, heads from the rel-pos tables, global
// blocks from their rel-pos length, window size, patch size, image size, MLP width), so any ViT SAM
// variant loads without code changes. Names the preset when the shape matches one.
StatusOr<SamConfig> InferSamConfig(const StateDict& tensors, const std::string& source);

}  // namespace maskd
