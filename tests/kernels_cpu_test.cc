// The kernels' LibTorch references against independent plain computations, and the public functions
// on CPU tensors (their fallback path). Runs without a GPU.
#include <gtest/gtest.h>

#include <ATen/ATen.h>

#include <array>
#include <cmath>
#include <limits>
#include <vector>

#include "kernels/bilinear.h"
#include "kernels/kernels.h"
#include "model/io/pil_resize.h"

namespace mk = maskd::kernels;

namespace {

at::Generator Gen(uint64_t seed) { return at::make_generator<at::CPUGeneratorImpl>(seed); }

at::Tensor Randn(at::IntArrayRef sizes, uint64_t seed, double std = 1.0) {
  return at::randn(sizes, Gen(seed), at::kFloat) * std;
}

// q, k, v as views of one qkv projection [B, N, 3, H, D], as the encoder produces them.
struct Qkv {
  at::Tensor qkv, q, k, v;
};
Qkv MakeQkv(int64_t B, int64_t H, int64_t N, int64_t D, at::ScalarType dtype, uint64_t seed) {
  Qkv r;
  r.qkv = Randn({B, N, 3, H, D}, seed).to(dtype);
  const at::Tensor p = r.qkv.permute({2, 0, 3, 1, 4});  // [3, B, H, N, D]
  r.q = p[0];
  r.k = p[1];
  r.v = p[2];
  return r;
}

// SAM's attention in float64 with explicit loops over the materialised bias: for each (b, h, n),
// bias_j = rel_h[n, j / W] + rel_w[n, j % W], softmax over j of scale q.k_j + bias_j, times v.
at::Tensor NaiveRelPosAttention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                const at::Tensor& rel_h, const at::Tensor& rel_w, int64_t gw,
                                double scale) {
  const int64_t B = q.size(0), H = q.size(1), N = q.size(2), D = q.size(3);
  const auto qd = q.to(at::kDouble).contiguous(), kd = k.to(at::kDouble).contiguous(),
             vd = v.to(at::kDouble).contiguous(), rh = rel_h.to(at::kDouble).contiguous(),
             rw = rel_w.to(at::kDouble).contiguous();
  const int64_t gh = rel_h.size(3);
  auto qa = qd.accessor<double, 4>(), ka = kd.accessor<double, 4>(), va = vd.accessor<double, 4>(),
       rha = rh.accessor<double, 4>(), rwa = rw.accessor<double, 4>();
  at::Tensor out = at::zeros({B, N, H, D}, at::kDouble);
  auto oa = out.accessor<double, 4>();
  std::vector<double> s(N);
  for (int64_t b = 0; b < B; ++b) {
    for (int64_t h = 0; h < H; ++h) {
      for (int64_t n = 0; n < N; ++n) {
        double mx = -std::numeric_limits<double>::infinity();
        for (int64_t j = 0; j < N; ++j) {
          double dot = 0;
          for (int64_t d = 0; d < D; ++d) dot += qa[b][h][n][d] * ka[b][h][j][d];
          EXPECT_LT(j / gw, gh);
          s[j] = scale * dot + rha[b][h][n][j / gw] + rwa[b][h][n][j % gw];
          mx = std::max(mx, s[j]);
        }
        double sum = 0;
        for (int64_t j = 0; j < N; ++j) sum += (s[j] = std::exp(s[j] - mx));
        for (int64_t j = 0; j < N; ++j) {
          for (int64_t d = 0; d < D; ++d) oa[b][n][h][d] += s[j] / sum * va[b][h][j][d];
        }
      }
    }
  }
  return out;
}

double MaxAbs(const at::Tensor& a, const at::Tensor& b) {
  return (a.to(at::kDouble) - b.to(at::kDouble)).abs().max().item<double>();
}

}  // namespace

// ---------------------------------------------------------------------------------------------------
// RelPosAttention

