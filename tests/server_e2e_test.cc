// End to end with the real engine: a real maskd (in-process, ephemeral loopback port) serving the
// golden tiny model on CPU fp32, checked over gRPC against the original SAM's masks
// ($MASKD_GOLDEN_DIR/tiny: manifest.json, imageN.png, imageN.pt) within the golden README's
// tolerance (<= 0.1 % differing mask pixels). Plus: concurrent mixed requests equal sequential ones,
// the real engine's validation messages, refinement through a stream, and the maskd binary's
// start-up log line and clean exit on SIGTERM.
#include <gtest/gtest.h>

#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <fstream>
#include <future>
#include <sstream>
#include <thread>

#include <nlohmann/json.hpp>
#include <spdlog/spdlog.h>

#include "client/client.h"
#include "model/io/image_codec.h"
#include "model/io/rle.h"
#include "model/tensor_file.h"
#include "model/io/image_id.h"
#include "model/io/polygon.h"
#include "server/server.h"
#include "tests/golden_dir.h"

namespace maskd::server {
namespace {

using std::chrono::milliseconds;

std::string ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

struct GoldenCase {
  std::vector<std::array<float, 2>> points;
  std::vector<int> labels;
  std::optional<std::array<float, 4>> box;
  std::optional<int> mask_from;
  bool multimask = false;
};

struct GoldenImage {
  std::string name;
  std::string png;
  int width = 0, height = 0;
  std::vector<GoldenCase> cases;
  std::vector<std::array<float, 4>> batch_boxes;
  TensorMap tensors;
};

v1::Prompt ToPrompt(const GoldenCase& c) {
  v1::Prompt p;
  for (size_t i = 0; i < c.points.size(); ++i) {
    auto* pt = p.add_points();
    pt->set_x(c.points[i][0]);
    pt->set_y(c.points[i][1]);
    pt->set_label(c.labels[i] == 1 ? v1::POINT_LABEL_FOREGROUND : v1::POINT_LABEL_BACKGROUND);
  }
  if (c.box) {
    auto* b = p.mutable_box();
    b->set_x0((*c.box)[0]);
    b->set_y0((*c.box)[1]);
    b->set_x1((*c.box)[2]);
    b->set_y1((*c.box)[3]);
  }
  p.set_multimask(c.multimask);
  return p;
}

std::vector<uint8_t> MaskOf(const v1::MaskResult& m) {
  auto counts = RleCountsFromString(m.rle().counts());
  EXPECT_TRUE(counts.ok()) << counts.status().ToString();
  auto mask = RleDecode(*counts, m.rle().size(1), m.rle().size(0));
  EXPECT_TRUE(mask.ok()) << mask.status().ToString();
  return mask.ok() ? *mask : std::vector<uint8_t>();
}

// Fraction of pixels where `got` differs from mask `index` of a golden C x H x W uint8 tensor.
double DifferingFraction(const std::vector<uint8_t>& got, const HostTensor& golden, int64_t index) {
  const int64_t plane = golden.shape[golden.shape.size() - 2] * golden.shape.back();
  EXPECT_EQ(static_cast<int64_t>(got.size()), plane);
  int64_t diff = 0;
  for (int64_t i = 0; i < plane && i < static_cast<int64_t>(got.size()); ++i) {
    diff += (got[i] != 0) != (golden.data[index * plane + i] != 0);
  }
  return static_cast<double>(diff) / static_cast<double>(plane);
}

constexpr double kMaskTolerance = 1e-3;  // the golden README: <= 0.1 % of pixels
constexpr double kScoreTolerance = 1e-3;  // IoU predictions through the PNG path (resize included)

// One server for the whole suite: loading the engine is the slow part.
class ServerE2E : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    spdlog::set_level(spdlog::level::err);
    dir_ = ::maskd::testing::GoldenRoot() + "/tiny";
    if (!::maskd::testing::IsDir(dir_)) return;
    const nlohmann::json manifest = nlohmann::json::parse(ReadFile(dir_ + "/manifest.json"));
    for (const auto& im : manifest["images"]) {
      GoldenImage g;
      g.name = im["name"];
      g.png = ReadFile(dir_ + "/" + im["png"].get<std::string>());
      g.width = im["width"];
      g.height = im["height"];
      for (const auto& c : im["cases"]) {
        GoldenCase gc;
        if (c.contains("points")) {
          for (const auto& p : c["points"]) gc.points.push_back({p[0].get<float>(), p[1].get<float>()});
          for (const auto& l : c["labels"]) gc.labels.push_back(l.get<int>());
        }
        if (c.contains("box")) {
          gc.box = std::array<float, 4>{c["box"][0], c["box"][1], c["box"][2], c["box"][3]};
        }
        if (c.contains("mask_from")) gc.mask_from = c["mask_from"].get<int>();
        gc.multimask = c["multimask"];
        g.cases.push_back(gc);
      }
      for (const auto& b : im["batch_boxes"]) g.batch_boxes.push_back({b[0], b[1], b[2], b[3]});
      auto t = ReadTensorFile(dir_ + "/" + im["tensors"].get<std::string>());
      if (!t.ok()) {
        load_error_ = t.status().ToString();
        return;
      }
      g.tensors = std::move(*t);
      images_.push_back(std::move(g));
    }
    ServerConfig c;
    c.checkpoint = dir_ + "/" + manifest["checkpoint"].get<std::string>();
    c.device = "cpu";
    c.listen = "127.0.0.1:0";
    c.decoder_queue_delay_us = 1000;
    c.decode_threads = 2;
    c.postprocess_threads = 2;
    server_ = new MaskServer(c, &Engine::Create, 0);
    Status s = server_->Start();
    if (!s.ok()) {
      load_error_ = s.ToString();
      return;
    }
    client::ClientOptions co;
    co.target = "127.0.0.1:" + std::to_string(server_->port());
    co.timeout = milliseconds(120000);
    client_ = new client::Client(co);
  }
  static void TearDownTestSuite() {
    delete client_;
    client_ = nullptr;
    if (server_) server_->Shutdown();
    delete server_;
    server_ = nullptr;
  }
  void SetUp() override {
    MASKD_REQUIRE_GOLDEN(dir, "tiny");
    ASSERT_TRUE(load_error_.empty()) << load_error_;
    ASSERT_NE(client_, nullptr);
  }

