// GenerateMasks end to end (issue #15) with the real engine: a real maskd (in-process, ephemeral
// loopback ports, gRPC and the HTTP front) serving the golden tiny model ($MASKD_GOLDEN_DIR/tiny-one,
// the model of the generator's parity test) on CPU fp32. Checked:
// - the RPC gives the masks of the engine-side generator (model/api/mask_generator.h: GenerateMasks
//   straight on the server's own engine, which tests/model_generate_test.cc holds to the original
//   SamAutomaticMaskGenerator), case by case, and, when the oracle file of that test is at hand
//   (MASKD_AMG_ORACLE_JSON or BUILD/amg_oracle.json), the original's records too;
// - the output forms (RLE, PNG, polygons) are the same masks; by image_id the cached embedding is used;
// - validation errors over the wire name the field, the value and what was expected;
// - fairness: clicks sent while a big generation runs complete long before it does;
// - a generation whose deadline passes stops at its next point batch (the decoder sees few of its
//   points);
// - POST /v1/generate is the same call.
#include <gtest/gtest.h>

#include <httplib.h>

#include <google/protobuf/util/json_util.h>
#include <nlohmann/json.hpp>
#include <spdlog/spdlog.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <fstream>
#include <future>
#include <sstream>
#include <thread>

#include "client/client.h"
#include "client/mask_codec.h"
#include "model/api/mask_generator.h"
#include "model/golden.h"
#include "model/io/image_codec.h"
#include "model/io/rle.h"
#include "server/server.h"
#include "tests/generation_params_json.h"
#include "tests/golden_dir.h"

