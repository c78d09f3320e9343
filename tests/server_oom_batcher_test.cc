// Issue #14: the batchers' split-and-retry on out of device memory, without gRPC: items submitted
// from several threads at once, batches that run out above a size are split in halves, each item is
// answered exactly once with its own result. These also run under TSan in CI (.ci/run), which the
// gRPC suites cannot (RELIABILITY.md, Sanitizer builds). Through real gRPC: server_oom_test.
#include <gtest/gtest.h>

#include <atomic>
#include <future>
#include <thread>

#include "server/decoder_batcher.h"
#include "server/encoder_batcher.h"
#include "tests/fake_engine.h"

namespace maskd::server {
namespace {

using fake::FakeEngine;

ImageRGB8 Picture(int seed) {
  ImageRGB8 im{32, 24, std::vector<uint8_t>(32 * 24 * 3)};
  for (size_t i = 0; i < im.pixels.size(); ++i) im.pixels[i] = static_cast<uint8_t>((i * 11 + seed * 37) & 0xff);
  return im;
}

TEST(ServerOomBatcher, EncoderSplitsConcurrentSubmissionsAndAnswersEachItemOnce) {
  FakeEngine engine;
  engine.SetEncodeMemoryLimit(3);
  engine.OomOnEncodeOf(FakeEngine::Checksum(Picture(5)));
  EncoderBatcher batcher("encoder", &engine, {16, std::chrono::milliseconds(50), 256}, nullptr);
  constexpr int kThreads = 4, kPerThread = 16;
  std::vector<std::promise<StatusOr<std::shared_ptr<const Embedding>>>> done(kThreads * kPerThread);
  std::atomic<int> answers{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (int k = 0; k < kPerThread; ++k) {
        const int i = t * kPerThread + k;
        EncoderBatcher::Request r{*engine.Prepare(Picture(i)), nullptr, {}};
        r.done = [&done, &answers, i](StatusOr<std::shared_ptr<const Embedding>> e, const EncodeTiming&) {
          ++answers;
          done[static_cast<size_t>(i)].set_value(std::move(e));  // a second call would throw
        };
        ASSERT_TRUE(batcher.Submit(std::move(r)).ok());
        if (k % 4 == 0) (void)batcher.counters();
      }
    });
  }
  for (auto& th : threads) th.join();
  for (int i = 0; i < kThreads * kPerThread; ++i) {
    auto e = done[static_cast<size_t>(i)].get_future().get();
    if (i == 5) {
      EXPECT_EQ(e.status().code(), StatusCode::kResourceExhausted);
      continue;
    }
    ASSERT_TRUE(e.ok()) << i << ": " << e.status().ToString();
    EXPECT_EQ(FakeEngine::ContentOf(**e), FakeEngine::Checksum(Picture(i)));
  }
  batcher.Stop();
  EXPECT_EQ(answers.load(), kThreads * kPerThread);
  for (int b : engine.encode_batches()) EXPECT_LE(b, 16);
  const QueueCounters c = batcher.counters();
  EXPECT_EQ(c.oom_failures, 1u);
  EXPECT_GT(c.oom_splits, 0u);
  EXPECT_EQ(c.items, static_cast<uint64_t>(kThreads * kPerThread));
}

TEST(ServerOomBatcher, DecoderSplitsConcurrentRequestsAndKeepsEachRequestsPrompts) {
  FakeEngine engine;
  std::vector<std::shared_ptr<const Embedding>> embeddings;
  for (int i = 0; i < 4; ++i) {
    auto e = engine.Encode({*engine.Prepare(Picture(40 + i))});
    ASSERT_TRUE(e.ok());
    embeddings.push_back((*e)[0]);
  }
  engine.SetDecodeMemoryLimit(3);
  BatchQueueOptions o{64, std::chrono::milliseconds(50), 4096};
  DecoderBatcher batcher("decoder", &engine, o, nullptr);
  constexpr int kThreads = 4, kRequests = 8;
  std::vector<std::promise<StatusOr<std::vector<DecodedPrompt>>>> done(kThreads * kRequests);
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (int k = 0; k < kRequests; ++k) {
        const int i = t * kRequests + k;
        DecoderBatcher::Request r;
        for (int p = 0; p <= i % 5; ++p) {
          PromptSpec spec;
          spec.points.push_back({static_cast<float>(1 + p), static_cast<float>(1 + i % 20), 1});
          r.prompts.push_back({embeddings[static_cast<size_t>(t)], spec});
        }
        r.done = [&done, i](StatusOr<std::vector<DecodedPrompt>> d, const DecodeTiming&) {
          done[static_cast<size_t>(i)].set_value(std::move(d));
        };
        ASSERT_TRUE(batcher.Submit(std::move(r)).ok());
      }
    });
  }
  for (auto& th : threads) th.join();
  for (int i = 0; i < kThreads * kRequests; ++i) {
    auto d = done[static_cast<size_t>(i)].get_future().get();
    ASSERT_TRUE(d.ok()) << i << ": " << d.status().ToString();
    EXPECT_EQ(d->size(), static_cast<size_t>(i % 5 + 1)) << i;
  }
  batcher.Stop();
  for (int b : engine.decode_batches()) EXPECT_LE(b, 64);
  const QueueCounters c = batcher.counters();
  EXPECT_GT(c.oom_splits, 0u);
  EXPECT_EQ(c.oom_failures, 0u);
}

}  // namespace
}  // namespace maskd::server
