// Where a peak of device memory comes from: the CUDA caching allocator's allocations recorded while
// some work runs (LibTorch's allocation history), replayed to the moment the allocated total was
// highest, and what was live then grouped by the MemoryScope label (model/memory_scope.h) under
// which each block was allocated. maskbench --memory-account prints it for the encoder rows (issue
// #12's peak-memory targets: the peak is a sum of named tensors, not one number). Torch-free header.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "model/api/status.h"

namespace maskd {

struct MemoryAccountRow {
  std::string label;  // the MemoryScope label at allocation; "(unlabelled)" outside every scope
  uint64_t bytes = 0;
  int64_t count = 0;
  uint64_t largest = 0;
};

struct MemoryAccount {
  // Allocated before the work began and still allocated at its peak (weights, caches, graph
  // inputs and outputs, embeddings held by the caller).
  uint64_t before_bytes = 0;
  // The highest allocated total during the work: before_bytes + the rows' bytes.
  uint64_t peak_bytes = 0;
  // What the work had allocated and not freed at that moment, by label, largest first.
  std::vector<MemoryAccountRow> rows;
  // Allocation events replayed; true when the history was full and the oldest were lost (the
  // account is then not trustworthy).
  size_t events = 0;
  bool truncated = false;
};

// One allocator event: an allocation, or the free of an earlier one at the same address.
struct AllocEvent {
  bool alloc = true;
  uint64_t addr = 0;
  uint64_t size = 0;
  std::string label;
};

// Replays `events` (in order) on top of `before_bytes` already allocated. A free of a block that
// was allocated before the events began lowers the "before" part.
MemoryAccount AccountPeak(const std::vector<AllocEvent>& events, uint64_t before_bytes);

// Records the CUDA caching allocator's events on device `device_index` while `work` runs (which must
// finish its device work, as Engine calls do) and accounts their peak. CUDA builds with a device only.
StatusOr<MemoryAccount> AccountDevicePeak(int device_index, const std::function<Status()>& work);

// The account as a table: MiB, blocks, largest block, label; at most `max_rows` rows.
std::string FormatMemoryAccount(const MemoryAccount& a, size_t max_rows = 25);

}  // namespace maskd
