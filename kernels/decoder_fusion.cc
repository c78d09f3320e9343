// ATen side of the mask decoder's element-wise kernels (decoder_fusion.cu); the LibTorch references
// are the CPU path and the fallback for shapes and dtypes the kernels do not cover.
#include <cstdint>

#include "kernels/internal.h"
#include "kernels/kernels.h"

namespace maskd::kernels {

using internal::Describe;

at::Tensor RowNormReference(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias, double eps,
                            bool gelu) {
  at::Tensor y = at::layer_norm(x, {x.size(-1)}, weight, bias, eps);
  return gelu ? at::gelu(y) : y;
}

at::Tensor RowNorm(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias, double eps, bool gelu,
                   Stream stream) {
  TORCH_CHECK(x.dim() >= 1 && x.size(-1) > 0, "x: expected [..., C], got ", Describe(x));
  const int64_t C = x.size(-1);
  for (const auto* t : {&weight, &bias})
    TORCH_CHECK(t->dim() == 1 && t->size(0) == C && t->scalar_type() == x.scalar_type() && t->device() == x.device(),
                "weight/bias: expected [", C, "] of x's dtype and device, got ", Describe(*t));
#ifdef MASKD_WITH_CUDA
  if (x.is_cuda() && x.is_contiguous() && x.scalar_type() != at::kFloat &&
      detail::RowNormVectorized(static_cast<int>(C), internal::ToDType(x.scalar_type(), "x")) &&
      weight.is_contiguous() && bias.is_contiguous()) {
    internal::StreamScope scope(stream, x.device());
    at::Tensor out = at::empty_like(x);
    const bool aligned = reinterpret_cast<uintptr_t>(x.data_ptr()) % 16 == 0 &&
                         reinterpret_cast<uintptr_t>(out.data_ptr()) % 16 == 0 &&
                         reinterpret_cast<uintptr_t>(weight.data_ptr()) % 16 == 0 &&
                         reinterpret_cast<uintptr_t>(bias.data_ptr()) % 16 == 0;
    if (aligned) {
      detail::RowNormArgs a;
      a.x = x.data_ptr();
      a.weight = weight.data_ptr();
      a.bias = bias.data_ptr();
      a.out = out.data_ptr();
      a.rows = x.numel() / C;
      a.C = static_cast<int>(C);
      a.eps = static_cast<float>(eps);
      a.gelu = gelu;
      internal::CheckLaunch(detail::LaunchRowNorm(a, internal::ToDType(x.scalar_type(), "x"), scope.get()),
                            "RowNormKernel");
      return out;
    }
  }
#endif
  (void)stream;
  return RowNormReference(x, weight, bias, eps, gelu);
}

void AddRowsBroadcast(at::Tensor& y, const at::Tensor& rows, Stream stream) {
  TORCH_CHECK(rows.dim() == 2 && y.dim() >= 2 && y.size(-1) == rows.size(1) && y.size(-2) == rows.size(0),
              "AddRowsBroadcast: expected y [..., ", rows.size(0), ", ", rows.size(1), "] for rows ", Describe(rows),
              ", got ", Describe(y));
  TORCH_CHECK(rows.scalar_type() == y.scalar_type() && rows.device() == y.device(),
              "AddRowsBroadcast: rows must have y's dtype and device");
#ifdef MASKD_WITH_CUDA
  if (y.is_cuda() && y.is_contiguous() && rows.is_contiguous() && y.scalar_type() != at::kFloat &&
      rows.numel() % 8 == 0 && reinterpret_cast<uintptr_t>(y.data_ptr()) % 16 == 0 &&
      reinterpret_cast<uintptr_t>(rows.data_ptr()) % 16 == 0) {
    internal::StreamScope scope(stream, y.device());
    internal::CheckLaunch(detail::LaunchAddRowsBroadcast(y.data_ptr(), rows.data_ptr(), y.numel(), rows.numel(),
                                                         internal::ToDType(y.scalar_type(), "y"), scope.get()),
                          "AddRowsBroadcastKernel");
    return;
  }
#endif
  (void)stream;
  y.add_(rows);
}

}  // namespace maskd::kernels
