// maskd_client and maskctl against an in-process fake server (tests/fake_maskd.h): the wire
// requests they build, how they decode masks, how errors come back, and the command line itself.
#include <gtest/gtest.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>

#include <nlohmann/json.hpp>

#include "client/client.h"
#include "client/mask_codec.h"
#include "client/maskctl_commands.h"
#include "fake_maskd.h"
#include "model/io/image_codec.h"
#include "model/io/image_id.h"
#include "tests/maskctl_runner.h"

namespace maskd::client {
namespace {

using maskd::testing::FakeMaskd;
using maskd::testing::FakeMaskService;

std::string TestPng(int w, int h) {
  ImageRGB8 im{w, h, std::vector<uint8_t>(static_cast<size_t>(w) * h * 3)};
  for (size_t i = 0; i < im.pixels.size(); ++i) im.pixels[i] = static_cast<uint8_t>(i * 7);
  return *EncodePngRgb(im);
}

std::unique_ptr<Client> ConnectTo(const FakeMaskd& server) {
  ClientOptions o;
  o.target = server.target();
  o.timeout = std::chrono::milliseconds(5000);
  StatusOr<std::unique_ptr<Client>> c = Client::Connect(o);
  EXPECT_TRUE(c.ok()) << c.status().ToString();
  return c.ok() ? std::move(*c) : nullptr;
}

TEST(ClientFake, EmbedThenSegmentByIdDecodesRle) {
  FakeMaskd server;
  auto client = ConnectTo(server);
  ASSERT_TRUE(client);
  const std::string png = TestPng(64, 48);
  StatusOr<v1::EmbedResponse> e = client->Embed(png);
  ASSERT_TRUE(e.ok()) << e.status().ToString();
  EXPECT_EQ(e->width(), 64u);
  EXPECT_EQ(e->height(), 48u);

  SegmentArgs args;
  args.image = ImageArg::Id(e->image_id());
  PromptArg p;
  p.points = {{20.5f, 30.5f, true}};
  p.multimask = true;
  args.prompts = {p};
  StatusOr<v1::SegmentResponse> r = client->Segment(args);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  ASSERT_EQ(r->results_size(), 1);
  ASSERT_EQ(r->results(0).masks_size(), 3);
  StatusOr<std::vector<uint8_t>> mask = DecodeMask(r->results(0).masks(0), 64, 48);
  ASSERT_TRUE(mask.ok()) << mask.status().ToString();
  EXPECT_EQ(*mask, FakeMaskService::SquareMask(20.5f, 30.5f, 64, 48));
  // The fake saw what BuildSegmentRequest built.
  EXPECT_EQ(server.service.last_request.image_id(), e->image_id());
  EXPECT_TRUE(server.service.last_request.prompts(0).multimask());
}

TEST(ClientFake, PngAndRleDecodeToTheSameMask) {
  FakeMaskd server;
  auto client = ConnectTo(server);
  ASSERT_TRUE(client);
  SegmentArgs args;
  args.image = ImageArg::Encoded(TestPng(50, 40));
  args.prompts = {PromptArg{{{3, 35, true}}, std::nullopt, "", std::nullopt, false}};
  StatusOr<v1::SegmentResponse> rle = client->Segment(args);
  args.format = v1::OUTPUT_FORMAT_PNG;
  StatusOr<v1::SegmentResponse> png = client->Segment(args);
  ASSERT_TRUE(rle.ok() && png.ok());
  ASSERT_FALSE(png->results(0).masks(0).png().empty());
  StatusOr<std::vector<uint8_t>> a = DecodeMask(rle->results(0).masks(0), 50, 40);
  StatusOr<std::vector<uint8_t>> b = DecodeMask(png->results(0).masks(0), 50, 40);
  ASSERT_TRUE(a.ok() && b.ok()) << a.status().ToString() << b.status().ToString();
  EXPECT_EQ(*a, *b);
  // A mask of the wrong size is refused, naming the field.
  EXPECT_NE(DecodeMask(rle->results(0).masks(0), 40, 50).status().message().find("mask.rle.size"),
            std::string::npos);
}

TEST(ClientFake, ServerErrorsKeepCodeAndMessage) {
  FakeMaskd server;
  auto client = ConnectTo(server);
  ASSERT_TRUE(client);
  SegmentArgs args;
  args.image = ImageArg::Id(FakeMaskService::kMissingId);
  args.prompts = {PromptArg{{{1, 1, true}}, std::nullopt, "", std::nullopt, false}};
  StatusOr<v1::SegmentResponse> r = client->Segment(args);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kNotFound);
  EXPECT_NE(r.status().message().find("re-send the image"), std::string::npos);

