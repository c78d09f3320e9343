// The batchers' answer to a device running out of memory (issue #14): a pass that fails with
// RESOURCE_EXHAUSTED as a whole is retried as two halves, down to single items, so that only what
// does not fit alone is refused. Shared by the encoder batcher (images) and the decoder batcher
// (prompts).
#pragma once

#include <spdlog/spdlog.h>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "model/api/status.h"

namespace maskd::server {

struct OomSplitCounters {
  std::atomic<uint64_t> splits{0}, failures{0};
};

// Runs run(items[first, last)) (a StatusOr of one result per item) and stores each item's result
// in results[first..last). RESOURCE_EXHAUSTED for the whole pass is the device running out of
// memory (the engine has released its cached blocks): halves need less, so they are tried before
// any item is refused. `batch` and `unit` name the work in log lines ("encoder", "images").
template <typename In, typename Result, typename Run>
void RunSplittingOnOom(const std::vector<In>& items, size_t first, size_t last, std::vector<Result>& results,
                       const Run& run, OomSplitCounters& counters, const char* batch, const char* unit) {
  const size_t n = last - first;
  const std::vector<In> part(items.begin() + static_cast<std::ptrdiff_t>(first),
                             items.begin() + static_cast<std::ptrdiff_t>(last));
  auto r = run(part);
  if (r.ok()) {
    for (size_t i = 0; i < n; ++i) results[first + i] = std::move((*r)[i]);
    return;
  }
  if (r.status().code() == StatusCode::kResourceExhausted && n > 1) {
    const size_t mid = first + n / 2;
    counters.splits.fetch_add(1, std::memory_order_relaxed);
    spdlog::warn("{} batch of {} {} ran out of device memory; retrying as {} + {}: {}", batch, n, unit,
                 mid - first, last - mid, r.status().message());
    RunSplittingOnOom(items, first, mid, results, run, counters, batch, unit);
    RunSplittingOnOom(items, mid, last, results, run, counters, batch, unit);
    return;
  }
  if (r.status().code() == StatusCode::kResourceExhausted) {
    counters.failures.fetch_add(1, std::memory_order_relaxed);
    spdlog::warn("one of the {} batch's {} ran out of device memory on its own; its request gets "
                 "RESOURCE_EXHAUSTED: {}",
                 batch, unit, r.status().message());
  }
  for (size_t i = first; i < last; ++i) results[i] = r.status();
}

}  // namespace maskd::server
