// ATen side of the mask decoder's element-wise kernels (decoder_fusion.cu); the LibTorch references
// are the CPU path and the fallback for shapes and dtypes the kernels do not cover.
#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <vector>

#include "kernels/internal.h"
#include "kernels/kernels.h"

#ifdef MASKD_WITH_CUDA
#include <cuda_runtime_api.h>
#endif

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

at::Tensor ImageToTokenProbsReference(const at::Tensor& q, const at::Tensor& k, const at::Tensor& q_rows,
                                      int64_t heads, double scale) {
  const int64_t b = k.size(0), t = k.size(1), ch = k.size(2), hw = q.size(1);
  const at::Tensor rows = q_rows.defined() ? q.index_select(0, q_rows) : q.expand({b, hw, ch});
  const at::Tensor qh = rows.to(at::kFloat).reshape({b, hw, heads, ch / heads});
  const at::Tensor kh = k.to(at::kFloat).reshape({b, t, heads, ch / heads});
  const at::Tensor s = at::einsum("bphc,bthc->bpht", {qh, kh}) * scale;
  return at::softmax(s, -1).to(q.scalar_type()).reshape({b, hw, heads * t});
}

at::Tensor ImageToTokenProbs(const at::Tensor& q, const at::Tensor& k, const at::Tensor& q_rows, int64_t heads,
                             double scale, Stream stream) {
  TORCH_CHECK(q.dim() == 3 && k.dim() == 3 && q.size(2) == k.size(2) && heads > 0 && k.size(2) % heads == 0,
              "ImageToTokenProbs: expected q [Bq, HW, I] and k [B, T, I] with I a multiple of heads, got ", Describe(q),
              " and ", Describe(k));
  TORCH_CHECK(q.scalar_type() == k.scalar_type() && q.device() == k.device(),
              "ImageToTokenProbs: q and k must share dtype and device");
  TORCH_CHECK(q_rows.defined() ? (q_rows.dim() == 1 && q_rows.size(0) == k.size(0) && q_rows.scalar_type() == at::kLong)
                               : (q.size(0) == k.size(0) || q.size(0) == 1),
              "ImageToTokenProbs: expected q_rows [", k.size(0), "] int64, or q with ", k.size(0), " or 1 rows, got ",
              Describe(q), q_rows.defined() ? " and q_rows " + Describe(q_rows) : std::string());
#ifdef MASKD_WITH_CUDA
  const int64_t b = k.size(0), t = k.size(1), hw = q.size(1);
  if (q.is_cuda() && q.scalar_type() != at::kFloat && k.size(2) == 16 * heads && heads <= 16 && t >= 1 && t <= 16 &&
      q.stride(2) == 1 && q.stride(0) % 8 == 0 && q.stride(1) % 8 == 0 &&
      reinterpret_cast<uintptr_t>(q.data_ptr()) % 16 == 0 && b <= 65535) {
    const at::Tensor kc = k.contiguous();
    const at::Tensor rows = q_rows.defined() ? q_rows.contiguous() : at::Tensor();
    at::Tensor out = at::empty({b, hw, heads * t}, q.options());
    detail::ImageToTokenProbsArgs a;
    a.q = q.data_ptr();
    a.q_batch_stride = q.stride(0);
    a.q_row_stride = q.stride(1);
    a.q_rows = rows.defined() ? rows.data_ptr<int64_t>() : nullptr;
    a.q_batches = q.size(0);
    a.k = kc.data_ptr();
    a.out = out.data_ptr();
    a.batch = b;
    a.positions = hw;
    a.heads = static_cast<int>(heads);
    a.tokens = static_cast<int>(t);
    a.scale = static_cast<float>(scale);
    internal::StreamScope scope(stream, q.device());
    internal::CheckLaunch(detail::LaunchImageToTokenProbs(a, internal::ToDType(q.scalar_type(), "q"), scope.get()),
                          "ImageToTokenProbsKernel");
    return out;
  }
#endif
  (void)stream;
  return ImageToTokenProbsReference(q, k, q_rows, heads, scale);
}

at::Tensor ImageToTokenUpdateReference(const at::Tensor& q, const at::Tensor& k, const at::Tensor& q_rows,
                                       int64_t heads, double scale, const at::Tensor& u, const at::Tensor& residual,
                                       const at::Tensor& residual_rows, const at::Tensor& weight,
                                       const at::Tensor& bias, double eps, const at::Tensor& q_bias) {
  const int64_t b = k.size(0);
  const at::Tensor res = residual_rows.defined() ? residual.index_select(0, residual_rows)
                                                 : residual.expand({b, residual.size(1), residual.size(2)});
  const at::Tensor qq = q_bias.defined() ? q + q_bias : q;
  const at::Tensor updated = at::baddbmm(res, ImageToTokenProbs(qq, k, q_rows, heads, scale), u);
  return RowNorm(updated, weight, bias, eps, /*gelu=*/false);
}