TEST(kernels_cpu, RelPosAttentionReferenceMatchesNaiveFormula) {
  // Grids that are not square and not a multiple of anything, plus a 1 x W edge case.
  for (auto [gh, gw] : {std::pair<int64_t, int64_t>{3, 5}, {4, 4}, {1, 7}}) {
    const int64_t B = 2, H = 3, D = 8, N = gh * gw;
    const Qkv x = MakeQkv(B, H, N, D, at::kFloat, 11 + gh);
    const at::Tensor rel_h = Randn({B, H, N, gh}, 21 + gh);
    const at::Tensor rel_w = Randn({B, H, N, gw}, 31 + gw);
    const double scale = 1.0 / std::sqrt(static_cast<double>(D));
    const at::Tensor ref = mk::RelPosAttentionReference(x.q, x.k, x.v, rel_h, rel_w, gh, gw, scale);
    const at::Tensor naive = NaiveRelPosAttention(x.q, x.k, x.v, rel_h, rel_w, gw, scale);
    ASSERT_EQ(ref.sizes(), (at::IntArrayRef{B, N, H, D}));
    EXPECT_EQ(ref.scalar_type(), at::kFloat);
    EXPECT_TRUE(ref.is_contiguous());
    EXPECT_LT(MaxAbs(ref, naive), 1e-5) << gh << "x" << gw;
  }
}

TEST(kernels_cpu, RelPosAttentionReferenceKeepsDtypeAndAcceptsLowPrecisionBias) {
  const int64_t B = 1, H = 2, gh = 4, gw = 6, N = gh * gw, D = 16;
  const Qkv x = MakeQkv(B, H, N, D, at::kBFloat16, 5);
  const at::Tensor rel_h = Randn({B, H, N, gh}, 6).to(at::kBFloat16);
  const at::Tensor rel_w = Randn({B, H, N, gw}, 7).to(at::kBFloat16);
  const at::Tensor ref = mk::RelPosAttentionReference(x.q, x.k, x.v, rel_h, rel_w, gh, gw, 0.25);
  EXPECT_EQ(ref.scalar_type(), at::kBFloat16);
  const at::Tensor naive = NaiveRelPosAttention(x.q, x.k, x.v, rel_h, rel_w, gw, 0.25);
  // Inputs are the same bf16 values; the only difference is the bf16 rounding of the output.
  EXPECT_LT(MaxAbs(ref, naive), 1e-2);
}

TEST(kernels_cpu, RelPosAttentionOnCpuIsTheReference) {
  const int64_t B = 2, H = 2, gh = 5, gw = 3, N = gh * gw, D = 8;
  const Qkv x = MakeQkv(B, H, N, D, at::kFloat, 9);
  const at::Tensor rel_h = Randn({B, H, N, gh}, 10);
  const at::Tensor rel_w = Randn({B, H, N, gw}, 12);
  const at::Tensor a = mk::RelPosAttention(x.q, x.k, x.v, rel_h, rel_w, gh, gw, 0.3);
  const at::Tensor b = mk::RelPosAttentionReference(x.q, x.k, x.v, rel_h, rel_w, gh, gw, 0.3);
  EXPECT_TRUE(at::equal(a, b));
}

TEST(kernels_cpu, RelPosAttentionRejectsBadShapes) {
  const Qkv x = MakeQkv(1, 2, 12, 8, at::kFloat, 1);
  const at::Tensor rel_h = Randn({1, 2, 12, 3}, 2);
  const at::Tensor rel_w = Randn({1, 2, 12, 4}, 3);
  EXPECT_THROW(mk::RelPosAttention(x.q, x.k, x.v, rel_h, rel_w, 4, 4, 1.0), c10::Error);  // 16 != 12
  EXPECT_THROW(mk::RelPosAttention(x.q, x.k, x.v, rel_w, rel_h, 3, 4, 1.0), c10::Error);  // swapped
  EXPECT_THROW(mk::RelPosAttention(x.q, x.k.narrow(2, 0, 6), x.v, rel_h, rel_w, 3, 4, 1.0),
               c10::Error);
  try {
    mk::RelPosAttention(x.q, x.k, x.v, rel_h, rel_w, 4, 4, 1.0);
  } catch (const c10::Error& e) {
    EXPECT_NE(std::string(e.what()).find("grid_h x grid_w"), std::string::npos) << e.what();
  }
}