namespace maskd::server {
namespace {

using nlohmann::json;
using std::chrono::milliseconds;
using Clock = std::chrono::steady_clock;

std::string ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

// Small grids (the CPU does the model's work, and the mask filtering upscales every candidate to the
// image): the default thresholds on a 4 x 4 grid, and cases of tests/oracle/amg_oracle.py with the
// original's parameter names (loose thresholds: the golden model's random weights score low).
struct GenCase {
  std::string name;
  json params;
};
const std::vector<GenCase>& Cases() {
  static const std::vector<GenCase> cases = {
      // Unset parameters take the original's defaults: nothing passes its thresholds on this model.
      {"defaults_4", {{"points_per_side", 4}}},
      {"no_nms_4",
       {{"pred_iou_thresh", 0.0}, {"points_per_side", 4}, {"stability_score_thresh", 0.03}, {"box_nms_thresh", 1.0}}},
      {"offset_batch",
       {{"pred_iou_thresh", 0.3}, {"stability_score_thresh", 0.05}, {"points_per_side", 6}, {"points_per_batch", 10},
        {"stability_score_offset", 0.5}, {"box_nms_thresh", 0.95}}},
      {"crop_layer_1_all",
       {{"pred_iou_thresh", 0.0}, {"stability_score_thresh", 0.03}, {"points_per_side", 4}, {"crop_n_layers", 1},
        {"box_nms_thresh", 1.0}, {"crop_nms_thresh", 1.0}}},
      {"min_region_area_all",
       {{"pred_iou_thresh", 0.0}, {"stability_score_thresh", 0.03}, {"points_per_side", 6}, {"box_nms_thresh", 1.0},
        {"min_mask_region_area", 2000}}},
  };
  return cases;
}

// The same parameters as the wire's optional fields (only those the case sets).
v1::MaskGenerationParams WireParams(const json& j) {
  v1::MaskGenerationParams p;
  if (j.contains("points_per_side")) p.set_points_per_side(j["points_per_side"]);
  if (j.contains("points_per_batch")) p.set_points_per_batch(j["points_per_batch"]);
  if (j.contains("pred_iou_thresh")) p.set_pred_iou_thresh(j["pred_iou_thresh"].get<float>());
  if (j.contains("stability_score_thresh")) p.set_stability_score_thresh(j["stability_score_thresh"].get<float>());
  if (j.contains("stability_score_offset")) p.set_stability_score_offset(j["stability_score_offset"].get<float>());
  if (j.contains("box_nms_thresh")) p.set_box_nms_thresh(j["box_nms_thresh"].get<float>());
  if (j.contains("crop_n_layers")) p.set_crop_n_layers(j["crop_n_layers"]);
  if (j.contains("crop_nms_thresh")) p.set_crop_nms_thresh(j["crop_nms_thresh"].get<float>());
  if (j.contains("crop_n_points_downscale_factor")) {
    p.set_crop_n_points_downscale_factor(j["crop_n_points_downscale_factor"]);
  }
  if (j.contains("min_mask_region_area")) p.set_min_mask_region_area(j["min_mask_region_area"]);
  return p;
}

double MaskIou(const std::vector<uint8_t>& a, const std::vector<uint8_t>& b) {
  if (a.size() != b.size()) return 0;
  uint64_t inter = 0, uni = 0;
  for (size_t i = 0; i < a.size(); ++i) inter += a[i] && b[i], uni += a[i] || b[i];
  return uni ? static_cast<double>(inter) / static_cast<double>(uni) : 1.0;
}

std::vector<uint8_t> Pixels(const v1::GeneratedMask& g, int w, int h) {
  v1::MaskResult m;
  switch (g.segmentation_case()) {
    case v1::GeneratedMask::kRle: *m.mutable_rle() = g.rle(); break;
    case v1::GeneratedMask::kPng: m.set_png(g.png()); break;
    case v1::GeneratedMask::kPolygons: *m.mutable_polygons() = g.polygons(); break;
    default: break;
  }
  auto mask = client::DecodeMask(m, w, h);
  EXPECT_TRUE(mask.ok()) << mask.status().ToString();
  return mask.ok() ? *mask : std::vector<uint8_t>();
}

// The generator's tolerances of tests/model_generate_test.cc: mask IoU >= 0.99, predicted IoU within
// 1e-4, stability within 2e-3, boxes within 1 px, the same point and crop box, in the same order.
void ExpectSameMasks(const v1::GenerateMasksResponse& got, const std::vector<GeneratedMask>& want,
                     const std::string& what) {
  SCOPED_TRACE(what);
  const int w = static_cast<int>(got.width()), h = static_cast<int>(got.height());
  ASSERT_EQ(got.masks_size(), static_cast<int>(want.size()));
  double worst = 1;
  for (size_t i = 0; i < want.size(); ++i) {
    SCOPED_TRACE("mask " + std::to_string(i));
    const v1::GeneratedMask& g = got.masks(static_cast<int>(i));
    const GeneratedMask& e = want[i];
    auto ref = RleDecode(e.rle_counts, w, h);
    ASSERT_TRUE(ref.ok());
    const double iou = MaskIou(Pixels(g, w, h), *ref);
    worst = std::min(worst, iou);
    EXPECT_GE(iou, 0.99);
    EXPECT_NEAR(g.predicted_iou(), e.predicted_iou, 1e-4);
    EXPECT_NEAR(g.stability_score(), e.stability_score, 2e-3);
    EXPECT_NEAR(static_cast<double>(g.area()), static_cast<double>(e.area), 1 + 0.01 * static_cast<double>(e.area));
    const int bbox[4] = {static_cast<int>(g.bbox().x()), static_cast<int>(g.bbox().y()),
                         static_cast<int>(g.bbox().width()), static_cast<int>(g.bbox().height())};
    const int crop[4] = {static_cast<int>(g.crop_box().x()), static_cast<int>(g.crop_box().y()),
                         static_cast<int>(g.crop_box().width()), static_cast<int>(g.crop_box().height())};
    for (int k = 0; k < 4; ++k) {
      EXPECT_NEAR(bbox[k], e.bbox[k], 1) << "bbox[" << k << "]";
      EXPECT_EQ(crop[k], e.crop_box[k]) << "crop_box[" << k << "]";
    }
    ASSERT_EQ(g.point_coords_size(), 1);
    EXPECT_NEAR(g.point_coords(0).x(), e.point_x, 1e-6);
    EXPECT_NEAR(g.point_coords(0).y(), e.point_y, 1e-6);
  }
  const v1::CallTiming& t = got.timing();
  std::printf("%s: %d masks, worst mask IoU %.5f; server %.0f ms (decoder %.0f + %.0f ms queued, rest %.0f ms)\n",
              what.c_str(), got.masks_size(), worst, t.total_us() / 1e3, t.decoder_compute_us() / 1e3,
              t.decoder_queue_us() / 1e3, t.postprocess_us() / 1e3);
  std::fflush(stdout);
}

class ServerGenerate : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    spdlog::set_level(spdlog::level::err);
    dir_ = ::maskd::testing::GoldenRoot() + "/tiny-one";
    if (!::maskd::testing::IsDir(dir_)) return;
    const json manifest = json::parse(ReadFile(dir_ + "/manifest.json"));
    png_ = ReadFile(dir_ + "/" + manifest["images"][0]["png"].get<std::string>());
    auto image = DecodeImage(png_);
    if (!image.ok()) {
      load_error_ = image.status().ToString();
      return;
    }
    image_ = new ImageRGB8(std::move(*image));
    auto ckpt = GoldenCheckpoint(dir_);
    if (!ckpt.ok()) {
      load_error_ = ckpt.status().ToString();
      return;
    }
    ServerConfig c;
    c.checkpoint = *ckpt;
    c.device = "cpu";
    c.listen = "127.0.0.1:0";
    c.http_listen = "127.0.0.1:0";
    c.decoder_queue_delay_us = 1000;
    // Small parts, so that a generation's batch of points_per_batch (64 by default) is split into 8
    // parts taking turns with other prompts in the decoder batches (the fairness bound under test).
    c.decoder_request_prompts = 8;
    c.decode_threads = 2;
    c.postprocess_threads = 2;
    server_ = new MaskServer(c, &Engine::Create, 0);
    if (Status s = server_->Start(); !s.ok()) {
      load_error_ = s.ToString();
      return;
    }
    client::ClientOptions co;
    co.target = "127.0.0.1:" + std::to_string(server_->port());
    co.timeout = milliseconds(300000);
    client_ = new client::Client(co);
    // The engine-side reference runs on the server's own engine, on the embedding of the same pixels.
    Engine& engine = server_->workers()[0]->engine();
    auto prep = engine.Prepare(*image_);
    auto enc = prep.ok() ? engine.Encode({*prep}) : StatusOr<std::vector<std::shared_ptr<const Embedding>>>(prep.status());
    if (!enc.ok()) {
      load_error_ = enc.status().ToString();
      return;
    }
    embedding_ = new std::shared_ptr<const Embedding>((*enc)[0]);
  }
  static void TearDownTestSuite() {
    delete client_;
    client_ = nullptr;
    delete embedding_;
    embedding_ = nullptr;
    if (server_) server_->Shutdown();
    delete server_;
    server_ = nullptr;
    delete image_;
    image_ = nullptr;
  }
  void SetUp() override {
    MASKD_REQUIRE_GOLDEN(dir, "tiny-one");
    ASSERT_TRUE(load_error_.empty()) << load_error_;
    ASSERT_NE(client_, nullptr);
  }

