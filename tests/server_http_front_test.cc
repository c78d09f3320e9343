// The HTTP front (server/http_front.h) in-process on fake engines, through real HTTP (cpp-httplib's
// client): it answers what the gRPC service answers, before loading (503 UNAVAILABLE) and after,
// names --http-listen in its errors, maps every gRPC code to an HTTP status, and stops with the server.
#include <gtest/gtest.h>

#include <httplib.h>

#include <google/protobuf/util/json_util.h>
#include <google/protobuf/util/message_differencer.h>
#include <spdlog/spdlog.h>

#include "client/client.h"
#include "model/io/image_codec.h"
#include "server/http_front.h"
#include "server/server.h"
#include "tests/fake_engine.h"
#include "tests/server_fixture.h"

namespace maskd::server {
namespace {

using std::chrono::milliseconds;

struct Maskd {
  explicit Maskd(bool load = true, std::string http_listen = "127.0.0.1:0") {
    spdlog::set_level(spdlog::level::err);
    ServerConfig c = TestConfig(/*threads=*/2);
    c.http_listen = std::move(http_listen);
    server = std::make_unique<MaskServer>(c, FakeFactory(), 0);
    listening = server->StartListening();
    if (listening.ok() && load) loaded = server->LoadAndServe();
  }
  ~Maskd() { server->Shutdown(); }

  httplib::Client Http() const {
    httplib::Client c("127.0.0.1", server->http_port());
    c.set_read_timeout(20, 0);
    return c;
  }

