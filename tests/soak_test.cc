// Soak: a whole in-process maskd (fake engines, real gRPC on a loopback port) under mixed traffic
// from several client threads for MASKD_SOAK_SECONDS (default 20; CI's soak step runs 180):
// distinct-image Embeds (the cache churns), Segments on a few cached images, Segments with invalid
// prompts, unparsable bytes on both unary methods, and SegmentStreams of several messages (one of
// them invalid). What it checks:
// - every request is answered exactly once: each unary call completes with one status, each stream
//   message gets one response, in order, and the server's own books (GetInfo.calls and
//   calls_by_status) agree with the client's, code by code, so nothing was dropped or counted twice;
// - nothing is lost: no UNAVAILABLE, DEADLINE_EXCEEDED, INTERNAL or UNKNOWN, only the statuses the
//   traffic asks for (OK, INVALID_ARGUMENT, and RESOURCE_EXHAUSTED when a bound is reached);
// - no call is left open afterwards (MaskService::active_calls() == 0);
// - memory stays flat: RSS (sampled every 100 ms) in the last quarter of the run exceeds its peak
//   in the second quarter (after warm-up: caches and stores filled to their bounds) by at most
//   max(16 MiB, 10 %) (CI runs ~1000 calls a second for 3 minutes: a leak of ~200 bytes a call would show).
#include <gtest/gtest.h>

#include <grpcpp/generic/generic_stub.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <future>
#include <map>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "maskd/v1/maskd.grpc.pb.h"
#include "model/io/image_codec.h"
#include "server/server.h"
#include "tests/fake_engine.h"

namespace maskd::server {
namespace {

using Clock = std::chrono::steady_clock;

double SoakSeconds() {
  const char* s = std::getenv("MASKD_SOAK_SECONDS");
  return s ? std::atof(s) : 20.0;
}

uint64_t RssBytes() {
  std::ifstream f("/proc/self/status");
  std::string key;
  while (f >> key) {
    if (key == "VmRSS:") {
      uint64_t kb = 0;
      f >> kb;
      return kb * 1024;
    }
    std::getline(f, key);
  }
  return 0;
}

std::string Png(int w, int h, uint64_t seed) {
  ImageRGB8 im{w, h, std::vector<uint8_t>(static_cast<size_t>(w) * h * 3)};
  std::mt19937_64 rng(seed);
  for (uint8_t& p : im.pixels) p = static_cast<uint8_t>(rng());
  return *EncodePngRgb(im, PngOptions{1});
}

v1::Prompt Click(float x, float y) {
  v1::Prompt p;
  v1::Point* pt = p.add_points();
  pt->set_x(x);
  pt->set_y(y);
  pt->set_label(v1::POINT_LABEL_FOREGROUND);
  return p;
}

// Outcomes by gRPC status code name, as GetInfo.calls_by_status spells them.
using Tally = std::map<std::string, uint64_t>;

std::string CodeName(grpc::StatusCode code) {
  return StatusCodeName(static_cast<StatusCode>(static_cast<int>(code)));
}

struct Books {
  std::mutex mu;
  Tally outcomes;         // every unary call and every stream message, by code
  uint64_t calls = 0;     // unary calls + streams opened (GetInfo.calls counts streams once)
  uint64_t messages = 0;  // stream messages sent
  uint64_t stream_replies = 0;
  std::vector<std::string> problems;  // wrong answers, reported at the end
  void Add(const std::string& code, uint64_t n = 1) {
    std::lock_guard<std::mutex> lock(mu);
    outcomes[code] += n;
  }
  void Problem(std::string p) {
    std::lock_guard<std::mutex> lock(mu);
    if (problems.size() < 20) problems.push_back(std::move(p));
  }
};

v1::GetInfoResponse Info(v1::MaskService::Stub& stub) {
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
  v1::GetInfoRequest req;
  v1::GetInfoResponse resp;
  const grpc::Status s = stub.GetInfo(&ctx, req, &resp);
  EXPECT_TRUE(s.ok()) << s.error_message();
  return resp;
}

class Traffic {
 public:
  Traffic(std::shared_ptr<grpc::Channel> channel, Books* books, int thread)
      : stub_(v1::MaskService::NewStub(channel)), generic_(channel), books_(books),
        rng_(1000 + thread), thread_(thread) {
    for (int i = 0; i < 4; ++i) shared_images_.push_back(Png(48, 32, 77 + i));
  }