  static const HostTensor& Tensor(const GoldenImage& g, const std::string& name) {
    const HostTensor* t = FindTensor(g.tensors, name);
    EXPECT_NE(t, nullptr) << g.name << " has no tensor " << name;
    static const HostTensor empty;
    return t ? *t : empty;
  }

  static v1::SegmentRequest ByPng(const GoldenImage& g) {
    v1::SegmentRequest r;
    r.mutable_image()->set_encoded(g.png);
    return r;
  }

  static std::string dir_;
  static std::string load_error_;
  static std::vector<GoldenImage> images_;
  static MaskServer* server_;
  static client::Client* client_;
};

std::string ServerE2E::dir_;
std::string ServerE2E::load_error_;
std::vector<GoldenImage> ServerE2E::images_;
MaskServer* ServerE2E::server_ = nullptr;
client::Client* ServerE2E::client_ = nullptr;

TEST_F(ServerE2E, ServingAndDescribed) {
  EXPECT_EQ(*client_->Health(), client::ServingStatus::kServing);
  auto info = client_->GetInfo();
  ASSERT_TRUE(info.ok());
  EXPECT_EQ(info->precision(), "fp32");
  EXPECT_EQ(info->model().encoder_embed_dim(), 96u);
  EXPECT_EQ(info->model().encoder_depth(), 4u);
  EXPECT_FALSE(info->model().demo());
  EXPECT_EQ(info->model().image_size(), 1024u);
  ASSERT_EQ(info->devices_size(), 1);
  EXPECT_EQ(info->devices(0).device(), "cpu");
}

