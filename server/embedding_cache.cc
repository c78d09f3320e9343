#include "server/embedding_cache.h"

#include <utility>

namespace maskd::server {

struct EmbeddingCache::Flight {
  std::string image_id;
  std::vector<Waiter> waiters;
  std::vector<CallControlPtr> controls;  // the leader's first
  CachedEmbeddingPtr host_entry;         // promotions only
  bool done = false;
};

EmbeddingCache::EmbeddingCache(Options options, MoveFn to_host, MoveFn to_device, EvictFn on_evict)
    : options_(options),
      to_host_(std::move(to_host)),
      to_device_(std::move(to_device)),
      on_evict_(std::move(on_evict)) {
  counters_.device.capacity_bytes = options_.device_capacity_bytes;
  counters_.host.capacity_bytes = to_host_ ? options_.host_capacity_bytes : 0;
}

EmbeddingCache::Acquired EmbeddingCache::Acquire(const std::string& image_id, bool create,
                                                 const CallControlPtr& control, Waiter waiter) {
  std::lock_guard<std::mutex> lock(mu_);
  Acquired out;
  if (auto f = flights_.find(image_id); f != flights_.end()) {
    f->second->waiters.push_back(std::move(waiter));
    if (control) f->second->controls.push_back(control);
    ++counters_.single_flight_joins;
    out.outcome = Outcome::kJoined;
    return out;
  }
  if (auto e = entries_.find(image_id); e != entries_.end()) {
    Entry& entry = e->second;
    ++counters_.hits;
    if (entry.tier == Tier::kDevice) {
      device_lru_.splice(device_lru_.begin(), device_lru_, entry.lru);
      out.outcome = Outcome::kHit;
      out.entry = entry.value;
      return out;
    }
    auto flight = std::make_shared<Flight>();
    flight->image_id = image_id;
    flight->host_entry = entry.value;
    if (control) flight->controls.push_back(control);
    flights_[image_id] = flight;
    out.outcome = Outcome::kPromote;
    out.flight = std::move(flight);
    return out;
  }
  ++counters_.misses;
  if (!create) {
    out.outcome = Outcome::kAbsent;
    return out;
  }
  auto flight = std::make_shared<Flight>();
  flight->image_id = image_id;
  if (control) flight->controls.push_back(control);
  flights_[image_id] = flight;
  out.outcome = Outcome::kLeader;
  out.flight = std::move(flight);
  return out;
}

bool EmbeddingCache::Holds(const std::string& image_id) const {
  std::lock_guard<std::mutex> lock(mu_);
  return entries_.count(image_id) > 0 || flights_.count(image_id) > 0;
}

bool EmbeddingCache::Contains(const std::string& image_id) const {
  std::lock_guard<std::mutex> lock(mu_);
  return entries_.count(image_id) > 0;
}

Status EmbeddingCache::FlightAlive(const std::shared_ptr<Flight>& flight) const {
  std::vector<CallControlPtr> controls;
  {
    std::lock_guard<std::mutex> lock(mu_);
    controls = flight->controls;
  }
  if (controls.empty()) return Status::Ok();
  Status first;
  for (const auto& c : controls) {
    Status s = c->Check();
    if (s.ok()) return s;
    if (first.ok()) first = s;
  }
  return first;
}

void EmbeddingCache::InsertDeviceLocked(CachedEmbeddingPtr value, std::vector<Demotion>* demote,
                                        std::vector<std::string>* evicted) {
  const std::string id = value->image_id;
  if (entries_.count(id)) RemoveLocked(id);
  device_lru_.push_front(id);
  Entry entry;
  entry.value = std::move(value);
  entry.tier = Tier::kDevice;
  entry.lru = device_lru_.begin();
  device_bytes_ += entry.value->bytes;
  entries_[id] = std::move(entry);

  const bool host_tier = to_host_ && options_.host_capacity_bytes > 0;
  auto it = device_lru_.end();
  while (device_bytes_ - demoting_bytes_ > options_.device_capacity_bytes &&
         it != device_lru_.begin()) {
    --it;
    Entry& victim = entries_.at(*it);
    if (victim.demoting) continue;
    if (host_tier && victim.value->bytes <= options_.host_capacity_bytes) {
      victim.demoting = true;
      demoting_bytes_ += victim.value->bytes;
      demote->push_back({*it, victim.value});
    } else {
      const std::string victim_id = *it;
      ++it;  // RemoveLocked invalidates the victim's iterator only
      RemoveLocked(victim_id);
      ++counters_.evictions;
      evicted->push_back(victim_id);
    }
  }
}

void EmbeddingCache::RemoveLocked(const std::string& image_id) {
  auto e = entries_.find(image_id);
  if (e == entries_.end()) return;
  Entry& entry = e->second;
  if (entry.tier == Tier::kDevice) {
    device_bytes_ -= entry.value->bytes;
    if (entry.demoting) demoting_bytes_ -= entry.value->bytes;
    device_lru_.erase(entry.lru);
  } else {
    host_bytes_ -= entry.value->bytes;
    host_lru_.erase(entry.lru);
  }
  entries_.erase(e);
}

void EmbeddingCache::EvictHostLocked(std::vector<std::string>* evicted) {
  while (host_bytes_ > options_.host_capacity_bytes && !host_lru_.empty()) {
    const std::string victim = host_lru_.back();
    RemoveLocked(victim);
    ++counters_.evictions;
    evicted->push_back(victim);
  }
}

void EmbeddingCache::NotifyEvicted(const std::vector<std::string>& evicted) {
  if (!on_evict_) return;
  for (const auto& id : evicted) on_evict_(id);
}

void EmbeddingCache::FinishMoves(std::vector<Demotion> demote, std::vector<std::string> evicted) {
  for (auto& d : demote) {
    StatusOr<std::shared_ptr<const Embedding>> host = to_host_(*d.value->embedding);
    std::lock_guard<std::mutex> lock(mu_);
    auto e = entries_.find(d.image_id);
    // Gone (evicted or replaced) while it was being copied: nothing to move.
    if (e == entries_.end() || !e->second.demoting || e->second.value != d.value) continue;
    if (!host.ok()) {
      RemoveLocked(d.image_id);
      ++counters_.evictions;
      evicted.push_back(d.image_id);
      continue;
    }
    Entry& entry = e->second;
    auto moved = std::make_shared<CachedEmbedding>(*entry.value);
    moved->embedding = std::move(*host);
    device_bytes_ -= entry.value->bytes;
    demoting_bytes_ -= entry.value->bytes;
    device_lru_.erase(entry.lru);
    host_lru_.push_front(d.image_id);
    entry.lru = host_lru_.begin();
    entry.tier = Tier::kHost;
    entry.demoting = false;
    entry.value = std::move(moved);
    host_bytes_ += entry.value->bytes;
    ++counters_.demotions;
    EvictHostLocked(&evicted);
  }
  NotifyEvicted(evicted);
}

StatusOr<CachedEmbeddingPtr> EmbeddingCache::Complete(const std::shared_ptr<Flight>& flight,
                                                      StatusOr<CachedEmbedding> result) {
  std::vector<Waiter> waiters;
  std::vector<Demotion> demote;
  std::vector<std::string> evicted;
  StatusOr<CachedEmbeddingPtr> out = Internal("flight completed twice");
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (flight->done) return out;
    flight->done = true;
    if (auto f = flights_.find(flight->image_id); f != flights_.end() && f->second == flight) {
      flights_.erase(f);
    }
    waiters = std::move(flight->waiters);
    if (result.ok()) {
      auto value = std::make_shared<const CachedEmbedding>(std::move(*result));
      out = value;
      InsertDeviceLocked(value, &demote, &evicted);
    } else {
      out = result.status();
    }
  }
  for (auto& w : waiters) w(out);
  FinishMoves(std::move(demote), std::move(evicted));
  return out;
}

