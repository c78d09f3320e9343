// The whole server in-process on an ephemeral loopback port, over real gRPC, with fake engines whose
// latency and failures the tests control: health transitions, every RPC, routing and cache affinity
// across two simulated devices, single flight, queue limits, deadlines, tiers, streams, shutdown.
#include <gtest/gtest.h>

#include <future>
#include <limits>
#include <thread>

#include <grpcpp/generic/generic_stub.h>
#include <spdlog/spdlog.h>

#include "client/client.h"
#include "model/io/image_codec.h"
#include "model/io/rle.h"
#include "model/io/image_id.h"
#include "model/io/polygon.h"
#include "server/server.h"
#include "tests/fake_engine.h"
#include "tests/scoped_env.h"
#include "tests/server_fixture.h"

namespace maskd::server {
namespace {

using client::Client;
using client::ClientOptions;
using client::ServingStatus;
using fake::FakeEngine;
using fake::FakeEngineOptions;
using std::chrono::milliseconds;

ImageRGB8 Picture(int w, int h, int seed) {
  ImageRGB8 im{w, h, std::vector<uint8_t>(static_cast<size_t>(w) * h * 3)};
  for (size_t i = 0; i < im.pixels.size(); ++i) im.pixels[i] = static_cast<uint8_t>((i * 7 + seed * 31) & 0xff);
  return im;
}

v1::Image Encoded(int w, int h, int seed) {
  v1::Image out;
  out.set_encoded(*EncodePngRgb(Picture(w, h, seed)));
  return out;
}

v1::Prompt Click(float x, float y, bool multimask = false, bool foreground = true) {
  v1::Prompt p;
  auto* pt = p.add_points();
  pt->set_x(x);
  pt->set_y(y);
  pt->set_label(foreground ? v1::POINT_LABEL_FOREGROUND : v1::POINT_LABEL_BACKGROUND);
  p.set_multimask(multimask);
  return p;
}

v1::SegmentRequest ById(const std::string& id, std::vector<v1::Prompt> prompts,
                        v1::OutputFormat f = v1::OUTPUT_FORMAT_COCO_RLE) {
  v1::SegmentRequest r;
  r.set_image_id(id);
  for (auto& p : prompts) *r.add_prompts() = p;
  r.set_output_format(f);
  return r;
}

v1::SegmentRequest ByImage(const v1::Image& image, std::vector<v1::Prompt> prompts) {
  v1::SegmentRequest r;
  *r.mutable_image() = image;
  for (auto& p : prompts) *r.add_prompts() = p;
  return r;
}

std::vector<uint8_t> DecodeRle(const v1::MaskResult& m) {
  auto counts = RleCountsFromString(m.rle().counts());
  EXPECT_TRUE(counts.ok());
  auto mask = RleDecode(*counts, m.rle().size(1), m.rle().size(0));
  EXPECT_TRUE(mask.ok());
  return *mask;
}

// A server with `devices` fake engines.
class MaskdOnFakeEngines {
 public:
  struct Options {
    int devices = 1;
    bool cuda = false;  // fake GPUs (host tier on) instead of CPU engines
    FakeEngineOptions engine;
    std::function<void(ServerConfig&)> configure;
    bool start_loading = true;
    std::function<void()> before_engine;  // runs in the engine factory (to hold loading)
  };

  explicit MaskdOnFakeEngines(Options o) : o_(std::move(o)) {
    spdlog::set_level(spdlog::level::err);
    ServerConfig c = TestConfig(/*threads=*/2, /*shutdown_grace_s=*/5);
    std::string devices;
    for (int i = 0; i < o_.devices; ++i) {
      devices += (i ? "," : "") + std::string(o_.cuda ? "cuda:" : "cpu:") + std::to_string(i);
    }
    c.device = devices;
    if (o_.configure) o_.configure(c);
    auto factory = [this](const EngineOptions& eo) -> StatusOr<std::unique_ptr<Engine>> {
      if (o_.before_engine) o_.before_engine();
      FakeEngineOptions fo = o_.engine;
      fo.device = eo.device;
      auto e = std::make_unique<FakeEngine>(fo);
      std::lock_guard<std::mutex> lock(mu_);
      engines_.push_back(e.get());
      return std::unique_ptr<Engine>(std::move(e));
    };
    server_ = std::make_unique<MaskServer>(c, factory, o_.cuda ? o_.devices : 0);
    Status s = server_->StartListening();
    EXPECT_TRUE(s.ok()) << s.ToString();
    ClientOptions co;
    co.target = "127.0.0.1:" + std::to_string(server_->port());
    co.timeout = milliseconds(20000);
    client_ = std::make_unique<Client>(co);
    if (o_.start_loading) {
      Status l = server_->LoadAndServe();
      EXPECT_TRUE(l.ok()) << l.ToString();
    }
  }
  ~MaskdOnFakeEngines() {
    for (FakeEngine* e : engines()) {
      e->ReleaseEncodes();
      e->ReleasePrepares();
    }
    server_->Shutdown();
  }

  MaskServer& server() { return *server_; }
  Client& client() { return *client_; }
  v1::MaskService::Stub& stub() { return client_->stub(); }
  std::vector<FakeEngine*> engines() {
    std::lock_guard<std::mutex> lock(mu_);
    return engines_;
  }
  // The engine of worker i (workers keep the device order).
  FakeEngine* engine(int i) { return static_cast<FakeEngine*>(&server_->workers()[i]->engine()); }
  std::string identity() const { return o_.engine.identity; }

  StatusOr<v1::EmbedResponse> Embed(const v1::Image& image) {
    v1::EmbedRequest r;
    *r.mutable_image() = image;
    return client_->Embed(r);
  }
  StatusOr<v1::SegmentResponse> Segment(const v1::SegmentRequest& r) { return client_->Segment(r); }
  v1::GetInfoResponse Info() {
    auto i = client_->GetInfo();
    EXPECT_TRUE(i.ok()) << i.status().ToString();
    return i.ok() ? *i : v1::GetInfoResponse();
  }
  // Calls with an explicit deadline through the raw stub.
  grpc::Status EmbedWithDeadline(const v1::Image& image, milliseconds timeout, v1::EmbedResponse* out) {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + timeout);
    v1::EmbedRequest r;
    *r.mutable_image() = image;
    return stub().Embed(&ctx, r, out);
  }
  grpc::Status SegmentWithDeadline(const v1::SegmentRequest& r, milliseconds timeout, v1::SegmentResponse* out) {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + timeout);
    return stub().Segment(&ctx, r, out);
  }

 private:
  Options o_;
  std::unique_ptr<MaskServer> server_;
  std::unique_ptr<Client> client_;
  std::mutex mu_;
  std::vector<FakeEngine*> engines_;
};

bool WaitFor(const std::function<bool()>& cond, milliseconds timeout = milliseconds(10000)) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (!cond()) {
    if (std::chrono::steady_clock::now() > deadline) return false;
    std::this_thread::sleep_for(milliseconds(2));
  }
  return true;
}

TEST(ServerService, HealthIsNotServingUntilLoadedAndDuringShutdown) {
  std::promise<void> release;
  std::shared_future<void> released = release.get_future().share();
  MaskdOnFakeEngines::Options o;
  o.start_loading = false;
  o.before_engine = [released] { released.wait(); };
  MaskdOnFakeEngines m(o);
  // Listening, model not loaded: health answers NOT_SERVING, the service UNAVAILABLE.
  EXPECT_EQ(*m.client().Health(""), ServingStatus::kNotServing);
  EXPECT_EQ(*m.client().Health("maskd.v1.MaskService"), ServingStatus::kNotServing);
  auto early = m.Embed(Encoded(8, 8, 1));
  EXPECT_EQ(early.status().code(), StatusCode::kUnavailable);
  EXPECT_NE(early.status().message().find("still loading the model"), std::string::npos);

  std::thread loader([&] { EXPECT_TRUE(m.server().LoadAndServe().ok()); });
  std::this_thread::sleep_for(milliseconds(50));
  EXPECT_EQ(*m.client().Health(), ServingStatus::kNotServing);  // still loading
  release.set_value();
  loader.join();
  EXPECT_EQ(*m.client().Health(""), ServingStatus::kServing);
  EXPECT_EQ(*m.client().Health("maskd.v1.MaskService"), ServingStatus::kServing);

  // Shutdown with a call in flight: NOT_SERVING, new calls refused, the in-flight one finishes.
  m.engine(0)->HoldEncodes();
  auto in_flight = std::async(std::launch::async, [&] { return m.Embed(Encoded(16, 16, 2)); });
  ASSERT_TRUE(m.engine(0)->WaitForEncodeCalls(1, milliseconds(5000)));
  std::thread stopper([&] { m.server().Shutdown(); });
  ASSERT_TRUE(WaitFor([&] { return *m.client().Health() == ServingStatus::kNotServing; }));
  auto refused = m.Embed(Encoded(8, 8, 3));
  EXPECT_EQ(refused.status().code(), StatusCode::kUnavailable);
  EXPECT_NE(refused.status().message().find("shutting down"), std::string::npos);
  m.engine(0)->ReleaseEncodes();
  auto finished = in_flight.get();
  EXPECT_TRUE(finished.ok()) << finished.status().ToString();
  stopper.join();
}

