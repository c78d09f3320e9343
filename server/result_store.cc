#include "server/result_store.h"

#include <cstdlib>

#include <openssl/rand.h>
#include <spdlog/spdlog.h>

namespace maskd::server {

ResultStore::ResultStore(uint64_t capacity_bytes) : capacity_bytes_(capacity_bytes) {}

std::string ResultStore::NewIdLocked() {
  static const char kHex[] = "0123456789abcdef";
  constexpr int kIdBytes = 16;  // 128 bits: guessing a live id is hopeless
  for (;;) {
    unsigned char raw[kIdBytes];
    if (RAND_bytes(raw, kIdBytes) != 1) {
      // No safe fallback exists: a predictable id would let clients read each other's results.
      spdlog::critical("OpenSSL RAND_bytes failed: cannot make unguessable result ids");
      std::abort();
    }
    std::string id = "r";
    for (unsigned char b : raw) {
      id.push_back(kHex[b >> 4]);
      id.push_back(kHex[b & 15]);
    }
    if (!entries_.count(id)) return id;
  }
}

std::string ResultStore::Put(StoredResult result) {
  std::lock_guard<std::mutex> lock(mu_);
  std::string id = NewIdLocked();
  if (result.bytes > capacity_bytes_) return id;
  while (bytes_ + result.bytes > capacity_bytes_ && !lru_.empty()) {
    const std::string victim = lru_.back();  // a copy: RemoveLocked erases the list node
    RemoveLocked(victim);
    ++evictions_;
  }
  lru_.push_front(id);
  bytes_ += result.bytes;
  by_image_[result.image_id].insert(id);
  entries_[id] = Entry{std::move(result), lru_.begin()};
  return id;
}

StatusOr<StoredResult> ResultStore::Get(const std::string& result_id, std::string_view field,
                                        std::string_view image_id) {
  std::lock_guard<std::mutex> lock(mu_);
  auto e = entries_.find(result_id);
  if (e == entries_.end() || (!image_id.empty() && e->second.value.image_id != image_id)) {
    return NotFound(std::string(field) + " = \"" + result_id +
                    "\" is not a stored result (unknown, or evicted from the result store or with "
                    "its image): send the previous mask as mask_input.logits or segment again");
  }
  lru_.splice(lru_.begin(), lru_, e->second.lru);
  return e->second.value;
}

void ResultStore::DropImage(const std::string& image_id) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = by_image_.find(image_id);
  if (it == by_image_.end()) return;
  const std::unordered_set<std::string> ids = std::move(it->second);
  by_image_.erase(it);
  for (const auto& id : ids) {
    auto e = entries_.find(id);
    if (e == entries_.end()) continue;
    bytes_ -= e->second.value.bytes;
    lru_.erase(e->second.lru);
    entries_.erase(e);
    ++evictions_;
  }
}

void ResultStore::RemoveLocked(const std::string& result_id) {
  auto e = entries_.find(result_id);
  if (e == entries_.end()) return;
  bytes_ -= e->second.value.bytes;
  lru_.erase(e->second.lru);
  auto img = by_image_.find(e->second.value.image_id);
  if (img != by_image_.end()) {
    img->second.erase(result_id);
    if (img->second.empty()) by_image_.erase(img);
  }
  entries_.erase(e);
}

ResultStoreCounters ResultStore::counters() const {
  std::lock_guard<std::mutex> lock(mu_);
  return {entries_.size(), bytes_, capacity_bytes_, evictions_};
}

}  // namespace maskd::server