  std::unique_ptr<MaskServer> server;
  Status listening, loaded;
};

std::string Png(int w, int h) {
  ImageRGB8 im{w, h, std::vector<uint8_t>(static_cast<size_t>(w) * h * 3, 90)};
  return *EncodePngRgb(im);
}

template <typename M>
M FromJson(const std::string& json) {
  M m;
  const auto s = google::protobuf::util::JsonStringToMessage(json, &m);
  EXPECT_TRUE(s.ok()) << s.ToString() << ": " << json;
  return m;
}

std::string ToJson(const google::protobuf::Message& m) {
  std::string out;
  (void)google::protobuf::util::MessageToJsonString(m, &out);
  return out;
}

TEST(ServerHttpFront, AnswersWhatTheGrpcServiceAnswers) {
  Maskd m;
  ASSERT_TRUE(m.listening.ok() && m.loaded.ok()) << m.listening.ToString() << m.loaded.ToString();
  ASSERT_GT(m.server->http_port(), 0);
  httplib::Client http = m.Http();

  v1::EmbedRequest embed;
  embed.mutable_image()->set_encoded(Png(64, 48));
  auto e = http.Post("/v1/embed", ToJson(embed), "application/json");
  ASSERT_TRUE(e) << httplib::to_string(e.error());
  ASSERT_EQ(e->status, 200) << e->body;
  const auto er = FromJson<v1::EmbedResponse>(e->body);
  EXPECT_EQ(er.width(), 64u);

  v1::SegmentRequest seg;
  seg.set_image_id(er.image_id());
  v1::Prompt* p = seg.add_prompts();
  v1::Point* pt = p->add_points();
  pt->set_x(30);
  pt->set_y(20);
  p->set_multimask(true);
  seg.set_output_format(v1::OUTPUT_FORMAT_POLYGONS);
  // As a browser asks: compressed if you like. The answer comes back as it is (see kJsonContentType).
  auto s = http.Post("/v1/segment", {{"Accept-Encoding", "gzip, deflate, br"}}, ToJson(seg),
                     "application/json");
  ASSERT_TRUE(s);
  ASSERT_EQ(s->status, 200) << s->body;
  EXPECT_TRUE(s->has_header("x-request-id"));
  EXPECT_FALSE(s->has_header("Content-Encoding")) << s->get_header_value("Content-Encoding");
  EXPECT_EQ(s->get_header_value("Content-Type"), kJsonContentType);
  const auto over_http = FromJson<v1::SegmentResponse>(s->body);

  client::ClientOptions co;
  co.target = "127.0.0.1:" + std::to_string(m.server->port());
  client::Client grpc_client(co);
  auto over_grpc = grpc_client.Segment(seg);
  ASSERT_TRUE(over_grpc.ok()) << over_grpc.status().ToString();
  ASSERT_EQ(over_http.results_size(), 1);
  ASSERT_EQ(over_http.results(0).masks_size(), 3);
  for (int k = 0; k < 3; ++k) {
    EXPECT_TRUE(google::protobuf::util::MessageDifferencer::Equals(over_http.results(0).masks(k),
                                                                  over_grpc->results(0).masks(k)))
        << "mask " << k;
  }

  // The same validation message as gRPC, with its code name and HTTP status.
  seg.mutable_prompts(0)->mutable_points(0)->set_x(1000);
  auto bad = http.Post("/v1/segment", ToJson(seg), "application/json");
  ASSERT_TRUE(bad);
  EXPECT_EQ(bad->status, 400);
  auto bad_grpc = grpc_client.Segment(seg);
  ASSERT_FALSE(bad_grpc.ok());
  EXPECT_NE(bad->body.find("\"INVALID_ARGUMENT\""), std::string::npos) << bad->body;
  // The message inside the JSON body is the gRPC one (protobuf's printer escapes quotes).
  EXPECT_NE(bad->body.find("prompts[0].points[0]"), std::string::npos) << bad->body;
  EXPECT_NE(bad_grpc.status().message().find("prompts[0].points[0]"), std::string::npos);

  auto info = http.Get("/v1/info");
  ASSERT_TRUE(info);
  ASSERT_EQ(info->status, 200);
  const auto gi = FromJson<v1::GetInfoResponse>(info->body);
  EXPECT_GE(gi.calls_by_status().at("OK"), 3u);  // the HTTP calls counted like any other
  EXPECT_GE(gi.calls_by_status().at("INVALID_ARGUMENT"), 2u);
}

TEST(ServerHttpFront, BeforeTheModelIsLoadedCallsAreUnavailable) {
  Maskd m(/*load=*/false);
  ASSERT_TRUE(m.listening.ok()) << m.listening.ToString();
  httplib::Client http = m.Http();
  auto r = http.Post("/v1/embed", "{}", "application/json");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 503) << r->body;
  EXPECT_NE(r->body.find("\"UNAVAILABLE\""), std::string::npos) << r->body;
  // The page is there at once.
  auto page = http.Get("/");
  ASSERT_TRUE(page);
  EXPECT_EQ(page->status, 200);
  EXPECT_NE(page->body.find("<canvas id=\"overlay\""), std::string::npos);
}

TEST(ServerHttpFront, StopsWithTheServer) {
  Maskd m;
  ASSERT_TRUE(m.loaded.ok());
  const int port = m.server->http_port();
  m.server->Shutdown();
  httplib::Client http("127.0.0.1", port);
  http.set_connection_timeout(2, 0);
  auto r = http.Get("/v1/info");
  EXPECT_FALSE(r) << "still answering after Shutdown: " << r->status;
}

TEST(ServerHttpFront, ListenErrorsNameTheFlag) {
  ServerConfig c;
  c.http_listen = "no-port";
  Status v = ValidateConfig(c);
  EXPECT_EQ(v.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(v.message().find("--http-listen = \"no-port\""), std::string::npos) << v.message();

  Maskd first;
  ASSERT_TRUE(first.loaded.ok());
  Maskd second(/*load=*/false, "127.0.0.1:" + std::to_string(first.server->http_port()));
  EXPECT_EQ(second.listening.code(), StatusCode::kUnavailable);
  EXPECT_NE(second.listening.message().find("--http-listen"), std::string::npos)
      << second.listening.message();
}

TEST(ServerHttpFront, EveryGrpcCodeHasAnHttpStatus) {
  const std::vector<std::pair<grpc::StatusCode, int>> expected = {
      {grpc::StatusCode::OK, 200},
      {grpc::StatusCode::CANCELLED, 499},
      {grpc::StatusCode::UNKNOWN, 500},
      {grpc::StatusCode::INVALID_ARGUMENT, 400},
      {grpc::StatusCode::DEADLINE_EXCEEDED, 504},
      {grpc::StatusCode::NOT_FOUND, 404},
      {grpc::StatusCode::ALREADY_EXISTS, 409},
      {grpc::StatusCode::PERMISSION_DENIED, 403},
      {grpc::StatusCode::RESOURCE_EXHAUSTED, 429},
      {grpc::StatusCode::FAILED_PRECONDITION, 400},
      {grpc::StatusCode::ABORTED, 409},
      {grpc::StatusCode::OUT_OF_RANGE, 400},
      {grpc::StatusCode::UNIMPLEMENTED, 501},
      {grpc::StatusCode::INTERNAL, 500},
      {grpc::StatusCode::UNAVAILABLE, 503},
      {grpc::StatusCode::DATA_LOSS, 500},
      {grpc::StatusCode::UNAUTHENTICATED, 401},
  };
  for (const auto& [code, status] : expected) EXPECT_EQ(HttpStatusFor(code), status) << code;
}

}  // namespace
}  // namespace maskd::server
