// Automatic mask generation against the original SamAutomaticMaskGenerator (CPU, fp32): the oracle
// (tests/oracle/amg_oracle.py, segment_anything in MASKD_PYTHON) writes the original's records for
// each case on the golden model; the engine's GenerateMasks must give the same number of masks, each
// matched one-to-one with mask IoU >= 0.99, predicted IoU within 1e-4 (the golden README's IoU
// tolerance), stability score within 2e-3 (a ratio of pixel counts at logits +-offset: a few of
// thousands of pixels may flip at the fp32 logit tolerance), boxes within 1 px, the same point and
// crop box. Plus the torch-free parts (grids, crops, NMS, small regions, validation) on their own.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>

#include <sys/stat.h>
#include <unistd.h>

#include "model/api/engine.h"
#include "model/api/mask_generator.h"
#include "model/golden.h"
#include "model/io/image_codec.h"
#include "model/io/rle.h"
#include "tests/generation_params_json.h"
#include "tests/golden_dir.h"

namespace maskd {
namespace {

using nlohmann::json;

TEST(MaskGenerationParts, PointGridMatchesNumpyLinspace) {
  auto g = BuildPointGrid(4);
  ASSERT_EQ(g.size(), 16u);
  EXPECT_DOUBLE_EQ(g[0].x, 0.125);
  EXPECT_DOUBLE_EQ(g[1].x, 0.375);
  EXPECT_DOUBLE_EQ(g[3].x, 0.875);
  EXPECT_DOUBLE_EQ(g[4].y, 0.375);  // row-major: y outer
  EXPECT_DOUBLE_EQ(g[4].x, 0.125);
  auto one = BuildPointGrid(1);
  ASSERT_EQ(one.size(), 1u);
  EXPECT_DOUBLE_EQ(one[0].x, 0.5);
}

TEST(MaskGenerationParts, CropBoxesOfOneLayer) {
  // generate_crop_boxes((480, 640), 1, 512/1500): overlap int(0.3413 * 480 * 1) = 163,
  // crop_w = ceil((163 + 640) / 2) = 402, crop_h = ceil((163 + 480) / 2) = 322.
  auto c = GenerateCropBoxes(640, 480, 1, 512.0 / 1500);
  ASSERT_EQ(c.size(), 5u);
  EXPECT_EQ(c[0].box, (CropBox{0, 0, 640, 480}));
  EXPECT_EQ(c[1].box, (CropBox{0, 0, 402, 322}));
  EXPECT_EQ(c[2].box, (CropBox{0, 159, 402, 480}));  // y inner
  EXPECT_EQ(c[3].box, (CropBox{239, 0, 640, 322}));
  EXPECT_EQ(c[4].layer, 1);
}

TEST(MaskGenerationParts, NmsKeepsByScoreWithStableTies) {
  std::vector<std::array<float, 4>> boxes = {{0, 0, 10, 10}, {1, 1, 10, 10}, {20, 20, 30, 30}, {0, 0, 10, 9}};
  auto keep = BoxNmsHost(boxes, {0.5f, 0.9f, 0.1f, 0.5f}, 0.7f);
  // 1 first (best), suppresses 0 (IoU 0.81) and 3 (IoU 72/(81+90-72) = 0.727); 2 stays.
  EXPECT_EQ(keep, (std::vector<int>{1, 2}));
  auto ties = BoxNmsHost({{0, 0, 1, 1}, {5, 5, 6, 6}, {0, 0, 1, 1}}, {1, 1, 1}, 0.5f);
  EXPECT_EQ(ties, (std::vector<int>{0, 1}));
}

TEST(MaskGenerationParts, SmallRegionsFillHolesAndDropIslands) {
  // 6x6: a 4x4 square with a 1-pixel hole, plus a lone pixel (8-connected to nothing).
  std::vector<uint8_t> m(36, 0);
  for (int y = 1; y <= 4; ++y)
    for (int x = 0; x <= 3; ++x) m[y * 6 + x] = 1;
  m[2 * 6 + 1] = 0;  // hole
  m[0 * 6 + 5] = 1;  // island
  auto holes = m;
  EXPECT_TRUE(RemoveSmallRegions(holes, 6, 6, 2, true));
  EXPECT_EQ(holes[2 * 6 + 1], 1);
  EXPECT_EQ(holes[0 * 6 + 0], 0);  // the outer background (20 px) is not small
  auto islands = holes;
  EXPECT_TRUE(RemoveSmallRegions(islands, 6, 6, 2, false));
  EXPECT_EQ(islands[5], 0);
  EXPECT_EQ(islands[1 * 6 + 0], 1);
  auto again = islands;
  EXPECT_FALSE(RemoveSmallRegions(again, 6, 6, 2, false));
  // All islands small: the largest stays.
  std::vector<uint8_t> two(36, 0);
  two[0] = 1, two[7] = 1, two[20] = 1;  // {0, 7} diagonal = one component of 2; {20} of 1
  EXPECT_TRUE(RemoveSmallRegions(two, 6, 6, 10, false));
  EXPECT_EQ(two[0] + two[7] + two[20], 2);
  EXPECT_EQ(MaskBox(islands.data(), 6, 6), (std::array<int, 4>{0, 1, 3, 4}));
}

TEST(MaskGenerationParts, ValidationNamesTheField) {
  MaskGenerationParams p;
  EXPECT_TRUE(ValidateMaskGenerationParams(p).ok());
  auto expect_bad = [](MaskGenerationParams q, const std::string& field) {
    Status s = ValidateMaskGenerationParams(q);
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << field;
    EXPECT_NE(s.message().find("params." + field), std::string::npos) << s.message();
  };
  { auto q = p; q.points_per_side = 0; expect_bad(q, "points_per_side"); }
  { auto q = p; q.points_per_side = 1000; expect_bad(q, "points_per_side"); }
  { auto q = p; q.points_per_batch = 0; expect_bad(q, "points_per_batch"); }
  { auto q = p; q.pred_iou_thresh = 1.5f; expect_bad(q, "pred_iou_thresh"); }
  { auto q = p; q.stability_score_thresh = NAN; expect_bad(q, "stability_score_thresh"); }
  { auto q = p; q.stability_score_offset = -1; expect_bad(q, "stability_score_offset"); }
  { auto q = p; q.box_nms_thresh = -0.1f; expect_bad(q, "box_nms_thresh"); }
  { auto q = p; q.crop_n_layers = 9; expect_bad(q, "crop_n_layers"); }
  { auto q = p; q.crop_overlap_ratio = 1; expect_bad(q, "crop_overlap_ratio"); }
  { auto q = p; q.crop_n_layers = 2; q.crop_n_points_downscale_factor = 16; q.points_per_side = 32;
    expect_bad(q, "crop_n_points_downscale_factor"); }
  { auto q = p; q.min_mask_region_area = -5; expect_bad(q, "min_mask_region_area"); }
  { auto q = p; q.point_grids = {{{0.5, 0.5}}}; expect_bad(q, "points_per_side"); }
  { auto q = p; q.points_per_side = 0; q.point_grids = {{{0.5, 1.5}}}; expect_bad(q, "point_grids[0].points[0]"); }
  { auto q = p; q.points_per_side = 0; q.point_grids = {{{0.5, 0.5}}}; q.crop_n_layers = 1; expect_bad(q, "point_grids"); }
}

std::string ReadFile(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

double MaskIou(const std::vector<uint8_t>& a, const std::vector<uint8_t>& b) {
  uint64_t inter = 0, uni = 0;
  for (size_t i = 0; i < a.size(); ++i) inter += a[i] && b[i], uni += a[i] || b[i];
  return uni ? static_cast<double>(inter) / uni : 1.0;
}

// kGpu: the same cases on the CUDA device in fp32 (TF32 off) with the fused post-processing
// kernel (FastPathOptions::gpu_postprocess), i.e. EngineImpl::FilterMasks' kernel path, against the
// same oracle. The GPU host has no segment_anything: give it the oracle file written here
// (MASKD_AMG_ORACLE_JSON).
template <bool kGpu>
class GenerateParityT : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    const std::string dir = ::maskd::testing::GoldenRoot() + "/tiny-one";
    if (!::maskd::testing::IsDir(dir)) {
      skip_ = "golden data not found at " + dir;
      return;
    }
    const std::string py = MASKD_PYTHON_EXE;
    const char* oracle_given = std::getenv("MASKD_AMG_ORACLE_JSON");
    if (!(oracle_given && *oracle_given) &&
        std::system((py + " -c 'import segment_anything, torchvision' >/dev/null 2>&1").c_str()) != 0) {
      skip_ = "segment_anything is not importable by " + py;
      return;
    }
    // MASKD_AMG_ORACLE_JSON: an oracle file written earlier (the oracle takes minutes on a busy CPU).
    const char* given = std::getenv("MASKD_AMG_ORACLE_JSON");
    const std::string out = given && *given ? given : std::string(MASKD_BINARY_DIR) + "/amg_oracle.json";
    const std::string cmd = py + " " MASKD_SOURCE_DIR "/tests/oracle/amg_oracle.py --golden " + dir + " --out " + out;
    // ctest runs each test in a process of its own: the first one writes the oracle file (to a
    // temporary name, then renamed), the others reuse it while it is newer than the oracle script.
    struct stat out_st, script_st;
    const bool fresh = stat(out.c_str(), &out_st) == 0 &&
                       stat(MASKD_SOURCE_DIR "/tests/oracle/amg_oracle.py", &script_st) == 0 &&
                       out_st.st_mtime >= script_st.st_mtime;
    const std::string tmp = out + "." + std::to_string(getpid());
    if (!(given && *given) && !fresh &&
        (std::system((py + " " MASKD_SOURCE_DIR "/tests/oracle/amg_oracle.py --golden " + dir + " --out " + tmp).c_str()) != 0 ||
         std::rename(tmp.c_str(), out.c_str()) != 0)) {
      error_ = "the oracle failed: " + cmd;
      return;
    }
    oracle_ = json::parse(ReadFile(out));
    auto ckpt = GoldenCheckpoint(dir);
    if (!ckpt.ok()) { error_ = ckpt.status().ToString(); return; }
    EngineOptions o;
    o.checkpoint = *ckpt;
    o.device = kGpu ? "cuda" : "cpu";
    if (kGpu) o.fast.gpu_postprocess = true;
    auto engine = Engine::Create(o);
    if (kGpu && !engine.ok()) {
      skip_ = "no CUDA engine: " + engine.status().ToString();
      return;
    }
    if (!engine.ok()) { error_ = engine.status().ToString(); return; }
    engine_ = std::move(*engine).release();
    auto img = DecodeImage(ReadFile(dir + "/" + oracle_["image"].get<std::string>()));
    if (!img.ok()) { error_ = img.status().ToString(); return; }
    image_ = new ImageRGB8(std::move(*img));
    auto prep = engine_->Prepare(*image_);
    auto enc = prep.ok() ? engine_->Encode({*prep}) : StatusOr<std::vector<std::shared_ptr<const Embedding>>>(prep.status());
    if (!enc.ok()) { error_ = enc.status().ToString(); return; }
    embedding_ = new std::shared_ptr<const Embedding>((*enc)[0]);
  }

