// maskload's measurement: percentiles, window aggregation, the stability rule, the seeded random
// sources (arrivals, prompts, images) and the unique-JPEG trick.
#include <gtest/gtest.h>

#include <cmath>
#include <numeric>

#include "load_tests/latency_stats.h"
#include "load_tests/workload.h"
#include "model/io/image_codec.h"

namespace maskd::load {
namespace {

TEST(MaskloadStats, NearestRankPercentiles) {
  std::vector<uint64_t> v(100);
  std::iota(v.begin(), v.end(), 1);  // 1..100
  EXPECT_EQ(NearestRank(v, 50), 50u);
  EXPECT_EQ(NearestRank(v, 90), 90u);
  EXPECT_EQ(NearestRank(v, 99), 99u);
  EXPECT_EQ(NearestRank(v, 100), 100u);
  EXPECT_EQ(NearestRank(v, 0), 1u);
  std::vector<uint64_t> five = {10, 20, 30, 40, 50};
  EXPECT_EQ(NearestRank(five, 50), 30u);  // ceil(2.5) = 3rd
  EXPECT_EQ(NearestRank(five, 99), 50u);
  EXPECT_EQ(NearestRank(five, 20), 10u);  // exactly 1st
  EXPECT_EQ(NearestRank(five, 21), 20u);
}

TEST(MaskloadStats, SummarizeUnsorted) {
  LatencySummary s = Summarize({5, 1, 4, 2, 3});
  EXPECT_EQ(s.count, 5u);
  EXPECT_EQ(s.min_us, 1u);
  EXPECT_EQ(s.max_us, 5u);
  EXPECT_EQ(s.p50_us, 3u);
  EXPECT_DOUBLE_EQ(s.mean_us, 3.0);
  EXPECT_EQ(Summarize({}).count, 0u);
}

Sample Ok(uint64_t done, uint64_t latency, uint32_t images, uint32_t prompts) {
  Sample s;
  s.done_us = done;
  s.latency_us = latency;
  s.images = images;
  s.prompts = prompts;
  s.masks = prompts * 3;
  s.rle_bytes = 10 * s.masks;
  s.response_bytes = 100;
  s.server_total_us = latency / 2;
  return s;
}

TEST(MaskloadStats, AggregateWindowCountsOnlyItsSamples) {
  std::vector<Sample> samples = {Ok(100, 1000, 1, 5), Ok(1'000'000, 2000, 1, 7), Ok(1'500'000, 3000, 1, 2)};
  Sample err;
  err.done_us = 1'200'000;
  err.code = 8;  // RESOURCE_EXHAUSTED
  samples.push_back(err);
  WindowStats w = Aggregate(samples, 1'000'000, 2'000'000);
  EXPECT_EQ(w.requests, 3u);
  EXPECT_EQ(w.ok, 2u);
  EXPECT_EQ(w.errors, 1u);
  EXPECT_EQ(w.errors_by_code.at("RESOURCE_EXHAUSTED"), 1u);
  EXPECT_EQ(w.images, 2u);
  EXPECT_EQ(w.prompts, 9u);
  EXPECT_EQ(w.masks, 27u);
  EXPECT_DOUBLE_EQ(w.images_per_s(), 2.0);
  EXPECT_DOUBLE_EQ(w.prompts_per_s(), 9.0);
  EXPECT_EQ(w.latency.count, 2u);  // errors have no latency
  EXPECT_EQ(w.latency.max_us, 3000u);
  EXPECT_DOUBLE_EQ(w.server_total_us, 1250.0);
  EXPECT_EQ(w.rle_bytes, 270u);
}

WindowStats Window(double rate, uint64_t p50) {
  WindowStats w;
  w.duration_s = 1;
  w.ok = w.requests = w.images = static_cast<uint64_t>(rate);
  w.latency.p50_us = p50;
  return w;
}

TEST(MaskloadStats, StabilityRule) {
  std::vector<WindowStats> ws = {Window(50, 1000), Window(100, 1000), Window(105, 1050), Window(98, 980)};
  EXPECT_TRUE(IsStable(ws, 3, 0.10, RateUnit::kImages));
  EXPECT_FALSE(IsStable(ws, 4, 0.10, RateUnit::kImages));  // the first window is far off
  EXPECT_FALSE(IsStable(ws, 3, 0.02, RateUnit::kImages));
  // Latency must agree too.
  ws.back().latency.p50_us = 2000;
  EXPECT_FALSE(IsStable(ws, 3, 0.10, RateUnit::kImages));
  // Too few windows, or an empty one, are never stable.
  EXPECT_FALSE(IsStable({Window(100, 1000)}, 3, 0.10, RateUnit::kImages));
  EXPECT_FALSE(IsStable({Window(0, 0), Window(0, 0), Window(0, 0)}, 3, 0.10, RateUnit::kRequests));
}

// --fail-unstable's message: names the window and the figure that broke the rule, empty if stable.
TEST(MaskloadStats, WhyNotStableNamesTheWindowAndFigure) {
  std::vector<WindowStats> ws = {Window(50, 1000), Window(100, 1000), Window(105, 1050), Window(98, 980)};
  EXPECT_EQ(WhyNotStable(ws, 3, 0.10, RateUnit::kImages), "");
  const std::string rate = WhyNotStable(ws, 4, 0.10, RateUnit::kImages);
  EXPECT_NE(rate.find("window 0"), std::string::npos) << rate;
  EXPECT_NE(rate.find("img/s"), std::string::npos) << rate;
  EXPECT_NE(rate.find("allowed 10 %"), std::string::npos) << rate;
  ws.back().latency.p50_us = 2000;
  const std::string p50 = WhyNotStable(ws, 3, 0.10, RateUnit::kImages);
  EXPECT_NE(p50.find("window 3"), std::string::npos) << p50;
  EXPECT_NE(p50.find("p50 2.00 ms"), std::string::npos) << p50;
  const std::string few = WhyNotStable({Window(100, 1000)}, 3, 0.10, RateUnit::kRequests);
  EXPECT_NE(few.find("1 measurement window(s), fewer than the 3"), std::string::npos) << few;
  const std::string empty = WhyNotStable({Window(10, 1), Window(0, 0), Window(10, 1)}, 3, 0.10,
                                         RateUnit::kRequests);
  EXPECT_NE(empty.find("window 1 completed no call"), std::string::npos) << empty;
}

TEST(MaskloadWorkload, UniformIntCoversRangeEvenly) {
  Rng rng(7);
  std::vector<int> hist(14, 0);
  const int n = 140000;
  for (int i = 0; i < n; ++i) {
    const int64_t v = rng.UniformInt(1, 14);
    ASSERT_GE(v, 1);
    ASSERT_LE(v, 14);
    ++hist[v - 1];
  }
  // Each bucket expects 10000 (sd ~ 96): 5 sd.
  for (int h : hist) EXPECT_NEAR(h, 10000, 500);
}

TEST(MaskloadWorkload, PoissonArrivalsHaveTheRequestedRate) {
  PoissonArrivals a(2000.0, 11);
  const int n = 200000;
  double sum = 0, sum2 = 0;
  // Counts per 10 ms bin: Poisson(20), so variance == mean.
  std::vector<int> bins(static_cast<size_t>(n / 2000.0 / 0.01) + 2, 0);
  double t = 0;
  for (int i = 0; i < n; ++i) {
    const double g = a.NextGapSeconds();
    ASSERT_GT(g, 0);
    sum += g;
    sum2 += g * g;
    t += g;
    const size_t b = static_cast<size_t>(t / 0.01);
    if (b < bins.size()) ++bins[b];
  }
  const double mean = sum / n, var = sum2 / n - mean * mean;
  EXPECT_NEAR(mean, 1.0 / 2000, 0.01 / 2000);          // 1 % (sd of the mean is 0.22 %)
  EXPECT_NEAR(std::sqrt(var), 1.0 / 2000, 0.02 / 2000);  // exponential: sd == mean
  double bm = 0, bv = 0;
  const size_t full = static_cast<size_t>(t / 0.01) - 1;
  for (size_t i = 0; i < full; ++i) bm += bins[i];
  bm /= full;
  for (size_t i = 0; i < full; ++i) bv += (bins[i] - bm) * (bins[i] - bm);
  bv /= full;
  EXPECT_NEAR(bm, 20, 0.5);
  EXPECT_NEAR(bv / bm, 1.0, 0.1);  // dispersion index of a Poisson process
}

TEST(MaskloadWorkload, PromptsFollowWorkloadMd) {
  double total = 0;
  int lo = 100, hi = 0;
  const int n = 20000;
  for (int i = 0; i < n; ++i) {
    std::vector<PointPrompt> p = GeneratePointPrompts(MixSeed(1, 1, i), 1024, 768, 1, 14);
    lo = std::min<int>(lo, p.size());
    hi = std::max<int>(hi, p.size());
    total += p.size();
    for (const PointPrompt& q : p) {
      ASSERT_GT(q.x, 0);
      ASSERT_LT(q.x, 1024);
      ASSERT_GT(q.y, 0);
      ASSERT_LT(q.y, 768);
    }
  }
  EXPECT_EQ(lo, 1);
  EXPECT_EQ(hi, 14);
  EXPECT_NEAR(total / n, 7.5, 0.1);
  // Seeded: the same seed gives the same prompts, another seed others.
  auto a = GeneratePointPrompts(42, 1024, 768, 1, 14), b = GeneratePointPrompts(42, 1024, 768, 1, 14);
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) EXPECT_EQ(a[i].x, b[i].x);
  EXPECT_NE(MixSeed(1, 1, 0), MixSeed(1, 1, 1));
  EXPECT_NE(MixSeed(1, 1, 0), MixSeed(1, 2, 0));
}

TEST(MaskloadWorkload, GeneratedImagesAreSeededAndLookLikePictures) {
  const ImageRGB8 a = GenerateImage(5, 1024, 768), b = GenerateImage(5, 1024, 768),
                  c = GenerateImage(6, 1024, 768);
  ASSERT_EQ(a.pixels.size(), 1024u * 768 * 3);
  EXPECT_EQ(a.pixels, b.pixels);
  EXPECT_NE(a.pixels, c.pixels);
  // Smooth regions with edges, not noise: most horizontal neighbours differ by a level or two, and
  // the JPEG is far smaller than one of noise.
  size_t smooth = 0, n = 0;
  for (int y = 0; y < a.height; y += 7)
    for (int x = 1; x < a.width; ++x, ++n)
      smooth += std::abs(a.pixels[(y * a.width + x) * 3] - a.pixels[(y * a.width + x - 1) * 3]) <= 2;
  EXPECT_GT(static_cast<double>(smooth) / n, 0.95);
  // ... and it is not one flat colour either.
  std::vector<bool> seen(256, false);
  for (size_t i = 0; i < a.pixels.size(); i += 3) seen[a.pixels[i]] = true;
  EXPECT_GT(std::count(seen.begin(), seen.end(), true), 40);
  StatusOr<std::string> jpeg = EncodeJpeg(a, 90);
  ASSERT_TRUE(jpeg.ok());
  ImageRGB8 noise = a;
  Rng rng(1);
  for (uint8_t& p : noise.pixels) p = static_cast<uint8_t>(rng.Next());
  EXPECT_LT(jpeg->size() * 5, EncodeJpeg(noise, 90)->size());
}

TEST(MaskloadWorkload, JpegWithNonceDecodesToTheSamePixels) {
  const ImageRGB8 im = GenerateImage(3, 96, 64);
  const std::string jpeg = *EncodeJpeg(im, 90);
  const std::string a = JpegWithNonce(jpeg, 1), b = JpegWithNonce(jpeg, 2);
  EXPECT_NE(a, b);
  EXPECT_NE(a, jpeg);
  EXPECT_EQ(DetectImageFormat(a), ImageFormat::kJpeg);
  StatusOr<ImageRGB8> da = DecodeImage(a), dj = DecodeImage(jpeg);
  ASSERT_TRUE(da.ok()) << da.status().ToString();
  ASSERT_TRUE(dj.ok());
  EXPECT_EQ(da->pixels, dj->pixels);
  EXPECT_TRUE(JpegWithNonce("not a jpeg", 1).empty());
}

}  // namespace
}  // namespace maskd::load
