#include "model/engine_handles.h"

#include <stdexcept>

namespace maskd {
namespace {

std::vector<float> ToFloatVector(const at::Tensor& tensor) {
  const at::Tensor t = tensor.to(at::kCPU, at::kFloat).contiguous();
  return std::vector<float>(t.data_ptr<float>(), t.data_ptr<float>() + t.numel());
}

template <typename T, typename P>
const T& Cast(const P* payload, const char* what) {
  const T* t = dynamic_cast<const T*>(payload);
  if (t == nullptr)
    throw std::invalid_argument(std::string(what) + " was made by another engine (expected one of this engine's)");
  return *t;
}

}  // namespace

std::vector<float> TorchEmbedding::ToFloat() const { return ToFloatVector(tensor); }
std::vector<float> TorchMaskLogits::ToFloat() const { return ToFloatVector(tensor); }

const TorchPreparedImage& PayloadOf(const PreparedImage& image) {
  return Cast<TorchPreparedImage>(image.payload(), "a prepared image");
}
const TorchEmbedding& PayloadOf(const Embedding& embedding) {
  return Cast<TorchEmbedding>(&embedding.payload(), "an embedding");
}
const TorchMaskLogits& PayloadOf(const MaskLogits& logits) {
  return Cast<TorchMaskLogits>(&logits.payload(), "mask logits");
}

}  // namespace maskd