  static std::vector<GeneratedMask> EngineSide(const MaskGenerationParams& p) {
    MaskGenerationInput in;
    in.embedding = *embedding_;
    in.image = image_;
    auto r = GenerateMasks(server_->workers()[0]->engine(), in, p);
    EXPECT_TRUE(r.ok()) << r.status().ToString();
    return r.ok() ? *r : std::vector<GeneratedMask>();
  }

  static v1::GenerateMasksRequest ByBytes(const json& params) {
    v1::GenerateMasksRequest r;
    r.mutable_image()->set_encoded(png_);
    *r.mutable_params() = WireParams(params);
    return r;
  }

  static std::string ImageId() {
    v1::EmbedRequest e;
    e.mutable_image()->set_encoded(png_);
    auto r = client_->Embed(e);
    EXPECT_TRUE(r.ok()) << r.status().ToString();
    return r.ok() ? r->image_id() : std::string();
  }

  static uint64_t DecoderItems() {
    auto info = client_->GetInfo();
    EXPECT_TRUE(info.ok());
    return info.ok() ? info->decoder_queue().items() : 0;
  }

  static inline std::string dir_, load_error_, png_;
  static inline ImageRGB8* image_ = nullptr;
  static inline MaskServer* server_ = nullptr;
  static inline client::Client* client_ = nullptr;
  static inline std::shared_ptr<const Embedding>* embedding_ = nullptr;
};

// The original generator's records for a case, from the oracle file of model_generate_test when it is
// at hand (MASKD_AMG_ORACLE_JSON or BUILD/amg_oracle.json); null otherwise.
const json* OracleCase(const std::string& name) {
  static const json oracle = [] {
    const char* given = std::getenv("MASKD_AMG_ORACLE_JSON");
    const std::string path = given && *given ? given : std::string(MASKD_BINARY_DIR) + "/amg_oracle.json";
    std::ifstream f(path);
    return f ? json::parse(ReadFile(path), nullptr, /*allow_exceptions=*/false) : json();
  }();
  if (!oracle.is_object() || !oracle.contains("cases")) return nullptr;
  for (const auto& c : oracle["cases"])
    if (c["name"] == name && !c.contains("skipped")) return &c;
  return nullptr;
}

