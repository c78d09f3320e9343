#include <array>
#include <tuple>
#include <cstdint>
#include <utility>

#include "kernels/internal.h"
#include "kernels/kernels.h"

namespace maskd::kernels {
namespace {

using internal::CheckDim;
using internal::CheckSize;
using internal::Describe;

// Shapes shared by the kernel and the reference; returns {B, H, N, D}.
std::array<int64_t, 4> CheckAttentionArgs(const at::Tensor& q, const at::Tensor& k,
                                          const at::Tensor& v, const at::Tensor& rel_h,
                                          const at::Tensor& rel_w, int64_t grid_h,
                                          int64_t grid_w) {
  CheckDim(q, "q", 4);
  const int64_t B = q.size(0), H = q.size(1), N = q.size(2), D = q.size(3);
  for (const auto& [t, name] : {std::pair{&k, "k"}, std::pair{&v, "v"}}) {
    CheckDim(*t, name, 4);
    TORCH_CHECK(t->sizes() == q.sizes(), name, ": expected the shape of q ", q.sizes(), ", got ",
                Describe(*t));
    TORCH_CHECK(t->scalar_type() == q.scalar_type(), name, ": expected q's dtype ",
                q.scalar_type(), ", got ", Describe(*t));
    TORCH_CHECK(t->device() == q.device(), name, ": expected q's device ", q.device(), ", got ",
                Describe(*t));
  }
  TORCH_CHECK(grid_h > 0 && grid_w > 0 && grid_h * grid_w == N, "grid_h x grid_w: expected ",
              grid_h, " x ", grid_w, " = N = ", N, " (q is ", Describe(q), ")");
  for (const auto& [t, name, g] : {std::tuple{&rel_h, "rel_h", grid_h}, std::tuple{&rel_w, "rel_w", grid_w}}) {
    TORCH_CHECK(t->dim() == 4 || t->dim() == 5, name, ": expected [B, H, N, g] or [B, H, grid_h, grid_w, g], got ",
                Describe(*t));
    CheckSize(*t, name, 0, B);
    CheckSize(*t, name, 1, H);
    if (t->dim() == 4) {
      CheckSize(*t, name, 2, N);
    } else {
      CheckSize(*t, name, 2, grid_h);
      CheckSize(*t, name, 3, grid_w);
    }
    CheckSize(*t, name, t->dim() - 1, g);
  }
  for (const auto& [t, name] : {std::pair{&rel_h, "rel_h"}, std::pair{&rel_w, "rel_w"}}) {
    TORCH_CHECK(t->device() == q.device(), name, ": expected q's device ", q.device(), ", got ",
                Describe(*t));
    TORCH_CHECK(t->scalar_type() == at::kFloat || t->scalar_type() == q.scalar_type(), name,
                ": expected float32 or q's dtype ", q.scalar_type(), ", got ", Describe(*t));
  }
  return {B, H, N, D};
}

#ifdef MASKD_WITH_CUDA
// The kernel reads q/k/v rows with 16-byte copies: base and row/head/batch strides must be
// multiples of 8 elements. Views of the qkv projection are; anything else is copied once.
at::Tensor AlignedForKernel(const at::Tensor& t) {
  bool ok = t.stride(3) == 1 && reinterpret_cast<uintptr_t>(t.data_ptr()) % 16 == 0;
  for (int64_t d = 0; d < 3 && ok; ++d) ok = t.size(d) == 1 || t.stride(d) % 8 == 0;
  return ok ? t : t.contiguous();
}

// The fields both modes fill alike: q/k/v (aligned for the kernel) and their strides, heads, head
// dim, scale; the caller sets the rest (out, batch, seq, grid, bias source, window mode).
struct QkvForKernel {
  at::Tensor q, k, v;
};
QkvForKernel FillQkvArgs(const at::Tensor& q_in, const at::Tensor& k_in, const at::Tensor& v_in,
                         double scale, detail::RelPosAttentionArgs& a) {
  QkvForKernel t{AlignedForKernel(q_in), AlignedForKernel(k_in), AlignedForKernel(v_in)};
  a.q = t.q.data_ptr();
  a.k = t.k.data_ptr();
  a.v = t.v.data_ptr();
  for (int d = 0; d < 3; ++d) {
    a.q_stride[d] = t.q.stride(d);
    a.k_stride[d] = t.k.stride(d);
    a.v_stride[d] = t.v.stride(d);
  }
  a.heads = static_cast<int>(t.q.size(1));
  a.head_dim = static_cast<int>(t.q.size(3));
  a.scale = static_cast<float>(scale);
  return t;
}

void Launch(const detail::RelPosAttentionArgs& a, at::ScalarType q_dtype, cudaStream_t stream) {
  const detail::DType dtype = internal::ToDType(q_dtype, "q");
  internal::CheckLaunch(detail::LaunchRelPosAttention(a, dtype, stream),
                        detail::RelPosAttentionKernelName(a, dtype));
}

// rev_tables set: the kernel makes the bias rows from it, and rel_h_in / rel_w_in are only shape
// witnesses (checked, never read).
at::Tensor RelPosAttentionCuda(const at::Tensor& q_in, const at::Tensor& k_in,
                               const at::Tensor& v_in, const at::Tensor& rel_h_in,
                               const at::Tensor& rel_w_in, int64_t grid_h, int64_t grid_w,
                               double scale, Stream stream, const at::Tensor& rev_tables = {}) {
  const auto [B, H, N, D] = CheckAttentionArgs(q_in, k_in, v_in, rel_h_in, rel_w_in, grid_h,
                                               grid_w);
  TORCH_CHECK(q_in.scalar_type() == at::kBFloat16 || q_in.scalar_type() == at::kHalf,
              "q: expected bfloat16 or float16 on CUDA, got ", Describe(q_in));
  TORCH_CHECK(rel_h_in.scalar_type() == rel_w_in.scalar_type(),
              "rel_w: expected the dtype of rel_h ", rel_h_in.scalar_type(), ", got ",
              Describe(rel_w_in));
  TORCH_CHECK(detail::RelPosAttentionSupported(static_cast<int>(D), static_cast<int>(grid_h),
                                               static_cast<int>(grid_w), static_cast<int>(N)),
              "RelPosAttention on CUDA: expected head dim 64 or 80 and grid_h + grid_w small "
              "enough for the bias rows in shared memory, got D = ",
              D, ", grid ", grid_h, " x ", grid_w);
  TORCH_CHECK(H <= 65535 && B <= 65535, "RelPosAttention on CUDA: expected B and H <= 65535, got ",
              Describe(q_in));
  internal::StreamScope scope(stream, q_in.device());
  detail::RelPosAttentionArgs a;
  const QkvForKernel qkv = FillQkvArgs(q_in, k_in, v_in, scale, a);
  const at::Tensor& q = qkv.q;
  auto last_contiguous = [](const at::Tensor& t) { return t.stride(-1) == 1 ? t : t.contiguous(); };
  const bool witnesses = rev_tables.defined();  // never read: no copy of the expanded views
  const at::Tensor rel_h = witnesses ? rel_h_in : last_contiguous(rel_h_in);
  const at::Tensor rel_w = witnesses ? rel_w_in : last_contiguous(rel_w_in);
  at::Tensor out = at::empty({B, N, H, D}, q.options());
  if (out.numel() == 0) return out;

  a.rel_h = rel_h.data_ptr();
  a.rel_w = rel_w.data_ptr();
  // (b, h, query grid row, query grid column) strides.
  auto grid_strides = [&](const at::Tensor& t, int64_t* s) {
    s[0] = t.stride(0);
    s[1] = t.stride(1);
    if (t.dim() == 4) {
      s[2] = grid_w * t.stride(2);
      s[3] = t.stride(2);
    } else {
      s[2] = t.stride(2);
      s[3] = t.stride(3);
    }
  };
  grid_strides(rel_h, a.rel_h_stride);
  grid_strides(rel_w, a.rel_w_stride);
  a.rel_is_float32 = rel_h.scalar_type() == at::kFloat;
  at::Tensor tables;
  if (rev_tables.defined()) {
    tables = rev_tables.to(q.scalar_type()).contiguous();
    a.rel_tables = tables.data_ptr();
  }
  a.out = out.data_ptr();
  a.batch = static_cast<int>(B);
  a.seq = static_cast<int>(N);
  a.grid_h = static_cast<int>(grid_h);
  a.grid_w = static_cast<int>(grid_w);
  Launch(a, q.scalar_type(), scope.get());
  return out;
}
#endif

void CheckRevTables(const at::Tensor& q, const at::Tensor& rev_tables, int64_t grid_h,
                    int64_t grid_w);

#ifdef MASKD_WITH_CUDA
at::Tensor RelPosWindowAttentionCuda(const at::Tensor& q_in, const at::Tensor& k_in,
                                     const at::Tensor& v_in, const at::Tensor& pad_k_in,
                                     const at::Tensor& pad_v_in, const at::Tensor& rev_tables,
                                     int64_t window, int64_t img_h, int64_t img_w, double scale,
                                     Stream stream) {
  const int64_t B = q_in.size(0), H = q_in.size(1), D = q_in.size(3);
  const int64_t nh = (img_h + window - 1) / window, nw = (img_w + window - 1) / window;
  TORCH_CHECK(q_in.scalar_type() == at::kBFloat16 || q_in.scalar_type() == at::kHalf,
              "q: expected bfloat16 or float16 on CUDA, got ", Describe(q_in));
  const int64_t seq = window * window;
  TORCH_CHECK(window == detail::kRelPosWindowModeSize, "RelPosWindowAttention on CUDA: window ",
              window, " is not compiled (expected SAM's ", detail::kRelPosWindowModeSize,
              "; RelPosWindowAttentionSupported says which are)");
  TORCH_CHECK(detail::RelPosAttentionSupported(static_cast<int>(D), static_cast<int>(window),
                                               static_cast<int>(window), static_cast<int>(seq)),
              "RelPosWindowAttention on CUDA: expected head dim 64 or 80, got D = ", D,
              ", window ", window);
  TORCH_CHECK(H <= 65535 && B * nh * nw <= 65535,
              "RelPosWindowAttention on CUDA: expected heads and windows <= 65535, got ",
              Describe(q_in), " in ", nh * nw, " windows per image");
  internal::StreamScope scope(stream, q_in.device());
  detail::RelPosAttentionArgs a;
  const QkvForKernel qkv = FillQkvArgs(q_in, k_in, v_in, scale, a);
  const at::Tensor& q = qkv.q;
  // The kernel multiplies key/value token indices by 32-bit byte strides in window mode.
  TORCH_CHECK(a.k_stride[2] * q.element_size() <= UINT32_MAX && a.v_stride[2] * q.element_size() <= UINT32_MAX,
              "RelPosWindowAttention on CUDA: k/v token strides must fit in 32 bits as bytes, got ", a.k_stride[2],
              " and ", a.v_stride[2], " elements");
  // The pad rows are read with 16-byte copies at h * D: contiguous and aligned.
  auto pad_row = [&](const at::Tensor& t) {
    at::Tensor c = t.to(q.scalar_type()).contiguous();
    if (reinterpret_cast<uintptr_t>(c.data_ptr()) % 16 != 0) c = c.clone();
    return c;
  };
  const at::Tensor pad_k = pad_row(pad_k_in), pad_v = pad_row(pad_v_in);
  const at::Tensor tables = rev_tables.to(q.scalar_type()).contiguous();
  at::Tensor out = at::empty({B, img_h * img_w, H, D}, q.options());
  if (out.numel() == 0) return out;

  a.rel_tables = tables.data_ptr();
  a.window = static_cast<int>(window);
  a.img_h = static_cast<int>(img_h);
  a.img_w = static_cast<int>(img_w);
  a.pad_k = pad_k.data_ptr();
  a.pad_v = pad_v.data_ptr();
  a.out = out.data_ptr();
  a.batch = static_cast<int>(B * nh * nw);
  a.seq = static_cast<int>(seq);
  a.grid_h = a.grid_w = static_cast<int>(window);
  Launch(a, q.scalar_type(), scope.get());
  return out;
}
#endif

void CheckRevTables(const at::Tensor& q, const at::Tensor& rev_tables, int64_t grid_h,
                    int64_t grid_w) {
  CheckDim(q, "q", 4);
  CheckDim(rev_tables, "rev_tables", 2);
  const int64_t L = (2 * grid_h - 1) + (2 * grid_w - 1);
  TORCH_CHECK(rev_tables.size(0) == L && rev_tables.size(1) == q.size(3), "rev_tables: expected [",
              L, ", ", q.size(3), "] for a ", grid_h, " x ", grid_w, " grid, got ",
              Describe(rev_tables));
  TORCH_CHECK(rev_tables.device() == q.device(), "rev_tables: expected q's device ", q.device(),
              ", got ", Describe(rev_tables));
}

}  // namespace

at::Tensor RelPosAttentionFromTables(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                     const at::Tensor& rev_tables, int64_t grid_h, int64_t grid_w,
                                     double scale, Stream stream) {
  CheckRevTables(q, rev_tables, grid_h, grid_w);
#ifdef MASKD_WITH_CUDA
  if (q.is_cuda()) {
    // Zero-stride views of one uninitialised element carry the shapes CheckAttentionArgs wants
    // (no memory, no fill kernel; the kernel never reads them).
    const int64_t B = q.size(0), H = q.size(1), N = q.size(2);
    const at::Tensor one = at::empty({1}, q.options());
    const at::Tensor shape_h = one.expand({B, H, N, grid_h});
    const at::Tensor shape_w = one.expand({B, H, N, grid_w});
    return RelPosAttentionCuda(q, k, v, shape_h, shape_w, grid_h, grid_w, scale, stream,
                               rev_tables);
  }
#endif
  (void)stream;
  const RelPosTerms t = RelPosTables(q, rev_tables, grid_h, grid_w);
  return RelPosAttentionReference(q, k, v, t.rel_h, t.rel_w, grid_h, grid_w, scale);
}

// SAM's window, the one window mode the CUDA kernel is compiled for (kernels/launchers.h, which a
// build without CUDA does not include): the same answer with and without CUDA.
constexpr int64_t kWindowModeSize = 14;
#ifdef MASKD_WITH_CUDA
static_assert(kWindowModeSize == detail::kRelPosWindowModeSize, "keep in step with launchers.h");
#endif

bool RelPosWindowAttentionSupported(int64_t window, int64_t head_dim) {
  return window == kWindowModeSize && (head_dim == 64 || head_dim == 80);
}

at::Tensor RelPosWindowAttentionFromTables(const at::Tensor& q, const at::Tensor& k,
                                           const at::Tensor& v, const at::Tensor& pad_k,
                                           const at::Tensor& pad_v, const at::Tensor& rev_tables,
                                           int64_t window, int64_t img_h, int64_t img_w,
                                           double scale, Stream stream) {
  CheckDim(q, "q", 4);
  const int64_t B = q.size(0), H = q.size(1), D = q.size(3);
  TORCH_CHECK(window > 0 && img_h > 0 && img_w > 0 && q.size(2) == img_h * img_w,
              "q: expected [B, heads, img_h * img_w = ", img_h * img_w, ", D] and a window > 0, got ",
              Describe(q), ", window ", window);
  for (const auto& [t, name] : {std::pair{&k, "k"}, std::pair{&v, "v"}}) {
    TORCH_CHECK(t->sizes() == q.sizes() && t->scalar_type() == q.scalar_type() &&
                    t->device() == q.device(),
                name, ": expected q's shape, dtype and device ", Describe(q), ", got ", Describe(*t));
  }
  for (const auto& [t, name] : {std::pair{&pad_k, "pad_k"}, std::pair{&pad_v, "pad_v"}}) {
    TORCH_CHECK(t->numel() == H * D && t->device() == q.device(), name, ": expected ", H * D,
                " values (heads x D) on ", q.device(), ", got ", Describe(*t));
  }
  CheckRevTables(q, rev_tables, window, window);
#ifdef MASKD_WITH_CUDA
  if (q.is_cuda())
    return RelPosWindowAttentionCuda(q, k, v, pad_k, pad_v, rev_tables, window, img_h, img_w,
                                     scale, stream);
#endif
  (void)stream;
  // SAM's order, spelled out: raster -> zero-padded windows (a padded token's key and value are the
  // projection's bias), attention per window, windows -> raster with the padding cropped.
  const int64_t nh = (img_h + window - 1) / window, nw = (img_w + window - 1) / window;
  const int64_t Hp = nh * window, Wp = nw * window;
  auto windows = [&](const at::Tensor& t, const at::Tensor& pad) {
    const at::Tensor x = t.reshape({B, H, img_h, img_w, D}).to(at::kFloat);
    at::Tensor padded = pad.reshape({1, H, 1, 1, D}).to(at::kFloat).expand({B, H, Hp, Wp, D}).clone();
    padded.slice(2, 0, img_h).slice(3, 0, img_w).copy_(x);
    return padded.reshape({B, H, nh, window, nw, window, D})
        .permute({0, 2, 4, 1, 3, 5, 6})
        .reshape({B * nh * nw, H, window * window, D});
  };
  const at::Tensor qw = windows(q, at::zeros({H * D}, q.options()));
  const at::Tensor kw = windows(k, pad_k), vw = windows(v, pad_v);
  const RelPosTerms t = RelPosTables(qw, rev_tables.to(at::kFloat), window, window);
  const at::Tensor o = RelPosAttentionReference(qw, kw, vw, t.rel_h, t.rel_w, window, window, scale);
  return o.reshape({B, nh, nw, window, window, H, D})
      .permute({0, 1, 3, 2, 4, 5, 6})
      .reshape({B, Hp, Wp, H, D})
      .slice(1, 0, img_h)
      .slice(2, 0, img_w)
      .reshape({B, img_h * img_w, H, D})
      .to(q.scalar_type());
}

at::Tensor RelPosAttentionReference(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                    const at::Tensor& rel_h, const at::Tensor& rel_w,
                                    int64_t grid_h, int64_t grid_w, double scale) {
  const auto [B, H, N, D] = CheckAttentionArgs(q, k, v, rel_h, rel_w, grid_h, grid_w);
  const at::Tensor qf = q.to(at::kFloat);
  const at::Tensor kf = k.to(at::kFloat);
  const at::Tensor vf = v.to(at::kFloat);
  // SAM's order: (q * scale) @ k^T, then add_decomposed_rel_pos's broadcast of rel_h over key
  // columns and rel_w over key rows.
  at::Tensor attn = at::matmul(qf * scale, kf.transpose(-2, -1));
  const at::Tensor bias = rel_h.to(at::kFloat).reshape({B, H, N, grid_h, 1}) +
                          rel_w.to(at::kFloat).reshape({B, H, N, 1, grid_w});
  attn = attn + bias.reshape({B, H, N, N});
  attn = at::softmax(attn, -1);
  return at::matmul(attn, vf).permute({0, 2, 1, 3}).contiguous().to(q.scalar_type());
}

at::Tensor RelPosAttention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                           const at::Tensor& rel_h, const at::Tensor& rel_w, int64_t grid_h,
                           int64_t grid_w, double scale, Stream stream) {
#ifdef MASKD_WITH_CUDA
  if (q.is_cuda()) return RelPosAttentionCuda(q, k, v, rel_h, rel_w, grid_h, grid_w, scale, stream);
#endif
  (void)stream;
  return RelPosAttentionReference(q, k, v, rel_h, rel_w, grid_h, grid_w, scale);
}

}  // namespace maskd::kernels