TEST_F(ServerE2E, GoldenMasksOverGrpc) {
  for (const GoldenImage& g : images_) {
    std::vector<v1::SegmentResponse> responses;
    for (size_t k = 0; k < g.cases.size(); ++k) {
      const GoldenCase& c = g.cases[k];
      v1::SegmentRequest r = ByPng(g);
      v1::Prompt p = ToPrompt(c);
      if (c.mask_from) {
        // The original fed back the best-IoU mask's low-res logits: the default of mask_index.
        p.mutable_mask_input()->set_result_id(responses.at(*c.mask_from).results(0).result_id());
      }
      *r.add_prompts() = p;
      auto s = client_->Segment(r);
      ASSERT_TRUE(s.ok()) << g.name << " case" << k << ": " << s.status().ToString();
      ASSERT_EQ(s->width(), static_cast<uint32_t>(g.width));
      ASSERT_EQ(s->height(), static_cast<uint32_t>(g.height));
      EXPECT_EQ(s->cached(), k > 0) << g.name << " case" << k;
      const HostTensor& masks = Tensor(g, "case" + std::to_string(k) + ".masks");
      const std::vector<float> iou = Tensor(g, "case" + std::to_string(k) + ".iou_predictions").ToFloat();
      const auto& result = s->results(0);
      ASSERT_EQ(result.masks_size(), masks.shape[0]) << g.name << " case" << k;
      for (int m = 0; m < result.masks_size(); ++m) {
        const double frac = DifferingFraction(MaskOf(result.masks(m)), masks, m);
        EXPECT_LE(frac, kMaskTolerance) << g.name << " case" << k << " mask " << m;
        EXPECT_NEAR(result.masks(m).score(), iou[m], kScoreTolerance) << g.name << " case" << k;
      }
      responses.push_back(*s);
    }
  }
}

TEST_F(ServerE2E, GoldenBatchOfBoxesInOneRequestAndAsPng) {
  for (const GoldenImage& g : images_) {
    v1::SegmentRequest r = ByPng(g);
    r.set_output_format(v1::OUTPUT_FORMAT_PNG);
    for (const auto& b : g.batch_boxes) {
      GoldenCase c;
      c.box = b;
      c.multimask = true;
      *r.add_prompts() = ToPrompt(c);
    }
    auto s = client_->Segment(r);
    ASSERT_TRUE(s.ok()) << s.status().ToString();
    const HostTensor& masks = Tensor(g, "batch.masks");  // B x 3 x H x W
    ASSERT_EQ(s->results_size(), masks.shape[0]);
    for (int b = 0; b < s->results_size(); ++b) {
      ASSERT_EQ(s->results(b).masks_size(), 3);
      for (int m = 0; m < 3; ++m) {
        auto grey = DecodePngGray(s->results(b).masks(m).png());
        ASSERT_TRUE(grey.ok()) << grey.status().ToString();
        std::vector<uint8_t> bits(grey->pixels.size());
        for (size_t i = 0; i < bits.size(); ++i) bits[i] = grey->pixels[i] != 0;
        EXPECT_LE(DifferingFraction(bits, masks, b * 3 + m), kMaskTolerance) << g.name << " box " << b;
      }
    }
  }
}

// Issue #15: the real model's masks (several objects, holes, pieces cut by the image border) as
// polygons over gRPC: at tolerance 0 they rasterise back to exactly the RLE masks of the same prompts.
TEST_F(ServerE2E, GoldenMasksAsPolygonsRasteriseBackExactly) {
  int outers = 0, holes = 0, masks_with_pieces = 0;
  for (const GoldenImage& g : images_) {
    v1::SegmentRequest r = ByPng(g);
    for (const auto& b : g.batch_boxes) {
      GoldenCase c;
      c.box = b;
      c.multimask = true;
      *r.add_prompts() = ToPrompt(c);
    }
    auto rle = client_->Segment(r);
    r.set_output_format(v1::OUTPUT_FORMAT_POLYGONS);
    auto poly = client_->Segment(r);
    ASSERT_TRUE(rle.ok() && poly.ok()) << poly.status().ToString();
    ASSERT_EQ(poly->results_size(), rle->results_size());
    for (int b = 0; b < poly->results_size(); ++b) {
      for (int m = 0; m < poly->results(b).masks_size(); ++m) {
        const v1::MaskResult& pm = poly->results(b).masks(m);
        ASSERT_TRUE(pm.has_polygons());
        std::vector<Contour> contours;
        int pieces = 0;
        for (const v1::Polygon& p : pm.polygons().polygons()) {
          Contour c;
          for (float v : p.points()) c.xy.push_back(static_cast<int32_t>(v));
          c.hole = p.hole();
          c.parent = p.parent();
          if (c.hole) {
            ++holes;
            ASSERT_GE(c.parent, 0);
            ASSERT_FALSE(pm.polygons().polygons(c.parent).hole());
          } else {
            ++outers;
            ++pieces;
          }
          contours.push_back(std::move(c));
        }
        masks_with_pieces += pieces > 1;
        EXPECT_EQ(RasterisePolygons(contours, g.width, g.height), MaskOf(rle->results(b).masks(m)))
            << g.name << " box " << b << " mask " << m;
        EXPECT_EQ(pm.area(), rle->results(b).masks(m).area());
      }
    }
  }
  std::printf("polygons: %d outer contours, %d holes, %d masks of several pieces\n", outers, holes,
              masks_with_pieces);
  EXPECT_GT(outers, 0);
}

