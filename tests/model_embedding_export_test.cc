// Engine::ExportEmbedding (the embedding returned to clients as fp32/bf16/fp16 bytes) and the
// torch-free scalar roundings of model/api/half.h that define it: the scalar functions against
// c10's own BFloat16/Half conversions over many bit patterns, the export of crafted tensors (ties,
// fp16 subnormals and overflow, NaN, host tier) on CPU and CUDA (skips without a device), and the
// export of a real encoder output against the handle's own values.
#include <gtest/gtest.h>

#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>
#include <torch/cuda.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <random>

#include "model/api/engine.h"
#include "model/api/half.h"
#include "model/engine_handles.h"

namespace maskd {
namespace {

uint32_t Bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}
float FromBits(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

// Random bit patterns over every exponent plus the special values.
std::vector<float> Patterns(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<float> v = {0.0f, -0.0f, 1.0f, -1.0f, 65504.0f, 65519.996f, 65520.0f, 1e-8f, 2.9802322e-8f,
                          5.9604645e-8f, 6.1035156e-5f, std::numeric_limits<float>::infinity(),
                          -std::numeric_limits<float>::infinity(), std::numeric_limits<float>::max(),
                          std::numeric_limits<float>::denorm_min(), FromBits(0x3f808000u),
                          FromBits(0x3f818000u), FromBits(0x3f801000u), FromBits(0x3f803000u)};
  while (v.size() < n) {
    uint32_t u = rng();
    if ((u & 0x7f800000u) == 0x7f800000u) continue;  // NaN/inf: compared separately
    if (v.size() % 5 == 0) u &= 0xffff8000u | (u & 0x8000u);  // more ties and near-ties
    v.push_back(FromBits(u));
  }
  return v;
}

#ifndef MASKD_EMBEDDING_EXPORT_GPU  // the CPU suite (model_embedding_export_test)

TEST(EmbeddingExport, ScalarRoundingMatchesC10) {
  for (float f : Patterns(2'000'000, 1)) {
    ASSERT_EQ(FloatToBf16(f), c10::BFloat16(f).x) << std::hexfloat << f;
    ASSERT_EQ(FloatToHalf(f), c10::Half(f).x) << std::hexfloat << f;
    ASSERT_EQ(Bits(Bf16ToFloat(FloatToBf16(f))), Bits(static_cast<float>(c10::BFloat16(f))));
    ASSERT_EQ(Bits(HalfToFloat(FloatToHalf(f))), Bits(static_cast<float>(c10::Half(f)))) << std::hexfloat << f;
  }
  // Every half decodes like c10 (NaNs: as NaN).
  for (uint32_t h = 0; h < 0x10000u; ++h) {
    c10::Half c(static_cast<uint16_t>(h), c10::Half::from_bits());
    const float ours = HalfToFloat(static_cast<uint16_t>(h)), theirs = static_cast<float>(c);
    if (std::isnan(theirs)) {
      EXPECT_TRUE(std::isnan(ours)) << h;
    } else {
      ASSERT_EQ(Bits(ours), Bits(theirs)) << h;
    }
  }
  const float nan = std::numeric_limits<float>::quiet_NaN();
  EXPECT_TRUE(std::isnan(Bf16ToFloat(FloatToBf16(nan))));
  EXPECT_TRUE(std::isnan(HalfToFloat(FloatToHalf(nan))));
  EXPECT_TRUE(std::isnan(Bf16ToFloat(FloatToBf16(FromBits(0x7f800001u)))));  // a NaN that rounds up
  EXPECT_EQ(FloatToHalf(65520.0f), 0x7c00);  // the tie above 65504 goes to inf (even)
  EXPECT_EQ(FloatToHalf(65519.996f), 0x7bff);
  EXPECT_EQ(FloatToBf16(FromBits(0x3f808000u)), 0x3f80);  // tie, kept bit even: down
  EXPECT_EQ(FloatToBf16(FromBits(0x3f818000u)), 0x3f82);  // tie, kept bit odd: up
}

#endif

std::unique_ptr<Engine> DemoEngine(const std::string& device) {
  EngineOptions o;
  o.device = device;
  o.warmup = false;
  auto e = Engine::Create(o);
  EXPECT_TRUE(e.ok()) << e.status().ToString();
  return e.ok() ? std::move(*e) : nullptr;
}

template <typename T>
std::vector<T> As(const std::string& data) {
  std::vector<T> v(data.size() / sizeof(T));
  std::memcpy(v.data(), data.data(), v.size() * sizeof(T));
  return v;
}

void CheckCraftedExport(Engine& engine, const at::Device& device, bool host_tier) {
  const std::vector<float> values = Patterns(256 * 64 * 64, 7);
  at::Tensor t = at::from_blob(const_cast<float*>(values.data()), {256, 64, 64}, at::kFloat).clone();
  auto emb = WrapEmbedding(ImageGeometry{640, 480, 1024, 768}, t.to(device), host_tier);

  auto f32 = engine.ExportEmbedding(*emb, Precision::kFloat32);
  ASSERT_TRUE(f32.ok()) << f32.status().ToString();
  EXPECT_EQ(f32->shape, (std::vector<int64_t>{1, 256, 64, 64}));
  EXPECT_EQ(f32->dtype, Precision::kFloat32);
  ASSERT_EQ(f32->data.size(), values.size() * 4);
  EXPECT_EQ(std::memcmp(f32->data.data(), values.data(), f32->data.size()), 0);

  for (Precision p : {Precision::kBFloat16, Precision::kFloat16}) {
    auto x = engine.ExportEmbedding(*emb, p);
    ASSERT_TRUE(x.ok()) << x.status().ToString();
    EXPECT_EQ(x->shape, (std::vector<int64_t>{1, 256, 64, 64}));
    const std::vector<uint16_t> got = As<uint16_t>(x->data);
    ASSERT_EQ(got.size(), values.size());
    size_t wrong = 0;
    for (size_t i = 0; i < values.size(); ++i) {
      const uint16_t want = p == Precision::kBFloat16 ? FloatToBf16(values[i]) : FloatToHalf(values[i]);
      wrong += got[i] != want;
    }
    EXPECT_EQ(wrong, 0u) << PrecisionName(p) << " on " << device.str();
  }

  // An embedding kept in bf16 (a bf16 engine): fp16 is the rounding of its fp32 value, fp32 exact.
  auto b16 = WrapEmbedding(ImageGeometry{640, 480, 1024, 768}, t.to(device, at::kBFloat16));
  auto h = engine.ExportEmbedding(*b16, Precision::kFloat16);
  auto f = engine.ExportEmbedding(*b16, Precision::kFloat32);
  ASSERT_TRUE(h.ok() && f.ok());
  const std::vector<uint16_t> hv = As<uint16_t>(h->data);
  const std::vector<float> fv = As<float>(f->data);
  for (size_t i = 0; i < values.size(); ++i) {
    ASSERT_EQ(Bits(fv[i]), Bits(Bf16ToFloat(FloatToBf16(values[i])))) << i;
    ASSERT_EQ(hv[i], FloatToHalf(fv[i])) << i;
  }
}

#ifndef MASKD_EMBEDDING_EXPORT_GPU

TEST(EmbeddingExport, CraftedTensorOnCpuAndHostTier) {
  auto engine = DemoEngine("cpu");
  ASSERT_NE(engine, nullptr);
  CheckCraftedExport(*engine, at::kCPU, false);
  CheckCraftedExport(*engine, at::kCPU, true);
}

#else  // the gpu suite (model_embedding_export_gpu_test)

TEST(EmbeddingExportGpu, CraftedTensorOnCuda) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  auto engine = DemoEngine("cuda:0");
  ASSERT_NE(engine, nullptr);
  CheckCraftedExport(*engine, at::Device(at::kCUDA, 0), false);
  CheckCraftedExport(*engine, at::kCPU, true);  // a host-tier embedding of a CUDA engine
}

#endif
#ifndef MASKD_EMBEDDING_EXPORT_GPU

TEST(EmbeddingExport, RealEncoderOutputEqualsItsValues) {
  auto engine = DemoEngine("cpu");
  ASSERT_NE(engine, nullptr);
  ImageRGB8 img{96, 64, std::vector<uint8_t>(96 * 64 * 3)};
  for (size_t i = 0; i < img.pixels.size(); ++i) img.pixels[i] = static_cast<uint8_t>(i * 37 % 251);
  auto prepared = engine->Prepare(img);
  ASSERT_TRUE(prepared.ok()) << prepared.status().ToString();
  auto emb = engine->Encode({*prepared});
  ASSERT_TRUE(emb.ok()) << emb.status().ToString();
  const std::vector<float> want = (*emb)[0]->ToFloat();
  auto x = engine->ExportEmbedding(*(*emb)[0], Precision::kFloat32);
  ASSERT_TRUE(x.ok()) << x.status().ToString();
  EXPECT_EQ(x->shape, (std::vector<int64_t>{1, 256, 64, 64}));
  ASSERT_EQ(x->data.size(), want.size() * 4);
  EXPECT_EQ(std::memcmp(x->data.data(), want.data(), x->data.size()), 0);
  auto b = engine->ExportEmbedding(*(*emb)[0], Precision::kBFloat16);
  ASSERT_TRUE(b.ok());
  const std::vector<uint16_t> bv = As<uint16_t>(b->data);
  for (size_t i = 0; i < want.size(); ++i) ASSERT_EQ(bv[i], FloatToBf16(want[i])) << i;
}

#endif

}  // namespace
}  // namespace maskd
