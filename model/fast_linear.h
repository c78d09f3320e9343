// Linear layers of the image encoder with a replaceable forward: dense (LibTorch) or fp8 e4m3 with
// row-wise scales. (The int8 and 2:4-sparse replacements were retired after run 17: slower than bf16
// on H200, see BENCHMARKS.md.)
//
// The parameters stay in the torch::nn::Linear under their state_dict names; a FastLinear holds the
// derived (quantised) weights and is installed next to it.
#pragma once

#include <torch/nn/modules/linear.h>

#include <memory>
#include <string>

#include "kernels/kernels.h"

namespace maskd {

class FastLinear {
 public:
  virtual ~FastLinear() = default;
  // x: [..., in_features] -> [..., out_features] in x's dtype.
  virtual at::Tensor Forward(const at::Tensor& x) const = 0;
  // Forward(gelu(x)), erf GELU: a replacement that quantises its input may fold the GELU into that
  // pass (fp8) instead of a separate element-wise pass over the activation.
  virtual at::Tensor ForwardGelu(const at::Tensor& x) const { return Forward(at::gelu(x)); }
  // Whether the input may come already quantised, as e4m3 rows (kernels::AddLayerNormFp8 writes the
  // qkv / fc1 inputs so); then ForwardFp8Rows(x) [rows, out_features] = Forward of the dequantised x.
  virtual bool TakesFp8Rows() const { return false; }
  virtual at::Tensor ForwardFp8Rows(const kernels::Fp8Rows& x) const;
  virtual const char* name() const = 0;
};

// Builds an fp8 (e4m3, row-wise scales) replacement: weights quantised once here. Runs on CUDA
// (sm_90, bf16 activations); elsewhere it computes the dequantised reference (for tests).
std::shared_ptr<FastLinear> MakeFp8Linear(const torch::nn::Linear& linear);

// forward through the replacement when there is one.
inline at::Tensor LinearForward(torch::nn::Linear& linear,
                                const std::shared_ptr<FastLinear>& fast, const at::Tensor& x) {
  return fast ? fast->Forward(x) : linear->forward(x);
}

}  // namespace maskd
