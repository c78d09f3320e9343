// The encoder-fusion helpers' LibTorch references (the CPU path) against independent plain
// computations: AddLayerNorm's layouts and in-place residual, the window (un)partition, and the
// rel-pos terms as one matmul with skewed views against the gathered tables + einsum of SAM.
#include <gtest/gtest.h>

#include <ATen/ATen.h>

#include <cmath>
#include <vector>

#include "kernels/kernels.h"

namespace mk = maskd::kernels;

namespace {

at::Generator Gen(uint64_t seed) { return at::make_generator<at::CPUGeneratorImpl>(seed); }
at::Tensor Randn(at::IntArrayRef s, uint64_t seed) { return at::randn(s, Gen(seed), at::kFloat); }
double MaxAbs(const at::Tensor& a, const at::Tensor& b) {
  return (a.to(at::kDouble) - b.to(at::kDouble)).abs().max().item<double>();
}

// Token (y, x) of image b in the windowed layout, written out by hand.
at::Tensor WindowToken(const at::Tensor& windows, int64_t ws, int64_t b, int64_t H, int64_t W, int64_t y,
                       int64_t x) {
  const int64_t nh = (H + ws - 1) / ws, nw = (W + ws - 1) / ws;
  return windows[(b * nh + y / ws) * nw + x / ws][y % ws][x % ws];
}

// The reference is the decoder's original arithmetic (a batched matmul of the heads, softmax,
// permute to [B, HW, heads * T]); on the CPU ImageToTokenProbs is the reference.
TEST(kernels_fusion_cpu, ImageToTokenProbsEqualsMatmulSoftmaxPermute) {
  const int64_t B = 3, HW = 20, heads = 4, c = 16, I = heads * c, T = 5;
  const at::Tensor k = Randn({B, T, I}, 21);
  const double scale = 1.0 / std::sqrt(static_cast<double>(c));
  auto original = [&](const at::Tensor& q) {  // q [B, HW, I]
    const at::Tensor qh = q.reshape({B, HW, heads, c}).permute({0, 2, 1, 3});
    const at::Tensor kh = (k * scale).view({B, T, heads, c}).permute({0, 2, 3, 1});
    return at::softmax(at::matmul(qh, kh), -1).permute({0, 2, 1, 3}).contiguous().view({B, HW, heads * T});
  };
  const at::Tensor wide = Randn({B, HW, 3 * I}, 22);
  const at::Tensor q = wide.narrow(2, I, I);  // strided rows, as the projection's output
  EXPECT_LT(MaxAbs(mk::ImageToTokenProbs(q, k, {}, heads, scale), original(q)), 1e-6);
  EXPECT_LT(MaxAbs(mk::ImageToTokenProbsReference(q, k, {}, heads, scale), original(q)), 1e-6);
  const at::Tensor one = Randn({1, HW, I}, 23);
  EXPECT_LT(MaxAbs(mk::ImageToTokenProbs(one, k, {}, heads, scale), original(one.expand({B, HW, I}))), 1e-6);
  const at::Tensor groups = Randn({2, HW, I}, 24);
  const at::Tensor rows = at::tensor(std::vector<int64_t>{1, 0, 1}, at::TensorOptions().dtype(at::kLong));
  EXPECT_LT(MaxAbs(mk::ImageToTokenProbs(groups, k, rows, heads, scale), original(groups.index_select(0, rows))), 1e-6);
  // Mismatched shapes are refused, naming the arguments.
  EXPECT_THROW(mk::ImageToTokenProbs(groups, k, {}, heads, scale), c10::Error);
  EXPECT_THROW(mk::ImageToTokenProbs(q, k, {}, 5, scale), c10::Error);
}

// The image->token step with norm4 (the CPU path is its reference) against SAM's arithmetic written
// out per prompt: softmax of the per-head scores, P u added to the residual, LayerNorm; the residual
// per prompt, shared by every prompt, and picked per prompt by residual_rows; a q_bias added to q.
TEST(kernels_fusion_cpu, ImageToTokenUpdateIsProbsValueProductAndNorm) {
  const int64_t B = 3, HW = 20, heads = 4, c = 16, I = heads * c, T = 5, D = 24;
  const double scale = 1.0 / std::sqrt(static_cast<double>(c)), eps = 1e-5;
  const at::Tensor q = Randn({B, HW, 3 * I}, 41).narrow(2, I, I);
  const at::Tensor k = Randn({B, T, I}, 42), u = Randn({B, heads * T, D}, 43);
  const at::Tensor w = Randn({D}, 44) * 0.2 + 1, bias = Randn({D}, 45) * 0.2;
  auto original = [&](const at::Tensor& res) {  // res [B, HW, D]
    std::vector<at::Tensor> out;
    for (int64_t b = 0; b < B; ++b) {
      const at::Tensor qh = q[b].reshape({HW, heads, c}).permute({1, 0, 2});       // [h, HW, c]
      const at::Tensor kh = k[b].reshape({T, heads, c}).permute({1, 2, 0});        // [h, c, T]
      const at::Tensor p = at::softmax(at::bmm(qh, kh) * scale, -1).permute({1, 0, 2}).reshape({HW, heads * T});
      out.push_back(at::layer_norm(res[b] + at::mm(p, u[b]), {D}, w, bias, eps));
    }
    return at::stack(out);
  };
  const at::Tensor own = Randn({B, HW, D}, 46);
  EXPECT_LT(MaxAbs(mk::ImageToTokenUpdate(q, k, {}, heads, scale, u, own, {}, w, bias, eps), original(own)), 1e-5);
  const at::Tensor one = Randn({1, HW, D}, 47);
  EXPECT_LT(MaxAbs(mk::ImageToTokenUpdate(q, k, {}, heads, scale, u, one, {}, w, bias, eps),
                   original(one.expand({B, HW, D}))),
            1e-5);
  const at::Tensor groups = Randn({2, HW, D}, 48);
  const at::Tensor rows = at::tensor(std::vector<int64_t>{1, 0, 1}, at::TensorOptions().dtype(at::kLong));
  EXPECT_LT(MaxAbs(mk::ImageToTokenUpdate(q, k, {}, heads, scale, u, groups, rows, w, bias, eps),
                   original(groups.index_select(0, rows))),
            1e-5);
  // q_bias (the positional share of the query projection, [HW, I]) is added to every prompt's q:
  // q - q_bias with q_bias gives SAM's result on q.
  const at::Tensor q_bias = Randn({HW, I}, 49);
  EXPECT_LT(MaxAbs(mk::ImageToTokenUpdate(q - q_bias, k, {}, heads, scale, u, own, {}, w, bias, eps, q_bias),
                   original(own)),
            1e-5);
  // Mismatched shapes are refused with an error naming the argument.
  EXPECT_THROW(mk::ImageToTokenUpdate(q, k, {}, heads, scale, u, own, {}, w, bias, eps, q_bias.narrow(0, 0, 8)),
               c10::Error);
  EXPECT_THROW(mk::ImageToTokenUpdate(q, k, {}, heads, scale, u, groups, {}, w, bias, eps), c10::Error);
  EXPECT_THROW(mk::ImageToTokenUpdate(q, k, {}, heads, scale, u.narrow(1, 0, T), own, {}, w, bias, eps), c10::Error);
  EXPECT_THROW(mk::ImageToTokenUpdate(q, k, {}, heads, scale, u, own, {}, w.narrow(0, 0, 8), bias, eps), c10::Error);
}

// FewQueryAttention's CPU path (its reference) is SDPA's function in the [N, L, H, C] layout, on
// strided per-head views as the decoder passes them; the CUDA kernel is held to it on the GPU.
TEST(kernels_fusion_cpu, FewQueryAttentionIsSdpaInTheOutProjLayout) {
  const int64_t N = 3, H = 4, L = 7, S = 50, C = 16;
  const at::Tensor y = Randn({N, S, 3 * H * C}, 31);  // a fused k/v projection's output
  const at::Tensor k = y.narrow(2, 0, H * C).view({N, S, H, C}).transpose(1, 2);
  const at::Tensor v = y.narrow(2, H * C, H * C).view({N, S, H, C}).transpose(1, 2);
  const at::Tensor q = Randn({N, L, H, C}, 32).transpose(1, 2);
  const double scale = 1.0 / std::sqrt(static_cast<double>(C));
  const at::Tensor sdpa = at::scaled_dot_product_attention(q, k, v).transpose(1, 2);  // [N, L, H, C]
  const at::Tensor out = mk::FewQueryAttention(q, k, v, scale);
  ASSERT_EQ(out.sizes(), (std::vector<int64_t>{N, L, H, C}));
  EXPECT_TRUE(out.is_contiguous());
  EXPECT_LT(MaxAbs(out, sdpa), 1e-5);
  // Another scale is not SDPA's default: the result moves.
  EXPECT_GT(MaxAbs(mk::FewQueryAttention(q, k, v, 2 * scale), sdpa), 1e-3);
  EXPECT_FALSE(mk::FewQueryAttentionFits(q, k, v));  // no kernel on the CPU
  EXPECT_THROW(mk::FewQueryAttention(q, k.narrow(2, 0, 10), v, scale), c10::Error);
  EXPECT_THROW(mk::FewQueryAttention(q.narrow(3, 0, 8), k, v, scale), c10::Error);
  // Shared keys picked per query batch: the same as attending to the gathered rows, and a missing or
  // mis-sized row index is refused.
  const at::Tensor rows = at::tensor(std::vector<int64_t>{1, 1, 0}, at::TensorOptions().dtype(at::kLong));
  const at::Tensor kg = k.narrow(0, 0, 2), vg = v.narrow(0, 0, 2);
  EXPECT_LT(MaxAbs(mk::FewQueryAttentionRows(q, kg, vg, rows, scale),
                   at::scaled_dot_product_attention(q, kg.index_select(0, rows), vg.index_select(0, rows))
                       .transpose(1, 2)),
            1e-5);
  EXPECT_THROW(mk::FewQueryAttentionRows(q, kg, vg, rows.narrow(0, 0, 2), scale), c10::Error);
  EXPECT_THROW(mk::FewQueryAttentionRows(q, kg, vg, at::Tensor(), scale), c10::Error);
  // Biases shared by every batch: a [S, H * C] key table (a strided slice, as of the decoder's pe
  // table) and a [H * C] value bias give SDPA's result on k + k_bias and v + v_bias, with and without
  // row indices; each bias on its own too; a mis-sized bias is refused.
  const at::Tensor k_bias = Randn({S, 3 * H * C}, 33).narrow(1, H * C, H * C), v_bias = Randn({H * C}, 34);
  const at::Tensor kb = k_bias.view({S, H, C}).transpose(0, 1), vb = v_bias.view({H, 1, C});
  EXPECT_LT(MaxAbs(mk::FewQueryAttentionBiased(q, k, v, {}, k_bias, v_bias, scale),
                   at::scaled_dot_product_attention(q, k + kb, v + vb).transpose(1, 2)),
            1e-5);
  EXPECT_LT(MaxAbs(mk::FewQueryAttentionBiased(q, kg, vg, rows, k_bias, v_bias, scale),
                   at::scaled_dot_product_attention(q, kg.index_select(0, rows) + kb, vg.index_select(0, rows) + vb)
                       .transpose(1, 2)),
            1e-5);
  EXPECT_LT(MaxAbs(mk::FewQueryAttentionBiased(q, k, v, {}, k_bias, {}, scale),
                   at::scaled_dot_product_attention(q, k + kb, v).transpose(1, 2)),
            1e-5);
  EXPECT_LT(MaxAbs(mk::FewQueryAttentionBiased(q, k, v, {}, {}, v_bias, scale),
                   at::scaled_dot_product_attention(q, k, v + vb).transpose(1, 2)),
            1e-5);
  EXPECT_THROW(mk::FewQueryAttentionBiased(q, k, v, {}, k_bias.narrow(0, 0, 10), v_bias, scale), c10::Error);
  EXPECT_THROW(mk::FewQueryAttentionBiased(q, k, v, {}, k_bias, v_bias.narrow(0, 0, 8), scale), c10::Error);
}

// AbsorbedAttention's CPU path (its reference) against the projected attention it replaces, written
// with other ops: k = x Wk^T + k_bias and v = x Wv^T per head, SDPA, then the per-head value
// projection moved after the sum (z_h Wv_h^T). qa = Wk_h^T q strided as the decoder makes it.
TEST(kernels_fusion_cpu, AbsorbedAttentionIsTheProjectedAttentionOnTheKeysThemselves) {
  const int64_t N = 3, H = 8, L = 5, S = 70, C = 16, D = 256, I = H * C;
  const at::Tensor x = Randn({N, S, D}, 41);
  const at::Tensor wk = Randn({I, D}, 42) * 0.1, wv = Randn({I, D}, 43) * 0.1;
  const at::Tensor table = Randn({S, 3 * I}, 44);  // the decoder's [HW, 3I] positional table
  const at::Tensor k_bias = table.narrow(1, 0, I);
  const at::Tensor q = Randn({N, L, H, C}, 45).transpose(1, 2);  // [N, H, L, C], strided
  const double scale = 1.0 / std::sqrt(static_cast<double>(C));
  const at::Tensor k = (at::matmul(x, wk.t()) + k_bias).view({N, S, H, C}).transpose(1, 2);
  const at::Tensor v = at::matmul(x, wv.t()).view({N, S, H, C}).transpose(1, 2);
  const at::Tensor projected = at::scaled_dot_product_attention(q, k, v).transpose(1, 2);  // [N, L, H, C]
  const at::Tensor qa = at::matmul(q.transpose(0, 1).reshape({H, N * L, C}), wk.view({H, C, D}))
                            .view({H, N, L, D})
                            .permute({1, 0, 2, 3});
  const at::Tensor z = mk::AbsorbedAttention(qa, q, x, k_bias, scale);  // [N, L, H, D]
  ASSERT_EQ(z.sizes(), (std::vector<int64_t>{N, L, H, D}));
  EXPECT_TRUE(z.is_contiguous());
  const at::Tensor absorbed = at::einsum("nlhd,hcd->nlhc", {z, wv.view({H, C, D})});
  EXPECT_LT(MaxAbs(absorbed, projected), 2e-5);
  // Without the key bias: the keys' own share only; and the bias changes the answer.
  const at::Tensor k0 = at::matmul(x, wk.t()).view({N, S, H, C}).transpose(1, 2);
  const at::Tensor z0 = mk::AbsorbedAttention(qa, q, x, at::Tensor(), scale);
  EXPECT_LT(MaxAbs(at::einsum("nlhd,hcd->nlhc", {z0, wv.view({H, C, D})}),
                   at::scaled_dot_product_attention(q, k0, v).transpose(1, 2)),
            2e-5);
  EXPECT_GT(MaxAbs(z0, z), 1e-3);
  EXPECT_FALSE(mk::AbsorbedAttentionFits(qa, q, x, k_bias));  // no kernel on the CPU
  EXPECT_FALSE(mk::AbsorbedAttentionShapeSupported(H, C, D, L, at::kBFloat16, at::Device(at::kCPU)));
  // Mismatched arguments are refused with a message, not read out of bounds.
  EXPECT_THROW(mk::AbsorbedAttention(qa, q, x.narrow(2, 0, 128), k_bias, scale), c10::Error);
  EXPECT_THROW(mk::AbsorbedAttention(qa, q.narrow(2, 0, 2), x, k_bias, scale), c10::Error);
  EXPECT_THROW(mk::AbsorbedAttention(qa, q, x, k_bias.narrow(0, 0, S - 1), scale), c10::Error);
  EXPECT_THROW(mk::AbsorbedAttention(qa, q, x.narrow(0, 0, 2), k_bias, scale), c10::Error);
}

// The shared decoder's image side: out[i][y * w + x][c] = image_i[c][y][x] + bias[c], element by
// element, for channel-major images and a position-major one (the encoder's layout); rows of out past
// the images are left alone; mismatched shapes are refused.
TEST(kernels_fusion_cpu, ImageSideKeysIsBiasedChannelsLastPerImage) {
  const int64_t C = 6, h = 3, w = 5, N = 3;
  const std::vector<at::Tensor> images = {Randn({C, h, w}, 61), Randn({1, C, h, w}, 62),
                                          Randn({1, h, w, C}, 65).permute({0, 3, 1, 2})};
  const at::Tensor bias = Randn({1, C, 1, 1}, 63);
  at::Tensor out = at::full({N + 1, h * w, C}, 7.0);
  mk::ImageSideKeys(images, bias, out);
  for (int64_t i = 0; i < N; ++i)
    for (int64_t y = 0; y < h; ++y)
      for (int64_t x = 0; x < w; ++x)
        for (int64_t c = 0; c < C; ++c)
          EXPECT_EQ(out[i][y * w + x][c].item<float>(),
                    images[i].reshape({C, h, w})[c][y][x].item<float>() + bias.view({C})[c].item<float>())
              << i << " " << y << " " << x << " " << c;
  EXPECT_TRUE(at::equal(out[N], at::full({h * w, C}, 7.0)));
  // The layouts the CUDA launch reads in place (the others, e.g. h and w swapped in memory, go through
  // ATen there too).
  EXPECT_TRUE(mk::ImageSideKeysReadsInPlace(images[0]));
  EXPECT_TRUE(mk::ImageSideKeysReadsInPlace(images[1]));
  EXPECT_TRUE(mk::ImageSideKeysReadsInPlace(images[2]));
  EXPECT_FALSE(mk::ImageSideKeysReadsInPlace(Randn({C, w, h}, 66).transpose(1, 2)));
  EXPECT_FALSE(mk::ImageSideKeysReadsInPlace(Randn({w, h, C}, 67).permute({2, 1, 0})));
  EXPECT_THROW(mk::ImageSideKeys({Randn({C, h, w + 1}, 64)}, bias, out), c10::Error);
  EXPECT_THROW(mk::ImageSideKeys(images, bias.narrow(1, 0, C - 1), out), c10::Error);
  at::Tensor small = at::empty({1, h * w, C});
  EXPECT_THROW(mk::ImageSideKeys(images, bias, small), c10::Error);
}

TEST(kernels_fusion_cpu, WindowPartitionPadsWithZerosAndUnpartitionCrops) {
  const int64_t B = 2, H = 5, W = 7, C = 3, ws = 3;
  const at::Tensor x = Randn({B, H, W, C}, 1);
  const at::Tensor w = mk::WindowPartition(x, ws);
  ASSERT_EQ(w.sizes(), (std::vector<int64_t>{B * 2 * 3, ws, ws, C}));
  for (int64_t b = 0; b < B; ++b)
    for (int64_t y = 0; y < 6; ++y)
      for (int64_t xx = 0; xx < 9; ++xx) {
        const at::Tensor tok = WindowToken(w, ws, b, H, W, y, xx);
        if (y < H && xx < W)
          EXPECT_TRUE(at::equal(tok, x[b][y][xx])) << b << " " << y << " " << xx;
        else
          EXPECT_EQ(tok.abs().max().item<float>(), 0.f) << "padding token " << y << " " << xx;
      }
  EXPECT_TRUE(at::equal(mk::WindowUnpartition(w, ws, B, H, W), x));
}

TEST(kernels_fusion_cpu, AddLayerNormAddsInPlaceAndWritesEveryLayout) {
  const int64_t B = 2, H = 5, W = 6, C = 8;
  const at::Tensor w = Randn({C}, 2), bias = Randn({C}, 3);
  for (int64_t delta_window : {0, 4}) {
    for (int64_t out_window : {0, 4}) {
      for (bool with_delta : {false, true}) {
        const at::Tensor x0 = Randn({B, H, W, C}, 4) * 3 + 1;
        at::Tensor delta;
        at::Tensor expected_x = x0.clone();
        if (with_delta) {
          // delta in its own layout; in the windowed one its padding tokens hold garbage that must
          // be ignored.
          const at::Tensor d = Randn({B, H, W, C}, 5);
          delta = delta_window > 0 ? mk::WindowPartition(d, delta_window).contiguous() : d;
          if (delta_window > 0) {
            const at::Tensor garbage = (mk::WindowPartition(at::ones({B, H, W, C}), delta_window) == 0);
            delta = delta.masked_fill(garbage, 1e6);
          }
          expected_x = x0 + d;
        }
        // LayerNorm written out: mean, biased variance, eps 1e-6.
        const at::Tensor mean = expected_x.mean(-1, true);
        const at::Tensor var = (expected_x - mean).pow(2).mean(-1, true);
        const at::Tensor ln = (expected_x - mean) / at::sqrt(var + 1e-6) * w + bias;
        const at::Tensor expected = out_window > 0 ? mk::WindowPartition(ln, out_window) : ln;
        at::Tensor x = x0.clone();
        const at::Tensor out = mk::AddLayerNorm(x, delta, delta_window, w, bias, 1e-6, out_window);
        SCOPED_TRACE("delta_window " + std::to_string(delta_window) + " out_window " +
                     std::to_string(out_window) + " delta " + std::to_string(with_delta));
        EXPECT_EQ(out.sizes(), expected.sizes());
        EXPECT_LT(MaxAbs(out, expected), 2e-5);
        EXPECT_LT(MaxAbs(x, expected_x), 1e-6);
      }
    }
  }
}

// The fp8-output form off CUDA: AddLayerNorm then the row quantisation, in AddLayerNorm's layout
// (padding tokens: zero values, the smallest normal scale), dequantising to the normalised tokens
// within e4m3's rounding, and x updated as AddLayerNorm updates it.
TEST(kernels_fusion_cpu, AddLayerNormFp8QuantisesTheNormalisedTokens) {
  const int64_t B = 1, H = 5, W = 6, C = 32;
  const at::Tensor w = Randn({C}, 2), bias = Randn({C}, 3);
  for (int64_t out_window : {0, 4}) {
    SCOPED_TRACE("out_window " + std::to_string(out_window));
    const at::Tensor x0 = Randn({B, H, W, C}, 4) * 3 + 1, delta = Randn({B, H, W, C}, 5);
    at::Tensor x = x0.clone(), x_ln = x0.clone();
    const mk::Fp8Rows q = mk::AddLayerNormFp8(x, delta, 0, w, bias, 1e-6, out_window);
    const at::Tensor ln = mk::AddLayerNorm(x_ln, delta, 0, w, bias, 1e-6, out_window);
    EXPECT_TRUE(at::equal(x, x_ln));
    ASSERT_EQ(q.values.scalar_type(), at::kFloat8_e4m3fn);
    ASSERT_EQ(q.values.sizes(), ln.sizes());
    ASSERT_EQ(q.scales.sizes(), (std::vector<int64_t>{ln.numel() / C, 1}));
    const at::Tensor rows = ln.reshape({-1, C});
    const at::Tensor deq = q.values.reshape({-1, C}).to(at::kFloat) * q.scales;
    // e4m3 rounds each value to 3 mantissa bits: within 2^-4 relative, or half the smallest
    // subnormal step (2^-10 of the scale) near zero.
    EXPECT_TRUE(((deq - rows).abs() <= rows.abs() / 16 + q.scales * std::ldexp(1.0, -10)).all().item<bool>());
    // each row's largest value maps to e4m3's largest, 448
    EXPECT_TRUE(at::allclose(q.scales.squeeze(1) * 448, rows.abs().amax(1).clamp_min(1.17549435e-38f)));
    if (out_window > 0) {
      const at::Tensor pad = (mk::WindowPartition(at::ones({B, H, W, 1}), out_window) == 0).reshape({-1});
      EXPECT_EQ(q.values.reshape({-1, C}).index({pad}).to(at::kFloat).abs().sum().item<float>(), 0.f);
      EXPECT_TRUE((q.scales.squeeze(1).index({pad}) == 1.17549435e-38f).all().item<bool>());
    }
  }
}

TEST(kernels_fusion_cpu, AddLayerNormRejectsMismatchedArguments) {
  at::Tensor x = Randn({1, 4, 4, 8}, 6);
  const at::Tensor w = Randn({8}, 7), b = Randn({8}, 8);
  EXPECT_THROW(mk::AddLayerNorm(x, Randn({1, 4, 4, 7}, 9), 0, w, b, 1e-6, 0), c10::Error);
  EXPECT_THROW(mk::AddLayerNorm(x, at::Tensor(), 0, Randn({7}, 9), b, 1e-6, 0), c10::Error);
  at::Tensor nc = Randn({1, 4, 8, 4}, 10).transpose(2, 3);
  EXPECT_THROW(mk::AddLayerNorm(nc, at::Tensor(), 0, w, b, 1e-6, 0), c10::Error);
  // A windowed delta must have the padded token count: 4x4 in windows of 3 -> 4 windows of 9.
  EXPECT_THROW(mk::AddLayerNorm(x, Randn({1, 4, 4, 8}, 11), 3, w, b, 1e-6, 0), c10::Error);
  EXPECT_NO_THROW(mk::AddLayerNorm(x, Randn({4, 3, 3, 8}, 12), 3, w, b, 1e-6, 0));
}

// SAM's get_rel_pos for equal sizes: R[r, k] = table[r - k + g - 1].
at::Tensor Gathered(const at::Tensor& table, int64_t g) {
  std::vector<at::Tensor> rows;
  for (int64_t r = 0; r < g; ++r) {
    std::vector<at::Tensor> ks;
    for (int64_t k = 0; k < g; ++k) ks.push_back(table[r - k + g - 1]);
    rows.push_back(at::stack(ks));
  }
  return at::stack(rows);
}

TEST(kernels_fusion_cpu, RelPosTablesEqualTheGatheredEinsums) {
  for (auto [gh, gw] : std::vector<std::pair<int64_t, int64_t>>{{4, 4}, {3, 5}, {14, 14}}) {
    const int64_t B = 2, H = 3, D = 8, N = gh * gw;
    const at::Tensor th = Randn({2 * gh - 1, D}, 20), tw = Randn({2 * gw - 1, D}, 21);
    const at::Tensor Rh = Gathered(th, gh), Rw = Gathered(tw, gw);
    // q as a strided view, like the qkv projection's.
    const at::Tensor qkv = Randn({B, N, 3, H, D}, 22);
    const at::Tensor q = qkv.permute({2, 0, 3, 1, 4})[0];
    const mk::RelPosTerms t = mk::RelPosTables(q, mk::ReversedRelPosTables(Rh, Rw), gh, gw);
    ASSERT_EQ(t.rel_h.sizes(), (std::vector<int64_t>{B, H, gh, gw, gh}));
    ASSERT_EQ(t.rel_w.sizes(), (std::vector<int64_t>{B, H, gh, gw, gw}));
    const at::Tensor r_q = q.reshape({B, H, gh, gw, D});
    const at::Tensor rel_h = at::einsum("bnhwc,hkc->bnhwk", {r_q, Rh});
    const at::Tensor rel_w = at::einsum("bnhwc,wkc->bnhwk", {r_q, Rw});
    EXPECT_LT(MaxAbs(t.rel_h, rel_h), 1e-4) << gh << "x" << gw;
    EXPECT_LT(MaxAbs(t.rel_w, rel_w), 1e-4) << gh << "x" << gw;
    // The attention reference reads the 5-D views like the 4-D tensors.
    const at::Tensor k = qkv.permute({2, 0, 3, 1, 4})[1], v = qkv.permute({2, 0, 3, 1, 4})[2];
    const at::Tensor a5 = mk::RelPosAttentionReference(q, k, v, t.rel_h, t.rel_w, gh, gw, 0.3);
    const at::Tensor a4 = mk::RelPosAttentionReference(q, k, v, rel_h.reshape({B, H, N, gh}),
                                                       rel_w.reshape({B, H, N, gw}), gh, gw, 0.3);
    EXPECT_LT(MaxAbs(a5, a4), 1e-5);
    // The from-tables entry point's CPU fallback is the same function of the same inputs.
    const at::Tensor ft = mk::RelPosAttentionFromTables(q, k, v, mk::ReversedRelPosTables(Rh, Rw), gh, gw, 0.3);
    EXPECT_LT(MaxAbs(ft, a4), 1e-5) << gh << "x" << gw;
  }
  // A table for another grid is refused before any work.
  const at::Tensor q = Randn({1, 2, 16, 8}, 23);
  EXPECT_THROW(mk::RelPosAttentionFromTables(q, q, q, Randn({12, 8}, 24), 4, 4, 1.0), c10::Error);
}

// The folded operands: q' . k'^T is SAM's scaled scores plus the decomposed rel-pos bias, for every
// query / key pair (the definition kSdpaFolded relies on), and the padding columns are zeros.
TEST(kernels_fusion_cpu, FoldedOperandsGiveScoresPlusTheRelPosBias) {
  const int64_t B = 2, H = 3, g = 4, D = 8, N = g * g, width = 24;  // D + 2 g = 16, padded to 24
  const at::Tensor Rh = Gathered(Randn({2 * g - 1, D}, 30), g), Rw = Gathered(Randn({2 * g - 1, D}, 31), g);
  const at::Tensor qkv = Randn({B, N, 3, H, D}, 32);
  const at::Tensor q = qkv.permute({2, 0, 3, 1, 4})[0], k = qkv.permute({2, 0, 3, 1, 4})[1];
  const double scale = 0.35;
  const mk::FoldedQK f = mk::FoldRelPosQK(q, k, mk::ReversedRelPosTables(Rh, Rw), g, scale, width);
  ASSERT_EQ(f.q.sizes(), (std::vector<int64_t>{B, H, N, width}));
  ASSERT_EQ(f.k.sizes(), (std::vector<int64_t>{B, H, N, width}));
  const at::Tensor r_q = q.reshape({B, H, g, g, D});
  const at::Tensor rel_h = at::einsum("bnhwc,hkc->bnhwk", {r_q, Rh}).reshape({B, H, N, g, 1});
  const at::Tensor rel_w = at::einsum("bnhwc,wkc->bnhwk", {r_q, Rw}).reshape({B, H, N, 1, g});
  const at::Tensor want = at::matmul(q * scale, k.transpose(-2, -1)) + (rel_h + rel_w).reshape({B, H, N, N});
  EXPECT_LT(MaxAbs(at::matmul(f.q, f.k.transpose(-2, -1)), want), 1e-4);
  EXPECT_EQ(f.q.narrow(3, D + 2 * g, width - D - 2 * g).abs().max().item<float>(), 0.f);
  EXPECT_EQ(f.k.narrow(3, D + 2 * g, width - D - 2 * g).abs().max().item<float>(), 0.f);
  // Each key's indicator columns: one 1 among the row columns, one among the column columns.
  EXPECT_TRUE(at::equal(f.k.narrow(3, D, g).sum(-1), at::ones({B, H, N})));
  EXPECT_TRUE(at::equal(f.k.narrow(3, D + g, g).sum(-1), at::ones({B, H, N})));
  // The indicators a caller keeps (the attention module builds them once) give the same k'.
  const at::Tensor kept = mk::FoldedKeyIndicators(g, width - D, k.options());
  EXPECT_TRUE(at::equal(mk::FoldRelPosQKReference(q, k, mk::ReversedRelPosTables(Rh, Rw), g, scale, width, kept).k, f.k));
  EXPECT_THROW(mk::FoldRelPosQK(q, k, mk::ReversedRelPosTables(Rh, Rw), g, scale, D + 2 * g - 8), c10::Error);
}

// SAM's windowed block, both ways: zero-padded windows of the normalised tokens through qkv, then
// attention per window and the unpartition (the original), against qkv on the raster tokens and
// RelPosWindowAttentionFromTables (a padded key/value is the bias). Image sizes that do and do not
// divide into windows.
TEST(kernels_fusion_cpu, WindowAttentionFromRasterTokensEqualsPaddedWindows) {
  for (auto [H, W] : std::vector<std::pair<int64_t, int64_t>>{{8, 8}, {10, 9}, {3, 7}}) {
    const int64_t B = 2, heads = 2, D = 8, C = heads * D, ws = 4;
    const at::Tensor x = Randn({B, H, W, C}, 60);
    const at::Tensor w = Randn({3 * C, C}, 61) * 0.3, bias = Randn({3 * C}, 62);
    const at::Tensor th = Randn({2 * ws - 1, D}, 63), tw = Randn({2 * ws - 1, D}, 64);
    const at::Tensor rev = mk::ReversedRelPosTables(Gathered(th, ws), Gathered(tw, ws));
    const double scale = 0.35;
    // The original: pad + partition, qkv, attention, unpartition + crop.
    const at::Tensor xw = mk::WindowPartition(x, ws);
    const int64_t Bw = xw.size(0);
    const at::Tensor pw = at::linear(xw, w, bias).reshape({Bw, ws * ws, 3, heads, D}).permute({2, 0, 3, 1, 4});
    const at::Tensor ow = mk::RelPosAttentionFromTables(pw[0], pw[1], pw[2], rev, ws, ws, scale);
    const at::Tensor want = mk::WindowUnpartition(ow.reshape({Bw, ws, ws, C}), ws, B, H, W);
    // Raster tokens.
    const at::Tensor pr = at::linear(x, w, bias).reshape({B, H * W, 3, heads, D}).permute({2, 0, 3, 1, 4});
    const at::Tensor got = mk::RelPosWindowAttentionFromTables(pr[0], pr[1], pr[2], bias.narrow(0, C, C),
                                                               bias.narrow(0, 2 * C, C), rev, ws, H, W, scale);
    ASSERT_EQ(got.sizes(), (std::vector<int64_t>{B, H * W, heads, D}));
    EXPECT_LT(MaxAbs(got.reshape({B, H, W, C}), want), 1e-4) << H << "x" << W;
  }
  // Bad geometry is refused: q's token count must be img_h * img_w.
  const at::Tensor q = Randn({1, 2, 12, 8}, 65), pad = Randn({16}, 66);
  EXPECT_THROW(mk::RelPosWindowAttentionFromTables(q, q, q, pad, pad, Randn({14, 8}, 67), 4, 4, 4, 1.0), c10::Error);
}

TEST(kernels_fusion_cpu, RowNormIsLayerNormThenGeluOnTheCpu) {
  const at::Tensor x = Randn({6, 64}, 50) * 3 + 1, w = Randn({64}, 51), b = Randn({64}, 52);
  const at::Tensor mean = x.mean(-1, true), var = x.var(-1, false, true);
  const at::Tensor ln = (x - mean) / at::sqrt(var + 1e-6) * w + b;
  EXPECT_LT(MaxAbs(mk::RowNorm(x, w, b, 1e-6, false), ln), 1e-4);
  const at::Tensor gelu = 0.5 * ln * (1 + at::erf(ln / std::sqrt(2.0)));
  EXPECT_LT(MaxAbs(mk::RowNorm(x, w, b, 1e-6, true), gelu), 1e-4);
  EXPECT_THROW(mk::RowNorm(x, Randn({32}, 53), b, 1e-6, false), c10::Error);
}

TEST(kernels_fusion_cpu, AddRowsBroadcastAddsPerRowAndChecksShapes) {
  at::Tensor y = Randn({3, 5, 8}, 60);
  const at::Tensor rows = Randn({5, 8}, 61), before = y.clone();
  mk::AddRowsBroadcast(y, rows);
  for (int64_t i = 0; i < 3; ++i) EXPECT_TRUE(at::equal(y[i], before[i] + rows));
  at::Tensor bad = Randn({3, 4, 8}, 62);
  EXPECT_THROW(mk::AddRowsBroadcast(bad, rows), c10::Error);
}

TEST(kernels_fusion_cpu, UpscaleHyperIsTransposedConvGeluAndTheHypernetworkProduct) {
  // The definition, written with LibTorch's own transposed convolution on the NCHW image: z is the
  // first upscaling's output (after LayerNorm + GELU) at 2h x 2w, conv2 is ConvTranspose2d(64, 32,
  // k=2, s=2), and each of M masks is hyper[b, m] . GELU(conv2(z)) per pixel.
  const int64_t B = 2, h = 3, w = 4, C1 = 64, C2 = 32, M = 4;
  const at::Tensor z = Randn({B, C1, 2 * h, 2 * w}, 80);
  const at::Tensor W = Randn({C1, C2, 2, 2}, 81) * 0.1, bias = Randn({C2}, 82);
  const at::Tensor hyper = Randn({B, M, C2}, 83);
  const at::Tensor up = at::gelu(at::conv_transpose2d(z, W, bias, /*stride=*/2));  // [B, C2, 4h, 4w]
  const at::Tensor expected = at::einsum("bmc,bcyx->bmyx", {hyper, up});
  // The kernel's operands: rows (b, y, x, dy, dx) of z's pixel (2y + dy, 2x + dx); columns (ddy, ddx, c).
  const at::Tensor x = z.view({B, C1, h, 2, w, 2}).permute({0, 2, 4, 3, 5, 1}).reshape({-1, C1});
  const at::Tensor wg = W.permute({0, 2, 3, 1}).reshape({C1, 4 * C2}).contiguous();
  const at::Tensor out = mk::UpscaleHyper(x, wg, bias.repeat({4}), hyper, h, w);
  ASSERT_EQ(out.sizes(), expected.sizes());
  EXPECT_LT(MaxAbs(out, expected), 1e-4);
  EXPECT_TRUE(at::equal(out, mk::UpscaleHyperReference(x, wg, bias.repeat({4}), hyper, h, w)));
  EXPECT_THROW(mk::UpscaleHyper(x.narrow(0, 0, 8), wg, bias.repeat({4}), hyper, h, w), c10::Error);
  EXPECT_THROW(mk::UpscaleHyper(x, wg, bias, hyper, h, w), c10::Error);  // bias without the 4 sub-pixels
  // With the input norm: the LayerNorm2d + GELU of each row first (RowNorm), then the same product.
  const at::Tensor nw = Randn({C1}, 84) * 0.2 + 1.0, nb = Randn({C1}, 85) * 0.2;
  const at::Tensor raw = x * 3.0 + 0.5;
  EXPECT_TRUE(at::equal(mk::UpscaleHyper(raw, wg, bias.repeat({4}), hyper, h, w, {nw, nb, 1e-6}),
                        mk::UpscaleHyper(mk::RowNormReference(raw, nw, nb, 1e-6, /*gelu=*/true), wg, bias.repeat({4}),
                                         hyper, h, w)));
  EXPECT_THROW(mk::UpscaleHyper(raw, wg, bias.repeat({4}), hyper, h, w, {nw.narrow(0, 0, 8), nb, 1e-6}), c10::Error);
  EXPECT_THROW(mk::UpscaleHyper(raw, wg, bias.repeat({4}), hyper, h, w, {nw, at::Tensor(), 1e-6}), c10::Error);
}

TEST(kernels_fusion_cpu, CopySlicesCopiesEachSliceAndChecksBounds) {
  const at::Tensor src = Randn({4, 4, 3, 5}, 70);
  const std::vector<at::Tensor> out = mk::CopySlices(src, {2, 0, 3}, {1, 0, 3}, {3, 1, 1});
  ASSERT_EQ(out.size(), 3u);
  EXPECT_TRUE(at::equal(out[0], src[2].narrow(0, 1, 3)));
  EXPECT_TRUE(at::equal(out[1], src[0].narrow(0, 0, 1)));
  EXPECT_TRUE(at::equal(out[2], src[3].narrow(0, 3, 1)));
  EXPECT_NE(out[0].data_ptr(), src[2][1].data_ptr());  // a copy, not a view
  EXPECT_THROW(mk::CopySlices(src, {4}, {0}, {1}), c10::Error);     // row out of range
  EXPECT_THROW(mk::CopySlices(src, {0}, {2}, {3}), c10::Error);     // past the end of dim 1
  EXPECT_THROW(mk::CopySlices(src, {0}, {0}, {0}), c10::Error);     // empty slice
  EXPECT_THROW(mk::CopySlices(src, {0, 1}, {0}, {1}), c10::Error);  // lists of different lengths
  EXPECT_TRUE(mk::CopySlices(src, {}, {}, {}).empty());
}

}  // namespace
