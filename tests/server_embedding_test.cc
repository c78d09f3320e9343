// Embed's return_embedding (issue #15, "embeddings to the client") through real gRPC and the HTTP
// front on a fake engine: the bytes decode to the engine's embedding (fp32 exactly; bf16 and fp16
// equal the round-to-nearest-even of those fp32 values), the sizes SamPredictor needs come back, a
// cached image answers without encoding again, an unknown dtype is refused naming the field, and an
// fp32 embedding is over gRPC clients' 4 MiB default receive limit while bf16/fp16 are not.
#include <gtest/gtest.h>

#include <httplib.h>

#include <cstring>

#include <google/protobuf/util/json_util.h>
#include <grpcpp/grpcpp.h>
#include <nlohmann/json.hpp>
#include <spdlog/spdlog.h>

#include "client/client.h"
#include "model/api/half.h"
#include "model/io/image_codec.h"
#include "server/server.h"
#include "tests/fake_engine.h"
#include "tests/server_fixture.h"

namespace maskd::server {
namespace {

using fake::FakeEngine;
using std::chrono::milliseconds;

struct Maskd {
  Maskd() {
    spdlog::set_level(spdlog::level::err);
    ServerConfig c = TestConfig(/*threads=*/2);
    c.http_listen = "127.0.0.1:0";
    server = std::make_unique<MaskServer>(c, FakeFactory(), 0);
    Status s = server->StartListening();
    EXPECT_TRUE(s.ok()) << s.ToString();
    s = server->LoadAndServe();
    EXPECT_TRUE(s.ok()) << s.ToString();
    client::ClientOptions co;
    co.target = Target();
    co.timeout = milliseconds(20000);
    client = std::make_unique<client::Client>(co);
  }
  ~Maskd() { server->Shutdown(); }
  std::string Target() const { return "127.0.0.1:" + std::to_string(server->port()); }
  FakeEngine& engine() { return static_cast<FakeEngine&>(server->workers()[0]->engine()); }