// Cold start on the fake engine (which reports no engine phases: they are reached when its factory
// returns). A failed Segment is not the first mask; a successful one is, once.
TEST(ServerService, StartupMilestonesAreOrderedAndTheFirstMaskIsTheFirstSuccess) {
  MaskdOnFakeEngines m(MaskdOnFakeEngines::Options{});
  const v1::StartupTimes before = m.Info().startup();
  EXPECT_EQ(before.main_ms(), 0);  // not maskd's main()
  EXPECT_GT(before.listening_ms(), 0);
  EXPECT_LE(before.listening_ms(), before.checkpoint_read_ms());
  EXPECT_LE(before.checkpoint_read_ms(), before.weights_ready_ms());
  EXPECT_LE(before.weights_ready_ms(), before.warmed_up_ms());
  EXPECT_LE(before.warmed_up_ms(), before.serving_ms());
  EXPECT_EQ(before.first_mask_ms(), 0);
  EXPECT_EQ(m.Segment(ById(std::string(64, 'a'), {Click(1, 1)})).status().code(), StatusCode::kNotFound);
  EXPECT_EQ(m.Info().startup().first_mask_ms(), 0) << "a failed Segment is not a mask served";
  ASSERT_TRUE(m.Segment(ByImage(Encoded(32, 24, 1), {Click(3, 3)})).ok());
  const v1::StartupTimes after = m.Info().startup();
  EXPECT_GE(after.first_mask_ms(), after.serving_ms());
  EXPECT_EQ(after.serving_ms(), before.serving_ms());
  ASSERT_TRUE(m.Segment(ByImage(Encoded(32, 24, 2), {Click(3, 3)})).ok());
  EXPECT_EQ(m.Info().startup().first_mask_ms(), after.first_mask_ms());
}

TEST(ServerService, EmbedThenSegmentByImageId) {
  MaskdOnFakeEngines m({});
  const v1::Image image = Encoded(64, 48, 1);
  auto e = m.Embed(image);
  ASSERT_TRUE(e.ok()) << e.status().ToString();
  EXPECT_EQ(e->image_id(), ImageIdForEncoded(m.identity(), image.encoded()));
  EXPECT_EQ(e->width(), 64u);
  EXPECT_EQ(e->height(), 48u);
  EXPECT_FALSE(e->cached());
  auto again = m.Embed(image);
  ASSERT_TRUE(again.ok());
  EXPECT_TRUE(again->cached());
  EXPECT_EQ(again->timing().encoder_compute_us(), 0u);
  EXPECT_EQ(m.engine(0)->encoded_images.load(), 1);

  auto s = m.Segment(ById(e->image_id(), {Click(10, 20, true), Click(30, 5)}));
  ASSERT_TRUE(s.ok()) << s.status().ToString();
  EXPECT_TRUE(s->cached());
  EXPECT_EQ(s->image_id(), e->image_id());
  ASSERT_EQ(s->results_size(), 2);
  EXPECT_EQ(s->results(0).masks_size(), 3);
  EXPECT_EQ(s->results(1).masks_size(), 1);
  for (const auto& r : s->results()) {
    EXPECT_FALSE(r.result_id().empty());
    uint32_t best = 0;
    for (int i = 0; i < r.masks_size(); ++i) {
      if (r.masks(i).score() > r.masks(best).score()) best = i;
    }
    EXPECT_EQ(r.best_index(), best);
    for (const auto& mk : r.masks()) {
      ASSERT_TRUE(mk.has_rle());
      EXPECT_EQ(mk.rle().size(0), 48u);
      EXPECT_EQ(mk.rle().size(1), 64u);
      const auto mask = DecodeRle(mk);
      uint64_t area = 0;
      for (auto v : mask) area += v;
      EXPECT_EQ(area, mk.area());
      EXPECT_GT(mk.area(), 0u);
    }
  }
  EXPECT_NE(s->results(0).result_id(), s->results(1).result_id());
  EXPECT_GT(s->timing().total_us(), 0u);
  EXPECT_EQ(s->timing().decode_us(), 0u);  // by image_id: nothing decoded
}

TEST(ServerService, RequestIdGoesBackToTheClientInInitialMetadata) {
  MaskdOnFakeEngines m({});
  auto returned = [](const grpc::ClientContext& ctx) {
    const auto& md = ctx.GetServerInitialMetadata();
    auto it = md.find("x-request-id");
    return it == md.end() ? std::string("<none>") : std::string(it->second.data(), it->second.size());
  };
  {
    grpc::ClientContext ctx;
    ctx.AddMetadata("x-request-id", "annotator-7-click-42");
    v1::EmbedRequest r;
    *r.mutable_image() = Encoded(32, 24, 3);
    v1::EmbedResponse out;
    ASSERT_TRUE(m.stub().Embed(&ctx, r, &out).ok());
    EXPECT_EQ(returned(ctx), "annotator-7-click-42");
  }
  {
    // No id sent: the generated one comes back, and an error carries it too.
    grpc::ClientContext ctx;
    v1::SegmentRequest r;
    r.set_image_id("no-such-image");
    v1::SegmentResponse out;
    EXPECT_FALSE(m.stub().Segment(&ctx, r, &out).ok());
    const std::string id = returned(ctx);
    EXPECT_NE(id, "<none>");
    EXPECT_FALSE(id.empty());
  }
  {
    // A value that cannot be logged safely is replaced by a generated id, not echoed.
    grpc::ClientContext ctx;
    ctx.AddMetadata("x-request-id", std::string(65, 'a'));
    v1::GetInfoRequest r;
    v1::GetInfoResponse out;
    ASSERT_TRUE(m.stub().GetInfo(&ctx, r, &out).ok());
    EXPECT_NE(returned(ctx), std::string(65, 'a'));
    EXPECT_NE(returned(ctx), "<none>");
  }
  {
    grpc::ClientContext ctx;
    ctx.AddMetadata("x-request-id", "stream-1");
    auto rw = m.stub().SegmentStream(&ctx);
    rw->WritesDone();
    EXPECT_TRUE(rw->Finish().ok());
    EXPECT_EQ(returned(ctx), "stream-1");
  }
}

TEST(ServerService, OutputFormatsDescribeTheSameMask) {
  MaskdOnFakeEngines m({});
  auto e = m.Embed(Encoded(50, 30, 4));
  ASSERT_TRUE(e.ok());
  const auto prompt = Click(25, 15, true);
  auto rle = m.Segment(ById(e->image_id(), {prompt}, v1::OUTPUT_FORMAT_UNSPECIFIED));
  auto png = m.Segment(ById(e->image_id(), {prompt}, v1::OUTPUT_FORMAT_PNG));
  auto low = m.Segment(ById(e->image_id(), {prompt}, v1::OUTPUT_FORMAT_LOW_RES_LOGITS));
  ASSERT_TRUE(rle.ok() && png.ok() && low.ok());
  for (int k = 0; k < 3; ++k) {
    const auto& r = rle->results(0).masks(k);
    const auto& p = png->results(0).masks(k);
    const auto& l = low->results(0).masks(k);
    ASSERT_TRUE(r.has_rle());  // unspecified = COCO RLE
    ASSERT_FALSE(p.png().empty());
    auto grey = DecodePngGray(p.png());
    ASSERT_TRUE(grey.ok());
    ASSERT_EQ(grey->width, 50);
    const auto from_rle = DecodeRle(r);
    for (size_t i = 0; i < from_rle.size(); ++i) ASSERT_EQ(grey->pixels[i] != 0, from_rle[i] != 0) << i;
    ASSERT_TRUE(l.has_low_res_logits());
    EXPECT_EQ(l.low_res_logits().width(), 256u);
    EXPECT_EQ(l.low_res_logits().values_size(), 256 * 256);
    // The statistics describe the thresholded full-size mask in every format.
    EXPECT_EQ(r.area(), p.area());
    EXPECT_EQ(r.area(), l.area());
    EXPECT_EQ(r.bbox().width(), l.bbox().width());
    EXPECT_FLOAT_EQ(r.score(), l.score());
    EXPECT_FLOAT_EQ(r.stability_score(), p.stability_score());
  }
}

