// The shared-image decoder (model/fast_decoder.h) against the original decoder (model/mask_decoder.h)
// on the same weights, in fp32 on the CPU: one image for many prompts, several images in one jagged
// call, groups with their own dense input, both attention paths; and the engine with
// FastPathOptions::shared_image_decoder against the engine without it.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <optional>
#include <string>

#include "model/api/engine.h"
#include "model/fast_decoder.h"
#include "model/mask_decoder.h"
#include "model/sam.h"
#include "model/sam_config.h"
#include "tests/scoped_env.h"

namespace maskd {
namespace {

// Max |a - b| relative to max |b|: the reassociated sums differ by fp32 rounding only.
double RelMax(const at::Tensor& a, const at::Tensor& b) {
  const at::Tensor x = a.to(at::kDouble), y = b.to(at::kDouble);
  return (x - y).abs().max().item<double>() / std::max(1e-12, y.abs().max().item<double>());
}

struct Fixture {
  SamConfig c = *SamPreset("tiny");
  MaskDecoder dec{c};
  at::Tensor pos;
  explicit Fixture(uint64_t seed) {
    RandomizeWeights(*dec, seed);
    torch::manual_seed(seed);
    pos = torch::randn({1, 256, 64, 64});
  }
};

void ExpectSame(const MaskDecoderImpl::Output& got, const MaskDecoderImpl::Output& ref, const char* what) {
  ASSERT_EQ(got.masks.sizes(), ref.masks.sizes()) << what;
  ASSERT_EQ(got.iou_predictions.sizes(), ref.iou_predictions.sizes()) << what;
  EXPECT_LT(RelMax(got.masks, ref.masks), 2e-5) << what;
  EXPECT_LT(RelMax(got.iou_predictions, ref.iou_predictions), 2e-5) << what;
}

TEST(SharedImageDecoder, ManyPromptsOfOneImageEqualTheOriginal) {
  torch::NoGradGuard no_grad;
  for (bool sdpa : {false, true}) {
    Fixture f(31);
    f.dec->transformer->SetSdpa(sdpa);
    const at::Tensor src = torch::randn({1, 256, 64, 64});
    const at::Tensor sparse = torch::randn({5, 3, 256});
    const auto ref = f.dec->forward(src.expand({5, -1, -1, -1}), f.pos, sparse);
    SharedImageDecoder shared(*f.dec, f.pos);
    ExpectSame(shared.forward(src, at::Tensor(), sparse), ref, sdpa ? "sdpa" : "math");
  }
}

TEST(SharedImageDecoder, JaggedGroupsEqualTheOriginalPerPrompt) {
  torch::NoGradGuard no_grad;
  Fixture f(32);
  const at::Tensor groups = torch::randn({3, 256, 64, 64});
  const at::Tensor group_of = torch::tensor({2, 0, 1, 0, 2, 2}, torch::kLong);
  const at::Tensor sparse = torch::randn({6, 2, 256});
  const auto ref = f.dec->forward(groups.index_select(0, group_of), f.pos, sparse);
  SharedImageDecoder shared(*f.dec, f.pos);
  ExpectSame(shared.forward(groups, group_of, sparse), ref, "3 groups");
  // A group of one prompt each (what a mask input makes) is the same computation.
  const at::Tensor single = torch::arange(6, torch::kLong);
  const at::Tensor per_prompt = groups.index_select(0, group_of);
  ExpectSame(shared.forward(per_prompt, single, sparse), ref, "one group per prompt");
}

// MASKD_DECODER_ABSORB=1: blocks 1.. and the final attention run on the prompts' keys themselves
// (kernels::AbsorbedAttention, whose CPU path is its reference). The same function as the original
// up to fp32 reassociation, for one image and for jagged groups, with 8 tokens a prompt (the kernel's
// limit on CUDA) and with 12; and not the projected path's bits, so the absorbed form did run.
TEST(SharedImageDecoder, AbsorbedAttentionsEqualTheOriginal) {
  torch::NoGradGuard no_grad;
  Fixture f(35);
  const at::Tensor groups = torch::randn({3, 256, 64, 64});
  const at::Tensor group_of = torch::tensor({2, 0, 1, 0, 2}, torch::kLong);
  std::optional<SharedImageDecoder> projected;
  {
    const testing::ScopedEnv off("MASKD_DECODER_ABSORB", "0");
    projected.emplace(*f.dec, f.pos);
  }
  const testing::ScopedEnv absorb("MASKD_DECODER_ABSORB", "1");
  SharedImageDecoder absorbed(*f.dec, f.pos);
  for (int64_t tokens : {3, 7}) {
    const at::Tensor sparse = torch::randn({5, tokens, 256});
    const std::string what = std::to_string(5 + tokens) + " tokens";
    const auto ref = f.dec->forward(groups.index_select(0, group_of), f.pos, sparse);
    const auto got = absorbed.forward(groups, group_of, sparse);
    ExpectSame(got, ref, (what + ", 3 groups").c_str());
    EXPECT_FALSE(at::equal(got.masks, projected->forward(groups, group_of, sparse).masks)) << what;
    const auto one_ref = f.dec->forward(groups.slice(0, 0, 1).expand({5, -1, -1, -1}), f.pos, sparse);
    ExpectSame(absorbed.forward(groups.slice(0, 0, 1), at::Tensor(), sparse), one_ref, (what + ", one image").c_str());
  }
}

// Without MASKD_DECODER_ABSORB the absorbed form serves passes of 8 prompts or more (run 60's
// crossover) and "0" none: below the threshold the default decoder gives the projected path's bits,
// from it not.
TEST(SharedImageDecoder, AbsorbedAttentionsFromEightPromptsByDefault) {
  torch::NoGradGuard no_grad;
  Fixture f(36);
  const at::Tensor src = torch::randn({1, 256, 64, 64});
  at::Tensor projected_small, projected_large;
  const at::Tensor small = torch::randn({7, 2, 256}), large = torch::randn({8, 2, 256});
  {
    const testing::ScopedEnv off("MASKD_DECODER_ABSORB", "0");
    SharedImageDecoder projected(*f.dec, f.pos);
    projected_small = projected.forward(src, at::Tensor(), small).masks;
    projected_large = projected.forward(src, at::Tensor(), large).masks;
  }
  const testing::ScopedEnv unset("MASKD_DECODER_ABSORB", nullptr);
  SharedImageDecoder by_default(*f.dec, f.pos);
  EXPECT_TRUE(at::equal(by_default.forward(src, at::Tensor(), small).masks, projected_small));
  const at::Tensor large_default = by_default.forward(src, at::Tensor(), large).masks;
  EXPECT_FALSE(at::equal(large_default, projected_large));
  EXPECT_LT(RelMax(large_default, projected_large), 2e-5);
}

TEST(SharedImageDecoder, RowsAreIndependentOfTheirBatch) {
  torch::NoGradGuard no_grad;
  Fixture f(33);
  const at::Tensor src = torch::randn({1, 256, 64, 64});
  const at::Tensor sparse = torch::randn({4, 4, 256});
  SharedImageDecoder shared(*f.dec, f.pos);
  const auto all = shared.forward(src, at::Tensor(), sparse);
  for (int64_t i = 0; i < 4; ++i) {
    const auto one = shared.forward(src, at::Tensor(), sparse.slice(0, i, i + 1));
    EXPECT_LT(RelMax(all.masks[i], one.masks[0]), 1e-5) << i;
    EXPECT_LT(RelMax(all.iou_predictions[i], one.iou_predictions[0]), 1e-5) << i;
  }
}

TEST(SharedImageDecoder, RejectsMissingGroupIndexForSeveralGroups) {
  torch::NoGradGuard no_grad;
  Fixture f(34);
  SharedImageDecoder shared(*f.dec, f.pos);
  EXPECT_THROW(shared.forward(torch::randn({2, 256, 64, 64}), at::Tensor(), torch::randn({3, 2, 256})), c10::Error);
  EXPECT_THROW(shared.forward(torch::randn({2, 256, 64, 64}), torch::tensor({0, 1}, torch::kLong),
                              torch::randn({3, 2, 256})),
               c10::Error);
}

TEST(SharedImageDecoder, EngineDecodeEqualsTheOriginalEngine) {
  EngineOptions o;  // the demo model, CPU, fp32
  o.warmup = false;
  auto base = Engine::Create(o);
  o.fast.shared_image_decoder = true;
  auto fast = Engine::Create(o);
  ASSERT_TRUE(base.ok() && fast.ok());
  ImageRGB8 a{320, 200, {}}, b{150, 400, {}};
  for (auto* im : {&a, &b}) {
    im->pixels.resize(static_cast<size_t>(im->width) * im->height * 3);
    for (size_t i = 0; i < im->pixels.size(); ++i) im->pixels[i] = static_cast<uint8_t>((i * 37 + im->width) % 251);
  }
  auto run = [&](Engine& e, bool with_mask) {
    auto pa = e.Prepare(a), pb = e.Prepare(b);
    EXPECT_TRUE(pa.ok() && pb.ok());
    auto embs = e.Encode({*pa, *pb});
    EXPECT_TRUE(embs.ok());
    std::vector<DecodeItem> items;
    auto add = [&](int img, std::vector<Point> pts, std::optional<Box> box, bool multi) {
      PromptSpec p;
      p.points = std::move(pts);
      p.box = box;
      p.multimask = multi;
      items.push_back({(*embs)[img], p});
    };
    add(0, {{10, 20, 1}}, std::nullopt, true);
    add(1, {{100, 300, 1}}, std::nullopt, false);
    add(0, {{300, 190, 1}}, std::nullopt, false);
    add(0, {}, Box{5, 5, 200, 150}, true);
    add(1, {{50, 60, 1}}, Box{10, 10, 140, 390}, false);
    add(1, {{1, 1, 0}}, std::nullopt, true);
    if (with_mask) {
      auto first = e.Decode({items[0]});
      EXPECT_TRUE(first.ok());
      PromptSpec refine;
      refine.points = {{12, 22, 1}};
      refine.mask_input = (*first)[0].logits;
      refine.mask_input_index = 2;
      items.push_back({(*embs)[0], refine});
    }
    return *e.Decode(items);
  };
  const auto ref = run(**base, true), got = run(**fast, true);
  ASSERT_EQ(ref.size(), got.size());
  for (size_t i = 0; i < ref.size(); ++i) {
    ASSERT_EQ(ref[i].scores.size(), got[i].scores.size());
    for (size_t k = 0; k < ref[i].scores.size(); ++k) EXPECT_NEAR(got[i].scores[k], ref[i].scores[k], 1e-4) << i;
    const auto lr = ref[i].logits->ToFloat(), lg = got[i].logits->ToFloat();
    ASSERT_EQ(lr.size(), lg.size());
    double m = 0, s = 0;
    for (size_t k = 0; k < lr.size(); ++k) {
      m = std::max(m, static_cast<double>(std::fabs(lr[k] - lg[k])));
      s = std::max(s, static_cast<double>(std::fabs(lr[k])));
    }
    EXPECT_LT(m, 2e-5 * std::max(1.0, s)) << "prompt " << i;
  }
  const auto opts = (*fast)->optimisations();
  EXPECT_NE(std::find(opts.begin(), opts.end(), "shared-image-decoder"), opts.end());
}

// DecodeEach runs a token-count bucket larger than decoder_max_pass_prompts in passes of equal size
// (the decoder's memory is per pass): the same results, in the items' order, as one pass.
TEST(SharedImageDecoder, PassesOfAtMostTheLimitGiveTheSameResultsAsOnePass) {
  for (bool shared : {false, true}) {
    EngineOptions o;  // the demo model, CPU, fp32
    o.warmup = false;
    o.fast.shared_image_decoder = shared;
    o.decoder_max_pass_prompts = 0;
    auto whole = Engine::Create(o);
    o.decoder_max_pass_prompts = 3;
    auto split = Engine::Create(o);
    ASSERT_TRUE(whole.ok() && split.ok());
    ImageRGB8 a{300, 220, {}}, b{180, 360, {}};
    for (auto* im : {&a, &b}) {
      im->pixels.resize(static_cast<size_t>(im->width) * im->height * 3);
      for (size_t i = 0; i < im->pixels.size(); ++i) im->pixels[i] = static_cast<uint8_t>((i * 29 + im->height) % 251);
    }
    auto run = [&](Engine& e) {
      auto pa = e.Prepare(a), pb = e.Prepare(b);
      auto embs = e.Encode({*pa, *pb});
      EXPECT_TRUE(embs.ok());
      std::vector<DecodeItem> items;
      // 11 one-point prompts (one bucket: passes of 3, 4, 4) over both images, and two boxes.
      for (int k = 0; k < 11; ++k) {
        PromptSpec p;
        p.points = {{static_cast<float>(13 * k % 170), static_cast<float>(31 * k % 210), k % 3 ? 1 : 0}};
        p.multimask = k % 2 == 0;
        items.push_back({(*embs)[k % 2], p});
      }
      for (int k = 0; k < 2; ++k) {
        PromptSpec p;
        p.box = Box{5.f + k, 8.f, 120.f, 150.f + k};
        items.push_back({(*embs)[k], p});
      }
      return *e.Decode(items);
    };
    const auto ref = run(**whole), got = run(**split);
    ASSERT_EQ(ref.size(), 13u);
    ASSERT_EQ(got.size(), ref.size());
    for (size_t i = 0; i < ref.size(); ++i) {
      ASSERT_EQ(ref[i].scores.size(), got[i].scores.size()) << i;
      for (size_t k = 0; k < ref[i].scores.size(); ++k) EXPECT_NEAR(got[i].scores[k], ref[i].scores[k], 1e-5) << i;
      const auto lr = ref[i].logits->ToFloat(), lg = got[i].logits->ToFloat();
      ASSERT_EQ(lr.size(), lg.size());
      double m = 0;
      for (size_t k = 0; k < lr.size(); ++k) m = std::max(m, static_cast<double>(std::fabs(lr[k] - lg[k])));
      EXPECT_LT(m, 1e-4) << (shared ? "shared " : "original ") << "prompt " << i;
    }
  }
}

}  // namespace
}  // namespace maskd
