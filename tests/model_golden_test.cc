// Parity with the original SAM on CPU fp32: every case of the golden folder, model path
// (input_resized) and whole-pipeline path (PNG decode + Pillow-exact resize), within the golden
// README's tolerances. Uses only the public, torch-free engine API.
#include <gtest/gtest.h>

#include "model/api/engine.h"
#include "model/golden.h"
#include "tests/golden_dir.h"

namespace maskd {
namespace {

TEST(GoldenParity, EveryCaseWithinFp32TolerancesOnCpu) {
  MASKD_REQUIRE_GOLDEN(dir, "tiny");
  auto ckpt = GoldenCheckpoint(dir);
  ASSERT_TRUE(ckpt.ok()) << ckpt.status().ToString();
  EngineOptions o;
  o.checkpoint = *ckpt;
  o.device = "cpu";
  auto engine = Engine::Create(o);
  ASSERT_TRUE(engine.ok()) << engine.status().ToString();
  EXPECT_EQ((*engine)->description().arch, "tiny");
  const GoldenTolerances tol = GoldenTolerances::Fp32();
  auto report = RunGolden(**engine, {dir, {}, true}, tol);
  ASSERT_TRUE(report.ok()) << report.status().ToString();
  int embeddings = 0, cases = 0;
  for (const auto& c : report->cases) {
    SCOPED_TRACE(c.image + "/" + c.path + "/" + c.name);
    if (c.name == "embedding") {
      ++embeddings;
      EXPECT_LE(c.max_abs_embedding, tol.embedding_max_abs);
      if (c.path == "png") EXPECT_EQ(c.resize_max_diff, 0) << "resize is not bit-exact with Pillow";
    } else {
      ++cases;
      EXPECT_LE(c.max_abs_logits, tol.logits_max_abs);
      EXPECT_LE(c.max_abs_iou, tol.iou_max_abs);
      EXPECT_LE(c.mask_pixel_fraction, tol.mask_pixel_fraction);
    }
    EXPECT_TRUE(c.passed) << c.failure;
    std::printf("%-7s %-13s %-9s emb %.2e logits %.2e iou %.2e mask %.2e (%lld px)\n", c.image.c_str(),
                c.path.c_str(), c.name.c_str(), c.max_abs_embedding, c.max_abs_logits, c.max_abs_iou,
                c.mask_pixel_fraction, static_cast<long long>(c.differing_pixels));
  }
  // 3 images x 2 paths: one embedding row and 5 cases + 1 batch each.
  EXPECT_EQ(embeddings, 6);
  EXPECT_EQ(cases, 36);
}

}  // namespace
}  // namespace maskd