  void Once() {
    switch (rng_() % 10) {
      case 0: case 1: Embed(); break;
      case 2: case 3: case 4: Segment(/*valid=*/true); break;
      case 5: Segment(/*valid=*/false); break;
      case 6: Garbage(); break;
      default: Stream(); break;
    }
  }

 private:
  static void Deadline(grpc::ClientContext* ctx) {
    // Far beyond any answer on an idle fake engine: a call that hits it was lost, not slow.
    ctx->set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(60));
  }

  void Unary(const grpc::Status& s, std::initializer_list<grpc::StatusCode> expected,
             const char* what) {
    {
      std::lock_guard<std::mutex> lock(books_->mu);
      ++books_->calls;
    }
    books_->Add(CodeName(s.error_code()));
    if (std::find(expected.begin(), expected.end(), s.error_code()) == expected.end()) {
      books_->Problem(std::string(what) + ": " + CodeName(s.error_code()) + " " + s.error_message());
    }
  }

  void Embed() {
    v1::EmbedRequest req;
    req.mutable_image()->set_encoded(Png(40, 30, (uint64_t{1} << 40) + thread_ * 1000003 + n_++));
    v1::EmbedResponse resp;
    grpc::ClientContext ctx;
    Deadline(&ctx);
    const grpc::Status s = stub_->Embed(&ctx, req, &resp);
    Unary(s, {grpc::StatusCode::OK, grpc::StatusCode::RESOURCE_EXHAUSTED}, "Embed");
    if (s.ok() && resp.image_id().size() != 64) books_->Problem("Embed without an image_id");
  }

  void Segment(bool valid) {
    v1::SegmentRequest req;
    req.mutable_image()->set_encoded(shared_images_[rng_() % shared_images_.size()]);
    const int prompts = 1 + static_cast<int>(rng_() % 4);
    for (int i = 0; i < prompts; ++i) *req.add_prompts() = Click(3.0f + i, 5.0f + i);
    if (!valid) req.mutable_prompts(0)->mutable_points(0)->set_x(std::nanf(""));
    v1::SegmentResponse resp;
    grpc::ClientContext ctx;
    Deadline(&ctx);
    const grpc::Status s = stub_->Segment(&ctx, req, &resp);
    if (valid) {
      Unary(s, {grpc::StatusCode::OK, grpc::StatusCode::RESOURCE_EXHAUSTED}, "Segment");
      if (s.ok() && resp.results_size() != prompts) {
        books_->Problem("Segment answered " + std::to_string(resp.results_size()) + " of " +
                        std::to_string(prompts) + " prompts");
      }
    } else {
      Unary(s, {grpc::StatusCode::INVALID_ARGUMENT}, "Segment with a NaN point");
    }
  }

  void Garbage() {
    std::string bytes(1 + rng_() % 64, '\0');
    for (char& c : bytes) c = static_cast<char>(rng_());
    bytes[0] = '\x0a';  // field 1, length-delimited, with a length that overruns: never parses
    bytes.push_back('\xff');
    if (bytes.size() > 1) bytes[1] = '\x7f';
    grpc::Slice slice(bytes);
    grpc::ByteBuffer request(&slice, 1), response;
    grpc::ClientContext ctx;
    Deadline(&ctx);
    std::promise<grpc::Status> done;
    const char* method = rng_() % 2 ? "/maskd.v1.MaskService/Segment" : "/maskd.v1.MaskService/Embed";
    generic_.UnaryCall(&ctx, method, grpc::StubOptions(), &request, &response,
                       [&](grpc::Status s) { done.set_value(s); });
    Unary(done.get_future().get(), {grpc::StatusCode::INVALID_ARGUMENT}, "unparsable request");
  }

