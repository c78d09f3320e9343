#include <cstdint>

#include "kernels/internal.h"
#include "kernels/kernels.h"

namespace maskd::kernels {
namespace {

using internal::CheckDim;
using internal::CheckSize;
using internal::Describe;

void CheckActivations(const at::Tensor& x) {
  CheckDim(x, "x", 2);
  const auto st = x.scalar_type();
  TORCH_CHECK(st == at::kFloat || st == at::kBFloat16 || st == at::kHalf,
              "x: expected float32, bfloat16 or float16, got ", Describe(x));
}

// Per-row scale max|row| / 127 (1 for an all-zero row); the division by a tensor on the same
// device, not by a Python-style scalar: ATen's CUDA div by a scalar multiplies by its reciprocal,
// which is not the IEEE quotient the kernel computes.
at::Tensor RowScales(const at::Tensor& xf) {
  const at::Tensor amax = xf.abs().amax(1);
  const at::Tensor s = amax / at::full_like(amax, 127.0f);
  return at::where(amax == 0, at::ones_like(s), s);
}

at::Tensor QuantizeRows(const at::Tensor& xf, const at::Tensor& scales) {
  return at::round(xf / scales.unsqueeze(1)).clamp(-127, 127).to(at::kChar);
}

void CheckInt8LinearArgs(const QuantizedActivations& x, const QuantizedWeight& w,
                         const at::Tensor& bias, at::ScalarType out_dtype) {
  CheckDim(x.values, "x.values", 2);
  CheckDim(w.values_t, "w.values_t", 2);
  TORCH_CHECK(x.values.scalar_type() == at::kChar, "x.values: expected int8, got ",
              Describe(x.values));
  TORCH_CHECK(w.values_t.scalar_type() == at::kChar, "w.values_t: expected int8, got ",
              Describe(w.values_t));
  const int64_t M = x.values.size(0), K = x.values.size(1), N = w.values_t.size(1);
  CheckSize(w.values_t, "w.values_t", 0, K);
  CheckDim(x.scales, "x.scales", 1);
  CheckSize(x.scales, "x.scales", 0, M);
  CheckDim(w.scales, "w.scales", 1);
  CheckSize(w.scales, "w.scales", 0, N);
  TORCH_CHECK(x.scales.scalar_type() == at::kFloat, "x.scales: expected float32, got ",
              Describe(x.scales));
  TORCH_CHECK(w.scales.scalar_type() == at::kFloat, "w.scales: expected float32, got ",
              Describe(w.scales));
  if (bias.defined()) {
    CheckDim(bias, "bias", 1);
    CheckSize(bias, "bias", 0, N);
  }
  TORCH_CHECK(out_dtype == at::kFloat || out_dtype == at::kBFloat16 || out_dtype == at::kHalf,
              "out_dtype: expected float32, bfloat16 or float16, got ", out_dtype);
  for (const at::Tensor* t : {&x.scales, &w.values_t, &w.scales}) {
    TORCH_CHECK(t->device() == x.values.device(), "quantised operands: expected all on ",
                x.values.device(), ", got ", Describe(*t));
  }
  if (bias.defined()) {
    TORCH_CHECK(bias.device() == x.values.device(), "bias: expected ", x.values.device(),
                ", got ", Describe(bias));
  }
}

}  // namespace

QuantizedActivations QuantizePerTokenReference(const at::Tensor& x) {
  CheckActivations(x);
  const at::Tensor xf = x.to(at::kFloat);
  QuantizedActivations q;
  q.scales = RowScales(xf);
  q.values = QuantizeRows(xf, q.scales);
  return q;
}

QuantizedActivations QuantizePerToken(const at::Tensor& x, Stream stream) {
  CheckActivations(x);
#ifdef MASKD_WITH_CUDA
  if (x.is_cuda()) {
    internal::StreamScope scope(stream, x.device());
    const at::Tensor xc = x.stride(1) == 1 ? x : x.contiguous();
    QuantizedActivations q;
    q.values = at::empty(x.sizes(), x.options().dtype(at::kChar));
    q.scales = at::empty({x.size(0)}, x.options().dtype(at::kFloat));
    if (x.numel() == 0) {
      q.scales.fill_(1.0f);
      return q;
    }
    internal::CheckLaunch(
        detail::LaunchQuantizePerToken(xc.data_ptr(), internal::ToDType(x.scalar_type(), "x"),
                                       xc.size(0), xc.size(1), xc.stride(0),
                                       q.values.data_ptr<int8_t>(), q.scales.data_ptr<float>(),
                                       scope.get()),
        "QuantizePerTokenKernel");
    return q;
  }
#endif
  (void)stream;
  return QuantizePerTokenReference(x);
}

QuantizedWeight QuantizeWeightPerChannel(const at::Tensor& w) {
  CheckDim(w, "w", 2);
  TORCH_CHECK(at::isFloatingType(w.scalar_type()), "w: expected a floating-point weight, got ",
              Describe(w));
  const at::Tensor wf = w.to(at::kFloat);
  QuantizedWeight q;
  q.scales = RowScales(wf);
  // [N, K] row-major quantised, handed to the GEMM as its transpose: [K, N] column-major.
  q.values_t = QuantizeRows(wf, q.scales).contiguous().t();
  return q;
}

at::Tensor Int8LinearReference(const QuantizedActivations& x, const QuantizedWeight& w,
                               const at::Tensor& bias, at::ScalarType out_dtype) {
  CheckInt8LinearArgs(x, w, bias, out_dtype);
  // The int32 accumulation exactly, on any device: in float64 every partial sum is an integer
  // below K * 127^2 < 2^53, so the product is exact whatever the summation order (int64 matmul
  // has no CUDA kernel).
  const at::Tensor acc = at::matmul(x.values.to(at::kDouble), w.values_t.to(at::kDouble));
  at::Tensor y = acc.to(at::kFloat) * x.scales.unsqueeze(1) * w.scales.unsqueeze(0);
  if (bias.defined()) y = y + bias.to(at::kFloat);
  return y.to(out_dtype);
}

at::Tensor Int8Linear(const QuantizedActivations& x, const QuantizedWeight& w,
                      const at::Tensor& bias, at::ScalarType out_dtype, Stream stream) {
  CheckInt8LinearArgs(x, w, bias, out_dtype);
#ifdef MASKD_WITH_CUDA
  if (x.values.is_cuda()) {
    internal::StreamScope scope(stream, x.values.device());
    const int64_t M = x.values.size(0), K = x.values.size(1), N = w.values_t.size(1);
    TORCH_CHECK(M > 16 && K % 8 == 0 && N % 8 == 0,
                "Int8Linear on CUDA: the int8 GEMM needs M > 16 and K, N multiples of 8, got M = ",
                M, ", K = ", K, ", N = ", N);
    // The epilogue reads acc, w_scales and bias as 16-byte vectors: contiguous and 16-byte aligned
    // (a contiguous view with a storage offset may not be; it is copied once).
    const auto aligned16 = [](const at::Tensor& t) {
      const at::Tensor c = t.contiguous();
      return reinterpret_cast<uintptr_t>(c.data_ptr()) % 16 == 0 ? c : c.clone();
    };
    const at::Tensor acc = aligned16(at::_int_mm(x.values, w.values_t));
    const at::Tensor xs = x.scales.contiguous();
    const at::Tensor ws = aligned16(w.scales);
    at::Tensor bf;
    if (bias.defined()) bf = aligned16(bias.to(at::kFloat));
    at::Tensor out = at::empty({M, N}, x.values.options().dtype(out_dtype));
    internal::CheckLaunch(
        detail::LaunchDequantizeBias(acc.data_ptr<int32_t>(), M, N, xs.data_ptr<float>(),
                                     ws.data_ptr<float>(),
                                     bf.defined() ? bf.data_ptr<float>() : nullptr,
                                     out.data_ptr(), internal::ToDType(out_dtype, "out_dtype"),
                                     scope.get()),
        "DequantizeBiasKernel");
    return out;
  }
#endif
  (void)stream;
  return Int8LinearReference(x, w, bias, out_dtype);
}

}  // namespace maskd::kernels