  void CheckCase(const std::string& name) {
    if (!skip_.empty()) {
      if (::maskd::testing::RunningInCi() && !kGpu) FAIL() << skip_ << " (required under CI=true)";
      GTEST_SKIP() << "*** " << skip_ << ": SKIPPING generation parity ***";
    }
    ASSERT_TRUE(error_.empty()) << error_;
    const json* c = nullptr;
    for (const auto& cc : oracle_["cases"]) if (cc["name"] == name) c = &cc;
    ASSERT_NE(c, nullptr) << name;
    if (c->contains("skipped")) {
      if (::maskd::testing::RunningInCi()) FAIL() << (*c)["skipped"].get<std::string>();
      GTEST_SKIP() << "*** " << (*c)["skipped"].get<std::string>() << " ***";
    }
    const MaskGenerationParams p = ::maskd::testing::GenerationParamsFromJson((*c)["params"]);
    MaskGenerationInput in;
    in.embedding = *embedding_;
    in.image = image_;
    auto got = GenerateMasks(*engine_, in, p);
    ASSERT_TRUE(got.ok()) << got.status().ToString();
    const auto& want = (*c)["records"];
    const int W = image_->width, H = image_->height;
    std::printf("%s%s: original %zu masks, maskd %zu\n", kGpu ? "[cuda] " : "", name.c_str(), want.size(),
                got->size());
    ASSERT_EQ(got->size(), want.size());
    std::vector<std::vector<uint8_t>> mine;
    for (const auto& g : *got) {
      auto m = RleDecode(g.rle_counts, W, H);
      ASSERT_TRUE(m.ok()) << m.status().ToString();
      mine.push_back(std::move(*m));
    }
    std::vector<char> used(got->size(), 0);
    double worst_iou = 1, worst_pred = 0, worst_stab = 0;
    for (size_t i = 0; i < want.size(); ++i) {
      const auto& w = want[i];
      auto wm = RleDecode(w["counts"].get<std::vector<uint32_t>>(), W, H);
      ASSERT_TRUE(wm.ok());
      int best = -1;
      double best_iou = -1;
      for (size_t j = 0; j < mine.size(); ++j) {
        if (used[j]) continue;
        const double iou = MaskIou(*wm, mine[j]);
        if (iou > best_iou) best_iou = iou, best = static_cast<int>(j);
      }
      ASSERT_GE(best, 0);
      SCOPED_TRACE("original record " + std::to_string(i) + " matched with " + std::to_string(best));
      used[best] = 1;
      EXPECT_EQ(best, static_cast<int>(i)) << "not in the original's order";
      const GeneratedMask& g = (*got)[best];
      worst_iou = std::min(worst_iou, best_iou);
      EXPECT_GE(best_iou, 0.99);
      worst_pred = std::max(worst_pred, std::abs(g.predicted_iou - w["predicted_iou"].get<double>()));
      worst_stab = std::max(worst_stab, std::abs(g.stability_score - w["stability_score"].get<double>()));
      EXPECT_NEAR(g.predicted_iou, w["predicted_iou"].get<double>(), 1e-4);
      EXPECT_NEAR(g.stability_score, w["stability_score"].get<double>(), 2e-3);
      for (int k = 0; k < 4; ++k) {
        EXPECT_NEAR(g.bbox[k], w["bbox"][k].get<int>(), 1) << "bbox[" << k << "]";
        EXPECT_EQ(g.crop_box[k], w["crop_box"][k].get<int>()) << "crop_box[" << k << "]";
      }
      EXPECT_NEAR(g.point_x, w["point"][0].get<double>(), 1e-6);
      EXPECT_NEAR(g.point_y, w["point"][1].get<double>(), 1e-6);
      EXPECT_NEAR(static_cast<double>(g.area), w["area"].get<double>(), 1 + 0.01 * w["area"].get<double>());
    }
    std::printf("%s%s: worst mask IoU %.5f, predicted IoU diff %.2e, stability diff %.2e\n", kGpu ? "[cuda] " : "",
                name.c_str(), worst_iou, worst_pred, worst_stab);
  }

