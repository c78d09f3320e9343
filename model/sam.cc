#include "model/sam.h"

#include <ATen/ATen.h>
#include <torch/nn/modules/conv.h>
#include <torch/nn/modules/embedding.h>
#include <torch/nn/modules/normalization.h>
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
    // One NaN or inf weight makes every score NaN, silently: refuse the file instead.
    if (src.is_floating_point()) {
      const int64_t bad = src.numel() - at::isfinite(src).sum().item<int64_t>();
      if (bad > 0)
        return InvalidArgument(source + ": tensor '" + name + "' has " + std::to_string(bad) +
                               " NaN or infinite value(s) (expected finite weights)");
    }
    target.copy_(src);
  }
  return Status::Ok();
}

namespace {
bool EndsWith(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}
}  // namespace

void RandomizeWeights(torch::nn::Module& model, uint64_t seed) {
  torch::NoGradGuard no_grad;
  at::Generator gen = at::detail::createCPUGenerator(seed);
  // Which modules are norms and embeddings, by type rather than by name.
  std::set<std::string> norms, embeddings, transposed;
  for (const auto& m : model.named_modules("", /*include_self=*/false)) {
    const auto* mod = m.value().get();
    if (dynamic_cast<const torch::nn::LayerNormImpl*>(mod) || dynamic_cast<const LayerNorm2dImpl*>(mod))
      norms.insert(m.key() + ".weight");
    if (dynamic_cast<const torch::nn::EmbeddingImpl*>(mod)) embeddings.insert(m.key() + ".weight");
    if (dynamic_cast<const torch::nn::ConvTranspose2dImpl*>(mod)) transposed.insert(m.key() + ".weight");
  }
  for (auto& [name, t] : ModelStateDict(model)) {
    const at::Tensor r = at::randn(t.sizes(), gen, at::TensorOptions().dtype(at::kFloat));
    if (norms.count(name)) {
      t.copy_(1.0 + 0.1 * r);
    } else if (EndsWith(name, ".bias")) {
      t.copy_(0.02 * r);
    } else if (embeddings.count(name) || EndsWith(name, "positional_encoding_gaussian_matrix")) {
      t.copy_(r);  // nn.Embedding's and SAM's own N(0, 1) initialisation
    } else if (EndsWith(name, "pos_embed") || EndsWith(name, "rel_pos_h") || EndsWith(name, "rel_pos_w")) {
      t.copy_(0.2 * r);  // learned positional terms: non-zero, small against the activations
    } else {
      // Linear/conv weights ~ N(0, 1/fan_in) keep activations O(1) through the layers.
      // ConvTranspose2d weights are [in, out, k, k]: the fan-in is in * k * k / stride^2 ~ in.
      const int64_t fan_in = transposed.count(name) ? t.size(0) : t.numel() / t.size(0);
      t.copy_(r / std::sqrt(static_cast<double>(fan_in)));
    }
  }
}

}  // namespace maskd