// Issue #15: OUTPUT_FORMAT_POLYGONS over real gRPC. At tolerance 0 the polygons rasterise back to
// exactly the RLE mask; a tolerance gives fewer vertices and still nearly the same mask; the
// statistics are those of the mask in every format; a bad tolerance is INVALID_ARGUMENT.
TEST(ServerService, PolygonsRasteriseBackToTheMask) {
  MaskdOnFakeEngines m({});
  auto e = m.Embed(Encoded(80, 60, 6));
  ASSERT_TRUE(e.ok());
  // A click near the border: the fake engine's discs are cut by the image edge.
  const auto prompt = Click(75, 5, true);
  auto rle = m.Segment(ById(e->image_id(), {prompt}));
  auto exact = m.Segment(ById(e->image_id(), {prompt}, v1::OUTPUT_FORMAT_POLYGONS));
  v1::SegmentRequest coarse_request = ById(e->image_id(), {prompt}, v1::OUTPUT_FORMAT_POLYGONS);
  coarse_request.set_polygon_tolerance(1.0f);
  auto coarse = m.Segment(coarse_request);
  ASSERT_TRUE(rle.ok() && exact.ok() && coarse.ok()) << exact.status().ToString();
  ASSERT_EQ(exact->results(0).masks_size(), 3);
  for (int k = 0; k < 3; ++k) {
    const v1::MaskResult& r = rle->results(0).masks(k);
    const v1::MaskResult& p = exact->results(0).masks(k);
    const v1::MaskResult& c = coarse->results(0).masks(k);
    ASSERT_TRUE(p.has_polygons());
    const auto ToContours = [](const v1::Polygons& ps) {
      std::vector<Contour> out;
      for (const v1::Polygon& poly : ps.polygons()) {
        Contour contour;
        for (float v : poly.points()) contour.xy.push_back(static_cast<int32_t>(v));
        contour.hole = poly.hole();
        contour.parent = poly.parent();
        out.push_back(std::move(contour));
      }
      return out;
    };
    const std::vector<uint8_t> mask = DecodeRle(r);
    ASSERT_GT(r.area(), 0u);
    EXPECT_EQ(RasterisePolygons(ToContours(p.polygons()), 80, 60), mask) << "mask " << k;
    EXPECT_EQ(p.area(), r.area());
    EXPECT_EQ(p.bbox().x(), r.bbox().x());
    EXPECT_EQ(p.bbox().width(), r.bbox().width());
    EXPECT_FLOAT_EQ(p.score(), r.score());
    int exact_vertices = 0, coarse_vertices = 0;
    for (const auto& poly : p.polygons().polygons()) exact_vertices += poly.points_size() / 2;
    for (const auto& poly : c.polygons().polygons()) coarse_vertices += poly.points_size() / 2;
    EXPECT_LT(coarse_vertices, exact_vertices) << "mask " << k;
    const std::vector<uint8_t> approx = RasterisePolygons(ToContours(c.polygons()), 80, 60);
    size_t inter = 0, uni = 0;
    for (size_t i = 0; i < mask.size(); ++i) {
      inter += mask[i] && approx[i];
      uni += mask[i] || approx[i];
    }
    // The fake discs are small (tens of pixels), so a 1-pixel tolerance costs a noticeable share.
    EXPECT_GT(static_cast<double>(inter) / uni, 0.8) << "mask " << k << " area " << r.area();
  }
  for (float bad : {-1.0f, std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity()}) {
    v1::SegmentRequest r = ById(e->image_id(), {prompt}, v1::OUTPUT_FORMAT_POLYGONS);
    r.set_polygon_tolerance(bad);
    auto s = m.Segment(r);
    ASSERT_FALSE(s.ok()) << bad;
    EXPECT_EQ(s.status().code(), StatusCode::kInvalidArgument);
    EXPECT_NE(s.status().message().find("polygon_tolerance = "), std::string::npos) << s.status().message();
  }
}

// Polygons in a SegmentStream: each message chooses its own format and tolerance, and a bad tolerance
// is an inline error that leaves the stream open.
TEST(ServerService, StreamMessagesChooseTheirOwnPolygonFormat) {
  MaskdOnFakeEngines m({});
  const v1::Image a = Encoded(40, 30, 3);
  grpc::ClientContext ctx;
  auto stream = m.stub().SegmentStream(&ctx);
  std::vector<v1::SegmentRequest> msgs;
  msgs.push_back(ByImage(a, {Click(20, 15)}));  // RLE
  msgs.push_back(ById("", {Click(20, 15)}, v1::OUTPUT_FORMAT_POLYGONS));
  msgs.back().clear_image_id();
  msgs.push_back(msgs.back());
  msgs.back().set_polygon_tolerance(-2);  // inline INVALID_ARGUMENT
  msgs.push_back(ById("", {Click(20, 15)}, v1::OUTPUT_FORMAT_POLYGONS));
  msgs.back().clear_image_id();
  msgs.back().set_polygon_tolerance(1);
  for (const auto& msg : msgs) ASSERT_TRUE(stream->Write(msg));
  stream->WritesDone();
  std::vector<v1::SegmentResponse> got;
  v1::SegmentResponse r;
  while (stream->Read(&r)) got.push_back(r);
  ASSERT_TRUE(stream->Finish().ok());
  ASSERT_EQ(got.size(), 4u);
  ASSERT_TRUE(got[0].results(0).masks(0).has_rle());
  ASSERT_TRUE(got[1].results(0).masks(0).has_polygons());
  std::vector<Contour> contours;
  for (const v1::Polygon& p : got[1].results(0).masks(0).polygons().polygons()) {
    Contour c;
    for (float v : p.points()) c.xy.push_back(static_cast<int32_t>(v));
    c.hole = p.hole();
    c.parent = p.parent();
    contours.push_back(std::move(c));
  }
  EXPECT_EQ(RasterisePolygons(contours, 40, 30), DecodeRle(got[0].results(0).masks(0)));
  ASSERT_TRUE(got[2].has_error());
  EXPECT_EQ(got[2].error().code(), static_cast<int>(grpc::StatusCode::INVALID_ARGUMENT));
  EXPECT_NE(got[2].error().message().find("polygon_tolerance = -2"), std::string::npos);
  ASSERT_FALSE(got[3].has_error()) << got[3].error().message();
  int exact = 0, coarse = 0;
  for (const auto& p : got[1].results(0).masks(0).polygons().polygons()) exact += p.points_size();
  for (const auto& p : got[3].results(0).masks(0).polygons().polygons()) coarse += p.points_size();
  EXPECT_LT(coarse, exact);
}

