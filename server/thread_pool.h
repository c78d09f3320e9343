// A fixed set of threads serving one FIFO queue: the decode pool (hashing, image decoding, resize)
// and the post-processing pool. A bounded queue refuses work at once instead of growing without
// limit, so a handler can answer RESOURCE_EXHAUSTED immediately.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <deque>
#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "server/spin_wait.h"

namespace maskd::server {

class ThreadPool {
 public:
  // capacity 0: unbounded (for work that was already admitted upstream). spin: how long a thread
  // that finished a task polls for the next before it sleeps (server/spin_wait.h; 0: not at all).
  ThreadPool(std::string name, int threads, size_t capacity,
             std::chrono::microseconds spin = std::chrono::microseconds(0));
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  // False when the queue is full or the pool is stopping; the task is then not run.
  bool TrySubmit(std::function<void()> task);
  // Runs what is queued, then joins the threads. Later TrySubmit calls return false.
  void Stop();

  size_t depth() const;
  size_t capacity() const { return capacity_; }
  int threads() const { return static_cast<int>(threads_.size()); }
  const std::string& name() const { return name_; }

 private:
  void Loop();

  const std::string name_;
  const size_t capacity_;
  // Guards queue_ and stopping_; tasks run without it.
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> queue_;
  bool stopping_ = false;
  SpinGate spin_;  // told under mu_ whether queue_ is non-empty or stopping_
  std::vector<std::thread> threads_;
};

// Runs fn(0..n-1), each index once, on the calling thread and on up to `helpers` tasks submitted to
// `pool`; returns when every index has run, rethrowing the first exception of any (after all have
// run). The caller claims indices too and waits only for those already running on a helper, so it
// never waits for a task queued behind it (safe from a thread of the same pool, every thread of it
// busy); a helper that starts after every index was claimed returns at once. A refused task (a
// stopping pool) leaves its share to the others.
void RunSpread(ThreadPool& pool, size_t n, size_t helpers, const std::function<void(size_t)>& fn);

}  // namespace maskd::server
