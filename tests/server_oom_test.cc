// Issue #14: a device out-of-memory splits the batch and retries; only what still fails alone gets
// RESOURCE_EXHAUSTED, and the server keeps serving. Through real gRPC against an in-process maskd on
// the fake engine, whose injected out-of-memory errors are what the real engine returns
// (RESOURCE_EXHAUSTED for the whole call, engine still usable; model/api/engine.h). The real engine
// under a real memory cap: server_oom_gpu_test.
#include <gtest/gtest.h>

#include <algorithm>
#include <future>
#include <thread>

#include "tests/server_fixture.h"

namespace maskd::server {
namespace {

using std::chrono::milliseconds;

ImageRGB8 Picture(int seed) {
  ImageRGB8 im{32, 24, std::vector<uint8_t>(32 * 24 * 3)};
  for (size_t i = 0; i < im.pixels.size(); ++i) im.pixels[i] = static_cast<uint8_t>((i * 11 + seed * 37) & 0xff);
  return im;
}

v1::Image Png(int seed) {
  v1::Image out;
  out.set_encoded(*EncodePngRgb(Picture(seed)));
  return out;
}

bool WaitFor(const std::function<bool()>& cond, milliseconds timeout = milliseconds(10000)) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (!cond()) {
    if (std::chrono::steady_clock::now() > deadline) return false;
    std::this_thread::sleep_for(milliseconds(2));
  }
  return true;
}

struct OomServer {
  explicit OomServer(std::function<void(ServerConfig&)> configure = {}) {
    ServerConfig c = TestConfig(/*threads=*/4);
    c.encoder_max_batch = 8;
    if (configure) configure(c);
    server = std::make_unique<TestServer>(c);
  }
  FakeEngine& engine() { return *server->engine.load(); }
  Client& client() { return *server->client; }
  v1::GetInfoResponse Info() {
    auto i = client().GetInfo();
    EXPECT_TRUE(i.ok()) << i.status().ToString();
    return i.ok() ? *i : v1::GetInfoResponse();
  }
  StatusOr<v1::EmbedResponse> Embed(int seed) {
    v1::EmbedRequest r;
    *r.mutable_image() = Png(seed);
    return client().Embed(r);
  }
  StatusOr<v1::SegmentResponse> Segment(const std::string& image_id, int prompts) {
    v1::SegmentRequest r;
    r.set_image_id(image_id);
    for (int k = 0; k < prompts; ++k) *r.add_prompts() = Point(4.0f + 5.0f * k, 6.0f + 3.0f * k);
    return client().Segment(r);
  }
  // Holds the encoder on one image so that the next `queued` Embeds (seeds) wait in its queue and
  // leave as one batch when it is released. Returns every call's result, the holder's first.
  std::vector<StatusOr<v1::EmbedResponse>> EmbedAsOneBatch(int holder_seed, const std::vector<int>& seeds) {
    engine().HoldEncodes();
    const int calls_before = engine().encode_calls.load();
    auto holder = std::async(std::launch::async, [&] { return Embed(holder_seed); });
    EXPECT_TRUE(engine().WaitForEncodeCalls(calls_before + 1, milliseconds(10000)));
    std::vector<std::future<StatusOr<v1::EmbedResponse>>> queued;
    for (int s : seeds) queued.push_back(std::async(std::launch::async, [this, s] { return Embed(s); }));
    EXPECT_TRUE(WaitFor([&] { return Info().encoder_queue().depth() == seeds.size(); }))
        << "queued: " << Info().encoder_queue().depth();
    engine().ReleaseEncodes();
    std::vector<StatusOr<v1::EmbedResponse>> out;
    out.push_back(holder.get());
    for (auto& f : queued) out.push_back(f.get());
    return out;
  }
  // The server still answers: health SERVING and a good Segment on a new image.
  void ExpectStillServing(int seed) {
    auto health = client().Health();
    ASSERT_TRUE(health.ok()) << health.status().ToString();
    EXPECT_EQ(*health, client::ServingStatus::kServing);
    v1::SegmentRequest r;
    *r.mutable_image() = Png(seed);
    *r.add_prompts() = Point(10, 10);
    auto seg = client().Segment(r);
    ASSERT_TRUE(seg.ok()) << seg.status().ToString();
    EXPECT_EQ(seg->results_size(), 1);
  }
  std::unique_ptr<TestServer> server;
};

TEST(ServerOom, EncoderBatchSplitsInHalvesUntilItFitsAndEveryImageSucceeds) {
  OomServer s;
  s.engine().SetEncodeMemoryLimit(2);  // more than 2 images at once: out of memory
  const std::vector<int> seeds = {1, 2, 3, 4, 5, 6, 7, 8};
  auto results = s.EmbedAsOneBatch(100, seeds);
  ASSERT_EQ(results.size(), 9u);
  for (size_t i = 0; i < results.size(); ++i) ASSERT_TRUE(results[i].ok()) << i << ": " << results[i].status().ToString();
  // The holder alone, then 8 -> 4 + 4 -> 2 + 2 + 2 + 2 (depth first).
  EXPECT_EQ(s.engine().encode_batches(), (std::vector<int>{1, 8, 4, 2, 2, 4, 2, 2}));
  EXPECT_EQ(s.engine().oom_returns.load(), 3);
  const v1::GetInfoResponse info = s.Info();
  EXPECT_EQ(info.encoder_queue().oom_splits(), 3u);
  EXPECT_EQ(info.encoder_queue().oom_failures(), 0u);
  EXPECT_EQ(info.encoder_queue().batches(), 2u);  // batches formed; the retries are not new ones
  // /metrics says the same as GetInfo (it is built from it).
  const std::string metrics = s.server->server.metrics().Serialize();
  EXPECT_NE(metrics.find("maskd_queue_oom_splits_total{device=\"cpu:0\",queue=\"encoder\"} 3"), std::string::npos)
      << metrics.substr(0, 4000);
  EXPECT_NE(metrics.find("maskd_queue_oom_failures_total{device=\"cpu:0\",queue=\"encoder\"} 0"), std::string::npos);
  // Each embedding is its own image's (content-addressed ids, cached): Segments by id work.
  for (size_t i = 1; i < results.size(); ++i) {
    auto seg = s.Segment(results[i]->image_id(), 2);
    ASSERT_TRUE(seg.ok()) << seg.status().ToString();
    EXPECT_EQ(seg->results_size(), 2);
  }
  EXPECT_EQ(s.engine().encoded_images.load(), 9);
  s.ExpectStillServing(200);
}

TEST(ServerOom, AnImageThatDoesNotFitAloneFailsAloneAndTheServerKeepsServing) {
  OomServer s;
  s.engine().OomOnEncodeOf(FakeEngine::Checksum(Picture(13)));
  auto results = s.EmbedAsOneBatch(100, {11, 12, 13, 14});
  ASSERT_EQ(results.size(), 5u);
  EXPECT_TRUE(results[0].ok());
  EXPECT_TRUE(results[1].ok()) << results[1].status().ToString();
  EXPECT_TRUE(results[2].ok()) << results[2].status().ToString();
  ASSERT_FALSE(results[3].ok());
  EXPECT_EQ(results[3].status().code(), StatusCode::kResourceExhausted);
  EXPECT_NE(results[3].status().message().find("out of device memory while running the image encoder on 1 images"),
            std::string::npos)
      << results[3].status().message();
  EXPECT_TRUE(results[4].ok()) << results[4].status().ToString();
  // The holder, then the 4 (in arrival order) -> the half without 13 ok, the half with it -> 13
  // fails alone, its partner ok.
  std::vector<int> batches = s.engine().encode_batches();
  std::sort(batches.begin(), batches.end());
  EXPECT_EQ(batches, (std::vector<int>{1, 1, 1, 2, 2, 4}));
  const v1::GetInfoResponse info = s.Info();
  EXPECT_EQ(info.encoder_queue().oom_splits(), 2u);
  EXPECT_EQ(info.encoder_queue().oom_failures(), 1u);
  // The failure was not cached: the same image fails again (still too big), others still work.
  auto again = s.Embed(13);
  EXPECT_EQ(again.status().code(), StatusCode::kResourceExhausted);
  s.ExpectStillServing(201);
}

// Decoder: concurrent Segments whose prompts share one batch; passes of more than 2 prompts run out
// of memory. Every mask must equal what the same request gets without the limit.
TEST(ServerOom, DecoderBatchSplitsAndEveryPromptGetsItsOwnMask) {
  OomServer s([](ServerConfig& c) {
    c.decoder_launch_when_idle = false;
    c.decoder_queue_delay_us = 300000;  // concurrent Segments share a batch
  });
  std::vector<std::string> ids;
  for (int seed : {21, 22, 23, 24}) {
    auto e = s.Embed(seed);
    ASSERT_TRUE(e.ok()) << e.status().ToString();
    ids.push_back(e->image_id());
  }
  std::vector<v1::SegmentResponse> reference;
  for (const auto& id : ids) {
    auto r = s.Segment(id, 3);
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    reference.push_back(*r);
  }
  const int decode_calls_before = s.engine().decode_calls.load();
  s.engine().SetDecodeMemoryLimit(2);
  std::vector<std::future<StatusOr<v1::SegmentResponse>>> calls;
  for (const auto& id : ids) calls.push_back(std::async(std::launch::async, [&s, id] { return s.Segment(id, 3); }));
  for (size_t i = 0; i < calls.size(); ++i) {
    auto r = calls[i].get();
    ASSERT_TRUE(r.ok()) << i << ": " << r.status().ToString();
    ASSERT_EQ(r->results_size(), 3);
    for (int m = 0; m < 3; ++m) {
      EXPECT_EQ(r->results(m).masks(0).rle().counts(), reference[i].results(m).masks(0).rle().counts())
          << i << "/" << m;
      EXPECT_EQ(r->results(m).masks(0).score(), reference[i].results(m).masks(0).score());
    }
  }
  const std::vector<int> batches = s.engine().decode_batches();
  int biggest = 0;
  for (size_t k = static_cast<size_t>(decode_calls_before); k < batches.size(); ++k) biggest = std::max(biggest, batches[k]);
  EXPECT_GT(biggest, 2) << "the Segments never shared a batch: nothing was split";
  const v1::GetInfoResponse info = s.Info();
  EXPECT_GT(info.decoder_queue().oom_splits(), 0u);
  EXPECT_EQ(info.decoder_queue().oom_failures(), 0u);
  EXPECT_EQ(static_cast<uint64_t>(s.engine().oom_returns.load()), info.decoder_queue().oom_splits());
  s.ExpectStillServing(202);
}

TEST(ServerOom, APromptThatDoesNotFitAloneFailsOnlyItsRequest) {
  OomServer s([](ServerConfig& c) {
    c.decoder_launch_when_idle = false;
    c.decoder_queue_delay_us = 300000;
  });
  std::vector<std::string> ids;
  for (int seed : {31, 32, 33}) {
    auto e = s.Embed(seed);
    ASSERT_TRUE(e.ok()) << e.status().ToString();
    ids.push_back(e->image_id());
  }
  s.engine().OomOnDecodeOf(FakeEngine::Checksum(Picture(32)));
  std::vector<std::future<StatusOr<v1::SegmentResponse>>> calls;
  for (const auto& id : ids) calls.push_back(std::async(std::launch::async, [&s, id] { return s.Segment(id, 2); }));
  auto first = calls[0].get(), poisoned = calls[1].get(), third = calls[2].get();
  EXPECT_TRUE(first.ok()) << first.status().ToString();
  EXPECT_TRUE(third.ok()) << third.status().ToString();
  ASSERT_FALSE(poisoned.ok());
  EXPECT_EQ(poisoned.status().code(), StatusCode::kResourceExhausted);
  EXPECT_NE(poisoned.status().message().find("out of device memory while running the mask decoder on 1 prompts"),
            std::string::npos)
      << poisoned.status().message();
  const v1::GetInfoResponse info = s.Info();
  EXPECT_EQ(info.decoder_queue().oom_failures(), 2u);  // both of its prompts, each alone
  EXPECT_GT(info.decoder_queue().oom_splits(), 0u);
  EXPECT_GE(info.calls_by_status().at("RESOURCE_EXHAUSTED"), 1u);
  s.ExpectStillServing(203);
}

ConfigParseResult Parse(std::vector<std::string> args) {
  args.insert(args.begin(), "maskd");
  std::vector<const char*> argv;
  for (const auto& a : args) argv.push_back(a.c_str());
  return ParseConfig(static_cast<int>(argv.size()), argv.data());
}

TEST(ServerOom, GpuMemoryLimitFlagIsValidatedDocumentedAndReachesTheEngine) {
  EXPECT_EQ(Parse({}).config.gpu_memory_limit_bytes, 0u);  // no limit by default
  const ConfigParseResult forty = Parse({"--gpu-memory-limit-bytes", "40GiB"});
  ASSERT_FALSE(forty.exit) << forty.output;
  EXPECT_EQ(forty.config.gpu_memory_limit_bytes, uint64_t{40} << 30);
  EXPECT_FALSE(Parse({"--gpu-memory-limit-bytes", "0"}).exit);
  for (const char* small : {"1", "100MiB", "255MiB"}) {
    const ConfigParseResult r = Parse({"--gpu-memory-limit-bytes", small});
    EXPECT_TRUE(r.exit) << small;
    EXPECT_NE(r.exit_code, 0) << small;
    EXPECT_NE(r.output.find("--gpu-memory-limit-bytes"), std::string::npos) << r.output;
    EXPECT_NE(r.output.find("at least 256MiB"), std::string::npos) << r.output;
  }
  EXPECT_TRUE(Parse({"--gpu-memory-limit-bytes", "lots"}).exit);
  const ConfigParseResult help = Parse({"--help"});
  EXPECT_NE(help.output.find("--gpu-memory-limit-bytes"), std::string::npos);
  DeviceSpec gpu{"cuda:0", "cuda:0", true};
  auto eo = MakeEngineOptions(forty.config, gpu, CheckpointChoice{});
  ASSERT_TRUE(eo.ok()) << eo.status().ToString();
  EXPECT_EQ(eo->device_memory_limit_bytes, uint64_t{40} << 30);
}

}  // namespace
}  // namespace maskd::server
