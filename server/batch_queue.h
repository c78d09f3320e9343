// The dynamic batcher both stages use, after Triton's dynamic_batch_scheduler: one thread, one mutex
// and condition variable, items stamped on arrival; a batch leaves when it reaches its maximum
// weight or when its oldest item has waited max_queue_delay. A full queue refuses an item at once
// (RESOURCE_EXHAUSTED). Items whose call is dead (deadline passed, cancelled) are dropped when the
// batch is formed, before any engine work.
//
// Fairness: items of one group (the parts of one request split by its caller) put at most
// max_group_weight into one batch, and the batch is filled in arrival order past a group that has
// had its share. A 256-prompt request queued before a click therefore runs part by part with the
// click in the first batch after it arrives, instead of the click waiting for all of it; and the
// big request's later parts are dropped as soon as its call is cancelled or expires.
//
// Item requirements:
//   size_t weight() const;                  // images (encoder) or prompts (decoder), >= 1
//   const void* group() const;              // items of one request share it; nullptr: no group
//   Status Alive() const;                   // OK, or why the item is not worth running
//   void Fail(const Status&);               // called once for a dropped/refused-after-queueing item
//   Clock::time_point arrival;              // stamped by Submit
#pragma once

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include <spdlog/spdlog.h>

#include "model/api/status.h"
#include "server/call_control.h"
#include "server/spin_wait.h"
#include "server/thread_name.h"

namespace maskd::server {

struct BatchQueueOptions {
  size_t max_batch_weight = 1;
  std::chrono::microseconds max_queue_delay{0};
  size_t capacity_weight = 64;
  // The most weight one group puts into one batch (0: no limit). Callers split bigger requests
  // into parts of at most this weight.
  size_t max_group_weight = 0;
  // An item that finds the batcher idle (it arrived after the previous batch had finished) leaves
  // at once instead of waiting max_queue_delay for company: the delay then applies only under
  // load, where the items that queue up while a batch runs are batched together anyway.
  bool launch_when_idle = false;
  // How long the thread polls for the next item after a batch before it sleeps (server/spin_wait.h;
  // 0: not at all).
  std::chrono::microseconds spin{0};
};

struct QueueCounters {
  uint64_t depth = 0, capacity = 0, batches = 0, items = 0, rejected = 0, dropped = 0;
  double mean_batch_size = 0;
  // Filled by the batchers, not the queue: engine calls that ran out of device memory and were
  // split in halves, and items that ran out of memory alone (they got RESOURCE_EXHAUSTED).
  uint64_t oom_splits = 0, oom_failures = 0;
};

template <typename Item>
class BatchQueue {
 public:
  // Runs on the queue's thread with the live items of one batch; `formed` is when the batch left
  // the queue (queue time of an item = formed - arrival).
  using RunFn = std::function<void(std::vector<Item>& batch, Clock::time_point formed)>;

  BatchQueue(std::string name, BatchQueueOptions options, RunFn run)
      : name_(std::move(name)), options_(options), run_(std::move(run)), spin_(options.spin) {
    if (options_.max_batch_weight < 1) options_.max_batch_weight = 1;
    thread_ = std::thread([this] {
      NameThisThread(name_);  // "decoder[cuda:0]"
      Loop();
    });
  }
  ~BatchQueue() { Stop(); }
  BatchQueue(const BatchQueue&) = delete;
  BatchQueue& operator=(const BatchQueue&) = delete;

  // OK: queued (the item's own callbacks will report). RESOURCE_EXHAUSTED when the queue is full,
  // UNAVAILABLE when stopping; the item is then untouched and its callbacks are not called.
  Status Submit(Item&& item) {
    const size_t w = std::max<size_t>(1, item.weight());
    bool notify;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (stopping_) return Unavailable(name_ + " queue is shutting down: retry on another server");
      if (queued_weight_ + w > options_.capacity_weight) {
        ++rejected_;
        return ResourceExhausted(name_ + " queue is full (" + std::to_string(queued_weight_) + " of " +
                                 std::to_string(options_.capacity_weight) +
                                 " queued, this request needs " + std::to_string(w) +
                                 "): retry with backoff");
      }
      item.arrival = Clock::now();
      queued_weight_ += w;
      queue_.push_back(std::move(item));
      spin_.SetReady(true);
      // The one thread is woken unless it is spinning (then it is not in a batching wait either).
      notify = spin_.NeedsNotify(1);
    }
    if (notify) cv_.notify_one();
    return Status::Ok();
  }

  // True when an item of weight w would be accepted now (a hint to skip work that would be refused).
  bool HasRoom(size_t w) const {
    std::lock_guard<std::mutex> lock(mu_);
    return !stopping_ && queued_weight_ + std::max<size_t>(1, w) <= options_.capacity_weight;
  }