  StatusOr<v1::EmbedResponse> e = client->Embed(std::string("not an image"));
  ASSERT_FALSE(e.ok());
  EXPECT_EQ(e.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(e.status().message().find("image.encoded"), std::string::npos);
}

TEST(ClientFake, HealthAndInfo) {
  FakeMaskd server;
  auto client = ConnectTo(server);
  ASSERT_TRUE(client);
  StatusOr<ServingStatus> h = client->Health();
  ASSERT_TRUE(h.ok()) << h.status().ToString();
  EXPECT_EQ(*h, ServingStatus::kServing);
  StatusOr<ServingStatus> whole = client->Health("");
  ASSERT_TRUE(whole.ok()) << whole.status().ToString();
  EXPECT_EQ(*whole, ServingStatus::kServing);
  // grpc's health service answers NOT_FOUND for a service it does not know.
  EXPECT_EQ(client->Health("no.such.Service").status().code(), StatusCode::kNotFound);
  StatusOr<v1::GetInfoResponse> info = client->GetInfo();
  ASSERT_TRUE(info.ok());
  EXPECT_EQ(info->model().arch(), "fake");
}

TEST(ClientFake, ConnectToNothingIsUnavailableNamingTheTarget) {
  ClientOptions o;
  o.target = "127.0.0.1:1";
  o.connect_timeout = std::chrono::milliseconds(300);
  StatusOr<std::unique_ptr<Client>> c = Client::Connect(o);
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.status().code(), StatusCode::kUnavailable);
  EXPECT_NE(c.status().message().find("127.0.0.1:1"), std::string::npos);
  // A call on an unconnected client honours its deadline.
  o.timeout = std::chrono::milliseconds(300);
  Client lazy(o);
  const auto t0 = std::chrono::steady_clock::now();
  StatusOr<v1::GetInfoResponse> info = lazy.GetInfo();
  EXPECT_FALSE(info.ok());
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(3));
}

TEST(ClientFake, SegmentSessionKeepsImageAndSurvivesErrors) {
  FakeMaskd server;
  auto client = ConnectTo(server);
  ASSERT_TRUE(client);
  std::unique_ptr<SegmentSession> session = client->OpenSession(std::chrono::milliseconds(10000));
  SegmentArgs first;
  first.image = ImageArg::Encoded(TestPng(32, 32));
  first.prompts = {PromptArg{{{5, 5, true}}, std::nullopt, "", std::nullopt, false}};
  StatusOr<v1::SegmentResponse> a = session->Send(first);
  ASSERT_TRUE(a.ok()) << a.status().ToString();
  // No image: the stream's current one.
  SegmentArgs click;
  click.prompts = {PromptArg{{{20, 20, true}}, std::nullopt, "", std::nullopt, false}};
  StatusOr<v1::SegmentResponse> b = session->Send(click);
  ASSERT_TRUE(b.ok()) << b.status().ToString();
  EXPECT_EQ(b->image_id(), a->image_id());
  // A bad message is an error response; the stream stays open.
  SegmentArgs empty;
  StatusOr<v1::SegmentResponse> c = session->Send(empty);
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.status().code(), StatusCode::kInvalidArgument);
  StatusOr<v1::SegmentResponse> d = session->Send(click);
  EXPECT_TRUE(d.ok()) << d.status().ToString();
  EXPECT_TRUE(session->Finish().ok());
  EXPECT_EQ(session->Send(click).status().code(), StatusCode::kFailedPrecondition);
}

PromptArg ClickAt(float x, float y) { return PromptArg{{{x, y, true}}, std::nullopt, "", std::nullopt, false}; }

// The last call the fake saw with `method`.
FakeMaskService::SeenCall LastCall(FakeMaskd& server, const std::string& method) {
  std::vector<FakeMaskService::SeenCall> seen = server.service.seen_calls();
  for (auto it = seen.rbegin(); it != seen.rend(); ++it) {
    if (it->method == method) return *it;
  }
  ADD_FAILURE() << "the fake saw no " << method << " call";
  return {};
}