// ---------------------------------------------------------------------------------------------------
// ResizeNormalizePad

namespace {
at::Tensor RandomImage(int64_t h, int64_t w, uint64_t seed) {
  return at::randint(0, 256, {h, w, 3}, Gen(seed), at::TensorOptions().dtype(at::kByte));
}
}  // namespace

TEST(kernels_cpu, ResizeNormalizePadReferenceMatchesPilResizeAndFormula) {
  const std::vector<float> mean = {123.675f, 116.28f, 103.53f};
  const std::vector<float> std = {58.395f, 57.12f, 57.375f};
  struct Case {
    int64_t h, w, out_h, out_w, pad;
  };
  for (const Case& c : {Case{60, 80, 48, 64, 64}, Case{30, 20, 45, 30, 50}, Case{17, 33, 17, 33, 40}}) {
    const at::Tensor rgb = RandomImage(c.h, c.w, c.h * 100 + c.w);
    const at::Tensor out =
        mk::ResizeNormalizePadReference(rgb, c.out_h, c.out_w, c.pad, mean, std, at::kFloat);
    ASSERT_EQ(out.sizes(), (at::IntArrayRef{3, c.pad, c.pad}));
    maskd::ImageRGB8 im;
    im.height = static_cast<int>(c.h);
    im.width = static_cast<int>(c.w);
    im.pixels.assign(rgb.data_ptr<uint8_t>(), rgb.data_ptr<uint8_t>() + rgb.numel());
    const maskd::ImageRGB8 r =
        maskd::PilResizeBilinear(im, static_cast<int>(c.out_w), static_cast<int>(c.out_h));
    auto o = out.accessor<float, 3>();
    int64_t mismatches = 0;
    for (int64_t ch = 0; ch < 3; ++ch) {
      for (int64_t y = 0; y < c.pad; ++y) {
        for (int64_t x = 0; x < c.pad; ++x) {
          float expect = 0.0f;
          if (y < c.out_h && x < c.out_w) {
            const float px = r.pixels[(y * c.out_w + x) * 3 + ch];
            expect = (px - mean[ch]) / std[ch];
          }
          mismatches += o[ch][y][x] != expect;
        }
      }
    }
    EXPECT_EQ(mismatches, 0) << c.h << "x" << c.w << " -> " << c.out_h << "x" << c.out_w;
  }
}

TEST(kernels_cpu, ResizeNormalizePadIdentityKeepsPixelsAndCastsDtype) {
  const at::Tensor rgb = RandomImage(24, 40, 77);
  const at::Tensor out = mk::ResizeNormalizePad(rgb, 24, 40, 48, {0, 0, 0}, {1, 1, 1}, at::kFloat);
  EXPECT_TRUE(at::equal(out.slice(1, 0, 24).slice(2, 0, 40), rgb.permute({2, 0, 1}).to(at::kFloat)));
  EXPECT_EQ(out.slice(1, 24).abs().sum().item<float>(), 0.0f);
  EXPECT_EQ(out.slice(2, 40).abs().sum().item<float>(), 0.0f);
  const at::Tensor bf = mk::ResizeNormalizePad(rgb, 24, 40, 48, {0, 0, 0}, {1, 1, 1}, at::kBFloat16);
  EXPECT_EQ(bf.scalar_type(), at::kBFloat16);
  EXPECT_TRUE(at::equal(bf, out.to(at::kBFloat16)));
}

TEST(kernels_cpu, ResizeNormalizePadRejectsBadArguments) {
  const at::Tensor rgb = RandomImage(8, 8, 1);
  EXPECT_THROW(mk::ResizeNormalizePad(rgb, 9, 8, 8, {0, 0, 0}, {1, 1, 1}, at::kFloat), c10::Error);
  EXPECT_THROW(mk::ResizeNormalizePad(rgb, 8, 8, 8, {0, 0}, {1, 1, 1}, at::kFloat), c10::Error);
  EXPECT_THROW(mk::ResizeNormalizePad(rgb.to(at::kFloat), 8, 8, 8, {0, 0, 0}, {1, 1, 1}, at::kFloat),
               c10::Error);
}

