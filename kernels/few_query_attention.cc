// ATen side of FewQueryAttention (few_query_attention.cu): checks, the split of the keys, the
// workspace; the LibTorch reference is the CPU path and the fallback.
#include <algorithm>
#include <cstdint>

#include "kernels/internal.h"
#include "kernels/kernels.h"

#ifdef MASKD_WITH_CUDA
#include <cuda_runtime_api.h>
#endif

namespace maskd::kernels {

using internal::Describe;

namespace {
void CheckFewQueryArgs(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, bool rows = false) {
  TORCH_CHECK(q.dim() == 4 && k.dim() == 4 && v.dim() == 4 && k.sizes() == v.sizes() &&
                  (rows || q.size(0) == k.size(0)) && q.size(1) == k.size(1) && q.size(3) == k.size(3) &&
                  k.size(2) > 0,
              "FewQueryAttention: expected q [N, H, L, C] and k, v [N, H, S, C] with S > 0, got ", Describe(q), ", ",
              Describe(k), " and ", Describe(v));
  TORCH_CHECK(q.scalar_type() == k.scalar_type() && q.scalar_type() == v.scalar_type() && q.device() == k.device() &&
                  q.device() == v.device(),
              "FewQueryAttention: q, k and v must share dtype and device");
}
// kv_rows, when given, names one k / v row per query batch: [N] int64 on q's device.
void CheckKvRows(const at::Tensor& q, const at::Tensor& kv_rows, bool required, const char* who) {
  TORCH_CHECK(kv_rows.defined() ? kv_rows.dim() == 1 && kv_rows.size(0) == q.size(0) &&
                                      kv_rows.scalar_type() == at::kLong && kv_rows.device() == q.device()
                                : !required,
              who, ": expected kv_rows [", q.size(0), "] int64 on q's device, got ",
              kv_rows.defined() ? Describe(kv_rows) : std::string("none"));
}
}  // namespace

at::Tensor FewQueryAttentionReference(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, double scale) {
  CheckFewQueryArgs(q, k, v);
  const at::Tensor s = at::matmul(q.to(at::kFloat), k.to(at::kFloat).transpose(2, 3)) * scale;
  const at::Tensor o = at::matmul(at::softmax(s, -1), v.to(at::kFloat));  // [N, H, L, C]
  return o.transpose(1, 2).contiguous().to(q.scalar_type());
}

bool FewQueryAttentionFits(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, bool kv_rows) {
#ifdef MASKD_WITH_CUDA
  if (q.dim() != 4 || k.dim() != 4 || v.dim() != 4 || !q.is_cuda() || q.scalar_type() == at::kFloat ||
      q.scalar_type() != k.scalar_type() || q.scalar_type() != v.scalar_type() || k.sizes() != v.sizes() ||
      (!kv_rows && q.size(0) != k.size(0)) || q.size(1) != k.size(1) || q.size(3) != k.size(3) || k.size(2) < 1 ||
      k.size(2) > (int64_t{1} << 30) || q.size(0) > 65535 || q.size(1) > 65535)
    return false;
  if (!detail::FewQueryAttentionSupported(static_cast<int>(q.size(2)), static_cast<int>(q.size(3)),
                                          internal::ToDType(q.scalar_type(), "q")))
    return false;
  const auto rows_aligned = [](const at::Tensor& t) {
    return t.stride(3) == 1 && t.stride(0) % 8 == 0 && t.stride(1) % 8 == 0 && t.stride(2) % 8 == 0 &&
           reinterpret_cast<uintptr_t>(t.data_ptr()) % 16 == 0;
  };
  return q.stride(3) == 1 && rows_aligned(k) && rows_aligned(v);
#else
  (void)q, (void)k, (void)v, (void)kv_rows;
  return false;
#endif
}

namespace {
// kv_rows undefined: k / v batch n for query batch n; else [N] int64, checked by the caller. k_bias
// [S, H * C] and v_bias [H * C]: undefined, or checked by the caller.
at::Tensor FewQueryAttentionImpl(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                 const at::Tensor& kv_rows, const at::Tensor& k_bias, const at::Tensor& v_bias,
                                 double scale, Stream stream) {
#ifdef MASKD_WITH_CUDA
  const bool biases_fit = (!k_bias.defined() || (k_bias.stride(1) == 1 && k_bias.stride(0) % 8 == 0 &&
                                                 reinterpret_cast<uintptr_t>(k_bias.data_ptr()) % 16 == 0)) &&
                          (!v_bias.defined() || v_bias.is_contiguous());
  if (biases_fit && FewQueryAttentionFits(q, k, v, kv_rows.defined())) {
    internal::StreamScope scope(stream, q.device());
    const int64_t n = q.size(0), h = q.size(1), l = q.size(2), c = q.size(3), s = k.size(2);
    detail::FewQueryAttentionArgs a;
    a.q = q.data_ptr();
    a.k = k.data_ptr();
    a.v = v.data_ptr();
    for (int d = 0; d < 3; ++d) {
      a.q_stride[d] = q.stride(d);
      a.k_stride[d] = k.stride(d);
      a.v_stride[d] = v.stride(d);
    }
    a.batch = static_cast<int>(n);
    a.heads = static_cast<int>(h);
    a.queries = static_cast<int>(l);
    a.keys = static_cast<int>(s);
    a.head_dim = static_cast<int>(c);
    a.scale = static_cast<float>(scale);
    const at::Tensor rows = kv_rows.defined() ? kv_rows.contiguous() : at::Tensor();
    a.kv_rows = rows.defined() ? rows.data_ptr<int64_t>() : nullptr;
    a.k_bias = k_bias.defined() ? k_bias.data_ptr() : nullptr;
    a.k_bias_row_stride = k_bias.defined() ? k_bias.stride(0) : 0;
    a.v_bias = v_bias.defined() ? v_bias.data_ptr() : nullptr;
    // Enough blocks for eight per SM (40 registers and 14.5 KB of shared memory a block allow 12),
    // each over at least one chunk of keys: a click (N = 1, 8 heads) splits 4096 keys 32 ways, 64
    // prompts 3 ways. (Two per SM, as before run 27, left 64 prompts' 512 blocks at ~4 per SM: the
    // key loads' latency exposed, 157 us per call on the H100, run 26.)
    const int sms = internal::MultiProcessors(q.device());
    const int64_t chunk = detail::FewQueryChunkKeys();
    const int64_t chunks = (s + chunk - 1) / chunk;
    const int64_t want = std::clamp<int64_t>((8 * sms + n * h - 1) / (n * h), 1, chunks);
    a.chunks_per_split = static_cast<int>((chunks + want - 1) / want);
    a.splits = static_cast<int>((chunks + a.chunks_per_split - 1) / a.chunks_per_split);
    at::Tensor out = at::empty({n, l, h, c}, q.options());
    a.out = out.data_ptr();
    at::Tensor partial;
    if (a.splits > 1) {
      partial = at::empty({n, h, a.splits, l, c + 2}, q.options().dtype(at::kFloat));
      a.partial = partial.data_ptr<float>();
    }
    const detail::DType dt = internal::ToDType(q.scalar_type(), "q");
    internal::CheckLaunch(detail::LaunchFewQueryAttention(a, dt, scope.get()), "FewQueryAttentionKernel");
    if (a.splits > 1) internal::CheckLaunch(detail::LaunchFewQueryCombine(a, dt, scope.get()), "FewQueryCombineKernel");
    return out;
  }
#endif
  (void)stream;
  at::Tensor kk = kv_rows.defined() ? k.index_select(0, kv_rows) : k;
  at::Tensor vv = kv_rows.defined() ? v.index_select(0, kv_rows) : v;
  if (!k_bias.defined() && !v_bias.defined()) return FewQueryAttentionReference(q, kk, vv, scale);
  // The biases in fp32 on the fp32 copies the reference makes anyway: one rounding, at the output.
  const int64_t h = q.size(1), c = q.size(3);
  if (k_bias.defined()) kk = kk.to(at::kFloat) + k_bias.to(at::kFloat).view({-1, h, c}).transpose(0, 1);
  if (v_bias.defined()) vv = vv.to(at::kFloat) + v_bias.to(at::kFloat).view({h, 1, c});
  return FewQueryAttentionReference(q.to(at::kFloat), kk.to(at::kFloat), vv.to(at::kFloat), scale)
      .to(q.scalar_type());
}
}  // namespace

at::Tensor FewQueryAttention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, double scale,
                             Stream stream) {
  CheckFewQueryArgs(q, k, v);
  return FewQueryAttentionImpl(q, k, v, at::Tensor(), at::Tensor(), at::Tensor(), scale, stream);
}

