// Each CUDA kernel against its LibTorch reference on fresh random inputs (never zeros), several
// shapes, per-dtype tolerances stated next to the checks. Skips without a CUDA device or in a build
// without the kernels.
//
// Outputs are allocated inside the kernels' host functions, so they cannot be pre-filled; instead
// each call is preceded by Poison(): it fills and frees a large NaN block, which LibTorch's caching
// allocator hands out again for the outputs, so an element the kernel never writes stays NaN and
// fails the comparison (every check also requires all outputs finite).
#include <gtest/gtest.h>
#include <torch/cuda.h>

#include <ATen/ATen.h>
#include <ATen/cuda/CUDAContext.h>
#include <ATen/cuda/CUDAGraph.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDACachingAllocator.h>

#include <array>
#include <cmath>
#include <cctype>
#include <string>
#include <tuple>
#include <vector>

#include "kernels/kernels.h"
#include "model/io/rle.h"

namespace mk = maskd::kernels;

namespace {

#define SKIP_WITHOUT_GPU()                                                   \
  do {                                                                       \
    if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device";      \
    if (!mk::BuiltWithCuda()) GTEST_SKIP() << "built without MASKD_WITH_CUDA"; \
  } while (0)

const at::Device kCuda(at::kCUDA, 0);

at::Generator Gen(uint64_t seed) { return at::make_generator<at::CPUGeneratorImpl>(seed); }

// Random on the CPU (reproducible), moved to the device.
at::Tensor Randn(at::IntArrayRef sizes, uint64_t seed, double std = 1.0) {
  return (at::randn(sizes, Gen(seed), at::kFloat) * std).to(kCuda);
}

// 0x7fc07fc0 is NaN read as float32 and, in each half, as bf16 and fp16 (a float NaN fill would
// leave every other 16-bit element 0); read as bytes it is 0x7f/0xc0, never a valid 0/1 mask byte.
void Poison(int64_t bytes) {
  at::Tensor p = at::full({bytes / 4 + 1}, 0x7fc07fc0,
                          at::TensorOptions().device(kCuda).dtype(at::kInt));
  (void)p;
}

struct Errors {
  double rel_l2 = 0, max_abs = 0;
  bool finite = true;
};
Errors Compare(const at::Tensor& out, const at::Tensor& ref) {
  const at::Tensor o = out.to(at::kDouble), r = ref.to(at::kDouble);
  Errors e;
  e.finite = o.isfinite().all().item<bool>();
  e.max_abs = (o - r).abs().max().item<double>();
  e.rel_l2 = (o - r).norm().item<double>() / r.norm().item<double>();
  return e;
}

// ---------------------------------------------------------------------------------------------------
// RelPosAttention

struct AttnCase {
  std::string name;
  int64_t batch, heads, grid_h, grid_w, head_dim;
  bool rel_float32;
};

std::string CaseName(const AttnCase& c, at::ScalarType t) {
  return c.name + (t == at::kBFloat16 ? "/bf16" : "/fp16") + (c.rel_float32 ? "/rel-fp32" : "/rel-16");
}

// Tolerances (|out - ref| on outputs of magnitude <= ~1, ref in fp32 from the same 16-bit inputs):
// bf16 has 8 mantissa bits (P and the output are rounded to it): rel L2 <= 1.5e-2, max abs <= 4e-2;
// fp16 has 11: rel L2 <= 3e-3, max abs <= 6e-3.
constexpr double kBf16RelL2 = 1.5e-2, kBf16MaxAbs = 4e-2;
constexpr double kFp16RelL2 = 3e-3, kFp16MaxAbs = 6e-3;

void RunAttentionCase(const AttnCase& c, at::ScalarType dtype, uint64_t seed) {
  SCOPED_TRACE(CaseName(c, dtype));
  const int64_t B = c.batch, H = c.heads, N = c.grid_h * c.grid_w, D = c.head_dim;
  // q/k/v: views of one qkv projection [B, N, 3, H, D] (non-contiguous, head stride D).
  const at::Tensor qkv = Randn({B, N, 3, H, D}, seed).to(dtype);
  const at::Tensor p = qkv.permute({2, 0, 3, 1, 4});
  const at::Tensor q = p[0], k = p[1], v = p[2];
  ASSERT_FALSE(q.is_contiguous());
  // rel_h/rel_w as SAM computes them (q . R): [B, H, N, grid], here random of similar scale; a
  // view with a padded last-but-one stride to exercise strides.
  const at::ScalarType rel_t = c.rel_float32 ? at::kFloat : dtype;
  const at::Tensor rel_h = Randn({B, H, N, c.grid_h + 3}, seed + 1, 1.5).to(rel_t).narrow(3, 0, c.grid_h);
  const at::Tensor rel_w = Randn({B, H, N, c.grid_w}, seed + 2, 1.5).to(rel_t);
  const double scale = 1.0 / std::sqrt(static_cast<double>(D));

  Poison(B * N * H * D * 2);
  const at::Tensor out = mk::RelPosAttention(q, k, v, rel_h, rel_w, c.grid_h, c.grid_w, scale);
  ASSERT_EQ(out.sizes(), (at::IntArrayRef{B, N, H, D}));
  ASSERT_EQ(out.scalar_type(), dtype);
  ASSERT_TRUE(out.is_contiguous());
  const at::Tensor ref =
      mk::RelPosAttentionReference(q, k, v, rel_h, rel_w, c.grid_h, c.grid_w, scale);
  const Errors e = Compare(out, ref.to(at::kFloat));
  EXPECT_TRUE(e.finite);
  const bool bf16 = dtype == at::kBFloat16;
  EXPECT_LE(e.rel_l2, bf16 ? kBf16RelL2 : kFp16RelL2);
  EXPECT_LE(e.max_abs, bf16 ? kBf16MaxAbs : kFp16MaxAbs);
  std::printf("  %-36s rel_l2 %.2e  max_abs %.2e\n", CaseName(c, dtype).c_str(), e.rel_l2,
              e.max_abs);
}

const std::vector<AttnCase>& AttnCases() {
  static const std::vector<AttnCase> cases = {
      // SAM's shapes: 14 x 14 windows (25 per 1024 image, N = 196, not a multiple of 64) and the
      // 64 x 64 global attention; vit_b/vit_l heads of 64, vit_h heads of 80.
      {"vit_b-window-b1", 25, 12, 14, 14, 64, true},
      {"vit_b-window-b2", 50, 12, 14, 14, 64, false},
      {"vit_h-window-b1", 25, 16, 14, 14, 80, true},
      {"vit_b-global-b1", 1, 12, 64, 64, 64, true},
      {"vit_b-global-b2", 2, 12, 64, 64, 64, false},
      {"vit_h-global-b2", 2, 16, 64, 64, 80, true},
      // Other sequence lengths: shorter than one tile, odd grid_h with the aligned (grid_w = 64)
      // path, a grid whose rows straddle tiles, a query tile past N in the 8-warp variant.
      {"grid-7x9", 3, 2, 7, 9, 64, true},
      {"grid-3x64", 2, 3, 3, 64, 80, true},
      {"grid-20x20", 2, 4, 20, 20, 64, false},
      {"grid-33x37", 1, 2, 33, 37, 80, true},
  };
  return cases;
}

// One test per (dtype, shape), seeds as before: 110, 120, ... for bf16, 210, 220, ... for fp16.
class RelPosAttentionByCase : public ::testing::TestWithParam<std::tuple<at::ScalarType, size_t>> {};

TEST_P(RelPosAttentionByCase, MatchesReference) {
  SKIP_WITHOUT_GPU();
  const auto [dtype, index] = GetParam();
  const uint64_t base = dtype == at::kBFloat16 ? 100 : 200;
  RunAttentionCase(AttnCases()[index], dtype, base + 10 * (index + 1));
}
INSTANTIATE_TEST_SUITE_P(
    kernels_gpu, RelPosAttentionByCase,
    ::testing::Combine(::testing::Values(at::kBFloat16, at::kHalf),
                       ::testing::Range<size_t>(0, AttnCases().size())),
    [](const ::testing::TestParamInfo<std::tuple<at::ScalarType, size_t>>& info) {
      std::string n = CaseName(AttnCases()[std::get<1>(info.param)], std::get<0>(info.param));
      for (char& ch : n)
        if (!std::isalnum(static_cast<unsigned char>(ch))) ch = '_';
      return n;
    });

TEST(kernels_gpu, RelPosAttentionIsDeterministicAndUsesTheGivenStream) {
  SKIP_WITHOUT_GPU();
  const int64_t N = 4096;
  const at::Tensor qkv = Randn({1, N, 3, 12, 64}, 7).to(at::kBFloat16);
  const at::Tensor p = qkv.permute({2, 0, 3, 1, 4});
  const at::Tensor rel_h = Randn({1, 12, N, 64}, 8), rel_w = Randn({1, 12, N, 64}, 9);
  const at::Tensor a = mk::RelPosAttention(p[0], p[1], p[2], rel_h, rel_w, 64, 64, 0.125);
  auto side = c10::cuda::getStreamFromPool();
  side.synchronize();
  at::cuda::getCurrentCUDAStream().synchronize();
  const at::Tensor b = mk::RelPosAttention(p[0], p[1], p[2], rel_h, rel_w, 64, 64, 0.125,
                                           static_cast<mk::Stream>(side.stream()));
  side.synchronize();
  EXPECT_TRUE(at::equal(a, b));  // same inputs, same schedule: bit-identical (no atomics)
}

TEST(kernels_gpu, RelPosAttentionRejectsUnsupportedHeadDim) {
  SKIP_WITHOUT_GPU();
  const at::Tensor q = Randn({1, 2, 16, 32}, 1).to(at::kBFloat16);
  const at::Tensor r = Randn({1, 2, 16, 4}, 2);
  EXPECT_THROW(mk::RelPosAttention(q, q, q, r, r, 4, 4, 1.0), c10::Error);
}

// ---------------------------------------------------------------------------------------------------
// ResizeNormalizePad

at::Tensor RandomImage(int64_t h, int64_t w, uint64_t seed) {
  // Smooth gradients plus noise: both the flat and the busy parts of real photos.
  const at::Tensor noise =
      at::randint(0, 256, {h, w, 3}, Gen(seed), at::TensorOptions().dtype(at::kFloat));
  const at::Tensor ramp = at::linspace(0, 255, w).view({1, w, 1}).expand({h, w, 3});
  return ((noise + ramp) * 0.5).clamp(0, 255).to(at::kByte).contiguous().to(kCuda);
}

TEST(kernels_gpu, ResizeNormalizePadIsBitExact) {
  SKIP_WITHOUT_GPU();
  struct Case {
    int64_t h, w, out_h, out_w;
  };
  // The workload's 1024 x 768 (no resize), a phone photo down, a small image up, width-only and
  // height-only resizes, an odd-sized one.
  const std::vector<Case> cases = {{768, 1024, 768, 1024}, {3024, 4032, 768, 1024},
                                   {480, 640, 768, 1024},  {768, 2000, 768, 1024},
                                   {2000, 1024, 1024, 1024}, {517, 333, 1024, 659}};
  const std::vector<float> sam_mean = {123.675f, 116.28f, 103.53f};
  const std::vector<float> sam_std = {58.395f, 57.12f, 57.375f};
  uint64_t seed = 1;
  for (const Case& c : cases) {
    SCOPED_TRACE(std::to_string(c.h) + "x" + std::to_string(c.w) + " -> " +
                 std::to_string(c.out_h) + "x" + std::to_string(c.out_w));
    const at::Tensor rgb = RandomImage(c.h, c.w, ++seed);
    // mean 0, std 1, float32: the output is the uint8 intermediate itself -> must be identical.
    Poison(3 * 1024 * 1024 * 4);
    const at::Tensor raw = mk::ResizeNormalizePad(rgb, c.out_h, c.out_w, 1024, {0, 0, 0}, {1, 1, 1}, at::kFloat);
    const at::Tensor raw_ref =
        mk::ResizeNormalizePadReference(rgb, c.out_h, c.out_w, 1024, {0, 0, 0}, {1, 1, 1}, at::kFloat);
    EXPECT_TRUE(at::equal(raw, raw_ref)) << "uint8 intermediate differs at "
                                         << (raw != raw_ref).sum().item<int64_t>() << " values";
    // SAM's mean/std: the same two IEEE operations on both sides; float32 must match exactly,
    // 16-bit outputs are the same value rounded to nearest-even.
    for (at::ScalarType t : {at::kFloat, at::kBFloat16, at::kHalf}) {
      Poison(3 * 1024 * 1024 * 4);
      const at::Tensor out = mk::ResizeNormalizePad(rgb, c.out_h, c.out_w, 1024, sam_mean, sam_std, t);
      const at::Tensor ref =
          mk::ResizeNormalizePadReference(rgb, c.out_h, c.out_w, 1024, sam_mean, sam_std, t);
      ASSERT_EQ(out.scalar_type(), t);
      EXPECT_TRUE(out.isfinite().all().item<bool>());
      EXPECT_TRUE(at::equal(out, ref)) << c10::toString(t) << ": max abs diff "
                                       << (out.to(at::kFloat) - ref.to(at::kFloat)).abs().max().item<float>();
    }
  }
}

// ---------------------------------------------------------------------------------------------------
// MaskPostprocess

at::Tensor SmoothLogits(int64_t M, uint64_t seed, at::ScalarType dtype) {
  const at::Tensor coarse = at::randn({M, 1, 12, 12}, Gen(seed), at::kFloat) * 6.0;
  const at::Tensor fine = at::randn({M, 1, 256, 256}, Gen(seed + 1), at::kFloat) * 0.2;
  return (at::upsample_bicubic2d(coarse, {256, 256}, false) + fine)
      .select(1, 0)
      .contiguous()
      .to(dtype)
      .to(kCuda);
}

std::vector<uint8_t> DecodeRle(const int32_t* counts, int64_t n, int64_t h, int64_t w) {
  std::vector<uint8_t> row_major(static_cast<size_t>(h * w), 2);
  int64_t i = 0;
  uint8_t v = 0;
  for (int64_t r = 0; r < n; ++r, v ^= 1) {
    for (int32_t j = 0; j < counts[r] && i < h * w; ++j, ++i) row_major[(i % h) * w + i / h] = v;
  }
  EXPECT_EQ(i, h * w);
  return row_major;
}

// Pixels whose logit is within float rounding of 0 may differ from the reference (|logit| ~ 1e-6):
// allowed per mask. Smooth logits of magnitude ~5 put well under one such pixel in a mask, so in
// practice the count is 0 and the RLE must then be identical.
constexpr int64_t kMaxDifferingPixelsPerMask = 4;

// GPU output against the reference, mask by mask: pixels may differ only within
// kMaxDifferingPixelsPerMask; with no differing pixel, bbox and RLE must be identical; the GPU RLE
// must always decode to the GPU bitmask and the area must count it.
void ExpectMasksMatch(const mk::MaskPostprocessOutput& out, const mk::MaskPostprocessOutput& ref,
                      const std::vector<std::array<int, 4>>& geo) {
  ASSERT_TRUE(out.rle_counts.device().is_cpu());
  ASSERT_TRUE(out.bitmask.device().is_cpu());
  ASSERT_TRUE(at::equal(out.bitmask_offsets, ref.bitmask_offsets));
  for (size_t m = 0; m < geo.size(); ++m) {
    SCOPED_TRACE("mask " + std::to_string(m));
    const int64_t oh = geo[m][2], ow = geo[m][3];
    const int64_t b0 = ref.bitmask_offsets[m].item<int64_t>();
    const at::Tensor bm = out.bitmask.slice(0, b0, b0 + oh * ow);
    const at::Tensor bm_ref = ref.bitmask.slice(0, b0, b0 + oh * ow);
    ASSERT_LE(bm.max().item<uint8_t>(), 1);  // also catches unwritten bytes
    const int64_t differing = (bm != bm_ref).sum().item<int64_t>();
    EXPECT_LE(differing, kMaxDifferingPixelsPerMask);
    EXPECT_LE(std::abs(out.area[m].item<int64_t>() - ref.area[m].item<int64_t>()), differing);
    EXPECT_EQ(out.area[m].item<int64_t>(), bm.sum().item<int64_t>());  // self-consistent
    // The box is the bitmask's own tight box (x, y, width, height; zeros when empty), whether or not
    // the mask matches the reference: no box value is left unchecked (or poisoned).
    const at::Tensor grid = bm.view({oh, ow}) != 0;
    const at::Tensor rows = grid.any(1).nonzero(), cols = grid.any(0).nonzero();
    std::array<int64_t, 4> box{0, 0, 0, 0};
    if (rows.numel() > 0) {
      const int64_t x0 = cols.min().item<int64_t>(), y0 = rows.min().item<int64_t>();
      box = {x0, y0, cols.max().item<int64_t>() - x0 + 1, rows.max().item<int64_t>() - y0 + 1};
    }
    for (int k = 0; k < 4; ++k) EXPECT_EQ(out.bbox[m][k].item<int64_t>(), box[k]) << "bbox[" << k << "]";
    // Stability counts pixels past +-1; a pixel within rounding of +-1 moves it by 1 / count.
    EXPECT_NEAR(out.stability[m].item<float>(), ref.stability[m].item<float>(), 1e-4);
    const int64_t r0 = out.rle_offsets[m].item<int64_t>(), r1 = out.rle_offsets[m + 1].item<int64_t>();
    const std::vector<uint8_t> decoded = DecodeRle(out.rle_counts.data_ptr<int32_t>() + r0, r1 - r0, oh, ow);
    EXPECT_TRUE(std::equal(decoded.begin(), decoded.end(), bm.data_ptr<uint8_t>()))
        << "GPU RLE does not decode to the GPU bitmask";
    // The device's COCO string is exactly the host encoder's string of the same counts.
    ASSERT_TRUE(out.rle_string.defined());
    ASSERT_TRUE(out.rle_string.device().is_cpu());
    const int64_t s0 = out.rle_string_offsets[m].item<int64_t>(), s1 = out.rle_string_offsets[m + 1].item<int64_t>();
    const std::vector<uint32_t> counts(out.rle_counts.data_ptr<int32_t>() + r0, out.rle_counts.data_ptr<int32_t>() + r1);
    EXPECT_EQ(std::string(reinterpret_cast<const char*>(out.rle_string.data_ptr<uint8_t>()) + s0,
                          reinterpret_cast<const char*>(out.rle_string.data_ptr<uint8_t>()) + s1),
              maskd::RleCountsToString(counts));
    if (differing == 0) {
      EXPECT_TRUE(at::equal(out.bbox[m], ref.bbox[m]));
      const int64_t q0 = ref.rle_offsets[m].item<int64_t>(), q1 = ref.rle_offsets[m + 1].item<int64_t>();
      ASSERT_EQ(r1 - r0, q1 - q0);
      EXPECT_TRUE(at::equal(out.rle_counts.slice(0, r0, r1), ref.rle_counts.slice(0, q0, q1)));
    }
  }
}

void RunPostprocess(at::ScalarType dtype, uint64_t seed) {
  SCOPED_TRACE(c10::toString(dtype));
  // (input_h, input_w, orig_h, orig_w): the workload (1024 x 768: identity second stage), portrait
  // downscaled (1500 x 1000 -> 1024 x 683), a large photo upscaled, a tiny image, a 1-pixel-wide one.
  const std::vector<std::array<int, 4>> geo = {{768, 1024, 768, 1024}, {1024, 683, 1500, 1000},
                                               {768, 1024, 3024, 4032}, {1024, 1024, 37, 29},
                                               {1024, 16, 640, 1},      {768, 1024, 768, 1024}};
  const int64_t M = static_cast<int64_t>(geo.size());
  at::Tensor logits = SmoothLogits(M, seed, dtype);
  logits[5].fill_(-3.0);  // empty mask
  std::vector<int32_t> flat;
  for (const auto& g : geo) flat.insert(flat.end(), g.begin(), g.end());
  const at::Tensor geometry = at::tensor(at::ArrayRef<int32_t>(flat), at::kInt).view({M, 4}).to(kCuda);

  Poison(int64_t{1} << 28);
  const mk::MaskPostprocessOutput out = mk::MaskPostprocess(logits, geometry, 1024, true, true, nullptr, /*want_rle_string=*/true);
  const mk::MaskPostprocessOutput ref = mk::MaskPostprocessReference(logits, geometry, 1024, true, true);
  ExpectMasksMatch(out, ref, geo);
}

// One case per logits dtype, each with a seed of its own.
struct PostprocessCase {
  at::ScalarType dtype;
  uint64_t seed;
};
class MaskPostprocessByDtype : public ::testing::TestWithParam<PostprocessCase> {};

TEST_P(MaskPostprocessByDtype, MatchesReference) {
  SKIP_WITHOUT_GPU();
  RunPostprocess(GetParam().dtype, GetParam().seed);
}
INSTANTIATE_TEST_SUITE_P(kernels_gpu, MaskPostprocessByDtype,
                         ::testing::Values(PostprocessCase{at::kFloat, 31}, PostprocessCase{at::kBFloat16, 41},
                                           PostprocessCase{at::kHalf, 51}),
                         [](const ::testing::TestParamInfo<PostprocessCase>& info) {
                           return std::string(c10::toString(info.param.dtype));
                         });

// The evaluation kernel's column layout (its caches of the separable stages' row values) on the
// geometries of RunPostprocess (identity, down- and upscaled second stages, a tiny and a 1-pixel-wide
// image) plus a wide one, with smooth and high-frequency logits, bf16 and fp32, against the reference.
// Run 63 also compared it with the ballot layout it replaced: 0 of 14980413 pixels differed in each
// of these four cases.
TEST(kernels_gpu, MaskPostprocessGeometriesAndHighFrequencyLogits) {
  SKIP_WITHOUT_GPU();
  const std::vector<std::array<int, 4>> geo = {{768, 1024, 768, 1024}, {1024, 683, 1500, 1000},
                                               {768, 1024, 3024, 4032}, {1024, 1024, 37, 29},
                                               {1024, 16, 640, 1},      {1024, 1024, 333, 1500}};
  std::vector<int32_t> flat;
  for (const auto& g : geo) flat.insert(flat.end(), g.begin(), g.end());
  const int64_t M = static_cast<int64_t>(geo.size());
  const at::Tensor geometry = at::tensor(at::ArrayRef<int32_t>(flat), at::kInt).view({M, 4}).to(kCuda);
  for (const at::ScalarType dtype : {at::kBFloat16, at::kFloat}) {
    for (const bool rough : {false, true}) {
      SCOPED_TRACE(std::string(c10::toString(dtype)) + (rough ? ", high-frequency logits" : ", smooth logits"));
      const at::Tensor logits = rough ? (Randn({M, 256, 256}, 71) * 3.0).to(dtype).to(kCuda) : SmoothLogits(M, 73, dtype);
      Poison(int64_t{1} << 28);
      const mk::MaskPostprocessOutput out =
          mk::MaskPostprocess(logits, geometry, 1024, true, true, nullptr, /*want_rle_string=*/true);
      const mk::MaskPostprocessOutput ref = mk::MaskPostprocessReference(logits, geometry, 1024, true, true);
      ExpectMasksMatch(out, ref, geo);
    }
  }
}

TEST(kernels_gpu, MaskPostprocessManyRunsAndStatsOnly) {
  SKIP_WITHOUT_GPU();
  // High-frequency logits: thousands of runs per mask, boundaries across words and column groups.
  const std::vector<std::array<int, 4>> geo = {{256, 256, 300, 257}, {256, 200, 100, 33},
                                               {200, 256, 1000, 1280}};
  const at::Tensor logits = Randn({3, 256, 256}, 61);
  const at::Tensor geometry =  // on the CPU: also accepted
      at::tensor({256, 256, 300, 257, 256, 200, 100, 33, 200, 256, 1000, 1280}, at::kInt).view({3, 4});
  Poison(int64_t{1} << 26);
  const mk::MaskPostprocessOutput out = mk::MaskPostprocess(logits, geometry, 256, true, true, nullptr, /*want_rle_string=*/true);
  const mk::MaskPostprocessOutput ref = mk::MaskPostprocessReference(logits, geometry, 256, true, true);
  ExpectMasksMatch(out, ref, geo);
  EXPECT_GT(out.rle_counts.numel(), 10000);
  // Only the string to the host: the same string and offsets, no counts.
  const mk::MaskPostprocessOutput strings_only =
      mk::MaskPostprocess(logits, geometry, 256, true, false, nullptr, /*want_rle_string=*/true,
                          /*want_rle_counts=*/false);
  EXPECT_FALSE(strings_only.rle_counts.defined());
  ASSERT_TRUE(strings_only.rle_string.defined());
  EXPECT_TRUE(at::equal(strings_only.rle_string, out.rle_string));
  EXPECT_TRUE(at::equal(strings_only.rle_string_offsets, out.rle_string_offsets));
  EXPECT_TRUE(at::equal(strings_only.area, out.area));
  const mk::MaskPostprocessOutput stats = mk::MaskPostprocess(logits, geometry, 256, false, false);
  EXPECT_FALSE(stats.rle_counts.defined());
  EXPECT_FALSE(stats.bitmask.defined());
  EXPECT_TRUE(at::equal(stats.area, out.area));
  EXPECT_TRUE(at::equal(stats.stability, out.stability));
}

// The string-only call sizes its scratch from the pixels when they are few (no wait for the device's
// run count) and from the counted runs otherwise; both, with the strings written straight into
// pinned host memory, must give the bytes the host encoder gives for the counts.
TEST(kernels_gpu, MaskPostprocessStringsOnlyBoundedAndCounted) {
  SKIP_WITHOUT_GPU();
  const at::Tensor logits = Randn({2, 256, 256}, 67);
  for (const std::vector<int32_t>& flat : {std::vector<int32_t>{256, 256, 300, 257, 200, 256, 768, 1024},
                                           std::vector<int32_t>{256, 256, 300, 257, 200, 256, 2000, 2560}}) {
    const int64_t pixels = int64_t{flat[2]} * flat[3] + int64_t{flat[6]} * flat[7];
    SCOPED_TRACE(std::to_string(pixels) + " pixels");
    const at::Tensor geometry = at::tensor(at::ArrayRef<int32_t>(flat), at::kInt).view({2, 4});
    Poison(int64_t{1} << 26);
    const mk::MaskPostprocessOutput with_counts =
        mk::MaskPostprocess(logits, geometry, 256, true, false, nullptr, /*want_rle_string=*/true);
    const mk::MaskPostprocessOutput strings_only =
        mk::MaskPostprocess(logits, geometry, 256, true, false, nullptr, /*want_rle_string=*/true,
                            /*want_rle_counts=*/false);
    ASSERT_TRUE(with_counts.rle_counts.defined());
    ASSERT_FALSE(strings_only.rle_counts.defined());
    EXPECT_TRUE(at::equal(strings_only.rle_offsets, with_counts.rle_offsets));
    EXPECT_TRUE(at::equal(strings_only.rle_string_offsets, with_counts.rle_string_offsets));
    EXPECT_TRUE(at::equal(strings_only.rle_string, with_counts.rle_string));
    EXPECT_EQ(strings_only.rle_string.numel(), strings_only.rle_string_offsets[2].item<int64_t>());
    for (int m = 0; m < 2; ++m) {
      const int64_t r0 = with_counts.rle_offsets[m].item<int64_t>(), r1 = with_counts.rle_offsets[m + 1].item<int64_t>();
      const int64_t s0 = strings_only.rle_string_offsets[m].item<int64_t>();
      const int64_t s1 = strings_only.rle_string_offsets[m + 1].item<int64_t>();
      const std::vector<uint32_t> counts(with_counts.rle_counts.data_ptr<int32_t>() + r0,
                                         with_counts.rle_counts.data_ptr<int32_t>() + r1);
      EXPECT_GT(counts.size(), 1000u) << "mask " << m;
      EXPECT_EQ(std::string(reinterpret_cast<const char*>(strings_only.rle_string.data_ptr<uint8_t>()) + s0,
                            reinterpret_cast<const char*>(strings_only.rle_string.data_ptr<uint8_t>()) + s1),
                maskd::RleCountsToString(counts))
          << "mask " << m;
    }
  }
}

// ---------------------------------------------------------------------------------------------------
// fp8 e4m3 row-wise GEMM (at::_scaled_mm) against the dequantised fp32 reference on the same
// quantised operands (fp32 accumulation on both sides; the kernel rounds once to bf16), on the
// encoder's shapes; and against the bf16 linear it replaces (the quantisation error, ~3 %).
TEST(kernels_gpu, Fp8LinearMatchesReference) {
  SKIP_WITHOUT_GPU();
  struct Case {
    int64_t m, k, n;
  };
  uint64_t seed = 190;
  for (const Case& c : {Case{4096, 768, 2304}, Case{4096, 3072, 768}, Case{4096, 1280, 5120},
                        Case{4096, 5120, 1280}, Case{48, 64, 32}}) {
    SCOPED_TRACE(std::to_string(c.m) + "x" + std::to_string(c.k) + "x" + std::to_string(c.n));
    const at::Tensor x = Randn({c.m, c.k}, ++seed).to(at::kBFloat16);
    const at::Tensor w = Randn({c.n, c.k}, ++seed, 0.05).to(at::kBFloat16);
    const at::Tensor bias = Randn({c.n}, ++seed).to(at::kBFloat16);
    const mk::Fp8Rows xq = mk::QuantizeRowsFp8(x);
    const mk::Fp8Weight wq = mk::QuantizeWeightFp8(w);
    Poison(c.m * c.n * 4);
    const at::Tensor y = mk::Fp8Linear(xq, wq, bias, at::kBFloat16);
    ASSERT_EQ(y.scalar_type(), at::kBFloat16);
    const at::Tensor r = mk::Fp8LinearReference(xq, wq, bias, at::kFloat);
    const at::Tensor yf = y.to(at::kFloat);
    EXPECT_TRUE(yf.isfinite().all().item<bool>());
    EXPECT_LT((yf - r).norm().item<double>() / r.norm().item<double>(), 5e-3);
    const at::Tensor lin = at::linear(x.to(at::kFloat), w.to(at::kFloat), bias.to(at::kFloat));
    EXPECT_LT((yf - lin).norm().item<double>() / lin.norm().item<double>(), 5e-2);
    const at::Tensor no_bias = mk::Fp8Linear(xq, wq, at::Tensor(), at::kBFloat16).to(at::kFloat);
    const at::Tensor r0 = mk::Fp8LinearReference(xq, wq, at::Tensor(), at::kFloat);
    EXPECT_LT((no_bias - r0).norm().item<double>() / r0.norm().item<double>(), 5e-3);
  }
  // fp16 out is refused with the reason (the row-wise kernel writes bf16).
  const at::Tensor x = Randn({32, 64}, 1).to(at::kHalf);
  EXPECT_THROW(mk::Fp8Linear(mk::QuantizeRowsFp8(x), mk::QuantizeWeightFp8(Randn({32, 64}, 2)), at::Tensor(), at::kHalf),
               c10::Error);
}

// cuBLASLt with the timed algorithm against LibTorch's addmm / _addmm_activation (the heuristic's
// first algorithm): the encoder's shapes and an odd one, bf16 and fp16, with and without GELU, into a
// new tensor and into rows of a wider one. Each shape is tuned once (GemmTunings grows by one entry
// per new shape and row pitch, not on repeats) and a repeat gives the same bits. Accumulating into
// the output adds once per call. Inside a CUDA graph capture a
// new shape runs untimed and the replay matches.
TEST(kernels_gpu, TunedLinearMatchesLibTorch) {
  SKIP_WITHOUT_GPU();
  struct Case {
    int64_t m, k, n;
  };
  uint64_t seed = 300;
  const size_t tuned_before = mk::GemmTunings().size();
  size_t shapes = 0;
  for (const at::ScalarType dt : {at::kBFloat16, at::kHalf}) {
    for (const Case& c : {Case{4096, 768, 2304}, Case{4096, 3072, 768}, Case{8192, 1280, 5120}, Case{200, 40, 24}}) {
      for (const bool gelu : {false, true}) {
        SCOPED_TRACE(std::string(c10::toString(dt)) + " " + std::to_string(c.m) + "x" + std::to_string(c.k) + "x" +
                     std::to_string(c.n) + (gelu ? " gelu" : ""));
        const at::Tensor x = Randn({c.m, c.k}, ++seed).to(dt);
        const at::Tensor w = Randn({c.n, c.k}, ++seed, 1.0 / std::sqrt(double(c.k))).to(dt);
        const at::Tensor bias = Randn({c.n}, ++seed).to(dt);
        Poison(c.m * c.n * 4);
        const at::Tensor y = mk::TunedLinear(x, w, bias, gelu);
        ++shapes;
        const at::Tensor r = mk::TunedLinearReference(x, w, bias, gelu);
        ASSERT_EQ(y.sizes(), r.sizes());
        ASSERT_EQ(y.scalar_type(), dt);
        const Errors e = Compare(y, r);
        EXPECT_TRUE(e.finite);
        EXPECT_LT(e.rel_l2, 2e-3);
        // Exact product in fp32 (GELU's tanh form), as a check on both.
        at::Tensor exact = at::linear(x.to(at::kFloat), w.to(at::kFloat), bias.to(at::kFloat));
        if (gelu) exact = at::gelu(exact, "tanh");
        EXPECT_LT(Compare(y, exact).rel_l2, 1e-2);
        // The cached choice: the same bits again.
        EXPECT_TRUE(at::equal(mk::TunedLinear(x, w, bias, gelu), y));
        // Into rows of a wider output (another row pitch: tuned as a shape of its own); the columns
        // past it untouched.
        at::Tensor wide = at::full({c.m, c.n + 8}, 7.0, x.options());
        mk::TunedLinear(x, w, bias, gelu, wide.narrow(1, 0, c.n));
        ++shapes;
        EXPECT_LT(Compare(wide.narrow(1, 0, c.n), r).rel_l2, 2e-3);
        EXPECT_TRUE(at::equal(wide.narrow(1, c.n, 8), at::full({c.m, 8}, 7.0, x.options())));
      }
    }
  }
  // Accumulating into the output (the encoder's residual adds): out += x w^T + bias, the tuning's
  // trial launches not counted in the answer; the cached choice adds again.
  for (const Case& c : {Case{4096, 3072, 768}, Case{200, 40, 24}}) {
    SCOPED_TRACE("accumulate " + std::to_string(c.m) + "x" + std::to_string(c.k) + "x" + std::to_string(c.n));
    const at::Tensor x = Randn({c.m, c.k}, ++seed).to(at::kBFloat16);
    const at::Tensor w = Randn({c.n, c.k}, ++seed, 1.0 / std::sqrt(double(c.k))).to(at::kBFloat16);
    const at::Tensor bias = Randn({c.n}, ++seed).to(at::kBFloat16);
    const at::Tensor start = Randn({c.m, c.n}, ++seed, 4.0).to(at::kBFloat16);
    at::Tensor y = start.clone();
    EXPECT_EQ(mk::TunedLinear(x, w, bias, false, y, /*accumulate=*/true).data_ptr(), y.data_ptr());
    ++shapes;
    at::Tensor r = start.clone();
    mk::TunedLinearReference(x, w, bias, false, r, true);
    EXPECT_LT(Compare(y, r).rel_l2, 2e-3);
    const at::Tensor exact = start.to(at::kFloat) + at::linear(x.to(at::kFloat), w.to(at::kFloat), bias.to(at::kFloat));
    EXPECT_LT(Compare(y, exact).rel_l2, 5e-3);
    mk::TunedLinear(x, w, bias, false, y, true);
    EXPECT_LT(Compare(y, exact + at::linear(x.to(at::kFloat), w.to(at::kFloat), bias.to(at::kFloat))).rel_l2, 5e-3);
  }
  EXPECT_THROW(mk::TunedLinear(Randn({8, 16}, 1).to(at::kBFloat16), Randn({8, 16}, 2).to(at::kBFloat16),
                               Randn({8}, 3).to(at::kBFloat16), false, at::Tensor(), true),
               c10::Error);
  const std::vector<mk::GemmTuning> tuned = mk::GemmTunings();
  ASSERT_EQ(tuned.size(), tuned_before + shapes);
  for (size_t i = tuned_before; i < tuned.size(); ++i) {
    EXPECT_GT(tuned[i].candidates, 0);
    EXPECT_LT(tuned[i].chosen, tuned[i].candidates);
    EXPECT_GT(tuned[i].chosen_ms, 0.0f);
    EXPECT_LE(tuned[i].chosen_ms, tuned[i].first_ms > 0 ? tuned[i].first_ms : tuned[i].chosen_ms);
    EXPECT_GE(tuned[i].tuning_ms, tuned[i].chosen_ms * 3);  // at least the kept one's timed launches
  }
  // A shape first seen inside a capture: launched with the heuristic's first, not timed, not cached.
  const at::Tensor x = Randn({96, 64}, 400).to(at::kBFloat16), w = Randn({48, 64}, 401, 0.1).to(at::kBFloat16);
  const at::Tensor bias = Randn({48}, 402).to(at::kBFloat16);
  at::cuda::CUDAStream side = at::cuda::getStreamFromPool();
  {
    at::cuda::CUDAStreamGuard guard(side);
    at::cuda::CUDAGraph graph;
    at::Tensor y;
    graph.capture_begin();
    y = mk::TunedLinear(x, w, bias, true);
    graph.capture_end();
    EXPECT_EQ(mk::GemmTunings().size(), tuned.size());
    graph.replay();
    side.synchronize();
    EXPECT_LT(Compare(y, mk::TunedLinearReference(x, w, bias, true)).rel_l2, 2e-3);
  }
  mk::TunedLinear(x, w, bias, true);
  EXPECT_EQ(mk::GemmTunings().size(), tuned.size() + 1);  // timed at its first call outside
  // Operands cuBLASLt does not take here go to LibTorch: fp32 (bit-identical to the reference).
  const at::Tensor xf = Randn({64, 32}, 403), wf = Randn({16, 32}, 404), bf = Randn({16}, 405);
  EXPECT_TRUE(at::equal(mk::TunedLinear(xf, wf, bf, false), mk::TunedLinearReference(xf, wf, bf, false)));
}

// The one-pass fp8 quantisation kernel against the LibTorch reference: bit-identical without GELU
// (the same IEEE-rounded operations: scale = amax * fl(1/448), q = e4m3_rne(clamp(x * fl(1/s)))), for
// each input dtype, vectorised and scalar rows (K % 8 != 0), a strided input and an all-zero row.
// With the GELU folded in, erf's last bit may differ from ATen's, so scales agree to 1e-6 and each
// value is within one e4m3 step (2^-3 relative) and almost all are identical.
TEST(kernels_gpu, Fp8QuantisationKernelMatchesReference) {
  SKIP_WITHOUT_GPU();
  uint64_t seed = 230;
  for (const at::ScalarType dt : {at::kBFloat16, at::kHalf, at::kFloat}) {
    for (const auto& [m, k] : std::vector<std::pair<int64_t, int64_t>>{{4099, 768}, {37, 5120}, {19, 20}, {3, 1}}) {
      SCOPED_TRACE(std::string(c10::toString(dt)) + " " + std::to_string(m) + "x" + std::to_string(k));
      at::Tensor x = Randn({m, k + 8}, ++seed, 3.0).to(dt);
      x[1 % m].zero_();
      for (const at::Tensor& in : {x.narrow(1, 0, k).contiguous(), x.narrow(1, 8, k)}) {  // the second strided
        Poison(m * k * 4);
        const mk::Fp8Rows q = mk::QuantizeRowsFp8(in);
        const mk::Fp8Rows r = mk::QuantizeRowsFp8Reference(in);
        ASSERT_EQ(q.values.scalar_type(), at::kFloat8_e4m3fn);
        ASSERT_EQ(q.scales.sizes(), r.scales.sizes());
        EXPECT_TRUE(at::equal(q.scales, r.scales));
        EXPECT_TRUE(at::equal(q.values.view(at::kByte), r.values.view(at::kByte)));
        EXPECT_TRUE(q.values.to(at::kFloat).isfinite().all().item<bool>());

        Poison(m * k * 4);
        const mk::Fp8Rows qg = mk::QuantizeRowsFp8(in, /*gelu=*/true);
        const mk::Fp8Rows rg = mk::QuantizeRowsFp8Reference(in, /*gelu=*/true);
        EXPECT_LT(((qg.scales - rg.scales).abs() / rg.scales).max().item<double>(), 1e-6);
        const at::Tensor a = qg.values.to(at::kFloat) * qg.scales, b = rg.values.to(at::kFloat) * rg.scales;
        EXPECT_TRUE(a.isfinite().all().item<bool>());
        EXPECT_TRUE(((a - b).abs() <= 0.125 * at::maximum(a.abs(), b.abs()) + 1e-30).all().item<bool>());
        const double differ = at::ne(qg.values.view(at::kByte), rg.values.view(at::kByte)).to(at::kDouble).mean().item<double>();
        EXPECT_LE(differ, 1e-3);
        // and it is the GELU that was quantised: dequantised values follow gelu(x) to e4m3's precision
        const at::Tensor g = at::gelu(in.to(at::kFloat));
        EXPECT_LT((a - g).norm().item<double>() / std::max(1e-30, g.norm().item<double>()), 0.05);
      }
    }
  }
}

}  // namespace