TEST(ClientFake, AffinityHeaderIsTheImageIdTheServerAnswers) {
  FakeMaskd server;
  auto client = ConnectTo(server);
  ASSERT_TRUE(client);
  ASSERT_TRUE(client->options().affinity_header);  // on by default
  const std::string png = TestPng(40, 30);

  // Bytes: the id computed on the client before the call equals the one the server answers.
  StatusOr<v1::EmbedResponse> e = client->Embed(png);
  ASSERT_TRUE(e.ok()) << e.status().ToString();
  EXPECT_EQ(LastCall(server, "Embed").affinity, e->image_id());

  SegmentArgs by_id;
  by_id.image = ImageArg::Id(e->image_id());
  by_id.prompts = {ClickAt(3, 4)};
  StatusOr<v1::SegmentResponse> r = client->Segment(by_id);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(LastCall(server, "Segment").affinity, e->image_id());

  SegmentArgs by_bytes;
  by_bytes.image = ImageArg::Encoded(TestPng(41, 30));
  by_bytes.prompts = {ClickAt(3, 4)};
  StatusOr<v1::SegmentResponse> rb = client->Segment(by_bytes);
  ASSERT_TRUE(rb.ok()) << rb.status().ToString();
  EXPECT_EQ(LastCall(server, "Segment").affinity, rb->image_id());
  EXPECT_NE(rb->image_id(), e->image_id());

  // Streams carry the header of their first request's image (metadata is sent when they open).
  {
    std::unique_ptr<SegmentSession> session = client->OpenSession(std::chrono::milliseconds(10000));
    SegmentArgs first;
    first.image = ImageArg::Encoded(TestPng(42, 30));
    first.prompts = {ClickAt(5, 5)};
    StatusOr<v1::SegmentResponse> a = session->Send(first);
    ASSERT_TRUE(a.ok()) << a.status().ToString();
    EXPECT_EQ(LastCall(server, "SegmentStream").affinity, a->image_id());
    EXPECT_TRUE(session->Finish().ok());
  }
  {
    std::unique_ptr<SegmentSession> session = client->OpenSession();
    StatusOr<v1::SegmentResponse> a = session->Send(by_id);
    ASSERT_TRUE(a.ok()) << a.status().ToString();
    EXPECT_EQ(LastCall(server, "SegmentStream").affinity, e->image_id());
  }
  // The identity came from one GetInfo, however many calls with bytes needed it.
  EXPECT_EQ(server.service.infos.load(), 1u);
  // A session that never sent anything opened no stream.
  const size_t streams_before = server.service.seen_calls().size();
  { client->OpenSession(); }
  EXPECT_EQ(server.service.seen_calls().size(), streams_before);
}

TEST(ClientFake, NoAffinityHeaderWhenOffOrWithoutIdentity) {
  FakeMaskd server;
  const std::string png = TestPng(40, 30);
  SegmentArgs by_bytes;
  by_bytes.image = ImageArg::Encoded(png);
  by_bytes.prompts = {ClickAt(3, 4)};
  {
    ClientOptions o;
    o.target = server.target();
    o.affinity_header = false;
    Client client(o);
    StatusOr<v1::EmbedResponse> e = client.Embed(png);
    ASSERT_TRUE(e.ok()) << e.status().ToString();
    EXPECT_EQ(LastCall(server, "Embed").affinity, std::nullopt);
    SegmentArgs by_id = by_bytes;
    by_id.image = ImageArg::Id(e->image_id());
    ASSERT_TRUE(client.Segment(by_id).ok());
    EXPECT_EQ(LastCall(server, "Segment").affinity, std::nullopt);
    ASSERT_TRUE(client.OpenSession()->Send(by_bytes).ok());
    EXPECT_EQ(LastCall(server, "SegmentStream").affinity, std::nullopt);
    EXPECT_EQ(server.service.infos.load(), 0u);  // off: not even asked
  }
  // A server that reports no identity: bytes go without the header, ids still carry it.
  server.service.report_identity.store(false);
  auto client = ConnectTo(server);
  ASSERT_TRUE(client);
  StatusOr<v1::SegmentResponse> r = client->Segment(by_bytes);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(LastCall(server, "Segment").affinity, std::nullopt);
  SegmentArgs by_id = by_bytes;
  by_id.image = ImageArg::Id(r->image_id());
  ASSERT_TRUE(client->Segment(by_id).ok());
  EXPECT_EQ(LastCall(server, "Segment").affinity, r->image_id());
  ASSERT_TRUE(client->Embed(png).ok());
  EXPECT_EQ(server.service.infos.load(), 1u);  // the empty identity was kept, not asked for again
}

