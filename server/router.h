// Chooses the device worker for a request. An image that some worker holds (cached or being
// embedded) goes to that worker, so its embedding is computed once and reused there; a new image
// goes to the least loaded worker (ties in turn). The choice and the cache acquisition happen under
// one lock, so concurrent requests for the same new image all meet on one worker's single flight.
#pragma once

#include <functional>
#include <mutex>
#include <string>
#include <vector>

#include "server/call_control.h"
#include "server/device_worker.h"
#include "server/embedding_cache.h"

namespace maskd::server {

class Router {
 public:
  explicit Router(std::vector<DeviceWorker*> workers);

  struct Routed {
    DeviceWorker* worker = nullptr;  // null only with kAbsent
    EmbeddingCache::Acquired acquired;
  };
  // `make_waiter` builds the join callback for the chosen worker (it may run before Acquire returns).
  // With create == false, an image no worker holds is kAbsent and no worker is chosen.
  Routed Acquire(const std::string& image_id, bool create, const CallControlPtr& control,
                 const std::function<EmbeddingCache::Waiter(DeviceWorker*)>& make_waiter);

  const std::vector<DeviceWorker*>& workers() const { return workers_; }

 private:
  // Requires mu_.
  DeviceWorker* LeastLoadedLocked();

  const std::vector<DeviceWorker*> workers_;
  // Guards next_ and makes "find holder or pick, then acquire" atomic. Lock order: router, then a
  // worker's cache (the cache never calls back into the router).
  std::mutex mu_;
  size_t next_ = 0;
};

}  // namespace maskd::server