  // Fails what is still queued with UNAVAILABLE, lets a running batch finish, joins the thread.
  void Stop() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (stopping_ && !thread_.joinable()) return;
      stopping_ = true;
      spin_.SetReady(true);
    }
    cv_.notify_all();
    if (thread_.joinable()) thread_.join();
  }

  QueueCounters counters() const {
    std::lock_guard<std::mutex> lock(mu_);
    QueueCounters c;
    c.depth = queued_weight_;
    c.capacity = options_.capacity_weight;
    c.batches = batches_;
    c.items = items_;
    c.rejected = rejected_;
    c.dropped = dropped_;
    c.mean_batch_size = batches_ ? static_cast<double>(items_) / static_cast<double>(batches_) : 0;
    return c;
  }

  const BatchQueueOptions& options() const { return options_; }

 private:
  void Loop() {
    std::unique_lock<std::mutex> lock(mu_);
    bool ran = false;  // a batch has just run: only then the thread spins before sleeping
    for (;;) {
      if (ran && !stopping_ && queue_.empty()) {
        spin_.Spin(lock);
      }
      cv_.wait(lock, [this] { return stopping_ || !queue_.empty(); });
      if (stopping_) break;
      // Wait for a full batch or for the oldest item's max_queue_delay, whichever comes first;
      // with launch_when_idle, not at all when the oldest item arrived to an idle batcher.
      const bool idle = options_.launch_when_idle && queue_.front().arrival >= idle_since_;
      const Clock::time_point leave = queue_.front().arrival + options_.max_queue_delay;
      if (!idle) {
        cv_.wait_until(lock, leave, [this] {
          return stopping_ || queued_weight_ >= options_.max_batch_weight;
        });
      }
      if (stopping_) break;
      std::vector<Item> batch = TakeBatch();
      spin_.SetReady(!queue_.empty());
      const Clock::time_point formed = Clock::now();
      lock.unlock();
      RunBatch(batch, formed);
      lock.lock();
      idle_since_ = Clock::now();
      ran = true;
    }
    // Stopping: everything still queued is refused; the clients may retry elsewhere.
    std::deque<Item> left = std::move(queue_);
    queue_.clear();
    queued_weight_ = 0;
    lock.unlock();
    for (auto& item : left) {
      item.Fail(Unavailable("the server is shutting down: " + name_ + " work was not started"));
    }
  }

  // Under mu_. In arrival order, up to max_batch_weight; an item that does not fit ends the batch
  // (later, smaller items do not overtake it), an item whose group had its share waits for the
  // next batch while the items behind it go on.
  std::vector<Item> TakeBatch() {
    std::vector<Item> batch;
    std::vector<std::pair<const void*, size_t>> groups;  // weight taken per group in this batch
    size_t weight = 0;
    for (auto it = queue_.begin(); it != queue_.end();) {
      const size_t w = std::max<size_t>(1, it->weight());
      if (!batch.empty() && weight + w > options_.max_batch_weight) break;
      const void* g = it->group();
      size_t* taken = nullptr;
      if (g != nullptr && options_.max_group_weight > 0) {
        auto found = std::find_if(groups.begin(), groups.end(),
                                  [g](const auto& e) { return e.first == g; });
        if (found == groups.end()) {
          groups.emplace_back(g, 0);
          found = groups.end() - 1;
        }
        taken = &found->second;
        if (*taken > 0 && *taken + w > options_.max_group_weight) {
          ++it;
          continue;
        }
      }
      if (taken) *taken += w;
      weight += w;
      queued_weight_ -= w;
      batch.push_back(std::move(*it));
      it = queue_.erase(it);
    }
    return batch;
  }

  void RunBatch(std::vector<Item>& batch, Clock::time_point formed) {
    std::vector<Item> live;
    std::vector<std::pair<Item, Status>> dead;
    live.reserve(batch.size());
    uint64_t items = 0;
    for (auto& item : batch) {
      Status alive = item.Alive();
      if (alive.ok()) {
        items += std::max<size_t>(1, item.weight());
        live.push_back(std::move(item));
      } else {
        dead.emplace_back(std::move(item), std::move(alive));
      }
    }
    // Counted before anyone hears of it, so that GetInfo never lags behind a reply.
    {
      std::lock_guard<std::mutex> lock(mu_);
      dropped_ += dead.size();
      if (!live.empty()) {
        ++batches_;
        items_ += items;
      }
    }
    for (auto& [item, why] : dead) item.Fail(why);
    if (live.empty()) return;
    // The run function reports per item; this guard only keeps the thread alive on a bug.
    try {
      run_(live, formed);
    } catch (const std::exception& e) {
      spdlog::error("{} batch threw: {}", name_, e.what());
    } catch (...) {
      spdlog::error("{} batch threw a non-standard exception", name_);
    }
  }

  const std::string name_;
  BatchQueueOptions options_;
  const RunFn run_;
  // Guards queue_, queued_weight_, stopping_ and the counters. Never held while a batch runs.
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Item> queue_;
  size_t queued_weight_ = 0;
  bool stopping_ = false;
  SpinGate spin_;  // told under mu_ whether queue_ is non-empty or stopping_
  // When the last batch finished (the thread's start before the first): items arriving after it
  // found the batcher idle.
  Clock::time_point idle_since_ = Clock::now();
  uint64_t batches_ = 0, items_ = 0, rejected_ = 0, dropped_ = 0;
  std::thread thread_;
};

}  // namespace maskd::server