// ---------------------------------------------------------------------------------------------------
// MaskPostprocess

namespace {

// Smooth random logits (blobs, like real masks) plus a little noise.
at::Tensor SmoothLogits(int64_t M, int64_t size, uint64_t seed) {
  const at::Tensor coarse = Randn({M, 1, 8, 8}, seed, 4.0);
  return (at::upsample_bicubic2d(coarse, {size, size}, false) + Randn({M, 1, size, size}, seed + 1, 0.1))
      .select(1, 0)
      .contiguous();
}

std::vector<uint8_t> DecodeRle(const int32_t* counts, int64_t n, int64_t h, int64_t w) {
  std::vector<uint8_t> col_major;
  uint8_t v = 0;
  for (int64_t i = 0; i < n; ++i) {
    col_major.insert(col_major.end(), static_cast<size_t>(counts[i]), v);
    v ^= 1;
  }
  EXPECT_EQ(static_cast<int64_t>(col_major.size()), h * w);
  std::vector<uint8_t> row_major(static_cast<size_t>(h * w));
  for (int64_t x = 0; x < w && static_cast<int64_t>(col_major.size()) == h * w; ++x) {
    for (int64_t y = 0; y < h; ++y) row_major[y * w + x] = col_major[x * h + y];
  }
  return row_major;
}

}  // namespace

TEST(kernels_cpu, MaskPostprocessReferenceMatchesDirectInterpolation) {
  const int64_t M = 4, low = 64, pad = 256;
  const at::Tensor logits = SmoothLogits(M, low, 3);
  // (input_h, input_w, orig_h, orig_w): identity second stage, downscale, upscale, tiny.
  const at::Tensor geometry =
      at::tensor({192, 256, 192, 256, 256, 171, 300, 200, 100, 256, 300, 768, 10, 7, 5, 3},
                 at::kInt)
          .view({M, 4});
  const mk::MaskPostprocessOutput out =
      mk::MaskPostprocessReference(logits, geometry, pad, /*want_rle=*/true, /*want_bitmask=*/true);
  ASSERT_EQ(out.rle_offsets.numel(), M + 1);
  ASSERT_EQ(out.bitmask_offsets.numel(), M + 1);
  for (int64_t m = 0; m < M; ++m) {
    const auto g = geometry[m];
    const int64_t ih = g[0].item<int>(), iw = g[1].item<int>(), oh = g[2].item<int>(),
                  ow = g[3].item<int>();
    // SAM: F.interpolate(masks, (1024, 1024)) -> [..., :h, :w] -> F.interpolate(original_size).
    const at::Tensor full =
        at::upsample_bilinear2d(
            at::upsample_bilinear2d(logits[m].view({1, 1, low, low}), {pad, pad}, false)
                .slice(2, 0, ih)
                .slice(3, 0, iw),
            {oh, ow}, false)
            .view({oh, ow});
    const at::Tensor mask = (full > 0).to(at::kByte).contiguous();
    EXPECT_EQ(out.area[m].item<int64_t>(), mask.sum().item<int64_t>());
    const int64_t lo = (full > -1).sum().item<int64_t>();
    const float stability =
        lo == 0 ? 1.0f : static_cast<float>((full > 1).sum().item<int64_t>()) / static_cast<float>(lo);
    EXPECT_FLOAT_EQ(out.stability[m].item<float>(), stability);
    const at::Tensor nz = mask.nonzero();  // [K, 2] (y, x)
    const auto box = out.bbox[m];
    if (nz.size(0) == 0) {
      EXPECT_EQ(box.abs().sum().item<int>(), 0);
    } else {
      const int64_t y0 = nz.select(1, 0).min().item<int64_t>(), y1 = nz.select(1, 0).max().item<int64_t>();
      const int64_t x0 = nz.select(1, 1).min().item<int64_t>(), x1 = nz.select(1, 1).max().item<int64_t>();
      EXPECT_EQ(box[0].item<int>(), x0);
      EXPECT_EQ(box[1].item<int>(), y0);
      EXPECT_EQ(box[2].item<int>(), x1 - x0 + 1);
      EXPECT_EQ(box[3].item<int>(), y1 - y0 + 1);
    }
    const int64_t b0 = out.bitmask_offsets[m].item<int64_t>();
    EXPECT_EQ(out.bitmask_offsets[m + 1].item<int64_t>() - b0, oh * ow);
    EXPECT_TRUE(at::equal(out.bitmask.slice(0, b0, b0 + oh * ow), mask.flatten()));
    const int64_t r0 = out.rle_offsets[m].item<int64_t>(), r1 = out.rle_offsets[m + 1].item<int64_t>();
    const std::vector<uint8_t> decoded =
        DecodeRle(out.rle_counts.data_ptr<int32_t>() + r0, r1 - r0, oh, ow);
    EXPECT_TRUE(std::equal(decoded.begin(), decoded.end(), mask.data_ptr<uint8_t>())) << m;
    // COCO: runs alternate, only the first may be 0.
    for (int64_t i = r0 + 1; i < r1; ++i) EXPECT_GT(out.rle_counts[i].item<int>(), 0);
  }
}

