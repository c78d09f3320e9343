// Stored prompt results for MaskInput.result_id: each holds the low-res logits of one prompt's
// masks. Bounded by bytes with LRU eviction, and tied to the image's cache entry: when the image
// leaves the embedding cache, its results go with it (a refinement needs the embedding anyway).
#pragma once

#include <cstdint>
#include <list>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <unordered_set>

#include "model/api/engine.h"
#include "model/api/status.h"

namespace maskd::server {

struct StoredResult {
  std::string image_id;
  std::shared_ptr<const MaskLogits> logits;
  int num_masks = 0;
  int best_index = 0;
  size_t bytes = 0;
};

struct ResultStoreCounters {
  uint64_t entries = 0, bytes = 0, capacity_bytes = 0, evictions = 0;
};

class ResultStore {
 public:
  explicit ResultStore(uint64_t capacity_bytes);

  // Stores `result` and returns its new id: 128 bits from the OS CSPRNG (OpenSSL RAND_bytes) in hex,
  // so that no client can predict another's ids. A result larger than the whole store is not kept;
  // its id is then unknown right away (NOT_FOUND on use, like an evicted one).
  std::string Put(StoredResult result);
  // NOT_FOUND naming the id when unknown or evicted. Refreshes its LRU position. With a non-empty
  // image_id, a result of another image answers exactly like an unknown id: telling them apart
  // would confirm that the id exists and reveal which image it belongs to.
  StatusOr<StoredResult> Get(const std::string& result_id, std::string_view field,
                             std::string_view image_id = {});
  void DropImage(const std::string& image_id);

  ResultStoreCounters counters() const;

 private:
  struct Entry {
    StoredResult value;
    std::list<std::string>::iterator lru;
  };
  // Requires mu_.
  void RemoveLocked(const std::string& result_id);
  std::string NewIdLocked();

  const uint64_t capacity_bytes_;
  // Guards everything below.
  mutable std::mutex mu_;
  std::unordered_map<std::string, Entry> entries_;
  std::unordered_map<std::string, std::unordered_set<std::string>> by_image_;
  std::list<std::string> lru_;  // front = most recently used
  uint64_t bytes_ = 0;
  uint64_t evictions_ = 0;
};

}  // namespace maskd::server