at::Tensor FewQueryAttentionRows(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                 const at::Tensor& kv_rows, double scale, Stream stream) {
  CheckFewQueryArgs(q, k, v, /*rows=*/true);
  CheckKvRows(q, kv_rows, /*required=*/true, "FewQueryAttentionRows");
  return FewQueryAttentionImpl(q, k, v, kv_rows, at::Tensor(), at::Tensor(), scale, stream);
}

at::Tensor FewQueryAttentionBiased(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                   const at::Tensor& kv_rows, const at::Tensor& k_bias, const at::Tensor& v_bias,
                                   double scale, Stream stream) {
  CheckFewQueryArgs(q, k, v, /*rows=*/kv_rows.defined());
  CheckKvRows(q, kv_rows, /*required=*/false, "FewQueryAttentionBiased");
  const int64_t s = k.size(2), hc = q.size(1) * q.size(3);
  TORCH_CHECK(!k_bias.defined() || (k_bias.dim() == 2 && k_bias.size(0) == s && k_bias.size(1) == hc &&
                                    k_bias.scalar_type() == q.scalar_type() && k_bias.device() == q.device()),
              "FewQueryAttentionBiased: expected k_bias [", s, ", ", hc, "] with q's dtype and device, got ",
              k_bias.defined() ? Describe(k_bias) : std::string("none"));
  TORCH_CHECK(!v_bias.defined() || (v_bias.dim() == 1 && v_bias.size(0) == hc &&
                                    v_bias.scalar_type() == q.scalar_type() && v_bias.device() == q.device()),
              "FewQueryAttentionBiased: expected v_bias [", hc, "] with q's dtype and device, got ",
              v_bias.defined() ? Describe(v_bias) : std::string("none"));
  return FewQueryAttentionImpl(q, k, v, kv_rows, k_bias, v_bias, scale, stream);
}

}  // namespace maskd::kernels