TEST_F(ServerE2E, ConcurrentMixedRequestsEqualSequential) {
  std::vector<v1::SegmentRequest> requests;
  for (const GoldenImage& g : images_) {
    for (size_t k = 0; k < g.cases.size(); ++k) {
      if (g.cases[k].mask_from) continue;
      v1::SegmentRequest r;
      r.set_image_id(ImageIdForEncoded(server_->workers()[0]->engine().description().identity, g.png));
      // Different prompt counts and multimask settings per request.
      for (size_t j = 0; j <= k; ++j) {
        if (!g.cases[j].mask_from) *r.add_prompts() = ToPrompt(g.cases[j]);
      }
      requests.push_back(r);
    }
  }
  // Embed the images first so that requests by image_id can run in any order.
  for (const GoldenImage& g : images_) {
    v1::EmbedRequest e;
    e.mutable_image()->set_encoded(g.png);
    ASSERT_TRUE(client_->Embed(e).ok());
  }
  std::vector<v1::SegmentResponse> sequential;
  for (const auto& r : requests) {
    auto s = client_->Segment(r);
    ASSERT_TRUE(s.ok()) << s.status().ToString();
    sequential.push_back(*s);
  }
  std::vector<std::future<StatusOr<v1::SegmentResponse>>> calls;
  for (const auto& r : requests) {
    calls.push_back(std::async(std::launch::async, [r] { return client_->Segment(r); }));
  }
  for (size_t i = 0; i < calls.size(); ++i) {
    auto c = calls[i].get();
    ASSERT_TRUE(c.ok()) << c.status().ToString();
    ASSERT_EQ(c->results_size(), sequential[i].results_size());
    for (int p = 0; p < c->results_size(); ++p) {
      for (int m = 0; m < c->results(p).masks_size(); ++m) {
        const auto a = MaskOf(c->results(p).masks(m));
        const auto b = MaskOf(sequential[i].results(p).masks(m));
        ASSERT_EQ(a.size(), b.size());
        int64_t diff = 0;
        for (size_t q = 0; q < a.size(); ++q) diff += a[q] != b[q];
        EXPECT_LE(static_cast<double>(diff) / a.size(), kMaskTolerance) << "request " << i;
        EXPECT_NEAR(c->results(p).masks(m).score(), sequential[i].results(p).masks(m).score(), 1e-4);
      }
    }
  }
}

TEST_F(ServerE2E, RealEngineValidationAndNotFound) {
  const GoldenImage& g = images_.at(0);  // 640 x 480
  v1::SegmentRequest r = ByPng(g);
  GoldenCase inside;
  inside.points = {{10, 10}};
  inside.labels = {1};
  GoldenCase outside;
  outside.points = {{700.5f, 10}};
  outside.labels = {1};
  *r.add_prompts() = ToPrompt(inside);
  *r.add_prompts() = ToPrompt(outside);
  auto s = client_->Segment(r);
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.status().message().find("prompts[1].points[0].x = 700.5"), std::string::npos)
      << s.status().message();
  EXPECT_NE(s.status().message().find("640"), std::string::npos) << s.status().message();

  GoldenCase unordered;
  unordered.box = std::array<float, 4>{100, 100, 50, 200};
  v1::SegmentRequest rb = ByPng(g);
  *rb.add_prompts() = ToPrompt(unordered);
  auto sb = client_->Segment(rb);
  EXPECT_EQ(sb.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(sb.status().message().find("prompts[0].box"), std::string::npos) << sb.status().message();

  v1::SegmentRequest unknown;
  unknown.set_image_id(std::string(64, 'c'));
  *unknown.add_prompts() = ToPrompt(inside);
  EXPECT_EQ(client_->Segment(unknown).status().code(), StatusCode::kNotFound);
}

