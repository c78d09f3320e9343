// The whole SAM model: image encoder, prompt encoder and mask decoder under their official
// state_dict prefixes, with strict checkpoint loading.
#pragma once

#include <torch/nn/module.h>

#include "model/checkpoint.h"
#include "model/image_encoder.h"
#include "model/mask_decoder.h"
#include "model/prompt_encoder.h"
#include "model/sam_config.h"

namespace maskd {

// SAM's pixel normalisation (ImageNet statistics in 0..255 units).
inline const std::vector<float> kPixelMean = {123.675f, 116.28f, 103.53f};
inline const std::vector<float> kPixelStd = {58.395f, 57.12f, 57.375f};

struct SamImpl : torch::nn::Module {
  explicit SamImpl(const SamConfig& c);
  SamConfig config;
  ImageEncoderViT image_encoder{nullptr};
  PromptEncoder prompt_encoder{nullptr};
  MaskDecoder mask_decoder{nullptr};
};
TORCH_MODULE(Sam);

// The model with uninitialised weights: every parameter and buffer is allocated (untouched, so
// no memory is committed yet) but not filled. For loading a checkpoint, which overwrites every
// tensor anyway: LibTorch's Linear/Conv2d constructors draw one uniform number per weight on one
// thread (641 M for vit_h, seconds of start-up) and touch every page. Its values are garbage until
// LoadStateDict succeeds; a model whose load failed must be thrown away.
Sam MakeSamForLoading(const SamConfig& c);

// Copies `tensors` into the model. Strict: every parameter and buffer must be present with its
// exact shape and nothing else may be in the file; the error lists missing keys, unexpected keys and
// shape mismatches (name, expected, got). Floating-point tensors must be finite.
// With `share_storage`, a given tensor that is a contiguous CPU tensor of the model tensor's dtype
// and alone in its storage becomes that model tensor's storage (Tensor::set_data) instead of being
// copied: the model and `tensors` then share that memory, so the caller must not change it.
Status LoadStateDict(torch::nn::Module& model, const StateDict& tensors, const std::string& source,
                     bool share_storage = false);

// Every parameter and buffer of `model` by state_dict name.
StateDict ModelStateDict(const torch::nn::Module& model);

// Seeded random weights with a realistic scale (for the demo model and make-checkpoint): linear and
// conv weights ~ N(0, 1/fan_in), norms around 1, embeddings and rel-pos tables non-trivial.
void RandomizeWeights(torch::nn::Module& model, uint64_t seed);

}  // namespace maskd
