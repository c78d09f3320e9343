// ATen side of the encoder's fused element-wise kernels (encoder_fusion.cu) and of the rel-pos
// tables as one matrix product; the LibTorch references double as the CPU path.
#include <cstdint>
#include <cstdlib>
#include <initializer_list>
#include <string>
#include <vector>

#include "kernels/internal.h"
#include "kernels/kernels.h"

namespace maskd::kernels {
namespace {

using internal::CheckDim;
using internal::Describe;

struct Geometry {
  int64_t B, H, W, C;
};

// Checks x, delta, weight and bias; returns x's geometry.
Geometry CheckAddLayerNormArgs(const at::Tensor& x, const at::Tensor& delta, int64_t delta_window,
                               const at::Tensor& weight, const at::Tensor& bias,
                               int64_t out_window) {
  CheckDim(x, "x", 4);
  TORCH_CHECK(x.is_contiguous(), "x: expected a contiguous [B, H, W, C] tensor, got ", Describe(x));
  const Geometry g{x.size(0), x.size(1), x.size(2), x.size(3)};
  TORCH_CHECK(delta_window >= 0 && out_window >= 0, "window sizes: expected >= 0, got delta ",
              delta_window, ", out ", out_window);
  for (const auto& [t, name] : {std::pair{&weight, "weight"}, std::pair{&bias, "bias"}}) {
    CheckDim(*t, name, 1);
    TORCH_CHECK(t->size(0) == g.C && t->is_contiguous() && t->scalar_type() == x.scalar_type() &&
                    t->device() == x.device(),
                name, ": expected a contiguous [", g.C, "] tensor of x's dtype and device, got ",
                Describe(*t));
  }
  if (delta.defined()) {
    int64_t rows = g.B * g.H * g.W;
    if (delta_window > 0) {
      const int64_t nh = (g.H + delta_window - 1) / delta_window;
      const int64_t nw = (g.W + delta_window - 1) / delta_window;
      rows = g.B * nh * nw * delta_window * delta_window;
    }
    TORCH_CHECK(delta.is_contiguous() && delta.numel() == rows * g.C && delta.size(-1) == g.C &&
                    delta.scalar_type() == x.scalar_type() && delta.device() == x.device(),
                "delta: expected a contiguous tensor of ", rows, " tokens x ", g.C,
                " channels (window ", delta_window, ") of x's dtype and device, got ", Describe(delta));
  }
  return g;
}

#ifdef MASKD_WITH_CUDA
// AddLayerNorm's output shape: [B, H, W, C] (raster) or [B * nh * nw, ws, ws, C] (windowed).
std::vector<int64_t> OutputShape(const Geometry& g, int64_t out_window) {
  if (out_window == 0) return {g.B, g.H, g.W, g.C};
  const int64_t nh = (g.H + out_window - 1) / out_window, nw = (g.W + out_window - 1) / out_window;
  return {g.B * nh * nw, out_window, out_window, g.C};
}

// With `scales` (fp8 output, the vector kernel only): `out` is float8_e4m3fn and scales [tokens, 1].
at::Tensor AddLayerNormCuda(at::Tensor& x, const at::Tensor& delta, int64_t delta_window,
                            const at::Tensor& weight, const at::Tensor& bias, double eps,
                            int64_t out_window, Stream stream, at::Tensor* scales = nullptr) {
  const Geometry g = CheckAddLayerNormArgs(x, delta, delta_window, weight, bias, out_window);
  const detail::DType dtype = internal::ToDType(x.scalar_type(), "x");
  const bool vec = detail::AddLayerNormVectorized(static_cast<int>(g.C), dtype);
  TORCH_CHECK(scales == nullptr || vec, "AddLayerNorm with fp8 output: no kernel for ", Describe(x));
  internal::StreamScope scope(stream, x.device());
  const std::vector<int64_t> shape = OutputShape(g, out_window);
  const at::Tensor out = at::empty(shape, scales != nullptr ? x.options().dtype(at::kFloat8_e4m3fn) : x.options());
  if (scales != nullptr) *scales = at::empty({out.numel() / g.C, 1}, x.options().dtype(at::kFloat));
  if (vec) {
    // 16-byte vector accesses (8-byte for fp8 output): every row starts aligned when the bases are.
    for (const at::Tensor* t : std::initializer_list<const at::Tensor*>{&x, &delta, &weight, &bias, &out})
      TORCH_CHECK(!t->defined() || reinterpret_cast<uintptr_t>(t->data_ptr()) % 16 == 0,
                  "AddLayerNorm: expected 16-byte aligned tensors, got ", Describe(*t));
  }
  detail::AddLayerNormArgs a;
  a.x = x.data_ptr();
  a.delta = delta.defined() ? delta.data_ptr() : nullptr;
  a.delta_window = static_cast<int>(delta_window);
  a.weight = weight.data_ptr();
  a.bias = bias.data_ptr();
  a.out = out.data_ptr();
  a.out_window = static_cast<int>(out_window);
  a.B = static_cast<int>(g.B);
  a.H = static_cast<int>(g.H);
  a.W = static_cast<int>(g.W);
  a.C = static_cast<int>(g.C);
  a.out_tokens = out.numel() / g.C;
  a.eps = static_cast<float>(eps);
  a.out_scales = scales != nullptr ? scales->data_ptr<float>() : nullptr;
  internal::CheckLaunch(detail::LaunchAddLayerNorm(a, dtype, scope.get()),
                        scales != nullptr ? "AddLayerNormVecKernel (fp8 output)"
                                          : detail::AddLayerNormKernelName(a.C, dtype));
  return out;
}
#endif

}  // namespace

at::Tensor WindowPartition(const at::Tensor& x, int64_t ws) {
  const int64_t B = x.size(0), H = x.size(1), W = x.size(2), C = x.size(3);
  const int64_t pad_h = (ws - H % ws) % ws, pad_w = (ws - W % ws) % ws;
  at::Tensor p = x;
  if (pad_h > 0 || pad_w > 0) p = at::constant_pad_nd(x, {0, 0, 0, pad_w, 0, pad_h});
  const int64_t Hp = H + pad_h, Wp = W + pad_w;
  return p.view({B, Hp / ws, ws, Wp / ws, ws, C}).permute({0, 1, 3, 2, 4, 5}).reshape({-1, ws, ws, C});
}

at::Tensor WindowUnpartition(const at::Tensor& windows, int64_t ws, int64_t B, int64_t H, int64_t W) {
  const int64_t C = windows.size(-1);
  const int64_t Hp = (H + ws - 1) / ws * ws, Wp = (W + ws - 1) / ws * ws;
  at::Tensor x = windows.reshape({B, Hp / ws, Wp / ws, ws, ws, C}).permute({0, 1, 3, 2, 4, 5}).reshape({B, Hp, Wp, C});
  if (Hp > H || Wp > W) x = x.slice(1, 0, H).slice(2, 0, W);
  return x;
}

at::Tensor AddLayerNormReference(at::Tensor& x, const at::Tensor& delta, int64_t delta_window,
                                 const at::Tensor& weight, const at::Tensor& bias, double eps,
                                 int64_t out_window) {
  const Geometry g = CheckAddLayerNormArgs(x, delta, delta_window, weight, bias, out_window);
  if (delta.defined())
    x.add_(delta_window > 0 ? WindowUnpartition(delta, delta_window, g.B, g.H, g.W) : delta.view_as(x));
  const at::Tensor y = at::layer_norm(x, {g.C}, weight, bias, eps);
  return out_window > 0 ? WindowPartition(y, out_window) : y;
}

at::Tensor AddLayerNorm(at::Tensor& x, const at::Tensor& delta, int64_t delta_window,
                        const at::Tensor& weight, const at::Tensor& bias, double eps,
                        int64_t out_window, Stream stream) {
#ifdef MASKD_WITH_CUDA
  if (x.is_cuda()) return AddLayerNormCuda(x, delta, delta_window, weight, bias, eps, out_window, stream);
#endif
  (void)stream;
  return AddLayerNormReference(x, delta, delta_window, weight, bias, eps, out_window);
}

Fp8Rows AddLayerNormFp8(at::Tensor& x, const at::Tensor& delta, int64_t delta_window, const at::Tensor& weight,
                        const at::Tensor& bias, double eps, int64_t out_window, Stream stream) {
#ifdef MASKD_WITH_CUDA
  if (x.is_cuda() && (x.scalar_type() == at::kBFloat16 || x.scalar_type() == at::kHalf) &&
      detail::AddLayerNormVectorized(static_cast<int>(x.size(-1)), internal::ToDType(x.scalar_type(), "x"))) {
    Fp8Rows r;
    r.values = AddLayerNormCuda(x, delta, delta_window, weight, bias, eps, out_window, stream, &r.scales);
    return r;
  }
#endif
  const at::Tensor y = AddLayerNorm(x, delta, delta_window, weight, bias, eps, out_window, stream);
  Fp8Rows r = QuantizeRowsFp8(y.reshape({-1, y.size(-1)}), /*gelu=*/false, stream);
  r.values = r.values.view(y.sizes());
  return r;
}

at::Tensor ReversedRelPosTables(const at::Tensor& Rh, const at::Tensor& Rw) {
  // R[r, k] = table[r - k + g - 1]; rev[j] = table[2g - 2 - j], so rev[(g - 1 - r) + k] = R[r, k]:
  // rev[0..g) = R[g - 1, :] and rev[g - 1 + m] = R[g - 1 - m, g - 1] for m in [1, g).
  auto reversed = [](const at::Tensor& R) {
    CheckDim(R, "R", 3);
    const int64_t g = R.size(0);
    TORCH_CHECK(R.size(1) == g, "R: expected [g, g, D], got ", Describe(R));
    return at::cat({R[g - 1], R.select(1, g - 1).slice(0, 0, g - 1).flip({0})}, 0);
  };
  return at::cat({reversed(Rh), reversed(Rw)}, 0).contiguous();
}

RelPosTerms RelPosTables(const at::Tensor& q, const at::Tensor& rev_tables, int64_t grid_h,
                         int64_t grid_w) {
  CheckDim(q, "q", 4);
  CheckDim(rev_tables, "rev_tables", 2);
  const int64_t B = q.size(0), H = q.size(1), N = q.size(2), D = q.size(3);
  const int64_t Lh = 2 * grid_h - 1, Lw = 2 * grid_w - 1, L = Lh + Lw;
  TORCH_CHECK(grid_h > 0 && grid_w > 0 && grid_h * grid_w == N, "grid ", grid_h, " x ", grid_w,
              ": expected N = ", N, " tokens (q is ", Describe(q), ")");
  TORCH_CHECK(rev_tables.size(0) == L && rev_tables.size(1) == D,
              "rev_tables: expected [", L, ", ", D, "], got ", Describe(rev_tables));
  RelPosTerms t;
  t.table = at::matmul(q, rev_tables.to(q.scalar_type()).t()).contiguous();
  const int64_t off = t.table.storage_offset();
  t.rel_h = t.table.as_strided({B, H, grid_h, grid_w, grid_h}, {H * N * L, N * L, grid_w * L - 1, L, 1},
                               off + grid_h - 1);
  t.rel_w = t.table.as_strided({B, H, grid_h, grid_w, grid_w}, {H * N * L, N * L, grid_w * L, L - 1, 1},
                               off + Lh + grid_w - 1);
  return t;
}

at::Tensor FoldedKeyIndicators(int64_t grid, int64_t extra, const at::TensorOptions& options) {
  TORCH_CHECK(grid > 0 && extra >= 2 * grid, "FoldedKeyIndicators: ", extra, " columns cannot hold 2 x ", grid);
  // Key j = (row, col): indicator columns e_row (the first grid) and e_col (the next grid).
  const int64_t n = grid * grid;
  at::Tensor onehot = at::zeros({n, extra}, options);
  const at::Tensor j = at::arange(n, options.dtype(at::kLong));
  onehot.index_put_({j, j.div(grid, "floor")}, 1);
  onehot.index_put_({j, grid + j.remainder(grid)}, 1);
  return onehot;
}

FoldedQK FoldRelPosQKReference(const at::Tensor& q, const at::Tensor& k, const at::Tensor& rev_tables,
                               int64_t grid, double scale, int64_t width, const at::Tensor& key_indicators) {
  const int64_t B = q.size(0), H = q.size(1), N = q.size(2), D = q.size(3);
  const RelPosTerms t = RelPosTables(q, rev_tables, grid, grid);
  std::vector<at::Tensor> qs = {(q * scale).reshape({B, H, grid, grid, D}), t.rel_h.to(q.scalar_type()),
                                t.rel_w.to(q.scalar_type())};
  const int64_t pad = width - D - 2 * grid;
  if (pad > 0) qs.push_back(at::zeros({B, H, grid, grid, pad}, q.options()));
  FoldedQK f;
  f.q = at::cat(qs, -1).view({B, H, N, width});
  const at::Tensor onehot = key_indicators.defined() ? key_indicators.to(k.scalar_type())
                                                     : FoldedKeyIndicators(grid, width - D, k.options());
  TORCH_CHECK(onehot.dim() == 2 && onehot.size(0) == N && onehot.size(1) == width - D,
              "FoldRelPosQKReference: key_indicators: expected [", N, ", ", width - D, "], got ", Describe(onehot));
  f.k = at::cat({k, onehot.expand({B, H, N, width - D})}, -1);
  return f;
}

FoldedQK FoldRelPosQK(const at::Tensor& q, const at::Tensor& k, const at::Tensor& rev_tables, int64_t grid,
                      double scale, int64_t width, const at::Tensor& key_indicators, Stream stream) {
  CheckDim(q, "q", 4);
  CheckDim(k, "k", 4);
  const int64_t B = q.size(0), H = q.size(1), N = q.size(2), D = q.size(3);
  TORCH_CHECK(k.sizes() == q.sizes(), "FoldRelPosQK: k ", Describe(k), " must have q's shape ", Describe(q));
  TORCH_CHECK(grid > 0 && grid * grid == N, "FoldRelPosQK: grid ", grid, " does not make q's ", N, " tokens");
  TORCH_CHECK(width >= D + 2 * grid, "FoldRelPosQK: width ", width, " < D + 2 grid = ", D + 2 * grid);
  TORCH_CHECK(rev_tables.dim() == 2 && rev_tables.size(0) == 2 * (2 * grid - 1) && rev_tables.size(1) == D,
              "FoldRelPosQK: rev_tables: expected [", 2 * (2 * grid - 1), ", ", D, "], got ", Describe(rev_tables));
#ifdef MASKD_WITH_CUDA
  const auto aligned16 = [](const at::Tensor& t) {
    return reinterpret_cast<uintptr_t>(t.data_ptr()) % 16 == 0 && t.stride(3) == 1 && t.stride(0) % 8 == 0 &&
           t.stride(1) % 8 == 0 && t.stride(2) % 8 == 0;
  };
  if (q.is_cuda() && k.device() == q.device() && rev_tables.device() == q.device() &&
      q.scalar_type() != at::kFloat && k.scalar_type() == q.scalar_type() &&
      detail::FoldRelPosSupported(static_cast<int>(D), static_cast<int>(grid), static_cast<int>(width)) &&
      aligned16(q) && aligned16(k) && B > 0 && B < 65536 && H < 65536) {
    internal::StreamScope scope(stream, q.device());
    const at::Tensor rev = rev_tables.to(q.scalar_type()).contiguous();
    FoldedQK f;
    f.q = at::empty({B, H, N, width}, q.options());
    f.k = at::empty({B, H, N, width}, q.options());
    detail::FoldRelPosArgs a;
    a.q = q.data_ptr();
    a.k = k.data_ptr();
    for (int d = 0; d < 3; ++d) {
      a.q_stride[d] = q.stride(d);
      a.k_stride[d] = k.stride(d);
    }
    a.rev = rev.data_ptr();
    a.qf = f.q.data_ptr();
    a.kf = f.k.data_ptr();
    a.batch = static_cast<int>(B);
    a.heads = static_cast<int>(H);
    a.grid = static_cast<int>(grid);
    a.head_dim = static_cast<int>(D);
    a.width = static_cast<int>(width);
    a.scale = static_cast<float>(scale);
    // The tensor-core variant is the default since run 58 (H100: the fold 0.213 -> 0.119 ms for vit_b's
    // 4 blocks at batch 1; vit_b bs32 355.6 -> 368.1 img/s). MASKD_FOLD_MMA=0 selects the fp32-FMA
    // kernel. Read at each call (the encoder calls this while capturing its graphs, not at replay) so
    // that one test process can check both variants.
    const char* mma = std::getenv("MASKD_FOLD_MMA");
    a.tensor_cores = !(mma != nullptr && std::string(mma) == "0");
    internal::CheckLaunch(detail::LaunchFoldRelPos(a, internal::ToDType(q.scalar_type(), "q"), scope.get()),
                          a.tensor_cores ? "FoldRelPosMmaKernel" : "FoldRelPosKernel");
    return f;
  }
#endif
  (void)stream;
  return FoldRelPosQKReference(q, k, rev_tables, grid, scale, width, key_indicators);
}

}  // namespace maskd::kernels