TEST(kernels_cpu, MaskPostprocessEdgeMasks) {
  const int64_t low = 16;
  at::Tensor logits = at::full({3, low, low}, -5.0f);
  logits[1].fill_(5.0f);
  logits[2].fill_(-5.0f);
  logits[2][0][0] = 50.0f;  // a blob in the top-left corner: the mask starts with ones
  const at::Tensor geometry = at::tensor({32, 32, 20, 24, 32, 32, 20, 24, 32, 32, 20, 24}, at::kInt).view({3, 4});
  const mk::MaskPostprocessOutput out = mk::MaskPostprocess(logits, geometry, 32, true, false);
  EXPECT_FALSE(out.bitmask.defined());
  // Empty: one run of zeros, area 0, bbox zeros, stability 1 (|v > -1| = 0).
  EXPECT_EQ(out.area[0].item<int64_t>(), 0);
  EXPECT_EQ(out.bbox[0].abs().sum().item<int>(), 0);
  EXPECT_EQ(out.stability[0].item<float>(), 1.0f);
  EXPECT_EQ(out.rle_offsets[1].item<int64_t>() - out.rle_offsets[0].item<int64_t>(), 1);
  EXPECT_EQ(out.rle_counts[out.rle_offsets[0].item<int64_t>()].item<int>(), 20 * 24);
  // Full: [0, H * W].
  const int64_t f = out.rle_offsets[1].item<int64_t>();
  EXPECT_EQ(out.rle_offsets[2].item<int64_t>() - f, 2);
  EXPECT_EQ(out.rle_counts[f].item<int>(), 0);
  EXPECT_EQ(out.rle_counts[f + 1].item<int>(), 20 * 24);
  EXPECT_EQ(out.area[1].item<int64_t>(), 20 * 24);
  EXPECT_EQ(out.stability[1].item<float>(), 1.0f);
  EXPECT_EQ(out.bbox[1][2].item<int>(), 24);
  EXPECT_EQ(out.bbox[1][3].item<int>(), 20);
  // Corner blob: a leading zero-length run.
  EXPECT_EQ(out.rle_counts[out.rle_offsets[2].item<int64_t>()].item<int>(), 0);
  EXPECT_EQ(out.bbox[2][0].item<int>(), 0);
  EXPECT_EQ(out.bbox[2][1].item<int>(), 0);
}