TEST_F(ServerE2E, StreamRefinesWithResultIds) {
  const GoldenImage& g = images_.at(0);
  auto session = client_->OpenSession();
  v1::SegmentRequest first = ByPng(g);
  *first.add_prompts() = ToPrompt(g.cases[0]);
  auto r0 = session->Send(first);
  ASSERT_TRUE(r0.ok()) << r0.status().ToString();
  // The golden case 4: a click refining case 0's best mask, on the stream's current image.
  v1::SegmentRequest next;
  v1::Prompt p = ToPrompt(g.cases[4]);
  p.mutable_mask_input()->set_result_id(r0->results(0).result_id());
  *next.add_prompts() = p;
  auto r1 = session->Send(next);
  ASSERT_TRUE(r1.ok()) << r1.status().ToString();
  EXPECT_TRUE(r1->cached());
  EXPECT_LE(DifferingFraction(MaskOf(r1->results(0).masks(0)), Tensor(g, "case4.masks"), 0), kMaskTolerance);
  EXPECT_TRUE(session->Finish().ok());
}

// The binary: logs `listening on HOST:PORT`, becomes SERVING, and exits 0 on SIGTERM.
TEST_F(ServerE2E, BinaryStartsServesAndExitsCleanlyOnSigterm) {
  const std::string binary = std::string(MASKD_BINARY_DIR) + "/server/maskd";
  ASSERT_EQ(access(binary.c_str(), X_OK), 0) << binary << " is not built";
  int out[2];
  ASSERT_EQ(pipe(out), 0);
  const std::string ckpt = dir_ + "/sam_tiny.pth";
  const pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    dup2(out[1], 2);
    dup2(out[1], 1);
    close(out[0]);
    execl(binary.c_str(), binary.c_str(), "--checkpoint", ckpt.c_str(), "--device", "cpu", "--listen",
          "127.0.0.1:0", static_cast<char*>(nullptr));
    _exit(127);
  }
  close(out[1]);
  std::string log;
  std::string address;
  char buf[4096];
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(120);
  while (address.empty() && std::chrono::steady_clock::now() < deadline) {
    const ssize_t n = read(out[0], buf, sizeof buf);
    if (n <= 0) break;
    log.append(buf, static_cast<size_t>(n));
    const size_t at = log.find("listening on ");
    const size_t eol = at == std::string::npos ? at : log.find('\n', at);
    if (eol != std::string::npos) address = log.substr(at + 13, eol - at - 13);
  }
  ASSERT_FALSE(address.empty()) << log;
  client::ClientOptions co;
  co.target = address;
  co.timeout = milliseconds(5000);
  client::Client c(co);
  bool serving = false;
  for (int i = 0; i < 1200 && !serving; ++i) {
    auto h = c.Health();
    serving = h.ok() && *h == client::ServingStatus::kServing;
    if (!serving) std::this_thread::sleep_for(milliseconds(100));
  }
  EXPECT_TRUE(serving) << log;
  v1::EmbedRequest e;
  e.mutable_image()->set_encoded(images_.at(0).png);
  EXPECT_TRUE(c.Embed(e).ok());
  kill(pid, SIGTERM);
  // Drain the pipe so the child never blocks on its log, then collect its exit status.
  fcntl(out[0], F_SETFL, O_NONBLOCK);
  int status = 0;
  for (int i = 0; i < 600; ++i) {
    ssize_t n;
    while ((n = read(out[0], buf, sizeof buf)) > 0) log.append(buf, static_cast<size_t>(n));
    if (waitpid(pid, &status, WNOHANG) == pid) break;
    std::this_thread::sleep_for(milliseconds(50));
    if (i == 599) {
      kill(pid, SIGKILL);
      waitpid(pid, &status, 0);
      FAIL() << "maskd did not exit within 30 s of SIGTERM:\n" << log;
    }
  }
  close(out[0]);
  EXPECT_TRUE(WIFEXITED(status)) << log;
  EXPECT_EQ(WEXITSTATUS(status), 0) << log;
  EXPECT_NE(log.find("access method=Embed"), std::string::npos) << log;
  EXPECT_NE(log.find("shut down"), std::string::npos) << log;
}

}  // namespace
}  // namespace maskd::server
