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
  bool TakesFp8Rows() const override { return true; }
  at::Tensor ForwardFp8Rows(const kernels::Fp8Rows& x) const override {
    const int64_t k = x.values.size(-1);
    return kernels::Fp8Linear({x.values.reshape({-1, k}), x.scales}, w_, bias_, at::kBFloat16);
  }

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

at::Tensor FastLinear::ForwardFp8Rows(const kernels::Fp8Rows& /*x*/) const {
  TORCH_CHECK(false, name(), " linear: takes no fp8 rows");
}

std::shared_ptr<FastLinear> MakeFp8Linear(const torch::nn::Linear& linear) {
  return std::make_shared<Fp8Linear>(linear);
}

}  // namespace maskd
