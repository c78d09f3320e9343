// One device's embedding cache: content-addressed (image_id), bounded by bytes with LRU eviction, a
// device tier with a host tier behind it, and single-flight computation.
//
// - Device tier: embeddings ready for Engine::Decode. When it is over capacity its least recently
//   used entries are demoted to the host tier (Engine::ToHost), or evicted when there is no host
//   tier (CPU engines: host capacity 0).
// - Host tier: a hit is promoted back to the device (Engine::ToDevice) before use; over capacity,
//   its LRU entries are evicted. Eviction from the last tier calls on_evict (the result store drops
//   the image's stored results with it).
// - Single flight: the first request for a new image becomes the leader of a "flight" and computes
//   the embedding; requests arriving meanwhile join the flight and are called back with its result
//   (so N concurrent requests for one new image cost one encode). Promotions are flights too.
//
// Callbacks (waiters, on_evict) and tier moves never run under the cache's lock.
#pragma once

#include <cstdint>
#include <functional>
#include <list>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "model/api/engine.h"
#include "model/api/status.h"
#include "server/call_control.h"

namespace maskd::server {

// The image an embedding belongs to, in original pixels and after the encoder's resize.
struct ImageGeometry {
  int width = 0, height = 0;
  int input_width = 0, input_height = 0;
};

struct CachedEmbedding {
  // The cache key: the image_id, with the caller's scope when caches are scoped (the pipeline's
  // CacheKey). The result store ties results to the same key.
  std::string image_id;
  ImageGeometry geometry;
  std::shared_ptr<const Embedding> embedding;
  size_t bytes = 0;
};
using CachedEmbeddingPtr = std::shared_ptr<const CachedEmbedding>;

struct CacheTierCounts {
  uint64_t entries = 0, bytes = 0, capacity_bytes = 0;
};

struct CacheCounters {
  CacheTierCounts device, host;
  uint64_t hits = 0, misses = 0, evictions = 0, demotions = 0, promotions = 0;
  uint64_t single_flight_joins = 0;
};

class EmbeddingCache {
 public:
  struct Options {
    uint64_t device_capacity_bytes = uint64_t{2} << 30;
    uint64_t host_capacity_bytes = 0;
  };
  using MoveFn = std::function<StatusOr<std::shared_ptr<const Embedding>>(const Embedding&)>;
  using EvictFn = std::function<void(const std::string& image_id)>;
  using Waiter = std::function<void(StatusOr<CachedEmbeddingPtr>)>;
  struct Flight;

  // to_host may be empty when host_capacity_bytes is 0.
  EmbeddingCache(Options options, MoveFn to_host, MoveFn to_device, EvictFn on_evict);

  enum class Outcome {
    kHit,      // `entry` is on the device, use it
    kJoined,   // another request computes it; `waiter` will be called
    kLeader,   // compute it, then Complete(flight, ...)
    kPromote,  // it is in the host tier: call Promote(flight)
    kAbsent,   // not cached and create == false
  };
  struct Acquired {
    Outcome outcome = Outcome::kAbsent;
    CachedEmbeddingPtr entry;
    std::shared_ptr<Flight> flight;
  };

  // Looks image_id up. With create == false (requests that name an image_id) a missing image is
  // kAbsent instead of a new flight. `control` joins the flight's liveness (see FlightAlive).
  Acquired Acquire(const std::string& image_id, bool create, const CallControlPtr& control,
                   Waiter waiter);
  // True when the image is cached or in flight here (for the router).
  bool Holds(const std::string& image_id) const;
  bool Contains(const std::string& image_id) const;  // cached (either tier), not merely in flight

  // The leader's end of a flight: inserts the embedding into the device tier (or records the
  // error), calls the joined waiters, then demotes/evicts what no longer fits.
  StatusOr<CachedEmbeddingPtr> Complete(const std::shared_ptr<Flight>& flight,
                                        StatusOr<CachedEmbedding> result);
  // Moves a host-tier entry back to the device (kPromote), completing its flight.
  StatusOr<CachedEmbeddingPtr> Promote(const std::shared_ptr<Flight>& flight);

  // OK while the leader or any joined request is still alive: an encoder batcher drops the work of
  // a flight nobody waits for any more.
  Status FlightAlive(const std::shared_ptr<Flight>& flight) const;

  CacheCounters counters() const;

 private:
  enum class Tier { kDevice, kHost };
  struct Entry {
    CachedEmbeddingPtr value;
    Tier tier = Tier::kDevice;
    std::list<std::string>::iterator lru;
    bool demoting = false;
  };
  struct Demotion {
    std::string image_id;
    CachedEmbeddingPtr value;
  };

  // All *Locked functions require mu_.
  void InsertDeviceLocked(CachedEmbeddingPtr value, std::vector<Demotion>* demote,
                          std::vector<std::string>* evicted);
  void RemoveLocked(const std::string& image_id);
  void EvictHostLocked(std::vector<std::string>* evicted);
  // Tier moves and callbacks, without the lock.
  void FinishMoves(std::vector<Demotion> demote, std::vector<std::string> evicted);
  void NotifyEvicted(const std::vector<std::string>& evicted);

  const Options options_;
  const MoveFn to_host_;
  const MoveFn to_device_;
  const EvictFn on_evict_;

  // Guards everything below. Held only for map/list updates: never across a tier move, an engine
  // call or a callback.
  mutable std::mutex mu_;
  std::unordered_map<std::string, Entry> entries_;
  std::list<std::string> device_lru_, host_lru_;  // front = most recently used
  std::unordered_map<std::string, std::shared_ptr<Flight>> flights_;
  uint64_t device_bytes_ = 0, host_bytes_ = 0, demoting_bytes_ = 0;
  CacheCounters counters_;
};

}  // namespace maskd::server