TEST(ServerService, MaskInputByResultIdAndByLogits) {
  MaskdOnFakeEngines m({});
  const v1::Image image = Encoded(64, 48, 5);
  auto first = m.Segment(ByImage(image, {Click(20, 20, true)}));
  ASSERT_TRUE(first.ok()) << first.status().ToString();
  const auto& r0 = first->results(0);
  auto plain = m.Segment(ById(first->image_id(), {Click(40, 30)}));
  ASSERT_TRUE(plain.ok());

  // Refine with the stored result (its best mask by default) ...
  v1::Prompt refine = Click(40, 30);
  refine.mutable_mask_input()->set_result_id(r0.result_id());
  auto refined = m.Segment(ById(first->image_id(), {refine}));
  ASSERT_TRUE(refined.ok()) << refined.status().ToString();
  EXPECT_NE(refined->results(0).masks(0).area(), plain->results(0).masks(0).area());

  // ... which equals sending that mask's logits by value.
  auto logits = m.Segment(ById(first->image_id(), {Click(20, 20, true)}, v1::OUTPUT_FORMAT_LOW_RES_LOGITS));
  ASSERT_TRUE(logits.ok());
  v1::Prompt by_value = Click(40, 30);
  *by_value.mutable_mask_input()->mutable_logits() =
      logits->results(0).masks(static_cast<int>(r0.best_index())).low_res_logits();
  auto by_value_r = m.Segment(ById(first->image_id(), {by_value}));
  ASSERT_TRUE(by_value_r.ok()) << by_value_r.status().ToString();
  EXPECT_EQ(by_value_r->results(0).masks(0).rle().counts(), refined->results(0).masks(0).rle().counts());

  // mask_index picks another mask of the result.
  v1::Prompt other = refine;
  other.mutable_mask_input()->set_mask_index((r0.best_index() + 1) % 3);
  auto other_r = m.Segment(ById(first->image_id(), {other}));
  ASSERT_TRUE(other_r.ok());
  EXPECT_NE(other_r->results(0).masks(0).rle().counts(), refined->results(0).masks(0).rle().counts());

  other.mutable_mask_input()->set_mask_index(3);
  auto bad_index = m.Segment(ById(first->image_id(), {other}));
  EXPECT_EQ(bad_index.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(bad_index.status().message().find("prompts[0].mask_input.mask_index = 3 (expected 0 .. 2"),
            std::string::npos)
      << bad_index.status().message();

  // A result of another image answers like an unknown id (NOT_FOUND, no other image's id); an
  // unknown id is NOT_FOUND.
  auto other_image = m.Embed(Encoded(20, 20, 6));
  ASSERT_TRUE(other_image.ok());
  auto wrong_image = m.Segment(ById(other_image->image_id(), {refine}));
  EXPECT_EQ(wrong_image.status().code(), StatusCode::kNotFound);
  EXPECT_EQ(wrong_image.status().message().find(first->image_id()), std::string::npos)
      << wrong_image.status().message();
  v1::Prompt unknown = Click(1, 1);
  unknown.mutable_mask_input()->set_result_id("r-no-such-result");
  auto nf = m.Segment(ById(first->image_id(), {unknown}));
  EXPECT_EQ(nf.status().code(), StatusCode::kNotFound);
  EXPECT_NE(nf.status().message().find("prompts[0].mask_input.result_id = \"r-no-such-result\" is not a "
                                       "stored result"),
            std::string::npos)
      << nf.status().message();
}

TEST(ServerService, ErrorPathsReturnTheRightCodeAndMessage) {
  MaskdOnFakeEngines m({});
  auto e = m.Embed(Encoded(64, 48, 1));
  ASSERT_TRUE(e.ok());
  struct Case {
    std::string name;
    v1::SegmentRequest request;
    StatusCode code;
    std::string message_part;
  };
  v1::SegmentRequest no_image;
  *no_image.add_prompts() = Click(1, 1);
  v1::SegmentRequest no_prompts = ById(e->image_id(), {});
  v1::Image truncated = Encoded(64, 48, 1);
  truncated.set_encoded(truncated.encoded().substr(0, truncated.encoded().size() / 2));
  v1::Image gif;
  gif.set_encoded("GIF89a-not-supported");
  v1::Image raw;
  raw.mutable_raw()->set_width(4);
  raw.mutable_raw()->set_height(4);
  raw.mutable_raw()->set_rgb("short");
  const std::vector<Case> cases = {
      {"no image", no_image, StatusCode::kInvalidArgument, "image_source: neither image nor image_id"},
      {"no prompts", no_prompts, StatusCode::kInvalidArgument, "prompts has 0 prompts (expected 1 .. 256"},
      {"bad id", ById("cat.jpg", {Click(1, 1)}), StatusCode::kInvalidArgument,
       "image_id = \"cat.jpg\" is not an image id"},
      {"unknown id", ById(std::string(64, 'a'), {Click(1, 1)}), StatusCode::kNotFound,
       "is not cached on this server (evicted, or never embedded here): re-send the image bytes"},
      {"truncated png", ByImage(truncated, {Click(1, 1)}), StatusCode::kInvalidArgument,
       "image.encoded: corrupt or truncated PNG"},
      {"unknown format", ByImage(gif, {Click(1, 1)}), StatusCode::kInvalidArgument,
       "image.encoded: unknown image format"},
      {"wrong raw length", ByImage(raw, {Click(1, 1)}), StatusCode::kInvalidArgument,
       "image.raw.rgb has 5 bytes (expected width * height * 3 = 48)"},
      {"outside the image", ById(e->image_id(), {Click(1, 1), Click(700.5f, 2)}),
       StatusCode::kInvalidArgument, "prompts[1].points[0]"},
  };
  for (const auto& c : cases) {
    auto r = m.Segment(c.request);
    ASSERT_FALSE(r.ok()) << c.name;
    EXPECT_EQ(r.status().code(), c.code) << c.name << ": " << r.status().ToString();
    EXPECT_NE(r.status().message().find(c.message_part), std::string::npos)
        << c.name << ": " << r.status().message();
  }
  v1::EmbedRequest empty;
  auto no_image_embed = m.client().Embed(empty);
  EXPECT_EQ(no_image_embed.status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(no_image_embed.status().message(), "image is not set (expected encoded bytes or raw pixels)");

  // An engine failure is INTERNAL with its message.
  m.engine(0)->FailNextEncode(Internal("running the image encoder: CUDA error"));
  auto broken = m.Embed(Encoded(10, 10, 77));
  EXPECT_EQ(broken.status().code(), StatusCode::kInternal);
  EXPECT_EQ(broken.status().message(), "running the image encoder: CUDA error");
  const auto info = m.Info();
  EXPECT_GE(info.calls_by_status().at("INVALID_ARGUMENT"), 8u);
  EXPECT_EQ(info.calls_by_status().at("NOT_FOUND"), 1u);
  EXPECT_EQ(info.calls_by_status().at("INTERNAL"), 1u);
}

// A click by image_id is a cache lookup: it runs on the calling thread and does not queue behind
// other requests' image decodes (a single decode thread, held busy by a new image here).
TEST(ServerService, AClickByImageIdDoesNotWaitBehindImageDecodes) {
  MaskdOnFakeEngines::Options o;
  o.configure = [](ServerConfig& c) { c.decode_threads = 1; };
  MaskdOnFakeEngines m(o);
  FakeEngine* engine = m.engine(0);
  auto embedded = m.Embed(Encoded(32, 24, 1));
  ASSERT_TRUE(embedded.ok()) << embedded.status().ToString();
  engine->HoldPrepares();
  auto busy = std::async(std::launch::async, [&] { return m.Segment(ByImage(Encoded(32, 24, 2), {Click(3, 3)})); });
  ASSERT_TRUE(WaitFor([&] { return engine->prepare_calls.load() == 2; }));
  v1::SegmentResponse click;
  const grpc::Status s = m.SegmentWithDeadline(ById(embedded->image_id(), {Click(5, 5)}), milliseconds(3000), &click);
  EXPECT_TRUE(s.ok()) << s.error_code() << " " << s.error_message();
  EXPECT_EQ(click.results_size(), 1);
  EXPECT_EQ(busy.wait_for(std::chrono::seconds(0)), std::future_status::timeout) << "the new image was not held";
  engine->ReleasePrepares();
  auto other = busy.get();
  EXPECT_TRUE(other.ok()) << other.status().ToString();
}

TEST(ServerService, SingleFlightOneEncodeForConcurrentRequests) {
  MaskdOnFakeEngines m({});
  FakeEngine* engine = m.engine(0);
  engine->HoldEncodes();
  const v1::Image image = Encoded(32, 32, 9);
  constexpr int kN = 8;
  std::vector<std::future<StatusOr<v1::EmbedResponse>>> calls;
  for (int i = 0; i < kN; ++i) {
    calls.push_back(std::async(std::launch::async, [&] { return m.Embed(image); }));
  }
  ASSERT_TRUE(engine->WaitForEncodeCalls(1, milliseconds(5000)));
  // Every other request joins the flight of the first.
  ASSERT_TRUE(WaitFor([&] { return m.Info().cache().single_flight_joins() == kN - 1; }))
      << m.Info().cache().DebugString();
  engine->ReleaseEncodes();
  std::set<std::string> ids;
  for (auto& c : calls) {
    auto r = c.get();
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    ids.insert(r->image_id());
  }
  EXPECT_EQ(ids.size(), 1u);
  EXPECT_EQ(engine->encoded_images.load(), 1);
  EXPECT_EQ(engine->prepare_calls.load(), 1);  // decoded and resized once, too
  const auto info = m.Info();
  EXPECT_EQ(info.cache().misses(), 1u);
  EXPECT_EQ(info.cache().single_flight_joins(), static_cast<uint64_t>(kN - 1));
}

TEST(ServerService, RoutingSpreadsNewImagesAndKeepsAffinity) {
  MaskdOnFakeEngines::Options o;
  o.devices = 2;
  MaskdOnFakeEngines m(o);
  ASSERT_EQ(m.server().workers().size(), 2u);
  // Two new images at once: the second goes to the other, less loaded device.
  m.engine(0)->HoldEncodes();
  m.engine(1)->HoldEncodes();
  auto a = std::async(std::launch::async, [&] { return m.Embed(Encoded(40, 30, 1)); });
  ASSERT_TRUE(WaitFor([&] { return m.engine(0)->encode_calls + m.engine(1)->encode_calls == 1; }));
  auto b = std::async(std::launch::async, [&] { return m.Embed(Encoded(40, 30, 2)); });
  ASSERT_TRUE(WaitFor([&] { return m.engine(0)->encode_calls + m.engine(1)->encode_calls == 2; }));
  m.engine(0)->ReleaseEncodes();
  m.engine(1)->ReleaseEncodes();
  auto ra = a.get(), rb = b.get();
  ASSERT_TRUE(ra.ok() && rb.ok());
  EXPECT_EQ(m.engine(0)->encoded_images.load(), 1);
  EXPECT_EQ(m.engine(1)->encoded_images.load(), 1);
  const int owner_a = m.server().workers()[0]->cache().Contains(ra->image_id()) ? 0 : 1;
  const int owner_b = 1 - owner_a;
  ASSERT_TRUE(m.server().workers()[owner_a]->cache().Contains(ra->image_id()));
  ASSERT_TRUE(m.server().workers()[owner_b]->cache().Contains(rb->image_id()));

  // Requests for a known image go to the device that holds its embedding, by id or by bytes.
  for (int i = 0; i < 5; ++i) {
    auto s = m.Segment(ById(ra->image_id(), {Click(5.f + i, 5)}));
    ASSERT_TRUE(s.ok()) << s.status().ToString();
    EXPECT_TRUE(s->cached());
  }
  auto by_bytes = m.Segment(ByImage(Encoded(40, 30, 2), {Click(3, 3)}));
  ASSERT_TRUE(by_bytes.ok());
  EXPECT_TRUE(by_bytes->cached());
  EXPECT_EQ(m.engine(owner_a)->decoded_prompts.load(), 5);
  EXPECT_EQ(m.engine(owner_b)->decoded_prompts.load(), 1);
  EXPECT_EQ(m.engine(0)->encoded_images + m.engine(1)->encoded_images, 2);  // no re-encoding

  // GetInfo: per device and totals.
  const auto info = m.Info();
  ASSERT_EQ(info.devices_size(), 2);
  EXPECT_EQ(info.devices(0).device(), "cpu:0");
  EXPECT_EQ(info.devices(1).device(), "cpu:1");
  EXPECT_EQ(info.devices(owner_a).cache().device().entries(), 1u);
  EXPECT_EQ(info.devices(owner_b).cache().device().entries(), 1u);
  EXPECT_EQ(info.devices(owner_a).decoder_queue().items(), 5u);
  EXPECT_EQ(info.cache().device().entries(), 2u);
  EXPECT_EQ(info.cache().hits(), 6u);
  EXPECT_EQ(info.cache().misses(), 2u);
  EXPECT_EQ(info.decoder_queue().items(), 6u);
  EXPECT_EQ(info.encoder_queue().items(), 2u);
}

TEST(ServerService, EncoderQueueFullIsResourceExhaustedAtOnce) {
  MaskdOnFakeEngines::Options o;
  o.configure = [](ServerConfig& c) {
    c.encoder_max_batch = 1;
    c.encoder_queue_capacity = 1;
  };
  MaskdOnFakeEngines m(o);
  FakeEngine* engine = m.engine(0);
  engine->HoldEncodes();
  auto running = std::async(std::launch::async, [&] { return m.Embed(Encoded(8, 8, 1)); });
  ASSERT_TRUE(engine->WaitForEncodeCalls(1, milliseconds(5000)));
  auto queued = std::async(std::launch::async, [&] { return m.Embed(Encoded(8, 8, 2)); });
  ASSERT_TRUE(WaitFor([&] { return m.Info().encoder_queue().depth() == 1; }));
  auto refused = m.Embed(Encoded(8, 8, 3));
  // Answered while the first encode is still held (released only below): not after it.
  EXPECT_EQ(engine->encoded_images.load(), 0);
  EXPECT_EQ(refused.status().code(), StatusCode::kResourceExhausted);
  EXPECT_NE(refused.status().message().find("queue of cpu:0 is full (1 of 1 images)"), std::string::npos)
      << refused.status().message();
  engine->ReleaseEncodes();
  EXPECT_TRUE(running.get().ok());
  EXPECT_TRUE(queued.get().ok());
  EXPECT_EQ(engine->encoded_images.load(), 2);
}

TEST(ServerService, ExpiredDeadlineIsDroppedBeforeEncoding) {
  MaskdOnFakeEngines::Options o;
  o.configure = [](ServerConfig& c) { c.encoder_max_batch = 1; };
  MaskdOnFakeEngines m(o);
  FakeEngine* engine = m.engine(0);
  engine->HoldEncodes();
  auto running = std::async(std::launch::async, [&] { return m.Embed(Encoded(8, 8, 1)); });
  ASSERT_TRUE(engine->WaitForEncodeCalls(1, milliseconds(5000)));
  v1::EmbedResponse out;
  const grpc::Status late = m.EmbedWithDeadline(Encoded(8, 8, 2), milliseconds(200), &out);
  EXPECT_EQ(late.error_code(), grpc::StatusCode::DEADLINE_EXCEEDED);
  // The server's copy of the deadline starts when the request arrives, a little after the client's:
  // make sure it has passed too before the queued image can reach the engine.
  std::this_thread::sleep_for(milliseconds(100));
  engine->ReleaseEncodes();
  EXPECT_TRUE(running.get().ok());
  // The expired image never reached the engine.
  ASSERT_TRUE(WaitFor([&] { return m.Info().encoder_queue().dropped() == 1; }));
  EXPECT_EQ(engine->encoded_images.load(), 1);
  EXPECT_EQ(engine->encode_calls.load(), 1);
}

TEST(ServerService, EvictedImageIsNotFoundWithResendHint) {
  MaskdOnFakeEngines::Options o;
  o.engine.embedding_bytes = 1 << 20;
  o.configure = [](ServerConfig& c) { c.cache_device_bytes = 1 << 20; };  // one embedding
  MaskdOnFakeEngines m(o);
  auto a = m.Segment(ByImage(Encoded(30, 30, 1), {Click(3, 3)}));
  ASSERT_TRUE(a.ok());
  auto b = m.Embed(Encoded(30, 30, 2));
  ASSERT_TRUE(b.ok());
  auto gone = m.Segment(ById(a->image_id(), {Click(1, 1)}));
  EXPECT_EQ(gone.status().code(), StatusCode::kNotFound);
  EXPECT_NE(gone.status().message().find("re-send the image bytes"), std::string::npos);
  // Its results went with it.
  v1::Prompt refine = Click(2, 2);
  refine.mutable_mask_input()->set_result_id(a->results(0).result_id());
  auto no_result = m.Segment(ByImage(Encoded(30, 30, 1), {refine}));
  EXPECT_EQ(no_result.status().code(), StatusCode::kNotFound);
  const auto info = m.Info();
  EXPECT_EQ(info.cache().evictions(), 2u);  // a by b, then b by a's re-embedding
  EXPECT_EQ(info.cache().device().entries(), 1u);
  EXPECT_EQ(info.cache().host().capacity_bytes(), 0u);  // CPU engines: no host tier
}

TEST(ServerService, HostTierDemotesAndPromotes) {
  MaskdOnFakeEngines::Options o;
  o.cuda = true;  // fake GPU engines: the host tier is on
  o.engine.embedding_bytes = 1 << 20;
  o.configure = [](ServerConfig& c) {
    c.cache_device_bytes = 1 << 20;
    c.cache_host_bytes = 4 << 20;
  };
  MaskdOnFakeEngines m(o);
  auto a = m.Embed(Encoded(30, 30, 1));
  auto b = m.Embed(Encoded(30, 30, 2));
  ASSERT_TRUE(a.ok() && b.ok());
  ASSERT_TRUE(WaitFor([&] { return m.Info().cache().demotions() == 1; }));
  EXPECT_EQ(m.engine(0)->to_host_calls.load(), 1);
  auto info = m.Info();
  EXPECT_EQ(info.cache().host().entries(), 1u);
  EXPECT_EQ(info.cache().device().entries(), 1u);
  EXPECT_EQ(info.devices(0).device(), "cuda:0");
  // a lives in host memory now; using it brings it back (the fake decoder refuses host embeddings).
  auto s = m.Segment(ById(a->image_id(), {Click(4, 4)}));
  ASSERT_TRUE(s.ok()) << s.status().ToString();
  EXPECT_TRUE(s->cached());
  EXPECT_EQ(m.engine(0)->to_device_calls.load(), 1);
  ASSERT_TRUE(WaitFor([&] { return m.Info().cache().demotions() == 2; }));  // b made room
  EXPECT_EQ(m.engine(0)->encoded_images.load(), 2);
}

// n requests over 4 images of 3 sizes, i % prompts_mod + 1 prompts each (foreground and background
// clicks, some multimask), every third one asking for PNGs and the others for COCO RLE.
std::vector<v1::SegmentRequest> MixedRequests(int n, int prompts_mod) {
  std::vector<v1::SegmentRequest> requests;
  for (int i = 0; i < n; ++i) {
    const v1::Image image = Encoded(40 + (i % 3) * 10, 30 + (i % 2) * 10, i % 4);
    std::vector<v1::Prompt> prompts;
    for (int k = 0; k <= i % prompts_mod; ++k) prompts.push_back(Click(1.f + k * 3, 2.f + (i % 5), (i + k) % 2, k != 2));
    v1::SegmentRequest r = ByImage(image, prompts);
    r.set_output_format(i % 3 == 0 ? v1::OUTPUT_FORMAT_PNG : v1::OUTPUT_FORMAT_COCO_RLE);
    requests.push_back(r);
  }
  return requests;
}

// The requests sent all at once, each answer checked against the one-by-one answer of its request.
void ExpectConcurrentEqualsSequential(MaskdOnFakeEngines& m, const std::vector<v1::SegmentRequest>& requests,
                                      const std::vector<v1::SegmentResponse>& sequential) {
  std::vector<std::future<StatusOr<v1::SegmentResponse>>> calls;
  for (const auto& r : requests) {
    calls.push_back(std::async(std::launch::async, [&m, r] { return m.Segment(r); }));
  }
  for (size_t i = 0; i < calls.size(); ++i) {
    auto c = calls[i].get();
    ASSERT_TRUE(c.ok()) << c.status().ToString();
    ASSERT_EQ(c->results_size(), sequential[i].results_size());
    for (int p = 0; p < c->results_size(); ++p) {
      ASSERT_EQ(c->results(p).masks_size(), sequential[i].results(p).masks_size());
      EXPECT_EQ(c->results(p).best_index(), sequential[i].results(p).best_index());
      for (int k = 0; k < c->results(p).masks_size(); ++k) {
        const auto& x = c->results(p).masks(k);
        const auto& y = sequential[i].results(p).masks(k);
        EXPECT_EQ(x.rle().counts(), y.rle().counts()) << "request " << i << " prompt " << p;
        EXPECT_EQ(x.png(), y.png()) << "request " << i << " prompt " << p;
        EXPECT_EQ(x.area(), y.area());
        EXPECT_FLOAT_EQ(x.score(), y.score());
      }
    }
  }
}

std::vector<v1::SegmentResponse> SegmentOneByOne(MaskdOnFakeEngines& m, const std::vector<v1::SegmentRequest>& requests) {
  std::vector<v1::SegmentResponse> out;
  for (const auto& r : requests) {
    auto s = m.Segment(r);
    EXPECT_TRUE(s.ok()) << s.status().ToString();
    out.push_back(s.ok() ? *s : v1::SegmentResponse());
  }
  return out;
}

TEST(ServerService, ConcurrentMixedRequestsEqualSequential) {
  MaskdOnFakeEngines::Options o;
  o.devices = 2;
  o.configure = [](ServerConfig& c) {
    c.decoder_queue_delay_us = 2000;  // let batches mix requests
    c.decoder_max_prompts = 7;        // and split the larger ones
  };
  MaskdOnFakeEngines m(o);
  const std::vector<v1::SegmentRequest> requests = MixedRequests(24, 10);
  ExpectConcurrentEqualsSequential(m, requests, SegmentOneByOne(m, requests));
  // Batches really mixed requests (more prompts per batch than one request had on average).
  const auto info = m.Info();
  EXPECT_GT(info.decoder_queue().batches(), 0u);
  for (int w = 0; w < 2; ++w) {
    for (int n : m.engine(w)->decode_batches()) EXPECT_LE(n, 7);
  }
}

// Under load, post-processing takes the decoded chunks of many requests in one Engine::Postprocess
// call per device (mixed output formats in one call): each request still gets exactly its own
// masks, the same as when the requests ran one by one. With one post-processing thread a batch's
// chunks finish in turn on it; with four, a batch of 4 chunks or more finishes on helper tasks too
// (Pipeline::FinishChunks).
TEST(ServerService, ConcurrentRequestsShareBatchedPostprocessingAndKeepTheirOwnMasks) {
  for (const int threads : {1, 4}) {
    SCOPED_TRACE(std::to_string(threads) + " post-processing thread(s)");
    MaskdOnFakeEngines::Options o;
    o.devices = 2;
    o.engine.postprocess_delay = milliseconds(30);  // chunks pile up behind the one running call
    o.configure = [threads](ServerConfig& c) { c.postprocess_threads = threads; };
    MaskdOnFakeEngines m(o);
    const int n = 8 * threads + 8;
    const std::vector<v1::SegmentRequest> requests = MixedRequests(n, 4);
    const std::vector<v1::SegmentResponse> sequential = SegmentOneByOne(m, requests);
    const int calls_before = m.engine(0)->postprocess_calls + m.engine(1)->postprocess_calls;
    EXPECT_EQ(calls_before, n);  // one by one: one call each
    ExpectConcurrentEqualsSequential(m, requests, sequential);
    const int concurrent = m.engine(0)->postprocess_calls + m.engine(1)->postprocess_calls - calls_before;
    EXPECT_LT(concurrent, n) << "no post-processing call served more than one request";
    EXPECT_GE(concurrent, 2);  // at least one per device
  }
}

// MASKD_RLE_IN_PLACE=1: the engine leaves each RLE string in its call's buffer (the fake does as a
// CUDA engine's pinned one) and the threads that build the responses copy it out, alone or across a
// batch finished on several threads; the responses are the bytes the server sends without it.
TEST(ServerService, RleStringsLeftInTheEnginesBufferGiveTheSameResponses) {
  const std::vector<v1::SegmentRequest> requests = MixedRequests(24, 4);
  std::vector<v1::SegmentResponse> copied;
  {
    MaskdOnFakeEngines m({});
    copied = SegmentOneByOne(m, requests);
    EXPECT_EQ(m.engine(0)->rle_in_place_masks, 0);
  }
  maskd::testing::ScopedEnv env("MASKD_RLE_IN_PLACE", "1");
  MaskdOnFakeEngines::Options o;
  o.devices = 2;
  o.engine.postprocess_delay = milliseconds(30);  // chunks pile up: batched calls, fanned out
  o.configure = [](ServerConfig& c) { c.postprocess_threads = 4; };
  MaskdOnFakeEngines m(o);
  const std::vector<v1::SegmentResponse> sequential = SegmentOneByOne(m, requests);
  ASSERT_EQ(sequential.size(), copied.size());
  for (size_t i = 0; i < copied.size(); ++i) {
    ASSERT_EQ(sequential[i].results_size(), copied[i].results_size());
    for (int p = 0; p < copied[i].results_size(); ++p)
      for (int k = 0; k < copied[i].results(p).masks_size(); ++k)
        EXPECT_EQ(sequential[i].results(p).masks(k).rle().counts(), copied[i].results(p).masks(k).rle().counts())
            << "request " << i << " prompt " << p;
  }
  ExpectConcurrentEqualsSequential(m, requests, copied);
  EXPECT_GT(m.engine(0)->rle_in_place_masks + m.engine(1)->rle_in_place_masks, 0);
}

// An exception thrown below the engine's post-processing never crosses the RPC boundary: that call
// gets INTERNAL naming it, and the server goes on serving the next one.
TEST(ServerService, ExceptionInPostprocessingIsInternalAndTheServerGoesOn) {
  MaskdOnFakeEngines m({});
  const v1::Image image = Encoded(24, 16, 5);
  m.engine(0)->ThrowOnNextPostprocess("cudaErrorIllegalAddress in a post-processing kernel");
  auto broken = m.Segment(ByImage(image, {Click(3, 3)}));
  EXPECT_EQ(broken.status().code(), StatusCode::kInternal);
  EXPECT_EQ(broken.status().message(),
            "unexpected exception in post-processing: cudaErrorIllegalAddress in a post-processing kernel");
  auto next = m.Segment(ByImage(image, {Click(3, 3), Click(7, 9)}));
  ASSERT_TRUE(next.ok()) << next.status().ToString();
  EXPECT_EQ(next->results_size(), 2);
}

TEST(ServerService, RawImagesAreContentAddressed) {
  MaskdOnFakeEngines m({});
  const ImageRGB8 pic = Picture(6, 4, 3);
  v1::Image raw;
  raw.mutable_raw()->set_width(6);
  raw.mutable_raw()->set_height(4);
  raw.mutable_raw()->set_rgb(std::string(pic.pixels.begin(), pic.pixels.end()));
  auto e = m.Embed(raw);
  ASSERT_TRUE(e.ok()) << e.status().ToString();
  EXPECT_EQ(e->image_id(), ImageIdForRaw(m.identity(), 6, 4, raw.raw().rgb()));
  // The same pixels sent as PNG are another image_id (bytes as sent) but the same embedding content.
  auto png = m.Embed(Encoded(6, 4, 3));
  ASSERT_TRUE(png.ok());
  EXPECT_NE(png->image_id(), e->image_id());
  EXPECT_FALSE(png->cached());
}

TEST(ServerService, ClientAffinityKeyIsTheServersImageId) {
  // The value maskd_client puts in x-maskd-image-id (client_fake_server_test checks it reaches the
  // wire) against this server's own image_id, with the identity the client fetched from GetInfo.
  MaskdOnFakeEngines m({});
  const v1::Image png = Encoded(12, 9, 5);
  v1::Image raw;
  const ImageRGB8 pic = Picture(5, 3, 2);
  raw.mutable_raw()->set_width(5);
  raw.mutable_raw()->set_height(3);
  raw.mutable_raw()->set_rgb(std::string(pic.pixels.begin(), pic.pixels.end()));
  for (const v1::Image& image : {png, raw}) {
    const std::optional<std::string> key = m.client().AffinityKeyFor(image);
    ASSERT_TRUE(key.has_value());
    auto e = m.Embed(image);
    ASSERT_TRUE(e.ok()) << e.status().ToString();
    EXPECT_EQ(*key, e->image_id());
    auto s = m.Segment(ByImage(image, {Click(1, 1)}));
    ASSERT_TRUE(s.ok()) << s.status().ToString();
    EXPECT_EQ(*m.client().AffinityKeyFor(ByImage(image, {Click(1, 1)})), s->image_id());
    EXPECT_EQ(*m.client().AffinityKeyFor(ById(e->image_id(), {Click(1, 1)})), e->image_id());
  }
  EXPECT_EQ(*m.client().ModelIdentity(), m.identity());
}

// ---- SegmentStream -----------------------------------------------------------------------------

TEST(ServerService, StreamAnswersEveryMessageInOrderWithErrorsInline) {
  MaskdOnFakeEngines m({});
  const v1::Image a = Encoded(40, 30, 1), b = Encoded(20, 60, 2);
  grpc::ClientContext ctx;
  auto stream = m.stub().SegmentStream(&ctx);
  std::vector<v1::SegmentRequest> msgs;
  msgs.push_back(ByImage(a, {Click(5, 5, true)}));                     // 0: names image a
  msgs.push_back(ById("", {Click(6, 6)}));                             // 1: keeps a
  msgs.back().clear_image_id();
  msgs.push_back(ById("", {Click(500, 6)}));                           // 2: outside a: error inline
  msgs.back().clear_image_id();
  msgs.push_back(ById(std::string(64, 'b'), {Click(1, 1)}));           // 3: unknown id: NOT_FOUND
  msgs.push_back(ById("", {Click(1, 1)}));                             // 4: current image is that id
  msgs.back().clear_image_id();
  msgs.push_back(ByImage(b, {Click(10, 50), Click(2, 2, true)}));     // 5: switches to b
  msgs.push_back(ById("", {Click(19, 59)}));                           // 6: keeps b
  msgs.back().clear_image_id();
  for (size_t i = 0; i < msgs.size(); ++i) {
    msgs[i].set_request_tag("m" + std::to_string(i));
    ASSERT_TRUE(stream->Write(msgs[i]));  // all written before any read: responses must still be in order
  }
  stream->WritesDone();
  std::vector<v1::SegmentResponse> got;
  v1::SegmentResponse r;
  while (stream->Read(&r)) got.push_back(r);
  const grpc::Status st = stream->Finish();
  EXPECT_TRUE(st.ok()) << st.error_message();
  ASSERT_EQ(got.size(), msgs.size());
  for (size_t i = 0; i < got.size(); ++i) EXPECT_EQ(got[i].request_tag(), "m" + std::to_string(i));
  const std::string id_a = ImageIdForEncoded(m.identity(), a.encoded());
  const std::string id_b = ImageIdForEncoded(m.identity(), b.encoded());
  EXPECT_FALSE(got[0].has_error());
  EXPECT_EQ(got[0].image_id(), id_a);
  EXPECT_EQ(got[0].results(0).masks_size(), 3);
  EXPECT_FALSE(got[1].has_error());
  EXPECT_EQ(got[1].image_id(), id_a);
  EXPECT_TRUE(got[1].cached());
  ASSERT_TRUE(got[2].has_error());
  EXPECT_EQ(got[2].error().code(), static_cast<int>(grpc::StatusCode::INVALID_ARGUMENT));
  EXPECT_NE(got[2].error().message().find("prompts[0].points[0]"), std::string::npos);
  EXPECT_EQ(got[2].results_size(), 0);
  ASSERT_TRUE(got[3].has_error());
  EXPECT_EQ(got[3].error().code(), static_cast<int>(grpc::StatusCode::NOT_FOUND));
  ASSERT_TRUE(got[4].has_error());
  EXPECT_EQ(got[4].error().code(), static_cast<int>(grpc::StatusCode::NOT_FOUND));
  EXPECT_FALSE(got[5].has_error());
  EXPECT_EQ(got[5].image_id(), id_b);
  EXPECT_EQ(got[5].results_size(), 2);
  EXPECT_FALSE(got[6].has_error()) << got[6].error().message();
  EXPECT_EQ(got[6].image_id(), id_b);
  EXPECT_EQ(got[6].width(), 20u);
}

TEST(ServerService, StreamFirstMessageMustNameAnImageAndMayOnlySetIt) {
  MaskdOnFakeEngines m({});
  grpc::ClientContext ctx;
  auto stream = m.stub().SegmentStream(&ctx);
  v1::SegmentRequest orphan;
  *orphan.add_prompts() = Click(1, 1);
  ASSERT_TRUE(stream->Write(orphan));
  v1::SegmentResponse r;
  ASSERT_TRUE(stream->Read(&r));
  ASSERT_TRUE(r.has_error());
  EXPECT_EQ(r.error().code(), static_cast<int>(grpc::StatusCode::INVALID_ARGUMENT));
  EXPECT_NE(r.error().message().find("the stream has no current image"), std::string::npos);
  // An image-only message sets the image (and embeds it) without prompts.
  v1::SegmentRequest set;
  *set.mutable_image() = Encoded(16, 16, 3);
  ASSERT_TRUE(stream->Write(set));
  ASSERT_TRUE(stream->Read(&r));
  EXPECT_FALSE(r.has_error()) << r.error().message();
  EXPECT_EQ(r.results_size(), 0);
  EXPECT_EQ(r.width(), 16u);
  ASSERT_TRUE(stream->Write(orphan));  // now it has an image
  ASSERT_TRUE(stream->Read(&r));
  EXPECT_FALSE(r.has_error()) << r.error().message();
  EXPECT_EQ(r.results_size(), 1);
  stream->WritesDone();
  EXPECT_FALSE(stream->Read(&r));
  EXPECT_TRUE(stream->Finish().ok());
}

TEST(ServerService, StreamEndsWithUnavailableOnShutdown) {
  auto m = std::make_unique<MaskdOnFakeEngines>(MaskdOnFakeEngines::Options{});
  grpc::ClientContext ctx;
  auto stream = m->stub().SegmentStream(&ctx);
  v1::SegmentRequest set;
  *set.mutable_image() = Encoded(16, 16, 3);
  *set.add_prompts() = Click(2, 2);
  ASSERT_TRUE(stream->Write(set));
  v1::SegmentResponse r;
  ASSERT_TRUE(stream->Read(&r));
  EXPECT_FALSE(r.has_error());
  std::thread stopper([&] { m->server().Shutdown(); });
  EXPECT_FALSE(stream->Read(&r));  // the server ends the idle stream
  const grpc::Status st = stream->Finish();
  EXPECT_EQ(st.error_code(), grpc::StatusCode::UNAVAILABLE) << st.error_message();
  stopper.join();
}

TEST(ServerService, GetInfoReportsModelLimitsStagesAndCalls) {
  MaskdOnFakeEngines::Options o;
  o.configure = [](ServerConfig& c) {
    c.max_prompts_per_request = 17;
    c.max_points_per_prompt = 5;
  };
  MaskdOnFakeEngines m(o);
  const auto first = m.Segment(ByImage(Encoded(32, 24, 1), {Click(3, 3)}));
  ASSERT_TRUE(first.ok());
  const auto info = m.Info();
  EXPECT_FALSE(info.version().empty());
  EXPECT_EQ(info.model().identity(), m.identity());
  EXPECT_EQ(info.model().checkpoint(), "builtin-demo");
  EXPECT_EQ(info.precision(), "fp32");
  EXPECT_EQ(info.limits().max_prompts_per_request(), 17u);
  EXPECT_EQ(info.limits().max_points_per_prompt(), 5u);
  EXPECT_EQ(info.limits().max_image_bytes(), 32u << 20);
  EXPECT_EQ(info.optimisations(0), "fake");
  EXPECT_EQ(info.memory().allocated_bytes(), 1000u);
  // The Segment, the client's identity GetInfo and this GetInfo (counted when it starts).
  EXPECT_EQ(info.calls(), 3u);
  // The Segment, and the GetInfo by which the client learnt the model identity for its affinity
  // header (maskd_client asks once, before its first call with bytes).
  EXPECT_EQ(info.calls_by_status().at("OK"), 2u);
  std::map<std::string, v1::StageTiming> stages;
  for (const auto& s : info.stages()) stages[s.stage()] = s;
  for (const char* name : {"decode_queue", "decode", "encoder_queue", "encoder_compute", "decoder_queue",
                           "decoder_compute", "postprocess_queue", "postprocess", "postprocess_masks",
                           "postprocess_encode", "total"}) {
    ASSERT_TRUE(stages.count(name)) << name;
    EXPECT_EQ(stages[name].count(), 1u) << name;
  }
  EXPECT_GT(stages["total"].mean_us(), 0);
  // One sample: every statistic is that sample, the Segment's own total.
  EXPECT_DOUBLE_EQ(stages["total"].mean_us(), static_cast<double>(first->timing().total_us()));
  EXPECT_DOUBLE_EQ(stages["total"].p50_us(), stages["total"].mean_us());
  EXPECT_DOUBLE_EQ(stages["total"].p99_us(), stages["total"].mean_us());
  ASSERT_EQ(info.devices_size(), 1);
  EXPECT_EQ(info.devices(0).stages_size(), 11);
  EXPECT_EQ(info.devices(0).name(), "fake cpu");
  EXPECT_EQ(info.cache().results(), 1u);
  EXPECT_GT(info.cache().result_bytes(), 0u);
  // Over the limit from the configuration.
  std::vector<v1::Prompt> many(18, Click(1, 1));
  auto r = m.Segment(ByImage(Encoded(32, 24, 1), many));
  EXPECT_NE(r.status().message().find("expected 1 .. 17: limits.max_prompts_per_request"), std::string::npos);
}

// Server reflection (what grpcurl uses): ServerReflectionInfo with list_services, encoded by hand
// (field 7, empty string) since the reflection protos are not installed for clients.
TEST(ServerService, ReflectionListsTheServices) {
  MaskdOnFakeEngines m({});
  grpc::CompletionQueue cq;
  grpc::GenericStub stub(m.client().channel());
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
  auto call = stub.PrepareCall(&ctx, "/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo",
                               &cq);
  void* tag = nullptr;
  bool ok = false;
  auto step = [&](intptr_t want) {
    EXPECT_TRUE(cq.Next(&tag, &ok));
    EXPECT_EQ(reinterpret_cast<intptr_t>(tag), want);
    return ok;
  };
  call->StartCall(reinterpret_cast<void*>(1));
  ASSERT_TRUE(step(1));
  grpc::Slice slice(std::string("\x3a\x00", 2));
  grpc::ByteBuffer request(&slice, 1);
  call->Write(request, reinterpret_cast<void*>(2));
  ASSERT_TRUE(step(2));
  grpc::ByteBuffer response;
  call->Read(&response, reinterpret_cast<void*>(3));
  ASSERT_TRUE(step(3));
  std::vector<grpc::Slice> slices;
  ASSERT_TRUE(response.Dump(&slices).ok());
  std::string bytes;
  for (const auto& s : slices) bytes.append(reinterpret_cast<const char*>(s.begin()), s.size());
  EXPECT_NE(bytes.find("maskd.v1.MaskService"), std::string::npos);
  EXPECT_NE(bytes.find("grpc.health.v1.Health"), std::string::npos);
  call->WritesDone(reinterpret_cast<void*>(4));
  step(4);
  grpc::Status status;
  call->Finish(&status, reinterpret_cast<void*>(5));
  step(5);
  EXPECT_TRUE(status.ok()) << status.error_message();
  cq.Shutdown();
  while (cq.Next(&tag, &ok)) {
  }
}

// GenerateMasks (issue #15) on fake engines: the generator runs on the generation pool, whose queue is
// bounded (--generate-queue-capacity): with one thread busy and one call waiting, the next is refused
// at once with RESOURCE_EXHAUSTED naming the queue; the others get the engine's own answer (the fake
// cannot filter masks: FAILED_PRECONDITION), after their grid points went through the decoder batcher.
TEST(ServerService, GenerationQueueIsBoundedAndRefusesAtOnce) {
  ServerConfig c = TestConfig();
  c.generate_threads = 1;
  c.generate_queue_capacity = 1;
  FakeEngineOptions fo;
  fo.decode_delay = std::chrono::milliseconds(1500);
  TestServer t(c, fo);
  v1::EmbedRequest e;
  *e.mutable_image() = EncodedPicture(40, 30, 7);
  auto embedded = t.client->Embed(e);
  ASSERT_TRUE(embedded.ok()) << embedded.status().ToString();
  v1::GenerateMasksRequest gen;
  gen.set_image_id(embedded->image_id());
  gen.mutable_params()->set_points_per_side(3);
  auto running = std::async(std::launch::async, [&] { return t.client->GenerateMasks(gen).status(); });
  // The first generation holds the only generation thread (its points are being decoded).
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (t.engine.load()->decode_calls.load() == 0 && std::chrono::steady_clock::now() < until) {
    std::this_thread::sleep_for(milliseconds(5));
  }
  ASSERT_GT(t.engine.load()->decode_calls.load(), 0);
  auto second = std::async(std::launch::async, [&] { return t.client->GenerateMasks(gen).status(); });
  auto third = std::async(std::launch::async, [&] { return t.client->GenerateMasks(gen).status(); });
  std::vector<Status> later = {second.get(), third.get()};
  const Status first = running.get();
  EXPECT_EQ(first.code(), StatusCode::kFailedPrecondition) << first.ToString();
  EXPECT_NE(first.message().find("cannot generate masks"), std::string::npos) << first.message();
  int refused = 0, answered = 0;
  for (const Status& s : later) {
    if (s.code() == StatusCode::kResourceExhausted) {
      ++refused;
      EXPECT_NE(s.message().find("the mask generation queue is full (1 of 1"), std::string::npos) << s.message();
    } else {
      ++answered;
      EXPECT_EQ(s.code(), StatusCode::kFailedPrecondition) << s.ToString();
    }
  }
  EXPECT_EQ(refused, 1);
  EXPECT_EQ(answered, 1);
  // 9 grid points per generation that ran, as multimask prompts through the decoder.
  EXPECT_EQ(t.engine.load()->decoded_prompts.load(), 2 * 9);
}

}  // namespace
}  // namespace maskd::server
