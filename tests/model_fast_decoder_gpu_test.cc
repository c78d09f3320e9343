// The shared-image decoder on CUDA in bf16 (SDPA, matmul upscaling, as the fast path runs it) against
// the original decoder in bf16, both measured against the original in fp32 on the same weights: the
// reassociation must add no more error than bf16 itself has. Then the engine with the full fast path
// (graphs on) against the engine with the shared-image decoder off, for one image and for several.
#include <gtest/gtest.h>
#include <torch/cuda.h>
#include <torch/torch.h>

#include <algorithm>
#include <cmath>

#include "kernels/kernels.h"
#include "model/api/engine.h"
#include "model/fast_decoder.h"
#include "model/mask_decoder.h"
#include "model/sam.h"
#include "model/sam_config.h"

namespace maskd {
namespace {

double RelL2(const at::Tensor& a, const at::Tensor& b) {
  const at::Tensor x = a.to(at::kDouble), y = b.to(at::kDouble);
  return (x - y).norm().item<double>() / y.norm().item<double>();
}

TEST(SharedImageDecoderCuda, Bf16ErrorIsTheOriginalsBf16Error) {
  if (!torch::cuda::is_available() || !kernels::BuiltWithCuda()) GTEST_SKIP() << "no CUDA device";
  torch::NoGradGuard no_grad;
  const at::Device cuda(at::kCUDA, 0);
  SamConfig c = *SamPreset("vit_b");
  MaskDecoder dec(c);
  RandomizeWeights(*dec, 41);
  torch::manual_seed(41);
  const at::Tensor pos = torch::randn({1, 256, 64, 64}).to(cuda);
  const at::Tensor groups = torch::randn({3, 256, 64, 64}).to(cuda);
  const at::Tensor group_of = torch::tensor({0, 0, 0, 0, 0, 1, 1, 2, 0, 2, 1, 0}, torch::kLong).to(cuda);
  const at::Tensor sparse = torch::randn({12, 3, 256}).to(cuda);
  dec->to(cuda, at::kFloat);
  at::globalContext().setAllowTF32CuBLAS(false);
  const auto fp32 = dec->forward(groups.index_select(0, group_of), pos, sparse);
  dec->to(cuda, at::kBFloat16);
  dec->transformer->SetSdpa(true);
  dec->matmul_upscaling = true;
  const at::Tensor pos16 = pos.to(at::kBFloat16), groups16 = groups.to(at::kBFloat16), sparse16 = sparse.to(at::kBFloat16);
  const auto orig = dec->forward(groups16.index_select(0, group_of), pos16, sparse16);
  SharedImageDecoder shared(*dec, pos16);
  const auto got = shared.forward(groups16, group_of, sparse16);
  ASSERT_TRUE(got.masks.isfinite().all().item<bool>());
  const double e_orig = RelL2(orig.masks, fp32.masks), e_got = RelL2(got.masks, fp32.masks);
  const double i_orig = RelL2(orig.iou_predictions, fp32.iou_predictions),
               i_got = RelL2(got.iou_predictions, fp32.iou_predictions);
  std::printf("decoder rel L2 vs fp32: masks original bf16 %.3e shared bf16 %.3e; iou %.3e / %.3e; "
              "shared vs original bf16 %.3e\n", e_orig, e_got, i_orig, i_got, RelL2(got.masks, orig.masks));
  EXPECT_LE(e_got, 1.5 * e_orig + 1e-3);
  EXPECT_LE(i_got, 1.5 * i_orig + 1e-3);
  // One image for all prompts (the single-group path) agrees with the grouped path.
  const auto one = shared.forward(groups16.slice(0, 0, 1), at::Tensor(), sparse16);
  const auto one_ref = shared.forward(groups16, at::zeros({12}, group_of.options()), sparse16);
  EXPECT_LE(RelL2(one.masks, one_ref.masks), 1e-2);
}

TEST(SharedImageDecoderCuda, EngineWithGraphsMatchesTheOriginalDecoder) {
  if (!torch::cuda::is_available() || !kernels::BuiltWithCuda()) GTEST_SKIP() << "no CUDA device";
  EngineOptions o;
  o.random_arch = "vit_b";
  o.device = "cuda";
  o.precision = Precision::kBFloat16;
  o.fast = FastPathOptions::Fast();
  auto fast = Engine::Create(o);
  ASSERT_TRUE(fast.ok()) << fast.status().ToString();
  o.fast.shared_image_decoder = false;
  auto base = Engine::Create(o);
  ASSERT_TRUE(base.ok()) << base.status().ToString();
  ImageRGB8 a{640, 480, {}}, b{300, 500, {}};
  for (auto* im : {&a, &b}) {
    im->pixels.resize(static_cast<size_t>(im->width) * im->height * 3);
    for (size_t i = 0; i < im->pixels.size(); ++i) im->pixels[i] = static_cast<uint8_t>((i * 31 + im->width) % 253);
  }
  auto run = [&](Engine& e, int prompts, bool two_images) {
    auto pa = e.Prepare(a), pb = e.Prepare(b);
    auto embs = e.Encode({*pa, *pb});
    EXPECT_TRUE(embs.ok());
    std::vector<DecodeItem> items;
    for (int k = 0; k < prompts; ++k) {
      PromptSpec p;
      p.points = {{static_cast<float>((37 * k) % 300), static_cast<float>((53 * k) % 480), 1}};
      items.push_back({(*embs)[two_images ? k % 2 : 0], p});
    }
    return *e.Decode(items);
  };
  for (auto [prompts, two] : {std::pair{1, false}, std::pair{64, false}, std::pair{24, true}}) {
    const auto ref = run(**base, prompts, two), got = run(**fast, prompts, two);
    ASSERT_EQ(ref.size(), got.size());
    double worst = 0;
    for (size_t i = 0; i < ref.size(); ++i) {
      const auto lr = ref[i].logits->ToFloat(), lg = got[i].logits->ToFloat();
      ASSERT_EQ(lr.size(), lg.size());
      double num = 0, den = 0;
      for (size_t k = 0; k < lr.size(); ++k) {
        num += (lr[k] - lg[k]) * (lr[k] - lg[k]);
        den += lr[k] * lr[k];
      }
      worst = std::max(worst, std::sqrt(num / std::max(den, 1e-12)));
      for (size_t k = 0; k < ref[i].scores.size(); ++k) EXPECT_NEAR(got[i].scores[k], ref[i].scores[k], 5e-2) << i;
    }
    std::printf("engine bf16, %d prompts%s: worst per-prompt logits rel L2 shared vs original %.3e\n", prompts,
                two ? " over 2 images" : "", worst);
    // Two bf16 computations of the same function (each ~1e-2 from fp32 on random weights).
    EXPECT_LE(worst, 5e-2);
  }
}

}  // namespace
}  // namespace maskd