// The kernel's per-pixel arithmetic (kernels/bilinear.h, also compiled into the CUDA kernel) against
// ATen's upsample_bilinear2d for the scale pairs SAM uses, including upscaling, downscaling and the
// edges. Here the host compiler and CPU ATen may round src = scale * (dst + 0.5) - 0.5 differently
// (fused or not): one ulp of src near index 171 is 1.5e-5, so values agree to ~1e-4 (the CUDA
// kernel, compiled by nvcc like ATen's, is compared with ATen's CUDA upsample in the GPU test);
// what must agree exactly is the choice of taps and the edge handling, i.e. no sign flips here.
TEST(kernels_cpu, BilinearTapsMatchUpsampleBilinear2d) {
  namespace bl = mk::bilinear;
  for (auto [in_h, in_w, out_h, out_w] :
       {std::array<int, 4>{64, 64, 256, 256}, {256, 256, 1024, 1024}, {768, 1024, 600, 800},
        {171, 256, 1500, 2250}, {5, 3, 5, 9}}) {
    const at::Tensor src = Randn({1, 1, in_h, in_w}, in_h * 7 + out_w);
    const at::Tensor ref = at::upsample_bilinear2d(src, {out_h, out_w}, false).view({out_h, out_w});
    const at::Tensor src2 = src.view({in_h, in_w});
    auto s = src2.accessor<float, 2>();
    auto r = ref.accessor<float, 2>();
    const float sh = bl::Scale(in_h, out_h), sw = bl::Scale(in_w, out_w);
    double max_diff = 0;
    int64_t sign_flips = 0;
    for (int y = 0; y < out_h; ++y) {
      const bl::Taps ty = bl::SourceTaps(sh, y, in_h);
      ASSERT_GE(ty.i0, 0);
      ASSERT_LT(ty.i1, in_h);
      for (int x = 0; x < out_w; ++x) {
        const bl::Taps tx = bl::SourceTaps(sw, x, in_w);
        const float v = bl::Combine(ty, tx, s[ty.i0][tx.i0], s[ty.i0][tx.i1], s[ty.i1][tx.i0],
                                    s[ty.i1][tx.i1]);
        max_diff = std::max(max_diff, static_cast<double>(std::fabs(v - r[y][x])));
        sign_flips += (v > 0) != (r[y][x] > 0);
      }
    }
    EXPECT_LT(max_diff, 1e-4) << in_h << "x" << in_w << " -> " << out_h << "x" << out_w;
    EXPECT_EQ(sign_flips, 0);
  }
}

// ---------------------------------------------------------------------------------------------------
// fp8 e4m3 quantisation: every value within e4m3's half-ulp (2^-4 relative) of its row's scaled
// value, the row's largest magnitude maps to 448, a zero row stays zero with a finite scale; the
// linear on the quantised values is the dequantised matmul, ~3 % of |y| from the float linear.
TEST(kernels_cpu, Fp8QuantisationAndLinearReference) {
  const int64_t M = 40, K = 64, N = 32;
  at::Tensor x = Randn({M, K}, 17);
  x[3].zero_();
  const at::Tensor w = Randn({N, K}, 18, 0.1);
  const at::Tensor bias = Randn({N}, 19);
  const mk::Fp8Rows xq = mk::QuantizeRowsFp8(x);
  ASSERT_EQ(xq.values.scalar_type(), at::kFloat8_e4m3fn);
  ASSERT_EQ(xq.scales.sizes(), (at::IntArrayRef{M, 1}));
  const at::Tensor deq = xq.values.to(at::kFloat) * xq.scales;
  const at::Tensor rel = ((deq - x).abs() - x.abs() * (1.0 / 16) - xq.scales * 1e-3);
  EXPECT_LE(rel.max().item<float>(), 0.0f) << "a value off by more than e4m3's rounding";
  EXPECT_FLOAT_EQ(xq.values.to(at::kFloat).abs().amax(1).select(0, 0).item<float>(), 448.0f);
  EXPECT_EQ(deq[3].abs().sum().item<float>(), 0.0f);
  EXPECT_TRUE(std::isfinite(xq.scales[3].item<float>()));
  const mk::Fp8Weight wq = mk::QuantizeWeightFp8(w);
  ASSERT_EQ(wq.values.sizes(), (at::IntArrayRef{N, K}));
  ASSERT_EQ(wq.scales.sizes(), (at::IntArrayRef{1, N}));
  const at::Tensor y = mk::Fp8LinearReference(xq, wq, bias, at::kFloat);
  const at::Tensor expect = at::linear(deq, wq.values.to(at::kFloat) * wq.scales.t(), bias);
  EXPECT_LT((y - expect).abs().max().item<float>(), 1e-4);
  const at::Tensor exact = at::linear(x, w, bias);
  EXPECT_LT((y - exact).norm().item<double>() / exact.norm().item<double>(), 5e-2);
  // On the CPU the entry point is the reference.
  EXPECT_TRUE(at::equal(mk::Fp8Linear(xq, wq, bias, at::kFloat), y));
  EXPECT_THROW(mk::QuantizeRowsFp8(Randn({2, 3, 4}, 20)), c10::Error);
}

