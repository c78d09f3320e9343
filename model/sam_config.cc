#include "model/sam_config.h"

#include <algorithm>
#include <map>

namespace maskd {
namespace {

const at::Tensor* Find(const StateDict& sd, const std::string& name) {
  for (auto& [n, t] : sd)
    if (n == name) return &t;
  return nullptr;
}

std::string Shape(const at::Tensor& t) {
  std::string s = "[";
  for (int64_t i = 0; i < t.dim(); ++i) s += (i ? ", " : "") + std::to_string(t.size(i));
  return s + "]";
}

bool SameEncoder(const SamConfig& a, const SamConfig& b) {
  return a.embed_dim == b.embed_dim && a.depth == b.depth && a.num_heads == b.num_heads &&
         a.global_attn_indexes == b.global_attn_indexes && a.window_size == b.window_size &&
         a.patch_size == b.patch_size && a.img_size == b.img_size && a.mlp_dim == b.mlp_dim &&
         a.out_chans == b.out_chans;
}

}  // namespace

StatusOr<SamConfig> SamPreset(const std::string& arch) {
  SamConfig c;
  c.arch = arch;
  if (arch == "vit_b") {
    c.embed_dim = 768, c.depth = 12, c.num_heads = 12, c.global_attn_indexes = {2, 5, 8, 11};
  } else if (arch == "vit_l") {
    c.embed_dim = 1024, c.depth = 24, c.num_heads = 16, c.global_attn_indexes = {5, 11, 17, 23};
  } else if (arch == "vit_h") {
    c.embed_dim = 1280, c.depth = 32, c.num_heads = 16, c.global_attn_indexes = {7, 15, 23, 31};
  } else if (arch == "tiny") {
    c.embed_dim = 96, c.depth = 4, c.num_heads = 2, c.global_attn_indexes = {1, 3};
  } else {
    return InvalidArgument("unknown SAM architecture '" + arch +
                           "' (expected vit_b, vit_l, vit_h or tiny)");
  }
  c.mlp_dim = 4 * c.embed_dim;
  return c;
}

StatusOr<SamConfig> InferSamConfig(const StateDict& sd, const std::string& source) {
  auto need = [&](const std::string& name, int64_t dims) -> StatusOr<const at::Tensor*> {
    const at::Tensor* t = Find(sd, name);
    if (!t) return InvalidArgument(source + ": missing key '" + name + "' (not a SAM checkpoint?)");
    if (t->dim() != dims)
      return InvalidArgument(source + ": '" + name + "' has shape " + Shape(*t) + ", expected " +
                             std::to_string(dims) + " dimensions");
    return t;
  };
  SamConfig c;
  auto patch = need("image_encoder.patch_embed.proj.weight", 4);
  if (!patch.ok()) return patch.status();
  c.embed_dim = static_cast<int>((*patch)->size(0));
  c.in_chans = static_cast<int>((*patch)->size(1));
  c.patch_size = static_cast<int>((*patch)->size(2));
  auto pos = need("image_encoder.pos_embed", 4);
  if (!pos.ok()) return pos.status();
  c.img_size = static_cast<int>((*pos)->size(1)) * c.patch_size;
  if ((*pos)->size(3) != c.embed_dim)
    return InvalidArgument(source + ": 'image_encoder.pos_embed' has shape " + Shape(**pos) +
                           ", expected its last dimension to be the patch embedding width " +
                           std::to_string(c.embed_dim));
  c.depth = 0;
  while (Find(sd, "image_encoder.blocks." + std::to_string(c.depth) + ".attn.qkv.weight")) ++c.depth;
  if (c.depth == 0) return InvalidArgument(source + ": no image_encoder.blocks.N found");
  const int grid = c.img_size / c.patch_size;
  c.global_attn_indexes.clear();
  int window = 0;
  int head_dim = 0;
  for (int i = 0; i < c.depth; ++i) {
    const std::string name = "image_encoder.blocks." + std::to_string(i) + ".attn.rel_pos_h";
    const at::Tensor* rel = Find(sd, name);
    if (!rel) {
      c.use_rel_pos = false;
      continue;
    }
    if (rel->dim() != 2) return InvalidArgument(source + ": '" + name + "' has shape " + Shape(*rel));
    head_dim = static_cast<int>(rel->size(1));
    const int size = static_cast<int>((rel->size(0) + 1) / 2);
    if (size == grid) {
      c.global_attn_indexes.push_back(i);
    } else {
      window = size;
    }
  }
  if (c.use_rel_pos && head_dim > 0) {
    if (c.embed_dim % head_dim)
      return InvalidArgument(source + ": rel-pos head width " + std::to_string(head_dim) +
                             " does not divide the embedding width " + std::to_string(c.embed_dim));
    c.num_heads = c.embed_dim / head_dim;
  } else {
    return InvalidArgument(source + ": checkpoints without relative position tables are not supported "
                                    "(every released SAM has them)");
  }
  c.window_size = window > 0 ? window : 14;
  if (window == 0 && static_cast<int>(c.global_attn_indexes.size()) != c.depth)
    return InvalidArgument(source + ": cannot infer the attention window size");
  auto lin1 = need("image_encoder.blocks.0.mlp.lin1.weight", 2);
  if (!lin1.ok()) return lin1.status();
  c.mlp_dim = static_cast<int>((*lin1)->size(0));
  auto neck = need("image_encoder.neck.0.weight", 4);
  if (!neck.ok()) return neck.status();
  c.out_chans = static_cast<int>((*neck)->size(0));
  auto pe = need("prompt_encoder.pe_layer.positional_encoding_gaussian_matrix", 2);
  if (!pe.ok()) return pe.status();
  c.prompt_embed_dim = static_cast<int>((*pe)->size(1)) * 2;
  if (c.out_chans != c.prompt_embed_dim)
    return InvalidArgument(source + ": image embedding width " + std::to_string(c.out_chans) +
                           " differs from the prompt embedding width " +
                           std::to_string(c.prompt_embed_dim));
  auto mask_tokens = need("mask_decoder.mask_tokens.weight", 2);
  if (!mask_tokens.ok()) return mask_tokens.status();
  c.num_multimask_outputs = static_cast<int>((*mask_tokens)->size(0)) - 1;
  c.transformer_depth = 0;
  while (Find(sd, "mask_decoder.transformer.layers." + std::to_string(c.transformer_depth) +
                      ".norm1.weight"))
    ++c.transformer_depth;
  auto tmlp = need("mask_decoder.transformer.layers.0.mlp.lin1.weight", 2);
  if (!tmlp.ok()) return tmlp.status();
  c.transformer_mlp_dim = static_cast<int>((*tmlp)->size(0));
  auto md = need("prompt_encoder.mask_downscaling.3.weight", 4);
  if (!md.ok()) return md.status();
  c.mask_in_chans = static_cast<int>((*md)->size(0));

  c.arch = "custom";
  for (const char* preset : {"vit_b", "vit_l", "vit_h", "tiny"}) {
    auto p = SamPreset(preset);
    if (SameEncoder(*p, c)) c.arch = preset;
  }
  return c;
}

}  // namespace maskd
