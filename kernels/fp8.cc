// fp8 (e4m3) linear layers with row-wise scales (kernels.h). The GEMM is at::_scaled_mm's CUTLASS
// kernel; the activation quantisation is one CUDA pass (fp8.cu, optionally with the GELU before it)
// and, off CUDA and as the reference, the LibTorch passes below.
#include <ATen/ATen.h>

#include <algorithm>

#include "kernels/internal.h"
#include "kernels/kernels.h"

namespace maskd::kernels {
namespace {

constexpr double kE4m3Max = 448.0;
// A zero row's scale: any positive value quantises it to zeros; the smallest normal float keeps
// every later division finite.
constexpr double kMinScale = 1.1754943508222875e-38;

// Row-wise quantisation of a 2-D tensor along dim 1: scales [rows, 1].
void CheckRows(const at::Tensor& x) {
  TORCH_CHECK(x.dim() == 2, "fp8 quantisation: expected a 2-D tensor, got ", internal::Describe(x));
  TORCH_CHECK(at::isFloatingType(x.scalar_type()), "fp8 quantisation: expected a float tensor, got ",
              internal::Describe(x));
}

std::pair<at::Tensor, at::Tensor> QuantizeRows(const at::Tensor& x) {
  CheckRows(x);
  // |max| is exact in any float dtype; the scales are float32, amax * fl(1/448) (the CUDA kernel
  // multiplies by the same rounded reciprocal, so both give the same bits).
  const at::Tensor scales =
      (x.abs().amax(1, /*keepdim=*/true).to(at::kFloat) * (1.0 / kE4m3Max)).clamp_min(kMinScale);
  at::Tensor q = at::empty(x.sizes(), x.options().dtype(at::kFloat8_e4m3fn));
  // x * fl(1/s): the product by the row's correctly rounded reciprocal (what the CUDA kernel
  // computes, bit for bit), in fp32, in row chunks: an fp32 copy of a whole activation (vit_h's fc2
  // input at batch 32 is 131072 x 5120) would cost gigabytes. The clamp keeps the cast finite
  // (float8_e4m3fn has no infinity).
  const at::Tensor inv_scales = scales.reciprocal();
  const int64_t rows = x.size(0);
  const int64_t chunk = std::max<int64_t>(1, (int64_t{1} << 26) / std::max<int64_t>(1, x.size(1)));
  for (int64_t r0 = 0; r0 < rows; r0 += chunk) {
    const int64_t n = std::min(chunk, rows - r0);
    q.narrow(0, r0, n).copy_(
        (x.narrow(0, r0, n).to(at::kFloat) * inv_scales.narrow(0, r0, n)).clamp(-kE4m3Max, kE4m3Max));
  }
  return {q, scales};
}

}  // namespace

Fp8Rows QuantizeRowsFp8Reference(const at::Tensor& x, bool gelu) {
  CheckRows(x);
  auto [q, s] = QuantizeRows(gelu ? at::gelu(x.to(at::kFloat)) : x);
  return {q, s};
}

Fp8Rows QuantizeRowsFp8(const at::Tensor& x, bool gelu, Stream stream) {
  CheckRows(x);
#ifdef MASKD_WITH_CUDA
  if (x.is_cuda()) {
    internal::StreamScope scope(stream, x.device());
    const at::Tensor xc = x.stride(1) == 1 ? x : x.contiguous();
    Fp8Rows r;
    r.values = at::empty(x.sizes(), x.options().dtype(at::kFloat8_e4m3fn));
    r.scales = at::empty({x.size(0), 1}, x.options().dtype(at::kFloat));
    if (x.numel() == 0) {
      r.scales.fill_(kMinScale);
      return r;
    }
    internal::CheckLaunch(
        detail::LaunchQuantizeRowsFp8(xc.data_ptr(), internal::ToDType(x.scalar_type(), "x"),
                                      xc.size(0), xc.size(1), xc.stride(0), gelu,
                                      r.values.data_ptr(), r.scales.data_ptr<float>(), scope.get()),
        gelu ? "QuantizeRowsFp8Kernel (gelu)" : "QuantizeRowsFp8Kernel");
    return r;
  }
#endif
  (void)stream;
  return QuantizeRowsFp8Reference(x, gelu);
}

Fp8Weight QuantizeWeightFp8(const at::Tensor& w) {
  auto [q, s] = QuantizeRows(w);
  return {q, s.t().contiguous()};
}

at::Tensor Fp8LinearReference(const Fp8Rows& x, const Fp8Weight& w, const at::Tensor& bias,
                              at::ScalarType out_dtype) {
  TORCH_CHECK(x.values.dim() == 2 && w.values.dim() == 2 && x.values.size(1) == w.values.size(1),
              "Fp8Linear: expected x [M, K] and w [N, K] with the same K, got ",
              internal::Describe(x.values), " and ", internal::Describe(w.values));
  const at::Tensor xd = x.values.to(at::kFloat) * x.scales;
  const at::Tensor wd = w.values.to(at::kFloat) * w.scales.t();
  at::Tensor y = at::matmul(xd, wd.t());
  if (bias.defined()) y = y + bias.to(at::kFloat);
  return y.to(out_dtype);
}

at::Tensor Fp8Linear(const Fp8Rows& x, const Fp8Weight& w, const at::Tensor& bias,
                     at::ScalarType out_dtype) {
  if (!x.values.is_cuda()) return Fp8LinearReference(x, w, bias, out_dtype);
  TORCH_CHECK(out_dtype == at::kBFloat16,
              "Fp8Linear on CUDA writes bfloat16 (the row-wise fp8 GEMM), asked for ", out_dtype);
  TORCH_CHECK(x.values.size(1) == w.values.size(1) && x.values.size(1) % 16 == 0 &&
                  w.values.size(0) % 16 == 0,
              "Fp8Linear on CUDA: expected K and N multiples of 16 and equal K, got x ",
              internal::Describe(x.values), ", w ", internal::Describe(w.values));
  std::optional<at::Tensor> b;
  if (bias.defined()) b = bias.to(at::kBFloat16);
  // use_fast_accum=false: the kernel promotes its fp32 accumulators regularly, the accurate mode.
  return at::_scaled_mm(x.values, w.values.t(), x.scales, w.scales, b, std::nullopt, at::kBFloat16,
                        /*use_fast_accum=*/false);
}

}  // namespace maskd::kernels
