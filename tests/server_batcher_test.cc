// The Triton-style batchers: batches leave at max size or after max_queue_delay, a full queue
// refuses at once, dead calls are dropped before any engine work, jagged decode results are split
// back per request, and one bad request does not fail its batch-mates.
#include <gtest/gtest.h>

#include <atomic>
#include <condition_variable>
#include <future>
#include <mutex>
#include <set>
#include <stdexcept>
#include <thread>
#include <vector>

#include "server/batch_queue.h"
#include "server/decoder_batcher.h"
#include "server/encoder_batcher.h"
#include "server/gpu_turns.h"
#include "server/thread_name.h"
#include "server/thread_pool.h"
#include "tests/fake_engine.h"

namespace maskd::server {
namespace {

using fake::FakeEngine;
using fake::FakeEngineOptions;
using std::chrono::microseconds;
using std::chrono::milliseconds;

ImageRGB8 Image(int w, int h, uint8_t v) {
  return ImageRGB8{w, h, std::vector<uint8_t>(static_cast<size_t>(w) * h * 3, v)};
}

struct EncodeResult {
  std::promise<StatusOr<std::shared_ptr<const Embedding>>> promise;
  EncodeTiming timing;
};

EncoderBatcher::Request MakeEncode(FakeEngine& engine, uint8_t v, std::shared_ptr<EncodeResult> out,
                                   std::function<Status()> alive = nullptr) {
  EncoderBatcher::Request r{*engine.Prepare(Image(8, 6, v)), std::move(alive), {}};
  r.done = [out](StatusOr<std::shared_ptr<const Embedding>> e, const EncodeTiming& t) {
    out->timing = t;
    out->promise.set_value(std::move(e));
  };
  return r;
}

// The queue alone, with an item that records nothing but its arrival.
struct PlainItem {
  Clock::time_point arrival;
  size_t weight() const { return 1; }
  Status Alive() const { return Status::Ok(); }
  void Fail(const Status&) {}
  const void* group() const { return nullptr; }
};

// launch_when_idle: an item that finds the batcher idle runs at once (the 1 s delay is not waited
// for); items that arrive while a batch runs still wait for company and leave together. Without
// it the lone item waits for the delay.
TEST(ServerBatcher, IdleBatcherLaunchesAtOnceAndBatchesUnderLoad) {
  // The same with the thread spinning after each batch (--spin-wait-us): batching is unchanged.
  for (const bool idle_launch : {true, false})
  for (const auto spin : {microseconds(0), microseconds(300'000)}) {
    SCOPED_TRACE(std::string(idle_launch ? "launch_when_idle" : "always wait") + ", spin " +
                 std::to_string(spin.count()) + " us");
    BatchQueueOptions o;
    o.spin = spin;
    o.max_batch_weight = 8;
    o.max_queue_delay = std::chrono::seconds(1);
    o.capacity_weight = 64;
    o.launch_when_idle = idle_launch;
    std::mutex mu;
    std::condition_variable cv;
    std::vector<size_t> sizes;
    std::promise<void> release;
    std::shared_future<void> released = release.get_future().share();
    BatchQueue<PlainItem> q("test", o, [&](std::vector<PlainItem>& batch, Clock::time_point) {
      size_t n;
      {
        std::lock_guard<std::mutex> lock(mu);
        sizes.push_back(batch.size());
        n = sizes.size();
      }
      cv.notify_all();
      if (n == 1) released.wait();  // the first batch keeps the "device" busy
    });
    auto wait_batches = [&](size_t n) {
      std::unique_lock<std::mutex> lock(mu);
      return cv.wait_for(lock, std::chrono::seconds(10), [&] { return sizes.size() >= n; });
    };
    const auto t0 = Clock::now();
    ASSERT_TRUE(q.Submit(PlainItem{}).ok());
    ASSERT_TRUE(wait_batches(1));
    const double first_s = std::chrono::duration<double>(Clock::now() - t0).count();
    if (idle_launch) {
      EXPECT_LT(first_s, 0.5) << "the lone item waited for the queue delay";
    } else {
      EXPECT_GE(first_s, 0.9) << "the lone item left before the queue delay";
    }
    for (int i = 0; i < 3; ++i) ASSERT_TRUE(q.Submit(PlainItem{}).ok());
    release.set_value();
    ASSERT_TRUE(wait_batches(2));
    std::lock_guard<std::mutex> lock(mu);
    EXPECT_EQ(sizes[1], 3u) << "items queued while a batch ran left separately";
    q.Stop();
  }
}

// --spin-wait-us on the batcher: an item arriving while the thread spins after a batch runs at once
// (no notify is sent to a spinning thread: it must see the item itself), and Stop ends the spin.
TEST(ServerBatcher, SpinningBatcherTakesTheNextItemAndStops) {
  BatchQueueOptions o;
  o.max_batch_weight = 8;
  o.max_queue_delay = std::chrono::seconds(1);
  o.launch_when_idle = true;
  o.spin = std::chrono::seconds(10);  // far longer than the test: only seeing the item ends it
  std::atomic<int> batches{0};
  BatchQueue<PlainItem> q("test", o, [&](std::vector<PlainItem>&, Clock::time_point) { ++batches; });
  auto wait_batches = [&](int n) {
    const auto deadline = Clock::now() + std::chrono::seconds(5);
    while (batches.load() < n && Clock::now() < deadline) std::this_thread::sleep_for(microseconds(100));
    return batches.load() >= n;
  };
  for (int i = 1; i <= 3; ++i) {
    ASSERT_TRUE(q.Submit(PlainItem{}).ok());
    ASSERT_TRUE(wait_batches(i)) << "item " << i << " was not taken by the spinning thread";
  }
  const auto t0 = Clock::now();
  q.Stop();
  EXPECT_LT(Clock::now() - t0, std::chrono::seconds(2)) << "Stop waited for the spin to time out";
}

// The server's threads carry their pool's or batcher's name (top -H, gdb, /proc/<pid>/task/*/comm),
// cut to Linux's 15 bytes.
TEST(ServerBatcher, PoolAndBatcherThreadsAreNamed) {
  std::set<std::string> names;
  {
    std::mutex mu;
    std::promise<void> both;
    std::atomic<int> ran{0};
    std::promise<void> release;
    std::shared_future<void> released = release.get_future().share();
    // Last, so that it is destroyed first: its destructor joins the threads that still use the
    // state above (ASan caught a task waiting on `released` after it was gone).
    ThreadPool pool("postprocess", 2, 0);
    int submitted = 0;
    for (int i = 0; i < 2; ++i) {
      submitted += pool.TrySubmit([&] {
        {
          std::lock_guard<std::mutex> lock(mu);
          names.insert(ThisThreadName());
        }
        if (++ran == 2) both.set_value();
        released.wait();  // both tasks held at once: one on each thread
      }) ? 1 : 0;
    }
    const bool both_ran = submitted == 2 &&
                          both.get_future().wait_for(std::chrono::seconds(5)) == std::future_status::ready;
    release.set_value();  // before any assertion: the pool's destructor waits for its tasks
    ASSERT_TRUE(both_ran) << submitted << " task(s) submitted, " << ran.load() << " ran";
  }
  EXPECT_EQ(names, (std::set<std::string>{"postprocess/0", "postprocess/1"}));

  BatchQueueOptions o;
  o.launch_when_idle = true;
  std::promise<std::string> batcher_name;
  BatchQueue<PlainItem> q("decoder[cuda:12]", o, [&](std::vector<PlainItem>&, Clock::time_point) {
    batcher_name.set_value(ThisThreadName());
  });
  auto name = batcher_name.get_future();
  ASSERT_TRUE(q.Submit(PlainItem{}).ok());
  ASSERT_EQ(name.wait_for(std::chrono::seconds(5)), std::future_status::ready);
  EXPECT_EQ(name.get(), "decoder[cuda:12");  // 15 bytes kept
}

// --spin-wait-us on a pool: a burst gets every thread, not only the one spinning (the submitter
// wakes sleeping threads for the tasks beyond the spinners), and Stop ends the spin.
TEST(ServerBatcher, SpinningPoolWakesSleepingThreadsForABurst) {
  constexpr int kThreads = 4;
  ThreadPool pool("test", kThreads, 0, std::chrono::seconds(10));
  std::atomic<int> done{0};
  ASSERT_TRUE(pool.TrySubmit([&] { ++done; }));  // one thread ran a task: it spins now
  while (done.load() < 1) std::this_thread::sleep_for(microseconds(100));
  std::this_thread::sleep_for(milliseconds(20));
  // kThreads tasks that each wait for all of them to have started: only kThreads threads at once
  // finish them.
  std::mutex mu;
  std::condition_variable cv;
  int started = 0;
  std::atomic<int> together{0};
  for (int i = 0; i < kThreads; ++i) {
    ASSERT_TRUE(pool.TrySubmit([&] {
      std::unique_lock<std::mutex> lock(mu);
      ++started;
      cv.notify_all();
      if (cv.wait_for(lock, std::chrono::seconds(5), [&] { return started == kThreads; })) ++together;
    }));
  }
  {
    // Before Stop, whose notify_all would wake every thread anyway.
    std::unique_lock<std::mutex> lock(mu);
    EXPECT_TRUE(cv.wait_for(lock, std::chrono::seconds(3), [&] { return started == kThreads; }))
        << "only " << started << " of the burst's " << kThreads << " tasks started";
  }
  const auto t0 = Clock::now();
  pool.Stop();  // runs what is queued, then joins
  EXPECT_EQ(together.load(), kThreads) << "the burst's tasks did not all run at once";
  EXPECT_LT(Clock::now() - t0, std::chrono::seconds(3)) << "Stop waited for the spin to time out";
}

// RunSpread (the post-processing fan-out): every index runs exactly once, on the caller and on
// helpers of the pool at once; it also completes when every pool thread is itself inside a RunSpread
// (the caller never waits for a task queued behind it), and an exception comes back to the caller
// after every index ran.
TEST(ServerBatcher, RunSpreadRunsEveryIndexOnceOnSeveralThreads) {
  constexpr int kThreads = 4;
  ThreadPool pool("spread", kThreads, 0);
  constexpr size_t kN = 64;
  std::vector<std::atomic<int>> runs(kN);
  std::mutex mu;
  std::set<std::thread::id> threads;
  RunSpread(pool, kN, kThreads - 1, [&](size_t k) {
    ++runs[k];
    std::this_thread::sleep_for(microseconds(500));  // long enough for the helpers to start
    std::lock_guard<std::mutex> lock(mu);
    threads.insert(std::this_thread::get_id());
  });
  for (size_t k = 0; k < kN; ++k) EXPECT_EQ(runs[k].load(), 1) << "index " << k;
  EXPECT_GE(threads.size(), 2u) << "no helper ran an index";
  EXPECT_TRUE(threads.count(std::this_thread::get_id())) << "the caller claims indices too";

  // Every pool thread inside a RunSpread of its own, each asking for helpers of the same busy pool.
  std::atomic<int> nested{0}, finished{0};
  for (int t = 0; t < kThreads; ++t) {
    ASSERT_TRUE(pool.TrySubmit([&] {
      RunSpread(pool, 16, kThreads - 1, [&](size_t) {
        ++nested;
        std::this_thread::sleep_for(microseconds(200));
      });
      ++finished;
    }));
  }
  const auto t0 = Clock::now();
  while (finished.load() < kThreads && Clock::now() - t0 < std::chrono::seconds(10))
    std::this_thread::sleep_for(milliseconds(1));
  EXPECT_EQ(finished.load(), kThreads) << "a RunSpread inside the pool waited for a queued task";
  EXPECT_EQ(nested.load(), 16 * kThreads);

  std::atomic<int> ran{0};
  EXPECT_THROW(RunSpread(pool, 32, 2,
                         [&](size_t k) {
                           ++ran;
                           if (k == 5) throw std::runtime_error("chunk 5");
                         }),
               std::runtime_error);
  EXPECT_EQ(ran.load(), 32) << "an exception stopped the other indices";
  ran = 0;  // the same on the caller alone (no helpers)
  EXPECT_THROW(RunSpread(pool, 8, 0,
                         [&](size_t k) {
                           ++ran;
                           if (k == 1) throw std::runtime_error("chunk 1");
                         }),
               std::runtime_error);
  EXPECT_EQ(ran.load(), 8) << "an exception stopped the other indices (no helpers)";
  pool.Stop();
}

TEST(ServerBatcher, EncoderBatchLeavesWhenFull) {
  FakeEngine engine;
  // A delay far longer than the test: only the size trigger can release the batch.
  EncoderBatcher batcher("encoder", &engine, {4, std::chrono::seconds(60), 64}, nullptr);
  std::vector<std::shared_ptr<EncodeResult>> results;
  const auto t0 = Clock::now();
  for (int i = 0; i < 4; ++i) {
    results.push_back(std::make_shared<EncodeResult>());
    ASSERT_TRUE(batcher.Submit(MakeEncode(engine, static_cast<uint8_t>(i), results.back())).ok());
  }
  for (int i = 0; i < 4; ++i) {
    auto f = results[i]->promise.get_future();
    ASSERT_EQ(f.wait_for(std::chrono::seconds(10)), std::future_status::ready);
    auto e = f.get();
    ASSERT_TRUE(e.ok()) << e.status().ToString();
    // Results are in item order: each embedding is its own image's.
    EXPECT_EQ(FakeEngine::ContentOf(**e), FakeEngine::Checksum(Image(8, 6, static_cast<uint8_t>(i))));
    EXPECT_EQ(results[i]->timing.batch_size, 4u);
  }
  EXPECT_LT(Clock::now() - t0, std::chrono::seconds(5));
  EXPECT_EQ(engine.encode_batches(), std::vector<int>{4});
  const QueueCounters c = batcher.counters();
  EXPECT_EQ(c.batches, 1u);
  EXPECT_EQ(c.items, 4u);
  EXPECT_DOUBLE_EQ(c.mean_batch_size, 4.0);
  batcher.Stop();
}

TEST(ServerBatcher, EncoderBatchLeavesAfterQueueDelay) {
  FakeEngine engine;
  EncoderBatcher batcher("encoder", &engine, {8, milliseconds(50), 64}, nullptr);
  auto r1 = std::make_shared<EncodeResult>();
  auto r2 = std::make_shared<EncodeResult>();
  const auto t0 = Clock::now();
  ASSERT_TRUE(batcher.Submit(MakeEncode(engine, 1, r1)).ok());
  ASSERT_TRUE(batcher.Submit(MakeEncode(engine, 2, r2)).ok());
  auto f1 = r1->promise.get_future();
  ASSERT_EQ(f1.wait_for(std::chrono::seconds(10)), std::future_status::ready);
  const auto waited = Clock::now() - t0;
  EXPECT_TRUE(f1.get().ok());
  EXPECT_TRUE(r2->promise.get_future().get().ok());
  // Not before the oldest item's delay, and both items in that one partial batch.
  EXPECT_GE(waited, milliseconds(45));
  EXPECT_EQ(engine.encode_batches(), std::vector<int>{2});
  EXPECT_GE(r1->timing.queue_us, 45'000u);
  batcher.Stop();
}

TEST(ServerBatcher, FullQueueIsRefusedAtOnce) {
  FakeEngine engine;
  engine.HoldEncodes();
  EncoderBatcher batcher("encoder[cpu]", &engine, {1, microseconds(0), 2}, nullptr);
  std::vector<std::shared_ptr<EncodeResult>> results;
  for (int i = 0; i < 3; ++i) results.push_back(std::make_shared<EncodeResult>());
  // The first is taken by the (held) engine, the next two fill the queue.
  ASSERT_TRUE(batcher.Submit(MakeEncode(engine, 0, results[0])).ok());
  ASSERT_TRUE(engine.WaitForEncodeCalls(1, milliseconds(5000)));
  ASSERT_TRUE(batcher.Submit(MakeEncode(engine, 1, results[1])).ok());
  ASSERT_TRUE(batcher.Submit(MakeEncode(engine, 2, results[2])).ok());
  EXPECT_FALSE(batcher.HasRoom());
  auto overflow = std::make_shared<EncodeResult>();
  Status s = batcher.Submit(MakeEncode(engine, 3, overflow));
  // Refused while the engine still holds the first image (it is released only below, on this
  // thread): Submit does not wait for the engine, or this test would hang here.
  EXPECT_EQ(engine.encoded_images.load(), 0);
  EXPECT_EQ(s.code(), StatusCode::kResourceExhausted);
  EXPECT_EQ(s.message().rfind("encoder[cpu] queue is full (2 of 2 queued", 0), 0u) << s.message();
  EXPECT_EQ(batcher.counters().rejected, 1u);
  EXPECT_EQ(batcher.counters().depth, 2u);
  engine.ReleaseEncodes();
  for (auto& r : results) EXPECT_TRUE(r->promise.get_future().get().ok());
  batcher.Stop();
}

TEST(ServerBatcher, DeadItemsAreDroppedBeforeEngineWork) {
  FakeEngine engine;
  EncoderBatcher batcher("encoder", &engine, {8, milliseconds(30), 64}, nullptr);
  auto expired = std::make_shared<EncodeResult>();
  auto cancelled = std::make_shared<EncodeResult>();
  auto alive = std::make_shared<EncodeResult>();
  ASSERT_TRUE(batcher.Submit(MakeEncode(engine, 1, expired, [] {
                     return DeadlineExceeded("the call's deadline passed");
                   })).ok());
  ASSERT_TRUE(batcher.Submit(MakeEncode(engine, 2, cancelled, [] {
                     return Cancelled("the client cancelled the call");
                   })).ok());
  ASSERT_TRUE(batcher.Submit(MakeEncode(engine, 3, alive, [] { return Status::Ok(); })).ok());
  EXPECT_EQ(expired->promise.get_future().get().status().code(), StatusCode::kDeadlineExceeded);
  EXPECT_EQ(cancelled->promise.get_future().get().status().code(), StatusCode::kCancelled);
  EXPECT_TRUE(alive->promise.get_future().get().ok());
  // Only the live image reached the engine.
  EXPECT_EQ(engine.encode_batches(), std::vector<int>{1});
  EXPECT_EQ(engine.encoded_images.load(), 1);
  EXPECT_EQ(batcher.counters().dropped, 2u);

  // A batch of only dead items runs nothing at all.
  auto d = std::make_shared<EncodeResult>();
  ASSERT_TRUE(batcher.Submit(MakeEncode(engine, 4, d, [] { return Cancelled("gone"); })).ok());
  EXPECT_FALSE(d->promise.get_future().get().ok());
  EXPECT_EQ(engine.encode_calls.load(), 1);
  batcher.Stop();
}

TEST(ServerBatcher, EngineErrorReachesEveryItemOfTheBatch) {
  FakeEngine engine;
  engine.FailNextEncode(Internal("CUDA error: out of memory"));
  EncoderBatcher batcher("encoder", &engine, {2, std::chrono::seconds(60), 64}, nullptr);
  auto a = std::make_shared<EncodeResult>(), b = std::make_shared<EncodeResult>();
  ASSERT_TRUE(batcher.Submit(MakeEncode(engine, 1, a)).ok());
  ASSERT_TRUE(batcher.Submit(MakeEncode(engine, 2, b)).ok());
  for (auto* r : {a.get(), b.get()}) {
    auto s = r->promise.get_future().get().status();
    EXPECT_EQ(s.code(), StatusCode::kInternal);
    EXPECT_EQ(s.message(), "CUDA error: out of memory");
  }
  batcher.Stop();
}

TEST(ServerBatcher, StopFailsQueuedWorkWithUnavailable) {
  FakeEngine engine;
  engine.HoldEncodes();
  EncoderBatcher batcher("encoder", &engine, {1, microseconds(0), 8}, nullptr);
  auto running = std::make_shared<EncodeResult>(), queued = std::make_shared<EncodeResult>();
  ASSERT_TRUE(batcher.Submit(MakeEncode(engine, 1, running)).ok());
  ASSERT_TRUE(engine.WaitForEncodeCalls(1, milliseconds(5000)));
  ASSERT_TRUE(batcher.Submit(MakeEncode(engine, 2, queued)).ok());
  std::thread stopper([&] { batcher.Stop(); });
  std::this_thread::sleep_for(milliseconds(20));
  engine.ReleaseEncodes();
  stopper.join();
  EXPECT_TRUE(running->promise.get_future().get().ok());  // the running batch finishes
  EXPECT_EQ(queued->promise.get_future().get().status().code(), StatusCode::kUnavailable);
  auto late = std::make_shared<EncodeResult>();
  EXPECT_EQ(batcher.Submit(MakeEncode(engine, 3, late)).code(), StatusCode::kUnavailable);
}

// ---- Decoder ---------------------------------------------------------------------------------

struct DecodeResult {
  std::promise<StatusOr<std::vector<DecodedPrompt>>> promise;
  DecodeTiming timing;
};

DecoderBatcher::Request MakeDecode(std::vector<DecodeItem> prompts, std::shared_ptr<DecodeResult> out,
                                   std::function<Status()> alive = nullptr) {
  DecoderBatcher::Request r;
  r.prompts = std::move(prompts);
  r.alive = std::move(alive);
  r.done = [out](StatusOr<std::vector<DecodedPrompt>> d, const DecodeTiming& t) {
    out->timing = t;
    out->promise.set_value(std::move(d));
  };
  return r;
}

std::vector<DecodeItem> Prompts(const std::shared_ptr<const Embedding>& e, std::vector<float> xs,
                                bool multimask) {
  std::vector<DecodeItem> items;
  for (float x : xs) {
    PromptSpec p;
    p.points = {{x, 10.f, 1}};
    p.multimask = multimask;
    items.push_back({e, p});
  }
  return items;
}

TEST(ServerBatcher, JaggedDecodeAcrossRequestsAndImagesSplitsBackInOrder) {
  FakeEngine engine;
  auto e1 = *engine.Encode({*engine.Prepare(Image(64, 48, 1))});
  auto e2 = *engine.Encode({*engine.Prepare(Image(40, 80, 2))});
  // Reference: each request decoded alone.
  auto req_a = Prompts(e1[0], {5, 20, 33}, true);
  auto req_b = Prompts(e2[0], {7}, false);
  auto req_c = Prompts(e1[0], {1, 2}, false);
  auto alone_a = *engine.Decode(req_a);
  auto alone_b = *engine.Decode(req_b);
  auto alone_c = *engine.Decode(req_c);
  const int calls_before = engine.decode_calls.load();

  DecoderBatcher batcher("decoder", &engine, {6, std::chrono::seconds(60), 100}, nullptr);
  auto a = std::make_shared<DecodeResult>(), b = std::make_shared<DecodeResult>(),
       c = std::make_shared<DecodeResult>();
  ASSERT_TRUE(batcher.Submit(MakeDecode(req_a, a)).ok());
  ASSERT_TRUE(batcher.Submit(MakeDecode(req_b, b)).ok());
  ASSERT_TRUE(batcher.Submit(MakeDecode(req_c, c)).ok());  // 3 + 1 + 2 = 6: the batch is full
  auto check = [](const std::vector<DecodedPrompt>& got, const std::vector<DecodedPrompt>& want) {
    ASSERT_EQ(got.size(), want.size());
    for (size_t i = 0; i < got.size(); ++i) {
      EXPECT_EQ(got[i].scores, want[i].scores);
      EXPECT_EQ(got[i].logits->ToFloat(), want[i].logits->ToFloat());
    }
  };
  auto ra = a->promise.get_future().get();
  auto rb = b->promise.get_future().get();
  auto rc = c->promise.get_future().get();
  ASSERT_TRUE(ra.ok() && rb.ok() && rc.ok());
  check(*ra, alone_a);
  check(*rb, alone_b);
  check(*rc, alone_c);
  EXPECT_EQ(engine.decode_calls.load(), calls_before + 1);  // one engine call for all three
  EXPECT_EQ(engine.decode_batches().back(), 6);
  EXPECT_EQ(a->timing.batch_prompts, 6u);
  batcher.Stop();
}

TEST(ServerBatcher, DecoderRespectsMaxPromptsAndCapacityInPrompts) {
  FakeEngine engine;
  auto e = *engine.Encode({*engine.Prepare(Image(64, 48, 1))});
  DecoderBatcher batcher("decoder[cpu]", &engine, {4, milliseconds(20), 6}, nullptr);
  auto a = std::make_shared<DecodeResult>(), b = std::make_shared<DecodeResult>();
  ASSERT_TRUE(batcher.Submit(MakeDecode(Prompts(e[0], {1, 2, 3}, false), a)).ok());
  ASSERT_TRUE(batcher.Submit(MakeDecode(Prompts(e[0], {4, 5, 6}, false), b)).ok());
  // 6 prompts queued: a request of 1 more does not fit.
  auto c = std::make_shared<DecodeResult>();
  Status s = batcher.Submit(MakeDecode(Prompts(e[0], {7}, false), c));
  // Either refused (both still queued) or accepted (the first batch already left): never blocked.
  if (!s.ok()) {
    EXPECT_EQ(s.code(), StatusCode::kResourceExhausted);
    EXPECT_NE(s.message().find("decoder[cpu] queue is full"), std::string::npos) << s.message();
  } else {
    EXPECT_TRUE(c->promise.get_future().get().ok());
  }
  EXPECT_TRUE(a->promise.get_future().get().ok());
  EXPECT_TRUE(b->promise.get_future().get().ok());
  // 3 + 3 > 4: the two requests never share a batch.
  for (int n : engine.decode_batches()) EXPECT_LE(n, 4);
  batcher.Stop();
}

TEST(ServerBatcher, OneBadRequestDoesNotFailItsBatchMates) {
  FakeEngine engine;
  auto e = *engine.Encode({*engine.Prepare(Image(64, 48, 1))});
  DecoderBatcher batcher("decoder", &engine, {8, std::chrono::seconds(60), 100}, nullptr);
  auto good = std::make_shared<DecodeResult>(), bad = std::make_shared<DecodeResult>(),
       good2 = std::make_shared<DecodeResult>();
  ASSERT_TRUE(batcher.Submit(MakeDecode(Prompts(e[0], {3, 4}, true), good)).ok());
  ASSERT_TRUE(batcher.Submit(MakeDecode(Prompts(e[0], {1e6f}, true), bad)).ok());  // outside
  ASSERT_TRUE(batcher.Submit(MakeDecode(Prompts(e[0], {1, 2, 5, 6, 7}, false), good2)).ok());
  EXPECT_TRUE(good->promise.get_future().get().ok());
  EXPECT_EQ(bad->promise.get_future().get().status().code(), StatusCode::kInvalidArgument);
  auto g2 = good2->promise.get_future().get();
  ASSERT_TRUE(g2.ok());
  EXPECT_EQ(g2->size(), 5u);
  // 2 + 1 + 5 prompts fill one batch of 8, and the bad prompt is answered without a second pass.
  EXPECT_EQ(engine.decode_calls.load(), 1);
  EXPECT_EQ(engine.decode_batches(), std::vector<int>{8});
  batcher.Stop();
}

TEST(ServerBatcher, PartsOfOneRequestTakeTurnsWithOtherRequests) {
  FakeEngine engine;
  auto e = *engine.Encode({*engine.Prepare(Image(64, 48, 1))});
  BatchQueueOptions o{8, milliseconds(200), 100};
  o.max_group_weight = 2;
  DecoderBatcher batcher("decoder", &engine, o, nullptr);
  EXPECT_EQ(batcher.max_part_prompts(), 2u);
  // Request A in three parts of 2 prompts, then request B (2 prompts): 8 queued, a full batch.
  int group_a = 0, group_b = 0;
  std::vector<std::shared_ptr<DecodeResult>> a;
  for (int part = 0; part < 3; ++part) {
    a.push_back(std::make_shared<DecodeResult>());
    DecoderBatcher::Request r = MakeDecode(Prompts(e[0], {1.0f + part, 2.0f + part}, false), a.back());
    r.group = &group_a;
    ASSERT_TRUE(batcher.Submit(std::move(r)).ok());
  }
  auto b = std::make_shared<DecodeResult>();
  DecoderBatcher::Request rb = MakeDecode(Prompts(e[0], {5, 6}, false), b);
  rb.group = &group_b;
  ASSERT_TRUE(batcher.Submit(std::move(rb)).ok());
  EXPECT_TRUE(b->promise.get_future().get().ok());
  for (auto& r : a) EXPECT_TRUE(r->promise.get_future().get().ok());
  // B shares A's first batch instead of waiting for all of A; A's other parts go one per batch.
  EXPECT_EQ(engine.decode_batches(), (std::vector<int>{4, 2, 2}));
  batcher.Stop();
}

TEST(ServerBatcher, DecoderDropsCancelledBeforeEngineWork) {
  FakeEngine engine;
  auto e = *engine.Encode({*engine.Prepare(Image(64, 48, 1))});
  DecoderBatcher batcher("decoder", &engine, {8, milliseconds(10), 100}, nullptr);
  auto gone = std::make_shared<DecodeResult>();
  ASSERT_TRUE(batcher.Submit(MakeDecode(Prompts(e[0], {1, 2}, false), gone,
                                        [] { return Cancelled("the client cancelled the call"); }))
                  .ok());
  EXPECT_EQ(gone->promise.get_future().get().status().code(), StatusCode::kCancelled);
  EXPECT_EQ(engine.decode_calls.load(), 0);
  EXPECT_EQ(batcher.counters().dropped, 1u);
  batcher.Stop();
}

// --gpu-turns: while an encoder batch runs, a decoder batch waits for it (and counts the wait as
// queueing); without turns the two overlap. The encoder is held inside Engine::Encode, so both
// outcomes are decided by construction, not by timing luck.
TEST(ServerBatcher, GpuTurnsKeepDecoderBatchesOffTheDeviceWhileTheEncoderRuns) {
  for (const bool with_turns : {false, true}) {
    SCOPED_TRACE(with_turns ? "with turns" : "without turns");
    FakeEngine engine;
    auto e = *engine.Encode({*engine.Prepare(Image(64, 48, 1))});
    GpuTurns turns;
    GpuTurns* t = with_turns ? &turns : nullptr;
    EncoderBatcher encoder("encoder", &engine, {1, milliseconds(1), 8}, nullptr, {}, t);
    DecoderBatcher decoder("decoder", &engine, {8, milliseconds(1), 100}, nullptr, {}, t);
    engine.HoldEncodes();
    const int encodes_before = engine.encode_calls.load();
    auto enc = std::make_shared<EncodeResult>();
    ASSERT_TRUE(encoder.Submit(MakeEncode(engine, 7, enc)).ok());
    ASSERT_TRUE(engine.WaitForEncodeCalls(encodes_before + 1, std::chrono::seconds(10)));
    auto dec = std::make_shared<DecodeResult>();
    ASSERT_TRUE(decoder.Submit(MakeDecode(Prompts(e[0], {3, 4}, false), dec)).ok());
    auto dec_future = dec->promise.get_future();
    if (with_turns) {
      EXPECT_EQ(dec_future.wait_for(milliseconds(300)), std::future_status::timeout)
          << "the decoder batch ran while the encoder batch held the device";
      EXPECT_EQ(engine.decode_calls.load(), 0);
    } else {
      EXPECT_EQ(dec_future.wait_for(std::chrono::seconds(10)), std::future_status::ready)
          << "without turns the decoder batch should not wait for the encoder";
    }
    engine.ReleaseEncodes();
    auto enc_future = enc->promise.get_future();
    ASSERT_EQ(enc_future.wait_for(std::chrono::seconds(10)), std::future_status::ready);
    EXPECT_TRUE(enc_future.get().ok());
    ASSERT_EQ(dec_future.wait_for(std::chrono::seconds(10)), std::future_status::ready);
    EXPECT_TRUE(dec_future.get().ok());
    if (with_turns) {
      EXPECT_GE(dec->timing.queue_us, 250'000u) << "the wait for the turn is queueing time";
      EXPECT_EQ(turns.turns_taken(), 2u);
    }
    encoder.Stop();
    decoder.Stop();
  }
}

// Turns are served in the order they were asked for: a side that finishes its turn and asks again
// queues behind the side that was already waiting.
TEST(ServerBatcher, GpuTurnsAreFirstComeFirstServed) {
  GpuTurns turns;
  std::mutex mu;
  std::vector<int> order;
  std::promise<void> holder_in, release;
  std::shared_future<void> released = release.get_future().share();
  std::thread holder([&] {
    GpuTurns::Turn turn(&turns);
    holder_in.set_value();
    released.wait();
    std::lock_guard<std::mutex> lock(mu);
    order.push_back(0);
  });
  holder_in.get_future().wait();
  std::vector<std::thread> waiters;
  for (int i = 1; i <= 3; ++i) {
    waiters.emplace_back([&, i] {
      GpuTurns::Turn turn(&turns);
      std::lock_guard<std::mutex> lock(mu);
      order.push_back(i);
    });
    // Each waiter has taken its ticket before the next one starts.
    const auto deadline = Clock::now() + std::chrono::seconds(10);
    while (turns.turns_taken() < static_cast<uint64_t>(i + 1) && Clock::now() < deadline)
      std::this_thread::sleep_for(milliseconds(1));
    ASSERT_EQ(turns.turns_taken(), static_cast<uint64_t>(i + 1));
  }
  release.set_value();
  holder.join();
  for (auto& w : waiters) w.join();
  EXPECT_EQ(order, (std::vector<int>{0, 1, 2, 3}));
}

}  // namespace
}  // namespace maskd::server
