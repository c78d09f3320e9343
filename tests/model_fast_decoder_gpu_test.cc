// The shared-image decoder on CUDA in bf16 (SDPA, matmul upscaling, as the fast path runs it) against
// the original decoder in bf16, both measured against the original in fp32 on the same weights: the
// reassociation must add no more error than bf16 itself has. Then the engine with the full fast path
// (graphs on) against the engine with the shared-image decoder off, for one image and for several.
#include <gtest/gtest.h>
#include <torch/cuda.h>
#include <torch/torch.h>

#include <algorithm>
#include <array>
#include <functional>
#include <memory>
#include <utility>
#include <cmath>

#include "kernels/kernels.h"
#include "model/engine_handles.h"
#include "model/api/engine.h"
#include "model/fast_decoder.h"
#include "model/mask_decoder.h"
#include "model/sam.h"
#include "model/sam_config.h"
#include "tests/scoped_env.h"

namespace maskd {
namespace {

// Two vit_b bf16 engines on CUDA with the fast path (same seeded random weights): the second with
// `change` applied to its options.
std::pair<std::unique_ptr<Engine>, std::unique_ptr<Engine>> FastAndChanged(
    const std::function<void(FastPathOptions&)>& change) {
  EngineOptions o;
  o.random_arch = "vit_b";
  o.device = "cuda";
  o.precision = Precision::kBFloat16;
  o.fast = FastPathOptions::Fast();
  auto fast = Engine::Create(o);
  EXPECT_TRUE(fast.ok()) << fast.status().ToString();
  change(o.fast);
  auto changed = Engine::Create(o);
  EXPECT_TRUE(changed.ok()) << changed.status().ToString();
  if (!fast.ok() || !changed.ok()) return {};
  return {std::move(*fast), std::move(*changed)};
}

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
  {
    // The token-side attentions on kernels::FewQueryAttention (as FastPathOptions::
    // decoder_attention_kernel runs them): no more error than with SDPA.
    dec->transformer->SetFewQueryKernel(true);
    const auto orig_fq = dec->forward(groups16.index_select(0, group_of), pos16, sparse16);
    const auto got_fq = shared.forward(groups16, group_of, sparse16);
    dec->transformer->SetFewQueryKernel(false);
    const double e_orig_fq = RelL2(orig_fq.masks, fp32.masks), e_got_fq = RelL2(got_fq.masks, fp32.masks);
    std::printf("with the few-query attention kernel: masks original %.3e shared %.3e; iou %.3e / %.3e\n",
                e_orig_fq, e_got_fq, RelL2(orig_fq.iou_predictions, fp32.iou_predictions),
                RelL2(got_fq.iou_predictions, fp32.iou_predictions));
    EXPECT_LE(e_orig_fq, 1.5 * e_orig + 1e-3);
    EXPECT_LE(e_got_fq, 1.5 * e_orig + 1e-3);
    EXPECT_LE(RelL2(got_fq.iou_predictions, fp32.iou_predictions), 1.5 * i_orig + 1e-3);
  }
  {
    // As shipped, the shared decoder takes the absorbed form for these 12 prompts (from 8 a pass:
    // block 1's and the final token->image attention on the prompts' keys themselves,
    // kernels::AbsorbedAttention). MASKD_DECODER_ABSORB=0 keeps the projected path (the k/v GEMM and
    // FewQueryAttentionBiased). Both within the bound; and they differ (the absorbed form does not
    // round k and v to bf16 before the products), so the default did take the absorbed form.
    const testing::ScopedEnv off("MASKD_DECODER_ABSORB", "0");
    SharedImageDecoder projected(*dec, pos16);
    const auto got_proj = projected.forward(groups16, group_of, sparse16);
    ASSERT_TRUE(got_proj.masks.isfinite().all().item<bool>());
    const double e_proj = RelL2(got_proj.masks, fp32.masks),
                 i_proj = RelL2(got_proj.iou_predictions, fp32.iou_predictions);
    std::printf("projected attentions: masks %.3e iou %.3e vs fp32 (as shipped, absorbed: %.3e / %.3e); "
                "absorbed vs projected %.3e\n", e_proj, i_proj, e_got, i_got, RelL2(got.masks, got_proj.masks));
    EXPECT_LE(e_proj, 1.5 * e_orig + 1e-3);
    EXPECT_LE(i_proj, 1.5 * i_orig + 1e-3);
    EXPECT_GT(RelL2(got.masks, got_proj.masks), 0.0);
  }
  // One image for all prompts (the single-group path) agrees with the grouped path.
  const auto one = shared.forward(groups16.slice(0, 0, 1), at::Tensor(), sparse16);
  const auto one_ref = shared.forward(groups16, at::zeros({12}, group_of.options()), sparse16);
  EXPECT_LE(RelL2(one.masks, one_ref.masks), 1e-2);
}

TEST(SharedImageDecoderCuda, EngineWithGraphsMatchesTheOriginalDecoder) {
  if (!torch::cuda::is_available() || !kernels::BuiltWithCuda()) GTEST_SKIP() << "no CUDA device";
  auto [fast, base] = FastAndChanged([](FastPathOptions& f) { f.shared_image_decoder = false; });
  ASSERT_TRUE(fast && base);
  ImageRGB8 a{640, 480, {}}, b{300, 500, {}};
  for (auto* im : {&a, &b}) {
    im->pixels.resize(static_cast<size_t>(im->width) * im->height * 3);
    for (size_t i = 0; i < im->pixels.size(); ++i) im->pixels[i] = static_cast<uint8_t>((i * 31 + im->width) % 253);
  }
  auto run = [&](Engine& e, int prompts, bool two_images) {
    auto pa = e.Prepare(a), pb = e.Prepare(b);
    auto embs = e.Encode({*pa, *pb});
    EXPECT_TRUE(embs.ok());
    // The decoder's image side reads the engine's embeddings in place (run 66: they are
    // position-major, and ImageSideKeys used to launch only for contiguous ones).
    for (const auto& emb : *embs) EXPECT_TRUE(kernels::ImageSideKeysReadsInPlace(PayloadOf(*emb).tensor));
    std::vector<DecodeItem> items;
    for (int k = 0; k < prompts; ++k) {
      PromptSpec p;
      p.points = {{static_cast<float>((37 * k) % 300), static_cast<float>((53 * k) % 480), 1}};
      items.push_back({(*embs)[two_images ? k % 2 : 0], p});
    }
    return *e.Decode(items);
  };
  for (auto [prompts, two] : {std::pair{1, false}, std::pair{64, false}, std::pair{24, true}}) {
    const auto ref = run(*base, prompts, two), got = run(*fast, prompts, two);
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

// Prompts of several images in one decoder pass replay a graph captured per (prompt bucket, token
// count, image bucket): the same masks as the eager shared-image decoder, and a replay after other
// images and group assignments went through the same graph gives the same answer (padded rows and
// stale static inputs must not leak into real prompts).
TEST(SharedImageDecoderCuda, GraphsOverSeveralImagesMatchEagerAndDoNotLeakBetweenCalls) {
  if (!torch::cuda::is_available() || !kernels::BuiltWithCuda()) GTEST_SKIP() << "no CUDA device";
  auto [graphs, eager] = FastAndChanged([](FastPathOptions& f) { f.cuda_graphs = false; });
  ASSERT_TRUE(graphs && eager);
  std::vector<ImageRGB8> images;
  for (int n = 0; n < 5; ++n) {
    ImageRGB8 im{320 + 40 * n, 240 + 30 * n, {}};
    im.pixels.resize(static_cast<size_t>(im.width) * im.height * 3);
    for (size_t i = 0; i < im.pixels.size(); ++i) im.pixels[i] = static_cast<uint8_t>((i * (7 + 2 * n) + 11 * n) % 251);
    images.push_back(std::move(im));
  }
  auto embed = [&](Engine& e) {
    std::vector<PreparedImage> prepared;
    for (const auto& im : images) prepared.push_back(*e.Prepare(im));
    return *e.Encode(prepared);
  };
  const auto embs_g = embed(*graphs), embs_e = embed(*eager);
  // items: (image, x, y) with one point each (token count 2), multimask.
  auto decode = [&](Engine& e, const std::vector<std::shared_ptr<const Embedding>>& embs,
                    const std::vector<std::array<int, 3>>& spec) {
    std::vector<DecodeItem> items;
    for (const auto& [img, x, y] : spec) {
      PromptSpec p;
      p.points = {{static_cast<float>(x), static_cast<float>(y), 1}};
      p.multimask = true;
      items.push_back({embs[static_cast<size_t>(img)], p});
    }
    auto out = e.Decode(items);
    EXPECT_TRUE(out.ok()) << out.status().ToString();
    return out.ok() ? *out : std::vector<DecodedPrompt>{};
  };
  auto rel_l2 = [](const DecodedPrompt& a, const DecodedPrompt& b) {
    const auto la = a.logits->ToFloat(), lb = b.logits->ToFloat();
    EXPECT_EQ(la.size(), lb.size());
    double num = 0, den = 0;
    for (size_t k = 0; k < la.size() && k < lb.size(); ++k) {
      num += (la[k] - lb[k]) * (la[k] - lb[k]);
      den += la[k] * la[k];
    }
    return std::sqrt(num / std::max(den, 1e-12));
  };
  // 10 prompts over 3 images (prompt bucket 16, image bucket 4), then 7 over 5 (bucket 8, images 8),
  // then the first call again after other groups went through the graphs.
  std::vector<std::array<int, 3>> first, second;
  for (int k = 0; k < 10; ++k) first.push_back({k % 3, 20 + 29 * k, 15 + 17 * k});
  for (int k = 0; k < 7; ++k) second.push_back({4 - k % 5, 200 - 13 * k, 100 + 9 * k});
  const auto g1 = decode(*graphs, embs_g, first), e1 = decode(*eager, embs_e, first);
  const auto g2 = decode(*graphs, embs_g, second), e2 = decode(*eager, embs_e, second);
  const auto g1_again = decode(*graphs, embs_g, first);
  ASSERT_EQ(g1.size(), first.size());
  ASSERT_EQ(g2.size(), second.size());
  ASSERT_EQ(g1_again.size(), first.size());
  double worst = 0;
  for (auto [g, e] : {std::pair{&g1, &e1}, std::pair{&g2, &e2}}) {
    for (size_t i = 0; i < g->size(); ++i) {
      worst = std::max(worst, rel_l2((*g)[i], (*e)[i]));
      ASSERT_EQ((*g)[i].scores.size(), 3u);
      for (size_t k = 0; k < 3; ++k) EXPECT_NEAR((*g)[i].scores[k], (*e)[i].scores[k], 2e-2) << i;
    }
  }
  std::printf("several images: worst per-prompt logits rel L2 graph vs eager %.3e\n", worst);
  // The same bf16 kernels on padded shapes (cuBLAS may pick other tiles): rounding-level only.
  EXPECT_LE(worst, 2e-2);
  for (size_t i = 0; i < first.size(); ++i) {
    EXPECT_EQ(g1[i].scores, g1_again[i].scores) << i;
    EXPECT_EQ(g1[i].logits->ToFloat(), g1_again[i].logits->ToFloat()) << i;
  }
}

// One prompt per image over up to 64 images in a pass (a served click load with a client per
// image): the shared-prompt graph of image bucket 64 (its static keys written by ImageSideKeys) and
// the eager decoder give the same masks to rounding, for 33 and 64 images.
TEST(SharedImageDecoderCuda, GraphsOverUpToSixtyFourImagesMatchEager) {
  if (!torch::cuda::is_available() || !kernels::BuiltWithCuda()) GTEST_SKIP() << "no CUDA device";
  auto [graphs, eager] = FastAndChanged([](FastPathOptions& f) { f.cuda_graphs = false; });
  ASSERT_TRUE(graphs && eager);
  auto embed = [&](Engine& e) {
    std::vector<std::shared_ptr<const Embedding>> all;
    for (int first = 0; first < 64; first += 16) {
      std::vector<PreparedImage> prepared;
      for (int n = first; n < first + 16; ++n) {
        ImageRGB8 im{96 + 4 * n, 80 + 2 * n, {}};
        im.pixels.resize(static_cast<size_t>(im.width) * im.height * 3);
        for (size_t i = 0; i < im.pixels.size(); ++i) im.pixels[i] = static_cast<uint8_t>((i * (3 + n) + 7 * n) % 251);
        prepared.push_back(*e.Prepare(im));
      }
      auto embs = e.Encode(prepared);
      EXPECT_TRUE(embs.ok()) << embs.status().ToString();
      if (!embs.ok()) return all;
      all.insert(all.end(), embs->begin(), embs->end());
    }
    return all;
  };
  const auto embs_g = embed(*graphs), embs_e = embed(*eager);
  ASSERT_EQ(embs_g.size(), 64u);
  ASSERT_EQ(embs_e.size(), 64u);
  for (int images : {33, 64}) {
    auto decode = [&](Engine& e, const std::vector<std::shared_ptr<const Embedding>>& embs) {
      std::vector<DecodeItem> items;
      for (int k = 0; k < images; ++k) {
        PromptSpec p;
        p.points = {{static_cast<float>(10 + k), static_cast<float>(20 + k / 2), 1}};
        p.multimask = true;
        items.push_back({embs[static_cast<size_t>(k)], p});
      }
      auto out = e.Decode(items);
      EXPECT_TRUE(out.ok()) << out.status().ToString();
      return out.ok() ? *out : std::vector<DecodedPrompt>{};
    };
    const auto g = decode(*graphs, embs_g), e = decode(*eager, embs_e);
    ASSERT_EQ(g.size(), static_cast<size_t>(images));
    ASSERT_EQ(e.size(), static_cast<size_t>(images));
    double worst = 0;
    for (int i = 0; i < images; ++i) {
      const auto lg = g[i].logits->ToFloat(), le = e[i].logits->ToFloat();
      ASSERT_EQ(lg.size(), le.size());
      double num = 0, den = 0;
      for (size_t k = 0; k < lg.size(); ++k) {
        num += (lg[k] - le[k]) * (lg[k] - le[k]);
        den += le[k] * le[k];
      }
      worst = std::max(worst, std::sqrt(num / std::max(den, 1e-12)));
    }
    std::printf("%d images, a prompt each: worst per-prompt logits rel L2 graph vs eager %.3e\n", images, worst);
    EXPECT_LE(worst, 2e-2) << images;
  }
}

}  // namespace
}  // namespace maskd