StatusOr<CachedEmbeddingPtr> EmbeddingCache::Promote(const std::shared_ptr<Flight>& flight) {
  const CachedEmbeddingPtr host_entry = flight->host_entry;
  if (!host_entry) return Complete(flight, Internal("Promote called on a flight without a host entry"));
  StatusOr<std::shared_ptr<const Embedding>> device =
      to_device_ ? to_device_(*host_entry->embedding)
                 : StatusOr<std::shared_ptr<const Embedding>>(
                       Internal("the cache has a host tier but no way back to the device"));
  if (!device.ok()) {
    Status s(device.status().code(), "moving image " + host_entry->image_id +
                                         "'s embedding from host to device memory: " +
                                         device.status().message());
    return Complete(flight, s);
  }
  CachedEmbedding value = *host_entry;
  value.embedding = std::move(*device);
  {
    std::lock_guard<std::mutex> lock(mu_);
    ++counters_.promotions;
  }
  return Complete(flight, std::move(value));
}

CacheCounters EmbeddingCache::counters() const {
  std::lock_guard<std::mutex> lock(mu_);
  CacheCounters c = counters_;
  c.device.entries = device_lru_.size();
  c.device.bytes = device_bytes_;
  c.host.entries = host_lru_.size();
  c.host.bytes = host_bytes_;
  return c;
}

}  // namespace maskd::server
