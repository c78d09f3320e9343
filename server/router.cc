#include "server/router.h"

#include <limits>

namespace maskd::server {

Router::Router(std::vector<DeviceWorker*> workers) : workers_(std::move(workers)) {}

DeviceWorker* Router::LeastLoadedLocked() {
  DeviceWorker* best = nullptr;
  int best_load = std::numeric_limits<int>::max();
  size_t best_pos = 0;
  for (size_t k = 0; k < workers_.size(); ++k) {
    const size_t i = (next_ + k) % workers_.size();
    const int load = workers_[i]->load();
    if (load < best_load) {
      best = workers_[i];
      best_load = load;
      best_pos = i;
    }
  }
  next_ = (best_pos + 1) % workers_.size();
  return best;
}

Router::Routed Router::Acquire(const std::string& image_id, bool create,
                               const CallControlPtr& control,
                               const std::function<EmbeddingCache::Waiter(DeviceWorker*)>& make_waiter) {
  std::lock_guard<std::mutex> lock(mu_);
  Routed out;
  for (DeviceWorker* w : workers_) {
    if (w->cache().Holds(image_id)) {
      out.worker = w;
      break;
    }
  }
  if (out.worker == nullptr) {
    if (!create) {
      // Counted as a miss by one cache, so that GetInfo's misses include unknown image_ids.
      if (!workers_.empty()) {
        out.acquired = workers_.front()->cache().Acquire(image_id, false, control, nullptr);
      }
      out.acquired.outcome = EmbeddingCache::Outcome::kAbsent;
      return out;
    }
    out.worker = LeastLoadedLocked();
  }
  out.acquired = out.worker->cache().Acquire(image_id, create, control, make_waiter(out.worker));
  if (out.acquired.outcome == EmbeddingCache::Outcome::kAbsent) out.worker = nullptr;
  return out;
}

}  // namespace maskd::server
