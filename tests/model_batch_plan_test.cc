// The encoder's batch planning (model/batch_plan.h): the cheapest cover of n images by the prepared
// batch sizes under a cost table, and the old "next size up" rule when no costs are known; and the
// decoder's passes over a token-count bucket.
#include <gtest/gtest.h>

#include <algorithm>
#include <numeric>
#include <set>
#include <vector>

#include "model/batch_plan.h"

namespace maskd {
namespace {

std::vector<EncoderBatchCost> Costs(const std::vector<int>& sizes, const std::vector<double>& seconds) {
  std::vector<EncoderBatchCost> c;
  for (size_t i = 0; i < sizes.size(); ++i) c.push_back({sizes[i], seconds.empty() ? 0.0 : seconds[i]});
  return c;
}

int Sum(const std::vector<int>& v) { return std::accumulate(v.begin(), v.end(), 0); }

TEST(BatchPlan, WithoutCostsTheFewestPassesThenTheLeastPadding) {
  const auto c = Costs({1, 2, 4, 8}, {});
  EXPECT_EQ(PlanEncoderBatches(1, c), (std::vector<int>{1}));
  EXPECT_EQ(PlanEncoderBatches(3, c), (std::vector<int>{4}));
  EXPECT_EQ(PlanEncoderBatches(5, c), (std::vector<int>{8}));
  EXPECT_EQ(PlanEncoderBatches(8, c), (std::vector<int>{8}));
  EXPECT_EQ(PlanEncoderBatches(20, c), (std::vector<int>{8, 8, 4}));
  EXPECT_EQ(PlanEncoderBatches(17, c), (std::vector<int>{8, 8, 1}));
  // Only size 1 prepared (the CPU default): one image per pass.
  EXPECT_EQ(PlanEncoderBatches(3, Costs({1}, {})), (std::vector<int>{1, 1, 1}));
}

TEST(BatchPlan, AMeasuredTableCanPreferTwoPassesOverPadding) {
  // A device where the 8-graph costs much more than a 4- and a 1-graph together.
  const auto c = Costs({1, 2, 4, 8}, {1.0, 1.6, 2.5, 6.0});
  EXPECT_EQ(PlanEncoderBatches(5, c), (std::vector<int>{4, 1}));  // 3.5 < 6.0 (8) and < 4.1 (4 + 2)
  EXPECT_EQ(PlanEncoderBatches(7, c), (std::vector<int>{4, 4}));  // 5.0 < 5.1 (4 + 2 + 1) and < 6.0
  EXPECT_EQ(PlanEncoderBatches(8, c), (std::vector<int>{4, 4}));  // 5.0 < 6.0
  // Where the big graph is cheap per image it wins, padding and all.
  const auto flat = Costs({1, 2, 4, 8}, {1.0, 1.1, 1.2, 1.3});
  EXPECT_EQ(PlanEncoderBatches(5, flat), (std::vector<int>{8}));
  EXPECT_EQ(PlanEncoderBatches(9, flat), (std::vector<int>{8, 1}));
}

TEST(BatchPlan, EveryPlanCoversTheBatchAtTheLeastCost) {
  const std::vector<int> sizes = {1, 3, 4, 8};
  const std::vector<double> secs = {1.0, 2.2, 2.5, 4.9};
  const auto c = Costs(sizes, secs);
  auto cost_of = [&](const std::vector<int>& plan) {
    double t = 0;
    for (int b : plan)
      for (size_t i = 0; i < sizes.size(); ++i)
        if (sizes[i] == b) t += secs[i];
    return t;
  };
  for (int n = 1; n <= 40; ++n) {
    const std::vector<int> plan = PlanEncoderBatches(n, c);
    ASSERT_FALSE(plan.empty()) << n;
    EXPECT_GE(Sum(plan), n) << n;
    EXPECT_TRUE(std::is_sorted(plan.rbegin(), plan.rend())) << n;
    // Brute force over how many passes of each size (enough to cover n).
    double best = 1e30;
    for (int a = 0; a <= n; ++a)
      for (int b = 0; b <= n / 3 + 1; ++b)
        for (int d = 0; d <= n / 4 + 1; ++d)
          for (int e = 0; e <= n / 8 + 1; ++e)
            if (a + 3 * b + 4 * d + 8 * e >= n) best = std::min(best, a * 1.0 + b * 2.2 + d * 2.5 + e * 4.9);
    EXPECT_NEAR(cost_of(plan), best, 1e-9) << n;
  }
}

// Run 45's measured tables (H100, ms per pass of sizes 1..32): vit_h's per-image cost is flat from
// size 4 on, vit_b's still falls by more than kFlatPerImageCost up to size 8.
TEST(BatchPlan, PerImageCostFlatStopsWhereTheCostPerImageStopsFalling) {
  const std::vector<int> sizes = {1, 2, 4, 8, 16, 32};
  const auto h = Costs(sizes, {12.24e-3, 23.23e-3, 46.21e-3, 96.05e-3, 189.67e-3, 383.44e-3});
  EXPECT_FALSE(PerImageCostFlat(h[0], h[1]));  // 12.24 -> 11.62 ms per image: still falling by 5 %
  EXPECT_TRUE(PerImageCostFlat(h[1], h[2]));   // 11.62 -> 11.55: flat
  EXPECT_TRUE(PerImageCostFlat(h[2], h[3]));   // dearer per image: flat too
  const auto b = Costs(sizes, {3.16e-3, 5.57e-3, 10.73e-3, 20.93e-3, 40.60e-3, 83.27e-3});
  EXPECT_FALSE(PerImageCostFlat(b[0], b[1]));  // 3.16 -> 2.79: -12 %
  EXPECT_FALSE(PerImageCostFlat(b[1], b[2]));  // 2.79 -> 2.68: -3.7 %
  EXPECT_TRUE(PerImageCostFlat(b[2], b[3]));   // 2.68 -> 2.62: -2.4 %
  // Unmeasured or not larger: never flat (the measurement goes on).
  EXPECT_FALSE(PerImageCostFlat(h[2], Costs({8}, {})[0]));
  EXPECT_FALSE(PerImageCostFlat(h[3], h[2]));
  EXPECT_FALSE(PerImageCostFlat(h[2], h[2]));
}

TEST(BatchPlan, ExtrapolatedCostsScaleTheLastMeasuredPerImageCost) {
  auto c = Costs({1, 2, 4, 8, 16, 32}, {12e-3, 23e-3, 46e-3, 0, 0, 0});
  ExtrapolateFlatEncoderCosts(c, 3);
  for (size_t i = 0; i < 3; ++i) EXPECT_FALSE(c[i].extrapolated) << i;
  EXPECT_DOUBLE_EQ(c[2].seconds, 46e-3);
  EXPECT_TRUE(c[3].extrapolated);
  EXPECT_NEAR(c[3].seconds, 92e-3, 1e-12);
  EXPECT_NEAR(c[4].seconds, 184e-3, 1e-12);
  EXPECT_NEAR(c[5].seconds, 368e-3, 1e-12);
  // The plan by the extrapolated table: a full 32 in one pass, 30 without padding.
  EXPECT_EQ(PlanEncoderBatches(32, c), std::vector<int>({32}));
  EXPECT_EQ(PlanEncoderBatches(30, c), std::vector<int>({16, 8, 4, 2}));
  // Nothing measured, or everything: unchanged.
  auto d = Costs({1, 2}, {1e-3, 2e-3});
  ExtrapolateFlatEncoderCosts(d, 0);
  ExtrapolateFlatEncoderCosts(d, 2);
  EXPECT_DOUBLE_EQ(d[1].seconds, 2e-3);
  EXPECT_FALSE(d[1].extrapolated);
}

TEST(BatchPlan, TheFoldedAttentionOnlyWhereItIsThreePercentFaster) {
  EXPECT_TRUE(PreferFolded(1.00, 0.96));
  EXPECT_FALSE(PreferFolded(1.00, 0.98));  // within the margin: the fused kernel (fp32 rel-pos terms)
  EXPECT_FALSE(PreferFolded(1.00, 1.20));
  EXPECT_FALSE(PreferFolded(1.00, 0.0));   // the folded way did not run
  EXPECT_FALSE(PreferFolded(0.0, 0.5));    // nothing measured
}

TEST(BatchPlan, NothingToPlan) {
  EXPECT_TRUE(PlanEncoderBatches(0, Costs({1, 2}, {})).empty());
  EXPECT_TRUE(PlanEncoderBatches(4, {}).empty());
}

TEST(DecodePasses, OnePassKeepsTheCallersOrder) {
  const std::vector<size_t> prompts = {4, 0, 7, 2};
  const std::vector<int64_t> image_of = {1, 2, 1, 2};
  EXPECT_EQ(SplitDecodePasses(prompts, image_of, 0), (std::vector<std::vector<size_t>>{{4, 0, 7, 2}}));
  EXPECT_EQ(SplitDecodePasses(prompts, image_of, 4), (std::vector<std::vector<size_t>>{{4, 0, 7, 2}}));
  EXPECT_TRUE(SplitDecodePasses({}, {}, 3).empty());
}

TEST(DecodePasses, SeveralPassesHoldThePromptsOfAnImageTogether) {
  // 256 prompts over 32 images given image by image in turn (maskbench's jagged case): passes of 64
  // hold 8 images each instead of all 32.
  std::vector<size_t> prompts;
  std::vector<int64_t> image_of;
  for (size_t k = 0; k < 256; ++k) {
    prompts.push_back(k);
    image_of.push_back(static_cast<int64_t>(1000 + 7 * (k % 32)));
  }
  const auto passes = SplitDecodePasses(prompts, image_of, 64);
  ASSERT_EQ(passes.size(), 4u);
  std::vector<size_t> seen;
  for (const auto& p : passes) {
    EXPECT_EQ(p.size(), 64u);
    std::set<int64_t> images;
    for (size_t i : p) images.insert(image_of[i]);
    EXPECT_EQ(images.size(), 8u);
    seen.insert(seen.end(), p.begin(), p.end());
  }
  // Every prompt once; within an image in the caller's order; images in the order of their first prompt.
  std::vector<size_t> sorted = seen;
  std::sort(sorted.begin(), sorted.end());
  EXPECT_EQ(sorted, prompts);
  EXPECT_EQ((std::vector<size_t>(seen.begin(), seen.begin() + 9)),
            (std::vector<size_t>{0, 32, 64, 96, 128, 160, 192, 224, 1}));
}

TEST(DecodePasses, PassesOfEqualSizeToWithinOne) {
  // 11 prompts over two images, at most 3 a pass: 4 passes of 2 or 3, image 5's prompts first.
  const std::vector<size_t> prompts = {10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20};
  const std::vector<int64_t> image_of = {5, 9, 5, 9, 5, 9, 5, 9, 5, 9, 5};
  const auto passes = SplitDecodePasses(prompts, image_of, 3);
  EXPECT_EQ(passes, (std::vector<std::vector<size_t>>{{10, 12}, {14, 16, 18}, {20, 11, 13}, {15, 17, 19}}));
  // An image_of that does not match: the caller's order.
  EXPECT_EQ(SplitDecodePasses(prompts, {1, 2}, 3),
            (std::vector<std::vector<size_t>>{{10, 11}, {12, 13, 14}, {15, 16, 17}, {18, 19, 20}}));
}

}  // namespace
}  // namespace maskd