TEST(ClientFake, FailedIdentityLookupIsNotRepeatedAtOnce) {
  ClientOptions o;
  o.target = "127.0.0.1:1";
  o.timeout = std::chrono::milliseconds(300);
  Client client(o);
  StatusOr<std::string> first = client.ModelIdentity();
  ASSERT_FALSE(first.ok());
  EXPECT_NE(first.status().message().find("GetInfo"), std::string::npos) << first.status().ToString();
  const auto t0 = std::chrono::steady_clock::now();
  StatusOr<std::string> second = client.ModelIdentity();
  ASSERT_FALSE(second.ok());
  EXPECT_NE(second.status().message().find("not asking again yet"), std::string::npos)
      << second.status().ToString();
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::milliseconds(100));
  // Without an identity a call with bytes still goes out (and here fails only for want of a server).
  v1::SegmentRequest req;
  req.mutable_image()->set_encoded("x");
  EXPECT_EQ(client.AffinityKeyFor(req), std::nullopt);
  req.set_image_id("abc");
  EXPECT_EQ(client.AffinityKeyFor(req), "abc");
}

// maskctl's real command line (tests/maskctl_runner.h) is run against the fake.

class MaskctlFake : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::temp_directory_path() /
           ("maskctl_test_" + std::to_string(::getpid()) + "_" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    std::filesystem::create_directories(dir_);
    image_ = (dir_ / "in.png").string();
    ASSERT_TRUE(WriteFileBytes(image_, TestPng(80, 60)).ok());
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }
  std::filesystem::path dir_;
  std::string image_;
  FakeMaskd server_;
};

TEST_F(MaskctlFake, SegmentWritesJsonAndOverlay) {
  Maskctl m;
  const std::string json = (dir_ / "out.json").string(), overlay = (dir_ / "overlay.png").string();
  // Options before and after the positional IMAGE, repeated --point.
  const int rc = m.Run({"--server", server_.target(), "segment", "--point", "40,30", image_,
                        "--point", "70,50,0", "--multimask", "--out-json", json, "--out-overlay",
                        overlay, "--tag", "t-42"});
  ASSERT_EQ(rc, 0) << m.err.str();
  const v1::SegmentRequest& seen = server_.service.last_request;
  ASSERT_EQ(seen.prompts_size(), 1);
  ASSERT_EQ(seen.prompts(0).points_size(), 2);
  EXPECT_EQ(seen.prompts(0).points(1).label(), v1::POINT_LABEL_BACKGROUND);
  EXPECT_TRUE(seen.prompts(0).multimask());
  EXPECT_EQ(seen.request_tag(), "t-42");
  EXPECT_NE(m.out.str().find("mask 2 *"), std::string::npos) << m.out.str();

  std::ifstream jf(json);
  nlohmann::json j = nlohmann::json::parse(jf);
  EXPECT_EQ(j["width"], 80);
  EXPECT_EQ(j["results"][0]["masks"].size(), 3u);
  EXPECT_EQ(j["results"][0]["masks"][0]["rle"]["size"][0], 60);

  StatusOr<std::string> png = ReadFileBytes(overlay);
  ASSERT_TRUE(png.ok());
  StatusOr<ImageRGB8> im = DecodeImage(*png);
  ASSERT_TRUE(im.ok()) << im.status().ToString();
  EXPECT_EQ(im->width, 80);
  EXPECT_EQ(im->height, 60);
  // Inside the fake's square around (40, 30), away from the point marker: blended pixels differ from
  // the input; far outside they are unchanged.
  StatusOr<ImageRGB8> in = DecodeImage(*ReadFileBytes(image_));
  auto at = [](const ImageRGB8& i, int x, int y) { return &i.pixels[(y * i.width + x) * 3]; };
  EXPECT_NE(std::vector<uint8_t>(at(*im, 33, 23), at(*im, 33, 23) + 3),
            std::vector<uint8_t>(at(*in, 33, 23), at(*in, 33, 23) + 3));
  EXPECT_EQ(std::vector<uint8_t>(at(*im, 5, 5), at(*im, 5, 5) + 3),
            std::vector<uint8_t>(at(*in, 5, 5), at(*in, 5, 5) + 3));
}

