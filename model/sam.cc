#include "model/sam.h"

#include <ATen/ATen.h>
#include <torch/types.h>

#include <map>
#include <set>
#include <sstream>

namespace maskd {

SamImpl::SamImpl(const SamConfig& c) : config(c) {
  image_encoder = register_module("image_encoder", ImageEncoderViT(c));
  prompt_encoder = register_module("prompt_encoder", PromptEncoder(c));
  mask_decoder = register_module("mask_decoder", MaskDecoder(c));
}

StateDict ModelStateDict(const torch::nn::Module& model) {
  StateDict out;
  for (const auto& p : model.named_parameters(true)) out.emplace_back(p.key(), p.value());
  for (const auto& b : model.named_buffers(true)) out.emplace_back(b.key(), b.value());
  return out;
}

namespace {
std::string ShapeOf(const at::Tensor& t) {
  std::ostringstream os;
  os << t.sizes();
  return os.str();
}
}  // namespace

Status LoadStateDict(torch::nn::Module& model, const StateDict& tensors, const std::string& source) {
  std::map<std::string, const at::Tensor*> given;
  for (const auto& [n, t] : tensors) given[n] = &t;
  std::vector<std::string> missing, mismatched;
  std::set<std::string> expected;
  StateDict targets = ModelStateDict(model);
  for (const auto& [name, target] : targets) {
    expected.insert(name);
    auto it = given.find(name);
    if (it == given.end()) {
      missing.push_back(name);
    } else if (it->second->sizes() != target.sizes()) {
      mismatched.push_back(name + " (expected " + ShapeOf(target) + ", got " + ShapeOf(*it->second) + ")");
    }
  }
  std::vector<std::string> unexpected;
  for (const auto& [n, t] : tensors)
    if (!expected.count(n)) unexpected.push_back(n);
  if (!missing.empty() || !unexpected.empty() || !mismatched.empty()) {
    auto list = [](const std::vector<std::string>& v) {
      std::string s;
      for (size_t i = 0; i < v.size() && i < 8; ++i) s += (i ? ", " : "") + v[i];
      if (v.size() > 8) s += ", ... (" + std::to_string(v.size()) + " in all)";
      return s;
    };
    std::string msg = source + ": checkpoint does not match the SAM model inferred from it:";
    if (!missing.empty()) msg += " missing keys: " + list(missing) + ";";
    if (!unexpected.empty()) msg += " unexpected keys: " + list(unexpected) + ";";
    if (!mismatched.empty()) msg += " shape mismatch: " + list(mismatched) + ";";
    return InvalidArgument(msg);
  }
  torch::NoGradGuard no_grad;
  for (auto& [name, target] : targets) {
    const at::Tensor& src = *given[name];
    if (!src.is_floating_point() && target.is_floating_point())
      return InvalidArgument(source + ": '" + name + "' has non-float dtype " +
                             std::string(c10::toString(src.scalar_type())));
    target.copy_(src);
  }
  return Status::Ok();
}

void RandomizeWeights(torch::nn::Module& model, uint64_t seed) {
  torch::NoGradGuard no_grad;
  at::Generator gen = at::detail::createCPUGenerator(seed);
  for (auto& [name, t] : ModelStateDict(model)) {
    const bool is_bias = name.size() > 5 && name.compare(name.size() - 5, 5, ".bias") == 0;
    const bool is_norm = name.find("norm") != std::string::npos ||
                         name.find("neck.1") != std::string::npos || name.find("neck.3") != std::string::npos ||
                         name.find("output_upscaling.1") != std::string::npos ||
                         name.find("mask_downscaling.1") != std::string::npos ||
                         name.find("mask_downscaling.4") != std::string::npos;
    at::Tensor r = at::randn(t.sizes(), gen, at::TensorOptions().dtype(at::kFloat));
    if (is_norm && !is_bias) {
      t.copy_(1.0 + 0.1 * r);
    } else if (is_bias) {
      t.copy_(0.02 * r);
    } else if (t.dim() >= 2 && name.find("weight") != std::string::npos &&
               name.find("embed") == std::string::npos && name.find("token") == std::string::npos) {
      const int64_t fan_in = t.numel() / t.size(0);
      // ConvTranspose weights are [in, out, k, k]: fan_in is the input channels.
      const int64_t fan = name.find("output_upscaling") != std::string::npos ? t.size(0) : fan_in;
      t.copy_(r / std::sqrt(static_cast<double>(fan)));
    } else {
      t.copy_(0.5 * r);  // embeddings, tokens, pos_embed, rel-pos tables, the PE matrix
    }
  }
}

}  // namespace maskd
