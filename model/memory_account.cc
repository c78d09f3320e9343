#include "model/memory_account.h"

#include <algorithm>
#include <cstdio>
#include <map>
#include <memory>
#include <unordered_map>
#include <vector>

#include "model/memory_scope.h"

#ifdef MASKD_WITH_CUDA
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAFunctions.h>
#endif

namespace maskd {
namespace {

thread_local std::vector<const char*> scopes;

}  // namespace

MemoryScope::MemoryScope(const char* label) { scopes.push_back(label); }
MemoryScope::~MemoryScope() { scopes.pop_back(); }

std::string MemoryScope::Current() {
  std::string out;
  for (const char* s : scopes) {
    if (!out.empty()) out += '/';
    out += s;
  }
  return out;
}

MemoryAccount AccountPeak(const std::vector<AllocEvent>& events, uint64_t before_bytes) {
  MemoryAccount a;
  a.events = events.size();
  // Pass 1: the event after which the total is highest (none: the peak is what was there before).
  std::unordered_map<uint64_t, uint64_t> live;  // addr -> size, allocated during the work
  uint64_t current = 0, freed_before = 0;
  uint64_t peak = before_bytes;
  size_t peak_after = 0;  // events replayed at the peak
  for (size_t i = 0; i < events.size(); ++i) {
    const AllocEvent& e = events[i];
    if (e.alloc) {
      live[e.addr] = e.size;
      current += e.size;
    } else if (auto it = live.find(e.addr); it != live.end()) {
      current -= it->second;
      live.erase(it);
    } else {
      freed_before += std::min(e.size, before_bytes - freed_before);
    }
    const uint64_t total = before_bytes - freed_before + current;
    if (total > peak) {
      peak = total;
      peak_after = i + 1;
    }
  }
  // Pass 2: what was live at that moment, and under which label it was allocated.
  struct Block {
    uint64_t size;
    const std::string* label;
  };
  std::unordered_map<uint64_t, Block> at_peak;
  uint64_t freed_before_peak = 0;
  for (size_t i = 0; i < peak_after; ++i) {
    const AllocEvent& e = events[i];
    if (e.alloc) {
      at_peak[e.addr] = {e.size, &e.label};
    } else if (auto it = at_peak.find(e.addr); it != at_peak.end()) {
      at_peak.erase(it);
    } else {
      freed_before_peak += std::min(e.size, before_bytes - freed_before_peak);
    }
  }
  std::map<std::string, MemoryAccountRow> by_label;
  for (const auto& [addr, b] : at_peak) {
    MemoryAccountRow& r = by_label[b.label->empty() ? std::string("(unlabelled)") : *b.label];
    r.bytes += b.size;
    r.count += 1;
    r.largest = std::max(r.largest, b.size);
  }
  for (auto& [label, r] : by_label) {
    r.label = label;
    a.rows.push_back(r);
  }
  std::sort(a.rows.begin(), a.rows.end(), [](const MemoryAccountRow& x, const MemoryAccountRow& y) {
    return x.bytes != y.bytes ? x.bytes > y.bytes : x.label < y.label;
  });
  a.before_bytes = before_bytes - freed_before_peak;
  a.peak_bytes = peak;
  return a;
}

std::string FormatMemoryAccount(const MemoryAccount& a, size_t max_rows) {
  auto mib = [](uint64_t b) { return static_cast<double>(b) / 1048576.0; };
  std::string out;
  char line[512];
  std::snprintf(line, sizeof line,
                "peak %.1f MiB = %.1f MiB allocated before the work + %.1f MiB it allocated and held at "
                "its peak (%zu allocator events%s)\n",
                mib(a.peak_bytes), mib(a.before_bytes), mib(a.peak_bytes - a.before_bytes), a.events,
                a.truncated ? "; HISTORY FULL, the oldest were lost: not trustworthy" : "");
  out += line;
  std::snprintf(line, sizeof line, "%10s %7s %12s  %s\n", "MiB", "blocks", "largest MiB", "allocated under");
  out += line;
  for (size_t i = 0; i < a.rows.size() && i < max_rows; ++i) {
    const MemoryAccountRow& r = a.rows[i];
    std::snprintf(line, sizeof line, "%10.1f %7lld %12.1f  %s\n", mib(r.bytes), static_cast<long long>(r.count),
                  mib(r.largest), r.label.c_str());
    out += line;
  }
  if (a.rows.size() > max_rows) out += "... " + std::to_string(a.rows.size() - max_rows) + " more labels\n";
  return out;
}

#ifdef MASKD_WITH_CUDA
namespace {

struct LabelContext final : c10::GatheredContext {
  explicit LabelContext(std::string l) : label(std::move(l)) {}
  std::string label;
};

std::shared_ptr<c10::GatheredContext> RecordLabel() { return std::make_shared<LabelContext>(MemoryScope::Current()); }

constexpr size_t kMaxEvents = size_t{1} << 21;

}  // namespace

StatusOr<MemoryAccount> AccountDevicePeak(int device_index, const std::function<Status()>& work) {
  namespace cca = c10::cuda::CUDACachingAllocator;
  using c10::CachingDeviceAllocator::RecordContext;
  using c10::CachingDeviceAllocator::TraceEntry;
  try {
    if (device_index < 0 || device_index >= static_cast<int>(c10::cuda::device_count()))
      return FailedPrecondition("a device memory account needs CUDA device " + std::to_string(device_index) +
                                " (" + std::to_string(c10::cuda::device_count()) + " present)");
    const auto device = static_cast<c10::DeviceIndex>(device_index);
    c10::cuda::device_synchronize();
    const uint64_t before = static_cast<uint64_t>(
        cca::getDeviceStats(device).allocated_bytes[static_cast<size_t>(c10::CachingAllocator::StatType::AGGREGATE)]
            .current);
    cca::recordHistory(true, &RecordLabel, kMaxEvents, RecordContext::ALLOC, /*clearHistory=*/true, {});
    Status s = work();
    c10::cuda::device_synchronize();
    const cca::SnapshotInfo snap = cca::snapshot();
    cca::recordHistory(false, nullptr, 0, RecordContext::NEVER, /*clearHistory=*/true, {});
    if (!s.ok()) return s;
    std::vector<AllocEvent> events;
    if (static_cast<size_t>(device) < snap.device_traces.size()) {
      for (const TraceEntry& t : snap.device_traces[static_cast<size_t>(device)]) {
        if (t.action_ != TraceEntry::ALLOC && t.action_ != TraceEntry::FREE_COMPLETED) continue;
        AllocEvent e;
        e.alloc = t.action_ == TraceEntry::ALLOC;
        e.addr = t.addr_;
        e.size = t.size_;
        if (const auto* c = dynamic_cast<const LabelContext*>(t.context_.get())) e.label = c->label;
        events.push_back(std::move(e));
      }
    }
    MemoryAccount a = AccountPeak(events, before);
    a.truncated = snap.device_traces.size() > static_cast<size_t>(device) &&
                  snap.device_traces[static_cast<size_t>(device)].size() >= kMaxEvents;
    return a;
  } catch (const std::exception& e) {
    return Internal(std::string("recording the allocator's history: ") + e.what());
  }
}
#else
StatusOr<MemoryAccount> AccountDevicePeak(int, const std::function<Status()>&) {
  return FailedPrecondition("a device memory account needs a CUDA build");
}
#endif

}  // namespace maskd
