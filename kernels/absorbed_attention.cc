// ATen side of AbsorbedAttention (absorbed_attention.cu): checks, the split of the keys, the
// workspace; the LibTorch reference is the CPU path and the fallback.
#include <algorithm>
#include <cstdint>

#include "kernels/internal.h"
#include "kernels/kernels.h"

namespace maskd::kernels {

using internal::Describe;

namespace {
// The argument rules, as predicates for both the checks (which throw) and AbsorbedAttentionFits.
bool ShapesAgree(const at::Tensor& qa, const at::Tensor& q, const at::Tensor& x) {
  return qa.dim() == 4 && q.dim() == 4 && x.dim() == 3 && q.size(0) == qa.size(0) && q.size(1) == qa.size(1) &&
         q.size(2) == qa.size(2) && x.size(0) == qa.size(0) && x.size(2) == qa.size(3) && x.size(1) > 0;
}
bool SameKind(const at::Tensor& a, const at::Tensor& b) {
  return a.scalar_type() == b.scalar_type() && a.device() == b.device();
}
// k_bias undefined, or [S, H * C] of x's dtype and device.
bool BiasAgrees(const at::Tensor& k_bias, const at::Tensor& q, const at::Tensor& x) {
  return !k_bias.defined() || (k_bias.dim() == 2 && k_bias.size(0) == x.size(1) &&
                               k_bias.size(1) == q.size(1) * q.size(3) && SameKind(k_bias, x));
}

void CheckAbsorbedArgs(const at::Tensor& qa, const at::Tensor& q, const at::Tensor& x, const at::Tensor& k_bias) {
  TORCH_CHECK(ShapesAgree(qa, q, x),
              "AbsorbedAttention: expected qa [N, H, L, D], q [N, H, L, C] and x [N, S, D] with S > 0, got ",
              Describe(qa), ", ", Describe(q), " and ", Describe(x));
  TORCH_CHECK(SameKind(qa, x) && SameKind(q, x), "AbsorbedAttention: qa, q and x must share dtype and device");
  TORCH_CHECK(BiasAgrees(k_bias, q, x), "AbsorbedAttention: expected k_bias [", x.size(1), ", ",
              q.size(1) * q.size(3), "] with x's dtype and device, got ",
              k_bias.defined() ? Describe(k_bias) : std::string("none"));
}
}  // namespace

at::Tensor AbsorbedAttentionReference(const at::Tensor& qa, const at::Tensor& q, const at::Tensor& x,
                                      const at::Tensor& k_bias, double scale) {
  CheckAbsorbedArgs(qa, q, x, k_bias);
  const int64_t n = qa.size(0), h = qa.size(1), l = qa.size(2), d = qa.size(3), s = x.size(1), c = q.size(3);
  const at::Tensor x32 = x.to(at::kFloat);
  at::Tensor scores = at::matmul(qa.to(at::kFloat).reshape({n, h * l, d}), x32.transpose(1, 2)).view({n, h, l, s});
  if (k_bias.defined())  // q [N, H, L, C] x k_bias per head [H, C, S]
    scores = scores + at::matmul(q.to(at::kFloat), k_bias.to(at::kFloat).view({s, h, c}).permute({1, 2, 0}));
  const at::Tensor p = at::softmax(scores * scale, -1);
  const at::Tensor z = at::matmul(p.view({n, h * l, s}), x32).view({n, h, l, d});
  return z.transpose(1, 2).contiguous().to(x.scalar_type());
}

bool AbsorbedAttentionShapeSupported(int64_t heads, int64_t head_dim, int64_t dim, int64_t queries,
                                     at::ScalarType dtype, const at::Device& device) {
#ifdef MASKD_WITH_CUDA
  return device.is_cuda() && (dtype == at::kBFloat16 || dtype == at::kHalf) && heads == detail::kAbsorbedHeads &&
         head_dim == detail::kAbsorbedHeadDim && dim == detail::kAbsorbedDim && queries >= 1 &&
         queries <= detail::kAbsorbedMaxQueries;
#else
  (void)heads, (void)head_dim, (void)dim, (void)queries, (void)dtype, (void)device;
  return false;
#endif
}

bool AbsorbedAttentionFits(const at::Tensor& qa, const at::Tensor& q, const at::Tensor& x, const at::Tensor& k_bias) {
#ifdef MASKD_WITH_CUDA
  if (!ShapesAgree(qa, q, x) || !SameKind(qa, x) || !SameKind(q, x) || !BiasAgrees(k_bias, q, x) ||
      x.size(1) > (int64_t{1} << 30) || qa.size(0) > 65535)
    return false;
  if (!AbsorbedAttentionShapeSupported(qa.size(1), q.size(3), qa.size(3), qa.size(2), x.scalar_type(), x.device()))
    return false;
  const auto aligned = [](const at::Tensor& t) { return reinterpret_cast<uintptr_t>(t.data_ptr()) % 16 == 0; };
  const bool qa_ok = qa.stride(3) == 1 && qa.stride(0) % 8 == 0 && qa.stride(1) % 8 == 0 && qa.stride(2) % 8 == 0 &&
                     aligned(qa);
  const bool x_ok = x.stride(2) == 1 && x.stride(0) % 8 == 0 && x.stride(1) % 8 == 0 && aligned(x);
  const bool bias_ok =
      !k_bias.defined() || (k_bias.stride(1) == 1 && k_bias.stride(0) % 8 == 0 && aligned(k_bias));
  return qa_ok && x_ok && bias_ok && q.stride(3) == 1;
#else
  (void)qa, (void)q, (void)x, (void)k_bias;
  return false;
#endif
}

at::Tensor AbsorbedAttention(const at::Tensor& qa, const at::Tensor& q, const at::Tensor& x, const at::Tensor& k_bias,
                             double scale, Stream stream) {
  CheckAbsorbedArgs(qa, q, x, k_bias);
#ifdef MASKD_WITH_CUDA
  if (AbsorbedAttentionFits(qa, q, x, k_bias)) {
    internal::StreamScope scope(stream, x.device());
    const int64_t n = qa.size(0), h = qa.size(1), l = qa.size(2), d = qa.size(3), s = x.size(1);
    detail::AbsorbedAttentionArgs a;
    a.qa = qa.data_ptr();
    a.q = q.data_ptr();
    a.x = x.data_ptr();
    for (int i = 0; i < 3; ++i) {
      a.qa_stride[i] = qa.stride(i);
      a.q_stride[i] = q.stride(i);
    }
    a.x_stride[0] = x.stride(0);
    a.x_stride[1] = x.stride(1);
    a.k_bias = k_bias.defined() ? k_bias.data_ptr() : nullptr;
    a.k_bias_row_stride = k_bias.defined() ? k_bias.stride(0) : 0;
    a.batch = static_cast<int>(n);
    a.queries = static_cast<int>(l);
    a.keys = static_cast<int>(s);
    a.scale = static_cast<float>(scale);
    // Two blocks an SM (85 KB of shared memory, 243 registers a thread): as many splits as keep
    // one wave of blocks, each split at least 128 keys (the block stages 32 KB of queries first).
    // 64 prompts on 132 SMs: 4 splits of 1024 keys; a click: 32 of 128.
    const int sms = internal::MultiProcessors(x.device());
    const int64_t step = detail::AbsorbedAttentionKeyStep();
    const int64_t max_splits = std::max<int64_t>(1, (s + 4 * step - 1) / (4 * step));
    const int64_t want = std::clamp<int64_t>(2 * sms / n, 1, max_splits);
    const int64_t steps = (s + step - 1) / step;
    a.keys_per_split = static_cast<int>(((steps + want - 1) / want) * step);
    a.splits = static_cast<int>((s + a.keys_per_split - 1) / a.keys_per_split);
    at::Tensor out = at::empty({n, l, h, d}, x.options());
    a.out = out.data_ptr();
    at::Tensor partial;
    if (a.splits > 1) {
      const int64_t rows = int64_t{detail::kAbsorbedHeads} * detail::kAbsorbedMaxQueries;
      partial = at::empty({n * a.splits * rows * (d + 2)}, x.options().dtype(at::kFloat));
      a.partial = partial.data_ptr<float>();
      a.partial_md = a.partial + n * a.splits * rows * d;
    }
    const detail::DType dt = internal::ToDType(x.scalar_type(), "x");
    internal::CheckLaunch(detail::LaunchAbsorbedAttention(a, dt, scope.get()), "AbsorbedAttentionKernel");
    if (a.splits > 1) internal::CheckLaunch(detail::LaunchAbsorbedCombine(a, dt, scope.get()), "AbsorbedCombineKernel");
    return out;
  }
#endif
  (void)stream;
  return AbsorbedAttentionReference(qa, q, x, k_bias, scale);
}

}  // namespace maskd::kernels
