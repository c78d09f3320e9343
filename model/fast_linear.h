// Linear layers of the image encoder with a replaceable forward: dense (LibTorch), int8 dynamic
// quantisation (per-token activation scales, per-channel weight scales, int8 tensor-core GEMM with
// fused dequantise + bias) or 2:4 semi-structured sparsity (cuSPARSELt through LibTorch).
//
// The parameters stay in the torch::nn::Linear under their state_dict names; a FastLinear holds the
// derived (quantised / compressed) weights and is installed next to it.
#pragma once

#include <torch/nn/modules/linear.h>

#include <memory>
#include <string>

namespace maskd {

class FastLinear {
 public:
  virtual ~FastLinear() = default;
  // x: [..., in_features] -> [..., out_features] in x's dtype.
  virtual at::Tensor Forward(const at::Tensor& x) const = 0;
  // Forward(gelu(x)), erf GELU: a replacement that quantises its input may fold the GELU into that
  // pass (fp8) instead of a separate element-wise pass over the activation.
  virtual at::Tensor ForwardGelu(const at::Tensor& x) const { return Forward(at::gelu(x)); }
  virtual const char* name() const = 0;
};

// Builds an int8 replacement of `linear` (weights quantised once here). CUDA only.
std::shared_ptr<FastLinear> MakeInt8Linear(const torch::nn::Linear& linear);

// Builds an fp8 (e4m3, row-wise scales) replacement: weights quantised once here. Runs on CUDA
// (sm_90, bf16 activations); elsewhere it computes the dequantised reference (for tests).
std::shared_ptr<FastLinear> MakeFp8Linear(const torch::nn::Linear& linear);

// Builds a 2:4 sparse replacement: the weight is magnitude-pruned in blocks of 4 along the input
// dimension (the 2 largest |w| of every 4 kept) and compressed for cuSPARSELt. CUDA only.
std::shared_ptr<FastLinear> MakeSparse24Linear(const torch::nn::Linear& linear);

// The 2:4-pruned weight (as MakeSparse24Linear prunes it) in a dense linear: the sparse kernel's
// exact reference, and what pruning alone does. Any device.
std::shared_ptr<FastLinear> MakePruned24DenseLinear(const torch::nn::Linear& linear);

// 2:4 magnitude pruning of a weight [out, in] (in % 4 == 0), any device: the mask that keeps the two
// largest-magnitude values of every group of four consecutive inputs.
at::Tensor Prune24(const at::Tensor& weight);

// forward through the replacement when there is one.
inline at::Tensor LinearForward(torch::nn::Linear& linear,
                                const std::shared_ptr<FastLinear>& fast, const at::Tensor& x) {
  return fast ? fast->Forward(x) : linear->forward(x);
}

}  // namespace maskd
