// The real engine's handle payloads: LibTorch tensors behind the api's opaque handles. Only
// model/engine*.cc include this; a handle whose payload is not one of these (another engine's) is
// refused with an exception that the calling Engine method turns into a Status.
#pragma once

#include <ATen/ATen.h>

#include <memory>
#include <vector>

#include "model/api/engine.h"

namespace maskd {

struct TorchPreparedImage final : HandlePayload {
  at::Tensor input;  // [3, S, S] normalised and padded, engine dtype, engine device
};

struct TorchEmbedding final : Embedding::Payload {
  at::Tensor tensor;       // [C, h, w]
  bool host_tier = false;  // moved off a CUDA device by ToHost

  size_t bytes() const override { return tensor.nbytes(); }
  bool on_host() const override { return host_tier; }
  std::vector<float> ToFloat() const override;
  std::vector<int64_t> shape() const override { return tensor.sizes().vec(); }
};

struct TorchMaskLogits final : MaskLogits::Payload {
  at::Tensor tensor;  // [N, 256, 256]

  int num_masks() const override { return static_cast<int>(tensor.size(0)); }
  int height() const override { return static_cast<int>(tensor.size(1)); }
  int width() const override { return static_cast<int>(tensor.size(2)); }
  size_t bytes() const override { return tensor.nbytes(); }
  std::vector<float> ToFloat() const override;
};

// The payloads of handles this engine made; throws std::invalid_argument for a foreign handle.
const TorchPreparedImage& PayloadOf(const PreparedImage& image);
const TorchEmbedding& PayloadOf(const Embedding& embedding);
const TorchMaskLogits& PayloadOf(const MaskLogits& logits);

inline std::shared_ptr<const Embedding> WrapEmbedding(const ImageGeometry& g, at::Tensor tensor,
                                                      bool host_tier = false) {
  auto p = std::make_shared<TorchEmbedding>();
  p->tensor = std::move(tensor);
  p->host_tier = host_tier;
  return std::make_shared<const Embedding>(g, std::move(p));
}

inline std::shared_ptr<const MaskLogits> WrapMaskLogits(at::Tensor tensor) {
  auto p = std::make_shared<TorchMaskLogits>();
  p->tensor = std::move(tensor);
  return std::make_shared<const MaskLogits>(std::move(p));
}

}  // namespace maskd
