// Embedding cache (LRU by bytes, device/host tiers, single flight, statistics), result store, and
// content addresses.
#include <gtest/gtest.h>

#include <atomic>
#include <thread>

#include "server/embedding_cache.h"
#include "model/io/image_id.h"
#include "server/result_store.h"
#include "tests/fake_engine.h"

namespace maskd::server {
namespace {

using fake::FakeEngine;

CachedEmbedding Value(const std::string& id, size_t bytes, bool on_host = false) {
  CachedEmbedding v;
  v.image_id = id;
  v.geometry = {64, 48, 1024, 768};
  v.embedding = FakeEngine::MakeEmbedding(bytes, std::hash<std::string>{}(id), on_host);
  v.bytes = bytes;
  return v;
}

// Puts `id` into the cache as a leader would.
void Insert(EmbeddingCache& cache, const std::string& id, size_t bytes) {
  auto a = cache.Acquire(id, true, nullptr, nullptr);
  ASSERT_EQ(a.outcome, EmbeddingCache::Outcome::kLeader) << id;
  ASSERT_TRUE(cache.Complete(a.flight, Value(id, bytes)).ok());
}

EmbeddingCache::Outcome Probe(EmbeddingCache& cache, const std::string& id) {
  auto a = cache.Acquire(id, false, nullptr, nullptr);
  if (a.outcome == EmbeddingCache::Outcome::kPromote) {
    EXPECT_TRUE(cache.Promote(a.flight).ok());
  }
  return a.outcome;
}

struct Moves {
  std::atomic<int> to_host{0}, to_device{0};
  std::vector<std::string> evicted;
  std::mutex mu;
  EmbeddingCache::MoveFn host() {
    return [this](const Embedding& e) -> StatusOr<std::shared_ptr<const Embedding>> {
      ++to_host;
      return FakeEngine::MakeEmbedding(e.bytes(), FakeEngine::ContentOf(e), true);
    };
  }
  EmbeddingCache::MoveFn device() {
    return [this](const Embedding& e) -> StatusOr<std::shared_ptr<const Embedding>> {
      ++to_device;
      return FakeEngine::MakeEmbedding(e.bytes(), FakeEngine::ContentOf(e), false);
    };
  }
  EmbeddingCache::EvictFn evict() {
    return [this](const std::string& id) {
      std::lock_guard<std::mutex> lock(mu);
      evicted.push_back(id);
    };
  }
};

TEST(ServerCache, LruByBytesOnOneTier) {
  Moves mv;
  EmbeddingCache cache({/*device*/ 300, /*host*/ 0}, nullptr, nullptr, mv.evict());
  Insert(cache, "a", 100);
  Insert(cache, "b", 100);
  Insert(cache, "c", 100);
  EXPECT_EQ(cache.counters().device.bytes, 300u);
  // Touch a: b is now the least recently used.
  EXPECT_EQ(Probe(cache, "a"), EmbeddingCache::Outcome::kHit);
  Insert(cache, "d", 100);
  EXPECT_TRUE(cache.Contains("a"));
  EXPECT_FALSE(cache.Contains("b"));
  EXPECT_TRUE(cache.Contains("c"));
  EXPECT_TRUE(cache.Contains("d"));
  // A big entry pushes out as many as needed, oldest first (c, then a).
  Insert(cache, "e", 200);
  EXPECT_FALSE(cache.Contains("c"));
  EXPECT_FALSE(cache.Contains("a"));
  EXPECT_TRUE(cache.Contains("d"));
  EXPECT_TRUE(cache.Contains("e"));
  const CacheCounters c = cache.counters();
  EXPECT_EQ(c.device.entries, 2u);
  EXPECT_EQ(c.device.bytes, 300u);
  EXPECT_EQ(c.device.capacity_bytes, 300u);
  EXPECT_EQ(c.evictions, 3u);
  EXPECT_EQ(c.demotions, 0u);
  EXPECT_EQ(c.misses, 5u);
  EXPECT_EQ(c.hits, 1u);
  EXPECT_EQ(mv.evicted, (std::vector<std::string>{"b", "c", "a"}));
  EXPECT_EQ(Probe(cache, "b"), EmbeddingCache::Outcome::kAbsent);
}

TEST(ServerCache, EntryLargerThanTheCacheIsServedButNotKept) {
  EmbeddingCache cache({100, 0}, nullptr, nullptr, nullptr);
  auto a = cache.Acquire("huge", true, nullptr, nullptr);
  auto r = cache.Complete(a.flight, Value("huge", 101));
  ASSERT_TRUE(r.ok());
  EXPECT_EQ((*r)->image_id, "huge");  // the requester still gets it
  EXPECT_FALSE(cache.Contains("huge"));
  EXPECT_EQ(cache.counters().device.bytes, 0u);
}

TEST(ServerCache, DeviceTierDemotesToHostAndPromotesBack) {
  Moves mv;
  EmbeddingCache cache({200, 200}, mv.host(), mv.device(), mv.evict());
  Insert(cache, "a", 100);
  Insert(cache, "b", 100);
  Insert(cache, "c", 100);  // a -> host
  CacheCounters c = cache.counters();
  EXPECT_EQ(c.device.entries, 2u);
  EXPECT_EQ(c.host.entries, 1u);
  EXPECT_EQ(c.host.bytes, 100u);
  EXPECT_EQ(c.demotions, 1u);
  EXPECT_EQ(c.evictions, 0u);
  EXPECT_EQ(mv.to_host.load(), 1);

  // A hit in the host tier is promoted (ToDevice), demoting the device tier's LRU (b).
  auto a = cache.Acquire("a", false, nullptr, nullptr);
  ASSERT_EQ(a.outcome, EmbeddingCache::Outcome::kPromote);
  auto promoted = cache.Promote(a.flight);
  ASSERT_TRUE(promoted.ok());
  EXPECT_FALSE((*promoted)->embedding->on_host());
  EXPECT_EQ(mv.to_device.load(), 1);
  c = cache.counters();
  EXPECT_EQ(c.promotions, 1u);
  EXPECT_EQ(c.demotions, 2u);
  EXPECT_EQ(Probe(cache, "a"), EmbeddingCache::Outcome::kHit);
  EXPECT_EQ(Probe(cache, "c"), EmbeddingCache::Outcome::kHit);

  // Host tier full: its LRU is evicted from the last tier (on_evict).
  Insert(cache, "d", 100);  // a or c -> host (LRU of device: a was touched before c -> a)
  Insert(cache, "e", 100);
  c = cache.counters();
  EXPECT_EQ(c.device.entries, 2u);
  EXPECT_EQ(c.host.entries, 2u);
  EXPECT_EQ(c.evictions, 1u);
  ASSERT_EQ(mv.evicted.size(), 1u);
  EXPECT_EQ(mv.evicted[0], "b");  // the oldest host entry
  EXPECT_EQ(Probe(cache, "b"), EmbeddingCache::Outcome::kAbsent);
}

TEST(ServerCache, NoHostTierMeansEvictionNotDemotion) {
  Moves mv;
  // A CPU engine: device tier only, host capacity 0 even if configured.
  EmbeddingCache cache({100, 0}, nullptr, nullptr, mv.evict());
  Insert(cache, "a", 100);
  Insert(cache, "b", 100);
  EXPECT_EQ(cache.counters().demotions, 0u);
  EXPECT_EQ(cache.counters().evictions, 1u);
  EXPECT_EQ(cache.counters().host.capacity_bytes, 0u);
  EXPECT_EQ(mv.to_host.load(), 0);
}

TEST(ServerCache, SingleFlightJoinsAndNotifiesOnce) {
  EmbeddingCache cache({1000, 0}, nullptr, nullptr, nullptr);
  auto leader = cache.Acquire("x", true, nullptr, nullptr);
  ASSERT_EQ(leader.outcome, EmbeddingCache::Outcome::kLeader);
  std::atomic<int> notified{0};
  std::vector<std::thread> joiners;
  for (int i = 0; i < 8; ++i) {
    joiners.emplace_back([&] {
      auto a = cache.Acquire("x", true, nullptr, [&](StatusOr<CachedEmbeddingPtr> r) {
        EXPECT_TRUE(r.ok());
        EXPECT_EQ((*r)->image_id, "x");
        ++notified;
      });
      EXPECT_EQ(a.outcome, EmbeddingCache::Outcome::kJoined);
    });
  }
  for (auto& t : joiners) t.join();
  EXPECT_EQ(notified.load(), 0);
  EXPECT_EQ(cache.counters().single_flight_joins, 8u);
  EXPECT_TRUE(cache.Holds("x"));
  EXPECT_FALSE(cache.Contains("x"));
  ASSERT_TRUE(cache.Complete(leader.flight, Value("x", 10)).ok());
  EXPECT_EQ(notified.load(), 8);
  EXPECT_EQ(Probe(cache, "x"), EmbeddingCache::Outcome::kHit);
  // A flight completes once.
  EXPECT_FALSE(cache.Complete(leader.flight, Value("x", 10)).ok());
}

TEST(ServerCache, FailedFlightTellsJoinersAndLeavesNothingBehind) {
  EmbeddingCache cache({1000, 0}, nullptr, nullptr, nullptr);
  auto leader = cache.Acquire("x", true, nullptr, nullptr);
  Status seen;
  cache.Acquire("x", true, nullptr, [&](StatusOr<CachedEmbeddingPtr> r) { seen = r.status(); });
  auto r = cache.Complete(leader.flight, InvalidArgument("image.encoded: corrupt"));
  EXPECT_FALSE(r.ok());
  EXPECT_EQ(seen.code(), StatusCode::kInvalidArgument);
  EXPECT_FALSE(cache.Holds("x"));
  // The next request leads a new flight.
  EXPECT_EQ(cache.Acquire("x", true, nullptr, nullptr).outcome, EmbeddingCache::Outcome::kLeader);
}

TEST(ServerCache, FlightIsAliveWhileAnyRequestWaits) {
  EmbeddingCache cache({1000, 0}, nullptr, nullptr, nullptr);
  auto now = Clock::now();
  auto dead = std::make_shared<CallControl>("dead", now - std::chrono::seconds(1), nullptr);
  auto cancelled = std::make_shared<CallControl>("c", Clock::time_point::max(), [] { return true; });
  auto alive = std::make_shared<CallControl>("alive", Clock::time_point::max(), [] { return false; });
  auto leader = cache.Acquire("x", true, dead, nullptr);
  EXPECT_EQ(cache.FlightAlive(leader.flight).code(), StatusCode::kDeadlineExceeded);
  cache.Acquire("x", true, cancelled, [](StatusOr<CachedEmbeddingPtr>) {});
  EXPECT_FALSE(cache.FlightAlive(leader.flight).ok());
  cache.Acquire("x", true, alive, [](StatusOr<CachedEmbeddingPtr>) {});
  EXPECT_TRUE(cache.FlightAlive(leader.flight).ok());
  alive->MarkFinished();
  EXPECT_EQ(cache.FlightAlive(leader.flight).code(), StatusCode::kDeadlineExceeded);
}

TEST(ServerResultStore, LruByBytesAndIds) {
  ResultStore store(250);
  auto logits = [] { return std::shared_ptr<const MaskLogits>(); };
  const std::string r1 = store.Put({"img", logits(), 3, 1, 100});
  const std::string r2 = store.Put({"img", logits(), 3, 0, 100});
  EXPECT_NE(r1, r2);
  EXPECT_EQ(r1.size(), 33u);
  ASSERT_TRUE(store.Get(r1, "f").ok());  // r2 is now the LRU
  const std::string r3 = store.Put({"other", logits(), 1, 0, 100});
  EXPECT_TRUE(store.Get(r1, "f").ok());
  auto gone = store.Get(r2, "prompts[0].mask_input.result_id");
  ASSERT_FALSE(gone.ok());
  EXPECT_EQ(gone.status().code(), StatusCode::kNotFound);
  EXPECT_EQ(gone.status().message().rfind("prompts[0].mask_input.result_id = \"" + r2 + "\"", 0), 0u)
      << gone.status().message();
  auto got = store.Get(r3, "f");
  ASSERT_TRUE(got.ok());
  EXPECT_EQ(got->image_id, "other");
  EXPECT_EQ(got->num_masks, 1);
  const ResultStoreCounters c = store.counters();
  EXPECT_EQ(c.entries, 2u);
  EXPECT_EQ(c.bytes, 200u);
  EXPECT_EQ(c.evictions, 1u);
  // Too large for the store: an id that is unknown at once.
  const std::string big = store.Put({"img", logits(), 1, 0, 251});
  EXPECT_EQ(store.Get(big, "f").status().code(), StatusCode::kNotFound);
}

TEST(ServerResultStore, ResultsLeaveWithTheirImage) {
  ResultStore store(1 << 20);
  Moves mv;
  EmbeddingCache cache({100, 0}, nullptr, nullptr,
                       [&](const std::string& id) { store.DropImage(id); });
  Insert(cache, "a", 100);
  const std::string ra = store.Put({"a", nullptr, 1, 0, 10});
  const std::string ra2 = store.Put({"a", nullptr, 1, 0, 10});
  Insert(cache, "b", 100);  // evicts a, and with it a's results
  const std::string rb = store.Put({"b", nullptr, 1, 0, 10});
  EXPECT_EQ(store.Get(ra, "f").status().code(), StatusCode::kNotFound);
  EXPECT_EQ(store.Get(ra2, "f").status().code(), StatusCode::kNotFound);
  EXPECT_TRUE(store.Get(rb, "f").ok());
  EXPECT_EQ(store.counters().entries, 1u);
  EXPECT_EQ(store.counters().bytes, 10u);
}

TEST(ServerImageId, ContentAddressesAreStableAndSeparated) {
  // FIPS 180-2's test vector.
  EXPECT_EQ(Sha256Hex("abc"), "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  const std::string a = ImageIdForEncoded("model-1", "bytes");
  EXPECT_EQ(a, ImageIdForEncoded("model-1", "bytes"));
  EXPECT_TRUE(LooksLikeImageId(a));
  EXPECT_NE(a, ImageIdForEncoded("model-2", "bytes"));  // the model is part of the address
  EXPECT_NE(a, ImageIdForEncoded("model-1", "bytez"));
  // Raw pixels: the same bytes with another shape are another image.
  const std::string rgb(12, '\x7f');
  EXPECT_NE(ImageIdForRaw("m", 2, 2, rgb), ImageIdForRaw("m", 4, 1, rgb));
  EXPECT_NE(ImageIdForRaw("m", 2, 2, rgb), ImageIdForEncoded("m", rgb));
  EXPECT_FALSE(LooksLikeImageId("ABC"));
  EXPECT_FALSE(LooksLikeImageId(std::string(64, 'g')));
  EXPECT_TRUE(LooksLikeImageId(std::string(64, 'f')));
}

TEST(ServerImageId, MatchesTheDocumentedScheme) {
  // Pinned values of the scheme written in model/io/image_id.h and maskd.proto (framed fields, 8-byte
  // little-endian lengths). client/python/tests/test_client_unit.py pins the same two values for the
  // Python client's copy, so a change on either side fails a test.
  EXPECT_EQ(ImageIdForEncoded("model-1", "bytes"),
            "af36684893d54e81145bab43c7c0c21c187cb972722361bb50a564cc62373c10");
  const std::string rgb = {0, 1, 2, 3, 4, 5};
  EXPECT_EQ(ImageIdForRaw("m", 2, 1, rgb),
            "dc2deb7c7aa88f6dd46f88656ab584bbc389fc99ec26fec9caff3c6d42f6a404");
}

}  // namespace
}  // namespace maskd::server