// The linear layer's reference (and, on the CPU, the entry point): bias + GELU (LibTorch's
// _addmm_activation: the erf form on the CPU, cuBLASLt's tanh form on CUDA) or bias, into a given
// output or a new one, against the formula; no bias; shape errors named.
TEST(kernels_cpu, TunedLinearReferenceOnTheCpu) {
  const at::Tensor x = Randn({37, 24}, 40), w = Randn({40, 24}, 41, 0.2), bias = Randn({40}, 42);
  const at::Tensor lin = at::linear(x, w, bias);
  EXPECT_TRUE(at::allclose(mk::TunedLinear(x, w, bias, false), lin, 1e-5, 1e-5));
  EXPECT_TRUE(at::allclose(mk::TunedLinear(x, w, bias, true), at::gelu(lin), 1e-5, 1e-5));
  at::Tensor out = at::zeros({37, 40});
  const at::Tensor y = mk::TunedLinear(x, w, bias, true, out);
  EXPECT_EQ(y.data_ptr(), out.data_ptr());
  EXPECT_TRUE(at::allclose(out, at::gelu(lin), 1e-5, 1e-5));
  // Rows of a wider output (a strided row pitch), as the MLP writes its row chunks.
  at::Tensor wide = at::zeros({37, 50});
  mk::TunedLinear(x, w, bias, false, wide.narrow(1, 5, 40));
  EXPECT_TRUE(at::allclose(wide.narrow(1, 5, 40), lin, 1e-5, 1e-5));
  EXPECT_EQ(wide.narrow(1, 0, 5).abs().sum().item<float>(), 0.0f);
  EXPECT_TRUE(at::allclose(mk::TunedLinear(x, w, at::Tensor(), true), at::gelu(at::mm(x, w.t())), 1e-5, 1e-5));
  // Accumulating: out += x w^T + bias (then GELU of the sum when asked); no output to add to refused.
  const at::Tensor start = Randn({37, 40}, 46);
  at::Tensor acc = start.clone();
  EXPECT_EQ(mk::TunedLinear(x, w, bias, false, acc, /*accumulate=*/true).data_ptr(), acc.data_ptr());
  EXPECT_TRUE(at::allclose(acc, start + lin, 1e-5, 1e-5));
  EXPECT_THROW(mk::TunedLinear(x, w, bias, false, at::Tensor(), true), c10::Error);
  EXPECT_THROW(mk::TunedLinear(x, Randn({40, 23}, 43), bias, false), c10::Error);
  EXPECT_THROW(mk::TunedLinear(x, w, Randn({39}, 44), false), c10::Error);
  EXPECT_THROW(mk::TunedLinear(x, w, bias, false, at::zeros({36, 40})), c10::Error);
  EXPECT_THROW(mk::TunedLinear(Randn({2, 37, 24}, 45), w, bias, false), c10::Error);
  EXPECT_TRUE(mk::GemmTunings().empty());  // nothing is tuned on the CPU
}

TEST(kernels_cpu, BuiltWithCudaIsConsistentWithTheBuild) {
#ifdef MASKD_KERNELS_TEST_EXPECT_CUDA
  EXPECT_TRUE(mk::BuiltWithCuda());
#else
  // A build without MASKD_WITH_CUDA has only the LibTorch references and must say so.
  EXPECT_FALSE(mk::BuiltWithCuda());
#endif
}