  std::unique_ptr<MaskServer> server;
  std::unique_ptr<client::Client> client;
};

ImageRGB8 Picture(int w, int h) {
  ImageRGB8 im{w, h, std::vector<uint8_t>(static_cast<size_t>(w) * h * 3)};
  for (size_t i = 0; i < im.pixels.size(); ++i) im.pixels[i] = static_cast<uint8_t>(i * 13 % 253);
  return im;
}

v1::EmbedRequest Request(const ImageRGB8& im, v1::EmbeddingDtype dtype) {
  v1::EmbedRequest r;
  r.mutable_image()->set_encoded(*EncodePngRgb(im));
  r.set_return_embedding(dtype);
  return r;
}

// The fp32 values the fake engine holds for `im`.
std::vector<float> Expected(const ImageRGB8& im) {
  return FakeEngine::EmbeddingValues(FakeEngine::Checksum(im));
}

// Checks `e` against `want` for its dtype: fp32 bit for bit, 16-bit types as their roundings.
void ExpectEmbedding(const v1::ImageEmbedding& e, const std::vector<float>& want) {
  ASSERT_EQ(e.shape_size(), 4);
  EXPECT_EQ(e.shape(0), 1u);
  EXPECT_EQ(e.shape(1), 256u);
  EXPECT_EQ(e.shape(2), 64u);
  EXPECT_EQ(e.shape(3), 64u);
  const std::string& data = e.data();
  if (e.dtype() == v1::EMBEDDING_DTYPE_FP32) {
    ASSERT_EQ(data.size(), want.size() * 4);
    EXPECT_EQ(std::memcmp(data.data(), want.data(), data.size()), 0);
    return;
  }
  ASSERT_TRUE(e.dtype() == v1::EMBEDDING_DTYPE_BF16 || e.dtype() == v1::EMBEDDING_DTYPE_FP16);
  ASSERT_EQ(data.size(), want.size() * 2);
  size_t wrong = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    // Little-endian on the wire, whatever the host.
    const uint16_t got = static_cast<uint16_t>(static_cast<uint8_t>(data[2 * i]) |
                                               static_cast<uint8_t>(data[2 * i + 1]) << 8);
    const uint16_t expect =
        e.dtype() == v1::EMBEDDING_DTYPE_BF16 ? FloatToBf16(want[i]) : FloatToHalf(want[i]);
    wrong += got != expect;
  }
  EXPECT_EQ(wrong, 0u) << v1::EmbeddingDtype_Name(e.dtype());
}

TEST(ServerEmbedding, ReturnsEachDtypeWithTheSizesSamPredictorNeeds) {
  Maskd m;
  const ImageRGB8 im = Picture(640, 480);
  const std::vector<float> want = Expected(im);
  for (v1::EmbeddingDtype d :
       {v1::EMBEDDING_DTYPE_FP32, v1::EMBEDDING_DTYPE_BF16, v1::EMBEDDING_DTYPE_FP16}) {
    auto r = m.client->Embed(Request(im, d));
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    ASSERT_TRUE(r->has_embedding()) << v1::EmbeddingDtype_Name(d);
    EXPECT_EQ(r->embedding().dtype(), d);
    ExpectEmbedding(r->embedding(), want);
    EXPECT_EQ(r->embedding().input_width(), 1024u);
    EXPECT_EQ(r->embedding().input_height(), 768u);
    EXPECT_EQ(r->embedding().original_width(), 640u);
    EXPECT_EQ(r->embedding().original_height(), 480u);
  }
  EXPECT_EQ(m.engine().export_calls.load(), 3);
  EXPECT_EQ(m.engine().encode_calls.load(), 1);  // the later two were cache hits
}

TEST(ServerEmbedding, NotAskedNotSentAndCachedImagesAnswerWithoutEncoding) {
  Maskd m;
  const ImageRGB8 im = Picture(300, 500);
  auto plain = m.client->Embed(Request(im, v1::EMBEDDING_DTYPE_UNSPECIFIED));
  ASSERT_TRUE(plain.ok()) << plain.status().ToString();
  EXPECT_FALSE(plain->has_embedding());
  EXPECT_EQ(m.engine().export_calls.load(), 0);
  auto cached = m.client->Embed(Request(im, v1::EMBEDDING_DTYPE_BF16));
  ASSERT_TRUE(cached.ok()) << cached.status().ToString();
  EXPECT_TRUE(cached->cached());
  EXPECT_EQ(cached->image_id(), plain->image_id());
  ExpectEmbedding(cached->embedding(), Expected(im));
  EXPECT_EQ(cached->embedding().input_width(), 614u);  // 300 * 1024 / 500, rounded half up
  EXPECT_EQ(cached->embedding().input_height(), 1024u);
  EXPECT_EQ(m.engine().encode_calls.load(), 1);
}

TEST(ServerEmbedding, UnknownDtypeIsRefusedNamingTheField) {
  Maskd m;
  v1::EmbedRequest r = Request(Picture(32, 32), v1::EMBEDDING_DTYPE_FP16);
  r.set_return_embedding(static_cast<v1::EmbeddingDtype>(7));
  auto res = m.client->Embed(r);
  ASSERT_FALSE(res.ok());
  EXPECT_EQ(res.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(res.status().message().find("return_embedding = 7"), std::string::npos)
      << res.status().message();
  EXPECT_NE(res.status().message().find("EMBEDDING_DTYPE_BF16"), std::string::npos);
  EXPECT_EQ(m.engine().encode_calls.load(), 0);
}

TEST(ServerEmbedding, Fp32IsOverTheDefaultReceiveLimitAnd16BitIsNot) {
  Maskd m;
  const ImageRGB8 im = Picture(64, 64);
  // A plain gRPC channel keeps the 4 MiB default, as third-party clients do.
  auto stub = v1::MaskService::NewStub(grpc::CreateChannel(m.Target(), grpc::InsecureChannelCredentials()));
  for (v1::EmbeddingDtype d : {v1::EMBEDDING_DTYPE_BF16, v1::EMBEDDING_DTYPE_FP16, v1::EMBEDDING_DTYPE_FP32}) {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(20));
    v1::EmbedResponse resp;
    const grpc::Status s = stub->Embed(&ctx, Request(im, d), &resp);
    if (d == v1::EMBEDDING_DTYPE_FP32) {
      EXPECT_EQ(s.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED) << s.error_message();
    } else {
      ASSERT_TRUE(s.ok()) << s.error_message();
      EXPECT_EQ(resp.embedding().data().size(), size_t{2} << 20);
      EXPECT_LT(resp.ByteSizeLong(), size_t{4} << 20);
    }
  }
  // maskd's own client raises the limit.
  auto r = m.client->Embed(Request(im, v1::EMBEDDING_DTYPE_FP32));
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_GT(r->ByteSizeLong(), size_t{4} << 20);
}

TEST(ServerEmbedding, HttpFrontReturnsItAsBase64Json) {
  Maskd m;
  const ImageRGB8 im = Picture(200, 100);
  httplib::Client http("127.0.0.1", m.server->http_port());
  http.set_read_timeout(20, 0);
  const std::string png = *EncodePngRgb(im);
  v1::EmbedRequest req;
  req.mutable_image()->set_encoded(png);
  std::string body;
  ASSERT_TRUE(google::protobuf::util::MessageToJsonString(req, &body).ok());
  // As a browser would write it: the enum by name.
  nlohmann::json j = nlohmann::json::parse(body);
  j["return_embedding"] = "EMBEDDING_DTYPE_FP16";
  auto res = http.Post("/v1/embed", j.dump(), "application/json");
  ASSERT_TRUE(res) << httplib::to_string(res.error());
  ASSERT_EQ(res->status, 200) << res->body.substr(0, 300);
  const nlohmann::json out = nlohmann::json::parse(res->body);
  ASSERT_TRUE(out.contains("embedding"));
  EXPECT_EQ(out["embedding"]["dtype"], "EMBEDDING_DTYPE_FP16");
  EXPECT_EQ(out["embedding"]["shape"], nlohmann::json({1, 256, 64, 64}));
  EXPECT_EQ(out["embedding"]["input_width"], 1024);
  const std::string b64 = out["embedding"]["data"].get<std::string>();
  EXPECT_EQ(b64.size(), ((size_t{2} << 20) + 2) / 3 * 4);  // base64 of 2 MiB
  v1::EmbedResponse parsed;
  ASSERT_TRUE(google::protobuf::util::JsonStringToMessage(res->body, &parsed).ok());
  ExpectEmbedding(parsed.embedding(), Expected(im));

  j["return_embedding"] = 9;
  auto bad = http.Post("/v1/embed", j.dump(), "application/json");
  ASSERT_TRUE(bad);
  EXPECT_EQ(bad->status, 400) << bad->body;
  EXPECT_NE(bad->body.find("return_embedding = 9"), std::string::npos) << bad->body;
}

}  // namespace
}  // namespace maskd::server