at::Tensor ImageToTokenUpdate(const at::Tensor& q, const at::Tensor& k, const at::Tensor& q_rows, int64_t heads,
                              double scale, const at::Tensor& u, const at::Tensor& residual,
                              const at::Tensor& residual_rows, const at::Tensor& weight, const at::Tensor& bias,
                              double eps, const at::Tensor& q_bias, Stream stream) {
  TORCH_CHECK(q.dim() == 3 && k.dim() == 3 && q.size(2) == k.size(2) && heads > 0 && k.size(2) % heads == 0,
              "ImageToTokenUpdate: expected q [Bq, HW, I] and k [B, T, I] with I a multiple of heads, got ",
              Describe(q), " and ", Describe(k));
  const int64_t b = k.size(0), t = k.size(1), hw = q.size(1);
  TORCH_CHECK(residual.dim() == 3 && residual.size(1) == hw && u.dim() == 3 && u.size(0) == b &&
                  u.size(1) == heads * t && u.size(2) == residual.size(2),
              "ImageToTokenUpdate: expected u [", b, ", ", heads * t, ", D] and residual [Br, ", hw,
              ", D], got u ", Describe(u), " and residual ", Describe(residual));
  TORCH_CHECK(residual_rows.defined()
                  ? (residual_rows.dim() == 1 && residual_rows.size(0) == b && residual_rows.scalar_type() == at::kLong)
                  : (residual.size(0) == b || residual.size(0) == 1),
              "ImageToTokenUpdate: expected residual_rows [", b, "] int64, or a residual with ", b,
              " or 1 rows, got residual ", Describe(residual),
              residual_rows.defined() ? " and residual_rows " + Describe(residual_rows) : std::string());
  const int64_t d = u.size(2);
  for (const auto* x : {&u, &residual, &weight, &bias})
    TORCH_CHECK(x->scalar_type() == q.scalar_type() && x->device() == q.device(),
                "ImageToTokenUpdate: u, residual, weight and bias must have q's dtype and device, got ", Describe(*x));
  TORCH_CHECK(weight.dim() == 1 && weight.size(0) == d && bias.dim() == 1 && bias.size(0) == d,
              "ImageToTokenUpdate: expected weight and bias [", d, "], got ", Describe(weight), " and ",
              Describe(bias));
  TORCH_CHECK(!q_bias.defined() || (q_bias.dim() == 2 && q_bias.size(0) == hw && q_bias.size(1) == q.size(2) &&
                                    q_bias.scalar_type() == q.scalar_type() && q_bias.device() == q.device()),
              "ImageToTokenUpdate: expected q_bias [", hw, ", ", q.size(2), "] with q's dtype and device, got ",
              q_bias.defined() ? Describe(q_bias) : std::string("none"));
#ifdef MASKD_WITH_CUDA
  const auto aligned = [](const at::Tensor& x) { return reinterpret_cast<uintptr_t>(x.data_ptr()) % 16 == 0; };
  if (q.is_cuda() && q.scalar_type() != at::kFloat && heads == detail::kImageToTokenUpdateHeads &&
      k.size(2) == 16 * heads && t >= 1 && t <= 16 && d == detail::kImageToTokenUpdateChannels && b <= 65535 &&
      q.stride(2) == 1 && q.stride(0) % 8 == 0 && q.stride(1) % 8 == 0 && aligned(q) && residual.stride(2) == 1 &&
      residual.stride(1) == d && residual.stride(0) % 8 == 0 && aligned(residual) &&
      (!q_bias.defined() || (q_bias.stride(1) == 1 && q_bias.stride(0) % 8 == 0 && aligned(q_bias)))) {
    internal::StreamScope scope(stream, q.device());
    const at::Tensor kc = k.contiguous(), uc = u.contiguous(), wc = weight.contiguous(), bc = bias.contiguous();
    if (aligned(uc) && aligned(wc) && aligned(bc)) {
      const at::Tensor qr = q_rows.defined() ? q_rows.contiguous() : at::Tensor();
      const at::Tensor rr = residual_rows.defined() ? residual_rows.contiguous() : at::Tensor();
      at::Tensor out = at::empty({b, hw, d}, q.options());
      detail::ImageToTokenUpdateArgs a;
      a.probs.q = q.data_ptr();
      a.probs.q_batch_stride = q.stride(0);
      a.probs.q_row_stride = q.stride(1);
      a.probs.q_rows = qr.defined() ? qr.data_ptr<int64_t>() : nullptr;
      a.probs.q_batches = q.size(0);
      a.probs.k = kc.data_ptr();
      a.probs.batch = b;
      a.probs.positions = hw;
      a.probs.heads = static_cast<int>(heads);
      a.probs.tokens = static_cast<int>(t);
      a.probs.scale = static_cast<float>(scale);
      a.probs.q_bias = q_bias.defined() ? q_bias.data_ptr() : nullptr;
      a.probs.q_bias_row_stride = q_bias.defined() ? q_bias.stride(0) : 0;
      a.u = uc.data_ptr();
      a.residual = residual.data_ptr();
      // One residual for every prompt reads row 0 (batch stride 0), whatever its own stride.
      a.residual_batch_stride = !rr.defined() && residual.size(0) == 1 ? 0 : residual.stride(0);
      a.residual_rows = rr.defined() ? rr.data_ptr<int64_t>() : nullptr;
      a.weight = wc.data_ptr();
      a.bias = bc.data_ptr();
      a.eps = static_cast<float>(eps);
      a.out = out.data_ptr();
      internal::CheckLaunch(detail::LaunchImageToTokenUpdate(a, internal::ToDType(q.scalar_type(), "q"),
                                                             internal::MultiProcessors(q.device()), scope.get()),
                            "ImageToTokenUpdateKernel");
      return out;
    }
  }
#endif
  (void)stream;
  return ImageToTokenUpdateReference(q, k, q_rows, heads, scale, u, residual, residual_rows, weight, bias, eps,
                                     q_bias);
}

