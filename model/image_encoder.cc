#include "model/image_encoder.h"

#include <ATen/ATen.h>
#include <torch/nn/functional/upsampling.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <string>

#include "kernels/kernels.h"
#include "model/memory_scope.h"

namespace maskd {

namespace F = torch::nn::functional;

LayerNorm2dImpl::LayerNorm2dImpl(int64_t channels, double eps_) : eps(eps_) {
  weight = register_parameter("weight", torch::ones({channels}));
  bias = register_parameter("bias", torch::zeros({channels}));
}

at::Tensor LayerNorm2dImpl::forward(const at::Tensor& x) {
  if (x.scalar_type() != at::kFloat) {
    // Reduced precision: LibTorch's fused layer norm over the channel dimension (fp32 statistics
    // inside), one kernel instead of eight passes over the tensor.
    return at::layer_norm(x.permute({0, 2, 3, 1}), {x.size(1)}, weight, bias, eps).permute({0, 3, 1, 2});
  }
  // fp32: the original's arithmetic (mean, biased variance, sqrt), for exact parity.
  const at::Tensor& xf = x;
  const at::Tensor u = xf.mean(1, /*keepdim=*/true);
  const at::Tensor d = xf - u;
  const at::Tensor s = d.pow(2).mean(1, true);
  at::Tensor y = d / at::sqrt(s + eps);
  y = weight.to(at::kFloat).view({1, -1, 1, 1}) * y + bias.to(at::kFloat).view({1, -1, 1, 1});
  return y.to(x.scalar_type());
}

PatchEmbedImpl::PatchEmbedImpl(int64_t patch, int64_t in_chans, int64_t embed_dim) {
  proj = register_module(
      "proj", torch::nn::Conv2d(torch::nn::Conv2dOptions(in_chans, embed_dim, patch).stride(patch)));
}

at::Tensor PatchEmbedImpl::forward(const at::Tensor& x) { return proj->forward(x).permute({0, 2, 3, 1}); }

at::Tensor PatchEmbedImpl::ForwardRows(const at::Tensor& x) {
  const int64_t p = proj->weight.size(2), e = proj->weight.size(0);
  TORCH_CHECK(x.dim() == 4 && x.size(1) == proj->weight.size(1) && proj->weight.size(3) == p && x.size(2) % p == 0 &&
                  x.size(3) % p == 0,
              "patch embedding: expected [B, ", proj->weight.size(1), ", H, W] with H and W multiples of ", p,
              ", got ", x.sizes());
  const int64_t b = x.size(0), c = x.size(1), h = x.size(2) / p, w = x.size(3) / p;
  // Rows (b, y, x), columns (channel, dy, dx): the order of the conv weight's [E, C, p, p].
  const at::Tensor cols = x.reshape({b, c, h, p, w, p}).permute({0, 2, 4, 1, 3, 5}).reshape({b * h * w, c * p * p});
  const at::Tensor wt = proj->weight.reshape({e, c * p * p}).t();
  const at::Tensor y = proj->bias.defined() ? at::addmm(proj->bias, cols, wt) : at::mm(cols, wt);
  return y.view({b, h, w, e});
}

MlpBlockImpl::MlpBlockImpl(int64_t dim, int64_t hidden) {
  lin1 = register_module("lin1", torch::nn::Linear(dim, hidden));
  lin2 = register_module("lin2", torch::nn::Linear(hidden, dim));
}

at::Tensor MlpBlockImpl::forward(const at::Tensor& x) {
  const at::Tensor h = LinearForward(lin1, lin1_fast, x);
  if (lin2_fast) return lin2_fast->ForwardGelu(h);
  return lin2->forward(at::gelu(h));
}

namespace {
// residual += y in place (residual is a const reference to a tensor written in place by design).
at::Tensor AddInto(const at::Tensor& residual, const at::Tensor& y) {
  at::Tensor r = residual;
  return r.add_(y);
}

// linear over [..., in] as one 2-D GEMM (bias in the epilogue), viewed back to [..., out]. With
// `residual` ([..., out], contiguous) the result is added to it in place instead (the GEMM's
// epilogue, beta = 1) and it is returned. With `xq` (fast taking e4m3 rows) the GEMM reads x's e4m3
// rows, and x gives only the shape.
at::Tensor FlatLinear(torch::nn::Linear& linear, const std::shared_ptr<FastLinear>& fast, const at::Tensor& x,
                      const at::Tensor& residual = {}, const kernels::Fp8Rows* xq = nullptr) {
  std::vector<int64_t> shape = x.sizes().vec();
  if (xq != nullptr) {
    TORCH_CHECK(fast && fast->TakesFp8Rows(), "fp8 rows given to a linear that does not take them");
    const at::Tensor y = fast->ForwardFp8Rows(*xq);
    if (residual.defined()) return AddInto(residual, y.view(residual.sizes()));
    shape.back() = y.size(-1);
    return y.view(shape);
  }
  const at::Tensor x2 = x.reshape({-1, shape.back()});
  if (residual.defined()) {
    if (fast) return AddInto(residual, fast->Forward(x2).view(residual.sizes()));
    kernels::TunedLinear(x2, linear->weight, linear->bias, /*gelu=*/false, residual.view({x2.size(0), -1}),
                         /*accumulate=*/true);
    return residual;
  }
  const at::Tensor y = fast ? fast->Forward(x2) : kernels::TunedLinear(x2, linear->weight, linear->bias, false);
  shape.back() = y.size(-1);
  return y.view(shape);
}
}  // namespace

at::Tensor MlpBlockImpl::ForwardFused(const at::Tensor& x, bool gelu_epilogue, int64_t max_hidden_bytes,
                                      const at::Tensor& residual, const kernels::Fp8Rows* xq) {
  if (xq != nullptr) {
    const at::Tensor h = FlatLinear(lin1, lin1_fast, x, {}, xq);
    at::Tensor y = lin2_fast ? lin2_fast->ForwardGelu(h) : lin2->forward(at::gelu(h));
    std::vector<int64_t> shape = x.sizes().vec();
    shape.back() = y.size(-1);
    y = y.view(shape);
    return residual.defined() ? AddInto(residual, y) : y;
  }
  if (!gelu_epilogue || lin1_fast || lin2_fast) {
    return residual.defined() ? AddInto(residual, forward(x)) : forward(x);
  }
  std::vector<int64_t> shape = x.sizes().vec();
  const at::Tensor x2 = x.reshape({-1, shape.back()});
  const int64_t rows = x2.size(0), hidden = lin1->weight.size(0);
  const int64_t row_bytes = hidden * static_cast<int64_t>(x2.element_size());
  // Whole multiples of 64 rows per chunk (GEMM tiles), at least one tile.
  const int64_t chunk = std::max<int64_t>(64, max_hidden_bytes / std::max<int64_t>(row_bytes, 1) / 64 * 64);
  // cuBLASLt's bias + GELU epilogue (tanh form) and bias epilogue, algorithms tuned per shape; fc2
  // writes its rows of y, or adds them to the residual's.
  const at::Tensor y = residual.defined() ? residual.view({rows, lin2->weight.size(0)})
                                          : at::empty({rows, lin2->weight.size(0)}, x2.options());
  for (int64_t r0 = 0; r0 < rows; r0 += chunk) {
    const int64_t n = std::min(chunk, rows - r0);
    const at::Tensor h = kernels::TunedLinear(x2.narrow(0, r0, n), lin1->weight, lin1->bias, /*gelu=*/true);
    kernels::TunedLinear(h, lin2->weight, lin2->bias, /*gelu=*/false, y.narrow(0, r0, n), residual.defined());
  }
  if (residual.defined()) return residual;
  shape.back() = y.size(1);
  return y.view(shape);
}

at::Tensor GetRelPos(int64_t q_size, int64_t k_size, const at::Tensor& rel_pos) {
  const int64_t max_rel_dist = 2 * std::max(q_size, k_size) - 1;
  at::Tensor resized = rel_pos;
  if (rel_pos.size(0) != max_rel_dist) {
    at::Tensor r = rel_pos.reshape({1, rel_pos.size(0), -1}).permute({0, 2, 1});
    r = F::interpolate(r, F::InterpolateFuncOptions()
                              .size(std::vector<int64_t>{max_rel_dist})
                              .mode(torch::kLinear));
    resized = r.reshape({-1, max_rel_dist}).permute({1, 0});
  }
  const double qs = std::max(static_cast<double>(k_size) / q_size, 1.0);
  const double ks = std::max(static_cast<double>(q_size) / k_size, 1.0);
  const auto opts = at::TensorOptions().dtype(at::kDouble).device(rel_pos.device());
  const at::Tensor q_coords = at::arange(q_size, opts).unsqueeze(1) * qs;
  const at::Tensor k_coords = at::arange(k_size, opts).unsqueeze(0) * ks;
  const at::Tensor rel = (q_coords - k_coords) + (k_size - 1) * ks;
  return resized.index({rel.to(at::kLong)});
}

RelPosAttentionImpl::RelPosAttentionImpl(int64_t dim, int64_t heads, int64_t grid_)
    : num_heads(heads), head_dim(dim / heads), grid(grid_) {
  qkv = register_module("qkv", torch::nn::Linear(dim, dim * 3));
  proj = register_module("proj", torch::nn::Linear(dim, dim));
  rel_pos_h = register_parameter("rel_pos_h", torch::zeros({2 * grid - 1, head_dim}));
  rel_pos_w = register_parameter("rel_pos_w", torch::zeros({2 * grid - 1, head_dim}));
}

void RelPosAttentionImpl::Prepare() {
  // Gathered once per dtype/device so the forward pass builds no index tensors on the host.
  Rh_ = GetRelPos(grid, grid, rel_pos_h.detach());
  Rw_ = GetRelPos(grid, grid, rel_pos_w.detach());
  // k's extra columns for kSdpaFolded, built once here, not at every call.
  key_onehot_ = kernels::FoldedKeyIndicators(grid, FoldedWidth() - head_dim, rel_pos_h.options());
  rev_tables_ = kernels::ReversedRelPosTables(Rh_, Rw_);
}

// rel_h[b, h, i, k] = sum_c q[b, h, i, c] R_h[row(i), k, c] (and rel_w by column), from the unscaled q.
void RelPosAttentionImpl::RelTables(const at::Tensor& q, at::Tensor* rel_h, at::Tensor* rel_w) const {
  const int64_t bh = q.size(0) * q.size(1);
  const at::Tensor r_q = q.reshape({bh, grid, grid, head_dim});
  *rel_h = at::einsum("bhwc,hkc->bhwk", {r_q, Rh_}).reshape({q.size(0), q.size(1), grid * grid, grid});
  *rel_w = at::einsum("bhwc,wkc->bhwk", {r_q, Rw_}).reshape({q.size(0), q.size(1), grid * grid, grid});
}

at::Tensor RelPosAttentionImpl::forward(const at::Tensor& x) { return Forward(x, {}); }

AttentionImpl RelPosAttentionImpl::ImplFor(int64_t batch) const {
  if (impl == AttentionImpl::kFused &&
      std::find(folded_batches.begin(), folded_batches.end(), batch) != folded_batches.end())
    return AttentionImpl::kSdpaFolded;
  return impl;
}

int64_t RelPosAttentionImpl::FoldedBytesPerImage(size_t element_size) const {
  // q' and k' (folded width each), RelPosTables' product (2 (2 grid - 1) columns) and q * scale
  // (head_dim), per head and token: what the LibTorch path holds at once.
  const int64_t width = FoldedWidth();
  return num_heads * grid * grid * (2 * width + 2 * (2 * grid - 1) + head_dim) * static_cast<int64_t>(element_size);
}

at::Tensor RelPosAttentionImpl::FoldedChunk(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v) const {
  const int64_t B = q.size(0), N = q.size(2);
  const double scale = 1.0 / std::sqrt(static_cast<double>(head_dim));
  // q' = [q * scale, rel_h, rel_w, 0...] and k' = [k, e_row, e_col, 0...]. Run 55 (H100) measured the
  // LibTorch concatenations at ~0.12 ms a block for vit_b at batch 1, against 0.18 ms for cuDNN's
  // attention itself; kernels::FoldRelPosQK makes both in one kernel (~0.05 ms, run 57) where it
  // supports the shape, and falls back to the LibTorch way elsewhere (CPU, fp32). MASKD_FOLD_KERNEL=0
  // forces the LibTorch way, to compare the two.
  static const bool fold_kernel = [] {
    const char* v = std::getenv("MASKD_FOLD_KERNEL");
    return !(v && std::string(v) == "0");
  }();
  const kernels::FoldedQK f =
      fold_kernel ? kernels::FoldRelPosQK(q, k, rev_tables_, grid, scale, FoldedWidth(), key_onehot_)
                  : kernels::FoldRelPosQKReference(q, k, rev_tables_, grid, scale, FoldedWidth(), key_onehot_);
  const at::Tensor& qf = f.q;
  const at::Tensor& kf = f.k;
  if (q.is_cuda() && !fold_pad_v) {
    // cuDNN's fused attention takes a narrower V than q/k (measured fastest for this shape on the
    // H200, see BENCHMARKS.md); the generic dispatcher would pick a slower backend.
    return std::get<0>(at::_scaled_dot_product_cudnn_attention(qf, kf, v, std::nullopt, false, 0.0, false,
                                                               false, 1.0));
  }
  at::Tensor vf = v;
  if (fold_pad_v) vf = at::cat({v, at::zeros({B, num_heads, N, FoldedWidth() - head_dim}, v.options())}, -1);
  at::Tensor o = at::scaled_dot_product_attention(qf, kf, vf, std::nullopt, 0.0, false, 1.0);
  return fold_pad_v ? o.narrow(-1, 0, head_dim) : o;
}

at::Tensor RelPosAttentionImpl::Attend(const at::Tensor& q_in, const at::Tensor& k_in, const at::Tensor& v_in,
                                       AttentionImpl use) const {
  const int64_t B = q_in.size(0), N = q_in.size(2), H = grid, W = grid;
  TORCH_CHECK(N == H * W, "attention built for a ", grid, "x", grid, " grid got ", N, " tokens");
  const double scale = 1.0 / std::sqrt(static_cast<double>(head_dim));
  at::Tensor q = q_in, k = k_in, v = v_in;
  at::Tensor out;  // [B, N, heads, hd] or [B*heads, N, hd]
  switch (use) {
    case AttentionImpl::kAuto:
    case AttentionImpl::kMath: {
      // The original: scores, + decomposed rel-pos, softmax, @ v.
      at::Tensor rel_h, rel_w;
      RelTables(q, &rel_h, &rel_w);
      q = q.reshape({B * num_heads, N, head_dim});
      k = k.reshape({B * num_heads, N, head_dim});
      v = v.reshape({B * num_heads, N, head_dim});
      at::Tensor attn = at::matmul(q * scale, k.transpose(-2, -1));
      attn = (attn.view({B * num_heads, H, W, H, W}) + rel_h.view({B * num_heads, H, W, H}).unsqueeze(4) +
              rel_w.view({B * num_heads, H, W, W}).unsqueeze(3))
                 .view({B * num_heads, N, N});
      attn = attn.softmax(-1);
      out = at::matmul(attn, v).view({B, num_heads, H, W, head_dim}).permute({0, 2, 3, 1, 4});
      break;
    }
    case AttentionImpl::kSdpa: {
      at::Tensor rel_h, rel_w;
      RelTables(q, &rel_h, &rel_w);
      const at::Tensor bias = (rel_h.view({B, num_heads, H, W, H, 1}) +
                               rel_w.view({B, num_heads, H, W, 1, W}))
                                  .view({B, num_heads, N, N});
      out = at::scaled_dot_product_attention(q, k, v, bias).permute({0, 2, 1, 3});
      break;
    }
    case AttentionImpl::kSdpaFolded: {
      // In chunks of images whose q', k' and rel-pos terms fit folded_max_bytes; each image's
      // attention is the same computation whichever chunk it is in.
      const int64_t per_image = FoldedBytesPerImage(q.element_size());
      const int64_t chunk = std::max<int64_t>(1, std::min<int64_t>(B, folded_max_bytes / std::max<int64_t>(1, per_image)));
      if (chunk >= B) {
        out = FoldedChunk(q, k, v).permute({0, 2, 1, 3});
        break;
      }
      out = at::empty({B, N, num_heads, head_dim}, q.options());
      for (int64_t b0 = 0; b0 < B; b0 += chunk) {
        const int64_t nb = std::min(chunk, B - b0);
        out.narrow(0, b0, nb)
            .copy_(FoldedChunk(q.narrow(0, b0, nb), k.narrow(0, b0, nb), v.narrow(0, b0, nb)).permute({0, 2, 1, 3}));
      }
      break;
    }
    case AttentionImpl::kFused: {
      if (rel_pos_in_kernel) {
        out = kernels::RelPosAttentionFromTables(q, k, v, rev_tables_, H, W, scale);
      } else if (rel_pos_gemm) {
        const kernels::RelPosTerms t = kernels::RelPosTables(q, rev_tables_, H, W);
        out = kernels::RelPosAttention(q, k, v, t.rel_h, t.rel_w, H, W, scale);
      } else {
        at::Tensor rel_h, rel_w;
        RelTables(q, &rel_h, &rel_w);
        out = kernels::RelPosAttention(q, k, v, rel_h, rel_w, H, W, scale);
      }
      break;
    }
  }
  return out;
}

at::Tensor RelPosAttentionImpl::Forward(const at::Tensor& x, const at::Tensor& residual, const kernels::Fp8Rows* xq) {
  const int64_t B = x.size(0), H = x.size(1), W = x.size(2), C = x.size(3);
  TORCH_CHECK(H == grid && W == grid, "attention built for a ", grid, "x", grid, " grid got ", H,
              "x", W);
  const int64_t N = H * W;
  TORCH_CHECK(xq == nullptr || flat_linear, "fp8 rows need the flat linears");
  const at::Tensor qkv_lin = flat_linear ? FlatLinear(qkv, qkv_fast, x, {}, xq) : LinearForward(qkv, qkv_fast, x);
  const at::Tensor qkv_out = qkv_lin.reshape({B, N, 3, num_heads, head_dim}).permute({2, 0, 3, 1, 4});
  // q, k, v: [B, heads, N, hd] views
  const at::Tensor o = Attend(qkv_out[0], qkv_out[1], qkv_out[2], ImplFor(B)).reshape({B, H, W, C});
  if (flat_linear) return FlatLinear(proj, proj_fast, o, residual);
  const at::Tensor y = LinearForward(proj, proj_fast, o);
  return residual.defined() ? AddInto(residual, y) : y;
}

at::Tensor RelPosAttentionImpl::ForwardRasterWindows(const at::Tensor& x, const at::Tensor& residual,
                                                     const kernels::Fp8Rows* xq) {
  const int64_t B = x.size(0), H = x.size(1), W = x.size(2), C = x.size(3);
  TORCH_CHECK(impl == AttentionImpl::kFused, "raster windows need the fused attention");
  const double scale = 1.0 / std::sqrt(static_cast<double>(head_dim));
  const at::Tensor qkv_out =
      FlatLinear(qkv, qkv_fast, x, {}, xq).reshape({B, H * W, 3, num_heads, head_dim}).permute({2, 0, 3, 1, 4});
  // SAM pads the normalised tokens with zeros before qkv: a padded key/value is the bias.
  const at::Tensor bias = qkv->bias.defined() ? qkv->bias : at::zeros({3 * C}, qkv->weight.options());
  const at::Tensor out = kernels::RelPosWindowAttentionFromTables(
      qkv_out[0], qkv_out[1], qkv_out[2], bias.narrow(0, C, C), bias.narrow(0, 2 * C, C), rev_tables_, grid,
      H, W, scale);
  return FlatLinear(proj, proj_fast, out.reshape({B, H, W, C}), residual);
}

EncoderBlockImpl::EncoderBlockImpl(const SamConfig& c, int64_t window) : window_size(window) {
  // MASKD_FP8_NORM_FUSION=0: the fp8 path as before AddLayerNormFp8, to compare the two in one run.
  static const bool fp8_norm_fusion_default = [] {
    const char* v = std::getenv("MASKD_FP8_NORM_FUSION");
    return !(v && std::string(v) == "0");
  }();
  fp8_norm_fusion = fp8_norm_fusion_default;
  norm1 = register_module(
      "norm1", torch::nn::LayerNorm(torch::nn::LayerNormOptions({c.embed_dim}).eps(1e-6)));
  attn = register_module(
      "attn", RelPosAttention(c.embed_dim, c.num_heads, window > 0 ? window : c.grid_size()));
  norm2 = register_module(
      "norm2", torch::nn::LayerNorm(torch::nn::LayerNormOptions({c.embed_dim}).eps(1e-6)));
  mlp = register_module("mlp", MlpBlock(c.embed_dim, c.mlp_dim));
}

at::Tensor EncoderBlockImpl::forward(const at::Tensor& x0) {
  MemoryScope block(window_size > 0 ? "block.windowed" : "block.global");
  const at::Tensor shortcut = x0;
  at::Tensor x;
  {
    MemoryScope s("norm1");
    x = norm1->forward(x0);
  }
  const int64_t B = x.size(0), H = x.size(1), W = x.size(2);
  {
    MemoryScope s("attention");
    if (window_size > 0) {
      // Window partition with zero padding to a multiple of the window (the padded tokens take part
      // in attention, exactly as in the original), and back.
      x = kernels::WindowUnpartition(attn->forward(kernels::WindowPartition(x, window_size)), window_size, B, H, W);
    } else {
      x = attn->forward(x);
    }
    x = shortcut + x;
  }
  MemoryScope s("mlp");
  return x + mlp->forward(norm2->forward(x));
}

at::Tensor EncoderBlockImpl::ForwardFused(at::Tensor& x, const at::Tensor& pending, bool gelu_epilogue) {
  // norm1 (+ the previous block's residual) written straight into the window layout, attention,
  // then the un-partitioned attention output added to the residual stream together with norm2.
  // With raster_windows the tokens stay raster and the attention kernel makes the windows.
  MemoryScope block(window_size > 0 ? "block.windowed" : "block.global");
  const int64_t layout_window = raster_windows ? 0 : window_size;
  // fp8 linears taking e4m3 rows: the norms write those (see fp8_norm_fusion).
  const bool fp8_rows = fp8_norm_fusion && attn->qkv_fast && attn->qkv_fast->TakesFp8Rows() && mlp->lin1_fast &&
                        mlp->lin1_fast->TakesFp8Rows();
  at::Tensor xn, a, xn2;
  kernels::Fp8Rows xq, xq2;
  {
    MemoryScope s("norm1");
    if (fp8_rows) {
      xq = kernels::AddLayerNormFp8(x, pending, 0, norm1->weight, norm1->bias, norm1->options.eps(), layout_window);
      xn = xq.values;  // its shape
    } else {
      xn = kernels::AddLayerNorm(x, pending, 0, norm1->weight, norm1->bias, norm1->options.eps(), layout_window);
    }
  }
  // With residual_in_gemm (raster layouts only) proj and fc2 add their outputs to x in their
  // epilogues: the norms then read x alone and write only the normalised tokens (two of the four
  // passes over the stream each did), and nothing is left pending. Otherwise the attention output
  // is added by norm2 and the MLP's is returned, pending for the next block's norm1. With fp8 rows
  // the norms add them: the fp8 GEMM has no accumulating epilogue, and a separate add would be one
  // more pass over the stream (x += y, rounded as the norms round it: the same values).
  const bool in_gemm = residual_in_gemm && layout_window == 0 && !fp8_rows;
  const at::Tensor residual = in_gemm ? x : at::Tensor();
  const kernels::Fp8Rows* xq_in = fp8_rows ? &xq : nullptr;
  {
    MemoryScope s("attention");
    a = raster_windows ? attn->ForwardRasterWindows(xn, residual, xq_in) : attn->Forward(xn, residual, xq_in);
    if (!in_gemm) a = a.contiguous();
  }
  {
    MemoryScope s("norm2");
    const at::Tensor delta = in_gemm ? at::Tensor() : a;
    if (fp8_rows) {
      xq2 = kernels::AddLayerNormFp8(x, delta, layout_window, norm2->weight, norm2->bias, norm2->options.eps(), 0);
      xn2 = xq2.values;
    } else {
      xn2 = kernels::AddLayerNorm(x, delta, layout_window, norm2->weight, norm2->bias, norm2->options.eps(), 0);
    }
  }
  MemoryScope s("mlp");
  at::Tensor out = mlp->ForwardFused(xn2, gelu_epilogue, MlpBlockImpl::kMaxHiddenBytes, residual,
                                     fp8_rows ? &xq2 : nullptr);
  return in_gemm ? at::Tensor() : out;
}

ImageEncoderViTImpl::ImageEncoderViTImpl(const SamConfig& c) {
  patch_embed = register_module("patch_embed", PatchEmbed(c.patch_size, c.in_chans, c.embed_dim));
  pos_embed = register_parameter("pos_embed", torch::zeros({1, c.grid_size(), c.grid_size(), c.embed_dim}));
  blocks = register_module("blocks", torch::nn::ModuleList());
  for (int i = 0; i < c.depth; ++i) {
    const bool global = std::find(c.global_attn_indexes.begin(), c.global_attn_indexes.end(), i) !=
                        c.global_attn_indexes.end();
    EncoderBlock b(c, global ? 0 : c.window_size);
    blocks->push_back(b);
    block_list.push_back(b);
  }
  neck = register_module(
      "neck",
      torch::nn::Sequential(
          torch::nn::Conv2d(torch::nn::Conv2dOptions(c.embed_dim, c.out_chans, 1).bias(false)),
          LayerNorm2d(c.out_chans),
          torch::nn::Conv2d(torch::nn::Conv2dOptions(c.out_chans, c.out_chans, 3).padding(1).bias(false)),
          LayerNorm2d(c.out_chans)));
}

void ImageEncoderViTImpl::SetAttention(AttentionImpl impl) {
  for (auto& b : block_list) b->attn->impl = impl;
}

void ImageEncoderViTImpl::Prepare() {
  for (auto& b : block_list) b->attn->Prepare();
}

void ImageEncoderViTImpl::SetFusion(bool fused, bool gelu, bool rel_pos_in_kernel, bool windows_in_kernel,
                                    bool residual_in_gemm) {
  fused_ops = fused;
  gelu_epilogue = fused && gelu;
  for (auto& b : block_list) {
    b->attn->rel_pos_gemm = fused;
    b->attn->rel_pos_in_kernel = fused && rel_pos_in_kernel;
    b->raster_windows = fused && rel_pos_in_kernel && windows_in_kernel && b->window_size > 0 &&
                        b->attn->impl == AttentionImpl::kFused &&
                        kernels::RelPosWindowAttentionSupported(b->window_size, b->attn->head_dim);
    b->attn->flat_linear = fused;
    b->residual_in_gemm = fused && residual_in_gemm;
  }
}

at::Tensor ImageEncoderViTImpl::forward(const at::Tensor& input) {
  MemoryScope encoder("encoder");
  if (!fused_ops) {
    at::Tensor patches;
    {
      MemoryScope s("patch_embed");
      patches = patch_embed->forward(input);
    }
    at::Tensor x = patches + pos_embed;
    for (auto& b : block_list) x = b->forward(x);
    MemoryScope s("neck");
    return neck->forward(x.permute({0, 3, 1, 2}));
  }
  // The residual stream must be contiguous for the fused kernels: the patch embedding as a GEMM
  // writes it so, and pos_embed is added in place. (cuDNN ran the 3-channel, stride-16 convolution
  // with a kernel without tensor cores, precomputed_convolve_sgemm: 4.9 ms of a 92.9 ms vit_b batch
  // of 32 on the H200, run 14, and the add of its permuted NCHW view another 0.5 ms.)
  at::Tensor x;
  {
    MemoryScope s("patch_embed");
    x = patch_embed->ForwardRows(input);
  }
  at::Tensor rows = x.view({x.size(0), x.size(1) * x.size(2), x.size(3)});
  kernels::AddRowsBroadcast(rows, pos_embed.reshape({-1, pos_embed.size(3)}));
  at::Tensor pending;
  for (auto& b : block_list) pending = b->ForwardFused(x, pending, gelu_epilogue);
  if (pending.defined()) x.add_(pending);
  MemoryScope s("neck");
  return neck->forward(x.permute({0, 3, 1, 2}));
}

}  // namespace maskd