TEST_F(ServerGenerate, RpcGivesTheEngineSideGeneratorsMasks) {
  int against_original = 0;
  for (const GenCase& c : Cases()) {
    auto r = client_->GenerateMasks(ByBytes(c.params));
    ASSERT_TRUE(r.ok()) << c.name << ": " << r.status().ToString();
    EXPECT_EQ(r->width(), static_cast<uint32_t>(image_->width));
    EXPECT_EQ(r->height(), static_cast<uint32_t>(image_->height));
    const MaskGenerationParams p = ::maskd::testing::GenerationParamsFromJson(c.params);
    const int crops = p.crop_n_layers == 0 ? 1 : 5;
    EXPECT_EQ(r->stats().crops(), static_cast<uint32_t>(crops)) << c.name;
    const std::vector<NormalizedPoint> grid = BuildPointGrid(p.points_per_side);
    EXPECT_EQ(r->stats().points(), static_cast<uint32_t>(grid.size() * (crops == 1 ? 1 : 5))) << c.name;
    ExpectSameMasks(*r, EngineSide(p), c.name);
    if (c.name == "defaults_4") EXPECT_EQ(r->masks_size(), 0);  // random weights: nothing is that good
    if (c.name == "no_nms_4") EXPECT_GT(r->masks_size(), 1);
    // And, where the oracle file has the case, the original's own records.
    if (const json* want = OracleCase(c.name)) {
      ASSERT_EQ((*want)["params"], c.params) << c.name << ": the oracle ran other parameters";
      const auto& records = (*want)["records"];
      ASSERT_EQ(r->masks_size(), static_cast<int>(records.size())) << c.name;
      const int w = static_cast<int>(r->width()), h = static_cast<int>(r->height());
      for (int i = 0; i < r->masks_size(); ++i) {
        auto ref = RleDecode(records[i]["counts"].get<std::vector<uint32_t>>(), w, h);
        ASSERT_TRUE(ref.ok());
        EXPECT_GE(MaskIou(Pixels(r->masks(i), w, h), *ref), 0.99) << c.name << " mask " << i;
        EXPECT_NEAR(r->masks(i).predicted_iou(), records[i]["predicted_iou"].get<double>(), 1e-4);
      }
      ++against_original;
    }
  }
  std::printf("%d cases also compared with the original generator's records (the oracle file of "
              "model_generate_test)\n", against_original);
}

TEST_F(ServerGenerate, PngAndPolygonsAreTheSameMasks) {
  const json params = Cases()[1].params;  // no_nms_4: many masks
  auto rle = client_->GenerateMasks(ByBytes(params));
  ASSERT_TRUE(rle.ok()) << rle.status().ToString();
  ASSERT_GT(rle->masks_size(), 3);
  const int w = static_cast<int>(rle->width()), h = static_cast<int>(rle->height());
  for (v1::OutputFormat f : {v1::OUTPUT_FORMAT_PNG, v1::OUTPUT_FORMAT_POLYGONS}) {
    v1::GenerateMasksRequest req = ByBytes(params);
    req.set_output_format(f);
    auto other = client_->GenerateMasks(req);
    ASSERT_TRUE(other.ok()) << other.status().ToString();
    ASSERT_EQ(other->masks_size(), rle->masks_size());
    for (int i = 0; i < rle->masks_size(); ++i) {
      const auto& m = other->masks(i);
      EXPECT_EQ(m.segmentation_case(),
                f == v1::OUTPUT_FORMAT_PNG ? v1::GeneratedMask::kPng : v1::GeneratedMask::kPolygons);
      // Polygons at tolerance 0 rasterise back to exactly the mask.
      EXPECT_EQ(Pixels(m, w, h), Pixels(rle->masks(i), w, h)) << v1::OutputFormat_Name(f) << " mask " << i;
      EXPECT_EQ(m.area(), rle->masks(i).area());
    }
  }
}