at::Tensor UpscaleHyperReference(const at::Tensor& x, const at::Tensor& w, const at::Tensor& bias,
                                 const at::Tensor& hyper, int64_t h, int64_t width) {
  const int64_t b = hyper.size(0), m = hyper.size(1), c2 = w.size(1) / 4;
  const at::Tensor y = at::gelu(at::addmm(bias, x, w)).view({b, h * width * 16, c2});
  const at::Tensor masks = at::bmm(y, hyper.transpose(1, 2));  // [B, HW*16, M]
  return masks.view({b, h, width, 2, 2, 2, 2, m}).permute({0, 7, 1, 3, 5, 2, 4, 6}).reshape({b, m, 4 * h, 4 * width});
}

at::Tensor UpscaleHyper(const at::Tensor& x, const at::Tensor& w, const at::Tensor& bias, const at::Tensor& hyper,
                        int64_t h, int64_t width, const UpscaleInputNorm& norm, Stream stream) {
  TORCH_CHECK(hyper.dim() == 3 && w.dim() == 2 && w.size(1) % 4 == 0 && hyper.size(2) == w.size(1) / 4,
              "UpscaleHyper: expected w [C1, 4*C2] and hyper [B, M, C2], got ", Describe(w), " and ", Describe(hyper));
  TORCH_CHECK(x.dim() == 2 && x.size(1) == w.size(0) && x.size(0) == hyper.size(0) * h * width * 4,
              "UpscaleHyper: expected x [B*h*w*4, C1] = [", hyper.size(0) * h * width * 4, ", ", w.size(0), "], got ",
              Describe(x));
  TORCH_CHECK(bias.dim() == 1 && bias.size(0) == w.size(1), "UpscaleHyper: expected bias [", w.size(1), "], got ",
              Describe(bias));
  const bool normed = norm.weight.defined();
  TORCH_CHECK(!normed || (norm.weight.dim() == 1 && norm.weight.size(0) == x.size(1) && norm.bias.defined() &&
                          norm.bias.sizes() == norm.weight.sizes()),
              "UpscaleHyper: expected the input norm's weight and bias [", x.size(1), "]");
#ifdef MASKD_WITH_CUDA
  const auto aligned = [](const at::Tensor& t) { return reinterpret_cast<uintptr_t>(t.data_ptr()) % 16 == 0; };
  if (x.is_cuda() && x.scalar_type() != at::kFloat && x.size(1) == 64 && w.size(1) == 128 && hyper.size(1) == 4 &&
      width % 8 == 0 && x.numel() > 0) {
    bool ok = true;
    for (const auto* t : {&w, &bias, &hyper, &norm.weight, &norm.bias})  // the norm's only if it is given
      ok = ok && (!t->defined() || (t->scalar_type() == x.scalar_type() && t->device() == x.device()));
    if (ok) {
      const at::Tensor xc = x.contiguous(), wc = w.contiguous(), bc = bias.contiguous(), hc = hyper.contiguous();
      const at::Tensor nw = normed ? norm.weight.contiguous() : at::Tensor(),
                       nb = normed ? norm.bias.contiguous() : at::Tensor();
      if (aligned(xc) && aligned(wc) && (!normed || (aligned(nw) && aligned(nb)))) {
        internal::StreamScope scope(stream, x.device());
        at::Tensor out = at::empty({hyper.size(0), 4, 4 * h, 4 * width}, x.options());
        detail::UpscaleHyperArgs a;
        a.x = xc.data_ptr();
        a.w = wc.data_ptr();
        a.bias = bc.data_ptr();
        a.hyper = hc.data_ptr();
        a.out = out.data_ptr();
        a.rows = x.size(0);
        a.grid_h = static_cast<int>(h);
        a.grid_w = static_cast<int>(width);
        if (normed) {
          a.norm_weight = nw.data_ptr();
          a.norm_bias = nb.data_ptr();
          a.norm_eps = static_cast<float>(norm.eps);
        }
        // MASKD_UPSCALE_GELU_TABLE=1: bf16's GELU by the kernel's table (the same bits; off until
        // timed on a GPU). Read at each call, so that a test compares both in one process.
        const char* table = std::getenv("MASKD_UPSCALE_GELU_TABLE");
        a.gelu_table = table != nullptr && std::string(table) == "1";
        internal::CheckLaunch(detail::LaunchUpscaleHyper(a, internal::ToDType(x.scalar_type(), "x"),
                                                         internal::MultiProcessors(x.device()), scope.get()),
                              "UpscaleHyperKernel");
        return out;
      }
    }
  }
#endif
  if (normed) return UpscaleHyper(RowNorm(x, norm.weight, norm.bias, norm.eps, /*gelu=*/true, stream), w, bias,
                                  hyper, h, width, {}, stream);
  (void)stream;
  return UpscaleHyperReference(x, w, bias, hyper, h, width);
}

