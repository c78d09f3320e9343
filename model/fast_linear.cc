#include "model/fast_linear.h"

#include <ATen/ATen.h>

#include "kernels/kernels.h"

namespace maskd {
namespace {

// x [..., k] as one [rows, k] matrix through gemm, viewed back to [..., out_features].
template <typename Gemm>
at::Tensor Flattened(const at::Tensor& x, int64_t out_features, Gemm&& gemm) {
  const at::Tensor y = gemm(x.reshape({-1, x.size(-1)}));
  std::vector<int64_t> shape = x.sizes().vec();
  shape.back() = out_features;
  return y.view(shape);
}

class Int8Linear final : public FastLinear {
 public:
  explicit Int8Linear(const torch::nn::Linear& l)
      : w_(kernels::QuantizeWeightPerChannel(l->weight.detach())),
        bias_(l->bias.defined() ? l->bias.detach().to(at::kFloat) : at::Tensor()),
        out_features_(l->weight.size(0)) {}

  at::Tensor Forward(const at::Tensor& x) const override {
    return Flattened(x, out_features_, [&](const at::Tensor& x2) {
      return kernels::Int8Linear(kernels::QuantizePerToken(x2), w_, bias_, x.scalar_type());
    });
  }
  const char* name() const override { return "int8"; }

 private:
  kernels::QuantizedWeight w_;
  at::Tensor bias_;
  int64_t out_features_;
};

class Sparse24Linear final : public FastLinear {
 public:
  explicit Sparse24Linear(const torch::nn::Linear& l) : out_features_(l->weight.size(0)) {
    const at::Tensor w = l->weight.detach();
    TORCH_CHECK(w.is_cuda(), "2:4 sparsity needs CUDA weights");
    packed_ = at::_cslt_compress(w * Prune24(w));
    bias_ = l->bias.defined() ? l->bias.detach() : at::Tensor();
  }

  at::Tensor Forward(const at::Tensor& x) const override {
    const int64_t k = x.size(-1);
    at::Tensor x2 = x.reshape({-1, k});
    const int64_t m = x2.size(0);
    // cuSPARSELt wants the dense operand's dimensions in multiples of 16 (windowed attention gives
    // B * 25 * 196 rows): pad with zero rows and drop them after.
    const int64_t padded = (m + 15) / 16 * 16;
    if (padded != m) x2 = at::constant_pad_nd(x2, {0, 0, 0, padded - m});
    // (W x^T)^T with the sparse operand first; transpose_result gives [M, N] row-major directly.
    at::Tensor y = at::_cslt_sparse_mm(packed_, x2.t(), bias_, std::nullopt, std::nullopt,
                                       /*transpose_result=*/true);
    if (padded != m) y = y.narrow(0, 0, m);
    std::vector<int64_t> shape = x.sizes().vec();
    shape.back() = out_features_;
    return y.reshape(shape);
  }
  const char* name() const override { return "sparse-2:4"; }

 private:
  at::Tensor packed_, bias_;
  int64_t out_features_;
};

// fp8 e4m3 with row-wise scales (kernels::Fp8Linear): weights quantised here once, activations at
// every call. bf16 models only (the row-wise GEMM writes bf16).
class Fp8Linear final : public FastLinear {
 public:
  explicit Fp8Linear(const torch::nn::Linear& l)
      : w_(kernels::QuantizeWeightFp8(l->weight.detach())),
        bias_(l->bias.defined() ? l->bias.detach() : at::Tensor()),
        out_features_(l->weight.size(0)) {}

  at::Tensor Forward(const at::Tensor& x) const override { return Run(x, /*gelu=*/false); }
  // GELU inside the quantisation pass (computed in fp32 from the bf16 pre-activation, so it is not
  // rounded to bf16 before quantising as a separate at::gelu would be).
  at::Tensor ForwardGelu(const at::Tensor& x) const override { return Run(x, /*gelu=*/true); }
  const char* name() const override { return "fp8-e4m3"; }

 private:
  at::Tensor Run(const at::Tensor& x, bool gelu) const {
    return Flattened(x, out_features_, [&](const at::Tensor& x2) {
      return kernels::Fp8Linear(kernels::QuantizeRowsFp8(x2, gelu), w_, bias_, x.scalar_type());
    });
  }

  kernels::Fp8Weight w_;
  at::Tensor bias_;
  int64_t out_features_;
};

}  // namespace

std::shared_ptr<FastLinear> MakeFp8Linear(const torch::nn::Linear& linear) {
  return std::make_shared<Fp8Linear>(linear);
}

at::Tensor Prune24(const at::Tensor& weight) {
  TORCH_CHECK(weight.dim() == 2 && weight.size(1) % 4 == 0,
              "2:4 pruning needs a [out, in] weight with in % 4 == 0, got ", weight.sizes());
  const int64_t n = weight.size(0), k = weight.size(1);
  const at::Tensor groups = weight.abs().reshape({n, k / 4, 4});
  const at::Tensor keep = std::get<1>(groups.topk(2, -1));
  at::Tensor mask = at::zeros_like(groups, weight.options().dtype(at::kBool));
  mask.scatter_(-1, keep, true);
  return mask.reshape({n, k}).to(weight.scalar_type());
}

std::shared_ptr<FastLinear> MakeInt8Linear(const torch::nn::Linear& linear) {
  return std::make_shared<Int8Linear>(linear);
}

namespace {

class Pruned24DenseLinear final : public FastLinear {
 public:
  explicit Pruned24DenseLinear(const torch::nn::Linear& l)
      : w_(l->weight.detach() * Prune24(l->weight.detach())),
        bias_(l->bias.defined() ? l->bias.detach() : at::Tensor()) {}
  at::Tensor Forward(const at::Tensor& x) const override { return at::linear(x, w_, bias_); }
  const char* name() const override { return "pruned-2:4-dense"; }

 private:
  at::Tensor w_, bias_;
};

}  // namespace

std::shared_ptr<FastLinear> MakePruned24DenseLinear(const torch::nn::Linear& linear) {
  return std::make_shared<Pruned24DenseLinear>(linear);
}

std::shared_ptr<FastLinear> MakeSparse24Linear(const torch::nn::Linear& linear) {
  return std::make_shared<Sparse24Linear>(linear);
}

}  // namespace maskd