TEST_F(ServerGenerate, ByImageIdUsesTheCachedEmbedding) {
  const std::string id = ImageId();
  const json params = Cases()[1].params;  // no_nms_4
  v1::GenerateMasksRequest req;
  req.set_image_id(id);
  *req.mutable_params() = WireParams(params);
  req.set_request_tag("by-id");
  auto r = client_->GenerateMasks(req);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_TRUE(r->cached());
  EXPECT_EQ(r->image_id(), id);
  EXPECT_EQ(r->request_tag(), "by-id");
  EXPECT_EQ(r->timing().encoder_compute_us(), 0u);
  EXPECT_GT(r->timing().decoder_compute_us(), 0u);
  const std::vector<GeneratedMask> reference = EngineSide(::maskd::testing::GenerationParamsFromJson(params));
  ExpectSameMasks(*r, reference, "by image_id");
  // Explicit point grids: the 4 x 4 grid written out gives the same masks.
  v1::GenerateMasksRequest grid = req;
  grid.mutable_params()->clear_points_per_side();
  v1::PointGrid* g = grid.mutable_params()->add_point_grids();
  for (const NormalizedPoint& p : BuildPointGrid(4)) {
    v1::PointXY* q = g->add_points();
    q->set_x(p.x);
    q->set_y(p.y);
  }
  auto by_grid = client_->GenerateMasks(grid);
  ASSERT_TRUE(by_grid.ok()) << by_grid.status().ToString();
  ExpectSameMasks(*by_grid, reference, "explicit point_grids");
  // Crop layers need the pixels, which the cache does not keep.
  v1::GenerateMasksRequest crops = req;
  crops.mutable_params()->set_crop_n_layers(1);
  auto refused = client_->GenerateMasks(crops);
  EXPECT_EQ(refused.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(refused.status().message().find("params.crop_n_layers = 1"), std::string::npos)
      << refused.status().message();
}

TEST_F(ServerGenerate, ValidationErrorsNameTheFieldOverTheWire) {
  const std::string id = ImageId();
  struct Bad {
    std::function<void(v1::GenerateMasksRequest*)> edit;
    std::string mention;
  };
  const std::vector<Bad> bad = {
      {[](auto* r) { r->mutable_params()->set_points_per_side(0); }, "params.points_per_side = 0 must be in [1, 128]"},
      {[](auto* r) { r->mutable_params()->set_points_per_batch(5000); }, "params.points_per_batch = 5000"},
      {[](auto* r) { r->mutable_params()->set_pred_iou_thresh(1.5f); }, "params.pred_iou_thresh = 1.5"},
      {[](auto* r) { r->mutable_params()->set_crop_n_layers(4); }, "params.crop_n_layers = 4 must be in [0, 3]"},
      {[](auto* r) { r->mutable_params()->set_min_mask_region_area(-2); }, "params.min_mask_region_area = -2"},
      {[](auto* r) { r->set_output_format(v1::OUTPUT_FORMAT_LOW_RES_LOGITS); }, "output_format = 3"},
      {[](auto* r) { r->set_polygon_tolerance(-1); }, "polygon_tolerance"},
      {[](auto* r) { r->set_image_id("nope"); }, "image_id = \"nope\""},
  };
  for (const Bad& b : bad) {
    v1::GenerateMasksRequest r;
    r.set_image_id(id);
    b.edit(&r);
    auto out = client_->GenerateMasks(r);
    EXPECT_EQ(out.status().code(), StatusCode::kInvalidArgument) << b.mention << ": " << out.status().ToString();
    EXPECT_NE(out.status().message().find(b.mention), std::string::npos) << out.status().message();
  }
  v1::GenerateMasksRequest unknown;
  unknown.set_image_id(std::string(64, 'a'));
  EXPECT_EQ(client_->GenerateMasks(unknown).status().code(), StatusCode::kNotFound);
}

// One generation of 8 x 8 points (one batch of 64, split into 8 parts of --decoder-request-prompts 8)
// while a client clicks on the same image: clicks complete while the generation is still running,
// each far faster than the generation (a click waits for at most one part ahead of it).
TEST_F(ServerGenerate, ClicksCompleteWhileAGenerationRuns) {
  const std::string id = ImageId();
  v1::GenerateMasksRequest big;
  big.set_image_id(id);
  big.mutable_params()->set_points_per_side(8);
  std::atomic<bool> generation_done{false};
  const Clock::time_point start = Clock::now();
  auto generation = std::async(std::launch::async, [&] {
    auto r = client_->GenerateMasks(big);
    generation_done = true;
    return std::make_pair(r.status(), std::chrono::duration<double>(Clock::now() - start).count());
  });
  // Clicks from the moment the generation has started to use the decoder.
  const uint64_t items0 = DecoderItems();
  while (!generation_done && DecoderItems() == items0) std::this_thread::sleep_for(milliseconds(5));
  int during = 0;
  double worst_click = 0;
  for (int i = 0; !generation_done && i < 200; ++i) {
    v1::SegmentRequest click;
    click.set_image_id(id);
    v1::Point* pt = click.add_prompts()->add_points();
    pt->set_x(static_cast<float>(50 + 5 * (i % 100)));
    pt->set_y(static_cast<float>(40 + 3 * (i % 100)));
    pt->set_label(v1::POINT_LABEL_FOREGROUND);
    const Clock::time_point t0 = Clock::now();
    auto r = client_->Segment(click);
    const double s = std::chrono::duration<double>(Clock::now() - t0).count();
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    if (!generation_done) {
      ++during;
      worst_click = std::max(worst_click, s);
    }
  }
  const auto [status, generation_s] = generation.get();
  ASSERT_TRUE(status.ok()) << status.ToString();
  std::printf("generation of 64 points: %.3f s; %d clicks completed during it, slowest %.3f s\n",
              generation_s, during, worst_click);
  EXPECT_GE(during, 3) << "clicks waited for the generation";
  EXPECT_LT(worst_click, generation_s / 3) << "a click waited for most of the generation";
}

// A deadline that passes mid-generation: DEADLINE_EXCEEDED, and the parts after it are never decoded
// (the batcher drops them, the generator stops before its next batch).
TEST_F(ServerGenerate, ExpiredGenerationStopsAtItsNextBatch) {
  const std::string id = ImageId();
  v1::GenerateMasksRequest big;
  big.set_image_id(id);
  big.mutable_params()->set_points_per_side(64);  // 4096 points in 64 batches
  const uint64_t before = DecoderItems();
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + milliseconds(400));
  v1::GenerateMasksResponse resp;
  const grpc::Status s = client_->stub().GenerateMasks(&ctx, big, &resp);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::DEADLINE_EXCEEDED) << s.error_message();
  // The server notices at its next batch; give it time to stop, then count what the decoder ran.
  uint64_t after = DecoderItems();
  for (int i = 0; i < 100; ++i) {
    std::this_thread::sleep_for(milliseconds(100));
    const uint64_t now = DecoderItems();
    if (now == after) break;
    after = now;
  }
  std::printf("a generation of 4096 points, expired after 400 ms: %llu points decoded\n",
              static_cast<unsigned long long>(after - before));
  EXPECT_LT(after - before, 4096u / 2);
  // And the server still serves.
  v1::GenerateMasksRequest small;
  small.set_image_id(id);
  small.mutable_params()->set_points_per_side(4);
  EXPECT_TRUE(client_->GenerateMasks(small).ok());
}