  static inline std::string skip_, error_;
  static inline json oracle_;
  static inline Engine* engine_ = nullptr;
  static inline ImageRGB8* image_ = nullptr;
  static inline std::shared_ptr<const Embedding>* embedding_ = nullptr;
};

#ifndef MASKD_GENERATE_ON_GPU
using GenerateParity = GenerateParityT<false>;
#else
using GenerateParity = GenerateParityT<true>;  // model_generate_gpu_test: the same cases on CUDA
#endif
TEST_F(GenerateParity, DefaultsKeepWhatTheOriginalKeeps) { CheckCase("defaults"); }
TEST_F(GenerateParity, LooseThresholds10PerSide) { CheckCase("loose_10"); }
TEST_F(GenerateParity, EveryFilteredMaskWithoutNms) { CheckCase("no_nms_8"); }
TEST_F(GenerateParity, OffsetBatchAndNms) { CheckCase("offset_batch"); }
TEST_F(GenerateParity, OneCropLayer) { CheckCase("crop_layer_1"); }
TEST_F(GenerateParity, MinMaskRegionArea) { CheckCase("min_region_area"); }
TEST_F(GenerateParity, OneCropLayerWithoutNms) { CheckCase("crop_layer_1_all"); }
TEST_F(GenerateParity, MinMaskRegionAreaWithoutBoxNms) { CheckCase("min_region_area_all"); }

TEST_F(GenerateParity, CropLayersNeedThePixels) {
  if (!skip_.empty()) GTEST_SKIP() << skip_;
  ASSERT_TRUE(error_.empty()) << error_;
  MaskGenerationParams p;
  p.crop_n_layers = 1;
  MaskGenerationInput in;
  in.embedding = *embedding_;
  auto r = GenerateMasks(*engine_, in, p);
  EXPECT_EQ(r.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(r.status().message().find("params.crop_n_layers"), std::string::npos);
}

}  // namespace
}  // namespace maskd
