#include "model/sam.h"

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <c10/core/impl/LocalDispatchKeySet.h>
#include <torch/nn/modules/conv.h>
#include <torch/nn/modules/embedding.h>
#include <torch/nn/modules/normalization.h>
#include <torch/types.h>

#include <functional>
#include <map>
#include <set>
#include <sstream>

namespace maskd {

SamImpl::SamImpl(const SamConfig& c) : config(c) {
  image_encoder = register_module("image_encoder", ImageEncoderViT(c));
  prompt_encoder = register_module("prompt_encoder", PromptEncoder(c));
  mask_decoder = register_module("mask_decoder", MaskDecoder(c));
}

namespace {
// Runs the constructors with Meta among the thread's included dispatch keys. Factory functions
// (torch::empty, zeros, randn) still make CPU tensors: BackendSelect picks their kernel from the
// requested device. But the initialisers called on them (uniform_, normal_, fill_, zero_) then
// dispatch to the Meta backend, outranking CPU, whose kernels check shapes and leave the data
// alone. The thread's dispatch state is restored exactly afterwards (IncludeDispatchKeyGuard
// cannot be used: its set difference keeps the Meta backend bit, which then turns every later
// CPU op on this thread into a meta op).
class SkipInitialisers {
 public:
  SkipInitialisers() : saved_(c10::impl::tls_local_dispatch_key_set()) {
    c10::impl::LocalDispatchKeySet skip = saved_;
    skip.included_ = skip.included_ | c10::DispatchKeySet(c10::DispatchKey::Meta);
    c10::impl::_force_tls_local_dispatch_key_set(skip);
  }
  ~SkipInitialisers() { c10::impl::_force_tls_local_dispatch_key_set(saved_); }
  SkipInitialisers(const SkipInitialisers&) = delete;
  SkipInitialisers& operator=(const SkipInitialisers&) = delete;

 private:
  const c10::impl::LocalDispatchKeySet saved_;
};
}  // namespace

Sam MakeSamForLoading(const SamConfig& c) {
  SkipInitialisers skip;
  return Sam(c);
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

// Elements whose exponent bits are all ones (inf or NaN), in one parallel pass without the
// temporary bool tensor of at::isfinite (which for vit_h's 641 M weights is 641 MB of fresh pages).
template <typename Bits>
int64_t CountAllOnesExponent(const at::Tensor& t, Bits exponent) {
  const Bits* p = static_cast<const Bits*>(t.data_ptr());
  return at::parallel_reduce(
      int64_t{0}, t.numel(), int64_t{1} << 16, int64_t{0},
      [p, exponent](int64_t begin, int64_t end, int64_t acc) {
        for (int64_t i = begin; i < end; ++i) acc += (p[i] & exponent) == exponent;
        return acc;
      },
      std::plus<int64_t>());
}

int64_t NonFiniteCount(const at::Tensor& t) {
  if (t.device().is_cpu() && t.is_contiguous() && t.numel() > 0) {
    switch (t.scalar_type()) {
      case at::kFloat: return CountAllOnesExponent<uint32_t>(t, 0x7f800000u);
      case at::kDouble: return CountAllOnesExponent<uint64_t>(t, 0x7ff0000000000000ull);
      case at::kHalf: return CountAllOnesExponent<uint16_t>(t, 0x7c00);
      case at::kBFloat16: return CountAllOnesExponent<uint16_t>(t, 0x7f80);
      default: break;
    }
  }
  return t.numel() - at::isfinite(t).sum().item<int64_t>();
}

// Whether `src` can become `target`'s storage: what set_data needs, and alone in its storage so
// that no two model tensors share memory (a checkpoint may store views of one storage).
bool CanShare(const at::Tensor& target, const at::Tensor& src) {
  return src.device().is_cpu() && target.device().is_cpu() && src.layout() == at::kStrided &&
         src.scalar_type() == target.scalar_type() && src.is_contiguous() && src.storage_offset() == 0 &&
         src.storage().nbytes() == src.nbytes();
}
}  // namespace

Status LoadStateDict(torch::nn::Module& model, const StateDict& tensors, const std::string& source,
                     bool share_storage) {
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
      const int64_t bad = NonFiniteCount(src);
      if (bad > 0)
        return InvalidArgument(source + ": tensor '" + name + "' has " + std::to_string(bad) +
                               " NaN or infinite value(s) (expected finite weights)");
    }
  }
  for (auto& [name, target] : targets) {
    const at::Tensor& src = *given[name];
    if (share_storage && CanShare(target, src)) {
      target.set_data(src);
    } else {
      target.copy_(src);
    }
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