  void Stream() {
    grpc::ClientContext ctx;
    Deadline(&ctx);
    auto stream = stub_->SegmentStream(&ctx);
    const int messages = 3 + static_cast<int>(rng_() % 4);
    const int bad = 1 + static_cast<int>(rng_() % (messages - 1));  // never the first
    std::vector<bool> expect_ok;
    for (int i = 0; i < messages; ++i) {
      v1::SegmentRequest req;
      if (i == 0) req.mutable_image()->set_encoded(shared_images_[rng_() % shared_images_.size()]);
      *req.add_prompts() = Click(2.0f + i, 4.0f);
      if (i == bad) req.mutable_prompts(0)->mutable_points(0)->set_y(-1e30f);
      req.set_request_tag("s" + std::to_string(i));
      expect_ok.push_back(i != bad);
      if (!stream->Write(req)) break;
    }
    stream->WritesDone();
    {
      std::lock_guard<std::mutex> lock(books_->mu);
      ++books_->calls;
      books_->messages += messages;
    }
    v1::SegmentResponse resp;
    int got = 0;
    while (stream->Read(&resp)) {
      if (got >= messages) {
        books_->Problem("a stream answered more messages than it sent");
        break;
      }
      if (resp.request_tag() != "s" + std::to_string(got)) {
        books_->Problem("stream reply " + std::to_string(got) + " has tag " + resp.request_tag());
      }
      const grpc::StatusCode code =
          resp.has_error() ? static_cast<grpc::StatusCode>(resp.error().code()) : grpc::StatusCode::OK;
      books_->Add(CodeName(code));
      const bool ok_expected = expect_ok[got];
      if (ok_expected && code != grpc::StatusCode::OK && code != grpc::StatusCode::RESOURCE_EXHAUSTED) {
        books_->Problem("stream message " + std::to_string(got) + ": " + CodeName(code) + " " +
                        resp.error().message());
      }
      if (!ok_expected && code != grpc::StatusCode::INVALID_ARGUMENT) {
        books_->Problem("invalid stream message answered " + CodeName(code));
      }
      ++got;
    }
    const grpc::Status end = stream->Finish();
    {
      std::lock_guard<std::mutex> lock(books_->mu);
      books_->stream_replies += got;
    }
    if (!end.ok()) books_->Problem("stream ended " + CodeName(end.error_code()) + " " + end.error_message());
    if (got != messages) {
      books_->Problem("stream answered " + std::to_string(got) + " of " + std::to_string(messages));
    }
  }