bool ImageSideKeysReadsInPlace(const at::Tensor& image) {
  if (image.dim() < 3) return false;
  const int64_t c = image.size(-3);
  return image.is_contiguous() ||
         (image.stride(-3) == 1 && image.stride(-1) == c && image.stride(-2) == image.size(-1) * c);
}

void ImageSideKeys(const std::vector<at::Tensor>& images, const at::Tensor& channel_bias, at::Tensor& out,
                   Stream stream) {
  TORCH_CHECK(out.dim() == 3 && out.is_contiguous() && static_cast<int64_t>(images.size()) <= out.size(0),
              "ImageSideKeys: expected out [N, HW, C] contiguous with N >= ", images.size(), " images, got ",
              Describe(out));
  const int64_t hw = out.size(1), c = out.size(2);
  TORCH_CHECK(channel_bias.numel() == c && channel_bias.scalar_type() == out.scalar_type() &&
                  channel_bias.device() == out.device(),
              "ImageSideKeys: expected ", c, " channel_bias values with out's dtype and device, got ",
              Describe(channel_bias));
  for (size_t i = 0; i < images.size(); ++i) {
    const at::Tensor& x = images[i];
    TORCH_CHECK((x.dim() == 3 || (x.dim() == 4 && x.size(0) == 1)) && x.size(-3) == c &&
                    x.size(-2) * x.size(-1) == hw && x.scalar_type() == out.scalar_type() &&
                    x.device() == out.device(),
                "ImageSideKeys: image ", i, " must be [", c, ", h, w] with h * w = ", hw,
                " in out's dtype and device, got ", Describe(x));
  }
  if (images.empty()) return;
  const at::Tensor bias = channel_bias.reshape({c}).contiguous();
#ifdef MASKD_WITH_CUDA
  // Channel-major ([C, HW] in memory) or position-major ([HW, C]: the encoder's embeddings, whose
  // neck ends in a LayerNorm over channels-last rows viewed as NCHW) images; any other layout takes
  // ATen's path below.
  // MASKD_IMAGE_SIDE_KEYS=aten: ATen's path for every layout (a same-binary comparison on the GPU host).
  static const bool aten_only = [] {
    const char* v = std::getenv("MASKD_IMAGE_SIDE_KEYS");
    return v != nullptr && std::string(v) == "aten";
  }();
  bool fits = !aten_only && out.is_cuda() && out.scalar_type() != at::kFloat;
  for (const auto& x : images) fits = fits && ImageSideKeysReadsInPlace(x);
  if (fits) {
    internal::StreamScope scope(stream, out.device());
    const detail::DType dt = internal::ToDType(out.scalar_type(), "out");
    for (size_t first = 0; first < images.size(); first += detail::kImageSideKeysMaxImages) {
      detail::ImageSideKeysArgs a;
      a.count = static_cast<int>(std::min<size_t>(images.size() - first, detail::kImageSideKeysMaxImages));
      for (int i = 0; i < a.count; ++i) {
        const at::Tensor& x = images[first + static_cast<size_t>(i)];
        a.images[i] = x.data_ptr();
        if (!x.is_contiguous()) a.position_major |= uint64_t{1} << i;
      }
      a.channel_bias = bias.data_ptr();
      a.out = out[static_cast<int64_t>(first)].data_ptr();
      a.channels = c;
      a.positions = hw;
      internal::CheckLaunch(detail::LaunchImageSideKeys(a, dt, scope.get()), "ImageSideKeysKernel");
    }
    return;
  }
#endif
  (void)stream;
  for (size_t i = 0; i < images.size(); ++i)
    out[static_cast<int64_t>(i)].copy_((images[i].reshape({c, hw}) + bias.view({c, 1})).t());
}