TEST_F(ServerGenerate, HttpRouteIsTheSameCall) {
  const std::string id = ImageId();
  const json params = Cases()[1].params;  // no_nms_4
  v1::GenerateMasksRequest req;
  req.set_image_id(id);
  *req.mutable_params() = WireParams(params);
  req.set_output_format(v1::OUTPUT_FORMAT_POLYGONS);
  std::string body;
  ASSERT_TRUE(google::protobuf::util::MessageToJsonString(req, &body).ok());
  httplib::Client http("127.0.0.1", server_->http_port());
  http.set_read_timeout(300, 0);
  auto res = http.Post("/v1/generate", body, "application/json");
  ASSERT_TRUE(res);
  ASSERT_EQ(res->status, 200) << res->body;
  v1::GenerateMasksResponse via_http;
  ASSERT_TRUE(google::protobuf::util::JsonStringToMessage(res->body, &via_http).ok()) << res->body.substr(0, 400);
  EXPECT_EQ(via_http.image_id(), id);
  ExpectSameMasks(via_http, EngineSide(::maskd::testing::GenerationParamsFromJson(params)), "POST /v1/generate");
  // Errors are the gRPC errors, as JSON.
  auto bad = http.Post("/v1/generate", "{\"image_id\": \"" + id + "\", \"params\": {\"points_per_side\": 0}}",
                       "application/json");
  ASSERT_TRUE(bad);
  EXPECT_EQ(bad->status, 400);
  EXPECT_NE(bad->body.find("params.points_per_side = 0"), std::string::npos) << bad->body;
  auto get = http.Get("/v1/generate");
  ASSERT_TRUE(get);
  EXPECT_EQ(get->status, 405);
  // GetInfo reports the generation limits.
  auto info = client_->GetInfo();
  ASSERT_TRUE(info.ok());
  EXPECT_EQ(info->limits().generation().max_points_per_side(), 128u);
  EXPECT_EQ(info->limits().generation().max_grid_points(), 16384u);
}

}  // namespace
}  // namespace maskd::server