  std::unique_ptr<v1::MaskService::Stub> stub_;
  grpc::GenericStub generic_;
  Books* books_;
  std::mt19937_64 rng_;
  int thread_;
  uint64_t n_ = 0;
  std::vector<std::string> shared_images_;
};

TEST(Soak, MixedTrafficIsAnsweredExactlyOnceAndMemoryStaysFlat) {
  spdlog::set_level(spdlog::level::err);
  ServerConfig c;
  c.listen = "127.0.0.1:0";
  c.models_dir = "/nonexistent-maskd-test-models";
  c.device = "cpu:0";
  c.decode_threads = 2;
  c.postprocess_threads = 2;
  c.shutdown_grace_s = 2;
  // Small bounds, so that warm-up fills them and the steady state is what is measured.
  c.cache_device_bytes = uint64_t{64} << 20;
  c.cache_host_bytes = uint64_t{64} << 20;
  c.result_store_bytes = uint64_t{16} << 20;
  fake::FakeEngineOptions fo;
  fo.embedding_bytes = 256 << 10;
  MaskServer server(c,
                    [fo](const EngineOptions& eo) -> StatusOr<std::unique_ptr<Engine>> {
                      fake::FakeEngineOptions o = fo;
                      o.device = eo.device;
                      return std::unique_ptr<Engine>(std::make_unique<fake::FakeEngine>(o));
                    },
                    0);
  ASSERT_TRUE(server.Start().ok());
  auto channel = grpc::CreateChannel("127.0.0.1:" + std::to_string(server.port()),
                                     grpc::InsecureChannelCredentials());
  auto info_stub = v1::MaskService::NewStub(channel);
  // What one GetInfo adds to the server's books (it may count itself), measured, not assumed.
  const v1::GetInfoResponse i0 = Info(*info_stub), i1 = Info(*info_stub);
  auto total = [](const v1::GetInfoResponse& i) {
    uint64_t n = 0;
    for (const auto& [k, v] : i.calls_by_status()) n += v;
    return n;
  };
  const uint64_t info_calls = i1.calls() - i0.calls();
  const uint64_t info_outcomes = total(i1) - total(i0);

  const double seconds = SoakSeconds();
  const auto start = Clock::now();
  const auto stop = start + std::chrono::duration<double>(seconds);
  Books books;
  std::atomic<bool> done{false};
  std::vector<std::pair<double, uint64_t>> rss;  // (seconds since start, bytes)
  std::thread sampler([&] {
    while (!done.load()) {
      rss.emplace_back(std::chrono::duration<double>(Clock::now() - start).count(), RssBytes());
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
  });
  const int kThreads = 6;
  std::vector<std::thread> clients;
  for (int t = 0; t < kThreads; ++t) {
    clients.emplace_back([&, t] {
      // One channel per client thread, as separate tools would have.
      Traffic traffic(grpc::CreateChannel("127.0.0.1:" + std::to_string(server.port()),
                                          grpc::InsecureChannelCredentials()),
                      &books, t);
      while (Clock::now() < stop) traffic.Once();
    });
  }
  for (std::thread& t : clients) t.join();
  done = true;
  sampler.join();

  const v1::GetInfoResponse i2 = Info(*info_stub);
  for (const std::string& p : books.problems) ADD_FAILURE() << p;
  EXPECT_EQ(server.service().active_calls(), 0) << "calls left open after every client finished";

  // The server's books against the client's: every call arrived once, every outcome was recorded
  // once with the code the client saw.
  EXPECT_EQ(i2.calls() - i1.calls() - info_calls, books.calls);
  EXPECT_EQ(books.stream_replies, books.messages);
  Tally server_outcomes;
  for (const auto& [k, v] : i2.calls_by_status()) {
    const auto before = i1.calls_by_status().find(k);
    server_outcomes[k] = v - (before == i1.calls_by_status().end() ? 0 : before->second);
  }
  server_outcomes["OK"] -= info_outcomes;  // the final GetInfo's own outcome, if it counts one
  for (auto it = server_outcomes.begin(); it != server_outcomes.end();) {
    it = it->second == 0 ? server_outcomes.erase(it) : std::next(it);
  }
  EXPECT_EQ(server_outcomes, books.outcomes);
  for (const char* lost : {"UNAVAILABLE", "DEADLINE_EXCEEDED", "INTERNAL", "UNKNOWN", "CANCELLED"}) {
    EXPECT_EQ(books.outcomes.count(lost), 0u) << lost;
  }

  // Memory after warm-up.
  uint64_t settled = 0, late = 0;
  for (const auto& [t, bytes] : rss) {
    if (t >= seconds / 4 && t < seconds / 2) settled = std::max(settled, bytes);
    if (t >= seconds * 3 / 4) late = std::max(late, bytes);
  }
  ASSERT_GT(settled, 0u);
  ASSERT_GT(late, 0u);
  const uint64_t margin = std::max<uint64_t>(uint64_t{16} << 20, settled / 10);
  EXPECT_LE(late, settled + margin) << "RSS grew after warm-up";

  uint64_t answered = 0;
  for (const auto& [k, v] : books.outcomes) answered += v;
  std::string by_code;
  for (const auto& [k, v] : books.outcomes) by_code += " " + k + "=" + std::to_string(v);
  std::printf("soak: %.0f s, %d client threads, %llu calls (%llu stream messages), %llu answers:%s; "
              "RSS %.1f MiB after warm-up, %.1f MiB at the end (margin %.1f MiB)\n",
              seconds, kThreads, static_cast<unsigned long long>(books.calls),
              static_cast<unsigned long long>(books.messages),
              static_cast<unsigned long long>(answered), by_code.c_str(), settled / 1048576.0,
              late / 1048576.0, margin / 1048576.0);
  server.Shutdown();
}

}  // namespace
}  // namespace maskd::server