std::vector<at::Tensor> CopySlices(const at::Tensor& src, const std::vector<int64_t>& row,
                                   const std::vector<int64_t>& first, const std::vector<int64_t>& count,
                                   Stream stream) {
  TORCH_CHECK(src.dim() >= 2, "CopySlices: expected src [G, K, ...], got ", Describe(src));
  TORCH_CHECK(row.size() == first.size() && row.size() == count.size(),
              "CopySlices: row, first and count must have one entry per slice (", row.size(), ", ", first.size(),
              ", ", count.size(), ")");
  const int64_t G = src.size(0), K = src.size(1);
  for (size_t i = 0; i < row.size(); ++i)
    TORCH_CHECK(row[i] >= 0 && row[i] < G && first[i] >= 0 && count[i] >= 1 && first[i] + count[i] <= K,
                "CopySlices: slice ", i, " (row ", row[i], ", first ", first[i], ", count ", count[i],
                ") is outside src ", Describe(src));
  std::vector<at::Tensor> out;
  out.reserve(row.size());
#ifdef MASKD_WITH_CUDA
  const int64_t inner_bytes = src.numel() / std::max<int64_t>(G * K, 1) * static_cast<int64_t>(src.element_size());
  if (src.is_cuda() && src.is_contiguous() && inner_bytes % 16 == 0 &&
      reinterpret_cast<uintptr_t>(src.data_ptr()) % 16 == 0 && !row.empty()) {
    internal::StreamScope scope(stream, src.device());
    const int64_t n = static_cast<int64_t>(row.size());
    at::Tensor table = at::empty({n, 3}, at::TensorOptions().dtype(at::kLong).pinned_memory(true));
    int64_t* t = table.data_ptr<int64_t>();
    const auto* base = static_cast<const char*>(src.data_ptr());
    int64_t max_bytes = 0;
    std::vector<int64_t> shape = src.sizes().vec();
    shape.erase(shape.begin());
    for (int64_t i = 0; i < n; ++i) {
      shape[0] = count[i];
      out.push_back(at::empty(shape, src.options()));
      const int64_t bytes = count[i] * inner_bytes;
      t[3 * i] = static_cast<int64_t>(reinterpret_cast<uintptr_t>(out.back().data_ptr()));
      t[3 * i + 1] = static_cast<int64_t>(reinterpret_cast<uintptr_t>(base + (row[i] * K + first[i]) * inner_bytes));
      t[3 * i + 2] = bytes;
      max_bytes = std::max(max_bytes, bytes);
    }
    // The caching allocator aligns blocks to 512 bytes, but say so rather than assume it.
    bool aligned = true;
    for (const auto& o : out) aligned = aligned && reinterpret_cast<uintptr_t>(o.data_ptr()) % 16 == 0;
    if (aligned) {
      // Pinned + non_blocking: the copy of the table is ordered on the stream, the host does not wait,
      // and the caching host allocator keeps the buffer until the copy has run.
      const at::Tensor table_dev = table.to(src.device(), /*non_blocking=*/true);
      internal::CheckLaunch(detail::LaunchCopySlices(table_dev.data_ptr<int64_t>(), n, max_bytes, scope.get()),
                            "CopySlicesKernel");
      return out;
    }
    out.clear();
  }
#endif
  (void)stream;
  for (size_t i = 0; i < row.size(); ++i) out.push_back(src[row[i]].narrow(0, first[i], count[i]).clone());
  return out;
}

}  // namespace maskd::kernels