TEST_F(MaskctlFake, UsageErrorsAndServerErrors) {
  {
    Maskctl m;  // neither IMAGE nor --image-id
    EXPECT_EQ(m.Run({"--server", server_.target(), "segment", "--point", "1,1"}), 1);
    EXPECT_NE(m.err.str().find("exactly one of IMAGE or --image-id"), std::string::npos);
  }
  {
    Maskctl m;  // no prompt
    EXPECT_EQ(m.Run({"--server", server_.target(), "segment", image_}), 1);
    EXPECT_NE(m.err.str().find("--point"), std::string::npos);
  }
  {
    Maskctl m;  // bad point text
    EXPECT_EQ(m.Run({"--server", server_.target(), "segment", image_, "--point", "1;2"}), 1);
    EXPECT_NE(m.err.str().find("'1;2'"), std::string::npos) << m.err.str();
  }
  {
    Maskctl m;  // overlay without pixels
    EXPECT_EQ(m.Run({"--server", server_.target(), "segment", "--image-id", "x", "--point", "1,1",
                     "--out-overlay", (dir_ / "o.png").string()}),
              1);
    EXPECT_NE(m.err.str().find("needs IMAGE"), std::string::npos);
  }
  {
    Maskctl m;  // NOT_FOUND from the server, message passed through
    EXPECT_EQ(m.Run({"--server", server_.target(), "segment", "--image-id",
                     FakeMaskService::kMissingId, "--point", "1,1"}),
              1);
    EXPECT_NE(m.err.str().find("NOT_FOUND"), std::string::npos) << m.err.str();
    EXPECT_NE(m.err.str().find("re-send the image"), std::string::npos);
  }
  {
    Maskctl m;
    EXPECT_EQ(m.Run({"--server", server_.target(), "segment", image_, "--point", "1,1", "--format",
                     "jpeg"}),
              100);
  }
}

TEST_F(MaskctlFake, EmbedInfoHealth) {
  {
    Maskctl m;
    ASSERT_EQ(m.Run({"--server", server_.target(), "embed", image_}), 0) << m.err.str();
    const std::string id = ImageIdForEncoded(FakeMaskService::kIdentity, *ReadFileBytes(image_));
    EXPECT_NE(m.out.str().find("image_id " + id), std::string::npos) << m.out.str();
    EXPECT_NE(m.out.str().find("80x60"), std::string::npos);
  }
  {
    Maskctl m;
    ASSERT_EQ(m.Run({"--server", server_.target(), "info", "--json"}), 0) << m.err.str();
    nlohmann::json j = nlohmann::json::parse(m.out.str());
    EXPECT_EQ(j["model"]["arch"], "fake");
  }
  {
    Maskctl m;
    ASSERT_EQ(m.Run({"--server", server_.target(), "info"}), 0) << m.err.str();
    EXPECT_NE(m.out.str().find("model: fake"), std::string::npos) << m.out.str();
  }
  {
    Maskctl m;
    EXPECT_EQ(m.Run({"--server", server_.target(), "health"}), 0);
    EXPECT_EQ(m.out.str(), "SERVING\n");
  }
  {
    // MASKD_SERVER is the default of --server.
    ::setenv("MASKD_SERVER", server_.target().c_str(), 1);
    Maskctl m;
    EXPECT_EQ(m.Run({"health"}), 0) << m.err.str();
    ::unsetenv("MASKD_SERVER");
  }
}

TEST(MaskctlFakeHealth, WaitReturnsOnceServingAndGivesUpWithExitTwo) {
  FakeMaskd server;
  server.SetServing(false);
  {
    // Not serving and no --wait: one answer, exit 2.
    Maskctl m;
    EXPECT_EQ(m.Run({"--server", server.target(), "health"}), 2) << m.err.str();
    EXPECT_EQ(m.out.str(), "NOT_SERVING\n");
  }
  {
    // --wait gives up after its time with the last answer.
    Maskctl m;
    const auto t0 = std::chrono::steady_clock::now();
    EXPECT_EQ(m.Run({"--server", server.target(), "health", "--wait", "0.3"}), 2) << m.err.str();
    EXPECT_GE(std::chrono::steady_clock::now() - t0, std::chrono::milliseconds(300));
    EXPECT_EQ(m.out.str(), "NOT_SERVING\n");
  }
  {
    // It returns once the server says SERVING, long before its time is up.
    std::thread flip([&] {
      std::this_thread::sleep_for(std::chrono::milliseconds(200));
      server.SetServing(true);
    });
    Maskctl m;
    const auto t0 = std::chrono::steady_clock::now();
    EXPECT_EQ(m.Run({"--server", server.target(), "health", "--wait", "30"}), 0) << m.err.str();
    flip.join();
    EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(10));
    EXPECT_EQ(m.out.str(), "SERVING\n");
  }
}

TEST(MaskctlFakeHealth, WaitOnANonListeningAddressFailsUnavailableAfterItsTime) {
  Maskctl m;
  const auto t0 = std::chrono::steady_clock::now();
  EXPECT_EQ(m.Run({"--server", "127.0.0.1:1", "health", "--wait", "0.5"}), 1);
  EXPECT_GE(std::chrono::steady_clock::now() - t0, std::chrono::milliseconds(500));
  EXPECT_NE(m.err.str().find("UNAVAILABLE"), std::string::npos) << m.err.str();
}

}  // namespace
}  // namespace maskd::client
