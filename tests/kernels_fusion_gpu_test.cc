// The encoder's fused element-wise kernel (AddLayerNorm) and the fused attention reading the skewed
// rel-pos views, each against its LibTorch reference on fresh random inputs (never zeros), with the
// outputs poisoned first (see kernels_gpu_test.cc: a NaN block is freed right before the call, so
// the caching allocator hands it out again and an unwritten element fails as non-finite).
#include <gtest/gtest.h>
#include <torch/cuda.h>

#include <ATen/ATen.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "kernels/kernels.h"
#include "tests/scoped_env.h"

namespace mk = maskd::kernels;
namespace mt = maskd::testing;

namespace {

#define SKIP_WITHOUT_GPU()                                                     \
  do {                                                                         \
    if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device";        \
    if (!mk::BuiltWithCuda()) GTEST_SKIP() << "built without MASKD_WITH_CUDA"; \
  } while (0)

const at::Device kCuda(at::kCUDA, 0);

at::Tensor Randn(at::IntArrayRef sizes, uint64_t seed, at::ScalarType t, double std = 1.0, double mean = 0) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(seed);
  return (at::randn(sizes, gen, at::kFloat) * std + mean).to(kCuda, t);
}

void Poison(int64_t bytes) {
  at::Tensor p = at::full({bytes / 4 + 1}, 0x7fc07fc0, at::TensorOptions().device(kCuda).dtype(at::kInt));
  (void)p;
}

struct Err {
  double rel_l2, max_abs;
  bool finite;
};
Err Compare(const at::Tensor& out, const at::Tensor& ref) {
  const at::Tensor o = out.to(at::kDouble), r = ref.to(at::kDouble);
  return {(o - r).norm().item<double>() / r.norm().item<double>(), (o - r).abs().max().item<double>(),
          o.isfinite().all().item<bool>()};
}

struct LnCase {
  int64_t B, H, W, C, delta_window, out_window;
  bool with_delta;
};

std::string Name(const LnCase& c, at::ScalarType t) {
  return std::to_string(c.B) + "x" + std::to_string(c.H) + "x" + std::to_string(c.W) + "x" + std::to_string(c.C) +
         " delta_window " + std::to_string(c.delta_window) + " out_window " + std::to_string(c.out_window) +
         (c.with_delta ? " +delta " : " ") + c10::toString(t);
}

// Tolerances against the same arithmetic in LibTorch (fp32 statistics; only the summation order
// differs, then both round to the output type): bf16 <= 1 ulp of |y| <= ~5 (max abs 4e-2, rel L2
// 4e-3); fp16 max abs 5e-3; fp32 1e-4. The residual sum x + delta rounds identically: exact.
double MaxAbsTol(at::ScalarType t) { return t == at::kBFloat16 ? 4e-2 : t == at::kHalf ? 5e-3 : 1e-4; }
double RelTol(at::ScalarType t) { return t == at::kBFloat16 ? 4e-3 : t == at::kHalf ? 1e-3 : 1e-5; }

// The few-query attention kernels against an fp32 reference: fp32 scores, softmax and sums, only the
// summation order differs, then one rounding of the output (bf16 max abs 1.6e-2, rel L2 5e-3; fp16
// 2e-3 / 1e-3).
void ExpectFewQueryClose(const at::Tensor& out, const at::Tensor& ref, at::ScalarType t, const std::string& name) {
  const Err e = Compare(out, ref);
  EXPECT_TRUE(e.finite) << name;
  EXPECT_LE(e.max_abs, t == at::kBFloat16 ? 1.6e-2 : 2e-3) << name;
  EXPECT_LE(e.rel_l2, t == at::kBFloat16 ? 5e-3 : 1e-3) << name;
}

TEST(kernels_fusion_gpu, AddLayerNormMatchesReference) {
  SKIP_WITHOUT_GPU();
  const std::vector<LnCase> cases = {
      {2, 64, 64, 768, 0, 14, true},    // vit_b norm1: residual from the MLP, windowed output
      {2, 64, 64, 768, 14, 0, true},    // vit_b norm2: windowed attention output un-partitioned
      {2, 64, 64, 1280, 0, 0, true},    // vit_h global block
      {1, 64, 64, 1024, 0, 14, false},  // vit_l first block: no pending residual
      {2, 10, 13, 96, 4, 4, true},      // generic kernel (C not a multiple of 256), both windowed
      {1, 7, 9, 256, 0, 3, true},       // vector kernel, tiny grid with heavy padding
  };
  uint64_t seed = 100;
  for (at::ScalarType t : {at::kBFloat16, at::kHalf, at::kFloat}) {
    for (const LnCase& c : cases) {
      SCOPED_TRACE(Name(c, t));
      const at::Tensor x0 = Randn({c.B, c.H, c.W, c.C}, ++seed, t, 2.0, 0.5);
      const at::Tensor w = Randn({c.C}, ++seed, t), b = Randn({c.C}, ++seed, t);
      at::Tensor delta;
      if (c.with_delta) {
        const at::Tensor d = Randn({c.B, c.H, c.W, c.C}, ++seed, t);
        delta = c.delta_window > 0 ? mk::WindowPartition(d, c.delta_window).contiguous() : d;
      }
      at::Tensor x_ref = x0.clone();
      const at::Tensor ref = mk::AddLayerNormReference(x_ref, delta, c.delta_window, w, b, 1e-6, c.out_window);
      at::Tensor x = x0.clone();
      Poison(ref.numel() * 4 + (1 << 20));
      const at::Tensor out = mk::AddLayerNorm(x, delta, c.delta_window, w, b, 1e-6, c.out_window);
      ASSERT_EQ(out.sizes(), ref.sizes());
      const Err e = Compare(out, ref);
      EXPECT_TRUE(e.finite) << "unwritten (NaN-poisoned) or non-finite outputs";
      EXPECT_LE(e.max_abs, MaxAbsTol(t));
      EXPECT_LE(e.rel_l2, RelTol(t));
      EXPECT_TRUE(at::equal(x, x_ref)) << "the residual stream must round exactly like x + delta";
      if (c.out_window > 0) {
        // Padding tokens are exact zeros.
        const at::Tensor pad = mk::WindowPartition(at::ones({c.B, c.H, c.W, 1}, x.options()), c.out_window) == 0;
        EXPECT_EQ(out.masked_select(pad.expand_as(out)).abs().sum().item<double>(), 0.0);
      }
      // fp8 output (the qkv / fc1 input of an fp8 encoder): bit for bit the e4m3 quantisation of this
      // kernel's own output (one kernel for 16-bit types with C = 256 k, two passes otherwise), with
      // x updated exactly as above.
      at::Tensor xq = x0.clone();
      Poison(ref.numel() * 4 + (1 << 20));
      const mk::Fp8Rows q = mk::AddLayerNormFp8(xq, delta, c.delta_window, w, b, 1e-6, c.out_window);
      const mk::Fp8Rows qr = mk::QuantizeRowsFp8Reference(out.reshape({-1, c.C}));
      ASSERT_EQ(q.values.scalar_type(), at::kFloat8_e4m3fn);
      ASSERT_EQ(q.values.sizes(), out.sizes());
      ASSERT_EQ(q.scales.sizes(), qr.scales.sizes());
      EXPECT_TRUE(at::equal(q.scales, qr.scales));
      EXPECT_TRUE(at::equal(q.values.reshape({-1, c.C}).view(at::kByte), qr.values.view(at::kByte)));
      EXPECT_TRUE(at::equal(xq, x_ref));
    }
  }
}

TEST(kernels_fusion_gpu, RelPosAttentionReadsTheSkewedTablesLikeGatheredOnes) {
  SKIP_WITHOUT_GPU();
  struct Case {
    int64_t B, H, g, D;
  };
  uint64_t seed = 500;
  for (const Case& c : std::vector<Case>{{8, 12, 14, 64}, {2, 16, 14, 80}, {1, 12, 64, 64}, {1, 16, 64, 80}}) {
    SCOPED_TRACE(std::to_string(c.B) + "x" + std::to_string(c.H) + " grid " + std::to_string(c.g) + " D " +
                 std::to_string(c.D));
    const int64_t N = c.g * c.g;
    const at::ScalarType t = at::kBFloat16;
    const at::Tensor qkv = Randn({c.B, N, 3, c.H, c.D}, ++seed, t);
    const at::Tensor qkv_p = qkv.permute({2, 0, 3, 1, 4});
    const at::Tensor q = qkv_p[0], k = qkv_p[1], v = qkv_p[2];
    // Gathered tables as get_rel_pos makes them: R[r, k] = table[r - k + g - 1].
    const at::Tensor r = at::arange(c.g, at::TensorOptions().dtype(at::kLong).device(kCuda));
    const at::Tensor idx = r.unsqueeze(1) - r.unsqueeze(0) + (c.g - 1);
    const at::Tensor Rh = Randn({2 * c.g - 1, c.D}, ++seed, t, 0.3).index({idx});
    const at::Tensor Rw = Randn({2 * c.g - 1, c.D}, ++seed, t, 0.3).index({idx});
    const mk::RelPosTerms terms = mk::RelPosTables(q, mk::ReversedRelPosTables(Rh, Rw), c.g, c.g);
    // The gathered tables as SAM computes them (einsum), as plain 4-D tensors.
    const at::Tensor r_q = q.reshape({c.B, c.H, c.g, c.g, c.D}).to(at::kFloat);
    const at::Tensor rel_h = at::einsum("bnhwc,hkc->bnhwk", {r_q, Rh.to(at::kFloat)}).reshape({c.B, c.H, N, c.g});
    const at::Tensor rel_w = at::einsum("bnhwc,wkc->bnhwk", {r_q, Rw.to(at::kFloat)}).reshape({c.B, c.H, N, c.g});
    // The skewed terms equal the einsums up to bf16 rounding of the product.
    EXPECT_LE(Compare(terms.rel_h, rel_h.view({c.B, c.H, c.g, c.g, c.g})).rel_l2, 8e-3);
    EXPECT_LE(Compare(terms.rel_w, rel_w.view({c.B, c.H, c.g, c.g, c.g})).rel_l2, 8e-3);
    // The kernel on the skewed views against the reference on the same values, and against the
    // kernel on contiguous copies of them (the same function of the same numbers: exact).
    const double scale = 1.0 / std::sqrt(static_cast<double>(c.D));
    const at::Tensor ref = mk::RelPosAttentionReference(q, k, v, terms.rel_h, terms.rel_w, c.g, c.g, scale);
    Poison(ref.numel() * 4 + (1 << 20));
    const at::Tensor out = mk::RelPosAttention(q, k, v, terms.rel_h, terms.rel_w, c.g, c.g, scale);
    const Err e = Compare(out, ref);
    EXPECT_TRUE(e.finite);
    EXPECT_LE(e.rel_l2, 1.5e-2);
    EXPECT_LE(e.max_abs, 4e-2);
    const at::Tensor out4 = mk::RelPosAttention(q, k, v, terms.rel_h.reshape({c.B, c.H, N, c.g}).contiguous(),
                                                terms.rel_w.reshape({c.B, c.H, N, c.g}).contiguous(), c.g, c.g, scale);
    EXPECT_TRUE(at::equal(out, out4));
  }
}

// The rel-pos terms made inside the kernel (RelPosAttentionFromTables) against the fp32 reference on
// SAM's gathered einsums: square windowed and global grids with both head dims, and non-square grids
// (the aligned path needs grid_w % 64 == 0; 64 x 8 and 10 x 13 take the general one), sequences that
// end inside a CTA's last warp, q/k/v strided views of one qkv tensor as in the encoder.
TEST(kernels_fusion_gpu, RelPosAttentionMakesTheTermsInTheKernel) {
  SKIP_WITHOUT_GPU();
  struct Case {
    int64_t B, H, gh, gw, D;
  };
  uint64_t seed = 700;
  for (const Case& c : std::vector<Case>{{8, 12, 14, 14, 64},
                                         {2, 16, 14, 14, 80},
                                         {1, 12, 64, 64, 64},
                                         {1, 16, 64, 64, 80},
                                         {2, 4, 8, 64, 64},
                                         {3, 2, 10, 13, 80},
                                         {2, 3, 64, 8, 64}}) {
    SCOPED_TRACE(std::to_string(c.B) + "x" + std::to_string(c.H) + " grid " + std::to_string(c.gh) + "x" +
                 std::to_string(c.gw) + " D " + std::to_string(c.D));
    const int64_t N = c.gh * c.gw;
    for (at::ScalarType t : {at::kBFloat16, at::kHalf}) {
      const at::Tensor qkv = Randn({c.B, N, 3, c.H, c.D}, ++seed, t);
      const at::Tensor qkv_p = qkv.permute({2, 0, 3, 1, 4});
      const at::Tensor q = qkv_p[0], k = qkv_p[1], v = qkv_p[2];
      auto gathered = [&](int64_t g) {
        const at::Tensor r = at::arange(g, at::TensorOptions().dtype(at::kLong).device(kCuda));
        return Randn({2 * g - 1, c.D}, ++seed, t, 0.3).index({r.unsqueeze(1) - r.unsqueeze(0) + (g - 1)});
      };
      const at::Tensor Rh = gathered(c.gh), Rw = gathered(c.gw);
      // SAM's einsums in fp32: rel_h[n, kh] = q[n] . Rh[row(n), kh], rel_w[n, kw] = q[n] . Rw[col(n), kw].
      const at::Tensor r_q = q.reshape({c.B, c.H, c.gh, c.gw, c.D}).to(at::kFloat);
      const at::Tensor rel_h = at::einsum("bnhwc,hkc->bnhwk", {r_q, Rh.to(at::kFloat)}).reshape({c.B, c.H, N, c.gh});
      const at::Tensor rel_w = at::einsum("bnhwc,wkc->bnhwk", {r_q, Rw.to(at::kFloat)}).reshape({c.B, c.H, N, c.gw});
      const double scale = 1.0 / std::sqrt(static_cast<double>(c.D));
      const at::Tensor ref = mk::RelPosAttentionReference(q, k, v, rel_h, rel_w, c.gh, c.gw, scale);
      Poison(ref.numel() * 4 + (1 << 20));
      const at::Tensor out =
          mk::RelPosAttentionFromTables(q, k, v, mk::ReversedRelPosTables(Rh, Rw), c.gh, c.gw, scale);
      const Err e = Compare(out, ref);
      EXPECT_TRUE(e.finite);
      EXPECT_LE(e.rel_l2, 1.5e-2);
      EXPECT_LE(e.max_abs, 4e-2);
      // The same inputs through the kernel reading fp32 terms: the in-kernel terms are fp32 products
      // too, so the two agree far closer than either does with the reference's softmax rounding.
      const at::Tensor via_terms = mk::RelPosAttention(q, k, v, rel_h, rel_w, c.gh, c.gw, scale);
      EXPECT_LE(Compare(out, via_terms).rel_l2, 4e-3);
    }
  }
  // Wrong table shapes are refused with the expected shape named.
  const at::Tensor q = Randn({1, 2, 16, 64}, 1, at::kBFloat16);
  EXPECT_THROW(mk::RelPosAttentionFromTables(q, q, q, Randn({13, 64}, 2, at::kBFloat16), 4, 4, 1.0), c10::Error);
}

// The folded operands' kernel against their LibTorch reference (RelPosTables + concatenations) on
// vit_b's and vit_h's global shapes and a smaller grid, q and k strided views of one qkv tensor: the
// q * scale and k columns and the indicator and padding columns bit-identical, the rel-pos terms
// within one rounding of T (the same fp32 products, summed in another order). Both kernels: fp32 FMAs
// (MASKD_FOLD_MMA=0) and mma.sync (=1, the default).
TEST(kernels_fusion_gpu, FoldRelPosQKMatchesTheReference) {
  SKIP_WITHOUT_GPU();
  struct Case {
    int64_t B, H, g, D, width;
  };
  std::vector<std::pair<const char*, Case>> runs;
  for (const char* mma : {"0", "1"})
    for (const Case& c : {Case{2, 12, 64, 64, 192}, Case{2, 16, 64, 80, 208}, Case{3, 2, 16, 64, 104},
                          Case{1, 3, 40, 80, 168}})
      runs.emplace_back(mma, c);
  for (const auto& [mma, c] : runs) {
    uint64_t seed = 900 + 10 * c.g + c.D;  // the same inputs for both kernels
    const mt::ScopedEnv env("MASKD_FOLD_MMA", mma);
    SCOPED_TRACE(std::string("MASKD_FOLD_MMA=") + mma + ": " + std::to_string(c.B) + "x" + std::to_string(c.H) +
                 " grid " + std::to_string(c.g) + " D " + std::to_string(c.D) + " width " + std::to_string(c.width));
    const int64_t N = c.g * c.g;
    for (at::ScalarType t : {at::kBFloat16, at::kHalf}) {
      const at::Tensor qkv = Randn({c.B, N, 3, c.H, c.D}, ++seed, t);
      const at::Tensor q = qkv.permute({2, 0, 3, 1, 4})[0], k = qkv.permute({2, 0, 3, 1, 4})[1];
      const at::Tensor rev = Randn({2 * (2 * c.g - 1), c.D}, ++seed, t, 0.3);
      const double scale = 1.0 / std::sqrt(static_cast<double>(c.D));
      const mk::FoldedQK ref = mk::FoldRelPosQKReference(q, k, rev, c.g, scale, c.width);
      Poison(2 * c.B * c.H * N * c.width * 2 + (1 << 20));
      const mk::FoldedQK out = mk::FoldRelPosQK(q, k, rev, c.g, scale, c.width);
      ASSERT_EQ(out.q.sizes(), ref.q.sizes());
      ASSERT_TRUE(out.q.isfinite().all().item<bool>() && out.k.isfinite().all().item<bool>());
      EXPECT_TRUE(at::equal(out.k, ref.k));
      EXPECT_TRUE(at::equal(out.q.narrow(3, 0, c.D), ref.q.narrow(3, 0, c.D)));
      EXPECT_TRUE(at::equal(out.q.narrow(3, c.D + 2 * c.g, c.width - c.D - 2 * c.g),
                            ref.q.narrow(3, c.D + 2 * c.g, c.width - c.D - 2 * c.g)));
      // The same fp32 products summed in another order, each rounded once to T: at most one ulp of
      // T apart, and one ulp at |x| is at most |x| 2^-7 (bf16) / 2^-10 (fp16) of the largest term.
      const at::Tensor terms = ref.q.narrow(3, c.D, 2 * c.g);
      const Err e = Compare(out.q.narrow(3, c.D, 2 * c.g), terms);
      const double largest = terms.abs().max().item<double>();
      EXPECT_LE(e.max_abs, largest * (t == at::kBFloat16 ? 1.0 / 128 : 1.0 / 1024)) << c10::toString(t);
      EXPECT_LE(e.rel_l2, t == at::kBFloat16 ? 2e-3 : 3e-4) << c10::toString(t);
    }
  }
}

// The windows made in the kernel from raster tokens against the padded-window path the fused encoder
// ran before (WindowPartition of the tokens, qkv on the padded grid, the kernel per window,
// WindowUnpartition), and against the fp32 reference: SAM's 64 x 64 grid in 14 x 14 windows with
// both head dims, and an image that is not square.
TEST(kernels_fusion_gpu, WindowAttentionFromRasterTokensEqualsPaddedWindows) {
  SKIP_WITHOUT_GPU();
  struct Case {
    int64_t B, heads, D, H, W;
  };
  uint64_t seed = 900;
  for (const Case& c : std::vector<Case>{{2, 12, 64, 64, 64}, {2, 16, 80, 64, 64}, {3, 2, 64, 20, 30}}) {
    SCOPED_TRACE(std::to_string(c.B) + "x" + std::to_string(c.heads) + " D " + std::to_string(c.D) + " image " +
                 std::to_string(c.H) + "x" + std::to_string(c.W));
    const int64_t ws = 14, C = c.heads * c.D;
    const at::ScalarType t = at::kBFloat16;
    const at::Tensor x = Randn({c.B, c.H, c.W, C}, ++seed, t);
    const at::Tensor w = Randn({3 * C, C}, ++seed, t, 1.0 / std::sqrt(static_cast<double>(C)));
    const at::Tensor bias = Randn({3 * C}, ++seed, t, 0.5);
    const at::Tensor r = at::arange(ws, at::TensorOptions().dtype(at::kLong).device(kCuda));
    const at::Tensor idx = r.unsqueeze(1) - r.unsqueeze(0) + (ws - 1);
    const at::Tensor rev = mk::ReversedRelPosTables(Randn({2 * ws - 1, c.D}, ++seed, t, 0.3).index({idx}),
                                                    Randn({2 * ws - 1, c.D}, ++seed, t, 0.3).index({idx}));
    const double scale = 1.0 / std::sqrt(static_cast<double>(c.D));
    const at::Tensor xw = mk::WindowPartition(x, ws);
    const int64_t Bw = xw.size(0);
    const at::Tensor pw = at::linear(xw, w, bias).reshape({Bw, ws * ws, 3, c.heads, c.D}).permute({2, 0, 3, 1, 4});
    const at::Tensor padded = mk::WindowUnpartition(
        mk::RelPosAttentionFromTables(pw[0], pw[1], pw[2], rev, ws, ws, scale).reshape({Bw, ws, ws, C}), ws, c.B,
        c.H, c.W);
    const at::Tensor pr = at::linear(x, w, bias).reshape({c.B, c.H * c.W, 3, c.heads, c.D}).permute({2, 0, 3, 1, 4});
    Poison(pr.numel() * 2 + (1 << 20));
    const at::Tensor got = mk::RelPosWindowAttentionFromTables(pr[0], pr[1], pr[2], bias.narrow(0, C, C),
                                                               bias.narrow(0, 2 * C, C), rev, ws, c.H, c.W, scale);
    const at::Tensor got4 = got.reshape({c.B, c.H, c.W, C});
    // Only the GEMM's accumulation order differs (the raster and padded qkv are different GEMM shapes).
    const Err same = Compare(got4, padded);
    EXPECT_TRUE(same.finite);
    EXPECT_LE(same.rel_l2, 4e-3);
    // And the fp32 reference of the raster entry point (the padded windows spelled out on fp32 copies).
    const at::Tensor ref = mk::RelPosWindowAttentionFromTables(
        pr[0].cpu().to(at::kFloat), pr[1].cpu().to(at::kFloat), pr[2].cpu().to(at::kFloat),
        bias.narrow(0, C, C).cpu().to(at::kFloat), bias.narrow(0, 2 * C, C).cpu().to(at::kFloat),
        rev.cpu().to(at::kFloat), ws, c.H, c.W, scale);
    const Err e = Compare(got, ref.to(kCuda));
    EXPECT_TRUE(e.finite);
    EXPECT_LE(e.rel_l2, 1.5e-2);
    EXPECT_LE(e.max_abs, 4e-2);
  }
}

// The decoder's row LayerNorm (+ GELU) against LayerNorm then GELU in fp32 on the same inputs (the
// kernel applies GELU before its one rounding, the reference rounds twice: compared with fp32 math).
TEST(kernels_fusion_gpu, RowNormMatchesLayerNormAndGelu) {
  SKIP_WITHOUT_GPU();
  uint64_t seed = 300;
  for (at::ScalarType t : {at::kBFloat16, at::kHalf}) {
    for (int64_t C : {32, 64, 128, 256}) {
      for (bool gelu : {false, true}) {
        for (int64_t rows : {1, 7, 4096 * 3 + 5}) {
          const at::Tensor x = Randn({rows, C}, seed++, t, 2.0, 0.5);
          const at::Tensor w = Randn({C}, seed++, t, 0.5, 1.0), b = Randn({C}, seed++, t, 0.3);
          Poison(rows * C * 2);
          const at::Tensor out = mk::RowNorm(x, w, b, 1e-6, gelu);
          const at::Tensor ref32 = mk::RowNormReference(x.to(at::kFloat), w.to(at::kFloat), b.to(at::kFloat), 1e-6, gelu);
          const Err e = Compare(out, ref32);
          const std::string name = std::to_string(rows) + "x" + std::to_string(C) + (gelu ? " gelu " : " ") +
                                   c10::toString(t);
          EXPECT_TRUE(e.finite) << name;
          // One rounding of |y| <~ 6: bf16 half-ulp 1.6e-2, fp16 2e-3.
          EXPECT_LE(e.max_abs, t == at::kBFloat16 ? 3.2e-2 : 4e-3) << name;
          EXPECT_LE(e.rel_l2, t == at::kBFloat16 ? 4e-3 : 1e-3) << name;
        }
      }
    }
  }
  // Widths the kernel does not cover fall back to the reference, on the device.
  const at::Tensor x = Randn({5, 96}, seed++, at::kBFloat16), w = Randn({96}, seed++, at::kBFloat16),
                   b = Randn({96}, seed++, at::kBFloat16);
  EXPECT_TRUE(at::equal(mk::RowNorm(x, w, b, 1e-6, true), mk::RowNormReference(x, w, b, 1e-6, true)));
}

TEST(kernels_fusion_gpu, AddRowsBroadcastEqualsAtenAdd) {
  SKIP_WITHOUT_GPU();
  uint64_t seed = 400;
  for (at::ScalarType t : {at::kBFloat16, at::kHalf, at::kFloat}) {
    for (auto [n, r, c] : {std::tuple<int64_t, int64_t, int64_t>{64, 4096, 384}, {3, 4096, 256}, {1, 5, 8}, {2, 3, 12}}) {
      at::Tensor y = Randn({n, r, c}, seed++, t);
      const at::Tensor rows = Randn({r, c}, seed++, t);
      const at::Tensor ref = y + rows;
      mk::AddRowsBroadcast(y, rows);
      EXPECT_TRUE(at::equal(y, ref)) << n << "x" << r << "x" << c << " " << c10::toString(t);
    }
  }
}

// Fresh random q (read in place from a wider, strided projection output) and k, against the fp32
// reference (the same scores and softmax in LibTorch, one rounding): probabilities are <= 1, so one
// ulp of the output type bounds the difference (bf16 2^-8, fp16 2^-11), plus __expf's few ulp.
TEST(kernels_fusion_gpu, ImageToTokenProbsMatchesReference) {
  SKIP_WITHOUT_GPU();
  uint64_t seed = 900;
  for (at::ScalarType t : {at::kBFloat16, at::kHalf}) {
    for (int64_t T : {1, 2, 7, 16}) {
      for (int mode = 0; mode < 3; ++mode) {  // 0: q per prompt, 1: one shared q row, 2: q_rows
        const int64_t B = 5, HW = 4096, heads = 8, I = 16 * heads, G = mode == 1 ? 1 : mode == 2 ? 3 : B;
        // q as the middle third of a [G, HW, 3I] projection, scaled like real activations.
        const at::Tensor y = Randn({G, HW, 3 * I}, seed++, t, 2.0);
        const at::Tensor q = y.narrow(2, I, I);
        const at::Tensor k = Randn({B, T, I}, seed++, t, 2.0);
        at::Tensor rows;
        if (mode == 2)
          rows = at::tensor(std::vector<int64_t>{2, 0, 2, 1, 0}, at::TensorOptions().dtype(at::kLong)).to(kCuda);
        Poison(B * HW * heads * T * 2);
        const at::Tensor out = mk::ImageToTokenProbs(q, k, rows, heads, 0.25);
        const at::Tensor ref = mk::ImageToTokenProbsReference(q, k, rows, heads, 0.25);
        ASSERT_EQ(out.sizes(), ref.sizes());
        ASSERT_EQ(out.scalar_type(), t);
        const Err e = Compare(out, ref);
        const std::string name = c10::toString(t) + std::string(" T ") + std::to_string(T) + " mode " + std::to_string(mode);
        EXPECT_TRUE(e.finite) << name;
        EXPECT_LE(e.max_abs, t == at::kBFloat16 ? 8e-3 : 1.5e-3) << name;
        // Each head's probabilities sum to 1 up to the output rounding.
        const at::Tensor sums = out.to(at::kFloat).view({B, HW, heads, T}).sum(-1);
        EXPECT_LE((sums - 1).abs().max().item<double>(), T * (t == at::kBFloat16 ? 4e-3 : 5e-4)) << name;
      }
    }
  }
}

// The fused image->token step with norm4 against the same function in fp32 on the same (rounded)
// inputs: the kernel rounds P to the 16-bit type (as the unfused path does, for the tensor cores)
// and keeps the sum and the statistics in fp32 with one rounding of the output, so it is held to
// the output rounding (bf16: max abs 4e-2 for |y| <= ~5, rel L2 4e-3; fp16 5e-3 / 1e-3), and it must
// be no further from fp32 than the unfused composition it replaces (which also rounds the updated
// keys first). Residual per prompt, shared by all prompts, and picked by residual_rows; T from one
// token to the kernel's 16 (k padded to the mma's 16; above 48 KB of shared memory); a position count
// that ends mid-tile; at T = 7 with and without the positional q_bias added on load.
TEST(kernels_fusion_gpu, ImageToTokenUpdateMatchesFp32AndBeatsTheUnfusedPath) {
  SKIP_WITHOUT_GPU();
  uint64_t seed = 1200;
  for (at::ScalarType t : {at::kBFloat16, at::kHalf}) {
    for (int64_t T : {1, 7, 8, 16}) {
      for (int mode = 0; mode < 3; ++mode) {  // 0: residual and q per prompt, 1: one image, 2: rows
        for (int64_t HW : {4096, 4001}) {
          if (HW == 4001 && T != 7) continue;
          const int64_t B = 5, heads = 8, I = 16 * heads, D = 256, G = mode == 1 ? 1 : mode == 2 ? 3 : B;
          const at::Tensor y = Randn({G, HW, 3 * I}, seed++, t, 2.0);
          const at::Tensor q = y.narrow(2, 2 * I, I);  // q_img: the last third of the block's projection
          const at::Tensor k = Randn({B, T, I}, seed++, t, 2.0);
          const at::Tensor u = Randn({B, heads * T, D}, seed++, t, 0.5);
          const at::Tensor residual = Randn({G, HW, D}, seed++, t, 1.0, 0.3);
          const at::Tensor w = Randn({D}, seed++, t, 0.2, 1.0), bias = Randn({D}, seed++, t, 0.2);
          at::Tensor rows;
          if (mode == 2)
            rows = at::tensor(std::vector<int64_t>{2, 0, 2, 1, 0}, at::TensorOptions().dtype(at::kLong)).to(kCuda);
          const at::Tensor& q_rows = rows;  // q and the residual come from the same image
          const double scale = 0.25, eps = 1e-5;
          for (bool with_bias : {false, true}) {
            if (with_bias && T != 7) continue;
            // The positional share of the query projection, strided as in the decoder's [HW, 3I] table.
            const at::Tensor q_bias =
                with_bias ? Randn({HW, 3 * I}, seed++, t, 1.0).narrow(1, 2 * I, I) : at::Tensor();
            Poison(B * HW * D * 2);
            const at::Tensor out =
                mk::ImageToTokenUpdate(q, k, q_rows, heads, scale, u, residual, rows, w, bias, eps, q_bias);
            auto f32 = [](const at::Tensor& x) { return x.defined() ? x.to(at::kFloat) : x; };
            const at::Tensor truth = mk::ImageToTokenUpdateReference(
                f32(q), f32(k), q_rows, heads, scale, f32(u), f32(residual), rows, f32(w), f32(bias), eps, f32(q_bias));
            const at::Tensor unfused =
                mk::ImageToTokenUpdateReference(q, k, q_rows, heads, scale, u, residual, rows, w, bias, eps, q_bias);
            ASSERT_EQ(out.sizes(), truth.sizes());
            ASSERT_EQ(out.scalar_type(), t);
            const Err e = Compare(out, truth), eu = Compare(unfused, truth);
            const std::string name = c10::toString(t) + std::string(" T ") + std::to_string(T) + " mode " +
                                     std::to_string(mode) + " HW " + std::to_string(HW) + (with_bias ? " q_bias" : "");
            EXPECT_TRUE(e.finite) << name;
            EXPECT_LE(e.max_abs, MaxAbsTol(t)) << name;
            EXPECT_LE(e.rel_l2, RelTol(t)) << name;
            EXPECT_LE(e.rel_l2, eu.rel_l2 * 1.05) << name << ": unfused rel L2 " << eu.rel_l2;
          }
        }
      }
    }
  }
}

// The decoder's token-side attentions: a click's tokens against 4096 positions (split 32 ways over
// the keys, then combined), 64 prompts (no split), the tokens' self-attention (C = 32, 7 keys), the
// query limit, and a key count that ends mid-chunk; q, k and v strided as the projections leave them.
TEST(kernels_fusion_gpu, FewQueryAttentionMatchesReferenceAndSdpa) {
  SKIP_WITHOUT_GPU();
  struct Case {
    int64_t N, H, L, S, C;
  };
  uint64_t seed = 950;
  for (at::ScalarType t : {at::kBFloat16, at::kHalf}) {
    for (const Case& c : {Case{1, 8, 7, 4096, 16}, Case{64, 8, 7, 4096, 16}, Case{5, 8, 7, 7, 32},
                          Case{2, 8, 16, 1000, 16}, Case{3, 4, 1, 129, 32}}) {
      const at::Tensor y = Randn({c.N, c.S, 3 * c.H * c.C}, seed++, t, 2.0);
      const at::Tensor k = y.narrow(2, 0, c.H * c.C).view({c.N, c.S, c.H, c.C}).transpose(1, 2);
      const at::Tensor v = y.narrow(2, c.H * c.C, c.H * c.C).view({c.N, c.S, c.H, c.C}).transpose(1, 2);
      const at::Tensor q = Randn({c.N, c.L, c.H, c.C}, seed++, t, 2.0).transpose(1, 2);
      const double scale = 1.0 / std::sqrt(static_cast<double>(c.C));
      const std::string name = c10::toString(t) + std::string(" N ") + std::to_string(c.N) + " H " +
                               std::to_string(c.H) + " L " + std::to_string(c.L) + " S " + std::to_string(c.S) +
                               " C " + std::to_string(c.C);
      ASSERT_TRUE(mk::FewQueryAttentionFits(q, k, v)) << name;
      Poison(c.N * c.L * c.H * c.C * 2 + c.N * c.H * 64 * c.L * (c.C + 2) * 4);
      const at::Tensor out = mk::FewQueryAttention(q, k, v, scale);
      const at::Tensor ref = mk::FewQueryAttentionReference(q, k, v, scale);
      ASSERT_EQ(out.sizes(), ref.sizes()) << name;
      ASSERT_EQ(out.scalar_type(), t) << name;
      ExpectFewQueryClose(out, ref, t, name);
      // SDPA (what it replaces) agrees to the same order.
      const at::Tensor sdpa = at::scaled_dot_product_attention(q, k, v).transpose(1, 2);
      EXPECT_LE(Compare(out, sdpa).rel_l2, t == at::kBFloat16 ? 1e-2 : 2e-3) << name;
    }
  }
  // Outside the kernel's shapes (17 queries) it is the reference, not a wrong answer.
  const at::Tensor k = Randn({1, 8, 64, 16}, 990, at::kBFloat16);
  const at::Tensor q = Randn({1, 8, 17, 16}, 991, at::kBFloat16);
  EXPECT_FALSE(mk::FewQueryAttentionFits(q, k, k));
  EXPECT_LE(Compare(mk::FewQueryAttention(q, k, k, 0.25), mk::FewQueryAttentionReference(q, k, k, 0.25)).max_abs, 0.0);
}

// Prompts of several images: each query batch reads its image's k / v rows in place (kv_rows), held
// to the reference on the gathered rows with the tolerances above; 64 prompts over 16 images (the
// server's jagged batch, key splits of 2-3) and 3 prompts over 2 (32 splits).
TEST(kernels_fusion_gpu, FewQueryAttentionRowsEqualsAttendingToGatheredRows) {
  SKIP_WITHOUT_GPU();
  uint64_t seed = 1300;
  for (at::ScalarType t : {at::kBFloat16, at::kHalf}) {
    for (const auto& [N, G] : {std::pair<int64_t, int64_t>{64, 16}, std::pair<int64_t, int64_t>{3, 2}}) {
      const int64_t H = 8, L = 7, S = 4096, C = 16;
      const at::Tensor y = Randn({G, S, 3 * H * C}, seed++, t, 2.0);
      const at::Tensor k = y.narrow(2, 0, H * C).view({G, S, H, C}).transpose(1, 2);
      const at::Tensor v = y.narrow(2, H * C, H * C).view({G, S, H, C}).transpose(1, 2);
      const at::Tensor q = Randn({N, L, H, C}, seed++, t, 2.0).transpose(1, 2);
      const at::Tensor rows = (at::arange(N, at::TensorOptions().dtype(at::kLong)) * 7 % G).to(kCuda);
      const double scale = 0.25;
      const std::string name = c10::toString(t) + std::string(" N ") + std::to_string(N) + " G " + std::to_string(G);
      ASSERT_TRUE(mk::FewQueryAttentionFits(q, k, v, /*kv_rows=*/true)) << name;
      Poison(N * L * H * C * 2 + N * H * 64 * L * (C + 2) * 4);
      const at::Tensor out = mk::FewQueryAttentionRows(q, k, v, rows, scale);
      const at::Tensor ref = mk::FewQueryAttentionReference(q, k.index_select(0, rows), v.index_select(0, rows), scale);
      ASSERT_EQ(out.sizes(), ref.sizes()) << name;
      ExpectFewQueryClose(out, ref, t, name);
      // Not the same as reading row n: the index is used.
      EXPECT_GT(Compare(out, mk::FewQueryAttentionReference(q, k.narrow(0, 0, 1).expand({N, H, S, C}),
                                                            v.narrow(0, 0, 1).expand({N, H, S, C}), scale))
                    .rel_l2,
                0.05)
          << name;
    }
  }
}

// The positional share of the key projection ([S, H * C], strided as in the decoder's [HW, 3I] table)
// added to the keys as they are loaded and the value bias added to the output: held to the fp32
// reference on k + k_bias, v + v_bias with the tolerances above (one rounding, at the output);
// a click (32 key splits, the combine kernel adds the value bias), 64 prompts of one image each
// (3 splits), and 64 prompts over 16 images read by row.
TEST(kernels_fusion_gpu, FewQueryAttentionBiasedEqualsAttendingToBiasedKeysAndValues) {
  SKIP_WITHOUT_GPU();
  uint64_t seed = 1400;
  for (at::ScalarType t : {at::kBFloat16, at::kHalf}) {
    for (const auto& [N, G] : {std::pair<int64_t, int64_t>{1, 1}, {64, 64}, {64, 16}}) {
      const int64_t H = 8, L = 7, S = 4096, C = 16;
      const at::Tensor y = Randn({G, S, 3 * H * C}, seed++, t, 2.0);
      const at::Tensor k = y.narrow(2, 0, H * C).view({G, S, H, C}).transpose(1, 2);
      const at::Tensor v = y.narrow(2, H * C, H * C).view({G, S, H, C}).transpose(1, 2);
      const at::Tensor q = Randn({N, L, H, C}, seed++, t, 2.0).transpose(1, 2);
      const at::Tensor k_bias = Randn({S, 3 * H * C}, seed++, t, 1.0).narrow(1, 0, H * C);
      const at::Tensor v_bias = Randn({H * C}, seed++, t, 0.5);
      const at::Tensor rows =
          N == G ? at::Tensor() : (at::arange(N, at::TensorOptions().dtype(at::kLong)) * 7 % G).to(kCuda);
      const double scale = 0.25;
      const std::string name = c10::toString(t) + std::string(" N ") + std::to_string(N) + " G " + std::to_string(G);
      ASSERT_TRUE(mk::FewQueryAttentionFits(q, k, v, /*kv_rows=*/rows.defined())) << name;
      Poison(N * L * H * C * 2 + N * H * 64 * L * (C + 2) * 4);
      const at::Tensor out = mk::FewQueryAttentionBiased(q, k, v, rows, k_bias, v_bias, scale);
      auto f32 = [](const at::Tensor& x) { return x.to(at::kFloat); };
      const at::Tensor kk = rows.defined() ? k.index_select(0, rows) : k;
      const at::Tensor vv = rows.defined() ? v.index_select(0, rows) : v;
      const at::Tensor ref = mk::FewQueryAttentionReference(
          f32(q), f32(kk) + f32(k_bias).view({S, H, C}).transpose(0, 1), f32(vv) + f32(v_bias).view({H, 1, C}), scale);
      ASSERT_EQ(out.sizes(), ref.sizes()) << name;
      ASSERT_EQ(out.scalar_type(), t) << name;
      ExpectFewQueryClose(out, ref, t, name);
      // The biases are used: without them the answer is far off.
      EXPECT_GT(Compare(out, mk::FewQueryAttentionReference(f32(q), f32(kk), f32(vv), scale)).rel_l2, 0.05) << name;
    }
  }
}

// The absorbed token->image attention (the key and value projections moved onto the query and the
// output): the kernel against its fp32 reference on the same 16-bit inputs, with the tolerances of the
// few-query kernels (P is rounded to the 16-bit type before its product with x, as the projected
// path's kernel does not; the bound holds with room). A click (32 key splits and the combine kernel),
// 64 prompts (4 splits), a key count that ends mid-step and mid-split with 8 queries, many prompts in
// one split (the kernel writes the output itself) over 33 keys, no key bias; qa strided as the
// decoder's per-head product leaves it, the bias a strided slice of the [HW, 3I] table.
TEST(kernels_fusion_gpu, AbsorbedAttentionMatchesItsReference) {
  SKIP_WITHOUT_GPU();
  struct Case {
    int64_t N, L, S;
    bool bias;
  };
  const int64_t H = 8, C = 16, D = 256;
  uint64_t seed = 1700;
  for (at::ScalarType t : {at::kBFloat16, at::kHalf}) {
    for (const Case& c : {Case{1, 7, 4096, true}, Case{64, 7, 4096, true}, Case{3, 8, 1000, true},
                          Case{300, 1, 33, false}, Case{2, 8, 4096, false}}) {
      const std::string name = c10::toString(t) + std::string(" N ") + std::to_string(c.N) + " L " +
                               std::to_string(c.L) + " S " + std::to_string(c.S) + (c.bias ? " bias" : "");
      const at::Tensor x = Randn({c.N, c.S, D}, seed++, t);
      const at::Tensor qa = Randn({H, c.N, c.L, D}, seed++, t, 0.4).permute({1, 0, 2, 3});
      const at::Tensor q = Randn({c.N, c.L, H, C}, seed++, t).transpose(1, 2);
      const at::Tensor k_bias = c.bias ? Randn({c.S, 3 * H * C}, seed++, t, 2.0).narrow(1, 0, H * C) : at::Tensor();
      const double scale = 0.25;
      ASSERT_TRUE(mk::AbsorbedAttentionFits(qa, q, x, k_bias)) << name;
      Poison(c.N * c.L * H * D * 2 + std::min<int64_t>(32 * c.N, 256) * 64 * (D + 2) * 4);  // out, partials
      const at::Tensor out = mk::AbsorbedAttention(qa, q, x, k_bias, scale);
      const at::Tensor ref = mk::AbsorbedAttentionReference(qa, q, x, k_bias, scale);
      ASSERT_EQ(out.sizes(), ref.sizes()) << name;
      ASSERT_EQ(out.scalar_type(), t) << name;
      const Err e = Compare(out, ref);
      std::printf("%s: rel L2 %.3e max abs %.3e\n", name.c_str(), e.rel_l2, e.max_abs);
      ExpectFewQueryClose(out, ref, t, name);
      if (c.bias) {  // the bias is read: without it the answer moves
        EXPECT_GT(Compare(mk::AbsorbedAttentionReference(qa, q, x, at::Tensor(), scale), ref).rel_l2, 0.05) << name;
      }
    }
  }
  // Outside the kernel's shapes (9 queries) it is the reference, not a wrong answer.
  const at::Tensor x = Randn({2, 64, D}, 1790, at::kBFloat16);
  const at::Tensor qa = Randn({2, H, 9, D}, 1791, at::kBFloat16, 0.4);
  const at::Tensor q = Randn({2, H, 9, C}, 1792, at::kBFloat16);
  EXPECT_FALSE(mk::AbsorbedAttentionFits(qa, q, x, at::Tensor()));
  EXPECT_LE(Compare(mk::AbsorbedAttention(qa, q, x, at::Tensor(), 0.25),
                    mk::AbsorbedAttentionReference(qa, q, x, at::Tensor(), 0.25))
                .max_abs,
            0.0);
}

// The shared decoder's image side in one launch: bit-identical to ATen's add of the no-mask dense
// embedding then the transposing copy (both round the fp32 sum once); SAM's [256, 64, 64] for 1, 16
// and 70 images (two launches of at most 64), a shape that ends mid-tile, fp32 (ATen's path); rows
// of out past the images untouched. Images channel-major (contiguous), position-major ([h, w, C] in
// memory, as the encoder leaves its embeddings) and both in one call.
TEST(kernels_fusion_gpu, ImageSideKeysEqualsAddThenTranspose) {
  SKIP_WITHOUT_GPU();
  uint64_t seed = 1500;
  enum class Layout { kChannelMajor, kPositionMajor, kMixed };
  for (Layout layout : {Layout::kChannelMajor, Layout::kPositionMajor, Layout::kMixed}) {
    for (at::ScalarType t : {at::kBFloat16, at::kHalf, at::kFloat}) {
      for (auto [n, C, h, w] : {std::tuple<int64_t, int64_t, int64_t, int64_t>{1, 256, 64, 64}, {16, 256, 64, 64},
                                {70, 256, 64, 64}, {3, 40, 5, 7}}) {
        if (n == 70 && t == at::kFloat) continue;
        std::vector<at::Tensor> images;
        for (int64_t i = 0; i < n; ++i) {
          const bool pm = layout == Layout::kPositionMajor || (layout == Layout::kMixed && i % 2 == 1);
          images.push_back(pm ? Randn({h, w, C}, seed++, t).permute({2, 0, 1}) : Randn({C, h, w}, seed++, t));
        }
        // (The mixed list's position-major images are its odd ones: none when n is 1.)
        if (layout == Layout::kPositionMajor || (layout == Layout::kMixed && n > 1))
          ASSERT_FALSE(images[layout == Layout::kPositionMajor ? 0 : 1].is_contiguous());
        const at::Tensor bias = Randn({1, C, 1, 1}, seed++, t);
        at::Tensor out = at::full({n + 1, h * w, C}, 7.0, at::TensorOptions().dtype(t).device(kCuda));
        mk::ImageSideKeys(images, bias, out);
        std::vector<at::Tensor> each;
        for (const auto& im : images) each.push_back((im + bias[0]).flatten(1).t());
        const at::Tensor expected = at::stack(each);
        const std::string name = c10::toString(t) + std::string(" n ") + std::to_string(n) + " C " +
                                 std::to_string(C) + " layout " + std::to_string(static_cast<int>(layout));
        EXPECT_TRUE(at::equal(out.narrow(0, 0, n), expected)) << name;
        EXPECT_TRUE(at::equal(out[n], at::full({h * w, C}, 7.0, out.options()))) << name;
      }
    }
  }
}

TEST(kernels_fusion_gpu, UpscaleHyperMatchesTheUnfusedPathAndFp32) {
  SKIP_WITHOUT_GPU();
  uint64_t seed = 600;
  // {B, h, w}: 64 prompts on SAM's 64 x 64 grid, a small batch, and a width the kernel does not
  // take (6: the reference runs, so the answer is the reference's exactly).
  for (at::ScalarType t : {at::kBFloat16, at::kHalf}) {
    for (auto [B, h, w] : {std::tuple<int64_t, int64_t, int64_t>{64, 64, 64}, {3, 8, 16}, {2, 4, 6}}) {
      const std::string name = std::to_string(B) + "x" + std::to_string(h) + "x" + std::to_string(w) + " " +
                               c10::toString(t);
      // Activations as after LayerNorm + GELU (O(1)), weights at the decoder's scale.
      const at::Tensor x32 = at::gelu(Randn({B * h * w * 4, 64}, seed++, at::kFloat));
      const at::Tensor w32 = Randn({64, 128}, seed++, at::kFloat, 0.125), b32 = Randn({128}, seed++, at::kFloat, 0.1);
      const at::Tensor hy32 = Randn({B, 4, 32}, seed++, at::kFloat, 0.5);
      const at::Tensor x = x32.to(t), wt = w32.to(t), bt = b32.to(t), hy = hy32.to(t);
      const at::Tensor truth = mk::UpscaleHyperReference(x.to(at::kFloat), wt.to(at::kFloat), bt.to(at::kFloat),
                                                         hy.to(at::kFloat), h, w);
      const at::Tensor ref = mk::UpscaleHyperReference(x, wt, bt, hy, h, w);
      Poison(ref.nbytes());
      const at::Tensor out = mk::UpscaleHyper(x, wt, bt, hy, h, w);
      ASSERT_EQ(out.sizes(), ref.sizes()) << name;
      if (w % 8 != 0) {
        EXPECT_TRUE(at::equal(out, ref)) << name;
        continue;
      }
      const Err e = Compare(out, ref), e_out = Compare(out, truth), e_ref = Compare(ref, truth);
      EXPECT_TRUE(e.finite) << name;
      // Same roundings as the unfused path (GEMM + bias to T, GELU to T, product to T); only the
      // GEMM's summation order differs, so a value may move by an ulp of an intermediate.
      EXPECT_LT(e.rel_l2, t == at::kBFloat16 ? 1e-2 : 2e-3) << name;
      EXPECT_LE(e_out.rel_l2, 1.5 * e_ref.rel_l2 + 1e-4) << name << ": fused " << e_out.rel_l2 << " vs unfused "
                                                       << e_ref.rel_l2 << " against fp32";
      // The input norm on load (the decoder's LayerNorm2d + GELU of the first upscaling's raw output)
      // is RowNorm's arithmetic: the same answer as RowNorm's kernel first, to the bit.
      const at::Tensor raw = Randn({B * h * w * 4, 64}, seed++, t, 2.0, 0.5);
      const at::Tensor nw = Randn({64}, seed++, t, 0.2, 1.0), nb = Randn({64}, seed++, t, 0.2);
      Poison(ref.nbytes());
      const at::Tensor normed = mk::UpscaleHyper(raw, wt, bt, hy, h, w, {nw, nb, 1e-6});
      const at::Tensor two_pass =
          mk::UpscaleHyper(mk::RowNorm(raw, nw, nb, 1e-6, /*gelu=*/true), wt, bt, hy, h, w);
      EXPECT_TRUE(at::equal(normed, two_pass)) << name << ": max abs " << Compare(normed, two_pass).max_abs;
      // The GELU by the kernel's table (bf16; fp16 ignores it): the same bits as erff, also for the
      // values outside the table (|v| < 2^-8 or >= 8: wide activations, tiny ones, exact zeros).
      const at::Tensor wide = at::cat({x.narrow(0, 0, x.size(0) / 2) * 24, x.narrow(0, x.size(0) / 2, x.size(0) / 2) / 600}).contiguous();
      at::Tensor off, on, off_normed, on_normed, off_wide, on_wide;
      {
        const mt::ScopedEnv env("MASKD_UPSCALE_GELU_TABLE", "0");
        off = mk::UpscaleHyper(x, wt, bt, hy, h, w);
        off_normed = mk::UpscaleHyper(raw, wt, bt, hy, h, w, {nw, nb, 1e-6});
        off_wide = mk::UpscaleHyper(wide, wt, bt * 0, hy, h, w);
      }
      {
        const mt::ScopedEnv env("MASKD_UPSCALE_GELU_TABLE", "1");
        Poison(ref.nbytes());
        on = mk::UpscaleHyper(x, wt, bt, hy, h, w);
        on_normed = mk::UpscaleHyper(raw, wt, bt, hy, h, w, {nw, nb, 1e-6});
        on_wide = mk::UpscaleHyper(wide, wt, bt * 0, hy, h, w);
      }
      EXPECT_TRUE(at::equal(on, off)) << name << ": max abs " << Compare(on, off).max_abs;
      EXPECT_TRUE(at::equal(on_normed, off_normed)) << name;
      EXPECT_TRUE(at::equal(on_wide, off_wide)) << name << ": max abs " << Compare(on_wide, off_wide).max_abs;
    }
  }
}

// The GELU table's reach: every bf16 value, positive and negative, through the kernel with the
// table and without must give the same mask values. x = one-hot rows (x w = a row of w), w's rows
// every bf16 bit pattern of the table's range and around it, hyper one-hot: each output value is one
// GELU'd (bias 0) conv value.
TEST(kernels_fusion_gpu, UpscaleHyperGeluTableCoversItsRangeExactly) {
  SKIP_WITHOUT_GPU();
  // conv values: every bf16 pattern with exponent field 100..140 (|v| from 2^-27 to 2^13), both signs,
  // plus +-0: 2 * 41 * 128 + 2 values, spread over the w matrix's 64 x 128 entries, 5 passes.
  std::vector<uint16_t> bits;
  for (uint32_t sign = 0; sign < 2; ++sign)
    for (uint32_t e = 100; e <= 140; ++e)
      for (uint32_t m = 0; m < 128; ++m) bits.push_back(static_cast<uint16_t>(sign << 15 | e << 7 | m));
  bits.push_back(0x0000);
  bits.push_back(0x8000);
  const int64_t B = 1, h = 8, wd = 8, rows = B * h * wd * 4;
  const at::Tensor all = at::from_blob(bits.data(), {static_cast<int64_t>(bits.size())}, at::kShort).clone();
  for (int64_t start = 0; start < all.size(0); start += 64 * 128) {
    const int64_t n = std::min<int64_t>(64 * 128, all.size(0) - start);
    at::Tensor wbits = at::zeros({64 * 128}, at::kShort);
    wbits.narrow(0, 0, n).copy_(all.narrow(0, start, n));
    const at::Tensor wt = wbits.view(at::kBFloat16).view({64, 128}).cuda();
    // row r of x selects w's row r % 64: rows (b, y, x, dy, dx), 256 of them
    const at::Tensor x = at::one_hot(at::arange(rows) % 64, 64).to(at::kBFloat16).cuda();
    const at::Tensor bias = at::zeros({128}, wt.options());
    for (int64_t m = 0; m < 32; ++m) {  // hyper picks channel m of each sub-pixel
      const at::Tensor hy = at::one_hot(at::full({B, 4}, m, at::kLong), 32).to(at::kBFloat16).cuda();
      at::Tensor off, on;
      {
        const mt::ScopedEnv env("MASKD_UPSCALE_GELU_TABLE", "0");
        off = mk::UpscaleHyper(x, wt, bias, hy, h, wd);
      }
      {
        const mt::ScopedEnv env("MASKD_UPSCALE_GELU_TABLE", "1");
        on = mk::UpscaleHyper(x, wt, bias, hy, h, wd);
      }
      ASSERT_TRUE(at::equal(on.view(at::kShort), off.view(at::kShort)))
          << "values from " << start << ", channel " << m << ": max abs " << Compare(on, off).max_abs;
    }
  }
}

TEST(kernels_fusion_gpu, CopySlicesEqualsPerSliceClonesAndOwnsItsMemory) {
  SKIP_WITHOUT_GPU();
  uint64_t seed = 500;
  // [G, 4, 256, 256] as the decoder makes it, and odd inner sizes that are not 16-byte multiples
  // (those take the per-slice fallback and must give the same answer).
  for (at::ScalarType t : {at::kBFloat16, at::kFloat}) {
    for (auto shape : {std::vector<int64_t>{64, 4, 256, 256}, std::vector<int64_t>{5, 4, 8, 8},
                       std::vector<int64_t>{3, 4, 3, 5}}) {
      const at::Tensor src = Randn(shape, seed++, t);
      std::vector<int64_t> row, first, count;
      for (int64_t g = 0; g < shape[0]; ++g) {
        // Multimask (masks 1..3) and single-mask (mask 0) prompts mixed, rows out of order.
        row.push_back((g * 7) % shape[0]);
        first.push_back(g % 3 == 0 ? 0 : 1);
        count.push_back(g % 3 == 0 ? 1 : 3);
      }
      Poison(src.nbytes());
      const std::vector<at::Tensor> out = mk::CopySlices(src, row, first, count);
      ASSERT_EQ(out.size(), row.size());
      for (size_t i = 0; i < out.size(); ++i) {
        const at::Tensor ref = src[row[i]].narrow(0, first[i], count[i]);
        ASSERT_TRUE(out[i].is_contiguous());
        ASSERT_EQ(out[i].sizes(), ref.sizes());
        EXPECT_TRUE(at::equal(out[i], ref)) << "slice " << i << " of " << src.sizes() << " " << c10::toString(t);
        // Its own storage: not a view of src, and not shared with another slice.
        EXPECT_NE(out[i].data_ptr(), ref.data_ptr());
        if (i > 0) EXPECT_NE(out[i].data_ptr(), out[i - 1].data_ptr());
        EXPECT_EQ(out[i].storage().nbytes(), ref.nbytes());
      }
    }
  }
}

}  // namespace
